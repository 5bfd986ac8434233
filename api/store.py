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
A measured table imported from a file (api/measurements.py) is a run made ``done`` with its cells
in one transaction (``import_run``); its header's ``imported`` says where it came from.

Faults: a write that fails with a transient SQLite error (``is_transient``: busy, locked, full,
I/O, read-only) is tried again a few times with a doubling wait; reads likewise, on a fresh
connection. When the tries are spent, or at once for any other SQLite error, the public method
raises StoreError naming what it was doing: no sqlite3 exception leaves this module.
``PRAGMA quick_check`` runs when the store opens; ``Store.integrity`` keeps its answer for
/v1/health, and ``Store.write_failure`` why the last write failed (None once one succeeds:
``probe_writable`` tries one that needs a new page). ``Store.claim`` makes one server per
database *file*, whatever path reaches it.

No FastAPI here: the API (``api/``) and tests use the same store.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sqlite3
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any, TypeVar

from autotune.errors import StoreError

log = logging.getLogger("autotune.api")
T = TypeVar("T")

STATUSES = ("queued", "running", "done", "failed", "cancelled")
ACTIVE = ("queued", "running")
# A run with one of these statuses answers an identical request (dedupe); a failed or
# cancelled run does not, so asking again measures again.
REUSABLE = ("queued", "running", "done")
BUSY_TIMEOUT_S = 30.0  # how long a connection waits for another process's write lock
ATTEMPTS = 5  # tries of a write (or read) that fails with a transient error, the first included
RETRY_DELAY_S = 0.05  # the wait before the second try, doubled before each next: 0.75 s in all for 5
INTEGRITY_PROBLEMS = 10  # how many problems PRAGMA quick_check(N) reports at most

# Primary result codes of faults that may clear up by themselves (https://sqlite.org/rescode.html):
# another connection's lock (BUSY, LOCKED), a full disk (FULL), a failed read or write of the
# file (IOERR), and READONLY, which a WAL recovery under way also answers (READONLY_RECOVERY).
TRANSIENT = frozenset({sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED, sqlite3.SQLITE_FULL,
                       sqlite3.SQLITE_IOERR, sqlite3.SQLITE_READONLY})


def _primary_code(exc: sqlite3.Error) -> int | None:
    code = getattr(exc, "sqlite_errorcode", None)  # extended code; its low byte is the primary one
    return None if code is None else code & 0xFF


def is_transient(exc: sqlite3.Error) -> bool:
    """Whether trying ``exc``'s statement again may succeed: the one place that decides."""
    return _primary_code(exc) in TRANSIENT


def is_unavailable(exc: BaseException) -> bool:
    """Whether a StoreError is a fault that may clear up (a full disk, another process's lock, a
    failed read or write): the service answers it 503 with Retry-After, not 500."""
    cause = exc.__cause__
    return isinstance(exc, StoreError) and isinstance(cause, sqlite3.Error) and is_transient(cause)

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

    @property
    def imported(self) -> dict[str, Any] | None:
        """Where an imported measured table came from (api/measurements.py), None for a run of
        this service."""
        imported = (self.header or {}).get("imported")
        return imported if isinstance(imported, dict) else None


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


# --- the claim: one server per database file -------------------------------------------------
#
# On Linux the claim is an flock on the database file itself, so a symlink or a hard link to it
# meets the same lock (a lock file beside a hard link would be another file, and its server
# would keep another -wal file for the same database). SQLite locks the file with fcntl locks,
# which Linux keeps apart from flock ones (flock(2)), so the claim blocks no connection; on
# the BSDs and macOS the two kinds meet, and the claim is an flock on ``<real path>.lock``.
# Closing *any* descriptor of a file drops every fcntl lock the process holds on it, SQLite's
# included (https://sqlite.org/howtocorrupt.html, section 2.2), so a descriptor opened for a
# claim is never closed: a released one waits here for the next claim of the same file.
_spare_claims: dict[tuple[int, int], list[IO[bytes]]] = {}  # (st_dev, st_ino) -> unlocked files
_spare_claims_lock = threading.Lock()


def _open_for_claim(path: Path) -> IO[bytes]:
    """A descriptor of the database file at ``path`` to flock: a spare one, else a new one."""
    if sys.platform != "linux":
        return open(f"{os.path.realpath(path)}.lock", "a+b")  # noqa: SIM115 - held until released
    st = os.stat(path)  # symlinks followed
    with _spare_claims_lock:
        spares = _spare_claims.get((st.st_dev, st.st_ino))
        if spares:
            return spares.pop()
    return open(path, "rb")  # noqa: SIM115 - never closed, see above


def _same_file(path: Path, st: os.stat_result) -> bool:
    try:
        other = os.stat(path, follow_symlinks=False)
    except OSError:
        return False
    return (other.st_dev, other.st_ino) == (st.st_dev, st.st_ino)


def _keep_for_claims(handle: IO[bytes]) -> None:
    """Put away a descriptor ``_open_for_claim`` gave, unlocked."""
    if sys.platform != "linux":
        handle.close()  # a lock file's: no SQLite lock on it to drop
        return
    st = os.fstat(handle.fileno())
    with _spare_claims_lock:
        _spare_claims.setdefault((st.st_dev, st.st_ino), []).append(handle)


class Store:
    """The database at ``path`` (created, and migrated, when opened).

    ``attempts`` and ``retry_delay_s``: how often a read or write that fails with a transient
    error is tried in all, and the wait before the second try (doubled before each next one).
    ``claim``: make this process the one server of the file (``claim``) before SQLite opens it,
    as a server must: opening writes (WAL, migrations), and a second server, or a second name of
    the file, must be refused before it writes anything.
    """

    def __init__(self, path: str | Path, *, attempts: int = ATTEMPTS,
                 retry_delay_s: float = RETRY_DELAY_S, claim: bool = False) -> None:
        if attempts < 1 or retry_delay_s < 0:
            raise ValueError(f"attempts must be at least 1 and retry_delay_s at least 0, not "
                             f"{attempts} and {retry_delay_s}")
        self.path = Path(path)
        self.attempts = attempts
        self.retry_delay_s = retry_delay_s
        self._lock = threading.Lock()
        self._claim: IO[bytes] | None = None  # the database file, flocked, while claimed
        # SQLite's reason the last write failed for a fault that may clear up (``is_unavailable``:
        # "database or disk is full"), None since a write succeeded: /v1/health's "writable".
        self.write_failure: str | None = None
        if claim and self.path.exists():  # a new file has no other name nor server to meet
            self._take_claim()
        try:
            self._writer = self._connect()
        except sqlite3.Error as exc:
            raise StoreError(self._cannot_open(exc)) from exc
        try:
            self._writer.execute("PRAGMA journal_mode = WAL")
            self.migrate()
        except (sqlite3.Error, StoreError) as exc:
            self._writer.close()
            self._release_claim()
            cause = exc.__cause__ if isinstance(exc, StoreError) else exc
            if not isinstance(cause, sqlite3.Error):  # e.g. made by a newer version
                raise
            raise StoreError(self._cannot_open(cause)) from cause
        except BaseException:
            self._writer.close()
            self._release_claim()
            raise
        if claim:
            try:
                self.claim()
            except BaseException:
                self.close()
                raise
        # "ok", or the first problems found: a damaged file still opens, and /v1/health says so.
        self.integrity = self._quick_check()

    def _connect(self) -> sqlite3.Connection:
        # isolation_level=None: no implicit transactions; writes open their own, short ones.
        conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None,
                               check_same_thread=False)
        conn.row_factory = sqlite3.Row
        conn.execute("PRAGMA foreign_keys = ON")
        return conn

    def _cannot_open(self, exc: sqlite3.Error) -> str:
        code = _primary_code(exc)
        # On a read-only file system, or in a directory it may not write, SQLite cannot make the
        # -shm file of a WAL database: "unable to open database file" (CANTOPEN).
        unwritable = any(p.exists() and not os.access(p, os.W_OK) for p in (self.path, self.path.parent))
        if code == sqlite3.SQLITE_READONLY or (code == sqlite3.SQLITE_CANTOPEN and unwritable):
            return (f"the database {self.path} or its directory is read-only ({exc}): the server writes "
                    "the file, and -wal and -shm files beside it; make both writable, or give it another "
                    "database (--db or AUTOTUNE_DB)")
        return f"cannot open the database {self.path}: {exc}"

    def _quick_check(self) -> str:
        """``PRAGMA quick_check``: "ok", or its first problems (https://sqlite.org/pragma.html#pragma_quick_check).

        Not integrity_check: that also cross-checks every index entry, and is much slower on a
        large file; quick_check still reads every page and catches damaged ones.
        """
        try:
            with self._lock:
                rows = self._writer.execute(f"PRAGMA quick_check({INTEGRITY_PROBLEMS})").fetchall()
            # One problem a line, under a "*** in database main ***" heading: one line here.
            lines = [line for row in rows for line in str(row[0]).splitlines() if not line.startswith("***")]
            result = "; ".join(lines[:INTEGRITY_PROBLEMS])
        except sqlite3.DatabaseError as exc:  # so damaged that the check itself stops
            result = f"quick_check stopped: {exc}"
        if result == "ok":
            log.info("database %s: quick_check ok", self.path)
        else:
            log.error("database %s is damaged, PRAGMA quick_check says: %s", self.path, result)
        return result

    def close(self) -> None:
        with self._lock:
            self._writer.close()
            self._release_claim()

    def claim(self) -> None:
        """Make this process the one server of the database file, or raise StoreError.

        A second server would requeue the first one's running runs and probe the same GPU
        twice. An flock on the database file (see ``_spare_claims``), whatever path reaches it:
        the kernel drops it when the process dies, however it dies, and worker processes do not
        inherit it (subprocess closes their fds). Then a write, which a server must be able to
        make: SQLite opens a read-only file for reading without a word.
        """
        if self._claim is None:
            self._take_claim()
        try:
            self._check_writable()
        except BaseException:
            with self._lock:
                self._release_claim()
            raise

    def _take_claim(self) -> None:
        """The flock of ``claim``, after refusing a file with a second name."""
        try:
            import fcntl
        except ImportError:  # not POSIX: no claim, one server by convention
            return
        self._refuse_hard_links()
        try:
            handle = _open_for_claim(self.path)
        except OSError as exc:
            raise StoreError(f"cannot open the database {self.path} to claim it: {exc}") from exc
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            _keep_for_claims(handle)
            if isinstance(exc, BlockingIOError):
                raise StoreError(
                    f"another autotune server uses the database {self.path}: stop it, or give this "
                    "one another database (--db or AUTOTUNE_DB)"
                ) from exc
            raise StoreError(f"cannot lock the database {self.path}: {exc}") from exc
        self._claim = handle

    def _refuse_hard_links(self) -> None:
        """StoreError for a database file with more than one name (a hard link): SQLite keeps the
        -wal of a database beside the name it was opened by, so a server through one name and a
        server or the sqlite3 tool through another each see the file without the other's -wal,
        and the next open through the first name replays its old -wal over the other's writes
        (https://sqlite.org/howtocorrupt.html, section 2.5: "Multiple links to the same file")."""
        try:
            st = os.stat(self.path)
        except OSError:
            return  # no file yet: SQLite makes it
        if st.st_nlink <= 1:
            return
        real = Path(os.path.realpath(self.path))
        others = sorted(str(p) for p in real.parent.iterdir() if p != real and _same_file(p, st))
        named = f"{others[0]}" if others else "another name elsewhere on this file system"
        raise StoreError(f"the database {self.path} has a second name, {named} (a hard link): each "
                         "name keeps its own -wal file and runs would be lost; remove the link, or give "
                         "this server another database (--db or AUTOTUNE_DB)")

    def _release_claim(self) -> None:
        if self._claim is None:
            return
        import fcntl

        fcntl.flock(self._claim, fcntl.LOCK_UN)
        _keep_for_claims(self._claim)
        self._claim = None

    def _check_writable(self) -> None:
        """StoreError when the file is read-only: SQLite opens such a file for reading, silently."""
        def rewrite_header(conn: sqlite3.Connection) -> None:
            version = int(conn.execute("PRAGMA user_version").fetchone()[0])
            conn.execute(f"PRAGMA user_version = {version}")  # a write of page 1, even unchanged

        try:
            # One try: a read-only file stays so, and a server must not start on it.
            self._write("check that the database is writable", rewrite_header, attempts=1)
        except StoreError as exc:
            cause = exc.__cause__
            if isinstance(cause, sqlite3.Error) and _primary_code(cause) == sqlite3.SQLITE_READONLY:
                raise StoreError(self._cannot_open(cause)) from cause
            raise

    # --- transactions -------------------------------------------------------------------

    def _retrying(self, operation: str, attempt: Callable[[], T], attempts: int | None = None) -> T:
        """``attempt()``, tried again while it fails with a transient error and tries are left
        (``attempts``, else the store's).

        Every sqlite3 error it finally raises becomes a StoreError naming ``operation``.
        """
        attempts = self.attempts if attempts is None else attempts
        delay_s = self.retry_delay_s
        tries = 0
        while True:
            tries += 1
            try:
                return attempt()
            except sqlite3.Error as exc:
                if not is_transient(exc) or tries >= attempts:
                    spent = f" (tried {tries} times)" if tries > 1 else ""
                    raise StoreError(f"cannot {operation} in the database {self.path}: {exc}{spent}") from exc
                log.warning("cannot %s in the database %s: %s; try %d of %d in %.2f s",
                            operation, self.path, exc, tries + 1, attempts, delay_s)
            time.sleep(delay_s)
            delay_s *= 2

    def _write(self, operation: str, write: Callable[[sqlite3.Connection], T],
               attempts: int | None = None) -> T:
        """``write(conn)`` on the one writer, in a transaction that holds SQLite's write lock
        from its start; rolled back and tried again on a transient error (``_retrying``), so
        ``write`` must only touch the database."""
        def transaction() -> T:
            conn = self._writer
            self._rollback(conn)  # one a failed ROLLBACK left open would refuse BEGIN
            conn.execute("BEGIN IMMEDIATE")
            try:
                result = write(conn)
                conn.execute("COMMIT")
            except BaseException:
                self._rollback(conn)
                raise
            return result

        with self._lock:  # held through the waits too: writes keep their order
            try:
                result = self._retrying(operation, transaction, attempts)
            except StoreError as exc:
                if is_unavailable(exc):
                    self.write_failure = str(exc.__cause__)
                raise
            self.write_failure = None
            return result

    def probe_writable(self) -> bool:
        """Whether a write that needs a new page succeeds now (one try; nothing is left of it):
        the reconciler asks while ``write_failure`` is set, so that health sees the disk freed."""
        def grow(conn: sqlite3.Connection) -> None:
            # A row larger than a page, deleted in the same transaction: the file must grow to take
            # it (a full disk refuses that), and the commit writes its pages to the -wal.
            conn.execute("INSERT INTO _migrations (id, name, applied_at) VALUES (-1, ?, '')",
                         ("probe " + "x" * 8192,))
            conn.execute("DELETE FROM _migrations WHERE id = -1")

        try:
            self._write("check that the database can be written", grow, attempts=1)
        except StoreError:
            return False
        return True

    @staticmethod
    def _rollback(conn: sqlite3.Connection) -> None:
        # SQLite may have rolled back already (after FULL, IOERR, BUSY: https://sqlite.org/lang_transaction.html).
        with contextlib.suppress(sqlite3.Error):
            if conn.in_transaction:
                conn.execute("ROLLBACK")

    def _read(self, operation: str, read: Callable[[sqlite3.Connection], T]) -> T:
        """``read(conn)`` on a connection of its own, tried like a write (a fresh one each try)."""
        def attempt() -> T:
            conn = self._connect()
            try:
                return read(conn)
            finally:
                conn.close()

        return self._retrying(operation, attempt)

    # --- migrations ---------------------------------------------------------------------

    def migrate(self) -> list[str]:
        """Apply the migrations this database lacks, in order; return their names."""
        def apply(conn: sqlite3.Connection) -> list[str]:
            applied: list[str] = []
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

        return self._write("apply the migrations", apply)

    def migrations(self) -> list[tuple[int, str]]:
        rows = self._read("read the migrations", lambda conn: conn.execute(
            "SELECT id, name FROM _migrations ORDER BY id").fetchall())
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
        def create(conn: sqlite3.Connection) -> tuple[Run, bool]:
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

        return self._write(f"create a run of {model}", create)

    def _update(self, operation: str, sql: str, params: Sequence[Any]) -> bool:
        """One UPDATE or INSERT as a write; whether it changed exactly one row."""
        return self._write(operation, lambda conn: conn.execute(sql, params).rowcount == 1)

    def mark_running(self, run_id: str, *, lane: str, worker_pid: int | None) -> bool:
        """queued -> running; False if the run is no longer queued (e.g. cancelled)."""
        return self._update(
            f"mark run {run_id} running",
            "UPDATE runs SET status = 'running', lane = ?, worker_pid = ?, attempts = attempts + 1, "
            "started_at = coalesce(started_at, ?), error = NULL WHERE id = ? AND status = 'queued'",
            (lane, worker_pid, _now(), run_id),
        )

    def set_header(self, run_id: str, header: dict[str, Any]) -> bool:
        return self._update(f"record the header of run {run_id}",
                            "UPDATE runs SET header = ? WHERE id = ? AND status = 'running'",
                            (json.dumps(header, sort_keys=True), run_id))

    def add_cell(self, run_id: str, position: int, cell: dict[str, Any]) -> bool:
        """Record a finished cell of a running run; a cell already recorded is kept as it is.

        False when the run is not running (cancelled meanwhile) or the cell was there.
        """
        return self._update(
            f"record cell {position} of run {run_id}",
            "INSERT INTO cells (run_id, position, mode, seq_len, data, finished_at) "
            "SELECT ?, ?, ?, ?, ?, ? WHERE EXISTS "
            "(SELECT 1 FROM runs WHERE id = ? AND status = 'running') "
            "ON CONFLICT (run_id, mode, seq_len) DO NOTHING",
            (run_id, position, cell["mode"], cell["seq_len"], json.dumps(cell), _now(), run_id),
        )

    def finish_run(self, run_id: str, status: str, *, error: str | None = None,
                   elapsed_s: float | None = None) -> bool:
        """queued | running -> done | failed; False if the run is neither (cancelled meanwhile)."""
        if status not in ("done", "failed"):
            raise ValueError(f"a run finishes done or failed, not {status!r}")
        return self._update(
            f"record run {run_id} {status}",
            "UPDATE runs SET status = ?, error = ?, elapsed_s = ?, finished_at = ? "
            "WHERE id = ? AND status IN ('queued', 'running')",
            (status, error, elapsed_s, _now(), run_id),
        )

    def import_run(
        self, *, key: str, model: str, gpu: str, spec: dict[str, Any], total: int, header: dict[str, Any],
        cells: Sequence[tuple[int, dict[str, Any]]], elapsed_s: float | None = None,
    ) -> tuple[Run, str]:
        """A finished cuda run of a measured table read from a file (api/measurements.py), and
        what became of it: ``imported``, ``unchanged`` or ``replaced``.

        ``header["imported"]`` names the file's ``source`` (the import's identity) and ``sha256``
        (its content). The earlier import of the same source is kept as it is when its content is
        the same, else rewritten in place (same id, the new spec, header and cells); runs of this
        service and imports of other sources are never touched. One transaction.
        """
        source, digest = header["imported"]["source"], header["imported"]["sha256"]

        def write(conn: sqlite3.Connection) -> tuple[Run, str]:
            earlier = self._imported_run(conn, source)
            now = _now()
            if earlier is not None and (earlier.imported or {}).get("sha256") == digest:
                return earlier, "unchanged"
            values = (key, model, gpu, json.dumps(spec, sort_keys=True), total,
                      json.dumps(header, sort_keys=True), elapsed_s, now)
            if earlier is None:
                run_id = uuid.uuid4().hex
                conn.execute(
                    "INSERT INTO runs (id, key, model, gpu, backend, status, spec, total, header, elapsed_s, "
                    "finished_at, created_at) VALUES (?, ?, ?, ?, 'cuda', 'done', ?, ?, ?, ?, ?, ?)",
                    (run_id, *values, now),
                )
            else:
                run_id = earlier.id
                conn.execute(
                    "UPDATE runs SET key = ?, model = ?, gpu = ?, spec = ?, total = ?, header = ?, "
                    "elapsed_s = ?, finished_at = ?, status = 'done', error = NULL WHERE id = ?",
                    (*values, run_id),
                )
                conn.execute("DELETE FROM cells WHERE run_id = ?", (run_id,))
            conn.executemany(
                "INSERT INTO cells (run_id, position, mode, seq_len, data, finished_at) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                [(run_id, position, cell["mode"], cell["seq_len"], json.dumps(cell), now)
                 for position, cell in cells],
            )
            row = conn.execute(f"SELECT {_RUN_COLUMNS} FROM runs WHERE id = ?", (run_id,)).fetchone()
            return _run(row), "imported" if earlier is None else "replaced"

        return self._write(f"import the measured table {source}", write)

    @staticmethod
    def _imported_run(conn: sqlite3.Connection, source: str) -> Run | None:
        """The newest run imported from ``source``, if any. The LIKE narrows the rows to read to
        imports (headers are stored with json.dumps, so the key reads ``"imported":``); the
        source is compared decoded."""
        rows = conn.execute(f"SELECT {_RUN_COLUMNS} FROM runs WHERE backend = 'cuda' AND "
                            "header LIKE '%\"imported\":%' ORDER BY seq DESC").fetchall()
        return next((run for run in map(_run, rows) if (run.imported or {}).get("source") == source), None)

    def cancel_run(self, run_id: str) -> Run | None:
        """queued | running -> cancelled; the run afterwards (None if there is no such run)."""
        def cancel(conn: sqlite3.Connection) -> Run | None:
            conn.execute(
                "UPDATE runs SET status = 'cancelled', finished_at = ?, error = 'cancelled by request' "
                "WHERE id = ? AND status IN ('queued', 'running')",
                (_now(), run_id),
            )
            row = conn.execute(f"SELECT {_RUN_COLUMNS} FROM runs WHERE id = ?", (run_id,)).fetchone()
            return _run(row) if row is not None else None

        return self._write(f"cancel run {run_id}", cancel)

    def requeue_interrupted(self) -> list[str]:
        """running -> queued for runs a stopped server left behind; their cells stay."""
        def requeue(conn: sqlite3.Connection) -> list[str]:
            ids = [r["id"] for r in conn.execute("SELECT id FROM runs WHERE status = 'running' ORDER BY seq")]
            conn.execute("UPDATE runs SET status = 'queued', lane = NULL, worker_pid = NULL "
                         "WHERE status = 'running'")
            return ids

        return self._write("requeue the interrupted runs", requeue)

    def requeue_run(self, run_id: str) -> bool:
        """running -> queued for one run no worker holds (the reconciler); its cells stay."""
        return self._update(f"requeue run {run_id}",
                            "UPDATE runs SET status = 'queued', lane = NULL, worker_pid = NULL "
                            "WHERE id = ? AND status = 'running'", (run_id,))

    # --- reads --------------------------------------------------------------------------

    def get_run(self, run_id: str) -> Run | None:
        row = self._read(f"read run {run_id}", lambda conn: conn.execute(
            f"SELECT {_RUN_COLUMNS} FROM runs WHERE id = ?", (run_id,)).fetchone())
        return _run(row) if row is not None else None

    def cells(self, run_id: str) -> list[dict[str, Any]]:
        """The run's finished cells in the tuner's order, as CellResult.to_dict() made them."""
        rows = self._read(f"read the cells of run {run_id}", lambda conn: conn.execute(
            "SELECT data FROM cells WHERE run_id = ? ORDER BY position, mode, seq_len", (run_id,)).fetchall())
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

        def page(conn: sqlite3.Connection) -> tuple[list[sqlite3.Row], int]:
            total = conn.execute(f"SELECT count(*) FROM runs {clause}", params).fetchone()[0]
            rows = conn.execute(
                f"SELECT {_RUN_COLUMNS} FROM runs {clause} ORDER BY seq DESC LIMIT ? OFFSET ?",
                (*params, limit, offset),
            ).fetchall()
            return rows, total

        rows, total = self._read("list runs", page)
        return [_run(r) for r in rows], total

    def distinct(self, column: str) -> list[str]:
        """The values of ``model`` or ``gpu`` that runs have, sorted: the dashboard's filter choices."""
        if column not in ("model", "gpu"):
            raise ValueError(f"distinct() takes 'model' or 'gpu', not {column!r}")
        query = f"SELECT DISTINCT {column} AS v FROM runs ORDER BY v COLLATE NOCASE"
        rows = self._read(f"list the {column}s of runs", lambda conn: conn.execute(query).fetchall())
        return [r["v"] for r in rows]

    def queued_runs(self) -> list[Run]:
        """Queued runs, oldest first: the order they start in."""
        rows = self._read("list the queued runs", lambda conn: conn.execute(
            f"SELECT {_RUN_COLUMNS} FROM runs WHERE status = 'queued' ORDER BY seq").fetchall())
        return [_run(r) for r in rows]

    def counts(self) -> dict[str, int]:
        """Runs per status (every status, 0 included)."""
        rows = self._read("count the runs", lambda conn: conn.execute(
            "SELECT status, count(*) AS n FROM runs GROUP BY status").fetchall())
        return {status: 0 for status in STATUSES} | {r["status"]: r["n"] for r in rows}
