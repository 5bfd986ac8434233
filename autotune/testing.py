"""A fake GPU whose memory differs from the estimator's, for testing a search without a GPU: the
estimator-seeded search (autotune/backends/seeded.py) in the tests and in benchmarks/bench_seeded.py.

``ScaledGpu(EstimateBackend(gpu), scale=1.1)`` answers each probe as a GPU would: "fits" with its
peak when that is within the budget, else "oom" with no peak (a real CUDA out-of-memory says no
figure). The peak at batch b is

- ``smooth=False``: the estimator's demand at b, times ``scale``, plus ``offset_bytes``;
- ``smooth=True``: the same of the line through the estimator's demands at half its max batch and
  at its max batch, rounded up to the caching allocator's 2 MiB (kRoundLarge): a curve that grows
  with every batch, like the estimator's near the limit but without its steps, so that every
  search of it finds the same max (the estimator's own curve is not monotone near the limit).

It counts its probes, the figure a real GPU would spend seconds to minutes on each.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from typing import Any

from autotune.backends.estimate.backend import EstimateBackend
from autotune.search import Cell, Probe, ProbeOnlyCell, search_max_batch
from autotune.units import MIB
from autotune.workload import Workload
from autotune.workload.modes import Mode

ROUND_BYTES = 2 * MIB
# (curve backend, workload, mode, seq_len, budget) -> (intercept, slope) of a smooth cell: fixed once
# drawn, so that every fake GPU over the same curve has the same memory, whatever searched it first.
_LINES: dict[tuple[int, Workload, str, int, int], tuple[float, float]] = {}


class ScaledGpu:
    name = "cuda"

    def __init__(self, curve: EstimateBackend, *, scale: float = 1.0, offset_bytes: int = 0,
                 smooth: bool = False) -> None:
        self.curve = curve
        self.gpu = curve.gpu
        self.scale = scale
        self.offset_bytes = offset_bytes
        self.smooth = smooth
        self.probes = 0

    def describe(self) -> dict[str, Any]:
        return {"backend": self.name, "gpu_name": self.gpu.name, "scale": self.scale,
                "offset_bytes": self.offset_bytes, "smooth": self.smooth}

    def attn_used(self, workload: Workload) -> str:
        return self.curve.attn_used(workload)

    @contextlib.contextmanager
    def cell(self, workload: Workload, mode: Mode, seq_len: int, budget_bytes: int) -> Iterator[Cell]:
        with self.curve.cell(workload, mode, seq_len, budget_bytes) as estimated:
            demand = self._demand(estimated, (id(self.curve), workload, mode.name, seq_len, budget_bytes))

            def probe(batch_size: int) -> Probe:
                self.probes += 1
                peak = int(demand(batch_size) * self.scale) + self.offset_bytes
                if self.smooth:
                    peak = math.ceil(peak / ROUND_BYTES) * ROUND_BYTES
                if peak <= budget_bytes:
                    return Probe(batch_size, "fits", peak_bytes=peak, details={"peak_reserved_bytes": peak})
                return Probe(batch_size, "oom", details={"oom_message": "CUDA out of memory (fake)"})

            yield ProbeOnlyCell(probe)

    def _demand(self, estimated: Cell, key: tuple[int, Workload, str, int, int]) -> Callable[[int], float]:
        def exact(batch_size: int) -> float:
            peak = estimated.fits(batch_size).peak_bytes
            assert peak is not None
            return peak

        if not self.smooth:
            return exact
        if key not in _LINES:
            top = search_max_batch(estimated.fits, budget_bytes=key[-1], predict=estimated.predict,
                                   settle=estimated.settle).max_batch_size
            low, high = max(1, top // 2), max(2, top)
            if low == high:
                low = high - 1
            slope = (exact(high) - exact(low)) / (high - low)
            assert slope > 0, (low, high, slope)
            _LINES[key] = (exact(high) - slope * high, slope)
        intercept, slope = _LINES[key]
        return lambda batch_size: intercept + slope * batch_size
