"""A backend whose step fits up to a known batch size per cell, for tests of searches run against
known answers (check's advice over levers): ``LimitBackend(limit)``, where ``limit(workload, mode,
seq_len)`` is the largest batch that fits; a probe's peak is its batch size."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from autotune.gpus import resolve_gpu
from autotune.search import Probe, ProbeOnlyCell


class LimitBackend:
    name = "estimate"

    def __init__(self, limit: Callable[[Any, Any, int], int]) -> None:
        self.gpu = resolve_gpu("A100-80GB")
        self.limit = limit

    def attn_used(self, workload: Any) -> str:
        return "sdpa"

    def describe(self) -> dict[str, Any]:
        return {"backend": self.name, "gpu_name": self.gpu.name}

    def cell(self, workload: Any, mode: Any, seq_len: int, budget_bytes: int
             ) -> AbstractContextManager[ProbeOnlyCell]:
        limit = self.limit(workload, mode, seq_len)

        def probe(batch_size: int) -> Probe:
            return Probe(batch_size, "fits" if batch_size <= limit else "oom", peak_bytes=batch_size)

        return nullcontext(ProbeOnlyCell(probe))
