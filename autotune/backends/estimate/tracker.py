"""Dispatch-level accounting of live tensor storage, replayed through the allocator simulator.

``StorageTracker`` is a TorchDispatchMode: every tensor an aten op returns is looked at, and a
storage seen for the first time is an allocation of ``storage.nbytes()`` bytes. A weakref
finalizer on the storage records the matching free when the storage dies, whoever held it
(Python code, autograd's saved tensors, the optimizer). Views and in-place ops share their
base's storage and so cost nothing, as on CUDA. PyTorch keeps a storage's Python object alive as
long as the storage itself (PyObject preservation for UntypedStorage, PyTorch 2.1+), so the
finalizer fires when the memory would be returned, not when our reference goes away.

The resulting event list is replayed through ``CachingAllocatorSim`` (replay.py) for the peaks
``torch.cuda.max_memory_allocated/reserved`` would report and the smallest capacity it runs in.

With ``reductions=True`` it also records the two allocations a CUDA reduction kernel makes besides its
output (reduce.py); their events carry the reduction's element count, not bytes, and a
``trace.Trace`` made with the tracker's ``workspaces`` turns them into bytes: replay those events only
through a Trace.

Autograd accumulates two gradients for one input in place where it can (torch/csrc/autograd/
input_buffer.cpp ``accumulate``: ``old_var.add_(var)`` when the buffer holds the last reference to
``old_var`` and its storage), but never on a tensor subclass such as a fake tensor: there it
allocates ``old_var + var``. The tracker undoes that difference: an ``add`` run by the backward
engine whose first operand's storage dies as it returns was that in-place accumulation on CUDA,
so its output takes over the operand's allocation instead of making one of its own.

Two backward formulas do the same for composite compliance (aten/src/ATen/native/
TensorAdvancedIndexing.cpp): ``gather_backward`` makes ``grad.new_zeros(...)`` and scatters into it
with ``scatter_add_`` on CUDA, but with the out-of-place ``scatter_add`` when the index or the
gradient is a tensor subclass; ``index_select_backward_symint`` likewise with ``index_add_`` and
``index_add``. Their out-of-place op, run in that backward node, on zeros alone in their storage
that die as the formula returns, takes over the zeros' allocation the same way
(``_IN_PLACE_ON_CUDA``): one logits-sized block less in TRL's ``selective_log_softmax`` backward.

An op's outputs are counted in the order its CUDA kernel allocates them, which is their order in
the result except where ``_allocation_order`` says otherwise (dropout: mask first).

A DTensor (a sharded parameter, gradient or optimizer state of a multi-GPU job: distributed.py)
holds no memory of its own: its local shard is what the rank allocates, and is what is counted.
A storage resized in place (FSDP2 frees a gathered parameter to 0 bytes and brings it back) is
told to ``resized``, which records the free or the allocation: no aten op sees it.

A storage made while another stream than the default one is current (FSDP2's all-gather and
reduce-scatter buffers, made under ``torch.cpu.stream(...)`` where the estimator's fake tensors live
on the CPU device: estimate/rank.py) is allocated on that stream, whose blocks the caching
allocator keeps apart (allocator.py): inside ``side_streams(tracker)``, its allocation carries a
``trace.OnStream`` among the workspaces, under a key of its own (as a moved allocation's). Outside,
every allocation is the default stream's, as before.

Storages made inside ``outside_allocator()`` are not the caching allocator's (bitsandbytes' paged
optimizer state lives in CUDA managed memory, cudaMallocManaged): no tracker records them, for
their whole life.

Host memory (DeepSpeed's ZeRO-Offload, backends/deepspeed.py) is kept on a ledger of its own: a
storage made inside ``on_host()``, or moved there by ``to_host`` as it is made (a pinned buffer),
is no allocation of the GPU's; its bytes count towards ``host_bytes`` while it lives, and the most
held at once is ``host_peak_bytes``.

Code of the step may name a part of itself, ``with allocation_region(name) as region:``, and hand
back what the part returns (``region.hand_out(result)``): a tracker that records where each
allocation was made (instrument.RecordingTracker) notes the region of each allocation made inside
but those of the result. nf4.py names its 4-bit matmul so (explain's dequantization temporaries).
Other trackers ignore regions: they change no event.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextvars import ContextVar
from typing import Any, TypeVar

import torch
from torch._prims_common import is_non_overlapping_and_dense_or_false
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode_stack
from torch.utils._pytree import tree_leaves

from autotune.backends.estimate.embedding import partial_sums
from autotune.backends.estimate.reduce import Multiprocessors, ReduceInput, Workspace, reduction_of
from autotune.backends.estimate.trace import Event, OnStream
from autotune.backends.estimate.trace import Workspace as TraceWorkspace

# Ops that return no new storage and are called thousands of times per step.
_PASSTHROUGH = frozenset({torch.ops.prim.device.default})
_ADD = torch.ops.aten.add.Tensor
# The out-of-place ops a backward formula runs only on tensor subclasses, in place on CUDA (module
# docstring): the op -> the autograd node whose formula runs it.
_IN_PLACE_ON_CUDA = {torch.ops.aten.scatter_add.default: "GatherBackward0",
                     torch.ops.aten.index_add.default: "IndexSelectBackward0"}
_EMBEDDING_BACKWARD = torch.ops.aten.embedding_dense_backward.default
_NATIVE_DROPOUT = torch.ops.aten.native_dropout.default
# Keys of allocations whose storage changed hands (an in-place accumulation): above any storage
# address (a 48-bit pointer), below the keys steps.py writes (1 << 62).
_FIRST_MOVED_KEY = 1 << 60

# torchao's float8 training tensor (workload/fp8.py): its memory is its float8 ``_data``, made by a
# plain op (the cast) and counted there; a view of it (a reshape, a transpose) shares that storage.
_FLOAT8_WRAPPERS = frozenset({"Float8TrainingTensor"})

_OUTSIDE_ALLOCATOR: ContextVar[bool] = ContextVar("outside_allocator", default=False)
_ON_HOST: ContextVar[bool] = ContextVar("on_host", default=False)
_CONSTANT_VIEWS: ContextVar[bool] = ContextVar("constant_views", default=False)
_REGION: ContextVar[Region | None] = ContextVar("allocation_region", default=None)
T = TypeVar("T")


@contextlib.contextmanager
def shared_fake_mode() -> Iterator[None]:
    """``copy.deepcopy`` of fake tensors that stay in their FakeTensorMode, as PEFT deep-copies a
    module for ``modules_to_save`` (ModulesToSaveWrapper: a classification head). A FakeTensor
    keeps its mode in ``__dict__``, which deepcopy copies too: the copy would live in a mode of its
    own and the step would mix modes. Within this context a mode is never copied."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    FakeTensorMode.__deepcopy__ = lambda self, memo: self  # type: ignore[attr-defined]
    try:
        yield
    finally:
        del FakeTensorMode.__deepcopy__  # type: ignore[attr-defined]


@contextlib.contextmanager
def outside_allocator() -> Iterator[None]:
    """Storages first seen inside are memory the caching allocator does not hold: untracked."""
    token = _OUTSIDE_ALLOCATOR.set(True)
    try:
        yield
    finally:
        _OUTSIDE_ALLOCATOR.reset(token)


@contextlib.contextmanager
def on_host() -> Iterator[None]:
    """Storages first seen inside are host memory: on the tracker's host ledger (module docstring)."""
    token = _ON_HOST.set(True)
    try:
        yield
    finally:
        _ON_HOST.reset(token)


def to_host(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``'s storage, just made, is host memory (module docstring): the innermost tracker
    running takes its allocation back and puts it on its host ledger. Returns ``tensor``."""
    for mode in reversed(_get_current_dispatch_mode_stack()):
        if isinstance(mode, StorageTracker):
            mode.move_to_host(tensor)
            break
    return tensor


class Region:
    """A named part of the step (module docstring). A recording tracker calls ``made`` for each
    allocation inside; ``hand_out`` calls back ``leave`` for those of the result."""

    def __init__(self, name: str) -> None:
        self.name = name
        # storage key -> what takes that storage's allocation out of the region; a key whose
        # storage died and was reused is overwritten by the live storage's allocation
        self._made: dict[int, Callable[[], None]] = {}

    def made(self, storage_key: int, leave: Callable[[], None]) -> None:
        self._made[storage_key] = leave

    def hand_out(self, result: T) -> T:
        """``result`` (tensors, or a structure of them) is what the region returns, not part of
        its own work: the allocations of its storages leave the region. Returns ``result``."""
        for leaf in tree_leaves(result):
            if isinstance(leaf, torch.Tensor):
                leave = self._made.pop(leaf.untyped_storage()._cdata, None)
                if leave is not None:
                    leave()
        return result


@contextlib.contextmanager
def allocation_region(name: str) -> Iterator[Region]:
    """The allocations made inside are in the region ``name`` (module docstring)."""
    region = Region(name)
    token = _REGION.set(region)
    try:
        yield region
    finally:
        _REGION.reset(token)


@contextlib.contextmanager
def side_streams(tracker: StorageTracker) -> Iterator[None]:
    """Inside, ``tracker`` notes the stream each allocation is made on (module docstring): the stream
    current as it is entered is the default one (0); others are numbered 1, 2, ... as first seen."""
    tracker.default_stream = torch.cpu.current_stream()
    try:
        yield
    finally:
        tracker.default_stream = None


@contextlib.contextmanager
def constant_views_alias() -> Iterator[None]:
    """Inside, a view op's output that carries a constant (FakeTensorMode's constant propagation,
    backends/estimate/vision.py) is counted as the view it is: FakeTensorMode gives it a storage of
    its own (a fresh fake tensor of the computed constant), which on CUDA it does not have."""
    token = _CONSTANT_VIEWS.set(True)
    try:
        yield
    finally:
        _CONSTANT_VIEWS.reset(token)


def current_region() -> Region | None:
    """The innermost ``allocation_region`` open here, or None."""
    return _REGION.get()


class StorageTracker(TorchDispatchMode):
    """Record an allocation for each new storage an op creates and a free when it dies."""

    def __init__(self, reductions: bool = False, device: Multiprocessors | None = None) -> None:
        super().__init__()
        self.events: list[Event] = []
        self._live: dict[int, weakref.finalize] = {}
        self._outside: set[int] = set()  # storages made in outside_allocator(), while alive
        self._emptied: set[int] = set()  # live storages resized to 0 bytes (``resized``)
        self._closed = False
        # CUDA reductions' buffers (reduce.py), on ``device``: event key (< 0) -> its Workspace;
        # such an event's nbytes is the reduction's element count (trace.Trace.from_events).
        self._reductions = reductions
        self._device = device
        self.workspaces: dict[int, TraceWorkspace] = {}
        # In-place gradient accumulation (module docstring): the index in ``events`` of each live
        # storage's allocation, the key a storage that took over another's allocation frees it
        # with, and the add just run by the engine: (its output's storage, its first operand's,
        # the length of ``events`` once the output was counted).
        self._allocated_at: dict[int, int] = {}
        self._moved: dict[int, int] = {}
        self._accumulation: tuple[int, int, int] | None = None
        self._next_moved_key = _FIRST_MOVED_KEY
        # Streams (``side_streams``): the default one while noted, else None; the others' numbers.
        self.default_stream: Any = None
        self._streams: dict[Any, int] = {}
        self.host_bytes = 0  # the host ledger (module docstring)
        self.host_peak_bytes = 0

    def _on_host(self, storage: Any) -> None:
        nbytes = storage.nbytes()
        self.host_bytes += nbytes
        self.host_peak_bytes = max(self.host_peak_bytes, self.host_bytes)
        weakref.finalize(storage, self._host_freed, nbytes).atexit = False

    def _host_freed(self, nbytes: int) -> None:
        if not self._closed:
            self.host_bytes -= nbytes

    def move_to_host(self, tensor: torch.Tensor) -> None:
        """``tensor``'s storage is host memory (``to_host``): its allocation, made just before
        (DeepSpeed pins a host buffer as it makes it), is taken out of the events and onto the host
        ledger."""
        storage = local_shard(tensor).untyped_storage()
        key = storage._cdata
        index = self._allocated_at.get(key)
        if key in self._emptied or key in self._moved or index is None:
            return
        del self.events[index]
        del self._allocated_at[key]
        self._accumulation = None
        for other, at in self._allocated_at.items():
            if at > index:
                self._allocated_at[other] = at - 1
        self._live.pop(key).detach()
        self._outside.add(key)
        weakref.finalize(storage, self._outside.discard, key).atexit = False
        self._on_host(storage)

    def track(self, tensor: torch.Tensor) -> None:
        """Count ``tensor``'s storage as allocated now (once), and freed when it dies; never a
        storage first seen in ``outside_allocator()``. A DTensor's is its local shard's."""
        storage = local_shard(tensor).untyped_storage()
        key = storage._cdata
        if key in self._live or key in self._outside:
            return
        if _OUTSIDE_ALLOCATOR.get() or _ON_HOST.get():
            self._outside.add(key)
            weakref.finalize(storage, self._outside.discard, key).atexit = False
            if _ON_HOST.get():
                self._on_host(storage)
            return
        self._allocated_at[key] = len(self.events)
        self.events.append((self._allocation_key(key), storage.nbytes()))
        finalizer = weakref.finalize(storage, self._on_free, key)
        finalizer.atexit = False
        self._live[key] = finalizer

    def resized(self, tensor: torch.Tensor) -> None:
        """``tensor``'s storage was just resized in place: to 0 bytes, a free of its allocation; from
        0 bytes, an allocation again, under the same key (module docstring)."""
        storage = tensor.untyped_storage()
        key, nbytes = storage._cdata, storage.nbytes()
        if key not in self._live or self._closed:
            return
        if nbytes == 0 and key not in self._emptied:
            self._emptied.add(key)
            self._allocated_at.pop(key, None)
            self.events.append((self._moved.pop(key, key), -1))
        elif nbytes and key in self._emptied:
            self._emptied.discard(key)
            self._allocated_at[key] = len(self.events)
            self.events.append((self._allocation_key(key), nbytes))

    def _stream(self) -> int:
        """The number of the stream current now: 0, the default one (module docstring)."""
        if self.default_stream is None:
            return 0
        current = torch.cpu.current_stream()
        if current is self.default_stream:
            return 0
        return self._streams.setdefault(current, len(self._streams) + 1)

    def _allocation_key(self, key: int) -> int:
        """The event key of an allocation of storage ``key`` made now: the storage's own on the
        default stream; on another, a key of its own (freed as a moved allocation's), noted as
        ``OnStream`` among the workspaces."""
        stream = self._stream()
        if not stream:
            return key
        event_key, self._next_moved_key = self._next_moved_key, self._next_moved_key + 1
        self._moved[key] = event_key
        self.workspaces[event_key] = OnStream(stream)
        return event_key

    def _on_free(self, key: int) -> None:
        if self._closed or self._live.pop(key, None) is None:
            return
        if key in self._emptied:  # its allocation was freed by the resize to 0 bytes
            self._emptied.discard(key)
            return
        accumulation, self._accumulation = self._accumulation, None
        if accumulation is not None and accumulation[1] == key and accumulation[2] == len(self.events):
            self._accumulated_in_place(accumulation[0], key)
            return
        self._allocated_at.pop(key, None)
        self.events.append((self._moved.pop(key, key), -1))

    def _accumulated_in_place(self, output: int, operand: int) -> None:
        """The engine's ``operand + x`` just made ``output`` and dropped ``operand``: on CUDA it
        was ``operand.add_(x)``. The output's allocation (the last event) is taken back and
        ``output`` frees the operand's allocation when it dies (under a key no storage has)."""
        self.events.pop()
        self._allocated_at.pop(output)
        index = self._allocated_at.pop(operand)
        key, nbytes = self.events[index]
        self._moved.pop(operand, None)
        if key < _FIRST_MOVED_KEY:  # the address of a storage now dead: another may get it
            key, self._next_moved_key = self._next_moved_key, self._next_moved_key + 1
            self.events[index] = (key, nbytes)
        self._moved[output] = key
        self._allocated_at[output] = index

    def close(self) -> None:
        """Stop recording; storages still alive stay allocated in the trace."""
        self._closed = True
        for finalizer in self._live.values():
            finalizer.detach()
        self._live.clear()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        wrapper = _float8_wrapper(args, kwargs)
        emulation = _RUN_UNDER.get(func)
        if emulation is not None:  # an emulated kernel, one op of a compiled graph (run_under)
            with self:
                out = emulation(*args, **(kwargs or {}))
        elif wrapper is not None:
            # torchao's float8 ops (float8/float8_ops.py) run under this tracker, not past it: the
            # copies they make (preprocess_addmm's contiguous operands for torch._scaled_mm) are
            # allocations of the step like any other.
            with self:
                out = type(wrapper).__torch_dispatch__(func, types, args, kwargs or {})
        else:
            out = func(*args, **(kwargs or {}))
        if func in _PASSTHROUGH:
            return out
        self._accumulation = None
        constant_views = _CONSTANT_VIEWS.get() and func.is_view
        for leaf in _allocation_order(func, args, kwargs or {}, tree_leaves(out)):
            if isinstance(leaf, torch.Tensor) and not (constant_views and getattr(leaf, "constant", None)
                                                        is not None):
                self.track(leaf)
        if func is _ADD and not kwargs and _accumulable(args, out) and self.events \
                and self.events[-1][0] == out.untyped_storage()._cdata:
            self._accumulation = (self.events[-1][0], args[0].untyped_storage()._cdata, len(self.events))
        elif func in _IN_PLACE_ON_CUDA and _in_place_on_cuda(func, args, out) and self.events \
                and self.events[-1][0] == out.untyped_storage()._cdata:
            self._accumulation = (self.events[-1][0], args[0].untyped_storage()._cdata, len(self.events))
        if self._reductions:
            found = reduction_of(func, args, kwargs or {})
            if found is not None:
                self._reduce(*found)
            elif func is _EMBEDDING_BACKWARD:  # (grad_output, indices, num_weights, padding_idx, scale)
                grad_output, indices, num_weights, _padding_idx, scale_grad_by_freq = _arguments(
                    func, args, kwargs or {})
                # an assumed chip takes the two-pass kernel, the larger buffers (embedding.py)
                known = self._device is not None and self._device.known
                multiprocessors = self._device.count if known and self._device is not None else None
                self._transients(partial_sums(grad_output, num_weights, scale_grad_by_freq, multiprocessors),
                                 indices.numel())
        return out

    def _reduce(self, reduction: ReduceInput, numel: int) -> None:
        """A reduction's staging buffer, then its semaphores, after its output; both freed at once
        (gpu_reduce_kernel's DataPtrs, semaphores first). Recorded even where they take 0 bytes:
        which batch sizes need them varies, and a trace's order must not (trace.py)."""
        self._transients([Workspace(reduction, self._device, semaphores) for semaphores in (False, True)],
                         numel)

    def _transients(self, workspaces: Sequence[TraceWorkspace], count: int) -> None:
        """Buffers a CUDA kernel allocates in this order after its output and frees in the reverse
        one as it returns, their sizes given by ``count`` (trace.Workspace)."""
        keys = []
        stream = self._stream()
        for workspace in workspaces:
            key = -1 - len(self.workspaces)
            self.workspaces[key] = OnStream(stream, workspace) if stream else workspace
            self.events.append((key, count))
            keys.append(key)
        for key in reversed(keys):
            self.events.append((key, -1))


# Custom ops that stand for an emulated kernel in a compiled step's graph (opaque_attention.py): the
# tracker runs the emulation under itself, recording what it allocates inside, as it runs eagerly.
_RUN_UNDER: dict[Any, Callable[..., Any]] = {}


def run_under(op: Any, emulation: Callable[..., Any]) -> None:
    """``op`` run by every tracker as ``emulation`` under itself (its allocations recorded)."""
    _RUN_UNDER[op] = emulation


def kernel_buffer(workspace: TraceWorkspace, count: int) -> bool:
    """A buffer an emulated CUDA kernel allocates and frees as it returns (attention.py's cuDNN
    backward workspace), ``workspace.nbytes(count)`` bytes: recorded by the innermost tracker
    running, as a reduction's buffers are (``_transients``). False where no tracker runs (the
    caller allocates it as a tensor)."""
    for mode in reversed(_get_current_dispatch_mode_stack()):
        if isinstance(mode, StorageTracker):
            mode._transients([workspace], count)
            return True
    return False


def _float8_wrapper(args: Any, kwargs: Any) -> torch.Tensor | None:
    """The first of an op's arguments that is torchao's float8 training tensor, if any. An ATen op's
    arguments nest in lists and tuples only (a Tensor[] argument), walked here without pytree's
    general flattening: this runs at every op of every trace."""
    for value in (*args, *(kwargs.values() if kwargs else ())):
        found = _float8_in(value)
        if found is not None:
            return found
    return None


def _float8_in(value: Any) -> torch.Tensor | None:
    if isinstance(value, torch.Tensor):
        return value if type(value).__name__ in _FLOAT8_WRAPPERS else None
    if isinstance(value, (list, tuple)):
        for item in value:
            found = _float8_in(item)
            if found is not None:
                return found
    return None


def local_shard(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor whose storage holds ``tensor``'s memory: a DTensor's local shard, torchao's float8
    training tensor's float8 bits (``_data``, float8/float8_training_tensor.py: a wrapper, whose own
    storage reports the bytes of its high-precision dtype and holds none), else itself."""
    local = getattr(tensor, "_local_tensor", None)
    if local is None and type(tensor).__name__ in _FLOAT8_WRAPPERS:
        local = getattr(tensor, "_data", None)
    return local if isinstance(local, torch.Tensor) else tensor


def _allocation_order(func: Any, args: Any, kwargs: dict[str, Any], leaves: list[Any]) -> list[Any]:
    """``func``'s outputs in the order CUDA allocates them.

    ``native_dropout`` in training with 0 < p < 1 (Dropout.cu ``dropout_cuda``) makes its boolean
    mask (``at::empty_like``) before its output; its short cuts (p == 1, not training) make the
    output first. Measured on an H100 (records/llama-1b-qlora-bf16ckpt-2048x6.json): each LoRA
    dropout allocated its 24 MiB mask, then its 48 MiB output, then freed the mask.
    """
    if func is _NATIVE_DROPOUT and len(leaves) == 2:
        _input, p, train = _arguments(func, args, kwargs)  # (input, p, train: bool | None)
        if train is not False and 0 < p < 1:
            return leaves[::-1]
    return leaves


def _accumulable(args: Any, out: Any) -> bool:
    """Whether ``add(*args)`` -> ``out`` can be the backward engine's accumulation of two gradients
    that CUDA runs in place on ``args[0]`` (input_buffer.cpp ``can_accumulate_inplace``): run by
    the engine with grad mode off, on two tensors, the first a dense tensor of the output's shape
    and dtype, alone in its storage. Whether the engine held its last reference shows when its
    storage dies as the add returns (StorageTracker._on_free)."""
    if torch.is_grad_enabled() or torch._C._current_autograd_node() is None or len(args) != 2:
        return False
    first, second = args
    return (
        isinstance(first, torch.Tensor) and isinstance(second, torch.Tensor)
        and isinstance(out, torch.Tensor) and local_shard(first) is first and local_shard(out) is out
        and first.shape == out.shape and first.dtype == out.dtype
        and is_non_overlapping_and_dense_or_false(first)
        and first.untyped_storage().nbytes() == first.numel() * first.element_size()
    )


def _in_place_on_cuda(func: Any, args: Any, out: Any) -> bool:
    """Whether ``func(*args)`` -> ``out`` is the out-of-place twin of an in-place op that its
    backward formula runs on CUDA (``_IN_PLACE_ON_CUDA``): run in that node with grad mode off, on a
    dense first operand of the output's shape and dtype, alone in its storage. That the formula
    dropped the operand shows when its storage dies as the op returns (StorageTracker._on_free)."""
    node = torch._C._current_autograd_node()
    if torch.is_grad_enabled() or node is None or type(node).__name__ != _IN_PLACE_ON_CUDA[func] or not args:
        return False
    first = args[0]
    return (
        isinstance(first, torch.Tensor) and isinstance(out, torch.Tensor)
        and first.shape == out.shape and first.dtype == out.dtype
        and is_non_overlapping_and_dense_or_false(first)
        and first.untyped_storage().nbytes() == first.numel() * first.element_size()
    )


def _arguments(func: Any, args: Any, kwargs: dict[str, Any]) -> list[Any]:
    """An op's arguments in its schema's order, defaults filled in."""
    found = list(args)
    for argument in func._schema.arguments[len(found):]:
        found.append(kwargs[argument.name] if argument.name in kwargs else argument.default_value)
    return found
