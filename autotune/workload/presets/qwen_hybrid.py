"""Qwen's hybrid linear-attention presets: Qwen3.5 (dense and MoE, vision-language checkpoints) and
Qwen3-Next. Three of every four layers are Gated DeltaNet linear attention (``layer_types``, from
``full_attention_interval`` 4 when absent: configuration_qwen3_5.py), the fourth gated full
attention with a partial rotary embedding (a quarter of head_dim 256). Their linear-attention
kernel is emulated where a GPU user runs flash-linear-attention's: workload/gated_delta_rule.py.

Qwen3.5's checkpoints are vision-language models (``Qwen3_5ForConditionalGeneration``,
``Qwen3_5MoeForConditionalGeneration``: the text model under ``text_config``, a 27-block vision
tower under ``vision_config``). Axolotl loads them as such (utils/config normalize_config:
is_multimodal, as qwen3_5 is in transformers' image-text-to-text mapping). The 35B-A3B is here as
that vision-language model (its images Qwen3-VL's processor's: workload/vision.py); the 27B is the
text model that ``AutoModelForCausalLM`` builds from the same config.json (``Qwen3_5ForCausalLM``,
modeling_auto "VLM compatibility"), the vision tower left out: its 0.46B parameters are named in
the tests (test_presets_qwen_hybrid.py)."""

from __future__ import annotations

from typing import Any

# The Qwen3.5 tokens (configuration_qwen3_5.py Qwen3_5Config defaults, the 27B's as published).
_QWEN_3_5_TEXT = {
    "attention_bias": False,
    "attention_dropout": 0.0,
    "attn_output_gate": True,
    "eos_token_id": 248044,
    "full_attention_interval": 4,
    "head_dim": 256,
    "hidden_act": "silu",
    "initializer_range": 0.02,
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 128,
    "linear_num_key_heads": 16,
    "linear_value_head_dim": 128,
    "max_position_embeddings": 262144,
    "rms_norm_eps": 1e-06,
    "rope_parameters": {"mrope_interleaved": True, "mrope_section": [11, 11, 10],
                        "partial_rotary_factor": 0.25, "rope_theta": 10000000, "rope_type": "default"},
    "tie_word_embeddings": False,
    "vocab_size": 248320,
}

# Qwen3.5-27B: its config.json's text_config, as keyword arguments of Qwen3_5Config in a public
# Qwen-Image benchmark wrapper (QwenImageBenchQwen35ForConditionalGeneration: 64 layers, hidden 5120,
# intermediate 17408, 24 heads of 256 over 4 key/value heads, 16 key and 48 value heads of 128 in
# the linear attention, vocab 248320, untied); the same shapes in THUDM/slime
# scripts/models/qwen3.5-27B.sh (num-layers 64, hidden-size 5120, ffn-hidden-size 17408,
# num-attention-heads 24, num-query-groups 4, kv-channels 256, vocab-size 248320, rotary-base 1e7).
# Qwen3.5-35B-A3B: THUDM/slime scripts/models/qwen3.5-35B-A3B.sh (40 layers, hidden 2048, 16 heads
# over 2 key/value groups of 256, 256 experts of 512, top 8, a shared expert of 512, linear
# attention 16 key / 32 value heads of 128, conv 4, vocab 248320), which are also transformers'
# Qwen3_5MoeTextConfig defaults (configuration_qwen3_5_moe.py, documented as that checkpoint).
QWEN_3_5_PRESETS: dict[str, dict[str, Any]] = {
    "Qwen/Qwen3.5-27B": {
        "model_type": "qwen3_5_text",
        "architectures": ["Qwen3_5ForCausalLM"],
        **_QWEN_3_5_TEXT,
        "hidden_size": 5120,
        "intermediate_size": 17408,
        "linear_num_value_heads": 48,
        "num_attention_heads": 24,
        "num_hidden_layers": 64,
        "num_key_value_heads": 4,
        "torch_dtype": "bfloat16",
    },
    "Qwen/Qwen3.5-35B-A3B": {
        "model_type": "qwen3_5_moe_text",
        "architectures": ["Qwen3_5MoeForCausalLM"],
        **_QWEN_3_5_TEXT,
        "hidden_size": 2048,
        "linear_num_value_heads": 32,
        "moe_intermediate_size": 512,
        "num_attention_heads": 16,
        "num_experts": 256,
        "num_experts_per_tok": 8,
        "num_hidden_layers": 40,
        "num_key_value_heads": 2,
        "shared_expert_intermediate_size": 512,
        "torch_dtype": "bfloat16",
    },
}

# Qwen3.5's vision towers (Qwen3_5VisionConfig, Qwen3_5MoeVisionConfig: 16-pixel patches over 2 frames,
# a 48 x 48 learned position table, 2 x 2 merge into the text model's hidden size, gelu_pytorch_tanh,
# no DeepStack), three sizes across the release as a public Megatron-Bridge port lists them
# (_VISION_VARIANT_CONFIGS: small for 0.8B, medium for 2B and 4B, large for 9B, 27B and the MoE ones).
_QWEN_3_5_TOWER = {"hidden_act": "gelu_pytorch_tanh", "in_channels": 3, "num_position_embeddings": 2304,
                   "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2}
_QWEN_3_5_LARGE_TOWER = {**_QWEN_3_5_TOWER, "depth": 27, "hidden_size": 1152, "intermediate_size": 4304,
                         "num_heads": 16}


def _vlm(name: str, model_type: str, architecture: str, tower: dict[str, Any]) -> dict[str, Any]:
    """The checkpoint ``name`` as the vision-language model it is published as: its text model above as
    text_config, ``tower`` projecting into its hidden size, Qwen3.5's vision token ids, the text
    model's embedding tying at the top (where Qwen3_5Config reads tie_word_embeddings)."""
    text = {key: value for key, value in QWEN_3_5_PRESETS[name].items()
            if key not in ("architectures", "torch_dtype")}
    return {
        "model_type": model_type,
        "architectures": [architecture],
        "image_token_id": 248056,
        "text_config": {**text, "dtype": "bfloat16"},
        "tie_word_embeddings": text["tie_word_embeddings"],
        "torch_dtype": "bfloat16",
        "video_token_id": 248057,
        "vision_config": {"model_type": f"{model_type}_vision", **tower,
                          "out_hidden_size": text["hidden_size"]},
        "vision_end_token_id": 248054,
        "vision_start_token_id": 248053,
    }


# Qwen3.5-35B-A3B, the vision-language model it is published as (Qwen3_5MoeForConditionalGeneration):
# its text model above as text_config, and a 27-block tower of 1152 (16 heads, MLP 4304, gelu_pytorch_tanh,
# 16-pixel patches over 2 frames, a 48 x 48 learned position table, 2 x 2 merge) projecting into the
# text model's 2048, no DeepStack; image tokens 248053-248057. These are transformers'
# Qwen3_5MoeVisionConfig defaults (configuration_qwen3_5_moe.py, documented as this checkpoint) but
# out_hidden_size (the text model's hidden size, 2048, not the default 3584), and the config.json of
# Qwen/Qwen3.6-35B-A3B (the same architecture, its text model as this one) as a public validator pins
# it byte for byte: "deepstack_visual_indexes": [], "depth": 27, "hidden_size": 1152,
# "intermediate_size": 4304, "num_heads": 16, "num_position_embeddings": 2304, "out_hidden_size": 2048,
# "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2, "image_token_id": 248056,
# "video_token_id": 248057, "vision_start_token_id": 248053, "vision_end_token_id": 248054, untied;
# beside it its preprocessor_config.json: Qwen3VLProcessor, size {"shortest_edge": 65536,
# "longest_edge": 16777216}, patch 16, merge 2 (Qwen3-VL's: workload/vision.py QWEN3_FAMILIES).
QWEN_3_5_PRESETS["Qwen/Qwen3.5-35B-A3B"] = _vlm("Qwen/Qwen3.5-35B-A3B", "qwen3_5_moe",
                                               "Qwen3_5MoeForConditionalGeneration", _QWEN_3_5_LARGE_TOWER)

# The release's other sizes, each the vision-language model it is published as (Axolotl's
# examples/qwen3.5/README.md: "All Qwen3.5 models are early-fusion vision-language models: dense
# variants use Qwen3_5ForConditionalGeneration and MoE variants use Qwen3_5MoeForConditionalGeneration").
# Qwen3.5-0.8B: THUDM/slime scripts/models/qwen3.5-0.8B.sh (24 layers, hidden 1024, ffn 3584, 8 heads
# over 2 key/value groups of 256, vocab 248320, rotary-base 1e7, and no
# --untie-embeddings-and-output-weights: tied, where its 27B and MoE scripts untie them); cpehle/tyr
# Tyr/Model/Qwen35/Config.lean qwen35_0_8B (the same, linear attention 16 key and 16 value heads of
# 128, tie_word_embeddings true, eos 248044) and VLConfig.lean qwen35_0_8B (a 12-block tower of 768,
# 12 heads, MLP 3072, out 1024; tied).
# Qwen3.5-4B: the checkpoint's config.json as public code copies it for a fine-tune of it (Chandra's,
# parsed in a Rust test: text_config hidden 2560, 32 layers, 16 heads over 4 of 256, tie_word_embeddings
# true at both levels; a 24-block tower of 1024, 16 heads, MLP 4096, out 2560, no DeepStack), with
# intermediate_size 9216 and 16 key / 32 value linear-attention heads of 128 as public Qwen3.5-4B
# signatures pin them (a text signature {"hidden_size": 2560, "intermediate_size": 9216,
# "num_hidden_layers": 32, ...}; a Qwen3.5-4B-Base snapshot fixture: "linear_num_value_heads": 32).
# Qwen3.5-9B: a public validator of its NVFP4 export's config.json (text_config hidden 4096,
# intermediate 12288, 32 layers, 16 heads over 4 of 256, linear attention 16 key / 32 value heads of 128,
# conv 4, tie_word_embeddings false at both levels; the 27-block tower of 1152 out 4096, no DeepStack),
# the shapes cpehle/tyr's Config.lean also defaults to as "Qwen3.5-9B style".
# Qwen3.5-122B-A10B: its config.json as public code quotes it (48 layers, hidden 3072, 32 heads over 2 of
# 256, 256 experts of 1024 top 8, a shared expert of 1024, linear attention 16 key / 64 value heads of
# 128, conv 4, partial rotary 0.25, rope_theta 1e7: an Ascend run script's test config; mlx's
# gather_mm benchmark CONFIGS "qwen3.5-122b-a10b": (3072, 1024, 256, 8)); its tower the 27-block one out
# 3072 (a public MLX export check: depth 27, hidden 1152, 16 heads, out_hidden_size 3072).
# Qwen3.5-397B-A17B: its config.json, copied whole in ai-dynamo/aiconfigurator
# src/aiconfigurator/model_configs/Qwen--Qwen3.5-397B-A17B_config.json (60 layers, hidden 4096, 32 heads
# over 2 of 256, 512 experts of 1024 top 10, a shared expert of 1024, linear attention 16 key / 64 value
# heads, untied; the 27-block tower out 4096), the same in THUDM/slime scripts/models/qwen3.5-397B-A17B.sh.
QWEN_3_5_PRESETS.update({
    "Qwen/Qwen3.5-0.8B": {
        "model_type": "qwen3_5_text",
        **_QWEN_3_5_TEXT,
        "hidden_size": 1024,
        "intermediate_size": 3584,
        "linear_num_value_heads": 16,
        "num_attention_heads": 8,
        "num_hidden_layers": 24,
        "num_key_value_heads": 2,
        "tie_word_embeddings": True,
    },
    "Qwen/Qwen3.5-4B": {
        "model_type": "qwen3_5_text",
        **_QWEN_3_5_TEXT,
        "hidden_size": 2560,
        "intermediate_size": 9216,
        "linear_num_value_heads": 32,
        "num_attention_heads": 16,
        "num_hidden_layers": 32,
        "num_key_value_heads": 4,
        "tie_word_embeddings": True,
    },
    "Qwen/Qwen3.5-9B": {
        "model_type": "qwen3_5_text",
        **_QWEN_3_5_TEXT,
        "hidden_size": 4096,
        "intermediate_size": 12288,
        "linear_num_value_heads": 32,
        "num_attention_heads": 16,
        "num_hidden_layers": 32,
        "num_key_value_heads": 4,
    },
    "Qwen/Qwen3.5-122B-A10B": {
        "model_type": "qwen3_5_moe_text",
        **_QWEN_3_5_TEXT,
        "hidden_size": 3072,
        "linear_num_value_heads": 64,
        "moe_intermediate_size": 1024,
        "num_attention_heads": 32,
        "num_experts": 256,
        "num_experts_per_tok": 8,
        "num_hidden_layers": 48,
        "num_key_value_heads": 2,
        "shared_expert_intermediate_size": 1024,
    },
    "Qwen/Qwen3.5-397B-A17B": {
        "model_type": "qwen3_5_moe_text",
        **_QWEN_3_5_TEXT,
        "hidden_size": 4096,
        "linear_num_value_heads": 64,
        "moe_intermediate_size": 1024,
        "num_attention_heads": 32,
        "num_experts": 512,
        "num_experts_per_tok": 10,
        "num_hidden_layers": 60,
        "num_key_value_heads": 2,
        "shared_expert_intermediate_size": 1024,
    },
})
_SMALL_TOWER = {**_QWEN_3_5_TOWER, "depth": 12, "hidden_size": 768, "intermediate_size": 3072,
                "num_heads": 12}
_MEDIUM_TOWER = {**_QWEN_3_5_TOWER, "depth": 24, "hidden_size": 1024, "intermediate_size": 4096,
                 "num_heads": 16}
for _name, _tower in (("Qwen/Qwen3.5-0.8B", _SMALL_TOWER), ("Qwen/Qwen3.5-4B", _MEDIUM_TOWER),
                      ("Qwen/Qwen3.5-9B", _QWEN_3_5_LARGE_TOWER)):
    QWEN_3_5_PRESETS[_name] = _vlm(_name, "qwen3_5", "Qwen3_5ForConditionalGeneration", _tower)
for _name in ("Qwen/Qwen3.5-122B-A10B", "Qwen/Qwen3.5-397B-A17B"):
    QWEN_3_5_PRESETS[_name] = _vlm(_name, "qwen3_5_moe", "Qwen3_5MoeForConditionalGeneration",
                                   _QWEN_3_5_LARGE_TOWER)

# Qwen3-Next-80B-A3B: THUDM/slime scripts/models/qwen3-next-80B-A3B.sh (48 layers, hidden 2048,
# ffn-hidden-size 5120, 16 heads over 2 key/value groups of 256, 512 experts of 512, top 10, a gated
# shared expert of 512, vocab 151936, rotary-base 1e7, untied); the linear attention (16 key and 32
# value heads of 128, conv 4), decoder_sparse_step 1, mlp_only_layers [] and norm_topk_prob as the
# config.json of the same shapes parsed in public inference tests (Qwen3-Coder-Next's: "hidden_size":
# 2048, "intermediate_size": 5120, "linear_num_value_heads": 32, "num_experts": 512 ...), which are
# also transformers' Qwen3NextConfig defaults (configuration_qwen3_next.py).
QWEN_3_NEXT_PRESETS: dict[str, dict[str, Any]] = {
    "Qwen/Qwen3-Next-80B-A3B-Instruct": {
        "model_type": "qwen3_next",
        "architectures": ["Qwen3NextForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 151643,
        "decoder_sparse_step": 1,
        "eos_token_id": 151645,
        "full_attention_interval": 4,
        "head_dim": 256,
        "hidden_act": "silu",
        "hidden_size": 2048,
        "initializer_range": 0.02,
        "intermediate_size": 5120,
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 128,
        "linear_num_key_heads": 16,
        "linear_num_value_heads": 32,
        "linear_value_head_dim": 128,
        "max_position_embeddings": 262144,
        "mlp_only_layers": [],
        "moe_intermediate_size": 512,
        "norm_topk_prob": True,
        "num_attention_heads": 16,
        "num_experts": 512,
        "num_experts_per_tok": 10,
        "num_hidden_layers": 48,
        "num_key_value_heads": 2,
        "partial_rotary_factor": 0.25,
        "rms_norm_eps": 1e-06,
        "rope_theta": 10000000,
        "shared_expert_intermediate_size": 512,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "vocab_size": 151936,
    },
}
