"""gptqmodel's trainable GPTQ and AWQ layers (workload/prequantized.py), emulated on fake tensors.

gptqmodel (ModelCloud/GPTQModel 7.3.4 at f4c327a) is not installed here and its kernels are CUDA
ones; each layer below registers gptqmodel's buffers with their shapes and dtypes
(prequantized.storage_bytes) and runs its training forward and backward op for op, every size from
its source:

``EmulatedGPTQLinear`` is TritonV2Linear in training mode (nn_modules/qlinear/tritonv2.py
``forward``: ``if self.training: return super().forward(x)``), i.e. TorchLinear
(nn_modules/qlinear/torch.py ``forward`` -> ``_forward_eager``; the streaming path and the weight
cache are off by default: GPTQ_TORCH_STREAMING, GPTQ_TORCH_CACHE_WEIGHTS 0) with
``PackableQuantLinear.dequantize_weight`` (nn_modules/qlinear/__init__.py): plain torch ops, run
here as written on the fake buffers. The dequantized weight ``[in, out]`` (float16, the scales'
dtype, then cast to the input's dtype) is what ``torch.matmul(x, weights)`` saves for the input's
gradient: every quantized layer holds one 16-bit weight from its forward to its backward.

``EmulatedAwqLinear`` is AwqGEMMLinear (nn_modules/qlinear/gemm_awq.py ``forward`` and
``AwqGemmFn``): the input saved; above 1024 rows (batch x sequence) the AWQ extension's
``dequantize_weights`` kernel (AutoAWQ's ``dequantize_weights_cuda``: a ``[in, out]`` tensor of the
scales' dtype) then ``torch.matmul``; at most 1024 rows its ``gemm_forward_cuda`` (split_k_iters 8:
an ``[8, rows, out]`` partial sum, summed). Backward: the weight dequantized again, cast to the
gradient's dtype, and ``grad_output.bmm(weights.T.unsqueeze(0).repeat(batch, 1, 1))``: ``batch``
copies of the weight.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from autotune.workload.prequantized import PACK_BITS, SavedQuant, groups

AWQ_DEQUANT_ROWS = 1024  # AwqGemmFn.forward: FULL_DEQUANT_MATMUL_THRESHOLD = rows > 1024
AWQ_SPLIT_K = 8  # AwqGemmFn.forward: _awq_cuda_gemm_forward(..., 8)


class EmulatedGPTQLinear(nn.Linear):
    """TritonV2Linear's buffers and training step (module docstring). An ``nn.Linear`` so that PEFT's
    all-linear and OFT's layer class find it, as they find gptqmodel's through its quantization
    backend (peft/utils/quantization_utils.py ``ForwardOnlyQuantizationBackend("gptq")``)."""

    # gptqmodel's layers have no ``weight``: PEFT reads ``qweight`` (tuners_utils.py
    # _move_adapter_to_device_of_base_layer) and the features (``_get_in_out_features``)
    weight: Any = None
    qweight: torch.Tensor
    qzeros: torch.Tensor
    scales: torch.Tensor
    g_idx: torch.Tensor
    wf_unsqueeze_zero: torch.Tensor
    wf_unsqueeze_neg_one: torch.Tensor

    def __init__(self, linear: Any, quant: SavedQuant) -> None:
        nn.Module.__init__(self)  # not nn.Linear's: it would allocate a 16-bit weight
        out_features, in_features = linear.weight.shape
        self.in_features, self.out_features = int(in_features), int(out_features)
        self.bits = quant.bits
        self.pack_factor = PACK_BITS // quant.bits
        self.maxq = 2 ** quant.bits - 1
        self.dequant_dtype = torch.int16 if quant.bits == 8 else torch.int8  # torch.py TorchLinear.__init__
        device = linear.weight.device
        g = groups(self.in_features, quant.group_size)
        packed_out = math.ceil(self.out_features * quant.bits / PACK_BITS)
        # _register_gptq_buffers: qweight, qzeros, scales (float16), g_idx
        self.register_buffer("qweight", torch.empty(
            (math.ceil(self.in_features * quant.bits / PACK_BITS), self.out_features), dtype=torch.int32,
            device=device))
        self.register_buffer("qzeros", torch.empty((g, packed_out), dtype=torch.int32, device=device))
        self.register_buffer("scales", torch.empty((g, self.out_features), dtype=torch.float16,
                                                   device=device))
        self.register_buffer("g_idx", torch.empty(self.in_features, dtype=torch.int32, device=device))
        # _init_wf_unsqueeze_buffers: the shift amounts, int32 [1, 1, pack_factor] and [1, pack_factor, 1]
        self.register_buffer("wf_unsqueeze_zero", torch.empty((1, 1, self.pack_factor), dtype=torch.int32,
                                                              device=device), persistent=False)
        self.register_buffer("wf_unsqueeze_neg_one", torch.empty((1, self.pack_factor, 1), dtype=torch.int32,
                                                                 device=device), persistent=False)
        self.bias: Any = None
        if linear.bias is not None:
            self.register_buffer("bias", torch.empty(self.out_features, dtype=torch.float16, device=device))

    def dequantize_weight(self) -> torch.Tensor:
        """PackableQuantLinear.dequantize_weight for 2, 4 and 8 bits, num_itr 1: the same ops."""
        zeros = torch.bitwise_right_shift(torch.unsqueeze(self.qzeros, 2).expand(-1, -1, self.pack_factor),
                                          self.wf_unsqueeze_zero).to(self.dequant_dtype)
        zeros = torch.bitwise_and(zeros, self.maxq).reshape(self.scales.shape)
        weight = torch.bitwise_and(
            torch.bitwise_right_shift(torch.unsqueeze(self.qweight, 1).expand(-1, self.pack_factor, -1),
                                      self.wf_unsqueeze_neg_one).to(self.dequant_dtype), self.maxq)
        weight = weight.reshape(weight.shape[0] * weight.shape[1], weight.shape[2])
        g_idx = self.g_idx.long()
        return self.scales[g_idx] * (weight - zeros[g_idx])  # _dequantize_from_codes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out_shape = x.shape[:-1] + (self.out_features,)
        x = x.reshape(-1, x.shape[-1])
        weights = self.dequantize_weight()
        if weights.dtype != x.dtype:
            weights = weights.to(dtype=x.dtype)
        out = torch.matmul(x, weights).reshape(out_shape)
        if self.bias is not None:
            bias = self.bias if self.bias.dtype == out.dtype else self.bias.to(dtype=out.dtype)
            out.add_(bias)
        return out

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bits={self.bits}"


class EmulatedAwqLinear(nn.Linear):
    """AwqGEMMLinear's buffers and training step (module docstring); an ``nn.Linear`` as above."""

    weight: Any = None  # as above
    qweight: torch.Tensor
    qzeros: torch.Tensor
    scales: torch.Tensor

    def __init__(self, linear: Any, quant: SavedQuant) -> None:
        nn.Module.__init__(self)
        out_features, in_features = linear.weight.shape
        self.in_features, self.out_features = int(in_features), int(out_features)
        self.bits = quant.bits
        device = linear.weight.device
        g = groups(self.in_features, quant.group_size)
        packed = self.out_features // (PACK_BITS // quant.bits)
        # AWQuantLinear.__init__: qweight [in, out / 8], qzeros [in / group, out / 8], scales float16
        self.register_buffer("qweight", torch.empty((self.in_features, packed), dtype=torch.int32,
                                                    device=device))
        self.register_buffer("qzeros", torch.empty((g, packed), dtype=torch.int32, device=device))
        self.register_buffer("scales", torch.empty((g, self.out_features), dtype=torch.float16,
                                                   device=device))
        self.bias: Any = None
        if linear.bias is not None:
            self.register_buffer("bias", torch.empty(self.out_features, dtype=torch.float16, device=device))

    def dequantized(self) -> torch.Tensor:
        """The AWQ extension's dequantize_weights: ``[in, out]`` of the scales' dtype."""
        return torch.empty((self.in_features, self.out_features), dtype=self.scales.dtype,
                           device=self.scales.device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out_shape = x.shape[:-1] + (self.out_features,)
        input_dtype = x.dtype
        compute_dtype = input_dtype if input_dtype in (torch.float16, torch.bfloat16) else torch.float16
        if input_dtype != compute_dtype:
            x = x.to(compute_dtype)
        elif not x.is_contiguous():
            x = x.contiguous()
        # _ensure_runtime_dtype: the scales (and bias) cast to the compute dtype, kept
        if self.scales.dtype != compute_dtype:
            self.scales = self.scales.to(dtype=compute_dtype).contiguous()
        if self.bias is not None and self.bias.dtype != compute_dtype:
            self.bias = self.bias.to(dtype=compute_dtype).contiguous()
        out = _AwqGemmFn.apply(x, self, self.bias)
        if out.dtype != input_dtype:
            out = out.to(dtype=input_dtype)
        return out.reshape(out_shape)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bits={self.bits}"


class _AwqGemmFn(torch.autograd.Function):
    """gemm_awq.py ``AwqGemmFn`` (module docstring)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, layer: EmulatedAwqLinear,
                bias: torch.Tensor | None) -> torch.Tensor:
        ctx.save_for_backward(x, layer.qweight, layer.qzeros, layer.scales, bias)
        ctx.layer = layer
        out_shape = x.shape[:-1] + (layer.out_features,)
        if x.shape[0] * x.shape[1] > AWQ_DEQUANT_ROWS:
            out = torch.matmul(x, layer.dequantized().to(dtype=x.dtype))
        else:  # gemm_forward_cuda: split_k partial sums of the input's dtype, summed
            rows = x.reshape(-1, x.shape[-1]).shape[0]
            partial = torch.empty((AWQ_SPLIT_K, rows, layer.out_features), dtype=x.dtype, device=x.device)
            out = partial.sum(0)
            del partial
        out = out + bias if bias is not None else out
        out = out.reshape(out_shape)
        if len(out.shape) == 2:
            out = out.unsqueeze(0)
        return out

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, None, None]:
        layer: EmulatedAwqLinear = ctx.layer
        weights = layer.dequantized().to(grad_output.dtype)
        grad_input = None
        if ctx.needs_input_grad[0]:
            batch = grad_output.shape[0]
            grad_input = grad_output.bmm(weights.transpose(0, 1).unsqueeze(0).repeat(batch, 1, 1))
        return grad_input, None, None


def make_saved_quantizer(quant: SavedQuant) -> Any:
    """``quantize(linear, name)`` for adapters.prepare: the emulated layer of ``quant``'s method."""
    layer = EmulatedGPTQLinear if quant.method == "gptq" else EmulatedAwqLinear

    def quantize(linear: nn.Module, name: str) -> nn.Module:
        return layer(linear, quant)

    return quantize
