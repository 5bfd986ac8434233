"""The SQLite store of table runs and their cells: the service's queue and its results.

Plain SQL, in the style of sqlite-utils and datasette:

- ordered migrations (``MIGRATIONS``), each applied once in its own transaction and recorded
  in the ``_migrations`` table, so a database made by an older autotune is brought up to date;
- WAL journal: readers never block the writer nor each other (https://sqlite.org/wal.html);
- one writer: every write goes through one connection behind one lock, in a short
  ``BEGIN IMMEDIATE`` transaction (which also serialises writers of other processes);
  reads use a connection of their own per call.

A run's status moves ``queued -> running -> done | failed``, and ``queued | running ->
cancelled``; a run found ``running`` when a server starts was interrupted by the last one
stopping, and goes back to ``queued`` with its finished cells kept (``requeue_interrupted``).

No FastAPI here: the API (``api/``) and tests use the same store.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import threading
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from autotune.errors import StoreError

STATUSES = ("queued", "running", "done", "failed", "cancelled")
ACTIVE = ("queued", "running")
# A run with one of these statuses answers an identical request (dedupe); a failed or
# cancelled run does not, so asking again measures again.
REUSABLE = ("queued", "running", "done")
BUSY_TIMEOUT_S = 30.0  # how long a connection waits for another process's write lock

MIGRATIONS: tuple[tuple[str, str], ...] = (
    (
        "create runs",
        """
        CREATE TABLE runs (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,  -- creation order: newest first = seq DESC
            id TEXT NOT NULL UNIQUE,
            key TEXT NOT NULL,             -- sha256 of the normalised request + environment
            model TEXT NOT NULL,
            gpu TEXT NOT NULL,             -- the target GPU's name
            backend TEXT NOT NULL,         -- cuda | estimate
            status TEXT NOT NULL CHECK (status IN ('queued','running','done','failed','cancelled')),
            spec TEXT NOT NULL,            -- JSON: the normalised request
            total INTEGER NOT NULL,        -- cells in the table
            header TEXT,                   -- JSON: what the worker reported when it started
            error TEXT,
            lane TEXT,                     -- where it runs or ran, e.g. cuda:0
            worker_pid INTEGER,
            attempts INTEGER NOT NULL DEFAULT 0,  -- starts, > 1 after a restart
            elapsed_s REAL,
            created_at TEXT NOT NULL,
            started_at TEXT,
            finished_at TEXT
        );
        CREATE INDEX runs_by_key ON runs (key, seq);
        CREATE INDEX runs_by_status ON runs (status, seq);
        CREATE INDEX runs_by_model ON runs (model COLLATE NOCASE, seq);
        """,
    ),
    (
        "create cells",
        """
        CREATE TABLE cells (
            run_id TEXT NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
            position INTEGER NOT NULL,     -- 0-based, in the tuner's order (mode, then seq_len)
            mode TEXT NOT NULL,
            seq_len INTEGER NOT NULL,
            data TEXT NOT NULL,            -- JSON: CellResult.to_dict()
            finished_at TEXT NOT NULL,
            PRIMARY KEY (run_id, mode, seq_len)
        );
        """,
    ),
)


@dataclass(frozen=True)
class Run:
    """One row of ``runs``, JSON columns decoded; ``done`` counts its cells."""

    id: str
    key: str
    model: str
    gpu: str
    backend: str
    status: str
    spec: dict[str, Any]
    total: int
    done: int
    header: dict[str, Any] | None
    error: str | None
    lane: str | None
    worker_pid: int | None
    attempts: int
    elapsed_s: float | None
    created_at: str
    started_at: str | None
    finished_at: str | None

    @property
    def active(self) -> bool:
        return self.status in ACTIVE


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


_RUN_COLUMNS = (
    "id, key, model, gpu, backend, status, spec, total, header, error, lane, worker_pid, attempts, "
    "elapsed_s, created_at, started_at, finished_at, "
    "(SELECT count(*) FROM cells WHERE cells.run_id = runs.id) AS done"
)


def _run(row: sqlite3.Row) -> Run:
    data = dict(row)
    data["spec"] = json.loads(data["spec"])
    data["header"] = json.loads(data["header"]) if data["header"] else None
    return Run(**data)


class Store:
    """The database at ``path`` (created, and migrated, when opened)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._claim: Any = None  # the open lock file of claim()
        try:
            self._writer = self._connect()
            self._writer.execute("PRAGMA journal_mode = WAL")
            self.migrate()
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"cannot open the database {self.path}: {exc}") from exc

    def _connect(self) -> sqlite3.Connection:
        # isolation_level=None: no implicit transactions; writes open their own, short ones.
        conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None,
                               check_same_thread=False)
        conn.row_factory = sqlite3.Row
        conn.execute("PRAGMA foreign_keys = ON")
        return conn

    def close(self) -> None:
        with self._lock:
            self._writer.close()
            if self._claim is not None:
                self._claim.close()  # releases the flock
                self._claim = None

    def claim(self) -> None:
        """Make this process the one server of the database, or raise StoreError.

        A second server would requeue the first one's running runs and probe the same GPU
        twice. An flock on ``<db>.lock``: the kernel drops it when the process dies, however
        it dies, and worker processes do not inherit it (subprocess closes their fds).
        """
        try:
            import fcntl
        except ImportError:  # not POSIX: no claim, one server by convention
            return
        handle = open(f"{self.path}.lock", "a+")  # noqa: SIM115 - held until close()
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            handle.close()
            raise StoreError(
                f"another autotune server uses the database {self.path}: stop it, or give this "
                "one another database (--db or AUTOTUNE_DB)"
            ) from exc
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        self._claim = handle

    # --- transactions -------------------------------------------------------------------

    @contextlib.contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """The one writer, in a transaction that holds SQLite's write lock from its start."""
        with self._lock:
            conn = self._writer
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    @contextlib.contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        conn = self._connect()
        try:
            yield conn
        finally:
            conn.close()

    # --- migrations ---------------------------------------------------------------------

    def migrate(self) -> list[str]:
        """Apply the migrations this database lacks, in order; return their names."""
        applied: list[str] = []
        with self._write() as conn:
            conn.execute(
                "CREATE TABLE IF NOT EXISTS _migrations "
                "(id INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL)"
            )
            done = {row["id"] for row in conn.execute("SELECT id FROM _migrations")}
            if done - set(range(1, len(MIGRATIONS) + 1)):
                raise StoreError(
                    f"the database {self.path} has migrations this autotune does not know "
                    f"({sorted(done)}): it was made by a newer version"
                )
            for number, (name, sql) in enumerate(MIGRATIONS, start=1):
                if number in done:
                    continue
                for statement in sql.split(";"):
                    if statement.strip():
                        conn.execute(statement)
                conn.execute("INSERT INTO _migrations (id, name, applied_at) VALUES (?, ?, ?)",
                             (number, name, _now()))
                applied.append(name)
        return applied

    def migrations(self) -> list[tuple[int, str]]:
        with self._read() as conn:
            rows = conn.execute("SELECT id, name FROM _migrations ORDER BY id").fetchall()
        return [(r["id"], r["name"]) for r in rows]

    # --- writes -------------------------------------------------------------------------

    def create_run(
        self, *, key: str, model: str, gpu: str, backend: str, spec: dict[str, Any], total: int,
        reuse: Sequence[str] = REUSABLE,
    ) -> tuple[Run, bool]:
        """A new queued run, or the newest run of the same ``key`` whose status is in ``reuse``.

        Returns (run, created). The lookup and the insert are one transaction, so of two
        identical requests at once exactly one creates the run.
        """
        with self._write() as conn:
            if reuse:
                marks = ", ".join("?" for _ in reuse)
                row = conn.execute(
                    f"SELECT {_RUN_COLUMNS} FROM runs WHERE key = ? AND status IN ({marks}) "
                    "ORDER BY seq DESC LIMIT 1",
                    (key, *reuse),
                ).fetchone()
                if row is not None:
                    return _run(row), False
            run_id = uuid.uuid4().hex
            conn.execute(
                "INSERT INTO runs (id, key, model, gpu, backend, status, spec, total, created_at) "
                "VALUES (?, ?, ?, ?, ?, 'queued', ?, ?, ?)",
                (run_id, key, model, gpu, backend, json.dumps(spec, sort_keys=True), total, _now()),
            )
            row = conn.execute(f"SELECT {_RUN_COLUMNS} FROM runs WHERE id = ?", (run_id,)).fetchone()
            return _run(row), True

    def mark_running(self, run_id: str, *, lane: str, worker_pid: int | None) -> bool:
        """queued -> running; False if the run is no longer queued (e.g. cancelled)."""
        with self._write() as conn:
            cursor = conn.execute(
                "UPDATE runs SET status = 'running', lane = ?, worker_pid = ?, attempts = attempts + 1, "
                "started_at = coalesce(started_at, ?), error = NULL WHERE id = ? AND status = 'queued'",
                (lane, worker_pid, _now(), run_id),
            )
            return cursor.rowcount == 1

    def set_header(self, run_id: str, header: dict[str, Any]) -> bool:
        with self._write() as conn:
            cursor = conn.execute("UPDATE runs SET header = ? WHERE id = ? AND status = 'running'",
                                  (json.dumps(header, sort_keys=True), run_id))
            return cursor.rowcount == 1

    def add_cell(self, run_id: str, position: int, cell: dict[str, Any]) -> bool:
        """Record a finished cell of a running run; a cell already recorded is kept as it is.

        False when the run is not running (cancelled meanwhile) or the cell was there.
        """
        with self._write() as conn:
            cursor = conn.execute(
                "INSERT INTO cells (run_id, position, mode, seq_len, data, finished_at) "
                "SELECT ?, ?, ?, ?, ?, ? WHERE EXISTS "
                "(SELECT 1 FROM runs WHERE id = ? AND status = 'running') "
                "ON CONFLICT (run_id, mode, seq_len) DO NOTHING",
                (run_id, position, cell["mode"], cell["seq_len"], json.dumps(cell), _now(), run_id),
            )
            return cursor.rowcount == 1

    def finish_run(self, run_id: str, status: str, *, error: str | None = None,
                   elapsed_s: float | None = None) -> bool:
        """queued | running -> done | failed; False if the run is neither (cancelled meanwhile)."""
        if status not in ("done", "failed"):
            raise ValueError(f"a run finishes done or failed, not {status!r}")
        with self._write() as conn:
            cursor = conn.execute(
                "UPDATE runs SET status = ?, error = ?, elapsed_s = ?, finished_at = ? "
                "WHERE id = ? AND status IN ('queued', 'running')",
                (status, error, elapsed_s, _now(), run_id),
            )
            return cursor.rowcount == 1

    def cancel_run(self, run_id: str) -> Run | None:
        """queued | running -> cancelled; the run afterwards (None if there is no such run)."""
        with self._write() as conn:
            conn.execute(
                "UPDATE runs SET status = 'cancelled', finished_at = ?, error = 'cancelled by request' "
                "WHERE id = ? AND status IN ('queued', 'running')",
                (_now(), run_id),
            )
            row = conn.execute(f"SELECT {_RUN_COLUMNS} FROM runs WHERE id = ?", (run_id,)).fetchone()
            return _run(row) if row is not None else None

    def requeue_interrupted(self) -> list[str]:
        """running -> queued for runs a stopped server left behind; their cells stay."""
        with self._write() as conn:
            ids = [r["id"] for r in conn.execute("SELECT id FROM runs WHERE status = 'running' ORDER BY seq")]
            conn.execute("UPDATE runs SET status = 'queued', lane = NULL, worker_pid = NULL "
                         "WHERE status = 'running'")
            return ids

    # --- reads --------------------------------------------------------------------------

    def get_run(self, run_id: str) -> Run | None:
        with self._read() as conn:
            row = conn.execute(f"SELECT {_RUN_COLUMNS} FROM runs WHERE id = ?", (run_id,)).fetchone()
        return _run(row) if row is not None else None

    def cells(self, run_id: str) -> list[dict[str, Any]]:
        """The run's finished cells in the tuner's order, as CellResult.to_dict() made them."""
        with self._read() as conn:
            rows = conn.execute("SELECT data FROM cells WHERE run_id = ? ORDER BY position, mode, seq_len",
                                (run_id,)).fetchall()
        return [json.loads(r["data"]) for r in rows]

    def list_runs(
        self, *, model: str | None = None, gpu: str | None = None, status: str | None = None,
        limit: int = 20, offset: int = 0,
    ) -> tuple[list[Run], int]:
        """Runs matching the filters, newest first, and how many match in all."""
        where, params = [], []
        for column, value in (("model", model), ("gpu", gpu), ("status", status)):
            if value is not None:
                where.append(f"{column} = ? COLLATE NOCASE")
                params.append(value)
        clause = f"WHERE {' AND '.join(where)}" if where else ""
        with self._read() as conn:
            total = conn.execute(f"SELECT count(*) FROM runs {clause}", params).fetchone()[0]
            rows = conn.execute(
                f"SELECT {_RUN_COLUMNS} FROM runs {clause} ORDER BY seq DESC LIMIT ? OFFSET ?",
                (*params, limit, offset),
            ).fetchall()
        return [_run(r) for r in rows], total

    def distinct(self, column: str) -> list[str]:
        """The values of ``model`` or ``gpu`` that runs have, sorted: the dashboard's filter choices."""
        if column not in ("model", "gpu"):
            raise ValueError(f"distinct() takes 'model' or 'gpu', not {column!r}")
        with self._read() as conn:
            query = f"SELECT DISTINCT {column} AS v FROM runs ORDER BY v COLLATE NOCASE"
            rows = conn.execute(query).fetchall()
        return [r["v"] for r in rows]

    def queued_runs(self) -> list[Run]:
        """Queued runs, oldest first: the order they start in."""
        with self._read() as conn:
            rows = conn.execute(
                f"SELECT {_RUN_COLUMNS} FROM runs WHERE status = 'queued' ORDER BY seq"
            ).fetchall()
        return [_run(r) for r in rows]

    def counts(self) -> dict[str, int]:
        """Runs per status (every status, 0 included)."""
        with self._read() as conn:
            rows = conn.execute("SELECT status, count(*) AS n FROM runs GROUP BY status").fetchall()
        return {status: 0 for status in STATUSES} | {r["status"]: r["n"] for r in rows}
