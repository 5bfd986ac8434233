"""Levers: the changes to a training step that may raise its max batch, which of them apply to a
step, and how each is searched.

A lever is a ``LeverSearch``: the step changed one way (its mode, workload or sequence length, or a
change the table has no column for: instrument.Variant), searched as the table searches a cell
(``tuner.search_cell`` on the same backend), so a lever that is a table mode (amp, bf16, ckpt,
amp+ckpt) or a table option (``--optimizer sgd``, another sequence length) gives the table's number.
Two analyses ask for them:

- a check whose step does not fit (check.py) advises the levers that raise the cell's max batch,
  best first (``helpful_levers``, each a ``Lever``; ``suggestion`` says them in words): a lighter
  mode, checkpointing, bitsandbytes' 8-bit AdamW, a chunked loss (``candidate_levers``), then LoRA
  / QLoRA for a full fine-tune, QLoRA and a lower rank for a LoRA one (``adapter_levers``); all of
  the step's own levers together or a shorter sequence only when none of them lets batch 1 fit. A
  lever that does not help is never advised; one the backend cannot run is left out (``lever_max``).
- an explanation (explain.py) reports the max batch under every change a user can make, helpful or
  not (``what_if``, each a ``LeverReport`` that says how it was found, or the error that stopped
  it: ``report_lever``).

The explanation's levers the table has no column for change the step itself (instrument.Variant)
and are searched the same way on an ``InstrumentedBackend``:

- 8-bit AdamW: once with every parameter at 8 bits (``bnb.optim.AdamW8bit`` used directly) and
  once as transformers' Trainer sets it up (``optim="adamw_bnb_8bit"``: embeddings keep 32-bit
  state). Where this machine has a CUDA GPU and bitsandbytes (real_8bit), both are measured:
  the cuda backend runs the step with bitsandbytes' own optimizer (bnb.py) at the same budget,
  one worker per cell as for a table. Elsewhere, or when the measurement fails (the lever's note
  says why), bitsandbytes' state sizes are emulated on the estimator (optimizers.BnbAdamWState).
- frozen embeddings: ``requires_grad=False`` on every ``nn.Embedding`` parameter (with tied
  weights, the output projection tied to them freezes too, as it does in training).
- fused linear cross-entropy (causal LMs with the model's own loss): the step with loss
  "chunked" (workload/loss.py), Liger Kernel's chunked logits, as ``Trainer(use_liger_kernel=True)``
  runs it; a workload option (``loss``), so the lever gives the table's number for it.
- PEFT (adapter_levers): a workload option (``adapter``), searched as the table searches it; a
  setup PEFT cannot build for the model (e.g. a quantized classification head) is the lever's error.

Gradient accumulation needs no search: the largest micro-batch that divides the effective batch
and fits (accumulation_plan). Dynamic padding is padding.py's.

The searches of a check or an explanation run through a ``LeverRunner``: one after the other here
(``in_order``), or shared out over processes on the estimator (parallel.lever_runner), each search
a picklable function of (LeverSearch, backend).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from autotune.backends import Backend
from autotune.backends.cuda import bnb
from autotune.backends.cuda.bnb import BNB_OPTIMIZERS
from autotune.defaults import DEFAULT_MAX_BATCH
from autotune.errors import AutotuneError, InvalidInput, ProbeError
from autotune.gpus import GpuSpec
from autotune.tuner import adapter_json, search_cell
from autotune.units import format_bytes
from autotune.workload import Workload
from autotune.workload.adapters import DEFAULT_QLORA_RECIPE, DEFAULT_R, RECIPE_NAMES, make_adapter
from autotune.workload.loss import CHUNKED_TASKS
from autotune.workload.modes import Mode
from autotune.workload.optimizers import TORCH_ADAMW, uses_bitsandbytes, uses_torchao
from autotune.workload.parallel import DDP, FSDP, MAX_GPUS, Parallel, check_sharded
from autotune.workload.trainers import GENERATIVE, check_step

if TYPE_CHECKING:
    from autotune.backends.estimate.instrument import Variant

AS_THE_TABLE = "as the table"
EMULATED_8BIT = "emulated: bitsandbytes' 8-bit state sizes"
NOTE_CHARS = 300  # of a failed measurement's message, in a lever's note
EIGHT_BIT_OPTIMIZER = "adamw_bnb_8bit"  # the Trainer's optim name for bitsandbytes' 8-bit AdamW
# The most levers an explanation searches (what_if: two autocast modes, checkpointing and with AMP,
# two 8-bit AdamW setups, SGD, frozen embeddings, chunked loss, two PEFT setups, one or two shorter
# lengths; a check's are fewer): the processes they may use, before they are known
# (parallel.lever_processes).
LEVERS_AT_MOST = 13

T = TypeVar("T")


# -- what a lever is ------------------------------------------------------------------------------


@dataclass(frozen=True)
class LeverSearch:
    """One lever: the cell's step changed one way, searched on the backend itself or, with
    ``variant``, instrumented with it (``runs_on``)."""

    name: str  # Lever.name (a check's) or LeverReport.name (an explanation's)
    label: str
    workload: Workload
    mode: Mode
    seq_len: int
    variant: Variant | None = None  # a change the table has no column for (instrument.Variant)
    estimated: str = AS_THE_TABLE  # LeverReport.estimated
    note: str | None = None
    adapter: bool = False  # a PEFT lever: its report carries its adapter (_with_adapter)


@dataclass(frozen=True)
class Lever:
    """One change to the step and the max batch the same search finds with it: what a check advises."""

    name: str  # "mode" | "checkpointing" | "optimizer" | "loss" | "adapter" | "gpus" | "combined" | "seq_len"
    label: str  # what to do, e.g. "mode bf16+ckpt", "optimizer adamw_bnb_8bit (8-bit AdamW)"
    max_batch_size: int


@dataclass(frozen=True)
class LeverReport:
    """What an explanation says of one lever: its max batch and how it was found."""

    name: str  # amp, bf16, ckpt, amp+ckpt, adamw-8bit, adamw-8bit-trainer, sgd, frozen-embeddings,
    #            fused-cross-entropy, lora, qlora, lora-rN, qlora-rN, seq-N, accumulation
    label: str
    max_batch_size: int | None  # None when the lever does not apply (see error)
    mode: str
    seq_len: int
    optimizer: str
    estimated: str  # AS_THE_TABLE, or how the lever was emulated or measured
    capped: bool = False
    note: str | None = None
    error: str | None = None
    # The PEFT setup of a lever that changes it (tuner.adapter_json: settings, targets, trainable
    # and total parameters); None for the others.
    adapter: dict[str, Any] | None = None


class LeverRunner(Protocol):
    """Runs ``search`` (lever_max or report_lever with the cell's budget and cap bound: a picklable
    function) on each of ``searches``; the answers in their order."""

    def __call__(self, searches: Sequence[LeverSearch], search: Callable[[LeverSearch, Backend], T]
                 ) -> list[T]: ...


def in_order(backend: Backend) -> LeverRunner:
    """The runner of the searches one after the other, here, on ``backend``."""

    def run(searches: Sequence[LeverSearch], search: Callable[[LeverSearch, Backend], T]) -> list[T]:
        return [search(lever, backend) for lever in searches]

    return run


def runs_on(lever: LeverSearch, backend: Backend) -> Backend:
    """The backend that runs the lever's step: ``backend`` (an EstimateBackend where the lever has a
    variant), instrumented with the lever's variant where it has one."""
    if lever.variant is None:
        return backend
    from autotune.backends.estimate.instrument import InstrumentedBackend

    return InstrumentedBackend(backend, lever.variant)  # type: ignore[arg-type]


# -- which levers a check weighs --------------------------------------------------------------------


def _fsdp_checkpointed(workload: Workload) -> bool:
    """Whether FSDP's own activation checkpointing wraps the layers (no ckpt mode beside it)."""
    return workload.parallel is not None and workload.parallel.activation_checkpointing


def _lacks_bf16(gpu: GpuSpec) -> bool:
    """A card known to have no bfloat16 tensor cores (one of unknown compute capability may)."""
    return gpu.compute_capability is not None and not gpu.supports_bf16


def candidate_levers(workload: Workload, mode: Mode, gpu: GpuSpec
                     ) -> list[tuple[str, str, Workload, Mode]]:
    """(name, label, workload, mode) of each single change that may raise the max batch, in the
    order advice lists them when they tie: a lighter mode, checkpointing, an 8-bit optimizer, a
    chunked loss."""
    # The 16-bit autocast to suggest: bf16 where the card has it (no loss scaling), else amp.
    precision = mode.precision if mode.precision != "fp32" else "amp" if _lacks_bf16(gpu) else "bf16"
    options: list[tuple[str, str, Workload, Mode]] = []
    # FSDP's own activation checkpointing excludes a ckpt mode (the Trainer refuses both)
    lighter = Mode(precision, not _fsdp_checkpointed(workload))  # type: ignore[arg-type]
    if lighter != mode:
        options.append(("mode", f"mode {lighter.name}", workload, lighter))
    if not mode.checkpointing and not _fsdp_checkpointed(workload) and Mode(mode.precision, True) != lighter:
        options.append(("checkpointing", f"mode {Mode(mode.precision, True).name} (gradient "
                        "checkpointing)", workload, Mode(mode.precision, True)))
    if mode.precision == "fp32" and Mode(precision, mode.checkpointing) != lighter:  # type: ignore[arg-type]
        half = Mode(precision, mode.checkpointing)  # type: ignore[arg-type]
        options.append(("mode", f"mode {half.name}", workload, half))
    # An 8-bit or paged optimizer already is bitsandbytes' or torchao's: no lighter AdamW to offer.
    if not uses_bitsandbytes(workload.optimizer) and not uses_torchao(workload.optimizer):
        options.append(("optimizer", f"optimizer {EIGHT_BIT_OPTIMIZER} (bitsandbytes 8-bit AdamW)",
                        replace(workload, optimizer=EIGHT_BIT_OPTIMIZER), mode))
    if workload.task == "causal-lm" and workload.loss == "full":
        options.append(("loss", "a chunked linear cross-entropy (Liger's fused loss: no full "
                        "logits)", replace(workload, loss="chunked"), mode))
    trainer = workload.trainer
    if trainer is not None and trainer.can_precompute_reference(workload.adapter is not None):
        options.append(("reference", "precomputed reference log-probs (DPOConfig precompute_ref_log_probs: "
                        "no reference model nor forward in the step)",
                        replace(workload, trainer=replace(trainer, precompute_ref_log_probs=True)), mode))
        # a preference step takes no chunked loss (trainers.check_step): not offered, alone or together
        options = [option for option in options if _modelled(option[2])]
    return [option for option in options if _modelled(option[2], [option[3]])]


def adapter_levers(workload: Workload) -> list[tuple[str, str, Workload]]:
    """(name, label, workload) of each change of the PEFT setup that may raise the max batch: for a
    full fine-tune LoRA and QLoRA (r 16, PEFT's default modules: ``make_adapter``'s defaults); for
    LoRA (over a 16/32-bit or an 8-bit base) the same adapter over a 4-bit base, and half the rank;
    for QLoRA half the rank. Names as explain's levers name them (lora, qlora, lora-r8, qlora-r8,
    lora_8bit-r8)."""
    adapter = workload.adapter
    if adapter is None:
        lora, qlora = make_adapter("lora"), make_adapter("qlora")
        return [
            ("lora", f"LoRA r={DEFAULT_R} on PEFT's default modules", replace(workload, adapter=lora)),
            ("qlora", f"QLoRA r={DEFAULT_R} on PEFT's default modules, 4-bit "
             f"{qlora.quant_type.upper()} base, {RECIPE_NAMES[DEFAULT_QLORA_RECIPE]} recipe",
             replace(workload, adapter=qlora)),
        ]
    options: list[tuple[str, str, Workload]] = []
    if adapter.tuner != "lora":
        return options  # OFT (workload/oft.py): its rank and base are not LoRA's levers
    if adapter.base_bits != 4:
        recipe = adapter.recipe or DEFAULT_QLORA_RECIPE  # an 8-bit base's recipe prepares a 4-bit one too
        quantized = replace(adapter, method="qlora", recipe=recipe)
        options.append(("qlora", f"QLoRA r={adapter.r}: this LoRA over a 4-bit "
                        f"{quantized.quant_type.upper()} base, {RECIPE_NAMES[recipe]} recipe",
                        replace(workload, adapter=quantized)))
    if adapter.r > 1:
        lower = max(1, adapter.r // 2)
        name = {"qlora": "QLoRA", "lora_8bit": "LoRA over an 8-bit base"}.get(adapter.method, "LoRA")
        options.append((f"{adapter.method}-r{lower}", f"{name} r={lower}, half the rank",
                        replace(workload, adapter=replace(adapter, r=lower))))
    return options


def lever_searches(workload: Workload, mode: Mode, seq_len: int, gpu: GpuSpec) -> list[LeverSearch]:
    """The searches of the single levers of a cell: the step's own (candidate_levers), then the
    PEFT setup's (adapter_levers)."""
    return ([LeverSearch(name, label, changed, changed_mode, seq_len)
             for name, label, changed, changed_mode in candidate_levers(workload, mode, gpu)
             if _modelled(changed)]
            + [LeverSearch("adapter", label, changed, mode, seq_len)
               for _, label, changed in adapter_levers(workload) if _modelled(changed)]
            + [LeverSearch("gpus", label, changed, mode, seq_len)
               for label, changed in gpu_levers(workload) if _modelled(changed)])


def gpu_levers(workload: Workload) -> list[tuple[str, Workload]]:
    """(label, workload) of each change of a multi-GPU job's spread that may raise its per-GPU max
    batch: FSDP2 instead of DDP on the same GPUs; for FSDP2 resharding after forward, sharding over
    every GPU instead of a node's, and (on one node) twice the GPUs. None for a one-GPU job."""
    parallel = workload.parallel
    if parallel is None:
        return []
    if parallel.kind == DDP:
        fsdp = Parallel(FSDP, parallel.gpus)
        return [(f"parallel fsdp over the same {parallel.gpus} GPUs (FSDP2 full shard: parameters, "
                 "gradients and optimizer state split among them)", replace(workload, parallel=fsdp))]
    options = []
    if not parallel.reshard_after_forward:
        options.append(("reshard_after_forward (FULL_SHARD: each layer gathered again in backward)",
                        replace(workload, parallel=replace(parallel, reshard_after_forward=True))))
    if parallel.nodes > 1:
        options.append((f"full shard over all {parallel.gpus} GPUs instead of a node's {parallel.shard_size}",
                        replace(workload, parallel=replace(parallel, nodes=1))))
    if parallel.nodes == 1 and parallel.gpus * 2 <= MAX_GPUS:  # more nodes of a hybrid job: the same shards
        options.append((f"{parallel.gpus * 2} GPUs (twice the ranks: each holds half the shards)",
                        replace(workload, parallel=replace(parallel, gpus=parallel.gpus * 2))))
    return options


def _modelled(workload: Workload, modes: Sequence[Mode] = ()) -> bool:
    """Whether a lever's step is one the estimator models (a multi-GPU job's: check_sharded; a
    preference trainer's: trainers.check_step, which refuses a chunked loss and more GPUs; a compiled
    one's, in ``modes``: workload/compile.py check_compiled, which refuses checkpointing and more)."""
    from autotune.workload.compile import check_compiled

    try:
        check_compiled(workload, modes)
        check_sharded(workload.parallel, None if workload.adapter is None else workload.adapter.base_bits,
                      workload.optimizer, None if workload.adapter is None else workload.adapter.recipe)
        if workload.trainer is not None:
            check_step(workload.trainer, workload.task, loss=workload.loss, liger=workload.liger,
                       parallel=workload.parallel, images=workload.images)
    except InvalidInput:
        return False
    return True


def _all_together(workload: Workload, mode: Mode, seq_len: int, gpu: GpuSpec) -> LeverSearch | None:
    """The step's own levers at once (the lightest mode, every change of the workload); None where
    there are none."""
    options = candidate_levers(workload, mode, gpu)
    if not options:
        return None
    lightest = options[0][3]
    changes = {name: changed for name, _, changed, _ in options if changed != workload}
    together = replace(workload, optimizer=changes.get("optimizer", workload).optimizer,
                       loss=changes.get("loss", workload).loss,
                       trainer=changes.get("reference", workload).trainer)
    labels = [f"mode {lightest.name}"] + [label for _, label, changed, _ in options if changed != workload]
    return LeverSearch("combined", "all of: " + "; ".join(labels), together, lightest, seq_len)


def _all_together_over_4bit(together: LeverSearch | None, workload: Workload) -> LeverSearch | None:
    """``together`` (the step's own levers at once) over the 4-bit base adapter_levers offers (QLoRA
    for a full fine-tune or a LoRA); None where it offers none or there is nothing to add it to."""
    quantized = [(label, changed) for name, label, changed in adapter_levers(workload) if name == "qlora"]
    if together is None or not quantized:
        return None
    label, changed = quantized[0]
    return LeverSearch("combined", f"{together.label}; {label}",
                       replace(together.workload, adapter=changed.adapter), together.mode, together.seq_len)


# -- how a check searches them ----------------------------------------------------------------------


def lever_max(lever: LeverSearch, backend: Backend, *, budget: int, guess: int,
              max_batch: int = DEFAULT_MAX_BATCH) -> int | None:
    """The max batch of a lever's step; None where the backend cannot run it (e.g. bitsandbytes
    missing on a GPU machine, flash attention without 16-bit): such a lever is not advised."""
    try:
        return search_cell(runs_on(lever, backend), lever.workload, lever.mode, lever.seq_len, budget,
                           max_batch=max_batch, guess=guess).max_batch_size
    except AutotuneError:  # SearchError and ProbeError included
        return None


def helpful_levers(backend: Backend, workload: Workload, mode: Mode, seq_len: int, budget: int,
                   best: int, *, max_batch: int = DEFAULT_MAX_BATCH, run: LeverRunner | None = None,
                   ) -> list[Lever]:
    """The levers that raise this cell's max batch above ``best``, by the same backend's search
    (capped at ``max_batch``, as the cell's), best first. When none of the step's own levers does
    (a PEFT setup may) and nothing fits, those levers together, then half the length.

    ``run`` runs the searches of the single levers (lever_searches; default: one after the other
    here); each starts from four times ``best``."""
    search = partial(lever_max, budget=budget, guess=max(1, min(4 * best, max_batch)), max_batch=max_batch)
    searches = lever_searches(workload, mode, seq_len, backend.gpu)
    values = (run or in_order(backend))(searches, search)
    found = [Lever(lever.name, lever.label, value) for lever, value in zip(searches, values, strict=True)
             if value is not None and value > best]
    if best == 0 and all(lever.name == "adapter" for lever in found):
        found += _last_resort(backend, workload, mode, seq_len, search)
    return sorted(found, key=lambda lever: -lever.max_batch_size)


def _last_resort(backend: Backend, workload: Workload, mode: Mode, seq_len: int,
                 search: Callable[[LeverSearch, Backend], int | None]) -> list[Lever]:
    """Where nothing fits and none of the step's own levers alone lets batch 1 fit: all of them at
    once, else all of them over a 4-bit base (QLoRA with checkpointing: what fits an 8B model on a
    12 GiB card), else half the length; none where none does."""
    together = _all_together(workload, mode, seq_len, backend.gpu)
    tries = [together, _all_together_over_4bit(together, workload)]
    if seq_len > 1:
        if _holds_a_row(workload, seq_len // 2):
            tries.append(LeverSearch("seq_len", f"sequences of at most {seq_len // 2} tokens", workload, mode,
                                     seq_len // 2))
    for last in tries:
        if last is not None and (value := search(last, backend)) is not None and value > 0:
            return [Lever(last.name, last.label, value)]
    return []


def accumulation_plan(effective_batch: int, max_batch_size: int) -> tuple[int, int]:
    """(micro-batch, steps) reaching ``effective_batch`` with micro-batches that fit: the
    largest divisor of the effective batch that fits, else the max batch with enough steps."""
    divisors = [d for d in range(1, max_batch_size + 1) if effective_batch % d == 0]
    micro = max(divisors) if divisors else max_batch_size
    if micro * 2 < max_batch_size:  # a poor divisor (a prime effective batch): round up
        micro = max_batch_size
    return micro, -(-effective_batch // micro)


def suggestion(best: int, effective_batch: int, levers: list[Lever]) -> str:
    """What to do instead: accumulate micro-batches that fit, then the levers, best first."""
    parts = []
    if best >= 1:
        micro, steps = accumulation_plan(effective_batch, best)
        parts.append(f"use batch {micro} x {steps} accumulation steps for an effective "
                     f"{micro * steps}")
    parts.extend(f"{lever.label} (max {lever.max_batch_size})" for lever in levers)
    if not parts:
        return ("even batch 1 does not fit with any lever autotune models (16-bit autocast, "
                "checkpointing, 8-bit AdamW, chunked loss, LoRA / QLoRA): use a GPU with more memory")
    return ", or ".join(parts)


# -- which levers an explanation reports ------------------------------------------------------------


def _mode_levers(workload: Workload, mode: Mode, seq_len: int, backend: Backend) -> list[LeverSearch]:
    """The other autocast modes, checkpointing, and AMP with checkpointing from fp32."""
    found = []
    for precision, label in (("amp", "AMP fp16 (autocast float16 + GradScaler)"),
                             ("bf16", "bf16 (autocast bfloat16)")):
        if mode.precision != precision:
            found.append(LeverSearch(precision if not mode.checkpointing else f"{precision}+ckpt",
                                     label, workload, Mode(precision, mode.checkpointing),  # type: ignore[arg-type]
                                     seq_len, note=_bf16_note(backend) if precision == "bf16" else None))
    if not mode.checkpointing and not _fsdp_checkpointed(workload):
        found.append(LeverSearch("ckpt" if mode.precision == "fp32" else f"{mode.precision}+ckpt",
                                 "gradient checkpointing", workload, Mode(mode.precision, True), seq_len))
        if mode.precision == "fp32":
            found.append(LeverSearch("amp+ckpt", "AMP fp16 + gradient checkpointing", workload,
                                     Mode("amp", True), seq_len))
    return found


def _step_levers(workload: Workload, mode: Mode, seq_len: int, backend: Backend) -> list[LeverSearch]:
    """The 8-bit AdamW setups and SGD (for AdamW), frozen embeddings, the fused loss."""
    from autotune.backends.estimate.instrument import Variant, embedding_parameters

    # Embeddings that train (a PEFT setup freezes them): what the Trainer's 8-bit setup and the
    # frozen-embeddings lever change.
    has_embeddings = any(p.requires_grad for p in embedding_parameters(
        backend._model(workload).model))  # type: ignore[attr-defined]
    found = []
    if workload.optimizer in TORCH_ADAMW:
        found.append(LeverSearch("adamw-8bit", "8-bit AdamW (bitsandbytes AdamW8bit, every parameter)",
                                 workload, mode, seq_len, variant=Variant(optimizer="adamw-8bit"),
                                 estimated=EMULATED_8BIT))
        if has_embeddings:
            found.append(LeverSearch(
                "adamw-8bit-trainer", "8-bit AdamW as Trainer(optim='adamw_bnb_8bit') sets it up",
                workload, mode, seq_len, estimated=EMULATED_8BIT,
                variant=Variant(optimizer="adamw-8bit", fp32_state_for_embeddings=True),
                note="the Trainer keeps 32-bit state for every nn.Embedding weight",
            ))
        found.append(LeverSearch("sgd", "SGD instead of AdamW (no momentum: no optimizer state)",
                                 replace(workload, optimizer="sgd"), mode, seq_len))
    if has_embeddings:
        found.append(LeverSearch(
            "frozen-embeddings", "frozen embeddings (requires_grad=False on nn.Embedding)", workload, mode,
            seq_len, variant=Variant(freeze_embeddings=True),
            estimated="the table's step with the embeddings frozen",
        ))
    if workload.task in CHUNKED_TASKS and workload.loss == "full":
        found.append(LeverSearch(
            "fused-cross-entropy", "fused linear cross-entropy (chunked logits, as Liger Kernel)",
            replace(workload, loss="chunked"), mode, seq_len,
            note="Trainer(use_liger_kernel=True), or liger_kernel's LigerFusedLinearCrossEntropyLoss",
        ))
    trainer = workload.trainer
    if trainer is not None and trainer.can_precompute_reference(workload.adapter is not None):
        found.append(LeverSearch(
            "precompute-ref", "precomputed reference log-probs (no reference model nor forward)",
            replace(workload, trainer=replace(trainer, precompute_ref_log_probs=True)), mode, seq_len,
            note="DPOConfig(precompute_ref_log_probs=True): one no_grad pass over the data before training",
        ))
    return found


def explained_levers(workload: Workload, backend: Backend, *, seq_len: int, mode: Mode,
                     shorter_seq_lens: Sequence[int] | None = None, peft: bool = True) -> list[LeverSearch]:
    """Each lever that changes something from (workload, mode, seq_len), in the order an explanation
    reports them: the modes, the step's own changes, the PEFT setup's (with ``peft``), the shorter
    lengths (default: half the length)."""
    found = _mode_levers(workload, mode, seq_len, backend) + _step_levers(workload, mode, seq_len, backend)
    found += [LeverSearch(name, label, changed, mode, seq_len, adapter=True)
              for name, label, changed in (adapter_levers(workload) if peft else ())]
    # None the estimator refuses for a multi-GPU job (check_sharded: bitsandbytes' optimizers and
    # quantized bases under fsdp); the 8-bit AdamW variants are bitsandbytes' too.
    sharded = workload.parallel is not None and workload.parallel.kind == FSDP
    found = [lever for lever in found if _modelled(lever.workload, [lever.mode])
             and not (sharded and lever.variant is not None and lever.variant.optimizer is not None)]
    found += [LeverSearch(f"seq-{shorter}", f"max sequence length {shorter}", workload, mode, shorter)
              for shorter in sorted(set(shorter_seq_lens or [seq_len // 2]), reverse=True)
              if 1 <= shorter < seq_len and _holds_a_row(workload, shorter)]
    return found


def _bf16_note(backend: Backend) -> str | None:
    gpu = getattr(backend, "gpu", None)
    if gpu is None or not _lacks_bf16(gpu):
        return None
    major, minor = gpu.compute_capability
    return (f"{gpu.name} (sm{major}{minor}) has no bfloat16 tensor cores: transformers' Trainer "
            "refuses bf16=True there")


# -- how an explanation searches them ---------------------------------------------------------------


def what_if(
    workload: Workload, backend: Backend, *, seq_len: int, mode: Mode, budget: int, base_max: int,
    effective_batch: int | None = None, shorter_seq_lens: Sequence[int] | None = None,
    max_batch: int = DEFAULT_MAX_BATCH, real: Real8bit | None = None, peft: bool = True,
    run: LeverRunner | None = None,
) -> list[LeverReport]:
    """Each lever that changes something from (workload, mode, seq_len), with its max batch.

    ``real``: where the 8-bit levers are measured (real_8bit); None emulates them. ``peft``:
    with the levers that change the PEFT setup (adapter_levers). ``run`` runs the searches
    (default: one after the other here); the measured 8-bit levers run here, on the GPU.
    """
    planned = explained_levers(workload, backend, seq_len=seq_len, mode=mode,
                               shorter_seq_lens=shorter_seq_lens, peft=peft)
    # The measured 8-bit levers first, here (on this machine's GPU); the others by ``run``.
    measured = {} if real is None else {
        index: eight_bit_lever(lever.name, lever.label, lever.variant, backend=backend, workload=workload,
                               mode=mode, seq_len=seq_len, budget=budget, max_batch=max_batch, real=real,
                               note=lever.note)
        for index, lever in enumerate(planned) if lever.name in BNB_OPTIMIZERS and lever.variant is not None}
    searched = [lever for index, lever in enumerate(planned) if index not in measured]
    report = partial(report_lever, budget=budget, max_batch=max_batch)
    found = iter((run or in_order(backend))(searched, report))
    levers = [measured[index] if index in measured else next(found) for index in range(len(planned))]
    if effective_batch is not None:
        levers.append(_accumulation(effective_batch, base_max, mode, seq_len, workload.optimizer))
    return levers


def report_lever(lever: LeverSearch, backend: Backend, *, budget: int, max_batch: int) -> LeverReport:
    """The report of ``lever``, searched on ``backend`` (an EstimateBackend where the lever has a variant)."""
    report = search_lever(lever.name, lever.label, runs_on(lever, backend), lever.workload, lever.mode,
                          lever.seq_len, budget=budget, max_batch=max_batch, estimated=lever.estimated,
                          note=lever.note)
    return _with_adapter(report, lever.workload) if lever.adapter else report


def search_lever(name: str, label: str, target: Backend, workload: Workload, mode: Mode, seq_len: int, *,
                 budget: int, max_batch: int, estimated: str = AS_THE_TABLE,
                 note: str | None = None) -> LeverReport:
    """The lever's max batch, searched as the table searches a cell, on ``target``."""
    try:
        best = search_cell(target, workload, mode, seq_len, budget, max_batch=max_batch).max_batch_size
    except (InvalidInput, ProbeError) as exc:  # e.g. a model without gradient checkpointing
        return LeverReport(name, label, None, mode.name, seq_len, workload.optimizer, estimated,
                           error=str(exc))
    return LeverReport(name, label, best, mode.name, seq_len, workload.optimizer, estimated,
                       capped=best >= max_batch, note=note)


def eight_bit_lever(name: str, label: str, variant: Variant, *, backend: Backend, workload: Workload,
                    mode: Mode, seq_len: int, budget: int, max_batch: int, real: Real8bit | None,
                    note: str | None = None) -> LeverReport:
    """An 8-bit AdamW lever (``name``: a bnb.BNB_OPTIMIZERS setup): measured with bitsandbytes where
    ``real`` says how, else (or when that fails, as the note then says) emulated on ``backend``
    (an EstimateBackend) with ``variant`` (instrument.Variant)."""
    from autotune.backends.estimate.instrument import InstrumentedBackend

    if real is not None:
        if budget > real.gpu.total_memory_bytes:  # make_backend refuses a larger target too
            why = (f"the budget of {format_bytes(budget)} exceeds the local {real.gpu.name}'s "
                   f"{format_bytes(real.gpu.total_memory_bytes)}")
        else:
            try:
                best = search_cell(real.backend(name), workload, mode, seq_len, budget,
                                   max_batch=max_batch).max_batch_size
            except AutotuneError as exc:  # no worker, a probe that failed, no bitsandbytes there
                lines = str(exc).strip().splitlines()
                why = f"the measurement failed: {lines[0][:NOTE_CHARS] if lines else type(exc).__name__}"
            else:
                return LeverReport(name, label, best, mode.name, seq_len, workload.optimizer,
                                   f"measured: bitsandbytes {BNB_OPTIMIZERS[name]} on {real.gpu.name}",
                                   capped=best >= max_batch, note=note)
        fallback = f"not measured ({why}): emulated instead"
        note = f"{note}; {fallback}" if note else fallback
    return search_lever(name, label, InstrumentedBackend(backend, variant), workload, mode, seq_len,  # type: ignore[arg-type]
                        budget=budget, max_batch=max_batch, estimated=EMULATED_8BIT, note=note)


def _with_adapter(report: LeverReport, workload: Workload) -> LeverReport:
    """A PEFT lever with its adapter (settings, targets, parameter counts) and, as its note, the
    adapter's label; as it was where PEFT cannot build the setup (the lever's error says why)."""
    if report.error is not None:
        return report
    try:
        adapter = adapter_json(workload)
    except InvalidInput:
        return report
    return replace(report, adapter=adapter, note=adapter["label"] if adapter else report.note)


def _accumulation(effective: int, base_max: int, mode: Mode, seq_len: int, optimizer: str) -> LeverReport:
    label = f"gradient accumulation to an effective batch of {effective}"
    if base_max < 1:
        return LeverReport("accumulation", label, None, mode.name, seq_len, optimizer, AS_THE_TABLE,
                           error="even batch 1 does not fit: accumulation cannot help")
    micro, steps = accumulation_plan(effective, base_max)
    note = (f"batch {effective} fits without accumulation" if effective <= base_max else
            f"batch {micro} x {steps} accumulation steps = {micro * steps}")
    return LeverReport("accumulation", label, micro, mode.name, seq_len, optimizer, AS_THE_TABLE, note=note)


@dataclass(frozen=True)
class Real8bit:
    """Where the 8-bit levers are measured: a backend per BNB_OPTIMIZERS setup, on ``gpu``."""

    backend: Callable[[str], Backend]  # "adamw-8bit" | "adamw-8bit-trainer" -> a backend running it
    gpu: GpuSpec  # the local device that runs the probes


def real_8bit(target: GpuSpec) -> Real8bit | None:
    """The cuda backend with bitsandbytes' optimizers where this machine has a CUDA GPU and
    bitsandbytes; None elsewhere (the 8-bit levers are emulated). ``target``: the card of the budget."""
    from autotune.backends.cuda.device import cuda_available

    if not (cuda_available() and bnb.bitsandbytes_available()):
        return None
    from autotune.backends.cuda.backend import CudaBackend
    from autotune.backends.cuda.device import local_gpu

    return Real8bit(lambda name: CudaBackend(target, bnb_optimizer=name), local_gpu())


def _holds_a_row(workload: Workload, seq_len: int) -> bool:
    """Whether a shorter length still holds the step's row: a GRPO row's prompt beside its
    max_completion_length tokens (trainers.check_grpo_rows)."""
    trainer = workload.trainer
    return trainer is None or trainer.name not in GENERATIVE or seq_len > trainer.max_completion_length

