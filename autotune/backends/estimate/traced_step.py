"""The training step the estimator traces, once per probe, and the hooks that let a caller watch it.

``trace_step`` allocates what a training script does on the GPU, in its order: the model's
weights (``load_weights``), the cuBLAS workspaces, a multi-GPU job's wrapper
(backends/distributed.py: DDP's buckets), the batch, the optimizer, the gradient scaler, then
``workload.step.run_steps`` under the CUDA emulation (emulation.py) and the storage tracker
(tracker.py). Where a (workload, mode)'s
steps are steady, the steps after the first are written from it instead of run (steps.py).

``StepHooks`` are the step's seams: its tracker and emulation, the optimizer, each forward, each
optimizer step, the end of each step. Their defaults are the table's step (EstimateBackend.trace);
instrument.Recorder overrides them to record what each allocation is and to vary the step
(instrument.Variant), on this same step, so explain's breakdown is of the allocations the table
replays (tests/autotune/analysis/test_explain.py compares them, allocation for allocation).
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from autotune.backends.estimate.parts import ESTIMATE_PARTS
from autotune.backends.estimate.rank import around_rank, host_step, on_host_when
from autotune.backends.estimate.steps import Canonical, SteadySteps, StepMarks, StepWriter
from autotune.backends.estimate.vision import known_values
from autotune.workload import Workload
from autotune.workload.modes import Mode
from autotune.workload.optimizers import make_optimizer
from autotune.workload.preference import preference_forward, step_batch
from autotune.workload.step import NoScaler, run_steps

if TYPE_CHECKING:
    import torch

    from autotune.backends.estimate.attention import AttentionKernels
    from autotune.backends.estimate.emulation import CudaEmulation
    from autotune.backends.estimate.reduce import Multiprocessors
    from autotune.backends.estimate.trace import Event
    from autotune.backends.estimate.tracker import StorageTracker

CUBLAS_HANDLES_PER_STEP = 2  # the caller's thread (forward) + autograd's device thread (backward)


def load_weights(model: Any, track: Callable[[Any], None]) -> None:
    """Allocate ``model``'s parameters and buffers in the order they reach the GPU: module by module,
    children first, each module's parameters then its buffers (``Module._apply``, the order of
    ``model.to("cuda")``; a model built on the GPU allocates in nearly the same order); a 4- or
    8-bit layer through its quantization's allocations (nf4.py, int8.py ``load``); an adapter's
    weights last, as PEFT adds them to the loaded model. The order decides where the long-lived
    blocks lie in the allocator's segments, so what a step's fragmentation and a budget's releases
    can reach."""
    adapter = {id(p) for name, p in model.named_parameters() if "lora_" in name or "modules_to_save" in name}
    later: list[Any] = []

    def visit(module: Any) -> None:
        for child in module.children():
            visit(child)
        if getattr(module, "emulates_quantized_load", False):
            module.load(track)
        for tensor in module._parameters.values():
            if tensor is not None:
                (later.append if id(tensor) in adapter else track)(tensor)
        for tensor in module._buffers.values():
            if tensor is not None:
                track(tensor)

    visit(model)
    for tensor in later:
        track(tensor)


class MemoryEquivalentScaler:
    """GradScaler's memory footprint without its data-dependent control flow.

    torch.amp.GradScaler reads ``found_inf.item()`` to decide whether to skip the step, which a
    fake tensor cannot answer. Its memory is a scale and a found_inf scalar, the scaled loss, and
    an in-place unscale of the gradients (torch/amp/grad_scaler.py), all reproduced here.
    """

    def __init__(self) -> None:
        import torch

        self._scale = torch.full((), 2.0**16, dtype=torch.float32)

    def scale(self, loss: Any) -> Any:
        return loss * self._scale

    def step(self, optimizer: Any) -> None:
        import torch

        inv_scale = self._scale.double().reciprocal().float()
        found_inf = torch.full((), 0.0, dtype=torch.float32)
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        if grads:
            torch._foreach_mul_(grads, inv_scale)
        del found_inf
        optimizer.step()

    def update(self) -> None:
        pass


class StepHooks:
    """Where the traced step lets its caller watch and vary it; each hook is called at its point of
    the step. These defaults are the table's step. A hook that watches must allocate nothing (the
    events stay the table's); the factories make what the step then uses."""

    # Run every training step (none written from the first, steps.py), so the hooks see each one.
    every_step = False

    def make_tracker(self, device: Multiprocessors | None) -> StorageTracker:
        """The step's tracker, called once per run of the step; CUDA reductions' buffers on ``device``."""
        from autotune.backends.estimate.tracker import StorageTracker

        return StorageTracker(reductions=True, device=device)

    def make_emulation(self, autocast_dtype: torch.dtype | None, kernels: AttentionKernels) -> CudaEmulation:
        """The step's CUDA emulation, called once per run of the step."""
        from autotune.backends.estimate.emulation import CudaEmulation

        return CudaEmulation(autocast_dtype, kernels)

    def around(self, model: Any) -> AbstractContextManager[Any]:
        """Entered once the tracker records (before the weights are loaded), left before it stops."""
        return contextlib.nullcontext()

    def loaded(self, tensor: Any) -> None:
        """A parameter or buffer (or a 4-bit layer's part) has just been allocated (load_weights)."""

    def make_optimizer(self, model: Any, workload: Workload) -> Any:
        """The step's optimizer: the workload's, as the table builds it."""
        return make_optimizer(model, workload.optimizer, ESTIMATE_PARTS)

    def before_steps(self, workspaces: list[Any], batch: dict[str, Any], optimizer: Any) -> None:
        """All is allocated but the steps: weights, cuBLAS workspaces, batch, optimizer, scaler."""

    def forward_region(self, emulation: CudaEmulation) -> AbstractContextManager[Any]:
        """Around each forward and its loss, where ``torch.autocast`` stands in a training script."""
        return emulation.forward_region()

    def before_optimizer(self, optimizer: Any) -> None:
        """``scaler.step(optimizer)`` begins: the backward is over."""

    def after_optimizer(self, optimizer: Any) -> None:
        """``scaler.step(optimizer)`` has returned."""

    def after_step(self, index: int) -> None:
        """Training step ``index`` (0-based) is over: its ``zero_grad`` has run."""

    def host_offloaded(self, peak_bytes: int) -> None:
        """The steps are over; activation offloading's host copies held at most ``peak_bytes``."""

    def phase(self, name: str, event: int) -> None:
        """A phase of the step begins at the tracker's ``event``-th event (GRPO's generation and
        training step: workload/grpo.py)."""


def offloading(model: Any, streams: bool = True) -> Any:
    """TRL's OffloadActivations as ported (workload/offload.py), its host copies outside the caching
    allocator (pinned host memory: the tracker does not count them)."""
    import torch

    from autotune.backends.estimate.tracker import outside_allocator
    from autotune.workload.offload import Offloader

    def host_copy(tensor: Any) -> Any:
        with outside_allocator():
            host = torch.empty_like(tensor, memory_format=torch.contiguous_format)
            host.copy_(tensor)
        return host

    return Offloader(model, host_copy, streams)


class UnsteadyStep(Exception):
    """The first step, its optimizer step written, turned out not to be steady (steps.py)."""


class _MarkedScaler:
    """The step's gradient scaler, noting where each optimizer step begins and ends in the trace;
    the first optimizer step is written instead of run where ``steady`` allows (steps.py)."""

    def __init__(self, scaler: Any, tracker: StorageTracker, marks: StepMarks, steady: SteadySteps,
                 writer: StepWriter | None, hooks: StepHooks) -> None:
        self.scaler, self.tracker, self.marks = scaler, tracker, marks
        self.steady, self.writer, self.hooks = steady, writer, hooks
        self.state: dict[int, int] | None = None  # the written state's keys, by number
        self.first: tuple[Canonical, Canonical] | None = None  # step 1, where the rest is written from it

    def after_step(self, index: int) -> bool:
        """run_steps' hook: the end of a step; True (stop) where the rest is to be written."""
        self.hooks.after_step(index)
        events = self.tracker.events
        self.marks.ends.append(len(events))
        self.marks.starts.append(len(events))
        if index == 0 and self.writer is not None:
            self.first = self.steady.first_step(events, self.marks, self.tracker.workspaces)
            if self.state is not None and self.first is None:
                raise UnsteadyStep  # the optimizer step was written: run again, all of it
        return self.first is not None

    def scale(self, loss: Any) -> Any:
        return self.scaler.scale(loss)

    def step(self, optimizer: Any) -> None:
        self.hooks.before_optimizer(optimizer)
        events = self.tracker.events
        self.marks.optimizer_starts.append(len(events))
        first = len(self.marks.optimizer_starts) == 1
        if first and self.writer is not None and self.steady.can_write_first_optimizer(
                events, self.marks, self.tracker.workspaces):
            self.state = self.steady.write_first_optimizer(self.writer)
        else:
            self.scaler.step(optimizer)
        self.marks.optimizer_ends.append(len(events))
        self.hooks.after_optimizer(optimizer)

    def update(self) -> None:
        self.scaler.update()


def _phase(hooks: StepHooks, tracker: StorageTracker, emulation: CudaEmulation, name: str) -> None:
    """GRPO's generation or training step begins (workload/grpo.py), or KTO's KL or policy forward
    (workload/preference.py kto_loss): each of TRL's model calls is an
    autocast region of its own (accelerate wraps the prepared model's forward in autocast), so the
    casts cached in one (the generation's, under no_grad) are not the next one's."""
    emulation.begin_forward()
    hooks.phase(name, len(tracker.events))


def trace_step(
    fake: Any, workload: Workload, mode: Mode, seq_len: int, batch_size: int, *,
    tracker: StorageTracker, emulation: CudaEmulation, cublas_workspace_bytes: int,
    steady: SteadySteps, write_steps: bool, hooks: StepHooks,
) -> list[Event]:
    """The events of one probe's step (module docstring) on ``fake`` (the model and its
    FakeTensorMode). With ``write_steps`` the steps after the first are written where ``steady``
    allows (raising UnsteadyStep where the first turns out not to be steady), and a trace that ran
    every step teaches ``steady`` whether they can be."""
    import torch

    model, distributed = fake.model, fake.distributed
    if workload.compiled is not None:
        # Dynamo compiles under this tracker, which it would otherwise run eagerly under (a dispatch
        # mode: torch/_dynamo/convert_frame.py); its graphs then run under it (compiled.py)
        setattr(tracker, "ignore_compile_internals", lambda: True)  # noqa: B010 (a classmethod)
    zero = distributed is not None and distributed.parallel.is_zero
    ready: AbstractContextManager[Any] = contextlib.nullcontext()
    if zero:  # DeepSpeed changes the model it wraps: an engine per trace, on a copy (deepspeed.py)
        from autotune.backends import deepspeed

        with fake.mode_ctx:
            model = deepspeed.fresh_model(model, mode.precision)
        ready = deepspeed.fake_ready()
    with known_values(workload, batch_size), fake.mode_ctx, tracker, hooks.around(model), \
            around_rank(distributed, tracker), ready:
        def load(tensor: Any) -> None:
            with on_host_when(distributed, tensor):  # FSDP2's offloaded shards (rank.py)
                tracker.track(tensor)
            hooks.loaded(tensor)

        if zero:
            assert distributed is not None
            deepspeed.load(model, distributed.parallel, load, load_weights)
        else:
            # FSDP1's shards first: its FlatParameters are no module's parameters with
            # use_orig_params, and the root's sits on the wrapper (backends/fsdp1.py)
            for flat in [] if distributed is None else distributed.flat_parameters():
                load(flat)
            load_weights(model, load)
        if fake.reference is not None:  # DPO's frozen reference, loaded after the policy (preference.py)
            load_weights(fake.reference, load)
        workspaces = [torch.empty(cublas_workspace_bytes, dtype=torch.uint8)
                      for _ in range(CUBLAS_HANDLES_PER_STEP)]
        scaler = MemoryEquivalentScaler() if mode.uses_grad_scaler else NoScaler()
        if zero:  # the Trainer's optimizer, then the engine around it and the model
            assert distributed is not None
            engine = distributed.engine(model, hooks.make_optimizer(model, workload), mode.precision)
            forward, scaler, optimizer = engine.forward, engine, engine.optimizer
        else:
            # a multi-GPU job's wrapper (distributed.py): DDP's buckets are allocated as it is built
            forward = None if distributed is None else distributed.forward(model)
        if workload.trainer is not None:  # the preference trainer's loss (workload/preference.py)
            from autotune.backends.estimate.preference import EMULATED_LOG_PROBS  # torch, at first use

            forward = preference_forward(model, fake.reference, workload.trainer, seq_len=seq_len,
                                         attn=workload.attn, autocasts=mode.autocast_dtype_name is not None,
                                         log_probs=EMULATED_LOG_PROBS,
                                         phase=functools.partial(_phase, hooks, tracker, emulation))
        compiled = None
        if workload.compiled is not None:  # torch.compile around the model (compiled.py)
            from autotune.backends.estimate.compiled import compiled_loss

            assert forward is None, "a compiled step is one GPU's, its loss the model's own (compiled.py)"
            forward, compiled = compiled_loss(model)
        batch = step_batch(model.config, workload, batch_size, seq_len)
        if not zero:
            optimizer = host_step(distributed, hooks.make_optimizer(model, workload))
        marks = StepMarks()
        writer = StepWriter(tracker) if write_steps and not zero else None
        marked = _MarkedScaler(scaler, tracker, marks, steady, writer, hooks)
        hooks.before_steps(workspaces, batch, optimizer)
        offloader = offloading(model, workload.offload_streams) if workload.offload_activations else None
        with emulation, warnings.catch_warnings():
            # torch.amp.custom_bwd (torchao's QAT Functions) enters torch.autocast("cuda") again for
            # a backward whose forward ran under the emulated autocast: on a host without CUDA it
            # turns itself off with a warning (autocast_mode.py autocast.__init__). The backward
            # runs uncast either way (only Axolotl's emulated kernels enter CudaEmulation.resumed).
            warnings.filterwarnings("ignore", message="CUDA is not available or torch_xla is imported")
            marks.starts.append(len(tracker.events))
            run_steps(
                model, batch, optimizer, steps=workload.steps, after_step=marked.after_step,
                autocast=functools.partial(hooks.forward_region, emulation), scaler=marked,
                loss=workload.loss, forward=forward,
                around=contextlib.nullcontext if offloader is None else lambda: offloader,
            )
        if compiled is not None:
            from autotune.backends.estimate.compiled import check_compiled

            check_compiled(compiled)
        if offloader is not None:
            offloader.close()
            hooks.host_offloaded(offloader.host_peak_bytes)
        written = marked.first is not None
        if marked.first is not None:  # steps 2.. from step 1 (steps.py)
            assert writer is not None
            steady.write(writer, marked.first, workload.steps)
            if marked.state is not None:  # what ``del optimizer`` frees of the real state
                steady.free_state(writer, marked.state)
        del optimizer, batch, marked, workspaces, forward, scaler, compiled
        if zero:
            del engine
        model.zero_grad(set_to_none=True)
    tracker.close()
    if write_steps and not zero and steady.verified is None and not written:
        steady.learn(tracker.events, marks, workload.steps, tracker.workspaces)
    return tracker.events
