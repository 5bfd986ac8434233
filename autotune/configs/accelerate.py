"""An accelerate config YAML (what ``accelerate config`` writes and ``accelerate launch
--config_file`` reads): the GPUs a job launches on and how it spreads over them, read into the
request's ``gpus``, ``parallel``, ``nodes`` and ``reshard_after_forward``.

People launch ``accelerate launch --config_file acc.yaml train.py --config train.yaml``: the
accelerate config says the launch, the training config the step. ``--from-config`` takes both,
and ``combine`` puts them together as the Trainer does (the Trainer's own FSDP settings win over
the launcher's; TrainingArguments takes ``mixed_precision`` as its default precision).

Sources (accelerate 1.15): commands/launch.py ``_validate_launch_command`` (the config's keys to
the launcher's arguments; ``fsdp_config`` keys gain an ``fsdp_`` prefix), utils/launch.py
``prepare_multi_gpu_env`` (``num_processes`` is the total over machines: each runs
``num_processes // num_machines``), utils/dataclasses.py ``FullyShardedDataParallelPlugin`` and
``DeepSpeedPlugin``, parallelism_config.py ``ParallelismConfig``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from autotune.configs.reading import COMPILE, PARALLEL, Config, TrainingConfig, words
from autotune.configs.sharding import (
    CPU_OFFLOAD1_NOTE,
    FSDP1,
    FSDP2_NOTE,
    FSDP_CHECKPOINTING,
    WRAP,
    deepspeed_stage,
    fsdp_options,
    load_json,
    note_no_effect,
    offload,
    pin_memory,
    set_parallel,
    wrap_classes,
    zero,
)
from autotune.defaults import DEFAULT_MODE_NAME
from autotune.errors import InvalidInput, JobFails
from autotune.request import request_from, values_of
from autotune.workload.modes import Mode, parse_mode

# Keys only an accelerate config has (commands/config/config_args.py BaseConfig).
ACCELERATE_MARKERS = words("compute_environment distributed_type")
# ClusterConfig's keys with no effect on a step's GPU memory: where and how the job is launched.
_NO_EFFECT = words(
    "compute_environment debug machine_rank gpu_ids main_process_ip main_process_port rdzv_backend "
    "same_network main_training_function enable_cpu_affinity downcast_bf16 tpu_name tpu_zone "
    "tpu_use_cluster tpu_use_sudo command_file commands tpu_vm tpu_env mpirun_config ipex_config "
    "deepspeed_multinode_launcher")
_PRECISIONS = {"bf16": "bf16", "fp16": "amp"}  # accelerate's mixed_precision -> autotune's mode
_HANDLED = {"version", "reshard_after_forward", "offload_params", "sharding_strategy", "auto_wrap_policy",
            "transformer_layer_cls_to_wrap", "activation_checkpointing", "forward_prefetch",
            "cpu_offload_pin_memory"}


def read_accelerate(cfg: Config, trainer_fsdp: bool = False) -> TrainingConfig:
    """The launch an accelerate config describes. ``trainer_fsdp``: the training config beside it
    sets FSDP itself, and the Trainer's plugin then decides the version, the wrap policy and
    reshard_after_forward (transformers' ``create_accelerator_and_postprocess`` builds it from
    ``fsdp_plugin_args``; accelerate reads the launcher's FSDP_* environment only for what it
    leaves None)."""
    if cfg.flag("use_cpu"):
        raise cfg.unmodelled("use_cpu", True, "training on the CPU: autotune models a GPU")
    kind = cfg.text("distributed_type") or "NO"
    processes = _processes(cfg, kind)
    machines = cfg.positive("num_machines", "machines") or 1
    if kind == "MULTI_GPU":
        set_parallel(cfg, "distributed_type", "ddp")
    elif kind == "FSDP":
        _fsdp(cfg, trainer_fsdp)
    elif kind == "DEEPSPEED":
        _deepspeed(cfg)
    elif kind != "NO":
        raise cfg.unmodelled("distributed_type", kind, "autotune models NO (one GPU), MULTI_GPU (DDP), "
                             "FSDP (FSDP2) and reads DEEPSPEED's ZeRO stage")
    if processes is not None and kind != "NO":
        cfg.launch["gpus"] = processes
        if processes % machines:
            raise InvalidInput(f"num_processes {processes} in {cfg.file!r} is not a multiple of num_machines "
                               f"{machines}: accelerate runs num_processes // num_machines on each")
        cfg.notes.append(f"num_processes: {processes}: the GPUs of the job, over {machines} machine"
                         f"{'s' * (machines > 1)} (accelerate's num_processes is the total: utils/launch.py)")
    _parallelism(cfg, kind, processes)
    dynamo = cfg.get("dynamo_config") or {}
    backend = dynamo.get("dynamo_backend", "NO") if isinstance(dynamo, dict) else dynamo
    if str(backend).upper() != "NO":
        raise cfg.unmodelled("dynamo_config", dynamo, COMPILE)
    for key in ("fp8_config", "megatron_lm_config", "fsdp_config", "deepspeed_config"):
        cfg.get(key)  # read with the distributed type or precision that uses them, unused by others
    precision = _mixed_precision(cfg)
    mode = Mode(_PRECISIONS[precision], False) if precision in _PRECISIONS else None  # type: ignore[arg-type]
    config = cfg.result("accelerate", mode=mode, ignored=cfg.ignored(_NO_EFFECT))
    return replace(config, mixed_precision=precision)


def _processes(cfg: Config, kind: str) -> int | None:
    value = cfg.get("num_processes")
    if value is None or value == -1:  # ClusterConfig's default -1: given to the launcher
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise cfg.bad("num_processes", value, "a positive integer")
    if kind == "MULTI_GPU" and value < 2:  # _validate_launch_command
        raise JobFails(f"distributed_type: MULTI_GPU with num_processes {value} in {cfg.file!r}: "
                       "accelerate refuses it (fewer than 2 processes)")
    return value


def _mixed_precision(cfg: Config) -> str:
    precision = cfg.get("mixed_precision")
    precision = "no" if precision is None else str(precision).lower()
    if precision == "fp8":
        raise cfg.unmodelled("mixed_precision", "fp8", "fp8 training is not modelled")
    if precision not in ("no", "bf16", "fp16"):
        raise cfg.bad("mixed_precision", precision, "no, bf16 or fp16")
    return precision


def _fsdp(cfg: Config, trainer_fsdp: bool) -> None:
    """distributed_type FSDP: the launcher's fsdp_config, with its defaults (commands/launch.py:
    fsdp_version 1, reshard_after_forward true, offload_params false; the plugin's
    auto_wrap_policy NO_WRAP when none is exported)."""
    options = fsdp_options(cfg, cfg.get("fsdp_config"), "fsdp_config")
    version = options.get("version", 1)
    if str(version) not in ("1", "2"):
        raise cfg.bad("fsdp_config.fsdp_version", version, "1 or 2")
    if str(options.get("offload_params", False)).lower() == "true":
        # commands/launch.py exports it as FSDP_OFFLOAD_PARAMS, which the plugin reads for a cpu_offload
        # left None (utils/dataclasses.py __post_init__): the Trainer's plugin too (it sets cpu_offload
        # only when its own fsdp_config's is true), whatever version it builds (combine notes FSDP1's)
        offload(cfg, "fsdp_config.fsdp_offload_params", options["offload_params"], options)
    if str(options.get("activation_checkpointing", False)).lower() == "true":
        raise cfg.unmodelled("fsdp_config.fsdp_activation_checkpointing", options["activation_checkpointing"],
                             FSDP_CHECKPOINTING)
    wrap_classes(cfg, "fsdp_config.fsdp_transformer_layer_cls_to_wrap",
                 options.get("transformer_layer_cls_to_wrap"))
    pin_memory(cfg, "fsdp_config", options)
    note_no_effect(cfg, "fsdp_config", options, _HANDLED)
    if trainer_fsdp:
        cfg.notes.append("fsdp_config: the training config's fsdp settings decide the FSDP version, the wrap "
                         "policy and reshard_after_forward (the Trainer hands accelerate its own plugin)")
        set_parallel(cfg, "distributed_type", "fsdp")
        return
    if str(version) != "2":
        shown = version if "version" in options else "not set, accelerate launch's default 1"
        raise cfg.unmodelled("fsdp_config.fsdp_version", shown, f"{FSDP1}: write fsdp_version: 2")
    if options.get("forward_prefetch") and str(options["forward_prefetch"]).lower() == "true":
        raise JobFails(f"fsdp_config.fsdp_forward_prefetch: true in {cfg.file!r}: accelerate refuses it "
                       "with FSDP2 (\"not yet implemented in FSDP2\")")
    policy = options.get("auto_wrap_policy")
    if str(policy).upper() != "TRANSFORMER_BASED_WRAP":
        shown = "not set, accelerate's NO_WRAP" if policy is None else policy
        raise cfg.unmodelled("fsdp_config.fsdp_auto_wrap_policy", shown, WRAP)
    reshard = str(options.get("reshard_after_forward", True)).lower()
    if reshard not in ("true", "false"):
        raise cfg.bad("fsdp_config.fsdp_reshard_after_forward", options["reshard_after_forward"],
                      "true or false with FSDP2 (FULL_SHARD and the other strategies are FSDP1's)")
    set_parallel(cfg, "distributed_type", "fsdp", reshard == "true")
    cfg.notes.append(f"distributed_type: FSDP, fsdp_version 2: {FSDP2_NOTE}, reshard_after_forward {reshard}")


def _deepspeed(cfg: Config) -> None:
    """distributed_type DEEPSPEED: the ZeRO stage of deepspeed_config's file, else its zero_stage
    (DeepSpeedPlugin's default 2: utils/dataclasses.py)."""
    options = cfg.get("deepspeed_config") or {}
    if not isinstance(options, dict):
        raise cfg.bad("deepspeed_config", options, "a mapping")
    file = options.get("deepspeed_config_file")
    if file not in (None, "", "none"):
        config = load_json(cfg, "deepspeed_config.deepspeed_config_file", str(file), "DeepSpeed config")
        stage, source = deepspeed_stage(cfg, "deepspeed_config.deepspeed_config_file", config), str(file)
    else:
        stage, source = options.get("zero_stage", 2), "deepspeed_config.zero_stage"
        if isinstance(stage, bool) or stage not in (0, 1, 2, 3):
            raise cfg.bad("deepspeed_config.zero_stage", stage, "0, 1, 2 or 3")
    zero(cfg, "deepspeed_config", options, int(stage), source)
    cfg.parallel_key = "distributed_type"


def _parallelism(cfg: Config, kind: str, processes: int | None) -> None:
    """parallelism_config: FSDP2's hybrid sharding, dp_shard_size GPUs sharding a copy of the model
    and dp_replicate_size copies (the mesh accelerate builds from it: parallelism_config.py
    fsdp_dim_names). Without it accelerate's FSDP2 shards over every GPU, however many machines
    (fsdp2_prepare_model gets no mesh: fully_shard's 1-D mesh over the world), so num_machines
    alone is no hybrid sharding."""
    options = cfg.get("parallelism_config") or {}
    if not isinstance(options, dict):
        raise cfg.bad("parallelism_config", options, "a mapping")
    sizes = {name: options.get(f"parallelism_config_{name}_size", 1) for name in ("dp_replicate", "dp_shard",
                                                                                   "tp", "cp", "sp")}
    for name in ("tp", "cp", "sp"):
        if sizes[name] != 1:
            raise cfg.unmodelled(f"parallelism_config.parallelism_config_{name}_size", sizes[name], PARALLEL)
    if not options:
        machines = cfg.data.get("num_machines")
        if kind == "FSDP" and isinstance(machines, int) and machines > 1:
            cfg.notes.append(f"num_machines: {machines}: FSDP2 shards over every GPU of every machine (no "
                             "parallelism_config: no hybrid sharding)")
        return
    replicate, shard = sizes["dp_replicate"], sizes["dp_shard"]
    if kind != "FSDP":  # _validate_launch_command
        raise JobFails(f"parallelism_config in {cfg.file!r} without distributed_type: FSDP: accelerate "
                       "refuses it (it needs FSDP, version 2)")
    if shard < 2:
        raise cfg.unmodelled("parallelism_config", options, "FSDP2 replicating the whole model on every GPU "
                             "(dp_shard_size 1) is not modelled")
    if processes is not None and replicate * shard != processes:
        raise JobFails(f"parallelism_config in {cfg.file!r}: dp_replicate_size x dp_shard_size = "
                       f"{replicate * shard}, not num_processes {processes}: accelerate refuses it")
    if replicate > 1:
        cfg.launch["nodes"] = replicate
        cfg.notes.append(f"parallelism_config: hybrid sharding, {shard} GPUs shard each of {replicate} "
                         "copies of the model (read as nodes)")


def combine(training: TrainingConfig, launch: TrainingConfig) -> TrainingConfig:
    """A training config launched with an accelerate config: the step from the one, the GPUs from
    the other; a parallelism or a precision they disagree on is refused, naming both."""
    values = values_of(training.request)
    notes = [*training.notes, *launch.notes]
    step, spread = training.request.step, launch.request.step
    train_file, launch_file = training.files[0][0], launch.files[0][0]
    parallel_key = training.parallel_key
    if step.parallel is None or (spread.parallel == step.parallel and step.parallel != "fsdp"):
        values["parallel"] = spread.parallel or step.parallel
        parallel_key = launch.parallel_key if step.parallel is None else parallel_key
        values["reshard_after_forward"] = spread.reshard_after_forward
    elif spread.parallel == step.parallel:  # fsdp in both: the Trainer passes reshard_after_forward
        if spread.reshard_after_forward is not None and \
                spread.reshard_after_forward != step.reshard_after_forward:
            notes.append(f"fsdp_reshard_after_forward in {launch_file}: the training config's "
                         f"reshard_after_forward {str(step.reshard_after_forward).lower()} wins (the Trainer "
                         "passes it to accelerate's plugin)")
    elif spread.parallel not in (None, "ddp"):
        raise InvalidInput(f"{training.parallel_key} in {train_file!r} runs {step.parallel} and "
                           f"{launch.parallel_key} in {launch_file!r} runs {spread.parallel}: give one")
    values["gpus"], values["nodes"] = spread.gpus, spread.nodes
    if spread.fsdp_wrap is not None and step.fsdp_wrap is None:
        # the launcher's FSDP_TRANSFORMER_CLS_TO_WRAP, read by the Trainer's plugin where its own
        # fsdp_config names no classes (utils/dataclasses.py __post_init__)
        values["fsdp_wrap"] = spread.fsdp_wrap
    elif spread.fsdp_wrap is not None and spread.fsdp_wrap != step.fsdp_wrap:
        notes.append(f"fsdp_transformer_layer_cls_to_wrap in {launch_file}: the training config's "
                     f"{step.fsdp_wrap} wins (the Trainer passes it to accelerate's plugin)")
    if spread.offload_params:  # the launcher's FSDP_OFFLOAD_PARAMS, read by the Trainer's plugin too
        if step.fsdp_version == 1:
            notes.append(f"fsdp_config.fsdp_offload_params: true in {launch_file}: the Trainer's plugin of "
                         f"{train_file}'s FSDP1 reads it (FSDP_OFFLOAD_PARAMS): {CPU_OFFLOAD1_NOTE}")
        values["offload_params"] = True
    values["mode"] = _precision(training, launch, notes)
    return TrainingConfig(
        training.format, request_from(type(training.request), values), tuple(notes),
        (*training.ignored, *launch.ignored), parallel_key=parallel_key,
        wrap_classes=training.wrap_classes or launch.wrap_classes,
        wrap_key=training.wrap_key or launch.wrap_key, mixed_precision=launch.mixed_precision,
        from_pretrained=training.from_pretrained, files=(*training.files, *launch.files),
        mesh=training.mesh, trust_remote_code=training.trust_remote_code, by_gpu_count=training.by_gpu_count,
        kt_weight_format=training.kt_weight_format)


def _precision(training: TrainingConfig, launch: TrainingConfig, notes: list[str]) -> Any:
    """The mode with accelerate's mixed_precision: TrainingArguments takes ACCELERATE_MIXED_PRECISION
    as its default and its own bf16/fp16 over it (training_args.py __post_init__, "Mixed
    Precision"); Axolotl sets the variable from its own bf16/fp16 (utils/trainer.py
    prepare_optim_env)."""
    # a file that sets no precision (autotune's own, PEFT's) trains without autocast, as the Trainer does
    mode = parse_mode(training.request.mode or DEFAULT_MODE_NAME)
    wanted, launch_file = launch.mixed_precision or "no", launch.files[0][0]
    said = f"mixed_precision: {wanted} in {launch_file}"
    if wanted == "no" or _PRECISIONS[wanted] == mode.precision:
        if wanted == "no" and mode.precision != "fp32":
            notes.append(f"{said}: the training config's {mode.precision} wins (TrainingArguments' bf16/fp16 "
                         "over ACCELERATE_MIXED_PRECISION)")
        return training.request.mode
    if mode.precision != "fp32":
        raise InvalidInput(f"the training config {training.files[0][0]!r} trains in {mode.precision} and "
                           f"{said}: they disagree; give one precision")
    if training.format == "axolotl":
        notes.append(f"{said}: no effect: Axolotl sets ACCELERATE_MIXED_PRECISION from its own bf16/fp16 "
                     "(utils/trainer.py prepare_optim_env)")
        return training.request.mode
    notes.append(f"{said}: the Trainer's precision, neither bf16 nor fp16 being set (TrainingArguments "
                 "takes ACCELERATE_MIXED_PRECISION as its default)")
    return Mode(_PRECISIONS[wanted], mode.checkpointing).name  # type: ignore[arg-type]
