"""Z.ai's GLM-5 and GLM-5.1 (model_type glm_moe_dsa): DeepSeek-V3's layout (MLA attention, three dense
layers then 256 routed experts and a shared one, sigmoid routing) at width 6144 over 78 layers, with
DeepSeek Sparse Attention's lightning indexer in every layer (its own query, key and weight
projections: 32 heads of 128, the 2048 keys it keeps per query).

transformers' GlmMoeDsaForCausalLM is what is built; its multi-token-prediction layer
(num_nextn_predict_layers 1) is not (transformers drops its weights on load), so the count is of the
78 layers transformers trains.
"""

from __future__ import annotations

from typing import Any

GLM5_PRESETS: dict[str, dict[str, Any]] = {
    # zai-org/GLM-5.1's config.json, https://huggingface.co/zai-org/GLM-5.1/blob/main/config.json, as a
    # public model-report deployment note copies it whole ("原始 config.json", "transformers_version":
    # "5.4.0"; the note's repository/path not locatable by search); GLM-5.1 is GLM-5 post-trained, and
    # the GLM-5 technical report's architecture table (as glennklockwood.com/garden/GLM-5 copies it:
    # 3 dense and 75 MoE layers, width 6144, dense 12288, experts 2048 wide, QK head 192 + 64, V head
    # 256, Q LoRA 2048, KV LoRA 512, 64 heads, an indexer of 32 heads of 128, 256 experts, 8 routed,
    # 1 shared, vocabulary 154880) agrees on every shape. Every key kept but the MTP layer's count,
    # ep_size and use_cache; transformers' GlmMoeDsaConfig defaults agree on every width, count and the
    # vocabulary (configuration_glm_moe_dsa.py). No index_topk_freq: every layer runs its own indexer
    # (indexer_types all "full").
    "zai-org/GLM-5": {
        "model_type": "glm_moe_dsa",
        "architectures": ["GlmMoeDsaForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "eos_token_id": [154820, 154827, 154829],
        "first_k_dense_replace": 3,
        "head_dim": 64,
        "hidden_act": "silu",
        "hidden_size": 6144,
        "index_head_dim": 128,
        "index_n_heads": 32,
        "index_topk": 2048,
        "indexer_rope_interleave": True,
        "initializer_range": 0.02,
        "intermediate_size": 12288,
        "kv_lora_rank": 512,
        "max_position_embeddings": 202752,
        "moe_intermediate_size": 2048,
        "moe_layer_freq": 1,
        "n_group": 1,
        "n_routed_experts": 256,
        "n_shared_experts": 1,
        "norm_topk_prob": True,
        "num_attention_heads": 64,
        "num_experts_per_tok": 8,
        "num_hidden_layers": 78,
        "num_key_value_heads": 64,
        "pad_token_id": 154820,
        "pretraining_tp": 1,
        "q_lora_rank": 2048,
        "qk_head_dim": 256,
        "qk_nope_head_dim": 192,
        "qk_rope_head_dim": 64,
        "rms_norm_eps": 1e-05,
        "rope_interleave": True,
        "rope_parameters": {"rope_theta": 1000000, "rope_type": "default"},
        "routed_scaling_factor": 2.5,
        "scoring_func": "sigmoid",
        "tie_word_embeddings": False,
        "topk_group": 1,
        "topk_method": "noaux_tc",
        "torch_dtype": "bfloat16",
        "v_head_dim": 256,
        "vocab_size": 154880,
    },
}
