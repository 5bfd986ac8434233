"""Z.ai's GLM: the mixtures of experts GLM-4.5-Air (glm4_moe) and GLM-4.7-Flash (glm4_moe_lite), the
two whose Axolotl examples quantize the experts on load (examples/glm45, examples/glm47-flash:
``quantize_moe_experts: true``), and the dense GLM-4-32B-0414 (glm4, examples/glm4, at the end).

Their shapes are those of the checkpoints' Megatron definitions in THUDM's slime (mirrored in
vllm-project/vime scripts/models/glm4.5-106B-A12B.sh and glm4.7-30B-A3B.sh), mapped to
config.json's keys: --num-layers -> num_hidden_layers (N_DENSE_LAYERS -> first_k_dense_replace),
--hidden-size -> hidden_size, --ffn-hidden-size -> intermediate_size (the dense layer's),
--moe-ffn-hidden-size -> moe_intermediate_size, --num-experts -> n_routed_experts,
--moe-router-topk -> num_experts_per_tok, --moe-shared-expert-intermediate-size / moe width ->
n_shared_experts, --moe-router-topk-scaling-factor -> routed_scaling_factor, --num-attention-heads
-> num_attention_heads, --num-query-groups -> num_key_value_heads, --kv-channels -> head_dim,
--add-qkv-bias -> attention_bias (the q, k, v projections'; o_proj has none), --rotary-percent ->
partial_rotary_factor, --rotary-base -> rope_theta, --vocab-size -> vocab_size,
--untie-embeddings-and-output-weights -> tie_word_embeddings false; the latent attention's
--q-lora-rank, --kv-lora-rank, --qk-head-dim (qk_nope_head_dim), --qk-pos-emb-head-dim
(qk_rope_head_dim), --v-head-dim. transformers' own configs default to these checkpoints
(configuration_glm4_moe.py, configuration_glm4_moe_lite.py: the same widths, counts and vocab),
whose defaults give the keys slime has no flag for: max_position_embeddings, rms_norm_eps (1e-5,
slime's --norm-epsilon for GLM-4.7-Flash), n_group and topk_group (1).

Both checkpoints carry a multi-token-prediction layer (num_nextn_predict_layers 1) that
transformers does not build (it drops its weights on load): the parameter counts are of the
model transformers trains.
"""

from __future__ import annotations

from typing import Any

GLM_PRESETS: dict[str, dict[str, Any]] = {
    # GLM-4.5-Air: 1 dense and 45 MoE layers of 128 experts (8 per token) and a shared expert;
    # grouped-query attention, 96 heads of 128 over 8 key/value heads, rotary on half of each head.
    # transformers counts 106.85B: the model card's "106 billion total parameters".
    "zai-org/GLM-4.5-Air": {
        "model_type": "glm4_moe",
        "architectures": ["Glm4MoeForCausalLM"],
        "attention_bias": True,
        "attention_dropout": 0.0,
        "first_k_dense_replace": 1,
        "head_dim": 128,
        "hidden_act": "silu",
        "hidden_size": 4096,
        "intermediate_size": 10944,
        "max_position_embeddings": 131072,
        "moe_intermediate_size": 1408,
        "n_group": 1,
        "n_routed_experts": 128,
        "n_shared_experts": 1,
        "norm_topk_prob": True,
        "num_attention_heads": 96,
        "num_experts_per_tok": 8,
        "num_hidden_layers": 46,
        "num_key_value_heads": 8,
        "num_nextn_predict_layers": 1,
        "partial_rotary_factor": 0.5,
        "rms_norm_eps": 1e-05,
        "rope_theta": 1000000,
        "routed_scaling_factor": 1.0,
        "tie_word_embeddings": False,
        "topk_group": 1,
        "torch_dtype": "bfloat16",
        "use_qk_norm": False,  # GLM-4.5 (355B) sets --qk-layernorm; the Air does not
        "vocab_size": 151552,
    },
    # GLM-4.7-Flash: DeepSeek-V3's decoder (multi-head latent attention, 20 heads; queries through a
    # 768-wide and keys/values through a 512-wide projection), 1 dense and 46 MoE layers of 64
    # experts (4 per token) and a shared expert. transformers counts 29.94B: Z.ai's "30B-A3B".
    "zai-org/GLM-4.7-Flash": {
        "model_type": "glm4_moe_lite",
        "architectures": ["Glm4MoeLiteForCausalLM"],
        # transformers' default; not settled by slime (its --add-qkv-bias would put a bias on the
        # two down-projections, 63k parameters in all, 0.0002% of the model)
        "attention_bias": False,
        "attention_dropout": 0.0,
        "first_k_dense_replace": 1,
        "hidden_act": "silu",
        "hidden_size": 2048,
        "intermediate_size": 10240,
        "kv_lora_rank": 512,
        "max_position_embeddings": 202752,
        "moe_intermediate_size": 1536,
        "n_group": 1,
        "n_routed_experts": 64,
        "n_shared_experts": 1,
        "norm_topk_prob": True,
        "num_attention_heads": 20,
        "num_experts_per_tok": 4,
        "num_hidden_layers": 47,
        "num_key_value_heads": 20,
        "num_nextn_predict_layers": 1,
        "q_lora_rank": 768,
        "qk_nope_head_dim": 192,
        "qk_rope_head_dim": 64,
        "rms_norm_eps": 1e-05,
        "rope_theta": 1000000,
        "routed_scaling_factor": 1.8,
        "tie_word_embeddings": False,
        "topk_group": 1,
        "torch_dtype": "bfloat16",
        "v_head_dim": 256,
        "vocab_size": 154880,
    },
}

# GLM-4-32B-0414 (glm4, dense): its shapes in Ascend/MindSpeed-LLM's scripts for the checkpoint
# (tests/0day/glm4-32b-0414/pretrain_glm4_32b_0414_8k_ptd.sh, whose weights
# ckpt_convert_glm4_32b_0414_hf2mcore.sh converts from the hub's), mapped as slime's above:
# --num-layers 61, --hidden-size 6144, --ffn-hidden-size 23040, --num-attention-heads 48,
# --num-query-groups 2 (num_key_value_heads), --padded-vocab-size 151552, --rotary-percent 0.5,
# --norm-epsilon 1e-05, --untie-embeddings-and-output-weights, no --rotary-base (Megatron's 10000).
# Its attention has no bias: --disable-bias-linear without the --add-qkv-bias the 9B-0414's scripts
# (and configs/checkpoint/model_cfg.json "glm4_9b") add. max_position_embeddings 32768: the
# converter's glm4 entry (model_cfg.json "glm4": seq_length 32768, read from it). head_dim 128
# (6144 / 48) and the token ids as Glm4Config's defaults (configuration_glm4.py); the weights in
# bfloat16. transformers builds each layer's four norms (Glm4DecoderLayer: GLM's post-norms,
# MindSpeed's --post-norm).
GLM_4_PRESETS: dict[str, dict[str, Any]] = {
    "zai-org/GLM-4-32B-0414": {
        "model_type": "glm4",
        "architectures": ["Glm4ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "head_dim": 128,
        "hidden_act": "silu",
        "hidden_size": 6144,
        "intermediate_size": 23040,
        "max_position_embeddings": 32768,
        "num_attention_heads": 48,
        "num_hidden_layers": 61,
        "num_key_value_heads": 2,
        "partial_rotary_factor": 0.5,
        "rms_norm_eps": 1e-05,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "vocab_size": 151552,
    },
}
