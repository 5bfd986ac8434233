"""The offline model presets: the published hyperparameters of common checkpoints, as data.

Hyperparameters from each checkpoint's config.json on the Hugging Face hub. Keys that do not
change the model's size or memory (id2label, use_cache, dropout defaults equal to transformers'
own) are left out; everything that shapes a tensor is copied exactly, and so is ``torch_dtype``,
the dtype ``from_pretrained`` loads the weights in. ``architectures`` is kept for the decoder
presets because it decides the default task (a ``*ForCausalLM`` -> causal-lm); the encoder
presets (BERT-era and ModernBERT) stay without it, so that their default task is
sequence-classification, the fine-tuning task of the stories. The tests check the parameter
counts against published totals. Resolution (a name to a config) is ``models.py``.
"""

from __future__ import annotations

from typing import Any

_BERT_BASE = {
    "model_type": "bert",
    "hidden_size": 768,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "intermediate_size": 3072,
    "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1,
    "attention_probs_dropout_prob": 0.1,
    "max_position_embeddings": 512,
    "type_vocab_size": 2,
    "initializer_range": 0.02,
    "layer_norm_eps": 1e-12,
    "pad_token_id": 0,
    "vocab_size": 30522,
}
_BERT_LARGE = {
    **_BERT_BASE,
    "hidden_size": 1024,
    "num_hidden_layers": 24,
    "num_attention_heads": 16,
    "intermediate_size": 4096,
}
_ROBERTA_BASE = {
    "model_type": "roberta",
    "hidden_size": 768,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "intermediate_size": 3072,
    "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1,
    "attention_probs_dropout_prob": 0.1,
    "max_position_embeddings": 514,
    "type_vocab_size": 1,
    "initializer_range": 0.02,
    "layer_norm_eps": 1e-05,
    "bos_token_id": 0,
    "pad_token_id": 1,
    "eos_token_id": 2,
    "vocab_size": 50265,
}
_LARGE = {
    "hidden_size": 1024,
    "num_hidden_layers": 24,
    "num_attention_heads": 16,
    "intermediate_size": 4096,
}
_XLM_ROBERTA_BASE = {**_ROBERTA_BASE, "model_type": "xlm-roberta", "vocab_size": 250002}
_DEBERTA_V3_BASE = {
    "model_type": "deberta-v2",
    "hidden_size": 768,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "intermediate_size": 3072,
    "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1,
    "attention_probs_dropout_prob": 0.1,
    # Relative positions (position_buckets), but the config says 512 and the released
    # model was trained at 512, so 512 is the limit autotune enforces.
    "max_position_embeddings": 512,
    "relative_attention": True,
    "position_buckets": 256,
    "norm_rel_ebd": "layer_norm",
    "share_att_key": True,
    "pos_att_type": "p2c|c2p",
    "layer_norm_eps": 1e-07,
    "max_relative_positions": -1,
    "position_biased_input": False,
    "type_vocab_size": 0,
    "initializer_range": 0.02,
    "vocab_size": 128100,
}
_GPT2 = {
    "model_type": "gpt2",
    "activation_function": "gelu_new",
    "n_embd": 768,
    "n_layer": 12,
    "n_head": 12,
    "n_positions": 1024,
    "n_ctx": 1024,
    "attn_pdrop": 0.1,
    "embd_pdrop": 0.1,
    "resid_pdrop": 0.1,
    "layer_norm_epsilon": 1e-05,
    "initializer_range": 0.02,
    "bos_token_id": 50256,
    "eos_token_id": 50256,
    "vocab_size": 50257,
}

# --- decoder LLMs and ModernBERT (config.json as published; transformers 5 maps torch_dtype to
# dtype and rope_scaling/rope_theta to rope_parameters) ---------------------------------------
_LLAMA_3 = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
    "hidden_act": "silu",
    "initializer_range": 0.02,
    "max_position_embeddings": 131072,
    "mlp_bias": False,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0,
    "torch_dtype": "bfloat16",
    "vocab_size": 128256,
}
_LLAMA_3_ROPE = {  # "llama3" frequency scaling from an 8192-token original context
    "high_freq_factor": 4.0,
    "low_freq_factor": 1.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3",
}
_LLAMA_3_2 = {
    **_LLAMA_3,
    "intermediate_size": 8192,
    "rope_scaling": {"factor": 32.0, **_LLAMA_3_ROPE},
    "tie_word_embeddings": True,
}
_QWEN_2_5 = {
    "model_type": "qwen2",
    "architectures": ["Qwen2ForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151643,
    "hidden_act": "silu",
    "initializer_range": 0.02,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "use_mrope": False,
    "use_sliding_window": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 151936,
}
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
_MODERNBERT_BASE = {
    "model_type": "modernbert",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 50281,
    "classifier_activation": "gelu",
    "classifier_bias": False,
    "classifier_dropout": 0.0,
    "classifier_pooling": "mean",
    "cls_token_id": 50281,
    "decoder_bias": True,
    "embedding_dropout": 0.0,
    "eos_token_id": 50282,
    # Every third layer attends globally, the others within a 128-token window.
    "global_attn_every_n_layers": 3,
    "global_rope_theta": 160000.0,
    "hidden_activation": "gelu",
    "hidden_size": 768,
    "initializer_cutoff_factor": 2.0,
    "initializer_range": 0.02,
    "intermediate_size": 1152,
    "layer_norm_eps": 1e-05,
    "local_attention": 128,
    "local_rope_theta": 10000.0,
    "max_position_embeddings": 8192,
    "mlp_bias": False,
    "mlp_dropout": 0.0,
    "norm_bias": False,
    "norm_eps": 1e-05,
    "num_attention_heads": 12,
    "num_hidden_layers": 22,
    "pad_token_id": 50283,
    "sep_token_id": 50282,
    "tie_word_embeddings": True,
    "torch_dtype": "float32",
    "vocab_size": 50368,
}

_GEMMA_2 = {
    "model_type": "gemma2",
    "architectures": ["Gemma2ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "attn_logit_softcapping": 50.0,
    "bos_token_id": 2,
    "cache_implementation": "hybrid",
    "eos_token_id": 1,
    "final_logit_softcapping": 30.0,
    "head_dim": 256,
    "hidden_act": "gelu_pytorch_tanh",
    "hidden_activation": "gelu_pytorch_tanh",
    "initializer_range": 0.02,
    "max_position_embeddings": 8192,
    "pad_token_id": 0,
    "query_pre_attn_scalar": 256,
    "rms_norm_eps": 1e-06,
    "rope_theta": 10000.0,
    # Alternating layers: sliding (4096-token window) and global attention.
    "sliding_window": 4096,
    # The base checkpoints are published in float32 (their -it siblings in bfloat16).
    "torch_dtype": "float32",
    "vocab_size": 256000,
}
_MIXTRAL = {
    "model_type": "mixtral",
    "architectures": ["MixtralForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "hidden_act": "silu",
    "initializer_range": 0.02,
    "num_experts_per_tok": 2,
    "num_key_value_heads": 8,
    "num_local_experts": 8,
    "output_router_logits": False,
    "rms_norm_eps": 1e-05,
    "rope_theta": 1000000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 32000,
}
# Qwen3 dense (Qwen/Qwen3-0.6B ... 32B, config.json as published; the 0.6B and 1.7B copied in
# mlc-ai/mlc-llm python/mlc_llm/model/model_preset.py, the 4B to 32B in citsjtu2020/LLM-Prof
# sglang/Model_Config.md, the shapes also in pytorch/torchtune torchtune/models/qwen3/_model_builders.py).
# Qwen2's blocks with an RMSNorm on each head's query and key (head_dim 128 at every size).
_QWEN_3 = {
    "model_type": "qwen3",
    "architectures": ["Qwen3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "head_dim": 128,
    "hidden_act": "silu",
    "initializer_range": 0.02,
    # The -Base checkpoints say 32768; Qwen3-4B-Instruct-2507 says 262144 (rope_theta 5e6), with
    # the same shapes as Qwen3-4B.
    "max_position_embeddings": 40960,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "sliding_window": None,
    "use_sliding_window": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 151936,
}
# Gemma 3 text-only checkpoints (gemma3_text): five sliding-window layers (512 tokens) to each
# global one, a norm on each head's query and key, one key/value head. Shapes from transformers'
# src/transformers/models/gemma3/convert_gemma3_weights.py (the variants gemma3_270m and gemma3_1b,
# which wrote these checkpoints, in bfloat16 by default); the 1B's config.json as published for
# gemma-3-1b-it (same shapes as -pt) in mlc-ai/mlc-llm python/mlc_llm/model/model_preset.py.
# Token ids left at Gemma3TextConfig's defaults (pad 0, eos 1, bos 2), the pretrained ones.
_GEMMA_3_TEXT = {
    "model_type": "gemma3_text",
    "architectures": ["Gemma3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "attn_logit_softcapping": None,
    "final_logit_softcapping": None,
    "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh",
    "initializer_range": 0.02,
    "max_position_embeddings": 32768,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "query_pre_attn_scalar": 256,
    "rms_norm_eps": 1e-06,
    "rope_local_base_freq": 10000.0,  # the sliding layers' rotary base; rope_theta the global ones'
    "rope_scaling": None,
    "rope_theta": 1000000.0,
    "sliding_window": 512,
    "sliding_window_pattern": 6,  # transformers 5 turns it into layer_types
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "vocab_size": 262144,
}
# SmolLM2 (HuggingFaceTB/SmolLM2-135M, -360M, -1.7B): Llama blocks, tied embeddings, 8192
# positions. Shapes in Lightning-AI/litgpt litgpt/config.py and, as the -Instruct config.json
# (same shapes), mlc-ai/mlc-llm python/mlc_llm/model/model_preset.py.
_SMOLLM2 = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "hidden_act": "silu",
    "max_position_embeddings": 8192,
    "mlp_bias": False,
    "rms_norm_eps": 1e-05,
    "rope_scaling": None,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "vocab_size": 49152,
}
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

# --- vision-language models (task image-text-to-text: workload/vision.py) ----------------------
# Qwen2-VL and Qwen2.5-VL 7B: config.json as published, in the flat form the hub keeps (the text
# model's keys at the top, Qwen2VLConfig moves them to text_config). Qwen2-VL-7B-Instruct's values
# are transformers' Qwen2VLVisionConfig defaults (configuration_qwen2_vl.py, documented as that
# checkpoint's) for the vision tower; its text shapes, with Qwen2.5-VL's whole config, as copied in
# public code: Qwen2.5-VL-7B-Instruct's config.json as keyword arguments in a Qwen-Image text encoder
# (the module tree printed in zhenhua32/Qwen2-VL READ.md and acproject/duorou docs/qwen2.5vl_graph.md
# gives the same shapes). Their token ids: <|vision_start|> 151652 ... <|video_pad|> 151656.
_QWEN_VL_TOKENS = {
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "vision_start_token_id": 151652,
    "vision_end_token_id": 151653,
    "vision_token_id": 151654,
    "image_token_id": 151655,
    "video_token_id": 151656,
}
_QWEN_VL_7B_TEXT = {
    **_QWEN_VL_TOKENS,
    "attention_dropout": 0.0,
    "hidden_act": "silu",
    "hidden_size": 3584,
    "initializer_range": 0.02,
    "intermediate_size": 18944,
    "max_window_layers": 28,
    "num_attention_heads": 28,
    "num_hidden_layers": 28,
    "num_key_value_heads": 4,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
    "sliding_window": 32768,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_sliding_window": False,
    "vocab_size": 152064,
}
# Gemma 3 from 4B up (Gemma3ForConditionalGeneration): the keys of the -it config.json outside
# text_config, the same at every size (below).
_GEMMA_3_IT = {
    "model_type": "gemma3",
    "architectures": ["Gemma3ForConditionalGeneration"],
    "boi_token_index": 255999,
    "eoi_token_index": 256000,
    "eos_token_id": [1, 106],
    "image_token_index": 262144,
    "initializer_range": 0.02,
    "mm_tokens_per_image": 256,
    "torch_dtype": "bfloat16",
    "vision_config": {
        "hidden_size": 1152,
        "image_size": 896,
        "intermediate_size": 4304,
        "model_type": "siglip_vision_model",
        "num_attention_heads": 16,
        "num_hidden_layers": 27,
        "patch_size": 14,
        "vision_use_head": False,
    },
}
_VLM_PRESETS: dict[str, dict[str, Any]] = {
    "Qwen/Qwen2-VL-7B-Instruct": {
        "model_type": "qwen2_vl",
        "architectures": ["Qwen2VLForConditionalGeneration"],
        **_QWEN_VL_7B_TEXT,
        "max_position_embeddings": 32768,
        "vision_config": {
            "depth": 32,
            "embed_dim": 1280,
            "hidden_act": "quick_gelu",
            "hidden_size": 3584,
            "in_channels": 3,
            "mlp_ratio": 4,
            "num_heads": 16,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
        },
    },
    "Qwen/Qwen2.5-VL-7B-Instruct": {
        "model_type": "qwen2_5_vl",
        "architectures": ["Qwen2_5_VLForConditionalGeneration"],
        **_QWEN_VL_7B_TEXT,
        "max_position_embeddings": 128000,
        "vision_config": {
            "depth": 32,
            "fullatt_block_indexes": [7, 15, 23, 31],  # the others attend within 112-pixel windows
            "hidden_act": "silu",
            "hidden_size": 1280,
            "in_channels": 3,
            "intermediate_size": 3420,
            "num_heads": 16,
            "out_hidden_size": 3584,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "tokens_per_second": 2,
            "window_size": 112,
        },
    },
    # llava-hf/llava-1.5-7b-hf: CLIP ViT-L/14 at 336 pixels (its vision_config is transformers'
    # LlavaConfig default, configuration_llava.py, documented as this checkpoint's), a 2-layer GELU
    # projector, Vicuna-7B v1.5 (Llama-2-7B shapes, LlamaConfig's defaults) with 64 more token rows
    # (vocab 32064: <image> is 32000, <pad> 32001). Published in float16.
    "llava-hf/llava-1.5-7b-hf": {
        "model_type": "llava",
        "architectures": ["LlavaForConditionalGeneration"],
        "ignore_index": -100,
        "image_token_index": 32000,
        "pad_token_id": 32001,
        "projector_hidden_act": "gelu",
        "text_config": {
            "architectures": ["LlamaForCausalLM"],
            "max_position_embeddings": 4096,
            "model_type": "llama",
            "rms_norm_eps": 1e-05,
            "torch_dtype": "float16",
            "vocab_size": 32064,
        },
        "tie_word_embeddings": False,
        "torch_dtype": "float16",
        "vision_config": {
            "hidden_size": 1024,
            "image_size": 336,
            "intermediate_size": 4096,
            "model_type": "clip_vision_model",
            "num_attention_heads": 16,
            "num_hidden_layers": 24,
            "patch_size": 14,
            "projection_dim": 768,
            "vocab_size": 32000,
        },
        "vision_feature_layer": -2,
        "vision_feature_select_strategy": "default",
    },
    # google/gemma-3-4b-it: Gemma3Config's own defaults are this checkpoint's (configuration_gemma3.py,
    # documented as google/gemma-3-4b-it: 256 tokens an image, boi 255999, eoi 256000, image 262144);
    # the config.json sets in text_config 2560 hidden, 10240 intermediate, 34 layers, a 1024-token
    # window and linear rope scaling by 8 (the rest Gemma3TextConfig's defaults: 8 heads, 4 key/value
    # heads of 256, vocab 262208), and a SigLIP so400m tower at 896 pixels (27 layers of 1152).
    "google/gemma-3-4b-it": {
        **_GEMMA_3_IT,
        "text_config": {
            "hidden_size": 2560,
            "intermediate_size": 10240,
            "model_type": "gemma3_text",
            "num_hidden_layers": 34,
            "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
            "sliding_window": 1024,
        },
    },
    # google/gemma-3-12b-it and -27b-it: the 4B's release (Gemma3Config's defaults above, the same
    # SigLIP tower at 896 pixels, 256 tokens an image), larger text models. Their text_config as
    # Lightning-AI/litgpt litgpt/config.py gives it ("Gemma-3-12b-it", "Gemma-3-27b-it", from their
    # config.json: n_embd -> hidden_size, n_layer -> num_hidden_layers, n_head ->
    # num_attention_heads, n_query_groups -> num_key_value_heads, head_size -> head_dim,
    # attention_scores_scalar -> query_pre_attn_scalar, sliding_window_size -> sliding_window,
    # rope_adjustments factor -> linear rope scaling). The 27B's config.json is also in
    # NVIDIA/TensorRT-LLM tests/unittest/_torch/modeling/test_modeling_gemma3vl.py (GEMMA3_27B_MINI_CONFIG,
    # its layers and window cut for the test, the rest as above); the 12B's, as transformers 4.57
    # writes it, in an LTX-2 text encoder (Gemma3ForConditionalGeneration subclass LTX2TextEncoder:
    # head_dim 256, query_pre_attn_scalar 256, text vocabulary 262208, Gemma3TextConfig's defaults).
    "google/gemma-3-12b-it": {
        **_GEMMA_3_IT,
        "text_config": {
            "hidden_size": 3840,
            "intermediate_size": 15360,
            "model_type": "gemma3_text",
            "num_attention_heads": 16,
            "num_hidden_layers": 48,
            "num_key_value_heads": 8,
            "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
            "sliding_window": 1024,
        },
    },
    "google/gemma-3-27b-it": {
        **_GEMMA_3_IT,
        "text_config": {
            "head_dim": 128,
            "hidden_size": 5376,
            "intermediate_size": 21504,
            "model_type": "gemma3_text",
            "num_attention_heads": 32,
            "num_hidden_layers": 62,
            "num_key_value_heads": 16,
            "query_pre_attn_scalar": 168,
            "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
            "sliding_window": 1024,
        },
    },
}

_FULL_PRESETS: dict[str, dict[str, Any]] = {
    "bert-base-uncased": _BERT_BASE,
    "bert-base-cased": {**_BERT_BASE, "vocab_size": 28996},
    "bert-large-uncased": _BERT_LARGE,
    "bert-large-cased": {**_BERT_LARGE, "vocab_size": 28996},
    "bert-base-chinese": {**_BERT_BASE, "vocab_size": 21128},
    "bert-base-multilingual-cased": {**_BERT_BASE, "vocab_size": 119547},
    "cl-tohoku/bert-base-japanese": {**_BERT_BASE, "vocab_size": 32000},
    "distilbert-base-uncased": {
        "model_type": "distilbert",
        "dim": 768,
        "n_layers": 6,
        "n_heads": 12,
        "hidden_dim": 3072,
        "activation": "gelu",
        "dropout": 0.1,
        "attention_dropout": 0.1,
        "max_position_embeddings": 512,
        "sinusoidal_pos_embds": False,
        "initializer_range": 0.02,
        "qa_dropout": 0.1,
        "seq_classif_dropout": 0.2,
        "pad_token_id": 0,
        "vocab_size": 30522,
    },
    "roberta-base": _ROBERTA_BASE,
    "roberta-large": {**_ROBERTA_BASE, **_LARGE},
    "xlm-roberta-base": _XLM_ROBERTA_BASE,
    "xlm-roberta-large": {**_XLM_ROBERTA_BASE, **_LARGE},
    "albert-base-v2": {
        "model_type": "albert",
        "embedding_size": 128,
        "hidden_size": 768,
        "num_hidden_layers": 12,
        "num_hidden_groups": 1,
        "inner_group_num": 1,
        "num_attention_heads": 12,
        "intermediate_size": 3072,
        "hidden_act": "gelu_new",
        "hidden_dropout_prob": 0,
        "attention_probs_dropout_prob": 0,
        "classifier_dropout_prob": 0.1,
        "max_position_embeddings": 512,
        "type_vocab_size": 2,
        "initializer_range": 0.02,
        "layer_norm_eps": 1e-12,
        "bos_token_id": 2,
        "eos_token_id": 3,
        "pad_token_id": 0,
        "vocab_size": 30000,
    },
    "microsoft/deberta-v3-base": _DEBERTA_V3_BASE,
    "microsoft/deberta-v3-large": {**_DEBERTA_V3_BASE, **_LARGE},
    "google/electra-base-discriminator": {
        **_BERT_BASE,
        "model_type": "electra",
        "embedding_size": 768,
    },
    "gpt2": _GPT2,
    "gpt2-medium": {**_GPT2, "n_embd": 1024, "n_layer": 24, "n_head": 16},
    "meta-llama/Llama-3.2-1B": {
        **_LLAMA_3_2,
        "head_dim": 64,
        "hidden_size": 2048,
        "num_attention_heads": 32,
        "num_hidden_layers": 16,
    },
    "meta-llama/Llama-3.2-3B": {
        **_LLAMA_3_2,
        "head_dim": 128,
        "hidden_size": 3072,
        "num_attention_heads": 24,
        "num_hidden_layers": 28,
    },
    "meta-llama/Llama-3.1-8B": {
        **_LLAMA_3,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_attention_heads": 32,
        "num_hidden_layers": 32,
        "rope_scaling": {"factor": 8.0, **_LLAMA_3_ROPE},
        "tie_word_embeddings": False,
    },
    # meta-llama/Meta-Llama-3-70B's config.json in scaleapi/llm-engine
    # model-engine/tests/unit/domain/test_llm_use_cases.py (the "llama-3-70b" case): Llama 3's 8192
    # positions without rope scaling (3.1 added it); shapes also in Lightning-AI/litgpt
    # litgpt/config.py ("Llama-3-70B{}").
    "meta-llama/Meta-Llama-3-70B": {
        **_LLAMA_3,
        "hidden_size": 8192,
        "intermediate_size": 28672,
        "max_position_embeddings": 8192,
        "num_attention_heads": 64,
        "num_hidden_layers": 80,
        "rope_scaling": None,
        "tie_word_embeddings": False,
    },
    "Qwen/Qwen2.5-0.5B": {
        **_QWEN_2_5,
        "hidden_size": 896,
        "intermediate_size": 4864,
        "max_position_embeddings": 32768,
        "max_window_layers": 24,
        "num_attention_heads": 14,
        "num_hidden_layers": 24,
        "num_key_value_heads": 2,
        "sliding_window": 32768,
        "tie_word_embeddings": True,
    },
    "Qwen/Qwen2.5-1.5B": {
        **_QWEN_2_5,
        "hidden_size": 1536,
        "intermediate_size": 8960,
        "max_position_embeddings": 131072,
        "max_window_layers": 28,
        "num_attention_heads": 12,
        "num_hidden_layers": 28,
        "num_key_value_heads": 2,
        "sliding_window": 131072,
        "tie_word_embeddings": True,
    },
    "Qwen/Qwen2.5-3B": {  # config.json in citsjtu2020/LLM-Prof sglang/Model_Config.md
        **_QWEN_2_5,
        "hidden_size": 2048,
        "intermediate_size": 11008,
        "max_position_embeddings": 32768,
        "max_window_layers": 36,
        "num_attention_heads": 16,
        "num_hidden_layers": 36,
        "num_key_value_heads": 2,
        "sliding_window": 32768,
        "tie_word_embeddings": True,
    },
    "Qwen/Qwen2.5-7B": {
        **_QWEN_2_5,
        "hidden_size": 3584,
        "intermediate_size": 18944,
        "max_position_embeddings": 131072,
        "max_window_layers": 28,
        "num_attention_heads": 28,
        "num_hidden_layers": 28,
        "num_key_value_heads": 4,
        "sliding_window": 131072,
        "tie_word_embeddings": False,
        "vocab_size": 152064,
    },
    "Qwen/Qwen2.5-14B": {  # config.json in citsjtu2020/LLM-Prof sglang/Model_Config.md
        **_QWEN_2_5,
        "hidden_size": 5120,
        "intermediate_size": 13824,
        "max_position_embeddings": 131072,
        "max_window_layers": 48,
        "num_attention_heads": 40,
        "num_hidden_layers": 48,
        "num_key_value_heads": 8,
        "rms_norm_eps": 1e-05,
        "sliding_window": 131072,
        "tie_word_embeddings": False,
        "vocab_size": 152064,
    },
    # Qwen2.5-72B: shapes from Lightning-AI/litgpt litgpt/config.py ("Qwen2.5-72B{}", from its
    # config.json: n_layer 80, n_embd 8192, n_head 64, n_query_groups 8, intermediate_size 29568,
    # padded_vocab_size 152064, block_size 131072, norm_eps 1e-5, rope_base 1e6, q/k/v biases); the
    # rest as Qwen2-72B's config.json, which has these shapes, in Girafboy/pytorchKQI
    # example/evaluate.py ("Qwen2_72B": max_window_layers 80, sliding_window 131072, eos 151643).
    "Qwen/Qwen2.5-72B": {
        **_QWEN_2_5,
        "hidden_size": 8192,
        "intermediate_size": 29568,
        "max_position_embeddings": 131072,
        "max_window_layers": 80,
        "num_attention_heads": 64,
        "num_hidden_layers": 80,
        "num_key_value_heads": 8,
        "rms_norm_eps": 1e-05,
        "sliding_window": 131072,
        "tie_word_embeddings": False,
        "vocab_size": 152064,
    },
    "Qwen/Qwen3-0.6B": {
        **_QWEN_3,
        "hidden_size": 1024,
        "intermediate_size": 3072,
        "max_window_layers": 28,
        "num_attention_heads": 16,
        "num_hidden_layers": 28,
        "tie_word_embeddings": True,
    },
    "Qwen/Qwen3-1.7B": {
        **_QWEN_3,
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "max_window_layers": 28,
        "num_attention_heads": 16,
        "num_hidden_layers": 28,
        "tie_word_embeddings": True,
    },
    "Qwen/Qwen3-4B": {
        **_QWEN_3,
        "hidden_size": 2560,
        "intermediate_size": 9728,
        "max_window_layers": 36,
        "num_attention_heads": 32,
        "num_hidden_layers": 36,
        "tie_word_embeddings": True,
    },
    "Qwen/Qwen3-8B": {
        **_QWEN_3,
        "hidden_size": 4096,
        "intermediate_size": 12288,
        "max_window_layers": 36,
        "num_attention_heads": 32,
        "num_hidden_layers": 36,
        "tie_word_embeddings": False,
    },
    "Qwen/Qwen3-14B": {
        **_QWEN_3,
        "hidden_size": 5120,
        "intermediate_size": 17408,
        "max_window_layers": 40,
        "num_attention_heads": 40,
        "num_hidden_layers": 40,
        "tie_word_embeddings": False,
    },
    "Qwen/Qwen3-32B": {
        **_QWEN_3,
        "hidden_size": 5120,
        "intermediate_size": 25600,
        "max_window_layers": 64,
        "num_attention_heads": 64,
        "num_hidden_layers": 64,
        "tie_word_embeddings": False,
    },
    # Qwen3's mixture of experts: 48 layers of 128 experts, 8 routed per token, no shared expert;
    # config.json in citsjtu2020/LLM-Prof sglang/Model_Config.md. transformers 5 runs the experts
    # with grouped_mm (tokens x 8 rows, static shapes), in training and on fake tensors alike.
    "Qwen/Qwen3-30B-A3B": {
        **_QWEN_3,
        "model_type": "qwen3_moe",
        "architectures": ["Qwen3MoeForCausalLM"],
        "decoder_sparse_step": 1,
        "hidden_size": 2048,
        "intermediate_size": 6144,  # of dense layers, which mlp_only_layers (empty) would name
        "max_window_layers": 48,
        "mlp_only_layers": [],
        "moe_intermediate_size": 768,
        "norm_topk_prob": True,
        "num_attention_heads": 32,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "num_hidden_layers": 48,
        "num_key_value_heads": 4,
        "output_router_logits": False,
        "rope_theta": 1000000.0,
        "router_aux_loss_coef": 0.001,
        "tie_word_embeddings": False,
    },
    # Qwen3-235B-A22B: 94 layers of 128 experts, 8 routed per token. Shapes from Lightning-AI/litgpt
    # litgpt/config.py ("Qwen3-235B-A22B", from its config.json), mapped n_layer -> num_hidden_layers,
    # n_embd -> hidden_size, n_head -> num_attention_heads, n_query_groups -> num_key_value_heads,
    # head_size -> head_dim, padded_vocab_size -> vocab_size, block_size -> max_position_embeddings,
    # rope_base -> rope_theta, norm_eps -> rms_norm_eps, n_expert -> num_experts, n_expert_per_token
    # -> num_experts_per_tok, the two FFN widths as they are; the router keys as in Qwen3-30B-A3B's
    # config.json above (the same Qwen3MoE release). Its -Instruct-2507 has the same shapes (litgpt's
    # "Qwen3-235B-A22B-{}-2507": 262144 positions, rope_theta 5e6).
    "Qwen/Qwen3-235B-A22B": {
        **_QWEN_3,
        "model_type": "qwen3_moe",
        "architectures": ["Qwen3MoeForCausalLM"],
        "decoder_sparse_step": 1,
        "hidden_size": 4096,
        "intermediate_size": 12288,
        "max_window_layers": 94,
        "mlp_only_layers": [],
        "moe_intermediate_size": 1536,
        "norm_topk_prob": True,
        "num_attention_heads": 64,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "num_hidden_layers": 94,
        "num_key_value_heads": 4,
        "output_router_logits": False,
        "router_aux_loss_coef": 0.001,
        "tie_word_embeddings": False,
    },
    "mistralai/Mistral-7B-v0.3": {
        "model_type": "mistral",
        "architectures": ["MistralForCausalLM"],
        "attention_dropout": 0.0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "hidden_act": "silu",
        "hidden_size": 4096,
        "initializer_range": 0.02,
        "intermediate_size": 14336,
        "max_position_embeddings": 32768,
        "num_attention_heads": 32,
        "num_hidden_layers": 32,
        "num_key_value_heads": 8,
        "rms_norm_eps": 1e-05,
        "rope_theta": 1000000.0,
        "sliding_window": None,  # v0.3 dropped v0.1's 4096-token window
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "vocab_size": 32768,
    },
    # Mistral Small 3 (24B; Devstral-Small-2507 is a fine-tune of Mistral-Small-3.1's text model):
    # mistralai/Devstral-Small-2507's params.json (Mistral's own format) and model.safetensors.index.json,
    # in fetchwiki/mistralai-Devstral-Small-2507, mapped dim -> hidden_size, n_layers ->
    # num_hidden_layers, hidden_dim -> intermediate_size, n_heads -> num_attention_heads, n_kv_heads ->
    # num_key_value_heads, norm_eps -> rms_norm_eps, the rest by name. The index says 23,572,403,200
    # parameters in 47,144,806,400 bytes (bfloat16) with lm_head apart from embed_tokens (untied).
    # params.json names no context length: 131072 is the 128k window of the model card.
    "mistralai/Devstral-Small-2507": {
        "model_type": "mistral",
        "architectures": ["MistralForCausalLM"],
        "attention_dropout": 0.0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "head_dim": 128,
        "hidden_act": "silu",
        "hidden_size": 5120,
        "initializer_range": 0.02,
        "intermediate_size": 32768,
        "max_position_embeddings": 131072,
        "num_attention_heads": 32,
        "num_hidden_layers": 40,
        "num_key_value_heads": 8,
        "rms_norm_eps": 1e-05,
        "rope_theta": 1000000000.0,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "vocab_size": 131072,
    },
    # Mixtral (Mistral 7B's blocks, each MLP 8 experts of which 2 are routed per token): the
    # config.json of mistralai/Mixtral-8x7B-v0.1 and of Mixtral-8x22B-v0.1 (its base vocabulary of
    # 32000; the -Instruct's is 32768) in scaleapi/llm-engine
    # model-engine/tests/unit/domain/test_llm_use_cases.py (the "mixtral-8x7b" and "mixtral-8x22b"
    # cases); the 8x7B's also in NVIDIA/TensorRT-LLM tests/unittest/_torch/modeling/test_modeling_mixtral.py
    # and mlc-ai/mlc-llm python/mlc_llm/model/model_preset.py. transformers 5 runs the experts with
    # grouped_mm, as Qwen3's above.
    "mistralai/Mixtral-8x7B-v0.1": {
        **_MIXTRAL,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "max_position_embeddings": 32768,
        "num_attention_heads": 32,
        "num_hidden_layers": 32,
        "router_aux_loss_coef": 0.02,
        "sliding_window": None,
    },
    "mistralai/Mixtral-8x22B-v0.1": {
        **_MIXTRAL,
        "hidden_size": 6144,
        "intermediate_size": 16384,
        "max_position_embeddings": 65536,
        "num_attention_heads": 48,
        "num_hidden_layers": 56,
        "router_aux_loss_coef": 0.001,
        "router_jitter_noise": 0.0,
    },
    # swiss-ai/Apertus-8B-Instruct-2509 (same shapes as its base, Apertus-8B-2509): the config.json in
    # ollama/ollama's MLX runner tests (x/mlxrunner/model/apertus, TestParseConfigApertus8B). Llama
    # blocks with a norm on each head's query and key and an ungated MLP (up and down projections
    # around the xIELU activation); llama3 rope scaling from 8192 to 65536 positions. Its token ids
    # are not confirmed here and stay at ApertusConfig's defaults.
    "swiss-ai/Apertus-8B-Instruct-2509": {
        "model_type": "apertus",
        "architectures": ["ApertusForCausalLM"],
        "attention_bias": False,
        "hidden_act": "xielu",
        "hidden_size": 4096,
        "intermediate_size": 21504,
        "max_position_embeddings": 65536,
        "mlp_bias": False,
        "num_attention_heads": 32,
        "num_hidden_layers": 32,
        "num_key_value_heads": 8,
        "post_norm": False,
        "qk_norm": True,
        "rms_norm_eps": 1e-05,
        "rope_scaling": {"factor": 8.0, **_LLAMA_3_ROPE},
        "rope_theta": 12000000,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "vocab_size": 131072,
    },
    # ByteDance-Seed/Seed-OSS-36B-Instruct: the model card (ByteDance-Seed/seed-oss README.md, "Model
    # Summary": 64 layers, 80 / 8 / 8 query/key/value heads of 128 on a 5120 width, 155K vocabulary,
    # 512K context, rope base 1e7) and its config.json as copied in a Seed-OSS loader's tests (an MLX
    # port's SEED_OSS_36B_CONFIG, "mirrors the real checkpoint's config.json"): intermediate 27648,
    # vocab 155136, 524288 positions, q/k/v biases but none on o. Its dropouts (attention and
    # residual, 0.1: masks kept for the backward) are SeedOssConfig's defaults, documented as this
    # checkpoint's (transformers' configuration_seed_oss.py); bfloat16, the card's serving dtype.
    "ByteDance-Seed/Seed-OSS-36B-Instruct": {
        "model_type": "seed_oss",
        "architectures": ["SeedOssForCausalLM"],
        "attention_bias": True,
        "attention_dropout": 0.1,
        "attention_out_bias": False,
        "head_dim": 128,
        "hidden_act": "silu",
        "hidden_size": 5120,
        "intermediate_size": 27648,
        "max_position_embeddings": 524288,
        "mlp_bias": False,
        "num_attention_heads": 80,
        "num_hidden_layers": 64,
        "num_key_value_heads": 8,
        "residual_dropout": 0.1,
        "rms_norm_eps": 1e-06,
        "rope_theta": 10000000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "vocab_size": 155136,
    },
    "google/gemma-2-2b": {
        **_GEMMA_2,
        "hidden_size": 2304,
        "intermediate_size": 9216,
        "num_attention_heads": 8,
        "num_hidden_layers": 26,
        "num_key_value_heads": 4,
    },
    # google/gemma-2-9b's config.json, in Girafboy/pytorchKQI example/evaluate.py.
    "google/gemma-2-9b": {
        **_GEMMA_2,
        "hidden_size": 3584,
        "intermediate_size": 14336,
        "num_attention_heads": 16,
        "num_hidden_layers": 42,
        "num_key_value_heads": 8,
        "sliding_window_size": 4096,
    },
    "google/gemma-3-270m": {
        **_GEMMA_3_TEXT,
        "hidden_size": 640,
        "intermediate_size": 2048,
        "num_hidden_layers": 18,
    },
    "google/gemma-3-1b-pt": {
        **_GEMMA_3_TEXT,
        "hidden_size": 1152,
        "intermediate_size": 6912,
        "num_hidden_layers": 26,
    },
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
    # SmolLM2-135M's base config.json (bos and eos 0) is quoted in several repositories; the
    # larger two's token ids are not confirmed here and stay at LlamaConfig's defaults.
    "HuggingFaceTB/SmolLM2-135M": {
        **_SMOLLM2,
        "bos_token_id": 0,
        "eos_token_id": 0,
        "hidden_size": 576,
        "initializer_range": 0.041666666666666664,
        "intermediate_size": 1536,
        "num_attention_heads": 9,
        "num_hidden_layers": 30,
        "num_key_value_heads": 3,
        "rope_theta": 100000,
    },
    "HuggingFaceTB/SmolLM2-360M": {
        **_SMOLLM2,
        "hidden_size": 960,
        "initializer_range": 0.02,
        "intermediate_size": 2560,
        "num_attention_heads": 15,
        "num_hidden_layers": 32,
        "num_key_value_heads": 5,
        "rope_theta": 100000,
    },
    "HuggingFaceTB/SmolLM2-1.7B": {
        **_SMOLLM2,
        "hidden_size": 2048,
        "initializer_range": 0.02,
        "intermediate_size": 8192,
        "num_attention_heads": 32,
        "num_hidden_layers": 24,
        "num_key_value_heads": 32,
        "rope_theta": 130000,
    },
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
    # openai/gpt-oss-20b's config.json, in EchoCog/gpt-oss-20b config.json (its sizes also in
    # ParagEkbote/hf-model-inspector model_inspection_report.md): 24 layers of 32 experts, 4 routed
    # per token, attention alternating between a 128-token window and the full context. Its
    # quantization_config (the experts in MXFP4) is left out: autotune models the weights as loaded
    # for training. The config.json names no dtype; the unquantized weights are stored in bfloat16
    # and the experts dequantize to it, so bfloat16 is the dtype from_pretrained gives it.
    "openai/gpt-oss-20b": {
        "model_type": "gpt_oss",
        "architectures": ["GptOssForCausalLM"],
        "attention_bias": True,
        "attention_dropout": 0.0,
        "eos_token_id": 200002,
        "experts_per_token": 4,
        "head_dim": 64,
        "hidden_act": "silu",
        "hidden_size": 2880,
        "initial_context_length": 4096,
        "initializer_range": 0.02,
        "intermediate_size": 2880,
        "layer_types": ["sliding_attention", "full_attention"] * 12,
        "max_position_embeddings": 131072,
        "num_attention_heads": 64,
        "num_experts_per_tok": 4,
        "num_hidden_layers": 24,
        "num_key_value_heads": 8,
        "num_local_experts": 32,
        "output_router_logits": False,
        "pad_token_id": 199999,
        "rms_norm_eps": 1e-05,
        "rope_scaling": {
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "factor": 32.0,
            "original_max_position_embeddings": 4096,
            "rope_type": "yarn",
            "truncate": False,
        },
        "rope_theta": 150000,
        "router_aux_loss_coef": 0.9,
        "sliding_window": 128,
        "swiglu_limit": 7.0,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "vocab_size": 201088,
    },
    # deepseek-ai/DeepSeek-V2-Lite's config.json, in mlc-ai/mlc-llm python/mlc_llm/model/model_preset.py
    # ("deepseek_v2_lite"): multi-head latent attention (keys and values through a 512-wide
    # projection), 26 of its 27 layers of 64 routed experts (6 per token) and 2 shared ones. The
    # copy leaves out the checkpoint's "q_lora_rank": null (queries not compressed), which
    # mlc-llm's DeepseekV2Config defaults to None (python/mlc_llm/model/deepseek_v2/deepseek_v2_model.py);
    # transformers' default (1536) would add a query projection the model does not have.
    "deepseek-ai/DeepSeek-V2-Lite": {
        "model_type": "deepseek_v2",
        "architectures": ["DeepseekV2ForCausalLM"],
        "attention_bias": False,
        "bos_token_id": 100000,
        "eos_token_id": 100001,
        "first_k_dense_replace": 1,
        "hidden_act": "silu",
        "hidden_size": 2048,
        "initializer_range": 0.02,
        "intermediate_size": 10944,
        "kv_lora_rank": 512,
        "max_position_embeddings": 163840,
        "moe_intermediate_size": 1408,
        "moe_layer_freq": 1,
        "n_group": 1,
        "n_routed_experts": 64,
        "n_shared_experts": 2,
        "norm_topk_prob": False,
        "num_attention_heads": 16,
        "num_experts_per_tok": 6,
        "num_hidden_layers": 27,
        "num_key_value_heads": 16,
        "pretraining_tp": 1,
        "q_lora_rank": None,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "rms_norm_eps": 1e-06,
        "rope_scaling": {
            "beta_fast": 32,
            "beta_slow": 1,
            "factor": 40,
            "mscale": 0.707,
            "mscale_all_dim": 0.707,
            "original_max_position_embeddings": 4096,
            "type": "yarn",
        },
        "rope_theta": 10000,
        "routed_scaling_factor": 1.0,
        "scoring_func": "softmax",
        "topk_group": 1,
        "topk_method": "greedy",
        "torch_dtype": "bfloat16",
        "v_head_dim": 128,
        "vocab_size": 102400,
    },
    "answerdotai/ModernBERT-base": _MODERNBERT_BASE,
    "answerdotai/ModernBERT-large": {
        **_MODERNBERT_BASE,
        "hidden_size": 1024,
        "intermediate_size": 2624,
        "num_attention_heads": 16,
        "num_hidden_layers": 28,
    },
    **_VLM_PRESETS,
}

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
# A fixed-size tower of 56-pixel images in 14-pixel patches: 16 patches.
_TINY_VISION = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64,
                "image_size": 56, "patch_size": 14}
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
    "mixtral": {
        **_TINY_BERT,
        "num_key_value_heads": 1,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "architectures": ["MixtralForCausalLM"],
    },
    "gemma2": {
        **_TINY_BERT,
        "num_key_value_heads": 1,
        "head_dim": 16,  # Gemma 2's default is 256
        "query_pre_attn_scalar": 16,
        "sliding_window": 64,  # smaller than the context, so the sliding layers differ
        "architectures": ["Gemma2ForCausalLM"],
    },
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
        "vision_config": {"model_type": "siglip_vision_model", **_TINY_VISION},
        "mm_tokens_per_image": 4,  # 16 patches pooled 2 x 2
        "image_token_index": 100,
        "boi_token_index": 101,
        "eoi_token_index": 102,
        "architectures": ["Gemma3ForConditionalGeneration"],
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

PRESETS: dict[str, dict[str, Any]] = _FULL_PRESETS | {
    f"tiny-{model_type}": {"model_type": model_type, **kwargs} for model_type, kwargs in TINY_CONFIGS.items()
}

# Hub ids under which the same checkpoints are published (the hub moved the legacy
# un-namespaced models into organisations in 2024).
HUB_ALIASES: dict[str, str] = {
    "google-bert/bert-base-uncased": "bert-base-uncased",
    "google-bert/bert-base-cased": "bert-base-cased",
    "google-bert/bert-large-uncased": "bert-large-uncased",
    "google-bert/bert-large-cased": "bert-large-cased",
    "google-bert/bert-base-chinese": "bert-base-chinese",
    "google-bert/bert-base-multilingual-cased": "bert-base-multilingual-cased",
    "tohoku-nlp/bert-base-japanese": "cl-tohoku/bert-base-japanese",
    "distilbert/distilbert-base-uncased": "distilbert-base-uncased",
    "FacebookAI/roberta-base": "roberta-base",
    "FacebookAI/roberta-large": "roberta-large",
    "FacebookAI/xlm-roberta-base": "xlm-roberta-base",
    "FacebookAI/xlm-roberta-large": "xlm-roberta-large",
    "albert/albert-base-v2": "albert-base-v2",
    "openai-community/gpt2": "gpt2",
    "openai-community/gpt2-medium": "gpt2-medium",
    "meta-llama/Meta-Llama-3.1-8B": "meta-llama/Llama-3.1-8B",  # its name until late 2024
    # The 8x22B base was first published (from Mistral's torrent) under mistral-community.
    "mistral-community/Mixtral-8x22B-v0.1": "mistralai/Mixtral-8x22B-v0.1",
}


def _preset_index() -> dict[str, str]:
    """Lower-case name -> preset: the name, the name without its org, the hub aliases."""
    index: dict[str, str] = {}
    for name in PRESETS:
        index[name.lower()] = name
        index.setdefault(name.rsplit("/", 1)[-1].lower(), name)
    index.update({alias.lower(): name for alias, name in HUB_ALIASES.items()})
    return index


PRESET_INDEX = _preset_index()


def preset_name(name: str) -> str | None:
    """The preset `name` stands for (case-insensitive, org optional), or None. Here, not in
    models.py, so that a name can be told a preset without importing transformers (cli/answers.py)."""
    return PRESET_INDEX.get(name.strip().lower())
