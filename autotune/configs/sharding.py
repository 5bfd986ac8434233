"""How a training config spreads its job over GPUs: the keys of FSDP, DeepSpeed and DDP, read into
the request's ``parallel`` and ``reshard_after_forward`` (the GPU count, ``gpus``, is in no training
config: it comes from ``--gpus`` or an accelerate config, configs/accelerate.py).

autotune models FSDP2 as accelerate >= 1.14 prepares it for the Trainer (``fully_shard`` on each
decoder layer and on the root) and DDP (workload/parallel.py); DeepSpeed's ZeRO stages are read
into ``parallel`` zero1/zero2/zero3, which the request refuses by name until they are modelled.
FSDP1 is read from a TrainingArguments fsdp_config with version 1 (and Axolotl's unversioned one) as
the Trainer hands it to accelerate (``read_trainer_fsdp1``). FSDP's CPU offload (FSDP2's
CPUOffloadPolicy, FSDP1's CPUOffload) is read into ``offload_params``. Every other setting that changes
memory (FSDP1 in an accelerate launcher config, another wrap policy) is refused by its key; settings
with no effect on a step's memory are noted with the reason.

Sources: transformers 5.24 ``training_args.py`` (``TrainingArguments._process_fsdp_args`` and
``_apply_legacy_fsdp_to_config``), accelerate 1.15 ``utils/dataclasses.py``
(``FullyShardedDataParallelPlugin.__post_init__``, ``DistributedDataParallelKwargs``), Axolotl's
``utils/schemas/fsdp.py`` and ``utils/schemas/validation.py``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.configs.reading import Config, TrainingConfig
from autotune.errors import InvalidInput, JobFails, UnknownSetting
from autotune.spelling import close_matches, did_you_mean

if TYPE_CHECKING:
    from autotune.request import CheckRequest

FSDP1 = ("FSDP1 (FullyShardedDataParallel's flat parameters) is not modelled: autotune models FSDP2 "
         "(fully_shard), fsdp_version 2")
CPU_OFFLOAD_NOTE = ("FSDP2's CPU offload (accelerate's plugin makes cpu_offload fully_shard's "
                    "CPUOffloadPolicy: utils/dataclasses.py set_cpu_offload): each rank's shards, their "
                    "gradients and the optimizer state in host memory, the optimizer step run there; traced "
                    "(check gives the host memory)")
CPU_OFFLOAD1_NOTE = ("FSDP1's CPU offload (accelerate's plugin makes cpu_offload "
                     "CPUOffload(offload_params=True) at fsdp_version 1: utils/dataclasses.py "
                     "set_cpu_offload): each rank's FlatParameter "
                     "shards, their gradients and the optimizer state in host memory, the optimizer step "
                     "run there; traced (check gives the host memory)")
PIN_NOTE = "pinned or pageable, the host holds the same offloaded bytes and the GPU the same copies"
FSDP_CHECKPOINTING = ("FSDP's own activation checkpointing from accelerate's launcher config is not "
                      "modelled yet: set it in the training config's fsdp_config (activation_checkpointing: "
                      "true), which autotune models")
FSDP_CHECKPOINTING_NOTE = (
    "FSDP's own activation checkpointing, as accelerate 1.15 applies it before sharding (accelerator.py "
    "_prepare_fsdp2, utils/fsdp_utils.py fsdp2_apply_ac): each decoder layer in torch's checkpoint_wrapper "
    "(non-reentrant, preserve_rng_state false), traced; the Trainer refuses it beside gradient checkpointing")
TRAINER_BOTH_CHECKPOINTS = ("transformers' Trainer refuses the two together (trainer.py "
                            "create_accelerator_and_postprocess: \"can't both be set to True. Use FSDP's "
                            "activation checkpointing when using FSDP\")")
WRAP = ("FSDP2 groups other than accelerate's transformer-based auto wrap (one per decoder layer, the "
        "model's _no_split_modules, or per transformer_layer_cls_to_wrap class) are not modelled")
DEEPSPEED_STAGE0 = ("DeepSpeed's engine without ZeRO (stage 0) is not torch DDP: its own gradient buckets "
                    "and, under bf16 or fp16, an optimizer wrapper holding float32 master weights and "
                    "gradients; not modelled")
FSDP2_NOTE = ("FSDP2 (fully_shard on each decoder layer and the root, as accelerate >= 1.14 prepares it for "
              "the Trainer) over the job's GPUs")

# FSDP's sharding strategies (accelerate utils/constants.py FSDP_SHARDING_STRATEGY): with FSDP2,
# transformers maps full_shard and shard_grad_op to reshard_after_forward and refuses the others.
_STRATEGIES = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "HYBRID_SHARD_ZERO2")
_WRAP_POLICIES = ("TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP")
# fsdp_config keys with no effect on a training step's GPU memory under FSDP2, and why.
FSDP_NO_EFFECT = {
    "cpu_ram_efficient_loading": "how the weights are loaded (rank 0 reads them and broadcasts each "
                                 "tensor): a transient of one tensor before training, the same shards after",
    "state_dict_type": "how checkpoints are saved",
    "final_state_dict_type": "how the last checkpoint is saved",
    "sync_module_states": "FSDP1 only (accelerate resets it to None for FSDP2)",
    "use_orig_params": "FSDP1 only (accelerate resets it to None for FSDP2)",
    "limit_all_gathers": "FSDP1 only (accelerate resets it to None for FSDP2)",
    "forward_prefetch": "FSDP1 only: transformers passes it for version 1 alone (FSDP2 prefetches "
                        "implicitly, one layer ahead, which autotune traces)",
    "backward_prefetch": "FSDP1 only: transformers passes it for version 1 alone (FSDP2 prefetches "
                         "implicitly, one layer ahead, which autotune traces)",
    "sharding_strategy": "FSDP1 only: FSDP2 reads reshard_after_forward instead (accelerate warns and "
                         "ignores it)",
    "min_num_params": "read only by the size-based wrap policy",
    "mixed_precision_policy": "not read (the precision comes from bf16/fp16)",
    "xla_fsdp_settings": "read only with xla: true", "xla_fsdp_v2": "read only with xla: true",
    "xla_fsdp_grad_ckpt": "read only with xla: true",
    "cpu_offload_pin_memory": "read only with CPU offload",
    "activation_checkpointing_offload": "read only with FSDP's activation checkpointing",
    "ignored_modules": None,  # refused where set: its parameters stay whole on every rank
}
# DDP settings: DistributedDataParallelKwargs keeps only values other than its defaults
# (accelerate utils/dataclasses.py KwargsHandler.to_kwargs); the Trainer passes each ddp_* set.
DDP_NO_EFFECT = {
    "ddp_find_unused_parameters": "the Reducer's buckets hold the same gradient bytes either way (it "
                                  "changes only when they are rebuilt), plus one int32 per parameter",
    "ddp_broadcast_buffers": "the buffers are re-broadcast in place at each forward",
    "ddp_static_graph": "the Reducer's buckets hold the same gradient bytes (rebuilt one step later)",
    "ddp_bucket_cap_mb": "the buckets hold every trainable gradient whatever their size; autotune traces "
                         "them as the one flat buffer DDP makes before it splits them (docs/multi-gpu.md)",
}


def read_ddp(cfg: Config, keys: tuple[str, ...]) -> None:
    """The ``ddp_*`` keys whose lack of effect is not plain from their name, noted (ddp_timeout and
    ddp_backend, the process group's settings, are in the formats' lists of keys with no effect)."""
    for key in (*keys, "ddp_bucket_cap_mb"):
        value = cfg.get(key)
        if value is not None:
            cfg.notes.append(f"{key}: {value!r}: no effect on GPU memory: {DDP_NO_EFFECT[key]}")


def set_parallel(cfg: Config, key: str, parallel: str, reshard: bool | None = None) -> None:
    cfg.launch["parallel"] = parallel
    cfg.parallel_key = key
    if reshard is not None:
        cfg.launch["reshard_after_forward"] = reshard


def _truth(cfg: Config, key: str, value: Any) -> bool:
    """A boolean as transformers reads it: ``str_to_bool(str(value).lower())``."""
    text = str(value).lower()
    if text in ("y", "yes", "t", "true", "on", "1"):
        return True
    if text in ("n", "no", "f", "false", "off", "0"):
        return False
    raise cfg.bad(key, value, "true or false")


def load_json(cfg: Config, key: str, value: str, what: str) -> dict[str, Any]:
    """The JSON file a key names (as given, from the working directory, as the tool opens it; else
    beside the config)."""
    for path in (Path(value).expanduser(), Path(cfg.file).parent / value):
        if path.is_file():
            try:
                data = json.loads(path.read_text())
            except (OSError, json.JSONDecodeError) as exc:
                raise InvalidInput(f"{key}: {value!r} in {cfg.file!r}: cannot read {what} {str(path)!r}: "
                                   f"{exc}") from exc
            if not isinstance(data, dict):
                raise InvalidInput(f"{key}: {value!r} in {cfg.file!r}: {what} {str(path)!r} must be a JSON "
                                   "mapping")
            return data
    raise InvalidInput(f"{key}: {value!r} in {cfg.file!r}: no such file, here or beside the config: autotune "
                       f"reads the {what} from it; give its path")


# ---------------------------------------------------------------------------------------------
# TrainingArguments' fsdp and fsdp_config


def read_trainer_fsdp(cfg: Config) -> None:
    """``fsdp`` and ``fsdp_config`` as transformers' ``TrainingArguments._process_fsdp_args`` reads
    them (training_args.py, 5.24): nothing without ``fsdp``; ``fsdp_config`` a mapping or a JSON
    path, its ``fsdp_`` prefixes dropped; legacy strings and lists of ``fsdp`` moved into it
    (``_apply_legacy_fsdp_to_config``); version 2 by default, ``reshard_after_forward`` True."""
    fsdp, config = cfg.get("fsdp"), cfg.get("fsdp_config")
    if fsdp is None or fsdp is False or fsdp in ("", []):
        return  # transformers reads fsdp_config only with fsdp (a dump fills it with defaults)
    if not isinstance(fsdp, bool | str | list) or isinstance(fsdp, list) and not all(
            isinstance(item, str) for item in fsdp):
        raise cfg.bad("fsdp", fsdp, "true, or a string or list of FSDP options (full_shard, shard_grad_op, "
                      "offload, auto_wrap)")
    options = fsdp_options(cfg, config, "fsdp_config")
    version = options.get("version", 2)
    if version not in (1, 2, "1", "2"):
        raise cfg.bad("fsdp_config.version", version, "1 or 2")
    version = int(version)
    offload_key = "fsdp_config.cpu_offload" if "cpu_offload" in options else "fsdp"  # before the legacy's
    if not isinstance(fsdp, bool):
        legacy_fsdp(cfg, fsdp, options, version)
    if options.get("xla"):
        raise cfg.unmodelled("fsdp_config.xla", options["xla"], "FSDP on XLA (TPUs) is not modelled")
    if options.get("cpu_offload"):  # _process_fsdp_args, either version: fsdp_plugin_args["cpu_offload"]
        offload(cfg, offload_key, options["cpu_offload"] if offload_key != "fsdp" else fsdp, options, version)
    if "offload_params" in options and _truth(cfg, "fsdp_config.offload_params", options["offload_params"]):
        cfg.notes.append(f"fsdp_config.offload_params: {options['offload_params']!r}: not read by "
                         "transformers (_process_fsdp_args reads cpu_offload): nothing offloaded unless "
                         "cpu_offload is set or the launcher's fsdp_offload_params (FSDP_OFFLOAD_PARAMS) is")
    if version == 1:
        read_trainer_fsdp1(cfg, "fsdp_config", options)
        cfg.notes.append(f"fsdp: {fsdp!r}: fsdp_config version 1 (transformers' _process_fsdp_args)")
        return
    policy = options.get("auto_wrap_policy", "TRANSFORMER_BASED_WRAP")
    if policy not in _WRAP_POLICIES:
        raise cfg.bad("fsdp_config.auto_wrap_policy", policy, f"one of {', '.join(_WRAP_POLICIES)}")
    if policy != "TRANSFORMER_BASED_WRAP":
        raise cfg.unmodelled("fsdp_config.auto_wrap_policy", policy, WRAP)
    wrap_classes(cfg, "fsdp_config.transformer_layer_cls_to_wrap",
                 options.get("transformer_layer_cls_to_wrap"))
    checkpointing = "activation_checkpointing" in options and _truth(
        cfg, "fsdp_config.activation_checkpointing", options["activation_checkpointing"])
    if checkpointing:
        cfg.launch["fsdp_activation_checkpointing"] = True
        cfg.notes.append(f"fsdp_config.activation_checkpointing: true: {FSDP_CHECKPOINTING_NOTE}")
    reshard = _truth(cfg, "fsdp_config.reshard_after_forward", options.get("reshard_after_forward", True))
    handled = {"version", "xla", "cpu_offload", "offload_params", "auto_wrap_policy",
               "transformer_layer_cls_to_wrap", "activation_checkpointing", "reshard_after_forward",
               "cpu_offload_pin_memory"}
    pin_memory(cfg, "fsdp_config", options)
    note_no_effect(cfg, "fsdp_config", options, handled)
    set_parallel(cfg, "fsdp", "fsdp", reshard)
    how = "reshard_after_forward true (full shard)" if reshard else \
        "reshard_after_forward false (each layer kept gathered from its forward to its backward)"
    cfg.notes.append(f"fsdp: {fsdp!r}: {FSDP2_NOTE}, {how} (transformers' _process_fsdp_args: version 2 "
                     "unless fsdp_config says 1)")


# FSDP1 as the Trainer hands it to accelerate (transformers 5.24 _process_fsdp_args, version 1: its
# reshard_after_forward a strategy's name, forward_prefetch, backward_prefetch, use_orig_params,
# sync_module_states and limit_all_gathers; no sharding_strategy), and accelerate 1.15's plugin
# (FullyShardedDataParallelPlugin.__post_init__): sharding_strategy from FSDP_SHARDING_STRATEGY, else
# FULL_SHARD, which prepare_model passes ahead of reshard_after_forward ("sharding_strategy or
# reshard_after_forward"), so a Trainer's FSDP1 job is FULL_SHARD whatever reshard_after_forward says.
FSDP1_NOTE = ("FSDP1 (FullyShardedDataParallel, one FlatParameter per decoder layer and the root's), as "
              "accelerate 1.15's prepare_model wraps it for the Trainer: FULL_SHARD (the plugin's "
              "sharding_strategy default, which prepare_model passes ahead of reshard_after_forward)")
FSDP1_CHECKPOINTING_NOTE = (
    "FSDP's own activation checkpointing under FSDP1, as accelerate's prepare_model applies it "
    "(accelerator.py, its FSDP1 branch, alike in 1.13 and 1.15): after wrapping, "
    "apply_activation_checkpointing(model, checkpoint_wrapper_fn=partial(checkpoint_wrapper, "
    "checkpoint_impl=CheckpointImpl.NO_REENTRANT), "
    "auto_wrap_policy=the plugin's wrap policy): each decoder layer in torch's checkpoint_wrapper inside "
    "its FSDP unit, and for a PEFT model each adapter too (PEFT's policy); traced (backends/fsdp1.py). "
    "The Trainer refuses it beside gradient checkpointing")
FSDP1_NO_EFFECT = {
    "sync_module_states": "rank 0's weights broadcast once before training",
    "limit_all_gathers": None,  # true (accelerate's default) modelled; false refused
}


def read_trainer_fsdp1(cfg: Config, where: str, options: dict[str, Any], key: str = "fsdp") -> None:
    """An FSDP1 ``fsdp_config`` (its ``fsdp_`` prefixes dropped) as the Trainer hands it to
    accelerate (FSDP1_NOTE), into the request's fsdp_version 1 and fsdp1_config; what it cannot
    model refused by its key. The CPU offload is read by the caller (``offload``)."""
    checkpointing = "activation_checkpointing" in options and _truth(
        cfg, f"{where}.activation_checkpointing", options["activation_checkpointing"])
    policy = options.get("auto_wrap_policy", "TRANSFORMER_BASED_WRAP")
    if policy != "TRANSFORMER_BASED_WRAP":
        raise cfg.unmodelled(f"{where}.auto_wrap_policy", policy, "FSDP1 units other than the "
                             "transformer-based auto wrap's (one per decoder layer, or per "
                             "transformer_layer_cls_to_wrap class) are not modelled")
    wrap_classes(cfg, f"{where}.transformer_layer_cls_to_wrap", options.get("transformer_layer_cls_to_wrap"))
    strategy = str(options.get("sharding_strategy", "FULL_SHARD")).upper()
    if strategy not in _STRATEGIES:
        raise cfg.bad(f"{where}.sharding_strategy", options["sharding_strategy"], ", ".join(_STRATEGIES))
    if strategy != "FULL_SHARD":
        raise cfg.unmodelled(f"{where}.sharding_strategy", options["sharding_strategy"],
                             "transformers does not pass it to accelerate, whose FSDP1 plugin takes "
                             "FSDP_SHARDING_STRATEGY from the launcher, else FULL_SHARD: only FULL_SHARD is "
                             "modelled from a training config")
    reshard = options.get("reshard_after_forward")
    if reshard is not None and str(reshard).upper() not in _STRATEGIES:  # ShardingStrategy[...] raises
        raise cfg.bad(f"{where}.reshard_after_forward", reshard, "with FSDP1 a sharding strategy, one of "
                      f"{', '.join(_STRATEGIES)} (accelerate's FullyShardedDataParallelPlugin refuses "
                      "others)")
    if reshard is not None and str(reshard).upper() != "FULL_SHARD":
        cfg.notes.append(f"{where}.reshard_after_forward: {reshard!r}: no effect with FSDP1 under the "
                         "Trainer: accelerate's plugin sets sharding_strategy FULL_SHARD, which "
                         "prepare_model passes ahead of it")
    if "limit_all_gathers" in options and not _truth(cfg, f"{where}.limit_all_gathers",
                                                     options["limit_all_gathers"]):
        raise cfg.unmodelled(f"{where}.limit_all_gathers", options["limit_all_gathers"],
                             "FSDP1 without its rate limiter lets the CPU issue all-gathers ahead of the "
                             "GPU's frees; only limit_all_gathers true (accelerate's default) is modelled")
    prefetch = str(options.get("backward_prefetch", "NO_PREFETCH")).upper()
    if prefetch not in ("NO_PREFETCH", "BACKWARD_PRE", "BACKWARD_POST"):
        raise cfg.bad(f"{where}.backward_prefetch", options["backward_prefetch"],
                      "BACKWARD_PRE, BACKWARD_POST or NO_PREFETCH")
    settings = {"use_orig_params": _truth(cfg, f"{where}.use_orig_params",
                                          options.get("use_orig_params", True)),
                "forward_prefetch": _truth(cfg, f"{where}.forward_prefetch",
                                           options.get("forward_prefetch", False)),
                "backward_prefetch": None if prefetch == "NO_PREFETCH" else prefetch}
    for name in ("sync_module_states",):
        if name in options:
            cfg.notes.append(f"{where}.{name}: {options[name]!r}: no effect on GPU memory: "
                             f"{FSDP1_NO_EFFECT[name]}")
    handled = {"version", "fsdp_version", "xla", "cpu_offload", "offload_params", "activation_checkpointing",
               "auto_wrap_policy", "transformer_layer_cls_to_wrap", "sharding_strategy",
               "reshard_after_forward", "limit_all_gathers", "backward_prefetch", "forward_prefetch",
               "use_orig_params",
               "sync_module_states", "cpu_offload_pin_memory"}
    if "cpu_offload_pin_memory" in options:
        cfg.notes.append(f"{where}.cpu_offload_pin_memory: {options['cpu_offload_pin_memory']!r}: no effect "
                         "with FSDP1, whose CPUOffload has no such setting (_flat_param.py "
                         "init_flat_param_attributes pins the offloaded shard and gradient); " + PIN_NOTE)
    note_no_effect(cfg, where, options, handled)
    set_parallel(cfg, key, "fsdp", True)
    cfg.launch["fsdp_version"] = 1
    cfg.launch["fsdp1_config"] = json.dumps(settings)
    cfg.notes.append(f"{where}: {FSDP1_NOTE}; use_orig_params {str(settings['use_orig_params']).lower()}, "
                     f"forward_prefetch {str(settings['forward_prefetch']).lower()}, backward_prefetch "
                     f"{prefetch}")
    if checkpointing:  # the Trainer's refusal beside gradient checkpointing is its reader's
        cfg.launch["fsdp_activation_checkpointing"] = True
        cfg.notes.append(f"{where}.activation_checkpointing: true: {FSDP1_CHECKPOINTING_NOTE}")


def offload(cfg: Config, key: str, value: Any, options: dict[str, Any], version: int = 2) -> None:
    """FSDP's CPU offload (``version`` 2: FSDP2's, 1: FSDP1's), set by ``key``: the request's
    offload_params, noted."""
    cfg.launch["offload_params"] = True
    cfg.notes.append(f"{key}: {value!r}: {CPU_OFFLOAD_NOTE if version == 2 else CPU_OFFLOAD1_NOTE}")


def pin_memory(cfg: Config, where: str, options: dict[str, Any]) -> None:
    """cpu_offload_pin_memory (Axolotl's FSDP_CPU_OFFLOAD_PIN_MEMORY: CPUOffloadPolicy.pin_memory),
    noted as FSDP_NO_EFFECT says without offload, else as PIN_NOTE."""
    if "cpu_offload_pin_memory" in options:
        why = PIN_NOTE if cfg.launch.get("offload_params") else FSDP_NO_EFFECT["cpu_offload_pin_memory"]
        cfg.notes.append(f"{where}.cpu_offload_pin_memory: {options['cpu_offload_pin_memory']!r}: no effect "
                         f"on GPU memory: {why}")


def fsdp_options(cfg: Config, config: Any, key: str, keep: tuple[str, ...] = ()) -> dict[str, Any]:
    """An ``fsdp_config``: a mapping, or (TrainingArguments) the path of a JSON one; its keys without
    their ``fsdp_`` prefix (but those in ``keep``)."""
    if config is None:
        return {}
    if isinstance(config, str):
        config = load_json(cfg, key, config, "FSDP config")
    if not isinstance(config, dict):
        raise cfg.bad(key, config, "a mapping or the path of a JSON file")
    return {(name[5:] if name.startswith("fsdp_") and name not in keep else name): value
            for name, value in config.items()}


def legacy_fsdp(cfg: Config, fsdp: str | list[str], options: dict[str, Any], version: int) -> None:
    """``_apply_legacy_fsdp_to_config``: a sharding strategy becomes reshard_after_forward (unless
    fsdp_config sets it), offload becomes cpu_offload, auto_wrap is the default already."""
    items = fsdp.split() if isinstance(fsdp, str) else list(fsdp)
    for item in items:
        if item.upper() in _STRATEGIES:
            if version == 2:
                # As transformers compares them: the lower-case names only.
                if item == "full_shard":
                    options.setdefault("reshard_after_forward", True)
                elif item == "shard_grad_op":
                    options.setdefault("reshard_after_forward", False)
                else:
                    raise JobFails(f"fsdp: {item!r} in {cfg.file!r} is only available with FSDP1 "
                                   "(transformers' _apply_legacy_fsdp_to_config raises with FSDP2, the "
                                   "default): write full_shard or shard_grad_op")
            else:  # FSDP1: the strategy's name, lower-cased as given
                options.setdefault("reshard_after_forward", item)
        elif item == "offload":
            options.setdefault("cpu_offload", True)
        elif item != "auto_wrap":
            raise cfg.bad("fsdp", fsdp, "made of full_shard, shard_grad_op, offload and auto_wrap (unknown "
                          f"option {item!r})")


def wrap_classes(cfg: Config, key: str, value: Any) -> None:
    """transformer_layer_cls_to_wrap: the classes FSDP wraps one by one, the request's fsdp_wrap
    (workload/fsdp_wrap.py), checked against the model once it is known (``check_launch``)."""
    if value is None:
        return
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
        raise cfg.bad(key, value, "a class name or a list of them")
    # transformers joins a list with commas (_process_fsdp_args), the launcher exports the string
    # (FSDP_TRANSFORMER_CLS_TO_WRAP), and accelerate's plugin splits it on commas, unstripped
    parts = [part for name in names for part in name.split(",")]
    if not parts or any(not part.isidentifier() for part in parts):
        raise cfg.bad(key, value, "class names, comma-separated without spaces (accelerate's plugin splits "
                      "the string on commas and looks each part up as written)")
    cfg.wrap_classes = tuple(sorted(set(parts)))
    cfg.wrap_key = key
    cfg.launch["fsdp_wrap"] = ",".join(cfg.wrap_classes)
    which = "that class" if len(cfg.wrap_classes) == 1 else "those classes"
    cfg.notes.append(f"{key}: {value!r}: FSDP wraps each module of {which} on its own, as accelerate's "
                     "transformer-based policy does (the rest in the root's group); traced")


def note_no_effect(cfg: Config, where: str, options: dict[str, Any], handled: set[str]) -> None:
    """The FSDP options not read elsewhere: noted when set (with why they do not change memory),
    refused when they do, refused as unknown when FSDP has no such option."""
    for name, value in options.items():
        if name in handled:
            continue
        if name not in FSDP_NO_EFFECT:
            close = close_matches(name, [(known, known) for known in sorted(FSDP_NO_EFFECT.keys() | handled)])
            hint = f" ({did_you_mean(close)})" if close else ""
            raise UnknownSetting(f"unknown key {where}.{name} in {cfg.file!r}{hint}: autotune cannot tell "
                                 "whether it changes memory; correct the key, or remove it")
        why = FSDP_NO_EFFECT[name]
        if why is None:
            if value:
                raise cfg.unmodelled(f"{where}.{name}", value, "modules FSDP leaves unsharded (whole on "
                                     "every GPU) are not modelled")
            continue
        if value not in (None, False, "", [], {}):
            cfg.notes.append(f"{where}.{name}: {value!r}: no effect on GPU memory: {why}")


def check_launch(config: TrainingConfig, request: CheckRequest) -> None:
    """What a config's launch needs once the flags are merged in (``request``): the GPU count of a
    job it spreads over GPUs (and the refusals that turn on it: TrainingConfig.by_gpu_count), and
    FSDP's wrapped classes checked against the model's modules (an error naming the config's key; the
    request checks --fsdp-wrap again, the same way)."""
    step = request.step
    if step.parallel is not None and step.gpus is None:
        where = " and ".join(repr(path) for path, _ in config.files)
        raise _about_gpus(InvalidInput.naming(
            f"{where} spreads the job over GPUs with {step.parallel} ({config.parallel_key or 'parallel'}): "
            "give {gpus} N, the GPUs it launches on, every node's together (no training config says how "
            "many)"))
    if config.by_gpu_count is not None:
        one, more = config.by_gpu_count
        if (step.gpus or 1) > 1:
            raise more
        if one is not None:
            raise one
    fixed = config.request.step.gpus
    if config.mesh is not None and fixed is not None and step.gpus != fixed:
        raise _about_gpus(InvalidInput.naming(
            f"{{gpus}} {step.gpus}, but {config.mesh} in {config.files[0][0]!r} make {fixed} GPUs: "
            "accelerate's ParallelismConfig refuses a world size other than the mesh's product "
            "(parallelism_config.py _validate_accelerator: \"ParallelismConfig total_size ... does not "
            f"match num_processes\"); give {{gpus}} {fixed}, or change the sizes"))
    if config.wrap_classes and step.model is not None and step.fsdp_wrap == ",".join(config.wrap_classes):
        from autotune.request import Findings, resolve_model
        from autotune.workload.fsdp_wrap import resolve_wrap
        from autotune.workload.models import task_for

        spec = resolve_model(step, Findings())  # an unknown model is refused later, by the check
        if spec is not None:
            try:
                task = task_for(spec, step.task)
            except InvalidInput:
                return  # refused by the check itself, with the rest
            resolve_wrap(spec, task, config.wrap_classes, config.wrap_key or "transformer_layer_cls_to_wrap")


def _about_gpus(exc: InvalidInput) -> InvalidInput:
    exc.field = "gpus"
    return exc


# ---------------------------------------------------------------------------------------------
# DeepSpeed

# The DeepSpeed configs the tools ship, by the path their examples give, and the ZeRO stage each
# sets (zero_optimization.stage): Axolotl's deepspeed_configs/ (fetched by `axolotl fetch
# deepspeed_configs`) and LLaMA-Factory's examples/deepspeed/.
SHIPPED_DEEPSPEED = {
    "deepspeed_configs/zero1.json": 1, "deepspeed_configs/zero1_torch_compile.json": 1,
    "deepspeed_configs/zero2.json": 2, "deepspeed_configs/zero2_torch_compile.json": 2,
    "deepspeed_configs/zero3.json": 3, "deepspeed_configs/zero3_bf16.json": 3,
    "deepspeed_configs/zero3_bf16_cpuoffload_params.json": 3,
    "deepspeed_configs/zero3_bf16_cpuoffload_all.json": 3,
    "examples/deepspeed/ds_z0_config.json": 0, "examples/deepspeed/ds_z2_config.json": 2,
    "examples/deepspeed/ds_z2_offload_config.json": 2, "examples/deepspeed/ds_z2_autotp_config.json": 2,
    "examples/deepspeed/ds_z3_config.json": 3, "examples/deepspeed/ds_z3_offload_config.json": 3,
    "examples/deepspeed/ds_z3_fp8_config.json": 3,
}


def read_deepspeed(cfg: Config, key: str = "deepspeed") -> None:
    """``deepspeed``: a DeepSpeed config (a mapping, or the path of its JSON; a tool's shipped file
    by the path its examples give) read for its ZeRO stage, ``parallel`` zero1/zero2/zero3."""
    value = cfg.get(key)
    if value is None or value in ("", {}):
        return
    config: dict[str, Any] | None = None
    if isinstance(value, dict):
        config, source = value, "the mapping"
        stage = deepspeed_stage(cfg, key, value)
    elif isinstance(value, str):
        shipped = next((stage for path, stage in SHIPPED_DEEPSPEED.items()
                        if value.replace("\\", "/").lstrip("./").endswith(path)), None)
        local = [p for p in (Path(value).expanduser(), Path(cfg.file).parent / value) if p.is_file()]
        if local or shipped is None:
            config, source = load_json(cfg, key, value, "DeepSpeed config"), value
            stage = deepspeed_stage(cfg, key, config)
        else:
            stage, source = shipped, f"{value}, the tool's shipped file"
            config = SHIPPED_ZERO.get(value.replace("\\", "/").lstrip("./").rsplit("/", 1)[-1])
    else:
        raise cfg.bad(key, value, "the path of a DeepSpeed JSON config, or its mapping")
    zero(cfg, key, value, stage, source)
    if config is not None:
        read_zero_config(cfg, key, config, source)


# The zero_optimization of Axolotl's shipped files (deepspeed_configs/, Axolotl 067b021), described
# from their source, not copied: zero1 with overlap_comm; zero2 with the optimizer offloaded to the
# CPU; zero3 with "auto" sizes, overlap_comm, contiguous gradients, sub_group_size 0 and
# max_live_parameters / max_reuse_distance 0; zero3_bf16 the same, saving 16-bit weights
# (gather_16bit_weights_on_model_save); its cpuoffload_params the parameters offloaded to pinned host
# memory, cpuoffload_all the optimizer too, both with zero_force_ds_cpu_optimizer false.
_AXOLOTL_ZERO3 = {
    "stage": 3, "overlap_comm": True, "contiguous_gradients": True, "sub_group_size": 0,
    "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
    "stage3_param_persistence_threshold": "auto", "max_live_parameters": 0, "max_reuse_distance": 0}
_AXOLOTL_ZERO3_BF16 = {**_AXOLOTL_ZERO3, "gather_16bit_weights_on_model_save": True}
_PINNED_CPU = {"device": "cpu", "pin_memory": True}
SHIPPED_ZERO: dict[str, dict[str, Any]] = {
    "zero1.json": {"zero_optimization": {"stage": 1, "overlap_comm": True}},
    "zero2.json": {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"},
                                         "contiguous_gradients": True, "overlap_comm": True}},
    "zero3.json": {"zero_optimization": _AXOLOTL_ZERO3},
    "zero3_bf16.json": {"zero_optimization": _AXOLOTL_ZERO3_BF16},
    "zero3_bf16_cpuoffload_params.json": {
        "zero_force_ds_cpu_optimizer": False, "zero_allow_untested_optimizer": True,
        "zero_optimization": {**_AXOLOTL_ZERO3_BF16, "offload_param": _PINNED_CPU}},
    "zero3_bf16_cpuoffload_all.json": {
        "zero_force_ds_cpu_optimizer": False, "zero_allow_untested_optimizer": True,
        "zero_optimization": {**_AXOLOTL_ZERO3_BF16, "offload_optimizer": _PINNED_CPU,
                              "offload_param": _PINNED_CPU}},
}


def read_zero_config(cfg: Config, key: str, config: dict[str, Any], source: str) -> None:
    """A DeepSpeed config's zero_optimization into the request's ``zero_config`` (workload/zero.py
    checks each key: modelled, no effect, or refused by name); its top-level keys that change memory
    and are not modelled refused by name."""
    from autotune.workload.zero import read_settings, settings_text

    if config.get("fp16", {}).get("auto_cast") is True or config.get("torch_autocast", {}).get("enabled"):
        raise cfg.unmodelled(f"{key}: fp16.auto_cast", True, "DeepSpeed's autocast of the forward is not "
                             "modelled (the engine casts the model to 16 bits instead)")
    for name in ("activation_checkpointing", "compression_training", "sequence_parallel_size",
                 "tensor_parallel", "data_efficiency", "flops_profiler"):
        if config.get(name):
            raise cfg.unmodelled(f"{key}: {name}", config[name], f"DeepSpeed's {name} is not modelled")
    zero_optimization = config.get("zero_optimization") or {}
    try:
        settings = read_settings(zero_optimization, f"{key} ({source})", cfg.notes)
    except InvalidInput as exc:
        exc.field = "zero_config"
        raise
    cfg.launch["zero_config"] = settings_text(settings)
    if config.get("zero_force_ds_cpu_optimizer") is False and "offload_optimizer" in dict(settings):
        cfg.notes.append(f"{key}: zero_force_ds_cpu_optimizer: false: {CLIENT_OPTIMIZER_OFFLOADED}")


# What ``zero_force_ds_cpu_optimizer: false`` changes under offload_optimizer: accelerate 1.15
# (accelerator.py ``_prepare_deepspeed``) maps the Trainer's optimizer to DeepSpeedCPUAdam
# (utils/deepspeed.py ``map_pytorch_optim_to_deepspeed``) only where the key is true, its default;
# false, deepspeed 0.19 (engine.py ``_configure_optimizer``) keeps the Trainer's own optimizer and
# steps it on the host's float32 partitions. The GPU holds the same; the host figure is modelled
# as DeepSpeedCPUAdam's (backends/deepspeed.py cpu_adam).
CLIENT_OPTIMIZER_OFFLOADED = (
    "DeepSpeed steps the Trainer's own optimizer on the host partitions, not DeepSpeedCPUAdam: no effect "
    "on GPU memory; the host memory figure is DeepSpeedCPUAdam's float32 state (an 8-bit optimizer's "
    "host state is smaller)")


def deepspeed_stage(cfg: Config, key: str, config: dict[str, Any]) -> int:
    zero_config = config.get("zero_optimization") or {}
    if not isinstance(zero_config, dict):
        raise cfg.bad(f"{key}: zero_optimization", zero_config, "a mapping")
    stage = zero_config.get("stage", 0)  # DeepSpeed's default: no ZeRO
    if isinstance(stage, bool) or stage not in (0, 1, 2, 3):
        raise cfg.bad(f"{key}: zero_optimization.stage", stage, "0, 1, 2 or 3")
    return int(stage)


def zero(cfg: Config, key: str, value: Any, stage: int, source: str) -> None:
    """The ZeRO stage read into ``parallel`` (whose refusal names it); stage 0 refused here."""
    if stage == 0:
        raise cfg.unmodelled(key, value, DEEPSPEED_STAGE0)
    set_parallel(cfg, key, f"zero{stage}")
    cfg.notes.append(f"{key}: DeepSpeed ZeRO stage {stage} (zero_optimization.stage in {source})")
