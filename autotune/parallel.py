"""Estimator work on several CPU cores at once: an estimator table's modes (``autotune table``'s and
``autotune.table``'s default where there are cores to spare), the lever searches of a check whose
step does not fit (``autotune check``, ``autotune.check``) and of an explanation (``autotune
explain``, ``autotune.explain``).

The cells of one mode depend on each other: a cell's hints come from the shorter lengths before it
(tuner.py). The modes do not, nor do a check's levers (each a cell of a changed step). So each job
(a mode of a table, a lever's search) runs whole in one process, the costliest first: the caller's
own process takes jobs too, the costliest first (it has imported torch already), and ``workers - 1``
workers started for them, or before (``prestart``: the CLI starts them before it imports torch);
the caller puts the results in the order one process makes them. The answers are one process's:
every process builds its own estimator of the same workload and target. A worker is
``python -m autotune.parallel``, like the project's other child processes (processes.py): not a
fork (torch in a forked process can deadlock on the thread pools the parent started), and not
multiprocessing's spawn, which imports the caller's main script again (a script without an
``if __name__ == "__main__"`` guard would run twice). Each worker imports torch and builds the fake
model once, a few seconds paid back from two jobs on (the default table has four modes, a check of
a full fine-tune five levers or more), and keeps to one of torch's threads, as the caller does
while it takes jobs, so that two processes on two cores do not contend. Parent and worker exchange
pickles (base64 lines): a job, then its progress (a table's cells), then its result or the error it
raised.

Progress (``on_cell``) reaches the parent as each worker finishes a cell; an error in a worker is
raised here, as a sequential run would raise it.
"""

from __future__ import annotations

import base64
import os
import pickle
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from autotune.errors import AutotuneError
from autotune.gpus import GpuSpec
from autotune.processes import Child, exit_reason, protocol_stream
from autotune.tuner import CellResult, TableResult, tune_table
from autotune.workload import Workload
from autotune.workload.modes import Mode, parse_mode
from autotune.workload.support import step_warnings

if TYPE_CHECKING:
    from autotune.analysis.levers import LeverRunner, LeverSearch

T = TypeVar("T")
WORKER_COMMAND = (sys.executable, "-m", "autotune.parallel")
# Workers started before this process imported torch (``prestart``), taken by the next jobs.
_prestarted: list[Child] = []


# A process's estimators by (target card, allocator settings): each builds its fake models once.
Estimators = dict[tuple[GpuSpec, Any], Any]

def usable_cores() -> int:
    """The CPU cores this process may use now: those it may run on (its affinity, e.g. a container's
    cpuset), less those other work keeps busy, at least one. A second process on a busy machine
    only shares a core (measured, issue 39: a 2-core machine with one core busy made the default
    table in 36-39 s in one process, 39-54 s in two) and pays its own import and model build."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return max(1, min(cores, round(cores - busy_cores())))


def busy_cores() -> float:
    """How many cores the machine's runnable tasks keep busy: the kernel's one-minute load average,
    the measure GNU make's ``--load-average`` starts jobs by (0 where the platform has none)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return 0.0


# A model under this many parameters (about: its layers and embeddings) traces in well under the
# second or more a worker takes to start and import torch: its jobs run in one process.
PARALLEL_FROM_PARAMETERS = 10_000_000


def approximate_parameters(workload: Workload) -> int | None:
    """12 h^2 per layer and the embeddings (a transformer's weights, roughly); None when the config
    does not say its width and depth."""
    config = workload.model.config
    if getattr(config, "vision_config", None) is not None:  # a vision-language model: its text model's
        config = config.get_text_config()
    hidden, layers = getattr(config, "hidden_size", None), getattr(config, "num_hidden_layers", None)
    if not isinstance(hidden, int) or not isinstance(layers, int):
        return None
    return 12 * layers * hidden * hidden + int(getattr(config, "vocab_size", 0) or 0) * hidden


def default_workers(workload: Workload, modes: Sequence[Mode]) -> int:
    """One process per mode, up to the usable cores; one for a small model (see above)."""
    return _workers(approximate_parameters(workload), len(modes))


def preset_workers(config: dict[str, Any], jobs: int, workers: int | None) -> int:
    """The processes ``jobs`` jobs on the estimator run in (a table's modes: default_workers; a
    check's levers: lever_processes) for a preset (its config as data, workload/presets/: nothing
    imported), ``workers`` as the caller gave it."""
    if workers is not None:
        return min(workers, jobs)
    # The names transformers' attribute_map gives hidden_size and num_hidden_layers in the presets'
    # families (DistilBERT, GPT-2): tests/autotune/test_parallel.py checks every preset against
    # default_workers of its config.
    if isinstance(config.get("text_config"), dict):  # a vision-language model's, nested
        config = config["text_config"]
    hidden = next((config[k] for k in ("hidden_size", "dim", "n_embd") if k in config), None)
    layers = next((config[k] for k in ("num_hidden_layers", "n_layers", "n_layer") if k in config), None)
    size = None
    if isinstance(hidden, int) and isinstance(layers, int):
        size = 12 * layers * hidden * hidden + int(config.get("vocab_size") or 0) * hidden
    return _workers(size, jobs)


def _workers(parameters: int | None, jobs: int) -> int:
    if parameters is not None and parameters < PARALLEL_FROM_PARAMETERS:
        return 1
    return max(1, min(jobs, usable_cores()))


def prestart(count: int) -> None:
    """Start ``count`` workers now, for the jobs this process is about to share out: each imports
    torch and transformers while this process does the same (the CLI calls it first thing), instead
    of after it (2-3 s of the default table's wall). ``stop_prestarted`` ends those no job took."""
    _prestarted.extend(_start_worker() for _ in range(count))


def stop_prestarted() -> None:
    while _prestarted:
        process = _prestarted.pop()
        process.kill()
        process.wait()
        process.close()


def _start_worker() -> Child:
    return Child(WORKER_COMMAND, stderr="inherit")  # a worker's stderr is the caller's (tracebacks)


def _encode(message: Any) -> str:
    return base64.b64encode(pickle.dumps(message)).decode("ascii") + "\n"


def _decode(line: str) -> Any:
    return pickle.loads(base64.b64decode(line))  # noqa: S301 (our own child, over its own pipe)


def tune_table_parallel(
    workload: Workload, gpu: GpuSpec, *, seq_lens: Sequence[int], modes: Sequence[Mode], margin: float,
    method: str, max_batch: int, workers: int,
    on_cell: Callable[[CellResult, int, int], None] | None = None, allocator: Any = None,
) -> TableResult:
    """tuner.tune_table on the estimator, the modes shared out over ``workers`` processes: this one
    and ``workers - 1`` started for it."""
    started = time.perf_counter()
    ordered = sorted(set(seq_lens))
    # The costliest modes first, so that the last to finish is a cheap one: checkpointing recomputes
    # in every trace and its batches are larger (more replays to settle), autocast adds the casts.
    # (BERT-base, one process: amp+ckpt 8.6 s, ckpt 6.2, amp 5.2, fp32 4.2.)
    costliest = sorted(modes, key=_cost, reverse=True)
    jobs = [{"job": "mode", "name": f"mode {mode.name}", "workload": workload, "gpu": gpu,
             "allocator": allocator, "seq_lens": ordered, "mode_name": mode.name, "margin": margin,
             "method": method, "max_batch": max_batch} for mode in costliest]
    done = [0]
    total = len(ordered) * len(modes)

    def progress(cell: CellResult) -> None:
        done[0] += 1
        if on_cell is not None:
            on_cell(cell, done[0], total)

    tables = dict(zip([mode.name for mode in costliest], _share_out(jobs, workers, progress, {}),
                      strict=True))
    first = tables[modes[0].name]
    first.modes = [mode.name for mode in modes]
    first.cells = [cell for mode in modes for cell in tables[mode.name].cells]
    first.warnings = step_warnings(workload, modes, gpu, seq_lens)
    first.elapsed_s = round(time.perf_counter() - started, 3)
    return first


def lever_processes(workload: Workload, searches: int, workers: int | None) -> int:
    """The processes ``searches`` lever searches (a check's, an explanation's) run in (``workers`` as
    the caller gave it; None: one per search, up to the usable cores, for a model of 10M parameters
    or more)."""
    if workers is not None:
        return max(1, min(workers, searches))
    return _workers(approximate_parameters(workload), searches)


def lever_runner(backend: Any, processes: int) -> LeverRunner:
    """Lever searches (analysis/levers.py: a check's, an explanation's) on the estimator, shared out
    over up to ``processes`` processes: this one, with ``backend`` (the caller's estimator: its fake
    model is built), takes the costliest. Each search's answer is one process's."""

    def run(searches: Sequence[LeverSearch], search: Callable[[LeverSearch, Any], T]) -> list[T]:
        return _costliest_first(
            [(lever.mode, lever.workload) for lever in searches],
            lambda i: {"job": "lever", "name": f"lever search {searches[i].label}", "lever": searches[i],
                       "search": search, "gpu": backend.gpu, "allocator": backend.allocator},
            processes, backend)

    return run


def _costliest_first(steps: Sequence[tuple[Mode, Workload]], job: Callable[[int], dict[str, Any]],
                     processes: int, backend: Any) -> list[Any]:
    """Jobs ``job(i)`` for each of ``steps`` run over ``processes`` processes, the costliest first
    (this one with ``backend``, the caller's estimator); their results in the steps' order."""
    order = sorted(range(len(steps)), key=lambda i: _cost(*steps[i]), reverse=True)
    found = _share_out([job(i) for i in order], min(processes, len(steps)), None,
                       {(backend.gpu, backend.allocator): backend})
    results: list[Any] = [None] * len(steps)
    for i, result in zip(order, found, strict=True):
        results[i] = result
    return results


def _cost(mode: Mode, workload: Workload | None = None) -> tuple[bool, bool, bool]:
    """What makes a job slow, for the costliest-first order: checkpointing (recomputes in every
    trace, larger batches to settle), a PEFT model (built for the job), autocast (the casts)."""
    adapted = workload is not None and workload.adapter is not None
    return mode.checkpointing, adapted, mode.autocast_dtype_name is not None


class _Sharing:
    """The jobs of one ``_share_out``: the queue they are taken from, their results, the errors
    that stop them; taken by this process (``run_here``) and by a thread per worker (``serve``)."""

    def __init__(self, jobs: list[dict[str, Any]], on_progress: Callable[[Any], None] | None,
                 backends: Estimators) -> None:
        self.jobs, self.on_progress, self.backends = jobs, on_progress, backends
        self.pending = list(range(len(jobs)))
        self.results: dict[int, Any] = {}
        self.errors: list[BaseException] = []
        self.lock = threading.Lock()

    def take(self) -> int | None:
        with self.lock:
            return self.pending.pop(0) if self.pending and not self.errors else None

    def serve(self, process: Child) -> None:
        """Feed one worker jobs until none is left; pass on what it sends."""
        while (index := self.take()) is not None:
            process.send(_encode(self.jobs[index]))  # False: it is gone, and follow says how it died
            if not self.follow(process, index):
                return
        process.close_input()

    def follow(self, process: Child, index: int) -> bool:
        """Pass on the worker's replies to one job; False when it failed (``errors`` says why)."""
        for line in process.replies():
            kind, payload = _decode(line)
            with self.lock:
                if kind == "progress":
                    if self.on_progress is not None:
                        try:
                            self.on_progress(payload)
                        except BaseException as exc:  # the caller's own error ends the jobs
                            self.errors.append(exc)
                            return False
                elif kind == "done":
                    self.results[index] = payload
                    return True
                else:
                    self.errors.append(payload)
                    return False
        died = f"the worker of {self.jobs[index]['name']} {exit_reason(process.wait())} before it finished"
        with self.lock:
            self.errors.append(AutotuneError(died))
        return False

    def run_here(self, index: int | None) -> None:
        """Run jobs in this process, from ``index`` on, until none is left."""
        import torch

        def send(message: Any) -> None:
            _, payload = message
            with self.lock:
                if self.on_progress is not None:
                    self.on_progress(payload)  # the caller's own error ends the jobs

        threads_before = torch.get_num_threads()
        torch.set_num_threads(1)  # as a worker does: the cores are the workers'
        try:
            while index is not None:
                self.results[index] = _run_job(self.jobs[index], send, self.backends)
                index = self.take()
        except Exception as exc:  # the workers stop at their next job; Ctrl-C goes straight up
            with self.lock:
                self.errors.append(exc)
        finally:
            torch.set_num_threads(threads_before)


def _share_out(jobs: list[dict[str, Any]], workers: int, on_progress: Callable[[Any], None] | None,
               backends: Estimators) -> list[Any]:
    """Run ``jobs`` (each ``{"job": kind, "name": what it is, **arguments}``, costliest first) in
    this process and ``workers - 1`` worker processes, taken in order from one queue; their
    results in the jobs' order. This process takes the first (it has imported torch already, its
    workers may not have yet), with the estimators in ``backends``. ``on_progress`` gets each
    progress message (a table's cells) as it comes; the first error, a job's or ``on_progress``'s,
    stops the other jobs and is raised here, as one process would raise it."""
    sharing = _Sharing(jobs, on_progress, backends)
    processes = [_prestarted.pop() if _prestarted else _start_worker()
                 for _ in range(min(workers, len(jobs)) - 1)]
    mine = sharing.pending.pop(0) if sharing.pending else None
    threads = []
    finished = False
    try:
        for process in processes:
            thread = threading.Thread(target=sharing.serve, args=(process,), daemon=True)
            threads.append(thread)
            thread.start()
        sharing.run_here(mine)
        if not sharing.errors:  # else the workers are stopped now, not after their jobs
            for thread in threads:
                thread.join()
        finished = True
    finally:  # an error, or this process interrupted (Ctrl-C): no worker outlives its jobs
        for process in processes:
            if process.poll() is None and (sharing.errors or not finished):
                process.kill()
            process.wait()
            process.close()
    if sharing.errors:
        raise sharing.errors[0]
    return [sharing.results[index] for index in range(len(jobs))]


def _run_job(job: dict[str, Any], send: Callable[[Any], None], backends: Estimators) -> Any:
    arguments = {key: value for key, value in job.items() if key not in ("job", "name")}
    if job["job"] == "mode":
        return _tune_mode(**arguments, send=send, backends=backends)
    if job["job"] == "lever":  # its search: levers.lever_max or levers.report_lever, its cell bound
        return arguments["search"](arguments["lever"],
                                   _estimator(arguments["gpu"], arguments["allocator"], backends))
    raise AutotuneError(f"unknown job {job['job']!r}")


def _estimator(gpu: GpuSpec, allocator: Any, backends: Estimators) -> Any:
    """The process's estimator of ``gpu`` under ``allocator``'s settings (None: the classic
    segments), kept across its jobs (its fake models are built once)."""
    from autotune.backends.estimate.backend import EstimateBackend

    backend = backends.get((gpu, allocator))
    if backend is None:
        backend = backends[gpu, allocator] = EstimateBackend(gpu, allocator)
    return backend


def _tune_mode(workload: Workload, gpu: GpuSpec, allocator: Any, seq_lens: list[int], mode_name: str,
               margin: float, method: str, max_batch: int, send: Callable[[Any], None], backends: Estimators,
               ) -> TableResult:
    """One mode's table, each cell sent as it finishes."""
    return tune_table(workload, _estimator(gpu, allocator, backends), gpu, seq_lens=seq_lens,
                      modes=[parse_mode(mode_name)], margin=margin, method=method, max_batch=max_batch,
                      on_cell=lambda cell, done, total: send(("progress", cell)))


def main() -> int:
    """A worker: one job a line on stdin (a table's mode, a check's or an explanation's lever
    search); its progress (a table's cells) and its result (or error) on stdout."""
    import warnings

    replies = protocol_stream()

    def send(message: Any) -> None:
        replies.write(_encode(message))
        replies.flush()

    import torch

    torch.set_num_threads(1)
    warnings.simplefilter("ignore", FutureWarning)  # transformers' deprecation notices
    # What every job needs, imported before the first one is read: a worker started early (prestart)
    # imports while its parent does.
    import transformers.modeling_utils  # noqa: F401
    from transformers.utils import logging as transformers_logging

    import autotune.backends.estimate.backend  # noqa: F401

    transformers_logging.set_verbosity_error()
    backends: Estimators = {}
    for line in sys.stdin:
        try:
            send(("done", _run_job(_decode(line), send, backends)))
        except Exception as exc:  # the parent raises it, as a run in one process would
            try:
                pickle.dumps(exc)
            except Exception:
                exc = AutotuneError(f"{type(exc).__name__}: {exc}")
            send(("error", exc))
    return 0


if __name__ == "__main__":
    code = main()
    sys.stderr.flush()  # every reply was flushed as it was sent
    os._exit(code)  # not Python's finalization of torch's modules: 0.8 s the table would wait for
