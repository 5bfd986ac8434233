"""bitsandbytes' 4-bit linear layer (QLoRA's base), emulated on fake tensors with its CUDA sizes.

bitsandbytes cannot run here: its ``Params4bit`` cannot wrap a fake tensor, and its CUDA kernels
allocate inside the kernel call, where a CPU run sees nothing. ``EmulatedLinear4bit`` stores and
computes as bitsandbytes 0.50 does on CUDA, every size from its source:

Storage (``functional.quantize_4bit``; the fake kernel ``_ops.py`` "bitsandbytes::quantize_4bit"):
    weight      ``(n + 1) // 2`` bytes, n = in x out: shape ``[(n+1) // (2 * s), 1]`` of the
                ``quant_storage`` dtype of s bytes (uint8 by default; FSDP-QLoRA's bfloat16, which
                FSDP shards as any 16-bit parameter: backends/distributed.py)
    code        the 16-value NF4/FP4 table, float32, one per layer (``get_4bit_type(device=...)``)
    without double quantization:
        absmax  ``ceil(n / 64)`` float32 (blocksize 64, ``quantize_4bit``'s default)
    with double quantization (``compress_statistics=True``, transformers'
    ``bnb_4bit_use_double_quant``; ``quantize_blockwise(_absmax - offset, blocksize=256)``):
        absmax  ``ceil(n / 64)`` uint8
        offset  a float32 scalar (``_absmax.mean()``)
        state2  ``ceil(ceil(n / 64) / 256)`` float32 absmax and a copy of the 256-value dynamic map
                (float32, ``code.to(A.device, copy=True)``)

Forward (``nn.Linear4bit.forward``, ``autograd/_functions.py`` ``MatMul4Bit``): the input is cast to
the compute dtype (``set_compute_type``: the input's own dtype when it is float32 or bfloat16, the
configured one for float16), then CUDA's ``gemm_4bit`` kernel runs. For a training batch
(``M = batch x seq > 1536``, ``backends/cuda/ops.py`` ``_gemm_4bit_custom_max_m``) it takes the
unfused path ``_dequant_linear_fallback``: with double quantization a float32 absmax of
``ceil(n / 64)`` values and its sum with the offset, then the whole weight dequantized in the
compute dtype (``[out, in]``), then ``F.linear``. Smaller batches may take the fused kernel, which
allocates only its output: the emulation takes the unfused path always, which holds one layer's
dequantized weight more (an upper bound, by at most the largest layer's weight in 16 bits).
``MatMul4Bit`` saves no activation for backward (the packed weight only: no gradient for it).
Its forward and backward each run in the allocation region ``MATMUL_REGION`` (tracker.py), their
result handed out: a recording tracker tells what they allocate for themselves (the dequantized
weight and absmax, casts) from the rest of the step (explain's dequantization temporaries).

Backward (``MatMul4Bit.backward``): ``functional.dequantize_4bit`` (with double quantization a
float32 absmax again, offset added in place) dequantizes the weight in the dtype it was loaded in
(``quant_state.dtype``), casts it to the gradient's dtype, and multiplies.

``LoraLinear4bit`` is PEFT's LoRA layer over it (bnb_lora.py: the base output cloned
"defensively", per Tim Dettmers).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from autotune.backends.estimate.bnb_lora import BnbLoraLinear
from autotune.backends.estimate.tracker import allocation_region

BLOCKSIZE = 64  # functional.quantize_4bit: blocksize None -> 64
NESTED_BLOCKSIZE = 256  # functional.quantize_4bit: quantize_blockwise(..., blocksize=256)
CODE_VALUES_4BIT = 16  # functional.get_4bit_type: the NF4 / FP4 table
CODE_VALUES_DYNAMIC = 256  # functional.create_dynamic_map: the 8-bit map of the nested absmax
GEMM_CUSTOM_MAX_M = 1536  # backends/cuda/ops.py _gemm_4bit_custom_max_m (CUDA)
MATMUL_REGION = "4-bit matmul"  # the allocation region of the matmul's own work (module docstring)


def nf4_storage_bytes(in_features: int, out_features: int, *, double_quant: bool) -> dict[str, int]:
    """The bytes of one 4-bit layer's weight and quantization state, by part (module docstring)."""
    n = in_features * out_features
    blocks = math.ceil(n / BLOCKSIZE)
    parts = {"weight": (n + 1) // 2, "code": CODE_VALUES_4BIT * 4}
    if double_quant:
        parts.update({"absmax": blocks, "offset": 4,
                      "state2_absmax": math.ceil(blocks / NESTED_BLOCKSIZE) * 4,
                      "state2_code": CODE_VALUES_DYNAMIC * 4})
    else:
        parts["absmax"] = blocks * 4
    return parts


def quantize_4bit_allocations(layer: Any, track: Callable[[torch.Tensor], None]) -> None:
    """What ``functional.quantize_4bit`` allocates for ``layer``'s packed ``weight`` and its state
    (the buffers of EmulatedLinear4bit's, by the same names), the 16-bit source already on the
    device: the float32 absmax, the packed weight and the code table; with double quantization
    the offset, ``_absmax - offset``, the nested absmax, the 8-bit absmax and the nested code's
    copy, then ``_absmax - offset`` and the float32 absmax freed (``EmulatedLinear4bit.load``)."""
    device = layer.weight.device
    absmax32 = (torch.empty(layer.absmax.shape, dtype=torch.float32, device=device)
                if layer.double_quant else layer.absmax)
    track(absmax32)
    track(layer.weight)
    track(layer.code)
    if layer.double_quant:
        track(layer.offset)
        shifted = torch.empty(layer.absmax.shape, dtype=torch.float32, device=device)
        track(layer.state2_absmax)
        track(layer.absmax)
        track(layer.state2_code)
        del shifted, absmax32


class EmulatedLinear4bit(nn.Linear):
    """A linear layer stored in 4 bits as bitsandbytes stores it; computes as its CUDA kernels
    allocate (module docstring). An ``nn.Linear`` so that PEFT's ``all-linear`` finds it, as it
    finds ``bnb.nn.Linear4bit``."""

    emulates_quantized_load = True  # the estimator allocates it through ``load`` (traced_step.load_weights)
    stores_params4bit = True  # its weight stands for a bitsandbytes Params4bit (backends/distributed.py)

    # The quantization state's buffers (registered in __init__).
    code: torch.Tensor
    absmax: torch.Tensor
    offset: torch.Tensor
    state2_absmax: torch.Tensor
    state2_code: torch.Tensor

    def __init__(self, linear: Any, *, quant_type: str, double_quant: bool, compute_dtype: str,
                 transposed: bool = False, quant_storage: torch.dtype = torch.uint8) -> None:
        nn.Module.__init__(self)  # not nn.Linear's: it would allocate a full weight
        weight: torch.Tensor = linear.weight
        out_features, in_features = weight.shape[::-1] if transposed else weight.shape  # Conv1D: [in, out]
        self.in_features, self.out_features = int(in_features), int(out_features)
        self.quant_type, self.double_quant = quant_type, double_quant
        self.quant_dtype: torch.dtype = weight.dtype  # quant_state.dtype: the dtype the weight was loaded in
        self.compute_dtype: torch.dtype | None = getattr(torch, compute_dtype)
        self.compute_type_is_set = False
        n = self.in_features * self.out_features
        blocks = math.ceil(n / BLOCKSIZE)
        device = weight.device
        # the fake kernel's ``((n + 1) // (quant_storage.itemsize * 2), 1)`` of quant_storage
        rows = (n + 1) // (quant_storage.itemsize * 2)
        self.weight = nn.Parameter(torch.empty((rows, 1), dtype=quant_storage, device=device),
                                   requires_grad=False)
        self.bias = linear.bias
        if self.bias is not None:
            self.bias.requires_grad_(False)
        # The quantization state lives on the device as plain tensors: buffers here, so that the
        # estimator counts them with the parameters.
        self.register_buffer("code", torch.empty(CODE_VALUES_4BIT, device=device), persistent=False)
        if double_quant:
            self.register_buffer("absmax", torch.empty(blocks, dtype=torch.uint8, device=device),
                                 persistent=False)
            self.register_buffer("offset", torch.empty((), device=device), persistent=False)
            self.register_buffer("state2_absmax",
                                 torch.empty(math.ceil(blocks / NESTED_BLOCKSIZE), device=device),
                                 persistent=False)
            self.register_buffer("state2_code", torch.empty(CODE_VALUES_DYNAMIC, device=device),
                                 persistent=False)
        else:
            self.register_buffer("absmax", torch.empty(blocks, device=device), persistent=False)

    def load(self, track: Callable[[torch.Tensor], None]) -> None:
        """Allocate this layer as it reaches the GPU, run under the estimator's tracker: bitsandbytes'
        ``Params4bit._quantize`` (nn/modules.py) copies the 16-bit weight to the device, then
        ``functional.quantize_4bit`` allocates the float32 absmax, the packed weight and the code
        table; with double quantization the offset, ``_absmax - offset``, the nested absmax, the
        8-bit absmax and the nested code's copy, then frees ``_absmax - offset``, the float32 absmax
        and, back in ``_quantize``, the 16-bit copy. Its transients leave holes among the packed
        weights: an H100's record of Llama-3.2-1B's QLoRA step shows this sequence for every layer
        (docs/measurements/h100-80gb/records), and under a 24 GiB budget the step fits in 19.8 GiB
        reserved from that layout while a layout without the transients runs out of memory.
        Left out: get_4bit_type's 64- and 4-byte temporaries and the dynamic map bitsandbytes caches
        once per process (1 KiB)."""
        weight16 = torch.empty((self.out_features, self.in_features), dtype=self.quant_dtype,
                               device=self.weight.device)
        quantize_4bit_allocations(self, track)
        del weight16

    def set_compute_type(self, x: torch.Tensor) -> None:
        # nn/modules.py Linear4bit.set_compute_type: float32 and bfloat16 inputs compute in their
        # own dtype; float16 keeps the configured compute dtype.
        if x.dtype in (torch.float32, torch.bfloat16):
            self.compute_dtype = x.dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.compute_type_is_set:
            self.set_compute_type(x)
            self.compute_type_is_set = True
        inp_dtype = x.dtype
        if self.compute_dtype is not None:
            x = x.to(self.compute_dtype)
        bias: Any = self.bias
        if bias is not None:
            if bias.dtype != x.dtype:
                bias.data = bias.data.to(x.dtype)
            bias = bias.to(self.compute_dtype)
        return _MatMul4Bit.apply(x, self, bias).to(inp_dtype)

    def dequantized_absmax(self) -> torch.Tensor | None:
        """The float32 absmax a nested state is expanded to; None without double quantization."""
        if not self.double_quant:
            return None
        return torch.empty(self.absmax.shape, dtype=torch.float32, device=self.absmax.device)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"{self.quant_type}, double_quant={self.double_quant}")


class _MatMul4Bit(torch.autograd.Function):
    """``MatMul4Bit`` with CUDA's ``gemm_4bit`` unfused path (module docstring)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, layer: EmulatedLinear4bit,
                bias: torch.Tensor | None) -> torch.Tensor:
        ctx.layer = layer
        with allocation_region(MATMUL_REGION) as region:
            absmax = layer.dequantized_absmax()
            if absmax is not None:
                absmax = absmax + layer.offset  # _dequant_linear_fallback: absmax_dq + absmax_offset
            weight = torch.empty((layer.out_features, layer.in_features), dtype=x.dtype, device=x.device)
            del absmax
            return region.hand_out(torch.nn.functional.linear(x, weight, bias))

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, None, None]:
        layer: EmulatedLinear4bit = ctx.layer
        if not ctx.needs_input_grad[0]:
            return None, None, None
        with allocation_region(MATMUL_REGION) as region:
            absmax = layer.dequantized_absmax()
            if absmax is not None:
                absmax += layer.offset
            weight = torch.empty((layer.out_features, layer.in_features), dtype=layer.quant_dtype,
                                 device=grad_output.device)
            del absmax
            grad = region.hand_out(torch.matmul(grad_output, weight.to(grad_output.dtype)))
        return grad, None, None


def make_quantizer(*, quant_type: str, double_quant: bool, compute_dtype: str,
                   quant_storage: str = "uint8") -> Any:
    """``quantize(linear, name)`` for adapters.prepare: the emulated 4-bit layer, its packed weight
    in ``quant_storage`` (BitsAndBytesConfig's ``bnb_4bit_quant_storage``)."""
    from transformers.pytorch_utils import Conv1D

    storage = getattr(torch, quant_storage)

    def quantize(linear: nn.Module, name: str) -> nn.Module:
        return EmulatedLinear4bit(linear, quant_type=quant_type, double_quant=double_quant,
                                  compute_dtype=compute_dtype, transposed=isinstance(linear, Conv1D),
                                  quant_storage=storage)

    return quantize


class LoraLinear4bit(BnbLoraLinear):
    """PEFT's LoRA layer over a 4-bit base: peft/tuners/lora/bnb.py ``Linear4bit`` (bnb_lora.py)."""

    clone_base_output = True  # "As per Tim Dettmers, for 4bit, we need to defensively clone here."
