"""Activation offloading: TRL's ``OffloadActivations`` around each training step, ported.

TRL's SFTTrainer (``activation_offloading=True``: sft_trainer.py ``training_step`` runs under
``get_act_offloading_ctx_manager(model)``) and Axolotl (``activation_offloading: true``, and
``gradient_checkpointing: offload``, which its validation turns into that: core/trainers/mixins/
activation_checkpointing.py ``ActivationOffloadingMixin``) wrap each training step's forward and
backward in trl/models/activation_offloading.py ``OffloadActivations``, a ``saved_tensors_hooks``:

- pack (forward): a saved tensor of at least ``min_offload_size`` bytes (1024) that is not a
  parameter, a buffer or a parameter's storage, and whose storage is not offloaded already in this
  forward, is copied to a host tensor (pinned) and stands in the graph as an id; a view with an
  offset or a non-contiguous one is first made contiguous (``clone``: a GPU allocation). With
  ``use_streams`` (the default) the copy runs on a second stream and the GPU activation is kept
  alive in a stash until ``max_fwd_stash_size`` (5) newer ones were offloaded;
- unpack (backward): an activation still in the forward stash is used as it is; any other is
  copied back to the GPU, and kept until the backward moves on to the next autograd node (the
  previous node's are then dropped), the rest dropped by a callback at the end of backward;
- the model's output head runs under a ``NoOpManager`` (its saved tensors stay on the GPU):
  ``get_act_offloading_ctx_manager`` hooks ``lm_head`` (``output``, ``decoder``, ``final_layer_norm``
  or ``ln_f`` otherwise; Axolotl's PEFT variant also ``head``).

Without streams (``use_streams=False``: Axolotl's ``activation_offloading: legacy``,
ActivationOffloadingMixin's ``use_streams = activation_offloading != "legacy"``) the copy is made on
the compute stream and nothing is stashed: pack keeps no GPU tensor (and tracks no storage, so a
storage saved twice is copied twice: "single-stream has no release point"), unpack
(``unpack_tensor_single_stream``) brings each one back with ``.to(device)`` and keeps no reference.

``Offloader`` is that class ported line for line over what it allocates, with its host copies made
by the caller's ``host_copy`` (the estimator's are outside the caching allocator: the tracker does
not count them) and its stream events dropped: the stashes keep what they keep, and a freed block
is reusable at once, as the estimator's one-stream allocator has it (allocator.py). It counts the
host memory the copies hold (``host_peak_bytes``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

NAME = "TRL's OffloadActivations (emulated: streams, 5 activations stashed, none under 1 KiB)"
SINGLE_STREAM_NAME = "TRL's OffloadActivations without streams (emulated: nothing stashed, none under 1 KiB)"
MIN_OFFLOAD_BYTES = 1024  # OffloadActivations' min_offload_size default
MAX_FWD_STASH = 5  # its max_fwd_stash_size default
# The output heads get_act_offloading_ctx_manager keeps on the GPU, in the order it looks for them
# (TRL's; Axolotl's PEFT variant get_lora_act_offloading_ctx_manager adds "head" last).
HEADS = ("output", "lm_head", "decoder", "final_layer_norm", "ln_f", "head")


def _storage_key(tensor: torch.Tensor) -> tuple[Any, Any, Any]:
    """_get_unique_tensor_key: the storage (its identity standing for its address), the offset and
    the dtype."""
    return tensor.untyped_storage()._cdata, tensor.storage_offset(), tensor.dtype


class Offloader:
    """OffloadActivations with ``use_streams`` (module docstring); enter it around a step's forward
    and backward, as the trainers' ``training_step`` does. Its saved_tensors_hooks are made here, so
    that importing this module imports no torch."""

    def __init__(self, model: Any, host_copy: Callable[[torch.Tensor], torch.Tensor],
                 streams: bool = True) -> None:
        from torch.autograd.graph import saved_tensors_hooks

        self.host_copy = host_copy
        self.streams = streams
        # id -> (the tensor, or its host copy; the GPU tensor's (shape, stride, offset) if offloaded)
        self.tracker: dict[int, tuple[torch.Tensor, tuple[Any, Any, Any] | None]] = {}
        self.tensor_id = 0
        self.first_forward_call = True
        self.first_backward_call = True
        self.storage_to_id: dict[tuple[Any, Any, Any], int] = {}
        self.key_of_id: dict[int, tuple[Any, Any, Any]] = {}
        self.fwd_stash: dict[int, torch.Tensor] = {}
        self.bwd_stash: dict[int, torch.Tensor] = {}
        self.node: Any = None  # the autograd node unpacking, in the step's own backward graph
        self.graph = -1  # that graph's task id (a reentrant checkpoint's recompute runs another)
        # update_model_params: the parameters' storages are never offloaded
        self.param_storages = {p.untyped_storage()._cdata for p in model.parameters()}
        self.host_bytes = 0
        self.host_peak_bytes = 0
        self._handles = _keep_head_on_gpu(model)
        self._hooks = saved_tensors_hooks(self._pack, self._unpack)

    def close(self) -> None:
        """Remove the output head's hooks (TRL leaves them for the trainer's life)."""
        for handle in self._handles:
            handle.remove()

    def __enter__(self) -> Any:
        # OffloadActivations.__enter__: whatever a step left is dropped
        self.tracker.clear()
        self.storage_to_id.clear()
        self.key_of_id.clear()
        self.tensor_id = 0
        self.first_forward_call = self.first_backward_call = True
        self.bwd_stash.clear()
        self.fwd_stash.clear()
        self.host_bytes = 0  # the host copies went with the tracker
        return self._hooks.__enter__()

    def __exit__(self, *args: Any) -> None:
        self.bwd_stash.clear()
        self.fwd_stash.clear()
        self._hooks.__exit__(*args)

    def _release(self, tensor_id: int) -> None:
        key = self.key_of_id.pop(tensor_id, None)
        if key is not None and self.storage_to_id.get(key) == tensor_id:
            del self.storage_to_id[key]

    def _track(self, key: tuple[Any, Any, Any], tensor_id: int) -> None:
        self.storage_to_id[key] = tensor_id
        self.key_of_id[tensor_id] = key

    def _pack(self, activation: torch.Tensor) -> int:
        import torch

        if self.first_forward_call:
            self.first_forward_call, self.first_backward_call = False, True
            self.storage_to_id.clear()
            self.key_of_id.clear()
        self.tensor_id += 1
        tensor_id = self.tensor_id
        key = _storage_key(activation)
        keep = (key in self.storage_to_id
                or activation.element_size() * activation.nelement() < MIN_OFFLOAD_BYTES
                or isinstance(activation, torch.nn.Parameter)
                or activation.untyped_storage()._cdata in self.param_storages)
        if keep:
            self.tracker[tensor_id] = (activation, None)
            if key in self.storage_to_id:
                self._track(key, tensor_id)
            return tensor_id
        for stashed in list(self.fwd_stash) if self.streams else []:  # sync back and drop old ones
            if stashed > tensor_id - MAX_FWD_STASH:
                break
            del self.fwd_stash[stashed]
            self._release(stashed)
        if 0 in activation.stride():  # a broadcast: its storage alone goes over
            host = self.host_copy(torch.as_strided(activation, (activation.untyped_storage().nbytes()
                                                               // activation.element_size(),), (1,), 0))
        else:
            if activation.storage_offset() != 0:
                activation = activation.clone(memory_format=torch.contiguous_format)
            elif not activation.is_contiguous():
                activation = activation.contiguous()
            host = self.host_copy(activation)
        self.host_bytes += host.untyped_storage().nbytes()
        self.host_peak_bytes = max(self.host_peak_bytes, self.host_bytes)
        layout = (activation.size(), activation.stride(), activation.storage_offset())
        self.tracker[tensor_id] = (host, layout)
        if self.streams:
            self.fwd_stash[tensor_id] = activation  # until the copy is done (max_fwd_stash_size)
            self._track(key, tensor_id)
        return tensor_id

    def _unpack(self, tensor_id: int) -> torch.Tensor:
        import torch

        if self.first_backward_call:
            self.first_backward_call = False
            self.graph = torch._C._current_graph_task_id()
            engine = torch.autograd.Variable._execution_engine  # type: ignore[attr-defined]
            engine.queue_callback(self.bwd_stash.clear)  # wait_and_del_remaining_references
        tensor, layout = self.tracker.pop(tensor_id)
        if layout is not None and not self.streams:  # unpack_tensor_single_stream: ``.to(device)``
            self.host_bytes -= tensor.untyped_storage().nbytes()
            tensor = torch.as_strided(tensor.clone(), *layout)
        elif layout is not None:
            node = torch._C._current_autograd_node()
            previous = []
            # a new node of the step's graph: the previous one's tensors go once it has run
            if torch._C._current_graph_task_id() == self.graph and node is not self.node:
                self.node = node
                previous = list(self.bwd_stash)
            uses = 0
            self.host_bytes -= tensor.untyped_storage().nbytes()  # the host copy goes with its entry
            if tensor_id in self.fwd_stash:
                gpu = self.fwd_stash[tensor_id]
                brought_back = False
            else:
                # ``.to(device)``: a new GPU allocation, in the original layout (a broadcast's storage)
                gpu = torch.as_strided(tensor.clone(), *layout)
                self.bwd_stash[tensor_id] = gpu
                brought_back = True
                uses = _uses(gpu)

            def after_node(outputs: Any, inputs: Any) -> Any:
                kept = self.bwd_stash.get(tensor_id)
                if brought_back and kept is not None and _uses(kept) > uses:
                    # a view of it lives on: record_stream, and its last reference frees it
                    del self.bwd_stash[tensor_id]
                for stashed in list(self.fwd_stash):  # the forward's stash is done with
                    del self.fwd_stash[stashed]
                    self._release(stashed)
                for old in previous:
                    self.bwd_stash.pop(old, None)
                return outputs

            if node is not None:
                node.register_hook(after_node)
            tensor = gpu
        self._release(tensor_id)
        if not self.tracker:
            self.first_forward_call = True
        return tensor


def _uses(tensor: torch.Tensor) -> int:
    """The storage's use count, which unpack compares after the node (Note: [Track views of the
    unpacked])."""
    import torch

    return int(torch._C._storage_Use_Count(tensor.untyped_storage()._cdata))


def _keep_head_on_gpu(model: Any) -> list[Any]:
    """get_act_offloading_ctx_manager's output-head hooks: the head's forward under a NoOpManager
    (identity hooks: the innermost saved_tensors_hooks win, so tensors saved inside stay as they are)."""
    import torch
    from torch.autograd.graph import saved_tensors_hooks

    unwrapped = model.module if hasattr(model, "module") else model
    if hasattr(unwrapped, "base_model") and hasattr(unwrapped, "peft_config"):
        unwrapped = unwrapped.base_model
    for name in HEADS:
        head = getattr(unwrapped, name, None)
        if name == "decoder" and head is not None:
            head = getattr(head, "output", None) or getattr(head, "lm_head", None)
        if isinstance(head, torch.nn.Module):
            break
    else:
        return []
    noop = saved_tensors_hooks(lambda tensor: tensor, lambda tensor: tensor)
    return [head.register_forward_pre_hook(lambda *args: noop.__enter__()),
            head.register_forward_hook(lambda *args: noop.__exit__(), always_call=True)]
