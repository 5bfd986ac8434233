"""RayRunner's dispatcher when a cell cannot be sent (issue 40.6: a failed fleet run read "running
0/2 cells") and when a task goes quiet (issue 37.5). A fake cluster stands in for Ray and its driver
here: what is tested is the runner's bookkeeping, not Ray (tests/api/test_fleet*.py run a real cluster).

A task Ray refuses while the cluster is there used to leave its run "running" with no task in flight,
for ever. It now fails saying why; with the cluster gone it waits for it instead. A task that started
and then says nothing for watchdog_s fails its run, as the local runner's watchdog does.
"""

from __future__ import annotations

import queue
import threading
import time
from types import SimpleNamespace
from typing import Any

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
    """What RayRunner asks of api.fleet.cluster.Cluster; ``reachable`` as the test sets it, and a
    driver that answers each task as ``answer(task_id)`` says (a list of messages, or None: gone)."""

    def __init__(self, answer) -> None:
        self.reachable = True
        self.answer = answer
        self.said: queue.Queue[tuple[int, dict[str, Any]]] = queue.Queue()
        self.sent: list[int] = []
        self.cancelled: list[int] = []

    @property
    def epoch(self) -> int | None:
        return 1 if self.reachable else None

    def send(self, task_id: int, backend: str, order: dict[str, Any], selector: dict[str, str]) -> bool:
        messages = self.answer(task_id)
        if messages is None:  # no driver to take it, as Cluster.send says when it lost it
            self.reachable = False
            return False
        self.sent.append(task_id)
        for message in messages:
            self.said.put((1, {**message, "id": task_id}))
        return True

    def cancel(self, task_id: int) -> None:
        self.cancelled.append(task_id)

    def messages(self, timeout_s: float) -> list[tuple[int, dict[str, Any]]]:
        try:
            return [self.said.get(timeout=timeout_s)]
        except queue.Empty:
            return []

    def snapshot(self) -> Any:
        return SimpleNamespace(kinds=lambda: {}, selector=lambda kind: None)


REFUSED = [{"op": "error", "type": "ValueError", "sent": False,
            "error": "the task's arguments could not be serialized\nmore"}]


def order() -> RunOrder:
    return RunOrder("run-1", {"backend": "estimate", "environment": {"device": None},
                              "seq_lens": [32, 64], "modes": ["fp32", "amp"]})


def runner(cluster: Cluster, watchdog_s: float = 900.0) -> RayRunner:
    return RayRunner("127.0.0.1:1", cluster=cluster, analyses=SimpleNamespace(),  # type: ignore[arg-type]
                     watchdog_s=watchdog_s)


def close(ray_runner: RayRunner) -> None:
    with ray_runner._cond:
        ray_runner._closed = True
        ray_runner._cond.notify_all()
    ray_runner._thread.join(timeout=DEADLINE_S)


def test_a_cell_the_cluster_refuses_fails_its_run_saying_why():
    cluster = Cluster(lambda task_id: REFUSED)
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


def test_with_the_cluster_gone_a_run_waits_for_it_instead():
    cluster = Cluster(lambda task_id: None)
    ray_runner, events = runner(cluster), Events()
    try:
        ray_runner.submit(order(), events)
        deadline = time.monotonic() + DEADLINE_S
        while cluster.reachable and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not cluster.reachable
        time.sleep(0.5)  # a few turns of the dispatcher
        with ray_runner._cond:
            assert ray_runner._waiting == ["run-1"] and "run-1" in ray_runner._runs and not ray_runner._tasks
        assert not events.ended.is_set()
    finally:
        close(ray_runner)


def test_a_task_that_started_and_then_says_nothing_fails_its_run_by_the_watchdog():
    # The first task starts and goes quiet (a worker stopped with SIGSTOP); the other is still queued
    # in Ray (no word yet), which the watchdog leaves alone.
    quiet = [{"op": "started", "node": "n" * 56, "pid": 4242}]
    cluster = Cluster(lambda task_id: quiet if task_id == 1 else [])
    ray_runner, events = runner(cluster, watchdog_s=1.0), Events()
    try:
        started = time.monotonic()
        ray_runner.submit(order(), events)
        assert events.ended.wait(DEADLINE_S)
        assert time.monotonic() - started >= 1.0
        assert events.finished_with == (
            "failed", "the worker process (pid 4242, a Ray task) made no progress for 1 s "
            "(AUTOTUNE_WATCHDOG_S) and was killed")
        assert sorted(cluster.cancelled) == cluster.sent == [1, 2]  # its task killed, and the other mode's
        assert ray_runner._runs == {} and ray_runner._tasks == {}
    finally:
        close(ray_runner)


def test_the_dispatcher_s_reason_is_its_first_line():
    assert fleet_runner._reason("ValueError", "a\nb") == "ValueError: a"
