"""Axolotl's ``quantize_moe_experts``: the experts' 3D weights stored in 4 or 8 bits, emulated on
fake tensors with bitsandbytes' CUDA sizes.

transformers 5 stores a mixture's experts as 3D ``nn.Parameter`` tensors (``gate_up_proj``
``[experts, 2 x moe_intermediate, hidden]``, ``down_proj``), which its bitsandbytes integration
does not quantize (it replaces ``nn.Linear`` modules only). Axolotl's
``monkeypatch/moe_quant.py`` ``patch_moe_quantization_on_load`` (called from
``loaders/patch_manager.py`` ``_apply_moe_expert_quantization_patch``) wraps transformers'
``core_model_loading.set_param_for_module``: each parameter of 3 or more dimensions whose name
holds "expert" (and whose module is no bitsandbytes linear layer) is quantized as it reaches the
GPU, the 16-bit tensor then freed (``param_value.data = torch.empty(0)``, ``empty_cache()``):

    4-bit  bitsandbytes' ``nn/parametrize.py`` ``replace_parameter_4bit(module, name,
           compress_statistics=bnb_4bit_use_double_quant (default True), quant_type=
           bnb_4bit_quant_type (default nf4))``: ``functional.quantize_4bit`` of the whole 3D
           tensor, blocksize 64, so the packed weight and state of nf4.py's layer of the same
           element count (``nf4_storage_bytes``), in a ``Bnb4bitParametrization``
    8-bit  Axolotl's ``replace_parameter_8bit``: ``int8_vectorwise_quant`` of a float16 copy, an
           int8 tensor of the weight's shape and one float32 scale per row of its last dimension
           (``row_stats``, ``numel / shape[-1]`` of them: ``backends/cuda/ops.py``), in a
           ``Bnb8bitParametrization``

Either is registered with ``torch.nn.utils.parametrize.register_parametrization(unsafe=True)``:
the module's attribute becomes a property that dequantizes on each access, under ``@torch.no_grad``:

    4-bit  ``functional.dequantize_4bit``: with double quantization a float32 absmax
           (``dequantize_blockwise``, the offset added in place), then the weight in the dtype it
           was loaded in (``quant_state.dtype``: the model's, bfloat16)
    8-bit  ``int8_vectorwise_dequant`` (``_ops.py``'s default kernel, the one CUDA runs):
           ``A * stats.view(-1, 1) * (1/127)``, a float32 temporary and the float32 weight

The dequantized weights are cached for the experts module's forward: bitsandbytes
(``_register_parametrization_hooks``, per parameter) and Axolotl (once per module) register a
forward pre-hook that raises ``parametrize._cache_enabled`` and a forward hook that lowers it and
empties ``parametrize._cache`` at zero. So each weight is dequantized once per forward of the
experts and held to its end; what outlives it is what autograd saves: transformers' experts
(``integrations/moe.py`` ``grouped_mm_experts_forward``) multiply with the whole dequantized
tensor (``_grouped_mm``), which keeps it for the tokens' gradient whenever they require one.
Without gradient checkpointing every layer's dequantized experts thus live until its backward;
with it, the checkpointed forward keeps none and the recomputation in backward one layer's.
These lifetimes are torch's own: this module emulates the bitsandbytes kernels' allocations and
registers the real parametrization and hooks; the traced step does the rest.

Not modelled: the 16-bit tensors are loaded and freed one at a time with ``empty_cache()`` between
them; here each is made and freed in turn, the allocator's cache kept (a bound from above on the
segments' fragmentation at load). ``caching_allocator_warmup``, which Axolotl turns off, is not
modelled either way.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import torch
import torch.nn.utils.parametrize as P
from torch import nn

from autotune.backends.estimate.nf4 import (
    BLOCKSIZE,
    CODE_VALUES_4BIT,
    CODE_VALUES_DYNAMIC,
    NESTED_BLOCKSIZE,
    quantize_4bit_allocations,
)
from autotune.backends.estimate.tracker import allocation_region

INT8_RECIPROCAL = 7.874015718698502e-3  # _ops.py int8_vectorwise_dequant: 1 / 127
DEQUANT_REGION = "expert dequantization"  # the dequantized experts (tracker.allocation_region)


def expert_parameters(model: nn.Module) -> list[tuple[nn.Module, str]]:
    """The (module, name) of each parameter Axolotl quantizes (``_patched_set_param_for_module``):
    3 or more dimensions, "expert" in its full name (case-insensitive)."""
    found = []
    for module_name, module in model.named_modules():
        for name, param in module.named_parameters(recurse=False):
            full = f"{module_name}.{name}" if module_name else name
            if param.ndim >= 3 and "expert" in full.lower():
                found.append((module, name))
    return found


def _enable_cache(module: nn.Module, inputs: Any) -> None:
    # bitsandbytes nn/parametrize.py _enable_parametrization_cache (Axolotl's is the same)
    P._cache_enabled += 1


def _disable_cache(module: nn.Module, inputs: Any, output: Any) -> None:
    # bitsandbytes nn/parametrize.py _disable_parametrization_cache
    P._cache_enabled = max(0, P._cache_enabled - 1)
    if not P._cache_enabled:
        P._cache = {}


class EmulatedBnb4bitParametrization(nn.Module):
    """bitsandbytes' ``Bnb4bitParametrization`` over a packed 3D weight (module docstring). Its
    quantization state, plain tensors of the ``QuantState`` on the GPU, is held as buffers so that
    the estimator counts them with the weights (as nf4.EmulatedLinear4bit's)."""

    emulates_quantized_load = True  # allocated through ``load`` (traced_step.load_weights)

    code: torch.Tensor
    absmax: torch.Tensor
    offset: torch.Tensor
    state2_absmax: torch.Tensor
    state2_code: torch.Tensor

    def __init__(self, packed: torch.Tensor, shape: torch.Size, dtype: torch.dtype, *,
                 double_quant: bool) -> None:
        super().__init__()
        self.shape, self.dtype, self.double_quant = shape, dtype, double_quant
        self._packed = [packed]  # the module's own parameter (parametrizations.<name>.original)
        blocks = math.ceil(math.prod(shape) / BLOCKSIZE)
        device = packed.device
        self.register_buffer("code", torch.empty(CODE_VALUES_4BIT, device=device), persistent=False)
        if double_quant:
            self.register_buffer("absmax", torch.empty(blocks, dtype=torch.uint8, device=device),
                                 persistent=False)
            self.register_buffer("offset", torch.empty((), device=device), persistent=False)
            self.register_buffer("state2_absmax", torch.empty(math.ceil(blocks / NESTED_BLOCKSIZE),
                                                              device=device), persistent=False)
            self.register_buffer("state2_code", torch.empty(CODE_VALUES_DYNAMIC, device=device),
                                 persistent=False)
        else:
            self.register_buffer("absmax", torch.empty(blocks, device=device), persistent=False)

    def load(self, track: Callable[[torch.Tensor], None]) -> None:
        """The 16-bit weight as transformers loads it, ``quantize_4bit``'s allocations (nf4.py),
        then the 16-bit weight freed (Axolotl: ``param_value.data = torch.empty(0)``)."""
        loaded = torch.empty(self.shape, dtype=self.dtype, device=self.absmax.device)
        state = SimpleNamespace(weight=self._packed[0], absmax=self.absmax, code=self.code,
                                double_quant=self.double_quant, offset=getattr(self, "offset", None),
                                state2_absmax=getattr(self, "state2_absmax", None),
                                state2_code=getattr(self, "state2_code", None))
        quantize_4bit_allocations(state, track)
        del loaded

    @torch.no_grad()
    def forward(self, packed: torch.Tensor) -> torch.Tensor:
        # functional.dequantize_4bit (module docstring)
        with allocation_region(DEQUANT_REGION):
            absmax = None
            if self.double_quant:
                absmax = torch.empty(self.absmax.shape, dtype=torch.float32, device=packed.device)
                absmax += self.offset
            out = torch.empty(self.shape, dtype=self.dtype, device=packed.device)
            del absmax
            return out


class EmulatedBnb8bitParametrization(nn.Module):
    """Axolotl's ``Bnb8bitParametrization`` (module docstring): ``int8_vectorwise_dequant`` of
    the int8 weight flattened to 2D, reshaped back; float32."""

    emulates_quantized_load = True

    row_stats: torch.Tensor

    def __init__(self, quantized: torch.Tensor, dtype: torch.dtype) -> None:
        super().__init__()
        self.dtype = dtype
        self._quantized = [quantized]
        rows = quantized.numel() // quantized.shape[-1]
        self.register_buffer("row_stats", torch.empty(rows, device=quantized.device), persistent=False)

    def load(self, track: Callable[[torch.Tensor], None]) -> None:
        """The 16-bit weight as loaded, its float16 copy (``.to(torch.float16)``: a copy from
        bfloat16), ``int8_vectorwise_quant``'s row scales then int8 weight, the copies freed."""
        quantized = self._quantized[0]
        loaded = torch.empty(quantized.shape, dtype=self.dtype, device=quantized.device)
        half = loaded.to(torch.float16) if self.dtype != torch.float16 else loaded
        track(self.row_stats)
        track(quantized)
        del half, loaded

    @torch.no_grad()
    def forward(self, quantized: torch.Tensor) -> torch.Tensor:
        shape = quantized.shape
        with allocation_region(DEQUANT_REGION):
            # ``A * stats.view(-1, 1)``: one CUDA kernel into a float32 [rows, in] (on fake tensors
            # int8 * float32 would add type-promotion copies of both operands), then ``* (1/127)``
            scaled = torch.empty((quantized.numel() // shape[-1], shape[-1]), dtype=torch.float32,
                                 device=quantized.device)
            return (scaled * INT8_RECIPROCAL).reshape(shape)


def make_expert_quantizer(*, bits: int, quant_type: str, double_quant: bool) -> Callable[[nn.Module], int]:
    """``quantize_experts(model) -> count`` for adapters.prepare (workload/parts.py): each expert
    parameter (``expert_parameters``) replaced by its packed storage and an emulated
    parametrization, with the cache hooks of bitsandbytes (4-bit: per parameter) or Axolotl
    (8-bit: once per module)."""

    def quantize_experts(model: nn.Module) -> int:
        found = expert_parameters(model)
        hooked: set[int] = set()
        for module, name in found:
            weight = getattr(module, name)
            device = weight.device
            parametrization: nn.Module
            if bits == 4:
                n = weight.numel()
                packed = torch.empty(((n + 1) // 2, 1), dtype=torch.uint8, device=device)
                parametrization = EmulatedBnb4bitParametrization(packed, weight.shape, weight.dtype,
                                                                 double_quant=double_quant)
            else:
                packed = torch.empty(weight.shape, dtype=torch.int8, device=device)
                parametrization = EmulatedBnb8bitParametrization(packed, weight.dtype)
            setattr(module, name, nn.Parameter(packed, requires_grad=False))
            P.register_parametrization(module, name, parametrization, unsafe=True)
            if bits == 4 or id(module) not in hooked:
                module.register_forward_pre_hook(_enable_cache)
                module.register_forward_hook(_disable_cache, always_call=(bits == 4))
                hooked.add(id(module))
        return len(found)

    del quant_type  # nf4 and fp4 store and dequantize in the same sizes
    return quantize_experts
