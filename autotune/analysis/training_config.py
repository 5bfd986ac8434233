"""The planned training step in a training config, read whole.

Five formats, told apart by their keys (``_detect``):

    axolotl    an Axolotl YAML: base_model, sequence_len, micro_batch_size, sample_packing, adapter, ...
    trl-sft    a TRL SFTConfig (a TrainingArguments superset): packing, padding_free, model_init_kwargs,
               dataset_text_field, loss_type, ..., and the ``trl sft`` CLI's model keys (use_peft, lora_r)
    trainer    a Hugging Face TrainingArguments JSON (any of its fields), with the model and data
               arguments of the example scripts (model_name_or_path, torch_dtype, max_seq_length, block_size)
    autotune   autotune's own: model, seq_len, batch_size, mode, task, optimizer, dtype, attn, loss
    peft       a PEFT adapter_config.json (or the adapter directory holding one): the base model and
               the adapter; the step's length, batch and precision are left to the flags

Every key is one of three kinds. *Modelled*: read into the plan (batch, length, precision, weights
dtype, optimizer, attention, loss, checkpointing, and a LoRA/QLoRA adapter: ``TrainingPlan.adapter``,
an ``autotune.workload.adapters.Adapter``). *No effect* on a training step's GPU memory
(learning_rate, output_dir, datasets, ...): accepted. *Unmodelled*: it changes memory in a way
autotune does not model (8-bit weights, DoRA, DeepSpeed, torch.compile, ...): set to anything but its
default (null, false, empty), it raises ``UnmodelledSetting``; a verdict for a different job is worse
than none. Keys in none of the lists come back in ``TrainingPlan.ignored`` for the output to name.

An adapter is read as its tool builds it, with the tool's defaults where a key is absent (Axolotl:
loaders/adapter.py and utils/schemas/peft.py; TRL: trainer/model_config.py and trainer/utils.py
``get_peft_config`` / ``get_quantization_config``); every adapter read adds a note naming it.

``missing_fields`` names what the file leaves out (``autotune check --from-config`` lets flags fill it).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from autotune.errors import InvalidInput, UnmodelledSetting
from autotune.request import INT8_BASE, INT8_REASON
from autotune.workload.adapters import (
    ALL_LINEAR,
    COMPUTE_DTYPES,
    PEFT_TASK_TYPES,
    QUANT_TYPES,
    Adapter,
    adapter_from_peft_config,
    adapter_from_peft_dict,
    make_adapter,
)
from autotune.workload.models import TASKS
from autotune.workload.modes import Mode, parse_mode

FORMATS = ("trainer", "trl-sft", "axolotl", "autotune", "peft")
# The Trainer ``optim`` names that autotune.workload.optimizers models.
OPTIMIZERS = ("adamw_torch_fused", "adamw_torch", "adamw", "adafactor", "adamw_bnb_8bit", "adamw_8bit",
              "paged_adamw_8bit", "paged_adamw_32bit", "sgd")
ATTENTIONS = ("flash_attention_2", "sdpa", "eager")
# The same flash-attn 2 kernel, fetched from the Hub by transformers' kernels integration.
_ATTN_ALIASES = {"kernels-community/flash-attn2": "flash_attention_2"}
DTYPES = ("float32", "bfloat16", "float16", "auto")
_DTYPE_ALIASES = {"fp32": "float32", "float": "float32", "bf16": "bfloat16", "fp16": "float16",
                  "half": "float16"}

SHARDING = "DeepSpeed/FSDP sharding is not modelled: autotune models one GPU holding the whole model"
PARALLEL = "tensor/context parallelism is not modelled: autotune models one GPU holding the whole model"
QUANT = ("quantized weights are not modelled beyond a bitsandbytes 4-bit base under LoRA (QLoRA): "
         "8-bit, GPTQ, AWQ, torchao, ... are not")
DORA = "DoRA adds a weight-norm computation per adapted layer, which autotune does not model"
RELORA = ("ReLoRA merges the adapters into the base weights and restarts them every few steps, which "
          "autotune does not model")
REGEX_TARGETS = ("PEFT matches a string of target modules as a regular expression against whole module "
                 "names (model.layers.0.self_attn.q_proj), which autotune does not model: list module names, "
                 f"or write {ALL_LINEAR}")
COMPILE = "torch.compile fuses kernels and changes what the backward keeps; autotune models eager PyTorch"
LIGER = ("Liger swaps the RMSNorm, RoPE, SwiGLU and cross-entropy kernels, which autotune does not model; "
         "only its fused linear cross-entropy is modelled (loss: chunked)")
OFFLOAD = "activations or weights offloaded to the CPU are not modelled"
KERNEL = "a swapped-in kernel autotune does not model"
REENTRANT = ("reentrant checkpointing (use_reentrant=True) is not modelled: autotune models transformers' "
             "default, use_reentrant=False")

PACKED_NOTE = "every row filled to seq_len (the padded worst case autotune models)"
CHUNKED_NOTE = "logits computed in chunks, never the full [batch, seq, vocab] tensor (loss: chunked)"


@dataclass(frozen=True)
class TrainingPlan:
    format: str  # one of FORMATS
    model: str | None
    seq_len: int | None  # tokens per row
    batch_size: int | None  # rows per micro-batch on one GPU
    mode: Mode | None
    accumulation_steps: int = 1
    task: str | None = None  # None: autotune infers it from the model config
    dtype: str | None = None  # weights dtype asked for, one of DTYPES; None = not said
    optimizer: str | None = None  # a Trainer ``optim`` name of OPTIMIZERS; None = not said
    attn: str | None = None  # one of ATTENTIONS; None = what transformers picks
    loss: str | None = None  # "chunked": a loss that never materializes the full logits; None: full
    adapter: Adapter | None = None  # LoRA / QLoRA; None: no adapter, a full fine-tune (peft: always set)
    notes: tuple[str, ...] = ()  # one line per modelled setting a reader should see
    ignored: tuple[str, ...] = ()  # keys in no list, taken to have no effect on memory


def read_training_config(path: str | Path) -> TrainingPlan:
    """The planned training step of a config file (or of a PEFT adapter directory); a memory-relevant
    key it cannot model raises."""
    file = Path(path)
    if file.is_dir():
        if not (file / "adapter_config.json").is_file():
            raise InvalidInput(f"training config {str(path)!r} is a directory without adapter_config.json: "
                               "give a training config file, or a PEFT adapter directory")
        file = file / "adapter_config.json"
    cfg = _Config(_load(file), str(file))
    fmt = _detect(cfg)
    if fmt == "peft":
        return _read_peft(cfg)
    if fmt == "axolotl":
        return _read_axolotl(cfg)
    if fmt == "autotune":
        return _read_autotune(cfg)
    return _read_trainer(cfg, fmt)


def missing_fields(plan: TrainingPlan) -> list[str]:
    names = {"model": plan.model, "seq_len": plan.seq_len, "batch_size": plan.batch_size}
    return [name for name, value in names.items() if value is None]


# ---------------------------------------------------------------------------------------------
# Reading a file


def _load(file: Path) -> dict[str, Any]:
    try:
        text = file.read_text()
    except OSError as exc:
        raise InvalidInput(f"cannot read training config {str(file)!r}: {exc.strerror}") from exc
    if file.suffix.lower() == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InvalidInput(f"training config {str(file)!r} is not valid JSON: {exc}") from exc
    else:
        import yaml

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise InvalidInput(f"training config {str(file)!r} is not valid YAML or JSON: {exc}") from exc
    if data is None:
        data = {}
    if not isinstance(data, dict) or not all(isinstance(key, str) for key in data):
        raise InvalidInput(f"training config {str(file)!r} must be a mapping of keys to values")
    return data


def _unset(value: Any) -> bool:
    """A key's value that asks for nothing: null, false, zero, an empty string, list or mapping."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float):
        return value == 0
    return value is None or value in ("", [], {})


class _Config:
    """One file's mapping; remembers the keys read, so that the rest can be listed as ignored."""

    def __init__(self, data: dict[str, Any], file: str) -> None:
        self.data = data
        self.file = file
        self.read: set[str] = set()
        self.notes: list[str] = []
        self.nested_ignored: list[str] = []  # e.g. model_init_kwargs.revision

    def get(self, key: str) -> Any:
        self.read.add(key)
        return self.data.get(key)

    def bad(self, key: str, value: Any, expected: str, what: str = "") -> InvalidInput:
        return InvalidInput(f"{key}{': ' + what if what else ''} in {self.file!r} must be {expected}, "
                            f"got {value!r}")

    def unmodelled(self, key: str, value: Any, why: str) -> UnmodelledSetting:
        return UnmodelledSetting(f"{key}: {value!r} in {self.file!r} is not modelled: {why}")

    def flag(self, key: str, default: bool = False) -> bool:
        value = self.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self.bad(key, value, "true or false")
        return value

    def positive(self, key: str, what: str = "") -> int | None:
        value = self.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise self.bad(key, value, "a positive integer", what)
        return value

    def text(self, key: str) -> str | None:
        value = self.get(key)
        if value is not None and not isinstance(value, str):
            raise self.bad(key, value, "a string")
        return value

    def refuse(self, refused: dict[str, str]) -> None:
        """Raise for the first key of ``refused`` set to anything but its default."""
        for key, why in refused.items():
            if not _unset(self.get(key)):
                raise self.unmodelled(key, self.data[key], why)

    def ignored(self, known: Iterable[str], prefixes: tuple[str, ...] = ()) -> tuple[str, ...]:
        known = set(known) | self.read
        keys = [k for k in self.data if k not in known and not k.startswith(prefixes)]
        return tuple(keys + self.nested_ignored)


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


# ---------------------------------------------------------------------------------------------
# Format detection


# Keys only autotune's own format has.
_AUTOTUNE_KEYS = _words("model seq_len batch_size mode task optimizer dtype attn loss accumulation_steps")
_AUTOTUNE_MARKERS = _words("model seq_len batch_size mode")
# Keys only Axolotl has (TrainingArguments and TRL have none of them).
_AXOLOTL_MARKERS = _words("base_model base_model_config sequence_len micro_batch_size num_epochs "
                          "sample_packing adapter dataset_prepared_path val_set_size lr_scheduler")


def _detect(cfg: _Config) -> str:
    keys = set(cfg.data)
    if "peft_type" in keys:  # every PeftConfig's save_pretrained writes it
        return "peft"
    found = {
        "axolotl": keys & _AXOLOTL_MARKERS,
        "trl-sft": keys & _SFT_MARKERS,
        "trainer": keys & (_TRAINER_FIELDS | _LEGACY_TRAINER_FIELDS | {"model_name_or_path"}),
        "autotune": keys & _AUTOTUNE_MARKERS,
    }
    fmt = next((f for f in ("axolotl", "trl-sft", "trainer") if found[f]), "autotune")
    mixed = found["autotune"] - {"batch_size"} if fmt == "axolotl" else found["autotune"]  # Axolotl's global
    if fmt != "autotune" and mixed:
        raise InvalidInput(
            f"training config {cfg.file!r} mixes autotune keys ({', '.join(sorted(mixed))}) "
            f"with {fmt} keys ({', '.join(sorted(found[fmt])[:3])}): write one format"
        )
    return fmt


# ---------------------------------------------------------------------------------------------
# Values shared by the formats


def _optimizer(cfg: _Config, key: str) -> str | None:
    name = cfg.text(key)
    if name is not None and name.lower() not in OPTIMIZERS:
        raise cfg.unmodelled(key, name, f"autotune models the optimizers {', '.join(OPTIMIZERS)}")
    return None if name is None else name.lower()


def _attention(cfg: _Config, key: str, value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise cfg.bad(key, value, "a string")
    attn = _ATTN_ALIASES.get(value, value)
    if attn not in ATTENTIONS:
        raise cfg.unmodelled(key, value, f"autotune models the attentions {', '.join(ATTENTIONS)}")
    return attn


def _dtype(cfg: _Config, key: str, value: Any) -> str | None:
    if value is None:
        return None
    name = value.removeprefix("torch.") if isinstance(value, str) else None
    name = _DTYPE_ALIASES.get(name, name) if name is not None else None
    if name not in DTYPES:
        raise cfg.bad(key, value, f"one of {', '.join(DTYPES)}")
    return name


def _checkpoint_kwargs(cfg: _Config, key: str, refuse_unset_reentrant: str | None = None) -> None:
    """Refuse checkpointing arguments that change what is saved; ``use_reentrant=False`` is modelled."""
    kwargs = cfg.get(key)
    if isinstance(kwargs, str) and kwargs.strip().startswith("{"):
        try:  # TrainingArguments takes a JSON string for a dict field
            kwargs = json.loads(kwargs)
        except json.JSONDecodeError as exc:
            raise cfg.bad(key, kwargs, "a mapping") from exc
    if kwargs is None:
        kwargs = {}
    if not isinstance(kwargs, dict):
        raise cfg.bad(key, kwargs, "a mapping")
    if "use_reentrant" not in kwargs and refuse_unset_reentrant:
        raise cfg.unmodelled("gradient_checkpointing", True, refuse_unset_reentrant)
    for name, value in kwargs.items():
        if name == "use_reentrant" and value is True:
            raise cfg.unmodelled(f"{key}.use_reentrant", value, REENTRANT)
        if name == "every_n_layers" and value != 1:
            raise cfg.unmodelled(f"{key}.every_n_layers", value, "autotune models every layer checkpointed")
        if name == "offload" and value:
            raise cfg.unmodelled(f"{key}.offload", value, OFFLOAD)
        if name not in ("use_reentrant", "every_n_layers", "offload", "preserve_rng_state",
                        "determinism_check", "debug"):
            raise cfg.unmodelled(f"{key}.{name}", value, "checkpointing arguments other than "
                                 "use_reentrant: false are not modelled")


def _note_neftune(cfg: _Config, key: str) -> None:
    # NEFTune adds uniform noise to the embedding output in the forward (transformers
    # trainer_utils.neftune_post_forward_hook): one transient [batch, seq, hidden] tensor, freed
    # before the step's peak at the start of the backward; nothing is saved for the backward.
    if not _unset(cfg.get(key)):
        cfg.notes.append(f"{key}: noise added to the embedding output: one transient "
                         "[batch, seq, hidden] tensor in the forward, far below the step's peak")


# ---------------------------------------------------------------------------------------------
# Adapters (LoRA / QLoRA), shared by the formats

# What a regular expression has and a module name never does.
_REGEX_CHARS = frozenset("*+?[](){}|^$\\")
# BitsAndBytesConfig keys with no effect on a 4-bit base's memory: the storage dtype only changes
# the dtype its packed bytes are viewed as (bitsandbytes Params4bit), llm_int8_* are 8-bit settings.
_BNB_NO_EFFECT = frozenset({"quant_method", "load_in_4bit", "load_in_8bit", "bnb_4bit_quant_storage",
                            "llm_int8_threshold", "llm_int8_has_fp16_weight",
                            "llm_int8_enable_fp32_cpu_offload"})


def _int8(cfg: _Config, key: str, value: Any) -> UnmodelledSetting:
    """The refusal of an 8-bit base, for the reason the request's is refused (request.INT8_REASON)."""
    return cfg.unmodelled(key, value, f"an {INT8_BASE}: {INT8_REASON}; use load_in_4bit (QLoRA) or a "
                          "16-bit base")


def _lora_number(cfg: _Config, key: str, value: Any, *, rank: bool = False, dropout: bool = False) -> Any:
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


def _target_names(cfg: _Config, key: str, value: Any) -> tuple[str, ...] | None:
    """Target modules as PEFT's LoraConfig takes them: None (PEFT's default for the architecture),
    all-linear (a string), or a list of names PEFT matches literally against the last parts of a
    module's name (tuners_utils.py check_target_module_exists); a string is a regular expression."""
    if value is None:
        return None
    if isinstance(value, str):
        if value.lower() == ALL_LINEAR:
            return (ALL_LINEAR,)
        raise cfg.unmodelled(key, value, REGEX_TARGETS)
    if not isinstance(value, list) or not all(isinstance(name, str) and name for name in value):
        raise cfg.bad(key, value, "a list of module names")
    for name in value:
        if name.lower() == ALL_LINEAR:
            raise InvalidInput(f"{key} in {cfg.file!r} lists {name!r}: PEFT reads {ALL_LINEAR} as every "
                               "linear layer only as a string, in a list it is a module's name: write "
                               f"{key}: {ALL_LINEAR}")
        if _REGEX_CHARS & set(name):
            raise cfg.unmodelled(key, value, f"{name!r} is a regular expression, but PEFT matches the names "
                                 "of a list literally (the last parts of a module's name): list module names")
    return tuple(dict.fromkeys(value))


def _compute_dtype(cfg: _Config, key: str, value: Any) -> str:
    name = _dtype(cfg, key, value)
    if name not in COMPUTE_DTYPES:
        raise cfg.bad(key, value, f"one of {', '.join(COMPUTE_DTYPES)}")
    return name


def _bnb_4bit(cfg: _Config, key: str, settings: dict[str, Any], quant_type: str, double_quant: bool,
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
            compute = _compute_dtype(cfg, where, value)
        elif name == "load_in_8bit" and value:
            raise _int8(cfg, where, value)
        elif name == "load_in_4bit" and value is not True:
            raise cfg.bad(where, value, "true (a 4-bit base)")
        elif name == "llm_int8_enable_fp32_cpu_offload" and value:
            raise cfg.unmodelled(where, value, OFFLOAD)
        elif name not in _BNB_NO_EFFECT:
            # llm_int8_skip_modules among them: autotune quantizes the layers transformers does by default
            raise cfg.unmodelled(where, value, "a bitsandbytes setting autotune does not model (it models "
                                 "the layers transformers quantizes by default, in nf4 or fp4)")
    return quant_type, double_quant, compute


def _make_adapter(cfg: _Config, method: str, **fields: Any) -> Adapter:
    try:
        return make_adapter(method, **fields)
    except InvalidInput as exc:
        raise InvalidInput(f"{exc} (in {cfg.file!r})") from exc


def _note_adapter(cfg: _Config, source: str, adapter: Adapter, at: int | None = None) -> None:
    """The adapter's note, at ``at`` (before the notes on its keys), else last."""
    parts = [adapter.label()]
    if adapter.quantized:
        parts.append(f"4-bit layers computing in {adapter.compute_dtype}" if adapter.compute_dtype
                     else "4-bit layers computing in bfloat16 (float16 on a card without bfloat16)")
    if adapter.modules_to_save:
        parts.append(f"{', '.join(adapter.modules_to_save)} trained whole (modules_to_save)")
    if adapter.bias != "none":
        parts.append(f"biases trained (bias {adapter.bias})")
    note = f"{source}: {', '.join(parts)}; the base weights frozen, only the adapters trained"
    cfg.notes.insert(len(cfg.notes) if at is None else at, note)


# ---------------------------------------------------------------------------------------------
# Hugging Face TrainingArguments and TRL SFTConfig

# Every field of transformers.TrainingArguments (5.x), by what it does to a training step's memory.
# The test checks that these cover the installed transformers' dataclass fields.
_TRAINER_MODELLED = _words(
    "per_device_train_batch_size gradient_accumulation_steps optim bf16 fp16 gradient_checkpointing "
    "gradient_checkpointing_kwargs activation_checkpointing activation_checkpointing_kwargs "
    "neftune_noise_alpha auto_find_batch_size")
_TRAINER_REFUSED = {
    "deepspeed": SHARDING,
    "fsdp": SHARDING,
    "parallelism_config": PARALLEL,
    "torch_compile": COMPILE,
    "torch_compile_backend": COMPILE,  # setting either turns torch_compile on (TrainingArguments)
    "torch_compile_mode": COMPILE,
    "use_liger_kernel": LIGER,
    "use_cpu": "training on the CPU: autotune models a GPU",
    # The Trainer's LabelSmoother takes a log_softmax over the full logits beside the model's loss.
    "label_smoothing_factor": "the label smoother's extra log_softmax over the full logits",
    "use_cache": "a KV cache kept through the training forward",
    "optim_args": "optimizer arguments are not modelled; autotune models each optimizer's defaults",
    "optim_target_modules": "GaLore/APOLLO projections are not modelled",
}
_TRAINER_NO_EFFECT = _words(
    # fsdp_config is filled with defaults in every dump; only ``fsdp`` turns FSDP on.
    "fsdp_config liger_kernel_config accelerator_config tf32 bf16_full_eval fp16_full_eval "
    "per_device_eval_batch_size eval_accumulation_steps torch_empty_cache_steps max_grad_norm "
    "output_dir do_train do_eval do_predict eval_strategy eval_steps eval_delay eval_on_start "
    "eval_do_concat_batches eval_use_gather_object batch_eval_metrics prediction_loss_only "
    "include_for_metrics include_num_input_tokens_seen learning_rate weight_decay adam_beta1 adam_beta2 "
    "adam_epsilon num_train_epochs max_steps lr_scheduler_type lr_scheduler_kwargs warmup_steps "
    "average_tokens_across_devices log_level log_level_replica log_on_each_node logging_strategy "
    "logging_steps logging_first_step logging_nan_inf_filter save_strategy save_steps save_total_limit "
    "save_on_each_node save_only_model enable_jit_checkpoint restore_callback_states_from_checkpoint "
    "resume_from_checkpoint ignore_data_skip load_best_model_at_end metric_for_best_model "
    "greater_is_better push_to_hub hub_token hub_model_id hub_strategy hub_private_repo hub_always_push "
    "hub_revision report_to run_name project trackio_space_id trackio_bucket_id trackio_static_space_id "
    "seed data_seed full_determinism debug disable_tqdm skip_memory_metrics local_rank ddp_backend "
    "ddp_timeout ddp_find_unused_parameters ddp_bucket_cap_mb ddp_broadcast_buffers ddp_static_graph "
    "dataloader_drop_last dataloader_num_workers dataloader_pin_memory dataloader_persistent_workers "
    "dataloader_prefetch_factor dataloader_in_order dataloader_multiprocessing_context "
    "remove_unused_columns label_names length_column_name train_sampling_strategy")
_TRAINER_FIELDS = _TRAINER_MODELLED | set(_TRAINER_REFUSED) | _TRAINER_NO_EFFECT
# Fields of transformers 4.x TrainingArguments (and Seq2SeqTrainingArguments) that 5.x dropped.
_LEGACY_TRAINER_FIELDS = _words(
    "overwrite_output_dir evaluation_strategy logging_dir save_safetensors use_mps_device fp16_opt_level "
    "tpu_num_cores tpu_metrics_debug jit_mode_eval use_ipex past_index ray_scope group_by_length "
    "fsdp_min_num_params fsdp_transformer_layer_cls_to_wrap push_to_hub_model_id warmup_ratio "
    "push_to_hub_organization push_to_hub_token mp_parameters use_legacy_prediction_loop dispatch_batches "
    "split_batches include_tokens_per_second include_inputs_for_metrics per_gpu_eval_batch_size "
    "gradient_checkpointing_use_reentrant sortish_sampler predict_with_generate generation_max_length "
    "generation_num_beams generation_config save_only_model use_auth_token no_cuda half_precision_backend "
    "fp16_backend sharded_ddp torchdynamo adafactor")
_LEGACY_REFUSED = {
    "no_cuda": "training on the CPU: autotune models a GPU",
    "sharded_ddp": SHARDING,
    "torchdynamo": COMPILE,
    "gradient_checkpointing_use_reentrant": REENTRANT,  # TRL's old ScriptArguments
}
# The model and data arguments of transformers' example scripts (run_clm.py, run_glue.py, ...).
_SCRIPT_KEYS = _words(
    "model_name_or_path config_name tokenizer_name cache_dir use_fast_tokenizer model_revision token "
    "trust_remote_code low_cpu_mem_usage ignore_mismatched_sizes model_type dataset_name "
    "dataset_config_name train_file validation_file test_file max_train_samples max_eval_samples "
    "max_predict_samples streaming overwrite_cache validation_split_percentage preprocessing_num_workers "
    "keep_linebreaks pad_to_max_length task_name text_column_name label_column_name line_by_line "
    "mlm_probability torch_dtype dtype attn_implementation max_seq_length max_length block_size")
_SCRIPT_REFUSED = {"config_overrides": "a model config changed from the named model's"}

# TRL: the SFTConfig fields beyond TrainingArguments (trl/trainer/sft_config.py, TRL 1.9), older
# ones (max_seq_length, dataset_batch_size, ...), and the ``trl sft`` CLI's ScriptArguments and
# ModelConfig (trl/scripts/utils.py, trl/trainer/model_config.py).
_SFT_FIELDS = _words(
    "model_init_kwargs router_aux_loss_coef chat_template_path dataset_text_field dataset_kwargs "
    "dataset_num_proc eos_token max_length truncation_mode shuffle_dataset packing packing_strategy "
    "padding_free pad_to_multiple_of eval_packing completion_only_loss assistant_only_loss loss_type "
    "activation_offloading pad_token max_seq_length dataset_batch_size num_of_sequences chars_per_token "
    "use_liger dataset_train_split dataset_test_split dataset_streaming dataset_config ignore_bias_buffers "
    "datasets use_peft bnb_4bit_quant_type use_bnb_nested_quant bnb_4bit_quant_storage")
_SFT_MARKERS = _SFT_FIELDS - _words("max_length max_seq_length datasets")
_SFT_REFUSED = {
    "activation_offloading": OFFLOAD,
    "use_liger": LIGER,  # TRL < 0.13's name of use_liger_kernel
}
# The ``trl sft`` CLI's ModelConfig keys of an adapter (trl/trainer/model_config.py), and peft_config.
_TRL_PEFT_KEYS = _words(
    "use_peft peft_config lora_r lora_alpha lora_dropout lora_target_modules lora_target_parameters "
    "lora_modules_to_save lora_task_type use_rslora use_dora load_in_4bit load_in_8bit bnb_4bit_quant_type "
    "use_bnb_nested_quant bnb_4bit_quant_storage")
# Keys of from_pretrained's keyword arguments (model_init_kwargs) with no effect on memory.
_INIT_NO_EFFECT = _words("trust_remote_code revision cache_dir token local_files_only subfolder "
                         "low_cpu_mem_usage device_map use_cache force_download")
_INIT_REFUSED = {"load_in_4bit": "transformers 5's from_pretrained has no load_in_4bit argument: a 4-bit "
                                 "base is quantization_config: {load_in_4bit: true}",
                 "load_in_8bit": QUANT,  # refused with the 8-bit base's reason (_int8)
                 "max_memory": OFFLOAD, "offload_folder": OFFLOAD}
# TRL's chunked_nll loss (trl/trainer/sft_trainer.py _chunked_cross_entropy_loss): 256-token chunks
# of logits, each recomputed in its backward; the default loss_type since TRL 1.7.
_SFT_LOSSES = {"chunked_nll": "chunked", "nll": None}


def _read_trainer(cfg: _Config, fmt: str) -> TrainingPlan:
    sft = fmt == "trl-sft"
    cfg.refuse(_TRAINER_REFUSED | _LEGACY_REFUSED | _SCRIPT_REFUSED | _SFT_REFUSED)
    if cfg.get("half_precision_backend") == "apex" or cfg.get("fp16_backend") == "apex":
        raise cfg.unmodelled("half_precision_backend", "apex", "NVIDIA apex AMP is not modelled; "
                             "autotune models torch.autocast")
    fp16 = cfg.flag("fp16")
    # TRL's _BaseConfig: bf16 defaults to true when fp16 is not set, checkpointing to true.
    bf16 = cfg.flag("bf16", default=sft and not fp16)
    if fp16 and bf16:
        raise InvalidInput(f"fp16 and bf16 in {cfg.file!r} are both true: choose one")
    if sft and cfg.data.get("bf16") is None and bf16:
        cfg.notes.append("bf16: not set, TRL's default true (fp16 not set)")
    ckpt = _trainer_checkpointing(cfg, default=sft)
    dtype, attn, init_quant = _model_init(cfg, sft)
    adapter = _trainer_adapter(cfg, dtype, init_quant)
    seq_len = _trainer_seq_len(cfg, sft)
    loss = None
    if sft:
        loss = _sft_loss(cfg)
        _packing(cfg, attn)
        seq_len = _pad_to_multiple(cfg, seq_len)
    batch = cfg.positive("per_device_train_batch_size", "batch size")
    if batch is None and fmt == "trainer" and cfg.data:
        batch = 8  # TrainingArguments' default per_device_train_batch_size
        cfg.notes.append("per_device_train_batch_size: not set, the Trainer's default 8")
    optimizer = _optimizer(cfg, "optim")
    if optimizer is None and cfg.flag("adafactor"):  # transformers 4.x's flag for optim adafactor
        optimizer = "adafactor"
    if cfg.flag("auto_find_batch_size"):
        cfg.notes.append("auto_find_batch_size: the Trainer halves the batch after an out-of-memory "
                         "error; autotune checks the batch as written")
    _note_neftune(cfg, "neftune_noise_alpha")
    model = cfg.text("model_name_or_path")
    task = "causal-lm" if sft else _glue_task(cfg)
    return TrainingPlan(
        format=fmt, model=model, seq_len=seq_len, batch_size=batch,
        mode=Mode("bf16" if bf16 else "amp" if fp16 else "fp32", ckpt),
        accumulation_steps=cfg.positive("gradient_accumulation_steps", "accumulation steps") or 1,
        task=task, dtype=dtype, optimizer=optimizer, attn=attn, loss=loss, adapter=adapter,
        notes=tuple(cfg.notes),
        # lora_* keys are TRL's only with use_peft; with an adapter, one TRL does not know is listed.
        ignored=cfg.ignored(
            _TRAINER_FIELDS | _LEGACY_TRAINER_FIELDS | _SCRIPT_KEYS | _SFT_FIELDS | _TRL_PEFT_KEYS,
            ("eval_", "hub_", "logging_", "save_", "generation_") + (() if adapter else ("lora_",))),
    )


# run_glue.py's task_name: every GLUE task trains a sequence classification head.
_GLUE_TASKS = _words("cola mnli mrpc qnli qqp rte sst2 stsb wnli")


def _glue_task(cfg: _Config) -> str | None:
    name = cfg.get("task_name")
    if isinstance(name, str) and name.lower() in _GLUE_TASKS:
        cfg.notes.append(f"task_name: {name}: a GLUE task (run_glue.py), sequence-classification")
        return "sequence-classification"
    return None


def _trainer_adapter(cfg: _Config, dtype: str | None, init_quant: Any) -> Adapter | None:
    """The adapter as TRL builds it: ``use_peft`` with ModelConfig's lora_* keys (trl/scripts/sft.py:
    ``get_peft_config`` and ``get_quantization_config`` in trl/trainer/utils.py), or a LoraConfig
    written out as ``peft_config``; over a 4-bit base with ``load_in_4bit`` or a bitsandbytes
    ``model_init_kwargs.quantization_config``."""
    use_peft = cfg.get("use_peft")
    if use_peft is not None and not isinstance(use_peft, bool):
        raise cfg.bad("use_peft", use_peft, "true or false")
    peft_config = cfg.get("peft_config")
    if not _unset(cfg.get("quantization_config")):  # not a ModelConfig key: a script's own
        raise cfg.unmodelled("quantization_config", cfg.data["quantization_config"], QUANT)
    if not _unset(cfg.get("load_in_8bit")):
        raise _int8(cfg, "load_in_8bit", cfg.data["load_in_8bit"])
    load_in_4bit = cfg.flag("load_in_4bit")
    if load_in_4bit and init_quant is not None:
        raise InvalidInput(f"load_in_4bit and model_init_kwargs.quantization_config in {cfg.file!r} both set "
                           "the quantization: SFTTrainer refuses both, give one")
    quantized = load_in_4bit or init_quant is not None
    lora_keys = [k for k in cfg.data if k.startswith("lora_") and cfg.data[k] is not None]
    trained = use_peft or (use_peft is None and not _unset(peft_config))
    if not trained:
        if use_peft is False and not _unset(peft_config):
            raise InvalidInput(f"use_peft: false and peft_config in {cfg.file!r} contradict: give one")
        flags = [k for k in ("use_dora", "use_rslora") if cfg.flag(k)]
        if use_peft is None and (lora_keys or flags):
            # TRL builds an adapter only with use_peft; a script of one's own may read lora_* alone.
            key = (lora_keys + flags)[0]
            raise cfg.unmodelled(key, cfg.data[key], "TRL trains an adapter only with use_peft: true "
                                 "(get_peft_config); write use_peft: true for LoRA, or use_peft: false for "
                                 "a full fine-tune")
        if quantized:
            key = "load_in_4bit" if load_in_4bit else "model_init_kwargs.quantization_config"
            raise InvalidInput(f"{key} in {cfg.file!r} loads a 4-bit base without adapters: the Trainer "
                               "refuses to fine-tune a purely quantized model (transformers "
                               "trainer_utils.py); add use_peft: true")
        return None
    if cfg.flag("use_dora"):
        raise cfg.unmodelled("use_dora", True, DORA)
    method = "qlora" if quantized else "lora"
    at = len(cfg.notes)
    if not _unset(peft_config):
        if use_peft or lora_keys:
            named = ["use_peft"] * bool(use_peft) + lora_keys
            raise InvalidInput(f"peft_config and {', '.join(named)} in {cfg.file!r} both describe the "
                               "adapter: give one")
        if not isinstance(peft_config, dict):
            raise cfg.bad("peft_config", peft_config, "a mapping (a LoraConfig's fields)")
        adapter = adapter_from_peft_dict(peft_config, source=f"peft_config in {cfg.file!r}",
                                         quantized=quantized)
        source = "peft_config"
    else:
        adapter = _trl_lora(cfg, method)
        source = "use_peft: true"
    if quantized:
        adapter = _trl_quantization(cfg, adapter, dtype, init_quant)
    _note_adapter(cfg, source, adapter, at)
    if cfg.flag("use_rslora") or (isinstance(peft_config, dict) and peft_config.get("use_rslora")):
        cfg.notes.append("use_rslora: the adapters scaled by alpha/sqrt(r): no effect on memory")
    template = cfg.get("chat_template_path")
    if template is not None and not str(template).endswith((".jinja", ".j2")):
        raise cfg.unmodelled("chat_template_path", template, "with an adapter, SFTTrainer makes lm_head "
                             "(modules_to_save) and the embeddings of the tokens a cloned chat template adds "
                             "trainable (clone_chat_template), which autotune does not model; give a .jinja "
                             "file")
    return adapter


def _trl_lora(cfg: _Config, method: str) -> Adapter:
    """ModelConfig's LoRA keys, with TRL's defaults (trl/trainer/model_config.py)."""
    if not _unset(cfg.get("lora_target_parameters")):
        raise cfg.unmodelled("lora_target_parameters", cfg.data["lora_target_parameters"],
                             "LoRA on parameters (target_parameters) rather than modules is not modelled")
    task_type = cfg.get("lora_task_type")
    if task_type not in (None, "CAUSAL_LM"):
        raise cfg.unmodelled("lora_task_type", task_type, "SFT trains a causal LM; autotune models its "
                             "adapter with task type CAUSAL_LM")
    defaults: dict[str, float] = {}
    values: dict[str, Any] = {}
    for key, field, default in (("lora_r", "r", 16), ("lora_alpha", "alpha", 32),
                                ("lora_dropout", "dropout", 0.05)):
        value = cfg.get(key)
        if value is None:
            value = defaults[key] = default
        values[field] = _lora_number(cfg, key, value, rank=key == "lora_r", dropout=key == "lora_dropout")
    if defaults:
        cfg.notes.append(f"{', '.join(defaults)}: not set, TRL's default{'s' * (len(defaults) > 1)} "
                         f"{', '.join(f'{v:g}' for v in defaults.values())}")
    modules = cfg.get("lora_target_modules")
    if isinstance(modules, list) and len(modules) == 1 and isinstance(modules[0], str):
        modules = modules[0]  # ModelConfig.__post_init__: a one-entry list becomes its string
        if modules.lower() != ALL_LINEAR:
            raise cfg.unmodelled(
                "lora_target_modules", cfg.data["lora_target_modules"],
                f"TRL's ModelConfig turns a one-entry list into the string {modules!r}, which PEFT matches "
                "as a regular expression against whole module names (model.layers.0.self_attn.q_proj): a "
                "plain name matches none, a pattern autotune does not model; list two or more module names, "
                f"or write {ALL_LINEAR}")
    targets = _target_names(cfg, "lora_target_modules", modules)
    if targets == ():
        raise InvalidInput(f"lora_target_modules in {cfg.file!r} is empty: PEFT refuses an adapter on no "
                           "module; name modules, write all-linear, or leave it out for PEFT's default")
    to_save = cfg.get("lora_modules_to_save") or []
    if not isinstance(to_save, list) or not all(isinstance(m, str) for m in to_save):
        raise cfg.bad("lora_modules_to_save", to_save, "a list of module names")
    return _make_adapter(cfg, method, targets=targets, modules_to_save=to_save, **values)


def _trl_quantization(cfg: _Config, adapter: Adapter, dtype: str | None, init_quant: Any) -> Adapter:
    if init_quant is not None:
        # transformers' BitsAndBytesConfig defaults: fp4, no double quantization, float32 compute.
        quant_type, double_quant, compute = _bnb_4bit(
            cfg, "model_init_kwargs.quantization_config", init_quant, "fp4", False, "float32")
    else:
        # get_quantization_config: ModelConfig's bnb_4bit_quant_type (nf4), use_bnb_nested_quant
        # (false) and bnb_4bit_compute_dtype=model_args.dtype, the weights' dtype.
        if dtype == "auto":
            raise InvalidInput(f"dtype auto with load_in_4bit in {cfg.file!r}: TRL passes the dtype as "
                               "bnb_4bit_compute_dtype, which BitsAndBytesConfig cannot resolve from 'auto'; "
                               "write bfloat16, float16 or float32")
        quant_type = cfg.text("bnb_4bit_quant_type") or "nf4"
        if quant_type not in QUANT_TYPES:
            raise cfg.bad("bnb_4bit_quant_type", quant_type, f"one of {', '.join(QUANT_TYPES)}")
        double_quant, compute = cfg.flag("use_bnb_nested_quant"), dtype
        cfg.get("bnb_4bit_quant_storage")  # the dtype the packed bytes are viewed as: no effect on memory
    return replace(adapter, quant_type=quant_type, double_quant=double_quant, compute_dtype=compute)


def _trainer_checkpointing(cfg: _Config, default: bool) -> bool:
    # transformers 5: activation_checkpointing*, with gradient_checkpointing* as deprecated aliases
    # used only when the new name is not set (TrainingArguments.__post_init__).
    new, old = cfg.get("activation_checkpointing"), cfg.get("gradient_checkpointing")
    key = "activation_checkpointing" if new is not None else "gradient_checkpointing"
    ckpt = cfg.flag(key, default=default)
    if default and new is None and old is None:
        cfg.notes.append("gradient_checkpointing: not set, TRL's default true")
    if ckpt:
        kwargs_key = ("activation_checkpointing_kwargs" if cfg.get("activation_checkpointing_kwargs")
                      is not None else "gradient_checkpointing_kwargs")
        _checkpoint_kwargs(cfg, kwargs_key)
    return ckpt


def _model_init(cfg: _Config, sft: bool) -> tuple[str | None, str | None, dict[str, Any] | None]:
    """Weights dtype and attention from model_init_kwargs or the script's model arguments, and a
    bitsandbytes 4-bit ``model_init_kwargs.quantization_config`` (for an adapter to go over)."""
    kwargs = cfg.get("model_init_kwargs")
    if isinstance(kwargs, str) and kwargs.strip().startswith("{"):
        try:  # TrainingArguments takes a JSON string for a dict field
            kwargs = json.loads(kwargs)
        except json.JSONDecodeError as exc:
            raise cfg.bad("model_init_kwargs", kwargs, "a mapping") from exc
    kwargs = kwargs or {}
    if not isinstance(kwargs, dict):
        raise cfg.bad("model_init_kwargs", kwargs, "a mapping")
    for key, why in _INIT_REFUSED.items():
        if not _unset(kwargs.get(key)):
            if key == "load_in_8bit":
                raise _int8(cfg, f"model_init_kwargs.{key}", kwargs[key])
            raise cfg.unmodelled(f"model_init_kwargs.{key}", kwargs[key], why)
    quant = kwargs.get("quantization_config")
    if not _unset(quant):
        key = "model_init_kwargs.quantization_config"
        if not isinstance(quant, dict) or quant.get("quant_method", "bitsandbytes") != "bitsandbytes":
            raise cfg.unmodelled(key, quant, QUANT)
        if quant.get("load_in_8bit"):
            raise _int8(cfg, key, quant)
        if quant.get("load_in_4bit") is not True:
            raise cfg.unmodelled(key, quant, QUANT)
    else:
        quant = None
    known = _INIT_NO_EFFECT | {"dtype", "torch_dtype", "attn_implementation", "quantization_config"}
    cfg.nested_ignored.extend(f"model_init_kwargs.{k}" for k in kwargs if k not in known)
    dtype = attn = None
    for where, values in (("model_init_kwargs.", kwargs), ("", cfg.data)):
        for key in ("dtype", "torch_dtype"):
            if values.get(key) is not None and dtype is None:
                dtype = _dtype(cfg, where + key, values[key])
        if attn is None:
            attn = _attention(cfg, where + "attn_implementation", values.get("attn_implementation"))
    cfg.read.update(("dtype", "torch_dtype", "attn_implementation"))
    if sft and dtype is None:
        dtype = "float32"  # trl/trainer/utils.py create_model_from_path: kwargs.get("dtype", "float32")
        cfg.notes.append("dtype: not set, SFTTrainer loads the model in float32 (TRL's default)")
    return dtype, attn, quant


def _trainer_seq_len(cfg: _Config, sft: bool) -> int | None:
    for key in ("max_length", "max_seq_length", "block_size"):
        if cfg.data.get(key) is not None:
            return cfg.positive(key, "sequence length")
    if sft and "max_length" not in cfg.data:
        cfg.notes.append("max_length: not set, TRL's default 1024")
        return 1024
    return None


def _sft_loss(cfg: _Config) -> str | None:
    loss_type = cfg.text("loss_type")
    if loss_type is None:
        cfg.notes.append(f"loss_type: not set, TRL's default chunked_nll (TRL >= 1.7): {CHUNKED_NOTE}; "
                         "write loss_type: nll for an older TRL")
        return "chunked"
    if loss_type not in _SFT_LOSSES:
        raise cfg.unmodelled("loss_type", loss_type, "autotune models the losses nll and chunked_nll")
    if _SFT_LOSSES[loss_type]:
        cfg.notes.append(f"loss_type: chunked_nll: {CHUNKED_NOTE}")
    return _SFT_LOSSES[loss_type]


def _packing(cfg: _Config, attn: str | None) -> None:
    packing, padding_free = cfg.flag("packing"), cfg.flag("padding_free")
    strategy = cfg.text("packing_strategy") or "bfd"
    if strategy not in ("bfd", "bfd_split", "bfd-requeue", "wrapped"):
        raise cfg.bad("packing_strategy", strategy, "one of bfd, bfd_split, wrapped")
    # SFTTrainer: bfd packing turns padding-free on, whatever padding_free says.
    implied = packing and strategy != "wrapped"
    if packing:
        cfg.notes.append(f"packing: {PACKED_NOTE}")
    if padding_free or implied:
        key = "padding_free" if padding_free else "packing"
        if attn != "flash_attention_2":
            # Flattened into one row of batch x seq tokens: only flash-attn's varlen kernel keeps
            # that linear; sdpa and eager attend over the whole row (a (batch x seq)^2 mask or scores).
            raise cfg.unmodelled(key, True, f"padding-free rows with attention {attn or 'sdpa (default)'}: "
                                 "only flash_attention_2 is modelled "
                                 "(set model_init_kwargs.attn_implementation)")
        cfg.notes.append(f"{key}: padding-free, the batch flattened into one row through flash_attention_2: "
                         "the same memory as full rows of seq_len")


def _pad_to_multiple(cfg: _Config, seq_len: int | None) -> int | None:
    multiple = cfg.positive("pad_to_multiple_of")
    if multiple is None or seq_len is None or seq_len % multiple == 0:
        return seq_len
    padded = -(-seq_len // multiple) * multiple
    cfg.notes.append(f"pad_to_multiple_of: {multiple}: rows padded to {padded} tokens")
    return padded


# ---------------------------------------------------------------------------------------------
# Axolotl (src/axolotl/utils/schemas/config.py; normalize_config in utils/config/__init__.py)

_AXOLOTL_REFUSED = {
    "gptq": QUANT, "quantization": QUANT,
    "qat": "quantization-aware training is not modelled", "fp8": "fp8 training is not modelled",
    "deepspeed": SHARDING, "fsdp": SHARDING, "fsdp_config": SHARDING,
    "torch_compile": COMPILE,
    "activation_offloading": OFFLOAD, "layer_offloading": OFFLOAD, "gpu_memory_limit": OFFLOAD,
    "max_memory": OFFLOAD,
    "unfrozen_parameters": "training only some parameters is not modelled: autotune trains them all",
    "rl": "RL trainers (DPO, KTO, GRPO, ...) are not modelled: autotune models supervised fine-tuning",
    "reward_model": "reward model training is not modelled", "process_reward_model": "not modelled",
    "xformers_attention": KERNEL, "flex_attention": KERNEL, "sage_attention": KERNEL,
    "s2_attention": KERNEL, "flash_attn_cross_entropy": KERNEL, "flash_attn_fuse_mlp": KERNEL,
    "flash_attn_rms_norm": KERNEL, "flash_optimum": KERNEL, "tiled_mlp": KERNEL,
    # utils/chunked_cross_entropy: chunks the loss over logits that are still materialized.
    "chunked_cross_entropy": "a cross-entropy chunked over materialized logits is not modelled",
    "relora": RELORA,
    # utils/fp32_norms.py: norms kept in float32, whose outputs then are float32 too.
    "fp32_norms": "norms kept in float32 (float32 norm outputs into the next layer) are not modelled",
}
# Parallel degrees: 1 (or null) is one GPU holding the model.
_AXOLOTL_PARALLEL = ("tensor_parallel_size", "context_parallel_size", "sequence_parallel_degree",
                     "dp_shard_size")
_AXOLOTL_NO_EFFECT = _words(
    "datasets test_datasets pretraining_dataset dataset_prepared_path val_set_size output_dir chat_template "
    "num_epochs max_steps learning_rate lr_scheduler cosine_min_lr_ratio weight_decay max_grad_norm "
    "adam_beta1 adam_beta2 adam_epsilon tf32 eval_batch_size evals_per_epoch "
    "saves_per_epoch logging_steps resume_from_checkpoint auto_resume_from_checkpoints "
    "local_rank seed strict train_on_inputs group_by_length special_tokens tokens added_tokens_overrides "
    "tokenizer_type model_type trust_remote_code shuffle_merged_datasets debug plugins pad_to_sequence_len "
    "eval_sample_packing sample_packing_eval_drop_last bf16 fp16 float16 bfloat16 device_map "
    "embeddings_skip_upcast resize_token_embeddings_to_32x default_system_message eot_tokens train_on_eos "
    "roles_to_train use_tensorboard gc_steps batch_size base_model_config excess_length_strategy "
    "pretrain_multipack_attn streaming sequence_len_overflow_handling remove_unused_columns "
    "include_tokens_per_second profiler_steps ddp ddp_timeout ddp_bucket_cap_mb ddp_broadcast_buffers "
    "ddp_find_unused_parameters torch_compile_backend torch_compile_mode fsdp_version skip_prepare_dataset "
    "dataset_exact_deduplication embedding_lr embedding_lr_scale lr_groups gradient_checkpointing_kwargs "
    "low_cpu_mem_usage hf_use_auth_token")
# Families of keys with no effect: logging and tracking, data, schedules, and adapter settings
# (lora_*, peft_*: without an adapter Axolotl does not read them; with one, those not read are listed).
_AXOLOTL_PREFIXES = ("wandb_", "mlflow_", "comet_", "swanlab_", "trackio_", "hub_", "eval_", "save_",
                     "logging_", "lr_", "warmup_", "dataset_", "loss_watchdog", "lora_", "peft_", "loraplus_",
                     "relora_", "dataloader_", "chat_template", "tokenizer_", "is_", "early_stopping",
                     "profiler_")


# Axolotl's adapter settings that change the step in ways autotune does not model (schemas/peft.py;
# loaders/adapter.py _build_peft_lora_config and load_lora).
_AXOLOTL_LORA_REFUSED = {
    "lora_target_parameters": "LoRA on parameters (target_parameters) rather than modules is not modelled",
    "lora_rank_pattern": "per-module ranks are not modelled",
    "lora_exclude_modules": "modules excluded from the LoRA targets are not modelled",
    "peft_layers_to_transform": "adapters on some layers only are not modelled",
    "peft_layers_pattern": "adapters on some layers only are not modelled",
    "peft_use_dora": DORA,
    "peft_layer_replication": "layer replication (base layers shared between adapters) is not modelled",
    "peft_trainable_token_indices": "trainable token embeddings are not modelled",
    "lora_on_cpu": "lora_on_cpu moves the embedding modules to the CPU (loaders/model.py "
                   "_convert_embedding_modules_dtype), which is not modelled",
}
# Adapter settings with no effect on memory: the weights' layout and initialization, merging after
# training, loading, LoRA+'s per-group learning rates (the same optimizer states).
_AXOLOTL_ADAPTER_NO_EFFECT = _words(
    "lora_model_dir lora_fan_in_fan_out peft_init_lora_weights peft merge_lora merge_method "
    "qlora_sharded_model_loading loraplus_lr_ratio loraplus_lr_embedding lora_alpha_pattern peft_use_rslora "
    "peft_autocast_adapter_dtype peft_ensure_weight_tying")
# Axolotl's fused LoRA kernels, which check_auto_enable_lora_kernels (schemas/config.py) turns on for
# lora and qlora when none of them is set.
_AXOLOTL_LORA_KERNELS = ("lora_mlp_kernel", "lora_qkv_kernel", "lora_o_kernel", "lora_embedding_kernel")
LORA_KERNELS = ("Axolotl's fused LoRA kernels (custom autograd functions and Triton activation kernels, "
                "monkeypatch/lora_kernels.py) save other tensors for the backward than PEFT's LoRA layers, "
                "which autotune models")
# Embeddings and output heads (loaders/utils.py get_linear_embedding_layers, and GPT-2's): named
# beside lora_target_linear they put LoRA on more than every linear layer.
_AXOLOTL_EMBEDDINGS = frozenset({"embed_tokens", "lm_head", "embed_in", "embed_out", "word_embeddings",
                                 "embeddings", "wte", "wpe"})


def _axolotl_method(cfg: _Config) -> str | None:
    """lora, qlora or None from adapter, load_in_4bit and load_in_8bit (schemas/peft.py
    validate_adapter and validate_qlora; loaders/model.py _set_quantization_config)."""
    if not _unset(cfg.get("load_in_8bit")):
        raise _int8(cfg, "load_in_8bit", cfg.data["load_in_8bit"])
    load_in_4bit = cfg.flag("load_in_4bit")
    method = cfg.get("adapter")
    if _unset(method):
        if load_in_4bit:
            raise InvalidInput(f"load_in_4bit: true in {cfg.file!r} without an adapter: Axolotl refuses "
                               "4-bit loading for a full fine-tune (schemas/peft.py validate_adapter); add "
                               "adapter: qlora")
        return None
    if method not in ("lora", "qlora"):
        raise cfg.unmodelled("adapter", method, "autotune models the adapters lora and qlora")
    if method == "lora" and load_in_4bit:
        raise cfg.unmodelled("load_in_4bit", True, "with adapter: lora Axolotl loads no 4-bit base "
                             "(loaders/model.py _set_quantization_config quantizes for qlora only) but runs "
                             "prepare_model_for_kbit_training, which casts the linear weights to float32; "
                             "write adapter: qlora for QLoRA")
    if method == "qlora" and not load_in_4bit:
        if cfg.data.get("load_in_4bit") is False:
            raise InvalidInput(f"adapter: qlora with load_in_4bit: false in {cfg.file!r}: Axolotl requires "
                               "load_in_4bit: true for qlora (schemas/peft.py validate_qlora)")
        cfg.notes.append("adapter: qlora without load_in_4bit: read as a 4-bit base (Axolotl itself requires "
                         "load_in_4bit: true with qlora)")
    kernels = {key: cfg.get(key) for key in _AXOLOTL_LORA_KERNELS}
    for key, value in kernels.items():
        if value:
            raise cfg.unmodelled(key, value, LORA_KERNELS)
    if all(value is None for value in kernels.values()) and not cfg.data.get("trust_remote_code"):
        raise cfg.unmodelled("adapter", method, f"with none of {', '.join(_AXOLOTL_LORA_KERNELS)} set, "
                             "Axolotl turns them on (schemas/config.py check_auto_enable_lora_kernels): "
                             f"{LORA_KERNELS}; set them to false")
    return method


def _axolotl_adapter(cfg: _Config, method: str, dtype: str) -> Adapter:
    """The LoraConfig of loaders/adapter.py _build_peft_lora_config (bias none), or the adapter of
    lora_model_dir; a qlora base as _set_quantization_config loads it."""
    cfg.refuse(_AXOLOTL_LORA_REFUSED)
    at = len(cfg.notes)
    if cfg.get("peft_autocast_adapter_dtype") is False:
        raise cfg.unmodelled("peft_autocast_adapter_dtype", False, "LoRA weights kept in the base weights' "
                             "dtype, not PEFT's float32, are not modelled")
    to_save = cfg.get("lora_modules_to_save") or []
    if not isinstance(to_save, list) or not all(isinstance(m, str) for m in to_save):
        raise cfg.bad("lora_modules_to_save", to_save, "a list of module names")
    if cfg.get("peft_ensure_weight_tying") and to_save:
        raise cfg.unmodelled("peft_ensure_weight_tying", True,
                             "tied copies of modules_to_save are not modelled")
    model_dir = cfg.get("lora_model_dir")
    if not _unset(model_dir):
        adapter = _axolotl_saved_adapter(cfg, method, model_dir)
        source = "lora_model_dir"
    else:
        values = {}
        for key, field in (("lora_r", "r"), ("lora_alpha", "alpha")):
            value = cfg.get(key)
            if value is None:
                raise InvalidInput(f"adapter: {method} in {cfg.file!r} needs {key}: Axolotl has no default "
                                   f"(schemas/peft.py) and PEFT's LoraConfig fails on {field}=None")
            values[field] = _lora_number(cfg, key, value, rank=key == "lora_r")
        dropout = cfg.get("lora_dropout")
        if dropout is None:
            dropout = 0.0  # schemas/peft.py validate_lora_dropout
            cfg.notes.append("lora_dropout: not set, Axolotl's default 0.0")
        values["dropout"] = _lora_number(cfg, "lora_dropout", dropout, dropout=True)
        adapter = _make_adapter(cfg, method, targets=_axolotl_targets(cfg, method), modules_to_save=to_save,
                                **values)
        source = f"adapter: {method}"
    if method == "qlora":
        # _set_quantization_config: nf4, double quantization, compute in cfg.torch_dtype (the weights'
        # dtype), updated by bnb_config_kwargs.
        extra = cfg.get("bnb_config_kwargs") or {}
        if not isinstance(extra, dict):
            raise cfg.bad("bnb_config_kwargs", extra, "a mapping")
        quant_type, double_quant, compute = _bnb_4bit(cfg, "bnb_config_kwargs", extra, "nf4", True, dtype)
        # loaders/model.py: prepare_model_for_kbit_training, then norms and embeddings back to
        # torch_dtype (adapters.prepare, recipe "axolotl").
        adapter = replace(adapter, quant_type=quant_type, double_quant=double_quant, compute_dtype=compute,
                          recipe="axolotl")
    _note_adapter(cfg, source, adapter, at)
    if cfg.flag("peft_use_rslora"):
        cfg.notes.append("peft_use_rslora: the adapters scaled by alpha/sqrt(r): no effect on memory")
    if not _unset(cfg.get("lora_alpha_pattern")):
        cfg.notes.append("lora_alpha_pattern: per-module alphas scale the adapters' outputs: no effect on "
                         "memory")
    if not _unset(cfg.get("loraplus_lr_ratio")):
        cfg.notes.append("loraplus_lr_ratio: LoRA+ learning rates per parameter group, the same optimizer "
                         "states: no effect on memory")
    return adapter


def _axolotl_targets(cfg: _Config, method: str) -> tuple[str, ...]:
    modules = cfg.get("lora_target_modules")
    if cfg.flag("lora_target_linear"):
        # _build_peft_lora_config: lora_target_modules (as a list) with every linear module's name but
        # the output embedding's (find_all_linear_names): PEFT's all-linear, with what else is named.
        if isinstance(modules, str):
            modules = [] if modules.lower() == ALL_LINEAR else [modules]
        named = _target_names(cfg, "lora_target_modules", modules) or ()
        beyond = [name for name in named if name.split(".")[-1] in _AXOLOTL_EMBEDDINGS]
        if beyond:
            raise cfg.unmodelled("lora_target_modules", cfg.data["lora_target_modules"],
                                 f"{', '.join(beyond)} beside lora_target_linear: true puts LoRA on "
                                 "embeddings or the output head as well as on every linear layer, which "
                                 "autotune does not model")
        among = "; the layers lora_target_modules names are among them" if named else ""
        cfg.notes.append("lora_target_linear: true: LoRA on every linear layer but the output head (PEFT's "
                         f"all-linear){among}")
        return (ALL_LINEAR,)
    targets = _target_names(cfg, "lora_target_modules", modules)
    if not targets:
        raise InvalidInput(f"adapter: {method} in {cfg.file!r} names no LoRA target: set lora_target_modules "
                           "or lora_target_linear: true (Axolotl passes target_modules=[] to PEFT, which "
                           "refuses it)")
    return targets


def _axolotl_saved_adapter(cfg: _Config, method: str, model_dir: Any) -> Adapter:
    """lora_model_dir: load_lora trains on the saved adapter (PeftModel.from_pretrained), with the
    settings of its adapter_config.json rather than lora_*."""
    if not isinstance(model_dir, str):
        raise cfg.bad("lora_model_dir", model_dir, "a directory")
    for folder in (Path(model_dir).expanduser(), Path(cfg.file).parent / model_dir):
        if (folder / "adapter_config.json").is_file():
            cfg.notes.append(f"lora_model_dir: training goes on from the adapter in {folder}: its "
                             "adapter_config.json sets r, alpha, dropout and targets, not lora_*")
            return adapter_from_peft_config(folder, quantized=method == "qlora")
    raise InvalidInput(f"lora_model_dir: {model_dir!r} in {cfg.file!r} has no adapter_config.json here: "
                       "Axolotl trains on from the saved adapter, whose settings autotune reads from that "
                       "file; give a local adapter directory, or leave lora_model_dir out and set lora_*")


def _read_axolotl(cfg: _Config) -> TrainingPlan:
    cfg.refuse(_AXOLOTL_REFUSED)
    for key in _AXOLOTL_PARALLEL:
        value = cfg.get(key)
        if value is not None and value != 1:
            raise cfg.unmodelled(key, value, PARALLEL)
    for key in [k for k in cfg.data if k.startswith(("unsloth_", "liger_"))]:
        if key != "liger_fused_linear_cross_entropy" and not _unset(cfg.get(key)):
            raise cfg.unmodelled(key, cfg.data[key], LIGER if key.startswith("liger_") else KERNEL)
    method = _axolotl_method(cfg)
    attn = _axolotl_attention(cfg)
    mode, dtype = _axolotl_precision(cfg, attn, adapter=method is not None)
    adapter = None if method is None else _axolotl_adapter(cfg, method, dtype)
    loss = None
    for key in ("cut_cross_entropy", "liger_fused_linear_cross_entropy"):
        if cfg.flag(key):
            loss = "chunked"
            cfg.notes.append(f"{key}: {CHUNKED_NOTE}")
    if cfg.flag("sample_packing"):
        cfg.notes.append(f"sample_packing: {PACKED_NOTE}")
    batch = cfg.positive("micro_batch_size", "batch size")
    accumulation = cfg.positive("gradient_accumulation_steps", "accumulation steps")
    total = cfg.positive("batch_size", "global batch size")
    if accumulation is None and total is not None and batch is not None:
        accumulation = max(total // batch, 1)  # normalize_config: batch_size // micro_batch_size
    optimizer = _optimizer(cfg, "optimizer")
    if optimizer is None:
        optimizer = "adamw_torch_fused"  # schemas/training.py: optimizer's default
        cfg.notes.append("optimizer: not set, Axolotl's default adamw_torch_fused")
    _note_neftune(cfg, "neftune_noise_alpha")
    _note_neftune(cfg, "noisy_embedding_alpha")
    prefixes = _AXOLOTL_PREFIXES if adapter is None else tuple(
        p for p in _AXOLOTL_PREFIXES if p not in ("lora_", "peft_"))
    return TrainingPlan(
        format="axolotl", model=cfg.text("base_model"),
        seq_len=cfg.positive("sequence_len", "sequence length"), batch_size=batch, mode=mode,
        accumulation_steps=accumulation or 1, task="causal-lm", dtype=dtype, optimizer=optimizer,
        attn=attn, loss=loss, adapter=adapter, notes=tuple(cfg.notes),
        ignored=cfg.ignored(_AXOLOTL_NO_EFFECT | _AXOLOTL_ADAPTER_NO_EFFECT, prefixes),
    )


def _axolotl_attention(cfg: _Config) -> str | None:
    # attn_implementation, or the deprecated flags it replaced (schemas/config.py).
    attn = _attention(cfg, "attn_implementation", cfg.get("attn_implementation"))
    for key, name in (("flash_attention", "flash_attention_2"), ("sdp_attention", "sdpa"),
                      ("eager_attention", "eager")):
        if cfg.flag(key) and attn is None:
            attn = name
            cfg.notes.append(f"{key}: true: attention {name}")
    return attn


def _axolotl_precision(cfg: _Config, attn: str | None, adapter: bool) -> tuple[Mode, str]:
    """Mode and weights dtype as Axolotl's resolve_dtype and trainer builder set them."""
    bf16 = cfg.get("bf16")
    if bf16 == "auto":
        raise cfg.unmodelled("bf16", bf16, "it depends on the card (Axolotl's resolve_dtype: true where "
                             "bfloat16 is supported, Ampere and newer, else false with fp16: true); "
                             "write bf16: true or bf16: false")
    if bf16 is not None and not isinstance(bf16, bool) and bf16 != "full":
        raise cfg.bad("bf16", bf16, "true, false, 'auto' or 'full'")
    fp16, bfloat16, float16 = cfg.flag("fp16"), cfg.flag("bfloat16"), cfg.flag("float16")
    ckpt = _axolotl_checkpointing(cfg)
    # resolve_dtype: cfg.torch_dtype is bfloat16 if bf16 or bfloat16, else float16 if fp16 or float16,
    # else float32; from_pretrained loads the weights in it (loaders/model.py). The Trainer gets
    # bf16 = bf16 or bfloat16 (except bf16: full, which only evaluates in bf16), fp16 = fp16 and not bf16.
    if bf16 or bfloat16:
        dtype = "bfloat16"
        precision = "fp32" if bf16 == "full" else "bf16"
        cfg.notes.append("bf16: full: weights in bfloat16, no autocast" if bf16 == "full" else
                         "bf16: true: Axolotl loads the weights in bfloat16 and trains under bf16 autocast")
    elif fp16 and adapter:
        # The frozen base in float16, the trained LoRA weights in float32 (PEFT's autocast_adapter_dtype):
        # the GradScaler unscales float32 gradients.
        dtype, precision = "float16", "amp"
        cfg.notes.append("fp16: true: Axolotl loads the weights in float16 and trains the adapters under "
                         "fp16 autocast with a GradScaler")
    elif fp16:
        raise cfg.unmodelled("fp16", True, "Axolotl loads the weights in float16 and the Trainer's "
                             "GradScaler refuses float16 gradients in a full fine-tune; use bf16: true")
    elif float16:
        dtype, precision = "float16", "fp32"
        cfg.notes.append("float16: true: weights in float16, no autocast")
    else:
        dtype, precision = "float32", "fp32"
    if (dtype != "float32" and attn not in ("flash_attention_2",) and not cfg.data.get("cut_cross_entropy")
            and not adapter):
        # loaders/model.py _configure_embedding_dtypes: embed_tokens, lm_head and norms are upcast to
        # float32 and cast back to the weights dtype only for flash attention (attn_needs_dtype_cast),
        # or with an adapter (needs_fa2_dtype).
        key = "bf16" if bf16 else "bfloat16" if bfloat16 else "float16"
        raise cfg.unmodelled(key, cfg.data[key], f"with attention {attn or 'sdpa (default)'} Axolotl keeps "
                             "embed_tokens, lm_head and the norms in float32 beside 16-bit weights; mixed "
                             "weight dtypes are not modelled (set attn_implementation: flash_attention_2)")
    return Mode(precision, ckpt), dtype  # type: ignore[arg-type]


def _axolotl_checkpointing(cfg: _Config) -> bool:
    ckpt = cfg.get("gradient_checkpointing")
    if ckpt in ("offload", "offload_disk"):
        raise cfg.unmodelled("gradient_checkpointing", ckpt, OFFLOAD)
    if ckpt is not None and not isinstance(ckpt, bool):
        raise cfg.bad("gradient_checkpointing", ckpt, "true, false, 'offload' or 'offload_disk'")
    if ckpt:
        # normalize_config sets gradient_checkpointing_kwargs to {use_reentrant: True} when unset.
        _checkpoint_kwargs(cfg, "gradient_checkpointing_kwargs", refuse_unset_reentrant=(
            "without gradient_checkpointing_kwargs Axolotl checkpoints with use_reentrant=True, which is "
            "not modelled; add gradient_checkpointing_kwargs: {use_reentrant: false}"))
    return bool(ckpt)


# ---------------------------------------------------------------------------------------------
# autotune's own format


def _read_autotune(cfg: _Config) -> TrainingPlan:
    mode = cfg.text("mode")
    task = cfg.text("task")
    if task is not None and task.strip().lower() not in TASKS:
        raise cfg.bad("task", task, f"one of {', '.join(TASKS)}")
    loss = cfg.text("loss")
    if loss not in (None, "full", "chunked"):
        raise cfg.bad("loss", loss, "full or chunked")
    accumulation = (cfg.positive("accumulation_steps", "accumulation steps")
                    or cfg.positive("gradient_accumulation_steps", "accumulation steps"))
    return TrainingPlan(
        format="autotune", model=cfg.text("model"), seq_len=cfg.positive("seq_len", "sequence length"),
        batch_size=cfg.positive("batch_size", "batch size"), mode=None if mode is None else parse_mode(mode),
        accumulation_steps=accumulation or 1, task=None if task is None else task.strip().lower(),
        dtype=_dtype(cfg, "dtype", cfg.get("dtype")), optimizer=_optimizer(cfg, "optimizer"),
        attn=_attention(cfg, "attn", cfg.get("attn")), loss="chunked" if loss == "chunked" else None,
        notes=tuple(cfg.notes), ignored=cfg.ignored(_AUTOTUNE_KEYS),
    )



# ---------------------------------------------------------------------------------------------
# A PEFT adapter_config.json

# PEFT's task types back to autotune's tasks (adapters.PEFT_TASK_TYPES).
_PEFT_TASKS = {peft: task for task, peft in PEFT_TASK_TYPES.items() if peft is not None}


def _read_peft(cfg: _Config) -> TrainingPlan:
    """The base model and the adapter of a saved PEFT adapter; the step itself is the flags'."""
    adapter = adapter_from_peft_dict(cfg.data, source=cfg.file)
    task_type = cfg.data.get("task_type")
    task = None
    if task_type is not None:
        task = _PEFT_TASKS.get(str(task_type).upper())
        if task is None:
            raise cfg.unmodelled("task_type", task_type, f"autotune models the PEFT task types "
                                 f"{', '.join(_PEFT_TASKS)} (and none, a masked LM)")
    model = cfg.data.get("base_model_name_or_path")
    if model is not None and not isinstance(model, str):
        raise cfg.bad("base_model_name_or_path", model, "a string")
    _note_adapter(cfg, Path(cfg.file).name, adapter)
    cfg.notes.append("adapter_config.json does not record whether the base was loaded in 4 bits: read as "
                     "LoRA over 16-bit weights (QLoRA's base is 4-bit)")
    return TrainingPlan(format="peft", model=model or None, seq_len=None, batch_size=None, mode=None,
                        task=task, adapter=adapter, notes=tuple(cfg.notes))
