"""The caching-allocator simulator with several streams (allocator.py): a block belongs to the stream
whose request made its segment, and only that stream's requests get it (CUDACachingAllocator.cpp
``get_free_block``: "(*it)->stream != p.stream()" refuses it); releasing cached segments, on
``empty_cache`` or before an out-of-memory, takes every stream's. Default-stream traces are the
one-stream simulator's (test_allocator.py, test_allocator_expandable.py, unchanged)."""

from __future__ import annotations

import pytest

from autotune.backends.estimate.alloc_conf import parse_alloc_conf
from autotune.backends.estimate.allocator import CachingAllocatorSim
from autotune.backends.estimate.backend import workspace_from_json
from autotune.backends.estimate.replay import apply_events, replay
from autotune.backends.estimate.trace import Affine, OnStream, PlusFixed, Trace, affine
from autotune.errors import OutOfMemory

MiB = 1 << 20
SIDE = 1  # another stream than the default one (0)


def test_a_block_freed_on_another_stream_is_not_reused_by_the_default_stream() -> None:
    sim = CachingAllocatorSim()
    sim.free(sim.malloc(30 * MiB, SIDE))  # an all-gather output, say: cached, on stream 1
    sim.malloc(30 * MiB)  # the same size on the default stream: a segment of its own
    assert sim.stats.reserved_bytes == 60 * MiB
    assert sorted(segment.stream for segment in sim.snapshot()) == [0, SIDE]


def test_a_block_freed_on_a_stream_is_reused_by_that_stream_at_once() -> None:
    sim = CachingAllocatorSim()
    first = sim.malloc(30 * MiB, SIDE)
    sim.free(first)
    assert sim.malloc(30 * MiB, SIDE) == first
    assert sim.stats.reserved_bytes == 30 * MiB


def test_best_fit_looks_only_at_the_requests_stream() -> None:
    sim = CachingAllocatorSim()
    default = sim.malloc(24 * MiB)
    side = sim.malloc(40 * MiB, SIDE)
    sim.free(default)
    sim.free(side)
    # The 24 MiB block fits better, but a stream-1 request only sees the 40 MiB one.
    assert sim.malloc(20 * MiB, SIDE) == side
    assert sim.malloc(20 * MiB) == default
    assert sim.stats.reserved_bytes == 64 * MiB


def test_small_blocks_of_two_streams_live_in_separate_2_mib_segments() -> None:
    sim = CachingAllocatorSim()
    sim.malloc(512)
    sim.malloc(512, SIDE)
    assert sim.stats.reserved_bytes == 4 * MiB
    assert sim.stats.num_segments == 2


def test_empty_cache_releases_the_free_segments_of_every_stream() -> None:
    sim = CachingAllocatorSim()
    sim.free(sim.malloc(30 * MiB, SIDE))
    sim.free(sim.malloc(30 * MiB, 2))
    kept = sim.malloc(30 * MiB)
    sim.empty_cache()
    assert sim.stats.reserved_bytes == 30 * MiB
    assert [segment.address for segment in sim.snapshot()] == [kept]


def test_at_capacity_another_streams_cached_segment_is_released_for_the_request() -> None:
    sim = CachingAllocatorSim(capacity_bytes=64 * MiB)
    sim.free(sim.malloc(40 * MiB, SIDE))
    sim.malloc(40 * MiB)  # 80 MiB > 64 MiB: release_cached_blocks frees stream 1's, then it fits
    assert sim.stats.reserved_bytes == 40 * MiB
    actions = [event.action for event in sim.segment_events]
    assert actions == ["segment_alloc", "segment_free", "segment_alloc"]


def test_free_memory_in_another_streams_segment_in_use_is_out_of_reach() -> None:
    sim = CachingAllocatorSim(capacity_bytes=64 * MiB)
    sim.free(sim.malloc(60 * MiB, SIDE))
    sim.malloc(20 * MiB, SIDE)  # splits stream 1's segment: 40 MiB of it free, none releasable
    with pytest.raises(OutOfMemory):
        sim.malloc(40 * MiB)  # one stream would reuse the 40 MiB block; here 60 + 40 > 64 MiB
    assert sim.stats.reserved_bytes == 60 * MiB


def test_max_split_size_releases_oversize_segments_of_the_requests_stream_only() -> None:
    config = parse_alloc_conf("max_split_size_mb:64")
    sim = CachingAllocatorSim(capacity_bytes=220 * MiB, config=config)
    sim.free(sim.malloc(100 * MiB, SIDE))
    sim.free(sim.malloc(100 * MiB))
    sim.malloc(30 * MiB)  # below max_split: refused the oversize block, and 230 MiB > 220 MiB
    # release_available_cached_blocks frees the default stream's 100 MiB segment (at least 64 MiB),
    # never stream 1's; then the request fits.
    assert sorted((segment.stream, segment.size) for segment in sim.snapshot()) == [
        (0, 30 * MiB), (SIDE, 100 * MiB)]


def test_expandable_segments_are_one_per_stream() -> None:
    sim = CachingAllocatorSim(config=parse_alloc_conf("expandable_segments:True"))
    sim.free(sim.malloc(30 * MiB, SIDE))
    sim.malloc(30 * MiB)
    # Each stream maps its own pages (ExpandableSegment has a stream): 2 x 40 MiB (20 MiB pages).
    assert sim.stats.reserved_bytes == 80 * MiB
    assert sorted(segment.stream for segment in sim.snapshot()) == [0, SIDE]


def test_a_replay_keeps_an_allocations_stream_apart() -> None:
    """The synthetic step of an FSDP2 layer: the all-gather output (stream 1) is freed before the
    activations (default stream) of the same size are made; on one stream they would reuse it."""
    events = [(0, 30 * MiB, SIDE), (0, -1), (1, 30 * MiB), (1, -1), (2, 30 * MiB, SIDE)]
    apart, one_stream = CachingAllocatorSim(), CachingAllocatorSim()
    apply_events(apart, {}, events)
    apply_events(one_stream, {}, [event[:2] for event in events])
    assert (apart.stats.peak_allocated_bytes, apart.stats.peak_reserved_bytes) == (30 * MiB, 60 * MiB)
    assert one_stream.stats.peak_reserved_bytes == 30 * MiB
    # Under a limit of 30 MiB it still runs: stream 1's cached segment is released for the request.
    assert replay(events, None).demand_bytes == 30 * MiB


def test_a_trace_gives_its_side_stream_allocations_their_stream() -> None:
    workspaces = {7: OnStream(SIDE), -1: OnStream(2, PlusFixed(256))}  # a kernel's buffer on stream 2
    a = Trace.from_events(1, [(3, 100), (7, 200), (3, -1), (-1, 10), (-1, -1), (7, -1)], workspaces)
    b = Trace.from_events(2, [(3, 150), (7, 400), (3, -1), (-1, 10), (-1, -1), (7, -1)], workspaces)
    assert a.events()[:3] == [(0, 100), (1, 200, SIDE), (0, -1)]
    assert a.events()[3] == (2, 10 + 256, 2)
    form = affine(a, b)
    assert form is not None
    back = Affine.from_json(form.to_json(), workspace_from_json)
    assert back.at(3).events() == form.at(3).events()
    assert back.at(3).events()[1] == (1, 600, SIDE)
