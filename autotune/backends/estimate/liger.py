"""Liger Kernel's kernels on fake tensors: workload/liger.py's emulation, with the target card's
multiprocessors and the kernels' register arithmetic outside the caching allocator.

What a Liger kernel's Python wrapper allocates with torch is traced as any op is; what its Triton
kernel computes in registers is done by torch temporaries (liger_kernels.py) made inside
``tracker.outside_allocator()``, whose storages no tracker counts. LigerRMSNorm's backward sizes its
per-program weight gradients by the device's ``multi_processor_count``: the target card's
(gpus.multiprocessors), the most of any preset's where it is known only by its size.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from autotune.gpus import GpuSpec, chip_is_known, most_multiprocessors, multiprocessors
from autotune.workload.liger import apply_kernels

if TYPE_CHECKING:
    import torch


def swap_in(model: torch.nn.Module, kernels: tuple[str, ...], gpu: GpuSpec, model_type: str) -> None:
    """Liger's emulated ``kernels`` in the built fake ``model`` (before PEFT wraps it), as the patch of
    ``model_type`` (the checked config's, which check_kernels read) swaps them."""
    if not kernels:
        return
    from autotune.backends.estimate.tracker import outside_allocator

    count = multiprocessors(gpu)[0] if chip_is_known(gpu) else most_multiprocessors()
    apply_kernels(model, kernels, sm_count=count, registers=outside_allocator, model_type=model_type)


def swap_in_linear_attention(model: torch.nn.Module) -> None:
    """flash-linear-attention's chunk_gated_delta_rule, emulated (workload/gated_delta_rule.py), in
    every Gated DeltaNet layer of ``model`` (Qwen3.5, Qwen3-Next): what their GPU users run."""
    from autotune.backends.estimate.tracker import outside_allocator
    from autotune.workload.gated_delta_rule import apply

    apply(model, outside_allocator)


def swap_in_fused_attention(model: torch.nn.Module, gpu: GpuSpec) -> None:
    """Axolotl's fused Gemma 4 attention forward, emulated (workload/gemma4_fused_attn.py), in every
    Gemma4TextAttention of ``model``, and its fused_attn_kernel Qwen3 forward (qwen3_fused_attn.py) in
    every Qwen3Attention: its backward's weight-gradient partials sized by the target
    card's multiprocessors, as Liger's RMSNorm's."""
    from autotune.backends.estimate.tracker import outside_allocator
    from autotune.workload import gemma4_fused_attn, qwen3_fused_attn

    count = multiprocessors(gpu)[0] if chip_is_known(gpu) else most_multiprocessors()
    gemma4_fused_attn.apply(model, count, outside_allocator)
    qwen3_fused_attn.apply(model, count, outside_allocator)  # fused_attn_kernel (request.py: Qwen3's only)


def swap_in_scattermoe(model: torch.nn.Module) -> None:
    """Axolotl's ScatterMoE experts, emulated (workload/scattermoe.py), in every experts module of
    ``model``, before PEFT: as Axolotl's registration, which transformers dispatches to whatever wraps
    the model. Set before quantize_moe_experts quantizes the experts (adapters.prepare), the stand-in
    reads their 4-bit parametrizations when called, as scattermoe_experts_forward does. ScatterMoE is
    KernelsPlugin's, which sets use_kernels (args.py check_use_kernels): swap_in_hub_kernels follows."""
    from autotune.backends.estimate.tracker import outside_allocator
    from autotune.workload.scattermoe import apply

    apply(model, outside_allocator)


def route_scattermoe_lora(model: torch.nn.Module) -> None:
    """Axolotl's fast path for LoRA on ScatterMoE experts (workload/scattermoe.py route_lora: its
    patch of PEFT's ParamWrapper.forward), on the wrappers PEFT put around the emulated experts."""
    from autotune.backends.estimate.tracker import outside_allocator
    from autotune.workload.scattermoe import route_lora

    route_lora(model, outside_allocator)


def swap_in_hub_kernels(model: torch.nn.Module, gpu: GpuSpec) -> None:
    """transformers' kernelize under use_kernels: the hub kernels it swaps into ``model``, emulated
    (workload/hub_kernels.py), LigerRMSNorm's per-SM partials sized by the target card's
    multiprocessors."""
    from autotune.backends.estimate.tracker import outside_allocator
    from autotune.workload import hub_kernels

    count = multiprocessors(gpu)[0] if chip_is_known(gpu) else most_multiprocessors()
    hub_kernels.apply(model, sm_count=count, registers=outside_allocator)
