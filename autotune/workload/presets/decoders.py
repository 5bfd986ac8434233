"""Decoder presets of the families with one or two checkpoints here: GPT-2, Mistral 7B and
Devstral (Mistral Small 3), Seed-OSS. Llama, Qwen, Gemma and Phi have their own modules, the
mixtures of experts (Mixtral among them) moe.py."""

from __future__ import annotations

from typing import Any

_GPT2 = {
    "model_type": "gpt2",
    "activation_function": "gelu_new",
    "n_embd": 768,
    "n_layer": 12,
    "n_head": 12,
    "n_positions": 1024,
    "n_ctx": 1024,
    "attn_pdrop": 0.1,
    "embd_pdrop": 0.1,
    "resid_pdrop": 0.1,
    "layer_norm_epsilon": 1e-05,
    "initializer_range": 0.02,
    "bos_token_id": 50256,
    "eos_token_id": 50256,
    "vocab_size": 50257,
}

GPT2_PRESETS: dict[str, dict[str, Any]] = {
    "gpt2": _GPT2,
    "gpt2-medium": {**_GPT2, "n_embd": 1024, "n_layer": 24, "n_head": 16},
}

MISTRAL_PRESETS: dict[str, dict[str, Any]] = {
    "mistralai/Mistral-7B-v0.3": {
        "model_type": "mistral",
        "architectures": ["MistralForCausalLM"],
        "attention_dropout": 0.0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "hidden_act": "silu",
        "hidden_size": 4096,
        "initializer_range": 0.02,
        "intermediate_size": 14336,
        "max_position_embeddings": 32768,
        "num_attention_heads": 32,
        "num_hidden_layers": 32,
        "num_key_value_heads": 8,
        "rms_norm_eps": 1e-05,
        "rope_theta": 1000000.0,
        "sliding_window": None,  # v0.3 dropped v0.1's 4096-token window
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "vocab_size": 32768,
    },
    # Mistral Small 3 (24B; Devstral-Small-2507 is a fine-tune of Mistral-Small-3.1's text model):
    # mistralai/Devstral-Small-2507's params.json (Mistral's own format) and model.safetensors.index.json,
    # in fetchwiki/mistralai-Devstral-Small-2507, mapped dim -> hidden_size, n_layers ->
    # num_hidden_layers, hidden_dim -> intermediate_size, n_heads -> num_attention_heads, n_kv_heads ->
    # num_key_value_heads, norm_eps -> rms_norm_eps, the rest by name. The index says 23,572,403,200
    # parameters in 47,144,806,400 bytes (bfloat16) with lm_head apart from embed_tokens (untied).
    # params.json names no context length: 131072 is the 128k window of the model card.
    "mistralai/Devstral-Small-2507": {
        "model_type": "mistral",
        "architectures": ["MistralForCausalLM"],
        "attention_dropout": 0.0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "head_dim": 128,
        "hidden_act": "silu",
        "hidden_size": 5120,
        "initializer_range": 0.02,
        "intermediate_size": 32768,
        "max_position_embeddings": 131072,
        "num_attention_heads": 32,
        "num_hidden_layers": 40,
        "num_key_value_heads": 8,
        "rms_norm_eps": 1e-05,
        "rope_theta": 1000000000.0,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "vocab_size": 131072,
    },
}

SEED_OSS_PRESETS: dict[str, dict[str, Any]] = {
    # ByteDance-Seed/Seed-OSS-36B-Instruct: the model card (ByteDance-Seed/seed-oss README.md, "Model
    # Summary": 64 layers, 80 / 8 / 8 query/key/value heads of 128 on a 5120 width, 155K vocabulary,
    # 512K context, rope base 1e7) and its config.json as copied in a Seed-OSS loader's tests (an MLX
    # port's SEED_OSS_36B_CONFIG, "mirrors the real checkpoint's config.json"): intermediate 27648,
    # vocab 155136, 524288 positions, q/k/v biases but none on o. Its dropouts (attention and
    # residual, 0.1: masks kept for the backward) are SeedOssConfig's defaults, documented as this
    # checkpoint's (transformers' configuration_seed_oss.py); bfloat16, the card's serving dtype.
    "ByteDance-Seed/Seed-OSS-36B-Instruct": {
        "model_type": "seed_oss",
        "architectures": ["SeedOssForCausalLM"],
        "attention_bias": True,
        "attention_dropout": 0.1,
        "attention_out_bias": False,
        "head_dim": 128,
        "hidden_act": "silu",
        "hidden_size": 5120,
        "intermediate_size": 27648,
        "max_position_embeddings": 524288,
        "mlp_bias": False,
        "num_attention_heads": 80,
        "num_hidden_layers": 64,
        "num_key_value_heads": 8,
        "residual_dropout": 0.1,
        "rms_norm_eps": 1e-06,
        "rope_theta": 10000000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "vocab_size": 155136,
    },
}
