"""The estimator's training step, instrumented: what each allocation is, and variants of the step.

``InstrumentedBackend`` is an ``EstimateBackend`` whose ``trace`` runs the same step
(traced_step.trace_step) with the hooks of a ``Recorder`` (traced_step.StepHooks) and returns the
same events, so its probes, searches and extrapolations are the table's. On the way it records,
per allocation:

- the phase and training step it happened in (forward, backward, optimizer step), told by the
  step's own seams: the autocast region around the forward, ``scaler.step`` (which calls
  ``optimizer.step``) and run_steps' ``after_step``;
- the innermost module whose forward was running (forward pre/post hooks on every module);
- the region of the step's code it was made in (tracker.allocation_region: nf4.py's 4-bit matmul);
- what it is: parameters and buffers (tracked at the start), the cuBLAS workspaces, the batch,
  gradients (storages that are some ``p.grad`` when the optimizer step starts), optimizer state
  (storages in ``optimizer.state`` after the step), autocast copies (casts of parameters made by
  the emulation), activations (allocated in a forward and still alive when it ends: what
  autograd saved for backward, and the loss), temporaries (everything else);
- on a rank of a multi-GPU job (rank.py names its regions): gathered parameters (FSDP2's
  unsharded parameters, from each all-gather's copy-out until it frees them, also where they stay
  gathered past the forward) and communication buffers (FSDP2's flat all-gather and reduce-scatter
  buffers, DDP's gradient buckets). A sharded parameter, gradient or optimizer state is its local
  shard's storage (tracker.local_shard), and a storage FSDP2 brings back by resizing it is a new
  allocation (``resized``): ``allocations`` stays one per allocation event.

A ``Variant`` changes the step the way a user would: another optimizer (bitsandbytes' 8-bit
AdamW, emulated: workload.optimizers.BnbAdamWState) or frozen embeddings. tests/test_explain.py
checks that the instrumented trace of the plain step is the backend's own, allocation for allocation.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from autotune.backends.estimate.backend import EstimateBackend
from autotune.backends.estimate.emulation import CudaEmulation
from autotune.backends.estimate.parts import ESTIMATE_PARTS
from autotune.backends.estimate.rank import REGION_KINDS
from autotune.backends.estimate.reduce import Multiprocessors
from autotune.backends.estimate.trace import Trace
from autotune.backends.estimate.trace import Workspace as TraceWorkspace
from autotune.backends.estimate.traced_step import StepHooks
from autotune.backends.estimate.tracker import StorageTracker, current_region, local_shard
from autotune.workload import Workload
from autotune.workload.modes import Mode
from autotune.workload.optimizers import BnbAdamWState, embedding_parameters, make_optimizer

# The emulated bitsandbytes 8-bit AdamW, by the name it had here (tests/analysis import it).
AdamW8bitState = BnbAdamWState

# Phases of a training step, in order.
SETUP, FORWARD, BACKWARD, OPTIMIZER = "setup", "forward", "backward", "optimizer step"
# What an allocation is; "temporaries" until something says otherwise.
CATEGORIES = ("parameters", "gradients", "optimizer_state", "autocast_copies", "activations",
              "temporaries", "inputs", "workspaces")
TEMPORARY = "temporaries"


@dataclass
class Allocation:
    """One new storage of the step."""

    nbytes: int  # the storage's size, before the allocator rounds it
    phase: str
    step: int  # 1-based training step; 0 during setup
    module: str | None  # innermost module running ("" is the model itself); None outside forward
    shape: tuple[int, ...]
    dtype: str
    kind: str = TEMPORARY
    param: str | None = None  # the parameter this is, or is the gradient, state or cast copy of
    region: str | None = None  # the tracker.allocation_region it was made in (not as its result)


@dataclass(frozen=True)
class ModuleCall:
    """Shapes seen by a module's last forward call (the first tensor in and out)."""

    type: str
    input_shape: tuple[int, ...] | None
    output_shape: tuple[int, ...] | None


@dataclass
class Recording:
    """Everything one instrumented trace found; ``allocations[i]`` is the i-th allocation event."""

    batch_size: int
    seq_len: int
    events: list[tuple[int, int]]
    allocations: list[Allocation]
    calls: dict[str, ModuleCall] = field(default_factory=dict)
    steps: int = 0
    # CUDA kernels' own buffers (reductions', an embedding backward's): event key -> Workspace,
    # whose events record an element count
    # (tracker.StorageTracker, reduce.py); a Trace made with them gives bytes.
    workspaces: dict[int, TraceWorkspace] = field(default_factory=dict)
    # With activation offloading (workload/offload.py): the most host memory its copies held.
    host_offload_bytes: int = 0


@dataclass(frozen=True)
class Variant:
    """A change to the training step that the table does not cover (see levers.py)."""

    optimizer: str | None = None  # None: the workload's; "adamw-8bit": BnbAdamWState, 8 bits
    freeze_embeddings: bool = False  # requires_grad False on every nn.Embedding's parameters
    fp32_state_for_embeddings: bool = False  # with "adamw-8bit": as transformers' Trainer sets it


class RecordingTracker(StorageTracker):
    """A StorageTracker that also notes, per allocation, when and where it happened."""

    def __init__(self, device: Multiprocessors | None = None) -> None:
        super().__init__(reductions=True, device=device)
        self.allocations: list[Allocation] = []
        self._current: dict[int, int] = {}  # storage key -> allocation index, while alive
        self.phase = SETUP
        self.step = 0
        self.modules: list[str] = []

    def track(self, tensor: torch.Tensor) -> None:
        count = len(self.events)
        super().track(tensor)
        if len(self.events) > count:  # a storage not counted yet
            self._allocated(tensor)

    def resized(self, tensor: torch.Tensor) -> None:
        """FSDP2's resize of a storage (tracker.py): its free, or its allocation again."""
        count = len(self.events)
        super().resized(tensor)
        if len(self.events) == count:
            return
        if self.events[-1][1] < 0:
            self._current.pop(tensor.untyped_storage()._cdata, None)
        else:
            self._allocated(tensor)

    def _allocated(self, tensor: torch.Tensor) -> None:
        """The allocation the last event made, of ``tensor``'s storage: when, where, what region."""
        nbytes = self.events[-1][1]
        key = local_shard(tensor).untyped_storage()._cdata  # the event's key but on a side stream
        self._current[key] = len(self.allocations)
        module = self.modules[-1] if self.modules else None
        allocation = Allocation(nbytes, self.phase, self.step, module, tuple(tensor.shape),
                                str(tensor.dtype).removeprefix("torch."))
        self.allocations.append(allocation)
        region = current_region()
        if region is not None:
            allocation.region = region.name
            # a rank's region says what it is (a result handed out is not: ``leave``)
            kind = allocation.kind = REGION_KINDS.get(region.name, TEMPORARY)

            def leave() -> None:
                allocation.region = None
                if allocation.kind == kind:
                    allocation.kind = TEMPORARY

            region.made(key, leave)

    def _on_free(self, key: int) -> None:
        super()._on_free(key)
        self._current.pop(key, None)

    def _accumulated_in_place(self, output: int, operand: int) -> None:
        super()._accumulated_in_place(output, operand)
        self.allocations.pop()  # the output's, taken back: it is the operand's allocation
        self._current.pop(output, None)
        index = self._current.pop(operand, None)
        if index is not None:
            self._current[output] = index

    def _transients(self, workspaces: Sequence[TraceWorkspace], count: int) -> None:
        """A CUDA kernel's own buffers (a reduction's, reduce.py; an embedding backward's,
        embedding.py): temporaries of the running module."""
        module = self.modules[-1] if self.modules else None
        region = current_region()
        for workspace in workspaces:
            nbytes = workspace.nbytes(count)
            self.allocations.append(Allocation(nbytes, self.phase, self.step, module, (nbytes,), "uint8",
                                               region=None if region is None else region.name))
        super()._transients(workspaces, count)

    def mark(self, tensor: Any, kind: str, param: str | None = None) -> None:
        """Say what ``tensor``'s storage (a DTensor's: its local shard's) is, unless something already did."""
        if not isinstance(tensor, torch.Tensor):
            return
        index = self._current.get(local_shard(tensor).untyped_storage()._cdata)
        if index is not None and self.allocations[index].kind == TEMPORARY:
            self.allocations[index].kind = kind
            self.allocations[index].param = param

    def live(self) -> list[int]:
        return list(self._current.values())


class RecordingEmulation(CudaEmulation):
    """CudaEmulation that reports each cast it makes; the trace keeps those of parameters
    (autocast's weight copies: cached for the forward, and kept by autograd where saved)."""

    def __init__(self, autocast_dtype: Any, kernels: Any, on_cast: Callable[[Any, Any], None]) -> None:
        super().__init__(autocast_dtype, kernels)
        self._on_cast = on_cast

    def _cast(self, value: Any, dtype: torch.dtype) -> Any:
        cast = super()._cast(value, dtype)
        if cast is not value:
            self._on_cast(value, cast)
        return cast


def make_variant_optimizer(model: nn.Module, workload: Workload, variant: Variant) -> Any:
    """The optimizer of the step: the workload's (as the table builds it), or the variant's."""
    if variant.optimizer is None:
        return make_optimizer(model, workload.optimizer, ESTIMATE_PARTS)
    if variant.optimizer == "adamw-8bit":
        if variant.fp32_state_for_embeddings:  # the Trainer's setup of adamw_bnb_8bit
            return make_optimizer(model, "adamw_bnb_8bit", ESTIMATE_PARTS)
        return BnbAdamWState([p for p in model.parameters() if p.requires_grad], optim_bits=8)
    raise ValueError(f"unknown optimizer variant {variant.optimizer!r}")


@contextlib.contextmanager
def frozen_embeddings(model: nn.Module, enabled: bool, checkpointing: bool) -> Iterator[None]:
    """requires_grad False on every embedding parameter for the duration (the model is shared).

    transformers' ``activation_checkpointing_enable`` hooks the input embeddings so that their
    output requires grad, and its ``disable`` leaves the hook unless the model is a PEFT model
    (modeling_utils.py, transformers 5.x); a shared model that ran a checkpointed cell keeps it.
    A user's model without checkpointing has no such hook, so without checkpointing the frozen
    embeddings' output is made not to require grad again, as it would not.
    """
    params = embedding_parameters(model) if enabled else []
    before = [p.requires_grad for p in params]
    for p in params:
        p.requires_grad_(False)
    handles = []
    if enabled and not checkpointing:
        def no_grad_output(module: nn.Module, args: Any, output: Any) -> None:
            if isinstance(output, torch.Tensor) and output.is_leaf and output.requires_grad:
                output.requires_grad_(False)

        handles = [module.register_forward_hook(no_grad_output) for module in model.modules()
                   if isinstance(module, nn.Embedding)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
        for p, flag in zip(params, before, strict=True):
            p.requires_grad_(flag)


def _first_shape(value: Any) -> tuple[int, ...] | None:
    if isinstance(value, torch.Tensor):
        return tuple(value.shape)
    items = value.values() if isinstance(value, dict) else value if isinstance(value, (tuple, list)) else ()
    for item in items:
        shape = _first_shape(item)
        if shape is not None:
            return shape
    return None


@contextlib.contextmanager
def module_hooks(model: nn.Module, tracker: RecordingTracker, calls: dict[str, ModuleCall]) -> Iterator[None]:
    """Keep ``tracker.modules`` a stack of the modules whose forward is running."""
    handles = []
    for name, module in model.named_modules():
        def pre(module: nn.Module, args: Any, name: str = name) -> None:
            tracker.modules.append(name)

        def post(module: nn.Module, args: Any, output: Any, name: str = name) -> None:
            tracker.modules.pop()
            if tracker.phase == FORWARD:
                calls[name] = ModuleCall(type(module).__name__, _first_shape(args), _first_shape(output))

        handles.append(module.register_forward_pre_hook(pre))
        # always_call: the stack stays balanced when a forward raises.
        handles.append(module.register_forward_hook(post, always_call=True))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


class Recorder(StepHooks):
    """The traced step's hooks (traced_step.StepHooks) that record what each allocation is and
    vary the step by ``variant`` (module docstring); ``recording`` is what the latest run found."""

    every_step = True  # each allocation is seen as it happens: none written from the first step
    # Made by make_tracker before the step runs: its tracker and what it records.
    tracker: RecordingTracker
    recording: Recording

    def __init__(self, model: nn.Module, mode: Mode, variant: Variant, batch_size: int, seq_len: int
                 ) -> None:
        self.variant, self.checkpointing = variant, mode.checkpointing
        self.batch_size, self.seq_len = batch_size, seq_len
        self.names = {id(p): n for n, p in model.named_parameters()}
        self.names.update({id(b): n for n, b in model.named_buffers()})

    def make_tracker(self, device: Multiprocessors | None) -> StorageTracker:
        self.tracker = RecordingTracker(device)
        self.recording = Recording(self.batch_size, self.seq_len, self.tracker.events,
                                   self.tracker.allocations, workspaces=self.tracker.workspaces)
        return self.tracker

    def make_emulation(self, autocast_dtype: torch.dtype | None, kernels: Any) -> CudaEmulation:
        return RecordingEmulation(autocast_dtype, kernels, self._cast)

    def _cast(self, value: Any, cast: Any) -> None:
        if id(value) in self.names:
            self.tracker.mark(cast, "autocast_copies", self.names[id(value)])

    def around(self, model: nn.Module) -> contextlib.ExitStack:
        stack = contextlib.ExitStack()
        stack.enter_context(frozen_embeddings(model, self.variant.freeze_embeddings, self.checkpointing))
        stack.enter_context(module_hooks(model, self.tracker, self.recording.calls))
        return stack

    def loaded(self, tensor: Any) -> None:
        self.tracker.mark(tensor, "parameters", self.names.get(id(tensor)))

    def host_offloaded(self, peak_bytes: int) -> None:
        self.recording.host_offload_bytes = peak_bytes

    def make_optimizer(self, model: nn.Module, workload: Workload) -> Any:
        return make_variant_optimizer(model, workload, self.variant)

    def before_steps(self, workspaces: list[Any], batch: dict[str, Any], optimizer: Any) -> None:
        for workspace in workspaces:
            self.tracker.mark(workspace, "workspaces")
        for name in batch:
            self.tracker.mark(batch[name], "inputs")
        self.tracker.step = 1

    @contextlib.contextmanager
    def forward_region(self, emulation: CudaEmulation) -> Iterator[None]:
        tracker = self.tracker
        tracker.phase = FORWARD
        with emulation.forward_region():
            yield
        # Alive now, allocated in this forward: saved for backward (the cast cache is gone).
        for index in tracker.live():
            allocation = tracker.allocations[index]
            if allocation.phase == FORWARD and allocation.step == tracker.step \
                    and allocation.kind == TEMPORARY:
                allocation.kind = "activations"
        tracker.phase = BACKWARD

    def before_optimizer(self, optimizer: Any) -> None:
        self.tracker.phase = OPTIMIZER
        for group in optimizer.param_groups:
            for p in group["params"]:
                self.tracker.mark(p.grad, "gradients", self.names.get(id(p)))

    def after_optimizer(self, optimizer: Any) -> None:
        for p, state in optimizer.state.items():
            for value in state.values():
                self.tracker.mark(value, "optimizer_state", self.names.get(id(p)))

    def after_step(self, index: int) -> None:
        self.tracker.step = index + 2
        self.recording.steps = index + 1


class InstrumentedBackend(EstimateBackend):
    """The estimate backend with a recording trace and, optionally, a variant of the step.

    Shares the fake model of ``base`` (one model per workload); keeps its own cells' traces.
    ``last`` is the recording of the latest traced (not extrapolated) probe. ``trace_bound``: a
    probe whose weights alone exceed the budget is traced too (explain's step needs its recording;
    a lever's search takes the bound, EstimateBackend.probe).
    """

    def __init__(self, base: EstimateBackend, variant: Variant | None = None, *,
                 trace_bound: bool = False) -> None:
        super().__init__(base.gpu)
        self._base = base
        self.variant = variant or Variant()
        self.trace_bound = trace_bound
        self.last: Recording | None = None

    def floor_bytes(self, fake: Any) -> int:
        return 0 if self.trace_bound else super().floor_bytes(fake)

    def _model(self, workload: Workload, precision: str = "fp32") -> Any:
        return self._base._model(workload, precision)

    def trace(self, fake: Any, workload: Workload, mode: Mode, seq_len: int, batch_size: int
              ) -> Trace:
        """EstimateBackend.trace, the same step, recording what each allocation is (Recorder)."""
        recorder = Recorder(fake.model, mode, self.variant, batch_size, seq_len)
        traced = self.trace_with(recorder, fake, workload, mode, seq_len, batch_size)
        self.last = recorder.recording
        return traced
