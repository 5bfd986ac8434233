"""Dispatch-level accounting of live tensor storage, replayed through the allocator simulator.

``StorageTracker`` is a TorchDispatchMode: every tensor an aten op returns is looked at, and a
storage seen for the first time is an allocation of ``storage.nbytes()`` bytes. A weakref
finalizer on the storage records the matching free when the storage dies, whoever held it
(Python code, autograd's saved tensors, the optimizer). Views and in-place ops share their
base's storage and so cost nothing, as on CUDA. PyTorch keeps a storage's Python object alive as
long as the storage itself (PyObject preservation for UntypedStorage, PyTorch 2.1+), so the
finalizer fires when the memory would be returned, not when our reference goes away.

The resulting event list is replayed through ``CachingAllocatorSim``: once without a limit for
the peaks ``torch.cuda.max_memory_allocated/reserved`` would report, and once with the budget as
the capacity to decide whether CUDA would have raised out-of-memory.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from autotune.allocator import CachingAllocatorSim, OutOfMemory

# Ops that return no new storage and are called thousands of times per step.
_PASSTHROUGH = frozenset({torch.ops.prim.device.default})

Event = tuple[int, int]  # (storage key, nbytes); nbytes == -1 marks a free


@dataclass(frozen=True)
class Replay:
    """What the caching allocator would have reported for a trace."""

    peak_allocated_bytes: int
    peak_reserved_bytes: int
    fits: bool  # no out-of-memory with the budget as capacity
    oom_message: str | None = None


class StorageTracker(TorchDispatchMode):
    """Record an allocation for each new storage an op creates and a free when it dies."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[Event] = []
        self._live: dict[int, weakref.finalize] = {}
        self._closed = False

    def track(self, tensor: torch.Tensor) -> None:
        """Count ``tensor``'s storage as allocated now (once), and freed when it dies."""
        storage = tensor.untyped_storage()
        key = storage._cdata
        if key in self._live:
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
        return out


def replay(events: list[Event], capacity_bytes: int | None) -> Replay:
    """Peaks of ``events``, and whether they fit in ``capacity_bytes``.

    Without a limit the allocator keeps every segment it ever cached. With one it frees its
    cached segments and retries before giving up (CachingAllocatorSim models that), so a trace
    whose unlimited peak is over the capacity may still fit; then the peaks reported are the
    ones of the limited run, as ``torch.cuda.max_memory_reserved`` would read on that card.
    """
    peak_allocated, peak_reserved = _run(events, None)
    if capacity_bytes is None or peak_reserved <= capacity_bytes:
        return Replay(peak_allocated, peak_reserved, fits=True)
    try:
        peak_allocated, peak_reserved = _run(events, capacity_bytes)
    except OutOfMemory as exc:
        return Replay(peak_allocated, peak_reserved, fits=False, oom_message=str(exc))
    return Replay(peak_allocated, peak_reserved, fits=True)


def _run(events: list[Event], capacity_bytes: int | None) -> tuple[int, int]:
    sim = CachingAllocatorSim(capacity_bytes)
    handles: dict[int, int] = {}
    for key, nbytes in events:
        if nbytes < 0:
            sim.free(handles.pop(key))
        else:
            handles[key] = sim.malloc(nbytes)
    stats = sim.stats
    return stats.peak_allocated_bytes, stats.peak_reserved_bytes
