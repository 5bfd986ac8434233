"""Vision-language presets of Axolotl's later examples (task image-text-to-text:
autotune/workload/vision.py): InternVL 3.5."""

from __future__ import annotations

from typing import Any

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
