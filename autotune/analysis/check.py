"""The CI gate: does a planned training step fit, and if not, what would.

``check_step`` answers for one (model, seq_len, mode, batch_size) on a target GPU: the peak of
the step at the requested batch, the max batch of that cell (searched with the requested batch
as the first guess, so a plan close to the limit costs two or three probes), and, when it does
not fit, a suggestion: gradient accumulation to the same effective batch, and the mode with
checkpointing that would fit the most.

``read_training_config`` reads the plan from a Hugging Face ``TrainingArguments`` JSON (or a
small YAML/JSON of the same keys) plus the model name and sequence length.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from autotune.backends import Backend
from autotune.defaults import DEFAULT_MAX_BATCH
from autotune.errors import InvalidInput
from autotune.gpus import GpuSpec
from autotune.tuner import budget_bytes, memory_model, search_cell
from autotune.units import format_bytes
from autotune.workload import Workload
from autotune.workload.modes import Mode


@dataclass
class CheckResult:
    fits: bool
    max_batch_size: int
    peak_memory_bytes: int | None  # of the step at the requested batch
    budget_bytes: int
    source: str  # "measured" | "estimated"
    backend: str
    suggestion: str | None
    model: str
    seq_len: int
    mode: str
    batch_size: int
    gpu_name: str
    gpu_memory_bytes: int
    message: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def source_of(backend_name: str) -> str:
    return "measured" if backend_name == "cuda" else "estimated"


def check_step(
    workload: Workload, backend: Backend, gpu: GpuSpec, *, seq_len: int, batch_size: int,
    mode: Mode, margin: float, effective_batch: int | None = None,
) -> CheckResult:
    """Does ``batch_size`` fit? With the cell's max batch and, if not, a suggestion."""
    if batch_size < 1:
        raise InvalidInput(f"batch size {batch_size} must be at least 1")
    budget = budget_bytes(gpu, margin)
    cap = max(DEFAULT_MAX_BATCH, batch_size)
    found = search_cell(backend, workload, mode, seq_len, budget, max_batch=cap, guess=batch_size)
    best = found.max_batch_size
    at_request = next((p for p in found.probes if p.batch_size == batch_size), None)
    if at_request is None:  # the search never needed the requested batch itself
        with backend.cell(workload, mode, seq_len, budget) as cell:
            at_request = cell.fits(batch_size)
    fits_now = batch_size <= best
    advice = None if fits_now else _suggest(
        backend, workload, mode, seq_len, budget, best, effective_batch or batch_size
    )
    result = CheckResult(
        fits=fits_now, max_batch_size=best,
        peak_memory_bytes=at_request.details.get("peak_reserved_bytes", at_request.peak_bytes),
        budget_bytes=budget, source=source_of(backend.name), backend=backend.name,
        suggestion=advice, model=workload.model.name, seq_len=seq_len, mode=mode.name,
        batch_size=batch_size, gpu_name=gpu.name, gpu_memory_bytes=gpu.total_memory_bytes,
    )
    result.message = format_message(result)
    return result


def accumulation_plan(effective_batch: int, max_batch_size: int) -> tuple[int, int]:
    """(micro-batch, steps) reaching ``effective_batch`` with micro-batches that fit: the
    largest divisor of the effective batch that fits, else the max batch with enough steps."""
    divisors = [d for d in range(1, max_batch_size + 1) if effective_batch % d == 0]
    micro = max(divisors) if divisors else max_batch_size
    if micro * 2 < max_batch_size:  # a poor divisor (a prime effective batch): round up
        micro = max_batch_size
    return micro, -(-effective_batch // micro)


def _suggest(
    backend: Backend, workload: Workload, mode: Mode, seq_len: int, budget: int, best: int,
    effective_batch: int,
) -> str:
    lighter = _lighter_mode(mode)
    lighter_max = None
    if lighter is not None:
        lighter_max = search_cell(backend, workload, lighter, seq_len, budget,
                                  guess=max(1, 4 * best)).max_batch_size
    return suggestion(best, effective_batch, lighter, lighter_max)


def suggestion(best: int, effective_batch: int, lighter: Mode | None, lighter_max: int | None) -> str:
    """What to do instead: accumulate micro-batches that fit, or a lighter mode that fits more."""
    parts = []
    if best >= 1:
        micro, steps = accumulation_plan(effective_batch, best)
        parts.append(f"use batch {micro} x {steps} accumulation steps for an effective "
                     f"{micro * steps}")
    if lighter is not None and lighter_max is not None and lighter_max > best:
        parts.append(f"mode {lighter.name} (max {lighter_max})")
    if not parts:
        return "even batch 1 does not fit: use a GPU with more memory or a shorter sequence"
    return ", or ".join(parts)


def _lighter_mode(mode: Mode) -> Mode | None:
    """The mode with the most memory saving reachable from ``mode``: 16-bit + checkpointing."""
    precision = mode.precision if mode.precision != "fp32" else "amp"
    candidate = Mode(precision, True)  # type: ignore[arg-type]
    return None if candidate == mode else candidate


def gpu_label(result: CheckResult) -> str:
    if result.gpu_name.startswith("custom"):
        return format_bytes(result.gpu_memory_bytes)
    return f"{result.gpu_name} ({format_bytes(result.gpu_memory_bytes)})"


def format_message(result: CheckResult) -> str:
    """The one line a CI log shows."""
    where = f"{result.model} seq {result.seq_len} {result.mode} on {gpu_label(result)}"
    if result.fits:
        peak = "" if result.peak_memory_bytes is None else (
            f": peak {format_bytes(result.peak_memory_bytes)} of {format_bytes(result.budget_bytes)}"
        )
        return f"fits: {where}, batch {result.batch_size}{peak}; max batch {result.max_batch_size}"
    return f"does not fit: {where}: max batch {result.max_batch_size}; {result.suggestion}"


# -- answering from a stored table -----------------------------------------------------------


def check_from_cells(
    cells: Mapping[str, Mapping[str, Any]], *, model: str, seq_len: int, batch_size: int,
    mode: Mode, budget: int, backend_name: str, gpu_name: str, gpu_memory_bytes: int,
    effective_batch: int | None = None,
) -> CheckResult | None:
    """The check answered from a stored table's cells (mode name -> CellResult dict at this
    seq_len), or None when the table has no finished cell for ``mode``.

    The peak at the requested batch is the probe's when that batch was probed, else read off
    the line through the two largest fitting probes (tuner's memory model).
    """
    cell = cells.get(mode.name)
    if cell is None or cell.get("max_batch_size") is None:
        return None
    best = int(cell["max_batch_size"])
    probed = {p["batch_size"]: p for p in cell.get("probe_log", [])}
    peak: int | None = None
    if batch_size in probed:
        peak = probed[batch_size].get("peak_reserved_bytes") or probed[batch_size].get("peak_bytes")
    else:
        line = memory_model(cell.get("probe_log", []))
        if line is not None:
            peak = int(line.intercept_bytes + line.slope_bytes * batch_size)
    fits_now = batch_size <= best
    advice = None
    if not fits_now:
        lighter = _lighter_mode(mode)
        other = cells.get(lighter.name, {}) if lighter is not None else {}
        advice = suggestion(best, effective_batch or batch_size, lighter, other.get("max_batch_size"))
    result = CheckResult(
        fits=fits_now, max_batch_size=best, peak_memory_bytes=peak, budget_bytes=budget,
        source=source_of(backend_name), backend=backend_name, suggestion=advice, model=model,
        seq_len=seq_len, mode=mode.name, batch_size=batch_size, gpu_name=gpu_name,
        gpu_memory_bytes=gpu_memory_bytes,
    )
    result.message = format_message(result)
    return result

