"""Tencent's Hunyuan dense presets (model_type hunyuan_v1_dense: Llama's block with each query and key
head RMS-normed after the rotary embedding), for Axolotl's hunyuan example.

transformers 5.24 ships the model type (models/hunyuan_v1_dense); the checkpoints need no remote code.
"""

from __future__ import annotations

from typing import Any

HUNYUAN_PRESETS: dict[str, dict[str, Any]] = {
    # tencent/Hunyuan-0.5B-Instruct. Its text model is HunyuanOCR's, whose config.json a Rust port's
    # test copies (HUNYUAN_OCR_1_5 text_config, find_string id 71125665966; vllm-omni's MammothModa2.5
    # test "HunyuanOCR config.json dimensions", id 69258771363, agrees): width 1024, 24 layers, 16
    # query / 8 key-value heads of 128, MLP 3584, vocabulary 120818, embeddings tied, rms eps 1e-5.
    # An interpretability library's Hunyuan family module, read from Hunyuan-0.5B-Pretrain's config
    # (id 71289480038), gives the same heads, 24 blocks, q/k norm, the tie "on every checkpoint" and
    # rope_scaling {"type": "dynamic", "alpha": 1000.0} with rope_theta 10000 (the alpha raises the
    # rotary base only: no tensor's shape). max_position_embeddings: no public copy of the 0.5B's was
    # found; 262144 is the same release's 4B's (a model-matrix suite's HUNYUAN_4B_HF, id 65865534003,
    # vocabulary 120818 as here), the family's 256K context of the model cards. No biases (the
    # HunYuanDenseV1Config defaults, as the family's copies have them); bfloat16.
    "tencent/Hunyuan-0.5B-Instruct": {
        "model_type": "hunyuan_v1_dense",
        "architectures": ["HunYuanDenseV1ForCausalLM"],
        "attention_bias": False,
        "head_dim": 128,
        "hidden_act": "silu",
        "hidden_size": 1024,
        "intermediate_size": 3584,
        "max_position_embeddings": 262144,
        "mlp_bias": False,
        "num_attention_heads": 16,
        "num_hidden_layers": 24,
        "num_key_value_heads": 8,
        "rms_norm_eps": 1e-05,
        "rope_scaling": {"type": "dynamic", "alpha": 1000.0, "factor": 1.0},
        "rope_theta": 10000.0,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "use_qk_norm": True,
        "vocab_size": 120818,
    },
}
