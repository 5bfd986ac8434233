"""Scaled dot-product attention as CUDA would run it, for the estimator.

On CUDA, ``F.scaled_dot_product_attention`` dispatches to a fused kernel when it can
(aten/src/ATen/native/transformers/cuda/sdp_utils.cpp, priority flash > memory-efficient > math).
Fused kernels keep no seq x seq attention matrix: they save the output and a float32 log-sum-exp
per row, and recompute attention in backward. On the CPU the same call takes the math path
whenever dropout is on, which saves the full attention matrix and its dropout mask, so running
the CPU kernel would overstate CUDA's memory by O(batch x heads x seq^2) per layer.

``emulated_sdpa`` allocates (on fake tensors) exactly the buffers the chosen CUDA kernel
allocates, with their dtypes and alignment paddings:

flash (FlashAttention-2, flash_api.cpp ``mha_fwd``/``mha_bwd``)
    forward: out [B, Sq, H, Dv] (q dtype), softmax_lse float32 [B, H, Sq], rng_state int64 [2]
    backward: dq/dk/dv like q/k/v; temporaries dq_accum float32
    [B, round128(Sq), H, round32(D)] and softmax_d float32 [B, H, round128(Sq)]
memory-efficient (cutlass, attention.cu ``_efficient_attention_forward``/``_backward``)
    a boolean mask is first turned into an additive bias of q's dtype
    (``convert_boolean_attn_mask``) whose last dim is padded to a multiple of 16
    (``preprocess_mask``, mem_eff_alignment = 16); the bias is saved for backward.
    forward: out [B, Sq, H, Dv], logsumexp float32 [B, H, round32(Sq)] (kAlignLSE = 32)
    backward: dq/dk/dv; temporary delta float32 [B, H, round32(Sq)]
math
    the composite math path itself (``_scaled_dot_product_attention_math``), run as is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

FLASH_HEAD_DIM_MAX = 256  # sdp_utils.cpp check_head_dim_size_flash
HEAD_DIM_ALIGNMENT = 8  # both fused kernels need head_dim % 8 == 0 for 16-bit inputs
FP32_HEAD_DIM_ALIGNMENT = 4  # memory-efficient kernel, float32 inputs (minimum_gemm_alignment)
MEM_EFF_BIAS_ALIGNMENT = 16  # attention.cu: mem_eff_alignment
LSE_ALIGNMENT = 32  # kernel_forward.h: kAlignLSE
FLASH_SEQ_ROUND = 128  # flash_api.cpp: seqlen_q_rounded = round_multiple(seqlen_q, 128)
FLASH_HEAD_ROUND = 32  # flash_api.cpp: head_size_rounded for dq_accum


@dataclass(frozen=True)
class AttentionKernels:
    """Which fused SDPA kernels the target GPU offers."""

    flash: bool  # FlashAttention-2 in PyTorch needs sm80+
    bf16: bool  # bfloat16 inputs need sm80+ for both fused kernels


def _round_up(value: int, multiple: int) -> int:
    return (value + multiple - 1) // multiple * multiple


def choose_kernel(
    kernels: AttentionKernels,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None,
    is_causal: bool,
) -> str:
    """The kernel CUDA's SDPA would pick: "flash", "efficient" or "math"."""
    dtype = query.dtype
    if key.dtype != dtype or value.dtype != dtype or query.dim() != 4:
        return "math"
    if dtype == torch.bfloat16 and not kernels.bf16:
        return "math"
    head_dim = query.shape[-1]
    value_dim = value.shape[-1]
    half = dtype in (torch.float16, torch.bfloat16)
    if (
        kernels.flash and half and attn_mask is None and head_dim == value_dim
        and head_dim <= FLASH_HEAD_DIM_MAX and head_dim % HEAD_DIM_ALIGNMENT == 0
    ):
        return "flash"
    alignment = HEAD_DIM_ALIGNMENT if half else FP32_HEAD_DIM_ALIGNMENT
    if dtype in (torch.float16, torch.bfloat16, torch.float32) and head_dim % alignment == 0 \
            and value_dim % alignment == 0 and not (is_causal and attn_mask is not None):
        return "efficient"
    return "math"


class _FusedAttention(torch.autograd.Function):
    """Allocates what a fused CUDA attention kernel allocates; values are meaningless (fake)."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
        bias: torch.Tensor | None, kind: str,
    ) -> torch.Tensor:
        batch, heads, seq_q = query.shape[0], query.shape[1], query.shape[2]
        # Fused kernels write [B, Sq, H, Dv] and return it transposed to [B, H, Sq, Dv].
        out = query.new_empty((batch, seq_q, heads, value.shape[-1])).transpose(1, 2)
        lse_len = seq_q if kind == "flash" else _round_up(seq_q, LSE_ALIGNMENT)
        lse = query.new_empty((batch, heads, lse_len), dtype=torch.float32)
        ctx.kind = kind
        ctx.save_for_backward(query, key, value, out, lse, bias)
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> Any:  # type: ignore[override]
        query, key, value, _out, _lse, _bias = ctx.saved_tensors
        batch, heads, seq_q, head_dim = query.shape
        if ctx.kind == "flash":
            seq_rounded = _round_up(seq_q, FLASH_SEQ_ROUND)
            dq_accum = query.new_empty(
                (batch, seq_rounded, heads, _round_up(head_dim, FLASH_HEAD_ROUND)), dtype=torch.float32
            )
            softmax_d = query.new_empty((batch, heads, seq_rounded), dtype=torch.float32)
            temporaries = [dq_accum, softmax_d]
        else:
            delta = query.new_empty((batch, heads, _round_up(seq_q, LSE_ALIGNMENT)), dtype=torch.float32)
            temporaries = [delta]
        grads = tuple(
            t.new_empty((t.shape[0], t.shape[2], t.shape[1], t.shape[3])).transpose(1, 2)
            for t in (query, key, value)
        )
        del temporaries
        return grads[0], grads[1], grads[2], None, None


def _mem_efficient_bias(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The additive bias the memory-efficient kernel gets for ``mask`` (attention.cu)."""
    if mask.dtype == torch.bool:
        # convert_boolean_attn_mask: where(mask, 0, -inf) in the query's dtype, same shape.
        bias = mask.new_empty(mask.shape, dtype=dtype)
    else:
        bias = mask if mask.dtype == dtype else mask.to(dtype)
    last = bias.shape[-1]
    if last % MEM_EFF_BIAS_ALIGNMENT:
        # preprocess_mask -> pad_bias: a padded copy, then a slice view of it.
        padded = bias.new_empty((*bias.shape[:-1], _round_up(last, MEM_EFF_BIAS_ALIGNMENT)))
        bias = padded[..., :last]
    return bias


def emulated_sdpa(
    kernels: AttentionKernels,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> torch.Tensor:
    """``F.scaled_dot_product_attention`` with CUDA's kernel choice and buffers."""
    if enable_gqa and key.shape[1] != query.shape[1]:
        # Grouped-query attention: the CUDA kernels see keys/values repeated per query head.
        repeat = query.shape[1] // key.shape[1]
        key = key.repeat_interleave(repeat, dim=1)
        value = value.repeat_interleave(repeat, dim=1)
    kind = choose_kernel(kernels, query, key, value, attn_mask, is_causal)
    if kind == "math":
        return torch.ops.aten._scaled_dot_product_attention_math(
            query, key, value, attn_mask, dropout_p, is_causal, None,
            scale=scale if scale is not None else 1.0 / math.sqrt(query.shape[-1]),
        )[0]
    bias = _mem_efficient_bias(attn_mask, query.dtype) if attn_mask is not None else None
    return _FusedAttention.apply(query, key, value, bias, kind)
