"""The table tuner: for each (mode, seq_len) cell, the largest batch that fits.

Cells run mode by mode, sequence lengths ascending, so that each cell gets two hints from the
cells before it in the same mode (both only make the search cheaper; the answer is always
verified by the cell's own probes):

- an upper bound: a longer sequence never fits a larger batch than a shorter one;
- a guess: per-sample memory (the slope of peak memory in the batch size) grows with the
  sequence length, so the slopes of earlier cells extrapolate to this one, and the intercept
  (parameters, gradients, optimizer state) stays put.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from autotune.backends import Backend
from autotune.defaults import DEFAULT_MARGIN, DEFAULT_MAX_BATCH, DEFAULT_METHOD, DEFAULT_SEQ_LENS
from autotune.errors import InvalidInput, ProbeError, SearchError
from autotune.gpus import GpuSpec
from autotune.search import MemoryModel, Probe, SearchResult, search_max_batch
from autotune.units import format_bytes
from autotune.workload import Workload
from autotune.workload.models import check_seq_len
from autotune.workload.modes import Mode
from autotune.workload.parallel import Parallel, nccl_bytes
from autotune.workload.ring_attention import MAX_BATCH as RING_MAX_BATCH
from autotune.workload.support import check_supported, paged_state_bytes, step_warnings
from autotune.workload.trainers import Trainer


def budget_bytes(gpu: GpuSpec, margin: float, parallel: Parallel | None = None,
                 trainer: Trainer | None = None) -> int:
    """What PyTorch's caching allocator may use on ``gpu``, keeping ``margin`` of it free.

    The CUDA context lives outside the allocator, so it comes off the card's memory first, and so
    do a multi-GPU job's NCCL buffers (workload.parallel.nccl_bytes) and a GRPO job's colocated vLLM
    engine (``trainer``: Trainer.vllm_bytes, vllm_gpu_memory_utilization of the card).
    """
    if not 0.0 <= margin < 1.0:
        raise InvalidInput(f"margin {margin} is out of range: use a fraction in [0, 1), e.g. 0.05")
    nccl = nccl_bytes(parallel, gpu.compute_capability)
    vllm = 0 if trainer is None else trainer.vllm_bytes(gpu.total_memory_bytes)
    left = gpu.total_memory_bytes - gpu.context_overhead_bytes - nccl - vllm
    if left <= 0 and vllm:
        error = InvalidInput.naming(f"{gpu.name} ({format_bytes(gpu.total_memory_bytes)}) leaves training "
                                    f"nothing beside the colocated vLLM engine ({format_bytes(vllm)}): lower "
                                    "{vllm_gpu_memory_utilization}, or use vllm_mode server")
        error.field = "vllm_gpu_memory_utilization"
        raise error
    if left <= 0:
        error = InvalidInput(f"{gpu.name} ({format_bytes(gpu.total_memory_bytes)}) leaves PyTorch nothing "
                             f"after the CUDA context ({format_bytes(gpu.context_overhead_bytes)})"
                             + (f" and NCCL's buffers ({format_bytes(nccl)})" if nccl else ""))
        if left + nccl > 0:  # the card alone would do: the job's GPUs are what to change
            error.field = "gpus"
        raise error
    return int(left * (1.0 - margin))


def images_json(workload: Workload) -> dict[str, Any] | None:
    """A vision-language model's image assumption as the output says it (vision.ImageLayout.to_json:
    per sample, size, processed size, patches, tokens, label); None without one."""
    if workload.images is None:
        return None
    from autotune.workload.vision import image_layout

    return image_layout(workload.model.config, workload.images).to_json()


def parallel_json(workload: Workload, gpu: GpuSpec) -> dict[str, Any] | None:
    """A multi-GPU job as the output says it (Parallel.to_json), with its NCCL buffers on ``gpu``;
    None for one GPU."""
    if workload.parallel is None:
        return None
    nccl = nccl_bytes(workload.parallel, gpu.compute_capability)
    return {**workload.parallel.to_json(), "nccl_bytes": nccl}


@dataclass
class CellResult:
    seq_len: int
    mode: str
    max_batch_size: int | None  # None when the cell failed
    peak_memory_bytes: int | None  # peak reserved at the max batch (what the budget bounds)
    peak_allocated_bytes: int | None
    probes: int
    capped: bool
    backend: str
    step_time_s: float | None = None
    error: str | None = None
    probe_log: list[dict[str, Any]] = field(default_factory=list)
    # The estimator's answer that seeded a measured search (backends/seeded.py); None otherwise.
    estimated_max_batch_size: int | None = None
    # A larger batch that also fits past max_batch_size + 1, which runs out of memory (the caching
    # allocator's fragmentation: search.SearchResult.also_fits); None if none is known.
    also_fits: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class TableResult:
    model: str
    task: str
    backend: str
    attn: str
    optimizer: str
    weights_dtype: str  # the dtype the weights had (workload.models.resolve_dtype)
    loss: str
    gpu_name: str
    gpu_memory_bytes: int
    context_overhead_bytes: int
    budget_bytes: int
    margin: float
    search: str
    max_batch: int
    seq_lens: list[int]
    modes: list[str]
    environment: dict[str, Any]
    cells: list[CellResult] = field(default_factory=list)
    elapsed_s: float = 0.0
    warnings: list[str] = field(default_factory=list)  # workload.support.step_warnings
    # A paged optimizer's state in CUDA unified memory, outside the budget (optimizers.py).
    outside_allocator_bytes: int = 0
    # LoRA / QLoRA: adapters.AdapterSummary.to_json() (method, r, alpha, dropout, targets, the
    # trainable and total parameters, label); None for a full fine-tune.
    adapter: dict[str, Any] | None = None
    ckpt_reentrant: bool = False  # checkpointed modes with use_reentrant=True (workload.ckpt_reentrant)
    liger: list[str] = field(default_factory=list)  # Liger's kernels swapped in, emulated (workload.liger)
    # A multi-GPU job (workload.parallel.Parallel.to_json: kind, gpus, ..., label); None: one GPU.
    # Every max batch is then one rank's, the per-device batch.
    parallel: dict[str, Any] | None = None
    # A vision-language model's images in every row (images_json); None: not image-text-to-text.
    images: dict[str, Any] | None = None
    offload_activations: bool = False  # TRL's OffloadActivations around each step (workload.offload)
    offload_streams: bool = True  # its use_streams (False: Axolotl's activation_offloading: legacy)
    # A preference trainer's step (trainer_json); None: supervised fine-tuning. Its cells' batches
    # are samples as the trainer counts them (pairs for dpo, orpo, simpo, reward).
    trainer: dict[str, Any] | None = None

    @property
    def total_probes(self) -> int:
        return sum(cell.probes for cell in self.cells)

    def cell(self, mode: str, seq_len: int) -> CellResult | None:
        return next((c for c in self.cells if c.mode == mode and c.seq_len == seq_len), None)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["probes_total"] = self.total_probes
        data["probes_per_cell"] = round(self.total_probes / len(self.cells), 2) if self.cells else 0
        return data


def trainer_json(workload: Workload, gpu: GpuSpec | None = None) -> dict[str, Any] | None:
    """What results say of a preference trainer's step (preference.Trainer.to_json: its name, TRL's
    class, what a row is, the reference); for GRPO on ``gpu``, a colocated vLLM engine's bytes
    (``vllm_bytes``: off the budget)."""
    if workload.trainer is None:
        return None
    return trainer_summary(workload.trainer, peft=workload.adapter is not None, gpu=gpu)


def trainer_summary(trainer: Trainer, *, peft: bool, gpu: GpuSpec | None = None) -> dict[str, Any]:
    """trainer_json of a trainer on its own (the service's stored runs: no workload built)."""
    found = trainer.to_json(peft=peft)
    if "grpo" in found and gpu is not None:
        found["grpo"]["vllm_bytes"] = trainer.vllm_bytes(gpu.total_memory_bytes)
    return found


def adapter_json(workload: Workload) -> dict[str, Any] | None:
    """What results say of the workload's adapter (adapters.summarize, with the estimator's 4-bit
    layers on the meta device), None without one."""
    from autotune.backends.estimate.parts import ESTIMATE_PARTS
    from autotune.workload.adapters import summarize

    summary = summarize(workload, ESTIMATE_PARTS)
    return None if summary is None else summary.to_json()


def _probe_dict(probe: Probe) -> dict[str, Any]:
    return {
        "batch_size": probe.batch_size,
        "outcome": probe.outcome,
        "peak_bytes": probe.peak_bytes,
        "step_time_s": probe.step_time_s,
        "error": probe.error,
        **dict(probe.details),
    }


# The first probe of a mode when nothing is known. Not 1: at batch 1 size-1 dimensions make some
# ops views instead of copies, so the estimator's trace at 1 does not extrapolate to other
# batches (trace.py) and would cost an extra probe. Batch 0 is still found: 2 runs out, then 1.
FIRST_GUESS = 2


def _guess(history: Sequence[tuple[int, MemoryModel]], seq_len: int, budget: int) -> int | None:
    """Predict the max batch at ``seq_len`` from (seq_len, model) of earlier cells of a mode."""
    if not history:
        return FIRST_GUESS
    last_seq, last = history[-1]
    if len(history) >= 2:
        prev_seq, prev = history[-2]
        per_token = (last.slope_bytes - prev.slope_bytes) / (last_seq - prev_seq)
        slope = last.slope_bytes + per_token * (seq_len - last_seq)
    else:
        slope = last.slope_bytes * seq_len / last_seq  # activations grow at least linearly
    if slope <= 0:
        return None
    return max(0, int((budget - last.intercept_bytes) // slope))


def tune_table(
    workload: Workload,
    backend: Backend,
    gpu: GpuSpec,
    *,
    seq_lens: Sequence[int] = DEFAULT_SEQ_LENS,
    modes: Sequence[Mode],
    margin: float = DEFAULT_MARGIN,
    method: str = DEFAULT_METHOD,
    max_batch: int = DEFAULT_MAX_BATCH,
    on_cell: Callable[[CellResult, int, int], None] | None = None,
    completed: Mapping[tuple[str, int], CellResult] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> TableResult:
    """Fill the table; ``on_cell(cell, done, total)`` is called as each cell finishes.

    ``completed`` maps (mode name, seq_len) to cells finished earlier (a run resumed after a
    restart): they are kept as they are, not probed again, and still give hints to the next
    cell. ``should_stop()`` is asked between cells (a cancelled run); the table then holds
    the cells finished so far.
    """
    if not seq_lens:
        raise InvalidInput("no sequence lengths given")
    for seq_len in seq_lens:
        check_seq_len(workload.model, seq_len)
    if max_batch < 1:
        raise InvalidInput(f"max batch {max_batch} must be at least 1")
    budget = budget_bytes(gpu, margin, workload.parallel, workload.trainer)
    ordered = sorted(set(seq_lens))
    table = _empty_table(workload, backend, gpu, seq_lens=ordered, modes=modes, margin=margin, budget=budget,
                         method=method, max_batch=max_batch)
    started = time.perf_counter()
    total = len(ordered) * len(modes)
    for mode in modes:
        history: list[tuple[int, MemoryModel]] = []
        upper: int | None = None
        for seq_len in ordered:
            if should_stop is not None and should_stop():
                table.elapsed_s = round(time.perf_counter() - started, 3)
                return table
            previous = (completed or {}).get((mode.name, seq_len))
            if previous is not None:
                cell, fitted = previous, memory_model(previous.probe_log)
            else:
                cell, fitted = _tune_cell(workload, backend, mode, seq_len, budget, method,
                                          max_batch, upper, _guess(history, seq_len, budget))
            table.cells.append(cell)
            if cell.max_batch_size is not None:
                upper = cell.max_batch_size
            if fitted is not None:
                history.append((seq_len, fitted))
            if on_cell is not None:
                on_cell(cell, len(table.cells), total)
    table.elapsed_s = round(time.perf_counter() - started, 3)
    return table


def _empty_table(workload: Workload, backend: Backend, gpu: GpuSpec, *, seq_lens: list[int],
                 modes: Sequence[Mode], margin: float, budget: int, method: str, max_batch: int
                 ) -> TableResult:
    """The table before its first cell: the step, the card, the budget, the search, the rows and
    columns."""
    return TableResult(
        model=workload.model.name, task=workload.task, backend=backend.name,
        attn=backend.attn_used(workload), optimizer=workload.optimizer,
        weights_dtype=workload.weights_dtype, loss=workload.loss, ckpt_reentrant=workload.ckpt_reentrant,
        liger=list(workload.liger),
        gpu_name=gpu.name,
        gpu_memory_bytes=gpu.total_memory_bytes, context_overhead_bytes=gpu.context_overhead_bytes,
        budget_bytes=budget, margin=margin, search=method, max_batch=max_batch,
        seq_lens=seq_lens, modes=[m.name for m in modes], environment=backend.describe(),
        warnings=step_warnings(workload, modes, gpu, seq_lens),
        outside_allocator_bytes=paged_state_bytes(workload),
        adapter=adapter_json(workload),
        parallel=parallel_json(workload, gpu),
        images=images_json(workload),
        offload_activations=workload.offload_activations, offload_streams=workload.offload_streams,
        trainer=trainer_json(workload, gpu),
    )


def search_cell(
    backend: Backend, workload: Workload, mode: Mode, seq_len: int, budget_bytes: int, *,
    max_batch: int = DEFAULT_MAX_BATCH, method: str = DEFAULT_METHOD, upper_bound: int | None = None,
    guess: int | None = None,
) -> SearchResult:
    """The search of one cell on ``backend``, with the cell's hooks (search.Cell): what a table
    cell, a check, an explanation and each lever search the same way.

    ``max_batch`` is the search's cap; the answer is the result's ``max_batch_size``. A step the
    target card cannot run (workload.support.refusal) raises InvalidInput.
    """
    check_supported(workload, mode, backend.gpu)
    # context parallel: ring-flash-attn's varlen ring runs one row a micro-batch (ring_attention.py
    # MAX_BATCH), the most the job runs, not the search's cap
    ring = workload.parallel is not None and workload.parallel.cp > 1
    cap = min(max_batch, RING_MAX_BATCH) if ring else max_batch
    with backend.cell(workload, mode, seq_len, budget_bytes) as cell:
        result = search_max_batch(
            cell.fits, budget_bytes=budget_bytes, max_batch=cap, method=method,  # type: ignore[arg-type]
            upper_bound=upper_bound, guess=guess, predict=cell.predict, settle=cell.settle, above=cell.above,
        )
    return replace(result, capped=False, also_fits=None) if ring else result


def memory_model(probe_log: Sequence[Mapping[str, Any]]) -> MemoryModel | None:
    """A memory line through the two largest fitting probes of a finished cell's probe log."""
    points = sorted((p["batch_size"], p["peak_bytes"]) for p in probe_log
                    if p["outcome"] == "fits" and p.get("peak_bytes"))
    if len(points) < 2 or points[-1][0] == points[-2][0]:
        return None
    (b1, p1), (b2, p2) = points[-2], points[-1]
    slope = (p2 - p1) / (b2 - b1)
    if slope <= 0:
        return None
    return MemoryModel(intercept_bytes=p2 - slope * b2, slope_bytes=slope)


def _tune_cell(
    workload: Workload, backend: Backend, mode: Mode, seq_len: int, budget: int, method: str,
    max_batch: int, upper: int | None, guess: int | None,
) -> tuple[CellResult, MemoryModel | None]:
    """One cell's search; also the memory model it fitted, for the next cell's guess."""
    try:
        result = search_cell(backend, workload, mode, seq_len, budget, max_batch=max_batch, method=method,
                             upper_bound=upper, guess=guess if method == "guided" else None)
    except SearchError as exc:
        return CellResult(seq_len, mode.name, None, None, None, len(exc.probes), False,
                          backend.name, error=str(exc),
                          probe_log=[_probe_dict(p) for p in exc.probes]), None
    except (ProbeError, InvalidInput) as exc:
        # InvalidInput here is a mode the model cannot run (e.g. no gradient checkpointing):
        # that cell fails with the reason, the rest of the table is still worth having.
        return CellResult(seq_len, mode.name, None, None, None, 0, False, backend.name,
                          error=str(exc)), None
    best = next((p for p in result.probes if p.batch_size == result.max_batch_size), None)
    if workload.trainer is not None and result.max_batch_size:
        # the largest batch the trainer runs (KTO's KL term refuses 1; GRPO's generation batch holds
        # whole prompt groups: trainers.py largest_batch), with the peaks of its probe where it ran
        runs = workload.trainer.largest_batch(result.max_batch_size)
        if runs != result.max_batch_size:
            result = replace(result, max_batch_size=runs, also_fits=None)
            best = next((p for p in result.probes if p.batch_size == runs and p.outcome == "fits"), None)
    cell = CellResult(
        seq_len=seq_len, mode=mode.name, max_batch_size=result.max_batch_size,
        peak_memory_bytes=best.peak_bytes if best else None,
        peak_allocated_bytes=best.details.get("peak_allocated_bytes") if best else None,
        probes=result.num_probes, capped=result.capped, backend=backend.name,
        step_time_s=best.step_time_s if best else None,
        probe_log=[_probe_dict(p) for p in result.probes],
        estimated_max_batch_size=(result.probes[0].details.get("estimated_max_batch_size")
                                  if result.probes else None),
        also_fits=result.also_fits,
    )
    return cell, result.model
