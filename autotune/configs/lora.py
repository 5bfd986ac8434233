"""LoRA and QLoRA adapters as the formats write them: the values PEFT's LoraConfig and
bitsandbytes' BitsAndBytesConfig take, checked the way those libraries check them, and the note
each adapter read adds."""

from __future__ import annotations

from typing import Any

from autotune.configs.reading import OFFLOAD, Config, read_dtype
from autotune.errors import InvalidInput, JobFails
from autotune.workload.adapters import ALL_LINEAR, COMPUTE_DTYPES, QUANT_TYPES, Adapter, make_adapter

# What a regular expression has and a module name never does.
REGEX_CHARS = frozenset("*+?[](){}|^$\\")
# BitsAndBytesConfig keys with no effect on a 4-bit base's memory: the storage dtype only changes
# the dtype its packed bytes are viewed as (bitsandbytes Params4bit), llm_int8_* are 8-bit settings.
BNB_NO_EFFECT = frozenset({"quant_method", "load_in_4bit", "load_in_8bit", "bnb_4bit_quant_storage",
                            "llm_int8_threshold", "llm_int8_has_fp16_weight",
                            "llm_int8_enable_fp32_cpu_offload"})


def int8_settings(cfg: Config, key: str, settings: dict[str, Any]) -> None:
    """Check a BitsAndBytesConfig of an 8-bit base (``load_in_8bit: true``): what changes its memory
    beyond transformers' defaults is refused by name; the 4-bit settings have no effect on it."""
    for name, value in settings.items():
        where = f"{key}.{name}"
        if name == "llm_int8_has_fp16_weight" and value:
            raise cfg.unmodelled(where, value, "Linear8bitLt keeping 16-bit weights beside the int8 ones "
                                 "(has_fp16_weights) is not modelled")
        if name == "llm_int8_enable_fp32_cpu_offload" and value:
            raise cfg.unmodelled(where, value, OFFLOAD)
        if name == "llm_int8_skip_modules" and value:
            raise cfg.unmodelled(where, value, "autotune quantizes the layers transformers does by default")
        if name == "llm_int8_threshold" and value != 6.0:
            cfg.notes.append(f"{where}: {value}: the outlier threshold decides which input columns stay in "
                             "16 bits; autotune counts none either way (backends/estimate/int8.py)")
        elif name not in BNB_NO_EFFECT and not name.startswith("bnb_4bit_"):
            raise cfg.unmodelled(where, value, "a bitsandbytes setting autotune does not model")


def lora_number(cfg: Config, key: str, value: Any, *, rank: bool = False, dropout: bool = False) -> Any:
    """lora_r (a positive integer), lora_alpha (a positive number) or lora_dropout (0 up to 1)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise cfg.bad(key, value, "a positive integer" if rank else "a number")
    if rank and (not isinstance(value, int) or value < 1):
        raise cfg.bad(key, value, "a positive integer")
    if dropout and not 0 <= value < 1:
        raise cfg.bad(key, value, "a number from 0 up to (not including) 1")
    if not dropout and value <= 0:
        raise cfg.bad(key, value, "a positive number")
    return value


def target_names(cfg: Config, key: str, value: Any) -> tuple[str, ...] | None:
    """Target modules as a list of names PEFT matches literally against the last parts of a module's
    name (tuners_utils.py check_target_module_exists), or all-linear; None: PEFT's default."""
    if value is None:
        return None
    if isinstance(value, str) and value.lower() == ALL_LINEAR:
        return (ALL_LINEAR,)
    if not isinstance(value, list) or not all(isinstance(name, str) and name for name in value):
        raise cfg.bad(key, value, "a list of module names")
    for name in value:
        if name.lower() == ALL_LINEAR:
            raise InvalidInput(f"{key} in {cfg.file!r} lists {name!r}: PEFT reads {ALL_LINEAR} as every "
                               "linear layer only as a string, in a list it is a module's name: write "
                               f"{key}: {ALL_LINEAR}")
        if REGEX_CHARS & set(name):
            raise cfg.unmodelled(key, value, f"{name!r} is a regular expression, but PEFT matches the names "
                                 "of a list literally (the last parts of a module's name): list module names")
    return tuple(dict.fromkeys(value))


def lora_targets(cfg: Config, key: str, value: Any) -> dict[str, Any]:
    """Target modules as PEFT's LoraConfig takes them, as ``make_adapter``'s keyword: a string but
    all-linear is a regular expression PEFT matches against whole module names
    (``target_pattern``: re.fullmatch, tuners_utils.py check_target_module_exists), else the names
    of ``target_names``."""
    if isinstance(value, str) and value.lower() != ALL_LINEAR:
        cfg.notes.append(f"{key}: {value!r}: a regular expression, matched by PEFT against whole module "
                         "names (model.layers.0.self_attn.q_proj)")
        return {"target_pattern": value}
    return {"targets": target_names(cfg, key, value)}


def compute_dtype(cfg: Config, key: str, value: Any) -> str:
    name = read_dtype(cfg, key, value)
    if name not in COMPUTE_DTYPES:
        raise cfg.bad(key, value, f"one of {', '.join(COMPUTE_DTYPES)}")
    return name


def bnb_4bit(cfg: Config, key: str, settings: dict[str, Any], quant_type: str, double_quant: bool,
              compute: str | None) -> tuple[str, bool, str | None]:
    """The quant type, double quantization and compute dtype of a 4-bit base: the defaults given,
    overridden by ``settings`` (BitsAndBytesConfig keyword arguments); what else changes memory raises."""
    for name, value in settings.items():
        where = f"{key}.{name}"
        if name == "bnb_4bit_quant_type":
            if value not in QUANT_TYPES:
                raise cfg.bad(where, value, f"one of {', '.join(QUANT_TYPES)}")
            quant_type = value
        elif name == "bnb_4bit_use_double_quant":
            if not isinstance(value, bool):
                raise cfg.bad(where, value, "true or false")
            double_quant = value
        elif name == "bnb_4bit_compute_dtype":
            compute = compute_dtype(cfg, where, value)
        elif name == "load_in_8bit" and value:
            raise JobFails(f"{where}: true beside load_in_4bit in {cfg.file!r}: BitsAndBytesConfig "
                           "refuses both (\"only one can be used at the same time\"); give one")
        elif name == "load_in_4bit" and value is not True:
            raise cfg.bad(where, value, "true (a 4-bit base)")
        elif name == "llm_int8_enable_fp32_cpu_offload" and value:
            raise cfg.unmodelled(where, value, OFFLOAD)
        elif name not in BNB_NO_EFFECT:
            # llm_int8_skip_modules among them: autotune quantizes the layers transformers does by default
            raise cfg.unmodelled(where, value, "a bitsandbytes setting autotune does not model (it models "
                                 "the layers transformers quantizes by default, in nf4 or fp4)")
    return quant_type, double_quant, compute


def build_adapter(cfg: Config, method: str, **fields: Any) -> Adapter:
    try:
        return make_adapter(method, **fields)
    except InvalidInput as exc:
        raise exc.within(cfg.file) from exc


def note_adapter(cfg: Config, source: str, adapter: Adapter, at: int | None = None) -> None:
    """The adapter's note, at ``at`` (before the notes on its keys), else last."""
    parts = [adapter.label()]
    if adapter.base_bits == 4:
        parts.append(f"4-bit layers computing in {adapter.compute_dtype}" if adapter.compute_dtype
                     else "4-bit layers computing in bfloat16 (float16 on a card without bfloat16)")
    elif adapter.base_bits == 8:
        parts.append("8-bit layers computing in int8 (outlier columns, which depend on the data, not "
                     "counted)")
    if adapter.modules_to_save:
        parts.append(f"{', '.join(adapter.modules_to_save)} trained whole (modules_to_save)")
    if adapter.bias != "none":
        parts.append(f"biases trained (bias {adapter.bias})")
    note = f"{source}: {', '.join(parts)}; the base weights frozen, only the adapters trained"
    cfg.notes.insert(len(cfg.notes) if at is None else at, note)

