"""Falcon-H1 presets (model_type falcon_h1): a Mamba-2 mixer and an attention in parallel in every
layer, then a SwiGLU MLP, with muP multipliers (which shape no tensor).

Each config.json as a public copy of it gives it (cited beside each preset); the architecture table
of transformers' docs (model_doc/falcon_h1.md: depth, width, heads, Mamba heads, head dims, state)
agrees with every one. The 1.5B, 3B and 7B are copied by test fixtures that give the keys that size
a tensor (widths, heads, MLP, vocabulary, Mamba groups, state, conv); the keys those fixtures leave
out and 0.5B's and 34B's config.json share (biases, chunk size, expansion, the gate's order) are
taken at that shared value, and their per-size muP multipliers (key, MLP, SSM, output), which
scale values and shape no tensor, at transformers' defaults (configuration_falcon_h1.py).
The 1.5B-Deep is left out: no public copy of its MLP width or Mamba groups was found (only its
depth 66, width 1280, heads, vocabulary 65536 and untied head); solving them from its published
total would make the count check circular.
"""

from __future__ import annotations

from typing import Any

# The keys both copies below share with the same value.
_FALCON_H1 = {
    "model_type": "falcon_h1",
    "architectures": ["FalconH1ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "attention_in_multiplier": 1.0,
    "attn_layer_indices": None,
    "embedding_multiplier": 5.656854249492381,
    "hidden_act": "silu",
    "initializer_range": 0.02,
    "mamba_chunk_size": 128,
    "mamba_conv_bias": True,
    "mamba_d_conv": 4,
    "mamba_expand": 2,
    "mamba_norm_before_gate": False,
    "mamba_proj_bias": False,
    "mamba_use_mlp": True,
    "mlp_bias": False,
    "projectors_bias": False,
    "rms_norm_eps": 1e-05,
    "rope_scaling": None,
    "rope_theta": 100000000000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}

# The keys the fixtures below leave out (the 0.5B's and 34B's shared value, _FALCON_H1) and the gated
# RMSNorm after the scan: nnterp's Falcon-H1 family notes (nnterp/families/falcon_h1.py NOTES, written
# from the checkpoints' config.json) give mamba_rms_norm true "on 1.5B, 1.5B-Deep, 3B, 7B, 34B" and
# the lm_head "its own weight on 0.5B to 34B".
# Its embedding multiplier (5.66) and attention input multiplier (1.0) are every checkpoint's too;
# the other multipliers are left at transformers' defaults.
_FALCON_H1_FIXTURE = {**_FALCON_H1, "mamba_rms_norm": True}

FALCON_H1_PRESETS: dict[str, dict[str, Any]] = {
    # NVIDIA-NeMo/Megatron-Bridge tests/unit_tests/models/falcon_h1/test_falconh1_bridge.py
    # FALCON_H1_500M_CONFIG (the 0.5B's config.json, bos/eos/pad ids and mamba_d_ssm left out there).
    "tiiuae/Falcon-H1-0.5B-Base": {
        **_FALCON_H1,
        # 24 Mamba heads of 64 (the docs' table; Megatron-Bridge's megatron_to_hf_config writes
        # mamba_n_heads * mamba_d_head): transformers refuses the default mamba_expand * hidden_size,
        # 2048, which 24 heads do not divide (configuration_falcon_h1.py validate_architecture).
        "mamba_d_ssm": 1536,
        "attention_out_multiplier": 0.9375,
        "head_dim": 64,
        "hidden_size": 1024,
        "intermediate_size": 2048,
        "key_multiplier": 0.39062499999999994,
        "lm_head_multiplier": 0.0390625,
        "mamba_d_head": 64,
        "mamba_d_state": 128,
        "mamba_n_groups": 1,
        "mamba_n_heads": 24,
        "mamba_rms_norm": False,
        "max_position_embeddings": 16384,
        "mlp_multipliers": [0.8838834764831844, 0.5859375],
        "num_attention_heads": 8,
        "num_hidden_layers": 36,
        "num_key_value_heads": 2,
        "ssm_in_multiplier": 1.25,
        "ssm_multipliers": [0.3535533905932738, 0.25, 0.3535533905932738, 0.5, 0.3535533905932738],
        "ssm_out_multiplier": 0.23570226039551587,
        "vocab_size": 32784,
    },
    # Sahil170595/Chimeraforge tests/fixtures/hybrid_configs/tiiuae_Falcon-H1-34B-Instruct.json
    # (the Instruct's config.json, fetched whole; the Base shares its architecture).
    "tiiuae/Falcon-H1-34B-Base": {
        **_FALCON_H1,
        "attention_out_multiplier": 0.0375,
        "bos_token_id": 1,
        "eos_token_id": 11,
        "head_dim": 128,
        "hidden_size": 5120,
        "intermediate_size": 21504,
        "key_multiplier": 0.011048543456039804,
        "lm_head_multiplier": 0.0078125,
        "mamba_d_head": 128,
        "mamba_d_ssm": 4096,
        "mamba_d_state": 256,
        "mamba_n_groups": 2,
        "mamba_n_heads": 32,
        "mamba_rms_norm": True,
        "max_position_embeddings": 262144,
        "mlp_expansion_factor": 8,
        "mlp_multipliers": [0.1767766952966369, 0.011160714285714284],
        "num_attention_heads": 20,
        "num_hidden_layers": 72,
        "num_key_value_heads": 4,
        "pad_token_id": 0,
        "ssm_in_multiplier": 0.25,
        "ssm_multipliers": [0.3535533905932738, 0.25, 0.1767766952966369, 0.5, 0.3535533905932738],
        "ssm_out_multiplier": 0.08838834764831845,
        "vocab_size": 261120,
    },
    # A KV-cache sizing test suite's fixture FALCON_H1 (public copies: find_string ids 71543829462,
    # 60558215653, 70988719928, one suite's three versions): the 1.5B's widths, heads, MLP 4608,
    # vocabulary 65537, one Mamba group of state 256, 48 heads of 64 (mamba_d_ssm 3072). Context
    # 128K: transformers' docs table.
    "tiiuae/Falcon-H1-1.5B-Base": {
        **_FALCON_H1_FIXTURE,
        "head_dim": 128,
        "hidden_size": 2048,
        "intermediate_size": 4608,
        "mamba_d_head": 64,
        "mamba_d_ssm": 3072,
        "mamba_d_state": 256,
        "mamba_n_groups": 1,
        "mamba_n_heads": 48,
        "max_position_embeddings": 131072,
        "num_attention_heads": 8,
        "num_hidden_layers": 24,
        "num_key_value_heads": 2,
        "vocab_size": 65537,
    },
    # A model-matrix test suite's fixture FALCON_H1_3B_HF (public copy: find_string id 65865534003):
    # MLP 6144, vocabulary 65536 untied, one Mamba group, 32 heads of 128, context 131072.
    "tiiuae/Falcon-H1-3B-Base": {
        **_FALCON_H1_FIXTURE,
        "head_dim": 128,
        "hidden_size": 2560,
        "intermediate_size": 6144,
        "mamba_d_head": 128,
        "mamba_d_ssm": 4096,
        "mamba_d_state": 256,
        "mamba_n_groups": 1,
        "mamba_n_heads": 32,
        "max_position_embeddings": 131072,
        "num_attention_heads": 10,
        "num_hidden_layers": 32,
        "num_key_value_heads": 2,
        "vocab_size": 65536,
    },
    # The same suite's FALCON_H1_7B_HF (find_string id 65865534003): MLP 12288, vocabulary 130048
    # untied; an mlx sizing test's copy of Falcon-H1-7B-Instruct-4bit's config.json (id 70958236989)
    # agrees on every key it keeps (depth, heads, widths, Mamba groups, heads, state, context), a
    # dataset generator's test config (id 53924320954) on MLP 12288 and vocabulary 130048 too.
    "tiiuae/Falcon-H1-7B-Base": {
        **_FALCON_H1_FIXTURE,
        "head_dim": 128,
        "hidden_size": 3072,
        "intermediate_size": 12288,
        "mamba_d_head": 128,
        "mamba_d_ssm": 3072,
        "mamba_d_state": 256,
        "mamba_n_groups": 1,
        "mamba_n_heads": 24,
        "max_position_embeddings": 262144,
        "num_attention_heads": 12,
        "num_hidden_layers": 44,
        "num_key_value_heads": 2,
        "vocab_size": 130048,
    },
}
