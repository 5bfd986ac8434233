"""The emulated fused attention kernels (attention.py ``_FusedAttention``) as custom ops, for a
compiled step's graphs (compiled.py).

In eager PyTorch the emulation is an autograd Function whose forward and backward allocate what the
CUDA kernel allocates, from the tensors' shapes alone (``new_empty``). Traced by AOTAutograd, such
allocations are pure nodes without a data edge from the values they stand for, and its partitioner
treats them so: it merges equal ones (common subexpressions: dQ, dK and dV of one shape became one
buffer), drops unused ones (the log-sum-exp, the backward's workspaces) and moves those that only
need the forward's shapes into the forward (the gradients, then saved). A real kernel is one node of
the graph (``aten._scaled_dot_product_flash_attention`` and its backward, a fallback kernel for
inductor) taking the tensors it reads. Here each is one custom op as well, ``autotune::fused_attention``
and ``autotune::fused_attention_backward``, saving for the backward what the kernel's autograd node
saves (torch/csrc/autograd/generated/Functions.h ``ScaledDotProductFlashAttentionBackward0``: query,
key, value, output, log-sum-exp, and the bias of the memory-efficient kernel). When the graph runs,
the storage tracker runs each op's emulation under itself (tracker.py ``run_under``), so that its
allocations, workspaces included, are the eager emulation's, in its order.
"""

from __future__ import annotations

from typing import Any

import torch

from autotune.backends.estimate.attention import _FusedAttention
from autotune.backends.estimate.tracker import run_under


@torch.library.custom_op("autotune::fused_attention", mutates_args=())
def fused_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, bias: torch.Tensor | None,
                    kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's forward: its output [B, H, Sq, Dv] and log-sum-exp."""
    return _FusedAttention._kernel_forward(kind, query, value)


@fused_attention.register_fake
def _fused_attention_fake(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                          bias: torch.Tensor | None, kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    return _FusedAttention._kernel_forward(kind, query, value)


@torch.library.custom_op("autotune::fused_attention_backward", mutates_args=())
def fused_attention_backward(grad_out: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
                             value: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                             bias: torch.Tensor | None,
                             kind: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The kernel's backward: dQ, dK, dV (its workspaces allocated and freed inside)."""
    dq, dk, dv = _FusedAttention._kernel_backward(kind, query, key, value, out)
    return dq, dk, dv


@fused_attention_backward.register_fake
def _backward_fake(grad_out: torch.Tensor, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                   out: torch.Tensor, lse: torch.Tensor, bias: torch.Tensor | None,
                   kind: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    dq, dk, dv = _FusedAttention._kernel_backward(kind, query, key, value, out)
    return dq, dk, dv


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[torch.Tensor, torch.Tensor]) -> None:
    query, key, value, bias, kind = inputs
    out, lse = output
    ctx.kind = kind
    ctx.save_for_backward(query, key, value, out, lse, bias)


def _backward(ctx: Any, grad_out: torch.Tensor, grad_lse: torch.Tensor | None) -> tuple[Any, ...]:
    query, key, value, out, lse, bias = ctx.saved_tensors
    dq, dk, dv = fused_attention_backward(grad_out, query, key, value, out, lse, bias, ctx.kind)
    return dq, dk, dv, None, None


fused_attention.register_autograd(_backward, setup_context=_setup_context)
# Run by the tracker under itself, so that it records what each emulation allocates inside.
run_under(torch.ops.autotune.fused_attention.default, _fused_attention_fake)
run_under(torch.ops.autotune.fused_attention_backward.default, _backward_fake)
