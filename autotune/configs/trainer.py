"""Hugging Face TrainingArguments (with the example scripts' model and data arguments) and TRL's
SFTConfig (with the ``trl sft`` CLI's model arguments), read whole."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from autotune.configs.lora import (
    REGEX_CHARS,
    bnb_4bit,
    build_adapter,
    int8_settings,
    lora_number,
    lora_targets,
    note_adapter,
)
from autotune.configs.preference import PREFERENCE_FIELDS, read_preference, trainer_of
from autotune.configs.reading import (
    CHUNKED_NLL_NOTE,
    COMPILE,
    DORA,
    OFFLOAD,
    PACKED_NOTE,
    PARALLEL,
    QUANT,
    REENTRANT,
    SHARDING,
    Config,
    TrainingConfig,
    checkpoint_kwargs,
    note_neftune,
    read_attention,
    read_compile,
    read_dtype,
    read_optimizer,
    unset,
    words,
)
from autotune.configs.sharding import TRAINER_BOTH_CHECKPOINTS, read_ddp, read_deepspeed, read_trainer_fsdp
from autotune.errors import InvalidInput, JobFails
from autotune.workload.adapters import ALL_LINEAR, QUANT_TYPES, Adapter, adapter_from_peft_dict
from autotune.workload.liger import DEFAULT_KERNELS, FUSED_LINEAR, KERNELS
from autotune.workload.modes import Mode
from autotune.workload.trainers import DPO, GRPO, ORPO, SIMPO

# Every field of transformers.TrainingArguments (5.x), by what it does to a training step's memory.
# The test checks that these cover the installed transformers' dataclass fields.
_TRAINER_MODELLED = words(
    "per_device_train_batch_size gradient_accumulation_steps optim bf16 fp16 gradient_checkpointing "
    "gradient_checkpointing_kwargs activation_checkpointing activation_checkpointing_kwargs "
    "neftune_noise_alpha auto_find_batch_size use_liger_kernel liger_kernel_config "
    # configs/sharding.py: FSDP2 and DeepSpeed's stage into the request, the DDP settings noted
    "fsdp fsdp_config deepspeed ddp_find_unused_parameters ddp_bucket_cap_mb ddp_broadcast_buffers "
    "ddp_static_graph "
    # reading.read_compile: the model under torch.compile (workload/compile.py)
    "torch_compile torch_compile_backend torch_compile_mode")
_TRAINER_DDP = ("ddp_find_unused_parameters", "ddp_broadcast_buffers", "ddp_static_graph")
_TRAINER_REFUSED = {
    "parallelism_config": PARALLEL,
    "use_cpu": "training on the CPU: autotune models a GPU",
    # The Trainer's LabelSmoother takes a log_softmax over the full logits beside the model's loss.
    "label_smoothing_factor": "the label smoother's extra log_softmax over the full logits",
    "use_cache": "a KV cache kept through the training forward",
    "optim_args": "optimizer arguments are not modelled; autotune models each optimizer's defaults",
    "optim_target_modules": "GaLore/APOLLO projections are not modelled",
}
_TRAINER_NO_EFFECT = words(
    "accelerator_config tf32 bf16_full_eval fp16_full_eval "
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
    "ddp_timeout dataloader_drop_last dataloader_num_workers dataloader_pin_memory "
    "dataloader_persistent_workers dataloader_prefetch_factor dataloader_in_order "
    "dataloader_multiprocessing_context remove_unused_columns label_names length_column_name "
    "train_sampling_strategy")
TRAINER_FIELDS = _TRAINER_MODELLED | set(_TRAINER_REFUSED) | _TRAINER_NO_EFFECT
# Fields of transformers 4.x TrainingArguments (and Seq2SeqTrainingArguments) that 5.x dropped.
LEGACY_TRAINER_FIELDS = words(
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
}
# The model and data arguments of transformers' example scripts (run_clm.py, run_glue.py, ...).
_SCRIPT_KEYS = words(
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
_SFT_FIELDS = words(
    "model_init_kwargs router_aux_loss_coef chat_template_path dataset_text_field dataset_kwargs "
    "dataset_num_proc eos_token max_length truncation_mode shuffle_dataset packing packing_strategy "
    "padding_free pad_to_multiple_of eval_packing completion_only_loss assistant_only_loss loss_type "
    "activation_offloading pad_token max_seq_length dataset_batch_size num_of_sequences chars_per_token "
    "use_liger dataset_train_split dataset_test_split dataset_streaming dataset_config ignore_bias_buffers "
    "datasets use_peft bnb_4bit_quant_type use_bnb_nested_quant bnb_4bit_quant_storage")
SFT_MARKERS = _SFT_FIELDS - words("max_length max_seq_length datasets")
_SFT_REFUSED: dict[str, str] = {}
# The ``trl sft`` CLI's ModelConfig keys of an adapter (trl/trainer/model_config.py), and peft_config.
_TRL_PEFT_KEYS = words(
    "use_peft peft_config lora_r lora_alpha lora_dropout lora_target_modules lora_target_parameters "
    "lora_modules_to_save lora_task_type use_rslora use_dora load_in_4bit load_in_8bit bnb_4bit_quant_type "
    "use_bnb_nested_quant bnb_4bit_quant_storage")
# Keys of from_pretrained's keyword arguments (model_init_kwargs) with no effect on memory.
_INIT_NO_EFFECT = words("trust_remote_code revision cache_dir token local_files_only subfolder "
                         "low_cpu_mem_usage device_map use_cache force_download")
_INIT_REFUSED = {"load_in_4bit": "transformers 5's from_pretrained has no load_in_4bit argument: a 4-bit "
                                 "base is quantization_config: {load_in_4bit: true}",
                 "load_in_8bit": "transformers 5's from_pretrained has no load_in_8bit argument: an 8-bit "
                                 "base is quantization_config: {load_in_8bit: true}",
                 "max_memory": OFFLOAD, "offload_folder": OFFLOAD}
# TRL's chunked_nll loss (trl/trainer/sft_trainer.py _chunked_cross_entropy_loss): 256-token chunks
# of logits, each recomputed in its backward (workload/chunked_nll.py); the default loss_type since TRL 1.7.
_SFT_LOSSES = {"chunked_nll": "chunked_nll", "nll": None}


def read_trainer(cfg: Config, fmt: str, trainer: str | None = None) -> TrainingConfig:
    """A TrainingArguments file, TRL's SFTConfig, or (``fmt`` trl-preference) one of TRL's preference
    configs (configs/preference.py: ``trainer`` is --trainer, where the file cannot tell)."""
    sft = fmt == "trl-sft"
    preference: dict[str, Any] = {}
    if fmt == "trl-preference":
        preference = read_preference(cfg, trainer_of(cfg, trainer))
        fmt = f"trl-{preference['trainer']}"
    trl = sft or bool(preference)  # TRL's _BaseConfig: bf16 and gradient checkpointing on by default
    cfg.refuse(_TRAINER_REFUSED | _LEGACY_REFUSED | _SCRIPT_REFUSED | _SFT_REFUSED)
    read_trainer_sharding(cfg)
    if cfg.get("half_precision_backend") == "apex" or cfg.get("fp16_backend") == "apex":
        raise cfg.unmodelled("half_precision_backend", "apex", "NVIDIA apex AMP is not modelled; "
                             "autotune models torch.autocast")
    fp16 = cfg.flag("fp16")
    # TRL's _BaseConfig: bf16 defaults to true when fp16 is not set, checkpointing to true.
    bf16 = cfg.flag("bf16", default=trl and not fp16)
    if fp16 and bf16:
        raise InvalidInput(f"fp16 and bf16 in {cfg.file!r} are both true: choose one")
    if trl and cfg.data.get("bf16") is None and bf16:
        cfg.notes.append("bf16: not set, TRL's default true (fp16 not set)")
    ckpt = _trainer_checkpointing(cfg, default=trl)
    dtype, attn, init_quant = _model_init(cfg, trl)
    adapter = _trainer_adapter(cfg, dtype, init_quant)
    # GRPOConfig has no max_length: a row is max_prompt_length + max_completion_length (request.py)
    seq_len = None if preference.get("trainer") == GRPO else _trainer_seq_len(cfg, trl)
    loss = None
    if sft:
        loss = _sft_loss(cfg)
        _packing(cfg, attn)
        seq_len = _pad_to_multiple(cfg, seq_len)
        if cfg.flag("activation_offloading"):  # sft_trainer.py: training_step under the offloader
            cfg.offload_activations = True
            cfg.notes.append("activation_offloading: true: TRL's OffloadActivations around each step "
                             "(get_act_offloading_ctx_manager): saved activations to the host")
    liger, fused = _trainer_liger(cfg)
    loss = "chunked" if fused else loss
    batch = cfg.positive("per_device_train_batch_size", "batch size")
    if batch is None and fmt == "trainer" and cfg.data:
        batch = 8  # TrainingArguments' default per_device_train_batch_size
        cfg.notes.append("per_device_train_batch_size: not set, the Trainer's default 8")
    optimizer = read_optimizer(cfg, "optim")
    if optimizer is None and cfg.flag("adafactor"):  # transformers 4.x's flag for optim adafactor
        optimizer = "adafactor"
    if cfg.flag("auto_find_batch_size"):
        cfg.notes.append("auto_find_batch_size: the Trainer halves the batch after an out-of-memory "
                         "error; autotune checks the batch as written")
    note_neftune(cfg, "neftune_noise_alpha")
    read_compile(cfg, implied=True)
    model = cfg.text("model_name_or_path")
    task = "causal-lm" if sft or preference.get("trainer") in (DPO, ORPO, SIMPO, GRPO) else _glue_task(cfg)
    return cfg.result(
        fmt, model=model, seq_len=seq_len, batch_size=batch,
        mode=Mode("bf16" if bf16 else "amp" if fp16 else "fp32", ckpt),
        accumulation_steps=cfg.positive("gradient_accumulation_steps", "accumulation steps") or 1,
        task=task, dtype=dtype, optimizer=optimizer, attn=attn, loss=loss, adapter=adapter, liger=liger,
        **preference,
        # lora_* keys are TRL's only with use_peft; with an adapter, one TRL does not know is listed.
        ignored=cfg.ignored(
            TRAINER_FIELDS | LEGACY_TRAINER_FIELDS | _SCRIPT_KEYS | _SFT_FIELDS | _TRL_PEFT_KEYS
            | (PREFERENCE_FIELDS if preference else frozenset()),
            ("eval_", "hub_", "logging_", "save_", "generation_") + (() if adapter else ("lora_",))),
    )


def read_trainer_sharding(cfg: Config) -> None:
    """fsdp, fsdp_config, deepspeed and the ddp_* keys of TrainingArguments (configs/sharding.py);
    the Trainer refuses FSDP and DeepSpeed together (TrainingArguments' accelerator state: one
    distributed type)."""
    if not unset(cfg.data.get("fsdp")) and not unset(cfg.data.get("deepspeed")):
        raise InvalidInput(f"fsdp and deepspeed in {cfg.file!r} are both set: the Trainer runs one of them; "
                           "give one")
    read_trainer_fsdp(cfg)
    read_deepspeed(cfg)
    read_ddp(cfg, _TRAINER_DDP)


# Trainer(use_liger_kernel=True): ``_apply_liger_kernel_to_instance(model, **liger_kernel_config)``
# (transformers integrations/liger.py), the model type's Liger patch with its defaults
# (workload.liger.DEFAULT_KERNELS, cross_entropy off, fused_linear_cross_entropy on) under the config's.
_LIGER_CONFIG_KEYS = (*KERNELS, FUSED_LINEAR)
LIGER_NOTE = ("Liger's kernels, emulated from its source (what each saves for backward and allocates); "
              "those the model type's patch does not take are left out, as Liger leaves them out. The "
              "Trainer patches the built model (_apply_liger_kernel_to_instance), which leaves Qwen3's "
              "q_norm and k_norm transformers' RMSNorm; autotune swaps them too, as a patch before loading "
              "does")


def _trainer_liger(cfg: Config) -> tuple[tuple[str, ...] | None, bool]:
    """The Liger kernels use_liger_kernel (TRL < 0.13: use_liger) turns on, and whether its fused
    linear cross-entropy is on (the loss "chunked")."""
    on = [key for key in ("use_liger_kernel", "use_liger") if cfg.flag(key)]
    config = cfg.get("liger_kernel_config")
    if not on:
        return None, False
    if isinstance(config, str) and config.strip().startswith("{"):
        try:  # TrainingArguments takes a JSON string for a dict field
            config = json.loads(config)
        except json.JSONDecodeError as exc:
            raise cfg.bad("liger_kernel_config", config, "a mapping") from exc
    if not isinstance(config or {}, dict):
        raise cfg.bad("liger_kernel_config", config, "a mapping")
    wanted = {**dict.fromkeys(DEFAULT_KERNELS, True), "cross_entropy": False, FUSED_LINEAR: True}
    for name, value in (config or {}).items():
        if name not in _LIGER_CONFIG_KEYS:
            raise cfg.unmodelled(f"liger_kernel_config.{name}", value, "not emulated: autotune emulates "
                                 f"Liger's {', '.join(_LIGER_CONFIG_KEYS)}")
        if not isinstance(value, bool):
            raise cfg.bad(f"liger_kernel_config.{name}", value, "true or false")
        wanted[name] = value
    if wanted["cross_entropy"] and wanted[FUSED_LINEAR]:
        raise JobFails(f"liger_kernel_config in {cfg.file!r} turns on cross_entropy and "
                       f"{FUSED_LINEAR}: Liger refuses both")
    kernels = tuple(name for name in KERNELS if wanted.get(name))
    fused = f" and {FUSED_LINEAR} (loss: chunked)" if wanted[FUSED_LINEAR] else ""
    cfg.notes.append(f"{on[0]}: {', '.join(kernels) or 'no kernel'}{fused}: {LIGER_NOTE}")
    return kernels or None, wanted[FUSED_LINEAR]


# run_glue.py's task_name: every GLUE task trains a sequence classification head.
_GLUE_TASKS = words("cola mnli mrpc qnli qqp rte sst2 stsb wnli")


def _glue_task(cfg: Config) -> str | None:
    name = cfg.get("task_name")
    if isinstance(name, str) and name.lower() in _GLUE_TASKS:
        cfg.notes.append(f"task_name: {name}: a GLUE task (run_glue.py), sequence-classification")
        return "sequence-classification"
    return None


def _trainer_adapter(cfg: Config, dtype: str | None, init_quant: Any) -> Adapter | None:
    """The adapter as TRL builds it: ``use_peft`` with ModelConfig's lora_* keys (trl/scripts/sft.py:
    ``get_peft_config`` and ``get_quantization_config`` in trl/trainer/utils.py), or a LoraConfig
    written out as ``peft_config``; over a 4-bit base with ``load_in_4bit`` or a bitsandbytes
    ``model_init_kwargs.quantization_config``."""
    use_peft = cfg.get("use_peft")
    if use_peft is not None and not isinstance(use_peft, bool):
        raise cfg.bad("use_peft", use_peft, "true or false")
    peft_config = cfg.get("peft_config")
    if not unset(cfg.get("quantization_config")):  # not a ModelConfig key: a script's own
        raise cfg.unmodelled("quantization_config", cfg.data["quantization_config"], QUANT)
    load_in_4bit, load_in_8bit = cfg.flag("load_in_4bit"), cfg.flag("load_in_8bit")
    if load_in_4bit and load_in_8bit:
        raise InvalidInput(f"load_in_4bit and load_in_8bit in {cfg.file!r} both set: TRL's "
                           "get_quantization_config takes the 4-bit one; give one")
    if (load_in_4bit or load_in_8bit) and init_quant is not None:
        raise JobFails(f"load_in_{'4' if load_in_4bit else '8'}bit and "
                       f"model_init_kwargs.quantization_config in {cfg.file!r} both set the "
                       "quantization: SFTTrainer refuses both, give one")
    init_8bit = init_quant is not None and init_quant.get("load_in_8bit") is True
    quantized = load_in_4bit or (init_quant is not None and not init_8bit)
    eight_bit = load_in_8bit or init_8bit
    lora_keys = [k for k in cfg.data if k.startswith("lora_") and cfg.data[k] is not None]
    trained = use_peft or (use_peft is None and not unset(peft_config))
    if not trained:
        _refuse_adapter_keys_without_peft(cfg, use_peft, peft_config, lora_keys,
                                          "load_in_4bit" if load_in_4bit else "load_in_8bit" if load_in_8bit
                                          else "model_init_kwargs.quantization_config"
                                          if quantized or eight_bit else None)
        return None
    if cfg.flag("use_dora"):
        raise cfg.unmodelled("use_dora", True, DORA)
    # get_quantization_config: BitsAndBytesConfig(load_in_8bit=True) for ModelConfig's load_in_8bit
    method = "qlora" if quantized else "lora_8bit" if eight_bit else "lora"
    at = len(cfg.notes)
    if not unset(peft_config):
        if use_peft or lora_keys:
            named = ["use_peft"] * bool(use_peft) + lora_keys
            raise InvalidInput(f"peft_config and {', '.join(named)} in {cfg.file!r} both describe the "
                               "adapter: give one")
        if not isinstance(peft_config, dict):
            raise cfg.bad("peft_config", peft_config, "a mapping (a LoraConfig's fields)")
        adapter = adapter_from_peft_dict(peft_config, source=f"peft_config in {cfg.file!r}",
                                         method=method)
        source = "peft_config"
    else:
        adapter = _trl_lora(cfg, method)
        source = "use_peft: true"
    if quantized:
        adapter = _trl_quantization(cfg, adapter, dtype, init_quant)
    note_adapter(cfg, source, adapter, at)
    if cfg.flag("use_rslora") or (isinstance(peft_config, dict) and peft_config.get("use_rslora")):
        cfg.notes.append("use_rslora: the adapters scaled by alpha/sqrt(r): no effect on memory")
    template = cfg.get("chat_template_path")
    if template is not None and not str(template).endswith((".jinja", ".j2")):
        raise cfg.unmodelled("chat_template_path", template, "with an adapter, SFTTrainer makes lm_head "
                             "(modules_to_save) and the embeddings of the tokens a cloned chat template adds "
                             "trainable (clone_chat_template), which autotune does not model; give a .jinja "
                             "file")
    return adapter


def _refuse_adapter_keys_without_peft(cfg: Config, use_peft: bool | None, peft_config: Any,
                                      lora_keys: list[str], quantized_by: str | None) -> None:
    """A full fine-tune's adapter settings that contradict it, or that TRL would not read."""
    if use_peft is False and not unset(peft_config):
        raise InvalidInput(f"use_peft: false and peft_config in {cfg.file!r} contradict: give one")
    flags = [k for k in ("use_dora", "use_rslora") if cfg.flag(k)]
    if use_peft is None and (lora_keys or flags):
        # TRL builds an adapter only with use_peft; a script of one's own may read lora_* alone.
        key = (lora_keys + flags)[0]
        raise cfg.unmodelled(key, cfg.data[key], "TRL trains an adapter only with use_peft: true "
                             "(get_peft_config); write use_peft: true for LoRA, or use_peft: false for "
                             "a full fine-tune")
    if quantized_by is not None:
        raise JobFails(f"{quantized_by} in {cfg.file!r} loads a 4-bit base without adapters: the "
                       "Trainer refuses to fine-tune a purely quantized model (transformers "
                       "trainer_utils.py); add use_peft: true")


def _trl_lora(cfg: Config, method: str) -> Adapter:
    """ModelConfig's LoRA keys, with TRL's defaults (trl/trainer/model_config.py)."""
    if not unset(cfg.get("lora_target_parameters")):
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
        values[field] = lora_number(cfg, key, value, rank=key == "lora_r", dropout=key == "lora_dropout")
    if defaults:
        cfg.notes.append(f"{', '.join(defaults)}: not set, TRL's default{'s' * (len(defaults) > 1)} "
                         f"{', '.join(f'{v:g}' for v in defaults.values())}")
    modules = cfg.get("lora_target_modules")
    if isinstance(modules, list) and len(modules) == 1 and isinstance(modules[0], str):
        modules = modules[0]  # ModelConfig.__post_init__: a one-entry list becomes its string
        if modules.lower() != ALL_LINEAR and not REGEX_CHARS & set(modules):
            raise InvalidInput(
                f"lora_target_modules: {cfg.data['lora_target_modules']!r} in {cfg.file!r}: TRL's "
                f"ModelConfig "
                f"turns a one-entry list into the string {modules!r}, which PEFT matches as a regular "
                "expression against whole module names (model.layers.0.self_attn.q_proj): a plain name "
                f"matches none; list two or more module names, or write {ALL_LINEAR}")
    targets = lora_targets(cfg, "lora_target_modules", modules)
    if targets.get("targets") == ():
        raise JobFails(f"lora_target_modules in {cfg.file!r} is empty: PEFT refuses an adapter on no "
                       "module; name modules, write all-linear, or leave it out for PEFT's default")
    to_save = cfg.get("lora_modules_to_save") or []
    if not isinstance(to_save, list) or not all(isinstance(m, str) for m in to_save):
        raise cfg.bad("lora_modules_to_save", to_save, "a list of module names")
    return build_adapter(cfg, method, modules_to_save=to_save, **targets, **values)


def _trl_quantization(cfg: Config, adapter: Adapter, dtype: str | None, init_quant: Any) -> Adapter:
    if init_quant is not None:
        # transformers' BitsAndBytesConfig defaults: fp4, no double quantization, float32 compute.
        quant_type, double_quant, compute = bnb_4bit(
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


def _trainer_checkpointing(cfg: Config, default: bool) -> bool:
    # transformers 5: activation_checkpointing*, with gradient_checkpointing* as deprecated aliases
    # used only when the new name is not set (TrainingArguments.__post_init__).
    new, old = cfg.get("activation_checkpointing"), cfg.get("gradient_checkpointing")
    key = "activation_checkpointing" if new is not None else "gradient_checkpointing"
    ckpt = cfg.flag(key, default=default)
    if default and new is None and old is None:
        cfg.notes.append("gradient_checkpointing: not set, TRL's default true")
    if ckpt and cfg.launch.get("fsdp_activation_checkpointing"):
        shown = f"{key}: true" if new is not None or old is not None else f"{key} not set, TRL's default true"
        raise JobFails(f"fsdp_config.activation_checkpointing: true with {shown} in {cfg.file!r}: "
                       f"{TRAINER_BOTH_CHECKPOINTS}: set {key}: false")
    if ckpt:
        kwargs_key = ("activation_checkpointing_kwargs" if cfg.get("activation_checkpointing_kwargs")
                      is not None else "gradient_checkpointing_kwargs")
        legacy = cfg.get("gradient_checkpointing_use_reentrant")  # TRL's old ScriptArguments
        if legacy is not None and cfg.get(kwargs_key) is None:
            # trl/commands/scripts (TRL < 0.12): gradient_checkpointing_kwargs={use_reentrant: it}
            if not isinstance(legacy, bool):
                raise cfg.bad("gradient_checkpointing_use_reentrant", legacy, "true or false")
            if legacy:
                cfg.ckpt_reentrant = True
                cfg.notes.append(f"gradient_checkpointing_use_reentrant: true: {REENTRANT}")
        else:
            checkpoint_kwargs(cfg, kwargs_key)
    return ckpt


def _model_init(cfg: Config, sft: bool) -> tuple[str | None, str | None, dict[str, Any] | None]:
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
        if not unset(kwargs.get(key)):
            raise cfg.unmodelled(f"model_init_kwargs.{key}", kwargs[key], why)
    quant = kwargs.get("quantization_config")
    if not unset(quant):
        key = "model_init_kwargs.quantization_config"
        if not isinstance(quant, dict) or quant.get("quant_method", "bitsandbytes") != "bitsandbytes":
            raise cfg.unmodelled(key, quant, QUANT)
        if quant.get("load_in_8bit") is True and not quant.get("load_in_4bit"):
            int8_settings(cfg, key, quant)
        elif quant.get("load_in_4bit") is not True:
            raise cfg.unmodelled(key, quant, QUANT)
    else:
        quant = None
    known = _INIT_NO_EFFECT | {"dtype", "torch_dtype", "attn_implementation", "quantization_config"}
    cfg.nested_ignored.extend(f"model_init_kwargs.{k}" for k in kwargs if k not in known)
    dtype = attn = None
    for where, values in (("model_init_kwargs.", kwargs), ("", cfg.data)):
        for key in ("dtype", "torch_dtype"):
            if values.get(key) is not None and dtype is None:
                dtype = read_dtype(cfg, where + key, values[key])
        if attn is None:
            attn = read_attention(cfg, where + "attn_implementation", values.get("attn_implementation"))
    cfg.read.update(("dtype", "torch_dtype", "attn_implementation"))
    if sft and dtype is None:
        dtype = "float32"  # trl/trainer/utils.py create_model_from_path: kwargs.get("dtype", "float32")
        cfg.notes.append("dtype: not set, TRL's trainers load the model in float32 (TRL's default)")
    return dtype, attn, quant


def _trainer_seq_len(cfg: Config, sft: bool) -> int | None:
    for key in ("max_length", "max_seq_length", "block_size"):
        if cfg.data.get(key) is not None:
            return cfg.positive(key, "sequence length")
    if sft and "max_length" not in cfg.data:
        cfg.notes.append("max_length: not set, TRL's default 1024")
        return 1024
    return None


def _sft_loss(cfg: Config) -> str | None:
    """SFTConfig's loss_type: unset, "chunked_nll" unless use_liger_kernel (sft_config.py
    ``__post_init__``); chunked_nll with use_liger_kernel is refused (sft_trainer.py ``__init__``)."""
    loss_type = cfg.text("loss_type")
    liger = cfg.flag("use_liger_kernel")
    if loss_type is None:
        if liger:
            cfg.notes.append("loss_type: not set, TRL's default nll with use_liger_kernel (sft_config.py)")
            return None
        cfg.notes.append(f"loss_type: not set, TRL's default chunked_nll (TRL >= 1.7): {CHUNKED_NLL_NOTE}; "
                         "write loss_type: nll for an older TRL")
        return "chunked_nll"
    if loss_type not in _SFT_LOSSES:
        raise cfg.unmodelled("loss_type", loss_type, "autotune models the losses nll and chunked_nll")
    if _SFT_LOSSES[loss_type] and liger:
        raise JobFails(f"loss_type chunked_nll and use_liger_kernel in {cfg.file!r}: TRL refuses them "
                       "together (\"`loss_type='chunked_nll'` is not compatible with "
                       "`use_liger_kernel=True`\"); drop one")
    if _SFT_LOSSES[loss_type]:
        cfg.notes.append(f"loss_type: chunked_nll: {CHUNKED_NLL_NOTE}")
    return _SFT_LOSSES[loss_type]


def _packing(cfg: Config, attn: str | None) -> None:
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


def _pad_to_multiple(cfg: Config, seq_len: int | None) -> int | None:
    multiple = cfg.positive("pad_to_multiple_of")
    if multiple is None or seq_len is None or seq_len % multiple == 0:
        return seq_len
    padded = -(-seq_len // multiple) * multiple
    cfg.notes.append(f"pad_to_multiple_of: {multiple}: rows padded to {padded} tokens")
    return padded

