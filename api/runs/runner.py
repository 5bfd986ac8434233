"""Runners execute table runs away from the request path.

The service talks to a runner through ``Runner``, seven methods, and hears back through
``RunEvents``; the queue itself lives in the store (queue.py). ``LocalRunner`` runs orders on
this host. ``RayRunner`` (api/fleet/runner.py) implements the same interface on a Ray cluster, a fleet
of GPU kinds: a task per cell with ``num_gpus=1`` on a node of the run's kind. Both are a
``RunnerBase``: the versions, the analysis pool, the lock, the checks of a backend, and closing.

LocalRunner has lanes, each a thread that runs one order at a time in a worker process
(``python -m api.runs.worker``, protocol in that module):

- one lane per local GPU, its workers seeing only that GPU (``CUDA_VISIBLE_DEVICES``): two probes
  on one GPU would corrupt each other's peak, so a GPU never runs two orders at once;
- ``estimate_workers`` estimate lanes (default: the CPU count), with no GPU visible.

A watchdog fails a run whose worker reports nothing (no cell, no probe) for ``watchdog_s``:
it kills the worker's group and fails the run with that reason, freeing the lane (a worker
stopped with SIGSTOP, or stuck in a kernel, would hold it forever). Heavy reads (``check`` and
``explain`` on the estimator) go to the runner too, to a pool of their own (analysis.py).

Runs of a kind start in the order they were submitted. A worker is a process of its own, in a
process group of its own, so that a crash (segfault, kill, a CUDA error that ends the process)
fails its run with the reason while the service keeps serving; after any worker exits, the lane
kills what is left of its group (the cuda backend's probe processes) before the next order.
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import os
import platform
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import autotune
from api.runs.analysis import ANALYSIS_COMMAND, AnalysisOrder, AnalysisPool, Ticket
from api.settings import ANALYSIS_TIMEOUT_S, WATCHDOG_S
from autotune.errors import BackendUnavailable, InvalidInput
from autotune.processes import Child, child_env, exit_reason

log = logging.getLogger("autotune.api")

WORKER_COMMAND = (sys.executable, "-m", "api.runs.worker")
STOP_GRACE_S = 5.0  # for a cancelled worker to stop between cells before its group is killed
BACKEND_KINDS = ("cuda", "estimate")
WATCHDOG_POLL_S = 1.0


class ClusterUnreachable(BackendUnavailable):
    """The cluster a runner executes on (a fleet's Ray cluster, api/fleet/) cannot be reached now: new
    runs are refused (503 with Retry-After), queued ones wait (queue.py) until it is back."""

    retry_after_s = 10  # the runner joins the cluster again by itself within seconds of its head answering


@dataclass(frozen=True)
class RunOrder:
    """One table run to execute: its normalised spec and the cells finished before."""

    run_id: str
    spec: dict[str, Any]  # TableSpec.to_json()
    completed: tuple[dict[str, Any], ...] = ()  # CellResult.to_dict() of cells kept from before

    @property
    def backend(self) -> str:
        return str(self.spec["backend"])


class RunEvents(Protocol):
    """What a runner reports about an order (queue.RunQueue writes it to the store)."""

    def started(self, run_id: str, lane: str, pid: int | None) -> bool:
        """The order got a lane; False: it was cancelled meanwhile, do not run it."""
        ...

    def header(self, run_id: str, header: dict[str, Any]) -> None: ...

    def cell(self, run_id: str, position: int, cell: dict[str, Any]) -> None: ...

    def finished(self, run_id: str, status: str, error: str | None, elapsed_s: float | None) -> None:
        """status done or failed. Not called for a cancelled order, nor one cut off by close()."""
        ...


class Runner(Protocol):
    def environment(self, backend: str, gpu: str | None = None) -> dict[str, Any]:
        """Where a run of ``backend`` (auto|cuda|estimate) would go: the resolved backend, the
        GPU kind, the versions. Part of the key of identical runs. BackendUnavailable if none;
        ClusterUnreachable while the cluster the runner executes on is away.

        ``gpu``: the GPU preset the request names (a fleet runs cuda on a node of that kind; a
        host measures on its own GPUs and ignores it)."""
        ...

    def describe(self) -> dict[str, Any]:
        """For the health check: the default backend, GPUs, lanes, versions, the analysis pool."""
        ...

    def submit(self, order: RunOrder, events: RunEvents) -> None:
        """Queue ``order``; returns at once. An order already queued or running is ignored."""
        ...

    def cancel(self, run_id: str) -> None:
        """Drop a queued order, or stop a running one (its finished cells were reported)."""
        ...

    def held(self) -> set[str]:
        """The run ids queued or running here (the reconciler compares them with the store)."""
        ...

    def analyze(self, order: AnalysisOrder, client: str = "") -> Ticket:
        """Start (or join, or answer from cache) a check or explain away from the server process;
        ``client`` (api.admission.client_of) holds at most its share of the workers.

        Overloaded (HTTP 503, Retry-After) when there is no room for it now."""
        ...

    def close(self) -> None:
        """Stop every worker; running orders are left for the next start to resume."""
        ...


def versions() -> dict[str, str | None]:
    import torch
    import transformers

    return {
        "autotune": autotune.__version__,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "cuda": torch.version.cuda,
    }


def check_backend(backend: str) -> None:
    """InvalidInput unless ``backend`` is one a run may ask for (auto, or one of BACKEND_KINDS)."""
    if backend not in ("auto", *BACKEND_KINDS):
        raise InvalidInput(f"unknown backend {backend!r}: allowed are auto, {', '.join(BACKEND_KINDS)}")


class RunnerBase:
    """What every runner shares (LocalRunner here, RayRunner in api/fleet/runner.py): the versions
    of this host, the analysis pool (heavy reads run on this host wherever the tables run), and a
    condition guarding the runner's state, with whether it is closed. A runner says what runs in
    it as it closes (``_take_running``) and how to stop that (``_stop``)."""

    def __init__(self, *, analysis_workers: int, analysis_timeout_s: float, analysis_command: Sequence[str],
                 analyses: AnalysisPool | None) -> None:
        self._versions = versions()
        # A pool of the caller's, shared by several runners (the tests' apps): this runner then
        # leaves it open when it closes.
        self._own_analyses = analyses is None
        self.analyses = analyses if analyses is not None else AnalysisPool(
            workers=analysis_workers, timeout_s=analysis_timeout_s, command=analysis_command,
            env=child_env({"CUDA_VISIBLE_DEVICES": ""}))
        self._cond = threading.Condition()
        self._closed = False

    def analyze(self, order: AnalysisOrder, client: str = "") -> Ticket:
        return self.analyses.analyze(order, client)

    def close(self) -> None:
        """Stop every worker; running orders are left for the next start to resume (Runner.close)."""
        if self._own_analyses:
            self.analyses.close()
        with self._cond:
            self._closed = True
            running = self._take_running()
            self._cond.notify_all()
        self._stop(running)

    def _take_running(self) -> list[Any]:
        """Under the lock, as the runner closes: what runs in it now (workers, tasks)."""
        raise NotImplementedError

    def _stop(self, running: list[Any]) -> None:
        """Outside the lock, once closed: stop ``running`` (``_take_running``) and the runner's threads.
        The orders stay running in the store: the next start resumes them."""
        raise NotImplementedError

    def _check_order(self, order: RunOrder) -> None:
        if order.backend not in BACKEND_KINDS:
            raise InvalidInput(f"order {order.run_id} has backend {order.backend!r}")

    def _environment(self, backend: str, device: str | None, **more: Any) -> dict[str, Any]:
        """``environment``'s answer: the resolved backend, its GPU kind, ``more``, the versions."""
        # Python's version changes no allocation; CUDA's is in torch's (+cu124).
        return {"backend": backend, "device": device, **more,
                **{k: v for k, v in self._versions.items() if k not in ("python", "cuda")}}

    def _description(self, backend: str, gpu: str | None, lanes: dict[str, int]) -> dict[str, Any]:
        """``describe``'s answer: the default backend, the GPU, the lanes per backend, the rest shared."""
        return {"backend": backend, "gpu": gpu, "lanes": lanes, "analysis": self.analyses.describe(),
                "versions": dict(self._versions)}


@dataclass(frozen=True)
class Lane:
    name: str  # e.g. cuda:0, estimate:1
    backend: str  # cuda | estimate
    env: Mapping[str, str] = field(default_factory=dict)  # for its workers' environment
    device: str | None = None  # the GPU's name, for a cuda lane


def detect_gpu_lanes() -> list[Lane]:
    """One lane per visible CUDA device of the first device's kind.

    Reads device properties only: no CUDA context in the server, the GPUs stay free for
    the workers. Devices of another kind are left out (with a warning): one host, one kind.
    """
    import torch

    if not torch.cuda.is_available():
        return []
    count = torch.cuda.device_count()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:  # torch's device i is the i-th of them
        ids = [s.strip() for s in visible.split(",") if s.strip()][:count]
    else:
        ids = [str(i) for i in range(count)]
    names = [torch.cuda.get_device_properties(i).name for i in range(len(ids))]
    kind = names[0]
    lanes = [Lane(f"cuda:{i}", "cuda", {"CUDA_VISIBLE_DEVICES": ids[i]}, name)
             for i, name in enumerate(names) if name == kind]
    if len(lanes) < len(names):
        log.warning("GPUs of another kind than %s are not used: %s", kind,
                    ", ".join(f"{i} ({n})" for i, n in enumerate(names) if n != kind))
    return lanes


class _Worker(Child):
    """One run's worker, in a process group of its own: killing it reaches its probe processes."""

    def __init__(self, command: Sequence[str], env: Mapping[str, str]) -> None:
        super().__init__(command, env=env, own_group=True)
        self._timer: threading.Timer | None = None

    def cancel(self, grace_s: float) -> None:
        """Ask it to stop between cells; kill its group if it has not exited after ``grace_s``."""
        self.send(json.dumps({"op": "stop"}) + "\n")  # False: gone already, its exit says why
        if self._timer is None:
            self._timer = threading.Timer(grace_s, self.kill)
            self._timer.daemon = True
            self._timer.start()

    def reap(self) -> int | None:
        """Wait for the exit, then kill what is left of the group; the exit code."""
        code = self.wait()
        if self._timer is not None:
            self._timer.cancel()
        self.close()  # orphans of a crashed worker (the cuda backend's probe processes) hold the GPU
        return code

    def died(self, code: int | None, done: int, total: int) -> str:
        """Why a run failed whose worker exited without finishing it."""
        text = f"the worker process (pid {self.pid}) {exit_reason(code)} after {done} of {total} cells"
        lines = [line.strip() for line in self.stderr_tail() if line.strip()]
        return text + (f"; its stderr ends with: {lines[-1]}" if lines else "")


@dataclass
class _Slot:
    """An order a lane took: its worker once started, and whether to stop it."""

    lane: Lane
    worker: _Worker | None = None
    stop: bool = False
    last_progress: float = field(default_factory=time.monotonic)  # monotonic s of its last message
    stalled: str | None = None  # why the watchdog killed its worker


class LocalRunner(RunnerBase):
    """Runs orders in worker processes on this host; see the module docstring."""

    def __init__(
        self,
        *,
        estimate_workers: int,
        gpu_lanes: Sequence[Lane] | None = None,  # None: one per local GPU (detect_gpu_lanes)
        worker_command: Sequence[str] = WORKER_COMMAND,  # injectable: tests run fake workers
        stop_grace_s: float = STOP_GRACE_S,
        watchdog_s: float = WATCHDOG_S,
        analysis_workers: int = 1,
        analysis_timeout_s: float = ANALYSIS_TIMEOUT_S,
        analysis_command: Sequence[str] = ANALYSIS_COMMAND,
        analyses: AnalysisPool | None = None,  # shared by the tests' apps: left open on close
    ) -> None:
        super().__init__(analysis_workers=analysis_workers, analysis_timeout_s=analysis_timeout_s,
                         analysis_command=analysis_command, analyses=analyses)
        lanes = detect_gpu_lanes() if gpu_lanes is None else list(gpu_lanes)
        self._gpu_kind = lanes[0].device if lanes else None
        self._gpu_lanes = lanes
        self._lanes = lanes + [
            Lane(f"estimate:{i}", "estimate", {"CUDA_VISIBLE_DEVICES": ""}) for i in range(estimate_workers)
        ]
        self.worker_command = tuple(worker_command)
        self.stop_grace_s = stop_grace_s
        self.watchdog_s = watchdog_s
        self._pending: dict[str, collections.deque[tuple[RunOrder, RunEvents]]] = {
            kind: collections.deque() for kind in BACKEND_KINDS
        }
        self._running: dict[str, _Slot] = {}
        self._threads = [
            threading.Thread(target=self._lane_loop, args=(lane,), name=f"lane {lane.name}", daemon=True)
            for lane in self._lanes
        ]
        self._threads.append(threading.Thread(target=self._watchdog_loop, name="watchdog", daemon=True))
        for thread in self._threads:
            thread.start()

    # --- Runner ---------------------------------------------------------------------------

    def environment(self, backend: str, gpu: str | None = None) -> dict[str, Any]:
        check_backend(backend)
        if backend == "auto":
            backend = "cuda" if self._gpu_lanes else "estimate"
        if backend == "cuda" and not self._gpu_lanes:
            raise BackendUnavailable(
                "backend 'cuda' needs a CUDA GPU, and this server has none: use backend 'estimate' (or auto)"
            )
        return self._environment(backend, self._gpu_kind if backend == "cuda" else None)

    def describe(self) -> dict[str, Any]:
        lanes = {kind: sum(1 for lane in self._lanes if lane.backend == kind) for kind in BACKEND_KINDS}
        return self._description("cuda" if self._gpu_lanes else "estimate", self._gpu_kind, lanes)

    def submit(self, order: RunOrder, events: RunEvents) -> None:
        self._check_order(order)
        with self._cond:
            if self._closed or order.run_id in self._running or any(
                queued.run_id == order.run_id for queued, _ in self._pending[order.backend]
            ):
                return
            self._pending[order.backend].append((order, events))
            self._cond.notify_all()

    def cancel(self, run_id: str) -> None:
        with self._cond:
            for queue in self._pending.values():
                for entry in [e for e in queue if e[0].run_id == run_id]:
                    queue.remove(entry)
            slot = self._running.get(run_id)
            if slot is None:
                return
            slot.stop = True
            worker = slot.worker
        if worker is not None:
            worker.cancel(self.stop_grace_s)

    def held(self) -> set[str]:
        with self._cond:
            return set(self._running) | {order.run_id for q in self._pending.values() for order, _ in q}

    def _take_running(self) -> list[Any]:
        return [slot.worker for slot in self._running.values() if slot.worker is not None]

    def _stop(self, running: list[Any]) -> None:
        for worker in running:
            worker.kill()
        for thread in self._threads:
            thread.join(timeout=10.0)

    # --- lanes ----------------------------------------------------------------------------

    def running(self) -> dict[str, str]:
        """run id -> lane name, of the orders in a lane now."""
        with self._cond:
            return {run_id: slot.lane.name for run_id, slot in self._running.items()}

    def _watchdog_loop(self) -> None:
        """Kill the worker of a run that reported nothing for watchdog_s; _execute fails the run."""
        while True:
            with self._cond:
                if self._closed:
                    return
                now = time.monotonic()
                stalled = [slot for slot in self._running.values()
                           if slot.worker is not None and slot.stalled is None and not slot.stop
                           and now - slot.last_progress > self.watchdog_s]
                for slot in stalled:
                    pid = slot.worker.pid if slot.worker is not None else None
                    slot.stalled = (f"the worker process (pid {pid}) made no progress for "
                                    f"{self.watchdog_s:g} s (AUTOTUNE_WATCHDOG_S) and was killed")
                self._cond.wait(timeout=min(WATCHDOG_POLL_S, self.watchdog_s / 4))
            for slot in stalled:
                log.warning("lane %s: %s", slot.lane.name, slot.stalled)
                assert slot.worker is not None
                slot.worker.kill()

    def _lane_loop(self, lane: Lane) -> None:
        while True:
            with self._cond:
                queue = self._pending[lane.backend]
                while not self._closed and not queue:
                    self._cond.wait()
                if self._closed:
                    return
                order, events = queue.popleft()
                slot = self._running[order.run_id] = _Slot(lane)
            try:
                self._execute(order, events, slot)
            except Exception as exc:  # a bug here must not end the lane, nor leave the run hanging
                log.exception("lane %s: run %s", lane.name, order.run_id)
                with contextlib.suppress(Exception):
                    events.finished(order.run_id, "failed", f"internal error in the runner: {exc!r}", None)
            finally:
                with self._cond:
                    self._running.pop(order.run_id, None)

    def _worker_env(self, lane: Lane) -> dict[str, str]:
        return child_env(lane.env)

    def _execute(self, order: RunOrder, events: RunEvents, slot: _Slot) -> None:
        started = time.monotonic()
        try:
            worker = _Worker(self.worker_command, self._worker_env(slot.lane))
        except OSError as exc:
            if events.started(order.run_id, slot.lane.name, None):
                events.finished(order.run_id, "failed", f"cannot start a worker process: {exc}", None)
            return
        try:
            go = events.started(order.run_id, slot.lane.name, worker.pid)  # False: cancelled meanwhile
            if go:
                worker.send(json.dumps({"op": "run", "run_id": order.run_id, "spec": order.spec,
                                        "completed": list(order.completed)}) + "\n")
            with self._cond:  # from here on, cancel(), close() and the watchdog reach the worker
                slot.worker = worker
                slot.last_progress = time.monotonic()
                slot.stop = slot.stop or not go
                if slot.stop or self._closed:
                    worker.kill()
            result, new_cells = self._follow(order, events, worker, slot)
        except BaseException:
            worker.kill()
            raise
        finally:
            code = worker.reap()
        with self._cond:
            # Cancelled: the store says so already. Cut off by close(): the next start resumes it.
            if slot.stop or (self._closed and result is None):
                return
        if slot.stalled is not None:
            result = ("failed", slot.stalled)
        if result is None:
            total = len(order.spec["seq_lens"]) * len(order.spec["modes"])
            result = ("failed", worker.died(code, len(order.completed) + new_cells, total))
        status, error = result
        events.finished(order.run_id, status, error, round(time.monotonic() - started, 3))

    def _follow(
        self, order: RunOrder, events: RunEvents, worker: _Worker, slot: _Slot
    ) -> tuple[tuple[str, str | None] | None, int]:
        """Relay the worker's messages until it closes stdout.

        Returns (status, error) if the worker said how the run ended, and the cells it reported.
        """
        result: tuple[str, str | None] | None = None
        cells = 0
        for line in worker.replies():
            try:
                message = json.loads(line)
                op = message["op"]
            except (ValueError, KeyError, TypeError):
                worker.kill()
                why = f"the worker broke the protocol with the line {line.strip()[:200]!r}"
                return ("failed", why), cells
            slot.last_progress = time.monotonic()  # any message: the watchdog's sign of life
            if op == "progress":
                continue
            if op == "header":
                events.header(order.run_id, message["header"])
            elif op == "cell":
                events.cell(order.run_id, int(message["position"]), message["cell"])
                cells += 1
            elif op == "done":
                result = ("done", None)
            elif op == "failed":
                result = ("failed", str(message.get("error")))
        return result, cells
