"""DeepSpeed ZeRO's settings: the ``zero_optimization`` keys of a DeepSpeed config that the traced
engine runs (backends/deepspeed.py), those with no effect on a step's GPU memory, and those refused.

The engine itself reads the modelled keys: autotune hands them to DeepSpeed's own
``DeepSpeedEngine`` as written, after resolving the "auto" values as the Hugging Face integration
resolves them (transformers 5.24 integrations/deepspeed.py ``HfTrainerDeepSpeedConfig.
trainer_config_finalize``, the same in accelerate 1.15 accelerator.py ``_prepare_deepspeed``):

    reduce_bucket_size                  hidden_size * hidden_size
    stage3_prefetch_bucket_size         int(0.9 * hidden_size * hidden_size)   (stage 3)
    stage3_param_persistence_threshold  10 * hidden_size                      (stage 3)

``offload_optimizer`` (stages 1-3) and ``offload_param`` (stage 3) to the CPU are run by the engine
too (ZeRO-Offload, backends/deepspeed.py: its host buffers on the host ledger, DeepSpeedCPUAdam
modelled from source); kept as their ``device`` and ``pin_memory``, the keys of NVMe offload noted
as without effect on the CPU, NVMe itself and a partial offload (``ratio``) refused by name.

A key left out takes DeepSpeed's default (deepspeed 0.19 runtime/zero/config.py
``DeepSpeedZeroConfig``: buckets of 5e8 elements, prefetch 5e7, persistence 1e5, 1e9 live
parameters; ``overlap_comm`` true for stage 3 only). ``--parallel zeroN`` without a config is a
config of the stage and the three "auto" keys, as the Hugging Face docs' example configs write it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from autotune.errors import InvalidInput, UnknownSetting, UnmodelledSetting
from autotune.spelling import close_matches, did_you_mean
from autotune.units import format_bytes

AUTO = "auto"
# Keys DeepSpeed reads that the traced engine runs as written (deepspeed 0.19 runtime/zero/config.py);
# values are checked by DeepSpeed's own pydantic config when the engine is built.
MODELLED_KEYS = frozenset({
    "stage", "contiguous_gradients", "reduce_scatter", "reduce_bucket_size",
    "use_multi_rank_bucket_allreduce", "allgather_partitions", "allgather_bucket_size", "overlap_comm",
    "sub_group_size", "stage3_prefetch_bucket_size", "prefetch_bucket_size",
    "stage3_param_persistence_threshold", "param_persistence_threshold", "model_persistence_threshold",
    "stage3_max_live_parameters", "max_live_parameters", "stage3_max_reuse_distance", "max_reuse_distance",
    "round_robin_gradients", "compute_grad_norm", "memory_efficient_linear", "ignore_unused_parameters",
    "stage3_module_granularity_threshold", "module_granularity_threshold",
    "stage3_use_all_reduce_for_fetch_params", "use_all_reduce_for_fetch_params",
    "stage3_allgather_sequential", "allgather_sequential", "override_module_apply",
})
# Keys with no effect on a training step's GPU memory, and why.
NO_EFFECT = {
    "load_from_fp32_weights": "how a checkpoint is loaded",
    "elastic_checkpoint": "how a checkpoint is saved",
    "gather_16bit_weights_on_model_save": "how the model is saved",
    "stage3_gather_16bit_weights_on_model_save": "how the model is saved",
    "stage3_gather_fp16_weights_on_model_save": "how the model is saved",
    "log_trace_cache_warnings": "logging", "enable_sanity_checks": "checks, no tensors",
    "pipeline_loading_checkpoint": "how a checkpoint is loaded",
    "save_muon_momentum_buffer_in_memory": "read only by the Muon optimizer",
}
OFFLOAD_KEYS = ("offload_optimizer", "offload_param")
# offload_optimizer / offload_param's own keys (runtime/zero/offload_config.py): those NVMe offload
# alone reads, without effect when the device is the CPU.
NVME_ONLY = frozenset({"nvme_path", "buffer_count", "buffer_size", "max_in_cpu", "pipeline_read",
                       "pipeline_write", "fast_init"})
LEGACY = ("a deprecated spelling of ZeRO-Offload that autotune does not read: write "
          "offload_optimizer / offload_param {\"device\": \"cpu\"}")
# Keys that change memory in ways not modelled, and why; refused where set to other than the default.
UNMODELLED = {
    "cpu_offload": LEGACY, "cpu_offload_param": LEGACY, "cpu_offload_use_pin_memory": LEGACY,
    "zenflow": "ZenFlow's asynchronous CPU optimizer is not modelled",
    "zero_hpz_partition_size": "ZeRO++ hierarchical partitioning (a secondary copy of the parameters per "
                               "node) is not modelled",
    "zero_quantized_weights": "ZeRO++ quantized weight all-gather is not modelled (a compiled kernel)",
    "zero_quantized_nontrainable_weights": "ZeRO++ quantized frozen weights are not modelled",
    "zero_quantized_gradients": "ZeRO++ quantized gradient reduce-scatter is not modelled",
    "mics_shard_size": "MiCS sharding (a subgroup of ranks per shard) is not modelled",
    "mics_hierarchical_params_gather": "MiCS sharding is not modelled",
    "legacy_stage1": "the legacy stage 1 is not modelled",
    "parameter_alignment": "parameter alignment padding is not modelled",
    "leaf_module": "ZeRO-3 leaf modules (gathered whole) are not modelled",
}
# The value each refused key has by default (DeepSpeedZeroConfig), where setting it changes nothing.
_UNMODELLED_DEFAULTS: dict[str, Any] = {"zero_hpz_partition_size": 1, "zero_quantized_weights": False,
                                        "zero_quantized_nontrainable_weights": False,
                                        "zero_quantized_gradients": False, "legacy_stage1": False,
                                        "parameter_alignment": False, "mics_shard_size": -1,
                                        "mics_hierarchical_params_gather": False}
HIDDEN_SIZE_KEYS = ("reduce_bucket_size", "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold")

Settings = tuple[tuple[str, Any], ...]  # zero_optimization's modelled keys, sorted: hashable (Parallel)


def default_settings(stage: int) -> Settings:
    """``--parallel zeroN`` without a config: the stage and the "auto" keys (module docstring)."""
    keys = HIDDEN_SIZE_KEYS if stage == 3 else HIDDEN_SIZE_KEYS[:1]
    return tuple(sorted({"stage": stage, **{key: AUTO for key in keys}}.items()))


def read_settings(zero_optimization: Any, where: str, notes: list[str] | None = None) -> Settings:
    """A ``zero_optimization`` mapping checked key by key: the modelled ones kept, those with no
    effect noted (in ``notes``), those that change memory unmodelled refused by name
    (UnmodelledSetting), unknown ones refused (UnknownSetting). ``where`` names the mapping."""
    if not isinstance(zero_optimization, dict):
        raise InvalidInput(f"{where}: zero_optimization must be a mapping, got {zero_optimization!r}")
    kept: dict[str, Any] = {}
    for key, value in zero_optimization.items():
        if key in OFFLOAD_KEYS:
            offload = _offload(key, value, where, notes)
            if offload is not None:
                kept[key] = offload
        elif key in MODELLED_KEYS:
            if isinstance(value, str) and value != AUTO:
                raise InvalidInput(f"{where}: zero_optimization.{key} must be a number, a boolean or "
                                   f"\"auto\", got {value!r}")
            kept[key] = value
        elif key in NO_EFFECT:
            if notes is not None:
                notes.append(f"{where}: zero_optimization.{key}: {value!r}: no effect on GPU memory: "
                             f"{NO_EFFECT[key]}")
        elif key in UNMODELLED:
            if _is_set(key, value):
                raise UnmodelledSetting(f"{where}: zero_optimization.{key}: {value!r}: {UNMODELLED[key]}")
        else:
            known = sorted(MODELLED_KEYS | NO_EFFECT.keys() | UNMODELLED.keys())
            close = close_matches(key, [(name, name) for name in known])
            hint = f" ({did_you_mean(close)})" if close else ""
            raise UnknownSetting(f"unknown key {where}: zero_optimization.{key}{hint}: autotune cannot tell "
                                 "whether it changes memory; correct the key, or remove it")
    stage = kept.get("stage", 0)
    if isinstance(stage, bool) or stage not in (0, 1, 2, 3):
        raise InvalidInput(f"{where}: zero_optimization.stage must be 0, 1, 2 or 3, got {stage!r}")
    if "offload_param" in kept and stage != 3:
        raise InvalidInput(f"{where}: zero_optimization.offload_param is ZeRO-3's (stage {stage} never "
                           "reads it): remove it, or use stage 3")
    return tuple(sorted(kept.items()))


def _offload(key: str, value: Any, where: str, notes: list[str] | None) -> tuple[tuple[str, Any], ...] | None:
    """``offload_optimizer`` / ``offload_param`` (runtime/zero/offload_config.py
    ``DeepSpeedZeroOffloadOptimizerConfig``/``ParamConfig``): None where the device is none, else its
    device ("cpu") and pin_memory (default false), hashable; NVMe and a partial offload refused."""
    if value is None or value == {}:
        return None
    if not isinstance(value, dict):
        raise InvalidInput(f"{where}: zero_optimization.{key} must be a mapping such as "
                           f"{{\"device\": \"cpu\"}}, got {value!r}")
    device = str(value.get("device", "none")).lower()
    if device == "none":
        return None
    if device != "cpu":
        raise UnmodelledSetting(f"{where}: zero_optimization.{key}.device: {value.get('device')!r}: NVMe "
                                "offload (ZeRO-Infinity: the state swapped through files by DeepSpeed's "
                                "compiled async I/O op) is not modelled; device \"cpu\" is")
    for name, option in value.items():
        if name in ("device", "pin_memory"):
            continue
        if name == "ratio" and option in (1, 1.0):
            continue
        if name == "ratio":
            raise UnmodelledSetting(f"{where}: zero_optimization.{key}.ratio: {option!r}: a partial offload "
                                    "(part of the optimizer step kept on the GPU) is not modelled")
        if name in NVME_ONLY:
            if notes is not None:
                notes.append(f"{where}: zero_optimization.{key}.{name}: {option!r}: no effect on GPU memory: "
                             "read by NVMe offload only")
            continue
        raise UnknownSetting(f"unknown key {where}: zero_optimization.{key}.{name}: autotune cannot tell "
                             "whether it changes memory; correct the key, or remove it")
    pin = value.get("pin_memory", False)
    if not isinstance(pin, bool):
        raise InvalidInput(f"{where}: zero_optimization.{key}.pin_memory must be true or false, got {pin!r}")
    return (("device", "cpu"), ("pin_memory", pin))


def offloads_optimizer(settings: Settings) -> bool:
    return "offload_optimizer" in dict(settings)


def offloads(settings: Settings) -> tuple[str, ...]:
    """What the settings offload to the CPU: "optimizer", "param"."""
    found = dict(settings)
    return tuple(key.removeprefix("offload_") for key in OFFLOAD_KEYS if key in found)


def _is_set(key: str, value: Any) -> bool:
    """Whether a refused key asks for what it names: an offload to a device other than none, a
    flag on, a value other than DeepSpeed's default."""
    if value is None or value is False or value == {}:
        return False
    if isinstance(value, dict) and key.startswith("offload_"):
        return str(value.get("device", "none")).lower() != "none"
    if key in _UNMODELLED_DEFAULTS:
        return value != _UNMODELLED_DEFAULTS[key]
    return True


def parse_settings(text: str, where: str = "zero_config") -> Settings:
    """``zero_config`` as the request carries it: the JSON of a zero_optimization mapping."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidInput(f"{where}: not JSON ({exc}): give a zero_optimization mapping") from exc
    return read_settings(data, where)


def settings_text(settings: Settings) -> str:
    """The settings as a zero_optimization mapping's JSON (an offload as its mapping)."""
    return json.dumps({key: dict(value) if key in OFFLOAD_KEYS else value for key, value in settings},
                      sort_keys=True)


def hashable(items: Any) -> Settings:
    """Settings made again from JSON's lists ([key, value] pairs, an offload's pairs or mapping):
    tuples, so that a Parallel is hashable."""
    def value_of(key: str, value: Any) -> Any:
        if key in OFFLOAD_KEYS:
            pairs = value.items() if isinstance(value, dict) else value
            return tuple(sorted((str(name), option) for name, option in pairs))
        return value

    return tuple((str(key), value_of(str(key), value)) for key, value in items)


def stage_of(settings: Settings) -> int:
    return int(dict(settings).get("stage", 0))


def resolved(settings: Settings, hidden_size: int | None) -> dict[str, Any]:
    """The zero_optimization mapping the engine gets: "auto" values resolved from the model's hidden
    size as the Hugging Face integration does (module docstring; the stage-3 keys only for stage 3,
    else dropped as there, where DeepSpeed ignores them)."""
    config = {key: dict(value) if key in OFFLOAD_KEYS else value for key, value in settings}
    stage = stage_of(settings)
    values = {} if hidden_size is None else {
        "reduce_bucket_size": hidden_size * hidden_size,
        "stage3_prefetch_bucket_size": int(0.9 * hidden_size * hidden_size),
        "stage3_param_persistence_threshold": 10 * hidden_size,
    }
    for key, value in list(config.items()):
        if value != AUTO:
            continue
        if key in values and (stage == 3 or not key.startswith("stage3_")):
            config[key] = values[key]
        elif key.startswith("stage3_") and stage != 3:
            del config[key]
        else:
            raise InvalidInput(f"zero_optimization.{key}: \"auto\" is resolved by the Hugging Face "
                               "integration for reduce_bucket_size, stage3_prefetch_bucket_size and "
                               "stage3_param_persistence_threshold only (from the model's hidden_size)")
    return config


def host_note(nbytes: int, parallel: Mapping[str, Any] | None = None) -> str:
    """What a rank keeps in host memory, in words: the line a table and a check print; ``parallel``
    the job's (Parallel.to_json), which says whose offload it is."""
    what = (f"FSDP{parallel.get('fsdp_version') or 2}'s CPU offload: its shards, their gradients and the "
            "optimizer state" if parallel is not None and parallel.get("kind") == "fsdp" else
            "ZeRO-Offload's buffers and CPU Adam state")
    return (f"host memory per GPU's rank ({what}): {format_bytes(nbytes)} of pinned RAM; a node needs it "
            "once per GPU")
