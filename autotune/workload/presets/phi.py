"""Phi presets: Phi-3.5-mini (LongRoPE), Phi-1.5 and Phi-2."""

from __future__ import annotations

from typing import Any

# Phi-3.5-mini's LongRoPE rescale factors, one per rotary frequency (head_dim 96 / 2 = 48).
_PHI_3_5_LONG_FACTOR = [
    1.0800000429153442, 1.1100000143051147, 1.1399999856948853, 1.340000033378601,
    1.5899999141693115, 1.600000023841858, 1.6200000047683716, 2.620000123977661,
    3.2300000190734863, 3.2300000190734863, 4.789999961853027, 7.400000095367432,
    7.700000286102295, 9.09000015258789, 12.199999809265137, 17.670000076293945,
    24.46000099182129, 28.57000160217285, 30.420001983642578, 30.840002059936523,
    32.590003967285156, 32.93000411987305, 42.320003509521484, 44.96000289916992,
    50.340003967285156, 50.45000457763672, 57.55000305175781, 57.93000411987305,
    58.21000289916992, 60.1400032043457, 62.61000442504883, 62.62000274658203,
    62.71000289916992, 63.1400032043457, 63.1400032043457, 63.77000427246094,
    63.93000411987305, 63.96000289916992, 63.970001220703125, 64.02999877929688,
    64.06999969482422, 64.08000183105469, 64.12000274658203, 64.41000366210938,
    64.4800033569336, 64.51000213623047, 64.52999877929688, 64.83999633789062,
]
_PHI_3_5_SHORT_FACTOR = [
    1.0, 1.0199999809265137, 1.0299999713897705, 1.0299999713897705,
    1.0499999523162842, 1.0499999523162842, 1.0499999523162842, 1.0499999523162842,
    1.0499999523162842, 1.0699999332427979, 1.0999999046325684, 1.1099998950958252,
    1.1599998474121094, 1.1599998474121094, 1.1699998378753662, 1.2899998426437378,
    1.339999794960022, 1.679999828338623, 1.7899998426437378, 1.8199998140335083,
    1.8499997854232788, 1.8799997568130493, 1.9099997282028198, 1.9399996995925903,
    1.9899996519088745, 2.0199997425079346, 2.0199997425079346, 2.0199997425079346,
    2.0199997425079346, 2.0199997425079346, 2.0199997425079346, 2.0299997329711914,
    2.0299997329711914, 2.0299997329711914, 2.0299997329711914, 2.0299997329711914,
    2.0299997329711914, 2.0299997329711914, 2.0299997329711914, 2.0299997329711914,
    2.0799996852874756, 2.0899996757507324, 2.189999580383301, 2.2199995517730713,
    2.5899994373321533, 2.729999542236328, 2.749999523162842, 2.8399994373321533,
]
# Phi-1.5 and Phi-2 (model_type phi, as their config.json has said since transformers 4.37):
# parallel attention and MLP blocks, LayerNorm, partial rotary embeddings, untied lm_head with bias.
_PHI = {
    "model_type": "phi",
    "architectures": ["PhiForCausalLM"],
    "attention_dropout": 0.0,
    "embd_pdrop": 0.0,
    "hidden_act": "gelu_new",
    "initializer_range": 0.02,
    "layer_norm_eps": 1e-05,
    "max_position_embeddings": 2048,
    "num_attention_heads": 32,
    "qk_layernorm": False,
    "rope_scaling": None,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "float16",
    "vocab_size": 51200,
}

PHI_3_5_PRESETS: dict[str, dict[str, Any]] = {
    "microsoft/Phi-3.5-mini-instruct": {
        "model_type": "phi3",
        "architectures": ["Phi3ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 1,
        "embd_pdrop": 0.0,
        "eos_token_id": 32000,
        "hidden_act": "silu",
        "hidden_size": 3072,
        "initializer_range": 0.02,
        "intermediate_size": 8192,
        "max_position_embeddings": 131072,
        "num_attention_heads": 32,
        "num_hidden_layers": 32,
        "num_key_value_heads": 32,
        "original_max_position_embeddings": 4096,
        "pad_token_id": 32000,
        "resid_pdrop": 0.0,
        "rms_norm_eps": 1e-05,
        "rope_scaling": {
            "long_factor": _PHI_3_5_LONG_FACTOR,
            "short_factor": _PHI_3_5_SHORT_FACTOR,
            "type": "longrope",
        },
        "rope_theta": 10000.0,
        "sliding_window": 262144,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "vocab_size": 32064,
    },
}

PHI_PRESETS: dict[str, dict[str, Any]] = {
    # config.json of microsoft/phi-1_5 in Girafboy/pytorchKQI example/evaluate.py, of
    # microsoft/phi-2 in sdpython/onnx-diagnostic onnx_diagnostic/torch_models/untrained/llm_phi2.py.
    "microsoft/phi-1_5": {
        **_PHI,
        "bos_token_id": None,
        "eos_token_id": None,
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 24,
        "num_key_value_heads": None,
        "partial_rotary_factor": 0.5,  # rotary on 32 of the 64 dimensions of a head
        "resid_pdrop": 0.0,
    },
    "microsoft/phi-2": {
        **_PHI,
        "bos_token_id": 50256,
        "eos_token_id": 50256,
        "hidden_size": 2560,
        "intermediate_size": 10240,
        "num_hidden_layers": 32,
        "num_key_value_heads": 32,
        "partial_rotary_factor": 0.4,  # rotary on 32 of the 80 dimensions of a head
        "resid_pdrop": 0.1,
    },
}
