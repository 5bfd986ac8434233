"""Find the largest batch size that fits in memory, with as few probes as possible.

The search is pure: it calls ``fits(batch) -> Probe`` and knows nothing of torch,
so it is tested on fake memory curves (tests/test_search.py).

Contract, for both methods: the answer ``b`` is proven by probes made in this search,
``fits(b)`` fits and ``fits(b + 1)`` runs out of memory, except that

- ``b == 0`` needs only ``fits(1)`` out of memory;
- ``b == max_batch`` needs only ``fits(max_batch)`` (the result says ``capped``);
- ``b == upper_bound`` needs only ``fits(upper_bound)``: the caller's bound is the answer
  of a shorter sequence, whose search already saw ``upper_bound + 1`` run out of memory,
  and a longer sequence never needs less memory.

No batch is probed twice, none outside ``[1, min(max_batch, upper_bound)]``. Memory is
taken to be monotone in the batch size (if ``b`` fits, every smaller batch fits).

Two methods:

``bisect``
    The baseline, like PyTorch Lightning's ``BatchSizeFinder(mode="binsearch")`` started
    at 1: 1, 2, 4, ... until out of memory, then binary search between the last batch
    that fit and the first that did not.
``guided``
    Peak memory of a training step is close to affine in the batch size above a floor,
    ``peak(b) ~= max(floor, intercept + slope * b)`` (at small batches the optimizer
    step's peak dominates), plus steps where the caching allocator rounds blocks (2 MiB
    and 20 MiB segments, large blocks rounded up to 2 MiB: kSmallBuffer, kLargeBuffer,
    kRoundLarge in c10/cuda/CUDACachingAllocator.cpp). So every probe tests a claimed
    answer: first the caller's ``guess``, else the ``prior`` model's prediction; then
    where a line through the measured peaks crosses the budget. A claim of a batch
    already known to fit is tested one above it, so a right claim costs two probes.
    Peaks can also be noise at the scale of a few batches (fragmentation, segment
    reuse), so the search keeps score: each claim a probe refutes doubles ``error``
    (at least to the miss), a claim is then tested ``error`` away from the bracket's ends,
    and a bracket under twice the error, or one two probes failed to halve, is bisected.
    With nothing to predict from (no budget, no peaks, no slope) it gallops and bisects.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import Any, Literal, Protocol

from autotune.defaults import DEFAULT_MAX_BATCH
from autotune.errors import InvalidInput, SearchError

Outcome = Literal["fits", "oom", "error"]
Method = Literal["guided", "bisect"]
OUTCOMES: tuple[Outcome, ...] = ("fits", "oom", "error")
METHODS: tuple[Method, ...] = ("guided", "bisect")


@dataclass(frozen=True)
class Probe:
    """What one trial training step at one batch size found."""

    batch_size: int
    outcome: Outcome
    peak_bytes: int | None = None  # the figure the budget bounds; None for a real CUDA OOM
    step_time_s: float | None = None  # seconds for one training step, when measured
    error: str | None = None  # the message, for outcome "error"
    details: Mapping[str, Any] = field(default_factory=dict)  # backend extras


FitsFn = Callable[[int], Probe]
# predict(lo, hi) -> the claimed max inside (lo, hi): lo fits (0: none known), hi ran out of
# memory (None: none known); None when the backend cannot tell.
PredictFn = Callable[[int, "int | None"], "int | None"]
# settle(b) -> the boundary at or below b that searches ending near b agree on (None: b).
SettleFn = Callable[[int], "int | None"]
# above(b) -> a larger batch that also fits past b + 1, which runs out of memory (None: none known).
AboveFn = Callable[[int], "int | None"]


class Cell(Protocol):
    """One (workload, mode, seq_len) cell as a backend probes it (backends.Backend.cell).

    ``fits`` makes one probe. The two hooks let a backend that can evaluate batches without a
    probe (the estimator replays extrapolated traces in milliseconds) steer the search; both
    answer None where the backend cannot tell, as a real GPU never can. See
    ``search_max_batch`` for what each hook means.
    """

    def fits(self, batch_size: int) -> Probe: ...

    def predict(self, lo: int, hi: int | None) -> int | None: ...

    def settle(self, boundary: int) -> int | None: ...

    def above(self, boundary: int) -> int | None: ...


@dataclass(frozen=True)
class ProbeOnlyCell:
    """A Cell with nothing but probes: ``probe(batch) -> Probe``, no hooks."""

    probe: FitsFn

    def fits(self, batch_size: int) -> Probe:
        return self.probe(batch_size)

    def predict(self, lo: int, hi: int | None) -> int | None:
        return None

    def settle(self, boundary: int) -> int | None:
        return None

    def above(self, boundary: int) -> int | None:
        return None


@dataclass(frozen=True)
class MemoryModel:
    """Peak bytes of a training step ~= intercept_bytes + slope_bytes * batch_size.

    Valid above the small-batch floor only; slope_bytes (bytes per sample) is positive.
    """

    intercept_bytes: float
    slope_bytes: float

    def __post_init__(self) -> None:
        finite = math.isfinite(self.intercept_bytes) and math.isfinite(self.slope_bytes)
        if not finite or self.slope_bytes <= 0:
            raise ValueError(f"MemoryModel needs finite numbers, slope_bytes > 0: {self}")

    def predict_max(self, budget_bytes: int) -> int:
        """The largest batch whose predicted peak is <= budget_bytes (0 if none)."""
        # Exact arithmetic, so that a line through the budget at a whole batch size
        # does not lose that batch to float rounding.
        room = Fraction(budget_bytes) - Fraction(self.intercept_bytes)
        return max(0, math.floor(room / Fraction(self.slope_bytes)))


@dataclass(frozen=True)
class SearchResult:
    """The answer of one search and the probes that prove it."""

    max_batch_size: int  # 0: does not fit even at batch size 1
    probes: tuple[Probe, ...]  # every probe made, in order
    capped: bool  # max_batch_size == max_batch, so max_batch + 1 was not probed
    model: MemoryModel | None  # fitted to this search's peaks: a hint for the next cell
    # A larger batch that also fits, past max_batch_size + 1 that runs out of memory (the caching
    # allocator's fragmentation): the backend's word (``above``), not proven by probes; None if none.
    also_fits: int | None = None

    @property
    def num_probes(self) -> int:
        return len(self.probes)


class _Bracket:
    """The probes made so far and what they prove: lo fits, hi does not."""

    def __init__(self, fits: FitsFn, max_batch: int, upper_bound: int | None) -> None:
        if max_batch < 1:
            raise InvalidInput(f"max_batch must be >= 1, got {max_batch}")
        if upper_bound is not None and upper_bound < 0:
            raise InvalidInput(f"upper_bound must be >= 0 or None, got {upper_bound}")
        self._fits = fits
        self.max_batch = max_batch
        self.top = max_batch if upper_bound is None else min(upper_bound, max_batch)
        self.probes: list[Probe] = []
        self.lo = 0  # largest batch proven to fit; 0 before any
        self.hi: int | None = None  # smallest batch proven not to fit; None before any

    @property
    def ceiling(self) -> int:
        """The largest batch that may still be the answer."""
        return self.top if self.hi is None else self.hi - 1

    @property
    def done(self) -> bool:
        return self.lo == self.ceiling

    def open(self, answer: int) -> bool:
        """Whether the probes so far leave answer possible."""
        return self.lo <= answer <= self.ceiling

    def probe(self, batch: int) -> Probe:
        assert self.lo < batch <= self.ceiling, (batch, self.lo, self.ceiling)
        probe = self._fits(batch)
        if probe.batch_size != batch:
            raise ValueError(f"fits({batch}) returned a probe of {probe.batch_size}")
        if probe.outcome not in OUTCOMES:
            allowed = ", ".join(OUTCOMES)
            raise ValueError(f"unknown outcome {probe.outcome!r}; allowed: {allowed}")
        self.probes.append(probe)
        if probe.outcome == "error":
            why = probe.error or "no message"
            raise SearchError(f"probe at batch size {batch} failed: {why}", self.probes, probe)
        if probe.outcome == "fits":
            self.lo = batch
        else:
            self.hi = batch
        return probe

    def peaks(self, outcome: Outcome) -> list[tuple[int, int]]:
        """(batch, peak_bytes) of the probes with this outcome and a peak, by batch."""
        return sorted(
            (p.batch_size, p.peak_bytes)
            for p in self.probes
            if p.outcome == outcome and p.peak_bytes is not None
        )

    def result(self, prior: MemoryModel | None) -> SearchResult:
        return SearchResult(
            max_batch_size=self.lo,
            probes=tuple(self.probes),
            capped=self.lo == self.max_batch,
            model=_summary_model(self, prior),
        )


@dataclass(frozen=True)
class _Line:
    """peak(b) = peak + slope * (b - batch): a line through a measured point, exactly."""

    batch: int
    peak: Fraction
    slope: Fraction  # bytes per sample, > 0

    def predict_max(self, budget_bytes: int) -> int:
        return self.batch + math.floor((budget_bytes - self.peak) / self.slope)

    @classmethod
    def through(cls, a: tuple[int, int], b: tuple[int, int]) -> _Line | None:
        slope = Fraction(b[1] - a[1]) / (b[0] - a[0])
        return cls(a[0], Fraction(a[1]), slope) if slope > 0 else None

    @classmethod
    def of(cls, model: MemoryModel) -> _Line:
        return cls(0, Fraction(model.intercept_bytes), Fraction(model.slope_bytes))

    def model(self) -> MemoryModel:
        intercept = self.peak - self.slope * self.batch
        return MemoryModel(float(intercept), float(self.slope))


def _local_line(s: _Bracket, prior: MemoryModel | None) -> tuple[_Line | None, int]:
    """The line to predict from, through the measured points nearest the budget, and
    the largest batch it may be trusted to reach.

    The secant between the largest fitting and the smallest OOM batch when both have a
    peak (interpolation: robust to curvature); else the two largest fitting batches
    (real CUDA OOMs have no peak); else the two smallest OOM batches. With one point, or
    a slope <= 0 (both points on the floor), the prior's slope through the nearest point.

    Extrapolating from fitting batches only, a slope below half the slope just above it
    (a convex bend: the optimizer-step floor, or steps of allocator rounding) may still
    be too shallow, so that line reaches no further than twice the largest fitting batch.
    """
    below, above = s.peaks("fits"), s.peaks("oom")
    line, reach = None, s.top
    if below and above:
        line = _Line.through(below[-1], above[0])
    elif len(below) >= 2:
        line = _Line.through(below[-2], below[-1])
        lower = _Line.through(below[-3], below[-2]) if len(below) >= 3 else line
        if line is not None and (lower is None or 2 * lower.slope < line.slope):
            reach = 2 * s.lo
    elif len(above) >= 2:
        line = _Line.through(above[0], above[1])
    if line is not None or prior is None:
        return line, reach
    nearest = below[-1] if below else above[0] if above else None
    if nearest is None:
        return _Line.of(prior), reach
    return _Line(nearest[0], Fraction(nearest[1]), Fraction(prior.slope_bytes)), reach


def _summary_model(s: _Bracket, prior: MemoryModel | None) -> MemoryModel | None:
    """The model to hand to the next cell: a slope measured over as wide a span as we can.

    The two points farthest apart among those at or above half the answer: neighbours
    of the answer alone give a slope swamped by allocator rounding, and points far below
    it may sit on the optimizer-step floor. With only one such point, it and the next
    point below; with no second point, the prior's slope through the one there is.
    """
    points = sorted(s.peaks("fits") + s.peaks("oom"))
    near = [p for p in points if 2 * p[0] >= s.lo]
    if len(near) == 1 and len(points) >= 2:
        near = points[-2:]
    line = _Line.through(near[0], near[-1]) if len(near) >= 2 else None
    if line is None and prior is not None and points:
        anchor = ([p for p in points if p[0] <= s.lo] or points)[-1]
        line = _Line(anchor[0], Fraction(anchor[1]), Fraction(prior.slope_bytes))
    return line.model() if line is not None else None


def bisect_search(
    fits: FitsFn, *, max_batch: int = DEFAULT_MAX_BATCH, upper_bound: int | None = None
) -> SearchResult:
    """The baseline: double from 1 until out of memory, then binary search."""
    s = _Bracket(fits, max_batch, upper_bound)
    while not s.done:
        if s.hi is None:
            s.probe(min(2 * s.lo, s.top) if s.lo else 1)
        else:
            s.probe((s.lo + s.hi) // 2)
    return s.result(prior=None)


def _fallback(s: _Bracket, base: int, *, skip_floor: bool) -> int:
    """The probe when nothing predicts the answer: gallop away from base, else bisect.

    base is the last probe a claim chose (0 if none). Galloping doubles the distance
    from it: from 0 this is the baseline's 1, 2, 4, ...; from a guess g that fit,
    g+1, g+2, g+4, ... Where the two largest fitting batches peaked alike (the
    optimizer-step floor hides the activations; nothing is learned there) and
    skip_floor, the distance grows 8-fold instead.

    Below a guess that ran out of memory, with no batch known to fit, it is g-1, then
    g-1-g/16, g-2-g/8, ...: a hint scaled from another cell is off by a fraction of
    itself rather than by a few batches, and after a real CUDA OOM (no peak) only a
    batch that fits gives the line a point to pivot on.
    """
    if s.hi is None:
        below = s.peaks("fits")
        flat = skip_floor and len(below) >= 2 and below[-1][1] <= below[-2][1]
        distance = (8 if flat else 2) * (s.lo - base)
        return min(max(s.lo + 1, base + distance), s.top)
    if s.lo == 0 and base >= s.hi:
        step = 1 if s.hi == base else max(base // 16, base - s.hi)
        return max(s.hi - step, 1)
    return (s.lo + s.hi) // 2


def _threshold(s: _Bracket, budget_bytes: int) -> int:
    """The peak that separates fitting from OOM batches: the budget, unless probes disagree.

    A backend may let a batch fit above the budget (an estimator that, like the caching
    allocator, frees cached segments and retries before it gives up) or run out below it
    (fragmentation). A batch that fit at peak p proves the threshold is at least p; one
    that ran out at peak q, that it is below q.
    """
    fit = [peak for _, peak in s.peaks("fits")]
    oom = [peak for _, peak in s.peaks("oom")]
    threshold = max([budget_bytes, *fit])
    if oom and min(oom) <= threshold and (not fit or max(fit) < min(oom)):
        threshold = min(oom) - 1
    return threshold


def _claim(
    s: _Bracket, budget_bytes: int | None, guess: int | None, prior: MemoryModel | None,
    predict: PredictFn | None = None,
) -> int | None:
    """The answer the hints (first probe) or the fitted line claim, clamped into the bracket.

    None when there is nothing to predict from, or when the line claims that a batch
    already proven out of memory fits (after a real CUDA OOM, which has no peak).
    A backend's own ``predict`` comes first when it has an answer.
    """
    predicted = predict(s.lo, s.hi) if predict is not None else None
    if predicted is not None:
        return min(max(predicted, s.lo), s.ceiling)
    if not s.probes:
        raw = guess
        if raw is None and prior is not None and budget_bytes is not None:
            raw = prior.predict_max(budget_bytes)
    elif budget_bytes is None:
        return None
    else:
        line, reach = _local_line(s, prior)
        if line is None:
            return None
        raw = min(line.predict_max(_threshold(s, budget_bytes)), reach)
        if s.hi is not None and raw >= s.hi:
            return None
    return None if raw is None else min(max(raw, s.lo), s.ceiling)


def guided_search(
    fits: FitsFn,
    *,
    budget_bytes: int | None,
    max_batch: int = DEFAULT_MAX_BATCH,
    upper_bound: int | None = None,
    guess: int | None = None,
    prior: MemoryModel | None = None,
    predict: PredictFn | None = None,
) -> SearchResult:
    """Probe where the fitted memory line crosses the budget; see the module docstring.

    The claim c, clamped to [lo, hi - 1], is probed at c itself, or at lo + max(1, error)
    when c is lo; once a batch has run out of memory, never closer than error to lo or hi.
    """
    if budget_bytes is not None and budget_bytes <= 0:
        raise InvalidInput(f"budget_bytes must be > 0 or None, got {budget_bytes}")
    s = _Bracket(fits, max_batch, upper_bound)
    skip_floor = budget_bytes is not None
    base = 0  # the last probe a claim chose: galloping counts from there
    error = 0  # in batches
    widths = [math.inf, math.inf]  # hi - lo after each probe, inf while no batch ran out
    while not s.done:
        claim = _claim(s, budget_bytes, guess, prior, predict)
        if claim is None:
            batch = _fallback(s, base, skip_floor=skip_floor)
            if s.hi is None:
                batch = min(max(batch, s.lo + error), s.top)
        elif s.hi is not None and (2 * error >= s.hi - s.lo or 2 * widths[-1] > widths[-3]):
            batch = (s.lo + s.hi) // 2
        elif claim > s.lo:
            batch = base = claim if s.hi is None else max(min(claim, s.hi - error), s.lo + error)
        else:
            batch = base = min(s.lo + max(1, error), s.ceiling)
        s.probe(batch)
        widths.append(math.inf if s.hi is None else s.hi - s.lo)
        if claim is not None and not s.open(claim):
            missed_by = s.lo - claim if claim < s.lo else claim - s.ceiling
            error = max(1, 2 * error, missed_by)
    return s.result(prior if budget_bytes is not None else None)


def search_max_batch(
    fits: FitsFn,
    *,
    budget_bytes: int | None,
    max_batch: int = DEFAULT_MAX_BATCH,
    method: Method = "guided",
    upper_bound: int | None = None,
    guess: int | None = None,
    prior: MemoryModel | None = None,
    predict: PredictFn | None = None,
    settle: SettleFn | None = None,
    above: AboveFn | None = None,
) -> SearchResult:
    """The largest batch size that fits, by the given method (see the module docstring).

    ``budget_bytes`` is what ``peak_bytes`` is compared with (None: unknown, no
    predictions); ``upper_bound`` the answer of a shorter sequence (this answer is
    <= it); ``guess`` and ``prior`` hints from earlier cells, used by "guided" only;
    ``predict(lo, hi)`` a backend's own claim of the answer inside the bracket (an estimator
    that can evaluate a batch without a probe), also "guided" only: still verified by probes.
    ``settle(b)``, for both methods: where fits is not monotone near the limit (the caching
    allocator's fragmentation), two searches can stop at different boundaries; a backend that
    can evaluate batches cheaply names the one boundary near ``b`` (below it, or above it past
    a batch that ran out of memory) that any search ending near it settles on, and the probes
    that prove it are made here.
    ``above(b)``, for both methods: where a batch larger than the answer ``b`` fits past ``b + 1``
    (a hole), the backend names it; the result keeps it as ``also_fits``, a note beside the answer
    (a GPU search from small batches stops at ``b`` too), never the answer.
    Raises SearchError on a probe with outcome "error"; exceptions raised by ``fits``
    propagate untouched.
    """
    if method == "bisect":
        result = bisect_search(fits, max_batch=max_batch, upper_bound=upper_bound)
    elif method == "guided":
        result = guided_search(
            fits,
            budget_bytes=budget_bytes,
            max_batch=max_batch,
            upper_bound=upper_bound,
            guess=guess,
            prior=prior,
            predict=predict,
        )
    else:
        allowed = ", ".join(METHODS)
        raise InvalidInput(f"unknown search method {method!r}; allowed: {allowed}")
    if settle is not None:
        result = _settle(fits, result, settle, max_batch, upper_bound)
    top = max_batch if upper_bound is None else min(upper_bound, max_batch)
    if above is None or result.capped or result.max_batch_size >= top:
        return result
    higher = above(result.max_batch_size)
    if higher is None or higher <= result.max_batch_size + 1:
        return result
    return replace(result, also_fits=higher)


def _settle(fits: FitsFn, result: SearchResult, settle: SettleFn, max_batch: int,
            upper_bound: int | None) -> SearchResult:
    """Move the answer to ``settle``'s boundary, proving it with its own probes: it fits and the next
    one does not, unless it is the largest batch the search may probe (``max_batch``, a shorter
    sequence's answer)."""
    found = result.max_batch_size
    top = max_batch if upper_bound is None else min(upper_bound, max_batch)
    if result.capped:  # the cap fits and nothing above was asked: no boundary to settle
        return result
    target = settle(found) if found >= 1 else None
    if target is None or target == found or target < 0 or target > top:
        return result
    probes = list(result.probes)
    made = {p.batch_size: p for p in probes}
    proof = ((target, "fits"), (target + 1, "oom")) if target < top else ((target, "fits"),)
    for batch, expected in proof:
        if batch < 1:
            continue
        probe = made.get(batch)
        if probe is None:
            probe = fits(batch)
            probes.append(probe)
            if probe.outcome == "error":
                raise SearchError(f"probe at batch size {batch} failed: {probe.error or 'no message'}",
                                  probes, probe)
        if probe.outcome != expected:  # the backend's claim did not hold: keep the search's
            return SearchResult(found, tuple(probes), result.capped, result.model)
    return SearchResult(target, tuple(probes), target == max_batch, result.model)
