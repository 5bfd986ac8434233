"""How close the estimator comes to measured truth: measured GPU tables against the estimate backend.

    python benchmarks/accuracy.py                      # every table, writes docs/accuracy.md
    python benchmarks/accuracy.py --only 'bert-*'      # some tables (file names without .json, globs)
    python benchmarks/accuracy.py --measured DIR [--measured DIR ...] --out PATH --cache PATH [--refresh]

Inputs (benchmarks/gpu_measure.py makes them on a CUDA machine), one folder per card
(``--measured``, default docs/measurements/h100-80gb/ and docs/measurements/h200/):

- measured tables: each ``NAME.json`` is the ``TableResult.to_dict()`` of a ``cuda`` table
  (autotune/tuner.py); raw ``NAME.cells.jsonl`` files are not read: assemble them into a table first;
- allocator records, in its ``records/``: ``*.json``, one real training step under
  ``torch.cuda.memory._record_memory_history`` with the real peaks.

For each table the estimator answers for the same workload (model, task, weights dtype, optimizer,
attention, loss, adapter) on the same budget, its target card the measured one (Hopper, sm90: cuBLAS
workspaces depend on the architecture): the max batch of each cell (``tune_table``, one mode at a
time over the lengths measured in that mode; modes never share hints, so for a complete table this
is the table's own search), and the peaks of one estimated step at the measured max batch; and the
max batch for the budget given by its size alone (``--gpu-memory``: gpus.size_only_chip), whose
distance to the chip's answer the report gives per cell. The records' allocator events are replayed
through ``CachingAllocatorSim``.

The estimator's answers are cached per table (``--cache``, default next to the output), keyed by the
table's file name, a hash of its content and a fingerprint of the estimator (autotune's sources,
torch and transformers versions): re-running after editing the report code takes seconds.
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import json
import re
import shlex
import statistics
import sys
import time
import warnings
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autotune.backends.estimate.allocator import CachingAllocatorSim  # noqa: E402  (no torch)

DEFAULT_MEASURED = [ROOT / "docs" / "measurements" / "h100-80gb", ROOT / "docs" / "measurements" / "h200"]
DEFAULT_OUT = ROOT / "docs" / "accuracy.md"
# 2: the target carries the measured chip's multiprocessors; 3, 4: refusals; 5: the size-only answers
CACHE_VERSION = 5

# The cards measured (the device name a table's environment records, in it: the preset of the card
# and its compute capability); the estimator targets the same architecture and chip: the measured
# steps' reductions split over the card's multiprocessors whatever the budget (estimate/reduce.py).
MEASURED_CARDS = {"H100": ("H100-80GB", (9, 0)), "H200": ("H200", (9, 0))}

# The issues' goals ("Measured truth, second card": 95 % of cells, never above).
RESERVED_MEDIAN_GOAL_PCT = 3.0  # median |error| of the estimated peak reserved
RESERVED_WORST_GOAL_PCT = 6.0  # worst |error|
MAX_BATCH_SHARE_GOAL = 0.95  # share of cells whose estimated max is the measured one or one below
MAX_BATCH_ABOVE_GOAL = 0.02  # the first card's goal: never above the measured by more than this fraction

SIZE_ONLY_GOAL_PCT = 2.0  # the size-only answer this close below the chip's, never above

GIB = 1024**3
MIB = 1024**2


# -- the estimator's side ----------------------------------------------------------------------------


# autotune's sources the estimator never runs: an edit there keeps the cached answers.
NOT_ESTIMATOR = ("autotune/backends/cuda/", "autotune/cli/", "autotune/analysis/", "autotune/__main__.py")


def estimator_fingerprint() -> str:
    """A hash of what the estimator's answers depend on: autotune's sources (but NOT_ESTIMATOR), how
    a table's workload is built from it here (table_workload), the torch and transformers versions."""
    import inspect

    import torch
    import transformers

    digest = hashlib.sha256(f"{torch.__version__} {transformers.__version__}".encode())
    digest.update(inspect.getsource(table_workload).encode())
    for path in sorted((ROOT / "autotune").rglob("*.py")):
        name = path.relative_to(ROOT).as_posix()
        if not name.startswith(NOT_ESTIMATOR):
            digest.update(name.encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def target_gpu(table: dict[str, Any]) -> Any:
    """The measured card as the estimator's target: its size and context overhead as the table says,
    the measured architecture; SystemExit if the budget does not come out as the table's."""
    from autotune.gpus import GPU_PRESETS, GpuSpec, multiprocessors
    from autotune.tuner import budget_bytes

    device = str(table["environment"].get("device_name") or "")
    card = next((found for name, found in MEASURED_CARDS.items() if name in device), None)
    if card is None:
        raise SystemExit(f"{table['model']}: measured on {device!r}, not one of {', '.join(MEASURED_CARDS)}: "
                         "add the card to MEASURED_CARDS")
    preset, compute_capability = card
    found = table["environment"].get("device_multiprocessors")  # recorded by cuda runs since 2026-11-25
    chip = tuple(found) if found else multiprocessors(GPU_PRESETS[preset])
    spec = GpuSpec(table["gpu_name"], table["gpu_memory_bytes"], table["context_overhead_bytes"],
                   compute_capability, chip)
    budget = budget_bytes(spec, table["margin"], table_parallel(table))  # a multi-GPU job's NCCL buffers off
    if budget != table["budget_bytes"]:
        raise SystemExit(f"{table['model']} on {table['gpu_name']}: the budget comes out as {budget} bytes, "
                         f"the table says {table['budget_bytes']}")
    return spec


def table_allocator(table: dict[str, Any]) -> Any:
    """The caching-allocator settings the table was measured under (its PYTORCH_CUDA_ALLOC_CONF)."""
    from autotune.backends.estimate.alloc_conf import parse_alloc_conf

    return parse_alloc_conf(table["environment"].get("alloc_conf"))


def table_parallel(table: dict[str, Any]) -> Any:
    """The Parallel of a multi-GPU table's ``parallel`` (Parallel.to_json's fields; a rank of that job
    measured on one GPU under a fake process group), None for a one-GPU table."""
    from autotune.workload.parallel import Parallel

    data = table.get("parallel")
    if data is None:
        return None
    return Parallel(data["kind"], data["gpus"], nodes=data["nodes"],
                    reshard_after_forward=data["reshard_after_forward"], recipe=data["recipe"])


def table_adapter(data: dict[str, Any] | None) -> Any:
    """The Adapter of a table's ``adapter`` (adapters.AdapterSummary.to_json: Adapter.to_json's fields,
    ``targets`` resolved by PEFT, ``targets_default`` when none were asked for), None without one."""
    from autotune.workload.adapters import Adapter

    if data is None:
        return None
    return Adapter.from_json({**data, "targets": None} if data.get("targets_default") else data)


def table_workload(table: dict[str, Any], backend: Any) -> Any:
    """The table's workload, built as autotune.public builds it. The attention the measured run used
    was transformers' choice unless one was asked for: None when the estimator picks the same."""
    from autotune.request import ModelAccess, Step, TableRequest, resolve

    adapter = table_adapter(table.get("adapter"))

    def build(attn: str | None) -> Any:
        parallel, trainer = table.get("parallel"), table.get("trainer")
        fsdp = parallel if parallel and parallel["kind"] == "fsdp" else None
        grpo = (trainer or {}).get("grpo") or {}  # the generation the GPU ran (num_generations, ...)
        generation = {name: grpo[name] for name in ("num_generations", "max_completion_length", "beta",
                                                    "steps_per_generation", "vllm_mode") if grpo.get(name)}
        step = Step(table["model"], table["task"], table["weights_dtype"], table["optimizer"], attn,
                    table["loss"], ckpt_reentrant=table.get("ckpt_reentrant") or None,
                    gpus=parallel and parallel["gpus"], parallel=parallel and parallel["kind"],
                    nodes=fsdp and fsdp["nodes"],
                    reshard_after_forward=fsdp and fsdp["reshard_after_forward"],
                    fsdp_recipe=fsdp and fsdp["recipe"], trainer=trainer and trainer["name"],
                    precompute_ref_log_probs=trainer and trainer["precompute_ref_log_probs"],
                    adapter=adapter, **generation)
        request = TableRequest(step, seq_lens=table["seq_lens"])
        return resolve(request, make_target=False, access=ModelAccess(allow_hub=False)).workload

    workload = build(None)
    if backend.attn_used(workload) != table["attn"]:
        workload = build(table["attn"])
    return workload


def replay_capped(events: Sequence[tuple[int, ...]], capacity_bytes: int
                  ) -> tuple[int | None, dict[str, int] | None]:
    """Peak reserved of the estimator's trace replayed with the budget as the allocator's limit (as the
    GPU ran, under set_per_process_memory_fraction); where it runs out of memory, None and the
    request it refused with the allocator's state then (_pool_state, after the release)."""
    from autotune.backends.estimate.replay import apply_events
    from autotune.errors import OutOfMemory

    sim = CachingAllocatorSim(capacity_bytes)
    try:
        apply_events(sim, {}, events)
    except OutOfMemory as exc:
        return None, _refusal(sim, exc)
    return sim.stats.peak_reserved_bytes, None


def _probe_and_trace(backend: Any, workload: Any, mode: Any, seq_len: int, budget: int,
                     batch: int) -> tuple[Any, Any]:
    """One estimator probe at ``batch`` and its step's trace (traced, or extrapolated as the probe did)."""
    from autotune.backends.estimate.backend import extrapolate_traces

    with backend.cell(workload, mode, seq_len, budget) as cell:
        probe = cell.fits(batch)
        traces = getattr(cell, "traces", [])
        trace = traces[-1] if traces and traces[-1].batch_size == batch else None
        if trace is None:  # the probe extrapolated it (exact, as the probe's own replay)
            found = extrapolate_traces(traces, batch, getattr(cell, "reference", None))
            trace = None if found is None else found[0]
    return probe, trace


def estimate_at(backend: Any, workload: Any, mode: Any, seq_len: int, budget: int,
                batch: int) -> dict[str, Any]:
    """One estimated step at ``batch``: the probe's outcome and peaks (backends/estimate/backend.py:
    peak_reserved_bytes is the reserved at the smallest capacity the step runs in when it fits), and
    its trace replayed with the budget as the limit."""
    probe, trace = _probe_and_trace(backend, workload, mode, seq_len, budget, batch)
    capped, refused = replay_capped(trace.events(), budget) if trace is not None else (None, None)
    return {
        "batch_size": batch, "outcome": probe.outcome,
        "peak_reserved_bytes": probe.details.get("peak_reserved_bytes"),
        "peak_allocated_bytes": probe.details.get("peak_allocated_bytes"),
        "demand_bytes": probe.details.get("demand_bytes"),
        "reserved_at_budget_bytes": capped,
        "refused_at_budget": refused,
    }


# How the GPU's out-of-memory message writes sizes: torch's format_size (c10/core/
# CachingDeviceAllocator.h), two decimals of bytes, KiB, MiB or GiB, each unit up to 1024 of it.
_SIZE_UNITS = {"bytes": 1, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3}
_OOM_MESSAGE = re.compile(
    r"Tried to allocate (?P<tried>[\d.]+ (?:bytes|KiB|MiB|GiB))\..*?"
    r"(?P<allocated>[\d.]+ (?:bytes|KiB|MiB|GiB)) is allocated by PyTorch, and "
    r"(?P<cached>[\d.]+ (?:bytes|KiB|MiB|GiB)) is reserved by PyTorch but unallocated", re.S)


def parse_size(text: str) -> tuple[int, int]:
    """``"6.12 GiB"`` as bytes, and the half-width of the figure's rounding (two decimals)."""
    value, unit = text.split()
    scale = _SIZE_UNITS[unit]
    return round(float(value) * scale), (scale // 200 if scale > 1 else 0)


def measured_refusal(cell: dict[str, Any]) -> dict[str, Any] | None:
    """What the GPU's allocator said when it refused the step one above the measured max: the segment
    it tried to allocate, the memory allocated and the memory cached but unallocated at that moment
    (after it released every cached segment with no block in use: CUDACachingAllocator.cpp, malloc).
    None without such a probe or message."""
    best = cell.get("max_batch_size")
    if best is None:
        return None
    probe = next((p for p in cell.get("probe_log") or []
                  if p["batch_size"] == best + 1 and p["outcome"] == "oom" and p.get("oom_message")), None)
    found = _OOM_MESSAGE.search(probe["oom_message"]) if probe else None
    if probe is None or found is None:
        return None
    (tried, tried_tol), (allocated, _), (cached, _) = (parse_size(found[k]) for k in ("tried", "allocated",
                                                                                      "cached"))
    return {"batch_size": best + 1, "tried_bytes": tried, "tried_tolerance": tried_tol,
            "allocated_bytes": allocated, "cached_free_bytes": cached}


def _pool_state(sim: CachingAllocatorSim, size: int) -> dict[str, int]:
    """What the allocator holds at a request of ``size`` (rounded) bytes: allocated, reserved, the
    reserved that release_cached_blocks would keep (segments with a block in use), the largest free
    block of the request's pool."""
    from autotune.backends.estimate.allocator import SMALL_SIZE

    segments = sim.snapshot()
    small = size <= SMALL_SIZE
    free = [b.size for s in segments if s.is_small == small for b in s.blocks if not b.allocated]
    return {"allocated_bytes": sim.stats.allocated_bytes, "reserved_bytes": sim.stats.reserved_bytes,
            "kept_bytes": sum(s.size for s in segments if any(b.allocated for b in s.blocks)),
            "largest_free_bytes": max(free, default=0)}


def _refusal(sim: CachingAllocatorSim, exc: Any) -> dict[str, int]:
    """The request the simulator refused (an OutOfMemory) and its state then: after the release, as
    the GPU's message gives it."""
    from autotune.backends.estimate.allocator import round_size

    return {"request_bytes": exc.requested_bytes, "segment_bytes": exc.segment_bytes,
            **_pool_state(sim, round_size(exc.requested_bytes))}


def estimate_refusal(backend: Any, workload: Any, mode: Any, seq_len: int, budget: int,
                     refused: dict[str, Any]) -> dict[str, Any]:
    """The estimator's step at the batch the GPU refused, replayed under the budget. Where the
    simulator refuses it too: the request it refused and its state then (as the GPU's message gives
    it, after the release). Where it fits: its state at the allocation the GPU refused: of the
    requests whose segment would be the size the message names, the one with the memory allocated
    before it nearest the GPU's."""
    from autotune.backends.estimate.allocator import round_size, segment_size
    from autotune.errors import OutOfMemory

    probe, trace = _probe_and_trace(backend, workload, mode, seq_len, budget, refused["batch_size"])
    found: dict[str, Any] = {"batch_size": refused["batch_size"], "outcome": probe.outcome}
    if trace is None:
        return found
    sim, handles = CachingAllocatorSim(budget), dict[int, int]()
    nearest: tuple[int, dict[str, Any]] | None = None
    try:
        for key, nbytes, *stream in trace.events():  # an allocation on another stream: with it
            if nbytes < 0:
                sim.free(handles.pop(key))
                continue
            size = round_size(nbytes)
            if abs(segment_size(size) - refused["tried_bytes"]) <= refused["tried_tolerance"] + 1:
                distance = abs(sim.stats.allocated_bytes - refused["allocated_bytes"])
                if nearest is None or distance < nearest[0]:
                    nearest = (distance, {"request_bytes": nbytes, **_pool_state(sim, size)})
            handles[key] = sim.malloc(nbytes, *stream)
    except OutOfMemory as exc:
        found["replay"], found["refused"] = "oom", _refusal(sim, exc)
        return found
    found["replay"] = "fits"
    found["nearest"] = None if nearest is None else nearest[1]
    return found


def tuned_modes(table: dict[str, Any], workload: Any, backend: Any, spec: Any) -> Iterator[Any]:
    """(mode, its measured cells by length, the estimator's table of them) for each measured mode:
    ``tune_table`` one mode at a time over the lengths measured in it, as the table was searched."""
    from autotune.tuner import tune_table
    from autotune.workload.modes import parse_modes

    for mode in parse_modes(",".join(table["modes"])):
        measured = {c["seq_len"]: c for c in table["cells"] if c["mode"] == mode.name}
        if measured:
            yield mode, measured, tune_table(workload, backend, spec, seq_lens=sorted(measured), modes=[mode],
                                             margin=table["margin"], method=table["search"],
                                             max_batch=table["max_batch"])


def estimate_table(table: dict[str, Any]) -> dict[str, Any]:
    """The estimator's answers for every measured cell of ``table`` (what the cache keeps)."""
    from autotune.backends.estimate.backend import EstimateBackend

    started = time.perf_counter()
    spec = target_gpu(table)
    backend = EstimateBackend(spec, table_allocator(table))
    workload = table_workload(table, backend)
    budget = table["budget_bytes"]
    cells = []
    for mode, measured, result in tuned_modes(table, workload, backend, spec):
        for cell in result.cells:
            batch = measured[cell.seq_len]["max_batch_size"]
            at = estimate_at(backend, workload, mode, cell.seq_len, budget, batch) if batch else None
            refused = measured_refusal(measured[cell.seq_len])
            at_refused = (estimate_refusal(backend, workload, mode, cell.seq_len, budget, refused)
                          if refused else None)
            cells.append({
                "mode": cell.mode, "seq_len": cell.seq_len, "max_batch_size": cell.max_batch_size,
                "peak_memory_bytes": cell.peak_memory_bytes,
                "peak_allocated_bytes": cell.peak_allocated_bytes,
                "probes": cell.probes, "capped": cell.capped, "error": cell.error, "at_measured": at,
                "at_refused": at_refused,
            })
    return {"attn": backend.attn_used(workload), "workload_attn": workload.attn,
            "environment": backend.describe(), "size_only": size_only_answers(table, workload),
            "elapsed_s": round(time.perf_counter() - started, 1), "cells": cells}


def size_only_answers(table: dict[str, Any], workload: Any) -> dict[str, int | None] | None:
    """The max batch of each measured cell for a card given by the table's size alone, as
    ``--gpu-memory`` asks (gpus.size_only_chip), keyed "mode:seq_len"; None for a whole card."""
    from autotune.backends.estimate.backend import EstimateBackend
    from autotune.gpus import custom_gpu

    if not table["gpu_name"].startswith("custom"):
        return None
    spec = custom_gpu(table["gpu_memory_bytes"])
    backend = EstimateBackend(spec, table_allocator(table))
    return {f"{c.mode}:{c.seq_len}": c.max_batch_size
            for _, _, result in tuned_modes(table, workload, backend, spec) for c in result.cells}


def load_cache(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {"version": CACHE_VERSION, "tables": {}}
    data = json.loads(path.read_text())
    return data if data.get("version") == CACHE_VERSION else {"version": CACHE_VERSION, "tables": {}}


def cached_estimates(card: str, paths: Sequence[Path], cache_path: Path,
                     refresh: bool) -> dict[str, dict[str, Any]]:
    """The estimator's answers per table file name of a card: from the cache where the table and the
    estimator are unchanged, else computed (and the cache written after each table)."""
    cache = load_cache(cache_path)
    fingerprint = estimator_fingerprint()
    found = {}
    for path in paths:
        content = path.read_bytes()
        key = {"sha256": hashlib.sha256(content).hexdigest(), "estimator": fingerprint}
        entry = cache["tables"].get(f"{card}/{path.name}")
        if not refresh and entry is not None and entry["key"] == key:
            found[path.name] = entry["result"]
            continue
        log(f"{path.name}: estimating")
        result = estimate_table(json.loads(content))
        log(f"{path.name}: {len(result['cells'])} cells in {result['elapsed_s']} s")
        cache["tables"][f"{card}/{path.name}"] = {"key": key, "result": result}
        cache_path.parent.mkdir(parents=True, exist_ok=True)
        cache_path.write_text(json.dumps(cache, indent=1) + "\n")
        found[path.name] = result
    return found


# -- comparing -----------------------------------------------------------------------------------------


@dataclass
class Comparison:
    """One cell: measured against estimated."""

    table: str
    mode: str
    seq_len: int
    measured_max: int | None
    estimated_max: int | None
    measured_reserved: int | None  # at the measured max batch
    measured_allocated: int | None
    estimated_reserved: int | None  # the estimator's step at the measured max batch
    estimated_allocated: int | None
    estimated_outcome: str | None  # does the estimator say the measured max fits
    reserved_at_budget: int | None  # the estimated trace replayed with the budget as the limit
    notes: list[str]
    size_only_max: int | None = None  # the max batch for the budget's size alone (--gpu-memory)

    @property
    def size_only_pct(self) -> float | None:
        """The size-only answer's distance to the measured max, % of it."""
        return error_pct(self.size_only_max, self.measured_max)

    @property
    def max_diff(self) -> int | None:
        if self.measured_max is None or self.estimated_max is None:
            return None
        return self.estimated_max - self.measured_max

    @property
    def max_diff_pct(self) -> float | None:
        diff = self.max_diff
        return None if diff is None or not self.measured_max else 100 * diff / self.measured_max

    @property
    def reserved_err(self) -> float | None:
        return error_pct(self.estimated_reserved, self.measured_reserved)

    @property
    def allocated_err(self) -> float | None:
        return error_pct(self.estimated_allocated, self.measured_allocated)

    @property
    def reserved_at_budget_err(self) -> float | None:
        return error_pct(self.reserved_at_budget, self.measured_reserved)

    @property
    def max_goal(self) -> bool:
        """The estimated max is the measured one or one below it."""
        diff = self.max_diff
        return diff is not None and diff in (0, -1)

    @property
    def above_goal(self) -> bool:
        """The estimated max is not above the measured by more than MAX_BATCH_ABOVE_GOAL of it."""
        diff = self.max_diff
        return diff is not None and self.measured_max is not None \
            and diff <= MAX_BATCH_ABOVE_GOAL * self.measured_max


def error_pct(estimated: int | None, measured: int | None) -> float | None:
    if estimated is None or not measured:
        return None
    return 100 * (estimated - measured) / measured


def measured_notes(cell: dict[str, Any]) -> list[str]:
    """What is odd about a measured cell: an error, a max not bracketed by an out-of-memory probe
    one above it, an out-of-memory probe below the max, probes that failed."""
    notes = []
    best = cell["max_batch_size"]
    log_ = cell.get("probe_log") or []
    if cell.get("error"):
        notes.append(f"measured cell failed: {cell['error'].splitlines()[0][:80]}")
    if best is not None and not cell.get("capped"):
        if not any(p["batch_size"] == best + 1 and p["outcome"] == "oom" for p in log_):
            notes.append(f"no out-of-memory probe at {best + 1}")
        below = sorted(p["batch_size"] for p in log_ if p["outcome"] == "oom" and p["batch_size"] <= best)
        if below:
            notes.append(f"out of memory at {', '.join(map(str, below))}, below the max")
    errors = [p["batch_size"] for p in log_ if p["outcome"] == "error"]
    if errors:
        notes.append(f"probe errors at {', '.join(map(str, errors))}")
    if cell.get("capped"):
        notes.append("capped")
    return notes


def compare_table(name: str, table: dict[str, Any], estimate: dict[str, Any]) -> list[Comparison]:
    estimated = {(c["mode"], c["seq_len"]): c for c in estimate["cells"]}
    size_only = estimate.get("size_only") or {}
    rows = []
    for cell in table["cells"]:
        est = estimated.get((cell["mode"], cell["seq_len"]))
        best = cell["max_batch_size"]
        fitting: dict[str, Any] = next((p for p in cell.get("probe_log") or []
                        if p["batch_size"] == best and p["outcome"] == "fits"), {})
        at = (est or {}).get("at_measured") or {}
        notes = measured_notes(cell)
        if est is not None and est.get("error"):
            notes.append(f"estimate failed: {est['error'].splitlines()[0][:80]}")
        if at.get("outcome") == "oom":
            refused = at.get("refused_at_budget")
            notes.append("the estimator says the measured max runs out of memory" + (
                "" if not refused else
                f" (under the budget it refuses {gib(refused['request_bytes'])} GiB with "
                f"{gib(refused['allocated_bytes'])} GiB allocated, "
                f"{gib(refused['kept_bytes'] - refused['allocated_bytes'])} GiB free in segments with a "
                f"block in use, the largest free block {gib(refused['largest_free_bytes'])} GiB)"))
        rows.append(Comparison(
            table=name, mode=cell["mode"], seq_len=cell["seq_len"], measured_max=best,
            estimated_max=est["max_batch_size"] if est else None,
            measured_reserved=fitting.get("peak_reserved_bytes", cell.get("peak_memory_bytes")),
            measured_allocated=fitting.get("peak_allocated_bytes", cell.get("peak_allocated_bytes")),
            estimated_reserved=at.get("peak_reserved_bytes"),
            estimated_allocated=at.get("peak_allocated_bytes"),
            estimated_outcome=at.get("outcome"), reserved_at_budget=at.get("reserved_at_budget_bytes"),
            notes=notes, size_only_max=size_only.get(f"{cell['mode']}:{cell['seq_len']}"),
        ))
    return rows


@dataclass
class RecordReplay:
    """One recorded step: the real allocator's figures and the simulator's over the same events."""

    name: str
    model: str
    mode: str
    seq_len: int
    batch: int
    events: int
    real_reserved: int
    sim_reserved: int
    real_allocated: int
    sim_allocated: int
    real_segments: int  # at the end: segment_alloc minus segment_free events
    sim_segments: int
    # The replay with each segment at its real address (RealAddressSim): peaks, misplaced blocks.
    addressed_reserved: int
    addressed_allocated: int
    misplaced: int  # allocations the simulator put elsewhere than the real allocator did
    allocations: int
    context_bytes: int  # device memory in use with the CUDA context alone
    outside_after_load: int | None  # device memory in use outside the allocator
    outside_after_step: int
    unmatched_frees: int  # frees of addresses allocated before the record began
    streams: int
    budget: int | None = None  # the allocator's cap during the record (None: the whole card)
    real_outcome: str = "fits"  # "oom" where the recorded step ran out of memory
    sim_outcome: str = "fits"


class RealAddressSim(CachingAllocatorSim):
    """The simulator with each new segment at the address cudaMalloc gave the real allocator (set
    ``next_segment_address`` from a segment_alloc event before the malloc that needs it). The
    simulator's own addresses only decide ties between equal-sized free blocks (allocator.py): with
    the real ones, a faithful simulator puts every block where the real one did."""

    def __init__(self, capacity_bytes: int | None = None) -> None:
        super().__init__(capacity_bytes)
        self.next_segment_address: int | None = None

    def _segment_address(self, alloc_size: int) -> int:
        real, self.next_segment_address = self.next_segment_address, None
        # The simulator's own for a segment the real allocator did not make (far above the real ones).
        return real if real is not None else super()._segment_address(alloc_size)


def replay_events(events: Sequence[Sequence[Any]], sim: CachingAllocatorSim) -> tuple[int, int, int, bool]:
    """Replay a record's allocator events through ``sim``: alloc is a malloc, free_completed its free,
    a run of segment_free events an empty_cache followed by a reset of the peaks (the worker's
    release()); a segment_alloc gives a RealAddressSim its address; an oom (a step recorded up to
    the allocation the GPU refused) that allocation. The replay stops where the simulator runs out
    of memory. Returns the allocations placed elsewhere than the real allocator placed them, the
    allocations, the frees of unknown blocks (so far) and whether the simulator ran out."""
    from autotune.errors import OutOfMemory

    handles: dict[int, int] = {}
    misplaced = allocations = unmatched = 0
    previous = None
    try:
        for index, (action, address, size, _stream) in enumerate(events):
            if action == "alloc":
                handles[address] = sim.malloc(size)
                allocations += 1
                misplaced += handles[address] != address
            elif action == "free_completed":
                handle = handles.pop(address, None)
                if handle is None:
                    unmatched += 1
                else:
                    sim.free(handle)
            elif action == "oom":  # the allocation the GPU refused (its size): the simulator tries it too
                sim.malloc(size)
            elif action == "segment_alloc" and isinstance(sim, RealAddressSim):
                sim.next_segment_address = address
            elif action == "segment_free" and previous != "segment_free":
                sim.empty_cache()
                sim.reset_peak()
            elif action == "segment_unmap" and previous != "segment_unmap" and next(
                    (e[0] for e in events[index:] if e[0] != "segment_unmap"), None) != "segment_map":
                sim.empty_cache()  # expandable segments: a release unmaps, an out-of-memory retry maps after
                sim.reset_peak()
            previous = action
    except OutOfMemory:  # so it did, or not, on the GPU (the record's outcome)
        return misplaced, allocations, unmatched, True
    return misplaced, allocations, unmatched, False


def replay_record(record: dict[str, Any]) -> RecordReplay:
    """The record's events replayed as the estimator's simulator runs (its own addresses) and with
    the real segment addresses, each up to where it runs out of memory, if it does; the memory
    outside the allocator."""
    from autotune.backends.estimate.alloc_conf import alloc_conf_text, parse_alloc_conf

    events = record["events"]
    budget = record.get("budget_bytes")  # a step recorded under a table's budget: replayed under it
    config = parse_alloc_conf(alloc_conf_text(record.get("env") or {}))
    sim = CachingAllocatorSim(budget, config)
    # real addresses place classic segments; an expandable one's pages lie where the simulator maps them
    addressed = (CachingAllocatorSim(budget, config) if config.expandable_segments
                 else RealAddressSim(budget))
    ran_out = replay_events(events, sim)[3]
    misplaced, allocations, unmatched, _ = replay_events(events, addressed)
    sim_outcome = "oom" if ran_out else "fits"
    counts = Counter(event[0] for event in events)

    def outside(snapshot: dict[str, int] | None) -> int | None:
        return None if snapshot is None else snapshot["device_used_bytes"] - snapshot["reserved_bytes"]

    after_step = outside(record["after_step"])
    assert after_step is not None
    return RecordReplay(
        name=record["name"] + ("" if not config.expandable_segments else f" ({config.name})"),
        model=record["model"], mode=record["mode"], seq_len=record["seq_len"],
        batch=record["batch"], events=len(events),
        real_reserved=record["peak_reserved_bytes"], sim_reserved=sim.stats.peak_reserved_bytes,
        real_allocated=record["peak_allocated_bytes"], sim_allocated=sim.stats.peak_allocated_bytes,
        real_segments=counts["segment_alloc"] - counts["segment_free"], sim_segments=sim.stats.num_segments,
        addressed_reserved=addressed.stats.peak_reserved_bytes,
        addressed_allocated=addressed.stats.peak_allocated_bytes,
        misplaced=misplaced, allocations=allocations,
        context_bytes=record["context"]["device_used_bytes"],
        outside_after_load=outside(record.get("after_load")), outside_after_step=after_step,
        unmatched_frees=unmatched, streams=len({event[3] for event in events}),
        budget=budget, real_outcome=record.get("outcome", "fits"), sim_outcome=sim_outcome,
    )


# -- the report ----------------------------------------------------------------------------------------


def gib(nbytes: int | None) -> str:
    return "—" if nbytes is None else f"{nbytes / GIB:.2f}"


def mib(nbytes: int | None) -> str:
    return "—" if nbytes is None else f"{nbytes / MIB:.0f}"


def pct(value: float | None) -> str:
    """A signed error in %."""
    return "—" if value is None else f"{value:+.2f}"


def abs_pct(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


def num(value: int | None) -> str:
    return "—" if value is None else str(value)


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[str]],
                   left: Iterable[int] = (0,)) -> list[str]:
    """A Markdown table, numbers right-aligned: the columns ``left`` are left-aligned."""
    keep_left = set(left)
    align = ["---" if i in keep_left else "---:" for i in range(len(header))]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(align) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def worst(values: Sequence[float]) -> float | None:
    """The value furthest from zero, with its sign."""
    return max(values, key=abs) if values else None


def median_abs(values: Sequence[float]) -> float | None:
    return statistics.median(abs(v) for v in values) if values else None


def distinct(environments: Iterable[dict[str, Any]], key: str) -> str:
    return ", ".join(sorted({str(environment.get(key)) for environment in environments}))


def adapter_label(table: dict[str, Any]) -> str | None:
    return (table.get("adapter") or {}).get("label")


def header_section(tables: dict[str, dict[str, Any]], estimates: dict[str, dict[str, Any]],
                   command: str) -> list[str]:
    measured = [t["environment"] for t in tables.values()]
    estimated = [e["environment"] for e in estimates.values()]
    lines = [
        "# Accuracy of the estimator against measured tables",
        "",
        f"Generated by `benchmarks/accuracy.py`; regenerate with `{command}` from the repository root (the "
        "estimator's answers are cached next to this file, per table and estimator version; `--refresh` "
        "recomputes them).",
        "",
        "Measured with the `cuda` backend (`benchmarks/gpu_measure.py`) on "
        f"{distinct(measured, 'device_name')}, driver {distinct(measured, 'driver')}, CUDA "
        f"{distinct(measured, 'cuda_version')}, torch {distinct(measured, 'torch_version')}, transformers "
        f"{distinct(measured, 'transformers_version')}. "
        "Each cell's budget caps PyTorch's caching allocator (`set_per_process_memory_fraction`): a smaller "
        "card simulated on the large one.",
        "",
        f"Estimated with the `estimate` backend on a CPU (torch {distinct(estimated, 'torch_version')}, "
        f"transformers {distinct(estimated, 'transformers_version')}) for the same workload and budget, the "
        "target card the measured one: its size and context overhead as the table says, its compute "
        "capability and multiprocessors (MEASURED_CARDS). Estimated peaks are those of one estimated step "
        "at the measured max batch: the peak reserved as the estimator reports it (the reserved memory at "
        "the smallest limit the step runs in), and *capped*, the same trace replayed with the budget as the "
        "allocator's limit, as the GPU ran it. Errors are (estimated - measured) / measured.",
        "",
    ]
    rows = []
    for name, table in tables.items():
        seeded = " (seeded)" if table.get("seeded_by") else ""
        rows.append([f"`{name}`", table["model"], table["task"], table["weights_dtype"], table["optimizer"],
                     table["attn"], table["loss"], adapter_label(table) or "full fine-tune",
                     table["gpu_name"],
                     gib(table["budget_bytes"]), mib(table["context_overhead_bytes"]),
                     f"{len(table['cells'])}{seeded}"])
    lines += markdown_table(["table", "model", "task", "weights", "optimizer", "attn", "loss", "adapter",
                             "card", "budget GiB", "context MiB", "cells"], rows, left=range(9))
    if any(t.get("seeded_by") for t in tables.values()):
        lines += ["", "Seeded: the measured search started at the estimator's answer; that changes which "
                  "batches were probed, not the answer, which the probes prove."]
    return lines + [""]


def goals_section(rows: Sequence[Comparison]) -> list[str]:
    reserved = [r.reserved_err for r in rows if r.reserved_err is not None]
    capped = [r.reserved_at_budget_err for r in rows if r.reserved_at_budget_err is not None]
    judged = [r for r in rows if r.measured_max is not None]
    share = sum(r.max_goal for r in judged) / len(judged) if judged else None
    above = [r for r in judged if not r.above_goal]
    med, bad = median_abs(reserved), worst(reserved)

    def verdict(ok: bool | None) -> str:
        return "—" if ok is None else ("**reached**" if ok else "**not reached**")

    listed = ", ".join(f"{r.table} {r.mode} {r.seq_len} ({r.estimated_max} vs {r.measured_max})"
                       for r in above)
    over = [r for r in judged if r.max_diff is not None and r.max_diff > 0]
    listed_over = ", ".join(f"{r.table} {r.mode} {r.seq_len} ({r.estimated_max} vs {r.measured_max})"
                            for r in over)
    body = [
        [f"estimated peak reserved within {RESERVED_MEDIAN_GOAL_PCT:g} % of measured (median of \\|error\\|)",
         "—" if med is None else f"{med:.2f} % over {len(reserved)} cells",
         verdict(None if med is None else med <= RESERVED_MEDIAN_GOAL_PCT)],
        [f"... and within {RESERVED_WORST_GOAL_PCT:g} % in the worst cell",
         "—" if bad is None else f"{bad:+.2f} %",
         verdict(None if bad is None else abs(bad) <= RESERVED_WORST_GOAL_PCT)],
        ["(for reference, not the goal: the estimated step replayed with the budget as the allocator's "
         "limit, as the GPU ran it, the quantity the GPU measured; *capped* below)",
         "—" if not capped else f"median {median_abs(capped):.2f} %, worst {worst(capped):+.2f} % over "
         f"{len(capped)} cells", "—"],
        [f"estimated max batch the measured one or one below it in at least {MAX_BATCH_SHARE_GOAL:.0%} of "
         "cells", "—" if share is None else f"{share:.0%} of {len(judged)} cells",
         verdict(None if share is None else share >= MAX_BATCH_SHARE_GOAL)],
        [f"estimated max batch never above the measured by more than {MAX_BATCH_ABOVE_GOAL:.0%} of it",
         f"{len(above)} cells above" + (f": {listed}" if above else ""),
         verdict(not above if judged else None)],
        ["estimated max batch never above the measured at all",
         f"{len(over)} cells above" + (f": {listed_over}" if over else ""),
         verdict(not over if judged else None)],
    ]
    return ["## Goals", "", *markdown_table(["goal", "result", "status"], body, left=range(3)), ""]


def modes_section(rows: Sequence[Comparison], modes: Sequence[str]) -> list[str]:
    def summary(label: str, group: Sequence[Comparison]) -> list[str]:
        reserved = [r.reserved_err for r in group if r.reserved_err is not None]
        capped = [r.reserved_at_budget_err for r in group if r.reserved_at_budget_err is not None]
        allocated = [r.allocated_err for r in group if r.allocated_err is not None]
        judged = [r for r in group if r.measured_max is not None]
        diffs = [r.max_diff for r in judged if r.max_diff is not None]
        return [label, str(len(group)),
                abs_pct(median_abs(reserved)), pct(worst(reserved)),
                abs_pct(median_abs(capped)), pct(worst(capped)),
                abs_pct(median_abs(allocated)), pct(worst(allocated)),
                f"{sum(r.max_goal for r in judged)}/{len(judged)}",
                str(sum(not r.above_goal for r in judged)),
                "—" if not diffs else f"{min(diffs):+d} .. {max(diffs):+d}"]

    header = ["mode", "cells", "reserved median \\|err\\| %", "reserved worst %",
              "capped median \\|err\\| %", "capped worst %", "allocated median \\|err\\| %",
              "allocated worst %", "max = or -1", "max > +2 %", "max diff range"]
    body = [summary(mode, [r for r in rows if r.mode == mode]) for mode in modes]
    body.append(summary("all", rows))
    return ["## Per mode, all tables", "",
            "Worst: the error furthest from zero, with its sign. `max = or -1`: cells whose estimated max is "
            "the measured one or one below it; `max > +2 %`: cells whose estimated max is above the measured "
            "by more than 2 % of it.", "", *markdown_table(header, body), ""]


def table_section(name: str, table: dict[str, Any], rows: Sequence[Comparison],
                  estimate: dict[str, Any]) -> list[str]:
    header = ["mode", "seq", "measured max", "estimated max", "diff", "diff %", "goal",
              "reserved meas. GiB", "reserved est. GiB", "err %", "capped err %",
              "allocated meas. GiB", "allocated est. GiB", "err %", "notes"]
    body = [[r.mode, str(r.seq_len), num(r.measured_max), num(r.estimated_max),
             "—" if r.max_diff is None else f"{r.max_diff:+d}", pct(r.max_diff_pct),
             "yes" if r.max_goal else ("above" if not r.above_goal else "no"),
             gib(r.measured_reserved), gib(r.estimated_reserved), pct(r.reserved_err),
             pct(r.reserved_at_budget_err), gib(r.measured_allocated), gib(r.estimated_allocated),
             pct(r.allocated_err), "; ".join(r.notes)] for r in rows]
    adapter = adapter_label(table)
    lines = [f"### {name}", "",
             f"{table['model']}, {table['task']}, {table['weights_dtype']} weights, {table['optimizer']}, "
             f"attn {table['attn']}, loss {table['loss']}" + (f", {adapter}" if adapter else "")
             + f"; budget {gib(table['budget_bytes'])} GiB of {table['gpu_name']}. "
             + (f"Measured in {table['elapsed_s']:.0f} s " if table.get("elapsed_s") else "Measured ")
             + f"with {table.get('probes_total', '?')} probes"
             + (f" ({len(table['cells_missing'])} cells not reached)" if table.get("cells_missing") else "")
             + ", "
             f"estimated in {estimate['elapsed_s']:.0f} s.", ""]
    if estimate["attn"] != table["attn"]:
        lines += [f"**The estimator ran with attention {estimate['attn']}, the measurement with "
                  f"{table['attn']}.**", ""]
    return lines + markdown_table(header, body, left=(0, 6, 14)) + [""]


def records_section(replays: Sequence[RecordReplay], tables: Sequence[dict[str, Any]]) -> list[str]:
    lines = ["## Allocator replay", ""]
    if not replays:
        return lines + ["No records found.", ""]
    header = ["record", "mode", "seq", "batch", "events", "reserved real GiB", "sim GiB", "err %",
              "real-address err %", "allocated real GiB", "sim GiB", "err %", "real-address err %",
              "segments real / sim", "misplaced blocks", "context MiB", "outside after load MiB",
              "outside after step MiB"]
    body = [[f"`{r.name}`", r.mode, str(r.seq_len), str(r.batch), str(r.events),
             gib(r.real_reserved), gib(r.sim_reserved), pct(error_pct(r.sim_reserved, r.real_reserved)),
             pct(error_pct(r.addressed_reserved, r.real_reserved)),
             gib(r.real_allocated), gib(r.sim_allocated), pct(error_pct(r.sim_allocated, r.real_allocated)),
             pct(error_pct(r.addressed_allocated, r.real_allocated)),
             f"{r.real_segments} / {r.sim_segments}", f"{r.misplaced} of {r.allocations}",
             mib(r.context_bytes), mib(r.outside_after_load), mib(r.outside_after_step)] for r in replays]
    assumed = sorted({t["context_overhead_bytes"] for t in tables})
    outside = [r.outside_after_step for r in replays]
    lines += [
        "Each record is one real training step under `torch.cuda.memory._record_memory_history`. Its "
        "allocator events are replayed through `CachingAllocatorSim` (alloc: malloc, free_completed: free, "
        "a run of segment_free: empty_cache and a reset of the peaks) as the estimator runs it, with segment "
        "addresses of its own, and with each segment at its real address (*real-address*: the simulator's "
        "addresses only break ties between equal-sized free blocks; *misplaced blocks* counts the "
        "allocations that replay put elsewhere than the real allocator did). *Context* is the device memory "
        "in use once the CUDA context is up, before any allocation; *outside* is the device memory in use "
        "minus the allocator's reserved memory (context, kernels, library handles).",
        "",
        *markdown_table(header, body),
        "",
        f"Memory outside the allocator after a step: {mib(min(outside))} to {mib(max(outside))} MiB; the "
        f"tables assume a context overhead of {', '.join(mib(a) for a in assumed)} MiB (it only sets the "
        "budget: the measured runs capped the allocator at the same budget).",
    ]
    for r in replays:
        if r.budget is not None:
            lines.append(f"- `{r.name}`: recorded under a {gib(r.budget)} GiB budget; the step "
                         f"{'ran out of memory' if r.real_outcome == 'oom' else 'fit'} on the GPU and "
                         f"{'runs out of memory' if r.sim_outcome == 'oom' else 'fits'} in the simulator.")
        if r.unmatched_frees or r.streams > 1:
            lines.append(f"- `{r.name}`: {r.unmatched_frees} frees of unknown addresses, {r.streams} streams "
                         "(the simulator models one).")
    return lines + [""]


def refusals_section(tables: dict[str, dict[str, Any]], estimates: dict[str, dict[str, Any]]) -> list[str]:
    """The GPU's out-of-memory one above each measured max against the estimator's step at that batch."""
    header = ["table", "mode", "seq", "batch", "GPU tried GiB", "GPU allocated GiB", "GPU cached free GiB",
              "estimator", "est. request GiB", "est. allocated GiB", "allocated err %",
              "est. cached free GiB", "est. largest free GiB"]
    body: list[list[str]] = []
    refuses = same = close = 0
    fits: list[str] = []  # the probes the simulator runs where the GPU refused them
    fit_errors: list[float] = []  # their allocated error at the refused allocation
    more_cached = 0  # of those, where the GPU kept more free memory in segments it could not release
    for name, table in tables.items():
        estimated = {(c["mode"], c["seq_len"]): c for c in estimates[name]["cells"]}
        for cell in table["cells"]:
            real = measured_refusal(cell)
            at = (estimated.get((cell["mode"], cell["seq_len"])) or {}).get("at_refused")
            if real is None or not at or "replay" not in at:
                continue
            state = at.get("refused") or at.get("nearest")
            err = None if state is None else error_pct(state["allocated_bytes"], real["allocated_bytes"])
            cached = None if state is None else state["kept_bytes"] - state["allocated_bytes"]
            if at["replay"] == "oom":
                refuses += 1
                matched = abs(state["segment_bytes"] - real["tried_bytes"]) <= real["tried_tolerance"] + 1
                same += matched
                close += matched and err is not None and abs(err) <= 1
                verdict = "refuses " + ("it" if matched else f"{gib(state['segment_bytes'])} GiB")
            else:
                verdict = "fits"
                fits.append(f"{name} {cell['mode']} {cell['seq_len']} x {real['batch_size']}")
                if err is not None and cached is not None:
                    fit_errors.append(err)
                    more_cached += real["cached_free_bytes"] > cached
            body.append([f"`{name}`", cell["mode"], str(cell["seq_len"]), str(real["batch_size"]),
                         gib(real["tried_bytes"]), gib(real["allocated_bytes"]),
                         gib(real["cached_free_bytes"]),
                         verdict, "—" if state is None else gib(state["request_bytes"]),
                         "—" if state is None else gib(state["allocated_bytes"]), pct(err), gib(cached),
                         "—" if state is None else gib(state["largest_free_bytes"])])
    lines = ["## Refused steps", ""]
    if not body:
        return lines + ["No out-of-memory probe one above a measured max has a message to compare.", ""]
    lines += [
        "The GPU's out-of-memory message for the probe one above each measured max names the segment it "
        "tried to allocate, the memory allocated and the memory cached but unallocated once it had released "
        "every cached segment with no block in use (two decimals of GiB or MiB). The estimator's step at "
        "that batch is replayed under the same budget: where the simulator refuses it too, its figures at "
        "its refusal; where it fits, its figures at the allocation the GPU refused (of the requests whose "
        "segment would be the size the message names, the one with the memory allocated before it nearest "
        "the GPU's). *Cached free*: reserved minus allocated in the segments with a block in use; *largest "
        "free*: the largest free block of the request's pool, segments with no block in use included.",
        "",
        f"- {len(body)} refused probes: the simulator refuses {refuses} of them, {same} at the allocation "
        f"the GPU refused, with the memory allocated then within 1 % of the GPU's in {close} of those.",
    ]
    if fits:
        found = (f"at the allocation the GPU refused, the memory allocated is within "
                 f"{max(abs(e) for e in fit_errors):.2f} % of the GPU's in the {len(fit_errors)} with a "
                 f"request of that size, and the GPU held more free memory than the simulator in segments "
                 f"with a block in use in {more_cached} of them: memory it could neither hand out in one "
                 "piece nor release for a new segment, where the simulator's lay in segments it could release"
                 if fit_errors else "none has a request of the size the GPU refused")
        lines.append(f"- It runs {len(fits)} ({', '.join(fits)}): {found}.")
    return lines + ["", *markdown_table(header, body), ""]


@dataclass
class Card:
    """One measured card's tables, the estimator's answers for them and its records' replays."""

    name: str  # the folder's: h100-80gb, h200
    tables: dict[str, dict[str, Any]]  # by "card/table"
    estimates: dict[str, dict[str, Any]]
    comparisons: dict[str, list[Comparison]]
    replays: list[RecordReplay]

    @property
    def rows(self) -> list[Comparison]:
        return [row for group in self.comparisons.values() for row in group]


def size_only_summary(rows: Sequence[Comparison]) -> list[str]:
    """cells, within SIZE_ONLY_GOAL_PCT below the measured max, above it, median and worst distance."""
    judged = [r.size_only_pct for r in rows if r.size_only_pct is not None]
    within = sum(-SIZE_ONLY_GOAL_PCT <= d <= 0 for d in judged)
    above = sum(d > 0 for d in judged)
    return [str(len(judged)), f"{within}/{len(judged)}", str(above),
            abs_pct(median_abs(judged)), pct(min(judged, default=None))]


def cards_section(cards: Sequence[Card]) -> list[str]:
    """Each card's goals in a row, and its size-only answers' distance."""
    header = ["card", "cells", "max = or -1", "max > +2 %", "reserved median \\|err\\| %", "reserved worst %",
              "size-only cells", f"size-only within {SIZE_ONLY_GOAL_PCT:g} % below", "size-only above",
              "size-only median \\|dist\\| %", "size-only furthest %"]
    body = []
    for card in cards:
        rows = card.rows
        judged = [r for r in rows if r.measured_max is not None]
        reserved = [r.reserved_err for r in rows if r.reserved_err is not None]
        body.append([card.name, str(len(rows)), f"{sum(r.max_goal for r in judged)}/{len(judged)}",
                     str(sum(not r.above_goal for r in judged)), abs_pct(median_abs(reserved)),
                     pct(worst(reserved)), *size_only_summary(rows)])
    return ["## The cards side by side", "",
            "The estimator aimed at the measured chip (its multiprocessors, Hopper's kernels): `max = or -1` "
            "counts the cells whose estimated max is the measured one or one below it. *Size-only*: the "
            "answer for the budget given by its size alone (`--gpu-memory`, the chip taken to be "
            "`gpus.size_only_chip`'s), its distance (size-only - measured) / measured; the goal is within "
            f"{SIZE_ONLY_GOAL_PCT:g} % below, never above.", "", *markdown_table(header, body), ""]


def size_only_section(card: Card) -> list[str]:
    """Per cell of a card: the measured max, the estimate for its chip, the size-only answer."""
    header = ["table", "mode", "seq", "measured max", "estimated (chip)", "size-only", "distance %"]
    body = [[f"`{r.table}`", r.mode, str(r.seq_len), num(r.measured_max), num(r.estimated_max),
             num(r.size_only_max), pct(r.size_only_pct)]
            for r in card.rows if r.size_only_max is not None]
    if not body:
        return []
    return [f"## {card.name}: size-only answers per cell", "", *markdown_table(header, body, left=(0, 1)), ""]


def card_sections(card: Card) -> list[str]:
    """A card's goals, modes, tables, refusals and records, each heading naming the card."""
    modes = list(dict.fromkeys(mode for t in card.tables.values() for mode in t["modes"]))
    lines = goals_section(card.rows) + modes_section(card.rows, modes)
    lines += ["## Per table", "",
              "`goal`: yes where the estimated max is the measured one or one below it, *above* where it is "
              "above the measured by more than 2 % of it. Peaks at the measured max batch; *capped err*: the "
              "estimated step replayed with the budget as the allocator's limit.", ""]
    for name, table in card.tables.items():
        lines += table_section(name, table, card.comparisons[name], card.estimates[name])
    lines += refusals_section(card.tables, card.estimates)
    lines += records_section(card.replays, list(card.tables.values()))
    lines += size_only_section(card)
    return [f"## {card.name}: {line[3:]}" if line.startswith("## ") and not line.startswith(f"## {card.name}")
            else line for line in lines]


def render(cards: Sequence[Card], command: str) -> str:
    tables = {name: t for card in cards for name, t in card.tables.items()}
    estimates = {name: e for card in cards for name, e in card.estimates.items()}
    lines = header_section(tables, estimates, command)
    lines += cards_section(cards)
    for card in cards:
        lines += [f"# {card.name}", "", *card_sections(card)]
    return "\n".join(lines)


# -- the command -------------------------------------------------------------------------------------


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def table_paths(directory: Path, only: str | None) -> list[Path]:
    """The table files of ``directory`` (``*.json`` but records), those ``only`` names if given."""
    paths = sorted(p for p in directory.glob("*.json") if not p.name.startswith("record-"))
    if only:
        patterns = [part.strip() for part in only.split(",") if part.strip()]
        paths = [p for p in paths if any(fnmatch.fnmatch(p.stem, pattern) for pattern in patterns)]
    return paths


def read_table(path: Path) -> dict[str, Any] | None:
    """A measured table; None (with a message) for a JSON file that is no table."""
    data = json.loads(path.read_text())
    if not isinstance(data, dict) or "cells" not in data or "budget_bytes" not in data:
        log(f"{path.name}: not a table, skipped")
        return None
    if data.get("backend") != "cuda":
        raise SystemExit(f"{path}: a {data.get('backend')!r} table, not a measured (cuda) one")
    return data


def read_card(directory: Path, only: str | None, cache: Path, refresh: bool) -> Card | None:
    """A card's measured tables (``directory``), the estimator's answers, its records replayed."""
    paths = table_paths(directory, only)
    found = {p.stem: t for p in paths if (t := read_table(p)) is not None}
    if not found:
        return None
    by_file = cached_estimates(directory.name, [p for p in paths if p.stem in found], cache, refresh)
    tables = {f"{directory.name}/{stem}": table for stem, table in found.items()}
    estimates = {f"{directory.name}/{Path(name).stem}": result for name, result in by_file.items()}
    comparisons = {name: compare_table(name, table, estimates[name]) for name, table in tables.items()}
    records = sorted((directory / "records").glob("*.json")) if (directory / "records").is_dir() else []
    replays = [replay_record(json.loads(path.read_text())) for path in records]
    return Card(directory.name, tables, estimates, comparisons, replays)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--measured", type=Path, action="append",
                        help="a card's folder of measured tables and records/ (again for each card; default: "
                        "docs/measurements/h100-80gb and h200)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="the Markdown report")
    parser.add_argument("--cache", type=Path,
                        help="the estimator's answers (default: next to OUT, OUT's name + .cache.json)")
    parser.add_argument("--only", help="comma-separated table names (file names without .json; globs)")
    parser.add_argument("--refresh", action="store_true", help="recompute the estimator's answers")
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore", FutureWarning)

    cache = args.cache or args.out.with_name(args.out.stem + ".cache.json")
    cards = [card for directory in args.measured or DEFAULT_MEASURED
             if (card := read_card(directory, args.only, cache, args.refresh)) is not None]
    if not cards:
        named = f" named {args.only}" if args.only else ""
        folders = ", ".join(map(str, args.measured or DEFAULT_MEASURED))
        raise SystemExit(f"no measured tables{named} in {folders}")
    command = shlex.join(["python", "benchmarks/accuracy.py", *(sys.argv[1:] if argv is None else argv)])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(render(cards, command) + "\n")
    log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
