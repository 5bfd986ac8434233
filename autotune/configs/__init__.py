"""A training config, read whole into the ``CheckRequest`` it describes.

Seven kinds of format, told apart by their keys (``detect``), each read by its own module:

    axolotl    an Axolotl YAML: base_model, sequence_len, micro_batch_size, sample_packing, adapter, ...
               (configs/axolotl.py)
    llamafactory  a LLaMA-Factory YAML: its model, data and fine-tuning arguments (stage,
               finetuning_type, cutoff_len, template, lora_rank, lora_target, quantization_bit, ...) with
               the Trainer's (per_device_train_batch_size, bf16, ...) (configs/llamafactory.py); read
               before TRL and the Trainer, whose keys (packing, model_name_or_path) it shares; or
               LLaMA-Factory v1's (model, train_dataset, peft_config, dist_config, micro_batch_size, ...)
               (configs/llamafactory_v1.py), told apart by v1's own keys
    trl-dpo, trl-orpo, trl-simpo, trl-reward
               a TRL DPOConfig, ORPOConfig, CPOConfig (SimPO) or RewardConfig: SFTConfig's reading with
               the trainer's keys (configs/preference.py, which tells the trainer or asks for --trainer)
    trl-sft    a TRL SFTConfig (a TrainingArguments superset): packing, padding_free, model_init_kwargs,
               dataset_text_field, loss_type, ..., and the ``trl sft`` CLI's model keys (use_peft, lora_r)
               (configs/trainer.py)
    trainer    a Hugging Face TrainingArguments JSON (any of its fields), with the model and data
               arguments of the example scripts (model_name_or_path, torch_dtype, max_seq_length, block_size)
               (configs/trainer.py)
    autotune   autotune's own: model, seq_len, batch_size, mode, task, optimizer, dtype, attn, loss
               (configs/native.py)
    peft       a PEFT adapter_config.json (or the adapter directory holding one): the base model and
               the adapter; the step's length, batch and precision are left to the flags (configs/peft.py)
    accelerate an accelerate config YAML (compute_environment, distributed_type, num_processes, ...): the
               GPUs of the job and how it spreads over them (configs/accelerate.py); given beside a
               training config (``read_training_configs``), as ``accelerate launch --config_file`` runs one

A job on more than one GPU: FSDP2, DeepSpeed's ZeRO stage and the DDP settings of each format are
read by configs/sharding.py into the request's ``parallel`` and ``reshard_after_forward``; the GPU
count is in no training config (it is the launcher's: ``--gpus``, or an accelerate config).

Every key is one of three kinds. *Modelled*: read into the request (batch, length, precision, weights
dtype, optimizer, attention, loss, checkpointing, and a LoRA/QLoRA adapter, ``request.step.adapter``).
*No effect* on a training step's GPU memory (learning_rate, output_dir, datasets, ...): accepted.
*Unmodelled*: it changes memory in a way autotune does not model (8-bit weights, DoRA, DeepSpeed,
torch.compile, ...): set to anything but its default (null, false, empty), it raises
``UnmodelledSetting``; a verdict for a different job is worse than none. Keys in none of the lists
come back in ``TrainingConfig.ignored`` for the output to name.

An adapter is read as its tool builds it, with the tool's defaults where a key is absent (Axolotl:
loaders/adapter.py and utils/schemas/peft.py; TRL: trainer/model_config.py and trainer/utils.py
``get_peft_config`` / ``get_quantization_config``; LLaMA-Factory: hparams/finetuning_args.py and
model/adapter.py ``init_adapter``); every adapter read adds a note naming it.

``missing_fields`` names what the file leaves out (``autotune check --from-config`` lets flags fill it).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from autotune.configs.accelerate import ACCELERATE_MARKERS, combine, read_accelerate
from autotune.configs.axolotl import AXOLOTL_MARKERS, read_axolotl
from autotune.configs.llamafactory import LLAMAFACTORY_MARKERS, read_llamafactory
from autotune.configs.llamafactory_v1 import LLAMAFACTORY_V1_MARKERS, is_v1, read_llamafactory_v1
from autotune.configs.native import AUTOTUNE_MARKERS, read_native
from autotune.configs.peft import read_peft
from autotune.configs.preference import PREFERENCE_MARKERS
from autotune.configs.reading import Config, TrainingConfig, check_remote_code, load
from autotune.configs.sharding import check_launch
from autotune.configs.trainer import LEGACY_TRAINER_FIELDS, SFT_MARKERS, TRAINER_FIELDS, read_trainer
from autotune.errors import InvalidInput
from autotune.gpus import GpuSpec

FORMATS = ("trainer", "trl-sft", "trl-dpo", "trl-orpo", "trl-simpo", "trl-reward", "axolotl", "llamafactory",
           "autotune", "peft", "accelerate")

__all__ = ["FORMATS", "TrainingConfig", "check_launch", "check_remote_code", "missing_fields",
           "read_training_config", "read_training_configs"]


def read_training_config(path: str | Path, card: GpuSpec | None = None, *,
                         trainer: str | None = None) -> TrainingConfig:
    """The check a config file (or a PEFT adapter directory) describes; a memory-relevant key it
    cannot model raises. ``card``: the GPU the check is for, where a tool resolves a key on the
    card it runs on (Axolotl's ``bf16: auto``); None: such a key is refused. ``trainer``: the one
    asked for (--trainer), for a TRL preference config whose keys do not tell (configs/preference.py)."""
    return _read(_config(path, card), trainer)


def read_training_configs(paths: Sequence[str | Path], card: GpuSpec | None = None, *,
                          trainer: str | None = None) -> TrainingConfig:
    """The check of one training config, or of a training config and the launcher's config beside
    it (either order): an accelerate config (the step from the one, the GPUs from the other,
    accelerate.combine), or a DeepSpeed JSON, read as the training config's ``deepspeed`` (the
    Trainer's ``--deepspeed ds.json``, Axolotl's and LLaMA-Factory's ``deepspeed:``)."""
    if len(paths) == 1:
        return read_training_config(paths[0], card, trainer=trainer)
    configs = [_config(path, card) for path in paths]
    speeds = [cfg for cfg in configs if is_deepspeed_json(cfg)]
    launches = [cfg for cfg in configs if detect(cfg) == "accelerate"] + speeds
    if len(configs) != 2 or len(launches) != 1:
        files = ", ".join(cfg.file for cfg in configs)
        raise InvalidInput(f"{len(configs)} configs given ({files}): give one training config, and at most "
                           "one launcher's config beside it: an accelerate config (accelerate launch "
                           "--config_file) or a DeepSpeed JSON")
    training_cfg = next(cfg for cfg in configs if cfg is not launches[0])
    if speeds:
        if training_cfg.data.get("deepspeed") not in (None, ""):
            given = training_cfg.data["deepspeed"]
            raise InvalidInput(f"{training_cfg.file!r} sets deepspeed ({given!r}) and {speeds[0].file!r} is "
                               "a DeepSpeed config too: give one of them")
        training_cfg.data["deepspeed"] = str(Path(speeds[0].file).resolve())
        return _read(training_cfg, trainer)
    training = _read(training_cfg, trainer)
    sharded = training.request.step.parallel == "fsdp"
    return combine(training, read_accelerate(launches[0], trainer_fsdp=sharded))


def is_deepspeed_json(cfg: Config) -> bool:
    """A DeepSpeed config (its ``zero_optimization``, no model): what ``deepspeed`` points to."""
    keys = set(cfg.data)
    return "zero_optimization" in keys and not keys & {"model", "model_name_or_path", "base_model",
                                                        "model_name"}


def _config(path: str | Path, card: GpuSpec | None) -> Config:
    file = Path(path)
    if file.is_dir():
        if not (file / "adapter_config.json").is_file():
            raise InvalidInput(f"training config {str(path)!r} is a directory without adapter_config.json: "
                               "give a training config file, or a PEFT adapter directory")
        file = file / "adapter_config.json"
    return Config(load(file), str(file), card)


def _read(cfg: Config, trainer: str | None = None) -> TrainingConfig:
    fmt = detect(cfg)
    if fmt == "accelerate":
        return read_accelerate(cfg)
    if fmt == "peft":
        return read_peft(cfg)
    if fmt == "axolotl":
        return read_axolotl(cfg)
    if fmt == "llamafactory":
        return read_llamafactory_v1(cfg) if is_v1(cfg) else read_llamafactory(cfg)
    if fmt == "autotune":
        return read_native(cfg)
    return read_trainer(cfg, fmt, trainer)


def missing_fields(config: TrainingConfig) -> list[str]:
    """What a check needs that the file does not say: of model, seq_len and batch_size."""
    request = config.request
    names = {"model": request.step.model, "seq_len": request.seq_len, "batch_size": request.batch_size}
    return [name for name, value in names.items() if value is None]


def detect(cfg: Config) -> str:
    """The format of a file, from the keys only it has."""
    keys = set(cfg.data)
    if "peft_type" in keys:  # every PeftConfig's save_pretrained writes it
        return "peft"
    if keys & ACCELERATE_MARKERS:  # accelerate's use_cpu and num_processes are no training config's
        return "accelerate"
    if keys & LLAMAFACTORY_V1_MARKERS:  # v1's model and micro_batch_size are autotune's and Axolotl's too
        return "llamafactory"  # read by configs/llamafactory_v1.py
    found = {
        "axolotl": keys & AXOLOTL_MARKERS,
        "llamafactory": keys & LLAMAFACTORY_MARKERS,
        "trl-sft": keys & SFT_MARKERS,
        "trainer": keys & (TRAINER_FIELDS | LEGACY_TRAINER_FIELDS | {"model_name_or_path"}),
        "autotune": keys & AUTOTUNE_MARKERS,
    }
    # LLaMA-Factory's files hold TRL's packing and the Trainer's keys too: its own keys decide first.
    # A TRL preference config shares SFTConfig's loss_type, padding_free, ...: its own keys decide
    # before SFT's (configs/preference.py tells which trainer).
    found["trl-preference"] = keys & PREFERENCE_MARKERS
    fmt = next((f for f in ("axolotl", "llamafactory", "trl-preference", "trl-sft", "trainer") if found[f]),
               "autotune")
    mixed = found["autotune"] - {"batch_size"} if fmt == "axolotl" else found["autotune"]  # Axolotl's global
    if fmt != "autotune" and mixed:
        raise InvalidInput(
            f"training config {cfg.file!r} mixes autotune keys ({', '.join(sorted(mixed))}) "
            f"with {fmt} keys ({', '.join(sorted(found[fmt])[:3])}): write one format"
        )
    return fmt
