"""LLaMA-Factory v1's training YAML (src/llamafactory/v1), read whole, as its SFT trainer runs it.

A v1 YAML is one flat mapping of the fields of four dataclasses, config/model_args.py
``ModelArguments``, data_args.py ``DataArguments``, training_args.py ``TrainingArguments`` and
sample_args.py ``SampleArguments``, parsed by config/arg_parser.py ``get_args`` (HfArgumentParser's
``parse_dict``, which refuses a key no dataclass has); its ``*_config`` keys are plugin mappings
with a ``name`` (arg_utils.py ``get_plugin_config``), each parsed strictly by its plugin
(utils/plugin.py ``parse_params``). Paths below are v1's (src/llamafactory/v1/, ff6d4d1).

The trainer is the command, not the file: ``llamafactory-cli sft`` (or ``train``) runs
trainers/sft_trainer.py, ``dpo`` and ``rm`` their own trainers (launcher.py). A file is read as
``sft``; one that only a preference trainer could run (its keys, a reward model's class, pair data)
is refused: v1's preference trainers are not modelled.

How v1 builds the step, and what autotune models of it:

- core/model_engine.py ``_init_model``: ``from_pretrained(dtype="auto")`` (the checkpoint's dtype),
  a 4/8-bit base from ``quant_config`` (plugins/model_plugins/quantization.py); without
  ``peft_config`` every weight cast to float32 (``model.to(torch.float32)``); with it PEFT's LoRA
  (plugins/model_plugins/peft.py ``get_lora_model``: adapters float32, PEFT's
  ``autocast_adapter_dtype``); then ``kernel_config`` (plugins/model_plugins/kernels/interface.py).
- core/base_trainer.py ``BaseTrainer.__init__``: ``gradient_checkpointing_enable({"use_reentrant":
  False})`` unless ``enable_activation_checkpointing`` is false; ``_shard_model`` by ``dist_config``
  (FSDP2: backends/distributed.py ``shard_as_llamafactory``, the ``llamafactory`` recipe);
  ``_init_optimizer``: ``torch.optim.AdamW`` (adamw_torch) without ``optim_config``.
- The step (``fit``, trainers/sft_trainer.py ``compute_loss``): no autocast anywhere; ``bf16`` is
  FSDP2's MixedPrecisionPolicy only (fsdp2.py ``get_mp_policy``); the loss is computed outside the
  model over float32 logits, which only the ``llamafactory`` recipe models: a file with no
  ``dist_config`` (one GPU as it is, DDP on more) is refused, naming how to check it.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from autotune.configs.lora import build_adapter, lora_number, note_adapter, target_names
from autotune.configs.reading import (
    DORA,
    KERNEL,
    PARALLEL,
    Config,
    TrainingConfig,
    unset,
    words,
)
from autotune.configs.sharding import (
    PIN_NOTE,
    SHIPPED_DEEPSPEED,
    deepspeed_stage,
    load_json,
    offload,
    set_parallel,
    zero,
)
from autotune.errors import InvalidInput, JobFails, UnknownSetting
from autotune.spelling import close_matches, did_you_mean
from autotune.workload.adapters import ALL_LINEAR, QUANT_TYPES, Adapter, adapter_from_peft_config
from autotune.workload.modes import Mode

# The fields of v1's four dataclasses (config/*_args.py), every key a v1 YAML may hold.
V1_FIELDS = words(
    # model_args.py ModelArguments
    "model custom_chat_template trust_remote_code flash_attn model_class init_config peft_config "
    "kernel_config quant_config "
    # data_args.py DataArguments
    "train_dataset eval_dataset "
    # training_args.py TrainingArguments
    "output_dir micro_batch_size global_batch_size cutoff_len learning_rate num_train_epochs max_steps "
    "max_grad_norm bf16 batching_strategy batching_workers enable_activation_checkpointing dist_config "
    "dp_size cp_size cp_mode mp_replicate_size mp_shard_size dist_timeout optim_config lr_scheduler_config "
    "seed full_determinism resume_from_checkpoint save_steps save_epochs save_ckpt_as_hf save_total_limit "
    "logging_steps pref_loss pref_beta pref_ftx simpo_gamma dpo_label_smoothing ld_alpha "
    # sample_args.py SampleArguments
    "sample_backend max_new_tokens")
# Keys only v1 has (neither the classic YAML, Axolotl, the Trainer, TRL nor autotune's own; TRL's
# readers take peft_config too): one of them makes a file v1's (configs.detect), whose model and
# micro_batch_size are autotune's and Axolotl's too.
LLAMAFACTORY_V1_MARKERS = words(
    "train_dataset dist_config model_class kernel_config sample_backend batching_strategy quant_config "
    "init_config optim_config lr_scheduler_config enable_activation_checkpointing batching_workers "
    "mp_replicate_size mp_shard_size save_ckpt_as_hf custom_chat_template")
# Keys with no effect on a training step's GPU memory: what is trained on and for how long, the
# schedule, saving, logging, the sampler (``llamafactory-cli chat``), the process group's timeout.
_V1_NO_EFFECT = words(
    "custom_chat_template trust_remote_code eval_dataset output_dir learning_rate num_train_epochs max_steps "
    "max_grad_norm batching_workers dist_timeout lr_scheduler_config seed full_determinism "
    "resume_from_checkpoint save_steps save_epochs save_total_limit logging_steps sample_backend "
    "max_new_tokens cp_mode")
# Read only by trainers/dpo_trainer.py (DPOTrainer.__init__: the preference loss and its reference).
_PREFERENCE = ("v1's preference trainers (llamafactory-cli dpo, rm: trainers/dpo_trainer.py, rm_trainer.py) "
               "are not modelled: autotune models v1's sft")
_PREFERENCE_KEYS = ("pref_loss", "pref_beta", "pref_ftx", "simpo_gamma", "dpo_label_smoothing", "ld_alpha")
# The classic YAML's own keys (configs/llamafactory.py): v1's parser refuses them.
_CLASSIC_KEYS = words(
    "stage finetuning_type model_name_or_path per_device_train_batch_size lora_rank lora_target "
    "quantization_bit template dataset")

# The datasets LLaMA-Factory ships for v1 (data/), by the path its examples give, and their rows.
SHIPPED_DATASETS = {
    "data/v1_sft_demo.yaml": "sft",  # identity and alpaca_en_demo, converter alpaca: text
    "data/v1_dpo_demo.yaml": "pair",  # HuggingFaceH4/orca_dpo_pairs, converter pair: chosen/rejected
    "data/v1_multimodal_demo.yaml": "multimodal",  # data/v1_multimodal_demo.jsonl: rows with images
}

# Each plugin's keys, as its dataclass has them (utils/plugin.py parse_params refuses the others).
_LORA_KEYS = words(  # plugins/model_plugins/peft.py LoraParams
    "name r lora_alpha lora_dropout target_modules use_rslora use_dora modules_to_save adapter_name_or_path "
    "export_dir export_size export_hub_model_id infer_dtype export_legacy_format")
_LORA_EXPORT = ("export_dir", "export_size", "export_hub_model_id", "infer_dtype", "export_legacy_format")
_FREEZE_KEYS = words(  # peft.py FreezeParams
    "name freeze_trainable_layers freeze_trainable_modules freeze_extra_modules "
    "cast_trainable_params_to_fp32")
_BNB_KEYS = words("name quantization_bit compute_dtype double_quantization quantization_type")  # BnbParams
_FSDP2_KEYS = words("name reshard_after_forward offload_params pin_memory dcp_path")  # FSDP2Params
_DEEPSPEED_KEYS = words("name config_file")  # distributed/interface.py DeepSpeedParams
# kernel_config: each kernel reads what it needs from the mapping (config.get), nothing refuses.
_KERNEL_KEYS = {"name": None, "require_logits": "liger_kernel", "include_kernels": "flash-linear-attention",
                "chunk_size": "flash-linear-attention"}
_NPU_KERNELS = ("npu_fused_moe", "npu_fused_rmsnorm", "npu_fused_rope", "npu_fused_swiglu")
_INIT = ("init_on_default", "init_on_meta", "init_on_rank0")  # model_plugins/initialization.py
_ATTENTION = ("eager", "sdpa", "flash_attention_2")  # utils/types.py AttentionFunction
_STRATEGIES = ("normal", "padding_free", "dynamic_batching", "dynamic_padding_free")  # arg_utils.py

_LOSS = ("v1's SFT loss (core/base_trainer.py compute_log_probs: the model called with the labels, so "
         "transformers' own loss is computed too, then the logits upcast to float32 and a shifted float32 "
         "copy passed to cross_entropy) is modelled only in autotune's llamafactory FSDP2 recipe")
_NO_DIST = ("without dist_config v1 trains on one GPU as it is, or under DDP on several "
            f"(core/base_trainer.py _shard_model); {_LOSS}, which runs one GPU unwrapped as v1 does: for one "
            "GPU, set dist_config: {name: fsdp2} and give --gpus 1 (the same step: without a process group "
            "FSDP2Engine.prepare_model leaves the model as it is)")


def is_v1(cfg: Config) -> bool:
    """Whether a LLaMA-Factory file is v1's (a key only v1 has) rather than the classic YAML."""
    return bool(set(cfg.data) & LLAMAFACTORY_V1_MARKERS)


def read_llamafactory_v1(cfg: Config) -> TrainingConfig:
    cfg.notes.append("LLaMA-Factory v1 config (src/llamafactory/v1): read as `llamafactory-cli sft` runs it "
                     "(trainers/sft_trainer.py run_sft); `llamafactory-cli dpo` or `rm` would train "
                     "preferences (trainers/dpo_trainer.py, rm_trainer.py), which autotune does not model")
    classic = sorted(set(cfg.data) & _CLASSIC_KEYS)
    if classic:
        raise JobFails(f"{cfg.file!r} mixes LLaMA-Factory's classic keys ({', '.join(classic)}) with "
                       f"v1's ({', '.join(sorted(set(cfg.data) & LLAMAFACTORY_V1_MARKERS))}): v1 refuses "
                       "keys its dataclasses lack (config/arg_parser.py get_args); write one format")
    _v1_trainer(cfg)
    model = cfg.text("model")
    if model is None:
        model = "Qwen/Qwen3-4B-Instruct-2507"  # config/model_args.py ModelArguments.model
        cfg.notes.append(f"model: not set, v1's default {model}")
    peft = _plugin(cfg, "peft_config")
    quant = _plugin(cfg, "quant_config")
    bits = _v1_quantization(cfg, quant, peft)
    adapter = None if peft is None else _v1_adapter(cfg, peft, quant, bits)
    dtype = _v1_dtype(cfg, adapter)
    ckpt = cfg.flag("enable_activation_checkpointing", default=True)  # training_args.py
    if ckpt:
        where = "enable_activation_checkpointing" + (": not set, v1's default true" if cfg.data.get(
            "enable_activation_checkpointing") is None else "")
        cfg.notes.append(f"{where}: every layer checkpointed with use_reentrant=False (core/base_trainer.py "
                         "BaseTrainer.__init__: gradient_checkpointing_enable({'use_reentrant': False}))")
    bf16 = cfg.flag("bf16", default=True)  # training_args.py TrainingArguments.bf16
    mode = Mode("bf16" if bf16 else "fp32", ckpt)
    where = "bf16: " + ("not set, v1's default true" if cfg.data.get("bf16") is None else str(bf16).lower())
    cfg.notes.append(f"{where}: v1 never autocasts; under FSDP2 the MixedPrecisionPolicy's parameters are "
                     + ("bfloat16, gradients reduced in float32" if bf16 else "float32")
                     + " (plugins/trainer_plugins/distributed/fsdp2.py get_mp_policy); on one GPU the step "
                     "computes in the weights' dtype")
    attn = _v1_attention(cfg)
    batch = cfg.positive("micro_batch_size", "batch size")
    if batch is None:
        batch = 1  # training_args.py TrainingArguments.micro_batch_size
        cfg.notes.append("micro_batch_size: not set, v1's default 1")
    seq_len = _v1_seq_len(cfg, attn)
    _v1_kernels(cfg)
    _v1_dist(cfg)
    _v1_mesh(cfg)
    optimizer = _v1_optimizer(cfg)
    _v1_init(cfg, adapter, quant)
    if cfg.flag("save_ckpt_as_hf"):
        cfg.notes.append("save_ckpt_as_hf: at a save, after a step: the full state dict gathered a tensor at "
                         "a time into CPU memory (fsdp2.py save_checkpoint, "
                         "StateDictOptions(cpu_offload=True)): no effect on the step's GPU memory")
    global_batch = cfg.positive("global_batch_size", "global batch size")
    if global_batch is not None:
        cfg.notes.append(f"global_batch_size: {global_batch}: v1 accumulates global_batch_size / (GPUs x "
                         "micro_batch_size) micro-batches per step (core/utils/batching.py BatchGenerator): "
                         "no effect on a step's memory")
    return cfg.result(
        "llamafactory", model=model, seq_len=seq_len, batch_size=batch, mode=mode, accumulation_steps=1,
        task="causal-lm", dtype=dtype, optimizer=optimizer, attn=attn, adapter=adapter,
        ignored=cfg.ignored(_V1_NO_EFFECT),
    )


# ---------------------------------------------------------------------------------------------
# The trainer and the data


def _v1_trainer(cfg: Config) -> None:
    """SFT (trainers/sft_trainer.py), unless the file can only be a preference trainer's."""
    for key in _PREFERENCE_KEYS:
        if cfg.get(key) is not None:
            raise cfg.unmodelled(key, cfg.data[key], f"{_PREFERENCE}; v1 reads {key} only in "
                                 "`llamafactory-cli dpo` (trainers/dpo_trainer.py DPOTrainer)")
    model_class = cfg.get("model_class")
    if model_class is None:
        cfg.notes.append("model_class: not set, v1's default llm: transformers' causal-LM (or "
                         "image-text-to-text) class (core/model_engine.py _init_model)")
    elif model_class == "cls":
        raise cfg.unmodelled("model_class", model_class, f"{_PREFERENCE}; a reward model's class "
                             "(trainers/rm_trainer.py run_rm sets it: AutoModelForTokenClassification, one "
                             "label)")
    elif model_class == "other":
        raise cfg.unmodelled("model_class", model_class, "a model without a language-model head (AutoModel), "
                             "which v1's SFT loss cannot train on")
    elif model_class != "llm":
        raise cfg.bad("model_class", model_class, "one of llm, cls, other")
    dataset = cfg.get("train_dataset")
    if dataset is None:
        cfg.notes.append("train_dataset: not set: read as a training run (v1 trains only with one, "
                         "core/data_engine.py DataEngine)")
        return
    if not isinstance(dataset, str):
        raise cfg.bad("train_dataset", dataset, "a dataset path or name")
    rows, source = _dataset_rows(cfg, dataset)
    if rows == "pair":
        raise cfg.unmodelled("train_dataset", dataset, f"{_PREFERENCE}; {source} holds chosen/rejected pairs "
                             "(converter pair), which only `llamafactory-cli dpo` or `rm` trains on")
    if rows == "multimodal":
        raise cfg.unmodelled("train_dataset", dataset, f"{source} holds rows with images: a vision tower's "
                             "inputs and activations are not modelled; autotune checks text rows")
    cfg.notes.append(f"train_dataset: {dataset!r}: " + (f"{source}: text rows" if rows else
                     "its rows taken to be text (images or videos in them are not modelled)"))


def _dataset_rows(cfg: Config, dataset: str) -> tuple[str | None, str]:
    """What the rows of ``train_dataset`` are (sft, pair, multimodal; None: cannot tell), and where
    that was read: a local dataset YAML (core/data_engine.py ``_get_dataset_info``: entries with a
    ``converter``), else one LLaMA-Factory ships by the path its examples give."""
    for path in (Path(dataset).expanduser(), Path(cfg.file).parent / dataset):
        if path.suffix in (".yaml", ".yml") and path.is_file():
            import yaml

            try:
                infos = yaml.safe_load(path.read_text())
            except (OSError, yaml.YAMLError) as exc:
                raise InvalidInput(f"train_dataset: {dataset!r} in {cfg.file!r}: cannot read {str(path)!r}: "
                                   f"{exc}") from exc
            entries = infos.values() if isinstance(infos, dict) else []
            converters = [info.get("converter") for info in entries if isinstance(info, dict)]
            return ("pair" if "pair" in converters else None), f"the dataset list {str(path)!r}"
    shipped = next((rows for name, rows in SHIPPED_DATASETS.items()
                    if dataset.replace("\\", "/").lstrip("./").endswith(name)), None)
    return shipped, "LLaMA-Factory's shipped dataset list"


# ---------------------------------------------------------------------------------------------
# Plugin mappings


def _plugin(cfg: Config, key: str) -> dict[str, Any] | None:
    """A ``*_config`` key as arg_utils.py ``get_plugin_config`` reads it: a mapping (or its JSON
    text) with a ``name``, its string values "true"/"false" and numbers converted."""
    value = cfg.get(key)
    if value is None:
        return None
    if isinstance(value, str) and value.startswith("{"):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise cfg.bad(key, value, "a mapping") from exc
    if not isinstance(value, dict):
        raise cfg.bad(key, value, "a mapping with a name (v1's PluginConfig)")
    value = _converted(value)
    if "name" not in value:
        raise InvalidInput(f"{key} in {cfg.file!r} has no name: v1 needs one (config/arg_utils.py "
                           "get_plugin_config)")
    return value


def _converted(data: dict[str, Any]) -> dict[str, Any]:
    """arg_utils.py ``_convert_str_dict``."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            value = _converted(value)
        elif isinstance(value, str):
            if value.lower() in ("true", "false"):
                value = value.lower() == "true"
            elif value.isdigit():
                value = int(value)
            elif value.replace(".", "", 1).isdigit():
                value = float(value)
        out[key] = value
    return out


def _check_keys(cfg: Config, key: str, plugin: dict[str, Any], known: frozenset[str], params: str) -> None:
    """Refuse a key the plugin's dataclass lacks, as v1 does (utils/plugin.py parse_params)."""
    unknown = [name for name in plugin if name not in known]
    if unknown:
        close = close_matches(unknown[0], [(name, name) for name in sorted(known)])
        hint = f" ({did_you_mean(close)})" if close else ""
        raise UnknownSetting(f"unknown key {key}.{unknown[0]} in {cfg.file!r}{hint}: v1's {params} has no "
                             "such field and refuses it (utils/plugin.py parse_params); correct the key, or "
                             "remove it")


def _name(cfg: Config, key: str, plugin: dict[str, Any]) -> str:
    name = plugin["name"]
    if not isinstance(name, str):
        raise cfg.bad(f"{key}.name", name, "a string")
    return name


# ---------------------------------------------------------------------------------------------
# Weights, adapter, quantization


def _v1_quantization(cfg: Config, quant: dict[str, Any] | None, peft: dict[str, Any] | None) -> int | None:
    """The bits of a bitsandbytes base (plugins/model_plugins/quantization.py: ``bnb`` 4 unless
    quantization_bit says 8, ``auto`` none unless it says 4 or 8); None for a 16/32-bit one."""
    if quant is None:
        return None
    name = _name(cfg, "quant_config", quant)
    if name not in ("bnb", "auto"):
        raise cfg.bad("quant_config.name", name, "bnb or auto (plugins/model_plugins/quantization.py)")
    _check_keys(cfg, "quant_config", quant, _BNB_KEYS, "BnbParams")
    bits = quant.get("quantization_bit")
    if bits is None:
        if name == "auto":  # quantization_auto: "No quantization method applied."
            cfg.notes.append("quant_config: auto without quantization_bit: v1 quantizes nothing")
            return None
        bits = 4  # quantization_with_bnb: "quantization_bit is not specified, default to 4-bit"
        cfg.notes.append("quant_config.quantization_bit: not set, v1's bnb default 4")
    if isinstance(bits, bool) or bits not in (4, 8):
        raise cfg.bad("quant_config.quantization_bit", bits, "4 or 8 (bitsandbytes)")
    if peft is None:
        raise JobFails(f"quant_config in {cfg.file!r} without peft_config: v1 casts a fully trained "
                       "model to float32 (core/model_engine.py _init_model), which a bitsandbytes model "
                       "refuses; train a LoRA over it (peft_config: {name: lora})")
    return int(bits)


def _v1_dtype(cfg: Config, adapter: Adapter | None) -> str:
    if adapter is None:
        cfg.notes.append("peft_config: not set: full fine-tuning, every weight cast to float32 "
                         "(core/model_engine.py _init_model: model.to(torch.float32)): float32 weights")
        return "float32"
    cfg.notes.append("weights in the checkpoint's dtype (core/model_engine.py _init_model: from_pretrained "
                     "dtype auto); the adapters float32 (PEFT's get_peft_model, autocast_adapter_dtype)")
    return "auto"


def _v1_adapter(cfg: Config, peft: dict[str, Any], quant: dict[str, Any] | None, bits: int | None) -> Adapter:
    """plugins/model_plugins/peft.py ``get_lora_model``: a LoraConfig of LoraParams' values, or the
    saved adapter training goes on from; a 4- or 8-bit base as quantization.py loads it."""
    name = _name(cfg, "peft_config", peft)
    if name == "freeze":
        _check_keys(cfg, "peft_config", peft, _FREEZE_KEYS, "FreezeParams")
        raise cfg.unmodelled("peft_config.name", name, "training only some layers (peft.py "
                             "get_freeze_model) is not modelled: autotune trains them all, or LoRA")
    if name != "lora":
        raise cfg.bad("peft_config.name", name, "lora or freeze (plugins/model_plugins/peft.py)")
    _check_keys(cfg, "peft_config", peft, _LORA_KEYS, "LoraParams")
    if peft.get("use_dora"):
        raise cfg.unmodelled("peft_config.use_dora", peft["use_dora"], DORA)
    at = len(cfg.notes)
    method = "qlora" if bits == 4 else "lora_8bit" if bits == 8 else "lora"
    adapter = _v1_saved_adapter(cfg, peft.get("adapter_name_or_path"), method)
    source = "peft_config.adapter_name_or_path"
    if adapter is None:
        source = "peft_config: lora" + (f" over quant_config.quantization_bit: {bits}" if bits else "")
        adapter = build_adapter(cfg, method, **_v1_lora_numbers(cfg, peft), targets=_v1_targets(cfg, peft),
                                modules_to_save=_v1_trained_whole(cfg, peft))
    if bits == 4 and quant is not None:
        # quantization.py BnbParams: compute_dtype float16, double_quantization true, quantization_type nf4
        compute = quant.get("compute_dtype", "float16")
        if compute not in ("bfloat16", "float16", "float32"):
            raise cfg.bad("quant_config.compute_dtype", compute, "bfloat16, float16 or float32")
        quant_type = quant.get("quantization_type", "nf4")
        if quant_type not in QUANT_TYPES:
            raise cfg.bad("quant_config.quantization_type", quant_type, f"one of {', '.join(QUANT_TYPES)}")
        double_quant = quant.get("double_quantization", True)
        if not isinstance(double_quant, bool):
            raise cfg.bad("quant_config.double_quantization", double_quant, "true or false")
        defaults = [key for key in ("compute_dtype", "quantization_type", "double_quantization")
                    if key not in quant]
        if defaults:
            cfg.notes.append(f"quant_config: {', '.join(defaults)} not set, v1's BnbParams defaults (float16 "
                             "compute, nf4, double quantization)")
        adapter = replace(adapter, quant_type=quant_type, double_quant=double_quant, compute_dtype=compute,
                          recipe="axolotl")
    elif bits == 8:
        adapter = replace(adapter, recipe="axolotl")
    if bits:
        cfg.notes.append(f"quant_config: {bits}-bit bitsandbytes base (BitsAndBytesConfig, quantization.py); "
                         "v1 keeps the weights not quantized in the checkpoint's dtype and PEFT the adapters "
                         "in float32 (no prepare_model_for_kbit_training): the dtypes of Axolotl's recipe")
    note_adapter(cfg, source, adapter, at)
    if peft.get("use_rslora"):
        cfg.notes.append("peft_config.use_rslora: the adapters scaled by alpha/sqrt(r): no effect on memory")
    export = [key for key in _LORA_EXPORT if key in peft]
    if export:
        cfg.notes.append(f"peft_config: {', '.join(export)}: read only by `llamafactory-cli merge` (peft.py "
                         "merge_and_export_model): no effect on training")
    return adapter


def _v1_lora_numbers(cfg: Config, peft: dict[str, Any]) -> dict[str, Any]:
    """r, lora_alpha, lora_dropout with LoraParams' defaults (peft.py): 8, 16, 0.05."""
    defaults = {"r": 8, "lora_alpha": 16, "lora_dropout": 0.05}
    missing = [key for key in defaults if key not in peft]
    if missing:
        cfg.notes.append(f"peft_config: {', '.join(missing)} not set, v1's LoraParams default"
                         f"{'s' * (len(missing) > 1)} {', '.join(f'{defaults[k]:g}' for k in missing)}")
    value = {key: peft.get(key, default) for key, default in defaults.items()}
    return {"r": lora_number(cfg, "peft_config.r", value["r"], rank=True),
            "alpha": lora_number(cfg, "peft_config.lora_alpha", value["lora_alpha"]),
            "dropout": lora_number(cfg, "peft_config.lora_dropout", value["lora_dropout"], dropout=True)}


def _v1_targets(cfg: Config, peft: dict[str, Any]) -> tuple[str, ...] | None:
    """target_modules: "all" (LoraParams' default) is peft.py ``_find_all_linear_modules``: the last
    name of every module whose class name has "Linear" (not "Embedding"), leaving out those whose
    name holds lm_head, output_layer, output, score or classifier: on a decoder LM every linear
    layer but the head, PEFT's all-linear. Another string is one module name."""
    value = peft.get("target_modules", "all")
    if "target_modules" not in peft:
        cfg.notes.append("peft_config.target_modules: not set, v1's default all")
    if value == "all":
        cfg.notes.append("peft_config.target_modules: all: LoRA on every linear layer but the output head "
                         "(peft.py _find_all_linear_modules, which also leaves out any module whose name "
                         "holds output, score or classifier): PEFT's all-linear")
        return (ALL_LINEAR,)
    if isinstance(value, str):
        value = [value]  # get_lora_model: target_modules = [target_modules]
    return target_names(cfg, "peft_config.target_modules", value)


def _v1_trained_whole(cfg: Config, peft: dict[str, Any]) -> tuple[str, ...]:
    """modules_to_save: PEFT's copies trained whole, in the weights' dtype (v1 casts nothing)."""
    value = peft.get("modules_to_save")
    if unset(value):
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(name, str) and name for name in value):
        raise cfg.bad("peft_config.modules_to_save", value, "module names")
    return tuple(value)


def _v1_saved_adapter(cfg: Config, value: Any, method: str) -> Adapter | None:
    """adapter_name_or_path: peft.py ``load_adapter`` trains on from a single saved adapter
    (PeftModel.from_pretrained, is_trainable), with its adapter_config.json's settings."""
    if unset(value):
        return None
    paths = [value] if isinstance(value, str) else value
    if not isinstance(paths, list) or not all(isinstance(path, str) and path for path in paths):
        raise cfg.bad("peft_config.adapter_name_or_path", value, "an adapter directory")
    if len(paths) != 1:
        raise InvalidInput(f"peft_config.adapter_name_or_path in {cfg.file!r} names {len(paths)} adapters: "
                           "v1 trains on from a single one (peft.py load_adapter); merge them first")
    for folder in (Path(paths[0]).expanduser(), Path(cfg.file).parent / paths[0]):
        if (folder / "adapter_config.json").is_file():
            adapter = adapter_from_peft_config(folder, method=method)
            cfg.notes.append("peft_config.adapter_name_or_path: training goes on from the adapter in "
                             f"{folder}: its adapter_config.json sets r, alpha, dropout and targets, not "
                             "peft_config's")
            return adapter
    raise InvalidInput(f"peft_config.adapter_name_or_path: {paths[0]!r} in {cfg.file!r} has no "
                       "adapter_config.json here: v1 trains on from the saved adapter, whose settings "
                       "autotune reads from that file; give a local adapter directory, or leave it out and "
                       "set r, lora_alpha, ...")


# ---------------------------------------------------------------------------------------------
# Attention, sequence, kernels


def _v1_attention(cfg: Config) -> str:
    value = cfg.get("flash_attn")
    if value is None:
        cfg.notes.append("flash_attn: not set, v1's default sdpa (config/model_args.py)")
        return "sdpa"
    if value not in _ATTENTION:
        raise cfg.bad("flash_attn", value, f"one of {', '.join(_ATTENTION)}")
    return str(value)


def _v1_seq_len(cfg: Config, attn: str) -> int:
    """cutoff_len (default 2048): every micro-batch padded to its longest row, at most cutoff_len
    (core/utils/collation.py pad_and_truncate), as each batching strategy forms it."""
    cutoff = cfg.positive("cutoff_len", "sequence length")
    if cutoff is None:
        cutoff = 2048  # training_args.py TrainingArguments.cutoff_len
        cfg.notes.append("cutoff_len: not set, v1's default 2048")
    strategy = cfg.get("batching_strategy")
    if strategy is None or strategy == "normal":
        where = "not set, v1's default normal" if strategy is None else "normal"
        cfg.notes.append(f"batching_strategy: {where}: micro_batch_size rows padded to the longest, at most "
                         "cutoff_len (the padded worst case autotune models)")
        return cutoff
    if strategy not in _STRATEGIES:
        raise cfg.bad("batching_strategy", strategy, f"one of {', '.join(_STRATEGIES)}")
    if strategy == "dynamic_batching":
        if not isinstance(cfg.get("max_steps"), int) or cfg.data["max_steps"] <= 0:
            raise InvalidInput(f"batching_strategy: dynamic_batching in {cfg.file!r} needs max_steps above 0 "
                               "(config/training_args.py __post_init__)")
        cfg.notes.append("batching_strategy: dynamic_batching: micro-batches of up to cutoff_len x "
                         "micro_batch_size padded tokens, rows of at most cutoff_len "
                         "(plugins/trainer_plugins/batching.py _get_dynamic_micro_batch_sizes): none holds "
                         "more tokens or longer rows than micro_batch_size rows of cutoff_len, the shape "
                         "autotune checks")
        return cutoff
    if attn != "flash_attention_2":
        if strategy == "padding_free":  # core/base_trainer.py _create_batch_generator
            raise JobFails(f"batching_strategy: padding_free in {cfg.file!r} needs flash_attn: "
                           f"flash_attention_2 (v1 refuses it with {attn})")
        raise cfg.unmodelled("batching_strategy", strategy, f"with attention {attn} the packed row "
                             "(batching.py _pack_padding_free_samples: no attention mask, positions "
                             "restarting per sample) is masked block-diagonally over its whole length, which "
                             "autotune does not model; set flash_attn: flash_attention_2")
    cfg.notes.append(f"batching_strategy: {strategy}: up to micro_batch_size x cutoff_len tokens packed into "
                     "one row (batching.py _pack_padding_free_samples), each sample attending within itself "
                     "through flash_attention_2's varlen path: the same memory as micro_batch_size full rows")
    return cutoff


def _v1_kernels(cfg: Config) -> None:
    """kernel_config: kernels/interface.py ``apply_kernels``, a comma-separated list of names."""
    kernels = _plugin(cfg, "kernel_config")
    if kernels is None:
        return
    unknown = [name for name in kernels if name not in _KERNEL_KEYS]
    if unknown:
        close = close_matches(unknown[0], [(name, name) for name in _KERNEL_KEYS])
        hint = f" ({did_you_mean(close)})" if close else ""
        raise UnknownSetting(f"unknown key kernel_config.{unknown[0]} in {cfg.file!r}{hint}: no v1 kernel "
                             "reads it; correct the key, or remove it")
    names = [name.strip() for name in _name(cfg, "kernel_config", kernels).split(",") if name.strip()]
    if not names:
        raise cfg.bad("kernel_config.name", kernels["name"], "kernel names (auto, liger_kernel, ...)")
    for name in names:
        if name == "auto":
            # interface.py _AUTO_KERNELS: kernels for Ascend NPUs only; none on a CUDA GPU
            cfg.notes.append("kernel_config: auto: no kernel on a CUDA GPU (kernels/interface.py "
                             "_AUTO_KERNELS lists NPU kernels only): no effect")
        elif name == "liger_kernel":
            raise cfg.unmodelled("kernel_config.name", kernels["name"], "v1's Liger patch "
                                 "(kernels/liger_kernel_ops.py) on the qwen3 family turns on rope, rms_norm, "
                                 "swiglu and, when training (require_logits), Liger's cross_entropy in place "
                                 "of torch's F.cross_entropy, which v1's SFT loss then calls per token "
                                 "(reduction none): not modelled; on other model types it changes nothing: "
                                 "remove it to check those")
        elif name in ("flash-linear-attention", "cuda_fused_moe"):
            raise cfg.unmodelled("kernel_config.name", kernels["name"], f"{name}: {KERNEL}")
        elif name in _NPU_KERNELS:
            raise JobFails(f"kernel_config.name: {name} in {cfg.file!r} is an Ascend NPU kernel: v1 "
                           "refuses it on a CUDA GPU (its check_device), and autotune checks NVIDIA GPUs")
        else:
            raise cfg.bad("kernel_config.name", kernels["name"], "comma-separated kernel names: auto, "
                          "liger_kernel, flash-linear-attention, cuda_fused_moe, or an NPU kernel")
    extra = [name for name in kernels if name != "name" and _KERNEL_KEYS[name] not in names]
    if extra:
        cfg.notes.append(f"kernel_config: {', '.join(extra)}: read only by a kernel not applied: no effect")


# ---------------------------------------------------------------------------------------------
# GPUs, optimizer, loading


def _v1_dist(cfg: Config) -> None:
    """dist_config (core/base_trainer.py ``_shard_model``; plugins/trainer_plugins/distributed/)."""
    dist = _plugin(cfg, "dist_config")
    if dist is None:
        raise cfg.unmodelled("dist_config", None, _NO_DIST)
    name = _name(cfg, "dist_config", dist)
    if name == "fsdp2":
        _check_keys(cfg, "dist_config", dist, _FSDP2_KEYS, "FSDP2Params")
        offloaded = dist.get("offload_params", False)  # interface.py FSDP2Params
        if not isinstance(offloaded, bool):
            raise cfg.bad("dist_config.offload_params", offloaded, "true or false")
        if offloaded:  # fsdp2.py FSDP2Engine.prepare_model: CPUOffloadPolicy(pin_memory) on every group
            offload(cfg, "dist_config.offload_params", offloaded, dist)
        reshard = dist.get("reshard_after_forward", True)  # distributed/interface.py FSDP2Params
        if not isinstance(reshard, bool):
            raise cfg.bad("dist_config.reshard_after_forward", reshard, "true or false")
        set_parallel(cfg, "dist_config", "fsdp", reshard)
        cfg.launch["fsdp_recipe"] = "llamafactory"
        how = "full shard" if reshard else "each group kept gathered from its forward to its backward"
        cfg.notes.append(f"dist_config: fsdp2: FSDP2 over the job's GPUs as v1 wraps it ({how}; fsdp2.py "
                         "FSDP2Engine.prepare_model: LoRA layers' trainable leaves, decoder layers, an "
                         "untied embedding, the root) with v1's SFT loss around it: fsdp_recipe "
                         "llamafactory; on one GPU v1 has no process group and leaves the model unwrapped")
        for key, why in (("dcp_path", "where the weights are loaded from (init_on_meta)"),
                         ("pin_memory", PIN_NOTE if offloaded else "read only with offload_params")):
            if not unset(dist.get(key)):
                cfg.notes.append(f"dist_config.{key}: {dist[key]!r}: no effect on GPU memory: {why}")
    elif name == "deepspeed":
        _check_keys(cfg, "dist_config", dist, _DEEPSPEED_KEYS, "DeepSpeedParams")
        value = dist.get("config_file")
        if not isinstance(value, str) or not value:  # deepspeed.py DeepSpeedEngine
            raise JobFails(f"dist_config: deepspeed in {cfg.file!r} needs a config_file (v1's "
                           "DeepSpeedEngine refuses it without)")
        shipped = next((stage for path, stage in SHIPPED_DEEPSPEED.items()
                        if value.replace("\\", "/").lstrip("./").endswith(path)), None)
        local = [p for p in (Path(value).expanduser(), Path(cfg.file).parent / value) if p.is_file()]
        key = "dist_config.config_file"
        if local or shipped is None:
            stage, source = deepspeed_stage(cfg, key, load_json(cfg, key, value, "DeepSpeed config")), value
        else:
            stage, source = shipped, f"{value}, LLaMA-Factory's shipped file"
        zero(cfg, key, value, stage, source)
        cfg.parallel_key = "dist_config"
    elif name == "fsdpturbo":
        raise cfg.unmodelled("dist_config.name", name, "FSDP Turbo (distributed/fsdpturbo.py: expert "
                             "parallelism, its own FSDP2 wrapping and ignored modules) is not modelled")
    else:
        raise cfg.bad("dist_config.name", name, "fsdp2, deepspeed or fsdpturbo")


def _v1_mesh(cfg: Config) -> None:
    """The device mesh's sizes (accelerator/interface.py DistributedStrategy)."""
    cp = cfg.get("cp_size")
    if cp is not None and cp != 1:
        raise cfg.unmodelled("cp_size", cp, f"context parallelism ({cfg.data.get('cp_mode') or 'ulysses'}): "
                             f"{PARALLEL}")
    replicate = cfg.get("mp_replicate_size")
    if replicate is not None and replicate != 1:
        raise cfg.unmodelled("mp_replicate_size", replicate, "FSDP2 over a replicate x shard mesh within the "
                             "job (hybrid sharding) is not modelled: autotune's hybrid sharding replicates "
                             "across nodes (--nodes)")
    for key in ("dp_size", "mp_shard_size"):
        value = cfg.get(key)
        if value is not None:
            cfg.notes.append(f"{key}: {value!r}: must be the GPU count here (v1 checks it against the world "
                             "size, DistributedStrategy): no effect on memory")


def _v1_optimizer(cfg: Config) -> str:
    optim = _plugin(cfg, "optim_config")
    if optim is None:
        cfg.notes.append("optim_config: not set: torch.optim.AdamW with its defaults (core/base_trainer.py "
                         "_init_optimizer): adamw_torch (foreach on CUDA)")
        return "adamw_torch"
    name = _name(cfg, "optim_config", optim)
    if name == "muon":
        raise cfg.unmodelled("optim_config.name", name, "Muon (plugins/trainer_plugins/optimizers/"
                             "muon_optimizer.py: momentum for the 2-D weights, AdamW for the rest, full "
                             "gradients gathered per matrix) is not modelled")
    raise cfg.bad("optim_config.name", name, "muon, v1's one optimizer plugin (optimizers/optimizer.py), or "
                  "leave optim_config out for AdamW")


def _v1_init(cfg: Config, adapter: Adapter | None, quant: dict[str, Any] | None) -> None:
    """init_config: where the weights are first made (plugins/model_plugins/initialization.py)."""
    init = _plugin(cfg, "init_config")
    if init is None:
        return
    name = _name(cfg, "init_config", init)
    if name not in _INIT:
        raise cfg.bad("init_config.name", name, f"one of {', '.join(_INIT)}")
    _check_keys(cfg, "init_config", init, frozenset({"name"}), "InitPlugin")
    if name == "init_on_meta" and adapter is not None:  # core/model_engine.py _init_model
        raise JobFails(f"init_config: init_on_meta with a LoRA in {cfg.file!r}: v1 refuses it (\"lora "
                       "stage does not support loading model by meta\")")
    if name == "init_on_meta" and quant is not None:
        raise JobFails(f"init_config: init_on_meta with quant_config in {cfg.file!r}: v1 refuses it "
                       "(\"Quantization is not supported with meta device\")")
    cfg.notes.append(f"init_config: {name}: where the weights are first made (on the device, on the meta "
                     "device, on rank 0's CPU), the same shards once training starts: no effect on the step")
