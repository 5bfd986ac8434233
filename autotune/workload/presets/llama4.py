"""Llama 4 presets (task image-text-to-text: Llama4ForConditionalGeneration, as Axolotl's
examples/llama-4 load them): Scout (16 experts) and Maverick (128 experts), 17B active each. A step
of one trains the whole checkpoint as Axolotl loads it (AutoModelForImageTextToText), with the images of
its processor (workload/llama4_images.py) or without (a text-only step).

Every layer of Scout is a mixture of 16 experts and one shared expert (interleave_moe_layer_step 1),
one expert a token; Maverick alternates a dense MLP of 16384 with a mixture of 128 experts
(interleave_moe_layer_step 2). Every fourth layer attends globally without RoPE, the others in 8192-
token chunks with RoPE (Llama4TextConfig.__post_init__ derives no_rope_layers and layer_types from
no_rope_layer_interval 4, as the checkpoints list them)."""

from __future__ import annotations

from typing import Any

# The tower and projector both checkpoints carry: NVIDIA/TensorRT-LLM's
# tests/unittest/_torch/modeling/test_modeling_llama_min_latency.py LLAMA_4_MAVERICK_TWO_LAYER_CONFIG
# copies Maverick's config.json (its vision num_hidden_layers set to 0 there; 34 in the checkpoint,
# Llama4VisionConfig's default, documented as meta-llama/Llama-4-Scout-17B-16E), and a public
# dump of Scout's Llama4Config lists the same vision_config: 34 layers of 1408, 16 heads, MLP
# 5632, 336-pixel images in 14-pixel patches, a 0.5 pixel shuffle into a 4096 projector.
_VISION = {
    "model_type": "llama4_vision_model",
    "attention_dropout": 0.0,
    "hidden_act": "gelu",
    "hidden_size": 1408,
    "image_size": 336,
    "intermediate_size": 5632,
    "multi_modal_projector_bias": False,
    "norm_eps": 1e-05,
    "num_attention_heads": 16,
    "num_channels": 3,
    "num_hidden_layers": 34,
    "patch_size": 14,
    "pixel_shuffle_ratio": 0.5,
    "projector_dropout": 0.0,
    "projector_input_dim": 4096,
    "projector_output_dim": 4096,
    "rope_theta": 10000,
    "vision_feature_layer": -1,
    "vision_feature_select_strategy": "default",
    "vision_output_dim": 4096,
}
# The text keys both share (the same copies): 48 layers of 5120, 40 heads and 8 key/value heads of
# 128, experts of 8192, a dense MLP of 16384, a 202048-token vocabulary, lm_head apart, 8192-token
# attention chunks, RoPE base 500000.
_TEXT = {
    "model_type": "llama4_text",
    "attention_bias": False,
    "attention_chunk_size": 8192,
    "attention_dropout": 0.0,
    "attn_scale": 0.1,
    "floor_scale": 8192,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 5120,
    "intermediate_size": 8192,
    "intermediate_size_mlp": 16384,
    "num_attention_heads": 40,
    "num_experts_per_tok": 1,
    "num_hidden_layers": 48,
    "num_key_value_heads": 8,
    "pad_token_id": 200018,
    "rms_norm_eps": 1e-05,
    "router_aux_loss_coef": 0.001,
    "tie_word_embeddings": False,
    "vocab_size": 202048,
}
_LLAMA4 = {
    "model_type": "llama4",
    "architectures": ["Llama4ForConditionalGeneration"],
    "boi_token_index": 200080,
    "eoi_token_index": 200081,
    "image_token_index": 200092,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vision_config": _VISION,
}

LLAMA4_PRESETS: dict[str, dict[str, Any]] = {
    # meta-llama/Llama-4-Scout-17B-16E (the base; 109B in total, 17B active: the model card): 16
    # experts in every layer, q/k L2-normed on the RoPE layers, 256k positions by llama3 scaling 8 of
    # 8192, as a public dump of its Llama4Config and ai-dynamo/aiconfigurator's copy of the
    # text_config ("Mirror the published unsloth/Llama-4-Scout-17B-16E text_config") give it. This
    # builds 108,641,793,536 parameters, the hub's count of Llama-4-Scout-17B-16E-Instruct (the same
    # shapes) as public model inventories list it.
    "meta-llama/Llama-4-Scout-17B-16E": {
        **_LLAMA4,
        "text_config": {
            **_TEXT,
            "interleave_moe_layer_step": 1,
            "max_position_embeddings": 262144,
            "num_local_experts": 16,
            "rope_scaling": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                             "original_max_position_embeddings": 8192, "rope_type": "llama3"},
            "rope_theta": 500000.0,
            "use_qk_norm": True,
        },
    },
    # meta-llama/Llama-4-Maverick-17B-128E (400B in total, 17B active: the model card): 128 experts
    # in every second layer, no q/k norm, 1M positions without RoPE scaling: TensorRT-LLM's copy of
    # its config.json above (there reduced to 2 layers from 48). This builds 401,583,781,376
    # parameters, the parameter_count Fireworks' billing export gives Llama 4 Maverick.
    "meta-llama/Llama-4-Maverick-17B-128E": {
        **_LLAMA4,
        "text_config": {
            **_TEXT,
            "interleave_moe_layer_step": 2,
            "max_position_embeddings": 1048576,
            "num_local_experts": 128,
            "rope_scaling": None,
            "rope_theta": 500000.0,
            "use_qk_norm": False,
        },
    },
}
