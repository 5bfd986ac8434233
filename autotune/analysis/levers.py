"""What would fit: the max batch under each change a user can make, and dynamic padding.

Every lever is a max batch for the same model, sequence and GPU, searched as the table searches a
cell (``tuner.search_cell`` on the same backend), so a lever that is a table mode (amp, bf16, ckpt,
amp+ckpt) or a table option (``--optimizer sgd``, another sequence length) gives the table's
number. Levers the table has no column for change the step itself (instrument.Variant) and are
searched the same way on an ``InstrumentedBackend``:

- 8-bit AdamW: once with every parameter at 8 bits (``bnb.optim.AdamW8bit`` used directly) and
  once as transformers' Trainer sets it up (``optim="adamw_bnb_8bit"``: embeddings keep 32-bit
  state). Where this machine has a CUDA GPU and bitsandbytes (bnb.real_8bit), both are measured:
  the cuda backend runs the step with bitsandbytes' own optimizer (bnb.py) at the same budget,
  one worker per cell as for a table. Elsewhere, or when the measurement fails (the lever's note
  says why), bitsandbytes' state sizes are emulated on the estimator (optimizers.BnbAdamWState).
- frozen embeddings: ``requires_grad=False`` on every ``nn.Embedding`` parameter (with tied
  weights, the output projection tied to them freezes too, as it does in training).
- fused linear cross-entropy (causal LMs with the model's own loss): the step with loss
  "chunked" (workload/loss.py), Liger Kernel's chunked logits, as ``Trainer(use_liger_kernel=True)``
  runs it; a workload option (``loss``), so the lever gives the table's number for it.
- PEFT (check.adapter_levers): for a full fine-tune LoRA and QLoRA at r 16 on PEFT's default
  modules; for LoRA the same adapter over a 4-bit base (QLoRA) and half the rank; for QLoRA half
  the rank. A workload option (``adapter``), searched as the table searches it; a setup PEFT
  cannot build for the model (e.g. a quantized classification head) is the lever's error.

Gradient accumulation needs no search: the largest micro-batch that divides the effective batch
and fits (check.accumulation_plan). Dynamic padding (``dynamic_padding``): given the token lengths
of a data set (``read_lengths``, or ``lengths_from_texts`` from a column of texts and a local
tokenizer), the max batch of each length bucket against fixed padding to ``seq_len``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from autotune.analysis.check import accumulation_plan, adapter_levers
from autotune.backends import Backend
from autotune.backends.cuda import bnb
from autotune.backends.cuda.bnb import BNB_OPTIMIZERS
from autotune.defaults import DEFAULT_MAX_BATCH
from autotune.errors import AutotuneError, InvalidInput, ProbeError
from autotune.gpus import GpuSpec
from autotune.tuner import search_cell
from autotune.units import format_bytes
from autotune.workload import Workload
from autotune.workload.loss import CHUNKED_TASKS
from autotune.workload.modes import Mode
from autotune.workload.optimizers import TORCH_ADAMW

if TYPE_CHECKING:
    from autotune.backends.estimate.instrument import Variant

AS_THE_TABLE = "as the table"
EMULATED_8BIT = "emulated: bitsandbytes' 8-bit state sizes"
NOTE_CHARS = 300  # of a failed measurement's message, in a lever's note


@dataclass(frozen=True)
class Lever:
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


@dataclass(frozen=True)
class LeverJob:
    """One lever's search, as ``run_lever_job`` runs it on an estimator (here or in a worker
    process, parallel.explain_levers): the changed step, on the estimator itself or instrumented
    with ``variant``."""

    name: str
    label: str
    workload: Workload
    mode: Mode
    seq_len: int
    variant: Variant | None = None  # a change the table has no column for (instrument.Variant)
    estimated: str = AS_THE_TABLE
    note: str | None = None
    adapter: bool = False  # a PEFT lever: it carries its adapter (_adapter_lever)


# Runs lever jobs (jobs, budget, max_batch) -> their levers, in order; parallel.explain_levers shares
# them out over processes.
LeverRunner = Callable[[Sequence[LeverJob], int, int], list[Lever]]


def run_lever_job(job: LeverJob, backend: Backend, *, budget: int, max_batch: int) -> Lever:
    """The lever of ``job``, searched on ``backend`` (an EstimateBackend where ``job.variant`` is set)."""
    from autotune.backends.estimate.instrument import InstrumentedBackend

    target = backend if job.variant is None else InstrumentedBackend(backend, job.variant)  # type: ignore[arg-type]
    lever = search_lever(job.name, job.label, target, job.workload, job.mode, job.seq_len, budget=budget,
                         max_batch=max_batch, estimated=job.estimated, note=job.note)
    return _adapter_lever(lever, job.workload) if job.adapter else lever


def what_if(
    workload: Workload, backend: Backend, *, seq_len: int, mode: Mode, budget: int, base_max: int,
    effective_batch: int | None = None, shorter_seq_lens: Sequence[int] | None = None,
    max_batch: int = DEFAULT_MAX_BATCH, real: Real8bit | None = None, peft: bool = True,
    run: LeverRunner | None = None,
) -> list[Lever]:
    """Each lever that changes something from (workload, mode, seq_len), with its max batch.

    ``real``: where the 8-bit levers are measured (bnb.real_8bit); None emulates them. ``peft``:
    with the levers that change the PEFT setup (check.adapter_levers). ``run`` runs the searches
    (default: one after the other here); the measured 8-bit levers run here, on the GPU.
    """
    from autotune.backends.estimate.instrument import Variant, embedding_parameters

    def eight_bit(name: str, label: str, variant: Variant, note: str | None = None) -> LeverJob | Lever:
        if real is None:
            return LeverJob(name, label, workload, mode, seq_len, variant=variant, estimated=EMULATED_8BIT,
                       note=note)
        return eight_bit_lever(name, label, variant, backend=backend, workload=workload, mode=mode,
                               seq_len=seq_len, budget=budget, max_batch=max_batch, real=real, note=note)

    planned: list[LeverJob | Lever] = []
    for precision, label in (("amp", "AMP fp16 (autocast float16 + GradScaler)"),
                             ("bf16", "bf16 (autocast bfloat16)")):
        if mode.precision != precision:
            planned.append(LeverJob(precision if not mode.checkpointing else f"{precision}+ckpt",
                               label, workload, Mode(precision, mode.checkpointing),  # type: ignore[arg-type]
                               seq_len, note=_bf16_note(backend) if precision == "bf16" else None))
    if not mode.checkpointing:
        planned.append(LeverJob("ckpt" if mode.precision == "fp32" else f"{mode.precision}+ckpt",
                           "gradient checkpointing", workload, Mode(mode.precision, True), seq_len))
        if mode.precision == "fp32":
            planned.append(LeverJob("amp+ckpt", "AMP fp16 + gradient checkpointing", workload,
                               Mode("amp", True), seq_len))
    # Embeddings that train (a PEFT setup freezes them): what the Trainer's 8-bit setup and the
    # frozen-embeddings lever change.
    has_embeddings = any(p.requires_grad for p in embedding_parameters(
        backend._model(workload).model))  # type: ignore[attr-defined]
    if workload.optimizer in TORCH_ADAMW:
        planned.append(eight_bit("adamw-8bit", "8-bit AdamW (bitsandbytes AdamW8bit, every parameter)",
                                 Variant(optimizer="adamw-8bit")))
        if has_embeddings:
            planned.append(eight_bit(
                "adamw-8bit-trainer", "8-bit AdamW as Trainer(optim='adamw_bnb_8bit') sets it up",
                Variant(optimizer="adamw-8bit", fp32_state_for_embeddings=True),
                note="the Trainer keeps 32-bit state for every nn.Embedding weight",
            ))
        planned.append(LeverJob("sgd", "SGD instead of AdamW (no momentum: no optimizer state)",
                           replace(workload, optimizer="sgd"), mode, seq_len))
    if has_embeddings:
        planned.append(LeverJob(
            "frozen-embeddings", "frozen embeddings (requires_grad=False on nn.Embedding)", workload, mode,
            seq_len, variant=Variant(freeze_embeddings=True),
            estimated="the table's step with the embeddings frozen",
        ))
    if workload.task in CHUNKED_TASKS and workload.loss == "full":
        planned.append(LeverJob(
            "fused-cross-entropy", "fused linear cross-entropy (chunked logits, as Liger Kernel)",
            replace(workload, loss="chunked"), mode, seq_len,
            note="Trainer(use_liger_kernel=True), or liger_kernel's LigerFusedLinearCrossEntropyLoss",
        ))
    for name, label, changed in adapter_levers(workload) if peft else ():
        planned.append(LeverJob(name, label, changed, mode, seq_len, adapter=True))
    for shorter in sorted(set(shorter_seq_lens or [seq_len // 2]), reverse=True):
        if 1 <= shorter < seq_len:
            planned.append(LeverJob(f"seq-{shorter}", f"max sequence length {shorter}", workload, mode,
                                    shorter))
    jobs = [entry for entry in planned if isinstance(entry, LeverJob)]
    found = iter((run or _one_after_another(backend))(jobs, budget, max_batch))
    levers = [next(found) if isinstance(entry, LeverJob) else entry for entry in planned]
    if effective_batch is not None:
        levers.append(_accumulation(effective_batch, base_max, mode, seq_len, workload.optimizer))
    return levers


def _one_after_another(backend: Backend) -> LeverRunner:
    def run(jobs: Sequence[LeverJob], budget: int, max_batch: int) -> list[Lever]:
        return [run_lever_job(job, backend, budget=budget, max_batch=max_batch) for job in jobs]

    return run


def search_lever(name: str, label: str, target: Backend, workload: Workload, mode: Mode, seq_len: int, *,
                 budget: int, max_batch: int, estimated: str = AS_THE_TABLE,
                 note: str | None = None) -> Lever:
    """The lever's max batch, searched as the table searches a cell, on ``target``."""
    try:
        best = search_cell(target, workload, mode, seq_len, budget, max_batch=max_batch).max_batch_size
    except (InvalidInput, ProbeError) as exc:  # e.g. a model without gradient checkpointing
        return Lever(name, label, None, mode.name, seq_len, workload.optimizer, estimated, error=str(exc))
    return Lever(name, label, best, mode.name, seq_len, workload.optimizer, estimated,
                 capped=best >= max_batch, note=note)


def eight_bit_lever(name: str, label: str, variant: Variant, *, backend: Backend, workload: Workload,
                    mode: Mode, seq_len: int, budget: int, max_batch: int, real: Real8bit | None,
                    note: str | None = None) -> Lever:
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
                return Lever(name, label, best, mode.name, seq_len, workload.optimizer,
                             f"measured: bitsandbytes {BNB_OPTIMIZERS[name]} on {real.gpu.name}",
                             capped=best >= max_batch, note=note)
        fallback = f"not measured ({why}): emulated instead"
        note = f"{note}; {fallback}" if note else fallback
    return search_lever(name, label, InstrumentedBackend(backend, variant), workload, mode, seq_len,  # type: ignore[arg-type]
                        budget=budget, max_batch=max_batch, estimated=EMULATED_8BIT, note=note)


def _adapter_lever(lever: Lever, workload: Workload) -> Lever:
    """A PEFT lever with its adapter (settings, targets, parameter counts) and, as its note, the
    adapter's label; as it was where PEFT cannot build the setup (the lever's error says why)."""
    from autotune.tuner import adapter_json

    if lever.error is not None:
        return lever
    try:
        adapter = adapter_json(workload)
    except InvalidInput:
        return lever
    return replace(lever, adapter=adapter, note=adapter["label"] if adapter else lever.note)


def _bf16_note(backend: Backend) -> str | None:
    gpu = getattr(backend, "gpu", None)
    if gpu is None or gpu.compute_capability is None or gpu.supports_bf16:
        return None
    major, minor = gpu.compute_capability
    return (f"{gpu.name} (sm{major}{minor}) has no bfloat16 tensor cores: transformers' Trainer "
            "refuses bf16=True there")


def _accumulation(effective: int, base_max: int, mode: Mode, seq_len: int, optimizer: str) -> Lever:
    label = f"gradient accumulation to an effective batch of {effective}"
    if base_max < 1:
        return Lever("accumulation", label, None, mode.name, seq_len, optimizer, AS_THE_TABLE,
                     error="even batch 1 does not fit: accumulation cannot help")
    micro, steps = accumulation_plan(effective, base_max)
    note = (f"batch {effective} fits without accumulation" if effective <= base_max else
            f"batch {micro} x {steps} accumulation steps = {micro * steps}")
    return Lever("accumulation", label, micro, mode.name, seq_len, optimizer, AS_THE_TABLE, note=note)


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
