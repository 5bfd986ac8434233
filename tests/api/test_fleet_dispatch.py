"""RayRunner's dispatcher when a cell cannot be sent (issue 40.6: a failed fleet run read "running
0/2 cells"). A fake cluster stands in for Ray here: what is tested is the runner's bookkeeping, not
Ray (tests/api/test_fleet.py runs a real cluster).

A task Ray refuses while the cluster is there (``.remote`` raising) used to propagate into the
dispatcher's loop, which logged it and went on: the run stayed "running" with no task in flight,
for ever. It now fails saying why; with the cluster gone it waits for it instead.
"""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest

from api.fleet import runner as fleet_runner
from api.fleet.runner import RayRunner
from api.runs.runner import RunOrder

DEADLINE_S = 30.0  # ample on a loaded machine: the dispatcher wakes every 0.2 s


class Events:
    def __init__(self) -> None:
        self.ended = threading.Event()
        self.finished_with: tuple[str, str | None] | None = None

    def started(self, run_id: str, lane: str, pid: int | None) -> bool:
        return True

    def header(self, run_id: str, header: dict[str, Any]) -> None:
        pass

    def cell(self, run_id: str, position: int, cell: dict[str, Any]) -> None:
        pass

    def finished(self, run_id: str, status: str, error: str | None, elapsed_s: float | None) -> None:
        self.finished_with = (status, error)
        self.ended.set()


class Cluster:
    """What RayRunner asks of api.fleet.cluster.Cluster; ``reachable`` as the test sets it."""

    def __init__(self) -> None:
        self.reachable = True
        self.lost_with: list[BaseException] = []
        self.ray = SimpleNamespace(wait=lambda refs, **kw: ([], refs), get=None, cancel=lambda *a, **kw: None)

    def lost(self, exc: BaseException) -> None:
        self.lost_with.append(exc)

    def snapshot(self) -> Any:
        return SimpleNamespace(kinds=lambda: {}, selector=lambda kind: None)


class Refused:
    def remote(self, *args: Any) -> Any:
        raise ValueError("the task's arguments could not be serialized\nmore lines")


@pytest.fixture
def refused(monkeypatch):
    from api.fleet import task

    monkeypatch.setattr(task, "estimate_cell", Refused())


def order() -> RunOrder:
    return RunOrder("run-1", {"backend": "estimate", "environment": {"device": None},
                              "seq_lens": [32, 64], "modes": ["fp32", "amp"]})


def runner(cluster: Cluster) -> RayRunner:
    return RayRunner("127.0.0.1:1", cluster=cluster, analyses=SimpleNamespace())  # type: ignore[arg-type]


def close(ray_runner: RayRunner) -> None:
    with ray_runner._cond:
        ray_runner._closed = True
        ray_runner._cond.notify_all()
    ray_runner._thread.join(timeout=DEADLINE_S)


def test_a_cell_the_cluster_refuses_fails_its_run_saying_why(refused):
    cluster = Cluster()
    ray_runner, events = runner(cluster), Events()
    try:
        ray_runner.submit(order(), events)
        assert events.ended.wait(DEADLINE_S)
        assert events.finished_with == (
            "failed", "a cell could not be sent to the Ray cluster: ValueError: the task's arguments could "
            "not be serialized")
        assert ray_runner._runs == {} and ray_runner._tasks == {}
    finally:
        close(ray_runner)


def test_with_the_cluster_gone_a_run_waits_for_it_instead(refused, monkeypatch):
    cluster = Cluster()
    monkeypatch.setattr(cluster, "lost", lambda exc: setattr(cluster, "reachable", False))
    ray_runner, events = runner(cluster), Events()
    try:
        ray_runner.submit(order(), events)
        deadline = time.monotonic() + DEADLINE_S
        while cluster.reachable and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not cluster.reachable
        with ray_runner._cond:
            assert ray_runner._waiting == ["run-1"] and "run-1" in ray_runner._runs
        assert not events.ended.is_set()
    finally:
        close(ray_runner)


def test_the_dispatcher_s_reason_is_its_first_line():
    assert fleet_runner._reason(ValueError("a\nb")) == "ValueError: a"
