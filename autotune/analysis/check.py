"""The CI gate: does a planned training step fit, and if not, what would.

``check_step`` answers for one (model, seq_len, mode, batch_size) on a target GPU: the peak of
the step at the requested batch, the max batch of that cell (searched with the requested batch
as the first guess, so a plan close to the limit costs two or three probes), and, when it does
not fit, a suggestion: gradient accumulation to the same effective batch, then every lever
that raises the max batch of this cell by the same backend's search, best first (levers.py:
which levers a check weighs and how they are searched). A lever that does not help is never
advised.

``autotune.configs.read_training_config`` reads the request from a training config.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from autotune.analysis.levers import Lever, LeverRunner, helpful_levers, suggestion
from autotune.backends import Backend
from autotune.defaults import DEFAULT_MAX_BATCH
from autotune.errors import InvalidInput
from autotune.gpus import GpuSpec, chip_is_known, size_only_chip
from autotune.search import Probe
from autotune.tuner import (
    adapter_json,
    budget_bytes,
    images_json,
    memory_model,
    parallel_json,
    search_cell,
    trainer_json,
)
from autotune.units import format_bytes
from autotune.workload import Workload
from autotune.workload.liger import describe as describe_liger
from autotune.workload.modes import Mode, parse_mode
from autotune.workload.offload import NAME as OFFLOAD_NAME
from autotune.workload.offload import SINGLE_STREAM_NAME
from autotune.workload.support import paged_state_bytes, step_warnings, weights_label
from autotune.workload.zero import host_note


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
    # The step that was modelled (step_label says it in words).
    task: str | None = None
    weights_dtype: str | None = None
    optimizer: str | None = None
    attn: str | None = None
    loss: str | None = None
    warnings: list[str] = field(default_factory=list)
    levers: list[dict[str, Any]] = field(default_factory=list)  # what raises the max, best first
    outside_allocator_bytes: int = 0  # a paged optimizer's state in unified memory (optimizers.py)
    adapter: dict[str, Any] | None = None  # LoRA / QLoRA (tuner.adapter_json); None: full fine-tune
    # The SDPA kernel the estimated step ran ("cuDNN", "memory-efficient", ...; attention.py); None
    # where the step has no SDPA or was measured.
    attention_kernel: str | None = None
    ckpt_reentrant: bool = False  # checkpointed modes with use_reentrant=True (workload.ckpt_reentrant)
    liger: list[str] = field(default_factory=list)  # Liger's kernels swapped in, emulated (workload.liger)
    # PyTorch's caching-allocator settings the step was estimated under (PYTORCH_ALLOC_CONF's text,
    # alloc_conf.py); None: its default, the classic segments
    alloc_conf: str | None = None
    # The chip the estimate took a card given by its size alone to be (gpus.describe_chip); None
    # where the card's chip is known
    chip_assumed: str | None = None
    # A multi-GPU job (workload.parallel.Parallel.to_json); None: one GPU. The batch is per GPU.
    parallel: dict[str, Any] | None = None
    # A vision-language model's images in every row (tuner.images_json); None: not image-text-to-text.
    images: dict[str, Any] | None = None
    offload_activations: bool = False  # TRL's OffloadActivations around each step (workload.offload)
    offload_streams: bool = True  # its use_streams (False: Axolotl's activation_offloading: legacy)
    compiled: str | None = None  # torch.compile's mode around the model (workload.compile); None: eager
    # A preference trainer's step (tuner.trainer_json); None: supervised fine-tuning.
    trainer: dict[str, Any] | None = None
    # Pinned host memory a GPU's rank holds through the step: FSDP2's offloaded shards, gradients and
    # optimizer state, or ZeRO-Offload's buffers and DeepSpeedCPUAdam's state (the tracker's host
    # ledger); 0: none
    host_memory_bytes: int = 0
    # A larger batch than the max that also fits, past max_batch_size + 1 which runs out of memory
    # (search.SearchResult.also_fits); None where none is known
    also_fits: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def source_of(backend_name: str) -> str:
    return "measured" if backend_name == "cuda" else "estimated"


def check_step(
    workload: Workload, backend: Backend, gpu: GpuSpec, *, seq_len: int, batch_size: int,
    mode: Mode, margin: float, effective_batch: int | None = None,
    known_max: Callable[[int, Callable[[], int]], int] | None = None,
    run_levers: LeverRunner | None = None, remember: Callable[[CellMemo], None] | None = None,
) -> CheckResult:
    """Does ``batch_size`` fit? With the cell's max batch and, if not, the levers that help.

    ``known_max(cap, search)``: where the caller keeps the cell's max batch from an earlier search of
    the same backend (the service's analysis worker), it returns that, else ``search()``'s answer.
    ``run_levers``: how the levers' searches run (levers.helpful_levers; parallel.lever_runner on
    the estimator).
    ``remember(memo)``: called with what answers this check at any other batch size without running
    the model (CellMemo), where the backend can tell that (the estimator).
    """
    if batch_size < 1:
        raise InvalidInput(f"batch size {batch_size} must be at least 1")
    if workload.trainer is not None and batch_size < workload.trainer.min_batch:
        error = InvalidInput.naming(
            f"{{batch_size}} {batch_size}: KTOTrainer refuses a per-device batch of 1 with the KL term "
            "(kto_trainer.py __init__: 'Actual (not effective) batch size must be > 1'); give 2 or more, or "
            "kto_loss_type apo_zero_unpaired")
        error.field = "batch_size"
        raise error
    if workload.trainer is not None and batch_size % workload.trainer.batch_multiple:
        trainer = workload.trainer
        error = InvalidInput.naming(
            f"{{batch_size}} {batch_size}: GRPO's generation batch (batch x steps_per_generation "
            f"{trainer.steps_per_generation}) must hold whole groups of num_generations "
            f"{trainer.num_generations} completions (grpo_config.py __post_init__); give a multiple of "
            f"{trainer.batch_multiple}")
        error.field = "batch_size"
        raise error
    budget = budget_bytes(gpu, margin, workload.parallel, workload.trainer)
    cap = max(DEFAULT_MAX_BATCH, batch_size)
    probes: tuple[Probe, ...] = ()
    also_fits: int | None = None

    def search() -> int:
        nonlocal probes, also_fits
        found = search_cell(backend, workload, mode, seq_len, budget, max_batch=cap, guess=batch_size)
        probes, also_fits = found.probes, found.also_fits
        return found.max_batch_size

    best = search() if known_max is None else known_max(cap, search)
    at_request = next((p for p in probes if p.batch_size == batch_size), None)
    if at_request is None:  # the search never needed the requested batch itself
        with backend.cell(workload, mode, seq_len, budget) as cell:
            at_request = cell.fits(batch_size)
    searched: list[Lever] | None = None

    def levers() -> list[Lever]:
        nonlocal searched
        searched = helpful_levers(backend, workload, mode, seq_len, budget, best, max_batch=cap,
                                  run=run_levers)
        return searched

    step = {
        "budget_bytes": budget, "source": source_of(backend.name), "backend": backend.name,
        "model": workload.model.name, "seq_len": seq_len, "mode": mode.name, "gpu_name": gpu.name,
        "gpu_memory_bytes": gpu.total_memory_bytes, "task": workload.task,
        "weights_dtype": workload.weights_dtype, "optimizer": workload.optimizer,
        "attn": backend.attn_used(workload), "loss": workload.loss,
        "warnings": step_warnings(workload, [mode], gpu, [seq_len]),
        "outside_allocator_bytes": paged_state_bytes(workload),
        "adapter": adapter_json(workload),
        "attention_kernel": at_request.details.get("attention"),
        "ckpt_reentrant": workload.ckpt_reentrant, "liger": list(workload.liger),
        "alloc_conf": allocator_text(backend),
        "chip_assumed": None if chip_is_known(gpu) else size_only_chip()[0],
        "parallel": parallel_json(workload, gpu),
        "images": images_json(workload),
        "offload_activations": workload.offload_activations, "offload_streams": workload.offload_streams,
        "compiled": workload.compiled,
        "trainer": trainer_json(workload, gpu),
        "host_memory_bytes": int(at_request.details.get("host_bytes") or 0),
        "also_fits": also_fits,
    }
    result = verdict(step, best=best, batch_size=batch_size, effective_batch=effective_batch,
                     peak_bytes=at_request.details.get("peak_reserved_bytes", at_request.peak_bytes),
                     runs=at_request.outcome == "fits", levers=levers)
    if remember is not None:  # the form is read off the cell's traces only for a caller that keeps it
        form = getattr(backend, "cell_form", lambda *args: None)(workload, mode, seq_len)
        if form is not None:
            remember(CellMemo(step, best, cap, searched, form))
    return result


def allocator_text(backend: Any) -> str | None:
    """The allocator settings a backend's steps run under (None: PyTorch's default)."""
    allocator = getattr(backend, "allocator", None) or getattr(getattr(backend, "estimator", None),
                                                               "allocator", None)
    return (allocator.conf_text() or None) if allocator is not None else getattr(backend, "alloc_conf", None)


def verdict(step: Mapping[str, Any], *, best: int, batch_size: int, effective_batch: int | None,
            peak_bytes: int | None, runs: bool, levers: Callable[[], list[Lever]]) -> CheckResult:
    """The check of ``batch_size`` in a cell whose max batch is ``best``: the step at the request
    has the peak ``peak_bytes`` and ``runs`` at the budget or not; ``levers()`` are searched only
    where they are advised (above the max). ``step``: the CheckResult's fields of the cell."""
    # Below the max, the step at the request can still run out of memory: the caching allocator
    # is not monotone near the limit (a hole the cell's max stepped over, backends/estimate).
    hole = batch_size <= best and not runs
    fits_now = batch_size <= best and not hole
    found = [] if fits_now or hole else levers()
    advice = (hole_advice(batch_size, best) if hole
              else None if fits_now else suggestion(best, effective_batch or batch_size, found))
    result = CheckResult(
        fits=fits_now, max_batch_size=best, peak_memory_bytes=peak_bytes, batch_size=batch_size,
        suggestion=advice,
        levers=[{"lever": lever.name, "label": lever.label, "max_batch_size": lever.max_batch_size}
                for lever in found],
        **step,
    )
    result.message = format_message(result)
    return result


def also_fits_note(best: int, also_fits: int) -> str:
    """A larger batch than the max ``best`` that fits past ``best + 1``, which runs out of memory."""
    return (f"batch {also_fits} also fits: batch {best + 1} runs out of memory (the caching allocator "
            f"fragments differently at the two sizes); the max is below the first batch that does")


def hole_advice(batch_size: int, best: int) -> str:
    """What to do where ``batch_size`` runs out of memory below the cell's max ``best``."""
    return (f"batch {batch_size} runs out of memory here though batch {best} fits: the caching "
            f"allocator fragments differently at the two sizes; use batch {best}")


def gpu_label(result: CheckResult) -> str:
    if result.gpu_name.startswith("custom"):
        return format_bytes(result.gpu_memory_bytes)
    return f"{result.gpu_name} ({format_bytes(result.gpu_memory_bytes)})"


def step_label(result: CheckResult) -> str:
    """The modelled step in words: "causal-lm, bf16 weights, adamw_torch_fused, attention sdpa"."""
    if result.task is None or result.weights_dtype is None:
        return ""
    parts = [result.task, weights_label(result.weights_dtype), str(result.optimizer),
             f"attention {result.attn}"]
    if result.loss not in (None, "full"):
        parts.append(f"{result.loss} loss")
    if result.ckpt_reentrant and parse_mode(result.mode).checkpointing:
        parts.append("reentrant checkpointing")
    if result.liger:
        parts.append(describe_liger(result.liger))
    if result.offload_activations:
        parts.append(OFFLOAD_NAME if result.offload_streams else SINGLE_STREAM_NAME)
    if result.compiled is not None:
        parts.append(f"torch.compile {result.compiled}")
    if result.adapter is not None:
        parts.append(str(result.adapter["label"]))
    if result.parallel is not None:
        parts.append(f"per GPU of {result.parallel['label']}")
    if result.images is not None:
        parts.append(f"images: {result.images['label']}")
    if result.trainer is not None:
        parts.append(f"trainer {result.trainer['label']}")
    return " (" + ", ".join(parts) + ")"


def format_message(result: CheckResult) -> str:
    """The one line a CI log shows (warnings follow it on lines of their own)."""
    where = f"{result.model} seq {result.seq_len} {result.mode}{step_label(result)} on {gpu_label(result)}"
    if result.fits:
        peak = "" if result.peak_memory_bytes is None else (
            f": peak {format_bytes(result.peak_memory_bytes)} of {format_bytes(result.budget_bytes)}"
        )
        line = f"fits: {where}, batch {result.batch_size}{peak}; max batch {result.max_batch_size}"
    else:
        line = f"does not fit: {where}: max batch {result.max_batch_size}; {result.suggestion}"
    notes = [f"warning: {w}" for w in result.warnings]
    if result.also_fits is not None:
        notes.append(f"note: {also_fits_note(result.max_batch_size, result.also_fits)}")
    if result.alloc_conf:
        notes.append(f"note: estimated with PyTorch's allocator under PYTORCH_ALLOC_CONF={result.alloc_conf}")
    if result.chip_assumed and not result.fits:  # a fit is one line (a CI log); --json says it always
        chip = result.chip_assumed
        notes.append(f"note: a size alone: the chip taken to be the {chip}'s, the most threads of any preset "
                     "(--gpu CARD with --gpu-memory, or --multiprocessors N, names it)")
    if result.outside_allocator_bytes:
        notes.append(f"note: {paged_note(str(result.optimizer), result.outside_allocator_bytes)}")
    if result.host_memory_bytes:
        notes.append(f"note: {host_note(result.host_memory_bytes, result.parallel)}")
    vllm = (result.trainer or {}).get("grpo", {}).get("vllm_bytes")
    if vllm:
        notes.append(f"note: {vllm_note(vllm)}")
    return "\n".join([line, *notes])


def vllm_note(nbytes: int) -> str:
    """A colocated vLLM engine's share, in words: off the budget, and the lever."""
    return (f"the colocated vLLM engine holds {format_bytes(nbytes)} of the GPU "
            "(vllm_gpu_memory_utilization) outside PyTorch's allocator: taken off the budget; "
            "vllm_mode server runs it on other GPUs")


def paged_note(optimizer: str, nbytes: int) -> str:
    """What a paged optimizer keeps outside the budget, in words."""
    return (f"{optimizer} keeps {format_bytes(nbytes)} of optimizer state in CUDA unified memory, "
            "outside PyTorch's allocator and this budget: the driver pages it to host memory when "
            "the GPU runs short (slower steps, not an out-of-memory error)")


# -- answering from a stored table -----------------------------------------------------------


def check_from_cells(
    cells: Mapping[str, Mapping[str, Any]], *, workload: Workload, gpu: GpuSpec, seq_len: int,
    batch_size: int, mode: Mode, budget: int, backend_name: str, attn: str | None = None,
    effective_batch: int | None = None,
) -> CheckResult | None:
    """The check answered from a stored table's cells (mode name -> CellResult dict at this
    seq_len), or None when the table has no finished cell for ``mode``.

    The peak at the requested batch is the probe's when that batch was probed, else read off
    the line through the two largest fitting probes (tuner's memory model). The advice names
    the table's other modes that fit more at this length (its cells are all that is known).
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
    levers = []
    if not fits_now:
        for other, other_cell in cells.items():
            value = other_cell.get("max_batch_size")
            if other != mode.name and isinstance(value, int) and value > best:
                levers.append(Lever("mode", f"mode {other}", value))
        levers.sort(key=lambda lever: -lever.max_batch_size)
    result = CheckResult(
        fits=fits_now, max_batch_size=best, peak_memory_bytes=peak, budget_bytes=budget,
        source=source_of(backend_name), backend=backend_name,
        suggestion=None if fits_now else suggestion(best, effective_batch or batch_size, levers),
        model=workload.model.name, seq_len=seq_len, mode=mode.name, batch_size=batch_size,
        gpu_name=gpu.name, gpu_memory_bytes=gpu.total_memory_bytes, task=workload.task,
        weights_dtype=workload.weights_dtype, optimizer=workload.optimizer,
        attn=attn or workload.attn or "default", loss=workload.loss,
        warnings=step_warnings(workload, [mode], gpu, [seq_len]),
        levers=[{"lever": lever.name, "label": lever.label, "max_batch_size": lever.max_batch_size}
                for lever in levers],
        adapter=adapter_json(workload), ckpt_reentrant=workload.ckpt_reentrant, liger=list(workload.liger),
        parallel=parallel_json(workload, gpu), images=images_json(workload),
        trainer=trainer_json(workload, gpu),
        offload_activations=workload.offload_activations, offload_streams=workload.offload_streams,
        compiled=workload.compiled,
        host_memory_bytes=max((int(p.get("host_bytes") or 0) for p in cell.get("probe_log", [])), default=0),
        also_fits=cell.get("also_fits"),
    )
    result.message = format_message(result)
    return result


# -- answering from a kept cell ----------------------------------------------------------------


@dataclass(frozen=True)
class CellMemo:
    """What a check on the estimator knows of its cell at every batch size: the cell's fields, its
    max batch (searched up to ``cap``), the levers when they were searched (None: the step fitted),
    and the step's allocations at any batch (trace.Affine). ``check_from_memo`` answers the same
    check at another batch from it in a replay, without torch (the CLI keeps it, cli/answers.py)."""

    step: Mapping[str, Any]
    max_batch_size: int
    cap: int
    levers: list[Lever] | None
    form: Any  # trace.Affine

    def to_json(self) -> dict[str, Any]:
        return {"step": dict(self.step), "max_batch_size": self.max_batch_size, "cap": self.cap,
                "levers": None if self.levers is None else [asdict(lever) for lever in self.levers],
                "form": self.form.to_json()}

    @classmethod
    def from_json(cls, document: Mapping[str, Any]) -> CellMemo:
        from autotune.backends.estimate.backend import workspace_from_json
        from autotune.backends.estimate.trace import Affine
        from autotune.workload.chunks import from_json as chunking_from_json

        levers = document["levers"]
        return cls(dict(document["step"]), int(document["max_batch_size"]), int(document["cap"]),
                   None if levers is None else [Lever(**lever) for lever in levers],
                   Affine.from_json(document["form"], workspace_from_json, chunking_from_json))


def check_from_memo(memo: CellMemo, *, batch_size: int, effective_batch: int | None = None
                    ) -> CheckResult | None:
    """check_step's answer at ``batch_size`` from a CellMemo of the same cell (the step at the
    request replayed from the memo's form), or None where the memo cannot tell: the levers were not
    searched and the request is above the max, or the search's cap (the larger of DEFAULT_MAX_BATCH
    and the request) is another one and a max reached the lower of the two."""
    from autotune.backends.estimate.replay import replay

    cap = max(DEFAULT_MAX_BATCH, batch_size)
    if cap != memo.cap:
        lower = min(cap, memo.cap)
        if memo.max_batch_size >= lower or any(lever.max_batch_size >= lower for lever in memo.levers or ()):
            return None
    if batch_size > memo.max_batch_size and memo.levers is None:
        return None
    levers = memo.levers or []
    from autotune.backends.estimate.alloc_conf import parse_alloc_conf

    if not memo.form.covers(batch_size):  # a chunked loss lays its chunks out otherwise there
        return None
    replayed = replay(memo.form.at(batch_size).events(), memo.step["budget_bytes"],
                      parse_alloc_conf(memo.step.get("alloc_conf")))
    return verdict(memo.step, best=memo.max_batch_size, batch_size=batch_size,
                   effective_batch=effective_batch, peak_bytes=replayed.peak_reserved_bytes,
                   runs=replayed.fits, levers=lambda: levers)
