"""Hybrid presets with Mamba-1 mixers: Jamba (model_type jamba: Mamba-1 mixers with one attention layer in
eight, a mixture of 16 experts in every other layer).

Each value as a public copy of the checkpoint's config.json gives it (cited beside each preset).
Axolotl's examples/jamba/ name ai21labs/Jamba-v0.1 and ai21labs/AI21-Jamba-1.5-Large. Their mixers run
mamba-ssm's CUDA kernels on a GPU; autotune refuses them by name until those are emulated
(workload/mamba_mixer.py ``check_kernels``).

Left out:
- state-spaces/mamba-2.8b (Axolotl's examples/mamba/config.yml): Axolotl loads it as mamba-ssm's own
  ``MambaLMHeadModel`` (src/axolotl/loaders/model.py), not a transformers model, and transformers'
  conversion (state-spaces/mamba-2.8b-hf, whose config.json confucianfighter/mamba-2.8b-hf-breakdown's
  README copies whole) has no position table, which autotune needs (models.py ``position_limit``).
- IBM's granite-4.0-tiny-preview (granitemoehybrid: Mamba-2, as Falcon-H1's): no public copy of its
  config.json was found whole (Granite-4.0-H-Tiny's, a later checkpoint with 64 experts, is not it).
"""

from __future__ import annotations

from typing import Any

# The keys the Jamba checkpoints share: sdpython/experimental-experiment
# experimental_experiment/torch_models/llm_model_helper.py copies AI21-Jamba-1.5-Mini's config.json
# whole; GenZ-LLM-Analyzer's misc.py (jamba_v1_config, jamba_1_5_mini_config, jamba_1_5_large_config)
# gives Jamba-v0.1 the 1.5-Mini's shape and the layer pattern, state, conv and expansion to all three.
_JAMBA = {
    "model_type": "jamba",
    "architectures": ["JambaForCausalLM"],
    "attention_dropout": 0.0,
    "attn_layer_offset": 4,
    "attn_layer_period": 8,
    "bos_token_id": 1,
    "expert_layer_offset": 1,
    "expert_layer_period": 2,
    "hidden_act": "silu",
    "initializer_range": 0.02,
    "mamba_conv_bias": True,
    "mamba_d_conv": 4,
    "mamba_d_state": 16,
    "mamba_expand": 2,
    "mamba_proj_bias": False,
    "max_position_embeddings": 262144,
    "num_experts": 16,
    "num_experts_per_tok": 2,
    "pad_token_id": 0,
    "rms_norm_eps": 1e-06,
    "router_aux_loss_coef": 0.001,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 65536,
}

JAMBA_PRESETS: dict[str, dict[str, Any]] = {
    # GenZ-LLM-Analyzer misc.py jamba_v1_config: the 1.5-Mini's widths, heads and depth.
    "ai21labs/Jamba-v0.1": {
        **_JAMBA,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "mamba_dt_rank": 256,
        "num_attention_heads": 32,
        "num_hidden_layers": 32,
        "num_key_value_heads": 8,
    },
    # GenZ-LLM-Analyzer misc.py jamba_1_5_large_config (hidden 8192, MLP 24576, dt rank 512, 64 heads
    # of which 8 key-value, 72 layers); the Jamba 1.5 paper (arXiv 2408.12570) sizes it so too.
    "ai21labs/AI21-Jamba-1.5-Large": {
        **_JAMBA,
        "hidden_size": 8192,
        "intermediate_size": 24576,
        "mamba_dt_rank": 512,
        "num_attention_heads": 64,
        "num_hidden_layers": 72,
        "num_key_value_heads": 8,
    },
}
