"""The offline model presets: the published hyperparameters of common checkpoints, as data.

Hyperparameters from each checkpoint's config.json on the Hugging Face hub. Keys that do not
change the model's size or memory (architectures, id2label, dropout defaults equal to
transformers' own) are left out; everything that shapes a tensor is copied exactly. The tests
check the parameter counts against published totals. Resolution (a name to a config) is
``models.py``.
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
}
