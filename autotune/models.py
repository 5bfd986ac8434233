"""Model resolution: a name to a transformers config, offline first.

A name resolves, in order, to

1. a built-in preset: the published hyperparameters of a common checkpoint (copied
   from its config.json on the Hugging Face hub), or a tiny test model ("tiny-bert");
2. a local directory holding config.json, or a path to a config .json file
   (only with ``allow_local``, and inside ``local_dirs`` when given);
3. a Hugging Face hub id (only with ``allow_hub``; with ``HF_HUB_OFFLINE=1`` or
   ``AUTOTUNE_OFFLINE=1`` only the local Hugging Face cache is read).

Remote code is never run (``trust_remote_code=False``): a config whose model_type
transformers does not know is refused. Only configs are read, never weights.

transformers is imported inside functions: the API server imports this module and
must start fast.
"""

from __future__ import annotations

import json
import os
import re
import socket
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from autotune.errors import InvalidInput, SequenceTooLong, UnknownModel

if TYPE_CHECKING:
    from transformers import PretrainedConfig

TASKS = (
    "sequence-classification",
    "question-answering",
    "masked-lm",
    "causal-lm",
    "token-classification",
)
DEFAULT_TASK = "sequence-classification"

OFFLINE_ENV_VARS = ("HF_HUB_OFFLINE", "AUTOTUNE_OFFLINE")
# huggingface_hub's own reading of HF_HUB_OFFLINE (constants._is_true).
_TRUE_VALUES = {"1", "on", "yes", "true"}
DEFAULT_HUB_ENDPOINT = "https://huggingface.co"  # huggingface_hub.constants.ENDPOINT
HUB_PROBE_TIMEOUT_S = 3.0
_PROXY_ENV_VARS = ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")


@dataclass(frozen=True)
class ModelSpec:
    name: str  # as the user gave it
    source: str  # "preset" | "local" | "hub"
    # The transformers config that random weights are built from. Left out of ==
    # and hash: a config is mutable and unhashable.
    config: PretrainedConfig = field(compare=False)
    max_seq_len: int  # usable positions (see position_limit)


# --- presets --------------------------------------------------------------------------
# Hyperparameters from each checkpoint's config.json on the Hugging Face hub. Keys
# that do not change the model's size or memory (architectures, id2label, dropout
# defaults equal to transformers' own) are left out; everything that shapes a tensor
# is copied exactly. The tests check the parameter counts against published totals.
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
_HUB_ALIASES: dict[str, str] = {
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


def _preset_index() -> dict[str, str]:
    """Lower-case name -> preset: the name, the name without its org, the hub aliases."""
    index: dict[str, str] = {}
    for name in PRESETS:
        index[name.lower()] = name
        index.setdefault(name.rsplit("/", 1)[-1].lower(), name)
    index.update({alias.lower(): name for alias, name in _HUB_ALIASES.items()})
    return index


_PRESET_INDEX = _preset_index()


def preset_name(name: str) -> str | None:
    """The preset `name` stands for (case-insensitive, org optional), or None."""
    return _PRESET_INDEX.get(name.strip().lower())


def tiny_config(model_type: str, **overrides: Any) -> PretrainedConfig:
    """A very small config of `model_type` (see TINY_CONFIGS), for tests and demos."""
    if model_type not in TINY_CONFIGS:
        raise InvalidInput(
            f"no tiny config for model_type '{model_type}': use one of {', '.join(TINY_CONFIGS)}"
        )
    return _build_config(model_type, {**TINY_CONFIGS[model_type], **overrides})


def _build_config(model_type: str, kwargs: dict[str, Any]) -> PretrainedConfig:
    from transformers import AutoConfig

    return AutoConfig.for_model(model_type, **kwargs)


# --- resolution -----------------------------------------------------------------------


def resolve_model(
    name: str,
    *,
    allow_local: bool = True,
    allow_hub: bool = True,
    local_dirs: Sequence[Path] | None = None,
) -> ModelSpec:
    """Resolve `name` to a config: preset, then local config, then hub id (module docstring).

    Raises UnknownModel (listing the presets) when nothing matches, and InvalidInput
    for a local path outside `local_dirs`.
    """
    name = name.strip()
    if not name:
        raise InvalidInput(
            f"empty model name: use a preset ({', '.join(sorted(PRESETS))}), a path or a hub id"
        )
    preset = preset_name(name)
    if preset is not None:
        kwargs = dict(PRESETS[preset])
        return _spec(name, "preset", _build_config(kwargs.pop("model_type"), kwargs))
    path = Path(name).expanduser()
    if allow_local and _looks_local(name, path):
        return _spec(name, "local", _local_config(name, path, local_dirs))
    # An existing path is never handed to from_pretrained, which would read it locally.
    if allow_hub and _looks_like_hub_id(name) and not path.exists():
        return _spec(name, "hub", _hub_config(name))
    raise _unknown(name)


def _spec(name: str, source: str, config: PretrainedConfig) -> ModelSpec:
    return ModelSpec(name, source, config, position_limit(config, name)[2])


def _looks_local(text: str, path: Path) -> bool:
    return path.exists() or text.startswith((".", "/", "~")) or text.endswith(".json") or text.count("/") > 1


def _looks_like_hub_id(text: str) -> bool:
    """huggingface_hub's repo-id rule: [org/]name of letters, digits, '-', '_', '.'."""
    return (
        re.fullmatch(r"(?:[\w.-]+/)?[\w.-]+", text) is not None
        and ".." not in text
        and not text.startswith((".", "-"))
    )


def _unknown(name: str, reason: str | None = None) -> UnknownModel:
    detail = f" ({reason})" if reason else ""
    return UnknownModel(
        f"unknown model '{name}': not a built-in preset, a local config, or a reachable "
        f"Hugging Face hub id{detail}. Presets: {', '.join(sorted(PRESETS))}"
    )


def _local_config(name: str, path: Path, local_dirs: Sequence[Path] | None) -> PretrainedConfig:
    resolved = path.resolve()
    config_file = (resolved / "config.json").resolve() if resolved.is_dir() else resolved
    if local_dirs is not None:
        allowed = [Path(d).expanduser().resolve() for d in local_dirs]
        # Checked on the resolved file, so no symlink leads out of the allowed directories.
        if not any(config_file.is_relative_to(d) for d in allowed):
            raise InvalidInput(
                f"local model path '{name}' is outside the allowed directories: "
                f"{', '.join(str(d) for d in allowed)}"
            )
    if not config_file.is_file():
        where = f"no config.json in {resolved}" if resolved.is_dir() else f"no file {resolved}"
        raise _unknown(name, where)
    try:
        data = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _unknown(name, f"cannot read {config_file}: {exc}") from exc
    if not isinstance(data, dict):
        raise _unknown(name, f"{config_file} is not a JSON object")
    _check_model_type(name, data.get("model_type"))
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(str(config_file), trust_remote_code=False)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise _unknown(name, f"transformers cannot load {config_file}: {exc}") from exc


def _check_model_type(name: str, model_type: object) -> None:
    """Refuse a model_type transformers does not know: its code would be remote code."""
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    if not isinstance(model_type, str) or not model_type:
        raise _unknown(name, "its config.json has no model_type")
    if model_type not in CONFIG_MAPPING:
        raise UnknownModel(
            f"unknown model '{name}': model_type '{model_type}' is not built into "
            f"transformers {transformers.__version__}, and autotune does not run remote "
            f"code (trust_remote_code is off). Presets: {', '.join(sorted(PRESETS))}"
        )


def is_offline() -> bool:
    """True when HF_HUB_OFFLINE or AUTOTUNE_OFFLINE is set to 1 (or true/yes/on)."""
    return any(os.environ.get(var, "").strip().lower() in _TRUE_VALUES for var in OFFLINE_ENV_VARS)


def hub_unreachable(timeout_s: float = HUB_PROBE_TIMEOUT_S) -> str | None:
    """Why the hub cannot be reached (one TCP connect), or None if it may be.

    huggingface_hub retries a failed request 5 times with backoff, about 25 s when
    the network is down; this probe makes a lookup fail in at most `timeout_s`.
    Behind a proxy only the proxy knows, so no probe is made.
    """
    if any(os.environ.get(var) for var in _PROXY_ENV_VARS):
        return None
    endpoint = os.environ.get("HF_ENDPOINT", DEFAULT_HUB_ENDPOINT)
    url = urlsplit(endpoint)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((url.hostname or "", port), timeout=timeout_s):
            return None
    except OSError as exc:
        return f"cannot reach {endpoint}: {exc}"


def _hub_config(name: str) -> PretrainedConfig:
    """The config of a hub model; offline or unreachable, from the local HF cache."""
    from transformers import AutoConfig

    offline = is_offline()
    unreachable = None if offline else hub_unreachable()
    try:
        return AutoConfig.from_pretrained(
            name,
            trust_remote_code=False,
            local_files_only=offline or unreachable is not None,
        )
    except Exception as exc:
        if "trust_remote_code" in str(exc):
            reason = "its config needs remote code, and autotune does not run it"
        elif offline:
            reason = "offline: only the local Hugging Face cache was searched"
        elif unreachable is not None:
            reason = f"{unreachable}, and the local Hugging Face cache has no copy"
        else:
            reason = f"{type(exc).__name__}: {exc}".splitlines()[0]
        raise _unknown(name, reason) from exc


# --- sequence lengths and tasks -------------------------------------------------------

# Models whose position ids start at padding_idx + 1, so max_position_embeddings - 2
# positions are usable (514 -> 512): transformers' create_position_ids_from_input_ids
# in modeling_roberta.py and its copies.
PADDING_OFFSET_MODEL_TYPES = frozenset(
    {
        "roberta",
        "xlm-roberta",
        "xlm-roberta-xl",
        "camembert",
        "roberta-prelayernorm",
        "data2vec-text",
        "longformer",
        "mpnet",
    }
)


def position_limit(config: PretrainedConfig, name: str = "this model") -> tuple[str, int, int]:
    """(config attribute, its value, usable positions) of a config's position table.

    GPT-2 calls it n_positions; RoBERTa-family models lose padding_idx + 1 positions.
    """
    attribute_map = getattr(config, "attribute_map", {}) or {}
    attribute = attribute_map.get("max_position_embeddings", "max_position_embeddings")
    value = getattr(config, attribute, None)
    if not isinstance(value, int) or value <= 0:
        raise InvalidInput(
            f"model {name} (model_type {config.model_type}) declares no "
            "max_position_embeddings or n_positions: autotune needs a fixed position limit"
        )
    usable = value
    if config.model_type in PADDING_OFFSET_MODEL_TYPES:
        usable = value - (getattr(config, "pad_token_id", None) or 0) - 1
    return attribute, value, usable


def check_seq_len(spec: ModelSpec, seq_len: int) -> None:
    """Raise SequenceTooLong if `seq_len` exceeds the model's positions, InvalidInput if < 1."""
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1:
        raise InvalidInput(f"sequence length must be an integer >= 1, got {seq_len!r}")
    if seq_len <= spec.max_seq_len:
        return
    attribute, value, usable = position_limit(spec.config, spec.name)
    if usable == value:
        limit = f"{attribute}={value}"
    else:
        limit = f"the {usable} usable positions ({attribute}={value})"
    raise SequenceTooLong(
        f"sequence length {seq_len} exceeds {limit} of {spec.name}",
        limit=spec.max_seq_len,
    )


def check_task(task: str) -> str:
    """`task`, normalised; InvalidInput listing TASKS when it is not one of them."""
    normalised = task.strip().lower().replace("_", "-")
    if normalised not in TASKS:
        raise InvalidInput(f"unknown task '{task}': use one of {', '.join(TASKS)}")
    return normalised
