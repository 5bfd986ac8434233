"""The Ray tasks of a fleet: one task per cell of a table run.

``measure_cell`` declares ``num_gpus=1``: Ray gives each such task a fresh worker process
(``max_calls`` is 1 for GPU tasks) that sees only its GPU (``CUDA_VISIBLE_DEVICES``), on a node
the caller's label selector picks (the run's GPU kind). ``estimate_cell`` takes one CPU anywhere:
the estimator needs no GPU, so estimate runs fan out over the cluster's CPUs.

A task runs the cell as the local runner's worker runs a table (api/runs/worker.py ``run_table``),
on a table of one mode up to the cell's sequence length whose earlier cells are given as finished:
they are not probed again, and they give the cell the hints ``tune_table`` gives it (an upper bound
and a guess), so a cell on the fleet is searched exactly as it is on one host.

Each is a generator task (a Ray streaming generator): it says first that it started (its node and
process), then that it is alive at most every PROGRESS_S while its cell reports (each probe that ended),
then its result. RayRunner's watchdog reads those: a task that says nothing for AUTOTUNE_WATCHDOG_S
is killed and its run failed, as the local runner's worker is (api/runs/runner.py).

Neither retries on its own (``max_retries=0``): RayRunner decides, and retries a cell whose worker
or node died at most once.
"""

from __future__ import annotations

import os
import queue
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import ray

from autotune.errors import AutotuneError

PROGRESS_S = 1.0  # a task's signs of life, at most one per this many seconds (each is an object in the store)


def run_cell(order: dict[str, Any], setup: Callable[[dict[str, Any]], None] | None = None,
             emit: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Run ``order`` (api.runs.worker's order of a one-mode table); what it reported.

    ``{"header", "cells": [new cells], "node", "pid"}``, or ``{"error", "node", "pid"}`` when
    the run cannot go on (a model PEFT cannot adapt, a bug): the run fails with that reason.
    ``setup(order)`` runs first, in the task's process (the tests put the CPU memory stand-in in
    place of the GPU there, and note where the task runs). ``emit`` hears each of run_table's messages.
    """
    from api.runs.worker import run_table

    where = {"node": ray.get_runtime_context().get_node_id(), "pid": os.getpid()}
    if setup is not None:
        setup(order)
    messages: list[dict[str, Any]] = []

    def record(message: dict[str, Any]) -> None:
        messages.append(message)
        if emit is not None:
            emit(message)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # transformers' deprecation notices
        try:
            from transformers.utils import logging as transformers_logging

            transformers_logging.set_verbosity_error()
            run_table(order, record, lambda: False)
        except AutotuneError as exc:
            return {"error": str(exc), **where}
        except Exception as exc:
            return {"error": f"{type(exc).__name__}: {exc}", **where}
    header = next((m["header"] for m in messages if m["op"] == "header"), None)
    return {"header": header, "cells": [m["cell"] for m in messages if m["op"] == "cell"], **where}


def stream_cell(order: dict[str, Any],
                setup: Callable[[dict[str, Any]], None] | None = None) -> Iterator[dict[str, Any]]:
    """``run_cell`` as a stream: ``{"op": "started", "node", "pid"}``, ``{"op": "progress"}`` while the
    cell reports (at most one per PROGRESS_S), then ``{"op": "result", "result": run_cell's answer}``."""
    where = {"node": ray.get_runtime_context().get_node_id(), "pid": os.getpid()}
    yield {"op": "started", **where}
    said: queue.Queue[dict[str, Any]] = queue.Queue()

    def run() -> None:
        try:
            said.put({"op": "result", "result": run_cell(order, setup, said.put)})
        except BaseException as exc:  # setup's own error: the run fails saying it
            said.put({"op": "result", "result": {"error": f"{type(exc).__name__}: {exc}", **where}})

    threading.Thread(target=run, name="cell", daemon=True).start()
    last = time.monotonic()
    while (item := said.get())["op"] != "result":
        if time.monotonic() - last >= PROGRESS_S:
            last = time.monotonic()
            yield {"op": "progress"}
    yield item


# max_retries=0: a worker or node that died is RayRunner's to retry (once, with the reason kept).
measure_cell = ray.remote(num_gpus=1, max_retries=0, num_returns="streaming")(stream_cell)
estimate_cell = ray.remote(num_cpus=1, max_retries=0, num_returns="streaming")(stream_cell)
