"""The service on a fleet: RayRunner against a real Ray cluster, on loopback, in a network namespace.

One cluster for the module (tests/fleet.py): a head and two worker nodes with one logical GPU each,
labelled T4 and L4. The GPU probe is the CPU memory stand-in the cuda tests use, so the whole path
runs: the app -> RayRunner -> a task on a node of the kind -> cells in the store -> the API.
"""

from __future__ import annotations

import ipaddress
import os
import signal
import time

import pytest
from conftest import LOCAL
from fleet import (
    CpuProbes,
    FleetCluster,
    FleetServer,
    alive,
    finished,
    namespace_or_skip,
    ray_or_skip,
    records_of,
    wait_until,
)

pytestmark = pytest.mark.slow
# Two probes a cell at most, none of the estimator's (a guided cuda search starts from its answer).
TINY = {"model": "tiny-bert", "modes": ["fp32"], "max_batch": 2, "search": "bisect"}


@pytest.fixture(scope="module")
def fleet():
    ray_or_skip()
    namespace = namespace_or_skip()
    try:
        cluster = FleetCluster(namespace)
    except BaseException:
        namespace.close()
        raise
    (cluster.dir / "hold").mkdir()
    yield cluster
    namespace.close()  # every Ray process of the cluster is in it
    cluster.close()


@pytest.fixture(scope="module")
def client(fleet, analyses, tmp_path_factory):
    from fastapi.testclient import TestClient

    from api.fleet.runner import RayRunner
    from api.main import create_app
    from api.settings import Settings

    runner = RayRunner(fleet.address, setup=CpuProbes(fleet.records, fleet.dir / "hold"), analyses=analyses)
    assert runner.cluster.wait_connected(60), runner.cluster.unreachable()
    db = tmp_path_factory.mktemp("fleet") / "fleet.db"
    with TestClient(create_app(Settings(db=db), runner=runner), base_url=LOCAL) as test_client:
        yield test_client


def held(fleet, seq_len: int):
    (fleet.dir / "hold" / str(seq_len)).touch()


def release(fleet, seq_len: int):
    (fleet.dir / "hold" / str(seq_len)).unlink(missing_ok=True)


def test_health_lists_the_kinds_nodes_and_free_gpus_of_the_fleet(client, fleet):
    health = client.get("/v1/health").json()
    fleet_health = health["fleet"]
    assert fleet_health["status"] == "connected" and fleet_health["address"] == fleet.address
    assert fleet_health["kinds"] == [{"kind": "L4", "nodes": 1, "gpus": 1.0, "free_gpus": 1.0},
                                     {"kind": "T4", "nodes": 1, "gpus": 1.0, "free_gpus": 1.0}]
    assert sorted(str(n["kind"]) for n in fleet_health["nodes"]) == ["L4", "None", "T4"]
    assert health["lanes"] == {"cuda": 2, "estimate": 3}
    # Loopback only: every address Ray advertises, and every socket in the namespace.
    assert {n["address"] for n in fleet_health["nodes"]} == {"127.0.0.1"}
    hosts = fleet.namespace.addresses()
    assert hosts and all(ipaddress.ip_address(h).is_loopback for h in hosts), hosts


def test_a_gpu_kind_the_fleet_lacks_is_refused_naming_the_kinds_it_has(client):
    response = client.post("/v1/tables", json={**TINY, "gpu": "A100-80GB", "backend": "cuda"})
    assert response.status_code == 422
    assert response.json()["field"] == "gpu"
    assert response.json()["detail"] == (
        "GPU 'A100-80GB': on this fleet backend 'cuda' runs on a node of the GPU kind named by gpu, and the "
        "fleet has L4, T4")
    none = client.post("/v1/tables", json={**TINY, "gpu_memory": "8GiB", "backend": "cuda"})
    assert none.status_code == 422 and "fleet has L4, T4" in none.json()["detail"]


def test_each_run_measures_on_a_node_of_its_kind(client, fleet):
    nodes = {n["kind"]: n["node_id"] for n in client.get("/v1/health").json()["fleet"]["nodes"]}
    runs = {kind: client.post("/v1/tables", json={**TINY, "seq_lens": [32], "gpu": kind,
                                                  "backend": "auto"}).json()["id"] for kind in ("T4", "L4")}
    for kind, run_id in runs.items():
        table = finished(client, run_id)
        assert table["status"] == "done", table["error"]
        assert table["backend"] == "cuda" and table["gpu"] == kind
        assert table["environment"]["device"] == kind and table["environment"]["fleet"] == "ray"
        cells = [(c["seq_len"], c["max_batch_size"], c["backend"]) for c in table["cells"]]
        assert cells == [(32, 2, "cuda")]
        ran = records_of(fleet, run_id)
        assert [(r["seq_len"], r["node"], r["gpus"]) for r in ran] == [(32, nodes[kind], "0")]
    listed = client.get("/v1/tables", params={"gpu": "t4"}).json()["data"]
    assert [r["id"] for r in listed] == [runs["T4"]]


def test_cancel_kills_the_running_task_and_frees_its_gpu(client, fleet):
    held(fleet, 48)
    run_id = client.post("/v1/tables", json={**TINY, "seq_lens": [48], "gpu": "T4",
                                             "backend": "cuda"}).json()["id"]
    task = wait_until(lambda: records_of(fleet, run_id), "the task to start")[0]
    assert alive(task["pid"])
    free = lambda: {k["kind"]: k["free_gpus"] for k in client.get("/v1/health").json()["fleet"]["kinds"]}  # noqa: E731
    wait_until(lambda: free()["T4"] == 0.0, "the T4 to be taken")
    cancelled = client.delete(f"/v1/tables/{run_id}")
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    wait_until(lambda: not alive(task["pid"]), "the cancelled task's process to end", timeout_s=120)
    wait_until(lambda: free()["T4"] == 1.0, "the T4 to be free again", timeout_s=120)
    release(fleet, 48)
    assert client.get(f"/v1/tables/{run_id}").json()["cells"] == []


def test_a_cell_whose_worker_dies_is_sent_again_once_then_fails_with_the_reason(client, fleet):
    held(fleet, 56)
    run_id = client.post("/v1/tables", json={**TINY, "seq_lens": [56], "gpu": "L4",
                                             "backend": "cuda"}).json()["id"]
    first = wait_until(lambda: records_of(fleet, run_id), "the task to start")[0]
    os.kill(first["pid"], signal.SIGKILL)  # mid-cell: its worker dies
    second = wait_until(lambda: records_of(fleet, run_id)[1:], "the cell to be sent again")[0]
    assert second["pid"] != first["pid"] and (second["seq_len"], second["mode"]) == (56, "fp32")
    release(fleet, 56)
    table = finished(client, run_id)
    assert table["status"] == "done" and table["cells"][0]["max_batch_size"] == 2  # the retry measured it

    held(fleet, 40)  # now both attempts die: the cell fails, saying why, and the run ends
    run_id = client.post("/v1/tables", json={**TINY, "seq_lens": [40], "gpu": "L4",
                                             "backend": "cuda"}).json()["id"]
    for attempt in (1, 2):
        task = wait_until(lambda n=attempt: records_of(fleet, run_id)[n - 1:], f"attempt {attempt}")[0]
        os.kill(task["pid"], signal.SIGKILL)
    release(fleet, 40)
    table = finished(client, run_id)
    assert table["status"] == "done"
    [failed] = table["cells"]
    assert failed["seq_len"] == 40 and failed["max_batch_size"] is None
    assert failed["error"].startswith("its Ray worker died twice: WorkerCrashedError: ")
    assert len(records_of(fleet, run_id)) == 2


def test_estimate_runs_fan_out_over_the_cluster_cpus(client, fleet):
    body = {"model": "tiny-bert", "modes": ["fp32", "amp"], "seq_lens": [32], "gpu": "T4",
            "backend": "estimate"}
    table = finished(client, client.post("/v1/tables", json=body).json()["id"])
    assert table["status"] == "done" and table["environment"].get("fleet") is None
    assert [(c["mode"], c["seq_len"]) for c in table["cells"]] == [("fp32", 32), ("amp", 32)]
    assert all(c["max_batch_size"] and c["backend"] == "estimate" for c in table["cells"])
    ran = records_of(fleet, table["id"])
    assert len(ran) == 2 and {r["gpus"] for r in ran} <= {None, ""}  # a task per cell, no GPU


def test_a_restart_with_tasks_in_flight_sends_their_cells_again_keeping_the_finished(fleet, tmp_path):
    db, hold = tmp_path / "restart.db", fleet.dir / "hold"
    held(fleet, 96)
    server = FleetServer(db, tmp_path / "server.log", fleet.address, fleet.records, hold)
    # Estimate cells: the same path as cuda's (the runner sends what the store lacks), cheaper.
    body = {**TINY, "seq_lens": [80, 96], "gpu": "T4", "backend": "estimate"}
    run_id = server.client.post("/v1/tables", json=body).json()["id"]
    wait_until(lambda: [r for r in records_of(fleet, run_id) if r["seq_len"] == 96], "the second cell's task")
    before = server.client.get(f"/v1/tables/{run_id}").json()
    assert [c["seq_len"] for c in before["cells"]] == [80]
    in_flight = records_of(fleet, run_id)[-1]
    server.kill()  # a crash: its tasks go with its driver
    wait_until(lambda: not alive(in_flight["pid"]), "the dead server's task to end", timeout_s=120)
    release(fleet, 96)
    server = FleetServer(db, tmp_path / "server.log", fleet.address, fleet.records, hold)
    try:
        table = finished(server.client, run_id)
    finally:
        server.stop()
    assert table["status"] == "done" and table["attempts"] == 2
    assert table["cells"][0] == before["cells"][0]  # kept as it was
    assert [r["seq_len"] for r in records_of(fleet, run_id)] == [80, 96, 96]


def test_an_unreachable_cluster_keeps_the_service_serving_and_refuses_new_runs(fleet, tmp_path):
    from liveserver import free_port

    nowhere = f"127.0.0.1:{free_port()}"
    server = FleetServer(tmp_path / "away.db", tmp_path / "away.log", nowhere, fleet.records, fleet.dir,
                         connected=False)
    try:
        health = server.client.get("/v1/health")
        assert health.status_code == 200
        assert health.json()["fleet"]["status"] == "unreachable"
        assert health.json()["fleet"]["kinds"] == []
        refused = server.client.post("/v1/tables", json={**TINY, "gpu": "T4", "backend": "estimate"})
        assert refused.status_code == 503
        assert refused.json()["detail"].startswith(f"the Ray cluster at {nowhere} is unreachable")
        assert server.client.get("/").status_code == 200  # the dashboard still answers
        assert server.client.get("/v1/tables").json()["count"] == 0
    finally:
        started = time.monotonic()
        server.kill()
        assert time.monotonic() - started < 10
