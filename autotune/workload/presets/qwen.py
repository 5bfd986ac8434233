"""Qwen presets: Qwen2.5 and Qwen3 (dense). The Qwen3 mixtures of experts, on the dense base
``_QWEN_3``, are in moe.py."""

from __future__ import annotations

from typing import Any

_QWEN_2_5 = {
    "model_type": "qwen2",
    "architectures": ["Qwen2ForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151643,
    "hidden_act": "silu",
    "initializer_range": 0.02,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "use_mrope": False,
    "use_sliding_window": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 151936,
}
# Qwen3 dense (Qwen/Qwen3-0.6B ... 32B, config.json as published; the 0.6B and 1.7B copied in
# mlc-ai/mlc-llm python/mlc_llm/model/model_preset.py, the 4B to 32B in citsjtu2020/LLM-Prof
# sglang/Model_Config.md, the shapes also in pytorch/torchtune torchtune/models/qwen3/_model_builders.py).
# Qwen2's blocks with an RMSNorm on each head's query and key (head_dim 128 at every size).
_QWEN_3 = {
    "model_type": "qwen3",
    "architectures": ["Qwen3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "head_dim": 128,
    "hidden_act": "silu",
    "initializer_range": 0.02,
    # The -Base checkpoints say 32768; Qwen3-4B-Instruct-2507 says 262144 (rope_theta 5e6), with
    # the same shapes as Qwen3-4B.
    "max_position_embeddings": 40960,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "sliding_window": None,
    "use_sliding_window": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 151936,
}

QWEN_2_5_PRESETS: dict[str, dict[str, Any]] = {
    "Qwen/Qwen2.5-0.5B": {
        **_QWEN_2_5,
        "hidden_size": 896,
        "intermediate_size": 4864,
        "max_position_embeddings": 32768,
        "max_window_layers": 24,
        "num_attention_heads": 14,
        "num_hidden_layers": 24,
        "num_key_value_heads": 2,
        "sliding_window": 32768,
        "tie_word_embeddings": True,
    },
    "Qwen/Qwen2.5-1.5B": {
        **_QWEN_2_5,
        "hidden_size": 1536,
        "intermediate_size": 8960,
        "max_position_embeddings": 131072,
        "max_window_layers": 28,
        "num_attention_heads": 12,
        "num_hidden_layers": 28,
        "num_key_value_heads": 2,
        "sliding_window": 131072,
        "tie_word_embeddings": True,
    },
    "Qwen/Qwen2.5-3B": {  # config.json in citsjtu2020/LLM-Prof sglang/Model_Config.md
        **_QWEN_2_5,
        "hidden_size": 2048,
        "intermediate_size": 11008,
        "max_position_embeddings": 32768,
        "max_window_layers": 36,
        "num_attention_heads": 16,
        "num_hidden_layers": 36,
        "num_key_value_heads": 2,
        "sliding_window": 32768,
        "tie_word_embeddings": True,
    },
    "Qwen/Qwen2.5-7B": {
        **_QWEN_2_5,
        "hidden_size": 3584,
        "intermediate_size": 18944,
        "max_position_embeddings": 131072,
        "max_window_layers": 28,
        "num_attention_heads": 28,
        "num_hidden_layers": 28,
        "num_key_value_heads": 4,
        "sliding_window": 131072,
        "tie_word_embeddings": False,
        "vocab_size": 152064,
    },
    "Qwen/Qwen2.5-14B": {  # config.json in citsjtu2020/LLM-Prof sglang/Model_Config.md
        **_QWEN_2_5,
        "hidden_size": 5120,
        "intermediate_size": 13824,
        "max_position_embeddings": 131072,
        "max_window_layers": 48,
        "num_attention_heads": 40,
        "num_hidden_layers": 48,
        "num_key_value_heads": 8,
        "rms_norm_eps": 1e-05,
        "sliding_window": 131072,
        "tie_word_embeddings": False,
        "vocab_size": 152064,
    },
    # Qwen2.5-72B: shapes from Lightning-AI/litgpt litgpt/config.py ("Qwen2.5-72B{}", from its
    # config.json: n_layer 80, n_embd 8192, n_head 64, n_query_groups 8, intermediate_size 29568,
    # padded_vocab_size 152064, block_size 131072, norm_eps 1e-5, rope_base 1e6, q/k/v biases); the
    # rest as Qwen2-72B's config.json, which has these shapes, in Girafboy/pytorchKQI
    # example/evaluate.py ("Qwen2_72B": max_window_layers 80, sliding_window 131072, eos 151643).
    "Qwen/Qwen2.5-72B": {
        **_QWEN_2_5,
        "hidden_size": 8192,
        "intermediate_size": 29568,
        "max_position_embeddings": 131072,
        "max_window_layers": 80,
        "num_attention_heads": 64,
        "num_hidden_layers": 80,
        "num_key_value_heads": 8,
        "rms_norm_eps": 1e-05,
        "sliding_window": 131072,
        "tie_word_embeddings": False,
        "vocab_size": 152064,
    },
}

QWEN_3_PRESETS: dict[str, dict[str, Any]] = {
    "Qwen/Qwen3-0.6B": {
        **_QWEN_3,
        "hidden_size": 1024,
        "intermediate_size": 3072,
        "max_window_layers": 28,
        "num_attention_heads": 16,
        "num_hidden_layers": 28,
        "tie_word_embeddings": True,
    },
    "Qwen/Qwen3-1.7B": {
        **_QWEN_3,
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "max_window_layers": 28,
        "num_attention_heads": 16,
        "num_hidden_layers": 28,
        "tie_word_embeddings": True,
    },
    "Qwen/Qwen3-4B": {
        **_QWEN_3,
        "hidden_size": 2560,
        "intermediate_size": 9728,
        "max_window_layers": 36,
        "num_attention_heads": 32,
        "num_hidden_layers": 36,
        "tie_word_embeddings": True,
    },
    "Qwen/Qwen3-8B": {
        **_QWEN_3,
        "hidden_size": 4096,
        "intermediate_size": 12288,
        "max_window_layers": 36,
        "num_attention_heads": 32,
        "num_hidden_layers": 36,
        "tie_word_embeddings": False,
    },
    "Qwen/Qwen3-14B": {
        **_QWEN_3,
        "hidden_size": 5120,
        "intermediate_size": 17408,
        "max_window_layers": 40,
        "num_attention_heads": 40,
        "num_hidden_layers": 40,
        "tie_word_embeddings": False,
    },
    "Qwen/Qwen3-32B": {
        **_QWEN_3,
        "hidden_size": 5120,
        "intermediate_size": 25600,
        "max_window_layers": 64,
        "num_attention_heads": 64,
        "num_hidden_layers": 64,
        "tie_word_embeddings": False,
    },
}
