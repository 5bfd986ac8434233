"""Axolotl's ``fused_attn_kernel: true`` for Qwen3, emulated: its outputs and gradients, its memory.

With ``fused_attn_kernel: true`` and model_config_type qwen3, Axolotl swaps ``Qwen3Attention.forward``
(src/axolotl/loaders/patch_manager.py ``_apply_model_specific_patches``: ``patch_qwen3_fused_attn``) for
``fused_forward`` (monkeypatch/models/qwen3/fused_attn.py ``_make_fused_forward``): q_norm + RoPE and
k_norm + RoPE each in one Triton kernel, ``fused_rms_norm_rope`` of kernels/gemma4_fused_rope.py (its
default ``unit_offset=False``: Qwen3RMSNorm's ``weight * normed``), v as projected. The kernel is the one
Gemma 4's fused attention runs, emulated in gemma4_fused_attn.py (its buffers, saved tensors and the
backward's per-program weight-gradient partials sized by the target card's multiprocessors).

Axolotl patches other model types under the same key (qwen3_moe, qwen3_vl, qwen3_5, qwen3_5_moe and their
text variants: patch_manager.py), whose forwards are not emulated here (``AXOLOTL_TYPES``); for a type
in neither list the key is "a silent no-op" (patch_manager.py ``_warn_if_fused_attn_unsupported``).
"""

from __future__ import annotations

from collections.abc import Callable
from types import MethodType
from typing import TYPE_CHECKING, Any

from autotune.workload.gemma4_fused_attn import Registers, fused_rms_norm_rope

if TYPE_CHECKING:
    import torch

NAME = "Axolotl's fused Qwen3 q/k RMSNorm + RoPE (fused_attn_kernel, emulated)"
MODEL_TYPES = ("qwen3",)
# patch_manager.py: the model_config_types fused_attn_kernel patches, these not emulated.
AXOLOTL_TYPES = ("qwen3_moe", "qwen3_vl", "qwen3_vl_text", "qwen3_5", "qwen3_5_text", "qwen3_5_moe",
                 "qwen3_5_moe_text")
# patch_manager.py _FUSED_ATTN_KERNEL_SUPPORTED's Gemma 4 types: their fused forward runs whatever the key
# says (gemma4_fused_attn.py), so the key changes nothing there.
ALWAYS_FUSED_TYPES = ("gemma4", "gemma4_text", "gemma4_unified", "gemma4_unified_text")
NOTE = (f"{NAME}: Axolotl swaps Qwen3Attention.forward (loaders/patch_manager.py: patch_qwen3_fused_attn); "
        "kernels/gemma4_fused_rope.py fused_rms_norm_rope's buffers for q and k, its arithmetic outside the "
        "allocator")


def _norm_module(norm: Any) -> Any:
    """fused_attn.py ``_resolve_norm_module``: a PEFT ``ModulesToSaveWrapper``'s active copy."""
    modules_to_save = getattr(norm, "modules_to_save", None)
    if not modules_to_save:
        return norm
    adapters = getattr(norm, "active_adapters", None)
    if adapters is None:
        adapter = getattr(norm, "active_adapter", None)
        adapters = [adapter] if adapter is not None else []
    elif isinstance(adapters, str):
        adapters = [adapters]
    for name in adapters:
        if isinstance(name, str) and name in modules_to_save:
            return modules_to_save[name]
    return getattr(norm, "original_module", norm)


def _fused_forward(sm_count: int, registers: Registers) -> Callable[..., Any]:
    """monkeypatch/models/qwen3/fused_attn.py ``fused_forward``, line for line, on the installed
    transformers' Qwen3Attention (its ``cache`` argument), with the emulated kernel."""

    def fused_forward(self: Any, hidden_states: torch.Tensor, position_embeddings: Any,
                      attention_mask: torch.Tensor | None, cache: Any = None,
                      **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
        from transformers.models.qwen3.modeling_qwen3 import eager_attention_forward

        input_shape = hidden_states.shape[:-1]
        hidden_shape = (*input_shape, -1, self.head_dim)
        q_norm, k_norm = _norm_module(self.q_norm), _norm_module(self.k_norm)
        eps = q_norm.variance_epsilon
        cos, sin = position_embeddings
        if hasattr(self, "apply_qkv"):  # Axolotl's LoRA kernels (workload/lora_kernels.py)
            query_states, key_states, value_states = self.apply_qkv(hidden_states)
            query_states = query_states.view(hidden_shape)
            key_states = key_states.view(hidden_shape)
            value_states = value_states.view(hidden_shape)
        else:
            query_states = self.q_proj(hidden_states).view(hidden_shape)
            key_states = self.k_proj(hidden_states).view(hidden_shape)
            value_states = self.v_proj(hidden_states).view(hidden_shape)
        query_states = fused_rms_norm_rope(query_states, q_norm.weight, cos, sin, eps, sm_count,
                                           registers).transpose(1, 2)
        key_states = fused_rms_norm_rope(key_states, k_norm.weight, cos, sin, eps, sm_count,
                                         registers).transpose(1, 2)
        value_states = value_states.transpose(1, 2)
        if cache is not None:
            key_states, value_states = cache.update(key_states, value_states, self.layer_idx)
        attention_interface = ALL_ATTENTION_FUNCTIONS.get_interface(
            self.config._attn_implementation, eager_attention_forward)
        attn_output, attn_weights = attention_interface(
            self, query_states, key_states, value_states, attention_mask,
            dropout=0.0 if not self.training else self.attention_dropout, scaling=self.scaling,
            sliding_window=self.sliding_window, **kwargs)
        attn_output = attn_output.reshape(*input_shape, -1).contiguous()
        attn_output = self.apply_o(attn_output) if hasattr(self, "apply_o") else self.o_proj(attn_output)
        return attn_output, attn_weights

    return fused_forward


def apply(model: Any, sm_count: int, registers: Registers) -> int:
    """Every Qwen3Attention of ``model`` runs Axolotl's fused forward, emulated (an instance's forward,
    as patch_qwen3_fused_attn sets the class's); the number patched."""
    forward = _fused_forward(sm_count, registers)
    patched = 0
    for module in model.modules():
        if type(module).__name__ == "Qwen3Attention":
            module.forward = MethodType(forward, module)
            patched += 1
    return patched


def patched(model_type: str | None) -> bool:
    """Whether ``fused_attn_kernel: true`` swaps this model type's attention for the forward emulated here."""
    return model_type in MODEL_TYPES
