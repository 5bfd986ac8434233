"""The service on a fleet that loses its head, and a Ray worker that stops (issue #37.3 and #37.5).

A real Ray cluster (a head with one CPU, nothing else: estimate runs are enough here) on loopback in a
network namespace of its own (tests/fleet.py), and the service in a process of its own, as
``autotune serve --ray`` runs it. Its Ray driver is a child process of the server (api/fleet/driver.py):
Ray ends a driver that lost the GCS, and before, that was the server itself.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
from fleet import (
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
TINY = {"model": "tiny-bert", "modes": ["fp32"], "max_batch": 2, "gpu": "T4", "backend": "estimate"}
WATCHDOG_S = 10.0
# What Ray gives a driver that lost the GCS before it ends it (60 s by default): short here, so that a
# driver inside the server would end it while the test looks (rpc_client.h, see api/fleet/driver.py).
RAY_GCS_TIMEOUT_S = 3
UNREACHABLE_WITHIN_S = 30.0  # the service sees a refused head port twice (1 s apart): ample on a loaded host


@pytest.fixture(scope="module")
def head():
    ray_or_skip()
    namespace = namespace_or_skip()
    try:
        cluster = FleetCluster(namespace, kinds=())
    except BaseException:
        namespace.close()
        raise
    (cluster.dir / "hold").mkdir()
    yield cluster
    namespace.close()
    cluster.close()


def test_a_stopped_ray_worker_s_run_fails_by_the_watchdog(head, tmp_path):
    hold = head.dir / "hold"
    (hold / "64").touch()  # the task waits in its setup until the test has stopped it
    server = FleetServer(tmp_path / "stop.db", tmp_path / "stop.log", head.address, head.records, hold,
                         watchdog_s=WATCHDOG_S)
    try:
        run_id = server.client.post("/v1/tables", json={**TINY, "seq_lens": [64]}).json()["id"]
        task = wait_until(lambda: records_of(head, run_id), "the task to start")[0]
        os.kill(task["pid"], signal.SIGSTOP)
        stopped = time.monotonic()
        (hold / "64").unlink()
        table = finished(server.client, run_id)
        assert time.monotonic() - stopped < 300
        assert table["status"] == "failed" and table["cells"] == []
        assert table["error"] == (f"the worker process (pid {task['pid']}, a Ray task) made no progress for "
                                  f"{WATCHDOG_S:g} s (AUTOTUNE_WATCHDOG_S) and was killed")
        wait_until(lambda: not alive(task["pid"]), "the stopped worker to be killed", timeout_s=120)
    finally:
        (hold / "64").unlink(missing_ok=True)
        server.stop()


def test_losing_the_head_leaves_the_service_serving_and_it_rejoins_when_the_head_is_back(head, tmp_path):
    hold = head.dir / "hold"
    (hold / "96").touch()
    server = FleetServer(tmp_path / "head.db", tmp_path / "head.log", head.address, head.records, hold,
                         env={"RAY_gcs_rpc_server_reconnect_timeout_s": str(RAY_GCS_TIMEOUT_S)})
    try:
        run_id = server.client.post("/v1/tables", json={**TINY, "seq_lens": [80, 96]}).json()["id"]
        wait_until(lambda: [r for r in records_of(head, run_id) if r["seq_len"] == 96],
                   "the second cell's task")
        before = server.client.get(f"/v1/tables/{run_id}").json()
        assert [c["seq_len"] for c in before["cells"]] == [80]

        head.kill_gcs()
        killed = time.monotonic()
        fleet = lambda: server.client.get("/v1/health").json()["fleet"]  # noqa: E731
        wait_until(lambda: fleet()["status"] == "unreachable", "health to say unreachable",
                   timeout_s=UNREACHABLE_WITHIN_S)
        unreachable_after_s = time.monotonic() - killed
        refused = server.client.post("/v1/tables", json={**TINY, "seq_lens": [112]})
        assert refused.status_code == 503 and refused.headers["Retry-After"] == "10"
        assert refused.json()["detail"].startswith(f"the Ray cluster at {head.address} is unreachable (")
        # Past the time Ray gives a driver without its GCS (3 times over): the server still answers.
        while time.monotonic() - killed < 3 * RAY_GCS_TIMEOUT_S:
            assert server.client.get("/v1/health").status_code == 200
            time.sleep(0.5)
        assert server.proc.poll() is None
        assert server.client.get("/").status_code == 200
        waiting = server.client.get(f"/v1/tables/{run_id}").json()
        assert waiting["status"] == "running" and waiting["cells"] == before["cells"]  # it waits

        (hold / "96").unlink()
        head.restart_head(keep=server.proc.pid)
        wait_until(lambda: fleet()["status"] == "connected", "the service to join the new head",
                   timeout_s=180)
        table = finished(server.client, run_id)
        assert table["status"] == "done"
        assert table["cells"][0] == before["cells"][0]  # kept as it was
        assert [r["seq_len"] for r in records_of(head, run_id)] == [80, 96, 96]  # the lost cell sent again
        assert server.client.post("/v1/tables", json={**TINY, "seq_lens": [112]}).status_code == 202
        print(f"health said unreachable {unreachable_after_s:.1f} s after the GCS was killed")
    finally:
        (hold / "96").unlink(missing_ok=True)
        server.stop()
