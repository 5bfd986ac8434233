"""DeepSeek-V3 (model_type deepseek_v3): MLA attention, 256 routed experts and a shared one in all but
the first three layers, sigmoid routing over 8 groups. V3, V3-0324 and V3.1 share these shapes
(DeepSeek's own tables, below); R1 is trained from V3-Base and publishes the same config.json.

transformers' DeepseekV3ForCausalLM is what is built. Its config.json names the checkpoint's own
configuration_deepseek.py and modeling_deepseek.py in an auto_map (workload/remote_code.py
REMOTE_CODE), which a config with trust_remote_code: true would load instead. The checkpoint's one
multi-token-prediction module (num_nextn_predict_layers: 1, model.layers.61: DeepSeek-V3
README_WEIGHTS.md) is not built by transformers (DeepseekV3 modeling: num_hidden_layers layers only;
the MTP weights are dropped on load), so the count is the 671B of the main model.

The hub release is saved in FP8 (its config.json's quantization_config: fp8, e4m3, 128 x 128 blocks, as
the copy below has it); the preset is its bfloat16 conversion (DeepSeek-V3 inference/fp8_cast_bf16.py),
what LLaMA-Factory's KTransformers examples train ("need to convert to BF16 checkpoint first":
examples/ktransformers/train_lora/deepseek_v3_lora_sft_kt.yaml, DeepSeek-V3-0324-BF16).
"""

from __future__ import annotations

from typing import Any

# deepseek-ai/DeepSeek-V3 (github) inference/configs/config_671B.json, DeepSeek's own table of the
# shapes, mapped as for DeepSeek-V2.5 (presets/moe.py): dim 7168 -> hidden_size, inter_dim 18432 ->
# intermediate_size, moe_inter_dim 2048 -> moe_intermediate_size, n_layers 61 -> num_hidden_layers,
# n_dense_layers 3 -> first_k_dense_replace, n_heads 128 -> num_attention_heads (and
# num_key_value_heads: MLA keeps a key and a value per head), n_routed_experts 256, n_shared_experts 1,
# n_activated_experts 8 -> num_experts_per_tok, n_expert_groups 8 -> n_group, n_limited_groups 4 ->
# topk_group, route_scale 2.5 -> routed_scaling_factor, score_func sigmoid -> scoring_func, the MLA
# ranks and head widths as they are, vocabulary 129280; its config_v3.1.json gives V3.1 the same.
# The keys that table has not (context, rope, norm, token ids, noaux_tc routing, the normalised top-k,
# untied head, dtype) as DeepSeek-R1's config.json has them
# (https://huggingface.co/deepseek-ai/DeepSeek-R1/blob/main/config.json, "transformers_version":
# "4.46.3"; checked against a public parameter counter's config_Deepseek_R1 copy, whose repository and
# path are not locatable by search), which agrees on every key of the table. transformers 5 maps
# rope_scaling/rope_theta to rope_parameters.
_DEEPSEEK_V3 = {
    "model_type": "deepseek_v3",
    "architectures": ["DeepseekV3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "first_k_dense_replace": 3,
    "hidden_act": "silu",
    "hidden_size": 7168,
    "initializer_range": 0.02,
    "intermediate_size": 18432,
    "kv_lora_rank": 512,
    "max_position_embeddings": 163840,
    "moe_intermediate_size": 2048,
    "n_group": 8,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "norm_topk_prob": True,
    "num_attention_heads": 128,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 61,
    "num_key_value_heads": 128,
    "q_lora_rank": 1536,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "rms_norm_eps": 1e-06,
    "rope_scaling": {
        "beta_fast": 32,
        "beta_slow": 1,
        "factor": 40,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
        "original_max_position_embeddings": 4096,
        "type": "yarn",
    },
    "rope_theta": 10000,
    "routed_scaling_factor": 2.5,
    "scoring_func": "sigmoid",
    "tie_word_embeddings": False,
    "topk_group": 4,
    "topk_method": "noaux_tc",
    "torch_dtype": "bfloat16",
    "v_head_dim": 128,
    "vocab_size": 129280,
}

DEEPSEEK_V3_PRESETS: dict[str, dict[str, Any]] = {
    "deepseek-ai/DeepSeek-V3": _DEEPSEEK_V3,
}
