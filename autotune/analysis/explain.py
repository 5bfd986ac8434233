"""Where the memory of a training step goes, and why a batch does not fit.

``explain`` answers for one (model, seq_len, mode) on a target GPU, at a requested batch or at
the max batch of the cell (found as the table finds it, ``tuner.search_cell``):

- the breakdown of the peak: one instrumented trace of the step (instrument.py) replayed
  through the caching-allocator simulator; at the moment allocated memory peaks, every live
  block is put in one category (parameters, gradients, optimizer state, autocast weight copies,
  activations saved for backward, temporaries, the batch, cuBLAS workspaces), so the categories
  add up to the peak allocated exactly. The allocator's cached-but-unused blocks and the CUDA
  context (outside the allocator) complete the picture. With a PEFT adapter (LoRA, QLoRA) the
  parameters and buffers split into the frozen base, its 4-bit storage (the packed weights and
  the quantization state of each 4-bit layer; or an 8-bit base's int8 weights and row scales) and
  the adapter weights (what trains: LoRA's matrices and modules_to_save); the gradients and
  optimizer state are the adapters' alone; the temporaries of the emulated 4-bit matmul (nf4.py:
  the dequantized weight and absmax, in its forward and backward) or 8-bit matmul (int8.py: the
  input quantized, the int32 product, the weight dequantized for backward) get a category of
  their own;
- on a rank of a multi-GPU job (workload.parallel), every figure is one GPU's: the parameters,
  gradients and optimizer state are the rank's shards under fsdp (whole under ddp), and two
  categories join them: the parameters FSDP2 gathers whole (each layer's, while it runs; the tail's
  and the root's, kept gathered) and the communication buffers (FSDP2's all-gather and
  reduce-scatter buffers, DDP's gradient buckets); the budget leaves out NCCL's own buffers too;
- the modules holding the most parameters and the most activations, and flags for the outliers
  that caused real out-of-memory reports: a module holding more than a third of the parameters,
  an embedding whose vocabulary dwarfs the model, a linear layer over a flattened sequence, the
  float32 logits of a language model's loss as its largest activation;
- when even batch 1 does not fit, which part alone exceeds the budget;
- the levers (levers.py): the max batch under each change a user can make (the 8-bit AdamW
  levers measured with bitsandbytes on this machine's GPU where it has both);
- with the levers, the risks (risks.py): what could make a run of this step need more than the
  estimate on some runs and not others (eager attention, a longer batch, an earlier model left
  on the GPU, fragmentation, evaluation outputs kept), each with the max batch it leaves.

Estimate backend only: the breakdown needs the fake-tensor trace (the 8-bit measurement uses a
cuda backend of its own).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from autotune.backends import Backend
from autotune.backends.estimate.rank import COMMUNICATION_BUFFERS, GATHERED_PARAMETERS
from autotune.defaults import DEFAULT_MAX_BATCH
from autotune.errors import InvalidInput
from autotune.gpus import GpuSpec
from autotune.tuner import adapter_json, budget_bytes, images_json, parallel_json, search_cell, trainer_json
from autotune.units import format_bytes
from autotune.workload import Workload
from autotune.workload.adapters import BASE_BITS
from autotune.workload.compile import compile_warnings
from autotune.workload.models import check_seq_len
from autotune.workload.modes import Mode
from autotune.workload.optimizers import TORCH_ADAMW, optimizer_label
from autotune.workload.parallel import DDP, FSDP

if TYPE_CHECKING:
    from autotune.analysis.levers import LeverReport, LeverRunner
    from autotune.analysis.padding import PaddingReport
    from autotune.analysis.risks import Risk
    from autotune.backends.estimate.backend import EstimateBackend
    from autotune.backends.estimate.instrument import Recording

# Flags for outliers. The thresholds: a module holding more than a third of the
# parameters; an embedding holding more than half of them.
DOMINANT_SHARE = 1 / 3
EMBEDDING_SHARE = 1 / 2
# The largest vocabularies of common pretrained models are about 2**18 tokens (Gemma 3: 262,144;
# NLLB: 256,206; XLM-R: 250,002): beyond that, a tokenizer or label-encoding accident is likelier
# than a design (the TabBERT story: 867,813 tokens from one ID column).
HUGE_VOCAB = 2**18
TOP_MODULES = 10
TEMPORARY = "temporaries"  # instrument.TEMPORARY
WEIGHT_KINDS = ("parameters", "gradients", "optimizer_state", "autocast_copies")
# How a report names each category of the breakdown (instrument.CATEGORIES).
CATEGORY_LABELS = {
    "parameters": "parameters and buffers",
    "gradients": "gradients",
    "optimizer_state": "optimizer state",
    "autocast_copies": "autocast weight copies",
    "activations": "activations saved for backward",
    "temporaries": "temporaries",
    "inputs": "the batch (inputs, labels)",
    "workspaces": "cuBLAS workspaces",
}
# With a PEFT adapter, "parameters" splits into these three (in this order, where it stood), and
# the 4-bit matmul's temporaries follow the activations (see the module docstring).
FROZEN_BASE, BASE_4BIT, ADAPTER_WEIGHTS, DEQUANTIZATION = (
    "frozen_base", "base_4bit", "adapter_weights", "dequantization")
BASE_8BIT, INT8_MATMUL = "base_8bit", "int8_matmul"
# What a model and its optimizer hold between steps: an earlier copy of them left on the GPU
# (risks.py) takes this much.
HELD_CATEGORIES = ("parameters", FROZEN_BASE, BASE_4BIT, BASE_8BIT, ADAPTER_WEIGHTS, "optimizer_state")
# Per bits of a quantized base: its storage's category and its matmul temporaries' category.
BASE_CATEGORIES = {4: (BASE_4BIT, DEQUANTIZATION), 8: (BASE_8BIT, INT8_MATMUL)}
ADAPTER_CATEGORY_LABELS = {
    FROZEN_BASE: "frozen base (weights and buffers)",
    BASE_4BIT: "4-bit base ({quant} weights + quantization state)",
    ADAPTER_WEIGHTS: "adapter weights (trainable)",
    "gradients": "adapter gradients",
    "optimizer_state": "optimizer state (adapter weights only)",
    DEQUANTIZATION: "4-bit dequantization temporaries",  # and the casts of the 4-bit matmul
    BASE_8BIT: "8-bit base (int8 weights + row scales)",
    INT8_MATMUL: "8-bit matmul temporaries",  # the input quantized, the int32 product, casts
}
# A rank's own categories (estimate/rank.py), after the optimizer state: FSDP2 has both, DDP only
# its buckets; ZeRO's are not regions yet (none: the CLI says so).
RANK_KEYS = {FSDP: (GATHERED_PARAMETERS, COMMUNICATION_BUFFERS), DDP: (COMMUNICATION_BUFFERS,)}
RANK_CATEGORY_LABELS = {
    FSDP: {GATHERED_PARAMETERS: "gathered parameters (FSDP2 all-gathers)",
           COMMUNICATION_BUFFERS: "communication buffers (all-gather, reduce-scatter)"},
    DDP: {COMMUNICATION_BUFFERS: "communication buffers (DDP gradient buckets)"},
}
# What FSDP2 shards: each rank holds 1/shard_size of these (category_labels says so).
# (A 4- or 8-bit base is not modelled under fsdp: parallel.check_sharded.)
SHARDED_KEYS = ("parameters", FROZEN_BASE, ADAPTER_WEIGHTS, "gradients", "optimizer_state")
# How batch_one_reason names the adapter's categories in a sentence.
_ADAPTER_SHORT = {FROZEN_BASE: "frozen base", BASE_4BIT: "4-bit base", ADAPTER_WEIGHTS: "adapter weights",
                  DEQUANTIZATION: "4-bit dequantization temporaries"}
# How the activation table names what the loss keeps (the model's own forward outside any of its
# modules): the log-softmax of the float32 logits ([batch x seq, vocab], transformers' loss_utils
# upcasts them), or with loss "chunked" the gradients Liger's fused loss computes in its forward.
LOSS_LOGITS = "logits of the loss (float32)"
FUSED_GRADIENTS = "gradients of the fused loss (hidden states, head weight)"
LM_TASKS = ("causal-lm", "masked-lm")


@dataclass(frozen=True)
class Breakdown:
    """Allocated memory at the peak of the step, by category (allocator blocks, in bytes)."""

    batch_size: int
    peak_allocated_bytes: int  # == sum(categories.values())
    peak_step: int  # 1-based training step of the peak
    peak_phase: str  # "forward" | "backward" | "optimizer step" (or "setup")
    # instrument.CATEGORIES, in that order; with an adapter, "parameters" is frozen_base,
    # base_4bit (a 4-bit base only) and adapter_weights, and dequantization (a 4-bit base only)
    # follows "activations" (category_keys)
    categories: dict[str, int]
    demand_bytes: int  # the smallest capacity the step runs in (what the budget bounds)
    cached_bytes: int  # demand - peak allocated: blocks reserved but not in use at the peak
    context_bytes: int  # CUDA context, outside PyTorch's allocator
    budget_bytes: int
    fits: bool


@dataclass(frozen=True)
class ModuleParams:
    name: str  # "" is the model itself
    type: str
    description: str  # e.g. "Embedding(868000, 32)"
    shapes: list[tuple[int, ...]]  # of its own parameters
    params: int
    param_bytes: int
    share: float  # of all parameters


@dataclass(frozen=True)
class ModuleActivations:
    name: str
    type: str
    output_shape: tuple[int, ...] | None
    activation_bytes: int  # tensor bytes it allocated in the last forward, saved for backward
    share: float  # of all activations


@dataclass(frozen=True)
class Flag:
    kind: str  # "dominant-module" | "huge-vocabulary" | "flattened-sequence" | "loss-logits"
    module: str
    message: str


@dataclass
class Explanation:
    model: str
    task: str
    attn: str
    optimizer: str
    weights_dtype: str  # workload.weights_dtype: float32 | bfloat16 | float16
    loss: str  # workload.loss: "full" | "chunked"
    mode: str
    seq_len: int
    gpu_name: str
    gpu_memory_bytes: int
    budget_bytes: int
    margin: float
    max_batch_size: int  # of the cell; 0: even batch 1 does not fit
    capped: bool  # max_batch_size reached the search's limit
    requested_batch_size: int | None
    batch_size: int  # the batch the breakdown is for
    fits: bool  # at batch_size
    breakdown: Breakdown
    total_params: int
    top_parameters: list[ModuleParams]
    top_activations: list[ModuleActivations]
    flags: list[Flag]
    does_not_fit: str | None  # why even batch 1 does not fit, when it does not
    levers: list[LeverReport] = field(default_factory=list)
    # What could make a run of this step need more than the estimate (risks.py), with levers.
    risks: list[Risk] = field(default_factory=list)
    padding: PaddingReport | None = None
    # The PEFT adapter (tuner.adapter_json: settings, resolved targets, trainable and total
    # parameters as PEFT counts them, label); None for a full fine-tune.
    adapter: dict[str, Any] | None = None
    # With an adapter: tensor bytes of the parameters and buffers by category (frozen_base,
    # base_4bit, adapter_weights), before the allocator's rounding; None for a full fine-tune.
    weight_bytes: dict[str, int] | None = None
    # The SDPA kernel the step ran ("cuDNN", "memory-efficient", ...; attention.py); None without SDPA.
    attention_kernel: str | None = None
    # A multi-GPU job (tuner.parallel_json: kind, gpus, shard_size, label, nccl_bytes, ...), whose
    # rank 0 every figure is of; None for one GPU.
    parallel: dict[str, Any] | None = None
    # A vision-language model's images in every row (tuner.images_json); None: not image-text-to-text.
    images: dict[str, Any] | None = None
    # With activation offloading (workload/offload.py): the most pinned host memory its copies of the
    # saved activations held at batch_size; None without it.
    host_offload_bytes: int | None = None
    offload_streams: bool = True  # its use_streams (False: Axolotl's activation_offloading: legacy)
    # workload/compile.py compile_warnings: how a compiled step (torch_compile) was modelled; None: eager
    compiled: str | None = None
    # With an offload of the job's (FSDP2's CPU offload, ZeRO-Offload): the most host memory the rank
    # held (tracker.py's host ledger) at batch_size; None without one.
    host_memory_bytes: int | None = None
    # A preference trainer's step (tuner.trainer_json: the reference model, the rows per sample);
    # None: supervised fine-tuning.
    trainer: dict[str, Any] | None = None
    # A larger batch than the max that also fits, past max_batch_size + 1 which runs out of memory
    # (search.SearchResult.also_fits); None where none is known.
    also_fits: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def category_keys(adapter: bool, bits: int | None = None, parallel: str | None = None) -> tuple[str, ...]:
    """The breakdown's categories in order: instrument.CATEGORIES, or with an adapter "parameters"
    split, over a base of ``bits`` (4 or 8) its storage and matmul temporaries too; on a rank of a
    ``parallel`` job (ddp, fsdp) its own categories after the optimizer state (module docstring)."""
    from autotune.backends.estimate.instrument import CATEGORIES

    storage, matmul = BASE_CATEGORIES.get(bits or 0, (None, None))
    keys: list[str] = []
    for kind in CATEGORIES:
        if kind == "parameters" and adapter:
            keys += [FROZEN_BASE, *([storage] if storage else []), ADAPTER_WEIGHTS]
        else:
            keys.append(kind)
        if kind == "optimizer_state" and parallel is not None:
            keys += RANK_KEYS.get(parallel, ())
        if kind == "activations" and adapter and matmul:
            keys.append(matmul)
    return tuple(keys)


def category_labels(adapter: dict[str, Any] | None, parallel: dict[str, Any] | None = None) -> dict[str, str]:
    """How a report names each category of a breakdown, in its order: CATEGORY_LABELS for a full
    fine-tune; with ``adapter`` (Explanation.adapter) the adapter's split; on a rank of a
    ``parallel`` job (Explanation.parallel) its own categories, and under fsdp the shard of what
    FSDP2 shards."""
    kind = None if parallel is None else str(parallel["kind"])
    bits = None if adapter is None else BASE_BITS.get(str(adapter.get("method")))
    quant = "NF4" if adapter is None else str(adapter.get("quant_type") or "nf4").upper()
    labels = {**CATEGORY_LABELS, **(ADAPTER_CATEGORY_LABELS if adapter else {}),
              **(RANK_CATEGORY_LABELS.get(kind, {}) if kind else {})}
    named = {key: labels[key].format(quant=quant) for key in category_keys(adapter is not None, bits, kind)}
    if kind == FSDP:
        assert parallel is not None
        shard = f"1/{parallel['shard_size']} shard"
        named = {key: _sharded(key, label, shard) if key in SHARDED_KEYS else label
                 for key, label in named.items()}
    return named


def _sharded(key: str, label: str, shard: str) -> str:
    """``label`` saying that the rank holds ``shard`` ("1/4 shard") of it."""
    if key == "parameters":  # the buffers (rotary frequencies, norms' running stats) are whole
        return f"parameters ({shard}) and buffers"
    if label.endswith(")"):
        return f"{label[:-1]}; {shard})"
    return f"{label} ({shard})"


@dataclass(frozen=True)
class AdapterSplit:
    """How a PEFT model's allocations split (module docstring): the category of each parameter
    and buffer by name (those not named are the frozen base), and the allocations made inside
    the emulated 4- or 8-bit matmul (its temporaries, by allocation index)."""

    bits: int | None  # of a quantized base (4 or 8); None for a base in the weights' dtype
    groups: dict[str, str]  # parameter or buffer name -> BASE_4BIT | BASE_8BIT | ADAPTER_WEIGHTS
    dequantization: frozenset[int] = frozenset()

    def kind(self, index: int, allocation: Any) -> str:
        if allocation.kind == "parameters":
            return self.groups.get(allocation.param or "", FROZEN_BASE)
        if allocation.kind == TEMPORARY and index in self.dequantization:
            return BASE_CATEGORIES[self.bits or 4][1]
        return str(allocation.kind)


def adapter_groups(model: Any) -> dict[str, str]:
    """Parameter and buffer names of a PEFT model -> BASE_4BIT (the packed weight and the
    quantization state of every emulated 4-bit layer), BASE_8BIT (the int8 weight and row scales of
    every emulated 8-bit layer) or ADAPTER_WEIGHTS (every trainable parameter); the rest is the
    frozen base."""
    from autotune.backends.estimate.int8 import EmulatedLinear8bitLt
    from autotune.backends.estimate.nf4 import EmulatedLinear4bit

    groups: dict[str, str] = {}
    for name, module in model.named_modules():
        storage = BASE_4BIT if isinstance(module, EmulatedLinear4bit) else \
            BASE_8BIT if isinstance(module, EmulatedLinear8bitLt) else None
        if storage is not None:
            prefix = f"{name}." if name else ""
            groups[f"{prefix}weight"] = storage
            for buffer, _ in module.named_buffers(recurse=False):
                groups[f"{prefix}{buffer}"] = storage
    for name, p in model.named_parameters():
        if p.requires_grad:
            groups[name] = ADAPTER_WEIGHTS
    return groups


def weight_bytes(model: Any, groups: dict[str, str]) -> dict[str, int]:
    """Tensor bytes of a PEFT model's parameters and buffers by category (each storage once):
    frozen_base, base_4bit and adapter_weights, and base_8bit over an 8-bit base."""
    eight_bit = BASE_8BIT in groups.values()
    totals = dict.fromkeys((FROZEN_BASE, BASE_4BIT, *([BASE_8BIT] if eight_bit else []), ADAPTER_WEIGHTS), 0)
    seen: set[int] = set()
    for name, tensor in (*model.named_parameters(), *model.named_buffers()):
        if id(tensor) in seen:
            continue
        seen.add(id(tensor))
        totals[groups.get(name, FROZEN_BASE)] += tensor.numel() * tensor.element_size()
    return totals


# -- the 4-bit matmul's temporaries ----------------------------------------------------------------


def dequantization(recording: Recording, bits: int = 4) -> frozenset[int]:
    """Indices of the allocations made inside the emulated 4-bit matmul's forward and backward
    (the dequantized weight, the float32 absmax, casts), or the 8-bit one's (``bits`` 8: the input
    quantized, the int32 product, the weight dequantized), but for what it returns (the output, the
    input's gradient): those the recording tracker noted in nf4's or int8's allocation region."""
    from autotune.backends.estimate import int8, nf4

    region = int8.MATMUL_REGION if bits == 8 else nf4.MATMUL_REGION
    return frozenset(index for index, allocation in enumerate(recording.allocations)
                     if allocation.region == region)


# -- the breakdown ------------------------------------------------------------------------------


def breakdown_of(recording: Recording, gpu: GpuSpec, budget: int, demand_bytes: int, fits: bool,
                 split: AdapterSplit | None = None, parallel: str | None = None) -> Breakdown:
    """Categories of the live blocks when allocated memory peaks (the first such moment); with
    ``split`` (a PEFT model), the adapter's categories, and a ``parallel`` (ddp, fsdp) rank's own
    (category_keys)."""
    from autotune.backends.estimate.allocator import CachingAllocatorSim
    from autotune.backends.estimate.trace import Trace

    # Keyed by allocation index, in bytes (a CUDA reduction's recorded count turned into its buffer),
    # an allocation on another stream with its stream (trace.OnStream).
    events = Trace.from_events(recording.batch_size, recording.events, recording.workspaces).events()
    sim = CachingAllocatorSim()  # no limit: as accounting.replay finds the peak allocated
    handles: dict[int, int] = {}
    blocks: list[int] = []  # the allocator's block size of each allocation
    allocated = peak = 0
    peak_event = 0
    for position, event in enumerate(events):
        index, nbytes = event[0], event[1]
        if nbytes < 0:
            sim.free(handles.pop(index))
            allocated -= blocks[index]
            continue
        before = sim.stats.allocated_bytes
        handles[index] = sim.malloc(nbytes, *event[2:])
        blocks.append(sim.stats.allocated_bytes - before)  # rounded, or a whole unsplit block
        allocated += blocks[index]
        if allocated > peak:
            peak, peak_event = allocated, position
    live, at_peak = _live_at(events, peak_event)
    categories = dict.fromkeys(category_keys(split is not None, split.bits if split is not None else None,
                                             parallel), 0)
    for index in live:
        allocation = recording.allocations[index]
        categories[split.kind(index, allocation) if split else allocation.kind] += blocks[index]
    assert sum(categories.values()) == peak  # every live block is in exactly one category
    peak_allocation = recording.allocations[at_peak]
    return Breakdown(
        batch_size=recording.batch_size, peak_allocated_bytes=peak, peak_step=peak_allocation.step,
        peak_phase=peak_allocation.phase, categories=categories, demand_bytes=demand_bytes,
        cached_bytes=max(0, demand_bytes - peak), context_bytes=gpu.context_overhead_bytes,
        budget_bytes=budget, fits=fits,
    )


def _live_at(events: Sequence[tuple[int, ...]], last: int) -> tuple[set[int], int]:
    """Allocation indices alive after ``events[last]``, and the index ``events[last]`` made."""
    index_of: dict[int, int] = {}
    live: set[int] = set()
    count = 0
    for key, nbytes, *_stream in events[: last + 1]:
        if nbytes < 0:
            live.discard(index_of.pop(key))
        else:
            index_of[key] = count
            live.add(count)
            count += 1
    return live, count - 1


# -- modules and flags --------------------------------------------------------------------------


def describe_module(module: Any) -> str:
    """Short and with the sizes: "Linear(4096, 200)", "Embedding(868000, 32)", "LayerNorm((32,), ...)",
    "Linear4bit(4096, 200, nf4)"."""
    from torch import nn

    linear_4bit = _linear_4bit()
    if linear_4bit is not None and isinstance(module, linear_4bit):
        return f"Linear4bit({module.in_features}, {module.out_features}, {module.quant_type})"
    if isinstance(module, nn.Linear):
        return f"Linear({module.in_features}, {module.out_features})"
    if isinstance(module, nn.Embedding):
        return f"Embedding({module.num_embeddings}, {module.embedding_dim})"
    extra = module.extra_repr()
    return f"{type(module).__name__}({extra})" if extra else type(module).__name__


def _linear_4bit() -> Any:
    """nf4.EmulatedLinear4bit, where a 4-bit model may exist (nf4 is imported: it imports PEFT)."""
    import sys

    module = sys.modules.get("autotune.backends.estimate.nf4")
    return None if module is None else module.EmulatedLinear4bit


def parameter_table(model: Any) -> tuple[list[ModuleParams], int]:
    """Modules by the bytes of their own parameters (shared parameters count once), and the total.

    A 4-bit layer's packed weight counts as the weights it holds (in x out, as PEFT counts
    bitsandbytes' layers), its bytes with the quantization state (the layer's buffers)."""
    linear_4bit = _linear_4bit() or ()
    seen: set[int] = set()
    rows = []
    for name, module in model.named_modules():
        own = [p for p in module.parameters(recurse=False) if id(p) not in seen]
        seen.update(id(p) for p in own)
        if own:
            rows.append((name, module, own))

    def count(module: Any, p: Any) -> int:
        if isinstance(module, linear_4bit) and p is module.weight:
            return int(module.in_features * module.out_features)
        return int(p.numel())

    def nbytes(module: Any, own: list[Any]) -> int:
        tensors = [*own, *(module.buffers(recurse=False) if isinstance(module, linear_4bit) else ())]
        return sum(t.numel() * t.element_size() for t in tensors)

    total = sum(count(module, p) for _, module, own in rows for p in own)
    table = [
        ModuleParams(
            name=name, type=type(module).__name__, description=describe_module(module),
            shapes=[tuple(p.shape) for p in own], params=sum(count(module, p) for p in own),
            param_bytes=nbytes(module, own),
            share=sum(count(module, p) for p in own) / total if total else 0.0,
        )
        for name, module, own in rows
    ]
    table.sort(key=lambda row: (-row.param_bytes, module_order(row.name)))
    return table, total


def activation_table(recording: Recording, vocab: int | None = None, loss: str = "full",
                     lm: str = "") -> list[ModuleActivations]:
    """Modules by the activations they allocated in the last forward and autograd kept.

    ``vocab``: a language model's vocabulary; the loss's float32 logits then get a row of their
    own (LOSS_LOGITS), apart from the rest of what the model's forward allocated itself. ``lm``:
    the module whose forward computes the loss (lm_module: the model itself, or PEFT's base model).
    """
    per_module: dict[str, int] = defaultdict(int)
    logits_bytes = 0
    for allocation in recording.allocations:
        if allocation.kind == "activations" and allocation.step == recording.steps:
            if vocab is not None and _is_loss_logits(allocation, recording, vocab, lm):
                logits_bytes += allocation.nbytes
            else:
                per_module[allocation.module or ""] += allocation.nbytes
    total = sum(per_module.values()) + logits_bytes
    rows = []
    for name, nbytes in per_module.items():
        call = recording.calls.get(name)
        kind = call.type if call else FUSED_GRADIENTS if name == "" and loss == "chunked" else ""
        rows.append(ModuleActivations(
            name=name, type=kind, output_shape=call.output_shape if call else None,
            activation_bytes=nbytes, share=nbytes / total if total else 0.0,
        ))
    if logits_bytes and vocab is not None:
        rows.append(ModuleActivations(
            name="", type=LOSS_LOGITS, output_shape=(recording.batch_size, recording.seq_len, vocab),
            activation_bytes=logits_bytes, share=logits_bytes / total,
        ))
    rows.sort(key=lambda row: (-row.activation_bytes, module_order(row.name), row.type))
    return rows


def module_order(name: str) -> tuple[tuple[int, int | str], ...]:
    """A module name's place among its equals: its numbered parts as numbers (``layer.2`` before
    ``layer.10``), as the model defines its layers."""
    return tuple((0, int(part)) if part.isdigit() else (1, part) for part in name.split("."))


def _is_loss_logits(allocation: Any, recording: Recording, vocab: int, lm: str = "") -> bool:
    """A float32 [batch x seq, vocab] tensor the model's forward made itself (not a module's)."""
    return (allocation.module in ("", lm) and allocation.dtype == "float32" and bool(allocation.shape)
            and allocation.shape[-1] == vocab
            and math.prod(allocation.shape) == recording.batch_size * recording.seq_len * vocab)


def lm_module(model: Any) -> str:
    """The name of the module whose forward computes the model's loss: "" (the model itself), or
    for a PEFT model its base model's (``base_model.model``)."""
    if not hasattr(model, "get_base_model"):
        return ""
    base = model.get_base_model()
    return next((name for name, module in model.named_modules() if module is base), "")


def lm_vocab(model: Any, task: str) -> int | None:
    """The vocabulary of a language model's head (its logits' last dimension); None for other tasks."""
    if task not in LM_TASKS:
        return None
    head = model.get_output_embeddings()
    vocab = getattr(head, "out_features", None) or getattr(model.config, "vocab_size", None)
    return vocab if isinstance(vocab, int) else None


def logits_flag(activations: list[ModuleActivations], task: str) -> Flag | None:
    """The loss's float32 logits, when they are the largest activation (see activation_table)."""
    top = activations[0] if activations else None
    if top is None or top.type != LOSS_LOGITS or top.output_shape is None:
        return None
    batch, seq, vocab = top.output_shape
    hint = ("; a fused linear cross-entropy (loss 'chunked', as Liger Kernel's) never materializes "
            "them: see its lever") if task == "causal-lm" else ""
    return Flag("loss-logits", top.name,
                f"the logits of the loss (float32, [batch {batch}, seq {seq}, vocab {vocab:,}]) are the "
                f"largest activation: {format_bytes(top.activation_bytes)}, {top.share:.0%} of those "
                f"saved for backward, and their gradients take as much again in the backward{hint}")


def find_flags(model: Any, recording: Recording, seq_len: int, hidden: int | None,
               table: list[ModuleParams], total: int) -> list[Flag]:
    """The outliers of the issue: see the module docstring and the thresholds above."""
    from torch import nn

    modules = dict(model.named_modules())
    flags: list[Flag] = []
    for row in table:
        module = modules[row.name]
        specific = None
        if isinstance(module, nn.Embedding):
            specific = _embedding_flag(row, module, total)
        elif isinstance(module, nn.Linear):
            specific = _flattened_flag(row, module, recording, seq_len, hidden)
        if specific is not None:
            flags.append(specific)
        elif row.share > DOMINANT_SHARE:
            flags.append(Flag("dominant-module", row.name,
                              f"{_label(row.name)}: {row.description} holds {row.share:.0%} of the "
                              f"model's {total:,} parameters ({row.params:,})"))
    return flags


def _embedding_flag(row: ModuleParams, module: Any, total: int) -> Flag | None:
    vocab, width = module.num_embeddings, module.embedding_dim
    if row.share <= EMBEDDING_SHARE and vocab <= HUGE_VOCAB:
        return None
    trains = any(p.requires_grad for p in module.parameters(recurse=False))
    hint = ("larger than any common pretrained vocabulary: check the tokenizer or the label encoding "
            "that grew it") if vocab > HUGE_VOCAB else \
        "its gradients and optimizer state dominate too: see the frozen-embeddings and 8-bit levers" \
        if trains else "frozen (no gradients, no optimizer state): its weights alone take their share"
    return Flag("huge-vocabulary", row.name,
                f"{_label(row.name)}: a vocabulary of {vocab:,} tokens x {width} holds {row.share:.0%} "
                f"of the model's {total:,} parameters ({row.params:,} = {vocab:,} x {width}); {hint}")


def _flattened_flag(row: ModuleParams, module: Any, recording: Recording, seq_len: int,
                    hidden: int | None) -> Flag | None:
    """A linear layer whose input is the sequence flattened: in_features = k x seq_len x hidden."""
    width = module.in_features
    if hidden is None or seq_len < 2 or width < seq_len * hidden or width % (seq_len * hidden):
        return None
    call = recording.calls.get(row.name)
    if call is not None and call.input_shape is not None and len(call.input_shape) != 2:
        return None  # applied per token, not to a flattened sequence
    k = width // (seq_len * hidden)
    factors = f"{k} x " if k > 1 else ""
    return Flag("flattened-sequence", row.name,
                f"{_label(row.name)}: {row.description} takes the whole sequence flattened (in_features "
                f"{width:,} = {factors}seq_len {seq_len} x hidden {hidden}): {row.params:,} parameters "
                f"({row.share:.0%}) that grow with the sequence length; a per-token head "
                f"(Linear({hidden}, n)) or a pooled sequence needs {hidden} x n")


def _label(name: str) -> str:
    return name or "(the model itself)"


# -- why batch 1 does not fit ---------------------------------------------------------------------


def weight_state(recording: Recording) -> dict[str, dict[str, int]]:
    """Per parameter: tensor bytes of itself, its gradient, optimizer state and autocast copies
    (the largest of any one step)."""
    per_step: dict[tuple[str, str, int], int] = defaultdict(int)
    for allocation in recording.allocations:
        if allocation.param is not None and allocation.kind in WEIGHT_KINDS:
            per_step[(allocation.param, allocation.kind, allocation.step)] += allocation.nbytes
    state: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(WEIGHT_KINDS, 0))
    for (param, kind, _), nbytes in per_step.items():
        state[param][kind] = max(state[param][kind], nbytes)
    return dict(state)


def _owner(param: str) -> str:
    return param.rsplit(".", 1)[0] if "." in param else ""


def batch_one_reason(breakdown: Breakdown, recording: Recording, table: list[ModuleParams],
                     optimizer: str, adapter: bool = False) -> str:
    """Which part alone exceeds the budget at batch 1 (module docstring)."""
    budget = breakdown.budget_bytes
    state = weight_state(recording)
    per_module: dict[str, int] = defaultdict(int)
    for param, kinds in state.items():
        per_module[_owner(param)] += sum(kinds[k] for k in ("parameters", "gradients", "optimizer_state"))
    static = sum(per_module.values())
    rows = {row.name: row for row in table}
    top = max(per_module, key=lambda name: per_module[name]) if per_module else None
    what = (f"weights (frozen base and adapters), adapter gradients and {optimizer} state" if adapter
            else f"parameters, gradients and {optimizer} state")
    head = f"even batch 1 does not fit in the {format_bytes(budget)} budget"
    about_top = ""
    if top is not None and top in rows and static and per_module[top] / static > DOMINANT_SHARE:
        row = rows[top]
        if per_module[top] > budget:
            return (f"{head}: the {what} of {_label(top)} ({row.description}, {row.params:,} "
                    f"parameters) alone take {format_bytes(per_module[top])}")
        about_top = (f"{_label(top)} ({row.description}, {row.params:,} parameters) accounts for "
                     f"{format_bytes(per_module[top])} of the {what}")
    if static > budget:
        return f"{head}: the {what} alone take {format_bytes(static)}" + \
            (f"; {about_top}" if about_top else "")
    parts = sorted(((n, k) for k, n in breakdown.categories.items() if n), reverse=True)
    chosen, running = [], 0
    for nbytes, kind in parts:
        chosen.append(f"{_ADAPTER_SHORT.get(kind, kind.replace('_', ' '))} {format_bytes(nbytes)}")
        running += nbytes
        if running > budget:
            break
    where = f"at its peak (the {breakdown.peak_phase} of step {breakdown.peak_step})"
    if running > budget:
        text = f"{head}: {where}, {' + '.join(chosen)} = {format_bytes(running)}"
    else:
        text = (f"{head}: {where} the step allocates {format_bytes(breakdown.peak_allocated_bytes)} "
                f"and needs {format_bytes(breakdown.demand_bytes)} with the allocator's rounding "
                "and cached blocks")
    return text + (f"; {about_top}" if about_top else "")


# -- the whole explanation --------------------------------------------------------------------------


def explain(
    workload: Workload, backend: Backend, gpu: GpuSpec, *, seq_len: int, mode: Mode,
    margin: float, batch_size: int | None = None, lengths: Sequence[int] | None = None,
    with_levers: bool = True, max_batch: int = DEFAULT_MAX_BATCH, measure_8bit: bool = True,
    run_levers: LeverRunner | None = None,
) -> Explanation:
    """The breakdown at ``batch_size`` (default: the cell's max batch), modules, flags, levers.

    ``measure_8bit``: measure the 8-bit AdamW levers on this machine's GPU where it has one and
    bitsandbytes (levers.real_8bit); False, or elsewhere, emulates them. ``run_levers``: how the
    levers' searches run (levers.what_if; parallel.lever_runner over the cores).
    """
    from autotune.backends.estimate.backend import EstimateBackend

    if not isinstance(backend, EstimateBackend):
        raise InvalidInput(f"explain needs the estimate backend, not {backend.name!r}: "
                           "use backend 'estimate'")
    check_seq_len(workload.model, seq_len)
    if batch_size is not None and batch_size < 1:
        raise InvalidInput(f"batch size {batch_size} must be at least 1")
    budget = budget_bytes(gpu, margin, workload.parallel, workload.trainer)  # NCCL's, vLLM's off it
    found = search_cell(backend, workload, mode, seq_len, budget, max_batch=max_batch)
    best = found.max_batch_size
    explanation = _explanation(workload, backend, gpu, seq_len=seq_len, mode=mode, margin=margin,
                               budget=budget, best=best, capped=best >= max_batch, batch_size=batch_size)
    explanation.also_fits = found.also_fits
    if with_levers:
        explanation.levers = _what_if(workload, backend, gpu, seq_len=seq_len, mode=mode, budget=budget,
                                      best=best, batch_size=batch_size, lengths=lengths, max_batch=max_batch,
                                      measure_8bit=measure_8bit, run_levers=run_levers)
        if best:
            explanation.risks = _risks(workload, backend, explanation, mode=mode, budget=budget,
                                       max_batch=max_batch)
    if lengths:
        from autotune.analysis.padding import dynamic_padding

        explanation.padding = dynamic_padding(
            workload, backend, lengths, seq_len=seq_len, mode=mode, budget=budget,
            fixed_max=best, max_batch=max_batch,
        )
    return explanation


def _explanation(workload: Workload, backend: EstimateBackend, gpu: GpuSpec, *, seq_len: int, mode: Mode,
                 margin: float, budget: int, best: int, capped: bool, batch_size: int | None) -> Explanation:
    """The explanation of the step at ``batch_size`` (default: the cell's max batch ``best``; 1 where
    even batch 1 does not fit) from one instrumented trace, without its levers and padding."""
    from autotune.backends.estimate.instrument import InstrumentedBackend

    at = 1 if best == 0 else batch_size or best
    model = backend._model(workload, mode.precision).model  # FSDP2's is sharded per precision
    instrumented = InstrumentedBackend(backend, trace_bound=True)  # batch 1 of a model too big: traced
    bits = workload.adapter.base_bits if workload.adapter is not None else None
    with instrumented.cell(workload, mode, seq_len, budget) as cell:
        probe = cell.fits(at)
    recording = instrumented.last
    assert recording is not None and recording.batch_size == at
    split = groups = None
    if workload.adapter is not None:
        groups = adapter_groups(model)
        split = AdapterSplit(bits, groups, dequantization(recording, bits) if bits else frozenset())
    parallel = None if workload.parallel is None else workload.parallel.kind
    breakdown = breakdown_of(recording, gpu, budget, probe.details["demand_bytes"],
                             probe.outcome == "fits", split, parallel)
    table, total = parameter_table(model)
    hidden = getattr(model.config, "hidden_size", None)
    activations = activation_table(recording, lm_vocab(model, workload.task), workload.loss,
                                   lm_module(model))
    flag = logits_flag(activations, workload.task)
    return Explanation(
        model=workload.model.name, task=workload.task, attn=backend.attn_used(workload),
        optimizer=workload.optimizer, weights_dtype=workload.weights_dtype, loss=workload.loss,
        mode=mode.name, seq_len=seq_len, gpu_name=gpu.name,
        gpu_memory_bytes=gpu.total_memory_bytes, budget_bytes=budget, margin=margin,
        max_batch_size=best, capped=capped, requested_batch_size=batch_size,
        batch_size=at, fits=probe.outcome == "fits", breakdown=breakdown, total_params=total,
        top_parameters=table[:TOP_MODULES], top_activations=activations[:TOP_MODULES],
        flags=find_flags(model, recording, seq_len, hidden if isinstance(hidden, int) else None,
                         table, total) + ([flag] if flag else []),
        does_not_fit=None if best else batch_one_reason(
            breakdown, recording, table, optimizer_label(workload.optimizer), workload.adapter is not None),
        adapter=adapter_json(workload),
        weight_bytes=None if groups is None else weight_bytes(model, groups),
        attention_kernel=probe.details.get("attention"),
        parallel=parallel_json(workload, gpu),
        images=images_json(workload),
        host_offload_bytes=recording.host_offload_bytes if workload.offload_activations else None,
        offload_streams=workload.offload_streams,
        compiled=next(iter(compile_warnings(workload)), None),
        host_memory_bytes=probe.details.get("host_bytes"),
        trainer=_grpo_phases(_trainer_json(workload, backend._model(workload, mode.precision).reference, gpu),
                             workload, backend, mode, seq_len, at),
    )


def _risks(workload: Workload, backend: EstimateBackend, explanation: Explanation, *, mode: Mode,
           budget: int, max_batch: int) -> list[Risk]:
    """What could make a run of the explained step need more than its estimate (risks.py)."""
    from autotune.analysis.risks import risks

    model = backend._model(workload, mode.precision).model
    categories = explanation.breakdown.categories
    return risks(workload, backend, seq_len=explanation.seq_len, mode=mode, budget=budget,
                 batch_size=explanation.batch_size, best=explanation.max_batch_size,
                 held=sum(categories.get(key, 0) for key in HELD_CATEGORIES),
                 cached=explanation.breakdown.cached_bytes, vocab=lm_vocab(model, workload.task),
                 model=model, max_batch=max_batch)


def _grpo_phases(found: dict[str, Any] | None, workload: Workload, backend: EstimateBackend, mode: Mode,
                 seq_len: int, batch_size: int) -> dict[str, Any] | None:
    """A GRPO step's two phases at ``batch_size`` (backends/estimate/phases.py): the generation's
    and the training step's peak allocated bytes, and the generation's KV cache (every row of the
    generation batch at prompt + completion - 1 tokens)."""
    if found is None or "grpo" not in found or batch_size < 1:
        return found
    from autotune.backends.estimate.phases import phase_peaks
    from autotune.workload.grpo import GENERATION, TRAINING, cache_bytes, generation_rows

    trainer = workload.trainer
    assert trainer is not None
    peaks = phase_peaks(backend, workload, mode, seq_len, batch_size)
    dtype_bytes = 4 if mode.autocast_dtype_name is None and workload.weights_dtype == "float32" else 2
    found["grpo"].update({
        "generation_peak_allocated_bytes": peaks.peaks.get(GENERATION),
        "training_peak_allocated_bytes": peaks.peaks.get(TRAINING),
        "generation_cache_bytes": 0 if trainer.vllm_mode is not None else cache_bytes(
            workload.model.config, generation_rows(trainer, batch_size), seq_len - 1, dtype_bytes),
        "generation_rows": generation_rows(trainer, batch_size)})
    return found


def _trainer_json(workload: Workload, reference: Any, gpu: GpuSpec) -> dict[str, Any] | None:
    """tuner.trainer_json, with the bytes of a DPO reference model's weights (a frozen copy, counted
    in the parameters and buffers) where there is one."""
    found = trainer_json(workload, gpu)
    if found is not None and reference is not None:
        tensors = [*reference.parameters(), *reference.buffers()]
        found["reference_weight_bytes"] = sum(t.untyped_storage().nbytes() for t in tensors)
    return found


def _what_if(workload: Workload, backend: EstimateBackend, gpu: GpuSpec, *, seq_len: int, mode: Mode,
             budget: int, best: int, batch_size: int | None, lengths: Sequence[int] | None, max_batch: int,
             measure_8bit: bool, run_levers: LeverRunner | None) -> list[LeverReport]:
    """The explanation's levers (levers.what_if): with half the length and, given the data's
    ``lengths``, the length that covers 99% of them as shorter maxima."""
    from autotune.analysis.levers import real_8bit, what_if
    from autotune.analysis.padding import length_stats, padded_length

    shorter = [seq_len // 2]
    if lengths:
        shorter.append(padded_length(length_stats(lengths, seq_len).p99, seq_len))
    if workload.trainer is not None:  # a GRPO row holds a prompt beside max_completion_length tokens
        shorter = [n for n in shorter if n > workload.trainer.max_completion_length]
    return what_if(
        workload, backend, seq_len=seq_len, mode=mode, budget=budget, base_max=best,
        effective_batch=batch_size, shorter_seq_lens=shorter, max_batch=max_batch,
        real=real_8bit(gpu) if measure_8bit and workload.optimizer in TORCH_ADAMW else None,
        run=run_levers,
    )
