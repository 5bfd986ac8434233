"""RayRunner: the runs of this service execute on a Ray cluster (``autotune serve --ray ADDRESS``).

The same interface as LocalRunner (``Runner``, api/runs/runner.py); the store stays the source of
truth (runs, cells, dedupe and resume work as on one host) and Ray only executes:

- a run of backend ``cuda`` names a GPU preset, and its cells run on nodes of that kind, one Ray
  task per cell (api/fleet/task.py ``measure_cell``, ``num_gpus=1``) sent with the label selector
  of the kind (api/fleet/cluster.py). A kind no node has is refused up front, naming the kinds
  the fleet has: Ray would leave such a task pending forever. ``auto`` is cuda on a kind the
  fleet has, else the estimator;
- a run of backend ``estimate`` fans out over the cluster's CPUs (``estimate_cell``);
- the cells of one mode run in order of sequence length, each given the mode's finished cells (its
  hints, as on one host); the modes of a run run at once;
- a cell whose worker or node died (Ray's WorkerCrashedError, NodeDiedError, OutOfMemoryError) is
  sent again once, away from the node it died on when the kind has another; if that dies too,
  the cell is recorded failed with both reasons and the run goes on;
- a cell whose task says nothing for ``watchdog_s`` (AUTOTUNE_WATCHDOG_S) once it started (a task says
  it is alive while its probes end, api/fleet/task.py) fails its run with the reason, and its task is
  killed, as the local runner's watchdog does (a worker stopped with SIGSTOP would hold it for ever);
- cancel stops a run's tasks with ``ray.cancel(force=True)``;
- close (a server stopping) cancels every task and leaves the runs running in the store: the next
  start requeues them, and this runner sends their unfinished cells again, keeping the finished
  ones. A driver that died without closing takes its tasks with it (Ray ends the tasks of a gone
  owner), so there is nothing to re-attach to: the unfinished cells are sent again;
- the Ray driver is a process of its own (api/fleet/cluster.py, driver.py): while the cluster is
  unreachable the service keeps serving, new runs are refused (503 with Retry-After, the reason said),
  and every run here waits until it is back (a new driver), then sends its unfinished cells again.

Heavy reads (check and explain) stay on this host, in the analysis pool as with LocalRunner.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from api.fleet.cluster import Cluster
from api.runs.analysis import ANALYSIS_COMMAND, AnalysisPool
from api.runs.runner import ClusterUnreachable, RunEvents, RunnerBase, RunOrder, check_backend
from api.settings import ANALYSIS_TIMEOUT_S, WATCHDOG_S
from autotune.errors import BackendUnavailable, InvalidInput, UnknownGpu
from autotune.gpus import resolve_gpu

log = logging.getLogger("autotune.api")

WAIT_S = 0.2  # the dispatcher's longest wait for a task's news before it looks at new work
# Ray's errors of a task whose process or node went away, not of the cell itself: sent again once.
DIED = ("WorkerCrashedError", "NodeDiedError", "OutOfMemoryError", "ObjectLostError",
        "LocalRayletDiedError", "ActorDiedError")


@dataclass
class _Cell:
    """One cell's task in flight."""

    run_id: str
    mode: str
    seq_len: int
    position: int
    attempt: int = 1
    died: str | None = None  # why the first attempt's worker died
    avoid: tuple[str, ...] = ()  # node ids not to run on (the one a first attempt died on)
    epoch: int | None = None  # the driver's (Cluster.epoch) it was sent through
    pid: int | None = None  # its worker's, once it started
    last_progress: float | None = None  # monotonic s of its last word; None: not started (queued in Ray)


@dataclass
class _Run:
    """An order handed to this runner: its cells, finished and to do, per mode."""

    order: RunOrder
    events: RunEvents
    seq_lens: list[int]
    modes: list[str]
    done: dict[tuple[str, int], dict[str, Any]]
    started: float = field(default_factory=time.monotonic)
    running: bool = False  # events.started said yes
    header_sent: bool = False
    new_cells: int = 0

    def position(self, mode: str, seq_len: int) -> int:
        return self.modes.index(mode) * len(self.seq_lens) + self.seq_lens.index(seq_len)

    def next_cell(self, mode: str) -> int | None:
        """The mode's next sequence length to run, None when its cells are all finished."""
        return next((s for s in self.seq_lens if (mode, s) not in self.done), None)

    def finished(self) -> bool:
        return len(self.done) == len(self.seq_lens) * len(self.modes)


class RayRunner(RunnerBase):
    """Runs orders on the Ray cluster at ``address``; see the module docstring."""

    def __init__(
        self,
        address: str,
        *,
        analysis_workers: int = 1,
        analysis_timeout_s: float = ANALYSIS_TIMEOUT_S,
        analysis_command: tuple[str, ...] = ANALYSIS_COMMAND,
        analyses: AnalysisPool | None = None,  # shared by the tests' apps: left open on close
        setup: Callable[[dict[str, Any]], None] | None = None,  # setup(order) first in each task (tests)
        cluster: Cluster | None = None,
        watchdog_s: float = WATCHDOG_S,
    ) -> None:
        super().__init__(analysis_workers=analysis_workers, analysis_timeout_s=analysis_timeout_s,
                         analysis_command=analysis_command, analyses=analyses)
        self.cluster = cluster if cluster is not None else Cluster(address, setup=setup)
        self.watchdog_s = watchdog_s
        self._runs: dict[str, _Run] = {}
        self._waiting: list[str] = []  # run ids handed over, not yet started (cluster unreachable)
        self._tasks: dict[int, _Cell] = {}  # task id -> its cell
        self._ids = itertools.count(1)
        self._thread = threading.Thread(target=self._dispatch_loop, name="ray dispatcher", daemon=True)
        self._thread.start()

    # --- Runner ---------------------------------------------------------------------------

    def environment(self, backend: str, gpu: str | None = None) -> dict[str, Any]:
        """Where a run goes: ``cuda`` on the kind ``gpu`` names (which the fleet must have),
        ``estimate`` on the cluster's CPUs, ``auto`` the first if it can."""
        check_backend(backend)
        if not self.cluster.reachable:
            raise ClusterUnreachable(self.cluster.unreachable() + ": no new runs until it is back")
        kinds = list(self.cluster.snapshot().kinds())
        kind = _kind(gpu) if gpu is not None else None
        if backend == "auto":
            backend = "cuda" if kind is not None and kind in kinds else "estimate"
        if backend != "cuda":
            return self._environment(backend, None)
        if not kinds:
            raise BackendUnavailable("backend 'cuda' needs a GPU node, and this fleet has none: use "
                                     "backend 'estimate' (or auto)")
        if kind is None or kind not in kinds:
            asked = "no GPU kind" if gpu is None else f"GPU {gpu!r}"
            error = InvalidInput(f"{asked}: on this fleet backend 'cuda' runs on a node of the GPU kind "
                                 f"named by gpu, and the fleet has {', '.join(kinds)}")
            error.field = "gpu"
            raise error
        return self._environment(backend, kind, fleet="ray")

    def describe(self) -> dict[str, Any]:
        fleet = self.cluster.describe()
        with self._cond:
            fleet["runs"] = len(self._runs)
            fleet["tasks"] = len(self._tasks)
        lanes = {"cuda": int(sum(k["gpus"] for k in fleet["kinds"])), "estimate": int(fleet["cpus"])}
        backend = "cuda" if fleet["kinds"] else "estimate"
        return {**self._description(backend, None, lanes), "fleet": fleet}  # gpu: one per kind, see fleet

    def submit(self, order: RunOrder, events: RunEvents) -> None:
        self._check_order(order)
        spec = order.spec
        seq_lens = sorted(set(int(s) for s in spec["seq_lens"]))
        modes = list(dict.fromkeys(spec["modes"]))
        done = {(c["mode"], int(c["seq_len"])): c for c in order.completed}
        with self._cond:
            if self._closed or order.run_id in self._runs:
                return
            self._runs[order.run_id] = _Run(order, events, seq_lens, modes, done)
            self._waiting.append(order.run_id)
            self._cond.notify_all()

    def cancel(self, run_id: str) -> None:
        with self._cond:
            self._runs.pop(run_id, None)
            with contextlib.suppress(ValueError):
                self._waiting.remove(run_id)
            ids = [task_id for task_id, cell in self._tasks.items() if cell.run_id == run_id]
            for task_id in ids:
                del self._tasks[task_id]
        self._kill(ids)

    def held(self) -> set[str]:
        with self._cond:
            return set(self._runs)

    def _take_running(self) -> list[Any]:
        ids = list(self._tasks)
        self._tasks.clear()
        return ids

    def _stop(self, running: list[Any]) -> None:
        self._kill(running)  # their runs stay running in the store: the next start resumes them
        self._thread.join(timeout=10.0)
        self.cluster.close()

    # --- the dispatcher -------------------------------------------------------------------

    def tasks(self) -> dict[str, list[tuple[str, int, int]]]:
        """run id -> (mode, seq_len, attempt) of its cells in flight."""
        with self._cond:
            found: dict[str, list[tuple[str, int, int]]] = {}
            for cell in self._tasks.values():
                found.setdefault(cell.run_id, []).append((cell.mode, cell.seq_len, cell.attempt))
            return found

    def _kill(self, task_ids: list[int]) -> None:
        for task_id in task_ids:  # the driver's ray.cancel(force=True); gone with the cluster if it is
            self.cluster.cancel(task_id)

    def _dispatch_loop(self) -> None:
        while True:
            with self._cond:
                if self._closed:
                    return
            try:
                self._check_epoch()
                self._start_waiting()
                for epoch, message in self.cluster.messages(timeout_s=WAIT_S):
                    self._heard(epoch, message)
                self._watchdog()
            except Exception:  # a bug must not end the dispatcher
                log.exception("ray dispatcher")
                time.sleep(WAIT_S)

    def _check_epoch(self) -> None:
        """Tasks sent through a driver that is gone went with it: their runs wait for the next one."""
        epoch = self.cluster.epoch
        with self._cond:
            gone = any(cell.epoch != epoch for cell in self._tasks.values())
        if gone:
            log.warning("the Ray cluster's driver changed: the runs here send their unfinished cells again")
            self._requeue()

    def _requeue(self) -> None:
        """The cluster went away: its tasks with it. Every run waits here for it to be back, and
        then sends its unfinished cells again (the finished ones are kept)."""
        with self._cond:
            self._tasks.clear()
            self._waiting = list(self._runs)

    def _start_waiting(self) -> None:
        """Start the runs handed over while the cluster was away (or just now)."""
        if not self.cluster.reachable:
            return
        with self._cond:
            waiting, self._waiting = self._waiting, []
            runs = [self._runs[r] for r in waiting if r in self._runs]
        for run in runs:
            lane = f"ray:{run.order.spec['environment'].get('device') or 'cpu'}"
            if not run.running and not run.events.started(run.order.run_id, lane, None):
                with self._cond:  # cancelled meanwhile (or the store is away: the reconciler retries)
                    self._runs.pop(run.order.run_id, None)
                continue
            run.running = True
            if run.finished():  # every cell was there already (a restart after the last one)
                self._end(run, "done", None)
                continue
            for mode in run.modes:
                seq_len = run.next_cell(mode)
                if seq_len is not None:
                    self._send(run, _Cell(run.order.run_id, mode, seq_len, run.position(mode, seq_len)))

    def _send(self, run: _Run, cell: _Cell) -> None:
        spec = run.order.spec
        earlier = [s for s in run.seq_lens if s < cell.seq_len]
        order = {"run_id": run.order.run_id,
                 "spec": {**spec, "seq_lens": [*earlier, cell.seq_len], "modes": [cell.mode]},
                 "completed": [run.done[(cell.mode, s)] for s in earlier]}
        selector: dict[str, str] = {}
        if spec["backend"] == "cuda":
            kind = spec["environment"]["device"]
            selector = self.cluster.snapshot().selector(kind) or {}
            if cell.avoid and self._other_nodes(kind, cell.avoid):
                selector["ray.io/node-id"] = f"!in({','.join(cell.avoid)})"
        task_id, cell.epoch = next(self._ids), self.cluster.epoch
        with self._cond:
            if self._closed or run.order.run_id not in self._runs:  # cancelled or closed meanwhile
                return
            self._tasks[task_id] = cell
        if not self.cluster.send(task_id, spec["backend"], order, selector):
            self._requeue()  # no driver to take it: the cluster is away, every run waits for it

    def _other_nodes(self, kind: str, avoid: tuple[str, ...]) -> bool:
        """Whether the fleet has a node of ``kind`` besides those in ``avoid``."""
        return any(n.node_id not in avoid for n in self.cluster.snapshot().kinds().get(kind, []))

    def _heard(self, epoch: int, message: dict[str, Any]) -> None:
        """A task's news from the driver (api/fleet/driver.py): it started, is alive, or ended."""
        task_id, op = int(message.get("id", 0)), message.get("op")
        ended = op in ("result", "error")
        with self._cond:
            cell = self._tasks.get(task_id)
            if cell is None or cell.epoch != epoch:  # cancelled meanwhile, or of a driver gone
                return
            if ended:
                del self._tasks[task_id]
            run = self._runs.get(cell.run_id)
            cell.last_progress = time.monotonic()
            if op == "started":
                cell.pid = message.get("pid")
        if run is None or not ended:
            return
        if op == "error":
            self._failed_task(run, cell, message)
            return
        result = message["result"]
        if "error" in result:
            self._end(run, "failed", str(result["error"]))
            return
        if not run.header_sent and result.get("header") is not None:
            run.events.header(run.order.run_id, result["header"])
            run.header_sent = True
        for new in result["cells"]:
            if (new["mode"], int(new["seq_len"])) == (cell.mode, cell.seq_len):
                self._record(run, cell, new)

    def _failed_task(self, run: _Run, cell: _Cell, message: dict[str, Any]) -> None:
        name, text = str(message.get("type")), str(message.get("error"))
        why = _reason(name, text)
        if not message.get("sent", True):  # Ray refused it: a run left with no task would never end
            log.error("run %s: a cell could not be sent to the Ray cluster: %s", run.order.run_id, why)
            self._end(run, "failed", f"a cell could not be sent to the Ray cluster: {why}")
            return
        if name == "TaskCancelledError":
            return
        if name not in DIED:  # Ray could not run the task at all: the cell fails
            self._record(run, cell, _failed_cell(run, cell, f"the Ray task failed: {why}"))
            return
        if cell.attempt == 1:
            node = _node_of(text)
            log.warning("run %s, cell %s seq %d: %s; sent again", cell.run_id, cell.mode, cell.seq_len, why)
            retry = _Cell(cell.run_id, cell.mode, cell.seq_len, cell.position, attempt=2, died=why,
                          avoid=(node,) if node else ())
            self._send(run, retry)
            return
        error = f"its Ray worker died twice: {cell.died}; then, sent again: {why}"
        self._record(run, cell, _failed_cell(run, cell, error))

    def _watchdog(self) -> None:
        """Fail the run of a task that said nothing for watchdog_s once it started (its worker is killed)."""
        now = time.monotonic()
        with self._cond:
            stalled = [(cell, self._runs.get(cell.run_id)) for cell in self._tasks.values()
                       if cell.last_progress is not None and now - cell.last_progress > self.watchdog_s]
        for cell, run in stalled:
            if run is None:
                continue
            why = (f"the worker process (pid {cell.pid}, a Ray task) made no progress for "
                   f"{self.watchdog_s:g} s (AUTOTUNE_WATCHDOG_S) and was killed")
            log.warning("run %s, cell %s seq %d: %s", cell.run_id, cell.mode, cell.seq_len, why)
            self._end(run, "failed", why)

    def _record(self, run: _Run, cell: _Cell, result: dict[str, Any]) -> None:
        run.done[(cell.mode, cell.seq_len)] = result
        run.new_cells += 1
        run.events.cell(run.order.run_id, cell.position, result)
        following = run.next_cell(cell.mode)
        if following is not None:
            self._send(run, _Cell(run.order.run_id, cell.mode, following, run.position(cell.mode, following)))
        elif run.finished():
            self._end(run, "done", None)

    def _end(self, run: _Run, status: str, error: str | None) -> None:
        with self._cond:
            if self._runs.pop(run.order.run_id, None) is None:
                return
            ids = [task_id for task_id, cell in self._tasks.items() if cell.run_id == run.order.run_id]
            for task_id in ids:
                del self._tasks[task_id]
        self._kill(ids)  # a failed run's other modes
        run.events.finished(run.order.run_id, status, error, round(time.monotonic() - run.started, 3))


def _kind(gpu: str) -> str | None:
    """The preset a request's gpu names, None for a name that is none (normalize says why)."""
    try:
        return resolve_gpu(gpu).name
    except UnknownGpu:
        return None


def _reason(name: str, text: str) -> str:
    """Ray's error in a line: its type and the first line of what it says."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return f"{name}: {lines[0] if lines else 'no details'}"


def _node_of(text: str) -> str | None:
    """The node id in Ray's message of a dead worker, when it gives one."""
    import re

    found = re.search(r"\b(?:node|Node ID:?)\s*(?:ID\s*)?:?\s*([0-9a-f]{56})\b", text)
    return found.group(1) if found else None


def _failed_cell(run: _Run, cell: _Cell, error: str) -> dict[str, Any]:
    """A cell that could not be measured, as tune_table records one (CellResult.to_dict())."""
    from autotune.tuner import CellResult

    return CellResult(cell.seq_len, cell.mode, None, None, None, 0, False, run.order.backend,
                      error=error).to_dict()
