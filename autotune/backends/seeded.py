"""A measuring backend whose searches start from the estimator's answer (the cuda backend's default).

On a GPU a probe is a real training step, seconds to minutes; the estimator answers the same cell on
the CPU in about a second, and its max batch is the measured one or one below it in most cells
(docs/accuracy.md). So each measured cell is first searched on the estimator, to the end, and then
on the GPU, where

- the first claim is the estimator's max batch, scaled by how far the measured max was from the
  estimated one in the previous cell of the mode, else of the mode before (a GPU that differs from
  the estimator does so alike at every length): a right claim costs two GPU probes, it fits and one
  more does not;
- the second, when only one measured batch has a peak, is the line through that peak with the
  estimator's slope (peak per sample between half its max batch and its max batch, wide enough
  that the allocator's 2 MiB and 20 MiB steps do not swamp it); two measured peaks make the search's
  own line (search.py). While no batch fit, the search steps down from the claim by a sixteenth of
  it, then twice that.

The answer is still only what the GPU's probes prove (search.py's contract: the max fits, the next
one does not); the estimate only decides where to look. A cell the estimator cannot model (an
operation it does not emulate) is searched as before, from the earlier cells' hints, and its first
probe says why (``estimate_error``).

Measured on the H100 (#17): 2.0 GPU probes per cell where the estimate was right, against 6.6 for the
guided search without it. On a fake GPU 10 % off the estimator: benchmarks/bench_seeded.py.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

from autotune.backends.base import Backend
from autotune.defaults import DEFAULT_MAX_BATCH
from autotune.errors import AutotuneError
from autotune.gpus import GpuSpec
from autotune.search import Cell, Probe, search_max_batch
from autotune.workload import Workload
from autotune.workload.modes import Mode


@dataclass(frozen=True)
class Seed:
    """What the estimator said of one cell before its first GPU probe."""

    max_batch_size: int | None  # None: the estimator could not model the step (error says why)
    peak_bytes: int | None = None  # the estimated peak at max_batch_size
    slope_bytes: float | None = None  # peak per sample near the max (None: not measurable)
    claim: int | None = None  # the first GPU claim: max_batch_size scaled by the mode's history
    error: str | None = None

    def details(self) -> dict[str, Any]:
        """What the cell's first probe says of its seed (the probe log's extras)."""
        if self.max_batch_size is None:
            return {"estimate_error": self.error}
        return {"estimated_max_batch_size": self.max_batch_size, "seeded_claim": self.claim}


def estimate_seed(estimator: Backend, workload: Workload, mode: Mode, seq_len: int, budget_bytes: int
                  ) -> Seed:
    """The estimator's max batch of the cell, its peak there and its slope near it (a Seed with
    ``error`` when the estimator cannot model the step: the GPU search then goes on without it)."""
    try:
        with estimator.cell(workload, mode, seq_len, budget_bytes) as cell:
            answer = search_max_batch(cell.fits, budget_bytes=budget_bytes, max_batch=DEFAULT_MAX_BATCH,
                                      predict=cell.predict, settle=cell.settle).max_batch_size
            low, high = max(1, answer // 2), max(2, answer)
            if low == high:
                low = high - 1
            first, second = cell.fits(low).peak_bytes, cell.fits(high).peak_bytes
            at_max = second if high == answer else cell.fits(answer).peak_bytes if answer else None
    except AutotuneError as exc:
        return Seed(None, error=str(exc))
    slope = None if first is None or second is None else (second - first) / (high - low)
    return Seed(answer, at_max, slope if slope is not None and slope > 0 else None, claim=answer)


class SeededCell:
    """A measuring cell (search.Cell) that claims the seed first, then the seed's slope through
    the one measured peak (see the module docstring)."""

    def __init__(self, cell: Cell, seed: Seed, budget_bytes: int) -> None:
        self.cell = cell
        self.seed = seed
        self.budget_bytes = budget_bytes
        self.probes: list[Probe] = []

    def fits(self, batch_size: int) -> Probe:
        probe = self.cell.fits(batch_size)
        if not self.probes:
            probe = replace(probe, details={**probe.details, **self.seed.details()})
        self.probes.append(probe)
        return probe

    def predict(self, lo: int, hi: int | None) -> int | None:
        """The seed's claim; then, from the one measured peak, the estimator's slope up to where the
        estimator's own limit lies (at most a batch above its peak at its max: the allocator's
        steps it saw there are the GPU's too)."""
        seed = self.seed
        if seed.claim is None:
            return self.cell.predict(lo, hi)
        if not self.probes:
            return seed.claim
        peaks = [(p.batch_size, p.peak_bytes) for p in self.probes if p.peak_bytes is not None]
        if len(peaks) != 1 or seed.slope_bytes is None or seed.peak_bytes is None:
            return self.cell.predict(lo, hi)  # None from a GPU: the search's own line or fallback
        (batch, peak), = peaks
        limit = min(self.budget_bytes, seed.peak_bytes + seed.slope_bytes)
        return batch + math.floor((limit - peak) / seed.slope_bytes)

    def settle(self, boundary: int) -> int | None:
        return self.cell.settle(boundary)

    def measured_max(self) -> int | None:
        """The max the probes proved: a fitting batch with the next one out of memory."""
        fitting = {p.batch_size for p in self.probes if p.outcome == "fits"}
        proven = [p.batch_size - 1 for p in self.probes
                  if p.outcome == "oom" and (p.batch_size - 1 in fitting or p.batch_size == 1)]
        return min(proven) if proven else None


class EstimateSeeded:
    """``measure`` (a Backend, the cuda one) with every cell's search seeded by ``estimator``."""

    def __init__(self, measure: Backend, estimator: Backend) -> None:
        self.measure = measure
        self.estimator = estimator
        self.name = measure.name
        self.gpu: GpuSpec = measure.gpu
        # (workload, mode) -> measured max / estimated max of its last cell that had both;
        # (workload, None) -> the same of the workload's last such cell in any mode, for the first
        # cell of the next mode (a GPU that differs from the estimator does so in every mode alike).
        self._scale: dict[tuple[Workload, str | None], float] = {}

    def describe(self) -> dict[str, Any]:
        return {**self.measure.describe(), "seeded_by": self.estimator.name}

    def attn_used(self, workload: Workload) -> str:
        return self.measure.attn_used(workload)

    def __getattr__(self, name: str) -> Any:
        # The measuring backend's own extras (workers_started, timeout_s, ...).
        if name in ("measure", "estimator"):
            raise AttributeError(name)
        return getattr(self.measure, name)

    @contextlib.contextmanager
    def cell(self, workload: Workload, mode: Mode, seq_len: int, budget_bytes: int) -> Iterator[Cell]:
        # The estimator runs the attention the GPU will run, not its own default.
        estimated = replace(workload, attn=self.measure.attn_used(workload))
        seed = estimate_seed(self.estimator, estimated, mode, seq_len, budget_bytes)
        key = (workload, mode.name)
        scale = self._scale.get(key, self._scale.get((workload, None)))
        if seed.max_batch_size is not None and scale is not None:
            seed = replace(seed, claim=round(seed.max_batch_size * scale))
        with self.measure.cell(workload, mode, seq_len, budget_bytes) as cell:
            seeded = SeededCell(cell, seed, budget_bytes)
            yield seeded
        measured = seeded.measured_max()
        if seed.max_batch_size and measured:
            self._scale[key] = self._scale[(workload, None)] = measured / seed.max_batch_size
