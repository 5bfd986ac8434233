"""Axolotl's fused LoRA kernels on fake tensors: workload/lora_kernels.py's emulation with the
estimator's 4-bit dequantization, registers and autocast.

- ``dequantize``: Axolotl's kernels/quantize.py ``dequantize(W, quant_state)``. A 16/32-bit weight
  is returned as it is (``quant_state`` None). The emulated 4-bit layer (nf4.py) is dequantized as
  Axolotl dequantizes bitsandbytes' ``Params4bit``: with double quantization ``_ctypes_nf4_dequant``
  allocates the weight ``torch.empty(quant_state.shape, quant_state.dtype)`` ([out, in] in the dtype
  the weight was loaded in), then a float32 absmax of ``ceil(n / 64)`` values, adds the offset in
  place and frees it; without, bitsandbytes' ``functional.dequantize_4bit`` allocates the weight
  alone. Both in nf4's allocation region (explain's dequantization temporaries): the weight is the
  kernel's temporary, freed after the matmul it is made for.
- ``registers``: the Triton activation kernels' arithmetic, in ``tracker.outside_allocator()``.
- ``autocast``: ``torch.amp.custom_fwd`` records the forward's autocast and ``custom_bwd`` runs the
  backward under it again. The CUDA autocast here is emulation.py's function mode with torch's
  autocast state it sets, active in the forward and not in the backward (it sees ``Tensor.backward``
  from outside): the forward finds it casting (none inside a region the model runs with autocast
  disabled), the backward enters it again (``CudaEmulation.resumed``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

import torch
from torch import nn

from autotune.backends.estimate.emulation import emulated_autocast
from autotune.backends.estimate.nf4 import MATMUL_REGION, EmulatedLinear4bit
from autotune.backends.estimate.tracker import allocation_region, outside_allocator
from autotune.workload.lora_kernel_functions import KernelHooks
from autotune.workload.lora_kernels import apply_kernels


def dequantize(layer: nn.Module) -> torch.Tensor:
    """The base weight [out, in] as Axolotl's ``dequantize`` makes it (module docstring)."""
    if not isinstance(layer, EmulatedLinear4bit):
        return layer.weight  # type: ignore[return-value]  # an nn.Linear's or nn.Embedding's
    device = layer.weight.device
    with allocation_region(MATMUL_REGION):
        out = torch.empty((layer.out_features, layer.in_features), dtype=layer.quant_dtype, device=device)
        if layer.double_quant:
            out_absmax = torch.empty(layer.absmax.shape, dtype=torch.float32, device=device)
            out_absmax += layer.offset
            del out_absmax
    return out


def forward_autocast() -> tuple[torch.dtype | None, Callable[[], AbstractContextManager[Any]]]:
    """The emulated CUDA autocast the forward runs under (its dtype, None without one or inside a
    region with autocast disabled) and a context that enters it again for the backward (module
    docstring)."""
    mode = emulated_autocast()
    if mode is None or mode.autocast_dtype is None:
        return None, contextlib.nullcontext
    return mode.autocast_dtype, mode.resumed


HOOKS = KernelHooks(dequantize=dequantize, registers=outside_allocator, autocast=forward_autocast)


def patch(model: nn.Module, kernels: Sequence[str]) -> None:
    """Axolotl's fused LoRA kernels, emulated, in the PEFT-wrapped fake ``model``."""
    apply_kernels(model, kernels, HOOKS)
