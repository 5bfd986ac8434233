"""Attributes set on the model's config before the model is built.

Axolotl's ``model_config`` (``overrides_of_model_config``, schemas/deprecated.py) is applied by
loaders/utils.py ``load_model_config``: ``setattr(model_config, key, val)`` on the top-level config
``from_pretrained`` returned, which the loader then builds the model from. autotune builds its model
from the config so overridden, and traces the step: an attribute read by the model's constructor or
forward (Mixtral's ``output_router_logits``: MixtralForCausalLM.forward returns the router logits
and adds ``router_aux_loss_coef`` times load_balancing_loss_func's loss) is in the trace. Refused by
name: the attributes acting outside the model's own code (the loading dtype, quantization, the
attention and experts implementations, the class the config names), a nested config replaced by a
mapping, and any name the config class does not have (PretrainedConfig keeps it, and no model code
reads it).
"""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from typing import Any

from autotune.errors import InvalidInput
from autotune.workload.models import ModelSpec, position_limit

_LOADER = ("Axolotl's loader passes it to from_pretrained itself (loaders/model.py), which wins over "
           "the config: set it with its own key")
NOT_TRACED = {
    "dtype": _LOADER + " (bf16, fp16, float32: the weights' dtype)",
    "torch_dtype": _LOADER + " (bf16, fp16, float32: the weights' dtype)",
    "attn_implementation": _LOADER + " (attn_implementation)",
    "_attn_implementation": _LOADER + " (attn_implementation)",
    "experts_implementation": _LOADER + " (experts_implementation)",
    "_experts_implementation": _LOADER + " (experts_implementation)",
    "quantization_config": "a quantized checkpoint is not modelled",
    "architectures": "the model class is chosen from the config's class, not from this attribute",
    "model_type": "the model class is chosen from the config's class, not from this attribute",
    "auto_map": "remote code is not run",
}


def parse_overrides(value: str | dict[str, Any] | None) -> dict[str, Any]:
    """The overrides as a mapping: a JSON object, or a mapping already; {} for none."""
    if value is None:
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise InvalidInput(f"config overrides must be a JSON object, got {value!r}") from exc
    if not isinstance(value, dict) or not all(isinstance(key, str) for key in value):
        raise InvalidInput(f"config overrides must map attribute names to values, got {value!r}")
    return dict(value)


def check_override(config: Any, name: str, value: Any) -> None:
    """InvalidInput for an override that is not traced: named, with why."""
    kind = type(config).__name__
    if name in NOT_TRACED:
        raise InvalidInput(f"config override {name}={value!r}: not modelled: {NOT_TRACED[name]}")
    if not hasattr(config, name):
        raise InvalidInput(f"config override {name}={value!r}: {kind} has no attribute {name}: "
                           "transformers would keep it and no code of the model reads it")
    current = getattr(config, name)
    if hasattr(current, "to_dict"):  # a nested config (text_config): setattr would put a dict there
        raise InvalidInput(f"config override {name}: replaces the nested {type(current).__name__} "
                           "with a mapping (setattr), which the model cannot be built from")
    numbers = (int, float)
    if isinstance(current, bool | str) and type(value) is not type(current) or (
            isinstance(current, numbers) and not isinstance(current, bool)
            and (isinstance(value, bool) or not isinstance(value, numbers))):
        raise InvalidInput(f"config override {name}={value!r}: {kind}.{name} is "
                           f"{type(current).__name__} ({current!r})")


def apply_overrides(spec: ModelSpec, overrides: dict[str, Any]) -> ModelSpec:
    """``spec`` with its config's attributes set as load_model_config sets them (a copy: the
    preset's config is shared), every one checked first."""
    if not overrides:
        return spec
    config = copy.deepcopy(spec.config)
    for name, value in overrides.items():
        check_override(config, name, value)
        setattr(config, name, value)
    given = tuple((name, repr(value)) for name, value in overrides.items())
    return replace(spec, config=config, max_seq_len=position_limit(config, spec.name)[2],
                   overrides=spec.overrides + given)


def describe(overrides: dict[str, Any]) -> str:
    return ", ".join(f"{name}={json.dumps(value)}" for name, value in overrides.items())
