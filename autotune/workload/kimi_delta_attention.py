"""Kimi Delta Attention (Kimi Linear's KDA layers): refused by the estimator until fla's kernels for it
are emulated.

KDA is not the gated delta rule that gated_delta_rule.py emulates (fla's ``chunk_gated_delta_rule``).
There the decay is one scalar per head and position (``g`` of [batch, seq, heads]); here it is one per
key channel (``g`` of [batch, seq, heads, head_dim]: transformers 5.24 modeling_kimi_linear.py
``KimiLinearForgetGate.forward``, "Main difference to GDN is the per head application of `g`" in
``chunk_kimi_delta_attention``), so its torch path's decay mask is [.., chunk, chunk, head_dim] and
flash-linear-attention runs other kernels for it (``fla.ops.kda``: ``chunk_kda``, with the gate in
``fused_kda_gate``), of other buffers.

What a GPU user runs:

- Axolotl (examples/kimi-linear, ``trust_remote_code: true``) loads its own training code in place of the
  checkpoint's remote code (src/axolotl/model_support/kimi_linear/patch_kimi_linear.py
  ``_patch_get_class_in_module``): modeling_kimi.py, which imports fla 0.4.0's ``chunk_kda``,
  ``fused_kda_gate``, ``ShortConvolution`` and ``FusedRMSNormGated`` at import and fails without them
  (``KimiDeltaAttention.forward``: three ShortConvolution q/k/v convolutions, fused_kda_gate, chunk_kda).
- transformers' own kimi_linear decorates its torch fallbacks with
  ``use_kernel_func_from_hub_with_fallback("chunk_kda", "fla")`` (integrations/hub_kernels.py): where fla
  imports, its ``chunk_kda`` runs instead of the torch path autotune would trace.

Neither is emulated, and the torch path keeps other tensors than fla's kernels (a float32 decay mask of
[batch, heads, chunks, chunk, chunk, head_dim] per layer, and a Python loop over the chunk's rows), so
tracing it would size another step: the estimator refuses the model type by name (exit 2).
"""

from __future__ import annotations

from autotune.errors import InvalidInput

MODEL_TYPES = frozenset({"kimi_linear"})


def check_kernels(model_type: str | None) -> None:
    """Refuse a model whose linear-attention layers are Kimi Delta Attention: fla's KDA kernels are not
    emulated."""
    if model_type in MODEL_TYPES:
        raise InvalidInput(
            f"model_type {model_type}: its Kimi Delta Attention layers run the Triton kernels chunk_kda "
            "and fused_kda_gate of flash-linear-attention (fla) on a GPU (Axolotl model_support/kimi_linear/"
            "modeling_kimi.py requires fla 0.4.0; transformers kimi_linear calls fla chunk_kda where fla "
            "imports), which autotune does not emulate yet; the torch fallback of transformers "
            "(chunk_kimi_delta_attention) keeps a float32 per-channel decay mask the kernels never make, "
            "so it cannot stand in for them")
