"""The API with its real runner: POST -> poll -> table, dedupe, cancel, worker crashes.

Every run here goes through real worker processes (python -m api.runs.worker) on the estimator with
tiny-bert, so a run takes a few seconds, most of it the worker importing torch.
"""

from __future__ import annotations

import os
import signal
import sys
import textwrap
import threading
import time

import pytest
from fastapi.testclient import TestClient

from api.main import create_app
from api.runs.runner import LocalRunner
from api.settings import Settings

TINY = {"model": "tiny-bert", "seq_lens": [32, 64], "modes": ["fp32"], "gpu_memory": "1GiB",
        "max_batch": 64, "backend": "estimate"}
CELL_FIELDS = {"seq_len", "mode", "max_batch_size", "peak_memory_bytes", "peak_allocated_bytes", "probes",
               "capped", "backend", "step_time_s", "error", "probe_log"}
PROBE_FIELDS = {"batch_size", "outcome", "peak_allocated_bytes", "peak_reserved_bytes", "step_time_s"}
TIMEOUT_S = 90.0  # for a run of a few tiny cells, worker start included, on a busy 2-core machine


@pytest.fixture
def make_client(tmp_path):
    """A TestClient of a real app (real store, real LocalRunner unless one is given)."""
    clients = []

    def make(runner=None, **settings):
        app = create_app(Settings(db=tmp_path / "api.db", **({"estimate_workers": 2} | settings)),
                         runner=runner)
        client = TestClient(app, base_url="http://localhost")  # a name the server answers to
        client.__enter__()  # runs the lifespan: store, runner, queue
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.__exit__(None, None, None)


def wait_for(client, url, predicate, timeout_s=TIMEOUT_S, step_s=0.25):
    """Polled every ``step_s`` (each poll runs the app in this process): a finished run stays
    finished; a test that acts on a passing state polls faster."""
    deadline = time.monotonic() + timeout_s
    while True:
        table = client.get(url).json()
        if predicate(table):
            return table
        assert time.monotonic() < deadline, f"gave up waiting; the run is {table}"
        time.sleep(step_s)


def finished(table):
    return table["status"] not in ("queued", "running")


def test_post_poll_table_then_identical_request_gets_the_same_run(make_client):
    client = make_client()
    response = client.post("/v1/tables", json=TINY)
    assert response.status_code == 202
    accepted = response.json()
    assert accepted["status"] == "queued" and accepted["created"] is True
    assert accepted["url"].endswith(f"/v1/tables/{accepted['id']}")
    assert response.headers["location"] == accepted["url"]

    table = wait_for(client, accepted["url"], finished)
    assert table["status"] == "done" and table["error"] is None
    assert table["progress"] == {"done": 2, "total": 2}
    assert table["model"] == "tiny-bert" and table["gpu"] == "custom 1 GiB" and table["backend"] == "estimate"
    assert table["attn_used"] == "sdpa" and table["environment"]["torch"]
    assert [(c["mode"], c["seq_len"]) for c in table["cells"]] == [("fp32", 32), ("fp32", 64)]
    for cell in table["cells"]:
        assert CELL_FIELDS <= set(cell)
        assert cell["max_batch_size"] == 64 and cell["capped"] and cell["probes"] == len(cell["probe_log"])
        for probe in cell["probe_log"]:
            assert PROBE_FIELDS <= set(probe) and probe["outcome"] in ("fits", "oom", "error")
            assert probe["peak_reserved_bytes"] >= probe["peak_allocated_bytes"] > 0
        assert cell["peak_memory_bytes"] <= table["budget_bytes"]

    # The same request spelled differently: the finished run answers, 200.
    same = dict(TINY, model="TINY-BERT", seq_lens=[64, 32, 64], modes="fp32", gpu_memory="1 GiB")
    again = client.post("/v1/tables", json=same)
    assert again.status_code == 200
    assert again.json() | {"created": True} == accepted | {"status": "done"}
    assert again.json()["created"] is False
    # ?force=true measures again.
    forced = client.post("/v1/tables?force=true", json=TINY)
    assert forced.status_code == 202 and forced.json()["created"] and forced.json()["id"] != accepted["id"]

    listed = client.get("/v1/tables", params={"model": "tiny-bert"}).json()
    assert [t["id"] for t in listed["data"]] == [forced.json()["id"], accepted["id"]]
    assert listed["count"] == 2
    assert client.get("/v1/tables", params={"status": "done"}).json()["data"][0]["id"] == accepted["id"]

    cancel = client.delete(accepted["url"])
    assert cancel.status_code == 409
    assert cancel.json()["detail"] == (f"table run '{accepted['id']}' is done already: only queued or "
                                       "running runs can be cancelled")


def test_identical_requests_at_once_share_one_run(make_client):
    client = make_client()
    barrier = threading.Barrier(4)
    responses = []

    def post():
        barrier.wait()
        responses.append(client.post("/v1/tables", json=TINY))

    threads = [threading.Thread(target=post) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=TIMEOUT_S)
    assert [r.status_code for r in responses] == [202] * 4
    assert len({r.json()["id"] for r in responses}) == 1
    assert sum(r.json()["created"] for r in responses) == 1
    # While it runs, the identical request gets it with 202.
    again = client.post("/v1/tables", json=TINY)
    assert again.status_code in (200, 202) and again.json()["id"] == responses[0].json()["id"]
    assert client.get("/v1/tables").json()["count"] == 1


def test_cancel_stops_a_running_run_and_keeps_its_finished_cells(make_client):
    client = make_client()
    body = dict(TINY, seq_lens=[16, 32, 48, 64, 80, 96, 112, 128], modes=["fp32", "amp", "ckpt"])
    url = client.post("/v1/tables", json=body).json()["url"]
    wait_for(client, url, lambda t: t["progress"]["done"] >= 1, step_s=0.05)
    response = client.delete(url)
    assert response.status_code == 200
    cancelled = response.json()
    assert cancelled["status"] == "cancelled" and 1 <= cancelled["progress"]["done"] < 24
    runner = client.app.state.queue.runner
    deadline = time.monotonic() + TIMEOUT_S
    while runner.running():  # the worker stops between cells
        assert time.monotonic() < deadline
        time.sleep(0.05)
    after = client.get(url).json()
    assert after["status"] == "cancelled" and after["cells"] == cancelled["cells"]
    assert client.delete(url).status_code == 200  # cancelling again changes nothing


CRASHING_WORKER = textwrap.dedent("""
    import json, os, signal, sys
    order = json.loads(sys.stdin.readline())
    cell = {"seq_len": order["spec"]["seq_lens"][0], "mode": "fp32", "max_batch_size": 8,
            "peak_memory_bytes": 100, "peak_allocated_bytes": 90, "probes": 1, "capped": False,
            "backend": "estimate", "step_time_s": None, "error": None,
            "probe_log": [{"batch_size": 8, "outcome": "fits", "peak_bytes": 100}]}
    print(json.dumps({"op": "cell", "position": 0, "cell": cell}), flush=True)
    print("cuda kernel went wrong", file=sys.stderr, flush=True)
    os.kill(os.getpid(), signal.SIGSEGV)
""")


def test_a_worker_that_segfaults_fails_its_run_and_the_service_keeps_serving(make_client, tmp_path):
    script = tmp_path / "crashing_worker.py"
    script.write_text(CRASHING_WORKER)
    runner = LocalRunner(estimate_workers=1, gpu_lanes=[], worker_command=[sys.executable, str(script)])
    client = make_client(runner=runner)
    url = client.post("/v1/tables", json=TINY).json()["url"]
    table = wait_for(client, url, finished)
    assert table["status"] == "failed"
    assert "was killed by signal SIGSEGV after 1 of 2 cells" in table["error"]
    assert table["error"].endswith("its stderr ends with: cuda kernel went wrong")
    assert [c["seq_len"] for c in table["cells"]] == [32]  # what it finished is kept
    assert client.get("/v1/health").status_code == 200
    # The lane is free again: the next run gets a worker (which crashes the same way).
    second = client.post("/v1/tables", json=dict(TINY, seq_lens=[64])).json()
    assert second["created"] and wait_for(client, second["url"], finished)["status"] == "failed"


def test_killing_a_real_worker_fails_its_run_with_the_signal(make_client):
    client = make_client()
    accepted = client.post("/v1/tables", json=TINY).json()
    store = client.app.state.queue.store
    deadline = time.monotonic() + TIMEOUT_S
    while (pid := store.get_run(accepted["id"]).worker_pid) is None:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)  # the worker is still importing torch: seconds from finishing
    table = wait_for(client, accepted["url"], finished)
    assert table["status"] == "failed"
    assert f"the worker process (pid {pid}) was killed by signal SIGKILL after 0 of 2 cells" in table["error"]
    assert client.get("/v1/health").json()["queue"]["failed"] == 1
    # A failed run does not answer the identical request: it runs again.
    retry = client.post("/v1/tables", json=TINY)
    assert retry.status_code == 202 and retry.json()["created"] and retry.json()["id"] != accepted["id"]


def test_health_reports_the_backend_lanes_and_versions(make_client):
    client = make_client(runner=LocalRunner(estimate_workers=3, gpu_lanes=[]))
    health = client.get("/v1/health").json()
    assert health["status"] == "ok" and health["backend"] == "estimate" and health["gpu"] is None
    assert health["lanes"] == {"cuda": 0, "estimate": 3}
    assert set(health["versions"]) >= {"autotune", "torch", "transformers", "python"}
    assert health["queue"] == {"queued": 0, "running": 0, "done": 0, "failed": 0, "cancelled": 0}



def test_a_table_past_a_rope_model_s_positions_warns_of_it(make_client):
    client = make_client()
    body = {"model": "tiny-llama", "seq_lens": [64, 256], "modes": ["fp32"], "max_batch": 8,
            "backend": "estimate"}
    accepted = client.post("/v1/tables", json=body)
    assert accepted.status_code == 202, accepted.json()
    table = client.get(accepted.json()["url"]).json()
    assert table["warnings"] == [
        "sequence length 256 is past max_position_embeddings=128 of tiny-llama, the length it was trained "
        "for: its rotary positions are computed for any position, so the step runs and its memory is as "
        "traced; the model's quality that far is untested"]
    client.delete(accepted.json()["url"])  # the table itself is not needed


def test_a_table_says_the_step_it_modelled_and_warns_of_bf16_on_a_t4(make_client):
    client = make_client()
    body = {"model": "tiny-llama", "seq_lens": [64], "modes": ["bf16"], "gpu": "T4", "dtype": "bfloat16",
            "max_batch": 64, "backend": "estimate"}
    accepted = client.post("/v1/tables", json=body).json()
    table = wait_for(client, accepted["url"], finished)
    assert table["status"] == "done", table
    assert (table["task"], table["dtype"], table["weights_dtype"], table["optimizer"], table["loss"]) == (
        "causal-lm", "bfloat16", "bfloat16", "adamw_torch_fused", "full")  # task from architectures
    assert len(table["warnings"]) == 1 and table["warnings"][0].startswith("T4 (compute capability 7.5)")
    page = client.get(f"/runs/{accepted['id']}").text
    assert "bf16 weights, adamw_torch_fused" in page and "Warning: T4 (compute capability 7.5)" in page
    # Another dtype or optimizer is another step: another run.
    other = client.post("/v1/tables", json={**body, "dtype": "float32"}).json()
    assert other["created"] and other["id"] != accepted["id"]


def test_a_multi_gpu_table_is_per_gpu_and_another_run_than_one_gpus(make_client):
    client = make_client()
    body = {"model": "tiny-llama", "seq_lens": [64], "modes": ["bf16"], "gpu": "A100-80GB",
            "dtype": "bfloat16", "max_batch": 16, "backend": "estimate"}
    accepted = client.post("/v1/tables", json={**body, "gpus": 4, "parallel": "fsdp"}).json()
    table = wait_for(client, accepted["url"], finished)
    assert table["status"] == "done", table
    assert (table["parallel"]["kind"], table["parallel"]["gpus"]) == ("fsdp", 4)
    page = client.get(f"/runs/{accepted['id']}").text
    assert "FSDP2 full shard, 4 GPUs; each max batch is one GPU's" in page
    alone = client.post("/v1/tables", json=body).json()
    assert alone["created"] and alone["id"] != accepted["id"]
    assert client.get(alone["url"]).json()["parallel"] is None
    check = client.get("/v1/check", params={"model": "tiny-llama", "seq_len": 64, "batch_size": 2,
                                            "gpu": "A100-80GB", "dtype": "bfloat16", "mode": "bf16",
                                            "gpus": 4, "parallel": "fsdp", "backend": "estimate"})
    assert check.status_code == 200, check.text
    assert check.json()["parallel"]["gpus"] == 4


def test_without_seq_lens_a_table_takes_the_models_default_rows(make_client):
    client = make_client(runner=LocalRunner(estimate_workers=0, gpu_lanes=[]))
    accepted = client.post("/v1/tables", json={"model": "tiny-llama", "modes": ["fp32"],
                                               "backend": "estimate"}).json()
    assert client.get(accepted["url"]).json()["seq_lens"] == [64, 128]  # within its 128 positions
    accepted = client.post("/v1/tables", json={"model": "gpt2", "modes": ["fp32"],
                                               "backend": "estimate"}).json()
    assert client.get(accepted["url"]).json()["seq_lens"] == [512, 1024]


def test_default_rows_stay_within_the_servers_max_seq_len(make_client):
    client = make_client(runner=LocalRunner(estimate_workers=0, gpu_lanes=[]), max_seq_len=2048)
    accepted = client.post("/v1/tables", json={"model": "meta-llama/Llama-3.2-1B", "modes": ["bf16"],
                                               "backend": "estimate"}).json()
    assert client.get(accepted["url"]).json()["seq_lens"] == [512, 1024, 2048]


def test_a_spec_stored_before_weights_dtypes_reads_as_the_step_it_ran(tmp_path):
    """Runs stored before #12 had no dtype fields and said "adamw": their weights were loaded as
    auto does (the config's dtype), and "adamw" was foreach AdamW."""
    from api.runs.spec import TableSpec, normalize

    settings = Settings(db=tmp_path / "db")
    spec = normalize({"model": "meta-llama/Llama-3.2-1B", "seq_lens": [512], "modes": ["bf16"],
                      "backend": "estimate", "optimizer": "adamw"}, settings,
                     lambda backend, gpu: {"backend": "estimate"})
    assert (spec.optimizer, spec.weights_dtype, spec.task) == ("adamw_torch", "bfloat16", "causal-lm")
    old = {k: v for k, v in spec.to_json().items() if k not in ("dtype", "weights_dtype", "loss")}
    stored = TableSpec.from_json({**old, "optimizer": "adamw"})
    assert (stored.optimizer, stored.dtype, stored.weights_dtype, stored.loss) == (
        "adamw_torch", "auto", "bfloat16", "full")
