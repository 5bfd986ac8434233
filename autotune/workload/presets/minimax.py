"""MiniMax-M2 (model_type minimax_m2): 62 layers of full attention (48 heads over 8 key-value heads of
128, a query and key RMSNorm over all heads at once, RoPE on half of each head) and 256 experts of
width 1536, 8 routed per token by a sigmoid with a correction bias, no shared expert.

transformers' MiniMaxM2ForCausalLM is what is built. The checkpoint's config.json names its own
configuration_minimax_m2.py and modeling_minimax_m2.py in an auto_map (workload/remote_code.py
REMOTE_CODE), which a config with trust_remote_code: true would load instead. Its three
multi-token-prediction modules (use_mtp, num_mtp_modules 3) are not built by transformers
(MiniMaxM2Model: num_hidden_layers decoder layers only), nor counted in the published total.

Its hub checkpoint is saved in FP8 (workload/prequantized.py PUBLISHED_QUANTIZED): a check of this
preset is refused by name; the shapes here are its bfloat16 ones.
"""

from __future__ import annotations

from typing import Any

MINIMAX_PRESETS: dict[str, dict[str, Any]] = {
    # MiniMax-M2.5's config.json (the M2 architecture, MiniMaxM2ForCausalLM; M2, M2.1 and M2.5 are one
    # shape), https://huggingface.co/MiniMaxAI/MiniMax-M2.5/blob/main/config.json; checked against a
    # full copy in a public Ascend msmodelslim W8A8C16 quantization guide (quantization_config removed,
    # "transformers_version": "4.46.1"; its repository and path not locatable by search): the keys that
    # shape a tensor, as transformers' MiniMaxM2Config defaults give them too (vocabulary 200064, width 3072,
    # expert width 1536, 62 layers, 48/8 heads of 128, 256 experts, 8 per token, context 196608).
    # rotary_dim 64 is read by transformers 5 as partial_rotary_factor 0.5
    # (configuration_minimax_m2.py convert_rope_params_to_dict). The keys of the remote code that
    # transformers' config does not keep (attn_type_list: every layer full attention; the MTP keys;
    # qk_norm_type per_layer, use_qk_norm, use_routing_bias, scoring_func sigmoid: what transformers'
    # MiniMaxM2 modeling does without a key) are left out.
    "MiniMaxAI/MiniMax-M2": {
        "model_type": "minimax_m2",
        "architectures": ["MiniMaxM2ForCausalLM"],
        "head_dim": 128,
        "hidden_act": "silu",
        "hidden_size": 3072,
        "intermediate_size": 1536,
        "max_position_embeddings": 196608,
        "num_attention_heads": 48,
        "num_experts_per_tok": 8,
        "num_hidden_layers": 62,
        "num_key_value_heads": 8,
        "num_local_experts": 256,
        "rms_norm_eps": 1e-06,
        "rope_theta": 5000000,
        "rotary_dim": 64,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "vocab_size": 200064,
    },
}
