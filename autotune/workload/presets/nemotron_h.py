"""NVIDIA Nemotron 3 presets (model_type nemotron_h): Mamba-2 mixers, mixtures of experts and a few
attention layers, each layer one of them (``hybrid_override_pattern``: M Mamba-2, E experts, *
attention), the experts' MLPs squared-ReLU (relu2) and not gated, one shared expert beside them.

Each config.json as a public copy of it gives it (cited beside each preset); the keys that shape no
tensor (token ids, dropout, init, cache dtype) are left out. transformers' NemotronHConfig reads the
legacy ``hybrid_override_pattern`` into ``layers_block_type`` (configuration_nemotron_h.py). Published
totals: Nano's model card, "31.6B total parameters"; Super's BF16 safetensors headers (as the
model page https://huggingface.co/nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-BF16 lists them, and as a
public model-size parser's test copies them: "BF16 weights 123,611,012,096; MTP 2,942,324,736"; that
test's repository and path are not locatable by search), of which transformers' NemotronHForCausalLM
builds all but the multi-token-prediction layer (num_nextn_predict_layers: an inference draft head,
no module of the training model): 120,668,687,360; tests/autotune/workload/test_presets_nemotron_h.py.

The Mamba-2 mixers are traced through transformers' torch path (workload/mamba_mixer.py), as
Falcon-H1's.
"""

from __future__ import annotations

from typing import Any

# The keys both copies below give the same value.
_NEMOTRON_3 = {
    "model_type": "nemotron_h",
    "architectures": ["NemotronHForCausalLM"],
    "attention_bias": False,
    "chunk_size": 128,
    "conv_kernel": 4,
    "expand": 2,
    "head_dim": 128,
    "layer_norm_epsilon": 1e-05,
    "mamba_head_dim": 64,
    "mamba_hidden_act": "silu",
    "mamba_proj_bias": False,
    "max_position_embeddings": 262144,
    "mlp_bias": False,
    "mlp_hidden_act": "relu2",
    "n_group": 1,
    "n_groups": 8,
    "n_shared_experts": 1,
    "norm_eps": 1e-05,
    "norm_topk_prob": True,
    "num_attention_heads": 32,
    "num_key_value_heads": 2,
    "partial_rotary_factor": 1.0,
    "residual_in_fp32": False,
    "rope_theta": 10000,
    "ssm_state_size": 128,
    "tie_word_embeddings": False,
    "time_step_floor": 0.0001,
    "time_step_max": 0.1,
    "time_step_min": 0.001,
    "topk_group": 1,
    "torch_dtype": "bfloat16",
    "use_bias": False,
    "use_conv_bias": True,
    "vocab_size": 131072,
}

NEMOTRON_H_PRESETS: dict[str, dict[str, Any]] = {
    # mehulbafnaa/jax-llm-examples (a fork of jax-ml/jax-llm-examples) nemotron3/tests/test_model.py
    # NEMOTRON3_30B_JSON copies the BF16 checkpoint's config.json whole (its auto_map and
    # transformers_version 4.55.4 with it); Rust ports' test fixtures repeat its widths, experts and
    # pattern. 52 layers: 23 Mamba-2, 23 of 128 experts (6 routed a token), 6 attention.
    "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16": {
        **_NEMOTRON_3,
        "hidden_size": 2688,
        "hybrid_override_pattern": "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME",
        "intermediate_size": 1856,
        "mamba_num_heads": 64,
        "moe_intermediate_size": 1856,
        "moe_shared_expert_intermediate_size": 3712,
        "n_routed_experts": 128,
        "num_experts_per_tok": 6,
        "num_hidden_layers": 52,
        "routed_scaling_factor": 2.5,
    },
    # https://huggingface.co/nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-NVFP4/blob/4f0cf9da/config.json,
    # as a public C++ test header's kSuperConfig transcribes it (the header names that commit; its
    # repository and path are not locatable by search; every key here checked against it), the
    # architecture the BF16 checkpoint shares, its quantization_config apart; the parameter-count test
    # above repeats its pattern and sizes. 88 layers: 40 Mamba-2, 40 of
    # 512 experts (22 routed a token) behind LatentMoE's 1024-wide projections, 8 attention.
    "nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-BF16": {
        **_NEMOTRON_3,
        "hidden_size": 4096,
        "hybrid_override_pattern": "MEMEMEM*EMEMEMEM*EMEMEMEM*EMEMEMEMEM*EMEMEMEMEM*EMEMEMEMEM*EMEMEMEMEM*"
                                   "EMEMEMEM*EMEMEMEME",
        "intermediate_size": 2688,
        "mamba_num_heads": 128,
        "moe_intermediate_size": 2688,
        "moe_latent_size": 1024,
        "moe_shared_expert_intermediate_size": 5376,
        "moe_shared_expert_overlap": False,
        "mtp_hybrid_override_pattern": "*E",
        "n_routed_experts": 512,
        "num_experts_per_tok": 22,
        "num_hidden_layers": 88,
        "num_nextn_predict_layers": 1,
        "routed_scaling_factor": 5.0,
    },
}
