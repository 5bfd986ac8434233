"""The worker of one table run: ``python -m api.runs.worker`` (runner.LocalRunner starts it).

A process per run, so that whatever the run does to its process (a segfault in a kernel, a CUDA
error, the OOM killer) ends the run, not the service. The cuda backend starts its own probe
processes below this one (autotune/backends/cuda/); the estimate backend runs in this process.

Protocol: JSON objects, one per line, UTF-8.

    server -> worker (stdin)                  worker -> server (stdout)
    {"op": "run", "run_id", "spec",           {"op": "header", "header": {"attn", "environment", "adapter"}}
     "completed": [cell, ...]}                {"op": "progress"}  after each probe (the watchdog's
    {"op": "stop"}  (cancel: stop between                          sign of life)
     cells)                                   {"op": "cell", "position": n, "cell": {...}}  per new cell
                                              {"op": "done", "elapsed_s", "stopped"}
                                              or {"op": "failed", "error_type", "error"}

``spec`` is a TableSpec (api/spec.py); cells are CellResult.to_dict(). Cells in ``completed``
are kept as they are (tuner.tune_table's ``completed``) and not reported again. stdin closing
means the server is gone: the worker then kills its process group (itself and its probe
processes) at once, so that no orphan goes on probing a GPU the next server will use.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import traceback
import warnings
from collections.abc import Callable, Iterator
from typing import IO, Any

from autotune.errors import AutotuneError
from autotune.processes import protocol_stream

Emit = Callable[[dict[str, Any]], None]


class _ProgressCell:
    """A backend's cell (search.Cell) that reports each probe as it ends."""

    def __init__(self, cell: Any, emit: Emit) -> None:
        self._cell, self._emit = cell, emit

    def fits(self, batch_size: int) -> Any:
        try:
            return self._cell.fits(batch_size)
        finally:
            self._emit({"op": "progress"})

    def predict(self, lo: int, hi: int | None) -> int | None:
        return self._cell.predict(lo, hi)

    def settle(self, boundary: int) -> int | None:
        return self._cell.settle(boundary)

    def above(self, boundary: int) -> int | None:
        return self._cell.above(boundary)


class _ProgressBackend:
    """A Backend whose cells report their probes (``{"op": "progress"}``); the rest is the backend's."""

    def __init__(self, backend: Any, emit: Emit) -> None:
        self._backend, self._emit = backend, emit

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)

    @contextlib.contextmanager
    def cell(self, *args: Any, **kwargs: Any) -> Iterator[_ProgressCell]:
        with self._backend.cell(*args, **kwargs) as inner:
            yield _ProgressCell(inner, self._emit)


def run_table(order: dict[str, Any], emit: Emit, should_stop: Callable[[], bool]) -> None:
    """Fill the table of ``order``, reporting each new cell through ``emit``."""
    from api.runs.spec import TableSpec
    from autotune.tuner import CellResult, adapter_json, tune_table
    from autotune.workload.modes import parse_modes

    spec = TableSpec.from_json(order["spec"])
    workload, gpu = spec.workload(), spec.target_gpu()
    backend: Any
    from autotune.backends.estimate.alloc_conf import parse_alloc_conf
    from autotune.backends.estimate.backend import EstimateBackend

    allocator = parse_alloc_conf(spec.alloc_conf)
    if spec.backend == "cuda":
        from autotune.backends.cuda.backend import CudaBackend
        from autotune.backends.seeded import EstimateSeeded

        # the lane's GPU is device 0 (CUDA_VISIBLE_DEVICES)
        backend = CudaBackend(gpu, alloc_conf=spec.alloc_conf)
        if spec.search == "guided":  # each cell's GPU search starts from the estimate (seeded.py)
            backend = EstimateSeeded(backend, EstimateBackend(gpu, allocator))
    else:
        backend = EstimateBackend(gpu, allocator)
    completed = {(c["mode"], c["seq_len"]): CellResult(**c) for c in order.get("completed", [])}

    def on_cell(cell: CellResult, done: int, total: int) -> None:
        if (cell.mode, cell.seq_len) not in completed:
            emit({"op": "cell", "position": done - 1, "cell": cell.to_dict()})

    # The adapter as PEFT built it on this model (its modules, its parameter counts): the run's
    # page and GET /v1/tables say it, and a check answered from this table (routes/check.py).
    # Targets this model lacks fail the run here, with PEFT's reason.
    adapter = adapter_json(workload)
    emit({"op": "header", "header": {"attn": backend.attn_used(workload), "environment": backend.describe(),
                                     "adapter": adapter}})
    table = tune_table(
        workload, _ProgressBackend(backend, emit), gpu, seq_lens=spec.seq_lens, modes=parse_modes(spec.modes),
        margin=spec.margin, method=spec.search, max_batch=spec.max_batch, on_cell=on_cell,
        completed=completed, should_stop=should_stop,
    )
    emit({"op": "done", "elapsed_s": table.elapsed_s, "stopped": len(table.cells) < spec.cells})


def _die_with_children() -> None:
    """The server is gone: end this process and its probe processes now."""
    if os.getpgrp() == os.getpid():  # our own group (the runner starts us in a new session)
        os.killpg(os.getpid(), signal.SIGKILL)
    os._exit(1)


def _watch_stdin(stop: threading.Event) -> None:
    for line in sys.stdin:
        try:
            if json.loads(line).get("op") == "stop":
                stop.set()
        except (ValueError, AttributeError):
            continue
    _die_with_children()


def serve(order: dict[str, Any], replies: IO[str]) -> int:
    """Run ``order``, replying on ``replies``, stopping when stdin says so; the exit code."""
    lock = threading.Lock()

    def emit(message: dict[str, Any]) -> None:
        with lock:
            replies.write(json.dumps(message) + "\n")
            replies.flush()

    stop = threading.Event()
    threading.Thread(target=_watch_stdin, args=(stop,), daemon=True).start()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # transformers' deprecation notices
        try:
            from transformers.utils import logging as transformers_logging

            transformers_logging.set_verbosity_error()
            run_table(order, emit, stop.is_set)
        except AutotuneError as exc:
            emit({"op": "failed", "error_type": type(exc).__name__, "error": str(exc)})
            return 1
        except Exception as exc:
            traceback.print_exc()
            emit({"op": "failed", "error_type": type(exc).__name__, "error": f"{type(exc).__name__}: {exc}"})
            return 1
    return 0


NICE_INCREMENT = 5  # below the server (health, pages), above the heavy reads (analysis_worker: 10)


def main() -> int:
    replies = protocol_stream()
    with contextlib.suppress(OSError):  # not allowed here: run at the server's priority
        os.nice(NICE_INCREMENT)
    line = sys.stdin.readline()
    if not line.strip():
        return 0  # no order: the server went away before sending one
    return serve(json.loads(line), replies)


if __name__ == "__main__":
    sys.exit(main())
