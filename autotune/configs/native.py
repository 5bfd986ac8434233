"""autotune's own format: the ``check`` flags' names as keys."""

from __future__ import annotations

from autotune.configs.reading import Config, TrainingConfig, read_attention, read_dtype, read_optimizer, words
from autotune.workload.loss import LOSSES
from autotune.workload.models import TASKS
from autotune.workload.modes import parse_mode

# Keys only autotune's own format has.
_AUTOTUNE_KEYS = words("model seq_len batch_size mode task optimizer dtype attn loss accumulation_steps")
AUTOTUNE_MARKERS = words("model seq_len batch_size mode")


def read_native(cfg: Config) -> TrainingConfig:
    mode = cfg.text("mode")
    task = cfg.text("task")
    if task is not None and task.strip().lower() not in TASKS:
        raise cfg.bad("task", task, f"one of {', '.join(TASKS)}")
    loss = cfg.text("loss")
    if loss is not None and loss not in LOSSES:
        raise cfg.bad("loss", loss, ", ".join(LOSSES[:-1]) + " or " + LOSSES[-1])
    accumulation = (cfg.positive("accumulation_steps", "accumulation steps")
                    or cfg.positive("gradient_accumulation_steps", "accumulation steps"))
    return cfg.result(
        "autotune", model=cfg.text("model"), seq_len=cfg.positive("seq_len", "sequence length"),
        batch_size=cfg.positive("batch_size", "batch size"), mode=None if mode is None else parse_mode(mode),
        accumulation_steps=accumulation or 1, task=None if task is None else task.strip().lower(),
        dtype=read_dtype(cfg, "dtype", cfg.get("dtype")), optimizer=read_optimizer(cfg, "optimizer"),
        attn=read_attention(cfg, "attn", cfg.get("attn")), loss=None if loss in (None, "full") else loss,
        ignored=cfg.ignored(_AUTOTUNE_KEYS),
    )


