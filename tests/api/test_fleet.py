"""The service on a fleet: RayRunner against a real Ray cluster, on loopback, in a network namespace.

One cluster for the module (tests/fleet.py): a head and two worker nodes with one logical GPU each,
labelled T4 and L4. The GPU probe is the CPU memory stand-in the cuda tests use, so the whole path
runs: the app -> RayRunner -> a task on a node of the kind -> cells in the store -> the API.
The dashboard's fleet view in a real browser (tests/browser.py) runs on this cluster too: a cluster
of its own cost one more start (13 CPU s, about 17 s at idle; issue #39).
"""

from __future__ import annotations

import ipaddress
import os
import re
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
# The attention named (transformers' choice for BERT): else each cuda task builds the model on the meta
# device to learn it (CudaBackend.attn_used) before its probe process builds it again, 2-3 CPU s a cell
# (measured); the fleet view's runs in the browser leave it to transformers.
TINY = {"model": "tiny-bert", "modes": ["fp32"], "max_batch": 2, "search": "bisect", "attn": "sdpa"}


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


# -- the fleet view in a browser ----------------------------------------------------------------------

# The fleet's two runs end to end (a Ray task per cell, each a fresh worker and a probe process importing
# torch): over 240 s at load 8 beside the config corpus; a limit, polled, not a wait.
FLEET_TIMEOUT_S = 600


def test_all_kinds_launch_and_the_fleet_view_in_a_real_browser(fleet, tmp_path):
    """The dashboard (tests/browser.py: headless Chromium, in the cluster's network namespace too) on this
    module's cluster: "all kinds in the fleet" on the form queues a run per kind, the fleet view opens and
    fills in as their cells are stored, one column and one line per kind."""
    from browser import browser_or_skip, browser_page, screenshots

    sync_playwright = browser_or_skip()
    shots = screenshots(tmp_path)
    server = FleetServer(tmp_path / "view.db", tmp_path / "view.log", fleet.address, fleet.records,
                         fleet.dir / "hold")
    try:
        with browser_page(sync_playwright, server.url) as page:
            fleet_in_the_browser(page, server, shots)
    finally:
        server.stop()


def fleet_in_the_browser(page, server, shots) -> None:
    from browser import LAPTOP, PHONE, assert_readable
    from playwright.sync_api import expect

    page.goto("/new")
    gpu = page.get_by_label("GPU preset")
    expect(gpu.locator("option[value=all-kinds]")).to_have_text("all kinds in the fleet: L4, T4")
    page.get_by_label("Model").fill("tiny-bert")
    # One cell per kind, the kinds at once: a cell is a Ray task in a fresh worker process, then a probe
    # process, each importing torch (seconds apiece on a loaded 2-core machine).
    page.get_by_label("Sequence lengths").fill("32")
    page.get_by_label("fp32", exact=True).check()  # one mode (none checked: the weights' four)
    page.get_by_text("More settings").click()
    page.get_by_label("Largest batch probed").fill("2")  # two probes a cell at most, on the CPU stand-in
    page.get_by_label("Search").select_option("bisect")
    # A card size beside "all kinds" is turned down next to its field, and nothing is queued.
    gpu.select_option("all-kinds")
    page.get_by_label("or its memory").fill("12GiB")
    page.get_by_role("button", name="Make the table").click()
    expect(page.locator("#gpu_memory-error")).to_contain_text("all kinds in the fleet sets each run's GPU")
    assert server.client.get("/v1/tables").json()["count"] == 0
    page.screenshot(path=shots / "12-launch-all-kinds-error.png", full_page=True)
    page.get_by_label("or its memory").fill("")
    page.get_by_role("button", name="Make the table").click()

    # The fleet view of the model, for the step just asked: a column per kind, filling in live.
    expect(page).to_have_url(re.compile(r"/fleet\?model=tiny-bert&step=[0-9a-f]{12}$"))
    page.evaluate("window.__sameDocument = true")
    table = page.get_by_role("table", name=re.compile("^Max batch size, fp32"))
    expect(table.locator("thead th a")).to_have_text(["T4", "L4"])
    live = page.locator("#fleet-live")
    deadline = time.monotonic() + FLEET_TIMEOUT_S
    while live.get_attribute("data-live") is not None:
        assert time.monotonic() < deadline, "the fleet's runs did not finish"
        page.wait_for_timeout(200)
    assert page.evaluate("window.__sameDocument") is True, "the view reloaded instead of updating"
    expect(table.locator("tbody tr")).to_have_count(1)
    expect(table.locator("td.cell")).to_have_text([re.compile(r"^\s*2\+\s*$")] * 2)  # at the cap of 2
    for kind in ("T4", "L4"):  # a line per kind: here its one point
        expect(page.locator("svg.chart title", has_text=f"{kind}, seq 32: max batch 2+")).to_have_count(1)
    expect(page.locator(".chart-legend li")).to_have_text(["T4", "L4"])
    expect(page.locator("#fleet-step")).to_contain_text("measured on each kind's GPU")
    runs = server.client.get("/v1/tables").json()["data"]
    assert sorted((r["gpu"], r["backend"], r["status"]) for r in runs) == [
        ("L4", "cuda", "done"), ("T4", "cuda", "done")]
    assert_readable(page, "the fleet view")
    page.screenshot(path=shots / "13-fleet-view.png", full_page=True)
    page.set_viewport_size(PHONE)
    page.reload()
    assert_readable(page, "the fleet view")
    page.screenshot(path=shots / "14-phone-fleet-view.png", full_page=True)
    # From a run's page, back to the fleet view of its step.
    page.set_viewport_size(LAPTOP)
    page.locator("thead th a", has_text="L4").first.click()
    expect(page.get_by_role("heading", name=re.compile("tiny-bert"))).to_contain_text("on L4")
    page.get_by_role("link", name="Every GPU kind…").click()
    back = page.get_by_role("table", name=re.compile("^Max batch size, fp32"))
    expect(back.locator("thead th a")).to_have_text(["T4", "L4"])
