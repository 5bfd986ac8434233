"""The caching-allocator simulator against figures worked out by hand.

Each expected figure follows from the rules of CUDACachingAllocator.cpp as quoted in
autotune/allocator.py: 512 B rounding, the 1 MiB small/large boundary, 2 MiB / 20 MiB
/ 2 MiB-rounded segments, best fit, should_split, merging, and the release of whole
free segments before an out-of-memory; and against real steps recorded on an H100, whose
allocations it replays to their real peaks.
"""

from __future__ import annotations

import contextlib
import json
import random
from pathlib import Path

import pytest

from autotune.backends.estimate.allocator import NULL_HANDLE, CachingAllocatorSim, round_size, segment_size
from autotune.errors import AutotuneError, OutOfMemory

KiB = 1 << 10
MiB = 1 << 20
# Real training steps under torch.cuda.memory._record_memory_history on an H100 (benchmarks/gpu_measure.py).
RECORDS = Path(__file__).resolve().parents[4] / "docs" / "measurements" / "h100-80gb" / "records"


@pytest.mark.parametrize(
    ("nbytes", "expected"),
    [
        (1, 512),  # below kMinBlockSize -> 512
        (100, 512),
        (512, 512),  # already a multiple of 512
        (513, 1024),  # next multiple of 512
        (30 * MiB + 1, 30 * MiB + 512),
    ],
)
def test_round_size(nbytes: int, expected: int) -> None:
    assert round_size(nbytes) == expected


@pytest.mark.parametrize(
    ("rounded", "expected"),
    [
        (512, 2 * MiB),  # small pool -> kSmallBuffer
        (1 * MiB, 2 * MiB),  # kSmallSize itself is still small
        (1 * MiB + 512, 20 * MiB),  # large and < 10 MiB -> kLargeBuffer
        (10 * MiB - 512, 20 * MiB),
        (10 * MiB, 10 * MiB),  # >= kMinLargeAlloc: rounded up to 2 MiB, here exact
        (30 * MiB + 512, 32 * MiB),  # next multiple of 2 MiB
    ],
)
def test_segment_size(rounded: int, expected: int) -> None:
    assert segment_size(rounded) == expected


def test_tiny_request_takes_512_bytes_of_a_2_mib_segment() -> None:
    sim = CachingAllocatorSim()
    sim.malloc(100)
    # 100 B -> 512 B block in a new 2 MiB small segment.
    assert sim.stats.allocated_bytes == 512
    assert sim.stats.reserved_bytes == 2 * MiB
    assert sim.stats.num_segments == 1


def test_small_requests_share_a_2_mib_segment() -> None:
    sim = CachingAllocatorSim()
    sim.malloc(600 * KiB)
    sim.malloc(600 * KiB)
    # 600 KiB = 614,400 B is a multiple of 512; two fit in 2 MiB = 2,097,152 B.
    assert sim.stats.allocated_bytes == 1_228_800
    assert sim.stats.reserved_bytes == 2 * MiB
    assert sim.stats.num_segments == 1
    sim.malloc(600 * KiB)
    # A third still fits the 868,352 B left; afterwards 253,952 B remain.
    assert sim.stats.num_segments == 1
    sim.malloc(600 * KiB)
    # A fourth does not fit 253,952 B: a second 2 MiB segment.
    assert sim.stats.reserved_bytes == 4 * MiB
    assert sim.stats.num_segments == 2


def test_mid_size_request_opens_20_mib_segment_that_later_requests_split() -> None:
    sim = CachingAllocatorSim()
    sim.malloc(5 * MiB)
    # 1 MiB < 5 MiB < 10 MiB -> a 20 MiB segment; the 15 MiB rest (> 1 MiB) is split.
    assert sim.stats.allocated_bytes == 5 * MiB
    assert sim.stats.reserved_bytes == 20 * MiB
    sim.malloc(5 * MiB)
    # Served from the 15 MiB rest: no new segment, 10 MiB rest left.
    assert sim.stats.allocated_bytes == 10 * MiB
    assert sim.stats.reserved_bytes == 20 * MiB
    assert sim.stats.num_segments == 1
    sim.malloc(5 * MiB)
    sim.malloc(5 * MiB)
    # The fourth takes the last 5 MiB exactly (remainder 0, no split).
    assert sim.stats.allocated_bytes == 20 * MiB
    assert sim.stats.reserved_bytes == 20 * MiB
    sim.malloc(5 * MiB)
    # The fifth needs a second 20 MiB segment.
    assert sim.stats.reserved_bytes == 40 * MiB
    assert sim.stats.num_segments == 2


def test_large_request_segment_rounds_up_to_2_mib() -> None:
    sim = CachingAllocatorSim()
    sim.malloc(30 * MiB + 1)
    # 30 MiB + 1 B -> 30 MiB + 512 B block in a 32 MiB segment.
    assert sim.stats.allocated_bytes == 30 * MiB + 512
    assert sim.stats.reserved_bytes == 32 * MiB
    # The 2 MiB - 512 B rest (> 1 MiB) was split off; 1.5 MiB fits in it.
    sim.malloc(1536 * KiB)
    assert sim.stats.reserved_bytes == 32 * MiB
    # Its remainder, 2,096,640 - 1,572,864 = 523,776 B, is <= 1 MiB: not split,
    # so the whole 2,096,640 B block counts as allocated: 32 MiB in all.
    assert sim.stats.allocated_bytes == 32 * MiB


def test_best_fit_picks_the_smallest_free_block_that_fits() -> None:
    sim = CachingAllocatorSim()
    small = sim.malloc(12 * MiB)  # its own 12 MiB segment
    big = sim.malloc(16 * MiB)  # its own 16 MiB segment, below the first (cudaMalloc goes top-down)
    assert big < small
    sim.free(big)
    sim.free(small)
    handle = sim.malloc(11 * MiB)
    # 11 MiB fits both; best fit takes the 12 MiB block although it lies higher.
    assert handle == small
    # Remainder exactly 1 MiB is not > kSmallSize: the whole 12 MiB is handed out.
    assert sim.stats.allocated_bytes == 12 * MiB
    assert sim.stats.reserved_bytes == 28 * MiB


def test_a_new_segment_lies_below_the_earlier_ones_so_a_tie_goes_to_the_newest() -> None:
    # cudaMalloc hands out addresses top-down (the H100 records: allocator.py's docstring), and
    # among equal free blocks best fit takes the lowest address: the newest segment's.
    sim = CachingAllocatorSim()
    older, newer = sim.malloc(12 * MiB), sim.malloc(12 * MiB)
    assert newer + 12 * MiB <= older
    sim.free(older)
    sim.free(newer)
    assert sim.malloc(12 * MiB) == newer
    assert sim.malloc(12 * MiB) == older
    assert [seg.address for seg in sim.snapshot()] == [newer, older]


@pytest.mark.parametrize("path", sorted(RECORDS.glob("*.json")), ids=lambda path: path.stem)
def test_a_step_recorded_on_an_h100_replays_to_its_real_peaks(path: Path) -> None:
    record = json.loads(path.read_text())
    sim = CachingAllocatorSim(record.get("budget_bytes"))
    handles: dict[int, int] = {}
    previous = None
    for action, address, size, _stream in record["events"]:
        if action == "alloc":
            handles[address] = sim.malloc(size)
        elif action == "free_completed":
            sim.free(handles.pop(address))
        elif action == "segment_free" and previous != "segment_free":  # the worker's release()
            sim.empty_cache()
            sim.reset_peak()
        elif action == "oom":  # a step recorded up to the allocation the GPU refused
            with pytest.raises(OutOfMemory):
                sim.malloc(size)
        previous = action
    assert sim.stats.peak_reserved_bytes == record["peak_reserved_bytes"]
    assert sim.stats.peak_allocated_bytes == record["peak_allocated_bytes"]


def test_large_block_splits_when_remainder_exceeds_1_mib() -> None:
    sim = CachingAllocatorSim()
    sim.free(sim.malloc(12 * MiB))
    sim.malloc(11 * MiB - 512)
    # Remainder 1 MiB + 512 B > kSmallSize: split, only the request counts.
    assert sim.stats.allocated_bytes == 11 * MiB - 512
    sim.malloc(1 * MiB + 512)
    # The split-off rest serves a large request of exactly its size.
    assert sim.stats.allocated_bytes == 12 * MiB
    assert sim.stats.num_segments == 1


def test_freeing_neighbours_merges_them_for_a_bigger_request() -> None:
    sim = CachingAllocatorSim()
    _a, b, c, _d = (sim.malloc(5 * MiB) for _ in range(4))  # fill one 20 MiB segment
    sim.free(b)
    sim.free(c)
    # b and c merge into one free 10 MiB block, which a 10 MiB request takes whole.
    sim.malloc(10 * MiB)
    assert sim.stats.reserved_bytes == 20 * MiB
    assert sim.stats.allocated_bytes == 20 * MiB
    assert sim.stats.num_segments == 1
    blocks = sim.snapshot()[0].blocks
    assert [blk.size for blk in blocks] == [5 * MiB, 10 * MiB, 5 * MiB]


def test_fully_freed_segment_merges_back_into_one_block() -> None:
    sim = CachingAllocatorSim()
    handles = [sim.malloc(5 * MiB) for _ in range(4)]
    for h in (handles[1], handles[3], handles[0], handles[2]):
        sim.free(h)
    (segment,) = sim.snapshot()
    assert [(blk.size, blk.allocated) for blk in segment.blocks] == [(20 * MiB, False)]
    # A request of the whole 20 MiB now fits without a new segment.
    sim.malloc(20 * MiB)
    assert sim.stats.reserved_bytes == 20 * MiB


def test_at_capacity_cached_segments_are_released_and_the_request_succeeds() -> None:
    sim = CachingAllocatorSim(capacity_bytes=32 * MiB)
    sim.free(sim.malloc(20 * MiB))  # a cached, fully free 20 MiB segment
    sim.malloc(24 * MiB)
    # 20 + 24 = 44 MiB > 32 MiB: the 20 MiB cache is released, then 24 <= 32 fits.
    assert sim.stats.reserved_bytes == 24 * MiB
    assert sim.stats.allocated_bytes == 24 * MiB
    assert sim.stats.num_segments == 1
    assert sim.stats.num_ooms == 0


def test_fragmentation_raises_oom_below_capacity() -> None:
    sim = CachingAllocatorSim(capacity_bytes=40 * MiB)
    # Each pair of 9 MiB requests shares a 20 MiB segment: [9][9][2 free].
    a, _b, c, _d = (sim.malloc(9 * MiB) for _ in range(4))
    sim.free(a)
    sim.free(c)
    # Free pieces: 9, 2, 9, 2 MiB; allocated 18 MiB of 40 MiB.
    assert sim.stats.allocated_bytes == 18 * MiB
    with pytest.raises(OutOfMemory) as info:
        # 10 MiB fits no free piece; a new 10 MiB segment would make 50 > 40 MiB,
        # and no segment is wholly free, so nothing can be released.
        sim.malloc(10 * MiB)
    oom = info.value
    assert oom.requested_bytes == 10 * MiB
    assert oom.segment_bytes == 10 * MiB
    assert oom.allocated_bytes == 18 * MiB
    assert oom.reserved_bytes == 40 * MiB
    assert oom.capacity_bytes == 40 * MiB
    assert sim.stats.num_ooms == 1
    assert sim.stats.num_segments == 2


def test_oom_message_reads_like_torch() -> None:
    sim = CachingAllocatorSim(capacity_bytes=16 * MiB)
    with pytest.raises(OutOfMemory) as info:
        sim.malloc(5 * MiB)  # needs a 20 MiB segment > 16 MiB
    assert str(info.value) == (
        "CUDA out of memory (simulated). Tried to allocate 20.00 MiB for a request"
        " of 5.00 MiB. Capacity 16.00 MiB, of which 0 bytes is allocated and"
        " 0 bytes is reserved but unallocated."
    )
    assert isinstance(info.value, AutotuneError)


def test_failed_retry_still_releases_the_cache() -> None:
    sim = CachingAllocatorSim(capacity_bytes=40 * MiB)
    x = sim.malloc(20 * MiB)
    sim.malloc(20 * MiB)
    sim.free(x)
    with pytest.raises(OutOfMemory):
        # 40 + 24 > 40: release x's segment (-> 20 MiB), then 20 + 24 > 40 still.
        sim.malloc(24 * MiB)
    # Like release_cached_blocks, the cache stays released after the failure.
    assert sim.stats.reserved_bytes == 20 * MiB
    assert sim.stats.num_segments == 1


def test_allocator_stays_usable_after_an_oom() -> None:
    sim = CachingAllocatorSim(capacity_bytes=20 * MiB)
    sim.malloc(5 * MiB)  # one 20 MiB segment, 15 MiB free rest
    with pytest.raises(OutOfMemory):
        sim.malloc(16 * MiB)  # no 16 MiB free block, no room for a 16 MiB segment
    sim.malloc(15 * MiB)  # the free rest still serves it
    assert sim.stats.allocated_bytes == 20 * MiB
    assert sim.stats.num_ooms == 1


def test_peaks_and_reset_peak() -> None:
    sim = CachingAllocatorSim()
    a = sim.malloc(5 * MiB)
    b = sim.malloc(5 * MiB)
    sim.free(a)
    sim.free(b)
    sim.malloc(1 * KiB)
    # Peak allocated 10 MiB; reserved 20 MiB large + 2 MiB small = 22 MiB.
    stats = sim.stats
    assert (stats.allocated_bytes, stats.peak_allocated_bytes) == (1 * KiB, 10 * MiB)
    assert (stats.reserved_bytes, stats.peak_reserved_bytes) == (22 * MiB, 22 * MiB)
    assert stats.num_allocs == 3
    sim.reset_peak()
    sim.empty_cache()  # releases the free 20 MiB segment; peaks never go down
    stats = sim.stats
    assert (stats.peak_allocated_bytes, stats.peak_reserved_bytes) == (
        1 * KiB,
        22 * MiB,
    )
    sim.reset_peak()
    assert sim.stats.peak_reserved_bytes == 2 * MiB


def test_empty_cache_releases_only_wholly_free_segments() -> None:
    sim = CachingAllocatorSim()
    sim.malloc(5 * MiB)  # kept: its 20 MiB segment is partly in use
    # 16 MiB does not fit the 15 MiB free rest: a 16 MiB segment, freed at once.
    sim.free(sim.malloc(16 * MiB))
    sim.free(sim.malloc(100))  # a free 2 MiB small segment
    assert sim.stats.reserved_bytes == 38 * MiB  # 20 + 16 + 2
    sim.empty_cache()
    assert sim.stats.reserved_bytes == 20 * MiB
    assert sim.stats.num_segments == 1
    assert sim.stats.allocated_bytes == 5 * MiB


def test_zero_byte_request_takes_nothing() -> None:
    sim = CachingAllocatorSim(capacity_bytes=0)
    handle = sim.malloc(0)
    assert handle == NULL_HANDLE
    assert sim.stats.allocated_bytes == 0
    assert sim.stats.reserved_bytes == 0
    assert sim.stats.num_allocs == 0
    sim.free(handle)  # freeing a null pointer is a no-op, as in the real allocator


def test_unlimited_capacity_never_runs_out() -> None:
    sim = CachingAllocatorSim()
    sim.malloc(1 << 50)
    assert sim.stats.reserved_bytes == 1 << 50


def test_double_free_and_bad_sizes_are_errors() -> None:
    sim = CachingAllocatorSim()
    handle = sim.malloc(100)
    sim.free(handle)
    with pytest.raises(ValueError, match="not in use"):
        sim.free(handle)
    with pytest.raises(ValueError, match="nbytes must be >= 0"):
        sim.malloc(-1)
    with pytest.raises(ValueError, match="capacity_bytes must be >= 0"):
        CachingAllocatorSim(capacity_bytes=-1)


def test_random_workload_keeps_the_books_consistent() -> None:
    rng = random.Random(0)
    sim = CachingAllocatorSim(capacity_bytes=2 << 30)
    live: dict[int, int] = {}  # handle -> requested bytes
    for _ in range(3000):
        if live and rng.random() < 0.45:
            handle = rng.choice(list(live))
            del live[handle]
            sim.free(handle)
        else:
            nbytes = rng.choice([rng.randrange(1, 2 * MiB), rng.randrange(1, 64 * MiB)])
            with contextlib.suppress(OutOfMemory):
                live[sim.malloc(nbytes)] = nbytes
        if rng.random() < 0.01:
            sim.empty_cache()
    segments = sim.snapshot()
    stats = sim.stats
    assert stats.num_ooms > 0  # seed 0 reaches the 2 GiB ceiling: release path runs
    assert sum(seg.size for seg in segments) == stats.reserved_bytes
    assert len(segments) == stats.num_segments
    in_use = [blk for seg in segments for blk in seg.blocks if blk.allocated]
    assert sum(blk.size for blk in in_use) == stats.allocated_bytes
    assert sorted(blk.address for blk in in_use) == sorted(live)
    for seg in segments:
        # Blocks tile the segment, and no two free blocks are left unmerged.
        assert seg.blocks[0].address == seg.address
        for left, right in zip(seg.blocks, seg.blocks[1:], strict=False):
            assert left.address + left.size == right.address
            assert left.allocated or right.allocated
    for handle, nbytes in live.items():
        block = next(b for seg in segments for b in seg.blocks if b.address == handle)
        assert block.size >= round_size(nbytes)



def test_a_clone_goes_on_as_the_original_would_and_shares_no_block_with_it() -> None:
    rng = random.Random(7)
    mib = 1 << 20
    original = CachingAllocatorSim(None)
    live = [original.malloc(rng.randint(1, 30 * mib)) for _ in range(40)]
    for handle in live[::3]:
        original.free(handle)
    live = [handle for index, handle in enumerate(live) if index % 3]
    clone = original.clone(None)
    assert clone.snapshot() == original.snapshot() and clone.stats == original.stats
    requests = [rng.randint(1, 30 * mib) for _ in range(30)]
    for sim in (original, clone):
        for handle in live[::2]:
            sim.free(handle)
        for nbytes in requests:
            sim.malloc(nbytes)
    assert clone.snapshot() == original.snapshot() and clone.stats == original.stats
    before = original.snapshot()
    for handle in live[1::2]:  # freed in the clone only
        clone.free(handle)
    assert original.snapshot() == before != clone.snapshot()
    assert original.clone(5 * mib).capacity_bytes == 5 * mib
