"""Vision-language presets beyond the first four (task image-text-to-text: autotune/workload/vision.py):
Qwen3-VL, dense and mixture of experts."""

from __future__ import annotations

from typing import Any

# Qwen3-VL: config.json as published (transformers 4.57 writes it nested: text_config, vision_config;
# no top-level dtype: from_pretrained's "auto" reads bfloat16 from the safetensors, the text_config
# says it too). Token ids as Qwen2-VL's (<|vision_start|> 151652 ... <|video_pad|> 151656).
_QWEN3_VL_TOKENS = {
    "image_token_id": 151655,
    "video_token_id": 151656,
    "vision_start_token_id": 151652,
    "vision_end_token_id": 151653,
}
# Both text models: interleaved multimodal rope over 24/20/20 frequencies of head_dim 128, theta 5e6,
# 256K positions.
_QWEN3_VL_TEXT = {
    "attention_bias": False,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "head_dim": 128,
    "hidden_act": "silu",
    "max_position_embeddings": 262144,
    "rms_norm_eps": 1e-06,
    "rope_scaling": {"mrope_interleaved": True, "mrope_section": [24, 20, 20], "rope_type": "default"},
    "rope_theta": 5000000,
    "vocab_size": 151936,
    "dtype": "bfloat16",
}
_QWEN3_VL_VISION = {
    "hidden_act": "gelu_pytorch_tanh",
    "in_channels": 3,
    "num_heads": 16,
    "num_position_embeddings": 2304,  # a 48 x 48 learned table, resampled to each image's grid
    "patch_size": 16,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
}
VLMS_PRESETS: dict[str, dict[str, Any]] = {
    # Qwen/Qwen3-VL-4B-Instruct: its config.json as keyword arguments of a Qwen3VLConfig in
    # modelscope/DiffSynth-Studio (WanMLLMEncoder, "transformers_version": "4.57.0.dev0"): Qwen3-4B's
    # text shapes (36 layers of 2560, 32 heads, 8 key/value heads, tied embeddings) and a 24-layer
    # tower of 1024 whose layers 5, 11 and 17 feed DeepStack.
    "Qwen/Qwen3-VL-4B-Instruct": {
        "model_type": "qwen3_vl",
        "architectures": ["Qwen3VLForConditionalGeneration"],
        **_QWEN3_VL_TOKENS,
        "text_config": {
            **_QWEN3_VL_TEXT,
            "model_type": "qwen3_vl_text",
            "hidden_size": 2560,
            "intermediate_size": 9728,
            "num_attention_heads": 32,
            "num_hidden_layers": 36,
            "num_key_value_heads": 8,
            "tie_word_embeddings": True,
        },
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "vision_config": {
            **_QWEN3_VL_VISION,
            "model_type": "qwen3_vl",
            "deepstack_visual_indexes": [5, 11, 17],
            "depth": 24,
            "hidden_size": 1024,
            "intermediate_size": 4096,
            "out_hidden_size": 2560,
        },
    },
    # Qwen/Qwen3-VL-30B-A3B-Instruct: pytorch/torchtitan torchtitan/experiments/qwen3_vl/__init__.py
    # ("30B-A3B": 48 layers of 2048, 32 heads, 4 key/value heads of 128, 128 experts of 768 with 8
    # routed, a 27-layer tower of 1152 with DeepStack at 8, 16, 24, out 2048); the rest as its
    # config.json is printed in a public model report (norm_topk_prob, decoder_sparse_step 1, no
    # mlp_only_layers, intermediate_size 6144 unused, untied embeddings).
    "Qwen/Qwen3-VL-30B-A3B-Instruct": {
        "model_type": "qwen3_vl_moe",
        "architectures": ["Qwen3VLMoeForConditionalGeneration"],
        **_QWEN3_VL_TOKENS,
        "text_config": {
            **_QWEN3_VL_TEXT,
            "model_type": "qwen3_vl_moe_text",
            "decoder_sparse_step": 1,
            "hidden_size": 2048,
            "intermediate_size": 6144,
            "mlp_only_layers": [],
            "moe_intermediate_size": 768,
            "norm_topk_prob": True,
            "num_attention_heads": 32,
            "num_experts": 128,
            "num_experts_per_tok": 8,
            "num_hidden_layers": 48,
            "num_key_value_heads": 4,
        },
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "vision_config": {
            **_QWEN3_VL_VISION,
            "model_type": "qwen3_vl_moe",
            "deepstack_visual_indexes": [8, 16, 24],
            "depth": 27,
            "hidden_size": 1152,
            "intermediate_size": 4304,
            "out_hidden_size": 2048,
        },
    },
}
