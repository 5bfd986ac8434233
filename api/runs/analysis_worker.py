"""The worker of heavy reads: ``python -m api.runs.analysis_worker`` (analysis.AnalysisPool starts it).

It answers ``check`` and ``explain`` orders on the estimator, one at a time, for as long as its
stdin stays open, so the server process never runs the estimator itself. Its nice value is
raised: under a burst of heavy reads the server (health, pages, the queue) keeps the CPU first.

Protocol: JSON objects, one per line, UTF-8.

    server -> worker (stdin)                    worker -> server (stdout)
    {"kind": "check" | "explain",               {"result": {...}}   the answer, as the route returns it
     "spec": TableSpec.to_json(),               or {"error_type", "error", "field", "expected"}
     "params": {"seq_len", "mode", ...}}

``expected`` is true for a refusal of the input (InvalidInput: an unknown model, a step that
cannot be modelled), which the server may cache; anything else is not. stdin closing ends it.
"""

from __future__ import annotations

import collections
import json
import os
import sys
import traceback
import warnings
from collections.abc import Callable
from typing import Any

from autotune.errors import AutotuneError, InvalidInput
from autotune.processes import protocol_stream

NICE_INCREMENT = 10  # below the server and the run workers (os.nice: 0 is normal, 19 the lowest)
# The estimators of the last specs (model, step, GPU) a worker answered for, kept with their fake
# model and the traces of each (mode, length) they probed (estimate/backend.py): the next check or
# explain of that spec, at any batch, replays those traces instead of running the model again
# (BERT-base on a T4: about 8 s the first time, a fraction of a second after). Each holds a fake
# model (no weights) and its traces: a few MB.
SPECS_KEPT = 8


def _workload(spec: Any) -> Any:
    """The spec's workload, its adapter built by PEFT first: modules the model lacks are refused
    naming the field (lora_targets, else peft), as normalize names the fields it checks."""
    from autotune.tuner import adapter_json

    workload = spec.workload()
    try:
        adapter_json(workload)  # cached: the check or explain's own call finds it
    except InvalidInput as exc:
        if exc.field is None:
            exc.field = "lora_targets" if workload.adapter.targets is not None else "peft"
        raise
    return workload


_prepared: collections.OrderedDict[str, tuple[Any, Any, Any, Any]] = collections.OrderedDict()
# (spec, mode, seq_len, search cap) -> the cell's max batch, found by an earlier check of a kept
# spec: a check of another batch of the same cell then costs one probe, not a search.
_max_batch: collections.OrderedDict[tuple[str, str, int, int], int] = collections.OrderedDict()
CELLS_KEPT = 1024


def _prepare(spec_json: dict[str, Any]) -> tuple[Any, Any, Any, Any]:
    """(spec, workload, target GPU, estimator) of a spec, the estimator kept (SPECS_KEPT)."""
    from api.runs.spec import TableSpec
    from autotune.backends.estimate.alloc_conf import parse_alloc_conf
    from autotune.backends.estimate.backend import EstimateBackend

    key = json.dumps(spec_json, sort_keys=True)
    if key in _prepared:
        _prepared.move_to_end(key)
        return _prepared[key]
    spec = TableSpec.from_json(spec_json)
    gpu = spec.target_gpu()
    prepared = (spec, _workload(spec), gpu, EstimateBackend(gpu, parse_alloc_conf(spec.alloc_conf)))
    _prepared[key] = prepared
    while len(_prepared) > SPECS_KEPT:
        _prepared.popitem(last=False)
    return prepared


def check_order(spec_json: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    """``autotune.analysis.check.check_step`` on the estimator for a normalised request, as JSON."""
    from autotune.analysis.check import check_step
    from autotune.workload.modes import parse_mode

    spec, workload, gpu, backend = _prepare(spec_json)
    spec_key = json.dumps(spec_json, sort_keys=True)

    def known_max(cap: int, search: Callable[[], int]) -> int:
        key = (spec_key, params["mode"], params["seq_len"], cap)
        if key in _max_batch:
            _max_batch.move_to_end(key)
        else:
            _max_batch[key] = search()
            while len(_max_batch) > CELLS_KEPT:
                _max_batch.popitem(last=False)
        return _max_batch[key]

    result = check_step(workload, backend, gpu, seq_len=params["seq_len"],
                        batch_size=params["batch_size"], mode=parse_mode(params["mode"]),
                        margin=spec.margin, effective_batch=params["effective_batch"], known_max=known_max)
    return {**result.to_dict(), "table_id": None, "measured_on": None, "imported_from": None}


def explain_order(spec_json: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    """``autotune.analysis.explain`` on the estimator for a normalised request, as JSON."""
    from autotune.analysis.explain import explain
    from autotune.tuner import adapter_json
    from autotune.workload.modes import parse_mode

    spec, workload, gpu, backend = _prepare(spec_json)
    result = explain(workload, backend, gpu, seq_len=params["seq_len"],
                     mode=parse_mode(params["mode"]), margin=spec.margin,
                     batch_size=params.get("batch_size"), with_levers=params.get("levers", True),
                     max_batch=spec.max_batch,
                     # The service's GPUs belong to the runner's lanes (one run per GPU): the
                     # 8-bit levers stay emulated here; the CLI measures them.
                     measure_8bit=False)
    data = result.to_dict()
    # LoRA / QLoRA as the check says it (tuner.adapter_json), unless explain says it itself.
    data.setdefault("adapter", adapter_json(workload))
    return data


ORDERS = {"check": check_order, "explain": explain_order}


def answer(order: dict[str, Any]) -> dict[str, Any]:
    """The reply to one order."""
    try:
        return {"result": ORDERS[order["kind"]](order["spec"], order["params"])}
    except AutotuneError as exc:
        return {"error_type": type(exc).__name__, "error": str(exc), "field": exc.field,
                "expected": isinstance(exc, InvalidInput)}
    except Exception as exc:
        traceback.print_exc()
        return {"error_type": type(exc).__name__, "error": f"{type(exc).__name__}: {exc}", "field": None,
                "expected": False}


def main() -> int:
    replies = protocol_stream()
    try:
        os.nice(NICE_INCREMENT)
    except OSError:  # not allowed here: run at the server's priority
        pass
    warnings.simplefilter("ignore", FutureWarning)  # transformers' deprecation notices
    from transformers.utils import logging as transformers_logging

    transformers_logging.set_verbosity_error()
    for line in sys.stdin:
        if not line.strip():
            continue
        reply = answer(json.loads(line))
        replies.write(json.dumps(reply) + "\n")
        replies.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
