"""Kimi Linear (model_type kimi_linear): Kimi Delta Attention (KDA, a gated delta rule with a
per-channel decay) in 20 of 27 layers, MLA in the others, a mixture of 256 experts (8 routed, one
shared) in every layer but the first.

Axolotl's examples/kimi-linear/kimi-48b-lora.yaml names moonshotai/Kimi-Linear-48B-A3B-Instruct. Its
KDA layers run flash-linear-attention's Triton kernels on a GPU, which autotune refuses by name until
they are emulated (workload/kimi_delta_attention.py ``check_kernels``).
"""

from __future__ import annotations

from typing import Any

KIMI_LINEAR_PRESETS: dict[str, dict[str, Any]] = {
    # A Rust engine's test fixture of "the released 48B config" (public copy: find_string id
    # 68953713753, ``released_48b_config_parses_with_one_based_layer_map``), every key as it gives it.
    # kda_layers, which it leaves out, are the other layers, 1-based as the checkpoint numbers them (a
    # conversion preflight test's KDA list, id 60758563596; transformers' KimiLinearConfig reads the
    # layer types from both lists). The context (model_max_length 1048576) is transformers' default,
    # the docstring checkpoint of configuration_kimi_linear.py being this one. bfloat16: "about 96 GB of
    # BF16 weights" (a model survey's note, find_string id 59772091839).
    "moonshotai/Kimi-Linear-48B-A3B-Instruct": {
        "model_type": "kimi_linear",
        "architectures": ["KimiLinearForCausalLM"],
        "eos_token_id": 163586,
        "first_k_dense_replace": 1,
        "hidden_act": "silu",
        "hidden_size": 2304,
        "intermediate_size": 9216,
        "kv_lora_rank": 512,
        "linear_attn_config": {
            "full_attn_layers": [4, 8, 12, 16, 20, 24, 27],
            "kda_layers": [1, 2, 3, 5, 6, 7, 9, 10, 11, 13, 14, 15, 17, 18, 19, 21, 22, 23, 25, 26],
            "head_dim": 128,
            "num_heads": 32,
            "short_conv_kernel_size": 4,
        },
        "mla_use_nope": True,
        "model_max_length": 1048576,
        "moe_intermediate_size": 1024,
        "moe_layer_freq": 1,
        "moe_renormalize": True,
        "moe_router_activation_func": "sigmoid",
        "num_attention_heads": 32,
        "num_expert_group": 1,
        "num_experts": 256,
        "num_experts_per_token": 8,
        "num_hidden_layers": 27,
        "num_shared_experts": 1,
        "q_lora_rank": None,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "rms_norm_eps": 1e-05,
        "routed_scaling_factor": 2.446,
        "tie_word_embeddings": False,
        "topk_group": 1,
        "torch_dtype": "bfloat16",
        "v_head_dim": 128,
        "vocab_size": 163840,
    },
}
