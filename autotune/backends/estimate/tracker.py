"""Dispatch-level accounting of live tensor storage, replayed through the allocator simulator.

``StorageTracker`` is a TorchDispatchMode: every tensor an aten op returns is looked at, and a
storage seen for the first time is an allocation of ``storage.nbytes()`` bytes. A weakref
finalizer on the storage records the matching free when the storage dies, whoever held it
(Python code, autograd's saved tensors, the optimizer). Views and in-place ops share their
base's storage and so cost nothing, as on CUDA. PyTorch keeps a storage's Python object alive as
long as the storage itself (PyObject preservation for UntypedStorage, PyTorch 2.1+), so the
finalizer fires when the memory would be returned, not when our reference goes away.

The resulting event list is replayed through ``CachingAllocatorSim`` (``replay``) for the peaks
``torch.cuda.max_memory_allocated/reserved`` would report and the smallest capacity it runs in.

With ``reductions=True`` it also records the two allocations a CUDA reduction kernel makes besides its
output (reduce.py); their events carry the reduction's element count, not bytes, and a
``trace.Trace`` made with the tracker's ``workspaces`` turns them into bytes: replay those events only
through a Trace.

Storages made inside ``outside_allocator()`` are not the caching allocator's (bitsandbytes' paged
optimizer state lives in CUDA managed memory, cudaMallocManaged): no tracker records them, for
their whole life.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from autotune.backends.estimate.allocator import ROUND_LARGE, CachingAllocatorSim
from autotune.backends.estimate.reduce import Multiprocessors, ReduceInput, Workspace, reduction_of
from autotune.backends.estimate.trace import Event
from autotune.errors import OutOfMemory

# Ops that return no new storage and are called thousands of times per step.
_PASSTHROUGH = frozenset({torch.ops.prim.device.default})

SEGMENT_GRANULE = ROUND_LARGE  # every segment size is a multiple of 2 MiB (allocator.py)

_OUTSIDE_ALLOCATOR: ContextVar[bool] = ContextVar("outside_allocator", default=False)


@contextlib.contextmanager
def outside_allocator() -> Iterator[None]:
    """Storages first seen inside are memory the caching allocator does not hold: untracked."""
    token = _OUTSIDE_ALLOCATOR.set(True)
    try:
        yield
    finally:
        _OUTSIDE_ALLOCATOR.reset(token)


@dataclass(frozen=True)
class Replay:
    """What the caching allocator would have reported for a trace."""

    peak_allocated_bytes: int
    peak_reserved_bytes: int  # with the capacity as the limit, when it fits; else without one
    demand_bytes: int  # the smallest capacity the trace runs in (a multiple of 2 MiB)
    fits: bool  # a replay with the capacity as the limit ran without out-of-memory

    @property
    def oom(self) -> bool:
        return not self.fits


class StorageTracker(TorchDispatchMode):
    """Record an allocation for each new storage an op creates and a free when it dies."""

    def __init__(self, reductions: bool = False, device: Multiprocessors | None = None) -> None:
        super().__init__()
        self.events: list[Event] = []
        self._live: dict[int, weakref.finalize] = {}
        self._outside: set[int] = set()  # storages made in outside_allocator(), while alive
        self._closed = False
        # CUDA reductions' buffers (reduce.py), on ``device``: event key (< 0) -> its Workspace;
        # such an event's nbytes is the reduction's element count (trace.Trace.from_events).
        self._reductions = reductions
        self._device = device
        self.workspaces: dict[int, Workspace] = {}

    def track(self, tensor: torch.Tensor) -> None:
        """Count ``tensor``'s storage as allocated now (once), and freed when it dies; never a
        storage first seen in ``outside_allocator()``."""
        storage = tensor.untyped_storage()
        key = storage._cdata
        if key in self._live or key in self._outside:
            return
        if _OUTSIDE_ALLOCATOR.get():
            self._outside.add(key)
            weakref.finalize(storage, self._outside.discard, key).atexit = False
            return
        self.events.append((key, storage.nbytes()))
        finalizer = weakref.finalize(storage, self._on_free, key)
        finalizer.atexit = False
        self._live[key] = finalizer

    def _on_free(self, key: int) -> None:
        if self._closed or self._live.pop(key, None) is None:
            return
        self.events.append((key, -1))

    def close(self) -> None:
        """Stop recording; storages still alive stay allocated in the trace."""
        self._closed = True
        for finalizer in self._live.values():
            finalizer.detach()
        self._live.clear()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if func in _PASSTHROUGH:
            return out
        for leaf in tree_leaves(out):
            if isinstance(leaf, torch.Tensor):
                self.track(leaf)
        if self._reductions:
            found = reduction_of(func, args, kwargs or {})
            if found is not None:
                self._reduce(*found)
        return out

    def _reduce(self, reduction: ReduceInput, numel: int) -> None:
        """A reduction's staging buffer, then its semaphores, after its output; both freed at once
        (gpu_reduce_kernel's DataPtrs, semaphores first). Recorded even where they take 0 bytes:
        which batch sizes need them varies, and a trace's order must not (trace.py)."""
        keys = []
        for semaphores in (False, True):
            key = -1 - len(self.workspaces)
            self.workspaces[key] = Workspace(reduction, self._device, semaphores)
            self.events.append((key, numel))
            keys.append(key)
        for key in reversed(keys):
            self.events.append((key, -1))


def replay(events: list[Event], capacity_bytes: int | None) -> Replay:
    """Peaks of ``events``, the smallest capacity they run in, and whether that is <= capacity.

    Without a limit the allocator keeps every segment it ever cached. With one it frees its
    cached segments and retries before giving up (CachingAllocatorSim models that), so a trace
    can run in less than its unlimited peak reserved, down to about its peak allocated. The
    demand is found by bisection over capacities between the two (reserved memory is a sum of
    whole segments, multiples of 2 MiB): a single figure that decides fits/oom and that grows
    with the batch size, which is what the batch-size search predicts from.

    A run with a limit is the run without one until its reserved memory would first pass the
    limit, and no limit the bisection tries is below the peak allocated: every run of it starts
    from the unlimited run's state where its reserved first passes that (``_Prefix``), instead of
    from the first event (the same figures; about half of each run is skipped).
    """
    peak_allocated, unlimited_reserved, grown = _run_growth(events)
    low = -(-peak_allocated // SEGMENT_GRANULE)  # in granules; nothing below can fit
    high = -(-unlimited_reserved // SEGMENT_GRANULE)  # fits: no limit is ever reached
    reserved_at_high = unlimited_reserved
    prefix = _Prefix.of(events, grown, low * SEGMENT_GRANULE)
    while low < high:
        middle = (low + high) // 2
        try:
            _, reserved = prefix.run(middle * SEGMENT_GRANULE)
        except OutOfMemory:
            low = middle + 1
        else:
            high, reserved_at_high = middle, reserved
    demand = high * SEGMENT_GRANULE
    if capacity_bytes is None or demand <= capacity_bytes:
        return Replay(peak_allocated, reserved_at_high, demand, fits=True)
    # Over the demand found by bisection; the direct run at the capacity decides (the two can
    # differ where releasing cached segments at other moments changes the placement).
    try:
        prefix.run(capacity_bytes)
    except OutOfMemory:
        return Replay(peak_allocated, unlimited_reserved, demand, fits=False)
    return Replay(peak_allocated, unlimited_reserved, demand, fits=True)


def fits_in(events: list[Event], capacity_bytes: int) -> bool:
    """Whether the caching allocator runs ``events`` within ``capacity_bytes``: one replay."""
    try:
        _run(events, capacity_bytes)
    except OutOfMemory:
        return False
    return True


def _run(events: list[Event], capacity_bytes: int | None) -> tuple[int, int]:
    sim = CachingAllocatorSim(capacity_bytes)
    _apply(sim, {}, events)
    stats = sim.stats
    return stats.peak_allocated_bytes, stats.peak_reserved_bytes


def _apply(sim: CachingAllocatorSim, handles: dict[int, int], events: Sequence[Event]) -> None:
    """Allocate and free ``events`` in ``sim``; ``handles``: event key -> the sim's handle."""
    for key, nbytes in events:
        if nbytes < 0:
            sim.free(handles.pop(key))
        else:
            handles[key] = sim.malloc(nbytes)


def _run_growth(events: list[Event]) -> tuple[int, int, list[tuple[int, int]]]:
    """The unlimited run's peaks, and where its reserved memory grew: (event index, reserved after)."""
    sim = CachingAllocatorSim(None)
    handles: dict[int, int] = {}
    grown: list[tuple[int, int]] = []
    reserved = 0
    for index, (key, nbytes) in enumerate(events):
        if nbytes < 0:
            sim.free(handles.pop(key))
            continue
        handles[key] = sim.malloc(nbytes)
        if sim.reserved_bytes != reserved:
            reserved = sim.reserved_bytes
            grown.append((index, reserved))
    stats = sim.stats
    return stats.peak_allocated_bytes, stats.peak_reserved_bytes, grown


@dataclass(frozen=True)
class _Prefix:
    """The unlimited run's state just before its reserved memory first passes ``floor``: every run
    with a limit of at least ``floor`` is the same up to there."""

    events: list[Event]
    floor: int
    start: int  # the first event not yet run
    sim: CachingAllocatorSim
    handles: dict[int, int]

    @classmethod
    def of(cls, events: list[Event], grown: list[tuple[int, int]], floor: int) -> _Prefix:
        start = next((index for index, reserved in grown if reserved > floor), len(events))
        sim = CachingAllocatorSim(None)
        handles: dict[int, int] = {}
        _apply(sim, handles, events[:start])
        return cls(events, floor, start, sim, handles)

    def run(self, capacity_bytes: int) -> tuple[int, int]:
        """_run(events, capacity_bytes): from the prefix where the capacity is at least ``floor``."""
        if capacity_bytes < self.floor:
            return _run(self.events, capacity_bytes)
        sim = self.sim.clone(capacity_bytes)
        _apply(sim, dict(self.handles), self.events[self.start:])
        stats = sim.stats
        return stats.peak_allocated_bytes, stats.peak_reserved_bytes
