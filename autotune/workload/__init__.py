"""What a table measures apart from mode, sequence length and batch size."""

from __future__ import annotations

from dataclasses import dataclass

from autotune.defaults import DEFAULT_OPTIMIZER
from autotune.workload.models import ModelSpec
from autotune.workload.step import MIN_STEPS, Optimizer


@dataclass(frozen=True)
class Workload:
    model: ModelSpec
    task: str  # one of models.TASKS
    attn: str | None  # "sdpa" | "eager" | None = what transformers picks on a CUDA GPU
    optimizer: Optimizer = DEFAULT_OPTIMIZER  # type: ignore[assignment]
    steps: int = MIN_STEPS  # full training steps per probe
