"""GLM-4.6V-Flash (task image-text-to-text: Glm4vForConditionalGeneration; its images:
workload/vision.py GLM_FAMILIES), the model of Axolotl's examples/glm46v.

Its class and model type: ZhipuAI's own usage loads GLM-4.6V-Flash with Glm4vForConditionalGeneration
(a public copy: updateforever/VLMTrack SOIBench/vlms/glm46v_infer.py), and a public test of MLX
checkpoint detection reads a GLM-4.6V-Flash-MLX-4bit folder's config.json as "model_type": "glm4v".

Its shapes are GLM-4.1V-9B's, the architecture transformers' Glm4vConfig and Glm46VConfig default to
(configuration_glm4v.py, configuration_glm46v.py: "similar to GLM-4.1V-9B-Thinking"): a GLM-4-9B text
model (40 layers of 4096, 32 query heads over 2 key/value heads of 128 with biased q/k/v, half of each
head rotated in mrope sections [8, 12, 12], MLP 13696, vocabulary 151552, untied) and a 24-block tower
of 1536 (12 heads, 14-pixel patches over 2 frames, a 24 x 24 learned position table of 336 pixels,
merged 2 x 2 by a strided convolution into 4096, a gated merger MLP of 13696). Public copies of the
values: a GLM-4.6V port's architecture constants (MLX C++: vision 1536, 12 heads, 24 layers, patch 14,
image 336, temporal patch 2, merge 2, block MLP 4096, merger MLP 13696; text 4096, 32 heads, 2 key/value
heads, 40 layers, MLP 13696, vocabulary 151552, partial rotary 0.5, rope theta 10000, <|image|> 151363),
a GLM-4V text config.json in a public Rust test (lablup: the same text keys and mrope_section
[8, 12, 12]) and mlx-vlm's glm4v TextConfig defaults (the same). Its context: 128K tokens (the model
card: "GLM-4.6V scales its context window to 128k tokens"), max_position_embeddings 131072.

transformers counts 10.29B parameters: GLM-4-9B's 9.40B text model (the "9B" of the model card's
"GLM-4.6V-Flash (9B)") and a 0.89B tower.
"""

from __future__ import annotations

from typing import Any

GLM4V_PRESETS: dict[str, dict[str, Any]] = {
    "zai-org/GLM-4.6V-Flash": {
        "model_type": "glm4v",
        "architectures": ["Glm4vForConditionalGeneration"],
        "image_token_id": 151363,
        "image_start_token_id": 151339,
        "image_end_token_id": 151340,
        "video_start_token_id": 151341,
        "video_end_token_id": 151342,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "text_config": {
            "model_type": "glm4v_text",
            "attention_bias": True,
            "attention_dropout": 0.0,
            "hidden_act": "silu",
            "hidden_size": 4096,
            "intermediate_size": 13696,
            "max_position_embeddings": 131072,
            "num_attention_heads": 32,
            "num_hidden_layers": 40,
            "num_key_value_heads": 2,
            "partial_rotary_factor": 0.5,
            "rms_norm_eps": 1e-05,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [8, 12, 12]},
            "vocab_size": 151552,
            "pad_token_id": 151329,
            "eos_token_id": [151329, 151336, 151338],
            "dtype": "bfloat16",
        },
        "vision_config": {
            "model_type": "glm4v_vision",
            "attention_bias": False,
            "depth": 24,
            "hidden_act": "silu",
            "hidden_size": 1536,
            "image_size": 336,
            "in_channels": 3,
            "intermediate_size": 13696,
            "num_heads": 12,
            "out_hidden_size": 4096,
            "patch_size": 14,
            "rms_norm_eps": 1e-05,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
        },
    },
}
