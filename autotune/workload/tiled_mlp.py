"""Axolotl's tiled MLP (``tiled_mlp: true``), ported call for call: the MLP over sequence shards.

Axolotl's ``patch_tiled_mlp`` (src/axolotl/monkeypatch/tiled_mlp/patch.py) replaces the forward of the
model type's ``{Prefix}MLP`` class (``{Prefix}TextMLP`` for a multimodal wrapper) by
``tiled_mlp_forward``, which runs ``TiledMLP.apply(mlp_forward, self, x, num_shards, compute_params)``
(monkeypatch/tiled_mlp/base.py, the path of single-GPU, DDP and FSDP jobs):

- forward: x saved; ``torch.chunk(x, shards, dim=1)``; each shard through the original MLP forward
  under ``torch.no_grad()`` (no activation kept), the outputs concatenated;
- backward: ``x_grad = torch.zeros_like(x)``; a ``torch.zeros_like(p)`` accumulator in the parameter's
  dtype for each trainable parameter of the MLP (AXOLOTL_TILED_MLP_ACCUM_FP32 unset); shard by shard,
  the MLP recomputed with grad and ``torch.autograd.backward`` run on it, the shard's input gradient
  accumulated in place into its slice of x_grad (the shards are views made in the engine's no-grad
  mode, leaves whose ``.grad`` is that slice) and each parameter's ``.grad`` added into its accumulator;
  then each parameter's ``.grad`` set to its accumulator (or the sum with an earlier one). Under FSDP2
  the wrapping FSDPModule does not reshard between shards (``_defer_fsdp2_reshard``) and reshards once
  after.

The shards: ``tiled_mlp_num_shards``, else ``ceil(seqlen / 32768)`` of the rank's own sequence
(all-reduced MAX across ranks: every rank of the estimator has the same). ``tiled_mlp_use_original_mlp``
false (a torch.compile'd Llama MLP) and DeepSpeed's TiledMLP are not this module's: refused by the
config reader.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Iterator
from types import MethodType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

TOKENS_PER_SHARD = 32768  # patch.py tiled_mlp_forward: target_tokens_per_shard, when num_shards is unset


def shard_count(seq_len: int, shards: int | None) -> int:
    """``tiled_mlp_num_shards``, else patch.py's ``max(1, math.ceil(seqlen / 32768))``."""
    return shards if shards else max(1, math.ceil(seq_len / TOKENS_PER_SHARD))


def mlp_class(model: Any) -> type | None:
    """The class Axolotl patches: the model type's ``{Prefix}MLP``, else ``{Prefix}TextMLP``
    (patch_tiled_mlp), looked up among the model's modules by name; None where it has neither."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    prefix = type(base).__name__.removesuffix("ForCausalLM").removesuffix("ForConditionalGeneration")
    classes = {type(module).__name__: type(module) for module in base.modules()}
    return classes.get(f"{prefix}MLP") or classes.get(f"{prefix}TextMLP")


def swap_in(model: Any, shards: int | None) -> int:
    """Each MLP of Axolotl's class in ``model`` given ``tiled_mlp_forward`` (on the instance: the class
    stays as transformers has it for other traces). Returns how many."""
    cls = mlp_class(model)
    if cls is None:
        return 0
    count = 0
    for module in model.modules():
        if type(module) is cls:
            tiled = functools.partial(_tiled_forward, cls.forward, shards)  # type: ignore[attr-defined]
            setattr(module, "forward", MethodType(tiled, module))  # noqa: B010
            count += 1
    return count


def _tiled_forward(mlp_forward: Callable[..., Any], shards: int | None, self: Any, x: torch.Tensor) -> Any:
    """patch.py ``tiled_mlp_forward``: the shard count, the MLP's trainable parameters, TiledMLP."""
    compute_params = [p for p in self.parameters() if p.requires_grad]
    return _function().apply(mlp_forward, self, x, shard_count(x.shape[-2], shards), compute_params)


@contextlib.contextmanager
def _defer_fsdp2_reshard(module: Any) -> Iterator[None]:
    """base.py ``_defer_fsdp2_reshard``: the nearest FSDPModule owning ``module`` (the deepest of
    ``_module_state_mapping``'s ancestors) keeps its parameters unsharded through the shards' backwards,
    then ``reshard()`` once; nothing without FSDP2."""
    from torch.distributed._composable_state import _module_state_mapping
    from torch.distributed.fsdp import FSDPModule

    owners = [owner for owner in list(_module_state_mapping.keys())
              if isinstance(owner, FSDPModule) and any(sub is module for sub in owner.modules())]
    if not owners:
        yield
        return
    owner = min(owners, key=lambda m: sum(1 for _ in m.modules()))
    group = owner._get_fsdp_state()._fsdp_param_group
    if group is None:
        yield
        return
    previous = group.reshard_after_backward
    owner.set_reshard_after_backward(False, recurse=False)
    try:
        yield
    finally:
        owner.set_reshard_after_backward(previous, recurse=False)
        owner.reshard()


@functools.cache
def _function() -> Any:
    """base.py ``TiledMLP``, defined on first use."""
    import torch

    class TiledMLP(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, fn: Callable[..., Any], self: Any, x: torch.Tensor, shards: int,
                    compute_params: list[torch.Tensor]) -> torch.Tensor:
            ctx.fn, ctx.self, ctx.shards = fn, self, shards
            ctx.compute_params = [p for p in compute_params if p.requires_grad]
            ctx.save_for_backward(x)
            x_shards = list(torch.chunk(x, chunks=shards, dim=1))
            with torch.no_grad():
                output_shards = [fn(self, x_shard) for x_shard in x_shards]
            return torch.cat(output_shards, dim=1)

        @staticmethod
        def backward(ctx: Any, *grads: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
            (x,) = ctx.saved_tensors
            x_requires_grad = x.requires_grad
            x = x.detach()
            x.requires_grad_(x_requires_grad)
            incoming_grad = grads[0]
            x_grad = torch.zeros_like(x)
            x_shards = list(torch.chunk(x, chunks=ctx.shards, dim=1))
            prev_grads, accum_grads = {}, {}
            for p in ctx.compute_params:
                prev_grads[p] = p.grad
                accum_grads[p] = torch.zeros_like(p, dtype=p.dtype)
                p.grad = None
            shard_step = x_shards[0].numel()
            with _defer_fsdp2_reshard(ctx.self):
                for i, x_shard in enumerate(x_shards):
                    x_shard.requires_grad_(x_requires_grad)
                    offset = i * shard_step
                    x_shard.grad = x_grad.view(-1).narrow(0, offset, x_shard.numel()).view_as(x_shard)
                    incoming = incoming_grad.view(-1).narrow(0, offset, x_shard.numel()).view_as(x_shard)
                    with torch.enable_grad():
                        output = ctx.fn(ctx.self, x_shard)
                    torch.autograd.backward(output, incoming)
                    for p in ctx.compute_params:
                        if p.grad is not None:
                            accum_grads[p].add_(p.grad.detach())
                            p.grad = None
            for p in ctx.compute_params:
                p.grad = accum_grads[p] if prev_grads[p] is None else prev_grads[p] + accum_grads[p]
            return None, None, x_grad, None, None

    return TiledMLP
