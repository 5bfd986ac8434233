"""Axolotl's YAML, read whole, with Axolotl's defaults where a key is absent
(src/axolotl/utils/schemas/config.py; normalize_config in utils/config/__init__.py)."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from autotune.configs.axolotl_callbacks import read_callbacks
from autotune.configs.axolotl_context import read_context_parallel
from autotune.configs.axolotl_diffusion import DIFFUSION_PLUGIN, read_diffusion
from autotune.configs.axolotl_loading import (
    REINIT,
    check_config_class,
    check_reinit_dtype,
    read_hybrid_attention,
    read_loading,
)
from autotune.configs.axolotl_tiled import read_tiled_mlp
from autotune.configs.generation import read_chat_template_kwargs, read_generation_kwargs
from autotune.configs.lora import (
    bnb_4bit,
    build_adapter,
    lora_number,
    lora_targets,
    note_adapter,
    target_names,
)
from autotune.configs.reading import (
    CCE_NOTE,
    CHUNKED_NOTE,
    DORA,
    KERNEL,
    OFFLOAD,
    PACKED_NOTE,
    PARALLEL,
    QUANT,
    Config,
    TrainingConfig,
    checkpoint_kwargs,
    note_neftune,
    note_set_keys,
    preset_model_type,
    read_attention,
    read_compile,
    read_optimizer,
    unset,
    vlm_preset,
    words,
)
from autotune.configs.sharding import (
    FSDP1,
    WRAP,
    fsdp_options,
    legacy_fsdp,
    note_no_effect,
    offload,
    pin_memory,
    read_ddp,
    read_deepspeed,
    read_trainer_fsdp1,
    set_parallel,
    wrap_classes,
)
from autotune.errors import InvalidInput, JobFails, UnmodelledSetting
from autotune.request import CheckRequest
from autotune.workload import fp8 as fp8_module
from autotune.workload.adapters import ALL_LINEAR, Adapter, adapter_from_peft_config
from autotune.workload.axolotl_eaft import AXOLOTL_EAFT, EAFT_ALPHA, EAFT_K
from autotune.workload.axolotl_eaft import DESCRIPTION as EAFT_DESCRIPTION
from autotune.workload.liger import GATED as LIGER_GATED
from autotune.workload.liger import parse_kernels as parse_liger_kernels
from autotune.workload.lora_kernels import CONFIG_KEYS, KERNELS, PATCHING, axolotl_turns_off, parse_kernels
from autotune.workload.modes import Mode
from autotune.workload.qat import parse_qat, to_json
from autotune.workload.step import FLEX_ATTENTION
from autotune.workload.trainers import (
    DPO,
    DPO_LOSS_TYPES,
    EBFT,
    EBFT_FEATURE_LAYERS,
    EBFT_MAX_COMPLETION_LENGTH,
    GRPO,
    KTO,
    ORPO,
    REWARD,
    REWARD_TASK,
    SIMPO,
)

# Keys only Axolotl has (TrainingArguments and TRL have none of them).
AXOLOTL_MARKERS = words("base_model base_model_config sequence_len micro_batch_size num_epochs "
                        "sample_packing adapter dataset_prepared_path val_set_size lr_scheduler")

_AXOLOTL_REFUSED = {
    # loaders/model.py _set_quantization_config: GPTQConfig(**the checkpoint's quantization_config), the
    # transformers GptqHfQuantizer path autotune models for LLaMA-Factory over the checkpoints whose
    # quantization_config it has read (workload/prequantized.py CHECKPOINTS); not wired for Axolotl yet.
    "gptq": "a checkpoint saved GPTQ-quantized, which Axolotl loads with GPTQConfig(**its "
            "quantization_config) (loaders/model.py _set_quantization_config): transformers' GPTQ path, "
            "modelled for LLaMA-Factory over the checkpoints whose quantization_config autotune has read "
            "(workload/prequantized.py), not yet for Axolotl's gptq: true",
    "quantization": QUANT,
    # core/builders/base.py _apply_torch_compile_options: torch._inductor.config flags set globally
    # (shape and comprehensive padding, triton.cudagraphs, ...), which change the compiled step's buffers
    "torch_compile_options": "inductor's config flags are not modelled: autotune models inductor's "
                             "defaults",
    "layer_offloading": OFFLOAD, "gpu_memory_limit": OFFLOAD,
    "max_memory": OFFLOAD,
    "process_reward_model": "not modelled",
    "xformers_attention": KERNEL, "sage_attention": KERNEL,
    "s2_attention": KERNEL, "flash_attn_cross_entropy": KERNEL,
    "flash_attn_rms_norm": KERNEL, "flash_optimum": KERNEL,
    # utils/chunked_cross_entropy: chunks the loss over logits that are still materialized.
    "chunked_cross_entropy": "a cross-entropy chunked over materialized logits is not modelled",
    # utils/fp32_norms.py: norms kept in float32, whose outputs then are float32 too.
    "fp32_norms": "norms kept in float32 (float32 norm outputs into the next layer) are not modelled",
    # integrations/llm_compressor/plugin.py: LLMCompressorPlugin's callback runs llm-compressor's recipe
    # around the Trainer's steps (examples/llama-3/sparse-finetuning.yaml: ConstantPruningModifier).
    "llmcompressor": "llm-compressor's sparse fine-tuning (LLMCompressorPlugin's session around each step) "
                     "is not modelled: its ConstantPruningModifier registers a bool mask the size of every "
                     "targeted weight (modifiers/pruning/utils/pytorch/layer_mask.py add_mask: "
                     "torch.ones_like(param, dtype=torch.bool), kept through training), fills it from "
                     "param.abs() > eps at the start and multiplies each weight by it after every optimizer "
                     "step (constant/base.py on_start, on_event)",
}
# Parallel degrees not modelled (1 or null: none), and why: expert parallelism is Axolotl's
# ExpertParallelPlugin's dispatch of the experts over ranks (integrations/expert_parallel). Context
# parallelism is read by axolotl_context.py.
_AXOLOTL_PARALLEL = {
    "expert_parallel_size": f"{PARALLEL}: expert parallelism (ExpertParallelPlugin, the experts dispatched "
                            "over ranks) is not modelled",
}
# Axolotl's plugins (integrations/): each one's keys join the config. Those read: CutCrossEntropy
# (cut_cross_entropy, default true once the plugin is listed: cut_cross_entropy/args.py), Liger
# (its liger_* keys), the diffusion plugin (its diffusion: block, axolotl_diffusion.py) and plugins
# that only log. Any other changes the step in ways not modelled.
_PLUGIN_PREFIX = "axolotl.integrations."
CCE_PLUGIN = "axolotl.integrations.cut_cross_entropy.CutCrossEntropyPlugin"
_AXOLOTL_PLUGINS_READ = frozenset({CCE_PLUGIN, "axolotl.integrations.liger.LigerPlugin", DIFFUSION_PLUGIN,
                                   "axolotl.integrations.swanlab.SwanLabPlugin"})
# transformers' experts implementations (modeling_utils get_correct_experts_implementation):
# grouped_mm is its default, which autotune traces; the others run the experts another way.
_EXPERTS_DEFAULT = "grouped_mm"
_AXOLOTL_NO_EFFECT = words(
    "datasets test_datasets pretraining_dataset dataset_prepared_path val_set_size output_dir chat_template "
    "num_epochs max_steps learning_rate lr_scheduler cosine_min_lr_ratio cosine_constant_lr_ratio "
    "weight_decay max_grad_norm adam_beta1 adam_beta2 adam_epsilon tf32 eval_batch_size evals_per_epoch "
    "saves_per_epoch logging_steps resume_from_checkpoint auto_resume_from_checkpoints "
    "local_rank seed strict train_on_inputs group_by_length special_tokens tokens added_tokens_overrides "
    "tokenizer_type model_type trust_remote_code shuffle_merged_datasets debug pad_to_sequence_len "
    "eval_sample_packing sample_packing_eval_drop_last bf16 fp16 float16 bfloat16 device_map "
    "embeddings_skip_upcast resize_token_embeddings_to_32x default_system_message eot_tokens train_on_eos "
    "roles_to_train use_tensorboard gc_steps batch_size base_model_config excess_length_strategy "
    # utils/data/utils.py _drop_outside_range: drops samples shorter than it; rows stay sequence_len
    "min_sample_len "
    "pretrain_multipack_attn streaming sequence_len_overflow_handling remove_unused_columns "
    "include_tokens_per_second profiler_steps fsdp_final_state_dict_type ddp ddp_timeout "
    "skip_prepare_dataset "
    "dataset_exact_deduplication embedding_lr embedding_lr_scale lr_groups gradient_checkpointing_kwargs "
    "low_cpu_mem_usage hf_use_auth_token sample_packing_sequentially curriculum_sampling "
    "streaming_multipack_buffer_size do_causal_lm_eval evaluation_strategy use_wandb use_swanlab "
    "use_otel_metrics revision_of_model "
    # Not a field of AxolotlInputConfig (utils/schemas/config.py), whose pydantic model ignores
    # extra keys: validate_config's model_dump drops it and nothing reads it (the cosine
    # schedule's floor is cosine_min_lr_ratio); a learning-rate floor has no effect on memory.
    "eta_min "
    # Not a field of AxolotlInputConfig either (examples/llama-3/lora-1b-sample-packing-sequentially.yml
    # sets it): dropped by validate_config's model_dump, read nowhere in src/axolotl.
    "test_value "
    # Nor adam_eps (examples/llama-2/gptq-lora.yml; Axolotl's key is adam_epsilon, an optimizer scalar).
    # push_dataset_to_hub: the prepared dataset's hub copy (utils/data/sft.py); torchdistx_path: a
    # sys.path entry for optimizer adamw_anyprecision's import (core/builders/base.py); gptq_disable_exllama:
    # a GPTQ kernel choice read with gptq: true alone (loaders/model.py _set_quantization_config), which
    # is refused.
    "adam_eps push_dataset_to_hub torchdistx_path gptq_disable_exllama")
# Families of keys with no effect: logging and tracking, data, schedules, and adapter settings
# (lora_*, peft_*: without an adapter Axolotl does not read them; with one, those not read are listed).
_AXOLOTL_PREFIXES = ("wandb_", "mlflow_", "comet_", "swanlab_", "trackio_", "hub_", "eval_", "save_",
                     "logging_", "lr_", "warmup_", "dataset_", "loss_watchdog", "lora_", "peft_", "loraplus_",
                     "relora_", "dataloader_", "chat_template", "tokenizer_", "is_", "early_stopping",
                     "profiler_", "otel_",
                     # the learning-rate schedule's restarts (utils/schedulers.py JaggedLRRestartScheduler)
                     "jagged_restart_")


# Axolotl's adapter settings that change the step in ways autotune does not model (schemas/peft.py;
# loaders/adapter.py _build_peft_lora_config and load_lora).
_AXOLOTL_LORA_REFUSED = {
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
# Keys read on some paths only (an adapter's, a 4-bit base's): set where this config does not use
# them (lora_alpha beside lora_model_dir), they are listed as ignored, never refused as unknown.
_AXOLOTL_SOMETIMES_READ = words(
    "bnb_config_kwargs lora_r lora_alpha lora_dropout lora_target_modules lora_target_linear "
    "lora_modules_to_save lora_model_dir lora_alpha_pattern loraplus_lr_ratio peft_use_rslora "
    "lora_target_parameters peft_autocast_adapter_dtype peft_ensure_weight_tying nvfp4_merge_aware")
# Adapter settings with no effect on memory: the weights' layout and initialization, merging after
# training, loading, LoRA+'s per-group learning rates (the same optimizer states).
_AXOLOTL_ADAPTER_NO_EFFECT = words(
    "lora_model_dir lora_fan_in_fan_out peft_init_lora_weights peft merge_lora merge_method "
    "qlora_sharded_model_loading loraplus_lr_ratio loraplus_lr_embedding lora_alpha_pattern peft_use_rslora "
    "peft_autocast_adapter_dtype peft_ensure_weight_tying")
# Axolotl's fused LoRA kernels (lora_mlp_kernel, lora_qkv_kernel, lora_o_kernel, lora_embedding_kernel),
# which check_auto_enable_lora_kernels (schemas/config.py) turns on for lora and qlora when none is set.
LORA_KERNELS_NOTE = ("emulated: Axolotl's LoRA_MLP, LoRA_QKV, LoRA_O (LoRA_QK where v_proj is None, and "
                     "LoRA_Embedding) autograd Functions and its SwiGLU/GeGLU Triton kernels re-written in "
                     "torch, saving for the backward what Axolotl's save, patched in as "
                     "apply_lora_kernel_patches patches them")
# Embeddings and output heads (loaders/utils.py get_linear_embedding_layers, and GPT-2's): named
# beside lora_target_linear they put LoRA on more than every linear layer.
_AXOLOTL_EMBEDDINGS = frozenset({"embed_tokens", "lm_head", "embed_in", "embed_out", "word_embeddings",
                                 "embeddings", "wte", "wpe"})


def _axolotl_method(cfg: Config) -> str | None:
    """lora, qlora, lora_8bit or None from adapter, load_in_4bit and load_in_8bit (schemas/peft.py
    validate_adapter and validate_qlora; loaders/model.py _set_quantization_config: an 8-bit base,
    BitsAndBytesConfig(load_in_8bit=True), for adapter: lora with load_in_8bit)."""
    load_in_4bit, load_in_8bit = cfg.flag("load_in_4bit"), cfg.flag("load_in_8bit")
    method = cfg.get("adapter")
    if load_in_8bit and method != "lora":
        if unset(method):
            raise JobFails(f"load_in_8bit: true in {cfg.file!r} without an adapter: an 8-bit base is "
                           "frozen (transformers refuses to train a purely quantized model); add "
                           "adapter: lora")
        if method == "qlora":
            raise JobFails(f"adapter: qlora with load_in_8bit: true in {cfg.file!r}: Axolotl refuses "
                           "it (schemas/peft.py validate_qlora: \"Can't load qlora in 8bit\")")
    if unset(method):
        if load_in_4bit:
            raise JobFails(f"load_in_4bit: true in {cfg.file!r} without an adapter: Axolotl refuses "
                           "4-bit loading for a full fine-tune (schemas/peft.py validate_adapter); add "
                           "adapter: qlora")
        return None
    if method not in ("lora", "qlora"):
        raise cfg.unmodelled("adapter", method, "autotune models the adapters lora and qlora")
    if method == "lora" and load_in_8bit:
        if load_in_4bit:
            raise JobFails(f"load_in_8bit and load_in_4bit in {cfg.file!r}: BitsAndBytesConfig refuses "
                           "both; give one")
        return "lora_8bit"
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
    return method


def _axolotl_kernels(cfg: Config, adapter: Adapter) -> tuple[str, ...]:
    """The fused LoRA kernels Axolotl patches in: the lora_*_kernel keys set true, or, where none is
    set, those schemas/config.py check_auto_enable_lora_kernels turns on: all four for lora and qlora
    but with rl, trust_remote_code, nvfp4_merge_aware, an 8-bit LoRA base or FSDP1 (an fsdp_config
    without fsdp_version 2 on more than one GPU: ``_fsdp1``); its MoE skip is for torch < 2.9, below
    Axolotl's torch>=2.11 in pyproject.toml. Set under FSDP1 they are refused: not modelled.
    The embedding kernel alone patches nothing (patch_manager.py _apply_lora_kernel_patch) and is
    dropped where embed_tokens carries no LoRA."""
    values = {name: cfg.get(key) for name, key in CONFIG_KEYS.items()}
    for name, value in values.items():
        if value is not None and not isinstance(value, bool):
            raise cfg.bad(CONFIG_KEYS[name], value, "true or false")
    off = axolotl_turns_off(preset_model_type(cfg.data.get("base_model")))
    if off is not None:
        cfg.notes.append(off)
        return ()
    if adapter.base_bits == 8:
        named = [CONFIG_KEYS[name] for name in PATCHING if values.get(name)]
        if named:
            raise JobFails(f"{', '.join(named)}: true with an 8-bit base in {cfg.file!r}: Axolotl "
                           "refuses them (schemas/validation.py check_lora_kernels_8bit: \"not "
                           "compatible with 8-bit LoRA\")")
        if all(value is None for value in values.values()):
            cfg.notes.append("lora_*_kernel: not set, and with load_in_8bit Axolotl leaves its fused LoRA "
                             "kernels off (check_auto_enable_lora_kernels)")
            return ()
    remote = cfg.get("trust_remote_code")
    if all(value is None for value in values.values()):
        # check_auto_enable_lora_kernels returns first for rl ("RL trainers not tested")
        skip = "rl" if not unset(cfg.data.get("rl")) else "trust_remote_code" if remote \
            else "nvfp4_merge_aware" if cfg.data.get("nvfp4_merge_aware") \
            else "FSDP1 (fsdp_config without fsdp_version: 2) on more than one GPU" if _fsdp1(cfg) else None
        if skip is not None:
            cfg.notes.append(f"lora_*_kernel: not set, and with {skip} Axolotl leaves its fused LoRA kernels "
                             "off (check_auto_enable_lora_kernels)")
            return ()
        on = list(KERNELS)
        cfg.notes.append("lora_*_kernel: not set, Axolotl turns its fused LoRA kernels on "
                         f"(check_auto_enable_lora_kernels): {', '.join(on)} — {LORA_KERNELS_NOTE}")
    else:
        on = [name for name, value in values.items() if value]
        if remote and set(on) & set(PATCHING):
            raise JobFails(f"lora_*_kernel with trust_remote_code in {cfg.file!r}: Axolotl refuses them "
                           "together (schemas/validation.py check_lora_kernels_trust_remote_code)")
        if on and _fsdp1(cfg):
            _kernels_under_fsdp1(cfg, on)
            if set(on) & set(PATCHING):
                return ()
        if set(on) & set(PATCHING):
            cfg.notes.append(f"{', '.join(CONFIG_KEYS[name] for name in on)}: true — {LORA_KERNELS_NOTE}")
    if not set(on) & set(PATCHING):
        if on:
            cfg.notes.append("lora_embedding_kernel: true alone patches nothing: Axolotl patches its kernels "
                             "in only with lora_mlp_kernel, lora_qkv_kernel or lora_o_kernel")
        return ()
    if "embedding" in on and not _embeddings_may_carry_lora(adapter):
        on.remove("embedding")
        cfg.notes.append("lora_embedding_kernel: embed_tokens carries no LoRA here: nothing for it to patch")
    return parse_kernels(on)


def _kernels_under_fsdp1(cfg: Config, on: list[str]) -> None:
    """LoRA kernels set under FSDP1: on more than one GPU Axolotl refuses them (schemas/config.py
    check_multigpu_lora_kernels: any of lora_mlp/qkv/o/embedding_kernel, ``capabilities.n_gpu > 1``
    and fsdp_config without fsdp_version 2); on one, they would read the adapters inside FSDP1's
    FlatParameters, which is not modelled (lora_embedding_kernel alone patches nothing). The GPU
    count is the merged flags' (check_launch)."""
    keys = ", ".join(CONFIG_KEYS[name] for name in on)
    fails = JobFails(f"{keys}: true under FSDP1 (fsdp_config without fsdp_version: 2) on more than one GPU "
                     f"in {cfg.file!r}: Axolotl refuses them (schemas/config.py check_multigpu_lora_kernels: "
                     "\"lora_mlp_kernel, lora_qkv_kernel, and lora_o_kernel are not compatible with "
                     "FSDP1.\"); give fsdp_version: 2")
    one = cfg.unmodelled(CONFIG_KEYS[on[0]], True, "Axolotl's fused LoRA kernels under FSDP1 (they read the "
                         "adapters inside FSDP1's FlatParameters): give fsdp_version: 2") \
        if set(on) & set(PATCHING) else None
    cfg.by_gpu_count = (one, fails)


def _note_fsdp_qlora_load(cfg: Config) -> None:
    """How Axolotl loads a QLoRA base under FSDP (loaders/model.py ``_set_device_map``: device_map
    ``{"": LOCAL_RANK}`` for QLoRA with FSDP; only FSDP2 with cpu_ram_efficient_loading replaces it by
    rank 0 on the CPU and the others on meta): the load is not modelled, the estimate is the step's."""
    if cfg.get("fsdp_config") is None:
        return
    config = cfg.get("fsdp_config")
    efficient = isinstance(config, dict) and any(
        config.get(key) for key in ("cpu_ram_efficient_loading", "fsdp_cpu_ram_efficient_loading"))
    if not _fsdp1(cfg) and efficient:
        return
    cfg.notes.append("adapter: qlora under FSDP: Axolotl loads the whole 4-bit model onto every rank's GPU "
                     "(loaders/model.py _set_device_map: device_map {'': LOCAL_RANK}) before FSDP shards it; "
                     "that load peak is not modelled: the estimate is the training step's")


def _fsdp1(cfg: Config) -> bool:
    """Whether check_auto_enable_lora_kernels finds FSDP1 (schemas/config.py: ``fsdp_config`` set
    and ``fsdp_version`` not 2; the version also read from inside fsdp_config, which validation.py
    check_fsdp_version_in_fsdp_config copies out to fsdp_version)."""
    config = cfg.get("fsdp_config")
    if config is None:
        return False
    inner = config.get("fsdp_version", config.get("version")) if isinstance(config, dict) else None
    return str(cfg.get("fsdp_version") or inner) != "2"


def _embeddings_may_carry_lora(adapter: Adapter) -> bool:
    """Whether embed_tokens may be a LoRA target (a pattern may match it; all-linear and PEFT's
    default targets are linear layers)."""
    if adapter.target_pattern is not None:
        return True
    return adapter.targets is not None and "embed_tokens" in adapter.targets


def _axolotl_adapter(cfg: Config, method: str, dtype: str) -> Adapter:
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
    if not unset(model_dir):
        adapter = _axolotl_saved_adapter(cfg, method, model_dir)
        source = "lora_model_dir"
    else:
        values = {}
        for key, field in (("lora_r", "r"), ("lora_alpha", "alpha")):
            value = cfg.get(key)
            if value is None:
                raise JobFails(f"adapter: {method} in {cfg.file!r} needs {key}: Axolotl has no default "
                               f"(schemas/peft.py) and PEFT's LoraConfig fails on {field}=None")
            values[field] = lora_number(cfg, key, value, rank=key == "lora_r")
        dropout = cfg.get("lora_dropout")
        if dropout is None:
            dropout = 0.0  # schemas/peft.py validate_lora_dropout
            cfg.notes.append("lora_dropout: not set, Axolotl's default 0.0")
        values["dropout"] = lora_number(cfg, "lora_dropout", dropout, dropout=True)
        adapter = build_adapter(cfg, method, **_axolotl_targets(cfg, method), modules_to_save=to_save,
                                **values)
        source = f"adapter: {method}"
    adapter = replace(adapter, kernels=_axolotl_kernels(cfg, adapter))
    if adapter.dropout:  # load_lora: PEFT's ParamWrapper on fused experts built without dropout
        adapter = replace(adapter, experts_undropped=True)
    if method == "lora_8bit":
        # _set_quantization_config: BitsAndBytesConfig(load_in_8bit=True); then, as for qlora,
        # prepare_model_for_kbit_training and norms and embeddings back to torch_dtype.
        adapter = replace(adapter, recipe="axolotl")
    if method == "qlora":
        # _set_quantization_config: nf4, double quantization, compute in cfg.torch_dtype (the weights'
        # dtype), updated by bnb_config_kwargs.
        extra = cfg.get("bnb_config_kwargs") or {}
        if not isinstance(extra, dict):
            raise cfg.bad("bnb_config_kwargs", extra, "a mapping")
        quant_type, double_quant, compute = bnb_4bit(cfg, "bnb_config_kwargs", extra, "nf4", True, dtype)
        # loaders/model.py: prepare_model_for_kbit_training, then norms and embeddings back to
        # torch_dtype (adapters.prepare, recipe "axolotl").
        adapter = replace(adapter, quant_type=quant_type, double_quant=double_quant, compute_dtype=compute,
                          recipe="axolotl")
        _note_fsdp_qlora_load(cfg)
    note_adapter(cfg, source, adapter, at)
    if cfg.flag("peft_use_rslora"):
        cfg.notes.append("peft_use_rslora: the adapters scaled by alpha/sqrt(r): no effect on memory")
    if not unset(cfg.get("lora_alpha_pattern")):
        cfg.notes.append("lora_alpha_pattern: per-module alphas scale the adapters' outputs: no effect on "
                         "memory")
    if not unset(cfg.get("loraplus_lr_ratio")):
        cfg.notes.append("loraplus_lr_ratio: LoRA+ learning rates per parameter group, the same optimizer "
                         "states: no effect on memory")
    return adapter


def _axolotl_quantized_experts(cfg: Config, adapter: Adapter | None) -> Adapter:
    """quantize_moe_experts: the experts' 3D weights quantized on load in the base's bits
    (monkeypatch/moe_quant.py, backends/estimate/moe_quant.py), under schemas/config.py
    check_quantize_moe_experts's conditions."""
    if cfg.flag("lora_target_linear"):
        raise JobFails(f"quantize_moe_experts with lora_target_linear in {cfg.file!r}: Axolotl refuses "
                       "it (schemas/config.py check_quantize_moe_experts: \"lora_target_linear is not "
                       "compatible with quantize_moe_experts\"); name lora_target_modules instead")
    if adapter is None or not adapter.quantized:
        raise InvalidInput(f"quantize_moe_experts in {cfg.file!r} without a 4- or 8-bit base: Axolotl "
                           "requires adapter: lora or qlora with load_in_4bit or load_in_8bit "
                           "(schemas/config.py check_quantize_moe_experts)")
    into = "the weights' dtype" if adapter.base_bits == 4 else "float32"
    bits = adapter.base_bits
    cfg.notes.append(f"quantize_moe_experts: the experts' 3D weights quantized on load to {bits} "
                     f"bits (bitsandbytes, as Axolotl's monkeypatch/moe_quant.py), dequantized to {into} "
                     "once per forward of the experts (emulated)")
    return replace(adapter, quantize_experts=True)


# A base_model saved in bitsandbytes nf4 (hugging-quants' and axolotl-quants' "-bnb-nf4-bf16": nf4,
# computed and stored in bfloat16, as their names say).
_SAVED_NF4 = re.compile(r"(?<![a-z0-9])bnb-nf4(?![a-z0-9])")


def _axolotl_saved_nf4(cfg: Config, adapter: Adapter | None) -> None:
    """A base_model saved in nf4: loaders/model.py _set_quantization_config loads it with the
    checkpoint's own quantization_config (BitsAndBytesConfig(**model_config.quantization_config)) under
    adapter lora or qlora, 4-bit whatever the config's keys say; modelled as a load_in_4bit base (nf4,
    double quantization, bfloat16, transformers' default skips), refused where the config does not
    load a 4-bit base."""
    model = cfg.data.get("base_model")
    if not isinstance(model, str) or not _SAVED_NF4.search(model.lower()):
        return
    if adapter is None or adapter.base_bits != 4:
        raise cfg.unmodelled("base_model", model, "a checkpoint saved in bitsandbytes nf4 loads in 4 bits "
                             "(its quantization_config), which autotune models under adapter: qlora with "
                             "load_in_4bit: true only")
    cfg.notes.append(f"base_model: {model}: saved in bitsandbytes nf4; Axolotl loads it with the "
                     "checkpoint's quantization_config (loaders/model.py _set_quantization_config), taken as "
                     "load_in_4bit's (nf4, double quantization, bfloat16; every linear layer but the output "
                     "head 4-bit)")


def _axolotl_linearized_experts(cfg: Config) -> dict[str, Any]:
    """``llama4_linearized_experts: true``: Llama 4's experts as Axolotl's per-expert linear layers
    (workload/llama4.py; model type llama4 only, refused for another there)."""
    if not cfg.flag("llama4_linearized_experts"):
        return {}
    from autotune.workload.llama4 import NOTE

    cfg.notes.append(NOTE)
    return {"llama4_linearized_experts": True}


def _axolotl_targets(cfg: Config, method: str) -> dict[str, Any]:
    """The targets as make_adapter's keywords (lora.lora_targets), with the parameters
    lora_target_parameters names."""
    modules = cfg.get("lora_target_modules")
    parameters = _axolotl_target_parameters(cfg)
    if cfg.flag("lora_target_linear"):
        # _build_peft_lora_config: lora_target_modules (as a list) with every linear module's name but
        # the output embedding's (find_all_linear_names): PEFT's all-linear, with what else is named.
        if isinstance(modules, str):
            modules = [] if modules.lower() == ALL_LINEAR else [modules]
        named = target_names(cfg, "lora_target_modules", modules) or ()
        beyond = [name for name in named if name.split(".")[-1] in _AXOLOTL_EMBEDDINGS]
        if beyond:
            raise cfg.unmodelled("lora_target_modules", cfg.data["lora_target_modules"],
                                 f"{', '.join(beyond)} beside lora_target_linear: true puts LoRA on "
                                 "embeddings or the output head as well as on every linear layer, which "
                                 "autotune does not model")
        among = "; the layers lora_target_modules names are among them" if named else ""
        cfg.notes.append("lora_target_linear: true: LoRA on every linear layer but the output head (PEFT's "
                         f"all-linear){among}")
        return {"targets": (ALL_LINEAR,), "parameters": parameters}
    targets = lora_targets(cfg, "lora_target_modules", modules)
    if parameters:
        # _build_peft_lora_config: target_modules=cfg.lora_target_modules or [] beside them
        return {**targets, "parameters": parameters} if targets.get("targets") or targets.get(
            "target_pattern") else {"targets": (), "parameters": parameters}
    if not targets.get("targets", True):
        raise JobFails(f"adapter: {method} in {cfg.file!r} names no LoRA target: set lora_target_modules "
                       "or lora_target_linear: true (Axolotl passes target_modules=[] to PEFT, which "
                       "refuses it)")
    return targets


def _axolotl_target_parameters(cfg: Config) -> tuple[str, ...]:
    """lora_target_parameters (schemas/peft.py: a name or a list), PEFT's target_parameters as
    _build_peft_lora_config passes them; lora_dropout must be 0 beside them (schemas/peft.py
    validate_lora_target_parameters_dropout)."""
    names = cfg.get("lora_target_parameters")
    if unset(names):
        return ()
    if isinstance(names, str):
        # passed as is: PEFT's _inject_parameters takes set(target_parameters), a string's letters
        raise cfg.bad("lora_target_parameters", names, "a list of parameter names (Axolotl passes a "
                      "string to PEFT as is, which matches it letter by letter)")
    if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
        raise cfg.bad("lora_target_parameters", names, "a list of parameter names")
    dropout = cfg.data.get("lora_dropout")
    if dropout:
        raise JobFails(f"lora_dropout: {dropout!r} beside lora_target_parameters in {cfg.file!r}: "
                       "Axolotl refuses it (schemas/peft.py validate_lora_target_parameters_dropout: "
                       "\"lora_dropout must be 0 when lora_target_parameters is set\")")
    cfg.notes.append(f"lora_target_parameters: LoRA on the parameters {', '.join(names)} (PEFT's "
                     "target_parameters: a ParamWrapper over each, its low-rank delta folded into the "
                     "weight on every forward, peft/tuners/lora/layer.py _activate_lora)")
    return tuple(names)


def _axolotl_saved_adapter(cfg: Config, method: str, model_dir: Any) -> Adapter:
    """lora_model_dir: load_lora trains on the saved adapter (PeftModel.from_pretrained), with the
    settings of its adapter_config.json rather than lora_*."""
    if not isinstance(model_dir, str):
        raise cfg.bad("lora_model_dir", model_dir, "a directory")
    for folder in (Path(model_dir).expanduser(), Path(cfg.file).parent / model_dir):
        if (folder / "adapter_config.json").is_file():
            cfg.notes.append(f"lora_model_dir: training goes on from the adapter in {folder}: its "
                             "adapter_config.json sets r, alpha, dropout and targets, not lora_*")
            return adapter_from_peft_config(folder, method=method)
    raise InvalidInput(f"lora_model_dir: {model_dir!r} in {cfg.file!r} has no adapter_config.json here: "
                       "Axolotl trains on from the saved adapter, whose settings autotune reads from that "
                       "file; give a local adapter directory, or leave lora_model_dir out and set lora_*")


# Axolotl's LigerPlugin keys (integrations/liger/args.py LigerArgs) and the kernels each turns on;
# liger_fused_linear_cross_entropy is the loss (read_axolotl). liger_glu_activation (liger_swiglu: its
# deprecated name) is geglu where the model type's patch takes it, else swiglu (plugin.py
# pre_model_load): both are asked for, and the patch keeps its own (workload.liger.check_kernels).
# liger_rms_norm_gated is read by the plugin's qwen3_5 and qwen3_5_moe branches alone (workload.liger.GATED).
_AXOLOTL_LIGER = {"liger_rope": ("rope",), "liger_rms_norm": ("rms_norm",),
                  "liger_layer_norm": ("layer_norm",), "liger_glu_activation": ("swiglu", "geglu"),
                  "liger_swiglu": ("swiglu", "geglu"), "liger_cross_entropy": ("cross_entropy",),
                  "liger_rms_norm_gated": (LIGER_GATED,)}
LIGER_NOTE = ("Liger's kernels, emulated from its source (what each saves for backward and allocates), "
              "swapped in before the model is built as the LigerPlugin does (apply_liger_kernel_to_<model_"
              "type>, or the plugin's own branch); those the model type's patch does not take are left out, "
              "as the plugin leaves them out, and a model type neither Liger 0.8.0 nor the plugin patches "
              "gets none (plugin.py: \"Unsupported model config type ... Liger not applied\")")


def _axolotl_liger(cfg: Config) -> tuple[str, ...] | None:
    """The Liger kernels the liger_* keys turn on (a key left out is off: the plugin passes None);
    keys of Liger settings not emulated (liger_use_token_scaling) refused."""
    kernels: list[str] = []
    for key in sorted(k for k in cfg.data if k.startswith("liger_")):
        if key == "liger_fused_linear_cross_entropy":
            continue
        if key not in _AXOLOTL_LIGER:
            if not unset(cfg.get(key)):
                raise cfg.unmodelled(key, cfg.data[key], f"not emulated: autotune emulates Liger's "
                                     f"{', '.join(_AXOLOTL_LIGER)} and liger_fused_linear_cross_entropy")
        elif cfg.flag(key):
            kernels += _AXOLOTL_LIGER[key]
    if cfg.data.get("liger_swiglu") is not None and cfg.data.get("liger_glu_activation") is not None:
        raise JobFails(f"liger_swiglu and liger_glu_activation in {cfg.file!r}: Axolotl refuses both "
                       "(liger_swiglu is the deprecated name of liger_glu_activation)")
    if "cross_entropy" in kernels and cfg.flag("liger_fused_linear_cross_entropy"):
        raise JobFails(f"liger_cross_entropy and liger_fused_linear_cross_entropy in {cfg.file!r}: "
                       "Axolotl refuses both")
    if not kernels:
        return None
    on = [key for key in sorted(_AXOLOTL_LIGER) if cfg.data.get(key) is True]
    cfg.notes.append(f"{', '.join(on)}: {LIGER_NOTE}")
    return parse_liger_kernels(kernels)


def _axolotl_plugins(cfg: Config) -> list[str]:
    """The plugins listed, each one read or refused by name (_AXOLOTL_PLUGINS_READ)."""
    plugins = cfg.get("plugins") or []
    if not isinstance(plugins, list) or not all(isinstance(p, str) for p in plugins):
        raise cfg.bad("plugins", plugins, "a list of plugin class paths")
    for plugin in plugins:
        if plugin == KERNELS_PLUGIN and not _scattermoe(cfg):
            raise cfg.unmodelled("plugins", plugin, _kernels_plugin_reason(cfg))
        if plugin not in _AXOLOTL_PLUGINS_READ and plugin != KERNELS_PLUGIN:
            name = plugin.removeprefix(_PLUGIN_PREFIX)
            raise cfg.unmodelled("plugins", plugin, f"the plugin {name} changes the training step in ways "
                                 "autotune does not model (it reads CutCrossEntropyPlugin, LigerPlugin, "
                                 "DiffusionPlugin and logging plugins)")
    return plugins


KERNELS_PLUGIN = "axolotl.integrations.kernels.KernelsPlugin"


def _scattermoe(cfg: Config) -> bool:
    """Whether KernelsPlugin's keys choose ScatterMoE: use_scattermoe, or expert_backend scattermoe
    (args.py _canonicalize_expert_backend: it sets use_scattermoe)."""
    backend = str(cfg.data.get("expert_backend") or "").lower()
    return (cfg.data.get("use_scattermoe") is True or backend == "scattermoe") and not (
        cfg.data.get("use_sonicmoe") or backend == "sonicmoe")


# KernelsPlugin's keys (integrations/kernels/args.py KernelsArgs) beside use_scattermoe that change
# the step in ways not emulated: other models' kernels, fp4/fp8 experts and non-experts, the chunked
# bitsandbytes path (moe_bnb_fast: false, chunked_bnb.py), NVFP4 merge-aware LoRA (SonicMoE's).
_KERNELS_REFUSED = {
    "use_dsv4_kernels": "DeepSeek-V4's fused kernels (libs/dsv4) are not modelled",
    "use_glm_dsa_kernels": "GLM-5's DSA attention kernels (libs/glm_dsa) are not modelled",
    "dsv4_fp4_grouped_mode": "the grouped fp4 experts path (dsv4_fp4_grouped_mode) is not modelled",
    "moe_grouped_backend": "the grouped fp4 experts' GEMM backends are not modelled",
    "nonexpert_quantization": "non-expert linears quantized by KernelsPlugin's adapters are not modelled",
    "gemma4_fp8_nonexpert": "fp8 non-expert linears are not modelled",
    "gemma4_nf4_nonexpert": "nf4 non-expert linears are not modelled",
    "dsv4_fp8_nonexpert_mode": "DeepSeek-V4's fp8 non-experts are not modelled",
    "dsv4_fp8_lora_kernel": "DeepSeek-V4's fp8 LoRA kernel is not modelled",
    "dsv4_shared_mlp_lora_kernel": "DeepSeek-V4's shared-expert LoRA kernel is not modelled",
    "dsv4_bf16_all": "DeepSeek-V4's kernels are not modelled",
    "nvfp4_merge_aware": "merge-aware NVFP4 LoRA (SonicMoE's) is not modelled",
    "nvfp4_merge_aware_start_step": "merge-aware NVFP4 LoRA (SonicMoE's) is not modelled",
}


def _axolotl_experts_kernel(cfg: Config, plugins: list[str]) -> str | None:
    """KernelsPlugin with ScatterMoE (plugin.py pre_model_load: register_scattermoe_experts and
    experts_implementation: scattermoe, whatever experts_implementation the config gives): the
    experts kernel of the request (workload/scattermoe.py); None without the plugin. The plugin with
    another expert backend is refused by _axolotl_plugins."""
    if KERNELS_PLUGIN not in plugins:
        return None
    for key in ("use_scattermoe", "expert_backend", "use_sonicmoe"):
        cfg.get(key)  # read by _scattermoe
    cfg.refuse(_KERNELS_REFUSED)
    if cfg.get("moe_bnb_fast") is False:
        raise cfg.unmodelled("moe_bnb_fast", False, "ScatterMoE's chunked bitsandbytes path (chunked_bnb.py "
                             "chunked_bnb_moe) is not emulated; its default moe_bnb_fast path is")
    if not unset(cfg.get("moe_dequant_chunk_size")):
        cfg.notes.append("moe_dequant_chunk_size: read by ScatterMoE's chunked bitsandbytes path only, not "
                         "by its default moe_bnb_fast one: no effect here")
    use_kernels = cfg.get("use_kernels")
    cfg.notes.append(f"use_kernels: {use_kernels!r}: KernelsPlugin sets it true (args.py check_use_kernels): "
                     "transformers' kernelize swaps hub kernels in for the layers its mapping names "
                     "(checked against the model's)")
    experts = cfg.get("experts_implementation")
    if experts is not None:
        cfg.notes.append(f"experts_implementation: {experts}: KernelsPlugin sets scattermoe over it "
                         "(plugin.py pre_model_load)")
    from autotune.workload.scattermoe import LORA_NOTE, NOTE, SCATTERMOE

    cfg.notes.append(f"use_scattermoe: {NOTE}")
    if not unset(cfg.get("lora_target_parameters")) or cfg.flag("lora_target_linear"):
        # PEFT wraps the experts' parameters: named, or all-linear's (utils/transformers_weight_conversion.py)
        cfg.notes.append(f"use_scattermoe with LoRA on the experts' parameters: {LORA_NOTE}")
    return SCATTERMOE


def _kernels_plugin_reason(cfg: Config) -> str:
    """Why KernelsPlugin is refused: what it swaps in (integrations/kernels/plugin.py pre_model_load,
    args.py check_experts_implementation), by the backend its keys choose."""
    backend = str(cfg.data.get("expert_backend") or "").lower()
    if cfg.data.get("use_sonicmoe") or backend == "sonicmoe":
        return ("KernelsPlugin's SonicMoE experts (use_sonicmoe: libs/sonicmoe, CuTe kernels on Hopper "
                "and Blackwell) are not modelled")
    return ("KernelsPlugin without an expert backend pins experts_implementation: eager (args.py "
            "check_experts_implementation), transformers' per-expert loop, which is not modelled, and sets "
            "use_kernels: true (check_use_kernels), kernelize's hub kernels, emulated for gpt_oss and "
            "qwen3_moe only (workload/hub_kernels.py)")


# model_quantization_config (schemas/model.py: Mxfp4Config or FineGrainedFP8Config), passed to
# from_pretrained as quantization_config with model_quantization_config_kwargs (loaders/model.py
# _set_quantization_config); transformers' Mxfp4Config.__init__ takes these keywords.
_MXFP4_KWARGS = ("dequantize", "modules_to_not_convert")
MXFP4_DEQUANTIZED_NOTE = (
    "the checkpoint's MXFP4 experts dequantized at load to the dtype of the parameters they load into "
    "(transformers integrations/mxfp4.py Mxfp4Dequantize; replace_with_mxfp4_linear leaves the model's "
    "own experts), the quantization config removed once loaded (quantizers/base.py "
    "remove_quantization_config): the model trains as the unquantized one traced here")


def _axolotl_model_quantization(cfg: Config, plugins: list[str]) -> None:
    """``model_quantization_config: Mxfp4Config`` that dequantizes (gpt-oss' MXFP4 checkpoints to the
    weights' dtype at load: the model traced), with Axolotl's refusals; every other one refused."""
    name = cfg.get("model_quantization_config")
    kwargs = cfg.get("model_quantization_config_kwargs")
    if unset(name):
        if not unset(kwargs):
            cfg.notes.append("model_quantization_config_kwargs: read only beside model_quantization_config "
                             "(loaders/model.py _set_quantization_config): no effect here")
        return
    if name != "Mxfp4Config":
        why = ("fp8 weights quantized at load (FineGrainedFP8Config) and their kernels are not modelled"
               if name == "FineGrainedFP8Config" else "Axolotl takes Mxfp4Config or FineGrainedFP8Config")
        raise cfg.unmodelled("model_quantization_config", name, why)
    for key in ("load_in_8bit", "load_in_4bit"):
        if cfg.flag(key):
            raise JobFails(f"model_quantization_config with {key}: true in {cfg.file!r}: Axolotl refuses "
                           "it (schemas/validation.py check_model_quantization_config_vs_bnb)")
    fsdp = cfg.data.get("fsdp_config")
    if isinstance(fsdp, dict) and fsdp.get("cpu_ram_efficient_loading") is True:
        raise JobFails(f"model_quantization_config: Mxfp4Config with "
                       f"fsdp_config.cpu_ram_efficient_loading in {cfg.file!r}: Axolotl refuses it "
                       "(schemas/validation.py check_gpt_oss_fsdp_loading)")
    kwargs = {} if kwargs is None else kwargs
    if not isinstance(kwargs, dict):
        raise cfg.bad("model_quantization_config_kwargs", kwargs, "a mapping of Mxfp4Config's keywords")
    for key in kwargs:
        if key not in _MXFP4_KWARGS:
            raise cfg.unmodelled(f"model_quantization_config_kwargs.{key}", kwargs[key],
                                 f"Mxfp4Config's keywords read are {', '.join(_MXFP4_KWARGS)}")
    dequantize = kwargs.get("dequantize", False)
    if not isinstance(dequantize, bool):
        raise cfg.bad("model_quantization_config_kwargs.dequantize", dequantize, "true or false")
    cfg.from_pretrained += (name,)
    use_kernels = cfg.data.get("use_kernels") is True or KERNELS_PLUGIN in plugins
    if dequantize:
        cfg.notes.append(f"model_quantization_config: Mxfp4Config(dequantize=True): {MXFP4_DEQUANTIZED_NOTE}")
    elif use_kernels:
        # quantizers/quantizer_mxfp4.py _process_model_before_weight_loading: use_kernels on a CUDA card
        # sets dequantize ("You are using full precision kernels, we will dequantize the model to bf16").
        cfg.notes.append("model_quantization_config: Mxfp4Config with use_kernels: transformers dequantizes "
                         f"on a CUDA card (quantizer_mxfp4.py _process_model_before_weight_loading): "
                         f"{MXFP4_DEQUANTIZED_NOTE}")
    else:
        raise cfg.unmodelled("model_quantization_config", name, "without dequantize: true the experts stay "
                             "MXFP4 (integrations/mxfp4.py Mxfp4GptOssExperts, Triton kernels of "
                             "kernels-community/gpt-oss-triton-kernels), not modelled; transformers refuses "
                             "to train them without an adapter (quantizer_mxfp4.py is_trainable: False, "
                             "trainer_utils.py validate_quantization_for_training); set "
                             "model_quantization_config_kwargs: {dequantize: true}")
    if not unset(kwargs.get("modules_to_not_convert")):
        cfg.notes.append("model_quantization_config_kwargs.modules_to_not_convert: no effect once "
                         "dequantized")


def _axolotl_use_kernels(cfg: Config, plugins: list[str]) -> bool | None:
    """``use_kernels`` without KernelsPlugin (which reads it: _axolotl_experts_kernel): passed to
    from_pretrained (loaders/model.py: ``if self.cfg.use_kernels``), whose kernelize swaps Hub kernels in
    (emulated: workload/hub_kernels.py); checked once the model is known (check_patched_model). False or
    null passes nothing: None."""
    if KERNELS_PLUGIN in plugins:
        return None
    value = cfg.get("use_kernels")
    if value is not None and not isinstance(value, bool):
        raise cfg.bad("use_kernels", value, "true or false")
    if not value:
        return None
    cfg.from_pretrained += ("use_kernels",)
    from autotune.workload.hub_kernels import NOTE

    cfg.notes.append(NOTE)
    return True


def _axolotl_model_class(cfg: Config) -> None:
    """``model_type: MambaLMHeadModel`` (examples/mamba/config.yml): Axolotl loads mamba-ssm's own model
    class (loaders/model.py ``ModelLoader._build_model``, its ``MambaLMHeadModel`` branch:
    axolotl.models.mamba's ``fix_mamba_attn_for_loss``), not a transformers one, so the model autotune
    builds is not it. Any other value names a transformers class (an Auto class or the architecture),
    read as the preset's."""
    if cfg.get("model_type") == "MambaLMHeadModel":
        raise cfg.unmodelled("model_type", "MambaLMHeadModel", "Axolotl loads mamba-ssm's own "
                             "MambaLMHeadModel (loaders/model.py), not a transformers model, and its "
                             "selective-scan CUDA kernels are not emulated")


def _axolotl_skip_move_to_device(cfg: Config) -> None:
    """``experimental_skip_move_to_device`` (default true, schemas/model.py): whether the loader moves
    the model to its GPU itself (loaders/model.py _apply_post_lora_load_setup: under ddp only); the
    Trainer, accelerate or the sharding places it before the first step either way."""
    value = cfg.get("experimental_skip_move_to_device")
    if value is None:
        return
    if not isinstance(value, bool):
        raise cfg.bad("experimental_skip_move_to_device", value, "true or false")
    if value is False and cfg.parallel_key is not None:
        raise cfg.unmodelled("experimental_skip_move_to_device", value, "the whole model moved to each GPU "
                             "before it is sharded (loaders/model.py _apply_post_lora_load_setup) is a "
                             "load-time peak autotune does not model; it models the training step")
    cfg.notes.append(f"experimental_skip_move_to_device: {str(value).lower()}: where the model is placed "
                     "as it loads (loaders/model.py _apply_post_lora_load_setup), not the step's memory")


def _axolotl_cut_cross_entropy(cfg: Config, plugins: list[str]) -> bool:
    """Whether CutCrossEntropy runs: with its plugin listed, cut_cross_entropy defaults to true
    (integrations/cut_cross_entropy/args.py), and needs bf16 or fp16 (check_dtype_is_half)."""
    value = cfg.get("cut_cross_entropy")
    if value is not None and not isinstance(value, bool):
        raise cfg.bad("cut_cross_entropy", value, "true or false")
    if CCE_PLUGIN not in plugins:
        return bool(value)
    on = value is not False
    if on and value is None:
        cfg.notes.append("cut_cross_entropy: not set, and with CutCrossEntropyPlugin listed Axolotl's "
                         "default is true")
    if on and not (cfg.data.get("bf16") or cfg.data.get("fp16")):  # check_dtype_is_half, as written
        raise JobFails(f"CutCrossEntropyPlugin in {cfg.file!r} without bf16 or fp16: Axolotl refuses it "
                       "(\"Cut Cross Entropy requires fp16/bf16 training\"); set bf16: true or turn "
                       "cut_cross_entropy off")
    return on


# Axolotl's DDP keys (schemas/config.py), passed to TrainingArguments when set.
_AXOLOTL_DDP = ("ddp_broadcast_buffers", "ddp_find_unused_parameters")
AXOLOTL_FSDP2_NOTE = ("Axolotl prepares FSDP2 itself (monkeypatch/accelerate/fsdp2.py, in place of "
                      "accelerate's fsdp2_prepare_model): no float32 upcast of the trainable parameters, the "
                      "root resharded as every layer, LoRA adapters sharded on their own; modelled so "
                      "(fsdp_recipe axolotl)")


def _axolotl_sharding(cfg: Config) -> None:
    """fsdp_config / fsdp_version (and the deprecated fsdp list), deepspeed and the ddp_* keys, as
    Axolotl reads them: prepare_optim_env (utils/trainer.py) turns FSDP on with fsdp or fsdp_config,
    else DeepSpeed with deepspeed; validation.py check_fsdp_config_kwargs_prefix drops the fsdp_
    prefixes and check_fsdp_version_in_fsdp_config pins an unversioned fsdp_config to FSDP1; the
    builder passes fsdp_config to TrainingArguments too (core/builders/base.py), whose defaults
    fill what it leaves out (reshard_after_forward true, the transformer-based wrap)."""
    fsdp, config, version = cfg.get("fsdp"), cfg.get("fsdp_config"), cfg.get("fsdp_version")
    read_ddp(cfg, _AXOLOTL_DDP)
    if unset(fsdp) and unset(config):
        read_deepspeed(cfg)
        return
    if not unset(cfg.get("deepspeed")):
        raise InvalidInput(f"deepspeed and {'fsdp' if not unset(fsdp) else 'fsdp_config'} in {cfg.file!r}: "
                           "Axolotl runs one of them (validation.py: \"deepspeed and fsdp cannot be used "
                           "together\"); give one")
    key = "fsdp_config" if not unset(config) else "fsdp"
    if config is not None and not isinstance(config, dict):
        raise cfg.bad("fsdp_config", config, "a mapping")
    options = fsdp_options(cfg, config, "fsdp_config", keep=("fsdp_version",))
    inner = options.pop("fsdp_version", None)
    inner = options.pop("version", None) if inner is None else inner
    version = version or inner
    if version is None and key == "fsdp":
        raise cfg.unmodelled(key, cfg.data[key], "the deprecated fsdp list without fsdp_config or "
                             f"fsdp_version: 2 does not take Axolotl's FSDP paths; {FSDP1}: write "
                             "fsdp_version: 2")
    if version is None or str(version) == "1":
        # validation.py check_fsdp_version_in_fsdp_config: an unversioned fsdp_config is FSDP1, which
        # Axolotl leaves to the Trainer (core/builders/base.py passes fsdp_config on) and accelerate
        offload_key = "fsdp_config.cpu_offload"
        if not unset(fsdp):
            if not isinstance(fsdp, list) or not all(isinstance(item, str) for item in fsdp):
                raise cfg.bad("fsdp", fsdp, "a list of FSDP options (full_shard, shard_grad_op, offload, "
                              "auto_wrap)")
            offload_key = "fsdp_config.cpu_offload" if "cpu_offload" in options else "fsdp"
            legacy_fsdp(cfg, fsdp, options, 1)
        _offload(cfg, fsdp, options, offload_key, 1)
        # FSDP1's checkpointing is accelerate's own (setup_fsdp_envs exports FSDP_ACTIVATION_CHECKPOINTING,
        # the builder passes fsdp_config on: the plugin's activation_checkpointing either way), read
        # by read_trainer_fsdp1; Axolotl patches nothing of FSDP1. Its checks are the FSDP2 path's.
        _axolotl_fsdp_checkpointing(cfg, options.get("activation_checkpointing"))
        read_trainer_fsdp1(cfg, "fsdp_config", options, key)
        if version is None:
            cfg.notes.append("fsdp_config without fsdp_version: FSDP1 in Axolotl (validation.py "
                             "check_fsdp_version_in_fsdp_config)")
        return
    if str(version) != "2":
        raise cfg.bad("fsdp_version", version, "1 or 2")
    offload_key = "fsdp_config.cpu_offload"
    if not unset(fsdp):
        if not isinstance(fsdp, list) or not all(isinstance(item, str) for item in fsdp):
            raise cfg.bad("fsdp", fsdp, "a list of FSDP options (full_shard, shard_grad_op, offload, "
                          "auto_wrap)")
        offload_key = "fsdp_config.cpu_offload" if "cpu_offload" in options else "fsdp"  # before the legacy's
        legacy_fsdp(cfg, fsdp, options, 2)  # TrainingArguments(fsdp=the list): transformers reads it
    _offload(cfg, fsdp, options, offload_key, 2)
    checkpointing = _axolotl_fsdp_checkpointing(cfg, options.get("activation_checkpointing"))
    policy = options.get("auto_wrap_policy")
    if policy not in (None, "TRANSFORMER_BASED_WRAP"):
        raise cfg.unmodelled("fsdp_config.auto_wrap_policy", policy, WRAP)
    wrap_classes(cfg, "fsdp_config.transformer_layer_cls_to_wrap",
                 options.get("transformer_layer_cls_to_wrap"))
    reshard = options.get("reshard_after_forward")
    if reshard is not None and not isinstance(reshard, bool):
        raise cfg.bad("fsdp_config.reshard_after_forward", reshard, "true or false")
    reshard = True if reshard is None else reshard  # TrainingArguments' default
    pin_memory(cfg, "fsdp_config", options)
    note_no_effect(cfg, "fsdp_config", options, {"offload_params", "cpu_offload", "activation_checkpointing",
                                                 "auto_wrap_policy", "transformer_layer_cls_to_wrap",
                                                 "reshard_after_forward", "cpu_offload_pin_memory"})
    set_parallel(cfg, key, "fsdp", reshard)
    cfg.launch["fsdp_recipe"] = "axolotl"
    cfg.notes.append(f"fsdp_version: 2: FSDP2 over the job's GPUs, reshard_after_forward "
                     f"{str(reshard).lower()}; {AXOLOTL_FSDP2_NOTE}")
    if checkpointing:
        cfg.launch["fsdp_activation_checkpointing"] = True
        cfg.notes.append(f"fsdp_config.activation_checkpointing: true: {AXOLOTL_FSDP_CHECKPOINTING}")


def _offload(cfg: Config, fsdp: Any, options: dict[str, Any], offload_key: str, version: int) -> None:
    """FSDP's CPU offload in an Axolotl config, either version: fsdp_config.offload_params, which
    utils/trainer.py setup_fsdp_envs exports as FSDP_OFFLOAD_PARAMS for accelerate's plugin to read
    (a cpu_offload left None), or cpu_offload (the fsdp list's offload), which the builder's
    TrainingArguments passes on (_process_fsdp_args); ``offload_key`` names the latter."""
    offloaded = options.get("offload_params")
    if offloaded not in (None, True, False):  # utils/schemas/fsdp.py: bool | None
        raise cfg.bad("fsdp_config.offload_params", offloaded, "true or false")
    if offloaded:
        offload(cfg, "fsdp_config.offload_params", offloaded, options, version)
    elif options.get("cpu_offload"):
        where = "fsdp" if offload_key == "fsdp" and not unset(fsdp) else "fsdp_config.cpu_offload"
        offload(cfg, where, options["cpu_offload"] if where != "fsdp" else fsdp, options, version)


AXOLOTL_FSDP_CHECKPOINTING = (
    "FSDP's activation checkpointing, as an Axolotl job applies it (utils/trainer.py setup_fsdp_envs: "
    "FSDP_ACTIVATION_CHECKPOINTING): accelerate 1.13's fsdp2_apply_ac (Axolotl's pin) wraps the "
    "attention, MLP and norms of each decoder layer in checkpoint_wrapper, then Axolotl's "
    "fsdp2_prepare_model wraps each decoder layer again (apply_activation_checkpointing, non-reentrant); "
    "traced so, nested")


def _axolotl_fsdp_checkpointing(cfg: Config, value: Any) -> bool:
    """fsdp_config.activation_checkpointing: FSDP's own checkpointing, which transformers' Trainer
    refuses beside gradient checkpointing. Axolotl does not choose between them: its validation lets
    both through, it passes fsdp_config to TrainingArguments (core/builders/base.py, whose
    _process_fsdp_args gives accelerate's plugin activation_checkpointing) and gradient_checkpointing
    too (``_configure_gradient_checkpointing``), and AxolotlTrainer's create_accelerator_and_postprocess
    calls transformers': 5.14.1's (Axolotl's pin, pyproject.toml) raises "The activation_checkpointing
    in FSDP config and the gradient_checkpointing in training arg can't be set to True simultaneously"
    as the trainer is built, after the model has loaded."""
    if value is None or value is False:
        return False
    if value is not True:
        raise cfg.bad("fsdp_config.activation_checkpointing", value, "true or false")
    if not unset(cfg.data.get("activation_offloading")):
        raise cfg.unmodelled("fsdp_config.activation_checkpointing", True, "FSDP's activation checkpointing "
                             "with activation_offloading is not modelled")
    if cfg.data.get("gradient_checkpointing") is True:
        raise JobFails(f"fsdp_config.activation_checkpointing: true with gradient_checkpointing: true in "
                       f"{cfg.file!r}: Axolotl runs neither alone, it passes both to transformers' "
                       "Trainer, whose create_accelerator_and_postprocess (transformers 5.14.1, "
                       "Axolotl's pin: trainer.py line 838) raises \"The activation_checkpointing in "
                       "FSDP config and the gradient_checkpointing in training arg can't be set to True "
                       "simultaneously\" once the model has loaded (no Axolotl code turns either off): "
                       "set gradient_checkpointing: false (FSDP's checkpointing, modelled) or drop "
                       "fsdp_config.activation_checkpointing")
    return True


# Processors of audio models (processor_type names the class): their audio tower and audio tokens
# are not modelled (gemma3n's and voxtral's examples train on audio: examples/gemma3n, examples/voxtral).
_AUDIO_PROCESSORS = ("VoxtralProcessor", "Gemma3nProcessor", "Qwen2AudioProcessor", "Qwen2_5OmniProcessor",
                     "WhisperProcessor", "Phi4MultimodalProcessor", "GraniteSpeechProcessor")
AUDIO = "audio inputs (an audio tower and the audio tokens of a row) are not modelled: autotune models images"
MULTIMODAL_NOTE = ("Axolotl trains it as a vision-language model (utils/config/__init__.py normalize_config: "
                   "is_multimodal; loaders/model.py: AutoModelForImageTextToText): task image-text-to-text, "
                   "each batch the processor's chat template over the images and text "
                   "(utils/collators/mm_chat.py MultiModalChatDataCollator), rows padded to the longest and "
                   "not cut to sequence_len; the check is for rows of sequence_len tokens, the images' "
                   "tokens among them")


TEXT_ONLY_NOTE = ("Axolotl loads it whole (loaders/model.py: AutoModelForImageTextToText, its vision "
                  "tower among the weights) and, with no processor_type, batches the text alone with its "
                  "text collators (core/builders/causal.py: MultiModalChatDataCollator only with "
                  "processor_type): a text-only step of the vision-language model, no images in its rows")

RL_TEXT_ONLY_NOTE = ("TRL's trainer calls its forward on input_ids and attention_mask alone (no image column "
                     "in the rows: TRL 1.8 dpo_trainer.py _is_vision_dataset, grpo_trainer.py "
                     "_get_per_token_logps_and_entropies: pixel_values only where given): the language "
                     "model and its head, the vision tower's weights loaded and never run; completions "
                     "generated over the text")


def _vlm_class(cfg: Config) -> bool:
    """``model_type`` naming a vision-language class of transformers (Llama4ForConditionalGeneration):
    loaders/model.py ``_build_model`` loads the model with ``getattr(transformers, model_type)``, an
    image-text-to-text model whatever its base_model's name says."""
    name = cfg.data.get("model_type")
    if not isinstance(name, str):
        return False
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES

    if name not in set(MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES.values()):
        return False
    cfg.notes.append(f"model_type: {name}: Axolotl loads the model with that class (loaders/model.py "
                     "_build_model: getattr(transformers, model_type)), a vision-language model")
    return True


def _axolotl_multimodal(cfg: Config) -> dict[str, Any]:
    """The step's task and images where Axolotl trains a vision-language model: processor_type set,
    or a base_model of a model type in transformers' image-text-to-text mapping (normalize_config's
    is_multimodal; a preset's config says it here). ``image_size`` as processing_strategies.py
    applies it (an int: the image padded to that square, ImageOps.pad; a pair: resized to (width,
    height)); unset, Axolotl takes the processor's size or the vision config's image_size
    (loaders/processor.py, loaders/utils.py), which the fixed-size processors resize to anyway, and
    otherwise leaves each image its size: autotune's default size then (workload/vision.py)."""
    processor = cfg.get("processor_type")
    if processor is not None and not isinstance(processor, str):
        raise cfg.bad("processor_type", processor, "a processor class name")
    if processor in _AUDIO_PROCESSORS:
        raise cfg.unmodelled("processor_type", processor, AUDIO)
    multimodal = not unset(processor) or cfg.data.get("is_multimodal") is True \
        or vlm_preset(cfg.data.get("base_model")) or _vlm_class(cfg)
    image_size, algorithm = cfg.get("image_size"), cfg.get("image_resize_algorithm")
    if not multimodal:
        for key, value in (("image_size", image_size), ("image_resize_algorithm", algorithm)):
            if not unset(value):
                cfg.notes.append(f"{key}: read by Axolotl's multimodal processing only: no effect here")
        return {"task": "causal-lm"}
    if unset(processor):
        # core/builders/causal.py build_collator: MultiModalChatDataCollator only where processor_type
        # is set; else the text collators over the tokenized chats (packed or padded), the model still
        # AutoModelForImageTextToText's with its towers (loaders/model.py _set_auto_model_loader).
        for key in ("image_size", "image_resize_algorithm"):
            if not unset(cfg.get(key)):
                cfg.notes.append(f"{key}: read by Axolotl's multimodal processing only: no effect here")
        cfg.notes.append(f"base_model: a vision-language model without processor_type: {TEXT_ONLY_NOTE}")
        if not unset(cfg.data.get("rl")):
            cfg.notes.append(f"rl: {cfg.data['rl']} over the vision-language model: {RL_TEXT_ONLY_NOTE}")
        return {"task": "image-text-to-text", "images_per_sample": 0}
    if not unset(cfg.data.get("rl")):
        raise cfg.unmodelled("processor_type", processor, f"rl {cfg.data['rl']} over rows with images (the "
                             "vision tower run on the images of each chosen, rejected or generated row): "
                             "autotune models a preference or RL trainer of a vision-language model on rows "
                             "of text alone (no processor_type)")
    if cfg.flag("sample_packing"):
        raise JobFails(f"sample_packing: true with a vision-language model in {cfg.file!r}: Axolotl "
                       "refuses it (MultiModalChatDataCollator: \"Packing is currently not supported.\")")
    cfg.notes.append(f"processor_type: {processor}: {MULTIMODAL_NOTE}")
    found: dict[str, Any] = {"task": "image-text-to-text"}
    if not unset(image_size):
        if isinstance(image_size, bool) or not isinstance(image_size, int | list | tuple):
            raise cfg.bad("image_size", image_size, "an integer (a padded square) or [width, height]")
        if isinstance(image_size, int):
            found["image_size"] = f"{image_size}x{image_size}"
            cfg.notes.append(f"image_size: {image_size}: every image padded to a {image_size}x{image_size} "
                             "square (processing_strategies.py: ImageOps.pad), then given to the processor")
        else:
            if len(image_size) != 2 or not all(isinstance(v, int) and not isinstance(v, bool)
                                               for v in image_size):
                raise cfg.bad("image_size", image_size, "an integer or [width, height]")
            found["image_size"] = f"{image_size[0]}x{image_size[1]}"
            cfg.notes.append(f"image_size: {list(image_size)}: every image resized to {image_size[0]}x"
                             f"{image_size[1]} (width x height; processing_strategies.py), then given to "
                             "the processor")
    if not unset(algorithm):
        cfg.notes.append(f"image_resize_algorithm: {algorithm}: the resampling filter: no effect on memory")
    processor_config = cfg.get("processor_config")
    if not unset(processor_config) and processor_config != cfg.data.get("base_model"):
        raise cfg.unmodelled("processor_config", processor_config, "autotune models the processor of "
                             "base_model's checkpoint (its image sizes and token counts); another processor "
                             "config may resize images differently")
    cfg.notes.append("one image per sample: Axolotl's processing strategy takes the first image of a "
                     "sample's images column (processing_strategies.py: \"Using the first one\"); "
                     "--images-per-sample for chats with more images in their messages")
    return found


def _fused_attn_kernel(cfg: Config) -> bool | None:
    """``fused_attn_kernel: true``: True (what it swaps in depends on the model type: check_patched_model,
    workload/qwen3_fused_attn.py); None where unset or false."""
    if not cfg.flag("fused_attn_kernel"):
        return None
    cfg.notes.append("fused_attn_kernel: true: Axolotl fuses q/k RMSNorm + RoPE into one Triton kernel for "
                     "the model types it patches (loaders/patch_manager.py), emulated for qwen3 and gemma4")
    return True


def _check_kernelized(spec: Any, path: str) -> None:
    """UnmodelledSetting where KernelsPlugin's use_kernels makes transformers' kernelize swap a hub
    kernel not emulated into the model (workload/hub_kernels.py KERNELIZED)."""
    from autotune.workload import hub_kernels

    hub_kernels.check(getattr(spec.config, "model_type", None),
                      f"use_kernels: true in {path!r} (KernelsPlugin sets it: args.py check_use_kernels)")


def check_patched_model(config: TrainingConfig, request: CheckRequest) -> None:
    """InvalidInput where Axolotl patches ``model``'s architecture in a way not modelled, whatever
    the Axolotl ``config`` says: with fused_attn_kernel, the model types whose fused forward is not
    emulated (workload/qwen3_fused_attn.py AXOLOTL_TYPES); nothing for other formats. The fused
    attention and shared-KV side channel Axolotl swaps into gemma4 and gemma4_unified on every GPU run
    (loaders/patch_manager.py _apply_model_specific_patches: patch_gemma4_fused_attn,
    patch_gemma4_unified_fused_attn) are emulated (workload/gemma4_fused_attn.py, swapped in by the
    request's ``axolotl``), qwen3's fused_attn_kernel too (qwen3_fused_attn.py). ``request``: the
    config's with the flags given over it."""
    model = request.step.model
    if config.format != "axolotl" or model is None:
        return
    from autotune.workload import qwen3_fused_attn
    from autotune.workload.models import resolve_model

    try:
        spec = resolve_model(model)
    except InvalidInput:  # an unknown model is refused later, by the check
        return
    model_type = getattr(spec.config, "model_type", None)
    if request.step.fused_attn_kernel and model_type in qwen3_fused_attn.AXOLOTL_TYPES:
        path = next((path for path, fmt in config.files if fmt == "axolotl"), "")
        raise UnmodelledSetting(f"fused_attn_kernel: true in {path!r} is not modelled for {spec.name} (model "
                                f"type {model_type}): Axolotl swaps its attention forward for one with a "
                                "fused q/k RMSNorm + RoPE Triton kernel (loaders/patch_manager.py), emulated "
                                "for qwen3 and gemma4 only")
    path = next((path for path, fmt in config.files if fmt == "axolotl"), "")
    if "Mxfp4Config" in config.from_pretrained and model_type != "gpt_oss":
        raise UnmodelledSetting(f"model_quantization_config: Mxfp4Config in {path!r} is not modelled for "
                                f"{spec.name} (model type {model_type}): transformers' MXFP4 is gpt-oss' "
                                "(integrations/mxfp4.py replace_with_mxfp4_linear swaps GptOssMLP only); "
                                "autotune models it for gpt-oss' MXFP4 checkpoints, dequantized")
    if "use_kernels" in config.from_pretrained:
        from autotune.workload import hub_kernels

        hub_kernels.check(model_type, f"use_kernels: true in {path!r} (Axolotl passes it to from_pretrained, "
                          "loaders/model.py)")
    if REINIT in config.from_pretrained:
        check_reinit_dtype(spec, request.step.dtype, path)
    check_config_class(type(spec.config).__name__, config.from_pretrained, path)
    if request.step.experts_kernel is not None:
        _check_kernelized(spec, path)


def _axolotl_config_overrides(cfg: Config) -> dict[str, Any]:
    """``model_config`` (alias of ``overrides_of_model_config``, schemas/deprecated.py), set on the
    model's config before the model is built (loaders/utils.py load_model_config: setattr on the
    config); checked against the model's config class once the model is known (workload/overrides.py)."""
    import json

    given = [key for key in ("model_config", "overrides_of_model_config") if not unset(cfg.get(key))]
    if not given:
        return {}
    if len(given) > 1:
        raise InvalidInput(f"model_config and overrides_of_model_config in {cfg.file!r}: one is the other's "
                           "alias (schemas/deprecated.py); give one")
    overrides = cfg.data[given[0]]
    if not isinstance(overrides, dict) or not all(isinstance(key, str) for key in overrides):
        raise cfg.bad(given[0], overrides, "a mapping of config attributes to values")
    from autotune.workload.overrides import describe

    cfg.notes.append(f"{given[0]}: {describe(overrides)} set on the model's config before it is built "
                     "(loaders/utils.py load_model_config), the model built and traced with it")
    return {"config_overrides": json.dumps(overrides)}


def _axolotl_unfrozen(cfg: Config, adapter: bool) -> dict[str, Any]:
    """``unfrozen_parameters`` of a full fine-tune: the parameters trained (workload/frozen.py
    freeze_except, as train.py's freeze_layers_except). Under an adapter, patterns that cannot match
    the PEFT model's names are refused with why; others there stay unmodelled."""
    patterns = cfg.get("unfrozen_parameters")
    if unset(patterns):
        return {}
    if adapter:
        _axolotl_unfrozen_under_an_adapter(cfg)
        raise cfg.unmodelled("unfrozen_parameters", patterns, "with an adapter it unfreezes base weights of "
                             "the PEFT model beside the adapters, which is not modelled")
    from autotune.workload.frozen import embeddings_require_grad, parse_unfrozen

    listed = parse_unfrozen(patterns)
    ranged = [pattern for pattern in listed if pattern.endswith("]") and "[" in pattern]
    cfg.notes.append(f"unfrozen_parameters: only the parameters these patterns match from the name's start "
                     f"train, every other one frozen, without gradient or optimizer state (train.py "
                     f"freeze_layers_except: re.match, periods literal): {', '.join(listed)}"
                     + ("; the embeddings' output requires grad (enable_input_require_grads)"
                        if embeddings_require_grad(listed) else ""))
    if ranged:
        cfg.notes.append(f"unfrozen_parameters {', '.join(ranged)}: an index range trains the whole "
                         "parameter, a gradient hook zeroing the rest in place "
                         "(_create_freeze_parameters_hook)")
    return {"unfrozen_parameters": listed}


def _axolotl_mesh(cfg: Config) -> None:
    """Axolotl's ND parallelism (utils/distributed.py ``build_parallelism_config``: accelerate's
    ParallelismConfig over dp_replicate x dp_shard x cp x tp): tensor_parallel_size is transformers'
    tp_plan="auto" on the mesh's tp dim (loaders/model.py ``_build_model``), FSDP2 over the data dims
    (monkeypatch/accelerate/fsdp2.py: ``fsdp_dim_names``); dp_replicate_size > 1 is hybrid sharding,
    read as nodes; a dp_shard_size given fixes the job's GPUs (their product; ParallelismConfig
    refuses another world size), else Axolotl fills dp_shard with the GPUs left (``--gpus``).
    context_parallel_size is the cp dim (axolotl_context.py), FSDP2 sharding over dp_shard x cp.
    Expert parallelism is refused by name."""
    for key, why in _AXOLOTL_PARALLEL.items():
        value = cfg.get(key)
        if value is not None and value != 1:
            raise cfg.unmodelled(key, value, why)
    cp = read_context_parallel(cfg)
    sizes = {}
    for key in ("tensor_parallel_size", "dp_shard_size", "dp_replicate_size"):
        value = cfg.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise cfg.bad(key, value, "a whole number of GPUs")
        sizes[key] = value
    tp, shard, replicate = (sizes[key] or 1 for key in sizes)
    if tp == shard == replicate == cp == 1:
        return
    where = next((key for key in sizes if (sizes[key] or 1) > 1), "dp_shard_size")
    if cfg.launch.get("parallel") != "fsdp" or cfg.launch.get("fsdp_version") == 1:
        raise cfg.unmodelled(where, cfg.data[where], f"{PARALLEL}: the mesh is modelled under FSDP2 "
                             "(fsdp_version: 2) alone")
    if tp > 1:
        cfg.launch["tensor_parallel"] = tp
    if replicate > 1:
        cfg.launch["nodes"] = replicate
    if sizes["dp_shard_size"] is not None:
        cfg.launch["gpus"] = replicate * shard * cp * tp
        cfg.mesh = " x ".join(f"{key} {sizes[key]}" for key in sizes if sizes[key] is not None) + (
            f" x context_parallel_size {cp}" if cp > 1 else "")
    cfg.notes.append(f"device mesh: {replicate} replicate x {sizes['dp_shard_size'] or 'the rest'} FSDP "
                     f"shard x {cp} context parallel x {tp} tensor parallel (Axolotl's "
                     "build_parallelism_config: accelerate's "
                     "ParallelismConfig)" + (", the GPUs their product" if sizes["dp_shard_size"] else ""))


# core/builders/base.py: optimizer muon builds axolotl.contribs.mit.muon's MuonOptimizerFactory, or
# DistMuonOptimizerFactory under a device mesh (FSDP2's), from the axolotl-contribs-mit package.
_AXOLOTL_MUON = ("Axolotl's Muon (core/builders/base.py: axolotl.contribs.mit.muon MuonOptimizerFactory, "
                 "DistMuonOptimizerFactory over FSDP2's device mesh) comes from the axolotl-contribs-mit "
                 "package, which autotune does not model; LLaMA-Factory's Muon (use_muon) is modelled")


def read_axolotl(cfg: Config) -> TrainingConfig:
    unfrozen = _axolotl_unfrozen(cfg, adapter=not unset(cfg.data.get("adapter")))
    overrides = _axolotl_config_overrides(cfg)
    cfg.refuse(_AXOLOTL_REFUSED)
    _axolotl_sharding(cfg)
    _axolotl_mesh(cfg)
    plugins = _axolotl_plugins(cfg)
    experts_kernel = _axolotl_experts_kernel(cfg, plugins)
    use_kernels = _axolotl_use_kernels(cfg, plugins)
    _axolotl_model_quantization(cfg, plugins)
    _axolotl_skip_move_to_device(cfg)
    _axolotl_model_class(cfg)
    experts = None if experts_kernel else cfg.get("experts_implementation")
    if experts is not None and experts != _EXPERTS_DEFAULT:
        raise cfg.unmodelled("experts_implementation", experts, f"autotune traces transformers' default "
                             f"{_EXPERTS_DEFAULT} experts")
    if experts is not None:
        cfg.notes.append(f"experts_implementation: {experts}: transformers' default for mixtures of experts")
    for key in [k for k in cfg.data if k.startswith("unsloth_")]:
        if not unset(cfg.get(key)):
            raise cfg.unmodelled(key, cfg.data[key], KERNEL)
    liger = _axolotl_liger(cfg)
    multimodal = _axolotl_multimodal(cfg)
    method = _axolotl_method(cfg)
    read_callbacks(cfg, method)  # relora, LISA's keys, flash_attn_fuse_mlp (axolotl_callbacks.py)
    read_tiled_mlp(cfg)  # tiled_mlp (axolotl_tiled.py)
    attn, hybrid = read_hybrid_attention(cfg, _axolotl_attention(cfg))
    cce = _axolotl_cut_cross_entropy(cfg, plugins)
    mode, dtype = _axolotl_precision(cfg, attn, adapter=method is not None, cce=cce)
    adapter = None if method is None else _axolotl_adapter(cfg, method, dtype)
    read_loading(cfg, method, dtype)
    if cfg.flag("quantize_moe_experts"):
        adapter = _axolotl_quantized_experts(cfg, adapter)
    _axolotl_saved_nf4(cfg, adapter)
    linearized = _axolotl_linearized_experts(cfg)
    loss = None
    if cce:
        if cfg.data.get("cut_cross_entropy") and cfg.flag("liger_fused_linear_cross_entropy"):
            # schemas/validation.py check_cross_entropy_conflicts, on the keys as written
            raise JobFails(f"cut_cross_entropy and liger_fused_linear_cross_entropy in {cfg.file!r}: "
                           "Axolotl refuses them together (\"Only one cross entropy optimization can "
                           "be enabled at a time\"); keep one")
        loss = "cce"
        cfg.notes.append(f"cut_cross_entropy: {CCE_NOTE}")
    if cfg.flag("liger_fused_linear_cross_entropy"):
        loss = "chunked"
        cfg.notes.append(f"liger_fused_linear_cross_entropy: {CHUNKED_NOTE}")
    loss = read_diffusion(cfg, plugins, attn, loss) or loss  # the DiffusionPlugin's step
    loss = _axolotl_eaft(cfg, loss)
    if cfg.flag("sample_packing"):
        cfg.notes.append(f"sample_packing: {PACKED_NOTE}")
    trainer = _axolotl_trainer(cfg, adapter)
    if trainer.get("trainer") == REWARD:
        multimodal = {**multimodal, "task": REWARD_TASK}
    batch = cfg.positive("micro_batch_size", "batch size")
    accumulation = cfg.positive("gradient_accumulation_steps", "accumulation steps")
    total = cfg.positive("batch_size", "global batch size")
    if accumulation is None and total is not None and batch is not None:
        accumulation = max(total // batch, 1)  # normalize_config: batch_size // micro_batch_size
    if cfg.get("optimizer") == "muon":
        raise cfg.unmodelled("optimizer", "muon", _AXOLOTL_MUON)
    optimizer = read_optimizer(cfg, "optimizer")
    if optimizer is None:
        optimizer = "adamw_torch_fused"  # schemas/training.py: optimizer's default
        cfg.notes.append("optimizer: not set, Axolotl's default adamw_torch_fused")
    note_neftune(cfg, "neftune_noise_alpha")
    note_neftune(cfg, "noisy_embedding_alpha")
    read_compile(cfg, implied=False, auto=True)  # core/builders/base.py _configure_torch_compile
    qat = _axolotl_qat(cfg, adapter)
    fp8 = _axolotl_fp8(cfg)
    prefixes = _AXOLOTL_PREFIXES if adapter is None else tuple(
        p for p in _AXOLOTL_PREFIXES if p not in ("lora_", "peft_"))
    return cfg.result(
        "axolotl", model=cfg.text("base_model"),
        seq_len=cfg.positive("sequence_len", "sequence length"), batch_size=batch, mode=mode,
        accumulation_steps=accumulation or 1, dtype=dtype, optimizer=optimizer, **multimodal,
        attn=attn, loss=loss, adapter=adapter, liger=liger, axolotl=True, qat=qat, fp8=fp8,
        float32_embeddings=True if cfg.float32_embeddings else None,
        fused_attn_kernel=_fused_attn_kernel(cfg), experts_kernel=experts_kernel, use_kernels=use_kernels,
        gemma4_hybrid_attn=hybrid, **trainer, **unfrozen,
        **linearized,
        **overrides,
        ignored=cfg.ignored(_AXOLOTL_NO_EFFECT | _AXOLOTL_ADAPTER_NO_EFFECT, prefixes,
                            modelled=_AXOLOTL_SOMETIMES_READ | set(CONFIG_KEYS.values())),
    )


def _axolotl_eaft(cfg: Config, loss: str | None) -> str | None:
    """``use_eaft: true``: the causal trainer builder's compute_loss_func (core/builders/causal.py:
    monkeypatch/loss/eaft.py eaft_loss with eaft_alpha, eaft_k), the loss axolotl_eaft; ``loss``: the
    loss another key set, returned where use_eaft is off."""
    alpha, k = cfg.get("eaft_alpha"), cfg.get("eaft_k")
    if not cfg.flag("use_eaft"):
        return loss
    if not unset(cfg.data.get("rl")):  # core/builders/rl.py builds the rl trainers: it reads no use_eaft
        cfg.notes.append(f"use_eaft: no effect under rl: {cfg.data['rl']} (only the causal trainer builder "
                         "reads it: core/builders/causal.py)")
        return loss
    if loss is not None or cfg.flag("reward_model"):
        why = ("reward_model: true" if loss is None else "the DiffusionPlugin" if loss == "diffusion"
               else "cut_cross_entropy" if loss == "cce" else "liger_fused_linear_cross_entropy")
        raise cfg.unmodelled("use_eaft", True, f"beside {why}: not modelled")
    if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
        raise cfg.bad("eaft_k", k, "a positive integer")
    if k is not None and k > EAFT_K:
        raise cfg.unmodelled("eaft_k", k, f"the top-k tensors [tokens, k] are traced at Axolotl's default k "
                             f"{EAFT_K} (an upper bound for a smaller k); a larger k is not modelled")
    alpha, k = EAFT_ALPHA if alpha is None else alpha, EAFT_K if k is None else k
    cfg.notes.append(f"use_eaft: true: {EAFT_DESCRIPTION}; eaft_alpha {alpha} (a scalar power), eaft_k {k} "
                     f"(the [tokens, k] top-k tensors, traced at k {EAFT_K})")
    return AXOLOTL_EAFT


def _axolotl_qat(cfg: Config, adapter: Adapter | None) -> str | None:
    """``qat:`` as the request's JSON (workload/qat.py: Axolotl's prepare_model_for_qat, traced through
    torchao), with Axolotl's refusals (schemas/config.py check_qat_config) and its defaults
    (schemas/quantization.py QATConfig); None where unset. An empty mapping is falsy: loaders/model.py
    ``_configure_qat`` runs only ``if self.cfg.qat``."""
    value = cfg.get("qat")
    if unset(value):
        return None
    if not isinstance(value, dict):
        raise cfg.bad("qat", value, "a mapping")
    for key in ("load_in_8bit", "load_in_4bit"):
        if cfg.flag(key):
            raise JobFails(f"qat with {key}: true in {cfg.file!r}: Axolotl refuses it "
                           f"(\"QAT and {key} cannot be used together\")")
    if adapter is not None:
        raise JobFails(f"qat with adapter: {adapter.method} in {cfg.file!r}: Axolotl refuses it "
                       "(\"QAT and PEFT cannot be used together\")")
    fields = {key: item for key, item in value.items() if key != "fake_quant_after_n_steps"}
    try:
        qat = parse_qat(fields)
    except InvalidInput as exc:
        raise exc.within(cfg.file) from exc
    assert qat is not None
    cfg.notes.append(f"qat: {qat.describe()}: every linear (the output head too) fake-quantized by "
                     "torchao's own modules, traced; their quantize-dequantize temporaries and saved "
                     "tensors are in the step")
    after = value.get("fake_quant_after_n_steps")
    if after is not None:
        if isinstance(after, bool) or not isinstance(after, int) or after < 0:
            raise cfg.bad("qat.fake_quant_after_n_steps", after, "a non-negative integer")
        cfg.notes.append(f"qat.fake_quant_after_n_steps: {after}: fake quantization off before step {after} "
                         "(Axolotl's QATCallback), on from it: the step modelled is the one with it on, "
                         "the larger")
    return to_json(qat)


# Axolotl's cli/config.py compute_supports_fp8: a card of compute capability 8.9 or above (Ada, Hopper).
FP8_COMPUTE_CAPABILITY = (8, 9)


def _axolotl_fp8(cfg: Config) -> str | None:
    """``fp8: true`` as the request's JSON (workload/fp8.py): core/trainers/base.py
    ``additional_accelerator_args`` hands accelerate ``AORecipeKwargs(Float8LinearConfig(
    enable_fsdp_float8_all_gather=X, force_recompute_fp8_weight_in_bwd=X))`` (the tensorwise recipe)
    and ``mixed_precision="fp8"``; loaders/patch_manager.py ``_apply_fp8_patches`` keeps routers in high
    precision (``patch_fp8_exclude_moe_router``). None where unset; the all-gather key alone does
    nothing (``_apply_fp8_patches`` runs only ``if self.cfg.fp8``)."""
    gather = cfg.flag("fp8_enable_fsdp_float8_all_gather")
    if not cfg.flag("fp8"):
        return None
    card = cfg.card
    if card is not None and card.compute_capability is not None \
            and card.compute_capability < FP8_COMPUTE_CAPABILITY:
        raise JobFails(f"fp8: true in {cfg.file!r} on {card.name}: Axolotl refuses it (schemas/config.py "
                       "check_fp8: \"fp8 requested, but fp8 is not supported on this GPU\"; compute "
                       "capability 8.9 or above)")
    fp8 = fp8_module.Fp8(enable_fsdp_float8_all_gather=gather, skip_routers=True)
    cfg.notes.append(f"fp8: true: {fp8.describe()}, as Axolotl's additional_accelerator_args hands it to "
                     "accelerate (mixed_precision fp8: bf16 autocast around torchao's Float8Linear)")
    return fp8_module.to_json(fp8)


# Axolotl's flex_attn_compile_kwargs reach torch.compile only through monkeypatch/attention/flex_attn.py
# patch_flex_wrapper, which returns at once off torch 2.6 and whose call is commented out
# (loaders/patch_manager.py apply_pre_model_load_patches): transformers compiles flex_attention itself,
# with torch.compile's defaults (integrations/flex_attention.py WrappedFlexAttention).
FLEX_COMPILE_NOTE = ("flex_attn_compile_kwargs: no effect (Axolotl's patch_flex_wrapper is not called: "
                     "loaders/patch_manager.py); transformers compiles flex_attention with torch.compile's "
                     "defaults")


def _axolotl_attention(cfg: Config) -> str | None:
    # attn_implementation, or the deprecated flags it replaced (schemas/enums.py LEGACY_ATTN_FLAG_TO_IMPL:
    # flex_attention before flash_attention, the specific before the generic).
    attn = read_attention(cfg, "attn_implementation", cfg.get("attn_implementation"))
    for key, name in (("flex_attention", FLEX_ATTENTION), ("flash_attention", "flash_attention_2"),
                      ("sdp_attention", "sdpa"), ("eager_attention", "eager")):
        if cfg.flag(key) and attn is None:
            attn = name
            cfg.notes.append(f"{key}: true: attention {name}")
    if not unset(cfg.get("flex_attn_compile_kwargs")):
        cfg.notes.append(FLEX_COMPILE_NOTE)
    if attn == FLEX_ATTENTION:
        cfg.notes.append("attention flex_attention: torch's FlexAttention as transformers compiles it, its "
                         "Triton kernels' buffers and the per-batch BlockMask emulated "
                         "(workload/flex_attention.py)")
    return attn


UPCAST_NOTE = ("Axolotl's loader keeps the embeddings, the output head and every norm in float32 (loaders/"
               "model.py _configure_embedding_dtypes upcasts them and casts them back only with an adapter, "
               "FSDP, cut_cross_entropy or attn_needs_dtype_cast, false for attn_implementation unset, eager "
               "or sdpa: schemas/enums.py ATTN_IMPLS_WITHOUT_DTYPE_CAST), modelled so (workload/upcast.py): "
               "their float32 gradients and optimizer state, a float32 residual stream under autocast")


def _axolotl_precision(cfg: Config, attn: str | None, adapter: bool, cce: bool) -> tuple[Mode, str]:
    """Mode and weights dtype as Axolotl's resolve_dtype and trainer builder set them (``cce``:
    CutCrossEntropy runs, which keeps the embeddings in the weights' dtype)."""
    bf16, fp16 = _axolotl_auto_bf16(cfg)
    if bf16 is not None and not isinstance(bf16, bool) and bf16 != "full":
        raise cfg.bad("bf16", bf16, "true, false, 'auto' or 'full'")
    bfloat16, float16 = cfg.flag("bfloat16"), cfg.flag("float16")
    ckpt = _axolotl_checkpointing(cfg, adapter)
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
    if dtype != "float32" and attn in (None, "eager", "sdpa") and not cce and not adapter:
        # loaders/model.py _configure_embedding_dtypes: embed_tokens, lm_head and norms are upcast to
        # float32 and cast back to the weights dtype only for an attention other than eager and sdpa
        # (attn_needs_dtype_cast: schemas/enums.py ATTN_IMPLS_WITHOUT_DTYPE_CAST; false when unset), or
        # with an adapter (needs_fa2_dtype), FSDP or cut_cross_entropy.
        key = "bf16" if bf16 else "bfloat16" if bfloat16 else "float16"
        cfg.float32_embeddings = _axolotl_upcast(cfg, attn, dtype, key)
    return Mode(precision, ckpt), dtype  # type: ignore[arg-type]


def _axolotl_upcast(cfg: Config, attn: str | None, dtype: str, key: str) -> bool:
    """Whether the 16-bit full fine-tune with eager or sdpa attention keeps Axolotl's float32 embeddings,
    output head and norms (workload/upcast.py): not under FSDP, whose loader skips the upcast
    (``is_fsdp_enabled``: fsdp or fsdp_config set), nor under DeepSpeed ZeRO-1/2, whose engine casts every
    parameter back to 16 bits; ZeRO-3's partitioned parameters are refused (``key``: the key that set
    the 16-bit weights)."""
    what = f"attention {attn or 'sdpa (default)'}"
    if not unset(cfg.data.get("fsdp")) or not unset(cfg.data.get("fsdp_config")):
        cfg.notes.append(f"{what} under FSDP: Axolotl's loader skips the float32 upcast of the embeddings "
                         "and norms there (loaders/model.py _configure_embedding_dtypes: not "
                         f"is_fsdp_enabled), and casts them to {dtype}: every weight in {dtype}")
        return False
    if not unset(cfg.data.get("deepspeed")) and cfg.launch.get("parallel") in ("zero1", "zero2"):
        cfg.notes.append(f"{what} under DeepSpeed ZeRO-1/2: Axolotl's loader upcasts the embeddings, "
                         "lm_head and norms to float32 (loaders/model.py _configure_embedding_dtypes), and "
                         f"DeepSpeed's engine casts every parameter to {dtype} again (runtime/engine.py "
                         f"_configure_distributed_model, _cast_module_mixed_precision): every weight in "
                         f"{dtype}")
        return False
    if not unset(cfg.data.get("deepspeed")):
        raise cfg.unmodelled(key, cfg.data.get(key, "auto (not set)"), f"with {what} under DeepSpeed "
                             "ZeRO-3: "
                             "Axolotl's loader upcasts the embeddings, lm_head and norms to float32 (loaders/"
                             "model.py _configure_embedding_dtypes) after zero.Init partitioned them, and "
                             "DeepSpeed's engine casts no zero.Init parameter back (runtime/engine.py "
                             "_cast_module_mixed_precision): not modelled (set attn_implementation: "
                             "flash_attention_2)")
    cfg.notes.append(f"{what} with {dtype} weights: {UPCAST_NOTE}")
    return True


def _offloading(cfg: Config, offload: Any, ckpt: bool, adapter: bool) -> bool:
    """``activation_offloading: true``: TRL's OffloadActivations around each training step, with
    streams (core/trainers/mixins/activation_checkpointing.py ActivationOffloadingMixin; emulated,
    workload/offload.py). The Trainer's gradient checkpointing is turned off (core/builders/base.py
    _configure_gradient_checkpointing), but the layers are checkpointed all the same: a LoRA/QLoRA
    model by the loader itself (loaders/model.py: ``gradient_checkpointing_enable`` with
    gradient_checkpointing_kwargs, ``{use_reentrant: True}`` when unset by normalize_config), a full
    fine-tune's decoder layers in torch's non-reentrant checkpoint_wrapper (loaders/model.py
    _apply_activation_checkpointing, ac_wrap_hf_model), the same torch.utils.checkpoint call per
    layer as transformers' non-reentrant checkpointing. Whether the modes checkpoint: always."""
    # ActivationOffloadingMixin: use_streams = activation_offloading != "legacy" (a full fine-tune's
    # legacy: modelled); with an adapter and gradient_checkpointing, patch_manager.py also swaps
    # transformers' checkpoint for hf_grad_checkpoint_offload_wrapper (CPU_Offloaded_Gradient_Checkpointer)
    legacy = offload == "legacy" and not adapter
    if offload is not True and not legacy:
        why = {"legacy": "with an adapter, each checkpointed layer's input offloaded by Axolotl's "
                         "CPU_Offloaded_Gradient_Checkpointer (monkeypatch/gradient_checkpointing.py) beside "
                         "TRL's OffloadActivations without streams is not modelled; a full fine-tune's is",
               "disk": "activations written to files on disk are not modelled",
               "hidden_states": "offloading the checkpointed hidden states alone is not modelled"}
        if offload in why:
            raise cfg.unmodelled("activation_offloading", offload, why[offload] + "; true is")
        raise cfg.bad("activation_offloading", offload, "true, false, 'legacy', 'disk' or 'hidden_states'")
    if not ckpt:  # schemas/validation.py check_activation_offloading_wo_gc
        shown = "legacy" if legacy else "true"
        raise JobFails(f"activation_offloading: {shown} without gradient_checkpointing in {cfg.file!r}: "
                       "Axolotl refuses it (\"activation_offloading requires gradient_checkpointing\")")
    cfg.offload_activations = True
    if adapter:
        cfg.notes.append("activation_offloading: true: TRL's OffloadActivations around each step (the saved "
                         "activations, the checkpointed layers' inputs among them, to the host), and the "
                         "layers checkpointed by Axolotl's loader (gradient_checkpointing_enable)")
        checkpoint_kwargs(cfg, "gradient_checkpointing_kwargs", unset={"use_reentrant": True})
        return True
    cfg.get("gradient_checkpointing_kwargs")  # the Trainer's checkpointing is off: unused
    if legacy:
        cfg.offload_streams = False
        cfg.notes.append("activation_offloading: legacy: TRL's OffloadActivations without streams "
                         "(use_streams=False, ActivationOffloadingMixin: each saved activation copied to the "
                         "host on the compute stream, none stashed, a storage saved twice copied twice), and "
                         "every decoder layer in torch's non-reentrant checkpoint_wrapper (ac_wrap_hf_model)")
        return True
    cfg.notes.append("activation_offloading: true: TRL's OffloadActivations around each step, and every "
                     "decoder layer in torch's non-reentrant checkpoint_wrapper (ac_wrap_hf_model): the "
                     "layers' inputs go to the host")
    return True


def _axolotl_unfrozen_under_an_adapter(cfg: Config) -> None:
    """``unfrozen_parameters`` with an adapter whose patterns match none of the PEFT model's names: a
    refusal that says why. train.py calls ``freeze_layers_except`` on the model the loader returns, the
    PEFT model, whose parameter names begin ``base_model.model.``; it freezes every parameter and
    unfreezes those a pattern matches from the name's start (utils/freeze.py ``LayerNamePattern.match``:
    ``re.match``, periods literal). A pattern whose literal beginning is not a beginning of
    ``base_model.model.`` matches nothing: with all of them so, the adapters are frozen too and the job
    trains nothing; Axolotl warns and runs that step, which autotune refuses to answer for rather than
    size a job that trains nothing. (A pattern that may match stays refused as unmodelled.)"""
    import re

    patterns = cfg.data.get("unfrozen_parameters")
    if not patterns or unset(cfg.data.get("adapter")):
        return
    names = [patterns] if isinstance(patterns, str) else list(patterns)
    prefix = "base_model.model."
    for pattern in names:
        literal = re.match(r"\^?([A-Za-z0-9_.]*)(.?)", str(pattern))
        start, after = (literal.group(1), literal.group(2)) if literal else ("", "")
        if after in ("*", "?", "{", "+"):  # a quantifier makes the last character optional
            start = start[:-1]
        if not start or start.startswith(prefix) or prefix.startswith(start):
            return
    raise JobFails(f"unfrozen_parameters {patterns!r} in {cfg.file!r} match no parameter: with an "
                   "adapter Axolotl unfreezes what they match in the PEFT model's names, which all begin "
                   "base_model.model. (train.py freeze_layers_except, matched from the name's start), so "
                   "every parameter is frozen, the adapters too, and the job trains nothing (Axolotl "
                   "only warns, utils/freeze.py: \"All parameters are frozen. Model will not be "
                   "trained.\", and runs on; its maintainers: \"unfreezing parameters while doing LoRAs "
                   "is not supported\", axolotl#1188); begin the patterns with base_model.model., or "
                   "remove them")


def _axolotl_auto_bf16(cfg: Config) -> tuple[Any, bool]:
    """bf16 and fp16 as Axolotl's resolve_dtype (utils/config/__init__.py) leaves them: ``bf16: auto``
    is true on a card with bfloat16 (is_torch_bf16_gpu_available: Ampere and newer), else false with
    fp16 true unless fp16 or float16 is set; with fp16: true it is false."""
    bf16, fp16 = cfg.get("bf16"), cfg.flag("fp16")
    if "bf16" not in cfg.data:  # the schema's default (utils/schemas/config.py AxolotlInputConfig.bf16)
        bf16 = "auto"
        cfg.notes.append("bf16: not set: Axolotl's default auto (utils/schemas/config.py)")
    if bf16 != "auto":
        return bf16, fp16
    if fp16:
        cfg.notes.append("bf16: auto with fp16: true: bf16 off (Axolotl's resolve_dtype)")
        return False, True
    if cfg.card is None:
        raise cfg.unmodelled("bf16", bf16, "it depends on the card (Axolotl's resolve_dtype: true where "
                             "bfloat16 is supported, Ampere and newer, else false with fp16: true): name "
                             "the card (--gpu), or write bf16: true or bf16: false")
    if cfg.card.supports_bf16:
        cfg.notes.append(f"bf16: auto: true on {cfg.card.name}, which has bfloat16 (Axolotl's resolve_dtype)")
        return True, False
    fp16 = cfg.data.get("fp16") is None and not cfg.flag("float16")
    cfg.notes.append(f"bf16: auto: false on {cfg.card.name}, which has no bfloat16 (Axolotl's resolve_dtype)"
                     + ("; fp16: true in its place" if fp16 else ""))
    return False, fp16


def _axolotl_checkpointing(cfg: Config, adapter: bool) -> bool:
    """Whether the modes checkpoint; with ``activation_offloading: true`` (or ``gradient_checkpointing:
    offload``) TRL's OffloadActivations runs around each step, as Axolotl sets it up (``_offloading``)."""
    ckpt = cfg.get("gradient_checkpointing")
    offload = cfg.get("activation_offloading")
    if ckpt == "offload":  # schemas/validation.py check_gradient_checkpointing_w_offload
        cfg.notes.append("gradient_checkpointing: offload: Axolotl reads it as gradient_checkpointing: true "
                         "with activation_offloading: true (check_gradient_checkpointing_w_offload)")
        ckpt, offload = True, True
    elif ckpt == "offload_disk":
        raise cfg.unmodelled("gradient_checkpointing", ckpt, "Axolotl reads it as activation_offloading: "
                             "disk, whose activations go to files on disk: not modelled")
    if ckpt is not None and not isinstance(ckpt, bool):
        raise cfg.bad("gradient_checkpointing", ckpt, "true, false, 'offload' or 'offload_disk'")
    if offload not in (None, False):
        return _offloading(cfg, offload, bool(ckpt), adapter)
    if ckpt:
        # normalize_config sets gradient_checkpointing_kwargs to {use_reentrant: True} when unset,
        # unless unfrozen_parameters or rl (utils/config/__init__.py): then transformers' default,
        # use_reentrant=False; schemas/validation.py check_use_reentrant_mismatch refuses
        # use_reentrant true with unfrozen_parameters.
        rl = not unset(cfg.data.get("rl"))
        unfrozen = not unset(cfg.data.get("unfrozen_parameters"))
        reentrant = checkpoint_kwargs(cfg, "gradient_checkpointing_kwargs",
                                      unset=None if rl or unfrozen else {"use_reentrant": True})
        kwargs = cfg.data.get("gradient_checkpointing_kwargs")
        if reentrant and unfrozen and isinstance(kwargs, dict) and kwargs.get("use_reentrant") is True:
            raise JobFails(f"gradient_checkpointing_kwargs use_reentrant: true with unfrozen_parameters "
                           f"in {cfg.file!r}: Axolotl refuses it (check_use_reentrant_mismatch: "
                           "\"`use_reentrant` must be false when used with partially frozen model.\")")
    return bool(ckpt)



# Axolotl's rl trainers (utils/schemas/enums.py RLType; core/builders/rl.py _get_trainer_cls): ipo is
# DPOTrainer with loss_type ipo (core/trainers/dpo DPOStrategy), simpo TRL's CPOTrainer, kto TRL's
# KTOTrainer (core/trainers/trl.py AxolotlKTOTrainer).
_RL_TRAINERS = {"dpo": DPO, "ipo": DPO, "orpo": ORPO, "simpo": SIMPO, "kto": KTO}
# ebft/strided.py AxolotlStridedEBFTTrainer.compute_loss, not yet modelled: rows = batch x
# n_samples_per_prompt grow by generate_max_len x num_blocks tokens (num_blocks = (seq_len -
# generate_max_len - anchor_offset) // stride + 1, anchor_offset from the batch's longest prompt) under
# no_grad, each step a full-logits forward with an eager [rows, 1, S, S] mask; on a GPU the training
# forward runs flex_attention on create_strided_block_mask (torch.compile's Triton kernels, __init__:
# use_flex_attention = torch.cuda.is_available()), one backbone forward per row, every row's graph held
# for the one backward (per_token_logps_list); then the feature network under no_grad.
STRIDED_EBFT = ("EBFT's strided mode (AxolotlStridedEBFTTrainer, ebft/strided.py compute_loss: strided "
                "block-parallel generation under no_grad with eager dense [rows, 1, S, S] masks, then on a "
                "GPU a flex_attention training forward on a compiled strided block mask, whose Triton "
                "kernels are not emulated, one backbone forward per row with every row's graph held for "
                "one backward)")
# rl: ebft's keys (utils/schemas/config.py ``ebft``; core/trainers/ebft/args.py EBFTFieldsMixin,
# AxolotlStridedEBFTConfig), those refused where they change memory; the rest change no tensor of
# the structured mode (trainer.py: coefficients of [rows] rewards; adaptive_max_tokens only shortens
# vLLM's completions; ce_coef, rl_coef, advantage_estimator and the generation keys are the strided
# mode's).
_EBFT_REFUSED = {
    "mode": (lambda v: v not in (None, "structured"), STRIDED_EBFT),
    "feature_layers": (lambda v: v is not None and len(v) != len(EBFT_FEATURE_LAYERS),
                       f"feature layers other than {len(EBFT_FEATURE_LAYERS)} (the concatenated features' "
                       "width)"),
    "embed_method": (lambda v: v not in (None, "last_token", "concat"), "a pooling over every position "
                     "(rewards.py apply_embed_method: a float32 [rows, tokens, features] product)"),
    "use_whitening": (lambda v: v is True, "SVD whitening (whiten_embeddings_batched: a float32 "
                      "[features, features] matrix per prompt)"),
}
# Not a data-loading thread: core/trainers/grpo/async_trainer.py AsyncGRPOTrainer (EBFT's
# AxolotlAsyncEBFTTrainer over it, ebft/__init__.py get_trainer_class) runs ``produce`` in a
# ThreadPoolExecutor, "vLLM generation + reward computation" (_prepare_inputs_data_producer's
# docstring), on the GPU beside the training step, then a deferred scoring forward of the policy's
# log-probs and ``prefetch_depth`` rollouts queued ahead.
ASYNC_GRPO = ("Axolotl's asynchronous GRPO (AxolotlAsyncGRPOTrainer / AxolotlAsyncEBFTTrainer, "
              "grpo/async_trainer.py): a background thread generates and computes the rewards (EBFT's "
              "feature-network forward) on the GPU while the training step runs, then a deferred forward "
              "scores the policy's log-probs; not a data-loading thread, and not modelled")
# rl: grpo's trl: keys (utils/schemas/trl.py TRLConfig; core/trainers/grpo/__init__.py
# set_training_args_kwargs passes them to TRL's GRPOConfig) read as the request's, those refused.
_GRPO_TRL_READ = ("beta", "max_completion_length", "num_generations", "use_vllm", "vllm_mode",
                  "generation_batch_size")
_GRPO_TRL_REFUSED = {
    "num_iterations": (lambda v: v not in (None, 1), "several iterations per generation"),
    "use_liger_loss": (lambda v: v is True, "Liger's fused GRPO loss"),
    "vllm_enable_sleep_mode": (lambda v: v is True, "vLLM's sleep mode"),
    "use_data_producer": (lambda v: v is True, ASYNC_GRPO),
    "async_prefetch": (lambda v: v is True, ASYNC_GRPO),
    "sync_ref_model": (lambda v: v is True, "a reference synchronized with the policy"),
    "vllm_importance_sampling_correction": (lambda v: v is False, "vLLM's completions without the old "
                                            "log-probs (TRL's default true is modelled)"),
}
# Keys of the rl trainers (utils/schemas/config.py), and those with no effect on memory.
_RL_KEYS = words("rl_beta dpo_use_weighting dpo_label_smoothing precompute_ref_log_probs "
                 "dpo_use_liger_kernel dpo_padding_free dpo_loss_type dpo_loss_weights orpo_alpha "
                 "simpo_gamma cpo_alpha rpo_alpha max_prompt_len trl kto_desirable_weight "
                 "kto_undesirable_weight")
_RL_NO_EFFECT = words("rl_beta dpo_label_smoothing dpo_loss_weights orpo_alpha simpo_gamma max_prompt_len "
                      "kto_desirable_weight kto_undesirable_weight")


def _axolotl_trainer(cfg: Config, adapter: Adapter | None) -> dict[str, Any]:
    """The request's trainer fields of ``rl`` / ``reward_model`` (none for supervised fine-tuning), the
    rl keys that change memory and are not modelled refused by name."""
    rl, reward = cfg.get("rl"), cfg.flag("reward_model")
    set_keys = sorted(key for key in _RL_KEYS if cfg.data.get(key) is not None)
    cfg.read.update(("rl", "reward_model", "num_labels", "center_rewards_coefficient", *_RL_KEYS))
    if cfg.data.get("ebft") is not None and (unset(rl) or str(rl).strip().lower() != EBFT):
        cfg.read.add("ebft")
        cfg.notes.append(f"ebft: read by rl: ebft alone (core/builders/rl.py EBFTStrategy; its dataset "
                         f"strategy's mask_thinking_ce, prompt_strategies/ebft): no effect under "
                         f"{'supervised fine-tuning' if unset(rl) else f'rl: {rl}'}")
    if reward:
        if not unset(rl):
            raise InvalidInput(f"rl and reward_model in {cfg.file!r}: Axolotl trains one of them; give one")
        if cfg.get("num_labels") not in (None, 1):
            raise cfg.unmodelled("num_labels", cfg.data["num_labels"], "a reward model has one score "
                                 "(num_labels 1, TRL's RewardTrainer)")
        cfg.notes.append("reward_model: true: TRL's RewardTrainer (AxolotlRewardTrainer), a sequence "
                         "classifier with num_labels 1 on chosen and rejected rows: the batch is pairs")
        return {"trainer": REWARD}
    if unset(rl):
        if set_keys:
            raise cfg.unmodelled(set_keys[0], cfg.data[set_keys[0]], "an rl trainer's key without rl")
        return {}
    name = str(rl).strip().lower()
    if name in (GRPO, "gdpo"):
        return _axolotl_grpo(cfg, name)
    if name == EBFT:
        return _axolotl_ebft(cfg, adapter)
    if name not in _RL_TRAINERS:
        raise cfg.unmodelled("rl", rl, f"autotune models rl {', '.join(_RL_TRAINERS)}")
    trainer = _RL_TRAINERS[name]
    if trainer == SIMPO and adapter is None:
        raise cfg.unmodelled("rl", rl, "a full fine-tune under rl simpo: Axolotl loads a reference model "
                             "(train.py setup_reference_model, every rl but orpo) that CPOTrainer never uses")
    refused = {"dpo_use_weighting": (True, "WPO's weights over the logits"),
               "dpo_use_liger_kernel": (True, "Liger's fused DPO loss"),
               "rpo_alpha": (None, "RPO's NLL over the chosen logits")}
    for key, (value, why) in refused.items():
        given = cfg.data.get(key)
        if given is not None and (value is None or given == value):
            raise cfg.unmodelled(key, given, why)
    trl = cfg.get("trl")
    if isinstance(trl, dict) and set(trl) - {"beta"}:
        key = sorted(set(trl) - {"beta"})[0]
        raise cfg.unmodelled(f"trl.{key}", trl[key], f"rl {name}: autotune reads trl.beta only")
    losses = cfg.get("dpo_loss_type") or []
    for loss in losses if isinstance(losses, list) else [losses]:
        if loss not in DPO_LOSS_TYPES:
            raise cfg.unmodelled("dpo_loss_type", loss, f"the losses on [batch] vectors are modelled "
                                 f"({', '.join(DPO_LOSS_TYPES)})")
    fields: dict[str, Any] = {"trainer": trainer}
    if cfg.flag("precompute_ref_log_probs") and trainer == KTO:
        # core/builders/rl.py passes it to DPOConfig alone (DPOStrategy.set_training_args_kwargs)
        cfg.notes.append("precompute_ref_log_probs: Axolotl passes it to DPO alone (DPOStrategy); KTOTrainer "
                         "runs its reference forward in every step")
    elif cfg.flag("precompute_ref_log_probs"):
        if trainer != DPO:
            raise cfg.unmodelled("precompute_ref_log_probs", True, f"rl {name} has no reference model")
        fields["precompute_ref_log_probs"] = True
    alpha = cfg.get("cpo_alpha")
    if trainer == SIMPO and isinstance(alpha, int | float) and alpha == 0:
        fields["chosen_nll"] = False
    what = {DPO: "DPOTrainer" + (" (loss_type ipo)" if name == "ipo" else ""), ORPO: "ORPOTrainer",
            SIMPO: "CPOTrainer (loss_type simpo)", KTO: "KTOTrainer"}[trainer]
    reference = ("" if trainer != DPO else "; reference: the base with the adapter disabled "
                 "(setup_reference_model: none with an adapter)" if adapter is not None
                 else "; reference: the model loaded again, frozen (setup_reference_model)")
    cfg.notes.append(_axolotl_kto_words(adapter is not None) if trainer == KTO else
                     f"rl: {name}: TRL's {what}, sequence_len its max_length; the batch is pairs{reference}")
    if cfg.flag("dpo_padding_free"):
        cfg.notes.append("dpo_padding_free: DPOTrainer falls back to padding ('padding_free=True is "
                         "temporarily unavailable'): rows padded to sequence_len")
    note_set_keys(cfg, _RL_NO_EFFECT, "the trainer's")
    return fields


def _axolotl_kto_words(adapter: bool) -> str:
    """What ``rl: kto`` runs (core/builders/rl.py: AxolotlKTOTrainer given the model alone, KTOConfig with
    max_length = sequence_len and TRL's default loss_type kto; loaders/model.py _load_adapters hands
    KTO the LoRA config, not a PEFT model)."""
    reference = ("the base with the adapter disabled (KTOTrainer applies the peft_config Axolotl passes)"
                 if adapter else "a frozen copy KTOTrainer loads itself (create_model_from_path: Axolotl's "
                 "setup_reference_model copy is not passed to KTO, and is freed once the trainer is built)")
    return ("rl: kto: TRL's KTOTrainer, sequence_len its max_length; the batch is examples (a prompt + "
            "completion, desirable or undesirable), 1 row each, with a KL batch of mismatched completions "
            f"(loss_type kto) under no_grad; reference: {reference}")


def _axolotl_grpo(cfg: Config, name: str = GRPO, own_trainer: bool = True) -> dict[str, Any]:
    """``rl: grpo``: TRL's GRPOTrainer (AxolotlGRPOTrainer) with GRPOConfig built from ``trl:`` and
    ``vllm:`` (core/trainers/grpo/__init__.py set_training_args_kwargs: a colocated engine's
    vllm_gpu_memory_utilization is ``vllm.gpu_memory_utilization``, Axolotl's default 0.9, when
    ``trl.vllm_mode`` says colocate; unset, Axolotl's schema makes it server: validation.py
    check_vllm_mode_set);
    ``sequence_len`` is the row, ``micro_batch_size`` the completions of a step. ``rl: gdpo`` is the
    same trainer (core/builders/rl.py: ``cfg.rl in {RLType.GRPO, RLType.GDPO}`` picks GRPOStrategy's
    class and arguments) with ``multi_objective_aggregation`` normalize_then_sum: each reward function
    normalized over its group before the sum (grpo_trainer.py ``_generate_and_score_completions``), on
    [completions, reward functions] tensors. ``own_trainer`` False: ``rl: ebft`` reads the same ``trl:``
    keys for its GRPOConfig and says its own notes and defaults (_axolotl_ebft)."""
    trl = _section(cfg, "trl", "a mapping of GRPOConfig keys", _GRPO_TRL_REFUSED)
    fields: dict[str, Any] = {"trainer": GRPO}
    for key in ("num_generations", "max_completion_length"):
        if trl.get(key) is not None:
            fields[key] = trl[key]
    if own_trainer and trl.get("max_completion_length") is None:
        # grpo/__init__.py set_training_args_kwargs passes trl.max_completion_length, None where unset,
        # to GRPOConfig (not its default): generate's max_new_tokens None (the checkpoint's
        # generation_config max_length), vLLM's max_tokens None (up to max_model_len)
        raise cfg.unmodelled("trl.max_completion_length", None,
                             f"Axolotl's rl {name} passes None to GRPOConfig (core/trainers/grpo/__init__.py "
                             "set_training_args_kwargs), so the completions' length is the generation's own "
                             "limit, not GRPOConfig's default: set trl.max_completion_length")
    beta = trl.get("beta") if trl.get("beta") is not None else cfg.get("rl_beta")
    if beta is not None:
        fields["beta"] = beta
    if trl.get("use_vllm"):
        fields["use_vllm"] = True
        # unset: Axolotl's schema sets it to server before any trainer reads it (utils/schemas/
        # validation.py GRPOVllmValidationMixin.check_vllm_mode_set), not GRPOConfig's colocate
        fields["vllm_mode"] = trl.get("vllm_mode") or "server"
        if trl.get("vllm_mode") is None:
            cfg.notes.append("trl.vllm_mode: not set: Axolotl sets it to server (utils/schemas/validation.py "
                             "check_vllm_mode_set: \"using default value `server`\"), not GRPOConfig's "
                             "colocate: the vLLM engine on other GPUs (axolotl vllm-serve), nothing of it "
                             "on this one")
        if fields["vllm_mode"] == "colocate":
            vllm = cfg.get("vllm") or {}
            share = vllm.get("gpu_memory_utilization") if isinstance(vllm, dict) else None
            fields["vllm_gpu_memory_utilization"] = 0.9 if share is None else share
            if (vllm.get("tensor_parallel_size") or 1) != 1 if isinstance(vllm, dict) else False:
                raise cfg.unmodelled("vllm.tensor_parallel_size", vllm["tensor_parallel_size"],
                                     "a vLLM engine sharded over GPUs")
    generation = trl.get("generation_batch_size")
    batch = cfg.positive("micro_batch_size") or 1
    if generation is not None:
        if not isinstance(generation, int) or generation % batch:
            raise cfg.bad("trl.generation_batch_size", generation, f"a multiple of micro_batch_size {batch}")
        fields["steps_per_generation"] = generation // batch
    elif (cfg.positive("gradient_accumulation_steps") or 1) > 1:
        fields["steps_per_generation"] = cfg.positive("gradient_accumulation_steps")
    cfg.read.update(("trl", "vllm", "rl_beta"))
    generation_words = ("model.generate (KV cache, emulated decode loop)" if "vllm_mode" not in fields
                        else f"vLLM {fields['vllm_mode']}")
    gdpo = ("" if name == GRPO else " with multi_objective_aggregation normalize_then_sum (GDPO: the "
            "rewards normalized per function, [completions, functions] tensors)")
    if name != GRPO and trl.get("multi_objective_aggregation") == "sum_then_normalize":
        raise JobFails(f"rl: gdpo with trl.multi_objective_aggregation sum_then_normalize in "
                       f"{cfg.file!r}: Axolotl refuses it (validation.py check_gdpo: that is GRPO)")
    given = sorted(key for key in ("generation_kwargs", "chat_template_kwargs") if trl.get(key))
    if own_trainer and given:  # (rl: ebft passes them)
        cfg.notes.append(f"{', '.join(f'trl.{key}' for key in given)}: Axolotl's rl {name} does not pass "
                         "it to GRPOConfig (core/trainers/grpo/__init__.py set_training_args_kwargs): no "
                         "effect")
    if own_trainer:
        cfg.notes.append(f"rl: {name}: TRL's GRPOTrainer{gdpo}; micro_batch_size counts completions, "
                         "sequence_len is a row (prompt + trl.max_completion_length); generation: "
                         f"{generation_words}")
    return fields


def _section(cfg: Config, name: str, allowed: str,
             refused: dict[str, tuple[Callable[[Any], bool], str]]) -> dict[str, Any]:
    """The mapping under ``name`` (empty where unset), its keys that change memory and are not
    modelled (``refused``: key -> (whether a value changes it, why)) refused as ``name.key``."""
    section = cfg.get(name) or {}
    if not isinstance(section, dict):
        raise cfg.bad(name, section, allowed)
    for key, (changes, why) in refused.items():
        if changes(section.get(key)):
            raise cfg.unmodelled(f"{name}.{key}", section[key], why)
    return section


def _axolotl_ebft(cfg: Config, adapter: Adapter | None) -> dict[str, Any]:
    """``rl: ebft`` in its structured mode: Axolotl's AxolotlEBFTTrainer, GRPO's step (``trl:`` and
    ``vllm:`` read as rl grpo's: ebft/__init__.py set_training_args_kwargs passes the same GRPOConfig
    keys) with a feature network as its reward (workload/ebft.py); ``ebft:`` keys that change memory
    and are not modelled refused by name."""
    _section(cfg, "ebft", "a mapping of EBFT's keys", _EBFT_REFUSED)
    trl = cfg.get("trl") or {}
    beta = trl.get("beta") if isinstance(trl, dict) and trl.get("beta") is not None else cfg.get("rl_beta")
    if beta:  # train.py setup_reference_model loads one; TRL's GRPOTrainer makes its own for beta != 0
        raise cfg.unmodelled("trl.beta" if isinstance(trl, dict) and trl.get("beta") else "rl_beta", beta,
                             "GRPO's reference model beside EBFT's feature network")
    fields = {**_axolotl_grpo(cfg, own_trainer=False), "trainer": EBFT}
    if "max_completion_length" not in fields:  # ebft/__init__.py passes it only where set
        fields["max_completion_length"] = EBFT_MAX_COMPLETION_LENGTH
        cfg.notes.append(f"trl.max_completion_length: not set: GRPOConfig's default in TRL 1.8.0, Axolotl's "
                         f"pin, {EBFT_MAX_COMPLETION_LENGTH} tokens (ebft/__init__.py passes it only where "
                         "set; TRL main's is 512)")
    if isinstance(trl, dict):  # ebft/__init__.py set_training_args_kwargs passes both to GRPOConfig
        completion = fields["max_completion_length"]
        read_generation_kwargs(cfg, "trl.generation_kwargs", trl.get("generation_kwargs"), completion)
        read_chat_template_kwargs(cfg, "trl.chat_template_kwargs", trl.get("chat_template_kwargs"))
    cfg.read.add("ebft")
    network = ("the policy with its adapter disabled (disable_adapter)" if adapter is not None else
               "a frozen deepcopy of the policy")
    cfg.notes.append("rl: ebft: Axolotl's AxolotlEBFTTrainer (structured mode, over TRL's GRPOTrainer); "
                     "micro_batch_size counts completions, sequence_len is a row (prompt + "
                     f"trl.max_completion_length); reward: the feature network, {network}, forward under "
                     "no_grad over the generation batch and one ground-truth row per prompt (modelled "
                     "sequence_len long; multi-turn rollouts and longer ground truths are not)")
    return fields
