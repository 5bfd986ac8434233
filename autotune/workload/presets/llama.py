"""Llama presets: Llama 3, and the checkpoints built of its blocks: Apertus (with llama3 rope
scaling) and SmolLM2."""

from __future__ import annotations

from typing import Any

_LLAMA_3 = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
    "hidden_act": "silu",
    "initializer_range": 0.02,
    "max_position_embeddings": 131072,
    "mlp_bias": False,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0,
    "torch_dtype": "bfloat16",
    "vocab_size": 128256,
}
_LLAMA_3_ROPE = {  # "llama3" frequency scaling from an 8192-token original context
    "high_freq_factor": 4.0,
    "low_freq_factor": 1.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3",
}
_LLAMA_3_2 = {
    **_LLAMA_3,
    "intermediate_size": 8192,
    "rope_scaling": {"factor": 32.0, **_LLAMA_3_ROPE},
    "tie_word_embeddings": True,
}
# SmolLM2 (HuggingFaceTB/SmolLM2-135M, -360M, -1.7B): Llama blocks, tied embeddings, 8192
# positions. Shapes in Lightning-AI/litgpt litgpt/config.py and, as the -Instruct config.json
# (same shapes), mlc-ai/mlc-llm python/mlc_llm/model/model_preset.py.
_SMOLLM2 = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "hidden_act": "silu",
    "max_position_embeddings": 8192,
    "mlp_bias": False,
    "rms_norm_eps": 1e-05,
    "rope_scaling": None,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "vocab_size": 49152,
}

LLAMA_3_PRESETS: dict[str, dict[str, Any]] = {
    "meta-llama/Llama-3.2-1B": {
        **_LLAMA_3_2,
        "head_dim": 64,
        "hidden_size": 2048,
        "num_attention_heads": 32,
        "num_hidden_layers": 16,
    },
    "meta-llama/Llama-3.2-3B": {
        **_LLAMA_3_2,
        "head_dim": 128,
        "hidden_size": 3072,
        "num_attention_heads": 24,
        "num_hidden_layers": 28,
    },
    "meta-llama/Llama-3.1-8B": {
        **_LLAMA_3,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_attention_heads": 32,
        "num_hidden_layers": 32,
        "rope_scaling": {"factor": 8.0, **_LLAMA_3_ROPE},
        "tie_word_embeddings": False,
    },
    # meta-llama/Meta-Llama-3-70B's config.json in scaleapi/llm-engine
    # model-engine/tests/unit/domain/test_llm_use_cases.py (the "llama-3-70b" case): Llama 3's 8192
    # positions without rope scaling (3.1 added it); shapes also in Lightning-AI/litgpt
    # litgpt/config.py ("Llama-3-70B{}").
    "meta-llama/Meta-Llama-3-70B": {
        **_LLAMA_3,
        "hidden_size": 8192,
        "intermediate_size": 28672,
        "max_position_embeddings": 8192,
        "num_attention_heads": 64,
        "num_hidden_layers": 80,
        "rope_scaling": None,
        "tie_word_embeddings": False,
    },
    # meta-llama/Llama-3.1-405B (Meta-Llama-3.1-405B until late 2024): its config.json's shapes in
    # Lightning-AI/litgpt litgpt/config.py ("Llama-3.1-405B{}", citing the hub's config.json), mapped as
    # the 70B's above (n_layer -> num_hidden_layers, n_embd -> hidden_size, n_head ->
    # num_attention_heads, n_query_groups -> num_key_value_heads, padded_vocab_size -> vocab_size,
    # block_size -> max_position_embeddings, rope_base -> rope_theta, rope_adjustments -> the llama3
    # rope scaling); the rest as Llama 3.1 8B's (one release). Axolotl's qlora-fsdp-405b trains
    # hugging-quants' bnb-nf4 copy of it (configs/axolotl.py reads that name as 4-bit).
    "meta-llama/Llama-3.1-405B": {
        **_LLAMA_3,
        "hidden_size": 16384,
        "intermediate_size": 53248,
        "num_attention_heads": 128,
        "num_hidden_layers": 126,
        "rope_scaling": {"factor": 8.0, **_LLAMA_3_ROPE},
        "tie_word_embeddings": False,
    },
}

APERTUS_PRESETS: dict[str, dict[str, Any]] = {
    # swiss-ai/Apertus-8B-Instruct-2509 (same shapes as its base, Apertus-8B-2509): the config.json in
    # ollama/ollama's MLX runner tests (x/mlxrunner/model/apertus, TestParseConfigApertus8B). Llama
    # blocks with a norm on each head's query and key and an ungated MLP (up and down projections
    # around the xIELU activation); llama3 rope scaling from 8192 to 65536 positions. Its token ids
    # are not confirmed here and stay at ApertusConfig's defaults.
    "swiss-ai/Apertus-8B-Instruct-2509": {
        "model_type": "apertus",
        "architectures": ["ApertusForCausalLM"],
        "attention_bias": False,
        "hidden_act": "xielu",
        "hidden_size": 4096,
        "intermediate_size": 21504,
        "max_position_embeddings": 65536,
        "mlp_bias": False,
        "num_attention_heads": 32,
        "num_hidden_layers": 32,
        "num_key_value_heads": 8,
        "post_norm": False,
        "qk_norm": True,
        "rms_norm_eps": 1e-05,
        "rope_scaling": {"factor": 8.0, **_LLAMA_3_ROPE},
        "rope_theta": 12000000,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "vocab_size": 131072,
    },
}

SMOLLM2_PRESETS: dict[str, dict[str, Any]] = {
    # SmolLM2-135M's base config.json (bos and eos 0) is quoted in several repositories; the
    # larger two's token ids are not confirmed here and stay at LlamaConfig's defaults.
    "HuggingFaceTB/SmolLM2-135M": {
        **_SMOLLM2,
        "bos_token_id": 0,
        "eos_token_id": 0,
        "hidden_size": 576,
        "initializer_range": 0.041666666666666664,
        "intermediate_size": 1536,
        "num_attention_heads": 9,
        "num_hidden_layers": 30,
        "num_key_value_heads": 3,
        "rope_theta": 100000,
    },
    "HuggingFaceTB/SmolLM2-360M": {
        **_SMOLLM2,
        "hidden_size": 960,
        "initializer_range": 0.02,
        "intermediate_size": 2560,
        "num_attention_heads": 15,
        "num_hidden_layers": 32,
        "num_key_value_heads": 5,
        "rope_theta": 100000,
    },
    "HuggingFaceTB/SmolLM2-1.7B": {
        **_SMOLLM2,
        "hidden_size": 2048,
        "initializer_range": 0.02,
        "intermediate_size": 8192,
        "num_attention_heads": 32,
        "num_hidden_layers": 24,
        "num_key_value_heads": 32,
        "rope_theta": 130000,
    },
}
