"""``attn_implementation: flex_attention``, emulated: torch's FlexAttention as transformers runs it on
CUDA, its outputs, gradients and memory.

transformers' flex path (integrations/flex_attention.py ``flex_attention_forward``) calls
``torch.compile(flex_attention)`` (``WrappedFlexAttention``, ``compile_friendly_flex_attention``) with the
layer's query, key and value as they are ([B, H, S, D] views; grouped keys with ``enable_gqa`` where the
query heads are a power of two, else repeated first by its ``repeat_kv``), a ``score_mod`` (softcap), the
BlockMask of masking_utils.py ``flex_attention_mask`` and, on CUDA, ``return_aux=AuxRequest(lse=True)``;
it casts the returned log-sum-exp to the values' dtype (returned as the layer's attention weights, which
decoder layers drop) and returns ``out.transpose(1, 2).contiguous()``. On CUDA, inductor lowers the
``flex_attention`` higher-order op to its Triton templates; the CPU runs another lowering (flex_cpu.py),
so this module emulates the CUDA kernels' allocations from torch 2.13's source:

- the mask, ``create_block_mask(mask_mod, B, None, Q, KV, _compile=True)`` (nn/attention/flex_attention.py):
  the BlockMask's int32 tensors, block size 128 (``_DEFAULT_SPARSE_BLOCK_SIZE``), H 1, separate full
  blocks (``separate_full_blocks=True``): kv_num_blocks [B, 1, nq], kv_indices [B, 1, nq, nk],
  full_kv_num_blocks, full_kv_indices alike, and their transposes for the backward
  (``BlockMask.from_kv_blocks`` -> ``_transpose_ordered``): q_num_blocks [B, 1, nk], q_indices
  [B, 1, nk, nq], full_q_num_blocks, full_q_indices; nq = ceil(Q / 128), nk = ceil(KV / 128). Made once
  per forward, saved by every layer. The compiled mask graph's own temporaries (per block, a few bytes
  x B x nq x nk) are not counted.
- forward, _inductor/kernel/flex/flex_attention.py ``flex_attention`` (the Triton template; the
  decoding template serves queries shorter than 128, refused here): out [B, Hq, Sq, Dv] in the query's
  dtype with the query's stride order (``infer_dense_strides``), logsumexp and max_scores float32
  [B, Hq, Sq] (max_scores freed once the kernel ran: nothing needs it); then ``_finalize_outputs``'s
  ``lse * ln2`` (the kernel keeps log2 stats), a float32 [B, Hq, Sq] output. Saved for backward
  (higher_order_ops/flex_attention.py ``FlexAttentionAutogradOp``): query, key, value, out, logsumexp
  and the BlockMask's tensors.
- backward, ``flex_attention_backward``: the compiled function's autograd node gets a zero gradient for
  the unused log-sum-exp output (a Function materializes missing gradients), float32 [B, Hq, Sq]; the
  lowering realizes grad_lse_exp2 and delta (float32 [B, Hq, Sq] each), then grad_query (the query's
  shape, dtype and stride order), broadcasted_grad_value and the template's grad_key, both of the
  key/value heads [B, Hkv, Skv, D]: grouped heads are summed inside the kernel (GQA_SHARED_HEADS), with
  no per-query-head copy.

What the kernels compute in registers is done by torch temporaries inside ``registers()`` (the
estimator's: outside the caching allocator), on real tensors only: dense attention over the mask.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from autotune.errors import InvalidInput, JobFails

if TYPE_CHECKING:
    import torch

Registers = Callable[[], AbstractContextManager[Any]]
NAME = "flex_attention"
KIND = "flex_attention"  # how the estimator's details name the kernel (backend.ATTENTION_KERNEL_NAMES)
SPARSE_BLOCK = 128  # nn/attention/flex_attention.py _DEFAULT_SPARSE_BLOCK_SIZE
DECODE_BELOW = 128  # flex_decoding.py _use_flex_decoding: short_query_length = Sq < 128
HEAD_DIM_MIN = 16  # flex_attention.py lowering: "tl.dot does not support embedding size less than 16"
LN2 = math.log(2.0)  # _finalize_outputs: the Triton kernels keep log2 stats


@dataclass(frozen=True)
class EmulatedBlockMask:
    """What ``create_block_mask`` returns, as the emulated kernel reads it: the BlockMask's tensors (in
    ``tensors``' order: kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices, q_num_blocks,
    q_indices, full_q_num_blocks, full_q_indices) and the ``mask_mod`` that decides each element."""

    tensors: tuple[torch.Tensor, ...]
    seq_lengths: tuple[int, int]
    mask_mod: Callable[..., Any]


def block_mask_shapes(batch: int, q_len: int, kv_len: int) -> tuple[tuple[int, ...], ...]:
    """The shapes of the BlockMask's tensors (int32), in EmulatedBlockMask.tensors' order."""
    nq, nk = -(-q_len // SPARSE_BLOCK), -(-kv_len // SPARSE_BLOCK)
    kv = ((batch, 1, nq), (batch, 1, nq, nk))
    q = ((batch, 1, nk), (batch, 1, nk, nq))
    return (*kv, *kv, *q, *q)


def create_block_mask(mask_mod: Callable[..., Any], batch: int, q_len: int, kv_len: int,
                      device: Any) -> EmulatedBlockMask:
    """nn/attention/flex_attention.py ``create_block_mask`` (H None), its outputs allocated; their values
    are not computed (the emulated kernel reads ``mask_mod`` instead)."""
    import torch

    tensors = tuple(torch.empty(shape, dtype=torch.int32, device=device)
                    for shape in block_mask_shapes(batch, q_len, kv_len))
    return EmulatedBlockMask(tensors, (q_len, kv_len), mask_mod)


def flex_attention_mask(batch_size: int, q_length: int, kv_length: int, q_offset: int = 0,
                        kv_offset: int = 0, mask_function: Callable[..., Any] | None = None,
                        attention_mask: Any = None, device: Any = "cpu",
                        **kwargs: Any) -> EmulatedBlockMask:
    """masking_utils.py ``flex_attention_mask``: the padding mask and offsets folded into the mask
    function (a fake 2D mask, whose values are unknown, is taken to pad: make_batch pads every row's
    last position), then the block mask."""
    from torch._subclasses.fake_tensor import is_fake
    from transformers.masking_utils import (
        add_offsets_to_mask_function,
        and_masks,
        causal_mask_function,
        padding_mask_function,
        prepare_padding_mask,
    )

    function = mask_function if mask_function is not None else causal_mask_function
    if attention_mask is not None and (is_fake(attention_mask) or not bool(attention_mask.all())):
        padding = prepare_padding_mask(attention_mask, kv_length, kv_offset)
        function = and_masks(function, padding_mask_function(padding))  # type: ignore[arg-type]
    function = add_offsets_to_mask_function(function, q_offset, kv_offset)
    return create_block_mask(function, batch_size, q_length, kv_length, device)


def _real(x: torch.Tensor) -> bool:
    """Whether ``x`` holds values (not a fake or meta tensor): only then is the arithmetic done."""
    from torch._subclasses.fake_tensor import is_fake

    return not is_fake(x) and x.device.type != "meta"


def _dense(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: EmulatedBlockMask, scale: float,
           softcap: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(out float32 [B, Hq, Sq, Dv], lse float32 [B, Hq, Sq], natural log) of the flex attention of q, k,
    v ([B, H, S, D], grouped keys broadcast), the mask evaluated densely (torch's ``create_mask``)."""
    import torch
    from torch.nn.attention.flex_attention import create_mask

    heads = q.shape[1]
    kh = k.float().repeat_interleave(heads // k.shape[1], dim=1)
    vh = v.float().repeat_interleave(heads // v.shape[1], dim=1)
    scores = torch.matmul(q.float(), kh.transpose(-1, -2)) * scale
    if softcap is not None:
        scores = softcap * torch.tanh(scores / softcap)
    allowed = create_mask(mask.mask_mod, q.shape[0], 1, *mask.seq_lengths, device=q.device)
    scores = scores.masked_fill(~allowed, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    return torch.matmul(torch.exp(scores - lse.unsqueeze(-1)), vh), lse


def _like(x: torch.Tensor, shape: tuple[int, ...], dtype: Any = None) -> torch.Tensor:
    """A dense tensor of ``shape`` with ``x``'s stride order (inductor's ``infer_dense_strides``)."""
    import torch

    order = sorted(range(x.dim()), key=lambda d: x.stride(d), reverse=True)  # outermost first
    strides = [0] * len(shape)
    step = 1
    for d in reversed(order):
        strides[d] = step
        step *= shape[d]
    return torch.empty_strided(shape, strides, dtype=dtype or x.dtype, device=x.device)


@functools.cache
def _function() -> Any:
    """The compiled ``flex_attention``'s autograd node, emulated (torch imported on first use)."""
    import torch

    class FlexAttention(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: EmulatedBlockMask,
                    scale: float, softcap: float | None, registers: Registers,
                    *mask_tensors: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            batch, heads, seq_q, _ = q.shape
            out = _like(q, (batch, heads, seq_q, v.shape[-1]))
            logsumexp = q.new_empty((batch, heads, seq_q), dtype=torch.float32)
            max_scores = q.new_empty((batch, heads, seq_q), dtype=torch.float32)
            del max_scores
            lse = q.new_empty((batch, heads, seq_q), dtype=torch.float32)  # lse * ln2
            if _real(q):
                with registers():
                    dense_out, dense_lse = _dense(q, k, v, mask, scale, softcap)
                    out.copy_(dense_out)
                    logsumexp.copy_(dense_lse / LN2)
                    lse.copy_(dense_lse)
            ctx.save_for_backward(q, k, v, out, logsumexp, *mask_tensors)
            ctx.args = (mask, scale, softcap, registers)
            return out, lse

        @staticmethod
        def backward(ctx: Any, grad_out: torch.Tensor, grad_lse: torch.Tensor) -> tuple[Any, ...]:
            saved = ctx.saved_tensors  # once: checkpointing's unpack hooks allow one unpack
            q, k, v, out, logsumexp = saved[:5]
            mask, scale, softcap, registers = ctx.args
            grad_lse_exp2 = grad_lse.new_empty(grad_lse.shape)
            delta = grad_lse.new_empty(grad_lse.shape)
            dq = _like(q, tuple(q.shape))
            dv = _like(v, tuple(v.shape))
            dk = _like(k, tuple(k.shape))
            if _real(q):
                with registers(), torch.enable_grad():
                    inputs = [t.detach().requires_grad_() for t in (q, k, v)]
                    dense_out, dense_lse = _dense(inputs[0], inputs[1], inputs[2], mask, scale, softcap)
                    grads = torch.autograd.grad((dense_out, dense_lse), inputs,
                                                (grad_out.float(), grad_lse.float()))
                    for grad, full in zip((dq, dk, dv), grads, strict=True):
                        grad.copy_(full)
            del delta, grad_lse_exp2
            return (dq, dk, dv, None, None, None, None, *(None for _ in saved[5:]))

    return FlexAttention


def flex_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, block_mask: EmulatedBlockMask,
                   scale: float | None = None, softcap: float | None = None, *,
                   registers: Registers = contextlib.nullcontext) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.compile(flex_attention)(query, key, value, score_mod, block_mask, scale, enable_gqa=True,
    return_aux=AuxRequest(lse=True))`` on CUDA: (out [B, Hq, Sq, Dv], lse float32 [B, Hq, Sq]). A torch
    function: the estimator's emulation sees the call (names the kernel, gives its ``registers``)."""
    from torch.overrides import handle_torch_function, has_torch_function

    if has_torch_function((query, key, value)):
        return handle_torch_function(  # type: ignore[no-any-return]
            flex_attention, (query, key, value), query, key, value, block_mask, scale=scale,
            softcap=softcap, registers=registers)
    check_inputs(query, key, value)
    scale = scale if scale is not None else 1.0 / math.sqrt(query.shape[-1])
    return _function().apply(  # type: ignore[no-any-return]
        query, key, value, block_mask, scale, softcap, registers, *block_mask.tensors)


def check_inputs(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> None:
    """What the CUDA lowering refuses, or serves with a kernel not emulated, as the user's error."""
    if min(query.shape[-1], value.shape[-1]) < HEAD_DIM_MIN:
        raise InvalidInput(f"{NAME} on CUDA needs head dims of at least {HEAD_DIM_MIN} (inductor's flex "
                           f"lowering: tl.dot); this model's are {query.shape[-1]}, {value.shape[-1]}")
    if query.shape[-2] < DECODE_BELOW:
        raise InvalidInput(f"{NAME} runs its decoding kernel for fewer than {DECODE_BELOW} queries "
                           f"(flex_decoding.py), which autotune does not emulate; seq_len {query.shape[-2]}: "
                           f"use {DECODE_BELOW} or more, or sdpa")


def _repeat_kv(hidden: torch.Tensor, n_rep: int) -> torch.Tensor:
    """integrations/flex_attention.py ``repeat_kv``."""
    batch, heads, seq, dim = hidden.shape
    if n_rep == 1:
        return hidden
    expanded = hidden[:, :, None, :, :].expand(batch, heads, n_rep, seq, dim)
    return expanded.reshape(batch, heads * n_rep, seq, dim)


def attention_forward(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: Any, scaling: float | None = None, softcap: float | None = None,
                      s_aux: torch.Tensor | None = None, position_bias: torch.Tensor | None = None,
                      **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """integrations/flex_attention.py ``flex_attention_forward`` on CUDA (``return_lse`` true), with this
    module's kernel and block mask."""
    if kwargs.get("dropout", 0.0) > 0:
        raise JobFails(f"{NAME} takes no attention dropout (transformers' flex_attention_forward refuses "
                       f"it in training): set the model's attention_dropout to 0, or use sdpa")
    if s_aux is not None or position_bias is not None:
        raise InvalidInput(f"{NAME} with attention sinks or a position bias is not modelled: "
                           "use sdpa or eager")
    if not isinstance(attention_mask, EmulatedBlockMask):
        raise InvalidInput(f"{NAME} with a dense score mask (this model's own mask) is not modelled: "
                           "use sdpa")
    heads = query.shape[1]
    if heads & (heads - 1):  # "When running TP this helps": not a power of two, keys repeated
        key = _repeat_kv(key, heads // key.shape[1])
        value = _repeat_kv(value, heads // value.shape[1])
    out, lse = flex_attention(query, key, value, attention_mask, scale=scaling, softcap=softcap)
    lse = lse.to(value.dtype)
    return out.transpose(1, 2).contiguous(), lse
