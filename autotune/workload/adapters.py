"""Parameter-efficient fine-tuning: LoRA and QLoRA (and OFT: workload/oft.py), built by the real PEFT.

An ``Adapter`` is what a run's PEFT setup changes in the training step:

    lora    a frozen base in the weights' dtype, LoRA matrices on the target modules
            (``peft.get_peft_model`` with a ``LoraConfig``)
    qlora   the same over a 4-bit base: every linear layer that transformers' bitsandbytes
            integration quantizes (``BitsAndBytesConfig(load_in_4bit=True)``) stored as NF4 (or FP4),
            prepared as the trainer that runs it prepares it (its ``recipe``, below), then
            ``get_peft_model``
    lora_8bit  the same over an 8-bit base (``BitsAndBytesConfig(load_in_8bit=True)``: LLM.int8,
            bitsandbytes' ``Linear8bitLt``), prepared by the same recipes (TRL, Axolotl and PEFT
            treat a base loaded in 8 bits as one loaded in 4: ``is_loaded_in_8bit``)

A 4- or 8-bit base is prepared differently by each trainer, and the dtypes it leaves change the step's
memory (the weights kept in 16 or 32 bits, the adapters' dtype, the dtype of the residual stream):

    trl      TRL's SFTTrainer (trl/trainer/sft_trainer.py since 0.26, which dropped
             ``prepare_model_for_kbit_training``): the weights not quantized stay in the dtype the
             model was loaded in; after ``get_peft_model`` every trainable parameter is cast to
             bfloat16 ("follow the recommendations from the original paper")
    axolotl  Axolotl (loaders/model.py ``_configure_embedding_dtypes``): PEFT's
             ``prepare_model_for_kbit_training`` (every weight not quantized to float32), then the
             modules named like a norm and the embeddings (``embed_tokens``, ``lm_head``) back to the
             model's dtype; the adapters float32 (PEFT's ``autocast_adapter_dtype``)
    peft     PEFT's QLoRA guide, and TRL before 0.26: ``prepare_model_for_kbit_training`` alone, so
             norms, embeddings and the head in float32 (the residual stream too, under autocast), the
             adapters float32

The model is wrapped by PEFT's own code (``prepare``): the trainable and frozen parameters, the
adapter layers' activations (their dropout, their casts) and the optimizer over the adapter
weights alone are what PEFT builds. What differs between backends is only how a linear layer
is stored in 4 or 8 bits: the estimator replaces it by an emulation with bitsandbytes' sizes
(backends/estimate/nf4.py, int8.py), the cuda backend by bitsandbytes' ``Linear4bit`` or
``Linear8bitLt`` (backends/cuda/bnb.py). Both come with the backend's parts (workload/parts.py,
``StepParts``).

An adapter's ``tuner`` is the PEFT method its ``method``'s base carries: LoRA (``LoraConfig``), or
OFT (``OFTConfig``, orthogonal fine-tuning: workload/oft.py), over the same 16/32-, 4- or 8-bit bases,
prepared by the same recipes.

An adapter's ``kernels`` are Axolotl's fused LoRA kernels (``lora_mlp_kernel``, ...), which replace
PEFT's LoRA layers' forward and backward in the MLPs and attentions once PEFT has wrapped the
model: emulated by the estimator (workload/lora_kernels.py), Axolotl's own on the GPU; both
through the backend's parts.

PEFT's defaults, kept here: ``lora_alpha`` 8 and ``lora_dropout`` 0 in ``LoraConfig``; this tool's
defaults (r 16, alpha 32, dropout 0.05) are the ones Axolotl's and TRL's QLoRA examples use.
``targets`` None is PEFT's own default for the architecture
(``TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING``: q_proj and v_proj for Llama, query and
value for BERT); ``all-linear`` is PEFT's every linear layer but the output head.
"""

from __future__ import annotations

import contextlib
import copy
import json
import re
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MethodType
from typing import TYPE_CHECKING, Any, Literal

from autotune.errors import InvalidInput
from autotune.workload.lora_kernels import describe, parse_kernels
from autotune.workload.prequantized import SavedQuant, check_saved_quant

if TYPE_CHECKING:
    import torch

    from autotune.workload.parts import StepParts

Method = Literal["lora", "qlora", "lora_8bit"]
METHODS: tuple[Method, ...] = ("lora", "qlora", "lora_8bit")
# PEFT's tuner over the base: LoraConfig, or OFTConfig (workload/oft.py)
TUNERS = ("lora", "oft")
# The request's peft: an 8-bit base is asked for with load_in_8bit beside peft lora, as in
# transformers' BitsAndBytesConfig and the trainers' configs.
PEFT_CHOICES = ("none", "lora", "qlora")
# The llm_int8_skip_modules Axolotl's 4-bit and 8-bit bases set per model type (loaders/model.py
# _set_quantization_config): Falcon-H1's "output projection cannot be quantized" (its Mamba-2 mixer's
# out_proj, whose weight mamba_ssm's fused mamba_split_conv1d_scan_combined reads). Given, they replace
# transformers' default skips, so Falcon-H1's lm_head is quantized (_quantize_linears).
AXOLOTL_SKIPPED: dict[str, tuple[str, ...]] = {"falcon_h1": ("out_proj",)}
# How many bits the base is stored in, per method that quantizes it.
BASE_BITS: dict[str, int] = {"qlora": 4, "lora_8bit": 8}
ALL_LINEAR = "all-linear"  # peft.utils.constants.INCLUDE_LINEAR_LAYERS_SHORTHAND
PARAMETRIZATIONS = r".*\.parametrizations\..*"  # torch parametrize's module names (quantize_experts)

DEFAULT_R = 16
DEFAULT_ALPHA = 32
DEFAULT_DROPOUT = 0.05
MAX_R = 4096  # far above any rank in use; a bound for what the service accepts

# transformers.BitsAndBytesConfig's 4-bit settings (utils/quantization_config.py): the quant type,
# double quantization (bnb_4bit_use_double_quant) and the compute dtype. QLoRA as the QLoRA paper,
# Axolotl and TRL's examples run it: nf4, double quantization, bfloat16 compute.
QUANT_TYPES = ("nf4", "fp4")
DEFAULT_QUANT_TYPE = "nf4"
COMPUTE_DTYPES = ("bfloat16", "float16", "float32")

QLORA_RECIPES = ("trl", "axolotl", "peft")  # see the module docstring
DEFAULT_QLORA_RECIPE = "trl"  # the SFTTrainer: the trainer most QLoRA runs go through
# What a stored QLoRA adapter without a recipe was computed with (before the choice existed).
STORED_QLORA_RECIPE = "peft"
RECIPE_NAMES = {"trl": "TRL's SFTTrainer", "axolotl": "Axolotl", "peft": "prepare_model_for_kbit_training"}
# Axolotl's embedding modules (loaders/utils.py get_linear_embedding_layers), per model type.
_AXOLOTL_EMBEDDINGS = {"gpt_neox": ("embed_in", "embed_out"), "falcon": ("word_embeddings", "lm_head"),
                       "nemotron_h": ("embeddings", "lm_head")}
_AXOLOTL_DEFAULT_EMBEDDINGS = ("embed_tokens", "lm_head")

# peft.TaskType per task: it decides PEFT's model class and, for sequence and token
# classification, that the head is trained too (PeftModelForSequenceClassification and
# PeftModelForTokenClassification add "classifier" and "score" to modules_to_save).
PEFT_TASK_TYPES = {
    "sequence-classification": "SEQ_CLS",
    "token-classification": "TOKEN_CLS",
    "question-answering": "QUESTION_ANS",
    "causal-lm": "CAUSAL_LM",
    "masked-lm": None,  # PEFT has no masked-LM task type: the plain PeftModel
}
# The tasks whose head PEFT trains whole, a copy in the weights' dtype (peft_model.py: "classifier",
# "score" for classification, "qa_outputs" for question answering).
PEFT_TRAINED_HEADS = ("sequence-classification", "token-classification", "question-answering")


@dataclass(frozen=True)
class Adapter:
    """A LoRA setup (see the module docstring). Frozen: part of a Workload's identity."""

    method: Method
    r: int = DEFAULT_R
    alpha: float = DEFAULT_ALPHA
    dropout: float = DEFAULT_DROPOUT
    targets: tuple[str, ...] | None = None  # None: PEFT's default for the architecture
    quant_type: str = DEFAULT_QUANT_TYPE  # qlora (a 4-bit base) only
    double_quant: bool = True  # qlora only
    # The bnb_4bit_compute_dtype; None: bfloat16, or float16 where the card has no bfloat16.
    compute_dtype: str | None = None
    # The LoraConfig fields read from an adapter_config.json that change memory (use_rslora does
    # not; bias "all" or "lora_only" trains the biases; modules_to_save trains whole modules).
    bias: str = "none"
    modules_to_save: tuple[str, ...] = field(default=())
    # How the 4- or 8-bit base is prepared (QLORA_RECIPES); None for a LoRA over a 16/32-bit base.
    recipe: str | None = None
    # A regular expression PEFT matches against whole module names (re.fullmatch, tuners_utils.py
    # check_target_module_exists), given as target_modules="..."; instead of ``targets``.
    target_pattern: str | None = None
    # Axolotl's fused LoRA kernels patched in after get_peft_model (workload/lora_kernels.py
    # KERNELS: mlp, qkv, o, embedding; Axolotl's lora_*_kernel), through the backend's parts.
    kernels: tuple[str, ...] = ()
    # Axolotl's quantize_moe_experts: the experts' 3D weights quantized on load too, in the base's
    # bits (backends/estimate/moe_quant.py), through the backend's parts; a quantized base only.
    quantize_experts: bool = False
    # Modules left without LoRA: those whose names contain one of these (LLaMA-Factory's
    # model_utils/visual.py patch_target_modules: a vision model's frozen tower and projector),
    # given to PEFT as exclude_modules (``excluded_pattern``).
    exclude: tuple[str, ...] = ()
    # Axolotl's _patch_peft_param_wrapper_dropout (loaders/adapter.py load_lora): PEFT's ParamWrapper
    # (LoRA on a fused MoE's 3D expert parameters) refuses lora_dropout != 0; Axolotl builds it with
    # dropout 0 (nn.Identity), every other LoRA layer with the dropout asked (``experts_undropped``).
    experts_undropped: bool = False
    # PEFT's tuner (TUNERS): "oft" is OFTConfig, where ``r`` is OFT's rank (blocks per layer, 0: derived
    # from ``block_size``), ``block_size`` its oft_block_size (0: derived from ``r``), ``dropout`` its
    # module_dropout, and ``alpha`` unused (workload/oft.py).
    tuner: str = "lora"
    block_size: int = 0
    # A base saved quantized with GPTQ or AWQ (workload/prequantized.py): its linear layers are
    # gptqmodel's, built from the checkpoint's quantization_config, under a "lora" method.
    saved_quant: SavedQuant | None = None
    # PEFT's target_parameters (Axolotl's lora_target_parameters): parameters given LoRA in place, each
    # wrapped by a ParamWrapper (peft/tuners/lora/layer.py: a fused MoE's 3D experts), matched by
    # suffix ("experts.gate_up_proj"); ``targets`` may then be empty (target_modules=[]).
    parameters: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.quantized and self.recipe is None:  # built directly, not by make_adapter
            object.__setattr__(self, "recipe", DEFAULT_QLORA_RECIPE)

    @property
    def quantized(self) -> bool:
        """Whether the base is stored in 4 or 8 bits (bitsandbytes), frozen and prepared by a recipe."""
        return self.method in BASE_BITS

    @property
    def base_bits(self) -> int | None:
        """4 (QLoRA) or 8 (an LLM.int8 base); None for a base in the weights' dtype."""
        return BASE_BITS.get(self.method)

    def label(self) -> str:
        """``LoRA r=16 alpha=32 dropout 0.05 on q_proj,v_proj``,
        ``QLoRA (nf4, double quant, TRL's SFTTrainer recipe) ...`` or
        ``LoRA over an LLM.int8 base (Linear8bitLt, Axolotl recipe) ...``; for OFT
        ``OFT block size 32 (Cayley-Neumann, 5 terms) ...``, ``QOFT (nf4, ...) ...``."""
        name = "LoRA"
        recipe = RECIPE_NAMES[self.recipe or DEFAULT_QLORA_RECIPE]
        if self.method == "qlora":
            double = ", double quant" if self.double_quant else ""
            name = f"QLoRA ({self.quant_type}{double}, {recipe} recipe)"
        elif self.method == "lora_8bit":
            name = f"LoRA over an LLM.int8 base (bitsandbytes Linear8bitLt, {recipe} recipe)"
        if self.quantize_experts:
            name = f"{name[:-1]}, experts quantized on load)"
        if self.saved_quant is not None:
            name = f"LoRA over a base saved quantized ({self.saved_quant.label()})"
        targets = ",".join(self.targets) if self.targets else "PEFT's default modules"
        if self.target_pattern is not None:
            targets = f"the modules matching {self.target_pattern}"
        kernels = f" with {describe(self.kernels)}" if self.kernels else ""
        if self.exclude:
            targets += f" outside {','.join(self.exclude)}"
        if self.parameters:
            named = f"the parameters {','.join(self.parameters)}"
            targets = f"{targets} and {named}" if self.targets != () else named
        if self.tuner == "oft":
            from autotune.workload.oft import oft_settings

            return (f"{name.replace('LoRA', 'OFT')} {oft_settings(self.r, self.block_size, self.dropout)} "
                    f"on {targets}")
        return (f"{name} r={self.r} alpha={_number(self.alpha)} dropout {_number(self.dropout)} on {targets}"
                f"{kernels}")

    def excluded_pattern(self) -> str | None:
        """PEFT's exclude_modules for ``exclude``: a regular expression it matches against whole module
        names (re.fullmatch, tuners_utils.py _check_for_modules_to_exclude): a name containing one."""
        if not self.exclude:
            return None
        return ".*(?:" + "|".join(re.escape(name) for name in self.exclude) + ").*"

    def to_json(self) -> dict[str, Any]:
        return {
            "method": self.method, "r": self.r, "alpha": self.alpha, "dropout": self.dropout,
            "targets": list(self.targets) if self.targets is not None else None,
            "quant_type": self.quant_type, "double_quant": self.double_quant,
            "compute_dtype": self.compute_dtype, "bias": self.bias,
            "modules_to_save": list(self.modules_to_save), "recipe": self.recipe,
            # only when set: the stored keys of adapters before it stay as they were
            **({"target_pattern": self.target_pattern} if self.target_pattern is not None else {}),
            **({"kernels": list(self.kernels)} if self.kernels else {}),
            **({"quantize_experts": True} if self.quantize_experts else {}),
            **({"exclude": list(self.exclude)} if self.exclude else {}),
            **({"experts_undropped": True} if self.experts_undropped else {}),
            **({"tuner": self.tuner, "block_size": self.block_size} if self.tuner != "lora" else {}),
            **({"saved_quant": self.saved_quant.to_json()} if self.saved_quant is not None else {}),
            **({"target_parameters": list(self.parameters)} if self.parameters else {}),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Adapter:
        targets = data.get("targets")
        return make_adapter(
            data["method"], r=data.get("r", DEFAULT_R), alpha=data.get("alpha", DEFAULT_ALPHA),
            dropout=data.get("dropout", DEFAULT_DROPOUT), targets=targets,
            quant_type=data.get("quant_type", DEFAULT_QUANT_TYPE),
            double_quant=data.get("double_quant", True), compute_dtype=data.get("compute_dtype"),
            bias=data.get("bias", "none"), modules_to_save=data.get("modules_to_save") or (),
            recipe=data.get("recipe") or (STORED_QLORA_RECIPE if data["method"] == "qlora" else None),
            # (an 8-bit base was never stored without its recipe)
            target_pattern=data.get("target_pattern"), kernels=data.get("kernels") or (),
            quantize_experts=bool(data.get("quantize_experts", False)), exclude=data.get("exclude") or (),
            experts_undropped=bool(data.get("experts_undropped", False)),
            tuner=data.get("tuner", "lora"), block_size=data.get("block_size", 0),
            saved_quant=SavedQuant.from_json(data["saved_quant"]) if data.get("saved_quant") else None,
            parameters=data.get("target_parameters") or (),
        )


def _number(value: float) -> str:
    return f"{value:g}"


def parse_targets(value: str | Iterable[str] | None) -> tuple[str, ...] | None:
    """``--lora-targets``: comma-separated module names, ``all-linear``, or None (PEFT's default)."""
    if value is None:
        return None
    parts = [part.strip() for part in (value.split(",") if isinstance(value, str) else value)]
    parts = [part for part in parts if part]
    if not parts:
        raise InvalidInput("no LoRA target modules given: name modules (q_proj,v_proj), "
                           f"or {ALL_LINEAR}, or leave --lora-targets out for PEFT's default")
    if ALL_LINEAR in parts and len(parts) > 1:
        raise InvalidInput(f"{ALL_LINEAR} stands alone in LoRA targets, got {','.join(parts)}")
    return tuple(dict.fromkeys(parts))


def make_adapter(
    method: str, *, r: int = DEFAULT_R, alpha: float = DEFAULT_ALPHA, dropout: float = DEFAULT_DROPOUT,
    targets: str | Iterable[str] | None = None, quant_type: str = DEFAULT_QUANT_TYPE,
    double_quant: bool = True, compute_dtype: str | None = None, bias: str = "none",
    modules_to_save: Iterable[str] = (), recipe: str | None = None, target_pattern: str | None = None,
    kernels: str | Iterable[str] = (), quantize_experts: bool = False, exclude: Iterable[str] = (),
    experts_undropped: bool = False, tuner: str = "lora", block_size: int = 0,
    saved_quant: SavedQuant | None = None, parameters: Iterable[str] = (),
) -> Adapter:
    """An Adapter with every field checked; InvalidInput naming what was wrong and what is allowed.
    ``recipe`` None is DEFAULT_QLORA_RECIPE for qlora; a LoRA over a 16/32-bit base has none.
    ``tuner`` "oft": OFT's r / block_size (one of them 0) checked by workload/oft.py. ``parameters``:
    PEFT's target_parameters; with them ``targets`` may be empty (no module targeted)."""
    name = str(method).strip().lower()
    if name not in METHODS:
        raise InvalidInput(f"unknown PEFT method {method!r}: allowed are {', '.join(METHODS)}")
    if tuner not in TUNERS:
        raise InvalidInput(f"unknown PEFT tuner {tuner!r}: allowed are {', '.join(TUNERS)}")
    if tuner == "oft":
        from autotune.workload.oft import check_oft

        check_oft(r, block_size, bias=bias, kernels=kernels, quantize_experts=quantize_experts,
                  experts_undropped=experts_undropped)
    elif block_size:
        raise InvalidInput(f"a block size ({block_size!r}) is OFT's: LoRA has a rank only")
    elif isinstance(r, bool) or not isinstance(r, int) or not 1 <= r <= MAX_R:
        raise InvalidInput(f"LoRA rank must be an integer from 1 to {MAX_R}, got {r!r}")
    if isinstance(alpha, bool) or not isinstance(alpha, int | float) or not alpha > 0:
        raise InvalidInput(f"LoRA alpha must be a positive number, got {alpha!r}")
    if isinstance(dropout, bool) or not isinstance(dropout, int | float) or not 0 <= dropout < 1:
        raise InvalidInput(f"LoRA dropout must be a number from 0 up to (not including) 1, got {dropout!r}")
    quant_type = check_quant_type(quant_type)
    compute_dtype = check_compute_dtype(compute_dtype)
    if bias not in ("none", "all", "lora_only"):
        raise InvalidInput(f"LoRA bias must be none, all or lora_only, got {bias!r}")
    if name in BASE_BITS:
        recipe = check_recipe(recipe or DEFAULT_QLORA_RECIPE)
    elif recipe is not None:
        raise InvalidInput(f"a QLoRA recipe ({recipe}) prepares a 4- or 8-bit base: LoRA over a 16/32-bit "
                           "base has none; use qlora, or leave the recipe out")
    if target_pattern is not None:
        _check_pattern(target_pattern, targets)
    if quantize_experts and name not in BASE_BITS:
        raise InvalidInput("quantizing the experts on load (Axolotl's quantize_moe_experts) needs a 4- or "
                           "8-bit base: qlora, or lora with load_in_8bit")
    if saved_quant is not None:
        check_saved_quant(saved_quant)
        if name != "lora":
            raise InvalidInput(f"a base saved quantized ({saved_quant.method.upper()}) is not "
                               f"quantized again with bitsandbytes ({name}): transformers loads one "
                               "quantization_config")
        if kernels:
            raise InvalidInput("Axolotl's fused LoRA kernels read a 16-bit or bitsandbytes weight, not a "
                               f"{saved_quant.method.upper()} layer's")
    named = _check_parameters(parameters, tuner, 0.0 if experts_undropped else dropout)
    no_modules = named and targets is not None and not (
        targets.strip() if isinstance(targets, str) else tuple(targets))
    parsed = () if no_modules else parse_targets(targets)
    return Adapter(name, r, float(alpha), float(dropout), parsed,  # type: ignore[arg-type]
                   quant_type, bool(double_quant), compute_dtype, bias, tuple(modules_to_save), recipe,
                   target_pattern, parse_kernels(kernels if isinstance(kernels, str) else tuple(kernels)),
                   bool(quantize_experts), _check_exclude(exclude), bool(experts_undropped), tuner,
                   int(block_size), saved_quant, named)


def _check_parameters(names: Iterable[str], tuner: str, dropout: float) -> tuple[str, ...]:
    """PEFT's target_parameters, checked as LoraConfig and ParamWrapper check them."""
    if isinstance(names, str):
        raise InvalidInput(f"LoRA target parameters must be a list of names, got the string {names!r}")
    found = tuple(dict.fromkeys(names))
    if not found:
        return found
    if not all(isinstance(name, str) and name for name in found):
        raise InvalidInput(f"LoRA target parameters must be named, got {list(found)!r}")
    if tuner != "lora":
        raise InvalidInput("target parameters are LoRA's (PEFT's ParamWrapper), not OFT's")
    if dropout:
        # peft/tuners/lora/layer.py ParamWrapper.update_layer
        raise InvalidInput("LoRA on parameters takes no dropout (PEFT's ParamWrapper: \"lora.ParamWrapper "
                           f"does not work with lora_dropout != 0\"), got {dropout:g}")
    return found


def _check_exclude(names: Iterable[str]) -> tuple[str, ...]:
    found = tuple(names)
    if not all(isinstance(name, str) and name for name in found):
        raise InvalidInput(f"modules left without LoRA must be named, got {list(found)!r}")
    return found


def _check_pattern(pattern: Any, targets: Any) -> None:
    if targets is not None:
        raise InvalidInput("LoRA targets are module names or a pattern, not both")
    if not isinstance(pattern, str) or not pattern:
        raise InvalidInput(f"a LoRA target pattern must be a regular expression, got {pattern!r}")
    try:
        re.compile(pattern)
    except re.error as exc:
        raise InvalidInput(f"LoRA target pattern {pattern!r} is not a regular expression: {exc}") from exc


# --- PEFT's adapter_config.json ------------------------------------------------------------

# LoraConfig fields this tool models; others must be at their defaults (or be memory-neutral).
_MEMORY_NEUTRAL = {
    "peft_type", "task_type", "base_model_name_or_path", "revision", "inference_mode",
    "init_lora_weights", "use_rslora", "fan_in_fan_out", "auto_mapping", "lora_alpha", "r",
    "lora_dropout", "target_modules", "bias", "modules_to_save", "layers_to_transform",
    "layers_pattern", "rank_pattern", "alpha_pattern", "megatron_config", "megatron_core",
    "loftq_config", "use_dora", "layer_replication", "runtime_config", "exclude_modules",
    "eva_config", "corda_config", "lora_bias", "trainable_token_indices", "target_parameters",
    "peft_version", "qalora_group_size", "use_qalora", "alora_invocation_tokens", "arrow_config",
    "ensure_weight_tying", "lora_ga_config", "use_bdlora",
}
# Fields that change the step in ways not modelled: refused unless at their no-op value.
_UNMODELLED: dict[str, tuple[Any, str]] = {
    "use_dora": (False, "DoRA adds a weight-norm computation per layer"),
    "layer_replication": (None, "layer replication shares base layers between adapters"),
    "rank_pattern": ({}, "per-module ranks"),
    "alpha_pattern": ({}, "per-module alphas"),
    "layers_to_transform": (None, "adapters on some layers only"),
    "lora_bias": (False, "a trainable bias on lora_B"),
    "exclude_modules": (None, "excluded modules"),
    "trainable_token_indices": (None, "trainable token embeddings"),
    "target_parameters": (None, "LoRA on parameters rather than modules"),
    "use_qalora": (False, "QA-LoRA"),
}


def adapter_from_peft_config(path: str | Path, *, method: str = "lora") -> Adapter:
    """The Adapter of a PEFT ``adapter_config.json`` (a file, or a directory holding one), as a
    ``method`` (METHODS: over a base in the weights' dtype, a 4-bit or an 8-bit one). A field that
    changes the step in a way not modelled is refused, naming it."""
    file = Path(path).expanduser()
    if file.is_dir():
        file = file / "adapter_config.json"
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InvalidInput(f"no PEFT config at {file}: give adapter_config.json or its directory") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidInput(f"cannot read the PEFT config {file}: {exc}") from exc
    return adapter_from_peft_dict(data, source=str(file), method=method)


def adapter_from_peft_dict(data: Any, *, source: str, method: str = "lora") -> Adapter:
    if not isinstance(data, dict):
        raise InvalidInput(f"{source} is not a JSON object")
    peft_type = str(data.get("peft_type", "LORA")).upper()
    if peft_type != "LORA":
        raise InvalidInput(f"{source}: peft_type {peft_type} is not modelled: autotune models LORA "
                           "(LoRA, and QLoRA over a 4-bit base)")
    for key, (neutral, what) in _UNMODELLED.items():
        value = data.get(key, neutral)
        if value not in (neutral, None, {}, [], False):
            raise InvalidInput(f"{source}: {key}={value!r} ({what}) is not modelled: autotune models "
                               "plain LoRA; remove it, or estimate without it")
    targets = data.get("target_modules")
    pattern = None
    if isinstance(targets, str) and targets != ALL_LINEAR:
        targets, pattern = None, targets  # PEFT matches a string as a regular expression
    return make_adapter(
        method, r=data.get("r", 8), alpha=data.get("lora_alpha", 8),
        dropout=data.get("lora_dropout", 0.0), targets=targets, bias=data.get("bias", "none"),
        modules_to_save=data.get("modules_to_save") or (), target_pattern=pattern,
    )


# --- building the adapted model ----------------------------------------------------------------

@dataclass(frozen=True)
class ParameterCounts:
    """PEFT's ``get_nb_trainable_parameters()``: 4-bit weights counted as their unpacked elements."""

    trainable: int
    total: int

    def to_json(self) -> dict[str, int]:
        return {"trainable": self.trainable, "total": self.total}


def peft_task_type(task: str) -> str | None:
    """PEFT's task_type for a ``task`` model. A vision-language model's adapter is a causal LM's:
    Axolotl's LoraConfig says task_type CAUSAL_LM for every model (loaders/adapter.py
    _build_peft_lora_config), VLMs included, as LLaMA-Factory's does (model/adapter.py)."""
    return PEFT_TASK_TYPES["causal-lm" if task == "image-text-to-text" else task]


def peft_targets(adapter: Adapter) -> str | list[str] | None:
    """``target_modules`` as PEFT's configs take it."""
    if adapter.targets == (ALL_LINEAR,):
        return ALL_LINEAR  # PEFT reads the shorthand only as a string
    if adapter.targets is not None:
        return list(adapter.targets)
    return adapter.target_pattern


def peft_config(adapter: Adapter, task: str) -> Any:
    """PEFT's config for ``adapter``: its LoraConfig, or its OFTConfig (workload/oft.py)."""
    if adapter.tuner == "oft":
        from autotune.workload.oft import oft_config

        return oft_config(r=adapter.r, block_size=adapter.block_size, dropout=adapter.dropout,
                          target_modules=peft_targets(adapter),
                          modules_to_save=list(adapter.modules_to_save) or None,
                          exclude_modules=adapter.excluded_pattern(), task_type=peft_task_type(task))
    return lora_config(adapter, task)


def lora_config(adapter: Adapter, task: str) -> Any:
    """PEFT's LoraConfig for ``adapter`` on a ``task`` model."""
    from peft import LoraConfig

    return LoraConfig(
        r=adapter.r,
        lora_alpha=adapter.alpha,  # type: ignore[arg-type]  # PEFT reads any number
        lora_dropout=adapter.dropout,
        target_modules=peft_targets(adapter),
        bias=adapter.bias,  # type: ignore[arg-type]  # checked by make_adapter
        modules_to_save=list(adapter.modules_to_save) or None,
        exclude_modules=adapter.excluded_pattern(),
        task_type=peft_task_type(task),  # type: ignore[arg-type]  # PEFT takes the name
        target_parameters=list(adapter.parameters) or None,
    )


@contextlib.contextmanager
def _experts_undropped(active: bool) -> Iterator[None]:
    """Axolotl's _patch_peft_param_wrapper_dropout (loaders/adapter.py), while PEFT builds the model:
    ParamWrapper.__init__ given a copy of the LoraConfig with lora_dropout 0."""
    from peft.tuners.lora.layer import ParamWrapper

    if not active:
        yield
        return
    original = ParamWrapper.__init__

    def init(self: Any, base_layer: Any, adapter_name: str, parameter_name: str, config: Any,
             *args: Any, **kwargs: Any) -> None:
        if getattr(config, "lora_dropout", 0):
            config = copy.copy(config)
            config.lora_dropout = 0.0
        original(self, base_layer, adapter_name, parameter_name, config, *args, **kwargs)

    ParamWrapper.__init__ = init  # type: ignore[method-assign]
    try:
        yield
    finally:
        ParamWrapper.__init__ = original  # type: ignore[method-assign]


def compute_dtype(adapter: Adapter, supports_bf16: bool) -> str:
    """The 4-bit layers' configured compute dtype: the adapter's, else bf16 where supported."""
    if adapter.compute_dtype is not None:
        return adapter.compute_dtype
    return "bfloat16" if supports_bf16 else "float16"


def prepare(
    model: torch.nn.Module, adapter: Adapter, task: str, parts: StepParts | None = None, *,
    supports_bf16: bool = True, fsdp: bool = False,
) -> torch.nn.Module:
    """``model`` as PEFT wraps it for ``adapter``: for qlora, its linear layers stored in 4 bits
    by the backend's ``parts`` first (those transformers' bitsandbytes integration quantizes,
    computing in ``compute_dtype(adapter, supports_bf16)``: the card's) and the base prepared by
    the adapter's recipe (module docstring); then ``get_peft_model``. ``fsdp``: the model is
    sharded by FSDP after (FSDP-QLoRA, ``quant_storage``).

    Gradient checkpointing is left to the step (step.gradient_checkpointing), which turns it on
    per mode as ``prepare_model_for_kbit_training(use_gradient_checkpointing=True)`` would.
    """
    from peft import get_peft_model, prepare_model_for_kbit_training

    if adapter.quantized:
        if parts is None:
            raise InvalidInput(f"a {adapter.base_bits}-bit base needs a backend that can store it")
        if adapter.base_bits == 8:
            quantize = parts.int8_quantizer()
        else:
            quantize = parts.quantizer(quant_type=adapter.quant_type, double_quant=adapter.double_quant,
                                       compute_dtype=compute_dtype(adapter, supports_bf16),
                                       quant_storage=quant_storage(adapter, fsdp))
        model_type = getattr(getattr(model, "config", None), "model_type", None)
        skip = AXOLOTL_SKIPPED.get(model_type) if adapter.recipe == "axolotl" and model_type else None
        _quantize_linears(model, quantize, skip)
        if adapter.quantize_experts:
            parts.expert_quantizer(bits=adapter.base_bits or 4, quant_type=adapter.quant_type,
                                   double_quant=adapter.double_quant)(model)
        # transformers' Bnb4BitHfQuantizer (Bnb8BitHfQuantizer) sets it after loading; the recipes
        # (PEFT's prepare_model_for_kbit_training, TRL's cast) read either
        setattr(model, f"is_loaded_in_{adapter.base_bits}bit", True)
        # Axolotl skips it under FSDP ("Make sure everything is in the same dtype": loaders/model.py
        # ``_prepare_model_for_quantization``, is_qlora_and_fsdp_enabled), and every later cast
        # (``_configure_embedding_dtypes``): the weights stay in the dtype they were loaded in.
        if adapter.recipe == "peft" or adapter.recipe == "axolotl" and not fsdp:
            loaded = {name: param.dtype for name, param in model.named_parameters()}
            # PEFT's own function: freezes every parameter and casts those in float16/bfloat16 (all
            # but the 4-bit weights: norms, embeddings, the head) to float32.
            prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
            if adapter.recipe == "axolotl":
                _axolotl_back_to_model_dtype(model, loaded)
    if adapter.saved_quant is not None:
        if parts is None:
            raise InvalidInput("a base saved quantized needs a backend that can store it")
        # transformers builds gptqmodel's layers for every linear layer but the output head
        # (quantizer_awq.py get_modules_to_not_convert with its default skips; optimum's GPTQ
        # convert_model, the linear layers of the decoder blocks: the same ones for a decoder LLM)
        _quantize_linears(model, parts.saved_quantizer(adapter.saved_quant))
    config = peft_config(adapter, task)
    if adapter.quantize_experts:
        # Axolotl's patch_peft_target_parameters_matching: PEFT skips the parametrizations' lists
        # ("...experts.parametrizations.down_proj"), which a module name would otherwise match.
        config.exclude_modules = PARAMETRIZATIONS
        if adapter.exclude:
            config.exclude_modules = f"(?:{PARAMETRIZATIONS})|(?:{adapter.excluded_pattern()})"
        if adapter.parameters:
            config.target_parameters = _parametrized_targets(model, adapter.parameters)
    _register_quantized_layers(config, adapter, parts)
    try:
        with warnings.catch_warnings():
            # PeftModel.__init__ asks transformers 5 by its deprecated name (peft_model.py): not the caller's
            warnings.filterwarnings("ignore", "`is_gradient_checkpointing` is deprecated", FutureWarning)
            # PEFT warns when exclude_modules excluded nothing: the parametrizations' need not match
            warnings.filterwarnings("ignore", "You have passed exclude_modules")
            with _experts_undropped(adapter.experts_undropped):
                wrapped = get_peft_model(model, config)
    except ValueError as exc:
        message = str(exc).splitlines()[0].rstrip(".")
        if "target_modules" in message or "not found in the base model" in message:
            raise InvalidInput.naming(
                f"LoRA targets: {message}. Name modules of this model in {{lora_targets}}, or use "
                f"{ALL_LINEAR}") from exc
        raise InvalidInput(f"PEFT cannot build this LoRA setup: {message}") from exc
    except RuntimeError as exc:
        # e.g. a classification head quantized by transformers (get_keys_to_not_convert keeps
        # "classifier.bias", not the module) that PEFT's modules_to_save then makes trainable.
        reason = str(exc).splitlines()[0]
        if "floating point dtype can require gradients" in reason:
            reason = (f"transformers quantizes its head to {adapter.base_bits} bits with the rest, and "
                      f"PEFT's modules_to_save cannot train a quantized module (torch: {reason})")
        raise InvalidInput(f"PEFT cannot build {adapter.method} for a {task} model: {reason}") from exc
    if adapter.quantized and adapter.recipe == "trl":
        import torch

        # trl/trainer/sft_trainer.py: "When using QLoRA, the PEFT adapter weights are converted to
        # bf16" (every parameter that requires grad: the adapters and any module trained whole),
        # for a model loaded in 4 or 8 bits ("is_loaded_in_4bit" or "is_loaded_in_8bit").
        for param in wrapped.parameters():
            if param.requires_grad:
                param.data = param.data.to(torch.bfloat16)
    if adapter.quantize_experts:
        _merge_as_axolotl_pins(wrapped)
    if adapter.kernels:
        # Axolotl: apply_lora_kernel_patches once PEFT has wrapped the model (loaders/model.py ->
        # patch_manager.py apply_post_model_load_patches -> _apply_lora_kernel_patch).
        if parts is None:
            raise InvalidInput("Axolotl's fused LoRA kernels need a backend that can patch them in")
        parts.lora_kernels(wrapped, adapter.kernels)
    return wrapped


# Axolotl's patch_peft_target_parameters_matching (monkeypatch/moe_quant.py _UNFUSED_TO_FUSED): an
# unfused projection's name also targets the fused parameter a model stores instead.
_UNFUSED_TO_FUSED = {"gate_proj": "gate_up_proj", "up_proj": "gate_up_proj"}


def _parametrized_targets(model: torch.nn.Module, names: tuple[str, ...]) -> list[str]:
    """target_parameters as Axolotl's patch_peft_target_parameters_matching (monkeypatch/moe_quant.py
    ``_patched_inject_parameters``) matches them on quantized experts: PEFT's _inject_parameters
    matches a parametrized module's parameter by its module's full name only, Axolotl's by suffix,
    so each name is expanded to the full names of the parametrized modules it ends (the fused
    parameter for an unfused name) before PEFT matches them."""
    expanded = dict.fromkeys(names)
    for module_name, module in model.named_modules():
        if not hasattr(module, "parametrizations"):
            continue
        for target in names:
            path, _, name = target.rpartition(".")
            if not (module_name == path or module_name.endswith("." + path)):
                continue
            if hasattr(module, name):
                expanded[f"{module_name}.{name}"] = None
            elif hasattr(module, _UNFUSED_TO_FUSED.get(name, "")):
                expanded[f"{module_name}.{_UNFUSED_TO_FUSED[name]}"] = None
    return list(expanded)


def _merge_as_axolotl_pins(model: torch.nn.Module) -> None:
    """LoRA on quantized experts as the PEFT Axolotl pins (pyproject.toml: peft==0.19.1) merges it:
    each ParamWrapper over a parameter bitsandbytes parametrizes (quantize_moe_experts) registers
    ``_LoraParameterProxy(get_delta_weight(...))``, the delta materialized in the parameter's shape
    (peft 0.19.1 tuners/lora/layer.py ``ParamWrapper._activate_lora``, the same code as this PEFT's
    branch for several adapters). This PEFT's single-adapter ``_LoraFactorsProxy`` is not removed from a
    list that holds another parametrization (``_remove_parametrizations`` looks for
    ``_LoraParameterProxy`` only: "Could not find any LoRA parametrization"), and the next forward then
    fails setting requires_grad on the packed uint8 weight."""
    import torch.nn.utils.parametrize as P
    from peft.tuners.lora.layer import ParamWrapper, _LoraParameterProxy

    @contextlib.contextmanager
    def activate_lora(self: Any, active_adapters: list[str]) -> Iterator[None]:
        adapters = [a for a in active_adapters if a in self.lora_A]
        if not adapters:
            yield
            return
        delta_weight = self.get_delta_weight(adapters[0])
        for name in adapters[1:]:
            delta_weight = delta_weight + self.get_delta_weight(name)
        base_layer = self.get_base_layer()
        requires_grad_before = self.get_param().requires_grad
        P.register_parametrization(base_layer, self.parameter_name, _LoraParameterProxy(delta_weight))
        base_layer.parametrizations[self.parameter_name].original.requires_grad_(requires_grad_before)
        try:
            with P.cached():
                yield
        finally:
            self._remove_parametrizations()

    for module in model.modules():
        if isinstance(module, ParamWrapper) and P.is_parametrized(module.get_base_layer(),
                                                                  module.parameter_name):
            module._activate_lora = MethodType(activate_lora, module)  # type: ignore[method-assign]


def quant_storage(adapter: Adapter, fsdp: bool) -> str:
    """The dtype a 4-bit base's packed bytes are stored in (``bnb_4bit_quant_storage``): bfloat16 as
    Axolotl loads a QLoRA base (loaders/model.py ``_set_quantization_config``: its BitsAndBytesConfig
    sets ``bnb_4bit_quant_storage=torch.bfloat16``), the storage FSDP shards as a 16-bit parameter
    (FSDP-QLoRA); else BitsAndBytesConfig's default uint8. Without FSDP Axolotl's bfloat16 holds the
    same bytes as uint8 (``(n + 1) // 4`` two-byte elements), and is left uint8 there."""
    return "bfloat16" if fsdp and adapter.recipe == "axolotl" else "uint8"


def _axolotl_back_to_model_dtype(model: torch.nn.Module, loaded: dict[str, torch.dtype]) -> None:
    """Axolotl's cast after ``prepare_model_for_kbit_training`` (loaders/model.py
    ``_convert_embedding_modules_dtype(dist_dtype=cfg.torch_dtype)``): every module whose name
    has "norm" in it, and the embedding modules, back to the model's dtype (the dtype the
    parameters were loaded in; 4-bit weights untouched)."""
    model_type = getattr(getattr(model, "config", None), "model_type", "")
    embeddings = _AXOLOTL_EMBEDDINGS.get(model_type, _AXOLOTL_DEFAULT_EMBEDDINGS)
    for name, module in model.named_modules():
        if "norm" in name or (any(e in name for e in embeddings) and hasattr(module, "weight")):
            for pname, param in module.named_parameters(prefix=name):
                dtype = loaded.get(pname)
                if dtype is not None and dtype.is_floating_point and param.dtype != dtype:
                    param.data = param.data.to(dtype)


def _quantize_linears(model: torch.nn.Module, quantize: Callable[[Any, str], Any],
                      skip: tuple[str, ...] | None = None) -> None:
    """Replace the linear layers transformers' bitsandbytes integration quantizes
    (integrations/bitsandbytes.py ``replace_with_bnb_linear``: every ``nn.Linear`` and GPT-2
    ``Conv1D`` but those of quantizers/base.py ``get_modules_to_not_convert``: without
    ``llm_int8_skip_modules`` (``skip``) ``get_keys_to_not_convert``'s tied weights, last module and
    output embeddings; with it, those modules instead, and the model's ``_keep_in_fp32_modules``)."""
    from torch import nn
    from transformers.pytorch_utils import Conv1D
    from transformers.quantizers.base import get_keys_to_not_convert
    from transformers.quantizers.quantizers_utils import should_convert_module

    if skip is None:
        keep = get_keys_to_not_convert(model)
    else:
        keep = [*skip, *(getattr(model, "_keep_in_fp32_modules", None) or [])]
    names = [name for name, module in model.named_modules()
             if (type(module) is nn.Linear or isinstance(module, Conv1D))
             and should_convert_module(name, keep)]
    for name in names:
        model.set_submodule(name, quantize(model.get_submodule(name), name))


def _register_quantized_layers(config: Any, adapter: Adapter, parts: StepParts | None) -> None:
    """PEFT's custom-module hook for the backend's 4-bit layers that PEFT does not dispatch itself
    (the estimator's emulated ones; the cuda backend's bitsandbytes layers PEFT knows)."""
    quantized = adapter.quantized or adapter.saved_quant is not None
    if not quantized or parts is None or adapter.tuner != "lora":
        # OFT's layer class wraps any nn.Linear, the emulated 4/8-bit layers and bitsandbytes' own
        # (peft/tuners/oft/model.py _get_tuner_layer_class): nothing to register
        return
    mapping = dict(parts.lora_modules())
    if mapping:
        config._register_custom_module(mapping)


def parameter_counts(model: Any, parts: StepParts | None = None) -> ParameterCounts:
    """Trainable and total parameters as PEFT's ``get_nb_trainable_parameters`` counts them;
    ``parts``: the backend's that built ``model`` (a 4-bit base needs them)."""
    if hasattr(model, "get_nb_trainable_parameters"):
        trainable, total = model.get_nb_trainable_parameters()
        # PEFT counts a bitsandbytes Params4bit as 2 elements a byte (peft_model.py); a backend's
        # 4-bit weight that PEFT does not know (the estimator's uint8 parameter) it counts once.
        if parts is not None:
            total += parts.uncounted_4bit_parameters(model)
        return ParameterCounts(int(trainable), int(total))
    params = list(model.parameters())
    return ParameterCounts(sum(p.numel() for p in params if p.requires_grad),
                           sum(p.numel() for p in params))


def resolved_targets(model: Any) -> tuple[str, ...]:
    """The target module names PEFT resolved on a wrapped model, by their last part (all-linear
    resolves to full paths: model.layers.0.mlp.up_proj is up_proj), sorted."""
    targets = model.peft_config["default"].target_modules
    if isinstance(targets, str):
        return (targets,)
    return tuple(sorted({name.rsplit(".", 1)[-1] for name in targets}))


@dataclass(frozen=True)
class AdapterSummary:
    """What outputs say of a workload's adapter: its settings, the modules PEFT put LoRA on, and
    the trainable / total parameters (``get_nb_trainable_parameters``)."""

    adapter: Adapter
    targets: tuple[str, ...]
    parameters: ParameterCounts

    def label(self) -> str:
        p = self.parameters
        return (f"{replace(self.adapter, targets=self.targets).label()}: {_count(p.trainable)} of "
                f"{_count(p.total)} parameters trainable ({100 * p.trainable / max(1, p.total):.2f}%)")

    def to_json(self) -> dict[str, Any]:
        return {**self.adapter.to_json(), "targets": list(self.targets),
                "targets_default": self.adapter.targets is None,
                "parameters": self.parameters.to_json(), "label": self.label()}


def _count(n: int) -> str:
    for unit, size in (("B", 10**9), ("M", 10**6), ("k", 10**3)):
        if n >= size:
            return f"{n / size:.2f}{unit}"
    return str(n)


_SUMMARIES: dict[Any, AdapterSummary] = {}


def summarize(workload: Any, parts: StepParts) -> AdapterSummary | None:
    """The AdapterSummary of ``workload`` (None without an adapter), from the model built on the
    meta device (shapes only) with ``parts`` (the estimator's: tuner.adapter_json): the same PEFT
    wrapping as every backend's, 4-bit layers counted as PEFT counts bitsandbytes' (two weights
    a byte)."""
    adapter = workload.adapter
    if adapter is None:
        return None
    kt = workload.experts_kernel == "ktransformers"  # use_kt: the experts off the GPU (ktransformers.py)
    key = (workload.model, workload.task, workload.weights_dtype, adapter, parts, kt)
    found = _SUMMARIES.get(key)
    if found is None:
        import torch

        from autotune.workload.step import build_model

        with torch.device("meta"):
            model, _ = build_model(workload.model, workload.task, "eager", workload.weights_dtype)
            if kt:
                from autotune.workload.ktransformers import apply as kt_apply

                kt_apply(model, workload.model.config.model_type)
            wrapped = prepare(model, adapter, workload.task, parts)
        found = AdapterSummary(adapter, resolved_targets(wrapped), parameter_counts(wrapped, parts))
        _SUMMARIES[key] = found
    return found


# --- checking one field (the request, autotune/request.py, checks them together) ------------------


def check_quant_type(value: str) -> str:
    """A 4-bit data type of bitsandbytes, one of QUANT_TYPES."""
    if value not in QUANT_TYPES:
        raise InvalidInput(f"unknown 4-bit quant type {value!r}: allowed are {', '.join(QUANT_TYPES)}")
    return value


def check_recipe(value: str) -> str:
    """How a 4-bit base is prepared, one of QLORA_RECIPES."""
    name = str(value).strip().lower()
    if name not in QLORA_RECIPES:
        raise InvalidInput(f"unknown QLoRA recipe {value!r}: allowed are {', '.join(QLORA_RECIPES)} "
                           "(how TRL's SFTTrainer, Axolotl, or PEFT's prepare_model_for_kbit_training "
                           "prepare a 4-bit base)")
    return name


def check_compute_dtype(value: str | None) -> str | None:
    """A 4-bit compute dtype by its torch name (bf16/fp16/fp32 accepted), one of COMPUTE_DTYPES."""
    if value is None:
        return None
    from autotune.workload.models import check_dtype

    try:
        name: str | None = check_dtype(value)
    except InvalidInput:
        name = None
    if name not in COMPUTE_DTYPES:
        raise InvalidInput(f"4-bit compute dtype must be one of {', '.join(COMPUTE_DTYPES)}, got {value!r}")
    return name
