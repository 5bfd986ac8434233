"""A rank's step as the estimator traces it: what the storage tracker must be told of.

FSDP2 (backends/distributed.py) frees a gathered parameter's storage and brings it back by
resizing it in place (torch/distributed/fsdp/_fully_shard/_fsdp_param.py ``free_storage`` /
``alloc_storage``: ``storage.resize_``), which no aten op sees: ``resizes_tracked`` tells the
tracker of each (tracker.py ``StorageTracker.resized``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from autotune.backends.distributed import Distributed
from autotune.workload.parallel import FSDP

if TYPE_CHECKING:
    import torch

    from autotune.backends.estimate.tracker import StorageTracker


@contextlib.contextmanager
def resizes_tracked(tracker: StorageTracker) -> Iterator[None]:
    """FSDP2's frees and re-allocations by storage resize (module docstring), told to ``tracker``."""
    from torch.distributed.fsdp._fully_shard import _fsdp_param, _fsdp_param_group

    saved = _fsdp_param.alloc_storage, _fsdp_param.free_storage, _fsdp_param_group.alloc_storage

    def alloc_storage(tensor: torch.Tensor) -> None:
        saved[0](tensor)
        tracker.resized(tensor)

    def free_storage(tensor: torch.Tensor) -> None:
        saved[1](tensor)
        tracker.resized(tensor)

    _fsdp_param.alloc_storage = _fsdp_param_group.alloc_storage = alloc_storage
    _fsdp_param.free_storage = free_storage
    try:
        yield
    finally:
        _fsdp_param.alloc_storage, _fsdp_param.free_storage, _fsdp_param_group.alloc_storage = saved


def around_rank(distributed: Distributed | None,
                tracker: StorageTracker) -> contextlib.AbstractContextManager[Any]:
    """What a trace of ``distributed``'s rank enters around its step (None: one GPU's, nothing)."""
    if distributed is not None and distributed.parallel.kind == FSDP:
        return resizes_tracked(tracker)
    return contextlib.nullcontext()
