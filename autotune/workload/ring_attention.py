"""Context parallelism as Axolotl runs it: ring-flash-attn's ``llama3_flash_attn_varlen_func``,
emulated (its CUDA kernels cannot run on fake tensors), on the rank's slice of the sequence.

Axolotl (axolotl-ai-cloud/axolotl, 067b021):

- ``utils/ctx_managers/sequence_parallel.py`` ``apply_sequence_parallelism``, a forward pre-hook on the
  model: every tensor of the batch with the sequence dim is padded on the right to a multiple of
  ``min(cp, 64)`` and chunked over the cp ranks, each rank keeping its 1/cp (``local_seq_len``); the
  outputs are gathered back only for GRPO and EBFT (train.py ``gather_outputs``), so an SFT rank's
  logits and loss are of its own tokens;
- ``monkeypatch/ring_attn/patch.py`` ``register_ring_attn_from_device_mesh``: with sample packing
  (``ring_attn_func`` varlen_llama3, the default then: schemas/validation.py ``validate_ring_attn_func``)
  transformers' ``_flash_attention_forward`` becomes ``_flash_attention_forward_v3``, which asserts batch
  1 ("varlen data should be processed in advance") and calls ``llama3_flash_attn_varlen_func`` on the
  squeezed [S/cp, H, D] query, key and value with ``heads_k_stride`` (``heads_k_stride or 1``).

ring-flash-attn (zhuzilin/ring-flash-attention, 8996282), ``ring_flash_attn/llama3_flash_attn_varlen.py``,
what a rank allocates, in order (L local tokens, S = L x cp, H query and Hk key heads, D head dim,
s = heads_k_stride, g = H / Hk; all in the inputs' dtype but lse):

forward (``Llama3FlashAttnVarlenFunc.forward`` then ``llama3_flash_attn_varlen_forward``)
    ``k.contiguous()``, ``v.contiguous()``: [L, Hk, D] copies (transformers' key and value are
    transposed views), saved for backward; ``kv_buffer`` and ``kv_buffer_copy`` [2, S, s, D], the
    all-gather outputs; ``k_0``, ``v_0`` [L, s, D] (the first stride's send buffers, alive to the end);
    per stride the next stride's ``send_k``, ``send_v`` and flash-attn's ``_flash_attn_varlen_forward``:
    out [L, s x g, D], softmax_lse float32 [s x g, L], rng_state int64 [2]; then ``torch.cat`` of the outs
    into out [L, H, D] and of the lses into lse [H, L], both saved; the per-stride pieces and the buffers
    freed as it returns.
backward (``llama3_flash_attn_varlen_backward``)
    ``kv_buffer``, ``kv_buffer_copy`` and ``dkv_buffer`` [2, S, s, D]; ``kv_contiguous_buffer``
    [2, L, s, D] when s < Hk; dq, dk, dv ``empty_like`` q, k, v; ``k_0``, ``v_0``; per stride the next
    send buffers and flash-attn's varlen backward (csrc/flash_attn/flash_api.cpp ``mha_varlen_bwd``):
    for grouped heads dk_expanded and dv_expanded [Sk, s x g, D], then softmax_d float32
    [s x g, L + 128] and dq_accum float32 [L + 128, s x g, round32(D)], freed as it returns (softmax_d
    once returned); dK and dV of the gathered keys land in ``dkv_buffer`` before
    ``dist.reduce_scatter_tensor`` gives the rank its [L, s, D] (the fake group moves nothing).

Sk, the keys a rank's queries attend, is ``local_k_slice`` (``llama3_flash_attn_prepare_cu_seqlens``,
causal: up to the end of the rank's slice): the whole sequence for the last rank, the one emulated.
A micro-batch above 1 fails (the forward's assertion, ``MAX_BATCH``): the search stops at 1
(tuner.py search_cell). Values are meaningless (fake), as attention.py's kernels.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

# Axolotl's patch.py _flash_attention_forward_v3: ``assert batch_size == 1, "varlen data should be
# processed in advance."``: the largest micro-batch a context-parallel rank runs
MAX_BATCH = 1
KIND = "ring-flash-attn"  # how the estimator's details name the kernel (backend.ATTENTION_KERNEL_NAMES)
PAD_DIVISOR_MAX = 64  # sequence_parallel.py apply_sequence_parallelism: divisor = min(world, 64)
FLASH_VARLEN_ROW_PAD = 128  # flash_api.cpp mha_varlen_bwd: total_q + 128 * batch_size rows
# flash_api.cpp mha_varlen_bwd: head_size_rounded = head_size <= 192 ? round_multiple(head_size, 32) : 256
FLASH_HEAD_ROUND, FLASH_HEAD_ROUND_MAX, FLASH_HEAD_ROUNDED_ABOVE = 32, 192, 256


@dataclass(frozen=True)
class Ring:
    """The ring a rank's attention runs over: ``cp`` ranks, ``heads_k_stride`` key heads a step."""

    cp: int
    heads_k_stride: int = 1


_RING: ContextVar[Ring | None] = ContextVar("ring_attention", default=None)


def local_seq_len(seq_len: int, cp: int) -> int:
    """A rank's tokens of a ``seq_len`` sequence: padded to a multiple of min(cp, 64), then 1/cp
    (``torch.chunk`` over cp: the first ranks' chunks are ceil(padded / cp), the largest)."""
    divisor = min(cp, PAD_DIVISOR_MAX)
    padded = -(-seq_len // divisor) * divisor
    return -(-padded // cp)


@contextlib.contextmanager
def ring(spec: Ring | None) -> Iterator[None]:
    """Inside: the flash stand-in's attention is ring-flash-attn's over ``spec`` (None: not)."""
    token = _RING.set(spec)
    try:
        yield
    finally:
        _RING.reset(token)


def current() -> Ring | None:
    return _RING.get()


def _round(value: int, multiple: int) -> int:
    return (value + multiple - 1) // multiple * multiple


def _varlen_forward(q: torch.Tensor, v: torch.Tensor, heads: int) -> list[torch.Tensor]:
    """flash-attn's ``_flash_attn_varlen_forward`` for ``heads`` query heads: out, softmax_lse (kept),
    rng_state (dropped by the caller)."""
    import torch

    out = q.new_empty((q.shape[0], heads, v.shape[-1]))
    lse = q.new_empty((heads, q.shape[0]), dtype=torch.float32)
    rng_state = q.new_empty((2,), dtype=torch.int64)
    del rng_state
    return [out, lse]


def _varlen_backward_temporaries(q: torch.Tensor, seq_k: int, heads: int, heads_k: int) -> None:
    """mha_varlen_bwd's temporaries (module docstring), freed as it returns."""
    import torch

    total_q, head_dim = q.shape[0], q.shape[-1]
    expanded = [q.new_empty((seq_k, heads, head_dim)) for _ in range(2)] if heads != heads_k else []
    softmax_d = q.new_empty((heads, total_q + FLASH_VARLEN_ROW_PAD), dtype=torch.float32)
    rounded = (_round(head_dim, FLASH_HEAD_ROUND) if head_dim <= FLASH_HEAD_ROUND_MAX
               else FLASH_HEAD_ROUNDED_ABOVE)
    dq_accum = q.new_empty((total_q + FLASH_VARLEN_ROW_PAD, heads, rounded), dtype=torch.float32)
    del dq_accum, expanded
    del softmax_d


@functools.cache
def _function() -> Any:
    """``Llama3FlashAttnVarlenFunc``, emulated (torch imported on first use)."""
    import torch

    def gather_buffers(k: torch.Tensor, world: int, stride: int, count: int) -> list[torch.Tensor]:
        return [k.new_empty((2, k.shape[0] * world, stride, k.shape[-1])) for _ in range(count)]

    class Llama3FlashAttnVarlenFunc(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,  # type: ignore[override]
                    world: int, stride: int) -> torch.Tensor:
            k, v = k.contiguous(), v.contiguous()
            heads, heads_k = q.shape[1], k.shape[1]
            buffers = gather_buffers(k, world, stride, 2)
            first = (k[:, :stride].contiguous(), v[:, :stride].contiguous())
            outs: list[torch.Tensor] = []
            lses: list[torch.Tensor] = []
            sends: tuple[torch.Tensor, ...] = ()
            for i in range(0, heads_k, stride):
                if i < heads_k - stride:
                    sends = (k[:, i + stride:i + 2 * stride].contiguous(),
                             v[:, i + stride:i + 2 * stride].contiguous())
                out_i, lse_i = _varlen_forward(q, v, stride * heads // heads_k)
                outs.append(out_i)
                lses.append(lse_i)
            out, lse = torch.cat(outs, dim=1), torch.cat(lses, dim=-2)
            del outs, lses, sends, first, buffers
            ctx.save_for_backward(q, k, v, out, lse)
            ctx.world, ctx.stride = world, stride
            return out

        @staticmethod
        def backward(ctx: Any, dout: torch.Tensor) -> Any:  # type: ignore[override]
            q, k, v, out, lse = ctx.saved_tensors
            world, stride = ctx.world, ctx.stride
            heads, heads_k = q.shape[1], k.shape[1]
            buffers = gather_buffers(k, world, stride, 3)  # kv_buffer, kv_buffer_copy, dkv_buffer
            contiguous = k.new_empty((2, k.shape[0], stride, k.shape[-1])) if stride != heads_k else None
            dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
            first = (k[:, :stride].contiguous(), v[:, :stride].contiguous())
            sends: tuple[torch.Tensor, ...] = ()
            for i in range(0, heads_k, stride):
                if i < heads_k - stride:
                    sends = (k[:, i + stride:i + 2 * stride].contiguous(),
                             v[:, i + stride:i + 2 * stride].contiguous())
                _varlen_backward_temporaries(q, k.shape[0] * world, stride * heads // heads_k, stride)
            del sends, first, contiguous, buffers
            return dq, dk, dv, None, None

    return Llama3FlashAttnVarlenFunc


def attention(spec: Ring, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """``_flash_attention_forward_v3`` over the layer's query [1, H, L, D], key and value [1, Hk, L, D]:
    the output [1, L, H, D] (as transformers' flash path returns it). A torch function: the estimator's
    emulation sees the call (names the kernel)."""
    from torch.overrides import handle_torch_function, has_torch_function

    from autotune.errors import JobFails

    if has_torch_function((query, key, value)):
        return handle_torch_function(  # type: ignore[no-any-return]
            attention, (query, key, value), spec, query, key, value)

    heads_k = key.shape[1]
    if heads_k % spec.heads_k_stride:
        # llama3_flash_attn_varlen_forward: ``assert nheads_k % heads_k_stride == 0``
        raise JobFails(f"heads_k_stride {spec.heads_k_stride} does not divide the model's "
                       f"{heads_k} key heads (ring-flash-attn asserts nheads_k % heads_k_stride == 0)")
    batch, heads, seq, _ = query.shape
    if batch > MAX_BATCH:
        raise JobFails(f"a micro-batch of {batch} under context parallel: Axolotl's ring-flash-attn forward "
                       "asserts batch 1 (monkeypatch/ring_attn/patch.py _flash_attention_forward_v3: "
                       "\"varlen data should be processed in advance.\")")
    # transformers' flash path hands [B, L, H, D] views (flash_attention_forward: transpose(1, 2));
    # _flash_attention_forward_v3 squeezes the batch dim
    q, k, v = (t.transpose(1, 2).squeeze(0) for t in (query, key, value))
    out = _function().apply(q, k, v, spec.cp, spec.heads_k_stride)
    return out.view(batch, seq, heads, out.shape[-1])  # type: ignore[no-any-return]
