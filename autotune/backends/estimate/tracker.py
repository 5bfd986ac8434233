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

Storages made inside ``outside_allocator()`` are not the caching allocator's (bitsandbytes' paged
optimizer state lives in CUDA managed memory, cudaMallocManaged): no tracker records them, for
their whole life.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from autotune.backends.estimate.reduce import Multiprocessors, ReduceInput, Workspace, reduction_of
from autotune.backends.estimate.trace import Event

# Ops that return no new storage and are called thousands of times per step.
_PASSTHROUGH = frozenset({torch.ops.prim.device.default})

_OUTSIDE_ALLOCATOR: ContextVar[bool] = ContextVar("outside_allocator", default=False)


@contextlib.contextmanager
def outside_allocator() -> Iterator[None]:
    """Storages first seen inside are memory the caching allocator does not hold: untracked."""
    token = _OUTSIDE_ALLOCATOR.set(True)
    try:
        yield
    finally:
        _OUTSIDE_ALLOCATOR.reset(token)


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
