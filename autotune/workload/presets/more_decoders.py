"""Decoder presets of Axolotl's example configs whose families have one checkpoint here: OLMo 3,
Cohere's Command R7B, NVIDIA's Nemotron-Mini-4B and Liquid AI's LFM2 (dense and mixture of experts).

Each config.json value is copied from a public source named beside it; keys the sources do not give
are transformers' defaults only where the source says the checkpoint keeps them.
"""

from __future__ import annotations

from typing import Any

_SLIDING_3_FULL_1 = ["sliding_attention"] * 3 + ["full_attention"]

OLMO_3_PRESETS: dict[str, dict[str, Any]] = {
    # allenai/Olmo-3-7B-Instruct-SFT (the 7B's SFT stage; same shapes as every Olmo 3 7B):
    # vLLM's NCP-ArchPreview contract test (vllm model_executor/models/ncp_olmo, an Olmo 3 7B backbone:
    # hidden 4096, 32 layers, 32 query and 32 key/value groups, q/k norm, ffn 11008, vocabulary 100278,
    # 65536 positions, a 4096-token window skipped every 4th layer) and an Olmo 3 config loader's test
    # ("Olmo3LayerPatternAndYarn": 3 sliding + 1 full, rope_theta 500000, window 4096, YaRN factor 8
    # from 8192 positions, attention_factor 1.2079441541679836, beta_fast 32, beta_slow 1); the Olmo 3
    # 32B contract of jspace-olmo-lineage's checkpoint inventory for rms_norm_eps 1e-6 and untied
    # embeddings (the family's). Dolma 2 tokenizer ids (eos 100257, pad 100277); bfloat16.
    "allenai/Olmo-3-7B-Instruct-SFT": {
        "model_type": "olmo3",
        "architectures": ["Olmo3ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "eos_token_id": 100257,
        "pad_token_id": 100277,
        "hidden_act": "silu",
        "hidden_size": 4096,
        "initializer_range": 0.02,
        "intermediate_size": 11008,
        "layer_types": _SLIDING_3_FULL_1 * 8,
        "max_position_embeddings": 65536,
        "num_attention_heads": 32,
        "num_hidden_layers": 32,
        "num_key_value_heads": 32,
        "rms_norm_eps": 1e-06,
        "rope_scaling": {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 8192,
                         "attention_factor": 1.2079441541679836, "beta_fast": 32.0, "beta_slow": 1.0},
        "rope_theta": 500000.0,
        "sliding_window": 4096,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "vocab_size": 100278,
    },
}

COHERE_2_PRESETS: dict[str, dict[str, Any]] = {
    # CohereForAI/c4ai-command-r7b-12-2024: a Cohere2 loader's COHERE2_CONFIG["c4ai-command-r7b-12-2024"]
    # (vocabulary 256000, width 4096, 32 layers, 32 query / 8 key-value heads of 128, mlp 14336, window
    # 4096 on three layers of four, norm eps 1e-5, rope_theta 50000, logit_scale 0.25, embeddings tied),
    # MacMLX's Cohere2 decode tests ("the shipped checkpoint overrides ... 0.0625 with 0.25", head_dim
    # 128), and a KV-cache registry's entry sourced from the checkpoint's config.json (raw/main,
    # retrieved 2026-05-23): 8 full and 24 sliding layers, max_position_embeddings 132096. transformers'
    # Cohere2 docs: "three layers with sliding window attention (window size 4096) and ROPE ... A fourth
    # layer uses global attention without positional embeddings". No biases (attention_bias false).
    "CohereForAI/c4ai-command-r7b-12-2024": {
        "model_type": "cohere2",
        "architectures": ["Cohere2ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 5,
        "eos_token_id": 255001,
        "pad_token_id": 0,
        "head_dim": 128,
        "hidden_act": "silu",
        "hidden_size": 4096,
        "initializer_range": 0.02,
        "intermediate_size": 14336,
        "layer_norm_eps": 1e-05,
        "layer_types": _SLIDING_3_FULL_1 * 8,
        "logit_scale": 0.25,
        "max_position_embeddings": 132096,
        "num_attention_heads": 32,
        "num_hidden_layers": 32,
        "num_key_value_heads": 8,
        "rope_theta": 50000.0,
        "sliding_window": 4096,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "vocab_size": 256000,
    },
}

NEMOTRON_PRESETS: dict[str, dict[str, Any]] = {
    # nvidia/Nemotron-Mini-4B-Instruct ("Nemotron-4 Mini 4B", a fine-tune of Minitron-4B-Base):
    # NVIDIA/TensorRT-LLM tests/unittest/_torch/modeling/test_modeling_nemotron.py Nemotron_4_4B_CONFIG,
    # copied key for key: squared-ReLU MLP (no gate) of 9216, 24 query / 8 key-value heads of 128
    # (kv_channels) on a 3072 width, half the head rotated, untied, vocabulary 256000, 4096 positions.
    "nvidia/Nemotron-Mini-4B-Instruct": {
        "model_type": "nemotron",
        "architectures": ["NemotronForCausalLM"],
        "bos_token_id": 2,
        "eos_token_id": 3,
        "hidden_act": "relu2",
        "hidden_size": 3072,
        "initializer_range": 0.0134,
        "intermediate_size": 9216,
        "kv_channels": 128,
        "max_position_embeddings": 4096,
        "norm_eps": 1e-05,
        "num_attention_heads": 24,
        "num_hidden_layers": 32,
        "num_key_value_heads": 8,
        "partial_rotary_factor": 0.5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "vocab_size": 256000,
    },
}

# LFM2's short convolutions: modeling_lfm2.py's causal_conv1d_fn is the causal-conv1d package's CUDA
# kernel where that is installed (use_kernel_func_from_hub_with_fallback), else F.conv1d. Axolotl
# ships without it (pyproject.toml puts causal_conv1d in the mamba-ssm extra; docker/Dockerfile-uv
# uninstalls it; examples/LiquidAI/README.md says to uninstall it on errors), so the torch path a
# GPU user of Axolotl runs is the one traced here, nothing emulated.
LFM2_PRESETS: dict[str, dict[str, Any]] = {
    # LiquidAI/LFM2-350M: mlxcel's "trimmed LFM2-350M (dense) config" (vocabulary 65536, width 1024,
    # 16 layers, 16 / 8 heads, 128000 positions, norm eps 1e-5, conv_L_cache 3 without bias,
    # rope_theta 1e6, attention at layers 2, 5, 8, 10, 12, 14, block_ff_dim 6656, eos 7) and MacMLX's
    # "Real configs decode" test of the 350M (block_multiple_of 256, block_ffn_dim_multiplier 1.0,
    # block_auto_adjust_ff_dim true: 2/3 of 6656 rounded up to 256, a 4608 MLP); the embedding tied
    # (config.json's tie_embedding, which Lfm2Config reads), bfloat16.
    "LiquidAI/LFM2-350M": {
        "model_type": "lfm2",
        "architectures": ["Lfm2ForCausalLM"],
        "block_auto_adjust_ff_dim": True,
        "block_ff_dim": 6656,
        "block_ffn_dim_multiplier": 1.0,
        "block_multiple_of": 256,
        "bos_token_id": 1,
        "conv_L_cache": 3,
        "conv_bias": False,
        "eos_token_id": 7,
        "full_attn_idxs": [2, 5, 8, 10, 12, 14],
        "hidden_size": 1024,
        "max_position_embeddings": 128000,
        "norm_eps": 1e-05,
        "num_attention_heads": 16,
        "num_hidden_layers": 16,
        "num_key_value_heads": 8,
        "pad_token_id": 0,
        "rope_theta": 1000000.0,
        "tie_embedding": True,
        "torch_dtype": "bfloat16",
        "vocab_size": 65536,
    },
    # LiquidAI/LFM2-8B-A1B: mlxcel's "trimmed LFM2-8B-A1B (MoE) config" (width 2048, 24 layers,
    # 32 / 8 heads, dense MLP 7168 in the first 2 layers, then 32 experts of 1792, 4 per token,
    # sigmoid routing with expert bias, top-k renormalised, attention at 2, 6, 10, 14, 18, 21,
    # vocabulary 65536, 128000 positions, conv_L_cache 3, rope_theta 1e6, eos 7).
    "LiquidAI/LFM2-8B-A1B": {
        "model_type": "lfm2_moe",
        "architectures": ["Lfm2MoeForCausalLM"],
        "bos_token_id": 1,
        "conv_L_cache": 3,
        "conv_bias": False,
        "eos_token_id": 7,
        "hidden_size": 2048,
        "intermediate_size": 7168,
        "layer_types": ["conv", "conv", "full_attention", "conv", "conv", "conv",
                        "full_attention", "conv", "conv", "conv", "full_attention", "conv",
                        "conv", "conv", "full_attention", "conv", "conv", "conv",
                        "full_attention", "conv", "conv", "full_attention", "conv", "conv"],
        "max_position_embeddings": 128000,
        "moe_intermediate_size": 1792,
        "norm_eps": 1e-05,
        "norm_topk_prob": True,
        "num_attention_heads": 32,
        "num_dense_layers": 2,
        "num_experts": 32,
        "num_experts_per_tok": 4,
        "num_hidden_layers": 24,
        "num_key_value_heads": 8,
        "pad_token_id": 0,
        "rope_theta": 1000000.0,
        "routed_scaling_factor": 1.0,
        "torch_dtype": "bfloat16",
        "use_expert_bias": True,
        "vocab_size": 65536,
    },
}
