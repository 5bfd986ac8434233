"""GET /v1/check: from a stored measured table when one covers the cell, else estimated; and
`autotune check --server` against a real server."""

from __future__ import annotations

import json

import pytest
from liveserver import Server

from api.runs.spec import normalize
from autotune.cli import main

QUERY = {"model": "tiny-bert", "seq_len": 64, "batch_size": 8, "gpu_memory": "1GiB"}


@pytest.fixture
def client(idle_client):
    return idle_client


def _store_measured_table(client, max_batch: int) -> str:
    """A finished cuda-backend run covering tiny-bert seq 64 fp32 on 1 GiB, as a GPU host stores it."""
    queue = client.app.state.queue
    body = {"model": "tiny-bert", "seq_lens": [64], "modes": ["fp32", "amp+ckpt"], "gpu_memory": "1GiB",
            "backend": "estimate"}
    spec = normalize(body, client.app.state.settings, queue.runner.environment)
    spec = type(spec).from_json({**spec.to_json(), "backend": "cuda",
                                 "environment": {**spec.environment, "backend": "cuda"}})
    run, _ = queue.store.create_run(key=spec.key(), spec=spec.to_json(), model=spec.model,
                                   gpu=spec.gpu["name"], backend="cuda", total=2)
    queue.store.mark_running(run.id, lane="cuda:0", worker_pid=None)
    probes = [{"batch_size": b, "outcome": "fits" if b <= max_batch else "oom",
               "peak_bytes": 1000 * b, "peak_reserved_bytes": 1000 * b}
              for b in (4, max_batch, max_batch + 1)]
    for position, (mode, best) in enumerate((("fp32", max_batch), ("amp+ckpt", 3 * max_batch))):
        queue.store.add_cell(run.id, position, {
            "seq_len": 64, "mode": mode, "max_batch_size": best, "peak_memory_bytes": 1000 * best,
            "peak_allocated_bytes": 900 * best, "probes": 3, "capped": False, "backend": "cuda",
            "step_time_s": 0.01, "error": None, "probe_log": probes})
    queue.store.finish_run(run.id, "done")
    return run.id


def test_a_stored_measured_table_answers(client):
    table_id = _store_measured_table(client, max_batch=6)
    doc = client.get("/v1/check", params=QUERY).json()
    assert doc["source"] == "measured" and doc["table_id"] == table_id
    assert doc["fits"] is False and doc["max_batch_size"] == 6
    assert doc["suggestion"] == ("use batch 4 x 2 accumulation steps for an effective 8, "
                                 "or mode amp+ckpt (max 18)")
    assert doc["peak_memory_bytes"] == 8000  # on the line through the probes at 4 and 6
    fitting = client.get("/v1/check", params=QUERY | {"batch_size": 4}).json()
    assert fitting["fits"] is True and fitting["peak_memory_bytes"] == 4000


def test_without_a_stored_table_the_estimator_answers(client):
    doc = client.get("/v1/check", params=QUERY).json()
    assert doc["source"] == "estimated" and doc["backend"] == "estimate" and doc["table_id"] is None
    assert doc["fits"] is True and doc["max_batch_size"] > 8
    for key in ("peak_memory_bytes", "budget_bytes", "suggestion", "message"):
        assert key in doc


@pytest.mark.parametrize(("changes", "status", "text"), [
    ({"model": "no-such-model"}, 404, "unknown model 'no-such-model'"),
    ({"seq_len": 1024}, 422, "sequence length 1024 exceeds max_position_embeddings=128 of tiny-bert"),
    ({"gpu_memory": "12 gigs"}, 422, "invalid memory size '12 gigs'"),
    ({"mode": "fp8"}, 422, "unknown mode 'fp8'"),
])
def test_bad_input(client, changes, status, text):
    response = client.get("/v1/check", params=QUERY | changes)
    assert response.status_code == status and text in response.json()["detail"]


def test_cli_check_against_a_real_server(tmp_path, capsys):
    server = Server(tmp_path / "server.db", tmp_path / "server.log")
    try:
        code = main(["check", "tiny-bert", "--seq-len", "64", "--batch-size", "8", "--gpu-memory", "1GiB",
                     "--server", server.url, "--json"])
        doc = json.loads(capsys.readouterr().out)
        assert code == 0 and doc["fits"] is True and doc["source"] == "estimated"
        code = main(["check", "tiny-bert", "--seq-len", "1024", "--batch-size", "8", "--server", server.url])
        assert code == 2
        assert "answered 422: sequence length 1024 exceeds" in capsys.readouterr().err
    finally:
        server.stop()
