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

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from autotune.errors import InvalidInput
from autotune.gpus import GpuSpec
from autotune.modes import Mode, parse_mode
from autotune.search import search_max_batch
from autotune.tuner import Backend, budget_bytes
from autotune.units import format_bytes
from autotune.workload import Workload


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


def max_batch(backend: Backend, workload: Workload, mode: Mode, seq_len: int, budget: int,
              guess: int | None = None, max_batch_size: int = 4096) -> tuple[int, dict[int, Any]]:
    """The max batch of one cell, and the probes made by batch size."""
    with backend.cell(workload, mode, seq_len, budget) as fits:
        result = search_max_batch(fits, budget_bytes=budget, max_batch=max_batch_size, guess=guess,
                                  predict=getattr(fits, "predict", None),
                                  settle=getattr(fits, "settle", None))
    return result.max_batch_size, {p.batch_size: p for p in result.probes}


def check_step(
    workload: Workload, backend: Backend, gpu: GpuSpec, *, seq_len: int, batch_size: int,
    mode: Mode, margin: float, effective_batch: int | None = None,
) -> CheckResult:
    """Does ``batch_size`` fit? With the cell's max batch and, if not, a suggestion."""
    if batch_size < 1:
        raise InvalidInput(f"batch size {batch_size} must be at least 1")
    budget = budget_bytes(gpu, margin)
    limit = max(4096, batch_size)
    best, probes = max_batch(backend, workload, mode, seq_len, budget, guess=batch_size,
                             max_batch_size=limit)
    at_request = probes.get(batch_size)
    if at_request is None:  # the search never needed the requested batch itself
        with backend.cell(workload, mode, seq_len, budget) as fits:
            at_request = fits(batch_size)
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
        lighter_max, _ = max_batch(backend, workload, lighter, seq_len, budget, guess=max(1, 4 * best))
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


# -- training configs ------------------------------------------------------------------------

_MODEL_KEYS = ("model", "model_name_or_path", "model_name")
_SEQ_KEYS = ("seq_len", "max_seq_length", "max_length", "max_seq_len")
_BATCH_KEYS = ("batch_size", "per_device_train_batch_size")


@dataclass(frozen=True)
class PlannedJob:
    model: str | None
    seq_len: int | None
    batch_size: int | None
    mode: Mode | None
    accumulation_steps: int


def read_training_config(path: str | Path) -> PlannedJob:
    """The planned job in a TrainingArguments JSON or a small YAML/JSON; unknown keys ignored."""
    file = Path(path)
    try:
        text = file.read_text()
    except OSError as exc:
        raise InvalidInput(f"cannot read training config {str(path)!r}: {exc.strerror}") from exc
    data = _parse(text, file)
    if not isinstance(data, dict):
        raise InvalidInput(f"training config {str(path)!r} must be a mapping of keys to values")

    def first(keys: tuple[str, ...]) -> Any:
        return next((data[k] for k in keys if data.get(k) is not None), None)

    mode = None
    if data.get("mode") is not None:
        mode = parse_mode(str(data["mode"]))
    elif any(k in data for k in ("fp16", "bf16", "gradient_checkpointing")):
        precision = "amp" if data.get("fp16") else "bf16" if data.get("bf16") else "fp32"
        mode = Mode(precision, bool(data.get("gradient_checkpointing")))  # type: ignore[arg-type]
    return PlannedJob(
        model=first(_MODEL_KEYS), seq_len=_int(first(_SEQ_KEYS), "sequence length", path),
        batch_size=_int(first(_BATCH_KEYS), "batch size", path), mode=mode,
        accumulation_steps=_int(data.get("gradient_accumulation_steps"), "accumulation steps",
                                path) or 1,
    )


def _parse(text: str, file: Path) -> Any:
    if file.suffix.lower() == ".json":
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise InvalidInput(f"training config {str(file)!r} is not valid JSON: {exc}") from exc
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise InvalidInput(f"training config {str(file)!r} is not valid YAML or JSON: {exc}") from exc


def _int(value: Any, what: str, path: str | Path) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidInput(f"{what} in {str(path)!r} must be a positive integer, got {value!r}")
    return value


def missing_fields(job: PlannedJob) -> list[str]:
    names = {"model": job.model, "seq_len": job.seq_len, "batch_size": job.batch_size}
    return [name for name, value in names.items() if value is None]


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
    from autotune.tuner import memory_model

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

