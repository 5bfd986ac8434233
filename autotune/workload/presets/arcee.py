"""Arcee AI's presets of Axolotl's example configs: AFM-4.5B (model_type arcee: Llama's block with a
squared-ReLU MLP without gate) and Trinity-Nano-Preview (model_type afmoe: 128 routed experts and a
shared one, three sliding-window layers of four, gated attention).

Each config.json value is copied from a public source named beside it. transformers 5.24 ships both
model types (models/arcee, models/afmoe); Trinity's config.json also names its own code in auto_map,
which a config with trust_remote_code: true would load instead (workload/remote_code.py REMOTE_CODE).
"""

from __future__ import annotations

from typing import Any

ARCEE_PRESETS: dict[str, dict[str, Any]] = {
    # arcee-ai/AFM-4.5B (https://huggingface.co/arcee-ai/AFM-4.5B/blob/main/config.json): a public AWS
    # NeuronX inference port's NeuronArceeForCausalLM docstring, "Load config from HF config.json dict"
    # (its repository and path not locatable by search; every value below checked in it): width 2560,
    # 36 layers, 20 query / 4 key-value heads of 128, squared-ReLU MLP of 18432, vocabulary 128004
    # untied, 65536 positions by YaRN (factor 20 from 4096), rope_theta 10000, no biases, pad id 0. The
    # Instruct (AFM-4.5B, the corpus's) and the Base share the shapes; bfloat16, the checkpoint's dtype.
    "arcee-ai/AFM-4.5B": {
        "model_type": "arcee",
        "architectures": ["ArceeForCausalLM"],
        "attention_bias": False,
        "head_dim": 128,
        "hidden_act": "relu2",
        "hidden_size": 2560,
        "intermediate_size": 18432,
        "max_position_embeddings": 65536,
        "mlp_bias": False,
        "num_attention_heads": 20,
        "num_hidden_layers": 36,
        "num_key_value_heads": 4,
        "pad_token_id": 0,
        "rms_norm_eps": 1e-05,
        "rope_scaling": {"rope_type": "yarn", "factor": 20.0, "original_max_position_embeddings": 4096},
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "vocab_size": 128004,
    },
    # arcee-ai/Trinity-Nano-Preview (https://huggingface.co/arcee-ai/Trinity-Nano-Preview/blob/main/
    # config.json): NANO_CONFIG of a Trinity NeuronX port's test/unit/test_config.py, "matches
    # arcee-ai/Trinity-Nano-Preview/config.json" (the port's contrib/models/Trinity lives in
    # aws-neuron/neuronx-distributed-inference; that test file is not in its indexed tree), key for key
    # less auto_map and use_cache: width 1024, 56 layers, 8 query / 2
    # key-value heads of 128, dense MLP 3072 in the first 2 layers, then 128 experts of 256 (8 a token,
    # sigmoid scores, one group) and one shared expert, a 2048-token window with every 4th layer global
    # (global_attn_every_n_layers 4: AfmoeConfig derives layer_types from it), vocabulary 200192 untied.
    "arcee-ai/Trinity-Nano-Preview": {
        "model_type": "afmoe",
        "architectures": ["AfmoeForCausalLM"],
        "attention_dropout": 0.0,
        "global_attn_every_n_layers": 4,
        "head_dim": 128,
        "hidden_act": "silu",
        "hidden_size": 1024,
        "initializer_range": 0.02,
        "intermediate_size": 3072,
        "max_position_embeddings": 131072,
        "moe_intermediate_size": 256,
        "mup_enabled": True,
        "n_group": 1,
        "num_attention_heads": 8,
        "num_dense_layers": 2,
        "num_expert_groups": 1,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "num_hidden_layers": 56,
        "num_key_value_heads": 2,
        "num_limited_groups": 1,
        "num_shared_experts": 1,
        "rms_norm_eps": 1e-05,
        "rope_scaling": None,
        "rope_theta": 10000,
        "route_norm": True,
        "route_scale": 2.826,
        "score_func": "sigmoid",
        "sliding_window": 2048,
        "tie_word_embeddings": False,
        "topk_group": 1,
        "torch_dtype": "bfloat16",
        "use_grouped_mm": True,
        "vocab_size": 200192,
    },
}
