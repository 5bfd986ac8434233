"""Scaled dot-product attention as CUDA would run it, for the estimator.

On CUDA, ``F.scaled_dot_product_attention`` dispatches to a fused kernel when it can
(aten/src/ATen/native/transformers/cuda/sdp_utils.cpp, priority cuDNN where SDPA prefers it, then
flash > memory-efficient > math).
Fused kernels keep no seq x seq attention matrix: they save the output and a float32 log-sum-exp
per row, and recompute attention in backward. On the CPU the same call takes the math path
whenever dropout is on, which saves the full attention matrix and its dropout mask, so running
the CPU kernel would overstate CUDA's memory by O(batch x heads x seq^2) per layer.

``emulated_sdpa`` allocates (on fake tensors) exactly the buffers the chosen CUDA kernel
allocates, with their dtypes and alignment paddings:

flash (FlashAttention-2, flash_api.cpp ``mha_fwd``/``mha_bwd``)
    forward: out [B, Sq, H, Dv] (q dtype), softmax_lse float32 [B, H, Sq], rng_state int64 [2]
    backward: dq/dk/dv like q/k/v, then temporaries softmax_d float32 [B, H, round128(Sq)] and
    dq_accum float32 [B, round128(Sq), H, round32(D)]
memory-efficient (cutlass, attention.cu ``_efficient_attention_forward``/``_backward``)
    a boolean mask is first turned into an additive bias of q's dtype
    (``convert_boolean_attn_mask``) whose last dim is padded to a multiple of 16
    (``preprocess_mask``, mem_eff_alignment = 16); the bias is saved for backward.
    forward: out [B, Sq, H, Dv], logsumexp float32 [B, H, round32(Sq)] (kAlignLSE = 32)
    backward: dq/dk/dv, then delta float32 [B, H, Sq] and a workspace of float32 dQ tiles
    (``_efficient_temporaries``)
cuDNN (aten/src/ATen/native/cudnn/MHA.cpp ``run_cudnn_SDP_fprop``/``bprop``)
    the first choice where SDPA prefers it (``check_prefer_cudnn_attention``: sm90, sm93, sm100,
    sm103 with a cuDNN runtime above 9.15.0, the one PyTorch 2.11's CUDA 13 wheels bundle). A
    boolean mask becomes an additive bias of q's dtype, as for the memory-efficient kernel.
    forward: out [B, Sq, H, Dv], softmax stats float32 [B, H, Sq, 1], a workspace
    backward: dq/dk/dv, then a workspace holding cuDNN's float32 dQ accumulator [B, H, Sq, Dqk]
    and its per-row sums [B, H, Sq], freed as the kernel returns
math
    the composite math path itself (``_scaled_dot_product_attention_math``), run as is.

Measured on an H100 with PyTorch 2.11.0+cu130 (docs/measurements/h100-80gb/records): every
half-precision attention ran on cuDNN. Its backward allocated dq, dk, dv and then one block of
4 x B x H x Sq x (Dqk + 1) + 256 bytes (102,236,416 B at B 6, H 32, Sq 2048, D 64; 51,118,336 B
at B 32, H 12, Sq 512, D 64), its forward a 256-byte workspace; float32 attention ran on the
memory-efficient kernel.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import torch

from autotune.backends.estimate.trace import PlusFixed
from autotune.backends.estimate.tracker import kernel_buffer
from autotune.gpus import CUDNN_DEPRIORITIZED_ENV, flash_attention_supported

FLASH_HEAD_DIM_MAX = 256  # sdp_utils.cpp check_head_dim_size_flash
HEAD_DIM_ALIGNMENT = 8  # both fused kernels need head_dim % 8 == 0 for 16-bit inputs
FP32_HEAD_DIM_ALIGNMENT = 4  # memory-efficient kernel, float32 inputs (minimum_gemm_alignment)
MEM_EFF_BIAS_ALIGNMENT = 16  # attention.cu: mem_eff_alignment
MEM_EFF_BLOCK = 64  # kBlockSizeI of the sm80 backward kernels up to a head dim of 64
MEM_EFF_GRAD_Q_TILE_FLOATS = 64 * 64 + 4  # sizeof(GradQTempStorage) / 4, measured (see the workspace)
LSE_ALIGNMENT = 32  # kernel_forward.h: kAlignLSE
FLASH_SEQ_ROUND = 128  # flash_api.cpp: seqlen_q_rounded = round_multiple(seqlen_q, 128)
FLASH_HEAD_ROUND = 32  # flash_api.cpp: head_size_rounded for dq_accum
# cuDNN's SDPA (sdp_utils.cpp check_cudnn_tensor_shapes): head dims up to 128, up to 256 on sm90
# (cuDNN >= 9.10), multiples of 8; no key/value sequence of length 1.
CUDNN_HEAD_DIM_MAX = 128
CUDNN_HOPPER_HEAD_DIM_MAX = 256
# Workspaces of cuDNN's SDPA graphs as measured on an H100, PyTorch 2.11.0+cu130 (module docstring):
# the forward's, and what the backward's holds beyond its float32 dQ accumulator and row sums.
CUDNN_FPROP_WORKSPACE_BYTES = 256
CUDNN_BPROP_WORKSPACE_EXTRA_BYTES = 256



@dataclass(frozen=True)
class AttentionKernels:
    """Which fused SDPA kernels the target GPU offers."""

    flash: bool  # FlashAttention-2 in PyTorch needs sm80+
    bf16: bool  # bfloat16 inputs need sm80+ for both fused kernels
    # The largest head dim cuDNN's SDPA takes where SDPA prefers it over flash; 0 where it does not.
    cudnn_head_dim_max: int = 0
    # attn_implementation flash_attention_2: the flash-attn package's kernel runs every attention of
    # 16-bit inputs (no SDPA choice: no cuDNN, no memory-efficient kernel, no mask bias); PyTorch's
    # own FlashAttention-2 kernel, whose buffers it shares (the flash branch below), stands in.
    flash_attn_package: bool = False
    # The card's (major, minor); None: given only by its size. Hub flash kernels' block sizes follow
    # it (workload/flash_attn3.py).
    compute_capability: tuple[int, int] | None = None


# sdp_utils.cpp check_prefer_cudnn_attention (PyTorch 2.10+): SDPA tries cuDNN first on these
# architectures (major 9 or 10, minor 0 or 3) when the cuDNN runtime is above 9.15.0, which holds
# from PyTorch 2.11's CUDA 13 wheels on; TORCH_CUDNN_SDPA_DEPRIORITIZED=1 turns it off.
CUDNN_PREFERRED_ARCHS = ((9, 0), (9, 3), (10, 0), (10, 3))
_ENV_TRUE = ("1", "ON", "YES", "TRUE", "Y")  # c10::utils::check_env


def kernels_for(compute_capability: tuple[int, int] | None) -> AttentionKernels:
    """The fused kernels SDPA has on a card of ``compute_capability``. A card given only by its
    size (None) is taken to be a current data-center one: sm80+, SDPA preferring cuDNN (Hopper and
    Blackwell) unless this environment sets TORCH_CUDNN_SDPA_DEPRIORITIZED, as the job's would."""
    cc = compute_capability
    current = cc is None or cc >= (8, 0)
    cudnn_max = 0
    if os.environ.get(CUDNN_DEPRIORITIZED_ENV, "").strip().upper() not in _ENV_TRUE:
        if cc is None or cc in CUDNN_PREFERRED_ARCHS:
            cudnn_max = CUDNN_HOPPER_HEAD_DIM_MAX if cc in (None, (9, 0)) else CUDNN_HEAD_DIM_MAX
    return AttentionKernels(
        flash=cc is None or flash_attention_supported(cc), bf16=current, cudnn_head_dim_max=cudnn_max,
        compute_capability=cc,
    )


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
    if kernels.flash_attn_package and half:
        return "flash"
    if (
        kernels.cudnn_head_dim_max and half and key.shape[-2] != 1
        and max(head_dim, value_dim) <= kernels.cudnn_head_dim_max
        and head_dim % HEAD_DIM_ALIGNMENT == 0 and value_dim % HEAD_DIM_ALIGNMENT == 0
    ):
        return "cudnn"
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
        out, lse = _FusedAttention._kernel_forward(kind, query, value)
        ctx.kind = kind
        # Saved as the generated autograd node saves them (torch/csrc/autograd/generated/
        # Functions.h, ScaledDotProduct{Cudnn,Efficient,Flash}AttentionBackward0): the inputs by
        # name, then the outputs by name. ``release_variables`` frees them in that order after
        # the backward, as a Python Function's saved tensors are freed in the order saved.
        ctx.save_for_backward(bias, key, query, value, lse, out)
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> Any:  # type: ignore[override]
        bias, key, query, value, lse, out = ctx.saved_tensors
        grads = _FusedAttention._kernel_backward(ctx.kind, query, key, value, out)
        # Under activation checkpointing the node's apply holds the only references (the
        # recomputed tensors, unpacked in the order saved), and they die with its locals, in the
        # reverse order. Measured on an H100 (records/llama-1b-qlora-bf16ckpt-2048x6.json): the
        # output, the log-sum-exp, value, query, key, then the mask's bias. Without checkpointing
        # these dels free nothing: the saved tensors still hold them.
        del out, lse, value, query, key, bias
        return grads[0], grads[1], grads[2], None, None

    @staticmethod
    def _kernel_forward(kind: str, query: torch.Tensor,
                        value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """What the kernel's forward allocates: its output and log-sum-exp (cuDNN's workspace freed)."""
        batch, heads, seq_q = query.shape[0], query.shape[1], query.shape[2]
        # Fused kernels write [B, Sq, H, Dv] and return it transposed to [B, H, Sq, Dv].
        out = query.new_empty((batch, seq_q, heads, value.shape[-1])).transpose(1, 2)
        lse_len = seq_q if kind in ("flash", "cudnn") else _round_up(seq_q, LSE_ALIGNMENT)
        lse = query.new_empty((batch, heads, lse_len), dtype=torch.float32)
        if kind == "cudnn":
            workspace = query.new_empty((CUDNN_FPROP_WORKSPACE_BYTES,), dtype=torch.uint8)
            del workspace
        return out, lse

    @staticmethod
    def _kernel_backward(kind: str, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                         out: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """What the kernel's backward allocates, in its order: dq, dk, dv first (every fused
        kernel), then its temporaries, freed as it returns; the gradients."""
        batch, heads, seq_q, head_dim = query.shape
        grads = _grads_like(query, key, value)
        if kind == "cudnn":
            # dQ accumulated in float32, plus the per-row sums of dO x O (MHA.cpp, module docstring).
            accumulators = 4 * batch * heads * seq_q * (head_dim + 1)
            if not kernel_buffer(PlusFixed(CUDNN_BPROP_WORKSPACE_EXTRA_BYTES), accumulators):
                workspace = query.new_empty((accumulators + CUDNN_BPROP_WORKSPACE_EXTRA_BYTES,),
                                            dtype=torch.uint8)
                del workspace
        elif kind == "flash":
            # mha_bwd (flash_api.cpp): softmax_d and dq_accum; dq_accum is freed as it returns,
            # softmax_d (returned, then dropped) right after.
            seq_rounded = _round_up(seq_q, FLASH_SEQ_ROUND)
            softmax_d = query.new_empty((batch, heads, seq_rounded), dtype=torch.float32)
            dq_accum = query.new_empty(
                (batch, seq_rounded, heads, _round_up(head_dim, FLASH_HEAD_ROUND)), dtype=torch.float32
            )
            if key.shape[1] != heads:  # grouped keys and values (the flash-attn package's only)
                _grouped_gradients(grads, heads)
            del dq_accum, softmax_d
        else:
            _efficient_temporaries(query, out)
        return grads


def _grouped_gradients(grads: tuple[torch.Tensor, ...], heads: int) -> None:
    """mha_bwd's grouped-query gradients (flash_api.cpp, MQA / GQA): dK and dV expanded to every
    query head, [B, Sk, H, D], which the kernel writes, then summed over each group into dk and dv
    (``at::sum_out``) before they are freed as it returns."""
    _, dk, dv = grads
    batch, groups, seq_k, head_dim = dk.shape
    expanded = [dk.new_empty((batch, seq_k, heads, head_dim)), dv.new_empty((batch, seq_k, heads, head_dim))]
    for grad, full in zip((dk, dv), expanded, strict=True):
        torch.sum(full.view(batch, seq_k, groups, heads // groups, head_dim), dim=3, out=grad.transpose(1, 2))
    del expanded


def _efficient_temporaries(query: torch.Tensor, out: torch.Tensor) -> None:
    """What ``_efficient_attention_backward`` (attention_backward.cu) allocates after the
    gradients, in its order: delta, the row sums of dO x O (an empty float32 [B, H, M] the 16-bit
    kernels fill; for float32, computed by ops: ``(grad_out * out).sum(-1).transpose(-2,
    -1).contiguous()``, whose product and sum are freed at once), then the kernel's workspace;
    delta is freed before the workspace."""
    batch, heads, seq_q, head_dim = query.shape
    if query.dtype in (torch.float16, torch.bfloat16):
        delta = query.new_empty((batch, heads, seq_q), dtype=torch.float32)
    else:
        product = query.new_empty((batch, seq_q, heads, out.shape[-1]), dtype=torch.float32)
        summed = query.new_empty((batch, seq_q, heads), dtype=torch.float32)
        delta = query.new_empty((batch, heads, seq_q), dtype=torch.float32)
        del summed, product
    nbytes = _efficient_workspace_bytes(batch, heads, seq_q, head_dim)
    workspace = query.new_empty((nbytes,), dtype=torch.uint8)
    del delta, workspace


def _efficient_workspace_bytes(batch: int, heads: int, seq_q: int, head_dim: int) -> int:
    """The memory-efficient backward's workspace (kernel_backward.h ``workspace_size``): per batch
    and head, a float32 tile for dQ (``GradQTempStorage``) per block of rows and of head dims,
    aligned to 4 floats. Tiles of 64 x 64 floats and 4 more: measured on an H100 for float32 and a
    head dim of 64 (25,190,400 B at B 64, H 12, Sq 128; docs/measurements/h100-80gb/records), and
    the shape of every sm80 kernel up to a head dim of 64. Kernels for larger head dims also
    accumulate dK and dV there when they do not fit in registers (``kNeedsAccumGradK/V``):
    ``num_splits_key x kBlockSizeJ x align_up(head_dim, kBlockSizeI)`` floats each per batch and
    head, ``num_splits_key`` capped at ``200 / (B x H)`` (at least 1) for such kernels
    (attention_backward.cu): at most about max(B x H, 200) x 128 x head_dim x 8 bytes in all, 26 MB
    at a head dim of 128 up to 200 batch x heads. Not counted: the dispatcher picks the kernel (its
    block sizes) by shared memory per architecture; plan ``last``'s ``-memeff`` records
    (benchmarks/gpu_measure.py) measure it."""
    tiles = -(-seq_q // MEM_EFF_BLOCK) * -(-head_dim // MEM_EFF_BLOCK)
    return 4 * batch * heads * _round_up(tiles * MEM_EFF_GRAD_Q_TILE_FLOATS, 4)


# Inside ``opaque_kernels()``: the fused kernels called as the custom ops of opaque_attention.py.
_OPAQUE: ContextVar[bool] = ContextVar("opaque_attention", default=False)


@contextlib.contextmanager
def opaque_kernels() -> Iterator[None]:
    """The fused kernels as one custom op each, forward and backward (opaque_attention.py), where
    AOTAutograd traces a compiled step's graphs: their allocations made from shapes alone would
    otherwise be moved, merged (CSE) or dropped (dead code) by its partitioner, as no real kernel's are.
    The ops are registered by importing opaque_attention (compiled.py does)."""
    token = _OPAQUE.set(True)
    try:
        yield
    finally:
        _OPAQUE.reset(token)


def _grads_like(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Gradients as the fused kernels write them: [B, S, H, D], returned as [B, H, S, D]."""
    return tuple(
        t.new_empty((t.shape[0], t.shape[2], t.shape[1], t.shape[3])).transpose(1, 2) for t in tensors
    )


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
    *,
    on_kernel: Callable[[str], None] | None = None,
) -> torch.Tensor:
    """``F.scaled_dot_product_attention`` with CUDA's kernel choice and buffers; ``on_kernel`` is
    told the kernel chosen ("cudnn", "flash", "efficient" or "math")."""
    native_groups = kernels.flash_attn_package and query.dtype in (torch.float16, torch.bfloat16)
    if enable_gqa and key.shape[1] != query.shape[1] and not native_groups:
        # Grouped-query attention: SDPA's CUDA kernels see keys/values repeated per query head. The
        # flash-attn package takes them as they are (flash_api.cpp mha_fwd: num_heads_k divides
        # num_heads), and expands only the gradients in its backward (_kernel_backward).
        repeat = query.shape[1] // key.shape[1]
        key = key.repeat_interleave(repeat, dim=1)
        value = value.repeat_interleave(repeat, dim=1)
    kind = choose_kernel(kernels, query, key, value, attn_mask, is_causal)
    if on_kernel is not None:
        on_kernel(kind)
    if kind == "math":
        return torch.ops.aten._scaled_dot_product_attention_math(
            query, key, value, attn_mask, dropout_p, is_causal, None,
            scale=scale if scale is not None else 1.0 / math.sqrt(query.shape[-1]),
        )[0]
    # flash takes no mask (causal): the flash-attn package's kernel, run whatever mask SDPA was given
    bias = _mem_efficient_bias(attn_mask, query.dtype) if attn_mask is not None and kind != "flash" else None
    if _OPAQUE.get():  # a compiled step's graph: one node per kernel call (opaque_attention.py)
        return torch.ops.autotune.fused_attention(query, key, value, bias, kind)[0]
    return _FusedAttention.apply(query, key, value, bias, kind)
