"""A trace's replay through the caching-allocator simulator: its peaks, and the smallest capacity it
runs in (``replay``), or whether it runs in one (``fits_in``).

Free of torch, like the trace (trace.py) and the simulator (allocator.py): a trace kept from an
earlier run replays without importing it (the CLI's check of another batch of a cell it has seen,
cli/answers.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from autotune.backends.estimate.alloc_conf import AllocatorConfig
from autotune.backends.estimate.allocator import ROUND_LARGE, CachingAllocatorSim
from autotune.backends.estimate.trace import ReplayEvent
from autotune.errors import OutOfMemory

# Every segment size, and every page an expandable segment maps (2 or 20 MiB), is a multiple of
# 2 MiB (allocator.py): so is reserved memory.
SEGMENT_GRANULE = ROUND_LARGE


@dataclass(frozen=True)
class Replay:
    """What the caching allocator would have reported for a trace."""

    peak_allocated_bytes: int
    peak_reserved_bytes: int  # with the capacity as the limit, when it fits; else without one
    demand_bytes: int  # the smallest capacity the trace runs in (a multiple of 2 MiB)
    fits: bool  # a replay with the capacity as the limit ran without out-of-memory

    @property
    def oom(self) -> bool:
        return not self.fits


def replay(events: Sequence[ReplayEvent], capacity_bytes: int | None,
           config: AllocatorConfig | None = None) -> Replay:
    """Peaks of ``events``, the smallest capacity they run in, and whether they run at ``capacity_bytes``.

    Without a limit the allocator keeps every segment it ever cached. With one it frees its
    cached segments and retries before giving up (CachingAllocatorSim models that), so a trace
    can run in less than its unlimited peak reserved, down to about its peak allocated. The
    demand is found by bisection over capacities between the two (reserved memory is a sum of
    whole segments, multiples of 2 MiB): a single figure that grows with the batch size, which is
    what the batch-size search predicts from. Whether the trace fits is the run at the capacity
    itself (``fits_in``'s verdict), which the demand does not always decide (see below).

    ``config``: the allocator's settings (PYTORCH_ALLOC_CONF; None: PyTorch's defaults). With
    expandable segments the limit is checked against a request's allocation size while the pages
    mapped for it can be fewer or more: the capacity the unlimited run never hits is the most any
    request checked (``capacity_needed_bytes``), which can be above or below its peak reserved
    (below its peak allocated even, where pages mapped beyond the allocation size serve later
    requests: the demand is then below the peak allocated, the bisection having nothing to do).

    A run with a limit is the run without one until a request for memory would first pass the
    limit, and no limit the bisection tries is below the peak allocated: every run of it starts
    from the unlimited run's state where a request first passes that (``_Prefix``), instead of
    from the first event (the same figures; about half of each run is skipped).
    """
    events = through_last_allocation(events)
    peak_allocated, unlimited_reserved, needed, grown = _run_growth(events, config)
    low = -(-peak_allocated // SEGMENT_GRANULE)  # in granules; below, a request is refused
    high = -(-needed // SEGMENT_GRANULE)  # fits: no limit is ever reached
    reserved_at_high = unlimited_reserved
    prefix = _Prefix.of(events, grown, low * SEGMENT_GRANULE, config)
    runs = _Runs(prefix)
    while low < high:
        middle = (low + high) // 2
        fitted, reserved = runs.run(middle * SEGMENT_GRANULE)
        if fitted:
            high, reserved_at_high = middle, reserved
        else:
            low = middle + 1
    demand = high * SEGMENT_GRANULE
    if capacity_bytes is None or capacity_bytes >= needed:  # no limit is ever reached
        return Replay(peak_allocated, reserved_at_high, demand, fits=True)
    # The run at the capacity decides, on either side of the demand: the allocator is not monotone
    # in its limit (releasing cached segments at other moments changes the placement), so a step can
    # run in less than the capacity and still run out of memory at it, and the reverse. So the GPU
    # runs it under that limit (Llama-3.2-1B FSDP2 at 1024 on an H200 capped at 21.88 GiB: batch 8
    # ran out of memory asking 3.91 GiB, as the run at the capacity does, though it runs in 20.11).
    fitted, _ = runs.run(capacity_bytes)
    return Replay(peak_allocated, reserved_at_high if demand <= capacity_bytes else unlimited_reserved,
                  demand, fits=fitted)


def fits_in(events: Sequence[ReplayEvent], capacity_bytes: int,
            config: AllocatorConfig | None = None) -> bool:
    """Whether the caching allocator (under ``config``'s settings) runs ``events`` within
    ``capacity_bytes``: one replay (to its last allocation: through_last_allocation)."""
    try:
        _run(through_last_allocation(events), capacity_bytes, config)
    except OutOfMemory:
        return False
    return True


def through_last_allocation(events: Sequence[ReplayEvent]) -> Sequence[ReplayEvent]:
    """``events`` up to their last allocation: the frees after it (a step's end releases its
    activations and gradients: a tenth of a BERT-base step's events) change neither whether a run
    fits nor its peaks. A free cannot run out of memory, and it neither reserves nor releases a
    segment (CachingAllocatorSim.free: free_block only merges the block and returns it to its pool;
    segments are released in malloc's retry, empty_cache and garbage collection, all in malloc)."""
    end = len(events)
    while end and events[end - 1][1] < 0:
        end -= 1
    return events if end == len(events) else events[:end]


def _run(events: Sequence[ReplayEvent], capacity_bytes: int | None,
         config: AllocatorConfig | None = None) -> tuple[int, int]:
    sim = CachingAllocatorSim(capacity_bytes, config)
    apply_events(sim, {}, events)
    stats = sim.stats
    return stats.peak_allocated_bytes, stats.peak_reserved_bytes


def apply_events(sim: CachingAllocatorSim, handles: dict[int, int], events: Sequence[ReplayEvent]) -> None:
    """Allocate and free ``events`` in ``sim``; ``handles``: event key -> the sim's handle. An
    allocation's third item, where it has one, is its stream (trace.ReplayEvent)."""
    malloc, free, take = sim.malloc, sim.free, handles.pop  # bound once: the loop runs per event
    for event in events:
        if len(event) == 2:
            key, nbytes = event
            if nbytes < 0:
                free(take(key))
            else:
                handles[key] = malloc(nbytes)
        else:
            key, nbytes, stream = event
            handles[key] = malloc(nbytes, stream)


def _run_growth(events: Sequence[ReplayEvent], config: AllocatorConfig | None
                ) -> tuple[int, int, int, list[tuple[int, int]]]:
    """The unlimited run's peaks, the most a request checked against the capacity, and where that
    grew: (event index, capacity needed after; classic segments: the reserved memory after)."""
    sim = CachingAllocatorSim(None, config)
    handles: dict[int, int] = {}
    grown: list[tuple[int, int]] = []
    needed = 0
    for index, (key, nbytes, *stream) in enumerate(events):
        if nbytes < 0:
            sim.free(handles.pop(key))
            continue
        handles[key] = sim.malloc(nbytes, *stream)
        if sim.capacity_needed_bytes != needed:
            needed = sim.capacity_needed_bytes
            grown.append((index, needed))
    stats = sim.stats
    return stats.peak_allocated_bytes, stats.peak_reserved_bytes, needed, grown


class _Runs:
    """Runs of the prefix's events at the capacities ``replay`` asks, each made once per class of
    capacities that run alike. A run with a limit depends on the limit only through the checks
    ``alloc_block`` makes of ``reserved + get_allocation_size > limit`` (allocator.py; garbage
    collection aside, the one other reader of the limit, under which every run is made). A run at
    ``limit`` whose passed checks asked at most ``needed`` (the allocator's capacity_needed_bytes,
    the prefix's checks included) and whose refused ones asked more than ``limit`` makes the same
    checks with the same verdicts, so the same run, at every limit in ``[needed, limit]``: its
    outcome and its peak reserved are known there without running it again. ``replay``'s
    bisection next asks a limit below the last that fitted, often inside that range (one run in
    eight of a BERT-base table's bisections is spared so)."""

    def __init__(self, prefix: _Prefix) -> None:
        self.prefix = prefix
        # (needed, limit, fitted, peak reserved) of each run made: it holds at every limit between
        self.known: list[tuple[int, int, bool, int]] = []
        self.alike = prefix.config is None or prefix.config.garbage_collection_threshold == 0

    def run(self, capacity_bytes: int) -> tuple[bool, int]:
        """(whether the events run within ``capacity_bytes``, their peak reserved when they do)."""
        for needed, limit, fitted, reserved in self.known:
            if needed <= capacity_bytes <= limit:
                return fitted, reserved
        sim = self.prefix.start_run(capacity_bytes)
        try:
            self.prefix.finish(sim)
        except OutOfMemory:
            fitted = False
        else:
            fitted = True
        reserved = sim.stats.peak_reserved_bytes
        if self.alike:
            self.known.append((sim.capacity_needed_bytes, capacity_bytes, fitted, reserved))
        return fitted, reserved


@dataclass(frozen=True)
class _Prefix:
    """The unlimited run's state just before a request first checks more than ``floor`` against the
    capacity: every run with a limit of at least ``floor`` is the same up to there."""

    events: Sequence[ReplayEvent]
    floor: int
    start: int  # the first event not yet run
    sim: CachingAllocatorSim
    handles: dict[int, int]
    config: AllocatorConfig | None

    @classmethod
    def of(cls, events: Sequence[ReplayEvent], grown: list[tuple[int, int]], floor: int,
           config: AllocatorConfig | None = None) -> _Prefix:
        start = next((index for index, needed in grown if needed > floor), len(events))
        if config is not None and config.garbage_collection_threshold > 0:
            # Garbage collection acts below the limit (from threshold x limit): runs differ earlier.
            start = 0
        sim = CachingAllocatorSim(None, config)
        handles: dict[int, int] = {}
        apply_events(sim, handles, events[:start])
        return cls(events, floor, start, sim, handles, config)

    def start_run(self, capacity_bytes: int) -> CachingAllocatorSim:
        """An allocator with ``capacity_bytes`` as its limit, at the prefix's end where the capacity
        is at least ``floor``, else at the start; ``finish`` runs the rest of the events in it (the
        whole run: ``_run(events, capacity_bytes)``)."""
        if capacity_bytes < self.floor:
            return CachingAllocatorSim(capacity_bytes, self.config)
        return self.sim.clone(capacity_bytes)

    def finish(self, sim: CachingAllocatorSim) -> None:
        """The events ``start_run``'s allocator has not seen, in it (OutOfMemory propagates)."""
        if sim.capacity_bytes is not None and sim.capacity_bytes < self.floor:
            apply_events(sim, {}, self.events)
        else:
            apply_events(sim, dict(self.handles), self.events[self.start:])
