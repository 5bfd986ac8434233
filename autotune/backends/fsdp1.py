"""FSDP1, torch's ``FullyShardedDataParallel`` (torch/distributed/fsdp/fully_sharded_data_parallel.py),
as accelerate 1.15 prepares it for the Trainer (accelerator.py ``Accelerator.prepare_model``, the
``DistributedType.FSDP`` branch with a plugin of fsdp_version 1), for rank 0 of the fake process
group (backends/distributed.py).

- ``FSDP(model, sharding_strategy=..., auto_wrap_policy=..., mixed_precision=..., backward_prefetch=...,
  forward_prefetch=..., use_orig_params=..., limit_all_gathers=True, device_id=...)``: the plugin's
  transformer-based auto wrap over the model's ``_no_split_modules`` (utils/dataclasses.py
  ``FullyShardedDataParallelPlugin.set_auto_wrap_policy``), so each decoder layer is one FSDP unit
  with one FlatParameter, and the root unit holds the rest (embeddings, final norm, head). Each
  rank keeps its 1/N shard of each FlatParameter (padded to a multiple of N,
  _flat_param.py ``FlatParamHandle.shard``) and all-gathers a unit whole into its
  ``_full_param_padded`` while it runs.
- Sharding strategy: FULL_SHARD (reshard after forward) or SHARD_GRAD_OP (kept gathered to the
  backward) over the job's ranks; HYBRID_SHARD / _HYBRID_SHARD_ZERO2 over a node's ranks with the
  job's 2-D mesh (nodes x a node's ranks).
- Mixed precision: bf16/fp16 modes are the plugin's ``MixedPrecision(param_dtype, reduce_dtype,
  buffer_dtype)`` all of the mode's dtype (``set_mixed_precision``, buffer_autocast False) **and**
  accelerate's autocast around the model's forward (``native_amp`` is set for FSDP1, unlike FSDP2):
  the estimator's autocast. After wrapping, accelerate upcasts every trainable FlatParameter that
  is not float32 to float32 (prepare_model: "we follow DeepSpeed's strategy to hold the parameters
  in full precision"), so the shards, gradients and Adam state are float32, and each gather casts
  the shard into a 16-bit ``_mp_shard`` first.
- ``sync_module_states`` (the Trainer's default true) broadcasts rank 0's weights once before
  training; it reads tensor data and is left out (no effect on the step's memory).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

from autotune.errors import InvalidInput


def _layer_classes(model: Any, names: set[str]) -> set[type]:
    """The classes of the model's ``_no_split_modules`` (``names``), as accelerate's
    ``set_auto_wrap_policy`` resolves them (utils/dataclasses.py: ``get_module_class_from_name``)."""
    return {type(module) for module in model.modules() if type(module).__name__ in names}


def wrap(trained: Any, model: Any, layers: set[str], parallel: Any, mesh: Any, precision: str) -> Any:
    """FSDP1 over ``trained`` (``model`` and its loss, distributed.TrainingLoss; the decoder layer
    classes named ``layers``) as the module docstring says, in the model's FakeTensorMode; returns
    the root FullyShardedDataParallel, whose call is the step's loss."""
    import torch
    from torch.distributed.fsdp import BackwardPrefetch, MixedPrecision, ShardingStrategy
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

    if parallel.activation_checkpointing:
        raise InvalidInput("FSDP's own activation checkpointing with FSDP1 is not modelled: use a ckpt mode "
                           "(gradient checkpointing)")
    dtype = {"fp32": None, "amp": torch.float16, "bf16": torch.bfloat16}[precision]
    policy = None if dtype is None else MixedPrecision(param_dtype=dtype, reduce_dtype=dtype,
                                                       buffer_dtype=dtype)
    if parallel.nodes > 1:
        strategy = ShardingStrategy.HYBRID_SHARD if parallel.reshard_after_forward \
            else ShardingStrategy._HYBRID_SHARD_ZERO2
        where: dict[str, Any] = {"device_mesh": mesh}
    else:
        strategy = ShardingStrategy.FULL_SHARD if parallel.reshard_after_forward \
            else ShardingStrategy.SHARD_GRAD_OP
        where = {"process_group": mesh.get_group()}
    prefetch = None if parallel.backward_prefetch is None else BackwardPrefetch[parallel.backward_prefetch]
    root = FSDP(
        trained, sharding_strategy=strategy,
        auto_wrap_policy=functools.partial(transformer_auto_wrap_policy,
                                           transformer_layer_cls=_layer_classes(model, layers)),
        mixed_precision=policy, backward_prefetch=prefetch, forward_prefetch=parallel.forward_prefetch,
        use_orig_params=parallel.use_orig_params, limit_all_gathers=True,
        device_id=torch.device("cpu"), **where)
    if dtype is not None:
        _upcast(root)
    return root


def _upcast(root: Any) -> None:
    """accelerate's float32 upcast of each trainable FlatParameter (module docstring):
    ``param.data = param.data.to(torch.float32)`` and the handle's ``_orig_param_dtype``. The
    original parameters (use_orig_params) are views of the old shard until FSDP next sets its
    sharded views, at the first forward's gather: set here at once, so the old 16-bit shard is not
    counted beside the new one (a transient of 1/N of a unit's 16-bit weights, freed at the first
    forward's gather)."""
    import torch
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    for module in FSDP.fsdp_modules(root):
        handle: Any = module._handle
        param = getattr(module, "_flat_param", None) if module._has_params else None
        if param is not None and param.dtype != torch.float32 and param.requires_grad:
            param.data = param.data.to(torch.float32)
            handle._orig_param_dtype = torch.float32
            if handle._use_orig_params:
                handle._use_sharded_views()


def flat_parameters(root: Any) -> list[Any]:
    """Each FSDP unit's FlatParameter under ``root``, children before parents (the order their
    shards reach the GPU as ``model.to`` would move them, traced_step.load_weights)."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    units = [module for module in FSDP.fsdp_modules(root) if module._has_params]
    return [unit._flat_param for unit in reversed(units)]


def _storage_key(tensor: Any) -> int:
    from torch.distributed.tensor import DTensor

    if isinstance(tensor, DTensor):
        tensor = tensor._local_tensor
    return int(tensor.untyped_storage()._cdata)


def _same_storage(a: Any, b: Any) -> bool:
    """_flat_param.py ``_same_storage`` by storage identity: a FakeTensor's ``data_ptr()`` is 0 for
    every storage (deprecated), so the original would find any two tensors to share one."""
    return _storage_key(a) == _storage_key(b)


def _data_ptr_allocated(tensor: Any) -> bool:
    """torch/distributed/utils.py ``_data_ptr_allocated`` (``data_ptr() > 0``, 0 on every
    FakeTensor) by what it asks: whether the storage holds memory."""
    return int(tensor.untyped_storage().nbytes()) > 0


def _catch_all_reshard(state: Any) -> None:
    """_runtime_utils.py ``_catch_all_reshard`` with its already-resharded check (the flat
    parameter's ``data_ptr()`` is its local shard's) made by storage and offset, as on a GPU."""
    from torch.distributed.fsdp import _runtime_utils as runtime

    handle = state._handle
    if not handle:
        return
    flat_param = handle.flat_param
    already_resharded = (_storage_key(flat_param) == _storage_key(flat_param._local_shard)
                         and flat_param.storage_offset() == flat_param._local_shard.storage_offset()
                         and not handle._skipped_use_sharded_views)
    if already_resharded:
        return
    runtime._reshard(state, handle, runtime._should_free_in_backward(state, handle))


@contextlib.contextmanager
def real_storage_checks() -> Iterator[None]:
    """FSDP1's checks of ``data_ptr()`` (``_same_storage``, ``_data_ptr_allocated``,
    ``_catch_all_reshard``) answered as on a GPU for the trace (the functions above)."""
    from torch.distributed.fsdp import _flat_param, _runtime_utils

    saved = _flat_param._same_storage, _flat_param._data_ptr_allocated, _runtime_utils._catch_all_reshard
    _flat_param._same_storage = _same_storage
    _flat_param._data_ptr_allocated = _data_ptr_allocated
    _runtime_utils._catch_all_reshard = _catch_all_reshard
    try:
        yield
    finally:
        _flat_param._same_storage, _flat_param._data_ptr_allocated, _runtime_utils._catch_all_reshard = saved


@contextlib.contextmanager
def resizes_tracked(track: Callable[[Any], None], resized: Callable[[Any], None]) -> Iterator[None]:
    """FSDP1's frees and re-allocations by storage resize (torch/distributed/utils.py
    ``_free_storage`` / ``_alloc_storage``, imported by name into _flat_param.py): the gathered
    ``_full_param_padded`` and the 16-bit ``_mp_shard``, made whole at wrapping and resized to 0
    there, then brought back at each gather. A storage first seen at its allocation is tracked
    then (``track``), every later resize told (``resized``)."""
    from torch.distributed.fsdp import _flat_param

    saved = _flat_param._alloc_storage, _flat_param._free_storage

    def alloc_storage(tensor: Any, size: Any) -> None:
        saved[0](tensor, size)
        track(tensor)
        resized(tensor)

    def free_storage(tensor: Any) -> None:
        saved[1](tensor)
        resized(tensor)

    _flat_param._alloc_storage, _flat_param._free_storage = alloc_storage, free_storage
    try:
        yield
    finally:
        _flat_param._alloc_storage, _flat_param._free_storage = saved
