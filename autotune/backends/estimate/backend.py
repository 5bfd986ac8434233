"""The ``estimate`` backend: the training step on fake tensors, accounted as CUDA would allocate.

No real memory and no FLOPs: the model is built under torch's FakeTensorMode (shapes and dtypes,
no data), and every probe runs the same training step as the CUDA backend (``step.run_steps``)
under three layers:

    CudaEmulation     (emulation.py)  CUDA's autocast lists, fused dropout, fused SDPA kernels
    StorageTracker    (tracker.py)    one allocation per new storage, one free when it dies
    FakeTensorMode                    runs the ops on shapes only

and the trace is replayed through the caching-allocator simulator (allocator.py), which adds
CUDA's rounding (512 B blocks, 2 MiB / 20 MiB segments) and decides out-of-memory the way the
allocator does (free cached segments and retry before giving up). The step itself, what it
allocates in which order and the hooks that let explain watch it, is traced_step.py's.

Added outside the trace, because the CPU run never allocates them:
- cuBLAS workspace: PyTorch allocates it through the caching allocator on the first matmul of a
  (handle, stream) pair (aten/src/ATen/cuda/CublasHandlePool.cpp). cuBLAS handles are per thread
  and autograd runs backward on its own device thread, so a training step holds two
  (traced_step.CUBLAS_HANDLES_PER_STEP).
- CUDA context overhead: outside the allocator, subtracted from the card's memory before the
  budget is computed (``tuner.budget_bytes``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import math
import time
import warnings
import weakref
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from autotune.backends.distributed import Distributed, recompute_under
from autotune.backends.estimate.alloc_conf import AllocatorConfig
from autotune.backends.estimate.liger import (
    route_scattermoe_lora,
    swap_in,
    swap_in_fused_attention,
    swap_in_hub_kernels,
    swap_in_linear_attention,
    swap_in_scattermoe,
)
from autotune.backends.estimate.mx_meta import meta_mx_conversions
from autotune.backends.estimate.paddleocr import route_paddleocr
from autotune.backends.estimate.parts import ESTIMATE_PARTS
from autotune.backends.estimate.pixtral import route_pixtral
from autotune.backends.estimate.rope import route_dynamic_rope
from autotune.backends.estimate.steps import SteadySteps
from autotune.backends.estimate.trace import (
    ON_STREAM,
    PLUS_FIXED,
    Affine,
    OnStream,
    PlusFixed,
    Trace,
    affine,
    aligned_pair,
    rescale,
    rescaled,
    synthesized,
)
from autotune.backends.estimate.traced_step import StepHooks, UnsteadyStep, trace_step
from autotune.backends.estimate.vision import (
    route_deepstack,
    route_gemma4_pooler,
    route_token_selection,
    route_vision_attention,
)
from autotune.gpus import GpuSpec, describe_chip
from autotune.search import Cell, Probe
from autotune.workload import Workload, gemma4_hybrid
from autotune.workload.chunks import recording
from autotune.workload.fp8 import prepare_fp8
from autotune.workload.frozen import freeze, freeze_except
from autotune.workload.gemma4_fused_attn import side_channel
from autotune.workload.kimi_delta_attention import check_kernels as check_kda_kernels
from autotune.workload.ktransformers import KTRANSFORMERS
from autotune.workload.ktransformers import apply as kt_apply
from autotune.workload.mamba_mixer import check_kernels
from autotune.workload.modes import Mode
from autotune.workload.parallel import FSDP
from autotune.workload.preference import prepare_models, trained_model
from autotune.workload.qat import prepare_qat
from autotune.workload.ring_attention import Ring, local_seq_len, ring
from autotune.workload.scattermoe import SCATTERMOE
from autotune.workload.step import FLASH_ATTENTION_2, build_model, gradient_checkpointing
from autotune.workload.tiled_mlp import swap_in as swap_in_tiled_mlp
from autotune.workload.upcast import upcast


@dataclass
class _FakeModel:
    model: Any
    mode_ctx: Any  # the FakeTensorMode the model lives in
    attn: str
    distributed: Distributed | None = None  # a multi-GPU job's rank (distributed.py)
    # A full fine-tune's DPO reference model, frozen (workload.preference.prepare_models)
    reference: Any = None


def _mx_qat(workload: Workload) -> bool:
    """Whether the workload's linears are torchao's MX fake-quantized ones (workload/qat.py)."""
    return workload.qat is not None and workload.qat.weight_dtype == "mxfp4"


def _extrapolation(traces: list[Trace], reference: tuple[Trace, Trace] | None = None,
                   ) -> tuple[Affine, str] | None:
    """The cell's traces at every batch size without running the model, if its traces allow it:
    from an aligned pair of this cell, else from one trace of it and another cell's pair; with
    what it came from, in words."""
    pair = aligned_pair(traces)
    if pair is not None:
        form = affine(pair[0], pair[1])
        if form is not None:
            return form, f"extrapolated from batches {pair[0].batch_size} and {pair[1].batch_size}"
    if reference is not None and traces:
        form = rescaled(reference, traces[-1])
        if form is not None:
            return form, (f"extrapolated from batch {traces[-1].batch_size} with the batch "
                          f"structure of batches {reference[0].batch_size} and "
                          f"{reference[1].batch_size} at another length")
    return None


def extrapolate_traces(
    traces: list[Trace], batch_size: int, reference: tuple[Trace, Trace] | None = None
) -> tuple[Trace, str] | None:
    """The trace at ``batch_size`` by ``_extrapolation``, and what it came from; None if it cannot."""
    found = _extrapolation(traces, reference) if batch_size >= 1 else None
    if found is None or not found[0].covers(batch_size):  # a chunked loss laid out otherwise there
        return None
    return found[0].at(batch_size), found[1]


# How far a prediction may gallop when no batch is known to run out of memory.
_PREDICT_LIMIT = 1 << 24

Verdict = Callable[[int], "bool | None"]  # fits at a batch (one allocator replay); None: cannot tell


def _largest_fitting(fits: Verdict, lo: int, hi: int | None, start: int | None = None) -> int | None:
    """The largest batch in (lo, hi) for which ``fits`` holds (``lo`` fits or is 0; ``hi`` fails
    or is None); None as soon as ``fits`` cannot tell. Each call of ``fits`` is one allocator
    replay (milliseconds), so the answer is reached in few of them from where it is likely to be:
    from ``start`` when given (a guess), else from a known end: the distance from it doubles
    (lo + 1, lo + 2, lo + 4, ... or hi - 1, hi - 2, hi - 4, ...) until the verdict changes, then
    the bracket is bisected. A claim one batch off costs two replays, not a bisection."""
    good, bad = lo, hi
    verdict: bool | None
    if start is not None and good < start and (bad is None or start < bad):
        verdict = fits(start) if start <= _PREDICT_LIMIT else False
        if verdict is None:
            return None
        good, bad = (start, bad) if verdict else (good, start)
    distance = 1
    while bad is None:  # up from the largest batch known to fit
        candidate = good + distance
        verdict = fits(candidate) if candidate <= _PREDICT_LIMIT else False
        if verdict is None:
            return None
        good, bad = (candidate, None) if verdict else (good, candidate)
        distance *= 2
    while good == 0 and bad - good > 1:  # down from the smallest batch known not to fit
        candidate = max(bad - distance, 1)
        verdict = fits(candidate)
        if verdict is None:
            return None
        good, bad = (candidate, bad) if verdict else (good, candidate)
        distance *= 2
    while bad - good > 1:
        middle = (good + bad) // 2
        verdict = fits(middle)
        if verdict is None:
            return None
        good, bad = (middle, bad) if verdict else (good, middle)
    return good


def _guess_max(
    known: dict[int, tuple[Trace, Trace]], seq_len: int, budget_bytes: int, start: int | None,
    guessed: dict[int, tuple[bool, Trace]], allocator: AllocatorConfig,
) -> int | None:
    """The max batch by traces synthesized from other lengths (trace.synthesized), settled as
    the cell's own traces would be (see _settle): a guess, to choose the cell's first probe.
    ``guessed`` receives each batch's verdict and the trace it replayed."""
    from autotune.backends.estimate.replay import fits_in

    form = synthesized(known, seq_len)
    if form is None:
        return None

    def fits(batch_size: int) -> bool:
        if batch_size in guessed:  # asked again (the settling's scans and gallops overlap): one replay
            return guessed[batch_size][0]
        guess = form.at(batch_size)
        verdict = fits_in(guess.events(), budget_bytes, allocator)
        guessed[batch_size] = (verdict, guess)
        return verdict

    found = _largest_fitting(fits, 0, None, start)
    settled = _settle(fits, found) if found else None
    return found if settled is None else settled


def _same_events(a: Trace, b: Trace) -> bool:
    """``a.events() == b.events()`` without writing either: with one order, the events are each
    allocation's bytes (its size, a workspace's converted; Trace.events)."""
    return a.order == b.order and _nbytes(a) == _nbytes(b)


def _nbytes(trace: Trace) -> list[int]:
    nbytes = list(trace.sizes)
    for index, workspace in trace.workspaces:
        nbytes[index] = workspace.nbytes(trace.sizes[index])
    return nbytes


def workspace_from_json(document: Mapping[str, Any]) -> Any:
    """A trace workspace's ``to_json`` back (trace.Affine.from_json): an embedding backward's buffer
    (embedding.py), cuDNN's attention backward workspace (attention.py), an allocation on another
    stream (trace.OnStream), else a reduction's (reduce.py)."""
    from autotune.backends.estimate.embedding import KIND, EmbeddingPartials
    from autotune.backends.estimate.reduce import Workspace

    if document.get("kind") == ON_STREAM:
        inner = document["inner"]
        return OnStream(int(document["stream"]), None if inner is None else workspace_from_json(inner))
    if document.get("kind") == KIND:
        return EmbeddingPartials.from_json(document)
    if document.get("kind") == PLUS_FIXED:
        return PlusFixed(int(document["fixed"]))
    return Workspace.from_json(document)


# A probe's "estimate" where the step was not run: the weights alone exceed the budget (floor_bytes).
BOUND = "bound"

# How the probes' details name the SDPA kernels a step ran (attention.choose_kernel's kinds).
# A Hub kernel (workload/flash_attn3.py) is named by its repository, emulated.
ATTENTION_KERNEL_NAMES = {"cudnn": "cuDNN", "flash": "flash", "efficient": "memory-efficient", "math": "math",
                          "vllm-flash-attn3": "kernels-community/vllm-flash-attn3 (emulated)",
                          "flex_attention": "flex_attention (Triton, emulated)",
                          "ring-flash-attn": "ring-flash-attn llama3 varlen (emulated)"}


def attention_detail(kinds: frozenset[str] | None) -> dict[str, str]:
    """``{"attention": "cuDNN"}`` for a probe whose step ran those SDPA kernels; {} if none or unknown."""
    if not kinds:
        return {}
    return {"attention": ", ".join(ATTENTION_KERNEL_NAMES[kind] for kind in sorted(kinds))}


# The simulated caching allocator, like the real one, is not monotone near the limit: a batch can
# fit while a smaller one runs out of memory (best-fit reuse of cached blocks changes with the
# sizes). Seen on BERT-base amp+ckpt at seq 64 on a T4 over 2% of the batch (OOMs from 2291, fits
# up to 2336); on Llama-3.2-1B bf16 on an H100 80GB at 512 (35 fits, 36 to 39 run out, 40 fits),
# 1024 (17 fits, 18 and 19 run out, 20 fits) and 2048 (8 fits, 9 runs out, 10 fits); and on
# Llama-3.2-1B FSDP2 bf16+ckpt at 1024 on an H200 capped at 21.88 GiB (7 fits, 8 runs out, 9 fits:
# the H200 measured 7 fitting and 8 running out, asking what the replay asks within 0.01 %).
# The cell's max is the largest batch B such that every batch from the window below a boundary a
# search found up to B fits: just below the lowest batch that runs out of memory in that window
# (this fraction of the boundary, at least _SETTLE_STEP batches, at most _SETTLE_BATCHES: each
# batch a replay; the T4's ragged band is 45 batches wide), then so again in the window below that
# one, until one holds no failure. So every search ending near the limit reports the same max (35,
# 17, 8 and 7 above, 2290 on the T4), what a GPU's own search from small batches finds, and a user
# lowering the batch below the max meets no out-of-memory the replays predict. A batch above the
# first failure that the search saw fit is the cell's note, not its max (_known_above). Each window
# after the first is scanned only below the last (the batches above it are known to fit up to the
# new boundary).
_SETTLE_WINDOW = 0.10
_SETTLE_STEP = 4
_SETTLE_BATCHES = 64
# The windows followed down before the settling stops where it is: a tiny model on a large card can
# fit at every fourth batch and run out of memory at the batch after each (tiny-llama under FSDP1
# QLoRA on an A100-80GB from 268,800 up: 575 holes). The last boundary reached is then the cell's.
_SETTLE_HOPS = 64


def _window(boundary: int) -> int:
    """How many batches below ``boundary`` (and above its first failure) the settling looks at."""
    return min(max(_SETTLE_STEP, math.ceil(_SETTLE_WINDOW * boundary)), _SETTLE_BATCHES)


def _settle(fits: Verdict, boundary: int) -> int | None:
    """The cell's max at or below ``boundary`` (see above); None when that is ``boundary`` itself
    or ``fits`` cannot tell. ``boundary`` fits and ``boundary + 1`` does not: neither is asked again."""
    current = boundary
    scanned = boundary  # every batch from here up to ``current`` fits
    for _ in range(_SETTLE_HOPS):
        low = max(1, current - _window(current))
        failed = None
        for batch in range(low, scanned):
            verdict = fits(batch)
            if verdict is None:
                return None
            if not verdict:
                failed = batch
                break
        if failed is None:
            break
        current, scanned = failed - 1, low
        if current == 0:  # batch 1 runs out of memory
            break
    return None if current == boundary else current


def _known_above(known: dict[int, bool], boundary: int, robust: Verdict | None = None) -> int | None:
    """The largest batch past ``boundary + 1`` (which runs out of memory) that the cell's replays so
    far found to fit: where its search ended above a hole before the settling moved below it, that
    boundary. ``robust``, where given, must hold for it (_EstimateCell.robust); None where none is
    known or ``robust`` cannot tell. No replay is made for it but ``robust``'s: looking above every
    max (a window of replays a cell) cost the default table half its CPU again (issue 39)."""
    for batch in sorted((b for b, fit in known.items() if fit and b > boundary + 1), reverse=True):
        held = True if robust is None else robust(batch)
        if held is None:
            return None
        if held:
            return batch
    return None


@contextlib.contextmanager
def _settable_fake_parameters() -> Iterator[None]:
    """``Module.to()`` over fake parameters, as PEFT calls it to give each adapter its base layer's
    dtype. torch swaps a FakeTensor parameter for its converted copy (nn/modules/module.py
    ``_apply``: ``torch.utils.swap_tensors``), which refuses a tensor with a weak reference, and
    fake parameters have one (the fake tensor converter's memo). Within this context a refused
    swap assigns ``.data`` instead: the same parameter object, the new dtype, no memory either way."""
    import torch.utils

    original = torch.utils.swap_tensors

    def swap(first: Any, second: Any) -> None:
        try:
            original(first, second)
        except RuntimeError:
            first.data = second.data

    torch.utils.swap_tensors = swap
    try:
        yield
    finally:
        torch.utils.swap_tensors = original


class _EstimateCell:
    """One cell's probes (search.Cell), with the search's hooks: cheap, exact evaluations by
    allocator replays of the cell's extrapolated traces."""

    def __init__(self, backend: EstimateBackend, fake: _FakeModel, workload: Workload, mode: Mode,
                 seq_len: int, budget_bytes: int, known: dict[int, tuple[Trace, Trace]],
                 maxima: dict[int, int]) -> None:
        self.backend, self.fake, self.workload, self.mode = backend, fake, workload, mode
        self.seq_len, self.budget_bytes, self.known, self.maxima = seq_len, budget_bytes, known, maxima
        self.traces: list[Trace] = []
        self.reference = known[max(known)] if known else None  # the longest length seen so far
        # Whether each batch fits at the budget by one replay of its extrapolated trace: the
        # search's hooks ask about the same batches again (claims, then settling).
        self.verdicts: dict[int, bool] = {}
        self.outcomes: dict[int, bool] = {}  # the probes': batch -> fits
        self.guessed: dict[int, tuple[bool, Trace]] = {}  # the guess's replays of synthesized traces
        self._form: tuple[tuple[int, ...], tuple[Affine, str] | None] | None = None  # see extrapolated
        self.settled: set[int] = set()  # boundaries _settle chose: they stay where they are
        self.robustness: dict[int, bool] = {}  # batch -> fits at every capacity from the budget up

    def fits(self, batch_size: int) -> Probe:
        probe = self.backend.probe(self.fake, self.workload, self.mode, self.seq_len, batch_size,
                                   self.budget_bytes, self.traces, self.extrapolation())
        self.outcomes[batch_size] = probe.outcome == "fits"
        return probe

    def extrapolation(self) -> tuple[Affine, str] | None:
        """_extrapolation of the cell's traces so far, read off once per set of traces."""
        key = tuple(id(trace) for trace in self.traces)
        if self._form is None or self._form[0] != key:
            self._form = key, _extrapolation(self.traces, self.reference)
        return self._form[1]

    def extrapolated(self, batch_size: int) -> Trace | None:
        """The cell's trace at ``batch_size`` without running the model; None if it cannot."""
        found = self.extrapolation()
        # None also where a chunked loss lays its chunks out otherwise than in the form's traces
        return None if found is None or not found[0].covers(batch_size) else found[0].at(batch_size)

    def replayed(self, batch_size: int) -> bool | None:
        """Whether ``batch_size`` fits by the cell's extrapolated traces; None if they cannot tell."""
        from autotune.backends.estimate.replay import fits_in

        verdict = self.verdicts.get(batch_size)
        if verdict is None:
            found = self.extrapolated(batch_size)
            if found is None:
                return None
            verdict = self.verdicts[batch_size] = fits_in(found.events(), self.budget_bytes,
                                                          self.backend.allocator)
        return verdict

    def robust(self, batch_size: int) -> bool | None:
        """Whether ``batch_size``'s demand (the smallest capacity it runs in, replay.replay) is
        within the budget, not only a run at the budget itself; None if the traces cannot tell.
        A batch above a hole is named only so (_known_above): the allocator is not monotone in
        the capacity either, and a step that runs at the budget but not a little above it would
        not run on the card, which has more memory than the budget (its margin)."""
        from autotune.backends.estimate.replay import replay

        verdict = self.robustness.get(batch_size)
        if verdict is None:
            found = self.extrapolated(batch_size)
            if found is None:
                return None
            demand = replay(found.events(), self.budget_bytes, self.backend.allocator).demand_bytes
            verdict = self.robustness[batch_size] = demand <= self.budget_bytes
        return verdict

    def predict(self, lo: int, hi: int | None) -> int | None:
        if not self.traces:  # the cell's first probe: a guess from the other lengths
            return _guess_max(self.known, self.seq_len, self.budget_bytes, self._start(), self.guessed,
                              self.backend.allocator)
        self._take_guessed()
        found = _largest_fitting(self.replayed, lo, hi)
        if not found:
            return found
        # Claim the boundary the search would settle on at the end, so its probes prove that one
        # (one above a batch known to run out of memory is the search's to move to, at the end).
        settled = self.settle(found)
        inside = settled is not None and lo <= settled and (hi is None or settled < hi)
        return settled if inside else found

    def _take_guessed(self) -> None:
        """The guess's verdicts where the trace it synthesized is the cell's own (the same
        allocations in bytes, as a replay sees them): the replays need not be made again."""
        for batch, (verdict, guess) in self.guessed.items():
            found = self.extrapolated(batch)
            if found is not None and _same_events(found, guess):
                self.verdicts.setdefault(batch, verdict)
        self.guessed.clear()

    def settle(self, boundary: int) -> int | None:
        if boundary in self.settled:  # already the boundary of a boundary found higher up
            return None
        settled = _settle(self.replayed, boundary)
        if settled is not None:
            self.settled.add(settled)
        return settled

    def above(self, boundary: int) -> int | None:
        return _known_above({**self.outcomes, **self.verdicts}, boundary, self.robust)

    def _start(self) -> int | None:
        """Where the guess starts looking: the max of the nearest length found so far, scaled by
        the lengths (activations grow at least linearly with the length)."""
        if not self.maxima:
            return None
        nearest = min(self.maxima, key=lambda length: abs(length - self.seq_len))
        return max(1, self.maxima[nearest] * nearest // self.seq_len)

    def proven_max(self) -> int | None:
        """The max the cell's probes proved (b fits, b + 1 does not), if they did."""
        best = max((b for b, fit in self.outcomes.items() if fit), default=0)
        return best if self.outcomes.get(best + 1) is False else None


class EstimateBackend:
    """Estimate CUDA memory on the CPU; one fake model per workload, reused across probes."""

    name = "estimate"

    def __init__(self, gpu: GpuSpec, allocator: AllocatorConfig | None = None) -> None:
        from autotune.backends.estimate.reduce import Multiprocessors
        from autotune.gpus import chip_is_known, multiprocessors

        self.gpu = gpu
        # PyTorch's caching-allocator settings the step runs under (PYTORCH_ALLOC_CONF): the classic
        # segments by default, or expandable ones (alloc_conf.py, allocator.py)
        self.allocator = allocator or AllocatorConfig()
        # what CUDA's reductions size their buffers by (reduce.py)
        self.multiprocessors = Multiprocessors(*multiprocessors(gpu), known=chip_is_known(gpu))
        self._models: dict[tuple[Any, ...], _FakeModel] = {}
        self._emulation: Any = None  # the CudaEmulation of the probe in progress
        # The SDPA kernels each (workload, mode)'s traces ran (attention.py), for the probes' details.
        self._attention: dict[tuple[Any, ...], frozenset[str]] = {}
        # Per (workload, mode): seq_len -> an aligned pair of traces at that length, whose batch
        # structure lets a cell at another length extrapolate from one trace of its own (trace.rescale).
        self._structures: dict[tuple[Any, ...], dict[int, tuple[Trace, Trace]]] = {}
        # Per (workload, mode, budget): seq_len -> the max batch a cell proved (where guesses start).
        self._maxima: dict[tuple[Any, ...], dict[int, int]] = {}
        # Per (workload, mode): whether steps after the first are written from it (steps.py).
        self._steady: dict[tuple[Any, ...], SteadySteps] = {}
        # Per (workload, mode): the most host memory a traced step's ZeRO-Offload held (tracker.py's
        # host ledger; the same at every batch: DeepSpeed's offloaded buffers are the model's).
        self._host_bytes: dict[tuple[Any, ...], int] = {}
        # Per fake model: the bytes every step holds at least (floor_bytes).
        self._floors: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()

    def describe(self) -> dict[str, Any]:
        import torch
        import transformers

        return {
            "backend": self.name,
            "gpu_name": self.gpu.name,
            "chip": describe_chip(self.gpu),
            "allocator": self.allocator.describe(),
            "alloc_conf": self.allocator.conf_text() or None,
            "torch_version": torch.__version__,
            "transformers_version": transformers.__version__,
            "cuda_version": None,
        }

    def cell_form(self, workload: Workload, mode: Mode, seq_len: int) -> Affine | None:
        """The exact allocations of a cell opened before at every batch (trace.Affine), if its
        traces gave them."""
        pair = self._structures.get((workload, mode.name), {}).get(seq_len)
        return None if pair is None else affine(*pair)

    def attn_used(self, workload: Workload) -> str:
        return self._model(workload).attn

    def _model(self, workload: Workload, precision: str = "fp32") -> _FakeModel:
        """The workload's model on fake tensors, built once. A multi-GPU job's is a rank's
        (distributed.py), whose loss is in its wrapper; FSDP2's is sharded for the modes of one
        ``precision`` (the mixed-precision policy and the float32 upcast are part of it)."""
        sharded = workload.parallel is not None and workload.parallel.kind == "fsdp"
        key = (workload.model, workload.task, workload.attn, workload.weights_dtype,
               workload.adapter, workload.liger, workload.parallel,
               workload.loss if workload.parallel is not None else None, precision if sharded else None,
               workload.trainer, workload.frozen, workload.unfrozen, workload.fused_attention, workload.qat,
               workload.experts_kernel, workload.hub_kernels, workload.axolotl_flash, workload.fp8,
               workload.float32_embeddings, workload.hybrid_attention, workload.tiled_mlp)
        cached = self._models.get(key)
        if cached is None:
            from torch._subclasses.fake_tensor import FakeTensorMode

            check_kernels(workload.model.config.model_type)  # Mamba-1's kernels are not emulated
            check_kda_kernels(workload.model.config.model_type)  # nor fla's Kimi Delta Attention

            fake_mode = FakeTensorMode()
            with fake_mode:
                model, attn = build_model(workload.model, workload.task, workload.attn,
                                          workload.weights_dtype, flash_as_sdpa=True,
                                          axolotl_flash=workload.axolotl_flash)
                # Liger's kernels, emulated (liger.py), as the checked config's model type's patch
                swap_in(model, workload.liger, self.gpu, workload.model.config.model_type)
                swap_in_linear_attention(model)  # fla's kernel, emulated (gated_delta_rule.py)
                if workload.fused_attention:  # Axolotl's Gemma 4 attention, emulated (gemma4_fused_attn.py)
                    swap_in_fused_attention(model, self.gpu)
                if workload.hybrid_attention is not None:  # gemma4_hybrid_attn_impl (gemma4_hybrid.py)
                    gemma4_hybrid.apply(model, packed=workload.hybrid_attention == "packed")
                prepare_qat(model, workload.qat)  # torchao's fake-quantized linears, as Axolotl's (qat.py)
                freeze(model, workload.frozen)  # a full fine-tune's untrained modules (frozen.py)
                freeze_except(model, workload.unfrozen)  # Axolotl's unfrozen_parameters (frozen.py)
                if workload.float32_embeddings:  # Axolotl's loader's float32 modules (upcast.py)
                    with _settable_fake_parameters():
                        upcast(model, workload.model.config.model_type)
                if workload.experts_kernel == KTRANSFORMERS:  # use_kt: experts on the CPU (ktransformers.py)
                    kt_apply(model, workload.model.config.model_type)
                elif workload.experts_kernel is not None:  # Axolotl's ScatterMoE, emulated
                    swap_in_scattermoe(model)
                if workload.hub_kernels:  # use_kernels: kernelize's hub kernels, emulated (hub_kernels.py)
                    swap_in_hub_kernels(model, self.gpu)
                if workload.tiled_mlp is not None:  # Axolotl's TiledMLP, traced (tiled_mlp.py)
                    swap_in_tiled_mlp(model, workload.tiled_mlp)
                if workload.adapter is not None:
                    model = self._adapt(model, workload)
                    if workload.experts_kernel == SCATTERMOE:  # ScatterMoE's LoRA on the experts
                        route_scattermoe_lora(model)
                route_vision_attention(model, workload.attn)  # Qwen2-VL's per-image loop (vision.py)
                route_deepstack(model)  # Qwen3-VL's boolean selections, of a known count (vision.py)
                route_gemma4_pooler(model)  # Gemma 4's pooler mask, of a known count (vision.py)
                route_pixtral(model, workload.attn)  # Pixtral's and Mistral 3's per-image loops (pixtral.py)
                route_paddleocr(model)  # PaddleOCR-VL's projector loop (paddleocr.py)
                route_token_selection(model)  # LFM2-VL's image tokens, of a known count (vision.py)
                route_dynamic_rope(model)  # a dynamic rope's update, of a known length (rope.py)
                model = trained_model(model, workload)  # LLaMA-Factory's value head (value_head.py)
                reference = prepare_models(model, workload, lambda dtype: build_model(
                    workload.model, workload.task, workload.attn, dtype, flash_as_sdpa=True,
                    axolotl_flash=workload.axolotl_flash)[0])
                # accelerate's fp8: torchao's Float8Linear, swapped in by Accelerator.prepare before FSDP
                # or DeepSpeed wraps the model (workload/fp8.py). Its forward casts its input under
                # autocast (torch.is_autocast_enabled(), the state emulation.py's forward region sets)
                prepare_fp8(model, workload.fp8)
            distributed = None
            if workload.parallel is not None:
                distributed = Distributed(workload.parallel, workload.loss)
                with fake_mode:
                    distributed.prepare(model, precision)
                recompute_under(model, self._checkpoint_contexts)  # FSDP's activation checkpointing
            cached = self._models[key] = _FakeModel(model, fake_mode, attn, distributed, reference)
        return cached

    def _adapt(self, model: Any, workload: Workload) -> Any:
        """``model`` wrapped by PEFT for the workload's adapter; a 4-bit base emulated (nf4.py)."""
        from autotune.workload.adapters import prepare

        adapter = workload.adapter
        assert adapter is not None
        custom = self.gpu.compute_capability is None  # a card given by its size: a current one
        from autotune.backends.estimate.tracker import shared_fake_mode

        with _settable_fake_parameters(), shared_fake_mode(), warnings.catch_warnings():
            # PEFT deep-copies the modules it trains in full (modules_to_save: a classifier head),
            # and torch's Tensor.__deepcopy__ reads data_ptr(), which warns on a FakeTensor; the
            # copy is a fake tensor of the same size, as it should be, so the warning says nothing.
            warnings.filterwarnings("ignore", message="Accessing the data pointer of FakeTensor",
                                    category=UserWarning)
            return prepare(model, adapter, workload.task, ESTIMATE_PARTS,
                           supports_bf16=custom or self.gpu.supports_bf16,
                           fsdp=workload.parallel is not None and workload.parallel.kind == FSDP)

    def parameter_counts(self, workload: Workload) -> Any:
        """Trainable and total parameters of the workload's model, as PEFT counts them."""
        from autotune.workload.adapters import parameter_counts

        return parameter_counts(self._model(workload).model, ESTIMATE_PARTS)

    @contextlib.contextmanager
    def cell(self, workload: Workload, mode: Mode, seq_len: int, budget_bytes: int) -> Iterator[Cell]:
        """Yield the probes of one (mode, seq_len) cell (search.Cell).

        The first probes of a cell run the model; once two of its traces line up, later probes
        are extrapolated from them exactly (trace.py), and say so in their details.
        """
        parallel = workload.parallel
        if mode.checkpointing and parallel is not None and parallel.activation_checkpointing:
            from autotune.errors import JobFails

            raise JobFails(f"mode {mode.name} with FSDP's activation checkpointing: transformers' "
                           "Trainer refuses gradient checkpointing beside it; give a mode without ckpt")
        fake = self._model(workload, mode.precision)
        structure_key = (workload, mode.name)  # every field of the step (Workload is frozen)
        known = self._structures.setdefault(structure_key, {})
        maxima = self._maxima.setdefault((structure_key, budget_bytes), {})
        cell = _EstimateCell(self, fake, workload, mode, seq_len, budget_bytes, known, maxima)
        if seq_len in known:  # a cell opened again (a check, explain, a seeded GPU search): its
            cell.traces.extend(known[seq_len])  # traces extrapolate every batch, as they did then

        # Checkpointed segments are recomputed inside backward, where the emulation's function
        # mode is not active: checkpoint's documented ``context_fn`` hook enters it for the
        # recompute (step.gradient_checkpointing wraps it for use_reentrant=True). It changes no
        # allocation; use_reentrant=False is transformers' default.
        checkpoint_kwargs = {"use_reentrant": workload.ckpt_reentrant,
                             "context_fn": self._checkpoint_contexts}
        # Axolotl's shared-KV side channel beside its fused Gemma 4 attention, where patch_manager.py
        # installs it: under activation checkpointing or offloading (workload/gemma4_fused_attn.py).
        shared_kv = workload.fused_attention and (mode.checkpointing or workload.offload_activations or (
            parallel is not None and parallel.activation_checkpointing))
        quantized = workload.adapter is not None and workload.adapter.quantized
        with gradient_checkpointing(fake.model, mode.checkpointing, checkpoint_kwargs,
                                    input_grads=quantized), side_channel(fake.model, shared_kv):
            yield cell
        pair = aligned_pair(cell.traces)
        if pair is None and cell.traces and cell.reference is not None:
            # One trace of its own and the batch structure of another length (trace.rescale):
            # as exact a pair as two traces, and the next lengths' guesses interpolate through it.
            single = cell.traces[-1]
            # the next batch, else the double (a chunked loss's chunks lay out otherwise at the next)
            partner = (rescale(cell.reference, single, single.batch_size + 1)
                       or rescale(cell.reference, single, 2 * single.batch_size))
            pair = None if partner is None else (single, partner)
        if pair is not None:  # the next length of this mode can extrapolate from one trace
            known[seq_len] = pair
        found = cell.proven_max()
        if found is not None:
            maxima[seq_len] = found

    def _checkpoint_contexts(self) -> tuple[Any, Any]:
        emulation = self._emulation
        recompute = emulation.recompute_region() if emulation is not None else contextlib.nullcontext()
        return contextlib.nullcontext(), recompute

    def probe(
        self, fake: _FakeModel, workload: Workload, mode: Mode, seq_len: int, batch_size: int,
        budget_bytes: int, traces: list[Trace], extrapolation: tuple[Affine, str] | None,
    ) -> Probe:
        """Estimate one training step at ``batch_size``: from ``extrapolation`` (of the cell's
        ``traces`` so far, _extrapolation) where there is one, else traced and added to them."""
        from autotune.backends.estimate.replay import replay

        started = time.perf_counter()
        found = None  # traced where the form does not cover the batch (a chunked loss laid out otherwise)
        if extrapolation is not None and extrapolation[0].covers(batch_size):
            found = extrapolation[0].at(batch_size), extrapolation[1]
        floor = self.floor_bytes(fake) if found is None else 0
        if floor > budget_bytes:  # no batch fits: not traced (issue 39: 13 s a lever for a 70B model)
            return Probe(batch_size=batch_size, outcome="oom", peak_bytes=floor, details={
                "demand_bytes": floor, "estimate": BOUND,
                "estimate_seconds": round(time.perf_counter() - started, 4)})
        if found is None:
            traced = self.trace(fake, workload, mode, seq_len, batch_size)
            method = "traced"
            traces.append(traced)
        else:
            traced, method = found
        result = replay(traced.events(), budget_bytes, self.allocator)
        return Probe(
            batch_size=batch_size,
            outcome="fits" if result.fits else "oom",
            # The demand, not the peak reserved, is the figure the search predicts from; the run at
            # the budget decides fits/oom (replay.replay), as the settling's replays do (fits_in).
            peak_bytes=result.demand_bytes,
            details={
                "demand_bytes": result.demand_bytes,
                "peak_allocated_bytes": result.peak_allocated_bytes,
                "peak_reserved_bytes": result.peak_reserved_bytes,
                "estimate": method,
                "estimate_seconds": round(time.perf_counter() - started, 4),
                **attention_detail(self._attention.get((workload, mode.name))),
                **({"host_bytes": host} if (host := self._host_bytes.get((workload, mode.name))) else {}),
            },
        )

    def floor_bytes(self, fake: _FakeModel) -> int:
        """A lower bound of every step's demand on the model: its weights (parameters and buffers,
        a rank's shards of them; a DPO reference model's too) and the cuBLAS workspaces, allocated
        before the first step and held through it (traced_step.trace_step), each storage once.
        Under ZeRO-3 the model is whole until DeepSpeed's engine partitions a copy of it in the
        trace (backends/deepspeed.py ``load``: the buffers alone are loaded; the partitions,
        offloaded or not, are the engine's): its parameters are left out of the bound."""
        from autotune.backends.estimate.traced_step import CUBLAS_HANDLES_PER_STEP
        from autotune.backends.estimate.tracker import local_shard

        key = fake.model
        if key not in self._floors:
            storages = {}
            models = (fake.model,) if fake.reference is None else (fake.model, fake.reference)
            zero3 = fake.distributed is not None and fake.distributed.parallel.kind == "zero3"
            tensors = [t for m in models for t in ((*m.parameters(), *m.buffers())
                                                     if not zero3 or m is fake.reference else m.buffers())]
            for tensor in tensors:
                storage = local_shard(tensor).untyped_storage()
                storages[storage._cdata] = storage.nbytes()
            workspaces = CUBLAS_HANDLES_PER_STEP * self.gpu.cublas_workspace_bytes
            self._floors[key] = sum(storages.values()) + workspaces
        return self._floors[key]

    def _note_attention(self, workload: Workload, mode: Mode, emulation: Any) -> None:
        """Keep the SDPA kernels a traced step ran (its CudaEmulation's), for the probes' details."""
        if emulation.attention_kernels:
            self._attention[(workload, mode.name)] = frozenset(emulation.attention_kernels)

    def trace(
        self, fake: _FakeModel, workload: Workload, mode: Mode, seq_len: int, batch_size: int
    ) -> Trace:
        """The allocations of one probe: parameters, workspaces, then the steps (traced_step.py)."""
        return self.trace_with(StepHooks(), fake, workload, mode, seq_len, batch_size)

    def trace_with(
        self, hooks: StepHooks, fake: _FakeModel, workload: Workload, mode: Mode, seq_len: int,
        batch_size: int,
    ) -> Trace:
        """``trace`` with the step's hooks (traced_step.StepHooks: instrument.py records with them)."""
        import torch

        from autotune.backends.estimate.attention import kernels_for

        dtype = {None: None, "float16": torch.float16, "bfloat16": torch.bfloat16}[
            mode.autocast_dtype_name
        ]
        if fake.distributed is not None and not fake.distributed.autocasts:
            dtype = None  # FSDP2's mixed-precision policy casts instead (distributed.py)
        # A card given only by its size (--gpu-memory) is taken to be a current one (kernels_for).
        kernels = kernels_for(self.gpu.compute_capability)
        if workload.attn == FLASH_ATTENTION_2:
            kernels = dataclasses.replace(kernels, flash_attn_package=True)
        # Cyclic garbage collection runs at moments that depend on Python's object counts, not
        # on the step, and would free tensors in cycles at different points from run to run;
        # with it paused, the trace depends only on the step (refcounting frees the rest).
        gc_was_enabled = gc.isenabled()
        gc.disable()
        # DeepSpeed's engine collects explicitly (runtime/zero/utils.py ``defragment``: gc.collect(),
        # once per engine, a trace's): a full collection walks every object of the process, about
        # 0.2 s with an 8B model built; frozen (gc.freeze), the objects made before this trace are
        # skipped, those it makes still collected there, as on the GPU.
        zero = fake.distributed is not None and fake.distributed.parallel.is_zero
        if zero:
            gc.freeze()
        # torchao's MX conversions on meta tensors: the same allocations, less CPU (mx_meta.py)
        conversions = meta_mx_conversions() if _mx_qat(workload) else contextlib.nullcontext()
        # Context parallel: the rank traces its slice of the sequence, its attention ring-flash-attn's
        # (workload/ring_attention.py); the trace is still the job's seq_len's (the cell's key).
        parallel = workload.parallel
        ringed = parallel is not None and parallel.cp > 1
        spec = Ring(parallel.cp, parallel.heads_k_stride) if parallel is not None and ringed else None
        local = seq_len if spec is None else local_seq_len(seq_len, spec.cp)
        try:
            with conversions, ring(spec):
                return self._trace_steps(hooks, fake, workload, mode, local, batch_size, dtype, kernels)
        finally:
            if zero:
                gc.unfreeze()
            if gc_was_enabled:
                gc.enable()

    def _trace_steps(self, hooks: StepHooks, fake: _FakeModel, workload: Workload, mode: Mode,
                     seq_len: int, batch_size: int, dtype: Any, kernels: Any) -> Trace:
        """``trace_with``'s runs of the step: the steady one, else every step (steps.py)."""
        steady = self._steady.setdefault((workload, mode.name), SteadySteps())
        for write_steps in (False,) if hooks.every_step else (True, False):
            emulation = hooks.make_emulation(dtype, kernels)
            tracker = hooks.make_tracker(self.multiprocessors)
            self._emulation = emulation  # the recompute of checkpointed segments runs under it
            try:
                with recording() as chunks:  # the chunked losses' layouts (workload/chunks.py)
                    events = trace_step(fake, workload, mode, seq_len, batch_size, tracker=tracker,
                                        emulation=emulation, hooks=hooks, steady=steady,
                                        write_steps=write_steps,
                                        cublas_workspace_bytes=self.gpu.cublas_workspace_bytes)
            except UnsteadyStep:  # a step that was not steady after all: run every step
                tracker.close()
                with fake.mode_ctx:
                    fake.model.zero_grad(set_to_none=True)  # as a finished step leaves it
                continue
            finally:
                self._emulation = None
            self._note_attention(workload, mode, emulation)
            if tracker.host_peak_bytes:
                self._host_bytes[(workload, mode.name)] = tracker.host_peak_bytes
            return Trace.from_events(batch_size, events, tracker.workspaces, tuple(chunks))
        raise AssertionError("a trace that writes no step cannot be unsteady")
