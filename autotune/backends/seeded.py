"""A measuring backend whose searches start from the estimator's answer (the cuda backend's default).

On a GPU a probe is a real training step, seconds to minutes; the estimator answers the same cell on
the CPU in about a second, and its max batch is the measured one or one below it in most cells
(docs/accuracy.md). So each measured cell is first searched on the estimator, to the end, and then
on the GPU, where

- the first claim of a workload's first cell is the estimator's max batch. Then the GPU's limit is
  read in the estimator's bytes: a batch fits on the GPU while the estimator's memory line of its
  cell (through its peaks at half its max batch and at its max batch) is below a limit that is the
  same for every cell of the workload (a GPU that differs from the estimator does so as a function
  of the memory, whatever the length: a scale, a context or workspace the estimator missed). Each
  measured cell bounds that limit from both sides (its max's line is below it, the next batch's is
  not), the bounds of the cells are intersected (``GpuLimit``), and the limit claims the largest
  batch whose line is below the upper bound: the answer or one above it, and both cost two GPU
  probes (fits, one more does not; or out of memory, one fewer fits); where the estimator's max is
  that or one off it, the larger of the two. Bounds that contradict each other (a GPU whose
  difference is not a function of the memory alone) are replaced by the newest cell's. A cell
  claims the estimator's max or the limit's claim, whichever missed the measured maxes of the
  workload's cells by less so far: on a GPU the estimator gets exactly right the estimator's max
  (its allocator steps, which the line smooths out), on one it does not the limit's;
- after a claim fit, the next is where the line through its measured peak, with the estimator's
  slope times the GPU's scale (the budget over the limit; before the first measured cell, the peak
  over the estimated one), crosses the budget; after a claim of the estimator's own max, at most
  a batch above it (the allocator's steps it saw there are the GPU's too). Two measured peaks make the
  search's own line (search.py). After a claim ran out of memory: one below it, then where the
  limit's lower bound says a batch surely fits; then, as with no limit, the search steps down by a
  sixteenth of the claim, then twice that.

The answer is still only what the GPU's probes prove (search.py's contract: the max fits, the next
one does not); the estimate only decides where to look. A cell the estimator cannot model (an
operation it does not emulate) is searched as before, from the earlier cells' hints, and its first
probe says why (``estimate_error``).

Measured on the H100 (#17): 2.0 GPU probes per cell where the estimate was right, against 6.6 for the
guided search without it. On a fake GPU 10 % off the estimator (benchmarks/bench_seeded.py, the
BERT-base table at 12 GiB): 2.08 GPU probes per cell at x0.9, 2.25 at x1.1 (3.50 and 3.50 before the
limit, when a claim was the estimate scaled by the previous cell's measured/estimated max), and
2.00 on a GPU whose memory is the estimator's own (``--stepwise --scales 1.0``).
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
    claim: int | None = None  # the first GPU claim (see the module docstring)
    error: str | None = None

    def details(self) -> dict[str, Any]:
        """What the cell's first probe says of its seed (the probe log's extras)."""
        if self.max_batch_size is None:
            return {"estimate_error": self.error}
        return {"estimated_max_batch_size": self.max_batch_size, "seeded_claim": self.claim}

    def line(self, batch_size: int) -> float | None:
        """The estimator's memory line of the cell at ``batch_size`` (None: it has none)."""
        if self.max_batch_size is None or self.peak_bytes is None or self.slope_bytes is None:
            return None
        return self.peak_bytes + self.slope_bytes * (batch_size - self.max_batch_size)

    def below(self, limit: float) -> int | None:
        """The largest batch whose line is below ``limit`` (0 when none is; None: no line)."""
        at_zero = self.line(0)
        if at_zero is None or self.slope_bytes is None:
            return None
        return max(0, math.ceil((limit - at_zero) / self.slope_bytes) - 1)


@dataclass(frozen=True)
class GpuLimit:
    """Where the GPU runs out, in the estimator's bytes: a batch fits while its cell's estimated
    line is below a limit at least ``low`` and below ``high`` (bounds from the measured cells,
    intersected)."""

    low: float
    high: float

    @classmethod
    def of(cls, seed: Seed, measured_max: int) -> GpuLimit | None:
        """The bounds one measured cell sets: its max's line is below the limit, the next one's not."""
        high = seed.line(measured_max + 1)
        if high is None:
            return None
        low = seed.line(measured_max) if measured_max >= 1 else -math.inf
        assert low is not None
        return cls(low, high)

    def narrowed(self, other: GpuLimit) -> GpuLimit:
        """Both cells' bounds; the newer cell's alone where they contradict each other."""
        low, high = max(self.low, other.low), min(self.high, other.high)
        return GpuLimit(low, high) if low < high else other

    def scale(self, budget_bytes: int) -> float | None:
        """The GPU's bytes per estimated byte near the limit (None: not known)."""
        if not math.isfinite(self.low) or self.low <= 0:
            return None
        return budget_bytes / ((self.low + self.high) / 2)


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


def first_claim(seed: Seed, limit: GpuLimit | None) -> int | None:
    """The cell's first GPU claim: the largest batch whose line is below the upper bound of the
    GPU's limit, or the estimator's max where that is the same within a batch (the estimator's own
    allocator steps, and a claim one too high costs no more than a right one); the estimator's max
    in a workload's first cell (the module docstring)."""
    estimated = seed.max_batch_size
    claim = seed.below(limit.high) if limit is not None else None
    if estimated is None or claim is None:
        return estimated
    return max(claim, estimated) if abs(claim - estimated) <= 1 else claim


class SeededCell:
    """A measuring cell (search.Cell) that claims the seed first, then the seed's slope, scaled,
    through the one measured peak (see the module docstring)."""

    def __init__(self, cell: Cell, seed: Seed, budget_bytes: int, limit: GpuLimit | None = None) -> None:
        self.cell = cell
        self.seed = seed
        self.budget_bytes = budget_bytes
        self.limit = limit
        self.probes: list[Probe] = []

    def fits(self, batch_size: int) -> Probe:
        probe = self.cell.fits(batch_size)
        if not self.probes:
            probe = replace(probe, details={**probe.details, **self.seed.details()})
        self.probes.append(probe)
        return probe

    def predict(self, lo: int, hi: int | None) -> int | None:
        """The seed's claim; then, from the one measured peak, the estimator's slope scaled to the
        GPU up to the budget (after a claim of the estimator's own max, up to where the estimator's
        own limit lies: at most a batch above its peak at its max); after out of memory only, one
        below, then where the limit says a batch surely fits (see the module docstring)."""
        seed = self.seed
        if seed.claim is None:
            return self.cell.predict(lo, hi)
        if not self.probes:
            return seed.claim
        peaks = [(p.batch_size, p.peak_bytes) for p in self.probes if p.peak_bytes is not None]
        if not peaks and hi is not None and self.limit is not None and len(self.probes) <= 2:
            # Only out of memory: the claim was one too high (the limit's upper bound claims the
            # answer or one above it), else the limit's lower bound says where a batch surely fits;
            # out of memory there too, the limit is wrong here and the search falls back.
            surely = seed.below(self.limit.low)
            if len(self.probes) == 1 or surely is None:
                return max(hi - 1, lo)
            return max(min(hi - 1, surely), lo)
        line = seed.line(peaks[0][0]) if len(peaks) == 1 else None
        if line is None or line <= 0 or seed.slope_bytes is None or seed.peak_bytes is None:
            return self.cell.predict(lo, hi)  # None from a GPU: the search's own line or fallback
        (batch, peak), = peaks
        limit = self.budget_bytes
        if seed.claim == seed.max_batch_size:  # the estimator's own steps: at most one batch above
            limit = min(limit, math.floor(seed.peak_bytes + seed.slope_bytes))
        scale = self.limit.scale(self.budget_bytes) if self.limit is not None else None
        if scale is None:
            scale = peak / line
        return batch + math.floor((limit - peak) / (seed.slope_bytes * scale))

    def settle(self, boundary: int) -> int | None:
        return self.cell.settle(boundary)

    def above(self, boundary: int) -> int | None:
        return self.cell.above(boundary)

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
        # (workload, mode) -> the GPU's limit read from the mode's measured cells; (workload, None)
        # -> the same of the workload's newest cell in any mode, for the first cell of the next mode.
        self._limit: dict[tuple[Workload, str | None], GpuLimit] = {}
        # workload -> how far the two first claims missed the measured max, summed over its cells:
        # the estimator's max, the claim from the GPU's limit (see ``first``).
        self._missed: dict[Workload, tuple[int, int]] = {}

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
        limit = self._limit.get(key, self._limit.get((workload, None)))
        from_limit = first_claim(seed, limit) if limit is not None else None
        seed = replace(seed, claim=self.first(workload, seed.max_batch_size, from_limit))
        with self.measure.cell(workload, mode, seq_len, budget_bytes) as cell:
            seeded = SeededCell(cell, seed, budget_bytes, limit)
            yield seeded
        measured = seeded.measured_max()
        if measured is None or seed.max_batch_size is None:
            return
        estimate_missed, limit_missed = self._missed.get(workload, (0, 0))
        if from_limit is not None:
            limit_missed += abs(measured - from_limit)
        self._missed[workload] = (estimate_missed + abs(measured - seed.max_batch_size), limit_missed)
        read = GpuLimit.of(seed, measured)
        if read is not None:
            self._limit[key] = self._limit[(workload, None)] = read if limit is None else limit.narrowed(read)

    def first(self, workload: Workload, estimated: int | None, from_limit: int | None) -> int | None:
        """A cell's first claim: the estimator's max or the claim from the GPU's limit, whichever
        missed the measured maxes of the workload's cells by less so far (the estimator's while
        neither did worse: a GPU it gets exactly right, allocator steps and all, stays at two probes
        a cell; the limit's line smooths those steps out)."""
        if from_limit is None or estimated is None:
            return estimated
        estimate_missed, limit_missed = self._missed.get(workload, (0, 0))
        return estimated if estimate_missed <= limit_missed else from_limit
