"""What a table measures apart from mode, sequence length and batch size."""

from __future__ import annotations

from dataclasses import dataclass

from autotune.models import ModelSpec
from autotune.step import MIN_STEPS, Optimizer


@dataclass(frozen=True)
class Workload:
    model: ModelSpec
    task: str  # one of models.TASKS
    attn: str | None  # "sdpa" | "eager" | None = what transformers picks on a CUDA GPU
    optimizer: Optimizer = "adamw"
    steps: int = MIN_STEPS  # full training steps per probe
