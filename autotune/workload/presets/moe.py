"""Mixture-of-experts presets: Qwen3-MoE (on Qwen3's dense base, qwen.py), Mixtral, gpt-oss (20b,
120b) and DeepSeek-V2 (Lite, V2.5)."""

from __future__ import annotations

from typing import Any

from autotune.workload.presets.qwen import _QWEN_3

_MIXTRAL = {
    "model_type": "mixtral",
    "architectures": ["MixtralForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "hidden_act": "silu",
    "initializer_range": 0.02,
    "num_experts_per_tok": 2,
    "num_key_value_heads": 8,
    "num_local_experts": 8,
    "output_router_logits": False,
    "rms_norm_eps": 1e-05,
    "rope_theta": 1000000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 32000,
}

QWEN_3_MOE_PRESETS: dict[str, dict[str, Any]] = {
    # Qwen3's mixture of experts: 48 layers of 128 experts, 8 routed per token, no shared expert;
    # config.json in citsjtu2020/LLM-Prof sglang/Model_Config.md. transformers 5 runs the experts
    # with grouped_mm (tokens x 8 rows, static shapes), in training and on fake tensors alike.
    "Qwen/Qwen3-30B-A3B": {
        **_QWEN_3,
        "model_type": "qwen3_moe",
        "architectures": ["Qwen3MoeForCausalLM"],
        "decoder_sparse_step": 1,
        "hidden_size": 2048,
        "intermediate_size": 6144,  # of dense layers, which mlp_only_layers (empty) would name
        "max_window_layers": 48,
        "mlp_only_layers": [],
        "moe_intermediate_size": 768,
        "norm_topk_prob": True,
        "num_attention_heads": 32,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "num_hidden_layers": 48,
        "num_key_value_heads": 4,
        "output_router_logits": False,
        "rope_theta": 1000000.0,
        "router_aux_loss_coef": 0.001,
        "tie_word_embeddings": False,
    },
    # Qwen3-235B-A22B: 94 layers of 128 experts, 8 routed per token. Shapes from Lightning-AI/litgpt
    # litgpt/config.py ("Qwen3-235B-A22B", from its config.json), mapped n_layer -> num_hidden_layers,
    # n_embd -> hidden_size, n_head -> num_attention_heads, n_query_groups -> num_key_value_heads,
    # head_size -> head_dim, padded_vocab_size -> vocab_size, block_size -> max_position_embeddings,
    # rope_base -> rope_theta, norm_eps -> rms_norm_eps, n_expert -> num_experts, n_expert_per_token
    # -> num_experts_per_tok, the two FFN widths as they are; the router keys as in Qwen3-30B-A3B's
    # config.json above (the same Qwen3MoE release). Its -Instruct-2507 has the same shapes (litgpt's
    # "Qwen3-235B-A22B-{}-2507": 262144 positions, rope_theta 5e6).
    "Qwen/Qwen3-235B-A22B": {
        **_QWEN_3,
        "model_type": "qwen3_moe",
        "architectures": ["Qwen3MoeForCausalLM"],
        "decoder_sparse_step": 1,
        "hidden_size": 4096,
        "intermediate_size": 12288,
        "max_window_layers": 94,
        "mlp_only_layers": [],
        "moe_intermediate_size": 1536,
        "norm_topk_prob": True,
        "num_attention_heads": 64,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "num_hidden_layers": 94,
        "num_key_value_heads": 4,
        "output_router_logits": False,
        "router_aux_loss_coef": 0.001,
        "tie_word_embeddings": False,
    },
}

MIXTRAL_PRESETS: dict[str, dict[str, Any]] = {
    # Mixtral (Mistral 7B's blocks, each MLP 8 experts of which 2 are routed per token): the
    # config.json of mistralai/Mixtral-8x7B-v0.1 and of Mixtral-8x22B-v0.1 (its base vocabulary of
    # 32000; the -Instruct's is 32768) in scaleapi/llm-engine
    # model-engine/tests/unit/domain/test_llm_use_cases.py (the "mixtral-8x7b" and "mixtral-8x22b"
    # cases); the 8x7B's also in NVIDIA/TensorRT-LLM tests/unittest/_torch/modeling/test_modeling_mixtral.py
    # and mlc-ai/mlc-llm python/mlc_llm/model/model_preset.py. transformers 5 runs the experts with
    # grouped_mm, as Qwen3's above.
    "mistralai/Mixtral-8x7B-v0.1": {
        **_MIXTRAL,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "max_position_embeddings": 32768,
        "num_attention_heads": 32,
        "num_hidden_layers": 32,
        "router_aux_loss_coef": 0.02,
        "sliding_window": None,
    },
    "mistralai/Mixtral-8x22B-v0.1": {
        **_MIXTRAL,
        "hidden_size": 6144,
        "intermediate_size": 16384,
        "max_position_embeddings": 65536,
        "num_attention_heads": 48,
        "num_hidden_layers": 56,
        "router_aux_loss_coef": 0.001,
        "router_jitter_noise": 0.0,
    },
}

# openai/gpt-oss-20b's config.json, in EchoCog/gpt-oss-20b config.json (its sizes also in
# ParagEkbote/hf-model-inspector model_inspection_report.md): 24 layers of 32 experts, 4 routed
# per token, attention alternating between a 128-token window and the full context. Its
# quantization_config (the experts in MXFP4) is left out: autotune models the weights as loaded
# for training. The config.json names no dtype; the unquantized weights are stored in bfloat16
# and the experts dequantize to it, so bfloat16 is the dtype from_pretrained gives it.
_GPT_OSS_20B: dict[str, Any] = {
    "model_type": "gpt_oss",
    "architectures": ["GptOssForCausalLM"],
    "attention_bias": True,
    "attention_dropout": 0.0,
    "eos_token_id": 200002,
    "experts_per_token": 4,
    "head_dim": 64,
    "hidden_act": "silu",
    "hidden_size": 2880,
    "initial_context_length": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 2880,
    "layer_types": ["sliding_attention", "full_attention"] * 12,
    "max_position_embeddings": 131072,
    "num_attention_heads": 64,
    "num_experts_per_tok": 4,
    "num_hidden_layers": 24,
    "num_key_value_heads": 8,
    "num_local_experts": 32,
    "output_router_logits": False,
    "pad_token_id": 199999,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "factor": 32.0,
        "original_max_position_embeddings": 4096,
        "rope_type": "yarn",
        "truncate": False,
    },
    "rope_theta": 150000,
    "router_aux_loss_coef": 0.9,
    "sliding_window": 128,
    "swiglu_limit": 7.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 201088,
}

# deepseek-ai/DeepSeek-V2-Lite's config.json, in mlc-ai/mlc-llm python/mlc_llm/model/model_preset.py
# ("deepseek_v2_lite"): multi-head latent attention (keys and values through a 512-wide
# projection), 26 of its 27 layers of 64 routed experts (6 per token) and 2 shared ones. The
# copy leaves out the checkpoint's "q_lora_rank": null (queries not compressed), which
# mlc-llm's DeepseekV2Config defaults to None (python/mlc_llm/model/deepseek_v2/deepseek_v2_model.py);
# transformers' default (1536) would add a query projection the model does not have.
_DEEPSEEK_V2_LITE: dict[str, Any] = {
    "model_type": "deepseek_v2",
    "architectures": ["DeepseekV2ForCausalLM"],
    "attention_bias": False,
    "bos_token_id": 100000,
    "eos_token_id": 100001,
    "first_k_dense_replace": 1,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "initializer_range": 0.02,
    "intermediate_size": 10944,
    "kv_lora_rank": 512,
    "max_position_embeddings": 163840,
    "moe_intermediate_size": 1408,
    "moe_layer_freq": 1,
    "n_group": 1,
    "n_routed_experts": 64,
    "n_shared_experts": 2,
    "norm_topk_prob": False,
    "num_attention_heads": 16,
    "num_experts_per_tok": 6,
    "num_hidden_layers": 27,
    "num_key_value_heads": 16,
    "pretraining_tp": 1,
    "q_lora_rank": None,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "rms_norm_eps": 1e-06,
    "rope_scaling": {
        "beta_fast": 32,
        "beta_slow": 1,
        "factor": 40,
        "mscale": 0.707,
        "mscale_all_dim": 0.707,
        "original_max_position_embeddings": 4096,
        "type": "yarn",
    },
    "rope_theta": 10000,
    "routed_scaling_factor": 1.0,
    "scoring_func": "softmax",
    "topk_group": 1,
    "topk_method": "greedy",
    "torch_dtype": "bfloat16",
    "v_head_dim": 128,
    "vocab_size": 102400,
}

GPT_OSS_DEEPSEEK_PRESETS: dict[str, dict[str, Any]] = {
    "openai/gpt-oss-20b": _GPT_OSS_20B,
    "deepseek-ai/DeepSeek-V2-Lite": _DEEPSEEK_V2_LITE,
    # openai/gpt-oss-120b: the 20b's blocks, 36 layers of 128 experts (4 routed per token): OpenAI's
    # reference implementation, openai/gpt-oss gpt_oss/torch/model.py ModelConfig (its defaults are the
    # 120b's: num_hidden_layers 36, num_experts 128, and the 20b's widths, heads, window, vocabulary and
    # rope as in the config.json above). Every other key as the 20b's config.json (one release; the
    # README's "117B parameters with 5.1B active"). Axolotl trains its bfloat16 copy,
    # axolotl-ai-co/gpt-oss-120b-dequantized.
    "openai/gpt-oss-120b": {
        **_GPT_OSS_20B,
        "layer_types": ["sliding_attention", "full_attention"] * 18,
        "num_hidden_layers": 36,
        "num_local_experts": 128,
    },
    # deepseek-ai/DeepSeek-V2.5 (DeepSeek-V2-Chat and DeepSeek-Coder-V2-Instruct merged: the 236B
    # DeepSeek-V2's shapes): DeepSeek's own table of them, deepseek-ai/DeepSeek-V3
    # inference/configs/config_236B.json, mapped dim -> hidden_size, inter_dim -> intermediate_size,
    # moe_inter_dim -> moe_intermediate_size, n_layers -> num_hidden_layers, n_dense_layers ->
    # first_k_dense_replace, n_heads -> num_attention_heads (and num_key_value_heads: MLA keeps a key
    # and a value per head), n_activated_experts -> num_experts_per_tok, n_expert_groups -> n_group,
    # n_limited_groups -> topk_group (group_limited_greedy routing), route_scale ->
    # routed_scaling_factor, the MLA ranks and head widths as they are. Queries are compressed here
    # (q_lora_rank 1536), unlike the Lite's. The rest (vocabulary, rope, norm, token ids) as the Lite's
    # config.json above, one release; the rope keys' mscale changes no tensor. transformers'
    # DeepseekV2ForCausalLM is what is built: with trust_remote_code the checkpoint's own
    # modeling_deepseek.py (its auto_map) runs instead, experts as nn.Linear modules (not modelled here).
    "deepseek-ai/DeepSeek-V2.5": {
        **_DEEPSEEK_V2_LITE,
        "hidden_size": 5120,
        "intermediate_size": 12288,
        "moe_intermediate_size": 1536,
        "n_group": 8,
        "n_routed_experts": 160,
        "num_attention_heads": 128,
        "num_hidden_layers": 60,
        "num_key_value_heads": 128,
        "q_lora_rank": 1536,
        "routed_scaling_factor": 16.0,
        "topk_group": 3,
        "topk_method": "group_limited_greedy",
    },
}
