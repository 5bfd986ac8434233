"""Tiny configs for tests and demos, one per model_type: the ``tiny-<model_type>`` presets (the
package's PRESETS)."""

from __future__ import annotations

from typing import Any

# Tiny models for tests and demos: 2 layers, hidden 32, 2 heads, intermediate 64,
# vocab 128, 128 usable positions. Same code paths as the full models, in milliseconds.
_TINY_BERT = {
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 64,
    "vocab_size": 128,
    "max_position_embeddings": 128,
}
_TINY_ROBERTA = {
    **_TINY_BERT,
    "max_position_embeddings": 130,
    "pad_token_id": 1,
    "type_vocab_size": 1,
}
_TINY_VLM_TEXT = {
    **_TINY_BERT,
    "num_key_value_heads": 1,
    "max_position_embeddings": 1024,
    "image_token_id": 100,
    "video_token_id": 101,
    "vision_start_token_id": 102,
    "vision_end_token_id": 103,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
# MLA (compressed queries and keys) over experts, a dense first layer then 4 routed (2 a token) beside a
# shared one: the layout of glm4_moe_lite, deepseek_v3 and glm_moe_dsa.
_TINY_MLA_MOE = {
    **_TINY_BERT,
    "num_key_value_heads": 2,
    "q_lora_rank": 16,
    "kv_lora_rank": 16,
    "qk_nope_head_dim": 8,
    "qk_rope_head_dim": 8,
    "v_head_dim": 16,
    "first_k_dense_replace": 1,
    "moe_intermediate_size": 16,
    "n_routed_experts": 4,
    "n_shared_experts": 1,
    "num_experts_per_tok": 2,
}
_TINY_VISION_TOKENS = {key: _TINY_VLM_TEXT[key] for key in
                       ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")}
_TINY_QWEN3_VISION = {"model_type": "qwen3_vl", "depth": 2, "hidden_size": 32, "intermediate_size": 64,
                      "num_heads": 2, "out_hidden_size": 32, "num_position_embeddings": 16,
                      "deepstack_visual_indexes": [0, 1]}
# A fixed-size tower of 56-pixel images in 14-pixel patches: 16 patches.
_TINY_VISION = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64,
                "image_size": 56, "patch_size": 14}
# Mistral 3's Pixtral tower (Mistral Small 3.1's and 4's alike): 14-pixel patches, up to 112 a side.
_TINY_PIXTRAL_VISION = {"model_type": "pixtral", **_TINY_VISION, "head_dim": 16, "image_size": 112}
TINY_CONFIGS: dict[str, dict[str, Any]] = {
    "bert": _TINY_BERT,
    "roberta": _TINY_ROBERTA,
    "xlm-roberta": _TINY_ROBERTA,
    "electra": {**_TINY_BERT, "embedding_size": 32},
    "albert": {**_TINY_BERT, "embedding_size": 16},
    "deberta-v2": {
        **_TINY_BERT,
        "relative_attention": True,
        "position_buckets": 256,
        "norm_rel_ebd": "layer_norm",
        "share_att_key": True,
        "pos_att_type": "p2c|c2p",
        "max_relative_positions": -1,
        "position_biased_input": False,
        "type_vocab_size": 0,
    },
    "distilbert": {
        "dim": 32,
        "n_layers": 2,
        "n_heads": 2,
        "hidden_dim": 64,
        "vocab_size": 128,
        "max_position_embeddings": 128,
    },
    "gpt2": {
        "n_embd": 32,
        "n_layer": 2,
        "n_head": 2,
        "n_inner": 64,
        "vocab_size": 128,
        "n_positions": 128,
        # GPT-2's bos/eos is its last token id (50256 of 50257); keep it inside the vocab.
        "bos_token_id": 127,
        "eos_token_id": 127,
    },
    # Decoders: grouped-query attention with 1 key/value head (head_dim 16), architectures so
    # that the default task is causal-lm; no torch_dtype, so the tiny models stay float32.
    "llama": {**_TINY_BERT, "num_key_value_heads": 1, "architectures": ["LlamaForCausalLM"]},
    "qwen2": {**_TINY_BERT, "num_key_value_heads": 1, "architectures": ["Qwen2ForCausalLM"]},
    "mistral": {
        **_TINY_BERT,
        "num_key_value_heads": 1,
        "sliding_window": None,
        "architectures": ["MistralForCausalLM"],
    },
    # Mixtral: 4 experts of the tiny MLP's width, 2 routed per token (the real models' 8 and 2).
    # gpt-oss' attention (sinks, a sliding window on alternate layers, grouped keys) and experts, tiny.
    "gpt_oss": {
        **_TINY_BERT,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 8,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "sliding_window": 8,
        "layer_types": ["sliding_attention", "full_attention"],
        # gpt-oss-20b's YaRN, over 4 original positions: 128 / 4 = its factor 32
        "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                         "original_max_position_embeddings": 4, "truncate": False},
        "architectures": ["GptOssForCausalLM"],
    },
    "qwen3": {**_TINY_BERT, "num_key_value_heads": 1, "head_dim": 16, "architectures": ["Qwen3ForCausalLM"]},
    "mixtral": {
        **_TINY_BERT,
        "num_key_value_heads": 1,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "architectures": ["MixtralForCausalLM"],
    },
    # Falcon-H1: a Mamba-2 mixer beside the attention in each layer, 2 heads of 16 each, a state of 8,
    # chunks of 16 positions (8 in the 128 positions); the gated RMSNorm on, as the 34B's.
    "falcon_h1": {
        **_TINY_BERT,
        "num_key_value_heads": 1,
        "head_dim": 16,
        "mamba_d_ssm": 32,
        "mamba_n_heads": 2,
        "mamba_d_head": 16,
        "mamba_d_state": 8,
        "mamba_n_groups": 1,
        "mamba_chunk_size": 16,
        "mamba_rms_norm": True,
        "architectures": ["FalconH1ForCausalLM"],
    },
    # Nemotron 3 (nemotron_h.py): a Mamba-2 layer (2 heads of 16, a state of 8, chunks of 16), a layer of
    # 4 experts (2 routed a token) and a shared one, an attention layer, as the checkpoints' M, E, *.
    "nemotron_h": {
        **_TINY_BERT,
        "num_hidden_layers": 3,
        "hybrid_override_pattern": "ME*",
        "num_key_value_heads": 1,
        "head_dim": 16,
        "mamba_num_heads": 2,
        "mamba_head_dim": 16,
        "ssm_state_size": 8,
        "n_groups": 1,
        "chunk_size": 16,
        "n_routed_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "moe_shared_expert_intermediate_size": 64,
        "architectures": ["NemotronHForCausalLM"],
    },
    # Jamba (ssm_hybrids.py): a Mamba-1 layer then an attention layer with 4 experts (2 routed per
    # token), as Jamba's pattern of period 8 with period 2; a state of 8, a dt rank of 4. The estimator
    # refuses its mixers (mamba_mixer.check_kernels); it reads Jamba configs' keys (bench_configs --peel).
    "jamba": {
        **_TINY_BERT,
        "num_key_value_heads": 1,
        "attn_layer_period": 2,
        "attn_layer_offset": 1,
        "expert_layer_period": 2,
        "expert_layer_offset": 1,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "mamba_d_state": 8,
        "mamba_dt_rank": 4,
        "architectures": ["JambaForCausalLM"],
    },
    # GLM's mixtures of experts (glm.py): a dense first layer, then 4 experts of width 16 (2 routed
    # per token) and a shared one; GLM-4.5-Air's grouped-query attention with biases and half-rotary
    # heads, GLM-4.7-Flash's latent attention (DeepSeek-V3's) with small ranks.
    "glm4_moe": {
        **_TINY_BERT,
        "num_key_value_heads": 1,
        "head_dim": 16,
        "attention_bias": True,
        "partial_rotary_factor": 0.5,
        "first_k_dense_replace": 1,
        "moe_intermediate_size": 16,
        "n_routed_experts": 4,
        "n_shared_experts": 1,
        "num_experts_per_tok": 2,
        "architectures": ["Glm4MoeForCausalLM"],
    },
    "glm4_moe_lite": {
        **_TINY_MLA_MOE,
        "architectures": ["Glm4MoeLiteForCausalLM"],
    },
    # DeepSeek-V3 (deepseek_v3.py): MLA with compressed queries, a dense first layer, then experts
    # routed by sigmoid within groups (2 groups, 1 kept) beside a shared one.
    "deepseek_v3": {
        **_TINY_MLA_MOE,
        "n_group": 2,
        "topk_group": 1,
        "architectures": ["DeepseekV3ForCausalLM"],
    },
    # MiniMax-M2 (minimax.py): experts in every layer, no shared one; a query and key norm over all
    # heads, RoPE on half of each head. 8 experts of 32, so that FSDP2 over 8 GPUs shards them evenly.
    "minimax_m2": {**_TINY_BERT, "num_key_value_heads": 1, "head_dim": 16, "num_local_experts": 8,
                   "intermediate_size": 32,
                   "num_experts_per_tok": 2, "rotary_dim": 8, "bos_token_id": 1, "eos_token_id": 2,
                   "architectures": ["MiniMaxM2ForCausalLM"]},
    # Granite 4.0 (granite.py): a Mamba-2 layer (2 heads of 32 = expand 2 x width 32, a state of 8,
    # chunks of 16) then a NoPE attention layer, each with 4 experts (2 routed) beside a shared one.
    "granitemoehybrid": {**_TINY_BERT, "num_key_value_heads": 1, "intermediate_size": 16,
                         "shared_intermediate_size": 32, "num_local_experts": 4, "num_experts_per_tok": 2,
                         "layer_types": ["mamba", "attention"], "mamba_n_heads": 2, "mamba_d_head": 32,
                         "mamba_d_state": 8, "mamba_n_groups": 1, "mamba_chunk_size": 16,
                         "architectures": ["GraniteMoeHybridForCausalLM"]},
    # GLM-5 (glm5.py): DeepSeek-V3's tiny layout above with DeepSeek Sparse Attention's indexer (2 heads
    # of 16, keeping 64 keys a query: fewer than the 128 positions, so it selects).
    "glm_moe_dsa": {
        **_TINY_MLA_MOE,
        "head_dim": 8,
        "index_n_heads": 2,
        "index_head_dim": 16,
        "index_topk": 64,
        "pad_token_id": 0,
        "eos_token_id": 2,
        "architectures": ["GlmMoeDsaForCausalLM"],
    },
    # The dense GLM-4-0414 (glm.py GLM-4-32B-0414): half-rotary heads, four norms a layer, a fused
    # gate_up_proj; no attention bias, as the 32B's. Glm4Config's pad token (151329) is past the vocab.
    "glm4": {**_TINY_BERT, "num_key_value_heads": 1, "head_dim": 16, "attention_bias": False,
             "partial_rotary_factor": 0.5, "pad_token_id": 0, "eos_token_id": 2,
             "architectures": ["Glm4ForCausalLM"]},
    "gemma2": {
        **_TINY_BERT,
        "num_key_value_heads": 1,
        "head_dim": 16,  # Gemma 2's default is 256
        "query_pre_attn_scalar": 16,
        "sliding_window": 64,  # smaller than the context, so the sliding layers differ
        "architectures": ["Gemma2ForCausalLM"],
    },
    # Hybrid linear attention (Qwen3.5, Qwen3-Next): 4 layers, the last full attention; 2 key and
    # 4 value heads of 16 in the Gated DeltaNet layers (as the real models, more value heads than key
    # heads); 70 rows past one 64-token chunk in the tests. Mixtures of 4 experts, 2 routed.
    "qwen3_5_text": {**_TINY_BERT, "num_hidden_layers": 4, "num_key_value_heads": 1, "head_dim": 16,
                     "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 16,
                     "linear_value_head_dim": 16, "architectures": ["Qwen3_5ForCausalLM"]},
    "qwen3_5_moe_text": {**_TINY_BERT, "num_hidden_layers": 4, "num_key_value_heads": 1, "head_dim": 16,
                         "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 16,
                         "linear_value_head_dim": 16, "num_experts": 4, "num_experts_per_tok": 2,
                         "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32,
                         "architectures": ["Qwen3_5MoeForCausalLM"]},
    "qwen3_next": {**_TINY_BERT, "num_hidden_layers": 4, "num_key_value_heads": 1, "head_dim": 16,
                   "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 16,
                   "linear_value_head_dim": 16, "num_experts": 4, "num_experts_per_tok": 2,
                   "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32,
                   "architectures": ["Qwen3NextForCausalLM"]},
    # Qwen3-MoE (Qwen3-30B-A3B's family): every layer a mixture of 4 experts, 2 routed, no shared
    # expert; Axolotl's ScatterMoE experts are emulated for it (workload/scattermoe.py).
    "qwen3_moe": {**_TINY_BERT, "num_key_value_heads": 1, "head_dim": 16, "num_experts": 4,
                  "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                  "architectures": ["Qwen3MoeForCausalLM"]},
    # Gemma 4 text, the 26B-A4B's kind (presets/gemma4.py): 2 layers (sliding, then global with 32-wide
    # heads whose keys are their values), each a dense MLP beside a mixture of 4 experts, 2 routed
    # (Gemma4TextDecoderLayer's enable_moe_block); Axolotl's ScatterMoE is emulated for its experts.
    "gemma4_text": {**_TINY_BERT, "num_key_value_heads": 1, "head_dim": 16, "global_head_dim": 32,
                    "sliding_window": 64, "layer_types": ["sliding_attention", "full_attention"],
                    "attention_k_eq_v": True, "num_global_key_value_heads": 1,
                    "hidden_size_per_layer_input": 0, "enable_moe_block": True, "num_experts": 4,
                    "top_k_experts": 2, "moe_intermediate_size": 32,
                    "architectures": ["Gemma4ForCausalLM"]},
    # Vision-language models: the tiny decoder above (1024 positions, room for the images) and a
    # 2-block vision tower of width 32; image token ids inside the vocab.
    "qwen2_vl": {
        **_TINY_VLM_TEXT,
        "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]},  # head_dim 16: 8 frequencies
        "vision_config": {"depth": 2, "embed_dim": 32, "hidden_size": 32, "num_heads": 2, "mlp_ratio": 2},
        "architectures": ["Qwen2VLForConditionalGeneration"],
    },
    "qwen2_5_vl": {
        **_TINY_VLM_TEXT,
        "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]},
        "vision_config": {"depth": 2, "hidden_size": 32, "intermediate_size": 32, "num_heads": 2,
                          "out_hidden_size": 32, "fullatt_block_indexes": [1], "window_size": 112},
        "architectures": ["Qwen2_5_VLForConditionalGeneration"],
    },
    # Qwen3-VL: the tiny decoder as its text_config (head_dim 16: interleaved mrope sections of 8
    # frequencies), a 2-block tower of 16-pixel patches with a 4 x 4 learned position table and
    # deepstack features after both blocks; the MoE one with 4 experts, 2 routed per token.
    "qwen3_vl": {
        "text_config": {"model_type": "qwen3_vl_text", **_TINY_VLM_TEXT, "head_dim": 16,
                        "rope_scaling": {"rope_type": "default", "mrope_section": [2, 3, 3],
                                         "mrope_interleaved": True}},
        "vision_config": _TINY_QWEN3_VISION,
        **_TINY_VISION_TOKENS,
        "architectures": ["Qwen3VLForConditionalGeneration"],
    },
    # GLM-4V (GLM-4.6V-Flash's layout): the tiny decoder with half its head rotated (partial_rotary_factor
    # 0.5: 4 frequencies in mrope sections), biased q/k/v, a 2-block tower of 14-pixel patches merged 2 x 2
    # with a 4 x 4 learned position table (image_size 56).
    "glm4v": {
        "text_config": {"model_type": "glm4v_text", **_TINY_VLM_TEXT, "partial_rotary_factor": 0.5,
                        "attention_bias": True, "pad_token_id": 0,
                        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                            "mrope_section": [1, 1, 2]}},
        "vision_config": {"model_type": "glm4v_vision", "depth": 2, "hidden_size": 32, "num_heads": 2,
                          "intermediate_size": 32, "out_hidden_size": 32, "image_size": 56, "patch_size": 14},
        "image_token_id": 100, "video_token_id": 101, "image_start_token_id": 102, "image_end_token_id": 103,
        "architectures": ["Glm4vForConditionalGeneration"],
    },
    "qwen3_vl_moe": {
        "text_config": {"model_type": "qwen3_vl_moe_text", **_TINY_VLM_TEXT, "head_dim": 16,
                        "rope_scaling": {"rope_type": "default", "mrope_section": [2, 3, 3],
                                         "mrope_interleaved": True},
                        "moe_intermediate_size": 32, "num_experts": 4, "num_experts_per_tok": 2},
        "vision_config": {**_TINY_QWEN3_VISION, "model_type": "qwen3_vl_moe"},
        **_TINY_VISION_TOKENS,
        "architectures": ["Qwen3VLMoeForConditionalGeneration"],
    },
    # Qwen3.5's MoE checkpoint as the vision-language model it is: the tiny hybrid MoE decoder above as
    # its text_config (interleaved mrope over the 2 frequencies of a quarter of head_dim 16 rotated) and
    # Qwen3-VL's tiny tower without DeepStack (Qwen3.5's has none).
    "qwen3_5_moe": {
        "text_config": {"model_type": "qwen3_5_moe_text", **_TINY_VLM_TEXT, "num_hidden_layers": 4,
                        "head_dim": 16, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
                        "linear_key_head_dim": 16, "linear_value_head_dim": 16, "num_experts": 4,
                        "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                        "shared_expert_intermediate_size": 32,
                        "rope_parameters": {"rope_type": "default", "mrope_section": [1, 1, 0],
                                            "mrope_interleaved": True, "partial_rotary_factor": 0.25}},
        "vision_config": {key: value for key, value in _TINY_QWEN3_VISION.items()
                          if key not in ("model_type", "deepstack_visual_indexes")},
        **_TINY_VISION_TOKENS,
        "architectures": ["Qwen3_5MoeForConditionalGeneration"],
    },
    # Qwen3.5's dense checkpoints (0.8B to 9B) as the vision-language models they are: the tiny hybrid
    # decoder above as their text_config, the same tower.
    "qwen3_5": {
        "text_config": {"model_type": "qwen3_5_text", **_TINY_VLM_TEXT, "num_hidden_layers": 4,
                        "head_dim": 16, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
                        "linear_key_head_dim": 16, "linear_value_head_dim": 16,
                        "rope_parameters": {"rope_type": "default", "mrope_section": [1, 1, 0],
                                            "mrope_interleaved": True, "partial_rotary_factor": 0.25}},
        "vision_config": {key: value for key, value in _TINY_QWEN3_VISION.items()
                          if key not in ("model_type", "deepstack_visual_indexes")},
        **_TINY_VISION_TOKENS,
        "architectures": ["Qwen3_5ForConditionalGeneration"],
    },
    # Llama 3.2 Vision: the tiny decoder of 3 layers, two of them cross-attention layers (the second and
    # third: the vision features feed more than one, as in the 11B's eight), a 2 + 1-layer tower
    # of 56-pixel tiles in 14-pixel patches (16 + CLS, padded to 24), up to 4 tiles an image, feeding the
    # projector the output of its layers 0 and 1 (vision_output_dim: 32 x (1 + 2)).
    "mllama": {
        "text_config": {"model_type": "mllama_text_model", **_TINY_BERT, "num_key_value_heads": 1,
                        "num_hidden_layers": 3, "cross_attention_layers": [1, 2],
                        "max_position_embeddings": 1024, "bos_token_id": 1, "eos_token_id": 2,
                        "pad_token_id": 0},
        "vision_config": {"model_type": "mllama_vision_model", "hidden_size": 32, "num_hidden_layers": 2,
                          "num_global_layers": 1, "attention_heads": 2, "intermediate_size": 64,
                          "image_size": 56, "patch_size": 14, "max_num_tiles": 4,
                          "intermediate_layers_indices": [0, 1], "vision_output_dim": 96},
        "image_token_index": 127,
        "architectures": ["MllamaForConditionalGeneration"],
    },
    "llava": {
        "text_config": {"model_type": "llama", **_TINY_BERT, "num_key_value_heads": 1,
                        "max_position_embeddings": 1024},
        "vision_config": {"model_type": "clip_vision_model", **_TINY_VISION},
        "image_token_index": 100,
        "architectures": ["LlavaForConditionalGeneration"],
    },
    "gemma3": {
        "text_config": {"model_type": "gemma3_text", **_TINY_BERT, "num_key_value_heads": 1, "head_dim": 16,
                        "query_pre_attn_scalar": 16, "sliding_window": 64, "max_position_embeddings": 1024},
        # no pooling head, as the checkpoints' (presets/vision.py google/gemma-3-4b-it: vision_use_head)
        "vision_config": {"model_type": "siglip_vision_model", **_TINY_VISION, "vision_use_head": False},
        "mm_tokens_per_image": 4,  # 16 patches pooled 2 x 2
        "image_token_index": 100,
        "boi_token_index": 101,
        "eoi_token_index": 102,
        "architectures": ["Gemma3ForConditionalGeneration"],
    },
    # Gemma 4: 2 layers (sliding, then global with 32-wide heads), per-layer embeddings of 8, and a
    # 2-block vision tower; 70 soft tokens an image (Gemma4ImageProcessor's smallest budget: 630
    # patches of 16 pixels, pooled 3 x 3).
    "gemma4": {
        "text_config": {"model_type": "gemma4_text", **_TINY_BERT, "num_key_value_heads": 1, "head_dim": 16,
                        "global_head_dim": 32, "sliding_window": 64, "max_position_embeddings": 1024,
                        "layer_types": ["sliding_attention", "full_attention"],
                        "hidden_size_per_layer_input": 8, "vocab_size_per_layer_input": 128},
        "vision_config": {"model_type": "gemma4_vision", "hidden_size": 32, "num_hidden_layers": 2,
                          "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 16,
                          "intermediate_size": 64, "position_embedding_size": 64},
        "vision_soft_tokens_per_image": 70,
        "image_token_id": 100,
        "boi_token_id": 101,
        "eoi_token_id": 102,
        "video_token_id": 103,
        "audio_token_id": 104,
        "boa_token_id": 105,
        "eoa_token_index": 106,
        "architectures": ["Gemma4ForConditionalGeneration"],
    },
    # Mistral 3: a Pixtral tower (14-pixel patches, images up to 112 pixels a side) merging 2x2
    # patches, a ministral3 decoder (Ministral 3's, and the Mistral Small ones' mistral blocks alike).
    "mistral3": {
        "text_config": {"model_type": "ministral3", **_TINY_BERT, "num_key_value_heads": 1, "head_dim": 16,
                        "max_position_embeddings": 1024,
                        # Ministral 3's YaRN by 16, from 64 positions here (16384 there)
                        "rope_parameters": {"rope_type": "yarn", "rope_theta": 1000000.0, "factor": 16.0,
                                            "original_max_position_embeddings": 64,
                                            "llama_4_scaling_beta": 0.1}},
        "vision_config": _TINY_PIXTRAL_VISION,
        "image_token_index": 100,
        "architectures": ["Mistral3ForConditionalGeneration"],
    },
    # Mistral Small 4's layout: Mistral 3 (model_type mistral3, so not a key of its own type) over a
    # mistral4 decoder (MLA, 4 routed experts of which 2 a token, one shared).
    "mistral4": {
        "model_type": "mistral3",
        "text_config": {"model_type": "mistral4", "vocab_size": 128, "hidden_size": 32,
                        "intermediate_size": 64, "moe_intermediate_size": 16, "num_hidden_layers": 2,
                        "num_attention_heads": 2, "num_key_value_heads": 2, "n_routed_experts": 4,
                        "num_experts_per_tok": 2, "kv_lora_rank": 16, "q_lora_rank": 16,
                        "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 16,
                        "max_position_embeddings": 1024, "pad_token_id": 0,
                        # Mistral Small 4's YaRN by 128, from 8 positions here (8192 there)
                        "rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 128.0,
                                            "original_max_position_embeddings": 8,
                                            "llama_4_scaling_beta": 0.1}},
        "vision_config": _TINY_PIXTRAL_VISION,
        "image_token_index": 100,
        "architectures": ["Mistral3ForConditionalGeneration"],
    },
    # Pixtral-12B's layout: LLaVA (model_type llava, so not a key of its own type) with a Pixtral tower
    # of 16-pixel patches, no merge, up to 128 pixels a side; a mistral decoder.
    "pixtral": {
        "model_type": "llava",
        "text_config": {"model_type": "mistral", **_TINY_BERT, "num_key_value_heads": 1,
                        "max_position_embeddings": 1024},
        "vision_config": {"model_type": "pixtral", **_TINY_VISION, "head_dim": 16, "image_size": 128,
                          "patch_size": 16},
        "image_token_index": 100,
        "vision_feature_select_strategy": "full",
        "architectures": ["LlavaForConditionalGeneration"],
    },
    # InternVL 3.5: a Qwen3 decoder and a 2-layer InternViT of 56-pixel tiles in 14-pixel patches:
    # 16 patches a tile, 4 features after the 2 x 2 pixel shuffle (image_seq_length).
    "internvl": {
        "text_config": {"model_type": "qwen3", **_TINY_BERT, "num_key_value_heads": 1, "head_dim": 16,
                        "max_position_embeddings": 1024},
        "vision_config": {"model_type": "internvl_vision", **_TINY_VISION, "attention_bias": True},
        "image_token_id": 100,
        "image_seq_length": 4,
        "architectures": ["InternVLForConditionalGeneration"],
    },
    # LFM2-VL: the tiny LFM2 (a conv layer, then attention) and a 2-layer SigLIP2 NaFlex tower of
    # 16-pixel patches with a 4 x 4 position table, merged 2 x 2.
    "lfm2_vl": {
        "text_config": {"model_type": "lfm2", **_TINY_BERT, "num_key_value_heads": 1,
                        "max_position_embeddings": 1024, "layer_types": ["conv", "full_attention"]},
        "vision_config": {"model_type": "siglip2_vision_model", "hidden_size": 32, "num_hidden_layers": 2,
                          "num_attention_heads": 2, "intermediate_size": 64, "patch_size": 16,
                          "num_patches": 16},
        "image_token_id": 100,
        "projector_hidden_size": 32,
        "architectures": ["Lfm2VlForConditionalGeneration"],
    },
    # Llama 4 (Scout's layout): 2 layers, each a mixture of 4 experts of 16 (one a token) beside a
    # shared one, the first chunked with RoPE, the second global without; a 2-layer tower whose 0.5
    # pixel shuffle feeds a projector of 32.
    "llama4": {
        "text_config": {"model_type": "llama4_text", **_TINY_BERT, "num_key_value_heads": 1, "head_dim": 16,
                        "intermediate_size": 16, "intermediate_size_mlp": 64, "num_local_experts": 4,
                        "num_experts_per_tok": 1, "interleave_moe_layer_step": 1, "no_rope_layers": [1, 0],
                        "attention_chunk_size": 64, "max_position_embeddings": 1024, "pad_token_id": 0,
                        "bos_token_id": 1, "eos_token_id": 2},
        # The pixel shuffle's MLP takes hidden_size / pixel_shuffle_ratio**2 (128) as intermediate_size
        # (modeling_llama4.py Llama4VisionMLP2: fc1 of intermediate_size; 5632 = 4 x 1408 in the checkpoints).
        "vision_config": {"model_type": "llama4_vision_model", **_TINY_VISION, "intermediate_size": 128,
                          "vision_output_dim": 32, "projector_input_dim": 32, "projector_output_dim": 32},
        "image_token_index": 100,
        "boi_token_index": 101,
        "eoi_token_index": 102,
        "architectures": ["Llama4ForConditionalGeneration"],
    },
    # PaddleOCR-VL: the tiny decoder's keys at the top level (as the checkpoint has them), head_dim 16
    # in mrope sections of 8 frequencies, untied; a 2-layer NaViT tower of 14-pixel patches with a 4 x 4
    # position table (image_size 56), merged 2 x 2 by the projector.
    "paddleocr_vl": {
        **_TINY_VLM_TEXT,
        "head_dim": 16,
        "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0, "mrope_section": [2, 3, 3]},
        "tie_word_embeddings": False,
        "vision_config": {"model_type": "paddleocr_vl_vision", **_TINY_VISION, "spatial_merge_size": 2},
        "architectures": ["PaddleOCRVLForConditionalGeneration"],
    },
    "modernbert": {
        **_TINY_BERT,
        "local_attention": 64,
        # ModernBERT's special tokens are ids 50281-50283; keep them inside the vocab.
        "bos_token_id": 1,
        "cls_token_id": 1,
        "eos_token_id": 2,
        "sep_token_id": 2,
        "pad_token_id": 0,
    },
}
