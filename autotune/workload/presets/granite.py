"""IBM Granite 4.0 (model_type granitemoehybrid): Mamba-2 mixers in 36 of 40 layers, attention
without positions (NoPE) in the other 4, and in every layer a mixture of experts beside a shared
expert, with Granite's muP multipliers (which shape no tensor).

The Mamba-2 mixers are traced through transformers' torch path (workload/mamba_mixer.py), as
Falcon-H1's: GraniteMoeHybridMambaLayer.forward calls the same hub-kernel-or-fallback
``mamba2_split_conv1d_scan_combined`` in training, then its torch path on the fallback's None.

granite-4.0-tiny-preview (the corpus's Axolotl example) is not a preset: no public copy of its
config.json was found (a port's docstring gives only its 40 layers, width 1536, vocabulary 49160 and
62 experts, 6 routed); the release it previewed, granite-4.0-h-tiny, is (bench_configs maps it there).
"""

from __future__ import annotations

from typing import Any

# Layers 5, 15, 25 and 35 attend; the others are Mamba-2 mixers.
_H_TINY_LAYERS = (["mamba"] * 5 + ["attention"] + ["mamba"] * 9 + ["attention"]
                  + ["mamba"] * 9 + ["attention"] + ["mamba"] * 9 + ["attention"] + ["mamba"] * 4)

GRANITE_PRESETS: dict[str, dict[str, Any]] = {
    # A model-matrix test suite's fixture GRANITE_H_TINY_HF (public copy: find_string id 65865534003,
    # the suite whose Falcon-H1 fixtures presets/falcon_h1.py cites), the keys of
    # ibm-granite/granite-4.0-h-tiny's config.json that shape a tensor: width 1536, 40 layers of the
    # order above, 12 heads over 4 key-value heads, 64 experts of 512 (6 per token) beside a shared one
    # of 1024, vocabulary 100352 tied, Mamba-2 of 48 heads of 64, one group, state 128, conv 4, chunk
    # 256, context 131072. The rest at transformers' defaults (configuration_granitemoehybrid.py): no
    # attention bias, a conv bias and no projection bias in the mixers, position_embedding_type None
    # (no rotary embedding: GraniteMoeHybridModel builds one only for "rope"), and the multipliers, which
    # scale values and shape no tensor. bfloat16, the dtype of Granite 4.0's checkpoints.
    "ibm-granite/granite-4.0-h-tiny": {
        "model_type": "granitemoehybrid",
        "architectures": ["GraniteMoeHybridForCausalLM"],
        "hidden_size": 1536,
        "intermediate_size": 512,
        "layer_types": _H_TINY_LAYERS,
        "mamba_chunk_size": 256,
        "mamba_d_conv": 4,
        "mamba_d_head": 64,
        "mamba_d_state": 128,
        "mamba_expand": 2,
        "mamba_n_groups": 1,
        "mamba_n_heads": 48,
        "max_position_embeddings": 131072,
        "num_attention_heads": 12,
        "num_experts_per_tok": 6,
        "num_hidden_layers": 40,
        "num_key_value_heads": 4,
        "num_local_experts": 64,
        "shared_intermediate_size": 1024,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "vocab_size": 100352,
    },
}
