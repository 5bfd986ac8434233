"""Model resolution: a name to a transformers config, offline first.

A name resolves, in order, to

1. a built-in preset: the published hyperparameters of a common checkpoint (copied
   from its config.json on the Hugging Face hub), or a tiny test model ("tiny-bert");
2. a local directory holding config.json, or a path to a config .json file
   (only with ``allow_local``, and inside ``local_dirs`` when given);
3. a Hugging Face hub id, only with ``allow_hub`` (off by default; the CLI's ``--hub``, the Python
   API's ``hub=True`` and AUTOTUNE_ALLOW_HUB=1 turn it on, and the service has it on unless
   AUTOTUNE_ALLOW_HUB=0; with ``HF_HUB_OFFLINE=1`` or ``AUTOTUNE_OFFLINE=1`` only the local
   Hugging Face cache is read).

A name that resolves nowhere is refused with the presets closest to it ("did you mean
tiny-bert?", spelling.py), found before any lookup on the hub could be made.

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

from autotune.defaults import DEFAULT_SEQ_LENS, DEFAULT_TASK
from autotune.errors import InvalidInput, SequenceTooLong, UnknownModel
from autotune.spelling import close_matches, did_you_mean
from autotune.workload.positions import past_positions_warning, runs_past_positions, text_config
from autotune.workload.presets import PRESET_INDEX, PRESETS, TINY_CONFIGS, preset_name

if TYPE_CHECKING:
    from transformers import PretrainedConfig

TASKS = (
    "sequence-classification",
    "question-answering",
    "masked-lm",
    "causal-lm",
    "token-classification",
    # A vision-language model's conditional generation (transformers' pipeline of that name,
    # AutoModelForImageTextToText): causal-lm on rows holding image tokens (workload/vision.py).
    "image-text-to-text",
)

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
    # Attributes set on ``config`` over the published values (workload.overrides: Axolotl's
    # model_config), as (name, repr(value)): compared, so a model built with them is another model.
    overrides: tuple[tuple[str, str], ...] = ()
    # Llama 4's experts as Axolotl's per-expert nn.Linear layers (llama4_linearized_experts,
    # workload/llama4.py): compared, so the model so built is another model.
    linearized_experts: bool = False


def preset_suggestions(name: str) -> list[str]:
    """The presets closest to a name that is none ("tiny-bret" -> ["tiny-bert"]), best first: the
    name and its part after the organisation, against every spelling of PRESET_INDEX.

    A name that says nothing of vision (no "vl", "vision", "llava" word) is matched against the
    vision-language presets by its beginning only: "Qwen2.5-7B-Instruct" is Qwen2.5-7B's, though
    "Qwen2.5-VL-7B-Instruct" is closer letter for letter; "gemma-3-4b" still finds gemma-3-4b-it."""
    typed = name.strip()
    words = [typed, typed.rsplit("/", 1)[-1]]
    # A checkpoint's variant words say nothing of its shapes: "llama-3.2-1b-instruct" reads as
    # Llama-3.2-1B's, not as Olmo-3-7B-Instruct-SFT's (letter for letter within 0.05 of it)
    words.append(_without_variant(words[-1]))
    forms = [*PRESET_INDEX.items(),
             *((_without_variant(spelling), preset) for spelling, preset in PRESET_INDEX.items())]
    found = close_matches(words, forms)
    if _names_vision(typed) or not any(_is_vlm_preset(match) for match in found):
        return found
    text = [(spelling, preset) for spelling, preset in forms if not _is_vlm_preset(preset)]
    vision = [(spelling, preset) for spelling, preset in forms if _is_vlm_preset(preset)]
    by_prefix = close_matches(words, vision, cutoff=1.0)
    return (by_prefix + [match for match in close_matches(words, text) if match not in by_prefix])[:3]


# The words a checkpoint's id adds to its base model's (instruction, chat, SFT and RL tunes, the
# hub conversions), dropped from both sides of a comparison by preset_suggestions.
_VARIANT = re.compile(r"[-_](instruct|it|chat|base|sft|rl|hf|preview)(?=[-_]|$)", re.IGNORECASE)


def _without_variant(text: str) -> str:
    return _VARIANT.sub("", text)


def _names_vision(text: str) -> bool:
    return bool(set(re.split(r"[\W_]+", text.lower())) & {"vl", "vlm", "vision", "llava", "visual"})


def _is_vlm_preset(name: str) -> bool:
    return "vision_config" in PRESETS[name]


def tiny_config(model_type: str, **overrides: Any) -> PretrainedConfig:
    """A very small config of `model_type` (see TINY_CONFIGS), for tests and demos."""
    if model_type not in TINY_CONFIGS:
        raise InvalidInput(
            f"no tiny config for model_type '{model_type}': use one of {', '.join(TINY_CONFIGS)}"
        )
    kwargs = {**TINY_CONFIGS[model_type], **overrides}
    return _build_config(kwargs.pop("model_type", model_type), kwargs)  # tiny-pixtral is a llava


def _build_config(model_type: str, kwargs: dict[str, Any]) -> PretrainedConfig:
    from transformers import AutoConfig

    return AutoConfig.for_model(model_type, **kwargs)


# --- resolution -----------------------------------------------------------------------


def resolve_model(
    name: str,
    *,
    allow_local: bool = True,
    allow_hub: bool = False,
    local_dirs: Sequence[Path] | None = None,
    hub_hint: str | None = None,
) -> ModelSpec:
    """Resolve `name` to a config: preset, then local config, then hub id (module docstring).

    Raises UnknownModel (naming the closest presets, and listing them all) when nothing matches,
    and InvalidInput for a local path outside `local_dirs`. ``hub_hint`` is how the caller's user
    turns hub lookups on: given, with ``allow_hub`` off, the refusal says the name was looked for
    only among presets and local configs, and gives the hint when the name could be a hub id
    (without it, the refusal reads as it does with the hub on: the service's).
    """
    name = name.strip()
    if not name:
        raise InvalidInput(
            f"empty model name: use a preset ({', '.join(sorted(PRESETS, key=str.lower))}), "
            "a path or a hub id"
        )
    preset = preset_name(name)
    if preset is not None:
        kwargs = dict(PRESETS[preset])
        return _spec(name, "preset", _build_config(kwargs.pop("model_type"), kwargs))
    path = Path(name).expanduser()
    if allow_local and _looks_local(name, path):
        return _spec(name, "local", _local_config(name, path, local_dirs))
    # An existing path is never handed to from_pretrained, which would read it locally.
    hub_id = _looks_like_hub_id(name) and not path.exists()
    if allow_hub and hub_id:
        return _spec(name, "hub", _hub_config(name))
    if allow_hub or hub_hint is None:
        raise _unknown(name, suggest=True)
    raise _unknown(name, hub_hint if hub_id else None, searched=_NOT_HUB, suggest=True)


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


# What an unknown name is not: everywhere it was looked for.
_NOT_ANYWHERE = "a built-in preset, a local config, or a reachable Hugging Face hub id"
_NOT_HUB = "a built-in preset or a local config"


def _unknown(name: str, reason: str | None = None, *, searched: str = _NOT_ANYWHERE,
             suggest: bool = False) -> UnknownModel:
    """UnknownModel: what ``name`` is not, why, the closest presets (with ``suggest``), them all.

    Its brief is the first clause alone: the closest presets, else what the name is not. A name looked
    up as a preset or hub id (``suggest``) leaves out why the hub could not be asked (a DNS error),
    a local path keeps why its file could not be read."""
    detail = f" ({reason})" if reason else ""
    guess = did_you_mean(preset_suggestions(name)) if suggest else ""
    lead = f"{guess} It is not" if guess else "not"
    error = UnknownModel(
        f"unknown model '{name}': {lead} {searched}{detail}. "
        f"Presets: {', '.join(sorted(PRESETS, key=str.lower))}"
    )
    error.brief = f"unknown model '{name}': {guess or f'not {searched}' + ('' if suggest else detail)}"
    return error


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
        brief = (f"unknown model '{name}': model_type '{model_type}' is not built into "
                 f"transformers {transformers.__version__}, and autotune does not run remote "
                 f"code (trust_remote_code is off)")
        error = UnknownModel(f"{brief}. Presets: {', '.join(sorted(PRESETS, key=str.lower))}")
        error.brief = brief
        raise error


def is_offline() -> bool:
    """True when HF_HUB_OFFLINE or AUTOTUNE_OFFLINE is set to 1 (or true/yes/on)."""
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE_VALUES:  # huggingface_hub's
        return True
    from autotune.settings import Settings  # pydantic-settings: imported when first needed

    return Settings.from_env().offline


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
        raise _unknown(name, reason, suggest=True) from exc


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

    GPT-2 calls it n_positions; RoBERTa-family models lose padding_idx + 1 positions. A
    vision-language model's is its text model's (``get_text_config()``: text_config).
    """
    config = text_config(config)
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


def parse_seq_lens(value: str | Sequence[int]) -> list[int]:
    """Sequence lengths as the CLI and the Python API take them: "128,256,512", or a list (each is
    checked against a model by ``check_seq_len``)."""
    if not isinstance(value, str):
        values = list(value)
        if not values:
            raise InvalidInput("no sequence lengths given")
        return values
    try:
        values = [int(part) for part in value.split(",") if part.strip()]
    except ValueError:
        raise InvalidInput(f"invalid sequence lengths {value!r}: use comma-separated integers, "
                           "e.g. 128,256,512") from None
    if not values or any(v < 1 for v in values):
        raise InvalidInput(f"invalid sequence lengths {value!r}: each must be a positive integer")
    return values


def check_seq_len(spec: ModelSpec, seq_len: int) -> None:
    """Raise SequenceTooLong if `seq_len` exceeds the positions of a model with a position table,
    InvalidInput if < 1. A RoPE model runs past its positions (workload/positions.py): allowed, and
    ``seq_len_warnings`` says so."""
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1:
        raise InvalidInput(f"sequence length must be an integer >= 1, got {seq_len!r}")
    if seq_len <= spec.max_seq_len or runs_past_positions(spec.config):
        return
    raise SequenceTooLong(
        f"sequence length {seq_len} exceeds {_limit_text(spec)} of {spec.name}",
        limit=spec.max_seq_len,
    )


def seq_len_warnings(spec: ModelSpec, seq_len: int) -> list[str]:
    """What an answer says of ``seq_len`` on this model: that it is past the positions a RoPE model
    was trained for (check_seq_len lets it through), else nothing."""
    if seq_len <= spec.max_seq_len:
        return []
    return [past_positions_warning(spec.name, _limit_text(spec), seq_len)]


def _limit_text(spec: ModelSpec) -> str:
    """The model's positions in words: "max_position_embeddings=512", "the 512 usable positions
    (max_position_embeddings=514)"."""
    attribute, value, usable = position_limit(spec.config, spec.name)
    if usable == value:
        return f"{attribute}={value}"
    return f"the {usable} usable positions ({attribute}={value})"


# The head of a ``*For<Head>`` architecture name, as transformers' Auto classes name them.
_ARCHITECTURE_TASKS = (
    ("ForCausalLM", "causal-lm"),
    ("ForMaskedLM", "masked-lm"),
    ("ForQuestionAnswering", "question-answering"),
    ("ForSequenceClassification", "sequence-classification"),
    ("ForTokenClassification", "token-classification"),
)


def infer_task(config: PretrainedConfig) -> tuple[str, str]:
    """(task, why): the task a config's checkpoint was built for.

    A vision-language model (a model type of transformers' image-text-to-text mapping, with a
    vision_config) -> image-text-to-text. Else from ``config.architectures`` (``LlamaForCausalLM``
    -> causal-lm, ``BertForMaskedLM`` -> masked-lm, ...). Without it, causal-lm for decoder-only
    model types (those transformers has a causal-LM class for and neither a masked-LM nor a
    sequence-to-sequence class: ``modeling_auto``'s mappings), else sequence-classification (an
    encoder's fine-tuning task).
    """
    from transformers.models.auto import modeling_auto

    from autotune.workload.vision import IMAGE_TEXT_TO_TEXT, is_vlm

    if is_vlm(config):
        return IMAGE_TEXT_TO_TEXT, f"{config.model_type} is a vision-language model type"
    for architecture in getattr(config, "architectures", None) or []:
        for suffix, task in _ARCHITECTURE_TASKS:
            if str(architecture).endswith(suffix):
                return task, f"from architectures {architecture}"
    model_type = config.model_type
    decoder_only = (
        model_type in modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
        and model_type not in modeling_auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES
        and model_type not in modeling_auto.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES
    )
    if decoder_only:
        return "causal-lm", f"{model_type} is a decoder-only model type"
    return DEFAULT_TASK, f"{model_type} is an encoder model type"


def task_for(spec: ModelSpec, task: str | None) -> str:
    """``task`` checked (check_task), or, when None, the one the config was built for (infer_task)."""
    return check_task(task) if task is not None else infer_task(spec.config)[0]


# Weight dtypes a model can be loaded in (``from_pretrained(dtype=...)``), by their torch names.
DTYPES = ("auto", "float32", "bfloat16", "float16")
_DTYPE_ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16",
                  "float": "float32"}


def check_dtype(dtype: str) -> str:
    """``dtype`` as one of DTYPES (torch names; fp32/bf16/fp16 accepted); InvalidInput otherwise."""
    name = str(dtype).strip().lower().removeprefix("torch.")
    name = _DTYPE_ALIASES.get(name, name)
    if name not in DTYPES:
        raise InvalidInput(f"unknown dtype {dtype!r}: allowed are {', '.join(DTYPES)}")
    return name


def configured_dtype(value: object) -> str:
    """The torch name of a config's ``dtype`` / ``torch_dtype`` value (a torch.dtype or its
    name); None is torch's default dtype, float32."""
    return "float32" if value is None else str(value).removeprefix("torch.")


def resolve_dtype(spec: ModelSpec, dtype: str = "auto") -> str:
    """The dtype the weights really have: ``dtype``, or for ``auto`` what the installed
    transformers' ``from_pretrained`` loads (transformers 5: ``dtype="auto"`` is its default and
    reads the config's ``dtype`` / ``torch_dtype``; without one, torch's default, float32)."""
    name = check_dtype(dtype)
    if name != "auto":
        return name
    # transformers 5 keeps it as ``dtype`` (``torch_dtype``, an alias, logs a deprecation notice
    # when read); before, as ``torch_dtype``.
    config = spec.config
    configured_name = configured_dtype(
        config.dtype if hasattr(config, "dtype") else getattr(config, "torch_dtype", None))
    if configured_name not in DTYPES:  # e.g. float64 or int8 in a hand-written config
        raise InvalidInput(
            f"{spec.name}'s config says dtype {configured_name}: autotune models float32, "
            "bfloat16 or float16 weights; give dtype explicitly"
        )
    return configured_name


# Default rows: the BERT README's lengths for models of at most 512 positions, else the lengths
# of LLM fine-tuning; each capped at the model's limit.
LONG_SEQ_LENS = (512, 1024, 2048, 4096, 8192)


def default_seq_lens(spec: ModelSpec, limit: int | None = None) -> list[int]:
    """The sequence lengths of a table when none are given, within ``spec``'s limit and
    ``limit`` (a server's AUTOTUNE_MAX_SEQ_LEN)."""
    rows = DEFAULT_SEQ_LENS if spec.max_seq_len <= max(DEFAULT_SEQ_LENS) else LONG_SEQ_LENS
    cap = spec.max_seq_len if limit is None else min(spec.max_seq_len, limit)
    fitting = [n for n in rows if n <= cap]
    return fitting or [cap]


def check_task(task: str) -> str:
    """`task`, normalised; InvalidInput listing TASKS when it is not one of them."""
    normalised = task.strip().lower().replace("_", "-")
    if normalised not in TASKS:
        raise InvalidInput(f"unknown task '{task}': use one of {', '.join(TASKS)}")
    return normalised


# --- a model as JSON (a stored run's spec, a probe worker's cell) -----------------------


def config_to_json(config: PretrainedConfig) -> dict[str, Any]:
    """The whole config in JSON types; ``model_from_json`` rebuilds it."""
    # to_json_string(use_diff=False) is to_dict() passed through transformers' own JSON encoder,
    # which knows the non-JSON values a config may hold (dtypes, numpy numbers).
    return json.loads(config.to_json_string(use_diff=False))


def model_from_json(name: str, source: str, model_type: str, config: dict[str, Any],
                    max_seq_len: int) -> ModelSpec:
    """A ModelSpec from ``config_to_json``'s output, built by transformers' own config class of
    ``model_type`` (never remote code: InvalidInput for a model_type transformers lacks)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    if model_type not in CONFIG_MAPPING:  # checked on the way in; a stored spec again
        raise InvalidInput(
            f"model_type {model_type!r} of {name} is not built into transformers, and autotune "
            "does not run remote code"
        )
    return ModelSpec(name, source, CONFIG_MAPPING[model_type].from_dict(dict(config)), max_seq_len)
