"""Mistral's vision-language presets (task image-text-to-text: autotune/workload/vision.py): Mistral 3
(Mistral Small 3.1, Magistral Small 1.2, Ministral 3, Mistral Medium 3.5), Mistral Small 4 and
Pixtral-12B. Their image processor is Pixtral's (dynamic resolution, vision.py ``pixtral_resize``); a
text-only step of one trains the whole checkpoint as Axolotl loads it (AutoModelForImageTextToText),
without images."""

from __future__ import annotations

from typing import Any

# The Pixtral tower of Mistral 3: transformers' Mistral3Config vision_config defaults
# (models/mistral3/configuration_mistral3.py, documented as mistralai/Mistral-Small-3.1-24B-Instruct-2503):
# 24 layers of 1024, 16 heads of 64, 14-pixel patches, images up to 1540 pixels a side; its rotary
# base PixtralVisionConfig's default (10000). Ministral 3 and Mistral Small 4 carry the same tower
# ("0.4B Vision Encoder", their model cards).
_MISTRAL3_TOWER = {
    "model_type": "pixtral",
    "head_dim": 64,
    "hidden_act": "gelu",
    "hidden_size": 1024,
    "image_size": 1540,
    "intermediate_size": 4096,
    "num_attention_heads": 16,
    "num_hidden_layers": 24,
    "patch_size": 14,
}
# The keys of a Mistral 3 config.json outside its text_config (Mistral3Config's defaults, above): the
# image token [IMG] is id 10, a 2x2 patch merger, a GELU projector without biases, the last layer's
# features.
_MISTRAL3 = {
    "model_type": "mistral3",
    "architectures": ["Mistral3ForConditionalGeneration"],
    "image_token_index": 10,
    "multimodal_projector_bias": False,
    "projector_hidden_act": "gelu",
    "spatial_merge_size": 2,
    "torch_dtype": "bfloat16",
    "vision_config": _MISTRAL3_TOWER,
    "vision_feature_layer": -1,
}
# Mistral Small 3.1 (24B): Mistral3Config's text_config defaults, the checkpoint's (the text model is
# Devstral-Small-2507's, decoders.py: 40 layers of 5120, 32 heads and 8 key/value heads of 128, an
# intermediate 32768, rope_theta 1e9, 128k positions), lm_head apart from embed_tokens. Mistral Small
# 3.2 and Magistral Small 1.2 (2509) are fine-tunes of it: keras-team/keras-hub's mistral3 presets give
# Mistral Small 3.1 (base and instruct) 24,011,361,280 parameters, as public inventories give the 3.2.
_MISTRAL_SMALL_3_1 = {
    **_MISTRAL3,
    "tie_word_embeddings": False,
    "text_config": {
        "model_type": "mistral",
        "attention_dropout": 0.0,
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
        "vocab_size": 131072,
    },
}
# Ministral 3's YaRN rotary scaling to 256k positions from 16k (Ministral3Config's default, documented
# as mistralai/Ministral-3-8B-Base-2512; the same in ERNIE-Image's copy of the 3B's text config below).
_MINISTRAL3_ROPE = {
    "rope_type": "yarn",
    "rope_theta": 1000000.0,
    "factor": 16.0,
    "original_max_position_embeddings": 16384,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
    "llama_4_scaling_beta": 0.1,
}

MISTRAL3_PRESETS: dict[str, dict[str, Any]] = {
    "mistralai/Mistral-Small-3.1-24B-Instruct-2503": _MISTRAL_SMALL_3_1,
    "mistralai/Magistral-Small-2509": _MISTRAL_SMALL_3_1,
    # Ministral 3 3B Reasoning 2512: a 3.4B ministral3 text model and the 0.4B tower (model card). Text
    # shapes as NVIDIA-NeMo's Megatron-Bridge docs give them (docs/models/vlm/ministral3.md: 26 layers
    # of 3072, 32 heads, 8 key/value groups) and as Blaizzy/mlx-vlm's ERNIE-Image text encoder copies
    # its config (ErnieImageTextConfig: intermediate 9216, head_dim 128, vocab 131072, 262144
    # positions, the YaRN above). Public listings of the hub's counts: Ministral-3-3B-Instruct-2512
    # 3,849,090,048 (language 3,429,006,336: embed_tokens and lm_head tied), the Reasoning checkpoint
    # 4,251,743,232, one 131072 x 3072 matrix more: its lm_head is stored apart, untied.
    "mistralai/Ministral-3-3B-Reasoning-2512": {
        **_MISTRAL3,
        "tie_word_embeddings": False,
        "text_config": {
            "model_type": "ministral3",
            "head_dim": 128,
            "hidden_act": "silu",
            "hidden_size": 3072,
            "intermediate_size": 9216,
            "max_position_embeddings": 262144,
            "num_attention_heads": 32,
            "num_hidden_layers": 26,
            "num_key_value_heads": 8,
            "rms_norm_eps": 1e-05,
            "rope_parameters": _MINISTRAL3_ROPE,
            "tie_word_embeddings": False,
            "vocab_size": 131072,
        },
    },
    # Mistral Small 4 (2603): Mistral 3's layout (the same Pixtral tower and 2x2 merger) over a mistral4
    # text model, an MLA mixture of experts. Its text_config is transformers' Mistral4Config defaults
    # (models/mistral4/configuration_mistral4.py, ``@auto_docstring(checkpoint=
    # "mistralai/Mistral-Small-4-119B-2603")``): 36 layers of 4096, 32 heads, MLA (q rank 1024, kv rank
    # 256, 64 + 64 query/key dims, 128 value dims), 128 routed experts of 2048 (4 a token) and one
    # shared, no dense first layer, 131072 tokens, 1M positions by YaRN 128 from 8192
    # (__post_init__), lm_head apart. The model card: 119B parameters, 6.5B active (Axolotl's
    # examples/mistral4/README.md); this builds 119,401,298,944, 6.5B a token
    # besides the embedding table (7.06B with it).
    "mistralai/Mistral-Small-4-119B-2603": {
        **_MISTRAL3,
        "tie_word_embeddings": False,
        "text_config": {"model_type": "mistral4", "tie_word_embeddings": False},
    },
    # Mistral Medium 3.5 (128B, dense): Mistral 3's layout over Devstral 2 123B's text model (NVIDIA NeMo
    # Automodel's model-coverage page: "88 Ministral-3 decoder layers (hidden 12288, 96 attention heads,
    # 8 KV heads)", Mistral3ForConditionalGeneration, "Pixtral vision tower") and a larger Pixtral tower
    # trained from scratch. Values of its config.json as a public Rust loader's test copies it
    # (rvllm's mistral35 loader, parses_full_config; find_string id 55386741447) and a public model
    # dossier tabulates them (id 55259639687): text 88 layers of 12288, intermediate 28672, 96 heads
    # and 8 key/value heads of 128, vocabulary 131072, 262144 positions by YaRN 64 from 4096
    # (beta_fast 4, beta_slow 1, mscale 1, mscale_all_dim 0: Mistral's corrected config), rope_theta 1e6,
    # lm_head apart; tower 48 layers of 1664, 16 heads of 104, intermediate 8192, 14-pixel patches,
    # images up to 1540, merged 2 x 2, [IMG] id 10. axolotl-ai-co/Mistral-Medium-3.5-128B-BF16 is its
    # BF16 copy (Axolotl's examples/mistral-medium-3_5; presets/__init__.py HUB_ALIASES). This builds
    # 127,704,210,176 parameters (125.0B text, 2.7B tower and projector): the model card's "128B".
    "mistralai/Mistral-Medium-3.5-128B": {
        **_MISTRAL3,
        "tie_word_embeddings": False,
        "text_config": {
            "model_type": "ministral3",
            "head_dim": 128,
            "hidden_act": "silu",
            "hidden_size": 12288,
            "intermediate_size": 28672,
            "max_position_embeddings": 262144,
            "num_attention_heads": 96,
            "num_hidden_layers": 88,
            "num_key_value_heads": 8,
            "rms_norm_eps": 1e-05,
            "rope_parameters": {"rope_type": "yarn", "rope_theta": 1000000.0, "factor": 64.0,
                                "original_max_position_embeddings": 4096, "beta_fast": 4.0,
                                "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 0.0,
                                # Ministral3Attention reads it (modeling_ministral3.py
                                # get_llama_4_attn_scale, a [B, 1, L, 1] query scale whatever its
                                # value); the copies above omit it: Ministral3Config's default.
                                "llama_4_scaling_beta": 0.1},
            "tie_word_embeddings": False,
            "vocab_size": 131072,
        },
        "vision_config": {
            **_MISTRAL3_TOWER,
            "head_dim": 104,
            "hidden_size": 1664,
            "intermediate_size": 8192,
            "num_hidden_layers": 48,
            "rope_theta": 10000.0,
        },
    },
    # mistral-community/pixtral-12b: LLaVA with a Pixtral tower (PixtralVisionConfig's defaults,
    # documented as mistral-labs/pixtral-12b: 24 layers of 1024, 16-pixel patches, images up to 1024
    # pixels) and Mistral NeMo 12B's text model (40 layers of 5120, 32 heads and 8 key/value heads of
    # 128, intermediate 14336, rope_theta 1e9), all layers' features ("full": no CLS to drop), a GELU
    # projector with biases (LlavaConfig's default).
    "mistral-community/pixtral-12b": {
        "model_type": "llava",
        "architectures": ["LlavaForConditionalGeneration"],
        "image_token_index": 10,
        "projector_hidden_act": "gelu",
        "text_config": {
            "model_type": "mistral",
            "head_dim": 128,
            "hidden_act": "silu",
            "hidden_size": 5120,
            "intermediate_size": 14336,
            "max_position_embeddings": 1024000,
            "num_attention_heads": 32,
            "num_hidden_layers": 40,
            "num_key_value_heads": 8,
            "rms_norm_eps": 1e-05,
            "rope_theta": 1000000000.0,
            "sliding_window": None,
            "vocab_size": 131072,
        },
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "vision_config": {
            "model_type": "pixtral",
            "head_dim": 64,
            "hidden_act": "gelu",
            "hidden_size": 1024,
            "image_size": 1024,
            "intermediate_size": 4096,
            "num_attention_heads": 16,
            "num_hidden_layers": 24,
            "patch_size": 16,
        },
        "vision_feature_layer": -1,
        "vision_feature_select_strategy": "full",
    },
}
