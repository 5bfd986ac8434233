"""The allocator simulator under PYTORCH_ALLOC_CONF settings: expandable segments, max_split_size_mb,
roundup_power2_divisions and garbage_collection_threshold, and the parser of the settings.

Each expected figure follows from the rules of CUDACachingAllocator.cpp as allocator.py quotes them:
2 MiB pages in the small pool and 20 MiB pages in the large one, mapped where the segment has room
and unmapped, whole pages only, on a release; the cap checked against a request's allocation size;
and two training steps an H200 ran with expandable_segments:True, replayed to their real peaks and
their real map and unmap events.
"""

from __future__ import annotations

import contextlib
import json
import random
from pathlib import Path
from typing import Any

import pytest

from autotune.backends.estimate.alloc_conf import AllocatorConfig, alloc_conf_text, parse_alloc_conf
from autotune.backends.estimate.allocator import CachingAllocatorSim, SegmentEvent, round_size
from autotune.backends.estimate.replay import SEGMENT_GRANULE, fits_in, replay
from autotune.errors import InvalidInput, OutOfMemory, UnknownSetting, UnmodelledSetting

KiB = 1 << 10
MiB = 1 << 20
EXPANDABLE = AllocatorConfig(expandable_segments=True)
# Steps recorded under torch.cuda.memory._record_memory_history on an H200 with
# PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, torch 2.11.0+cu130 (benchmarks/gpu_measure.py).
RECORDS = Path(__file__).resolve().parents[4] / "docs" / "measurements" / "h200" / "records"
EXPANDABLE_RECORDS = ["bert-base-ckpt-128x703-12GiB-expandable",
                      "llama-1b-lora-bf16ckpt-512x24-24GiB-expandable"]


# The parser of PYTORCH_ALLOC_CONF.


def test_no_settings_are_pytorchs_defaults() -> None:
    assert parse_alloc_conf(None) == parse_alloc_conf("") == AllocatorConfig()
    assert AllocatorConfig().name == AllocatorConfig().describe() == "classic segments"
    assert AllocatorConfig().conf_text() == ""
    assert CachingAllocatorSim().config == AllocatorConfig()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("expandable_segments:True", EXPANDABLE),
        ("expandable_segments:False", AllocatorConfig()),
        # Whitespace goes (ConfigTokenizer), and a key set again takes its last value.
        (" expandable_segments : True , expandable_segments:False,expandable_segments:True", EXPANDABLE),
        ("max_split_size_mb:128", AllocatorConfig(max_split_size_bytes=128 * MiB)),
        ("max_non_split_rounding_mb:64", AllocatorConfig(max_non_split_rounding_bytes=64 * MiB)),
        ("roundup_power2_divisions:4", AllocatorConfig(roundup_power2_divisions=(4,) * 16)),
        # Boundaries in MiB: 256 names [256, 512) MiB, interval 8; the first entry fills those below,
        # ">" those after the last entry.
        ("roundup_power2_divisions:[256:1,512:2,>:4]",
         AllocatorConfig(roundup_power2_divisions=(1,) * 9 + (2,) + (4,) * 6)),
        ("garbage_collection_threshold:0.6", AllocatorConfig(garbage_collection_threshold=0.6)),
        ("expandable_segments:True,max_split_size_mb:512,garbage_collection_threshold:0.8,",
         AllocatorConfig(expandable_segments=True, max_split_size_bytes=512 * MiB,
                         garbage_collection_threshold=0.8)),
        # Settings that leave the GPU's memory as it is: the lock around cudaMalloc, the host's
        # pinned memory, CUDA graph capture.
        ("backend:native,release_lock_on_cudamalloc:True,pinned_use_cuda_host_register:True,"
         "pinned_num_register_threads:8,pinned_use_background_threads:False,"
         "pinned_reserve_segment_size_mb:64,graph_capture_record_stream_reuse:True", AllocatorConfig()),
    ],
)
def test_accepted_settings(text: str, expected: AllocatorConfig) -> None:
    config = parse_alloc_conf(text)
    assert config == expected
    assert parse_alloc_conf(config.conf_text()) == config


def test_the_config_says_in_words_which_allocator_is_modelled() -> None:
    assert EXPANDABLE.name == EXPANDABLE.describe() == "expandable segments"
    config = parse_alloc_conf(
        "garbage_collection_threshold:0.8,expandable_segments:True,max_split_size_mb:512")
    assert config.describe() == (
        "expandable segments (max_split_size_mb:512,garbage_collection_threshold:0.8)")
    assert config.conf_text() == (
        "expandable_segments:True,max_split_size_mb:512,garbage_collection_threshold:0.8")
    config = parse_alloc_conf("roundup_power2_divisions:[256:1,512:2,1024:4,>:8]")
    assert config.describe() == "classic segments (roundup_power2_divisions:[256:1,512:2,1024:4,>:8])"


ALLOWED = ("the simulator models expandable_segments, garbage_collection_threshold, "
           "max_non_split_rounding_mb, max_split_size_mb, roundup_power2_divisions; it accepts "
           "backend:native and, as they leave the GPU's memory as it is, "
           "graph_capture_record_stream_reuse, pinned_num_register_threads, "
           "pinned_reserve_segment_size_mb, pinned_use_background_threads, "
           "pinned_use_cuda_host_register, pinned_use_hip_host_register, release_lock_on_cudamalloc, "
           "release_lock_on_hipmalloc")


@pytest.mark.parametrize(
    ("text", "error", "message"),
    [
        ("expandable_segments:true", InvalidInput,
         "allocator setting expandable_segments:true: expected True or False"),
        ("expandable_segments", InvalidInput,
         "allocator settings 'expandable_segments': expected key:value pairs separated by commas "
         "(e.g. expandable_segments:True), at 'expandable_segments'"),
        ("expandable_segments:True;max_split_size_mb:128", InvalidInput,
         "allocator settings 'expandable_segments:True;max_split_size_mb:128': expected ',' after the "
         "value of expandable_segments"),
        ("max_split_size_mb:19", InvalidInput,
         "allocator setting max_split_size_mb:19 is too small: PyTorch needs at least 20 (MiB)"),
        ("max_split_size_mb:1.5", InvalidInput,
         "allocator setting max_split_size_mb: expected a whole number, got '1.5'"),
        ("roundup_power2_divisions:3", InvalidInput,
         "allocator setting roundup_power2_divisions:3: the divisions must be a power of 2"),
        ("roundup_power2_divisions:[256:3]", InvalidInput,
         "allocator setting roundup_power2_divisions: the divisions must be a power of 2 or 0, got 3"),
        ("roundup_power2_divisions:[300:2]", InvalidInput,
         "allocator setting roundup_power2_divisions: the sizes must be powers of 2 (MiB), got 300"),
        ("roundup_power2_divisions:[256:1", InvalidInput,
         "allocator setting roundup_power2_divisions: a list needs its closing ']'"),
        ("garbage_collection_threshold:1.0", InvalidInput,
         "allocator setting garbage_collection_threshold:1.0: give a fraction between 0.0 and 1.0, "
         "both excluded (e.g. 0.6)"),
        ("pinned_num_register_threads:3", InvalidInput,
         "allocator setting pinned_num_register_threads:3: must be a power of 2"),
        ("backend:foo", InvalidInput,
         "allocator setting backend:foo: PyTorch's backends are native and cudaMallocAsync"),
        ("backend:cudaMallocAsync", UnmodelledSetting,
         "allocator setting backend:cudaMallocAsync is not modelled: it is CUDA's stream-ordered "
         "allocator, not PyTorch's caching allocator that the simulator follows; give backend:native "
         "or leave backend out"),
        ("expandable_segments:True,per_process_memory_fraction:0.5", UnmodelledSetting,
         "allocator setting per_process_memory_fraction is not modelled: a cap of its own, beside the "
         f"budget's; {ALLOWED}"),
        ("expandable_segment:True", UnknownSetting,
         "unknown allocator setting 'expandable_segment' (PyTorch refuses it too); the settings are "
         "backend, expandable_segments, garbage_collection_threshold, graph_capture_record_stream_reuse, "
         "max_non_split_rounding_mb, max_split_size_mb, pinned_num_register_threads, "
         "pinned_reserve_segment_size_mb, pinned_use_background_threads, pinned_use_cuda_host_register, "
         "pinned_use_hip_host_register, release_lock_on_cudamalloc, release_lock_on_hipmalloc, "
         "roundup_power2_divisions"),
    ],
)
def test_refused_settings(text: str, error: type[InvalidInput], message: str) -> None:
    with pytest.raises(error) as info:
        parse_alloc_conf(text)
    assert str(info.value) == message
    assert isinstance(info.value, InvalidInput)


def test_pytorch_alloc_conf_comes_before_the_cuda_one() -> None:
    assert alloc_conf_text({}) is None
    cuda = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    assert alloc_conf_text(cuda) == "expandable_segments:True"
    assert alloc_conf_text({**cuda, "PYTORCH_ALLOC_CONF": ""}) == ""


# Expandable segments.


def test_a_small_request_maps_one_2_mib_page() -> None:
    sim = CachingAllocatorSim(config=EXPANDABLE)
    handle = sim.malloc(100)
    assert (sim.stats.allocated_bytes, sim.stats.reserved_bytes) == (512, 2 * MiB)
    assert sim.stats.num_segments == 0  # segment.all.current: pages are mapped, nothing cudaMalloc'd
    assert sim.segment_events == (SegmentEvent("segment_map", handle, 2 * MiB, True),)


def test_large_pages_are_20_mib_and_every_remainder_splits() -> None:
    sim = CachingAllocatorSim(config=EXPANDABLE)
    sim.malloc(19 * MiB)
    # One 20 MiB page; the 1 MiB rest splits off (>= 512 B), so only the request counts...
    assert (sim.stats.allocated_bytes, sim.stats.reserved_bytes) == (19 * MiB, 20 * MiB)
    classic = CachingAllocatorSim()
    classic.malloc(19 * MiB)
    # ... where a classic 20 MiB segment is handed out whole (a rest of 1 MiB is not > kSmallSize).
    assert (classic.stats.allocated_bytes, classic.stats.reserved_bytes) == (20 * MiB, 20 * MiB)


def test_a_request_maps_whole_pages() -> None:
    sim = CachingAllocatorSim(config=EXPANDABLE)
    handle = sim.malloc(30 * MiB + 1)
    # 30 MiB + 512 B needs two 20 MiB pages, mapped at once.
    assert sim.stats.allocated_bytes == 30 * MiB + 512
    assert sim.segment_events == (SegmentEvent("segment_map", handle, 40 * MiB, False),)


def test_the_segment_grows_at_its_free_end() -> None:
    sim = CachingAllocatorSim(config=EXPANDABLE)
    first = sim.malloc(15 * MiB)  # a 20 MiB page, 5 MiB of it free
    second = sim.malloc(10 * MiB)  # 5 MiB free + the next page, mapped after it
    assert second == first + 15 * MiB
    assert sim.stats.reserved_bytes == 40 * MiB
    assert [(e.address - first, e.size) for e in sim.segment_events] == [(0, 20 * MiB), (20 * MiB, 20 * MiB)]
    (segment,) = sim.snapshot()  # one mapped range
    assert [(b.size, b.allocated) for b in segment.blocks] == [(15 * MiB, True), (10 * MiB, True),
                                                               (15 * MiB, False)]


def test_best_fit_takes_the_block_at_the_growing_end_last() -> None:
    sim = CachingAllocatorSim(config=EXPANDABLE)
    x = sim.malloc(14 * MiB)  # page 1: x, 6 MiB free
    sim.malloc(6 * MiB)  # takes the 6 MiB
    z = sim.malloc(8 * MiB)  # page 2: z, then 12 MiB free before the unmapped rest
    sim.free(x)
    # Free: 12 MiB at the end (it can grow: it weighs 12 MiB + every unmapped page) and x's 14 MiB.
    # Classic best fit takes the 12 MiB; get_free_block's expandable_size takes x's.
    assert sim.malloc(11 * MiB) == x
    assert sim.malloc(11 * MiB) == z + 8 * MiB
    assert sim.stats.reserved_bytes == 40 * MiB


def test_empty_cache_unmaps_whole_free_pages_and_they_are_mapped_again_where_they_were() -> None:
    sim = CachingAllocatorSim(config=EXPANDABLE)
    a = sim.malloc(30 * MiB)  # pages 0-1: a, 10 MiB free
    b = sim.malloc(50 * MiB)  # the 10 MiB free + pages 2-3
    assert (b, sim.stats.reserved_bytes) == (a + 30 * MiB, 80 * MiB)
    sim.free(b)  # free from 30 to 80 MiB
    sim.empty_cache()
    # Pages 2-3 go; page 1, partly a's, stays mapped with its free 10 MiB.
    assert sim.stats.reserved_bytes == 40 * MiB
    assert sim.segment_events[-1] == SegmentEvent("segment_unmap", a + 40 * MiB, 40 * MiB, False)
    assert sim.malloc(10 * MiB) == a + 30 * MiB  # the free 10 MiB, nothing mapped
    assert sim.stats.reserved_bytes == 40 * MiB
    sim.malloc(15 * MiB)  # maps page 2 again, where it was
    assert sim.segment_events[-1] == SegmentEvent("segment_map", a + 40 * MiB, 20 * MiB, False)
    assert sim.stats.peak_reserved_bytes == 80 * MiB


def test_a_segment_with_no_page_left_is_released() -> None:
    sim = CachingAllocatorSim(config=EXPANDABLE)
    sim.free(sim.malloc(5 * MiB))
    sim.empty_cache()
    assert (sim.stats.reserved_bytes, sim.snapshot()) == (0, [])
    sim.malloc(5 * MiB)  # a new segment
    assert sim.stats.reserved_bytes == 20 * MiB


def test_a_hole_left_by_a_release_is_filled_first() -> None:
    sim = CachingAllocatorSim(config=EXPANDABLE)
    x = sim.malloc(40 * MiB)
    sim.malloc(40 * MiB)
    sim.free(x)
    sim.empty_cache()  # unmaps x's two pages: a hole before the block in use
    # find_expandable_block: the lowest unmapped range with room, so the hole...
    assert sim.malloc(30 * MiB) == x
    # ... but not for a request it cannot hold: that grows the end.
    assert sim.malloc(45 * MiB) == x + 80 * MiB
    assert [(e.action, e.address - x, e.size) for e in sim.segment_events] == [
        ("segment_map", 0, 40 * MiB), ("segment_map", 40 * MiB, 40 * MiB), ("segment_unmap", 0, 40 * MiB),
        ("segment_map", 0, 40 * MiB), ("segment_map", 80 * MiB, 60 * MiB)]


def capped_after_a_free(capacity: int) -> tuple[CachingAllocatorSim, int]:
    """40 MiB free at the start of the segment, 40 MiB in use after it, under ``capacity``."""
    sim = CachingAllocatorSim(capacity, EXPANDABLE)
    x = sim.malloc(40 * MiB)
    sim.malloc(40 * MiB)
    sim.free(x)
    return sim, x


def test_out_of_memory_unmaps_free_pages_then_grows_the_end() -> None:
    sim, x = capped_after_a_free(100 * MiB)
    # 45 MiB (allocation size 46 MiB): 80 + 46 > 100, so free pages are unmapped (the hole, too small
    # for it) and the end of the segment grows by three pages: as the H200's Llama record does.
    assert sim.malloc(45 * MiB) == x + 80 * MiB
    assert [(e.action, e.address - x, e.size) for e in sim.segment_events[2:]] == [
        ("segment_unmap", 0, 40 * MiB), ("segment_map", 80 * MiB, 60 * MiB)]
    stats = sim.stats
    assert (stats.reserved_bytes, stats.peak_reserved_bytes, stats.num_ooms) == (100 * MiB, 100 * MiB, 0)


def test_the_cap_is_checked_against_the_allocation_size_not_the_pages_mapped() -> None:
    sim, _ = capped_after_a_free(90 * MiB)
    sim.malloc(45 * MiB)  # after the unmap 40 + 46 <= 90; three pages mapped: 100 MiB reserved
    assert sim.stats.reserved_bytes == 100 * MiB
    assert sim.capacity_needed_bytes == 86 * MiB  # 40 + 46, the most checked


def test_out_of_memory_when_even_the_retry_does_not_fit() -> None:
    sim, _ = capped_after_a_free(80 * MiB)
    with pytest.raises(OutOfMemory) as info:
        sim.malloc(45 * MiB)  # 40 + 46 > 80 after the unmap
    assert str(info.value) == (
        "CUDA out of memory (simulated). Tried to allocate 46.00 MiB for a request of 45.00 MiB."
        " Capacity 80.00 MiB, of which 40.00 MiB is allocated and 0 bytes is reserved but unallocated.")
    assert (sim.stats.reserved_bytes, sim.stats.num_ooms) == (40 * MiB, 1)  # the unmap stands


def test_reserved_is_the_mapped_pages_in_a_random_workload() -> None:
    rng = random.Random(1)
    sim = CachingAllocatorSim(capacity_bytes=1 << 30, config=EXPANDABLE)
    live: list[int] = []  # handles in use
    for _ in range(3000):
        if live and rng.random() < 0.45:
            sim.free(live.pop(rng.randrange(len(live))))
        else:
            nbytes = rng.choice([rng.randrange(1, 2 * MiB), rng.randrange(1, 64 * MiB)])
            with contextlib.suppress(OutOfMemory):
                live.append(sim.malloc(nbytes))
        if rng.random() < 0.01:
            sim.empty_cache()
    stats, segments, events = sim.stats, sim.snapshot(), sim.segment_events
    assert stats.num_ooms > 0  # seed 1 reaches the 1 GiB cap: the unmap-and-retry path runs
    assert sum(seg.size for seg in segments) == stats.reserved_bytes
    signed = {"segment_map": 1, "segment_unmap": -1}
    assert sum(signed[e.action] * e.size for e in events) == stats.reserved_bytes
    assert all(e.size % (2 * MiB if e.is_small else 20 * MiB) == 0 for e in events)
    in_use = [blk for seg in segments for blk in seg.blocks if blk.allocated]
    assert sum(blk.size for blk in in_use) == stats.allocated_bytes
    assert sorted(blk.address for blk in in_use) == sorted(live)
    for seg in segments:
        page = 2 * MiB if seg.is_small else 20 * MiB
        assert seg.address % page == 0 and seg.size % page == 0  # whole pages
        for left, right in zip(seg.blocks, seg.blocks[1:], strict=False):
            assert left.address + left.size == right.address
            assert left.allocated or right.allocated  # free neighbours are merged


def test_a_clone_carries_the_config_and_the_unmapped_pages() -> None:
    rng = random.Random(3)
    original = CachingAllocatorSim(None, EXPANDABLE)
    live = [original.malloc(rng.randint(1, 30 * MiB)) for _ in range(40)]
    for handle in live[::3]:
        original.free(handle)
    original.empty_cache()  # holes to fill
    clone = original.clone(None)
    assert clone.config == EXPANDABLE
    assert (clone.snapshot(), clone.stats, clone.segment_events) == (
        original.snapshot(), original.stats, original.segment_events)
    requests = [rng.randint(1, 30 * MiB) for _ in range(30)]
    for sim in (original, clone):
        for nbytes in requests:
            sim.malloc(nbytes)
    assert (clone.snapshot(), clone.stats, clone.segment_events) == (
        original.snapshot(), original.stats, original.segment_events)


# The other settings, with classic segments.


@pytest.mark.parametrize(
    ("nbytes", "config", "expected"),
    [
        (1200 * MiB, "roundup_power2_divisions:4", 1280 * MiB),  # [1024, 2048) MiB in steps of 256
        (1024 * MiB, "roundup_power2_divisions:4", 1024 * MiB),  # a power of two stays
        (5000, "roundup_power2_divisions:2", 6144),  # [4096, 8192) in steps of 2048
        (5000, "", 5120),  # without: a multiple of 512
        (2000, "roundup_power2_divisions:4", 2048),  # not above 512 x 4: a multiple of 512
        (300 * MiB + 1, "roundup_power2_divisions:[256:1,512:2,>:4]", 300 * MiB + 512),  # 1 division
        (600 * MiB, "roundup_power2_divisions:[256:1,512:2,>:4]", 768 * MiB),  # 2: steps of 256 MiB
        (3000 * MiB, "roundup_power2_divisions:[256:1,512:2,>:4]", 3072 * MiB),  # 4: steps of 512 MiB
    ],
)
def test_roundup_power2_divisions(nbytes: int, config: str, expected: int) -> None:
    assert round_size(nbytes, parse_alloc_conf(config)) == expected
    sim = CachingAllocatorSim(config=parse_alloc_conf(config))
    sim.malloc(nbytes)
    assert sim.stats.allocated_bytes == expected


def test_an_oversize_cached_block_is_refused_to_a_smaller_request() -> None:
    sim = CachingAllocatorSim(config=parse_alloc_conf("max_split_size_mb:40"))
    sim.free(sim.malloc(60 * MiB))
    sim.malloc(30 * MiB)  # the free 60 MiB is >= max_split_size, the request below: a new segment
    assert sim.stats.reserved_bytes == 90 * MiB
    default = CachingAllocatorSim()
    default.free(default.malloc(60 * MiB))
    default.malloc(30 * MiB)  # takes 30 of the 60 MiB and splits
    assert default.stats.reserved_bytes == 60 * MiB


@pytest.mark.parametrize(("config", "reserved", "allocated"), [
    # 62 >= 41 + 20 (max_non_split_rounding_mb's default): refused, a 42 MiB segment.
    ("max_split_size_mb:40", 104 * MiB, 42 * MiB),
    # 62 < 41 + 30: taken, and whole (a request of max_split_size or more never splits a block).
    ("max_split_size_mb:40,max_non_split_rounding_mb:30", 62 * MiB, 62 * MiB),
])
def test_a_large_request_takes_an_oversize_block_within_the_rounding_limit(
        config: str, reserved: int, allocated: int) -> None:
    sim = CachingAllocatorSim(config=parse_alloc_conf(config))
    sim.free(sim.malloc(62 * MiB))
    sim.malloc(41 * MiB)
    assert (sim.stats.reserved_bytes, sim.stats.allocated_bytes) == (reserved, allocated)


def test_oversize_segments_are_released_before_the_whole_cache() -> None:
    sim = CachingAllocatorSim(120 * MiB, parse_alloc_conf("max_split_size_mb:40"))
    a, _b, c = sim.malloc(60 * MiB), sim.malloc(30 * MiB), sim.malloc(20 * MiB)
    sim.free(a)
    sim.free(c)
    # 35 MiB: the free 60 MiB is refused (oversize), and 110 + 36 > 120. release_available_cached_blocks
    # frees the smallest block of at least max(35, 40) MiB and the retry fits: the 20 MiB stays cached.
    sim.malloc(35 * MiB)
    assert sim.stats.reserved_bytes == (30 + 20 + 36) * MiB
    assert [e.size for e in sim.segment_events if e.action == "segment_free"] == [60 * MiB]


def test_several_oversize_segments_are_released_largest_first_until_enough() -> None:
    sim = CachingAllocatorSim(150 * MiB, parse_alloc_conf("max_split_size_mb:40"))
    a, b, _c = sim.malloc(44 * MiB), sim.malloc(42 * MiB), sim.malloc(50 * MiB)
    sim.free(a)
    sim.free(b)
    sim.malloc(60 * MiB)  # 136 + 60 > 150; no cached block >= 60 MiB: 44, then 42 MiB go (86 >= 60)
    assert [e.size for e in sim.segment_events if e.action == "segment_free"] == [44 * MiB, 42 * MiB]
    assert sim.stats.reserved_bytes == 110 * MiB


@pytest.mark.parametrize(("capacity", "reserved"), [
    # Over 0.5 x 100 MiB: ages (get_free_block calls since cached) 2 and 1, average 1.5: the 24 MiB
    # segment goes, then 30 + 40 <= 100.
    (100 * MiB, 70 * MiB),
    (None, 94 * MiB),  # no memory fraction: no collection
])
def test_garbage_collection_releases_the_oldest_cached_segments(capacity: int | None, reserved: int) -> None:
    sim = CachingAllocatorSim(capacity, parse_alloc_conf("garbage_collection_threshold:0.5"))
    sim.free(sim.malloc(24 * MiB))
    sim.free(sim.malloc(30 * MiB))
    sim.malloc(40 * MiB)
    assert sim.stats.reserved_bytes == reserved


# The replay of a trace (replay.py) under a config.


def test_replay_finds_the_demand_the_allocation_sizes_make() -> None:
    events = [(0, 22 * MiB), (1, 17 * MiB)]
    # Classic: segments of 22 and 18 MiB. Expandable: 22 MiB checked, two 20 MiB pages mapped, and the
    # 17 MiB fits the 18 MiB left: it runs under a cap of 22 MiB with 40 MiB reserved.
    assert replay(events, None).demand_bytes == 40 * MiB
    expandable = replay(events, 22 * MiB, EXPANDABLE)
    assert (expandable.demand_bytes, expandable.peak_reserved_bytes) == (22 * MiB, 40 * MiB)
    assert expandable.fits
    assert fits_in(events, 22 * MiB, EXPANDABLE) and not fits_in(events, 20 * MiB, EXPANDABLE)


@pytest.mark.parametrize("config", [
    "garbage_collection_threshold:0.5", "max_split_size_mb:40", "roundup_power2_divisions:4",
    "expandable_segments:True,max_split_size_mb:40"])
def test_replay_under_other_settings_agrees_with_direct_runs(config: str) -> None:
    rng = random.Random(5)
    events: list[tuple[int, int]] = []
    live: list[int] = []
    for key in range(600):
        if live and rng.random() < 0.45:
            events.append((live.pop(rng.randrange(len(live))), -1))
        else:
            events.append((key, rng.choice([rng.randrange(1, 2 * MiB), rng.randrange(1, 64 * MiB)])))
            live.append(key)
    settings = parse_alloc_conf(config)
    found = replay(events, None, settings)
    # The bisection (from the unlimited run's prefix, or from the start under garbage collection,
    # which acts below the limit) finds what direct runs find.
    assert fits_in(events, found.demand_bytes, settings)
    assert not fits_in(events, found.demand_bytes - SEGMENT_GRANULE, settings)


# Steps recorded on an H200 with expandable segments.


def record_events(record: dict[str, Any]) -> list[tuple[int, int]]:
    """A record's allocations and frees as a trace's events (key, bytes; a free: -1)."""
    keys: dict[int, int] = {}  # address in use -> key: the index of its alloc event
    events = []
    for index, (action, address, size, _stream) in enumerate(record["events"]):
        if action == "alloc":
            keys[address] = index
            events.append((index, size))
        elif action == "free_completed":
            events.append((keys.pop(address), -1))
    return events


def replay_record(record: dict[str, Any]) -> CachingAllocatorSim:
    """The record's allocations and frees under its budget; where the record unmaps pages and maps
    none right after (not an out-of-memory retry, which the simulator makes itself), the worker's
    release(): torch.cuda.empty_cache() and reset_peak_memory_stats()."""
    sim = CachingAllocatorSim(record["budget_bytes"], EXPANDABLE)
    events = record["events"]
    handles: dict[int, int] = {}
    for index, (action, address, size, _stream) in enumerate(events):
        if action == "alloc":
            handles[address] = sim.malloc(size)
        elif action == "free_completed":
            sim.free(handles.pop(address))
        elif action == "segment_unmap" and events[index - 1][0] != "segment_unmap":
            after = next(event[0] for event in events[index:] if event[0] != "segment_unmap")
            if after != "segment_map":
                sim.empty_cache()
                sim.reset_peak()
    return sim


def pool_offsets(record: dict[str, Any]) -> list[tuple[str, bool, int, int]]:
    """The record's map and unmap events as (action, small pool, offset in its segment, size). A
    segment reserves 1 1/8 of the device's memory (ExpandableSegment): an address past every
    segment seen starts a new one; the small pool's came first in both records."""
    total = record["ready"]["total_bytes"]
    space = total + total // 8
    bases: list[int] = []
    found = []
    for action, address, size, _stream in record["events"]:
        if action not in ("segment_map", "segment_unmap"):
            continue
        base = next((b for b in bases if b <= address < b + space), None)
        if base is None:
            bases.append(address)
            base = address
        found.append((action, bases.index(base) == 0, address - base, size))
    return found


def sim_offsets(sim: CachingAllocatorSim) -> list[tuple[str, bool, int, int]]:
    bases: dict[bool, int] = {}
    return [(e.action, e.is_small, e.address - bases.setdefault(e.is_small, e.address), e.size)
            for e in sim.segment_events]


@pytest.mark.parametrize("name", EXPANDABLE_RECORDS)
def test_a_step_recorded_on_an_h200_with_expandable_segments_replays_exactly(name: str) -> None:
    record = json.loads((RECORDS / f"{name}.json").read_text())
    assert record["env"] == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    assert parse_alloc_conf(alloc_conf_text(record["env"])) == EXPANDABLE
    assert {event[0] for event in record["events"]} <= {
        "alloc", "free_requested", "free_completed", "segment_map", "segment_unmap"}
    sim = replay_record(record)
    stats = sim.stats
    assert stats.peak_allocated_bytes == record["peak_allocated_bytes"]
    assert stats.peak_reserved_bytes == record["peak_reserved_bytes"]  # to the byte
    # Every page mapped and unmapped, in order, at the same place in its pool's segment.
    assert sim_offsets(sim) == pool_offsets(record)
    memory = record["memory_stats"]
    assert stats.reserved_bytes == memory["reserved_bytes.all.current"]
    assert stats.allocated_bytes == memory["allocated_bytes.all.current"]
    unmapped = sum(e.size for e in sim.segment_events if e.action == "segment_unmap")
    assert unmapped == memory["reserved_bytes.all.freed"]  # BERT: none; Llama: 3,900,702,720 bytes
    assert stats.num_ooms == memory["num_ooms"] == 0


def test_the_llama_record_unmaps_at_the_release_and_in_an_out_of_memory_retry() -> None:
    record = json.loads((RECORDS / f"{EXPANDABLE_RECORDS[1]}.json").read_text())
    unmaps = [e for e in pool_offsets(record) if e[0] == "segment_unmap"]
    # The worker's empty_cache after loading the model gives back 500 MiB. The step's float32 logits
    # (24 x 512 x 128256 x 4 = 6,304,038,912 bytes; 18.2 GiB reserved + 5.9 GiB > the 22.3 GiB
    # budget) unmap 3.1 GiB of free pages, a hole too small for them, and map 6000 MiB at the end of
    # the segment (its last free 19 MiB and 300 pages).
    assert [size for *_, size in unmaps] == [524_288_000, 3_376_414_720]
    assert record["memory_stats"]["num_alloc_retries"] == 1
    sim = replay_record(record)
    retry = next(i for i, e in enumerate(sim.segment_events) if e.size == 3_376_414_720)
    assert sim.segment_events[retry + 1].size == 6_291_456_000


@pytest.mark.parametrize("name", EXPANDABLE_RECORDS)
def test_replay_of_an_expandable_record_fits_its_budget(name: str) -> None:
    record = json.loads((RECORDS / f"{name}.json").read_text())
    events = record_events(record)
    budget = record["budget_bytes"]
    found = replay(events, budget, EXPANDABLE)
    assert found.fits and found.peak_allocated_bytes == record["peak_allocated_bytes"]
    # The bisection's answer (from the unlimited run's prefix) is a direct run's.
    assert found.demand_bytes <= budget
    assert fits_in(events, found.demand_bytes, EXPANDABLE)
    assert not fits_in(events, found.demand_bytes - SEGMENT_GRANULE, EXPANDABLE)


@pytest.mark.parametrize("field", ["max_split_size_bytes", "max_non_split_rounding_bytes"])
def test_a_config_below_pytorch_s_floor_cannot_be_built(field):
    # below kLargeBuffer a split 20 MiB segment's remainder could be an oversize block that is no whole
    # segment, and release_available_cached_blocks would release it (a KeyError as the segment's
    # neighbours merge): PyTorch refuses such settings, and so does the config itself
    with pytest.raises(ValueError, match=f"{field} .* below PyTorch's floor"):
        AllocatorConfig(**{field: 4 * MiB})
    AllocatorConfig(**{field: 20 * MiB})
