"""FSDP1, torch's ``FullyShardedDataParallel`` (torch/distributed/fsdp/fully_sharded_data_parallel.py),
as accelerate 1.15 prepares it for the Trainer (accelerator.py ``Accelerator.prepare_model``, the
``DistributedType.FSDP`` branch with a plugin of fsdp_version 1), for rank 0 of the fake process
group (backends/distributed.py).

- ``FSDP(model, sharding_strategy=..., auto_wrap_policy=..., mixed_precision=..., backward_prefetch=...,
  forward_prefetch=..., use_orig_params=..., limit_all_gathers=True, device_id=...)``: the plugin's
  transformer-based auto wrap over the model's ``_no_split_modules`` (utils/dataclasses.py
  ``FullyShardedDataParallelPlugin.set_auto_wrap_policy``), so each decoder layer is one FSDP unit
  with one FlatParameter, and the root unit holds the rest (embeddings, final norm, head); for a
  PEFT model, PEFT's policy, which also makes each adapter a unit of its own (``_auto_wrap_policy``). Each
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
- FSDP's activation checkpointing (the plugin's ``activation_checkpointing``): after wrapping,
  accelerate's ``apply_activation_checkpointing`` with the same policy (``_checkpoint``).
- ``sync_module_states`` (the Trainer's default true) broadcasts rank 0's weights once before
  training; it reads tensor data and is left out (no effect on the step's memory).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

from autotune.errors import InvalidInput, JobFails


def _layer_classes(model: Any, names: set[str]) -> set[type]:
    """The classes of the model's ``_no_split_modules`` (``names``), as accelerate's
    ``set_auto_wrap_policy`` resolves them (utils/dataclasses.py: ``get_module_class_from_name``)."""
    return {type(module) for module in model.modules() if type(module).__name__ in names}


def _auto_wrap_policy(model: Any, layers: set[str]) -> Any:
    """The auto wrap policy the Trainer hands FSDP1: for a PEFT model, PEFT's own
    (transformers distributed/fsdp.py ``update_fsdp_plugin_peft``, called by trainer.py
    ``_inner_training_loop`` before ``accelerator.prepare`` whenever FSDP is on and the model is a
    PeftModel, replaces the plugin's policy by peft utils/other.py ``fsdp_auto_wrap_policy(model)``):
    torch's ``_or_policy`` of a lambda policy, which makes every leaf module with a trainable
    ``weight`` a unit of its own (each lora_A and lora_B Linear, a modules_to_save copy), and the
    transformer-based policy over the layer classes (``FSDP_TRANSFORMER_CLS_TO_WRAP``, as
    accelerate exports ``transformer_layer_cls_to_wrap``, else the model's ``_no_split_modules``:
    ``layers`` here) and PEFT's prompt encoders. So a decoder layer's unit holds its frozen weights
    alone, and the adapters their own FlatParameters. Else the plugin's transformer-based policy
    (module docstring)."""
    import os

    from peft import PeftConfig, PeftModel
    from peft.utils.other import fsdp_auto_wrap_policy
    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

    if not (isinstance(model, PeftModel) and isinstance(model.active_peft_config, PeftConfig)):
        return functools.partial(transformer_auto_wrap_policy,
                                 transformer_layer_cls=_layer_classes(model, layers))
    saved = os.environ.get("FSDP_TRANSFORMER_CLS_TO_WRAP")
    os.environ["FSDP_TRANSFORMER_CLS_TO_WRAP"] = ",".join(sorted(layers))
    try:
        return fsdp_auto_wrap_policy(model)
    except TypeError as exc:  # "Could not find the transformer layer class to wrap in the model."
        raise InvalidInput(f"PEFT's FSDP auto wrap policy cannot wrap {type(model).__name__} by "
                           f"{', '.join(sorted(layers))}: {exc}") from exc
    finally:
        if saved is None:
            del os.environ["FSDP_TRANSFORMER_CLS_TO_WRAP"]
        else:
            os.environ["FSDP_TRANSFORMER_CLS_TO_WRAP"] = saved


def wrap(trained: Any, model: Any, layers: set[str], parallel: Any, mesh: Any, precision: str) -> Any:
    """FSDP1 over ``trained`` (``model`` and its loss, distributed.TrainingLoss; the decoder layer
    classes named ``layers``) as the module docstring says, in the model's FakeTensorMode; returns
    the root FullyShardedDataParallel, whose call is the step's loss."""
    import torch
    from torch.distributed.fsdp import BackwardPrefetch, CPUOffload, MixedPrecision, ShardingStrategy
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    dtype = {"fp32": None, "amp": torch.float16, "bf16": torch.bfloat16}[precision]
    storage = _quant_storage(model)
    if storage is not None and storage.is_floating_point:
        # transformers distributed/fsdp.py update_fsdp_plugin_peft: a bitsandbytes base whose
        # bnb_4bit_quant_storage is a float dtype sets the plugin's policy to that dtype, whatever
        # the mode (accelerate utils/dataclasses.py set_mixed_precision(..., override=True))
        dtype = storage
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
    wrap_policy = _auto_wrap_policy(model, layers)
    _refuse_param_wrappers(trained)
    try:
        root = FSDP(
            trained, sharding_strategy=strategy, auto_wrap_policy=wrap_policy,
            mixed_precision=policy, backward_prefetch=prefetch, forward_prefetch=parallel.forward_prefetch,
            use_orig_params=parallel.use_orig_params, limit_all_gathers=True,
            cpu_offload=CPUOffload(offload_params=parallel.offload_params),
            device_id=torch.device("cpu"), **where)
    except ValueError as exc:
        if "uniform dtype" not in str(exc):
            raise
        # _flat_param.py FlatParamHandle._validate_tensors_to_flatten: the job fails so as it wraps
        raise JobFails(
            f"FSDP1 cannot wrap {type(model).__name__}: {exc} (torch's FlatParamHandle."
            "_validate_tensors_to_flatten: each unit's parameters become one FlatParameter of one dtype, "
            "and the model keeps some in float32, e.g. transformers' _keep_in_fp32_modules_strict); the "
            "job fails as it wraps the model: use fsdp_version 2 (fully_shard shards each parameter "
            "apart)") from exc
    if parallel.activation_checkpointing:
        _checkpoint(root, wrap_policy)
    if precision != "fp32":  # prepare_model: `if self.mixed_precision != "no"`
        _upcast(root)
    return root


def _refuse_param_wrappers(model: Any) -> None:
    """PEFT's ParamWrapper (LoRA on a module's parameter, e.g. fused MoE experts' 3-D weights) under
    FSDP1 is not modelled: its forward builds the delta weight from lora_A and lora_B
    (peft/tuners/lora/layer.py ``ParamWrapper._activate_lora`` -> ``get_delta_weight``) inside its
    parent's forward, outside the forward of the FSDP units PEFT's policy makes of them, while their
    parameters are views of a resharded FlatParameter; the trace cannot stand for that step."""
    wrappers = [name.removeprefix("model.base_model.model.") for name, module in model.named_modules()
                if type(module).__name__ == "ParamWrapper"]
    if wrappers:
        raise InvalidInput(
            f"LoRA on parameters (PEFT's ParamWrapper: {wrappers[0]}"
            f"{f' and {len(wrappers) - 1} more' if len(wrappers) > 1 else ''}) under FSDP1 is not "
            "modelled: its "
            "delta weight is built from lora_A and lora_B outside their FSDP units' forward "
            "(peft/tuners/lora/layer.py ParamWrapper.get_delta_weight); use fsdp_version 2, or leave "
            "those parameters out of the LoRA targets")


def _checkpoint(root: Any, wrap_policy: Any) -> None:
    """FSDP's activation checkpointing under FSDP1, as accelerate's ``prepare_model`` applies it
    (accelerator.py, the FSDP1 branch, the same in 1.13.0, Axolotl's pin, and 1.15): after wrapping,
    ``apply_activation_checkpointing(model, checkpoint_wrapper_fn=functools.partial(checkpoint_wrapper,
    checkpoint_impl=CheckpointImpl.NO_REENTRANT), auto_wrap_policy=fsdp_plugin.auto_wrap_policy)``
    over the root FullyShardedDataParallel, with the policy FSDP wrapped by: torch's
    ``_recursive_wrap`` puts a ``checkpoint_wrapper`` (preserve_rng_state left true) around each
    module the policy picks, inside its FSDP unit (a unit is no decoder layer; the layer it wraps
    is), and under PEFT's policy around each trainable leaf (lora_A, lora_B) too, nested inside the
    layer's; each runs in torch.utils.checkpoint, which keeps its inputs and recomputes the rest in
    backward. Traced as the library does it."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointImpl,
        apply_activation_checkpointing,
        checkpoint_wrapper,
    )

    apply_activation_checkpointing(
        root, auto_wrap_policy=wrap_policy,
        checkpoint_wrapper_fn=functools.partial(checkpoint_wrapper,
                                                checkpoint_impl=CheckpointImpl.NO_REENTRANT))


def _quant_storage(model: Any) -> Any:
    """The dtype a 4-bit base's packed weights are stored in (``bnb_4bit_quant_storage``): its
    4-bit layers' weight dtype (bitsandbytes' ``Params4bit``, or the estimator's emulation,
    backends/estimate/nf4.py); None for a model without one."""
    for module in model.modules():
        weight: Any = getattr(module, "weight", None)
        if getattr(module, "stores_params4bit", False) or type(weight).__name__ == "Params4bit":
            return weight.dtype
    return None


@contextlib.contextmanager
def quant_state_kept() -> Iterator[None]:
    """FSDP1's buffer cast at the root's lazy init (_runtime_utils.py ``_lazy_init`` ->
    ``_cast_buffers_to_dtype_and_device`` over ``_get_buffers_and_dtypes_for_computation``: each
    float buffer to the policy's ``buffer_dtype``) without the emulated 4-bit layers' quantization
    state: nf4.py keeps it in buffers so that it is counted, but bitsandbytes keeps it in a
    ``QuantState`` on the weight and the module (``Params4bit._quantize``: ``module.quant_state``),
    plain tensors that FSDP1 neither casts nor moves."""
    from torch.distributed.fsdp import _runtime_utils

    saved = _runtime_utils._get_buffers_and_dtypes_for_computation

    def buffers_and_dtypes(state: Any, root_module: Any) -> tuple[list[Any], list[Any]]:
        buffers, dtypes = saved(state, root_module)
        quant_state = {id(buffer) for module in root_module.modules()
                       if getattr(module, "stores_params4bit", False) for buffer in module.buffers()}
        kept = [(b, d) for b, d in zip(buffers, dtypes, strict=True) if id(b) not in quant_state]
        return [b for b, _ in kept], [d for _, d in kept]

    _runtime_utils._get_buffers_and_dtypes_for_computation = buffers_and_dtypes
    try:
        yield
    finally:
        _runtime_utils._get_buffers_and_dtypes_for_computation = saved


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


def _on_host(flat_param: Any) -> bool:
    """Whether ``flat_param`` is its host shard (``_use_sharded_flat_param``: ``flat_param.data =
    flat_param._local_shard``), by storage: on a GPU, ``flat_param.device`` is then the CPU."""
    return bool(_storage_key(flat_param) == _storage_key(flat_param._local_shard))


@contextlib.contextmanager
def host_offload() -> Iterator[None]:
    """FSDP1's ``CPUOffload(offload_params=True)`` as on a GPU, on the tracker's host ledger (module
    docstring: the fake tensors are CPU tensors standing for the GPU's, so FSDP1's moves between the
    two copy nothing, and ``pin_memory`` has no fake kernel):

    - _flat_param.py ``FlatParamHandle.init_flat_param_attributes`` pins the local shard
      (``_local_shard.pin_memory()``) and makes ``_cpu_grad`` (``zeros_like(..., device=cpu)
      .pin_memory()``): ``pin_memory`` puts a storage just made onto the host ledger
      (tracker.to_host) and returns the tensor itself (pinned or pageable, the same host bytes;
      the local shard is host memory since it was loaded, rank.on_host_when);
    - ``FlatParamHandle.pre_unshard``: ``flat_param_to(self.device, non_blocking=True)`` of a
      flat parameter on the host (no mixed precision) is a copy on the GPU, which lives until the
      all-gather points the flat parameter at the gathered one; under mixed precision
      ``_use_low_precision_shard`` copies ``_local_shard.to(self.device)`` to the GPU (a full
      precision temporary) before casting it into ``_mp_shard``: each such ``.to`` a clone;
    - ``FlatParamHandle._writeback_orig_params`` (the start of ``pre_unshard``) on a flat parameter
      on the host works on the host: the original parameters' gradients are views of ``_cpu_grad``
      from the forward's reshard on (``_use_sharded_grad_views`` of ``sharded_grad``, which is
      ``_cpu_grad`` whenever it exists), so in the pre-backward it finds them apart from
      ``flat_param.grad`` (None) and writes them back into ``zeros_like(flat_param)``, a host
      buffer ``prepare_gradient_for_backward`` drops again: inside it, storages are host memory;
    - ``FlatParamHandle.prepare_gradient_for_backward`` tells a sharded gradient on the host
      (``grad_offloaded = flat_param.grad.device != self.device``) from one on the GPU, which it
      would keep as ``_saved_grad_shard`` to accumulate into: with offload every sharded
      ``flat_param.grad`` is the host's (``_cpu_grad``, set by ``prepare_gradient_for_optim``, or
      the buffer above), so that branch is taken: ``_cpu_grad`` kept (cast as there under
      ``keep_low_precision_grads``), ``flat_param.grad`` dropped;
    - _runtime_utils.py ``_offload_grad``'s ``_cpu_grad.copy_(grad_to_offload)`` writes into the
      host buffer and allocates nothing, as traced; the GPU's sharded gradient
      (``_saved_grad_shard``) lives until ``_finalize_params`` (``prepare_gradient_for_optim``
      deletes it at the end of the backward), also as traced;
    - _runtime_utils.py ``_post_backward_final_callback`` waits for those copies
      (``current_stream().synchronize()``), which torch.cpu's stand-in ``Stream`` lacks: a wait
      that allocates nothing, a no-op here;
    - the optimizer's step runs on the host shards and ``_cpu_grad`` (rank.host_step)."""
    import torch
    from torch.distributed.fsdp._flat_param import FlatParamHandle

    saved = {name: vars(FlatParamHandle)[name] for name in (
        "init_flat_param_attributes", "_writeback_orig_params", "pre_unshard", "_use_low_precision_shard",
        "prepare_gradient_for_backward")}
    waits = "synchronize" not in vars(torch.cpu.Stream)
    if waits:
        torch.cpu.Stream.synchronize = lambda self: None  # type: ignore[attr-defined]
    for name, method in _offloaded(saved).items():
        setattr(FlatParamHandle, name, method)
    try:
        yield
    finally:
        for name, method in saved.items():
            setattr(FlatParamHandle, name, method)
        if waits:
            del torch.cpu.Stream.synchronize  # type: ignore[attr-defined]


def _offloaded(saved: dict[str, Callable[..., Any]]) -> dict[str, Callable[..., Any]]:
    """The FlatParamHandle methods ``host_offload`` replaces (its docstring), over torch's own
    (``saved``), which run unchanged without offload."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.overrides import TorchFunctionMode

    from autotune.backends.estimate.tracker import on_host, to_host

    class Pinned(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            if func is torch.Tensor.pin_memory and isinstance(args[0], FakeTensor):
                return to_host(args[0])
            return func(*args, **(kwargs or {}))

    class CopiedToGpu(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            moves = any(isinstance(a, torch.device) for a in (*args, *kwargs.values()))
            if func is torch.Tensor.to and moves:
                return args[0].clone()
            return func(*args, **kwargs)

    def init_flat_param_attributes(self: Any) -> None:
        with Pinned() if self._offload_params else contextlib.nullcontext():
            saved["init_flat_param_attributes"](self)

    def writeback_orig_params(self: Any) -> bool:
        with on_host() if self._offload_params and _on_host(self.flat_param) else contextlib.nullcontext():
            return bool(saved["_writeback_orig_params"](self))

    def pre_unshard(self: Any) -> bool:
        # its branches with offload: the low precision shard (mixed precision), else the copy
        copies = bool(self._offload_params and _on_host(self.flat_param)
                      and not (self._uses_param_mixed_precision and not self._force_full_precision))
        ran = bool(saved["pre_unshard"](self))  # skips the copy: flat_param.device == self.device here
        if copies:
            with CopiedToGpu():
                self.flat_param_to(self.device, non_blocking=True)
        return ran or copies

    def use_low_precision_shard(self: Any) -> None:
        with CopiedToGpu() if self._offload_params else contextlib.nullcontext():
            saved["_use_low_precision_shard"](self)

    def prepare_gradient_for_backward(self: Any) -> None:
        flat_param = self.flat_param
        if not self._offload_params or flat_param.grad is None \
                or flat_param.grad.size() != flat_param._local_shard.size():
            saved["prepare_gradient_for_backward"](self)
            return
        cpu_grad = flat_param._cpu_grad
        if self._keep_low_precision_grads and cpu_grad.dtype != flat_param._local_shard.dtype:
            with on_host():
                cpu_grad.data = cpu_grad.to(flat_param._local_shard.dtype)
        flat_param.grad = None

    return {"init_flat_param_attributes": init_flat_param_attributes,
            "_writeback_orig_params": writeback_orig_params, "pre_unshard": pre_unshard,
            "_use_low_precision_shard": use_low_precision_shard,
            "prepare_gradient_for_backward": prepare_gradient_for_backward}
