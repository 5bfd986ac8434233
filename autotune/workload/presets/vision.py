"""Vision-language presets (task image-text-to-text: autotune/workload/vision.py): Qwen2-VL and
Qwen2.5-VL 7B, LLaVA-1.5 7B, Gemma 3 from 4B up."""

from __future__ import annotations

from typing import Any

# Qwen2-VL and Qwen2.5-VL 7B: config.json as published, in the flat form the hub keeps (the text
# model's keys at the top, Qwen2VLConfig moves them to text_config). Qwen2-VL-7B-Instruct's values
# are transformers' Qwen2VLVisionConfig defaults (configuration_qwen2_vl.py, documented as that
# checkpoint's) for the vision tower; its text shapes, with Qwen2.5-VL's whole config, as copied in
# public code: Qwen2.5-VL-7B-Instruct's config.json as keyword arguments in a Qwen-Image text encoder
# (the module tree printed in zhenhua32/Qwen2-VL READ.md and acproject/duorou docs/qwen2.5vl_graph.md
# gives the same shapes). Their token ids: <|vision_start|> 151652 ... <|video_pad|> 151656.
_QWEN_VL_TOKENS = {
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "vision_start_token_id": 151652,
    "vision_end_token_id": 151653,
    "vision_token_id": 151654,
    "image_token_id": 151655,
    "video_token_id": 151656,
}
_QWEN_VL_7B_TEXT = {
    **_QWEN_VL_TOKENS,
    "attention_dropout": 0.0,
    "hidden_act": "silu",
    "hidden_size": 3584,
    "initializer_range": 0.02,
    "intermediate_size": 18944,
    "max_window_layers": 28,
    "num_attention_heads": 28,
    "num_hidden_layers": 28,
    "num_key_value_heads": 4,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
    "sliding_window": 32768,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_sliding_window": False,
    "vocab_size": 152064,
}
# Gemma 3 from 4B up (Gemma3ForConditionalGeneration): the keys of the -it config.json outside
# text_config, the same at every size (below).
_GEMMA_3_IT = {
    "model_type": "gemma3",
    "architectures": ["Gemma3ForConditionalGeneration"],
    "boi_token_index": 255999,
    "eoi_token_index": 256000,
    "eos_token_id": [1, 106],
    "image_token_index": 262144,
    "initializer_range": 0.02,
    "mm_tokens_per_image": 256,
    "torch_dtype": "bfloat16",
    "vision_config": {
        "hidden_size": 1152,
        "image_size": 896,
        "intermediate_size": 4304,
        "model_type": "siglip_vision_model",
        "num_attention_heads": 16,
        "num_hidden_layers": 27,
        "patch_size": 14,
        "vision_use_head": False,
    },
}
VLM_PRESETS: dict[str, dict[str, Any]] = {
    "Qwen/Qwen2-VL-7B-Instruct": {
        "model_type": "qwen2_vl",
        "architectures": ["Qwen2VLForConditionalGeneration"],
        **_QWEN_VL_7B_TEXT,
        "max_position_embeddings": 32768,
        "vision_config": {
            "depth": 32,
            "embed_dim": 1280,
            "hidden_act": "quick_gelu",
            "hidden_size": 3584,
            "in_channels": 3,
            "mlp_ratio": 4,
            "num_heads": 16,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
        },
    },
    "Qwen/Qwen2.5-VL-7B-Instruct": {
        "model_type": "qwen2_5_vl",
        "architectures": ["Qwen2_5_VLForConditionalGeneration"],
        **_QWEN_VL_7B_TEXT,
        "max_position_embeddings": 128000,
        "vision_config": {
            "depth": 32,
            "fullatt_block_indexes": [7, 15, 23, 31],  # the others attend within 112-pixel windows
            "hidden_act": "silu",
            "hidden_size": 1280,
            "in_channels": 3,
            "intermediate_size": 3420,
            "num_heads": 16,
            "out_hidden_size": 3584,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "tokens_per_second": 2,
            "window_size": 112,
        },
    },
    # llava-hf/llava-1.5-7b-hf: CLIP ViT-L/14 at 336 pixels (its vision_config is transformers'
    # LlavaConfig default, configuration_llava.py, documented as this checkpoint's), a 2-layer GELU
    # projector, Vicuna-7B v1.5 (Llama-2-7B shapes, LlamaConfig's defaults) with 64 more token rows
    # (vocab 32064: <image> is 32000, <pad> 32001). Published in float16.
    "llava-hf/llava-1.5-7b-hf": {
        "model_type": "llava",
        "architectures": ["LlavaForConditionalGeneration"],
        "ignore_index": -100,
        "image_token_index": 32000,
        "pad_token_id": 32001,
        "projector_hidden_act": "gelu",
        "text_config": {
            "architectures": ["LlamaForCausalLM"],
            "max_position_embeddings": 4096,
            "model_type": "llama",
            "rms_norm_eps": 1e-05,
            "torch_dtype": "float16",
            "vocab_size": 32064,
        },
        "tie_word_embeddings": False,
        "torch_dtype": "float16",
        "vision_config": {
            "hidden_size": 1024,
            "image_size": 336,
            "intermediate_size": 4096,
            "model_type": "clip_vision_model",
            "num_attention_heads": 16,
            "num_hidden_layers": 24,
            "patch_size": 14,
            "projection_dim": 768,
            "vocab_size": 32000,
        },
        "vision_feature_layer": -2,
        "vision_feature_select_strategy": "default",
    },
    # google/gemma-3-4b-it: Gemma3Config's own defaults are this checkpoint's (configuration_gemma3.py,
    # documented as google/gemma-3-4b-it: 256 tokens an image, boi 255999, eoi 256000, image 262144);
    # the config.json sets in text_config 2560 hidden, 10240 intermediate, 34 layers, a 1024-token
    # window and linear rope scaling by 8 (the rest Gemma3TextConfig's defaults: 8 heads, 4 key/value
    # heads of 256, vocab 262208), and a SigLIP so400m tower at 896 pixels (27 layers of 1152).
    "google/gemma-3-4b-it": {
        **_GEMMA_3_IT,
        "text_config": {
            "hidden_size": 2560,
            "intermediate_size": 10240,
            "model_type": "gemma3_text",
            "num_hidden_layers": 34,
            "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
            "sliding_window": 1024,
        },
    },
    # google/gemma-3-12b-it and -27b-it: the 4B's release (Gemma3Config's defaults above, the same
    # SigLIP tower at 896 pixels, 256 tokens an image), larger text models. Their text_config as
    # Lightning-AI/litgpt litgpt/config.py gives it ("Gemma-3-12b-it", "Gemma-3-27b-it", from their
    # config.json: n_embd -> hidden_size, n_layer -> num_hidden_layers, n_head ->
    # num_attention_heads, n_query_groups -> num_key_value_heads, head_size -> head_dim,
    # attention_scores_scalar -> query_pre_attn_scalar, sliding_window_size -> sliding_window,
    # rope_adjustments factor -> linear rope scaling). The 27B's config.json is also in
    # NVIDIA/TensorRT-LLM tests/unittest/_torch/modeling/test_modeling_gemma3vl.py (GEMMA3_27B_MINI_CONFIG,
    # its layers and window cut for the test, the rest as above); the 12B's, as transformers 4.57
    # writes it, in an LTX-2 text encoder (Gemma3ForConditionalGeneration subclass LTX2TextEncoder:
    # head_dim 256, query_pre_attn_scalar 256, text vocabulary 262208, Gemma3TextConfig's defaults).
    "google/gemma-3-12b-it": {
        **_GEMMA_3_IT,
        "text_config": {
            "hidden_size": 3840,
            "intermediate_size": 15360,
            "model_type": "gemma3_text",
            "num_attention_heads": 16,
            "num_hidden_layers": 48,
            "num_key_value_heads": 8,
            "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
            "sliding_window": 1024,
        },
    },
    "google/gemma-3-27b-it": {
        **_GEMMA_3_IT,
        "text_config": {
            "head_dim": 128,
            "hidden_size": 5376,
            "intermediate_size": 21504,
            "model_type": "gemma3_text",
            "num_attention_heads": 32,
            "num_hidden_layers": 62,
            "num_key_value_heads": 16,
            "query_pre_attn_scalar": 168,
            "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
            "sliding_window": 1024,
        },
    },
}
