"""bitsandbytes' 8-bit linear layer (an LLM.int8 base under LoRA), emulated on fake tensors with its
CUDA sizes.

bitsandbytes cannot run here (its ``Int8Params`` quantizes on the way to a CUDA device, its kernels
allocate inside the call): ``EmulatedLinear8bitLt`` stores and computes as bitsandbytes 0.50 does on
CUDA for a frozen base, every size from its source. transformers' ``BitsAndBytesConfig(load_in_8bit=
True)`` makes each quantized layer ``nn.Linear8bitLt(has_fp16_weights=False, threshold=6.0)``
(``llm_int8_threshold``'s default).

Storage (``nn/modules.py`` ``Int8Params._quantize``): the weight copied to the device in float16,
then ``functional.int8_vectorwise_quant`` (``backends/cuda/ops.py``: ``row_stats``, then ``out_row``)
makes ``SCB``, one float32 scale per output row, and ``CB``, the weight as int8 ``[out, in]``; the
float16 copy is freed.

Forward (``autograd/_functions.py`` ``MatMul8bitLt.forward``, the weight frozen so the "fast path"):
the input as float16 (``A.to(torch.float16)``: a copy unless it is float16), quantized row-wise by
``int8_vectorwise_quant(threshold=6.0)``: float32 row scales ``[M]``, int8 rows ``[M, in]``, and the
outlier search ``A.abs() >= threshold`` (a float16 and a bool ``[M, in]``, then a bool per column).
``int8_mixed_scaled_mm`` (``backends/default/ops.py``) multiplies: ``int8_linear_matmul`` into int32
``[M, out]``, ``int8_mm_dequant`` into float16 ``[M, out]``, cast to the input's dtype. The input
itself is kept for backward whenever it requires grad (``ctx.tensors = (CAt, subA, A)``): under LoRA
past the first adapted layer it does, so each layer's input lives until backward, where a 16-bit
frozen ``nn.Linear`` would keep none.

Backward (``MatMul8bitLt.backward``, input grads only): the weight dequantized in the input's dtype
(``state.CB.to(ctx.dtype_A, copy=True).mul_(state.SCB.unsqueeze(1).mul(1.0 / 127.0))``), the output
gradient cast to it, and one matmul.

Not counted: the outlier columns. Which input columns hold a value of 6 or more depends on the data
(the LLM.int8 paper's emergent features: a handful of the hidden dimensions in models of 6.7B
parameters and more), so the emulation finds none; each one found keeps a column of the input
(``subA``, ``M`` values in its dtype) until backward and dequantizes a column of the weight in
forward. The forward and backward run in the allocation region ``MATMUL_REGION`` (tracker.py), their
result handed out, as the 4-bit layer's do (nf4.py): explain counts their own buffers apart.

``LoraLinear8bitLt`` is PEFT's LoRA layer over it (bnb_lora.py: no defensive clone, unlike the 4-bit
one).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import torch
from torch import nn

from autotune.backends.estimate.bnb_lora import BnbLoraLinear
from autotune.backends.estimate.tracker import allocation_region

THRESHOLD = 6.0  # transformers BitsAndBytesConfig llm_int8_threshold (utils/quantization_config.py)
MATMUL_REGION = "8-bit matmul"  # the allocation region of the matmul's own work (module docstring)


def int8_storage_bytes(in_features: int, out_features: int) -> dict[str, int]:
    """The bytes of one 8-bit layer's weight and scales, by part (module docstring)."""
    return {"weight": in_features * out_features, "SCB": out_features * 4}


class EmulatedLinear8bitLt(nn.Linear):
    """A linear layer stored in 8 bits as bitsandbytes' ``Linear8bitLt`` stores a frozen one; computes
    as its CUDA kernels allocate (module docstring). An ``nn.Linear`` so that PEFT's ``all-linear``
    finds it, as it finds ``bnb.nn.Linear8bitLt``."""

    emulates_quantized_load = True  # allocated through ``load`` (traced_step.load_weights)

    SCB: torch.Tensor

    def __init__(self, linear: Any, *, transposed: bool = False) -> None:
        nn.Module.__init__(self)  # not nn.Linear's: it would allocate a full weight
        weight: torch.Tensor = linear.weight
        out_features, in_features = weight.shape[::-1] if transposed else weight.shape  # Conv1D: [in, out]
        self.in_features, self.out_features = int(in_features), int(out_features)
        device = weight.device
        self.weight = nn.Parameter(torch.empty((self.out_features, self.in_features), dtype=torch.int8,
                                               device=device), requires_grad=False)
        self.bias = linear.bias
        if self.bias is not None:
            self.bias.requires_grad_(False)
        # Int8Params.SCB, a plain tensor on the device: a buffer here, counted with the parameters.
        self.register_buffer("SCB", torch.empty(self.out_features, device=device), persistent=False)

    def load(self, track: Callable[[torch.Tensor], None]) -> None:
        """Allocate this layer as it reaches the GPU (``Int8Params._quantize``): the float16 copy of
        the weight, the row scales, the int8 weight; then the copy is freed."""
        weight16 = torch.empty((self.out_features, self.in_features), dtype=torch.float16,
                               device=self.weight.device)
        track(self.SCB)
        track(self.weight)
        del weight16

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias: Any = self.bias
        if bias is not None and bias.dtype != x.dtype:
            # Linear8bitLt.forward: "the bias has to be cast manually"
            bias.data = bias.data.to(x.dtype)
        return cast(torch.Tensor, _MatMul8bitLt.apply(x, self, bias))

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8"


class _MatMul8bitLt(torch.autograd.Function):
    """``MatMul8bitLt`` over a frozen int8 weight (module docstring)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, layer: EmulatedLinear8bitLt,
                bias: torch.Tensor | None) -> torch.Tensor:
        ctx.layer = layer
        shape = x.shape
        rows = x.reshape(-1, shape[-1])
        with allocation_region(MATMUL_REGION) as region:
            half = rows.to(torch.float16)
            row_stats = torch.empty(rows.shape[0], dtype=torch.float32, device=x.device)  # SCA
            quantized = torch.empty(rows.shape, dtype=torch.int8, device=x.device)  # CA
            outliers = half.abs() >= THRESHOLD
            columns = outliers.any(dim=0)
            del outliers, columns, half
            product = torch.empty((rows.shape[0], layer.out_features), dtype=torch.int32, device=x.device)
            dequantized = torch.empty(product.shape, dtype=torch.float16, device=x.device)
            del product, quantized, row_stats
            output = dequantized.to(x.dtype)
            del dequantized
            if bias is not None and bias.dtype != torch.float16:  # a float16 bias is fused in the kernel
                output.add_(bias)
            result = region.hand_out(output.reshape(*shape[:-1], layer.out_features))
        ctx.grad_shape = shape
        ctx.dtype_A = x.dtype
        # ctx.tensors = (CAt, subA, A): the input kept whenever a gradient flows back through it
        ctx.kept = rows if ctx.needs_input_grad[0] else None
        return result

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, None, None]:
        layer: EmulatedLinear8bitLt = ctx.layer
        ctx.kept = None
        if not ctx.needs_input_grad[0]:
            return None, None, None
        with allocation_region(MATMUL_REGION) as region:
            grad = grad_output
            if grad.dim() == 3:  # "Cast grad_output to fp16": a copy only where it is not contiguous
                grad = grad.reshape(-1, grad.shape[-1]).contiguous()
            weight = torch.empty((layer.out_features, layer.in_features), dtype=ctx.dtype_A,
                                 device=grad.device)
            weight.mul_(layer.SCB.unsqueeze(1).mul(1.0 / 127.0))
            result = region.hand_out(torch.matmul(grad.to(ctx.dtype_A), weight).view(ctx.grad_shape))
            del weight
        return result, None, None


def make_quantizer() -> Any:
    """``quantize(linear, name)`` for adapters.prepare: the emulated 8-bit layer."""
    from transformers.pytorch_utils import Conv1D

    def quantize(linear: nn.Module, name: str) -> nn.Module:
        return EmulatedLinear8bitLt(linear, transposed=isinstance(linear, Conv1D))

    return quantize


class LoraLinear8bitLt(BnbLoraLinear):
    """PEFT's LoRA layer over an 8-bit base: peft/tuners/lora/bnb.py ``Linear8bitLt`` (bnb_lora.py,
    without the 4-bit layer's clone)."""
