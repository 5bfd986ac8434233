"""What a probe backend is (``Backend``): the estimator, the cuda backend and the estimator-seeded
cuda backend (seeded.py) all are one."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any, Protocol

from autotune.gpus import GpuSpec
from autotune.search import Cell
from autotune.workload import Workload
from autotune.workload.modes import Mode


class Backend(Protocol):
    """Probes training steps: ``cell`` opens one (workload, mode, seq_len) cell at a budget."""

    name: str  # "estimate" | "cuda"
    gpu: GpuSpec  # the target card its answers are for

    def describe(self) -> dict[str, Any]:
        """The environment of its answers: backend, GPU, versions."""
        ...

    def attn_used(self, workload: Workload) -> str:
        """The attention implementation the step runs with (the one asked for, else transformers')."""
        ...

    def cell(self, workload: Workload, mode: Mode, seq_len: int, budget_bytes: int
             ) -> AbstractContextManager[Cell]:
        """The cell's probes, for the search (search.Cell); its resources are freed on exit."""
        ...
