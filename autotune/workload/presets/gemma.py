"""Gemma presets: Gemma 2, and Gemma 3's text-only checkpoints (270M, 1B; from 4B up, with their
vision tower, they are in vision.py)."""

from __future__ import annotations

from typing import Any

_GEMMA_2 = {
    "model_type": "gemma2",
    "architectures": ["Gemma2ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "attn_logit_softcapping": 50.0,
    "bos_token_id": 2,
    "cache_implementation": "hybrid",
    "eos_token_id": 1,
    "final_logit_softcapping": 30.0,
    "head_dim": 256,
    "hidden_act": "gelu_pytorch_tanh",
    "hidden_activation": "gelu_pytorch_tanh",
    "initializer_range": 0.02,
    "max_position_embeddings": 8192,
    "pad_token_id": 0,
    "query_pre_attn_scalar": 256,
    "rms_norm_eps": 1e-06,
    "rope_theta": 10000.0,
    # Alternating layers: sliding (4096-token window) and global attention.
    "sliding_window": 4096,
    # The base checkpoints are published in float32 (their -it siblings in bfloat16).
    "torch_dtype": "float32",
    "vocab_size": 256000,
}
# Gemma 3 text-only checkpoints (gemma3_text): five sliding-window layers (512 tokens) to each
# global one, a norm on each head's query and key, one key/value head. Shapes from transformers'
# src/transformers/models/gemma3/convert_gemma3_weights.py (the variants gemma3_270m and gemma3_1b,
# which wrote these checkpoints, in bfloat16 by default); the 1B's config.json as published for
# gemma-3-1b-it (same shapes as -pt) in mlc-ai/mlc-llm python/mlc_llm/model/model_preset.py.
# Token ids left at Gemma3TextConfig's defaults (pad 0, eos 1, bos 2), the pretrained ones.
_GEMMA_3_TEXT = {
    "model_type": "gemma3_text",
    "architectures": ["Gemma3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "attn_logit_softcapping": None,
    "final_logit_softcapping": None,
    "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh",
    "initializer_range": 0.02,
    "max_position_embeddings": 32768,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "query_pre_attn_scalar": 256,
    "rms_norm_eps": 1e-06,
    "rope_local_base_freq": 10000.0,  # the sliding layers' rotary base; rope_theta the global ones'
    "rope_scaling": None,
    "rope_theta": 1000000.0,
    "sliding_window": 512,
    "sliding_window_pattern": 6,  # transformers 5 turns it into layer_types
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "vocab_size": 262144,
}

GEMMA_PRESETS: dict[str, dict[str, Any]] = {
    "google/gemma-2-2b": {
        **_GEMMA_2,
        "hidden_size": 2304,
        "intermediate_size": 9216,
        "num_attention_heads": 8,
        "num_hidden_layers": 26,
        "num_key_value_heads": 4,
    },
    # google/gemma-2-9b's config.json, in Girafboy/pytorchKQI example/evaluate.py.
    "google/gemma-2-9b": {
        **_GEMMA_2,
        "hidden_size": 3584,
        "intermediate_size": 14336,
        "num_attention_heads": 16,
        "num_hidden_layers": 42,
        "num_key_value_heads": 8,
        "sliding_window_size": 4096,
    },
    "google/gemma-3-270m": {
        **_GEMMA_3_TEXT,
        "hidden_size": 640,
        "intermediate_size": 2048,
        "num_hidden_layers": 18,
    },
    "google/gemma-3-1b-pt": {
        **_GEMMA_3_TEXT,
        "hidden_size": 1152,
        "intermediate_size": 6912,
        "num_hidden_layers": 26,
    },
}
