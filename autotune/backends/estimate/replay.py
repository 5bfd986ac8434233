"""A trace's replay through the caching-allocator simulator: its peaks, and the smallest capacity it
runs in (``replay``), or whether it runs in one (``fits_in``).

Free of torch, like the trace (trace.py) and the simulator (allocator.py): a trace kept from an
earlier run replays without importing it (the CLI's check of another batch of a cell it has seen,
cli/answers.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from autotune.backends.estimate.allocator import ROUND_LARGE, CachingAllocatorSim
from autotune.backends.estimate.trace import Event
from autotune.errors import OutOfMemory

SEGMENT_GRANULE = ROUND_LARGE  # every segment size is a multiple of 2 MiB (allocator.py)


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


def replay(events: list[Event], capacity_bytes: int | None) -> Replay:
    """Peaks of ``events``, the smallest capacity they run in, and whether that is <= capacity.

    Without a limit the allocator keeps every segment it ever cached. With one it frees its
    cached segments and retries before giving up (CachingAllocatorSim models that), so a trace
    can run in less than its unlimited peak reserved, down to about its peak allocated. The
    demand is found by bisection over capacities between the two (reserved memory is a sum of
    whole segments, multiples of 2 MiB): a single figure that decides fits/oom and that grows
    with the batch size, which is what the batch-size search predicts from.

    A run with a limit is the run without one until its reserved memory would first pass the
    limit, and no limit the bisection tries is below the peak allocated: every run of it starts
    from the unlimited run's state where its reserved first passes that (``_Prefix``), instead of
    from the first event (the same figures; about half of each run is skipped).
    """
    peak_allocated, unlimited_reserved, grown = _run_growth(events)
    low = -(-peak_allocated // SEGMENT_GRANULE)  # in granules; nothing below can fit
    high = -(-unlimited_reserved // SEGMENT_GRANULE)  # fits: no limit is ever reached
    reserved_at_high = unlimited_reserved
    prefix = _Prefix.of(events, grown, low * SEGMENT_GRANULE)
    while low < high:
        middle = (low + high) // 2
        try:
            _, reserved = prefix.run(middle * SEGMENT_GRANULE)
        except OutOfMemory:
            low = middle + 1
        else:
            high, reserved_at_high = middle, reserved
    demand = high * SEGMENT_GRANULE
    if capacity_bytes is None or demand <= capacity_bytes:
        return Replay(peak_allocated, reserved_at_high, demand, fits=True)
    # Over the demand found by bisection; the direct run at the capacity decides (the two can
    # differ where releasing cached segments at other moments changes the placement).
    try:
        prefix.run(capacity_bytes)
    except OutOfMemory:
        return Replay(peak_allocated, unlimited_reserved, demand, fits=False)
    return Replay(peak_allocated, unlimited_reserved, demand, fits=True)


def fits_in(events: list[Event], capacity_bytes: int) -> bool:
    """Whether the caching allocator runs ``events`` within ``capacity_bytes``: one replay."""
    try:
        _run(events, capacity_bytes)
    except OutOfMemory:
        return False
    return True


def _run(events: list[Event], capacity_bytes: int | None) -> tuple[int, int]:
    sim = CachingAllocatorSim(capacity_bytes)
    apply_events(sim, {}, events)
    stats = sim.stats
    return stats.peak_allocated_bytes, stats.peak_reserved_bytes


def apply_events(sim: CachingAllocatorSim, handles: dict[int, int], events: Sequence[Event]) -> None:
    """Allocate and free ``events`` in ``sim``; ``handles``: event key -> the sim's handle."""
    for key, nbytes in events:
        if nbytes < 0:
            sim.free(handles.pop(key))
        else:
            handles[key] = sim.malloc(nbytes)


def _run_growth(events: list[Event]) -> tuple[int, int, list[tuple[int, int]]]:
    """The unlimited run's peaks, and where its reserved memory grew: (event index, reserved after)."""
    sim = CachingAllocatorSim(None)
    handles: dict[int, int] = {}
    grown: list[tuple[int, int]] = []
    reserved = 0
    for index, (key, nbytes) in enumerate(events):
        if nbytes < 0:
            sim.free(handles.pop(key))
            continue
        handles[key] = sim.malloc(nbytes)
        if sim.reserved_bytes != reserved:
            reserved = sim.reserved_bytes
            grown.append((index, reserved))
    stats = sim.stats
    return stats.peak_allocated_bytes, stats.peak_reserved_bytes, grown


@dataclass(frozen=True)
class _Prefix:
    """The unlimited run's state just before its reserved memory first passes ``floor``: every run
    with a limit of at least ``floor`` is the same up to there."""

    events: list[Event]
    floor: int
    start: int  # the first event not yet run
    sim: CachingAllocatorSim
    handles: dict[int, int]

    @classmethod
    def of(cls, events: list[Event], grown: list[tuple[int, int]], floor: int) -> _Prefix:
        start = next((index for index, reserved in grown if reserved > floor), len(events))
        sim = CachingAllocatorSim(None)
        handles: dict[int, int] = {}
        apply_events(sim, handles, events[:start])
        return cls(events, floor, start, sim, handles)

    def run(self, capacity_bytes: int) -> tuple[int, int]:
        """_run(events, capacity_bytes): from the prefix where the capacity is at least ``floor``."""
        if capacity_bytes < self.floor:
            return _run(self.events, capacity_bytes)
        sim = self.sim.clone(capacity_bytes)
        apply_events(sim, dict(self.handles), self.events[self.start:])
        stats = sim.stats
        return stats.peak_allocated_bytes, stats.peak_reserved_bytes
