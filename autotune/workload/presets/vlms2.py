"""Vision-language presets of Axolotl's later examples (task image-text-to-text:
autotune/workload/vision.py): InternVL 3.5, LFM2-VL."""

from __future__ import annotations

from typing import Any

from autotune.workload.presets.more_decoders import LFM2_PRESETS
from autotune.workload.presets.qwen import QWEN_3_PRESETS

# OpenGVLab/InternVL3_5-8B-HF (InternVLForConditionalGeneration, transformers' conversion of
# InternVL3_5-8B): Qwen3-8B's text model (its config.json, presets/qwen.py, as text_config, untied),
# an InternViT-300M-448px-V2_5 tower (transformers' InternVLVisionConfig defaults are that tower's:
# 24 layers of 1024, 16 heads, MLP 4096, 448-pixel images in 14-pixel patches, LayerNorm, layer
# scale, no q/k norm) whose qkv carry biases (attention_bias true), a 0.5 pixel-shuffle (256 tokens a
# 448-pixel tile) and the <IMG_CONTEXT> id of the Qwen3 tokenizer, 151671: as the 3.5 "-HF" configs
# are copied in public test fixtures ("model_type": "internvl", "image_token_id": 151671,
# "downsample_ratio": 0.5, "projector_hidden_act": "gelu", text_config model_type qwen3,
# vision_config "attention_bias": true, "norm_type": "layer_norm", "use_qk_norm": false).
_QWEN3_8B = {key: value for key, value in QWEN_3_PRESETS["Qwen/Qwen3-8B"].items()
             if key not in ("architectures", "torch_dtype")}
VLMS2_PRESETS: dict[str, dict[str, Any]] = {
    "OpenGVLab/InternVL3_5-8B-HF": {
        "model_type": "internvl",
        "architectures": ["InternVLForConditionalGeneration"],
        "downsample_ratio": 0.5,
        "image_seq_length": 256,
        "image_token_id": 151671,
        "projector_hidden_act": "gelu",
        "text_config": {**_QWEN3_8B, "dtype": "bfloat16"},
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "vision_config": {
            "model_type": "internvl_vision",
            "attention_bias": True,
            "hidden_act": "gelu",
            "hidden_size": 1024,
            "image_size": [448, 448],
            "intermediate_size": 4096,
            "layer_norm_eps": 1e-06,
            "layer_scale_init_value": 0.1,
            "norm_type": "layer_norm",
            "num_attention_heads": 16,
            "num_hidden_layers": 24,
            "patch_size": [14, 14],
            "use_absolute_position_embeddings": True,
            "use_mean_pooling": True,
            "use_qk_norm": False,
        },
        "vision_feature_layer": -1,
        "vision_feature_select_strategy": "default",
    },
}

# LiquidAI/LFM2-VL-450M: its config.json as a public copy of the checkpoint's files shows it
# (transformers 4.55, written for the hub's own code: "model_type": "lfm2-vl"; transformers' native
# lfm2_vl reads the same keys): LFM2-350M's text model (its config.json, presets/more_decoders.py, as
# text_config, "_name_or_path": "LiquidAI/LFM2-350M"), a SigLIP2 NaFlex base tower (12 layers of 768,
# 12 heads, MLP 3072, patches of 16, a 16 x 16 position table, no head), a 2 x 2 pixel unshuffle
# into a projector of 2560 with biases and GELU, <image> 396; the hub code's projector always has its
# LayerNorm (Lfm2VlConfig's projector_use_layernorm, default true).
_LFM2_350M = {key: value for key, value in LFM2_PRESETS["LiquidAI/LFM2-350M"].items()
              if key not in ("architectures", "torch_dtype")}
VLMS2_PRESETS["LiquidAI/LFM2-VL-450M"] = {
    "model_type": "lfm2_vl",
    "architectures": ["Lfm2VlForConditionalGeneration"],
    "downsample_factor": 2,
    "image_token_id": 396,
    "projector_bias": True,
    "projector_hidden_act": "gelu",
    "projector_hidden_size": 2560,
    "projector_use_layernorm": True,
    "text_config": {**_LFM2_350M, "dtype": "bfloat16"},
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "vision_config": {
        "model_type": "siglip2_vision_model",
        "hidden_act": "gelu_pytorch_tanh",
        "hidden_size": 768,
        "intermediate_size": 3072,
        "layer_norm_eps": 1e-06,
        "num_attention_heads": 12,
        "num_channels": 3,
        "num_hidden_layers": 12,
        "num_patches": 256,
        "patch_size": 16,
        "vision_use_head": False,
    },
    "vision_feature_layer": -1,
}

# Llama 3.2 11B Vision (alpindale/Llama-3.2-11B-Vision-Instruct, the ungated copy of
# meta-llama/Llama-3.2-11B-Vision-Instruct that Axolotl's examples/llama-3-vision/lora-11b.yaml loads):
# its config.json's vision_config as a public llama.cpp study copies it ("attention_heads": 16,
# "hidden_act": "gelu", "hidden_size": 1280, "image_size": 560, "intermediate_size": 5120,
# "max_num_tiles": 4, "num_channels": 3, "num_global_layers": 8, "num_hidden_layers": 32, "patch_size": 14,
# the 8 supported aspect ratios, "vision_output_dim": 7680; preprocessor_config.json: MllamaImageProcessor,
# max_image_tiles 4, size 560 x 560), the intermediate layers [3, 7, 15, 23, 30] as public mllama config
# parsers' tests copy them; its text_config as public loaders' tests copy it (40 layers of 4096, 32 heads
# over 8 key/value heads, MLP 14336, cross-attention layers [3, 8, ..., 38], vocab 128256, 131072
# positions, rope_theta 5e5) with Llama 3.1's llama3 rope scaling (factor 8, 1/4, 8192) and tokens
# (bos 128000, eos 128001/128008/128009, pad 128004) as a published copy of the 11B-shaped config.json
# shows them; <|image|> 128256. These are transformers' MllamaConfig defaults (configuration_mllama.py,
# documented as meta-llama/Llama-3.2-11B-Vision). Model card: 10.6B parameters.
VLMS2_PRESETS["alpindale/Llama-3.2-11B-Vision-Instruct"] = {
    "model_type": "mllama",
    "architectures": ["MllamaForConditionalGeneration"],
    "image_token_index": 128256,
    "text_config": {
        "model_type": "mllama_text_model",
        "bos_token_id": 128000,
        "cross_attention_layers": [3, 8, 13, 18, 23, 28, 33, 38],
        "eos_token_id": [128001, 128008, 128009],
        "hidden_act": "silu",
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "max_position_embeddings": 131072,
        "num_attention_heads": 32,
        "num_hidden_layers": 40,
        "num_key_value_heads": 8,
        "pad_token_id": 128004,
        "rms_norm_eps": 1e-05,
        "rope_scaling": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                         "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        "rope_theta": 500000.0,
        "tie_word_embeddings": False,
        "vocab_size": 128256,
        "dtype": "bfloat16",
    },
    "torch_dtype": "bfloat16",
    "vision_config": {
        "model_type": "mllama_vision_model",
        "attention_heads": 16,
        "hidden_act": "gelu",
        "hidden_size": 1280,
        "image_size": 560,
        "intermediate_layers_indices": [3, 7, 15, 23, 30],
        "intermediate_size": 5120,
        "max_num_tiles": 4,
        "norm_eps": 1e-05,
        "num_channels": 3,
        "num_global_layers": 8,
        "num_hidden_layers": 32,
        "patch_size": 14,
        "supported_aspect_ratios": [[1, 1], [1, 2], [1, 3], [1, 4], [2, 1], [2, 2], [3, 1], [4, 1]],
        "vision_output_dim": 7680,
    },
}
