"""The run queue against a store whose writes fail for a while (a full or read-only disk): no run is
left "running" without a worker, no finished cell is lost. The reconciler's passes are called by
hand here (``reconcile_s`` is an hour), so each test says exactly when one happens."""

from __future__ import annotations

import json
import sqlite3
import sys
import textwrap
import time

import pytest

from api.runs.queue import MAX_ATTEMPTS, RunQueue
from api.runs.runner import LocalRunner
from api.store import Store
from autotune.errors import StoreError

# Answers every cell of the order at once: {"mode", "seq_len", "max_batch_size": seq_len // 8}.
CELL_WORKER = textwrap.dedent("""
    import json, sys
    order = json.loads(sys.stdin.readline())
    spec, done = order["spec"], {(c["mode"], c["seq_len"]) for c in order["completed"]}
    print(json.dumps({"op": "header", "header": {"attn": "sdpa"}}), flush=True)
    position = 0
    for mode in spec["modes"]:
        for seq_len in spec["seq_lens"]:
            if (mode, seq_len) not in done:
                cell = {"mode": mode, "seq_len": seq_len, "max_batch_size": seq_len // 8}
                print(json.dumps({"op": "cell", "position": position, "cell": cell}), flush=True)
            position += 1
    print(json.dumps({"op": "done", "elapsed_s": 0.0}), flush=True)
""")


class FlakyStore(Store):
    """A real store whose writes fail with StoreError while ``broken`` (after ``ok_writes`` more)."""

    def __init__(self, path):
        super().__init__(path)
        self.broken = False
        self.ok_writes: int | None = None

    def _maybe_fail(self):
        if self.ok_writes is not None:
            if self.ok_writes == 0:
                self.broken = True
                self.ok_writes = None
            else:
                self.ok_writes -= 1
        if self.broken:
            raise StoreError("database or disk is full")

    def mark_running(self, *args, **kwargs):
        self._maybe_fail()
        return super().mark_running(*args, **kwargs)

    def set_header(self, *args, **kwargs):
        self._maybe_fail()
        return super().set_header(*args, **kwargs)

    def add_cell(self, *args, **kwargs):
        self._maybe_fail()
        return super().add_cell(*args, **kwargs)

    def finish_run(self, *args, **kwargs):
        self._maybe_fail()
        return super().finish_run(*args, **kwargs)


@pytest.fixture
def setup(tmp_path):
    script = tmp_path / "cell_worker.py"
    script.write_text(CELL_WORKER)
    store = FlakyStore(tmp_path / "runs.db")
    runner = LocalRunner(estimate_workers=1, gpu_lanes=[], worker_command=[sys.executable, str(script)])
    queue = RunQueue(store, runner, reconcile_s=3600)
    yield store, runner, queue
    queue.close()
    runner.close()
    store.close()


def new_run(store, runner, key="k"):
    spec = {"backend": "estimate", "seq_lens": [64, 128], "modes": ["fp32", "amp"],
            "environment": runner.environment("estimate")}
    run, _ = store.create_run(key=key, model="tiny-bert", gpu="T4", backend="estimate", spec=spec, total=4)
    return run


def wait_idle(runner, timeout_s=30.0):
    deadline = time.monotonic() + timeout_s
    while runner.held():
        assert time.monotonic() < deadline, "the runner never let go of its runs"
        time.sleep(0.01)


def wait_status(store, run_id, status, timeout_s=30.0):
    deadline = time.monotonic() + timeout_s
    while (run := store.get_run(run_id)).status != status:
        assert time.monotonic() < deadline, f"run {run_id} is {run.status}, not {status}"
        time.sleep(0.01)
    return run


EXPECTED_CELLS = [{"mode": m, "seq_len": s, "max_batch_size": s // 8}
                  for m in ("fp32", "amp") for s in (64, 128)]


def test_writes_that_fail_mid_run_are_kept_and_written_when_the_disk_is_back(setup):
    store, runner, queue = setup
    run = new_run(store, runner)
    store.ok_writes = 3  # mark_running, the header and one cell land; then the disk is full
    queue.start()
    wait_idle(runner)
    stuck = store.get_run(run.id)
    assert (stuck.status, stuck.done) == ("running", 1)  # what the store says while the disk is full
    assert queue.reconcile() == []  # still full: nothing written, the run not requeued either
    assert store.get_run(run.id).status == "running"
    store.broken = False
    assert queue.reconcile() == [f"wrote the backlog of run {run.id}"]
    done = store.get_run(run.id)
    assert (done.status, done.done, done.error) == ("done", 4, None)
    assert store.cells(run.id) == EXPECTED_CELLS
    assert queue.reconcile() == []


def test_a_run_marked_running_that_no_worker_holds_is_requeued_with_its_cells_and_finishes(setup):
    store, runner, queue = setup
    run = new_run(store, runner)
    # What a lost worker leaves: running in the store, one cell recorded, nobody holding it.
    assert store.mark_running(run.id, lane="estimate:0", worker_pid=None)
    assert store.add_cell(run.id, 0, EXPECTED_CELLS[0])
    assert queue.reconcile() == [f"requeued run {run.id}", f"handed over run {run.id}"]
    done = wait_status(store, run.id, "done")
    assert (done.attempts, done.done) == (2, 4)
    assert store.cells(run.id) == EXPECTED_CELLS


def test_a_run_that_keeps_losing_its_worker_is_failed_with_the_reason(setup):
    store, runner, queue = setup
    run = new_run(store, runner)
    with sqlite3.connect(store.path) as conn:
        conn.execute("UPDATE runs SET status = 'running', attempts = ?, lane = 'estimate:0' WHERE id = ?",
                     (MAX_ATTEMPTS, run.id))
    assert queue.reconcile() == [f"failed run {run.id}"]
    failed = store.get_run(run.id)
    assert failed.status == "failed"
    assert failed.error == (f"the run lost its worker {MAX_ATTEMPTS} times without a word (last on lane "
                            "estimate:0): given up")


def test_a_run_that_could_not_be_marked_running_stays_queued_and_is_handed_over_again(setup):
    store, runner, queue = setup
    run = new_run(store, runner)
    store.broken = True
    queue.start()
    wait_idle(runner)
    assert store.get_run(run.id).status == "queued"  # not started, not lost
    store.broken = False
    assert queue.reconcile() == [f"handed over run {run.id}"]
    assert wait_status(store, run.id, "done").done == 4


def test_the_reconciler_thread_makes_its_passes_on_its_own(tmp_path):
    script = tmp_path / "cell_worker.py"
    script.write_text(CELL_WORKER)
    store = FlakyStore(tmp_path / "runs.db")
    runner = LocalRunner(estimate_workers=1, gpu_lanes=[], worker_command=[sys.executable, str(script)])
    queue = RunQueue(store, runner, reconcile_s=0.2)
    try:
        run = new_run(store, runner)
        store.ok_writes = 2  # the run is marked running and has its header, then every write fails
        queue.start()
        wait_idle(runner)
        time.sleep(0.5)  # passes while the disk is full change nothing
        assert store.get_run(run.id).status == "running"
        store.broken = False
        assert wait_status(store, run.id, "done").done == 4
        assert json.loads(json.dumps(store.cells(run.id))) == EXPECTED_CELLS
    finally:
        queue.close()
        runner.close()
        store.close()
