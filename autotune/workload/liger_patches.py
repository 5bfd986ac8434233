"""Which modules Liger's patch of each model type swaps, as data: Liger's own functions
(``apply_liger_kernel_to_<model_type>``, liger-kernel's transformers/monkey_patch.py) and Axolotl's
LigerPlugin's own branches (src/axolotl/integrations/liger/plugin.py ``pre_model_load``); workload/liger.py
checks the kernels asked for against them and swaps the emulated kernels in.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelPatch:
    """What ``apply_liger_kernel_to_<model_type>`` swaps in transformers' ``modeling_<module>``."""

    module: str  # transformers.models.<module>.modeling_<module>
    prefix: str  # of its classes: <prefix>RMSNorm, <prefix>MLP
    glu: str  # the MLP's keyword: swiglu or geglu
    rms_norm: tuple[float, str, bool]  # LigerRMSNorm's offset, casting_mode, in_place
    cross_entropy: bool = True  # the patch's cross_entropy reaches the model's loss
    fused_gate_up: bool = False  # the MLP's gate and up projections are one (LigerPhi3SwiGLUMLP)
    # layer_norm: "" (not taken), "vision" (swaps the vision tower's nn.LayerNorm, run on images:
    # workload/liger.py's docstring) or "audio" (the audio tower's, which a text or image step never
    # runs; taken only where the model has one)
    layer_norm: str = ""
    # rope: "liger" (liger_rotary_pos_emb in place of apply_rotary_pos_emb), "own" (a kernel of its
    # own, refused) or "skipped" (the patch leaves it out, with a warning)
    rope: str = "liger"
    mlp: str = "MLP"  # the MLP class: <prefix><mlp>
    gated: bool = False  # rms_norm_gated: <prefix>RMSNormGated = Axolotl's FusedRMSNormGated


LLAMA_NORM = (0.0, "llama", True)  # LigerRMSNorm's defaults
GEMMA_NORM = (1.0, "gemma", True)  # LigerRMSNormForGemma; partial(_patch_rms_norm_module, offset=1.0, ...)
GEMMA2_NORM = (1.0, "gemma", False)  # LigerRMSNormForGemma2/3: gemma2 adds the residual between two norms
PATCHES = {
    "llama": ModelPatch("llama", "Llama", "swiglu", LLAMA_NORM),
    "mistral": ModelPatch("mistral", "Mistral", "swiglu", LLAMA_NORM, cross_entropy=False),
    "qwen2": ModelPatch("qwen2", "Qwen2", "swiglu", LLAMA_NORM),
    "qwen3": ModelPatch("qwen3", "Qwen3", "swiglu", LLAMA_NORM),
    "phi3": ModelPatch("phi3", "Phi3", "swiglu", LLAMA_NORM, fused_gate_up=True),
    "gemma": ModelPatch("gemma", "Gemma", "geglu", GEMMA_NORM),
    "gemma2": ModelPatch("gemma2", "Gemma2", "geglu", GEMMA2_NORM),
    "gemma3_text": ModelPatch("gemma3", "Gemma3", "geglu", GEMMA2_NORM),
    # apply_liger_kernel_to_gemma3: the text patch above on the language model; its cross_entropy
    # assigns modeling_gemma3.nn.CrossEntropyLoss, which Gemma3ForConditionalGeneration.forward does
    # not use (it calls self.loss_function, transformers' ForCausalLMLoss).
    "gemma3": ModelPatch("gemma3", "Gemma3", "geglu", GEMMA2_NORM, cross_entropy=False, layer_norm="vision"),
    # apply_liger_kernel_to_llama4 (Llama4ForConditionalGeneration and Llama4ForCausalLM alike):
    # Llama4TextRMSNorm = LigerRMSNorm, Llama4TextMLP = LigerSwiGLUMLP (the shared experts, and the
    # dense MLPs of interleaved layers, refused in _check_config); its rope is Llama 4's own
    # (apply_liger_llama4_rope_full), not emulated; its cross_entropy assigns modeling_llama4's
    # CrossEntropyLoss, which the models do not use (self.loss_function); its layer_norm patches a
    # built model's vision tower only, and Axolotl's plugin calls it before the model is built.
    "llama4": ModelPatch("llama4", "Llama4Text", "swiglu", LLAMA_NORM, cross_entropy=False, rope="own"),
    "llama4_text": ModelPatch("llama4", "Llama4Text", "swiglu", LLAMA_NORM, cross_entropy=False, rope="own"),
}
# Axolotl's own branches (plugin.py pre_model_load) for model types Liger 0.8.0's
# MODEL_TYPE_TO_APPLY_LIGER_FN has not.
AXOLOTL_BRANCHES = frozenset("jamba deepseek_v2 qwen3_5 qwen3_5_moe granitemoe gemma4 gemma4_unified "
                             "gemma4_unified_text".split())
AXOLOTL_PATCHES = {
    # plugin.py's gemma4 branch ("multimodal gemma4 only"): modeling_gemma4.Gemma4RMSNorm =
    # _LigerGemma4RMSNorm, LigerRMSNorm(dim, eps, offset=0.0, casting_mode="llama", in_place=False)
    # where with_scale, the model's own Gemma4RMSNorm where not (its __new__); Gemma4TextMLP =
    # _LigerGemma4MLP, LigerGEGLUMLP(config) (layer_idx dropped: _check_config); rope skipped ("Liger
    # RoPE is not compatible with Gemma4"); layer_norm assigns modeling_gemma4.nn.LayerNorm =
    # LigerLayerNorm (the audio tower's Gemma4AudioSubSampleConvProjectionLayer.norm: none in a model
    # without audio); cross_entropy assigns nn.CrossEntropyLoss, which Gemma 4's models do not use
    # (self.loss_function); fused_linear_cross_entropy skipped with a warning (read_axolotl's loss).
    "gemma4": ModelPatch("gemma4", "Gemma4", "geglu", (0.0, "llama", False), cross_entropy=False,
                         rope="skipped", mlp="TextMLP", layer_norm="audio"),
    # plugin.py's gemma4_unified / gemma4_unified_text branch ("mirrors gemma4's Liger compatibility"):
    # modeling_gemma4_unified.Gemma4UnifiedRMSNorm = _LigerGemma4UnifiedRMSNorm (LigerRMSNorm offset 0.0,
    # "llama", in_place=False where with_scale; the model's own where not), Gemma4UnifiedTextMLP =
    # _LigerGemma4UnifiedMLP (LigerGEGLUMLP(config)); rope skipped ("not compatible with Gemma4Unified");
    # layer_norm assigns modeling_gemma4_unified.nn.LayerNorm = LigerLayerNorm (Gemma4UnifiedVisionEmbedder's
    # patch_ln1, patch_ln2, pos_norm: run on images only); cross_entropy assigns nn.CrossEntropyLoss, which
    # its models do not use (self.loss_function); fused_linear_cross_entropy skipped with a warning.
    **{model_type: ModelPatch("gemma4_unified", "Gemma4Unified", "geglu", (0.0, "llama", False),
                              cross_entropy=False, rope="skipped", mlp="TextMLP", layer_norm="vision")
       for model_type in ("gemma4_unified", "gemma4_unified_text")},
    # integrations/liger/models/qwen3_5.py and qwen3_5_moe.py apply_liger_kernel_to_qwen3_5(_moe) (the
    # plugin's qwen3_5 and qwen3_5_moe branches, Liger's own function not called): <prefix>RMSNorm =
    # LigerRMSNorm(offset=1.0, casting_mode="gemma", init_fn="zeros", in_place=False);
    # <prefix>RMSNormGated = FusedRMSNormGated (rms_norm_gated: axolotl/kernels/rms_norm_gated.py, offset
    # 0.0); <prefix>MLP = LigerSwiGLUMLP of the MLP's intermediate_size (_liger_swiglu_mlp_wrapper: the
    # MoE's shared expert); layer_norm: modeling's nn.LayerNorm = LigerLayerNorm (the vision tower's);
    # cross_entropy: loss_utils' nn.functional.cross_entropy = liger_cross_entropy; no rope argument.
    "qwen3_5": ModelPatch("qwen3_5", "Qwen3_5", "swiglu", (1.0, "gemma", False), rope="skipped",
                          gated=True, layer_norm="vision"),
    "qwen3_5_moe": ModelPatch("qwen3_5_moe", "Qwen3_5Moe", "swiglu", (1.0, "gemma", False), rope="skipped",
                              gated=True, layer_norm="vision"),
}

# Liger's other patches (MODEL_TYPE_TO_APPLY_LIGER_FN), which swap modules these do not have.
NOT_EMULATED = frozenset(
    "deepseek_v4 gemma4_text gemma4 glm4 glm4v glm4v_moe gpt_oss internvl llava "
    "granite mllama mllama_text_model ministral mixtral nemotron olmo2 pixtral olmo3 qwen3_moe qwen2_vl "
    "qwen2_vl_text qwen2_5_vl qwen2_5_vl_text qwen3_next qwen3_5 qwen3_5_text qwen3_5_moe qwen3_5_moe_text "
    "qwen3_vl qwen3_vl_text qwen3_vl_moe qwen3_vl_moe_text smollm3 paligemma falcon_h1 smolvlm "
    "hunyuan_v1_dense hunyuan_v1_moe exaone4".split())


def patch_of(model_type: str, axolotl: bool = False) -> ModelPatch | None:
    """The emulated patch of a model type: Liger's, or where ``axolotl`` the LigerPlugin's own branch."""
    return PATCHES.get(model_type) or (AXOLOTL_PATCHES.get(model_type) if axolotl else None)
