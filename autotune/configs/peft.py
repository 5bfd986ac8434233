"""A PEFT adapter_config.json (or the adapter directory holding one): the base model and the
adapter; the step's length, batch and precision are left to the flags."""

from __future__ import annotations

from pathlib import Path

from autotune.configs.lora import note_adapter
from autotune.configs.reading import Config, TrainingConfig
from autotune.workload.adapters import PEFT_TASK_TYPES, adapter_from_peft_dict

# PEFT's task types back to autotune's tasks (adapters.PEFT_TASK_TYPES).
_PEFT_TASKS = {peft: task for task, peft in PEFT_TASK_TYPES.items() if peft is not None}


def read_peft(cfg: Config) -> TrainingConfig:
    """The base model and the adapter of a saved PEFT adapter; the step itself is the flags'."""
    adapter = adapter_from_peft_dict(cfg.data, source=cfg.file)
    task_type = cfg.data.get("task_type")
    task = None
    if task_type is not None:
        task = _PEFT_TASKS.get(str(task_type).upper())
        if task is None:
            raise cfg.unmodelled("task_type", task_type, f"autotune models the PEFT task types "
                                 f"{', '.join(_PEFT_TASKS)} (and none, a masked LM)")
    model = cfg.data.get("base_model_name_or_path")
    if model is not None and not isinstance(model, str):
        raise cfg.bad("base_model_name_or_path", model, "a string")
    note_adapter(cfg, Path(cfg.file).name, adapter)
    cfg.notes.append("adapter_config.json does not record whether the base was loaded in 4 bits: read as "
                     "LoRA over 16-bit weights (QLoRA's base is 4-bit)")
    return cfg.result("peft", model=model or None, seq_len=None, batch_size=None, mode=None,
                        task=task, adapter=adapter)
