"""Axolotl keys about how the model is built and launched, rather than how it steps: Ray's launcher
(``use_ray``), random weights (``reinit_weights``), the multimodal towers frozen
(``freeze_mm_modules``) and Gemma 4's split attention (``gemma4_hybrid_attn_impl``). Each is read as
Axolotl's source at the mirror's HEAD (067b021c) acts on it; what changes memory in a way autotune
does not model is refused by name.
"""

from __future__ import annotations

import re
from typing import Any

from autotune.configs.reading import Config, unset
from autotune.errors import JobFails, UnmodelledSetting
from autotune.workload import gemma4_hybrid
from autotune.workload.step import FLASH_ATTENTION_2

# utils/freeze.py _MM_MODULE_PREFIXES: the path components freeze_mm_modules freezes.
MM_MODULES = ("vision_tower", "vision_model", "vision_encoder", "embed_vision", "multi_modal_projector",
              "visual", "audio_tower", "audio_model", "embed_audio")
# What reinit_weights leaves the step as is: the marker check_patched_model reads (TrainingConfig.
# from_pretrained), once the checkpoint's dtype is known.
REINIT = "reinit_weights"
# cls_model_config's marker (TrainingConfig.from_pretrained, "cls_model_config:<class>"), checked against
# the model's config class by check_config_class once the model is known.
CONFIG_CLASS = "cls_model_config:"
# utils/schemas/config.py validate_large_head_attention: the policies large_head_attention takes.
LARGE_HEAD_POLICIES = ("sdpa", "auto", "triton_flash")


def read_loading(cfg: Config, method: str | None, dtype: str) -> None:
    """All four but the attention (``read_hybrid_attention``), given the adapter method (None: a full
    fine-tune) and the weights' dtype the reader chose (Axolotl's cfg.torch_dtype)."""
    _ray(cfg)
    _reinit_weights(cfg, method, dtype)
    _freeze_mm_modules(cfg, method)
    _config_class(cfg)


def _ray(cfg: Config) -> None:
    """``use_ray``: cli/train.py runs the job as Ray Train's TorchTrainer with
    ScalingConfig(num_workers=ray_num_workers, resources_per_worker=resources_per_worker
    (default {"GPU": 1}), use_gpu=True); each worker (ray_train_func) runs the ordinary training
    pipeline (do_train) as one rank of a torch.distributed job: the job is the same config launched
    on ray_num_workers GPUs. Without use_ray the ray_* keys are not read (schemas/integrations.py
    RayConfig)."""
    use = cfg.get("use_ray")
    workers, resources = cfg.get("ray_num_workers"), cfg.get("resources_per_worker")
    cfg.get("ray_run_name")  # the run's name under output_dir (RunConfig): no effect on memory
    if use is not None and not isinstance(use, bool):
        raise cfg.bad("use_ray", use, "true or false")
    if not use:
        if not unset(workers) or not unset(resources):
            cfg.notes.append("ray_num_workers, resources_per_worker: read by Axolotl's Ray launcher only "
                             "(use_ray: true): no effect here")
        return
    count = 1 if workers is None else cfg.positive("ray_num_workers", "Ray workers")
    if resources is not None and resources != {"GPU": 1}:
        raise cfg.unmodelled("resources_per_worker", resources, "autotune models Ray's default of one GPU "
                             "per worker (schemas/integrations.py RayConfig), each worker one rank")
    assert count is not None
    cfg.launch["gpus"] = count
    cfg.notes.append(f"use_ray: true: Ray Train's TorchTrainer runs {count} worker(s), one GPU each "
                     "(cli/train.py: ScalingConfig(num_workers=ray_num_workers, resources_per_worker "
                     "{'GPU': 1})), each one rank of the same training job: the job on "
                     f"{count} GPU(s)")


def _reinit_weights(cfg: Config, method: str | None, dtype: str) -> None:
    """``reinit_weights``: loaders/model.py _build_model calls _load_model_from_config in place of
    from_pretrained: ``AutoModelForCausalLM.from_config(config=model_config)`` with none of the
    model_kwargs (no dtype, no quantization_config, no device_map); the attention is still set, on
    model_config (_set_attention_config). The weights are random, the same shapes; their dtype is
    the checkpoint config's (transformers' _from_config: ``dtype = kwargs.pop("dtype",
    config.dtype)``), checked against the one Axolotl would load (cfg.torch_dtype) once the model is
    known (axolotl.check_patched_model). A quantized base is not built quantized: refused."""
    value = cfg.get(REINIT)
    if value is not None and not isinstance(value, bool):
        raise cfg.bad(REINIT, value, "true or false")
    if not value:
        return
    if method in ("qlora", "lora_8bit") or not unset(cfg.data.get("model_quantization_config")):
        raise cfg.unmodelled(REINIT, True, "from_config takes none of from_pretrained's model_kwargs "
                             "(loaders/model.py _load_model_from_config), so the base is built unquantized "
                             "and then prepared for k-bit training; not modelled")
    cfg.from_pretrained += (REINIT,)
    cfg.notes.append(f"reinit_weights: true: random weights of the same shapes (loaders/model.py "
                     f"_load_model_from_config: from_config), in the checkpoint config's dtype, which must "
                     f"be {dtype} as the config trains it: no other effect on memory")


def check_reinit_dtype(spec: Any, trained_dtype: str, path: str) -> None:
    """reinit_weights builds the model in ``spec``'s config dtype (transformers' _from_config), not
    in the dtype Axolotl loads a checkpoint in (cfg.torch_dtype): refused where they differ."""
    from autotune.errors import UnmodelledSetting

    dtype = getattr(spec.config, "dtype", None) or getattr(spec.config, "torch_dtype", None)
    name = str(dtype).removeprefix("torch.") if dtype is not None else "float32"
    if name != trained_dtype:
        raise UnmodelledSetting(f"reinit_weights: true in {path!r} is not modelled for {spec.name}: "
                                f"from_config builds its weights in the checkpoint config's dtype ({name}; "
                                "transformers' _from_config: config.dtype), not in the "
                                f"{trained_dtype} Axolotl loads them in from_pretrained (cfg.torch_dtype)")


def _freeze_mm_modules(cfg: Config, method: str | None) -> None:
    """``freeze_mm_modules``: train.py calls utils/freeze.py freeze_mm_modules on the loaded model
    (after any LoRA): requires_grad False on every parameter one of whose dotted path components is
    a vision/audio module name (MM_MODULES). With LoRA whose target regex reaches the language
    model alone (a literal prefix through ``language_model``) and nothing saved whole, no trained
    parameter has such a component: no effect. Otherwise it takes the towers' parameters (or their
    adapters) out of training, which is not modelled."""
    value = cfg.get("freeze_mm_modules")
    if value is not None and not isinstance(value, bool):
        raise cfg.bad("freeze_mm_modules", value, "true or false")
    if not value:
        return
    targets = cfg.data.get("lora_target_modules")
    saved = cfg.data.get("lora_modules_to_save")
    if method is not None and isinstance(targets, str) and unset(saved) \
            and not cfg.data.get("lora_target_linear") and _language_model_only(targets):
        cfg.notes.append(f"freeze_mm_modules: true: freezes the vision/audio towers' parameters (utils/"
                         f"freeze.py), frozen already under {method}; the adapters, on {targets!r}, lie in "
                         "the language model alone: no effect on memory")
        return
    why = ("the towers' parameters frozen in a full fine-tune" if method is None else
           "with LoRA targets that may reach the vision/audio towers (or modules saved whole), their "
           "adapters frozen")
    raise cfg.unmodelled("freeze_mm_modules", True, f"{why} (utils/freeze.py freeze_mm_modules: every "
                         f"parameter under {', '.join(MM_MODULES)}) is not modelled")


def _language_model_only(pattern: str) -> bool:
    """A PEFT target regex (re.fullmatch on each module's name) whose literal start runs through a
    ``language_model`` component, with no vision/audio component before it."""
    literal = re.match(r"[\w.]*", pattern.replace(r"\.", "."))
    parts = (literal.group(0) if literal else "").split(".")
    if "language_model" not in parts[:-1]:
        return False
    return not any(part in MM_MODULES for part in parts[:parts.index("language_model")])


def read_hybrid_attention(cfg: Config, attn: str | None) -> tuple[str | None, str | None]:
    """``gemma4_hybrid_attn_impl``: the job's attention and the Step's ``gemma4_hybrid_attn`` ("packed"
    or "unpacked"; None where off). loaders/patch_manager.py _apply_gemma_hybrid_attention keeps
    flash_attention_2 on the sliding-window layers and gives the global ones (head_dim 512) Axolotl's
    packing-aware SDPA (monkeypatch/gemma4_hybrid_mask.py GLOBAL_PACKED_SDPA), which builds its own
    block mask where batches are packed (``set_large_head_packed(bool(cfg.sample_packing))``): emulated
    and traced (workload/gemma4_hybrid.py). utils/schemas/config.py normalize_attn_implementation sets
    attn_implementation flash_attention_2 where neither it nor a legacy flag is given, and refuses
    another attn_implementation."""
    value = cfg.get(gemma4_hybrid.KEY)
    if value is not None and not isinstance(value, bool):
        raise cfg.bad(gemma4_hybrid.KEY, value, "true or false")
    if not value:
        return attn, None
    if not unset(cfg.data.get("attn_implementation")) and attn != FLASH_ATTENTION_2:
        raise JobFails(f"gemma4_hybrid_attn_impl with attn_implementation {attn} in {cfg.file!r}: Axolotl "
                       "refuses it (utils/schemas/config.py normalize_attn_implementation: "
                       "\"gemma4_hybrid_attn_impl requires attn_implementation=flash_attention_2 "
                       "(sliding-window layers run under FA2)\")")
    if attn is None:
        attn = FLASH_ATTENTION_2
        cfg.notes.append("attn_implementation: not set: flash_attention_2, which Axolotl's schema sets for "
                         "gemma4_hybrid_attn_impl (utils/schemas/config.py normalize_attn_implementation)")
    elif attn != FLASH_ATTENTION_2:  # a legacy flag other than flash_attention: the schema lets it by
        raise cfg.unmodelled(gemma4_hybrid.KEY, True, f"with attention {attn} on the sliding-window layers "
                             "(a legacy attention flag) in place of flash_attention_2")
    _large_head_policy(cfg)
    packed = cfg.flag("sample_packing")
    return attn, "packed" if packed else "unpacked"


def _large_head_policy(cfg: Config) -> None:
    """``large_head_attention`` (or the deprecated ``flash_attn_d512``: true is "auto"):
    monkeypatch/attention/large_head.py resolve_large_head_policy. "sdpa" (the default) is what
    workload/gemma4_hybrid.py models; "auto" and "triton_flash" route packed global layers through
    Axolotl's Triton flash_d512 kernel (monkeypatch/attention/flash_attn_d512.py), not emulated."""
    policy = cfg.get("large_head_attention")
    d512 = cfg.get("flash_attn_d512")
    if d512 is not None and not isinstance(d512, bool):
        raise cfg.bad("flash_attn_d512", d512, "true or false")
    if unset(policy):
        policy = "auto" if d512 else "sdpa"
    if not isinstance(policy, str) or policy.lower() not in LARGE_HEAD_POLICIES:
        raise cfg.bad("large_head_attention", policy, ", ".join(LARGE_HEAD_POLICIES))
    if policy.lower() != "sdpa":
        key = "large_head_attention" if not unset(cfg.get("large_head_attention")) else "flash_attn_d512"
        raise cfg.unmodelled(key, cfg.data[key], "Axolotl's Triton flash_d512 kernel on the 512-wide heads "
                             "of packed rows (monkeypatch/attention/large_head.py flash_d512_route) is not "
                             "emulated; large_head_attention sdpa is")


def _config_class(cfg: Config) -> None:
    """``cls_model_config``: loaders/utils.py load_model_config builds the model's config with
    ``getattr(transformers, cls_model_config).from_pretrained(base_model)`` instead of AutoConfig's; a
    name transformers does not have fails there (AttributeError). The class is compared with the
    model's once it is known (check_config_class)."""
    name = cfg.get("cls_model_config")
    if unset(name):
        return
    import transformers

    if not isinstance(name, str) or not name.isidentifier() or not hasattr(transformers, name):
        raise JobFails(f"cls_model_config {name!r} in {cfg.file!r}: transformers has no such class, "
                       "and Axolotl's load_model_config fails on it (getattr(transformers, "
                       "cls_model_config))")
    cfg.from_pretrained += (CONFIG_CLASS + name,)
    cfg.notes.append(f"cls_model_config: {name}: the model's config built with it (loaders/utils.py "
                     "load_model_config): no change where it is the class AutoConfig builds, as checked")


def check_config_class(config_class: str, markers: tuple[str, ...], path: str) -> None:
    """``cls_model_config`` against the model's config class (``config_class``: its name): the
    class AutoConfig gives is no change (the examples name it, examples/eaft/eaft-example.yml's
    Gemma3TextConfig for google/gemma-3-1b-it); another class reads the checkpoint's config.json with
    its own defaults for the keys it leaves out, and its own model classes: not modelled."""
    for marker in markers:
        if not marker.startswith(CONFIG_CLASS):
            continue
        name = marker.removeprefix(CONFIG_CLASS)
        if name != config_class:
            raise UnmodelledSetting(f"cls_model_config: {name!r} in {path!r} is not modelled: the model's "
                                    f"config class is {config_class} (what AutoConfig builds), and another "
                                    "class reads its config.json with its own defaults and model classes "
                                    "(loaders/utils.py load_model_config)")
