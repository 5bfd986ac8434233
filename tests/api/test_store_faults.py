"""The store under faults (issue #13): a read-only file, a damaged file, a full disk, a lock held.

Real SQLite throughout: ``PRAGMA max_page_count`` makes a full disk (https://sqlite.org/pragma.html),
file modes make a read-only one, garbage written into pages makes a damaged one.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import socket
import sqlite3
import stat
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

import api.store
from api.store import Store
from autotune.errors import StoreError

REPO = Path(__file__).resolve().parents[2]
PAGE_BYTES = 4096  # SQLite's default page size


def _create(store, key="k1", spec_bytes=0):
    spec = {"seq_lens": [32], "modes": ["fp32"], "padding": "x" * spec_bytes}
    return store.create_run(key=key, model="tiny-bert", gpu="T4", backend="estimate", spec=spec, total=1)[0]


class Retries(logging.Handler):
    """The store's retry warnings, as they happen."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []
        self.first = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if " try " in record.getMessage():
            self.messages.append(record.getMessage())
            self.first.set()


@pytest.fixture
def retries():
    handler = Retries()
    logger = logging.getLogger("autotune.api")
    level = logger.level
    logger.setLevel(logging.WARNING)
    logger.addHandler(handler)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(level)


def _fill_the_disk(store: Store) -> None:
    """From now on the database cannot grow by a page: SQLITE_FULL, as on a full disk."""
    pages = store._writer.execute("PRAGMA page_count").fetchone()[0]
    store._writer.execute(f"PRAGMA max_page_count = {pages}")


def _fill_the_disk_and_its_free_pages(store: Store) -> None:
    """``_fill_the_disk``, and the pages the file has free (a row rewritten leaves some) taken by a
    filler table: a write that needs a page finds none."""
    store._writer.execute("CREATE TABLE IF NOT EXISTS filler (x BLOB)")
    _fill_the_disk(store)
    with contextlib.suppress(sqlite3.OperationalError):  # database or disk is full
        while True:
            store._writer.execute("INSERT INTO filler VALUES (zeroblob(3000))")


def _free_the_disk(store: Store) -> None:
    store._writer.execute("PRAGMA max_page_count = 1073741823")


# --- write retries ---------------------------------------------------------------------------


def test_a_write_on_a_full_disk_is_retried_and_lands_when_space_returns(tmp_path, retries):
    store = Store(tmp_path / "runs.db", attempts=8, retry_delay_s=0.05)
    _fill_the_disk(store)
    freer = threading.Thread(target=lambda: retries.first.wait(30) and _free_the_disk(store))
    freer.start()
    run = _create(store, spec_bytes=20_000)  # overflow pages: the file must grow
    freer.join()
    assert store.get_run(run.id) == run
    assert retries.messages and retries.messages[0].startswith(
        f"cannot create a run of tiny-bert in the database {store.path}: database or disk is full; "
        "try 2 of 8")
    store.close()


def test_a_write_that_keeps_failing_raises_store_error_naming_it_after_its_tries(tmp_path, retries):
    store = Store(tmp_path / "runs.db", attempts=3, retry_delay_s=0.01)
    _fill_the_disk(store)
    with pytest.raises(StoreError, match=re.escape(
            f"cannot create a run of tiny-bert in the database {store.path}: database or disk is full "
            "(tried 3 times)")):
        _create(store, spec_bytes=20_000)
    assert len(retries.messages) == 2
    _free_the_disk(store)  # the failed transaction was rolled back: the store goes on
    assert _create(store, spec_bytes=20_000).status == "queued" and store.counts()["queued"] == 1
    store.close()


def test_a_write_blocked_by_another_connection_tries_a_bounded_number_of_times(tmp_path, monkeypatch,
                                                                             retries):
    monkeypatch.setattr(api.store, "BUSY_TIMEOUT_S", 0.05)  # SQLite's own wait, before each try
    store = Store(tmp_path / "runs.db", attempts=2, retry_delay_s=0.01)
    run = _create(store)
    holder = sqlite3.connect(store.path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another process's write, never finishing
    with pytest.raises(StoreError, match=re.escape(
            f"cannot mark run {run.id} running in the database {store.path}: database is locked "
            "(tried 2 times)")):
        store.mark_running(run.id, lane="estimate:0", worker_pid=None)
    assert len(retries.messages) == 1
    holder.execute("ROLLBACK")
    assert store.mark_running(run.id, lane="estimate:0", worker_pid=None)
    holder.close()
    store.close()


def test_retries_wait_twice_as_long_each_time_and_stop_at_the_attempts(tmp_path, monkeypatch):
    store = Store(tmp_path / "runs.db")
    waits: list[float] = []
    monkeypatch.setattr(api.store, "time", SimpleNamespace(sleep=waits.append))  # the store's waits only
    tries = []

    def busy(conn):
        tries.append(1)
        raise _error(sqlite3.OperationalError, "database is locked", sqlite3.SQLITE_BUSY)

    with pytest.raises(StoreError, match=r"cannot count the runs .*: database is locked \(tried 5 times\)$"):
        store._read("count the runs", busy)
    assert len(tries) == api.store.ATTEMPTS == 5 and waits == [0.05, 0.1, 0.2, 0.4]
    tries.clear()
    with pytest.raises(StoreError, match=r"no such table: missing$"):  # not transient: no second try
        store._read("read", lambda conn: tries.append(1) or conn.execute("SELECT * FROM missing"))
    assert len(tries) == 1
    store.close()


def _error(kind, message, code):
    exc = kind(message)
    exc.sqlite_errorcode = code  # as sqlite3 sets it on the errors it raises
    return exc


WRITES = {
    "migrate": lambda s, run: s.migrate(),
    "create_run": lambda s, run: _create(s, key="another"),
    "mark_running": lambda s, run: s.mark_running(run.id, lane="estimate:0", worker_pid=None),
    "set_header": lambda s, run: s.set_header(run.id, {"torch": "2"}),
    "add_cell": lambda s, run: s.add_cell(run.id, 0, {"mode": "fp32", "seq_len": 32}),
    "finish_run": lambda s, run: s.finish_run(run.id, "done"),
    "cancel_run": lambda s, run: s.cancel_run(run.id),
    "requeue_interrupted": lambda s, run: s.requeue_interrupted(),
    "requeue_run": lambda s, run: s.requeue_run(run.id),
}


@pytest.mark.parametrize("write", WRITES.values(), ids=WRITES.keys())
def test_every_public_write_fails_with_store_error_never_a_sqlite3_error(tmp_path, write):
    store = Store(tmp_path / "runs.db")
    run = _create(store)
    store.close()  # e.g. a runner event arriving after shutdown
    with pytest.raises(StoreError, match=f"in the database {re.escape(str(store.path))}: "
                                         "Cannot operate on a closed database.$"):
        write(store, run)


READS = {
    "migrations": lambda s, run: s.migrations(),
    "get_run": lambda s, run: s.get_run(run.id),
    "cells": lambda s, run: s.cells(run.id),
    "list_runs": lambda s, run: s.list_runs(),
    "distinct": lambda s, run: s.distinct("model"),
    "queued_runs": lambda s, run: s.queued_runs(),
    "counts": lambda s, run: s.counts(),
}


@pytest.mark.parametrize("read", READS.values(), ids=READS.keys())
def test_every_public_read_fails_with_store_error_at_once_on_a_broken_file(tmp_path, read, retries):
    store = Store(tmp_path / "runs.db")
    run = _create(store)
    store.close()
    (tmp_path / "runs.db").write_bytes(b"not a database, " * 512)
    with pytest.raises(StoreError, match="file is not a database$"):
        read(store, run)
    assert retries.messages == []  # not transient: no second try


# --- integrity ---------------------------------------------------------------------------------


def _damaged_database(path: Path) -> None:
    """A database with a run of many cells, then garbage in the cell pointers of middle pages."""
    store = Store(path)
    run = _create(store)
    store.mark_running(run.id, lane="estimate:0", worker_pid=None)
    for seq_len in range(400):
        store.add_cell(run.id, seq_len, {"mode": "fp32", "seq_len": seq_len, "padding": "x" * 1000})
    store.finish_run(run.id, "done")
    store.close()  # the last connection checkpoints: every page is in the file
    pages = path.stat().st_size // PAGE_BYTES
    with path.open("r+b") as file:
        for page in range(pages // 2 - 2, pages // 2 + 2):
            file.seek(page * PAGE_BYTES + 8)  # past a leaf page's 8-byte header: its cell pointers
            file.write(b"\xff" * 16)


def test_a_sound_database_reports_ok_in_health(idle_client):
    health = idle_client.get("/v1/health").json()
    assert health["status"] == "ok"
    assert health["database"] == {"file": "idle.db", "integrity": "ok", "writable": True, "write_error": None,
                                  "backlog": 0}


def test_a_damaged_database_opens_and_health_reports_it_degraded(tmp_path, caplog):
    from fastapi.testclient import TestClient

    from api.main import create_app
    from api.runs.runner import LocalRunner
    from api.settings import Settings

    _damaged_database(tmp_path / "runs.db")
    app = create_app(Settings(db=tmp_path / "runs.db"), runner=LocalRunner(estimate_workers=0, gpu_lanes=[]))
    with (caplog.at_level(logging.INFO, logger="autotune.api"),
          TestClient(app, base_url="http://localhost") as client):
        integrity = client.app.state.queue.store.integrity
        health = client.get("/v1/health").json()
    assert integrity != "ok" and "page" in integrity and "\n" not in integrity
    assert health["status"] == "degraded"
    assert health["database"] == {"file": "runs.db", "integrity": integrity, "writable": True,
                                  "write_error": None, "backlog": 0}
    assert health["queue"]["done"] == 1  # what still reads is served
    damaged = f"database {tmp_path / 'runs.db'} is damaged, PRAGMA quick_check says: {integrity}"
    assert damaged in caplog.messages


def test_a_full_disk_is_degraded_in_health_shown_on_the_run_page_and_a_refused_post_is_503(make_client,
                                                                                            tmp_path):
    # Issue #37 (7a): during a full disk health said "ok", the run page showed nothing, and a POST
    # the database refused was a 500. Now: 503 with Retry-After, health degraded with the backlog,
    # the run page says what waits; and once space returns every result is written.
    # PRAGMA max_page_count refuses a write that needs a new page, where a full disk refuses any: a
    # classifier of 1000 labels (its config is the run's spec) and a cell of 80 probes need pages.
    models = tmp_path / "models" / "classifier"
    models.mkdir(parents=True)
    labels = {str(i): f"label number {i}" for i in range(1000)}
    (models / "config.json").write_text(json.dumps({
        "model_type": "bert", "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
        "intermediate_size": 64, "vocab_size": 128, "max_position_embeddings": 128, "id2label": labels}))
    client = make_client(reconcile_s=3600, model_dirs=(tmp_path / "models",))  # passes run by the test
    queue = client.app.state.queue
    store = queue.store
    table = {"model": str(models), "backend": "estimate", "seq_lens": [32], "modes": ["fp32"], "gpu": "T4"}
    accepted = client.post("/v1/tables", json=table)
    assert accepted.status_code == 202, accepted.text
    run_id = accepted.json()["id"]
    assert store.mark_running(run_id, lane="estimate:0", worker_pid=None)
    oom = ("CUDA out of memory. Tried to allocate 1.50 GiB. GPU 0 has a total capacity of 14.56 GiB of "
           "which 1.02 GiB is free. Of the allocated memory 12.10 GiB is allocated by PyTorch")
    probes = [{"batch_size": b, "outcome": "oom", "peak_bytes": 10**9 + b, "peak_allocated_bytes": 10**9,
               "peak_reserved_bytes": 10**9, "step_time_s": None, "error": oom} for b in range(81, 161)]
    cell = {"mode": "fp32", "seq_len": 32, "max_batch_size": 80, "capped": True, "backend": "estimate",
            "peak_memory_bytes": 10**6, "peak_allocated_bytes": 10**6, "probes": len(probes),
            "step_time_s": None, "error": None, "probe_log": probes}

    _fill_the_disk_and_its_free_pages(store)
    queue.cell(run_id, 0, cell)  # a worker's result: kept, not lost
    refused = client.post("/v1/tables", json={**table, "seq_lens": [48]})
    assert refused.status_code == 503, refused.text
    assert int(refused.headers["Retry-After"]) == 3600
    assert "database or disk is full" in refused.json()["detail"]
    assert "nothing of this request was stored" in refused.json()["detail"]
    health = client.get("/v1/health").json()
    assert health["status"] == "degraded"
    assert health["database"] == {"file": store.path.name, "integrity": "ok", "writable": False,
                                  "write_error": "database or disk is full", "backlog": 1}
    page = client.get(f"/runs/{run_id}").text
    assert ("The server cannot write its database now (database or disk is full): 1 result of this run "
            "waits to be written, kept by the server and tried again every 3600 s.") in page

    _free_the_disk(store)
    queue.reconcile()
    assert [c["seq_len"] for c in store.cells(run_id)] == [32]  # written, nothing lost
    health = client.get("/v1/health").json()
    assert health["status"] == "ok" and health["database"]["writable"] and health["database"]["backlog"] == 0
    assert "cannot write its database" not in client.get(f"/runs/{run_id}").text
    assert sum(client.get("/v1/health").json()["queue"].values()) == 1  # the refused POST stored nothing

    # With nothing waiting, the reconciler finds the database writable again by trying a write.
    _fill_the_disk_and_its_free_pages(store)
    assert client.post("/v1/tables", json={**table, "seq_lens": [64]}).status_code == 503
    assert client.get("/v1/health").json()["database"]["writable"] is False
    _free_the_disk(store)
    queue.reconcile()
    assert client.get("/v1/health").json()["status"] == "ok"
    assert client.post("/v1/tables", json={**table, "seq_lens": [64]}).status_code == 202


def test_a_database_sqlite_cannot_open_is_a_store_error_at_start(tmp_path):
    junk = b"not a database, " * 512
    (tmp_path / "junk.db").write_bytes(junk)
    with pytest.raises(StoreError, match=f"^cannot open the database {re.escape(str(tmp_path / 'junk.db'))}: "
                                         "file is not a database$"):
        Store(tmp_path / "junk.db")
    assert (tmp_path / "junk.db").read_bytes() == junk


# --- a read-only database at start-up -------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _read_only(path: Path) -> list[str]:
    """A command prefix under which ``path`` (a file or a directory) cannot be written.

    File modes for a user; root ignores them, so for root a read-only bind mount of ``path``
    in a mount namespace of the command's own (unshare(1)), which goes with the command.
    """
    if os.geteuid() != 0:
        path.chmod(path.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
        return []
    if shutil.which("unshare") is None or subprocess.run(["unshare", "--mount", "true"]).returncode != 0:
        pytest.skip("running as root, and cannot make a mount namespace for a read-only mount")
    return ["unshare", "--mount", "sh", "-c", 'mount --bind -o ro "$1" "$1" && shift && exec "$@"', "sh",
            str(path)]


@pytest.mark.parametrize("read_only", ["file", "directory"])
def test_serve_on_a_read_only_database_is_a_one_line_error(tmp_path, read_only):
    db = tmp_path / "data" / "runs.db"
    db.parent.mkdir()
    Store(db).close()
    prefix = _read_only(db if read_only == "file" else db.parent)
    code = "import sys; from autotune.cli import main; sys.exit(main(sys.argv[1:]))"
    try:
        result = subprocess.run(
            [*prefix, sys.executable, "-c", code, "serve", "--db", str(db), "--port", str(_free_port())],
            cwd=REPO, capture_output=True, text=True, timeout=120)
    finally:
        db.parent.chmod(0o700)
        db.chmod(0o600)
    # SQLite's own words vary: a read-only file system leaves it unable to make the -shm file.
    assert result.returncode == 2 and re.fullmatch(
        re.escape(f"Error: the database {db} or its directory is read-only (")
        + "(attempt to write a readonly database|unable to open database file)"
        + re.escape("): the server writes the file, and -wal and -shm files beside it; make both writable, "
                    "or give it another database (--db or AUTOTUNE_DB)\n"), result.stderr), result.stderr
