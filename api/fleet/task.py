"""The Ray tasks of a fleet: one task per cell of a table run.

``measure_cell`` declares ``num_gpus=1``: Ray gives each such task a fresh worker process
(``max_calls`` is 1 for GPU tasks) that sees only its GPU (``CUDA_VISIBLE_DEVICES``), on a node
the caller's label selector picks (the run's GPU kind). ``estimate_cell`` takes one CPU anywhere:
the estimator needs no GPU, so estimate runs fan out over the cluster's CPUs.

A task runs the cell as the local runner's worker runs a table (api/runs/worker.py ``run_table``),
on a table of one mode up to the cell's sequence length whose earlier cells are given as finished:
they are not probed again, and they give the cell the hints ``tune_table`` gives it (an upper bound
and a guess), so a cell on the fleet is searched exactly as it is on one host.

Neither retries on its own (``max_retries=0``): RayRunner decides, and retries a cell whose worker
or node died at most once.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from typing import Any

import ray

from autotune.errors import AutotuneError


def run_cell(order: dict[str, Any], setup: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Run ``order`` (api.runs.worker's order of a one-mode table); what it reported.

    ``{"header", "cells": [new cells], "node", "pid"}``, or ``{"error", "node", "pid"}`` when
    the run cannot go on (a model PEFT cannot adapt, a bug): the run fails with that reason.
    ``setup(order)`` runs first, in the task's process (the tests put the CPU memory stand-in in
    place of the GPU there, and note where the task runs).
    """
    from api.runs.worker import run_table

    where = {"node": ray.get_runtime_context().get_node_id(), "pid": os.getpid()}
    if setup is not None:
        setup(order)
    messages: list[dict[str, Any]] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # transformers' deprecation notices
        try:
            from transformers.utils import logging as transformers_logging

            transformers_logging.set_verbosity_error()
            run_table(order, messages.append, lambda: False)
        except AutotuneError as exc:
            return {"error": str(exc), **where}
        except Exception as exc:
            return {"error": f"{type(exc).__name__}: {exc}", **where}
    header = next((m["header"] for m in messages if m["op"] == "header"), None)
    return {"header": header, "cells": [m["cell"] for m in messages if m["op"] == "cell"], **where}


# max_retries=0: a worker or node that died is RayRunner's to retry (once, with the reason kept).
measure_cell = ray.remote(num_gpus=1, max_retries=0)(run_cell)
estimate_cell = ray.remote(num_cpus=1, max_retries=0)(run_cell)
