"""``autotune serve`` as a real uvicorn process on a loopback port: the HTTP flow, and a server
killed mid-run that, started again, finishes the run keeping the cells it had."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from liveserver import Server

from api.store import Store
from autotune.cli.serve import check_bind, is_loopback
from autotune.cli.serve import main as serve_main

TINY = {"model": "tiny-bert", "seq_lens": [32, 64], "modes": ["fp32"], "gpu_memory": "1GiB",
        "max_batch": 64, "backend": "estimate"}


@pytest.fixture
def servers(tmp_path):
    started: list[Server] = []

    def start(**env) -> Server:
        server = Server(tmp_path / "serve.db", tmp_path / "serve.log", **env)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def finished(table):
    return table["status"] not in ("queued", "running")


def process_gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")  # a zombie runs nothing


def test_post_poll_table_over_http(servers):
    server = servers()
    response = server.client.post("/v1/tables", json=TINY)
    assert response.status_code == 202
    accepted = response.json()
    assert accepted["url"] == f"{server.url}/v1/tables/{accepted['id']}"
    table = server.wait_for(accepted["url"], finished)
    assert table["status"] == "done" and table["progress"] == {"done": 2, "total": 2}
    assert [c["max_batch_size"] for c in table["cells"]] == [64, 64]
    assert all(p["outcome"] == "fits" for c in table["cells"] for p in c["probe_log"])
    assert server.client.post("/v1/tables", json=TINY).status_code == 200  # identical: the finished run
    docs = server.client.get("/openapi.json").json()
    assert {"/v1/health", "/v1/tables", "/v1/tables/{table_id}"} <= set(docs["paths"])


def test_a_server_killed_mid_run_resumes_it_keeping_finished_cells(servers, tmp_path):
    # Six cells, one after another: the kill comes at the first poll (every 100 ms) that sees one done,
    # long before the sixth (five more cells of the warm worker); the second server sends the rest.
    # Every 20 ms, the polls of the first cell (its worker importing torch: 5-20 s) cost seconds of CPU
    # (a poll: 1.9 ms of the server's, 0.7 ms of this process's, measured).
    body = dict(TINY, seq_lens=[16, 32, 48], modes=["fp32", "amp"])
    first = servers(AUTOTUNE_API_TOKEN="t0ken")
    auth = {"Authorization": "Bearer t0ken"}
    accepted = first.client.post("/v1/tables", json=body, headers=auth).json()
    first.wait_for(accepted["url"], lambda t: t["progress"]["done"] >= 1, step_s=0.1)
    first.kill()

    store = Store(tmp_path / "serve.db")  # what the killed server left
    run = store.get_run(accepted["id"])
    kept = store.cells(run.id)
    store.close()
    assert run.status == "running" and 1 <= len(kept) < 6
    # Its worker saw the server go (stdin closed) and took its process group down with it.
    deadline = time.monotonic() + 30
    while not process_gone(run.worker_pid):
        assert time.monotonic() < deadline, "the worker outlived its server"
        time.sleep(0.05)

    second = servers(AUTOTUNE_API_TOKEN="t0ken")
    url = f"{second.url}/v1/tables/{accepted['id']}"
    table = second.wait_for(url, finished)
    assert table["status"] == "done" and table["error"] is None
    assert table["progress"] == {"done": 6, "total": 6} and table["attempts"] == 2
    assert table["cells"][:len(kept)] == kept  # exactly as they were, probes and all
    assert [(c["mode"], c["seq_len"]) for c in table["cells"]] == [
        (mode, seq) for mode in ("fp32", "amp") for seq in body["seq_lens"]]
    maxes = [c["max_batch_size"] for c in table["cells"]]
    assert all(m is not None and m > 0 for m in maxes)
    again = second.client.post("/v1/tables", json=body, headers=auth)
    assert again.status_code == 200 and again.json()["id"] == accepted["id"]


def test_serve_binds_beyond_loopback_only_with_a_token(capsys, monkeypatch):
    monkeypatch.delenv("AUTOTUNE_API_TOKEN", raising=False)
    assert serve_main(["--host", "0.0.0.0"]) == 2
    assert capsys.readouterr().err == (
        "Error: binding to 0.0.0.0 makes the API reachable from other machines: set AUTOTUNE_API_TOKEN "
        "(write requests must then send 'Authorization: Bearer <token>'), or bind to 127.0.0.1\n")
    check_bind("0.0.0.0", "a-token")  # with a token: allowed
    assert all(is_loopback(h) for h in ("127.0.0.1", "127.1.2.3", "::1", "[::1]", "localhost"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "::", "10.0.0.1", "example.com"))


def test_serve_refuses_a_database_another_server_holds(tmp_path, capsys):
    holder = Store(tmp_path / "held.db")
    holder.claim()
    try:
        assert serve_main(["--db", str(tmp_path / "held.db")]) == 2
    finally:
        holder.close()
    assert capsys.readouterr().err.startswith(
        f"Error: another autotune server uses the database {tmp_path / 'held.db'}: stop it")


def test_serve_refuses_a_hard_link_of_a_live_database_before_writing_beside_it(tmp_path, capsys):
    # Issue #37: refused only after SQLite had opened the link, its -wal left beside it was later
    # replayed over the real file. The serve command claims the file before SQLite opens it.
    holder = Store(tmp_path / "held.db", claim=True)
    os.link(tmp_path / "held.db", tmp_path / "link.db")
    try:
        assert serve_main(["--db", str(tmp_path / "link.db")]) == 2
    finally:
        holder.close()
    assert capsys.readouterr().err.startswith(
        f"Error: the database {tmp_path / 'link.db'} has a second name, {tmp_path / 'held.db'} (a hard link)")
    assert not (tmp_path / "link.db-wal").exists() and not (tmp_path / "link.db-shm").exists()
