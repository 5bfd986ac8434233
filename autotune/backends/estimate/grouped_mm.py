"""torch's grouped matrix product on weights other than bfloat16, as CUDA runs it.

transformers runs a mixture's experts with ``torch.nn.functional.grouped_mm`` (integrations/moe.py
``_grouped_mm``, the tokens cast to the weights' dtype). Its CUDA kernel
(aten/src/ATen/native/cuda/GroupedBlas.cpp ``_grouped_mm_cuda``) takes the CUTLASS fast path for
bfloat16 operands only and otherwise ``_grouped_mm_fallback``: a loop of ``mm_out`` over the groups
into the output, which ``create_grouped_gemm_output_tensor`` (GroupedMMUtils.h) allocates; nothing
else. torch's meta function (torch/_meta_registrations.py ``_meta_grouped_mm_common``) still
refuses all but bfloat16, so on fake tensors the fallback is this emulation: float32 experts reach
it under Axolotl's ``quantize_moe_experts`` with an 8-bit base (moe_quant.py: dequantized to
float32) and whenever ``prepare_model_for_kbit_training`` casts unquantized experts to float32.

The output of ``[M, K] x [groups, K, N]`` is ``[M, N]`` in the operands' dtype, its rows padded to
16 bytes (``create_grouped_gemm_output_tensor``: ``alignment = 16 / element size``). Autograd
saves what ``GroupedMmBackward0`` saves, each only where its gradient is wanted (checked on a CPU
build: the weight for the tokens' gradient, the tokens for the weight's); the backward's products
are grouped products again, allocated the same way.
"""

from __future__ import annotations

from typing import Any

import torch

ALIGNMENT_BYTES = 16  # GroupedMMUtils.h create_grouped_gemm_output_tensor


def is_fallback(mat_a: Any, mat_b: Any) -> bool:
    """Whether CUDA runs ``_grouped_mm(mat_a, mat_b)`` through its fallback (module docstring)."""
    return (isinstance(mat_a, torch.Tensor) and isinstance(mat_b, torch.Tensor)
            and not (mat_a.dtype == torch.bfloat16 and mat_b.dtype == torch.bfloat16)
            and mat_a.dtype.is_floating_point and mat_a.dtype.itemsize > 1)


def _output(rows: int, columns: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    alignment = ALIGNMENT_BYTES // dtype.itemsize
    padded = (columns + alignment - 1) // alignment * alignment
    return torch.empty_strided((rows, columns), (padded, 1), dtype=dtype, device=device)


class _FallbackGroupedMM(torch.autograd.Function):
    """``_grouped_mm`` of 2D tokens ``[M, K]`` by 3D weights ``[groups, K, N]`` (module docstring)."""

    @staticmethod
    def forward(ctx: Any, mat_a: torch.Tensor, mat_b: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
        ctx.needs = (mat_a.requires_grad, mat_b.requires_grad)
        ctx.shapes = (mat_a.shape, mat_b.shape)
        kept = (mat_b if mat_a.requires_grad else None, mat_a if mat_b.requires_grad else None)
        ctx.save_for_backward(*(t for t in kept if t is not None), offs)
        return _output(mat_a.shape[0], mat_b.shape[-1], mat_a.dtype, mat_a.device)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None, None]:
        (rows, inner), (groups, _, columns) = ctx.shapes
        grad_a = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_a = _output(rows, inner, grad.dtype, grad.device)  # grad x mat_b^T per group
        if ctx.needs_input_grad[1]:
            grad_b = torch.empty((groups, inner, columns), dtype=grad.dtype, device=grad.device)
        return grad_a, grad_b, None


def fallback_grouped_mm(mat_a: torch.Tensor, mat_b: torch.Tensor, offs: torch.Tensor | None = None,
                        bias: torch.Tensor | None = None,
                        out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """``torch._grouped_mm`` through CUDA's fallback: the 2D-by-3D product transformers' experts
    make; any other form, a bias or an output dtype is refused (no model here makes one)."""
    if mat_a.dim() != 2 or mat_b.dim() != 3 or offs is None or bias is not None \
            or out_dtype not in (None, mat_a.dtype) or mat_a.dtype != mat_b.dtype:
        raise NotImplementedError("only the experts' [tokens, K] x [experts, K, N] grouped product in one "
                                  "dtype is emulated off bfloat16")
    return _FallbackGroupedMM.apply(mat_a, mat_b, offs)
