"""A trace's replay: the frees after its last allocation are not replayed, and change nothing."""

from __future__ import annotations

import random

from autotune.backends.estimate.allocator import CachingAllocatorSim
from autotune.backends.estimate.replay import apply_events, fits_in, replay, through_last_allocation
from autotune.errors import OutOfMemory

MiB = 1 << 20


def step_events(seed: int) -> list[tuple[int, int]]:
    """A step's shape: weights held throughout, activations made and freed, all freed at the end."""
    rng = random.Random(seed)
    events: list[tuple[int, int]] = [(key, rng.randrange(1, 64) * MiB) for key in range(10)]
    live: list[int] = []
    for key in range(10, 400):
        if live and rng.random() < 0.4:
            events.append((live.pop(rng.randrange(len(live))), -1))
        events.append((key, rng.randrange(1, 4096) * 4096 + rng.randrange(512)))
        live.append(key)
    events.extend((key, -1) for key in [*live, *range(10)])
    return events


def test_the_frees_after_the_last_allocation_are_left_out() -> None:
    events = [(0, 4 * MiB), (1, MiB), (0, -1), (2, 3 * MiB), (1, -1), (2, -1)]
    assert through_last_allocation(events) == events[:4]
    assert through_last_allocation(events[:4]) == events[:4]
    assert through_last_allocation([(0, -1)]) == []


def test_a_replay_to_the_last_allocation_is_the_whole_replay_at_every_capacity() -> None:
    for seed in range(3):
        events = step_events(seed)
        whole, trimmed = CachingAllocatorSim(None), CachingAllocatorSim(None)
        apply_events(whole, {}, events)
        apply_events(trimmed, {}, through_last_allocation(events))
        assert len(through_last_allocation(events)) < len(events) - 100
        assert (trimmed.stats.peak_allocated_bytes, trimmed.stats.peak_reserved_bytes) == (
            whole.stats.peak_allocated_bytes, whole.stats.peak_reserved_bytes)
        unlimited = replay(events, None)
        for capacity in range(unlimited.demand_bytes - 40 * MiB, unlimited.demand_bytes + 40 * MiB, 2 * MiB):
            sim = CachingAllocatorSim(capacity)
            try:
                apply_events(sim, {}, events)  # every event, the trailing frees too
            except OutOfMemory:  # the whole run does not fit
                fitted = False
            else:
                fitted = True
            assert fits_in(events, capacity) is fitted
            assert replay(events, capacity).fits is fitted
