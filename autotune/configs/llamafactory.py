"""LLaMA-Factory's training YAML, read whole, with LLaMA-Factory's defaults where a key is absent.

A LLaMA-Factory YAML is one flat mapping of the fields of its argument dataclasses
(src/llamafactory/hparams/: model_args.py, data_args.py, finetuning_args.py, training_args.py,
generating_args.py) and of transformers' Seq2SeqTrainingArguments, parsed by hparams/parser.py
``get_train_args``. How the model is then built for training: model/loader.py ``load_model``
(weights in the checkpoint's dtype), model/patcher.py (attention, quantization, checkpointing),
model/adapter.py ``init_adapter`` (what trains, cast to float32). Paths below are LLaMA-Factory's.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from autotune.configs.llamafactory_kt import read_lf_kt
from autotune.configs.llamafactory_preference import PREFERENCE_STAGES, REFUSED_STAGES, read_lf_preference
from autotune.configs.llamafactory_quantized import read_lf_saved_quant
from autotune.configs.llamafactory_vision import read_lf_multimodal
from autotune.configs.lora import build_adapter, lora_number, note_adapter, target_names
from autotune.configs.reading import (
    COMPILE,
    DORA,
    KERNEL,
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
    read_compile,
    read_optimizer,
    unset,
    words,
)
from autotune.configs.trainer import LEGACY_TRAINER_FIELDS, TRAINER_FIELDS, read_trainer_sharding
from autotune.errors import InvalidInput, JobFails
from autotune.workload.adapters import ALL_LINEAR, QUANT_TYPES, Adapter, adapter_from_peft_config
from autotune.workload.fp8 import Fp8, to_json
from autotune.workload.lf_losses import DESCRIPTIONS as LF_LOSS_DESCRIPTIONS
from autotune.workload.lf_losses import DFT, EAFT, EAFT_ALPHA
from autotune.workload.liger import DEFAULT_KERNELS, FUSED_LINEAR
from autotune.workload.modes import Mode
from autotune.workload.optimizers import describe_optimizer

# Keys only LLaMA-Factory has (Axolotl, TrainingArguments and TRL have none of them).
LLAMAFACTORY_MARKERS = words(
    "stage finetuning_type cutoff_len template lora_target lora_rank quantization_bit quantization_method "
    "flash_attn disable_gradient_checkpointing use_reentrant_gc upcast_layernorm pure_bf16 "
    "additional_target neat_packing")

# Megatron's arguments (hparams/megatron_bridge_args.py, and mcore_adapter's): a run launched with
# USE_MCA=1 or USE_MEGATRON_BRIDGE=1 (train/mca, train/megatron_bridge), where Megatron-Core, not the
# Hugging Face Trainer, builds the step; LLaMA-Factory's own parser refuses these keys otherwise.
_MEGATRON_KEYS = tuple((
    "tensor_model_parallel_size pipeline_model_parallel_size expert_model_parallel_size "
    "context_parallel_size virtual_pipeline_model_parallel_size sequence_parallel recompute_granularity "
    "recompute_method recompute_num_layers account_for_embedding_in_pipeline_split "
    "account_for_loss_in_pipeline_split bias_activation_fusion apply_rope_fusion masked_softmax_fusion "
    "cross_entropy_loss_fusion moe_grouped_gemm moe_token_dispatcher_type calculate_per_token_loss "
    "use_distributed_optimizer overlap_param_gather overlap_grad_reduce use_packed_sequences mixed_precision "
    "megatron_pretrained_checkpoint export_hf_on_finish").split())
_MEGATRON = ("a Megatron-Core run (USE_MCA or USE_MEGATRON_BRIDGE: train/mca, train/megatron_bridge) is not "
             "modelled: autotune models the Hugging Face Trainer's step on one GPU")
_CPU = "training on the CPU: autotune models a GPU"
_GALORE = ("{name} (train/trainer_utils.py _create_{key}_optimizer) projects each target's gradient to a "
           "low rank (projection matrices refreshed by an SVD every {key}_update_interval steps) and, with "
           "{key}_layerwise, steps each parameter in its post-accumulate-grad hook as its gradient is made: "
           "neither is modelled")
_VOCAB = ("a resized vocabulary (model_utils/embedding.py resize_embedding_layer; under LoRA the embeddings "
          "trained whole) is not modelled: autotune models the checkpoint's vocabulary")
_LF_REFUSED = {
    # TrainingArguments (as configs/trainer.py refuses them)
    "sharded_ddp": SHARDING, "parallelism_config": PARALLEL,
    "torchdynamo": COMPILE,
    "use_cpu": _CPU, "no_cuda": _CPU,
    "label_smoothing_factor": "the label smoother's extra log_softmax over the full logits",
    "use_cache": "a KV cache kept through the training forward",
    "optim_args": "optimizer arguments are not modelled; autotune models each optimizer's defaults",
    "optim_target_modules": "GaLore/APOLLO projections are not modelled",
    # model_args.py
    "use_unsloth": "Unsloth's patched model and kernels (model_utils/unsloth.py) are not modelled",
    "use_unsloth_gc": f"Unsloth's checkpointing offloads each layer's input to the CPU: {OFFLOAD}",
    "use_v1_kernels": KERNEL, "shift_attn": "LongLoRA's shifted sparse attention (S^2-Attn) is not modelled",
    "mixture_of_depths": "mixture-of-depths (model_utils/mod.py) routes tokens past layers: not modelled",
    "upcast_lmhead_output": "a hook casting lm_head's output to float32 (model_utils/checkpointing.py "
                            "_fp32_forward_post_hook) is not modelled",
    "quantization_device_map": OFFLOAD,
    "export_quantization_bit": f"the model quantized with GPTQ as it loads (configure_quantization): {QUANT}",
    "resize_vocab": _VOCAB, "add_tokens": _VOCAB, "add_special_tokens": _VOCAB,
    "new_special_tokens_config": _VOCAB,
    # finetuning_args.py, training_args.py
    "use_galore": _GALORE.format(name="GaLore", key="galore"),
    "use_apollo": _GALORE.format(name="APOLLO", key="apollo"),
    "use_badam": "BAdam (train/trainer_utils.py _create_badam_optimizer; badam 1.4's block_optim.py "
                 "BlockOptimizer) trains one block (a decoder layer) at a time, the others frozen, with "
                 "float32 copies of the active block's weights and gradients under the Trainer's optimizer; "
                 "LLaMA-Factory then checkpoints only the layers with trainable parameters "
                 "(model_utils/checkpointing.py get_custom_gradient_checkpointing_func), the frozen ones "
                 "after the active block saving their activations whole: not modelled yet",
    "use_asft_loss": "ASFT's step runs a reference model (ref_model, a second copy of the model) forward "
                     "under no_grad on every batch and takes a KL term over its float32 logits beside DFT's "
                     "loss (train/sft/trainer.py compute_loss, trainer_utils.py asft_loss_func): a reference "
                     "model in a supervised step is not modelled",
    "use_llama_pro": "LLaMA Pro's expanded blocks, some trained, are not modelled",
    "use_dora": DORA,
    "use_mca": PARALLEL, "use_megatron_bridge": PARALLEL, "use_hyper_parallel": SHARDING,
}
# supervised steps, the model's causal-LM loss (train/sft, train/pt); and the preference stages
# (configs/llamafactory_preference.py)
_STAGES = ("sft", "pt", *PREFERENCE_STAGES)
# Keys read on some paths only (a new adapter's, a 4-bit base's): set where this config does not use
# them (lora_rank beside adapter_name_or_path), they are listed as ignored, never refused as unknown.
_LF_SOMETIMES_READ = words(
    "lora_rank lora_alpha lora_dropout lora_target additional_target loraplus_lr_ratio use_rslora pissa_init "
    "create_new_adapter adapter_folder quantization_type double_quantization quantization_method")
_LF_NO_EFFECT = words(
    # model_args.py
    "model_name_or_path adapter_folder cache_dir use_fast_tokenizer split_special_tokens "
    "init_special_tokens model_revision low_cpu_mem_usage moe_aux_loss_coef infer_backend offload_folder "
    "use_kv_cache infer_dtype hf_hub_token ms_hub_token om_hub_token print_param_status trust_remote_code "
    "quantization_method quantization_type double_quantization audio_sampling_rate "
    # data_args.py
    "template dataset eval_dataset dataset_dir media_dir train_on_prompt mask_history streaming buffer_size "
    "mix_strategy interleave_probs overwrite_cache preprocessing_batch_size preprocessing_num_workers "
    "max_samples eval_num_beams ignore_pad_token_for_loss val_size eval_on_each_dataset tool_format "
    "default_system enable_thinking preserve_thinking tokenized_path data_shared_file_system "
    # finetuning_args.py: settings of methods not in use, logging
    "pref_beta pref_ftx pref_bco_weight pref_loss dpo_label_smoothing kto_chosen_weight kto_rejected_weight "
    "simpo_gamma ref_model ref_model_adapters ref_model_quantization_bit reward_model reward_model_adapters "
    "reward_model_quantization_bit reward_model_type ld_alpha module_dropout asft_alpha eaft_alpha "
    "compute_accuracy disable_shuffling "
    "early_stopping_steps plot_loss include_effective_tokens_per_second hyper_parallel_args pissa_iter "
    "pissa_convert loraplus_lr_embedding create_new_adapter "
    # training_args.py, generating_args.py
    "ray_init_kwargs master_addr master_port enable_torch_profiler profile_modules "
    "overwrite_output_dir do_sample temperature top_p top_k num_beams max_length max_new_tokens "
    "repetition_penalty length_penalty skip_special_tokens")
# Families of keys with no effect: inference engines, export, settings of optimizers and methods
# not in use (those in use are refused by their use_* key), tracking and profiling.
_LF_PREFIXES = ("vllm_", "sglang_", "export_", "kt_", "galore_", "apollo_", "badam_", "swanlab_",
                "use_swanlab", "oft_", "freeze_trainable_", "freeze_extra_", "ppo_", "profiler_")


def read_llamafactory(cfg: Config) -> TrainingConfig:
    # v1's files never reach here: configs.detect sends them to llamafactory_v1.py
    present = [key for key in _MEGATRON_KEYS if key in cfg.data]
    if present:
        raise cfg.unmodelled(present[0], cfg.data[present[0]], _MEGATRON)
    cfg.refuse(_LF_REFUSED)
    # deepspeed (examples/deepspeed/ds_z*_config.json) and fsdp are TrainingArguments' (hparams/parser.py
    # parses Seq2SeqTrainingArguments); FSDP usually comes from an accelerate config
    # (examples/accelerate/fsdp2_config.yaml), given beside this file.
    read_trainer_sharding(cfg)
    stage = _lf_stage(cfg)
    model = cfg.text("model_name_or_path")
    method = _lf_finetuning_type(cfg)
    full = method == "full"
    saved = read_lf_saved_quant(cfg, model, full=full)
    bits = None if saved else _lf_quantization(cfg, full)
    multimodal, exclude = read_lf_multimodal(cfg, model, full=full, quantized=bits is not None or bool(saved))
    mode, dtype, compute = _lf_precision(cfg, method)
    kt = read_lf_kt(cfg, method)  # use_kt: the routed experts on the CPU (llamafactory_kt.py)
    if saved is not None and saved.method == "awq":
        dtype = "float16"  # quantizer_awq.py update_dtype (read_lf_saved_quant's note)
    attn = _lf_attention(cfg)
    adapter = None if full else _lf_adapter(cfg, bits, compute, oft=method == "oft")
    if adapter is not None and saved is not None:
        adapter = replace(adapter, saved_quant=saved)
    if adapter is not None and exclude and (unset(cfg.data.get("adapter_name_or_path"))
                                            or cfg.data.get("create_new_adapter") is True):
        adapter = replace(adapter, exclude=exclude)  # a new adapter's targets (a saved one's are its own)
    batch = cfg.positive("per_device_train_batch_size", "batch size")
    if batch is None:
        batch = 8  # transformers TrainingArguments' default per_device_train_batch_size
        cfg.notes.append("per_device_train_batch_size: not set, the Trainer's default 8")
    seq_len = _lf_seq_len(cfg, stage, attn, batch)
    if stage in PREFERENCE_STAGES and multimodal["task"] != "causal-lm":
        raise cfg.unmodelled("stage", stage, f"stage {stage} over a vision-language model ({model}: the "
                             "chosen and rejected rows' images through its tower) is not modelled: autotune "
                             "models the preference step of a text model")
    trainer = read_lf_preference(cfg, stage, full) if stage in PREFERENCE_STAGES else {}
    liger = _lf_liger(cfg)
    optimizer = _lf_optimizer(cfg, full) or read_optimizer(cfg, "optim")
    if optimizer is None and cfg.flag("adafactor"):  # transformers 4.x's flag for optim adafactor
        optimizer = "adafactor"
    if optimizer is None:
        optimizer = "adamw_torch_fused"  # TrainingArguments' default optim with torch >= 2.8
        cfg.notes.append("optim: not set, the Trainer's default adamw_torch_fused")
    if cfg.flag("auto_find_batch_size"):
        cfg.notes.append("auto_find_batch_size: the Trainer halves the batch after an out-of-memory "
                         "error; autotune checks the batch as written")
    workers = cfg.get("ray_num_workers")
    if isinstance(workers, int) and not isinstance(workers, bool) and workers > 1:
        cfg.notes.append(f"ray_num_workers: {workers} data-parallel workers, each GPU holding the whole "
                         "model: autotune checks one of them")
    rope = cfg.get("rope_scaling")
    if rope is not None:
        cfg.notes.append(f"rope_scaling: {rope}: rotary frequencies rescaled for a cutoff_len beyond the "
                         "model's positions (model_utils/rope.py configure_rope: rope type, factor and "
                         "max_position_embeddings): no tensor changes size, autotune traces the model's own "
                         "rotary embedding (a RoPE model runs past its positions: workload/positions.py)")
    note_neftune(cfg, "neftune_noise_alpha")
    # TrainingArguments' keys (hparams/training_args.py: Seq2SeqTrainingArguments), read as there
    read_compile(cfg, implied=True)
    fp8 = _lf_fp8(cfg, bits, mode)
    return cfg.result(
        "llamafactory", model=model, seq_len=seq_len, batch_size=batch, mode=mode, fp8=fp8,
        accumulation_steps=cfg.positive("gradient_accumulation_steps", "accumulation steps") or 1,
        dtype=dtype, optimizer=optimizer, attn=attn, adapter=adapter, liger=liger,
        loss=_lf_loss(cfg, stage, liger), **multimodal, **trainer, **kt,
        ignored=cfg.ignored(_LF_NO_EFFECT | TRAINER_FIELDS | LEGACY_TRAINER_FIELDS,
                            _LF_PREFIXES + (() if adapter else ("lora_", "loraplus_", "pissa_")),
                            modelled=_LF_SOMETIMES_READ),
    )


# hparams/training_args.py Fp8Arguments.fp8_backend's choices
_FP8_BACKENDS = ("auto", "torchao", "te", "msamp")


def _lf_fp8(cfg: Config, bits: int | None, mode: Mode) -> str | None:
    """``fp8: true`` as the request's JSON (workload/fp8.py). train/fp8_utils.py
    ``configure_fp8_environment`` sets ``ACCELERATE_MIXED_PRECISION=fp8`` before the Trainer builds its
    Accelerator; with no recipe handed to it (``create_fp8_kwargs``' rowwise ``AORecipeKwargs`` is built
    and logged only, and the ``FP8_BACKEND`` variable it sets is not ``ACCELERATE_FP8_BACKEND``),
    accelerate picks torchao when installed and its own ``AORecipeKwargs()``: the tensorwise recipe and
    ``filter_linear_layers``. ``fp8_backend: te`` patches the Accelerator for Transformer Engine
    (``patch_accelerator_for_fp8``): refused, as msamp."""
    gather = cfg.flag("fp8_enable_fsdp_float8_all_gather")
    backend = cfg.get("fp8_backend")
    if not cfg.flag("fp8"):
        if gather:  # hparams/parser.py sets model_args.fp8, which the trainers never read
            cfg.notes.append("fp8_enable_fsdp_float8_all_gather: true without fp8: LLaMA-Factory's parser "
                             "sets model_args.fp8, but the trainers read training_args.fp8: no fp8 training")
        return None
    if backend is not None and backend not in _FP8_BACKENDS:
        raise cfg.bad("fp8_backend", backend, f"one of {', '.join(_FP8_BACKENDS)}")
    if backend == "te":
        raise cfg.unmodelled("fp8_backend", backend, "Transformer Engine's fp8 layers (accelerate's "
                             "apply_fp8_autowrap, train/fp8_utils.py patch_accelerator_for_fp8) are CUDA "
                             "kernels of a library autotune neither installs nor emulates")
    if backend == "msamp":
        raise cfg.unmodelled("fp8_backend", backend, "MS-AMP's fp8 weights and optimizer are not modelled")
    if bits is not None:
        raise JobFails(f"fp8: true with quantization_bit: {bits} in {cfg.file!r}: LLaMA-Factory refuses "
                       "it (hparams/parser.py: \"FP8 training is not compatible with quantization\")")
    if mode.precision != "bf16":
        raise cfg.unmodelled("fp8", True, "accelerate's fp8 runs the forward under bfloat16 autocast, which "
                             "the Trainer's step without bf16: true does not: give bf16: true")
    fp8 = Fp8()
    cfg.notes.append(f"fp8: true (fp8_backend {backend or 'auto'}): {fp8.describe()}: LLaMA-Factory sets "
                     "ACCELERATE_MIXED_PRECISION=fp8 (train/fp8_utils.py configure_fp8_environment) and "
                     "accelerate builds its own AORecipeKwargs() with torchao installed; the rowwise recipe "
                     "and filter of create_fp8_kwargs are only logged. A Trainer that hands accelerate its "
                     "own mixed_precision (transformers 5's _build_accelerator_args: bf16) leaves fp8 off, a "
                     "plain bf16 step; modelled here is the fp8 step LLaMA-Factory asks for")
    if gather:
        cfg.notes.append("fp8_enable_fsdp_float8_all_gather: true: no effect: LLaMA-Factory only sets "
                         "FP8_ENABLE_FSDP_FLOAT8_ALL_GATHER, which neither accelerate nor transformers "
                         "reads, and accelerate's AORecipeKwargs() keeps the all-gather off")
    return to_json(fp8)


def _lf_liger(cfg: Config) -> tuple[str, ...] | None:
    """enable_liger_kernel: model_utils/liger_kernel.py apply_liger_kernel calls the model type's
    apply_liger_kernel_to_<model_type>() before the model is built, for sft and pt with its defaults
    (require_logits false): rms_norm, rope, swiglu or geglu, and the fused linear cross-entropy (the
    loss chunked). The Trainer's use_liger_kernel patches the built model with the same defaults."""
    on = [key for key in ("enable_liger_kernel", "use_liger_kernel") if cfg.flag(key)]
    if not on:
        return None
    if "use_liger_kernel" in on and not unset(cfg.get("liger_kernel_config")):
        raise cfg.unmodelled("liger_kernel_config", cfg.data["liger_kernel_config"], "Liger settings other "
                             "than the patch's defaults are not read from a LLaMA-Factory YAML")
    cfg.notes.append(f"{on[0]}: {', '.join(DEFAULT_KERNELS)} and {FUSED_LINEAR} (loss: chunked), the "
                     "defaults of apply_liger_kernel_to_<model_type>: Liger's kernels, emulated from its "
                     "source; those the model type's patch does not take are left out, as Liger leaves "
                     "them out")
    return DEFAULT_KERNELS


def _lf_optimizer(cfg: Config, full: bool) -> str | None:
    """use_adam_mini, use_muon: train/trainer_utils.py create_custom_optimizer builds Adam-mini or Muon in
    place of the Trainer's optim (workload/lf_optimizers.py), after LoRA+'s (loraplus_lr_ratio, a LoRA
    run's: the Trainer's optim over its parameter groups) and in that order."""
    on = [key for key in ("use_adam_mini", "use_muon") if cfg.flag(key)]
    if not on:
        return None
    if not full and not unset(cfg.get("loraplus_lr_ratio")):
        cfg.notes.append(f"{on[0]}: no effect beside loraplus_lr_ratio (create_custom_optimizer builds "
                         "LoRA+'s optimizer first)")
        return None
    name = "adam_mini" if on[0] == "use_adam_mini" else "llamafactory_muon"  # optimizers.LF_OPTIMIZERS
    optim = cfg.get("optim")
    ignored = f"; optim {optim} not used" if not unset(optim) else ""
    cfg.notes.append(f"{on[0]}: {describe_optimizer(name)}{ignored}")
    return name


def _lf_loss(cfg: Config, stage: str, liger: tuple[str, ...] | None) -> str | None:
    """use_dft_loss, use_eaft_loss: train/sft/trainer.py CustomSeq2SeqTrainer sets compute_loss_func to
    trainer_utils.py dft_loss_func, else eaft_loss_func (the losses dft and eaft: workload/lf_losses.py);
    stage sft only (the other stages' trainers never read them). enable_liger_kernel's fused linear
    cross-entropy is the loss chunked."""
    on = [key for key in ("use_dft_loss", "use_eaft_loss") if cfg.flag(key)]
    if not on:
        return "chunked" if liger else None
    if stage != "sft":
        cfg.notes.append(f"{on[0]}: read by stage sft's trainer only, no effect at stage {stage}")
        return "chunked" if liger else None
    if liger:
        # Liger's patched forward computes its fused loss only with labels, which compute_loss_func's
        # Trainer.compute_loss pops: the logits come back whole, and the patch's other kernels stay.
        raise cfg.unmodelled(on[0], True, "with enable_liger_kernel (Liger's forward then returns the "
                             "full logits to LLaMA-Factory's loss) is not modelled: autotune models the "
                             "loss without Liger's kernels")
    loss = DFT if on[0] == "use_dft_loss" else EAFT  # sft/trainer.py: if use_dft_loss ... elif use_eaft_loss
    alpha = cfg.get("eaft_alpha")
    what = "" if loss == DFT else f", eaft_alpha {EAFT_ALPHA if alpha is None else alpha} (a scalar power)"
    cfg.notes.append(f"{on[0]}: {LF_LOSS_DESCRIPTIONS[loss]}{what}; emulated where fake tensors cannot run "
                     "it (the boolean mask of labelled tokens: nonzero_static of their count)")
    return loss


def _lf_stage(cfg: Config) -> str:
    """sft (finetuning_args.py's default stage), pt, dpo, kto or rm; ppo is refused; and
    LLaMA-Factory's own refusals of a run that does not train."""
    stage = cfg.get("stage")
    if stage is None:
        stage = "sft"
        cfg.notes.append("stage: not set, LLaMA-Factory's default sft")
    if stage in REFUSED_STAGES:
        raise cfg.unmodelled("stage", stage, REFUSED_STAGES[stage])
    if stage not in _STAGES:
        raise cfg.bad("stage", stage, "one of sft, pt, rm, ppo, dpo, kto")  # finetuning_args.py stage
    do_train = cfg.get("do_train")
    if do_train is False:
        raise cfg.unmodelled("do_train", False, "LLaMA-Factory trains only with do_train: true (train/sft/"
                             "workflow.py run_sft); without it the run evaluates or predicts")
    if do_train is None:
        cfg.notes.append("do_train: not set: read as a training run (LLaMA-Factory trains only with "
                         "do_train: true)")
    backend = cfg.get("infer_backend")
    if backend not in (None, "huggingface", "hf"):
        raise InvalidInput(f"infer_backend: {backend!r} in {cfg.file!r}: LLaMA-Factory trains only with the "
                           "huggingface backend (hparams/parser.py get_train_args)")
    cp_size = cfg.get("hyper_parallel_cp_size")
    if cp_size is not None and cp_size != 1:
        raise cfg.unmodelled("hyper_parallel_cp_size", cp_size, PARALLEL)
    return str(stage)


def _lf_finetuning_type(cfg: Config) -> str:
    method = cfg.get("finetuning_type")
    if method is None:
        method = "lora"  # finetuning_args.py FinetuningArguments.finetuning_type
        cfg.notes.append("finetuning_type: not set, LLaMA-Factory's default lora")
    if method == "freeze":
        raise cfg.unmodelled("finetuning_type", method, "training only some layers (model/adapter.py "
                             "_setup_freeze_tuning) is not modelled: autotune trains them all, or LoRA")
    if method not in ("lora", "full", "oft"):
        raise cfg.bad("finetuning_type", method, "one of lora, full, freeze, oft")
    if method != "lora" and not unset(cfg.get("adapter_name_or_path")):  # parser.py _verify_model_args
        raise InvalidInput(f"adapter_name_or_path with finetuning_type: {method} in {cfg.file!r}: "
                           "LLaMA-Factory loads adapters only for LoRA (\"Adapter is only valid for the LoRA "
                           "method\")")
    return str(method)


def _lf_quantization(cfg: Config, full: bool) -> int | None:
    """The bits of a bitsandbytes base, 4 (QLoRA) or 8 (LLM.int8), as model_utils/quantization.py
    ``configure_quantization`` loads it on the fly; None for a 16/32-bit one; other quantizations
    raise."""
    bits = cfg.get("quantization_bit")
    if bits is None:
        return None
    if full:  # hparams/parser.py _verify_model_args
        raise InvalidInput(f"quantization_bit: {bits!r} in {cfg.file!r} with finetuning_type: full: "
                           "LLaMA-Factory quantizes only for LoRA (hparams/parser.py _verify_model_args)")
    method = cfg.get("quantization_method") or "bnb"  # model_args.py QuantizationArguments
    if method != "bnb":
        raise cfg.unmodelled("quantization_method", method, QUANT)
    if bits not in (4, 8) or isinstance(bits, bool):
        raise cfg.bad("quantization_bit", bits, "4 or 8 with quantization_method bnb (bitsandbytes "
                      "only accepts 4-bit or 8-bit quantization)")
    return int(bits)


def _lf_precision(cfg: Config, method: str) -> tuple[Mode, str, str | None]:
    """Mode, weights dtype and the compute dtype of a 4-bit base (None: bfloat16, float16 on a card
    without it) as LLaMA-Factory sets them."""
    full = method == "full"
    bf16, fp16, pure = cfg.flag("bf16"), cfg.flag("fp16"), cfg.flag("pure_bf16")
    if bf16 and fp16:
        raise InvalidInput(f"fp16 and bf16 in {cfg.file!r} are both true: choose one")
    ckpt = _lf_checkpointing(cfg)
    if cfg.data.get("bf16") is None and cfg.data.get("fp16") is None:
        cfg.notes.append("bf16, fp16: not set, the Trainer's default false: no autocast")
    # hparams/parser.py get_train_args: compute_dtype bfloat16 with bf16 or pure_bf16, float16 with
    # fp16; else patcher.py patch_config's infer_optim_dtype: bfloat16 for a bfloat16 checkpoint on a
    # card with bfloat16, else float16 (autotune's default for a 4-bit base: bfloat16, else float16).
    compute = "bfloat16" if bf16 or pure else "float16" if fp16 else None
    # model/loader.py load_model: from_pretrained(torch_dtype="auto"), the checkpoint's dtype; then
    # model/adapter.py init_adapter casts every trained parameter to float32 unless pure_bf16.
    loaded = ("LLaMA-Factory loads the weights in the checkpoint's dtype (model/loader.py load_model: "
              "torch_dtype auto)")
    if full and not pure:
        dtype = "float32"
        cfg.notes.append(f"finetuning_type: full: {loaded} and casts every trained parameter to float32 "
                         "(model/adapter.py init_adapter): float32 weights")
    elif pure:
        dtype = "auto"
        cfg.notes.append(f"pure_bf16: true: {loaded} and trains them there, not cast to float32 "
                         "(model/adapter.py init_adapter)")
    else:
        dtype = "auto"
        cfg.notes.append(f"finetuning_type: {method}: {loaded}; the adapters in float32 (model/adapter.py "
                         "init_adapter)")
    if cfg.flag("upcast_layernorm"):
        if dtype != "float32":
            raise cfg.unmodelled("upcast_layernorm", True, "norm weights in float32 beside 16-bit weights "
                                 "(model_utils/checkpointing.py prepare_model_for_training) make the norms' "
                                 "outputs float32; mixed weight dtypes are not modelled")
        cfg.notes.append("upcast_layernorm: true: the norms are float32 with every weight: no effect")
    if cfg.flag("train_from_scratch"):
        if dtype != "float32":
            raise cfg.unmodelled("train_from_scratch", True, "the dtype of weights initialized from the "
                                 "config (from_config) depends on the transformers version; autotune models "
                                 "a checkpoint's")
        cfg.notes.append("train_from_scratch: true: weights initialized from the config, then float32 as a "
                         "checkpoint's: no effect on memory")
    return Mode("bf16" if bf16 else "amp" if fp16 else "fp32", ckpt), dtype, compute


def _lf_checkpointing(cfg: Config) -> bool:
    """model_utils/checkpointing.py prepare_model_for_training: every layer checkpointed unless
    disable_gradient_checkpointing, with use_reentrant=use_reentrant_gc (default true); the
    Trainer's gradient_checkpointing enables it again with its own arguments."""
    on = not cfg.flag("disable_gradient_checkpointing")
    if cfg.launch.get("fsdp_activation_checkpointing"):
        raise cfg.unmodelled("fsdp_config.activation_checkpointing", True, "FSDP's activation checkpointing "
                             "beside LLaMA-Factory's own (prepare_model_for_training checkpoints every layer "
                             "unless disable_gradient_checkpointing) is not modelled")
    new = cfg.get("activation_checkpointing")
    key = "activation_checkpointing" if new is not None else "gradient_checkpointing"
    if cfg.flag(key):
        kwargs_key = ("activation_checkpointing_kwargs" if cfg.get("activation_checkpointing_kwargs")
                      is not None else "gradient_checkpointing_kwargs")
        # The Trainer calls the model's gradient_checkpointing_enable, LLaMA-Factory's own while its
        # checkpointing is on (_gradient_checkpointing_enable: no arguments is use_reentrant=True),
        # else transformers' (no arguments: use_reentrant=False).
        checkpoint_kwargs(cfg, kwargs_key, unset={"use_reentrant": True} if on else None)
        cfg.get("use_reentrant_gc")  # replaced by the Trainer's arguments
        return True
    if not on:
        return False
    if cfg.data.get("disable_gradient_checkpointing") is None:
        cfg.notes.append("disable_gradient_checkpointing: not set: LLaMA-Factory checkpoints every layer "
                         "(model_utils/checkpointing.py prepare_model_for_training)")
    reentrant = cfg.flag("use_reentrant_gc", default=True)  # model_args.py BaseModelArguments
    if reentrant:
        cfg.ckpt_reentrant = True
        where = ("use_reentrant_gc: not set, LLaMA-Factory's default true"
                 if cfg.data.get("use_reentrant_gc") is None else "use_reentrant_gc: true")
        cfg.notes.append(f"{where}: {REENTRANT}")
    return True


def _lf_attention(cfg: Config) -> str | None:
    """flash_attn as model_utils/attention.py configure_attn_implementation maps it."""
    value = cfg.get("flash_attn")
    if value is None or value == "auto":
        if value is None:
            cfg.notes.append("flash_attn: not set, LLaMA-Factory's default auto: the attention transformers "
                             "picks (model_utils/attention.py)")
        return None
    names = {"disabled": "eager", "sdpa": "sdpa", "fa2": "flash_attention_2"}
    if value == "fa3":
        raise cfg.unmodelled("flash_attn", value, f"FlashAttention-3: {KERNEL}")
    if value not in names:
        raise cfg.bad("flash_attn", value, "one of auto, disabled, sdpa, fa2, fa3")
    return names[value]


def _lf_adapter(cfg: Config, bits: int | None, compute: str | None, *, oft: bool = False) -> Adapter:
    """The LoraConfig of model/adapter.py _setup_lora_tuning (bias none), its OFTConfig with ``oft``
    (_lf_oft), or the saved adapter training goes on from; a 4- or 8-bit base as
    configure_quantization loads it (BitsAndBytesConfig(load_in_8bit=True) for quantization_bit 8)."""
    at = len(cfg.notes)
    to_save = _lf_trained_whole(cfg)
    method = "qlora" if bits == 4 else "lora_8bit" if bits == 8 else "lora"
    adapter = None if oft else _lf_saved_adapter(cfg, method)
    source = "adapter_name_or_path"
    if oft:
        adapter = _lf_oft(cfg, method, to_save)
        source = "finetuning_type: oft" + (f" over quantization_bit: {bits}" if bits else "")
    if adapter is None:
        adapter = build_adapter(cfg, method, **_lf_lora_numbers(cfg),
                                targets=_lf_targets(cfg), modules_to_save=to_save)
        source = "finetuning_type: lora" + (f" over quantization_bit: {bits}" if bits else "")
    if bits == 8:
        adapter = replace(adapter, recipe="axolotl")
        cfg.notes.append("quantization_bit: 8: LLaMA-Factory keeps the weights not quantized in the "
                         "checkpoint's dtype and casts the adapters to float32 (model/adapter.py "
                         "init_adapter): the dtypes of Axolotl's recipe")
    if bits == 4:
        # configure_quantization: BitsAndBytesConfig(load_in_4bit, bnb_4bit_quant_type=quantization_type
        # (nf4), bnb_4bit_use_double_quant=double_quantization (true), bnb_4bit_compute_dtype=compute_dtype).
        quant_type = cfg.get("quantization_type") or "nf4"
        if quant_type not in QUANT_TYPES:
            raise cfg.bad("quantization_type", quant_type, f"one of {', '.join(QUANT_TYPES)}")
        double_quant = cfg.flag("double_quantization", default=True)
        # The weights not quantized stay in the checkpoint's dtype and what trains is cast to float32
        # (init_adapter): the dtypes Axolotl's recipe leaves (adapters.prepare).
        adapter = replace(adapter, quant_type=quant_type, double_quant=double_quant, compute_dtype=compute,
                          recipe="axolotl")
        cfg.notes.append("quantization_bit: 4: LLaMA-Factory keeps the weights not quantized in the "
                         "checkpoint's dtype and casts the adapters to float32 (model/adapter.py "
                         "init_adapter): the dtypes of Axolotl's recipe")
    note_adapter(cfg, source, adapter, at)
    if oft:
        return adapter  # the notes below are on LoRA's keys
    if cfg.flag("use_rslora"):
        cfg.notes.append("use_rslora: the adapters scaled by alpha/sqrt(r): no effect on memory")
    if not unset(cfg.get("loraplus_lr_ratio")):
        cfg.notes.append("loraplus_lr_ratio: LoRA+ learning rates per parameter group, the same optimizer "
                         "states: no effect on memory")
    if cfg.flag("pissa_init"):
        cfg.notes.append("pissa_init: the adapters initialized from an SVD of the weights before training: "
                         "no effect on the step's memory")
    return adapter


def _lf_oft(cfg: Config, method: str, to_save: tuple[str, ...]) -> Adapter:
    """_setup_lora_tuning's OFTConfig(r=oft_rank, oft_block_size, target_modules, module_dropout,
    modules_to_save=additional_target), with finetuning_args.py OFTArguments' defaults: oft_rank 0,
    oft_block_size 32, module_dropout 0.0. Its target_modules are lora_target's (the same
    find_all_linear_modules for "all"): LLaMA-Factory parses oft_target and never reads it."""
    defaults = _Defaults(cfg)
    r, block_size = defaults.value("oft_rank", 0), defaults.value("oft_block_size", 32)
    dropout = lora_number(cfg, "module_dropout", defaults.value("module_dropout", 0.0), dropout=True)
    defaults.note()
    if cfg.flag("pissa_init"):
        raise JobFails(f"pissa_init with finetuning_type: oft in {cfg.file!r}: LLaMA-Factory passes "
                       "init_lora_weights to OFTConfig, which has no such field (model/adapter.py "
                       "_setup_lora_tuning): the run fails as it starts")
    oft_target = cfg.get("oft_target")
    if oft_target is not None:
        cfg.notes.append(f"oft_target: {oft_target}: parsed by LLaMA-Factory but never read: its OFT targets "
                         "are lora_target's (model/adapter.py _setup_lora_tuning)")
    adapter = build_adapter(cfg, method, tuner="oft", r=r, block_size=block_size, dropout=dropout,
                            targets=_lf_targets(cfg, "OFT"), modules_to_save=to_save)
    if dropout:
        cfg.notes.append(f"module_dropout: {dropout:g}: PEFT builds OFT's multiplicative dropout and no "
                         "forward applies it (peft/tuners/oft/layer.py): no effect on memory")
    return adapter


def _lf_lora_numbers(cfg: Config) -> dict[str, Any]:
    """r, alpha, dropout with finetuning_args.py LoraArguments' defaults: lora_rank 8, lora_alpha
    twice lora_rank (__post_init__), lora_dropout 0.0."""
    defaults = _Defaults(cfg)
    r = lora_number(cfg, "lora_rank", defaults.value("lora_rank", 8), rank=True)
    alpha = lora_number(cfg, "lora_alpha", defaults.value("lora_alpha", 2 * r))
    dropout = lora_number(cfg, "lora_dropout", defaults.value("lora_dropout", 0.0), dropout=True)
    defaults.note(" (lora_alpha: twice lora_rank)" if "lora_alpha" in defaults.taken else "")
    return {"r": r, "alpha": alpha, "dropout": dropout}


class _Defaults:
    """The keys a config leaves unset, each taken at LLaMA-Factory's default, said in one note."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.taken: dict[str, float] = {}

    def value(self, key: str, default: float) -> Any:
        found = self.cfg.get(key)
        if found is None:
            found = self.taken[key] = default
        return found

    def note(self, more: str = "") -> None:
        if self.taken:
            plural = "s" * (len(self.taken) > 1)
            self.cfg.notes.append(f"{', '.join(self.taken)}: not set, LLaMA-Factory's default{plural} "
                                  f"{', '.join(f'{v:g}' for v in self.taken.values())}{more}")


def _names(cfg: Config, key: str, value: Any) -> list[str]:
    """A comma-separated string (finetuning_args.py split_arg) or a list, as names."""
    if isinstance(value, str):
        return [name.strip() for name in value.split(",") if name.strip()]
    if not isinstance(value, list) or not all(isinstance(name, str) and name for name in value):
        raise cfg.bad(key, value, "comma-separated module names")
    return value


def _lf_targets(cfg: Config, adapter: str = "LoRA") -> tuple[str, ...] | None:
    """lora_target: "all" (the default) is find_all_linear_modules: every module whose class is a
    Linear (Linear4bit too) but lm_head (model_utils/misc.py), PEFT's all-linear; else names PEFT
    matches as the last parts of a module's name. ``adapter`` names what is put there (OFT takes
    lora_target's modules too)."""
    value = cfg.get("lora_target")
    if value is None:
        value = "all"  # finetuning_args.py LoraArguments.lora_target
        cfg.notes.append("lora_target: not set, LLaMA-Factory's default all")
    names = _names(cfg, "lora_target", value)
    if names == ["all"]:
        cfg.notes.append(f"lora_target: all: {adapter} on every linear layer but the output head "
                         "(model_utils/misc.py find_all_linear_modules): PEFT's all-linear")
        return (ALL_LINEAR,)
    if not names:
        raise cfg.bad("lora_target", value, "module names or all")
    return target_names(cfg, "lora_target", names)


_TRAINED_WHOLE = ("LLaMA-Factory casts the modules it trains whole to float32 (model/adapter.py "
                  "init_adapter: cast_trainable_params_to_fp32); autotune models their copies "
                  "(modules_to_save) in the weights' dtype (pure_bf16: true keeps them there)")


def _lf_trained_whole(cfg: Config) -> tuple[str, ...]:
    """additional_target: modules trained whole beside the adapters (PEFT's modules_to_save)."""
    value = cfg.get("additional_target")
    if unset(value):
        return ()
    if not cfg.data.get("pure_bf16"):
        raise cfg.unmodelled("additional_target", value, _TRAINED_WHOLE)
    return tuple(_names(cfg, "additional_target", value))


def _lf_saved_adapter(cfg: Config, method: str) -> Adapter | None:
    """adapter_name_or_path: _setup_lora_tuning merges every adapter but the last into the base
    (merge_and_unload: no effect on memory) and trains on from the last (PeftModel.from_pretrained),
    with the settings of its adapter_config.json; with create_new_adapter it merges them all and
    trains a new LoRA (None: read from lora_*)."""
    value = cfg.get("adapter_name_or_path")
    if unset(value):
        return None
    paths = _names(cfg, "adapter_name_or_path", value)
    quantized = method != "lora"
    if cfg.flag("create_new_adapter") and not quantized:
        cfg.notes.append(f"adapter_name_or_path: {len(paths)} adapter(s) merged into the base weights: no "
                         "effect on memory; create_new_adapter: a new LoRA trained")
        return None
    if quantized and len(paths) != 1:  # hparams/parser.py _verify_model_args
        raise InvalidInput(f"adapter_name_or_path in {cfg.file!r} names {len(paths)} adapters over a "
                           "quantized model: LLaMA-Factory accepts a single one (merge them first)")
    subfolder = cfg.text("adapter_folder") or ""
    for folder in (Path(paths[-1]).expanduser() / subfolder, Path(cfg.file).parent / paths[-1] / subfolder):
        if (folder / "adapter_config.json").is_file():
            adapter = adapter_from_peft_config(folder, method=method)
            if adapter.modules_to_save and not cfg.data.get("pure_bf16"):
                raise cfg.unmodelled("adapter_name_or_path", value, _TRAINED_WHOLE)
            merged = f"; {len(paths) - 1} before it merged into the base weights" if len(paths) > 1 else ""
            cfg.notes.append(f"adapter_name_or_path: training goes on from the adapter in {folder}: its "
                             f"adapter_config.json sets r, alpha, dropout and targets, not lora_*{merged}")
            return adapter
    raise InvalidInput(f"adapter_name_or_path: {paths[-1]!r} in {cfg.file!r} has no adapter_config.json "
                       "here: LLaMA-Factory trains on from the saved adapter, whose settings autotune reads "
                       "from that file; give a local adapter directory, or leave adapter_name_or_path out "
                       "and set lora_*")


def _lf_seq_len(cfg: Config, stage: str, attn: str | None, batch: int) -> int:
    """The longest row: cutoff_len (data_args.py, default 2048), as the stage's data builds rows."""
    cutoff = cfg.positive("cutoff_len", "sequence length")
    if cutoff is None:
        cutoff = 2048  # data_args.py DataArguments.cutoff_len
        cfg.notes.append("cutoff_len: not set, LLaMA-Factory's default 2048")
    packing = cfg.get("packing")
    if packing is not None and not isinstance(packing, bool):
        raise cfg.bad("packing", packing, "true or false")
    if cfg.flag("neat_packing"):
        _neat_packing(cfg, stage, attn, batch)
        packing = True  # data_args.py __post_init__
    if stage == "pt":
        if packing is None:  # hparams/parser.py get_train_args: packing on for pt
            cfg.notes.append(f"packing: not set, on for stage pt: texts concatenated into blocks of "
                             f"cutoff_len tokens (data/processor/pretrain.py): {PACKED_NOTE}")
            return cutoff
        if packing and cutoff > 1:
            # data_args.py __post_init__ shortens cutoff_len by one when packing is set.
            cfg.notes.append(f"packing: true: blocks of cutoff_len - 1 = {cutoff - 1} tokens "
                             f"(data/processor/pretrain.py): {PACKED_NOTE}")
            return cutoff - 1
        return cutoff
    if packing and stage == "sft":
        # data/processor/supervised.py: packed rows padded to cutoff_len (+1 after __post_init__'s -1).
        cfg.notes.append(f"packing: true: rows packed to cutoff_len tokens (data/processor/supervised.py): "
                         f"{PACKED_NOTE}")
    padded = -(-cutoff // 8) * 8  # train/{stage}/workflow.py: the collator's pad_to_multiple_of=8
    if padded != cutoff:
        cfg.notes.append(f"cutoff_len: {cutoff}: rows padded to a multiple of 8 (train/{stage}/workflow.py "
                         f"pad_to_multiple_of=8): {padded} tokens")
    return padded


def _neat_packing(cfg: Config, stage: str, attn: str | None, batch: int) -> None:
    """neat_packing: packed sequences that attend only within themselves (data/collator.py)."""
    if stage != "sft":  # hparams/parser.py get_train_args
        raise InvalidInput(f"neat_packing in {cfg.file!r} with stage {stage}: LLaMA-Factory packs neatly "
                           "only for sft")
    if attn != "flash_attention_2":
        raise cfg.unmodelled("neat_packing", True, f"with attention {attn or 'auto'} LLaMA-Factory builds a "
                             "[batch, 1, seq, seq] block-diagonal attention mask (data/collator.py "
                             "prepare_4d_attention_mask), which autotune does not model; set flash_attn: fa2")
    if batch != 1:
        raise InvalidInput(f"neat_packing in {cfg.file!r} with a batch of {batch}: LLaMA-Factory's collator "
                           "needs per_device_train_batch_size: 1 with flash attention (data/collator.py)")
    cfg.notes.append("neat_packing: packed sequences attend within themselves through flash_attention_2's "
                     "varlen path: the same memory as full rows")
