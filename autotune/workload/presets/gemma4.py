"""Gemma 4 presets (Gemma4ForConditionalGeneration: a Gemma 4 decoder, a ViT vision tower with
variable image resolution, and on the E-models an audio conformer; and the 12B, Gemma 4 Unified:
Gemma4UnifiedForConditionalGeneration, the same decoder with patch and waveform embedders in place of
towers, from its own converter, below).

Each checkpoint's config.json as transformers' own converter writes it:
src/transformers/models/gemma4/convert_gemma4_weights.py ``_VARIANTS`` (the configs it saved the
hub checkpoints with: ``gemma-4-e2b``, ``gemma-4-26b-a4b``, ``gemma-4-31b``), its vision configs
``_ON_DEVICE_VISION_CONFIG`` and ``_LARGE_MODEL_VISION_CONFIG``, its rotary parameters
``_ROPE_PARAMS`` (proportional rope on a quarter of the global layers' 512-wide heads); everything
else Gemma4Config's, Gemma4TextConfig's and Gemma4VisionConfig's defaults (configuration_gemma4.py:
vocabulary 262144, 8 heads of 256 on the sliding layers, a 512-token window, 131072 positions, image
token 258880, boi 255999, eoi 258882), which copies of the published config.json repeat (e.g. the
26B-A4B's text_config and token ids in tests of Rust and Go ports of Gemma 4 on GitHub). Weights
in bfloat16 (the converter's default dtypes). Published totals (Gemma 4 model card): E2B 2.3B
effective, 5.1B with its per-layer embeddings; 26B A4B 25.2B (3.8B active); 31B 30.7B, both counts
of the language model (the vision encoder, ~550M, apart); tests/autotune/workload/test_vlm.py.
"""

from __future__ import annotations

from typing import Any

_ROPE = {
    "full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0, "rope_type": "proportional"},
    "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"},
}
_SLIDING_5_TO_1 = ["sliding_attention"] * 5 + ["full_attention"]  # _DEFAULT_LAYER_TYPES
_GEMMA_4 = {
    "model_type": "gemma4",
    "architectures": ["Gemma4ForConditionalGeneration"],
    "boi_token_id": 255999,
    "eoi_token_id": 258882,
    "eos_token_id": [1, 106],
    "image_token_id": 258880,
    "initializer_range": 0.02,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "vision_soft_tokens_per_image": 280,  # the processor's image_seq_length / max_soft_tokens
}
_TEXT = {
    "model_type": "gemma4_text",
    "final_logit_softcapping": 30.0,
    "hidden_activation": "gelu_pytorch_tanh",
    "rope_parameters": _ROPE,
    "vocab_size": 262144,
}
# _ON_DEVICE_VISION_CONFIG: 16 layers of 768, 16-pixel patches pooled 3 x 3 into soft tokens.
_ON_DEVICE_VISION = {
    "model_type": "gemma4_vision",
    "default_output_length": 280,
    "global_head_dim": 64,
    "head_dim": 64,
    "hidden_size": 768,
    "intermediate_size": 3072,
    "num_attention_heads": 12,
    "num_hidden_layers": 16,
    "num_key_value_heads": 12,
    "patch_size": 16,
    "pooling_kernel_size": 3,
    "use_clipped_linears": True,
}
# _LARGE_MODEL_VISION_CONFIG: 27 layers of 1152 (SigLIP so400m's shapes), standardized soft tokens.
_LARGE_VISION = {
    "model_type": "gemma4_vision",
    "default_output_length": 280,
    "global_head_dim": 72,
    "head_dim": 72,
    "hidden_size": 1152,
    "intermediate_size": 4304,
    "num_attention_heads": 16,
    "num_hidden_layers": 27,
    "num_key_value_heads": 16,
    "patch_size": 16,
    "pooling_kernel_size": 3,
    "standardize": True,
    "use_clipped_linears": False,
}

GEMMA_4_PRESETS: dict[str, dict[str, Any]] = {
    # gemma-4-e2b: 35 layers of 1536 (4 sliding to 1 global), one key/value head, the last 20
    # layers reusing earlier layers' keys and values, a double-wide MLP on those, 256-wide per-layer
    # embeddings (PLE), the audio conformer (Gemma4AudioConfig's defaults).
    "google/gemma-4-E2B-it": {
        **_GEMMA_4,
        "audio_config": {"model_type": "gemma4_audio"},
        "text_config": {
            **_TEXT,
            "attention_k_eq_v": False,
            "hidden_size": 1536,
            "hidden_size_per_layer_input": 256,
            "intermediate_size": 6144,  # 4 x 1536
            "layer_types": (["sliding_attention"] * 4 + ["full_attention"]) * 7,
            "num_attention_heads": 8,
            "num_hidden_layers": 35,
            "num_key_value_heads": 1,
            "num_kv_shared_layers": 20,
            "use_double_wide_mlp": True,
        },
        "vision_config": _ON_DEVICE_VISION,
    },
    # gemma-4-26b-a4b: 30 layers of 2816, a shared 2112-wide MLP beside 128 experts of 704, 8
    # routed a token; global layers with 2 key/value heads whose keys are their values (k_eq_v).
    "google/gemma-4-26B-A4B": {
        **_GEMMA_4,
        "text_config": {
            **_TEXT,
            "attention_k_eq_v": True,
            "enable_moe_block": True,
            "hidden_size": 2816,
            "hidden_size_per_layer_input": 0,
            "intermediate_size": 2112,
            "layer_types": _SLIDING_5_TO_1 * 5,
            "max_position_embeddings": 262144,
            "moe_intermediate_size": 704,
            "num_attention_heads": 16,
            "num_experts": 128,
            "num_global_key_value_heads": 2,
            "num_hidden_layers": 30,
            "num_key_value_heads": 8,
            "num_kv_shared_layers": 0,
            "sliding_window": 1024,
            "top_k_experts": 8,
            "use_bidirectional_attention": "vision",
        },
        "vision_config": _LARGE_VISION,
    },
    # gemma-4-31b: 60 dense layers of 5376 (MLP 4 x 5376), 16 key/value heads (4 on the global
    # layers, k_eq_v), a 1024-token window.
    "google/gemma-4-31B": {
        **_GEMMA_4,
        "text_config": {
            **_TEXT,
            "attention_k_eq_v": True,
            "hidden_size": 5376,
            "hidden_size_per_layer_input": 0,
            "intermediate_size": 21504,
            "layer_types": _SLIDING_5_TO_1 * 10,
            "max_position_embeddings": 262144,
            "num_attention_heads": 32,
            "num_global_key_value_heads": 4,
            "num_hidden_layers": 60,
            "num_key_value_heads": 16,
            "num_kv_shared_layers": 0,
            "sliding_window": 1024,
            "use_bidirectional_attention": "vision",
        },
        "vision_config": _LARGE_VISION,
    },
    # gemma-4-12b (model_type gemma4_unified, "Gemma 4 Unified"): transformers' own converter,
    # src/transformers/models/gemma4_unified/convert_gemma4_unified_weights.py ``_VARIANTS``
    # ("gemma-4-12b", GitHub huggingface/transformers main, read 2026-11-28; its docstring converts
    # google/gemma-4-12B-it with it): 48 dense layers of 3840 (MLP 4 x 3840), 16 heads, 8 key/value
    # heads on the sliding layers and one on the global ones (k_eq_v), the 5:1 pattern, no vision or
    # audio tower (``_DEFAULT_VISION_CONFIG`` / ``_DEFAULT_AUDIO_CONFIG``: Gemma4UnifiedVisionConfig's
    # and Gemma4UnifiedAudioConfig's defaults, patch embedders projecting straight into the decoder);
    # everything else Gemma4UnifiedTextConfig's and Gemma4UnifiedConfig's defaults
    # (configuration_gemma4_unified.py: head_dim 256, global_head_dim 512, a 1024-token window,
    # 262144 positions and vocabulary, its token ids). bfloat16 (the converter's --text_dtype default).
    "google/gemma-4-12B-it": {
        "model_type": "gemma4_unified",
        "architectures": ["Gemma4UnifiedForConditionalGeneration"],
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "text_config": {
            "model_type": "gemma4_unified_text",
            "attention_k_eq_v": True,
            "final_logit_softcapping": 30.0,
            "hidden_size": 3840,
            "intermediate_size": 15360,  # 4 * 3840
            "layer_types": _SLIDING_5_TO_1 * 8,
            "num_attention_heads": 16,
            "num_global_key_value_heads": 1,
            "num_hidden_layers": 48,
            "num_key_value_heads": 8,
            "num_kv_shared_layers": 0,
            "rope_parameters": _ROPE,
            "use_bidirectional_attention": "vision",
            "use_double_wide_mlp": False,
        },
        "vision_config": {"model_type": "gemma4_unified_vision"},
        "audio_config": {"model_type": "gemma4_unified_audio"},
    },
}
