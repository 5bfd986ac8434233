"""``attn_implementation: kernels-community/vllm-flash-attn3``, emulated: its outputs and gradients,
its memory.

transformers loads an ``org/repo`` attn_implementation from the Hub with the ``kernels`` package
(integrations/hub_kernels.py ``load_and_register_attn_kernel``) and runs it through its flash path
(integrations/flash_attention.py ``flash_attention_forward`` -> modeling_flash_attention_utils.py
``_flash_attention_forward``): the layer's query, key and value transposed to [B, S, H, D] (views: no
copy), grouped keys and values as they are, the layer's ``s_aux`` (gpt-oss' attention sinks) cast to the
query's dtype, and, for a batch without padding, the kernel's ``flash_attn_func`` with ``softmax_scale``,
``causal``, ``window_size`` (a sliding layer's ``(w - 1, w - 1)``), ``deterministic`` and ``s_aux``; it
has no ``dropout_p`` (none is passed). The kernel is FlashAttention-3 as vLLM forks it, built by
huggingface/kernels-community vllm-flash-attn3 (torch-ext/vllm_flash_attn3/flash_attn_interface.py,
flash-attn/flash_api.cpp); a CUDA kernel, so its memory is emulated from that source:

- forward, ``FlashAttnFunc.forward`` / ``mha_fwd``: out [B, Sq, H, Dv] in q's dtype and softmax_lse
  float32 [B, H, Sq]; ``num_splits`` 1 (flash_attn_func's default): no float32 split accumulators; a
  causal or sliding layer's scheduler takes an int32 tile_count_semaphore [1], freed as it returns.
  ``ctx.save_for_backward(q, k, v, out, softmax_lse)``; out and softmax_lse are both returned.
- backward, ``FlashAttnFunc.backward``: dq, dk, dv ``torch.empty_like`` q, k, v, then ``mha_bwd``'s
  temporaries, in its order: softmax_d and softmax_lse_log2 float32 [B, H, round(Sq, kBlockM)],
  dq_accum float32 [B, H, round(Sq, kBlockM) x round_up_headdim(D)], for grouped keys dk_accum and
  dv_accum float32 zeros [B, Hk, round(Sk, kBlockN) x round_up_headdim(D)], and dq_semaphore int32
  [ceil(Sq / kBlockM), B, H]; all freed as it returns. No gradient for ``s_aux``: its backward returns
  None there (the sinks get none from this kernel).

What the kernel computes in registers is done by torch temporaries inside ``registers()`` (the
estimator's: outside the caching allocator), so that real CPU tensors get its outputs and gradients:
softmax over the keys and the sink, the sink's column dropped (as gpt-oss' eager attention).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from autotune.errors import InvalidInput

if TYPE_CHECKING:
    import torch

Registers = Callable[[], AbstractContextManager[Any]]
NAME = "kernels-community/vllm-flash-attn3"
KIND = "vllm-flash-attn3"  # how the estimator's details name the kernel (backend.ATTENTION_KERNEL_NAMES)
# transformers models whose attention passes ``s_aux`` (grep "s_aux=" transformers/models/*/modeling_*.py):
# mha_fwd takes it on Hopper only, in bfloat16, for up to 64 query heads.
SINK_MODEL_TYPES = ("gpt_oss", "deepseek_v4", "flint", "granite_swa", "granitemoe_swa", "hy_v4", "hy_v4_vl",
                    "mimo_v2_flash", "openai_privacy_filter")
SINK_ARCH = (9, 0)  # flash_api.cpp mha_fwd: "S aux is currently only supported for Hopper GPUs"
SINK_HEADS_MAX = 64  # mha_fwd: "We only support query heads <= 64 with S aux"
DEFAULT_ARCH = (9, 0)  # a card given only by its size: a current data-center one (attention.kernels_for)
SEQ_ROUND = 128  # mha_fwd: seqlen_q_rounded = round_multiple(seqlen_q, 128) (no buffer of that size)
HEAD_DIM_ALIGNMENT = 8  # mha_fwd: "head_size should be a multiple of 8" (16-bit inputs)
HEAD_DIM_MAX = 256  # get_max_headdim


def round_up_headdim(head_dim: int) -> int:
    """flash_api.cpp ``round_up_headdim``: 64, 96, 128, 192 or 256."""
    return next(size for size in (64, 96, 128, 192, 256) if head_dim <= size) if head_dim <= 256 else 256


def backward_blocks(arch: tuple[int, int], head_dim: int, causal: bool, local: bool,
                    softcap: bool = False) -> tuple[int, int]:
    """mha_bwd's kBlockM and kBlockN ("Very important that these match the kernel configs")."""
    d = round_up_headdim(head_dim)
    sm = arch[0] * 10 + arch[1]
    if sm >= 90:
        block_m = (96 if causal and softcap else 128) if d <= 64 else 64 if d <= 96 else \
            (64 if causal or local or softcap else 80) if d <= 128 else 64
        block_n = 128 if d <= 128 else 96 if d <= 192 else 80
    elif sm in (86, 89):
        block_m = 64 if d <= 192 else 32
        block_n = 128 if d <= 96 else 96 if d <= 128 else 64
    else:
        block_m = 128 if d <= 64 else 64
        block_n = 128 if d <= 128 else 80 if d <= 192 else 64
    return block_m, block_n


def _round(value: int, multiple: int) -> int:
    return (value + multiple - 1) // multiple * multiple


def _window(window_size: tuple[int, int], causal: bool, seq_q: int, seq_k: int) -> tuple[int, int, bool]:
    """mha_fwd / mha_bwd's window: (left, right, causal) after their adjustments; local = not causal
    and a side >= 0."""
    left, right = window_size
    if left >= seq_k - 1:
        left = -1
    if right >= seq_q - 1:
        right = -1
    if causal:
        right = 0
    return left, right, left < 0 and right == 0


def _allowed(seq_q: int, seq_k: int, left: int, right: int, device: Any) -> torch.Tensor:
    """The (query, key) pairs the kernel attends: keys within [i - left, i + right] of query i, bottom-right
    aligned (a side < 0: unbounded)."""
    import torch

    rows = torch.arange(seq_q, device=device).view(-1, 1) + (seq_k - seq_q)
    cols = torch.arange(seq_k, device=device).view(1, -1)
    allowed = torch.ones(seq_q, seq_k, dtype=torch.bool, device=device)
    if left >= 0:
        allowed &= cols >= rows - left
    if right >= 0:
        allowed &= cols <= rows + right
    return allowed


def _probabilities(q: torch.Tensor, k: torch.Tensor, scale: float, left: int, right: int,
                   lse: torch.Tensor | None, s_aux: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(P [B, H, Sq, Sk] float32, LSE [B, H, Sq] float32) from q [B, Sq, H, D] and k [B, Sk, Hk, D]:
    exp(S - LSE), LSE over the keys and the sink (``s_aux``, per head); the given ``lse`` if any."""
    import torch

    heads = q.shape[2]
    qh = q.transpose(1, 2).float()
    kh = k.transpose(1, 2).float().repeat_interleave(heads // k.shape[2], dim=1)
    scores = torch.matmul(qh, kh.transpose(-1, -2)) * scale
    allowed = _allowed(q.shape[1], k.shape[1], left, right, q.device)
    scores = scores.masked_fill(~allowed, float("-inf"))
    if lse is None:
        logits = scores
        if s_aux is not None:
            sink = s_aux.float().view(1, heads, 1, 1).expand(*scores.shape[:-1], 1)
            logits = torch.cat([scores, sink], dim=-1)
        lse = torch.logsumexp(logits, dim=-1)
    return torch.exp(scores - lse.unsqueeze(-1)), lse


@functools.cache
def _function() -> Any:
    """``FlashAttnFunc`` (flash_attn_interface.py), emulated (torch imported on first use)."""
    import torch

    class FlashAttnFunc(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, softmax_scale: float,
                    causal: bool, window_size: tuple[int, int], s_aux: torch.Tensor | None,
                    arch: tuple[int, int], registers: Registers) -> tuple[torch.Tensor, torch.Tensor]:
            batch, seq_q, heads, _ = q.shape
            left, right, causal = _window(window_size, causal, seq_q, k.shape[1])
            out = q.new_empty((batch, seq_q, heads, v.shape[-1]))  # mha_fwd: out_type = q's (16-bit)
            softmax_lse = q.new_empty((batch, heads, seq_q), dtype=torch.float32)
            if causal or left >= 0 or right >= 0:  # scheduler_needs_semaphore (num_splits 1, sm90)
                semaphore = q.new_empty((1,), dtype=torch.int32)
                del semaphore
            with registers():
                p, lse = _probabilities(q, k, softmax_scale, left, right, None, s_aux)
                vh = v.transpose(1, 2).float().repeat_interleave(heads // v.shape[2], dim=1)
                out.copy_(torch.matmul(p, vh).transpose(1, 2))
                softmax_lse.copy_(lse)
            ctx.save_for_backward(q, k, v, out, softmax_lse)
            ctx.args = (softmax_scale, causal, left, right, arch, registers)
            return out, softmax_lse

        @staticmethod
        def backward(ctx: Any, dout: torch.Tensor, *unused: Any) -> tuple[torch.Tensor | None, ...]:
            q, k, v, out, softmax_lse = ctx.saved_tensors
            scale, causal, left, right, arch, registers = ctx.args
            dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
            dout = dout if dout.stride(-1) == 1 else dout.contiguous()  # maybe_contiguous
            _backward_temporaries(q, k, causal, not causal and (left >= 0 or right >= 0), arch)
            with registers():
                heads, groups = q.shape[2], k.shape[2]
                p, _lse = _probabilities(q, k, scale, left, right, softmax_lse, None)
                vh = v.transpose(1, 2).float().repeat_interleave(heads // groups, dim=1)
                doh, oh = dout.transpose(1, 2).float(), out.transpose(1, 2).float()
                ds = p * (torch.matmul(doh, vh.transpose(-1, -2)) - (doh * oh).sum(-1, keepdim=True))
                dq.copy_((torch.matmul(ds, k.transpose(1, 2).float().repeat_interleave(
                    heads // groups, dim=1)) * scale).transpose(1, 2))
                dk_full = torch.matmul(ds.transpose(-1, -2), q.transpose(1, 2).float()) * scale
                dv_full = torch.matmul(p.transpose(-1, -2), doh)
                for grad, full in ((dk, dk_full), (dv, dv_full)):
                    batch, seq_k, dim = full.shape[0], full.shape[2], full.shape[3]
                    grad.copy_(full.view(batch, groups, heads // groups, seq_k, dim).sum(2).transpose(1, 2))
            return dq, dk, dv, None, None, None, None, None, None

    return FlashAttnFunc


def _backward_temporaries(q: torch.Tensor, k: torch.Tensor, causal: bool, local: bool,
                          arch: tuple[int, int]) -> None:
    """mha_bwd's float32 and int32 buffers after dq, dk and dv (module docstring), freed as it returns."""
    import torch

    batch, seq_q, heads, head_dim = q.shape
    seq_k, groups = k.shape[1], k.shape[2]
    block_m, block_n = backward_blocks(arch, head_dim, causal, local)
    rows, d = _round(seq_q, block_m), round_up_headdim(head_dim)
    softmax_d = q.new_empty((batch, heads, rows), dtype=torch.float32)
    softmax_lse_log2 = q.new_empty((batch, heads, rows), dtype=torch.float32)
    dq_accum = q.new_empty((batch, heads, rows * d), dtype=torch.float32)
    accums = [q.new_zeros((batch, groups, _round(seq_k, block_n) * d), dtype=torch.float32)
              for _ in range(2)] if groups != heads else []
    dq_semaphore = q.new_empty((-(-seq_q // block_m), batch, heads), dtype=torch.int32)
    del dq_semaphore, accums, dq_accum, softmax_lse_log2, softmax_d


def check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, s_aux: torch.Tensor | None) -> None:
    """mha_fwd's TORCH_CHECKs that a training step can meet, as the user's error (exit 2)."""
    import torch

    if q.dtype not in (torch.float16, torch.bfloat16):
        raise InvalidInput(f"{NAME} runs on float16/bfloat16 inputs only (mha_fwd), not {q.dtype}")
    head_dim = q.shape[-1]
    if head_dim % HEAD_DIM_ALIGNMENT or head_dim > HEAD_DIM_MAX or v.shape[-1] != head_dim:
        raise InvalidInput(f"{NAME} takes head dims that are multiples of {HEAD_DIM_ALIGNMENT} up to "
                           f"{HEAD_DIM_MAX}, the same for values (mha_bwd); this model's are {head_dim}, "
                           f"{v.shape[-1]}")
    if s_aux is not None:
        if s_aux.dtype != torch.bfloat16:
            raise InvalidInput(f"{NAME} takes attention sinks (s_aux) in bfloat16 only (mha_fwd: \"We only "
                               f"support bf16 dtype for S aux\"); they are {s_aux.dtype} here: use bf16")
        if q.shape[2] > SINK_HEADS_MAX:
            raise InvalidInput(f"{NAME} takes attention sinks for up to {SINK_HEADS_MAX} query heads "
                               f"(mha_fwd); this model has {q.shape[2]}")


def flash_attn_func(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, softmax_scale: float | None = None,
                    causal: bool = False, window_size: tuple[int, int] = (-1, -1),
                    deterministic: bool = False, s_aux: torch.Tensor | None = None, *,
                    arch: tuple[int, int] = DEFAULT_ARCH,
                    registers: Registers = contextlib.nullcontext) -> tuple[torch.Tensor, torch.Tensor]:
    """flash_attn_interface.py ``flash_attn_func`` on q [B, Sq, H, D], k and v [B, Sk, Hk, D]: (out,
    softmax_lse). A torch function: the estimator's emulation sees the call (names the kernel, gives
    the target's ``arch`` and its ``registers``). ``deterministic`` only adds semaphores for grouped
    keys, which transformers leaves off (FLASH_ATTENTION_DETERMINISTIC unset)."""
    from torch.overrides import handle_torch_function, has_torch_function

    if has_torch_function((q, k, v)):
        return handle_torch_function(  # type: ignore[no-any-return]
            flash_attn_func, (q, k, v), q, k, v, softmax_scale=softmax_scale, causal=causal,
            window_size=window_size, deterministic=deterministic, s_aux=s_aux, arch=arch,
            registers=registers)
    check_inputs(q, k, v, s_aux)
    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
    return _function().apply(q, k, v, scale, causal, window_size, s_aux, arch, registers)  # type: ignore[no-any-return]


def attention_forward(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: Any, dropout: float = 0.0, scaling: float | None = None,
                      sliding_window: int | None = None, softcap: float | None = None,
                      is_causal: bool | None = None, s_aux: torch.Tensor | None = None,
                      **kwargs: Any) -> tuple[torch.Tensor, None]:
    """integrations/flash_attention.py ``flash_attention_forward`` -> ``_flash_attention_forward``'s
    path for a batch without padding (the estimator's flash batches: step.make_batch), with this
    kernel's ``flash_attn_func`` and the kwargs ``_process_flash_attention_kwargs`` gives it."""
    if softcap is not None:  # flash_attn_func takes softcap; no model with sinks uses it
        raise InvalidInput(f"{NAME} with a softcap is not modelled")
    if attention_mask is not None:
        raise InvalidInput(f"{NAME} over a padded batch (its unpadded varlen call) is not modelled")
    query, key, value = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    window = (-1, -1)
    if sliding_window is not None and key.shape[1] > sliding_window:
        window = (sliding_window - 1, sliding_window - 1)
    out, _ = flash_attn_func(query, key, value, softmax_scale=scaling, causal=causal, window_size=window,
                             s_aux=None if s_aux is None else s_aux.to(query.dtype))
    return out, None
