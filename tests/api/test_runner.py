"""LocalRunner's lanes with fake workers: one order per GPU at a time, estimate orders in parallel,
cancel and close. No torch in the workers, so these take a fraction of a second each."""

from __future__ import annotations

import json
import os
import signal
import sys
import textwrap
import threading
import time

import pytest

from api.runs.runner import Lane, LocalRunner, RunOrder

FAKE_WORKER = textwrap.dedent("""
    import json, os, pathlib, sys, time
    order = json.loads(sys.stdin.readline())
    spec, run_id = order["spec"], order["run_id"]
    out = pathlib.Path(spec["dir"])
    (out / f"start-{run_id}").write_text(json.dumps(
        {"t": time.time(), "gpu": os.environ.get("CUDA_VISIBLE_DEVICES", "unset")}))
    deadline = time.monotonic() + 30
    while not all((out / f"start-{peer}").exists() for peer in spec.get("peers", [])):
        if time.monotonic() > deadline:
            print(json.dumps({"op": "failed", "error": "the peers never started"}), flush=True)
            sys.exit(1)
        time.sleep(0.01)
    time.sleep(spec.get("sleep_s", 0))
    for _ in range(spec.get("beats", 0)):  # a long run that reports each probe
        print(json.dumps({"op": "progress"}), flush=True)
        time.sleep(0.2)
    (out / f"end-{run_id}").write_text(json.dumps({"t": time.time()}))
    print(json.dumps({"op": "done", "elapsed_s": 0}), flush=True)
""")


class Events:
    """Records RunEvents; ``wait`` for a run to finish."""

    def __init__(self, refuse=()):
        self.refuse = set(refuse)
        self.started_runs: list[tuple[str, str]] = []
        self.finished_runs: dict[str, tuple[str, str | None]] = {}
        self._cond = threading.Condition()

    def started(self, run_id, lane, pid):
        self.started_runs.append((run_id, lane))
        return run_id not in self.refuse

    def header(self, run_id, header):
        pass

    def cell(self, run_id, position, cell):
        pass

    def finished(self, run_id, status, error, elapsed_s):
        with self._cond:
            self.finished_runs[run_id] = (status, error)
            self._cond.notify_all()

    def wait(self, *run_ids, timeout_s=30.0):
        with self._cond:
            assert self._cond.wait_for(lambda: set(run_ids) <= set(self.finished_runs), timeout=timeout_s), (
                f"not finished: {set(run_ids) - set(self.finished_runs)}")
        return [self.finished_runs[r] for r in run_ids]


@pytest.fixture
def make_runner(tmp_path):
    script = tmp_path / "fake_worker.py"
    script.write_text(FAKE_WORKER)
    runners = []

    def make(**kwargs):
        runner = LocalRunner(worker_command=[sys.executable, str(script)], **kwargs)
        runners.append(runner)
        return runner

    yield make
    for runner in runners:
        runner.close()


def order(run_id, tmp_path, backend="estimate", **spec):
    spec = {"backend": backend, "seq_lens": [32], "modes": ["fp32"], "dir": str(tmp_path), **spec}
    return RunOrder(run_id, spec)


def read(tmp_path, name):
    return json.loads((tmp_path / name).read_text())


def test_a_gpu_runs_one_job_at_a_time_and_its_workers_see_only_it(make_runner, tmp_path):
    lane = Lane("cuda:0", "cuda", {"CUDA_VISIBLE_DEVICES": "3"}, "H100")
    runner = make_runner(estimate_workers=0, gpu_lanes=[lane])
    events = Events()
    for run_id in ("a", "b"):
        runner.submit(order(run_id, tmp_path, "cuda", sleep_s=0.3), events)
    assert events.wait("a", "b") == [("done", None), ("done", None)]
    assert read(tmp_path, "end-a")["t"] <= read(tmp_path, "start-b")["t"]  # b waited for a
    assert read(tmp_path, "start-a")["gpu"] == "3"
    assert runner.environment("auto") == runner.environment("cuda")
    assert runner.environment("cuda")["device"] == "H100" and runner.describe()["gpu"] == "H100"


def test_estimate_jobs_run_in_parallel_with_no_gpu_visible(make_runner, tmp_path):
    runner = make_runner(estimate_workers=2, gpu_lanes=[])
    events = Events()
    # Each waits until the other has started: they finish only if they run at once.
    runner.submit(order("a", tmp_path, peers=["b"]), events)
    runner.submit(order("b", tmp_path, peers=["a"]), events)
    assert events.wait("a", "b") == [("done", None), ("done", None)]
    assert read(tmp_path, "start-a")["gpu"] == ""


def test_a_queued_job_that_is_cancelled_never_starts(make_runner, tmp_path):
    runner = make_runner(estimate_workers=1, gpu_lanes=[])
    events = Events()
    runner.submit(order("first", tmp_path, sleep_s=0.5), events)
    runner.submit(order("second", tmp_path), events)
    runner.cancel("second")
    runner.submit(order("third", tmp_path), events)
    events.wait("first", "third")
    assert [r for r, _ in events.started_runs] == ["first", "third"]


def test_a_cancelled_worker_that_does_not_stop_is_killed_after_the_grace(make_runner, tmp_path):
    runner = make_runner(estimate_workers=1, gpu_lanes=[], stop_grace_s=0.2)
    events = Events()
    runner.submit(order("stuck", tmp_path, sleep_s=60), events)  # the fake ignores "stop"
    deadline = time.monotonic() + 30
    while not (tmp_path / "start-stuck").exists():
        assert time.monotonic() < deadline
        time.sleep(0.01)
    runner.cancel("stuck")
    runner.submit(order("next", tmp_path), events)
    assert events.wait("next") == [("done", None)]  # the lane is free again
    assert "stuck" not in events.finished_runs  # a cancelled run is not reported as failed
    assert not (tmp_path / "end-stuck").exists()


def test_a_job_cancelled_while_it_got_its_lane_is_not_run(make_runner, tmp_path):
    runner = make_runner(estimate_workers=1, gpu_lanes=[])
    events = Events(refuse={"gone"})  # the store said: cancelled meanwhile
    runner.submit(order("gone", tmp_path), events)
    runner.submit(order("next", tmp_path), events)
    events.wait("next")
    assert not (tmp_path / "start-gone").exists() and "gone" not in events.finished_runs


def test_close_stops_running_workers_without_finishing_their_runs(make_runner, tmp_path):
    runner = make_runner(estimate_workers=1, gpu_lanes=[])
    events = Events()
    runner.submit(order("long", tmp_path, sleep_s=60), events)
    deadline = time.monotonic() + 30
    while not (tmp_path / "start-long").exists():
        assert time.monotonic() < deadline
        time.sleep(0.01)
    started = time.monotonic()
    runner.close()
    assert time.monotonic() - started < 10
    assert events.finished_runs == {}  # left running in the store: the next start resumes it
    runner.submit(order("late", tmp_path), events)  # a closed runner takes nothing
    assert runner.running() == {}


def test_cuda_is_unavailable_without_gpu_lanes(make_runner):
    from autotune.errors import BackendUnavailable

    runner = make_runner(estimate_workers=1, gpu_lanes=[])
    assert runner.environment("auto")["backend"] == "estimate"
    with pytest.raises(BackendUnavailable, match="backend 'cuda' needs a CUDA GPU"):
        runner.environment("cuda")


def wait_start(tmp_path, run_id, timeout_s=30.0):
    deadline = time.monotonic() + timeout_s
    while not (tmp_path / f"start-{run_id}").exists():
        assert time.monotonic() < deadline, f"{run_id} never started"
        time.sleep(0.01)


def test_the_watchdog_fails_a_run_whose_worker_is_stopped_and_frees_its_lane(make_runner, tmp_path):
    runner = make_runner(estimate_workers=1, gpu_lanes=[], watchdog_s=1.0)
    events = Events()
    runner.submit(order("frozen", tmp_path, sleep_s=0.5), events)
    runner.submit(order("next", tmp_path), events)
    wait_start(tmp_path, "frozen")
    pid = next(iter(runner._running.values())).worker.pid
    os.kill(pid, signal.SIGSTOP)  # stopped: never exits, never writes again
    status, error = events.wait("frozen")[0]
    assert status == "failed"
    assert error == (f"the worker process (pid {pid}) made no progress for 1 s (AUTOTUNE_WATCHDOG_S) "
                     "and was killed")
    assert events.wait("next") == [("done", None)]  # the lane is free again


def test_the_watchdog_leaves_a_long_run_that_reports_its_probes(make_runner, tmp_path):
    runner = make_runner(estimate_workers=1, gpu_lanes=[], watchdog_s=1.0)
    events = Events()
    runner.submit(order("long", tmp_path, beats=12), events)  # 2.4 s, a sign of life every 0.2 s
    assert events.wait("long") == [("done", None)]


def test_held_names_the_queued_and_running_orders(make_runner, tmp_path):
    runner = make_runner(estimate_workers=1, gpu_lanes=[])
    events = Events()
    runner.submit(order("first", tmp_path, sleep_s=0.5), events)
    runner.submit(order("second", tmp_path), events)
    assert runner.held() == {"first", "second"}
    events.wait("first", "second")
    deadline = time.monotonic() + 5
    while runner.held():
        assert time.monotonic() < deadline
        time.sleep(0.01)
