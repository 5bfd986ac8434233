"""LLaMA-Factory's ``use_kt: true`` (KTransformers: the routed experts on the CPU), read as its parser does.

hparams/model_args.py ``KTransformersArguments`` (its ``__post_init__``, ``get_kt_activation_policy``,
``configure_kt_checkpointing``, ``_normalize_advanced_kt_config``, ``get_kt_config_dict``) and
model/adapter.py ``init_adapter`` decide what runs; kt-kernel's sft/wrapper.py
``wrap_moe_layers_with_kt_wrapper`` checks the expert weight format. The step itself is
workload/ktransformers.py's (experts_kernel ktransformers).
"""

from __future__ import annotations

from typing import Any

from autotune.configs.reading import REENTRANT, Config
from autotune.errors import JobFails
from autotune.workload.ktransformers import KTRANSFORMERS

# model_args.py KTransformersArguments._KT_DERIVED_KEYS: kt_config may not set them
_DERIVED = frozenset(("enabled kt_activation_policy kt_expert_checkpoint_path kt_full_weight_grad "
                      "kt_lora_alpha kt_lora_dropout kt_lora_expert_intermediate_size kt_lora_expert_num "
                      "kt_lora_rank "
                      "kt_non_expert_weight_path kt_skip_expert_loading kt_train_mode kt_use_lora_experts "
                      "kt_weight_path").split())
_GPU_EXPERTS = ("GPU-side experts beside KT's CPU ones (kt-kernel sft/lora.py LoRAExperts, wrapper.py "
                "kt_num_gpu_experts) are not modelled")


def _fails(where: str, words: str) -> JobFails:
    return JobFails(f"use_kt: true: LLaMA-Factory's {where} raises \"{words}\"")


def _policy(cfg: Config) -> str:
    """get_kt_activation_policy: the CPU tier's policy ("retain" or "recompute")."""
    gpu = "retain" if cfg.flag("disable_gradient_checkpointing") else "recompute"
    cpu = cfg.get("kt_cpu_activation") or gpu
    if cpu == "recompute" and gpu == "retain":
        raise _fails("model_args.py get_kt_activation_policy",
                     "`kt_cpu_activation: recompute` requires GPU gradient checkpointing. Set "
                     "`disable_gradient_checkpointing: false` or use `kt_cpu_activation: retain`.")
    return cpu


def _kt_config(cfg: Config) -> dict[str, Any]:
    """kt_config, as _normalize_advanced_kt_config and wrapper.py check it."""
    raw = cfg.get("kt_config")
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise _fails("model_args.py _normalize_advanced_kt_config", "LLaMA-Factory `kt_config` must be a "
                     "flat mapping.")
    config = {k: v for k, v in raw.items() if not (k in ("enabled", "kt_skip_expert_loading") and v is True)}
    conflicts = sorted(set(config) & _DERIVED)
    if conflicts:
        raise _fails("model_args.py _normalize_advanced_kt_config", "These `kt_config` values are derived "
                     f"from LLaMA-Factory arguments: {conflicts}.")
    if config.get("kt_num_gpu_experts"):
        raise cfg.unmodelled("kt_config.kt_num_gpu_experts", config["kt_num_gpu_experts"], _GPU_EXPERTS)
    if config.get("kt_expert_weight_format") == "int8" and not config.get("kt_share_backward_bb"):
        raise JobFails("use_kt: true: kt-kernel's sft/wrapper.py wrap_moe_layers_with_kt_wrapper raises "
                       "\"INT8 SFT requires kt_share_backward_bb=true\"")
    return config


def read_lf_kt(cfg: Config, method: str) -> dict[str, Any]:
    """The experts kernel of a ``use_kt`` job ({} without it), after LLaMA-Factory's checks of it."""
    activation = cfg.get("kt_cpu_activation")
    if activation not in (None, "retain", "recompute"):
        raise cfg.bad("kt_cpu_activation", activation, "retain or recompute")
    if not cfg.flag("use_kt"):
        if activation is not None:
            raise _fails("model_args.py __post_init__",
                         "`kt_cpu_activation` is only valid when `use_kt: true`.")
        return {}
    if method != "lora":
        raise _fails("model/adapter.py init_adapter", "KTransformers only supports LoRA finetuning.")
    if cfg.flag("gradient_checkpointing"):
        raise _fails("model_args.py configure_kt_checkpointing", "KTransformers uses LLaMA-Factory's "
                     "`disable_gradient_checkpointing`; remove `gradient_checkpointing: true`.")
    if cfg.get("gradient_checkpointing_kwargs") is not None:
        raise _fails("model_args.py configure_kt_checkpointing", "KTransformers supplies its checkpoint "
                     "context; remove `gradient_checkpointing_kwargs`.")
    if cfg.flag("kt_use_lora_experts"):
        raise cfg.unmodelled("kt_use_lora_experts", True, _GPU_EXPERTS)
    cpu = _policy(cfg)
    config = _kt_config(cfg)
    fmt = str(config.get("kt_expert_weight_format") or "bf16")
    cfg.notes.append("use_kt: the routed experts and their LoRA in host memory, run by kt-kernel; "
                     "attention, dense layers, shared experts and routers (LoRA on the routers: KT's "
                     "nn.Linear proxy) "
                     f"traced on the GPU, the routed output copied back (kt_cpu_activation: {cpu}, "
                     f"kt_expert_weight_format: {fmt})")
    if not cfg.flag("disable_gradient_checkpointing"):
        # configure_kt_checkpointing: use_reentrant_gc = False under KT's checkpoint context
        cfg.ckpt_reentrant = False
        cfg.notes[:] = [n for n in cfg.notes if REENTRANT not in n]
        cfg.notes.append("use_kt: LLaMA-Factory checkpoints with use_reentrant=False under KT's context "
                         "(model_args.py configure_kt_checkpointing)")
    cfg.kt_weight_format = fmt  # the host memory note's, once the model is known (cli/check.py)
    return {"experts_kernel": KTRANSFORMERS}
