"""transformers' ``kernelize`` under ``use_kernels``: the hub kernels it swaps into a model for CUDA
training, those emulated, the others refused by name.

``from_pretrained(use_kernels=True)`` (Axolotl's loaders/model.py passes the config's ``use_kernels``;
its KernelsPlugin forces it true, integrations/kernels/args.py check_use_kernels) calls
``set_use_kernels`` -> ``kernelize`` (transformers integrations/hub_kernels.py), again in
``Mode.TRAINING`` when the Trainer calls ``model.train()`` (modeling_utils.py ``train``: a changed mode
kernelizes anew). kernelize (huggingface/kernels, layer/layer.py) replaces the forward of every
module whose class transformers decorated ``@use_kernel_forward_from_hub(name)`` and of every
function decorated ``use_kernel_func_from_hub_with_fallback(name, ...)`` and attached with
``@use_kernelized_func`` (the function becomes a module instance its caller calls), by the layer
transformers' ``_build_kernel_mapping`` names for ``name`` on the device and mode. A training mode
takes the ``Mode.TRAINING`` entry, else ``TRAINING | TORCH_COMPILE`` (kernels layer/repos.py
``_MODE_FALLBACK_PRIORITY``); a name without a CUDA training entry keeps its forward.

Per model type (those whose experts ScatterMoE is emulated for, whose KernelsPlugin sets
``use_kernels``, workload/scattermoe.py, and gpt_oss, whose Axolotl examples set it), the decorated
names with a CUDA training entry; ``use_kernels`` on another model type is refused (``check``): its
decorated layers are not read here.

- ``gpt_oss``: ``RMSNorm`` (GptOssRMSNorm) -> kernels-community/liger-kernels ``LigerRMSNorm`` (as
  qwen3_moe's, below) and ``MegaBlocksMoeMLP`` (GptOssMLP) -> kernels-community/megablocks
  ``MegaBlocksMoeMLP``: its routing, binned gather and scatter and torch experts, emulated
  (workload/megablocks.py). Its ``rotary_pos_emb`` (apply_rotary_pos_emb, use_kernelized_func) is
  mapped for inference only on CUDA. Under autocast the hub MegaBlocksMoeMLP raises (its router
  scatter, megablocks.py SCATTER_DTYPES): refused so; FSDP2's mixed-precision policy runs it.
- ``qwen3_moe``: ``RMSNorm`` (Qwen3MoeRMSNorm) -> kernels-community/liger-kernels ``LigerRMSNorm``,
  whose forward (torch-ext/liger_kernels/layers.py) is Liger's ``LigerRMSNormFunction.apply(x,
  weight, variance_epsilon, 0, "llama", True, None)``, the function of Liger's own source
  (torch-ext/liger_kernels/rms_norm.py: the same buffers as ops/rms_norm.py). Emulated: Liger's
  RMSNorm (liger_kernels.py) in every Qwen3MoeRMSNorm, q_norm and k_norm included. Its
  ``rotary_pos_emb`` is mapped for inference only on CUDA (the kernel's backward does not match).
- ``minimax_m2``: ``RMSNorm`` (MiniMaxM2RMSNorm, its q_norm and k_norm over all heads included) ->
  the same ``LigerRMSNorm``, emulated as qwen3_moe's; modeling_minimax_m2.py decorates nothing else.
- ``qwen3_5_moe`` and ``qwen3_next``: ``RMSNormGated`` -> kernels-community/fla ``FusedRMSNormGated``
  (fla modules/fused_norm_gate.py rms_norm_gated), ``causal_conv1d_fn`` -> kernels-community/mamba-ssm
  ``causal_conv1d_fn`` (Tri Dao's CUDA causal-conv1d), ``chunk_gated_delta_rule`` ->
  kernels-community/fla ``chunk_gated_delta_rule``: a fla newer than the 0.4.1 emulated in
  gated_delta_rule.py (its forward computes the gates in ``gdn_gate_chunk_cumsum`` and the intra-chunk
  solve in ``chunk_gated_delta_rule_fwd_intra``, other buffers than 0.4.1's). Not emulated: refused.
  ``Qwen3_5GatedDeltaNet`` is mapped on compute capability 12.1 (GB10) only, ``SoftmaxTopKRouter`` and
  ``RMSNormZeroCentered`` not at all; ``fused_recurrent_gated_delta_rule`` (mapped for inference) and
  ``causal_conv1d_update`` (for both) run in decoding only.

- ``gemma4``, ``gemma4_text``: modeling_gemma4.py decorates nothing: no change.

transformers' models decorate no class ``SwiGLUMLP``, ``Linear`` or ``ForCausalLMLoss`` (the
training-mapped Liger layers), so these swap nothing.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import MethodType
from typing import TYPE_CHECKING, Any

from autotune.errors import UnmodelledSetting

if TYPE_CHECKING:
    import torch

    from autotune.workload.liger_kernels import Registers

NOTE = ("use_kernels: transformers' kernelize swaps kernels-community/liger-kernels LigerRMSNorm in for "
        "every RMSNorm its model decorates (Qwen3MoeRMSNorm, GptOssRMSNorm, MiniMaxM2RMSNorm), and for "
        "gpt-oss' GptOssMLP kernels-community/megablocks MegaBlocksMoeMLP (integrations/hub_kernels.py, "
        "Mode.TRAINING on "
        "CUDA): Liger's RMSNorm and MegaBlocks' binned gather and scatter, emulated (each expert's bin "
        "holds top_k * tokens / experts rows: routings past it are dropped, as the kernel drops them)")


@dataclass(frozen=True)
class HubLayer:
    """A class or function of ``modeling_<module>`` decorated with hub layer ``name``, and the kernel
    transformers' CUDA training mapping swaps in for it (``kernel``: repository and layer)."""

    module: str  # transformers.models.<module>.modeling_<module>
    decorated: str  # the class, or the function a use_kernelized_func class attaches
    name: str  # use_kernel_forward_from_hub's layer name, the mapping's key
    kernel: str
    emulated: bool


_LIGER_RMS = "kernels-community/liger-kernels LigerRMSNorm"
_MEGABLOCKS = "kernels-community/megablocks MegaBlocksMoeMLP"
_FLA_NORM = "kernels-community/fla FusedRMSNormGated"
_CONV = "kernels-community/mamba-ssm causal_conv1d_fn"
_FLA_GDN = "kernels-community/fla chunk_gated_delta_rule"


def _gated_deltanet(module: str, prefix: str) -> tuple[HubLayer, ...]:
    """Qwen3.5-MoE's and Qwen3-Next's: the gated RMSNorm and the GatedDeltaNet's kernelized functions."""
    return (HubLayer(module, f"{prefix}RMSNormGated", "RMSNormGated", _FLA_NORM, False),
            HubLayer(module, "causal_conv1d_fn", "causal_conv1d_fn", _CONV, False),
            HubLayer(module, "torch_chunk_gated_delta_rule", "chunk_gated_delta_rule", _FLA_GDN, False))


# Mapped for CUDA training too, but called by the GatedDeltaNet's forward with a cache only (one
# token a step, decoding: modeling_qwen3_5_moe.py Qwen3_5MoeGatedDeltaNet.forward), never in training.
DECODING_ONLY = ("causal_conv1d_update",)
KERNELIZED: dict[str, tuple[HubLayer, ...]] = {
    "gpt_oss": (HubLayer("gpt_oss", "GptOssRMSNorm", "RMSNorm", _LIGER_RMS, True),
                HubLayer("gpt_oss", "GptOssMLP", "MegaBlocksMoeMLP", _MEGABLOCKS, True)),
    "qwen3_moe": (HubLayer("qwen3_moe", "Qwen3MoeRMSNorm", "RMSNorm", _LIGER_RMS, True),),
    "minimax_m2": (HubLayer("minimax_m2", "MiniMaxM2RMSNorm", "RMSNorm", _LIGER_RMS, True),),
    "qwen3_5_moe": _gated_deltanet("qwen3_5_moe", "Qwen3_5Moe"),
    "qwen3_5_moe_text": _gated_deltanet("qwen3_5_moe", "Qwen3_5Moe"),
    "qwen3_next": _gated_deltanet("qwen3_next", "Qwen3Next"),
    # modeling_gemma4.py decorates no class or function with a hub layer name: kernelize swaps nothing
    # (Axolotl's Gemma 4 26B-A4B examples load the KernelsPlugin for ScatterMoE: workload/scattermoe.py).
    "gemma4": (),
    "gemma4_text": (),  # its text model: the same modeling_gemma4.py
}


def check(model_type: str | None, what: str) -> None:
    """UnmodelledSetting naming the hub kernels kernelize swaps into ``model_type``'s model that are
    not emulated, or for a model type whose decorated layers are not read here (KERNELIZED);
    ``what``: the setting that turns kernelize on, as the message gives it."""
    if str(model_type) not in KERNELIZED:
        raise UnmodelledSetting(f"{what} is not modelled for model type {model_type}: transformers' "
                                "kernelize swaps hub kernels in for the layers its modeling file decorates "
                                "use_kernel_forward_from_hub (integrations/hub_kernels.py), read for "
                                f"{', '.join(sorted(KERNELIZED))} only")
    missing = [layer for layer in KERNELIZED[str(model_type)] if not layer.emulated]
    if missing:
        swaps = "; ".join(f"{layer.decorated} ({layer.name}) -> {layer.kernel}" for layer in missing)
        raise UnmodelledSetting(f"{what} is not modelled for model type {model_type}: transformers' "
                                "kernelize swaps in the hub's kernels for CUDA training "
                                f"(integrations/hub_kernels.py), not emulated: {swaps}")


def emulated(model_type: str | None) -> bool:
    """Whether kernelize swaps anything emulated into ``model_type``'s model (the output's note)."""
    return any(layer.emulated for layer in KERNELIZED.get(str(model_type), ()))


def apply(model: torch.nn.Module, *, sm_count: int, registers: Registers) -> None:
    """The emulated hub kernels in every module of the built ``model`` whose class kernelize swaps
    (module docstring), before PEFT wraps it; ``sm_count``: the target card's multiprocessors (Liger
    RMSNorm's per-program weight gradients). Model types with hub kernels not emulated are refused
    by ``check`` first."""
    from autotune.workload import megablocks
    from autotune.workload.liger import LLAMA_NORM

    config: Any = model.config
    for layer in KERNELIZED.get(str(config.model_type), ()):
        if not layer.emulated:
            raise UnmodelledSetting(f"{layer.kernel} is not emulated")
        modeling = importlib.import_module(f"transformers.models.{layer.module}.modeling_{layer.module}")
        cls = getattr(modeling, layer.decorated)
        swapped = [module for module in model.modules() if type(module) is cls]
        if not swapped:
            raise UnmodelledSetting(f"kernelize's {layer.kernel} found no {layer.decorated} in "
                                    f"{type(model).__name__}: not emulated for this transformers version")
        for module in swapped:
            if layer.kernel == _MEGABLOCKS:
                megablocks.apply(module, registers)
            else:
                module.forward = MethodType(_liger_rms_norm(module, LLAMA_NORM, sm_count, registers), module)


def _liger_rms_norm(module: Any, norm: tuple[float, str, bool], sm_count: int, registers: Registers) -> Any:
    """The hub LigerRMSNorm's forward: ``LigerRMSNormFunction.apply(x, weight, variance_epsilon, 0,
    "llama", True, None)`` on the module's own weight and eps (kernelize keeps the module, swaps its
    forward)."""
    from autotune.workload.liger_kernels import functions

    eps = module.variance_epsilon
    offset, casting_mode, in_place = norm
    function = functions().RMSNorm.apply

    def forward(self: Any, hidden_states: torch.Tensor) -> torch.Tensor:
        return function(hidden_states, self.weight, eps, offset, casting_mode, in_place, sm_count, registers)

    return forward
