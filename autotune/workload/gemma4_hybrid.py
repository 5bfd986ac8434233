"""Axolotl's ``gemma4_hybrid_attn_impl: true``: two attention implementations in one Gemma 4 model.

Gemma 4's global (full_attention) layers have 512-wide heads (``global_head_dim``), which the flash-attn
package refuses (flash_api.cpp ``mha_fwd``: "FlashAttention forward only supports head dimension at
most 256"). Axolotl (mirror HEAD 067b021c) loads the model with flash_attention_2 and then, after the
build (src/axolotl/loaders/patch_manager.py ``_apply_gemma_hybrid_attention``), gives each layer whose
``layer_types`` entry is not "sliding_attention" a shallow-copied config whose
``_attn_implementation`` is ``GLOBAL_PACKED_SDPA`` (monkeypatch/gemma4_hybrid_mask.py
``sdpa_global_packed_forward``): the sliding layers keep flash_attention_2 (emulated, as every
flash_attention_2 job: workload/step.py's stand-in), the global ones run transformers' own
``sdpa_attention_forward`` (integrations/sdpa_attention.py), on CUDA's SDPA dispatch: no flash kernel
at head dim 512, cuDNN takes at most 256 on Hopper, so the memory-efficient kernel.

Under ``sample_packing`` (``set_large_head_packed(bool(cfg.sample_packing))``, monkeypatch/attention/
large_head.py ``_multidoc_position_ids``: the packed flag declared, every row counts as packed) a global
layer given no mask builds its own block-diagonal causal mask from ``position_ids``
(gemma4_hybrid_mask.py ``_packing_block_causal_mask``), [batch, 1, seq, seq] in the query's dtype, which
the memory-efficient kernel keeps as its bias for the backward: the mask's size grows with seq^2 and
is traced here, call for call (``packing_block_causal_mask``). Without packing the layer runs SDPA with
no mask (is_causal).

The other two halves of Axolotl's patch change nothing in the estimator's step: the wrapper of
``create_causal_mask`` (``_patch_module_create_causal_mask``) builds the full-attention mask in SDPA's
format, which for the estimator's rows (filled, no padding) is None, as the flash stand-in's
(masking_utils.py ``sdpa_mask``: the is_causal skip); and ``_patch_use_gqa_head_dim_guard`` makes
``use_gqa_in_sdpa`` false above head dim 256, which transformers 5.24's own already is (``key.shape[-1]
== value.shape[-1] <= 256``): keys and values are repeated per query head (``repeat_kv``).
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

KEY = "gemma4_hybrid_attn_impl"
# The registered names of the global layers' attention (Axolotl's is "sdpa_global_packed"): with
# sample_packing (the block mask built), and without (no mask). No "flash" in them: transformers
# would import the flash-attn package for such a name.
PACKED = "autotune_sdpa_global_packed"
UNPACKED = "autotune_sdpa_global"
# The model types autotune builds with Axolotl's patch. gemma4_unified's too: _apply_gemma_hybrid_attention
# finds its layers as Gemma 4's (Gemma4UnifiedForConditionalGeneration.model.language_model.layers, its
# text config's layer_types), and gemma4_hybrid_mask.py's _TARGET_MODULES name modeling_gemma4_unified
# beside modeling_gemma4 (both namespaces' create_causal_mask wrapped).
MODEL_TYPES = ("gemma4", "gemma4_text", "gemma4_unified", "gemma4_unified_text")
CHOICES = ("packed", "unpacked")  # the Step option: whether Axolotl declares the batches packed
SLIDING = "sliding_attention"
# Inside a global layer's attention: CUDA's SDPA dispatch, not the flash-attn package the model's
# attn_implementation names (the estimator's emulation reads it: backends/estimate/emulation.py).
_SDPA_DISPATCH: ContextVar[bool] = ContextVar("gemma4_hybrid_sdpa", default=False)


def sdpa_dispatch() -> bool:
    """Whether the attention running now is a global layer's SDPA call."""
    return _SDPA_DISPATCH.get()


@contextlib.contextmanager
def _sdpa() -> Iterator[None]:
    token = _SDPA_DISPATCH.set(True)
    try:
        yield
    finally:
        _SDPA_DISPATCH.reset(token)


def packing_block_causal_mask(position_ids: torch.Tensor, dtype: torch.dtype,
                              device: torch.device) -> torch.Tensor:
    """monkeypatch/gemma4_hybrid_mask.py ``_packing_block_causal_mask``, call for call: the
    block-diagonal causal additive mask [B, 1, S, S] from packed position_ids."""
    import torch

    if position_ids.dim() == 1:
        position_ids = position_ids[None]
    batch, seq = position_ids.shape
    doc = (position_ids == 0).cumsum(-1)  # [B, S] document index
    same_doc = doc[:, :, None] == doc[:, None, :]  # [B, S, S]
    causal = torch.ones(seq, seq, dtype=torch.bool, device=device).tril()[None]  # [1, S, S]
    allow = same_doc & causal
    mask = torch.zeros(batch, 1, seq, seq, dtype=dtype, device=device)
    mask.masked_fill_(~allow[:, None], torch.finfo(dtype).min)
    return mask


def _global_forward(packed: bool) -> Any:
    def forward(module: Any, query: Any, key: Any, value: Any, attention_mask: Any,
                **kwargs: Any) -> tuple[Any, None]:
        """gemma4_hybrid_mask.py ``sdpa_global_packed_forward`` under the default large-head policy
        "sdpa" (``flash_d512_route`` declines): the block mask where packed and given none, then
        transformers' ``sdpa_attention_forward``."""
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        position_ids = kwargs.get("position_ids")
        if attention_mask is None and packed and position_ids is not None:
            pid = position_ids if position_ids.dim() > 1 else position_ids[None]
            attention_mask = packing_block_causal_mask(pid, query.dtype, query.device)
        with _sdpa():
            return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)

    return forward


def register() -> None:
    """Both of the global layers' attentions, registered with transformers' AttentionInterface."""
    from transformers import AttentionInterface

    for name, packed in ((PACKED, True), (UNPACKED, False)):
        if name not in AttentionInterface._global_mapping:
            AttentionInterface.register(name, _global_forward(packed))


def decoder_layers(model: Any) -> tuple[Any, Any] | None:
    """The decoder layers and the module holding them, found as ``_apply_gemma_hybrid_attention``
    finds them: ``model`` or ``model.model``, with ``layers`` or ``language_model.layers``."""
    for candidate in (model, getattr(model, "model", None)):
        if candidate is None:
            continue
        if hasattr(candidate, "layers"):
            return candidate.layers, candidate
        language = getattr(candidate, "language_model", None)
        if language is not None and hasattr(language, "layers"):
            return language.layers, language
    return None


def apply(model: Any, packed: bool) -> int:
    """``_apply_gemma_hybrid_attention`` on the built model (before any adapter, as Axolotl's
    post-build patch): each global layer's ``self_attn.config`` a shallow copy naming the packing-aware
    SDPA; the count of layers so patched."""
    register()
    found = decoder_layers(model)
    if found is None:
        return 0
    layers, holder = found
    layer_types = getattr(holder.config, "layer_types", None)
    if layer_types is None:
        return 0
    count = 0
    for index, layer in enumerate(layers):
        if layer_types[index] == SLIDING:
            continue
        attention = getattr(layer, "self_attn", None)
        if attention is not None and hasattr(attention, "config"):
            config = copy.copy(attention.config)
            config._attn_implementation = PACKED if packed else UNPACKED
            attention.config = config
            count += 1
    return count


def global_layers(config: Any) -> int:
    """The layers ``apply`` gives the packing-aware SDPA: those not "sliding_attention"."""
    text = getattr(config, "text_config", None) or config
    return sum(1 for kind in getattr(text, "layer_types", None) or () if kind != SLIDING)


def note(config: Any, packed: bool) -> str:
    """What the check's output says about the two attentions."""
    mask = ("each builds a [batch, 1, seq, seq] block-diagonal causal mask from position_ids under "
            "sample_packing (monkeypatch/gemma4_hybrid_mask.py _packing_block_causal_mask), traced"
            if packed else "no mask without sample_packing (is_causal)")
    return (f"{KEY}: flash_attention_2 (emulated) on sliding layers, packing-aware SDPA on "
            f"{global_layers(config)} global layers (loaders/patch_manager.py _apply_gemma_hybrid_attention; "
            f"head dim 512: CUDA's memory-efficient SDPA kernel, emulated); {mask}")
