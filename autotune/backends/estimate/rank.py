"""A rank's step as the estimator traces it: what the storage tracker must be told of.

FSDP2 (backends/distributed.py) frees a gathered parameter's storage and brings it back by
resizing it in place (torch/distributed/fsdp/_fully_shard/_fsdp_param.py ``free_storage`` /
``alloc_storage``: ``storage.resize_``), which no aten op sees: ``resizes_tracked`` tells the
tracker of each (tracker.py ``StorageTracker.resized``).

The parts of the step that exist only on a rank are named as allocation regions (tracker.py
``allocation_region``), so that explain can say what they hold (instrument.py turns each region
into a category); other trackers ignore regions, and no event changes:

- ``ALL_GATHER``: FSDP2's ``foreach_all_gather`` (_fsdp_collectives.py), a group's flat all-gather
  input (its shards copied in the gathered dtype, under a mixed-precision policy) and output;
- ``GATHERED``: its ``foreach_all_gather_copy_out``, each parameter's unsharded storage (the
  per-parameter all-gather outputs, allocated the first time and resized back every time after);
- ``REDUCE_SCATTER``: its ``foreach_reduce``, the flat reduce-scatter input and output, but for the
  sharded gradients it hands to the parameters (the output itself, or its cast to the shards' dtype);
- ``DDP_BUCKETS``: DDP's ``_ddp_init_helper`` (torch/nn/parallel/distributed.py), where the
  Reducer allocates its gradient buckets.

The FSDP2 functions are imported by name into _fsdp_param_group.py, where they are replaced for
the trace and restored after it.

FSDP2 makes its collectives' buffers on streams of its own (FSDPCommContext.lazy_init; read in
the venv's torch 2.13), which the estimator's CPU device has as ``torch.cpu.Stream`` and selects as CUDA does
(``torch.cpu.stream``), so its trace notes them (tracker.py ``side_streams``) and the allocator keeps
their blocks apart (allocator.py):

- ``all_gather_copy_in_stream``, in forward and in backward's unsharding (``get_all_gather_streams``:
  implicit prefetching, FORWARD and PRE_BACKWARD): ``foreach_all_gather``'s flat copy-in of the shards
  in the gathered dtype (``_get_param_all_gather_inputs``) and its all-gather output;
- ``reduce_scatter_stream``: ``foreach_reduce``'s reduce-scatter output and its cast to the shards'
  dtype, the sharded gradients (the reduce-scatter input is made on the current stream before it);
  with HSDP that cast is made on ``all_reduce_stream``, the post-reduce stream (a third one);
- nothing on ``all_gather_stream`` (the fake group's collective allocates nothing); the copy-out's
  unsharded parameters are made on the current stream.

Whatever stream is current when an allocation is made is the one noted: the list above is what the
source reads, not a rule of the trace.

FSDP2 calls no ``record_stream``: it keeps references instead (AllGatherState, ReduceScatterState,
the sharded gradients: "we do not need extra synchronization since the sharded parameters hold refs"),
so a block freed from Python is its stream's to reuse at once, as the simulator has it.

FSDP2's CPU offload (``CPUOffloadPolicy``, backends/distributed.py ``offload_policy``) keeps each
sharded parameter, its gradient and the optimizer state in host memory. The estimator's fake
tensors are CPU tensors standing for the GPU's, so FSDP2's copies between the two (a ``.to`` of the
device it is already on) copy nothing; ``host_offload`` makes them what they are on a GPU, onto the
tracker's host ledger (tracker.py ``on_host``):

- the shards are host memory as the weights are loaded (``on_host_when``);
- each shard's copy to the GPU for its all-gather (_fsdp_param.py ``FSDPParam.all_gather_inputs``:
  ``sharded_param_data.to(self.device, non_blocking=True)``) is a copy on the GPU, emulated by a
  clone; then its cast to the gathered dtype, as there;
- each sharded gradient's copy to the host in ``foreach_reduce`` (_fsdp_collectives.py:
  ``new_sharded_grad.to(torch.device("cpu"), ...)``, the only device move there) is a copy on the
  host ledger, and the reduce-scatter output it was a view of is the GPU's to free;
- the optimizer's step runs on the host parameters and gradients (torch.optim on CPU tensors): what
  it allocates, its state among it, is host memory (``host_step``).

FSDP1's ``CPUOffload(offload_params=True)`` (backends/fsdp1.py) the same way: each FlatParameter's
shard is host memory as it is loaded (``on_host_when``), the optimizer steps on the host
(``host_step``), and fsdp1.py ``host_offload`` makes its pinning, its copies to the GPU and its
gradients' buffer on the host what they are on a GPU.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from autotune.backends.distributed import Distributed
from autotune.workload.parallel import DDP, FSDP

if TYPE_CHECKING:
    import torch

    from autotune.backends.estimate.tracker import StorageTracker

# The rank's allocation regions (module docstring).
ALL_GATHER = "fsdp all-gather"
GATHERED = "fsdp gathered parameters"
REDUCE_SCATTER = "fsdp reduce-scatter"
DDP_BUCKETS = "ddp buckets"
# What a rank allocates besides a one-GPU step's categories (explain lists them for a rank only),
# and the category of each region's allocations (instrument.RecordingTracker).
GATHERED_PARAMETERS, COMMUNICATION_BUFFERS = "gathered_parameters", "communication_buffers"
REGION_KINDS = {GATHERED: GATHERED_PARAMETERS, ALL_GATHER: COMMUNICATION_BUFFERS,
                REDUCE_SCATTER: COMMUNICATION_BUFFERS, DDP_BUCKETS: COMMUNICATION_BUFFERS}


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


def _in_region(name: str, function: Callable[..., Any],
               hand_out: Callable[[tuple[Any, ...], Any], Any] | None = None) -> Callable[..., Any]:
    """``function`` run inside the allocation region ``name``; ``hand_out(args, result)`` says what
    of its work it hands out (tracker.Region.hand_out)."""
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        from autotune.backends.estimate.tracker import allocation_region  # imports torch: when traced

        with allocation_region(name) as region:
            result = function(*args, **kwargs)
            if hand_out is not None:
                region.hand_out(hand_out(args, result))
            return result

    return wrapped


def _sharded_gradients(args: tuple[Any, ...], result: Any) -> list[Any]:
    """What ``foreach_reduce(fsdp_params, ...)`` hands out: each parameter's sharded gradient (its
    local tensor, a view of the reduce-scatter output or of its cast)."""
    grads = (fsdp_param.sharded_param.grad for fsdp_param in args[0])
    from autotune.backends.estimate.tracker import local_shard

    return [local_shard(grad) for grad in grads if grad is not None]


@contextlib.contextmanager
def fsdp_regions() -> Iterator[None]:
    """FSDP2's all-gathers, copy-outs and reduce-scatters in their regions (module docstring)."""
    from torch.distributed.fsdp._fully_shard import _fsdp_param_group as group

    saved = group.foreach_all_gather, group.foreach_all_gather_copy_out, group.foreach_reduce
    group.foreach_all_gather = _in_region(ALL_GATHER, saved[0])
    group.foreach_all_gather_copy_out = _in_region(GATHERED, saved[1])
    group.foreach_reduce = _in_region(REDUCE_SCATTER, saved[2], _sharded_gradients)
    try:
        yield
    finally:
        group.foreach_all_gather, group.foreach_all_gather_copy_out, group.foreach_reduce = saved


@contextlib.contextmanager
def ddp_regions() -> Iterator[None]:
    """DDP's Reducer built in its region (module docstring)."""
    from torch.nn.parallel import DistributedDataParallel

    saved = DistributedDataParallel.__dict__["_ddp_init_helper"]
    DistributedDataParallel._ddp_init_helper = _in_region(DDP_BUCKETS, saved)  # type: ignore[method-assign]
    try:
        yield
    finally:
        DistributedDataParallel._ddp_init_helper = saved  # type: ignore[method-assign]


def offloads(distributed: Distributed | None) -> bool:
    """Whether ``distributed`` is FSDP (2 or 1) with its parameters offloaded to the host (module
    docstring)."""
    return distributed is not None and distributed.parallel.kind == FSDP \
        and distributed.parallel.offload_params


def on_host_when(distributed: Distributed | None,
                 tensor: torch.Tensor) -> contextlib.AbstractContextManager[None]:
    """Around the loading of ``tensor``: on the host ledger if it is an offloaded shard: FSDP2's (a
    DTensor) or FSDP1's (a FlatParameter, moved to the CPU as it is made: _init_utils.py
    ``_init_param_handle_from_params``, ``handle.flat_param_to(cpu_device)``); not the buffers, which
    both move to the GPU (module docstring)."""
    from torch.distributed.fsdp._flat_param import FlatParameter
    from torch.distributed.tensor import DTensor

    from autotune.backends.estimate.tracker import on_host

    sharded = isinstance(tensor, (DTensor, FlatParameter))
    return on_host() if offloads(distributed) and sharded else contextlib.nullcontext()


def host_step(distributed: Distributed | None, optimizer: Any) -> Any:
    """``optimizer``, its step on the host where ``distributed`` offloads (module docstring)."""
    if not offloads(distributed):
        return optimizer
    from autotune.backends.estimate.tracker import on_host

    step = optimizer.step

    def on_the_host(*args: Any, **kwargs: Any) -> Any:
        with on_host():
            return step(*args, **kwargs)

    optimizer.step = on_the_host
    return optimizer


def _gathered_from_host(original: property) -> property:
    """``FSDPParam.all_gather_inputs`` with an offloaded shard's copy to the GPU a clone (module
    docstring); else torch's own."""
    from torch.distributed.fsdp._fully_shard._fsdp_common import _to_dtype_if_needed
    from torch.distributed.fsdp._fully_shard._fsdp_param import ShardedState

    def all_gather_inputs(self: Any) -> list[torch.Tensor]:
        if not self.offload_to_cpu or self.sharded_state != ShardedState.SHARDED \
                or hasattr(self._sharded_local_tensor, "fsdp_pre_all_gather"):
            return original.fget(self)  # type: ignore[misc,no-any-return]
        return [_to_dtype_if_needed(self._sharded_param_data.clone(), self.param_dtype)]

    return property(all_gather_inputs)


def _reduced_to_host(function: Callable[..., Any]) -> Callable[..., Any]:
    """``foreach_reduce`` with its sharded gradients' ``.to(cpu)`` a copy on the host ledger."""
    import torch
    from torch.overrides import TorchFunctionMode

    from autotune.backends.estimate.tracker import on_host

    class ToHost(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            moves = any(isinstance(a, torch.device) for a in (*args, *kwargs.values()))
            if func is torch.Tensor.to and moves:
                with on_host():
                    return args[0].clone()
            return func(*args, **kwargs)

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        with ToHost():
            return function(*args, **kwargs)

    return wrapped


@contextlib.contextmanager
def host_offload() -> Iterator[None]:
    """FSDP2's copies between host and GPU made copies for the trace (module docstring)."""
    from torch.distributed.fsdp._fully_shard import _fsdp_param_group as group
    from torch.distributed.fsdp._fully_shard._fsdp_param import FSDPParam

    saved = FSDPParam.__dict__["all_gather_inputs"], group.foreach_reduce
    FSDPParam.all_gather_inputs = _gathered_from_host(saved[0])  # type: ignore[method-assign,assignment]
    group.foreach_reduce = _reduced_to_host(saved[1])
    try:
        yield
    finally:
        FSDPParam.all_gather_inputs, group.foreach_reduce = saved  # type: ignore[method-assign]


@contextlib.contextmanager
def around_rank(distributed: Distributed | None, tracker: StorageTracker) -> Iterator[None]:
    """What a trace of ``distributed``'s rank enters around its step (None: one GPU's, nothing)."""
    with contextlib.ExitStack() as stack:
        if distributed is not None and distributed.parallel.kind == FSDP \
                and distributed.parallel.fsdp_version == 1:
            from autotune.backends import fsdp1

            stack.enter_context(fsdp1.resizes_tracked(tracker.track, tracker.resized))
            stack.enter_context(fsdp1.real_storage_checks())
            stack.enter_context(fsdp1.quant_state_kept())
            if offloads(distributed):
                stack.enter_context(fsdp1.host_offload())
        elif distributed is not None and distributed.parallel.kind == FSDP:
            from autotune.backends.estimate.tracker import side_streams

            stack.enter_context(resizes_tracked(tracker))
            stack.enter_context(fsdp_regions())
            stack.enter_context(side_streams(tracker))
            if offloads(distributed):  # around the regions: foreach_reduce within its region
                stack.enter_context(host_offload())
        elif distributed is not None and distributed.parallel.kind == DDP:
            stack.enter_context(ddp_regions())
        yield
