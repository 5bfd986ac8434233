"""Falcon-H1 presets (model_type falcon_h1): a Mamba-2 mixer and an attention in parallel in every
layer, then a SwiGLU MLP, with muP multipliers (which shape no tensor).

Each config.json as a public copy of it gives it (cited beside each preset); the architecture table
of transformers' docs (model_doc/falcon_h1.md: depth, width, heads, Mamba heads, head dims, state)
agrees with both. The 1.5B, 1.5B-Deep, 3B and 7B are left out: no public copy of their config.json
was found whole (their widths are in that table, their MLP widths, vocabularies, Mamba groups and
gated-norm settings are not).
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
}
