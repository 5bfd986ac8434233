"""A pure-Python simulator of PyTorch's CUDA caching allocator.

It replays malloc/free events and reports what `torch.cuda.memory_allocated()` and
`torch.cuda.memory_reserved()` would read on a GPU, and whether an allocation would
raise `torch.OutOfMemoryError`, without touching CUDA (or torch).

Source: pytorch/pytorch `c10/cuda/CUDACachingAllocator.cpp`, class
`DeviceCachingAllocator` (read at commit 001074d25084fdb87a799823e395a50f5ec044d3), under
the settings of `PYTORCH_ALLOC_CONF` that `AllocatorConfig` holds (`parse_alloc_conf`). Each
rule below names the C++ function it mirrors, so it can be checked against newer releases.
Where PyTorch's main branch, which moved the allocator's body to `c10/core/CachingDeviceAllocator.h`
(`CachingDeviceAllocatorImpl`, read from a code index that names no commit), differs, the rule
says so and follows main:

- `round_size`: requests round up to a multiple of 512 bytes, at least 512. With
  `roundup_power2_divisions`, a request above 512 bytes x the divisions of its size's interval
  ([2^k, 2^(k+1)) MiB, k = 0..15, the last one open) rounds up to the next of that many equal steps
  between two powers of two (`roundup_power2_next_division`).
- `get_pool`: rounded sizes <= 1 MiB live in the small pool, the rest in the large one.
- `get_allocation_size`: the size of a new segment (one `cudaMalloc`); with expandable segments
  only the figure the memory cap is checked against (`alloc_block`).
- `get_free_block`: best fit, the smallest free block of the pool with size >= request;
  the pool is a `std::set` ordered by (stream, size, address), so ties go to the
  lowest address, and a request gets only a block of its own stream (streams below). With
  `max_split_size_mb`, a block at least that large is refused to a smaller
  request, and to a request at least that large if it is `max_non_split_rounding_mb` (default
  kLargeBuffer, 20 MiB; 001074d hard-codes kLargeBuffer) or more larger than the request; the
  search does not go on to another block.
- `should_split` / `alloc_found_block`: split off the remainder, or hand out the
  whole block (`memory_allocated` then counts the whole block): small blocks split down to
  512 bytes, large ones only when the request is below max_split_size and the remainder above
  1 MiB; with expandable segments every block splits down to 512 bytes.
- `free_block` / `try_merge_blocks`: a freed block merges with free neighbours of
  its own segment (mapped, like itself) and goes back to its pool.
- `malloc` / `alloc_block` / `release_cached_blocks`: when no free block fits, a new
  segment is allocated; if reserved + its size exceeds the capacity (what `cudaMalloc` can hand
  out, or `set_per_process_memory_fraction`'s `allowed_memory_maximum`, which `alloc_block` checks
  the same way), first, with max_split_size_mb, `release_available_cached_blocks` frees oversize
  cached segments (the smallest at least as large as the request and max_split_size, else the
  largest ones down to max_split_size until that much is freed) and the allocation is retried;
  then every cached segment with no block in use is released (`cudaFree`) and the allocation
  retried once; if it still fails, the allocator raises out-of-memory. `empty_cache` is
  `release_cached_blocks`.
- `garbage_collect_cached_blocks` (`garbage_collection_threshold`, which acts only with a
  memory fraction set: here, a capacity): before allocating, if reserved exceeds threshold x
  capacity, the whole cached large segments at least as old as their average (age: calls of
  `get_free_block` on the pool since the block was cached, `gc_count`) are released, round by round,
  until reserved is down by the excess or nothing is released.

Streams (`Block::stream`; `malloc(nbytes, stream)`, 0 the default stream, FSDP2's own numbered from 1:
estimate/rank.py):

- a segment belongs to the stream whose request made it (`alloc_block`: `Block(device, stream, ...)`),
  and every block split from it too; `free_block` returns a block to the pool at once (no
  `record_stream` was called on it: below) and merges it only with its segment's neighbours, which
  are of its stream;
- `get_free_block` searches from (stream, size, null): a block of another stream is never handed
  out ("(*it)->stream != p.stream()" returns false), so a block freed on one stream waits for a
  request of that stream, and a request of another opens a segment of its own;
- `release_available_cached_blocks` looks only at the request's stream's blocks; `release_cached_blocks`
  (empty_cache and the out-of-memory retry) and `garbage_collect_cached_blocks` release the cached
  segments of every stream, in the pool's order (stream first);
- with expandable segments, each stream has its segments of its own (`find_expandable_block` looks at
  `pool->unmapped` from (stream, null) while "(*it)->stream == stream"; a new `ExpandableSegment` is
  made for the request's stream).

Expandable segments (`expandable_segments:True`; Note [Expandable Segments], `ExpandableSegment`):

- a pool's segment is a range of virtual addresses (`cuMemAddressReserve`) in which physical
  pages are mapped (`cuMemCreate`, `cuMemMap`) and unmapped as needed; a page (`segment_size_`)
  is kSmallBuffer, 2 MiB, in the small pool and kLargeBuffer, 20 MiB, in the large one
  (`find_expandable_block`). Reserved memory is the pages mapped (`map_block`, `unmap_block`);
  `segment.all.current` stays 0.
- `try_allocate_expandable_block` / `find_expandable_block` / `map_block`: a request no free
  block serves grows the segment at the lowest address that can hold it: the first unmapped range
  (by address) which, with the free block just before it and the free and unmapped blocks after
  it, adds up to the request. The unmapped pages needed are mapped, whole pages, and merge with the
  free block before them; what is left over stays free, split off (`should_split`).
- `alloc_block`: the cap is checked against `get_allocation_size`, not against the pages mapped,
  so reserved memory can pass the cap by less than a page.
- `get_free_block`: a free block weighs as the size it can grow to (its own and the unmapped
  pages right after it, `expandable_size`): from the smallest fitting block the search moves on
  while the next one weighs less, so the block at the segment's growing end is taken last.
- `release_cached_blocks` / `release_blocks` / `unmap_block`: each free block (in the pool's order)
  gives back the whole pages inside it, a page partly in use stays mapped; a segment with no page
  left mapped is released (`release_expandable_segment`). The out-of-memory retry does the same:
  the H200's record of a Llama-3.2-1B LoRA step under a cap (docs/measurements/h200/records, the
  `-expandable` ones) unmaps a hole too small for the 5.9 GiB logits, which then grow the
  segment's end. `release_available_cached_blocks` releases no expandable block (main skips them;
  at 001074d it fails an assertion) and `garbage_collect_cached_blocks` finds none whole.

Replayed so, the two steps recorded on an H200 with expandable_segments:True (torch 2.11.0) reach
their real peak allocated and peak reserved to the byte, with every map and unmap at its place
(tests/autotune/backends/estimate/test_allocator_expandable.py).

Deliberately left out (none applies to the traces the estimator makes: FSDP2 calls no `record_stream`,
and no CUDA graphs are captured):

- `record_stream` and its CUDA events (`insert_events` / `process_events`): a block freed while used on
  other streams is reusable only once their events complete. Every block here is reusable by its
  stream at once: FSDP2 keeps references to the buffers it hands between streams instead
  (AllGatherState, ReduceScatterState, the sharded gradients; _fsdp_collectives.py), and with the
  fake process group the estimator and the measured runs use, no NCCL kernel records any. Other
  multi-stream code (FSDP1's streams, DeepSpeed's) is traced on the default stream alone;
- the order of streams: the real set orders them by their `cudaStream_t` (the default stream is the
  null pointer, first); here by their number, which decides nothing but the order in which cached
  segments are released. PyTorch's main branch (`CachingDeviceAllocatorImpl`, whose
  `BlockComparatorSize` compares the size before the stream) is not followed here: its
  `get_free_block` refuses a request whose best fit of any stream is another stream's;
- CUDA-graph private pools, and `trigger_free_memory_callbacks`;
- the address space of an expandable segment: PyTorch reserves 1 1/8 of the device's memory and
  starts a second segment only when no unmapped range of the first holds a request; the simulator,
  which does not know the device, reserves far more, so a pool keeps one segment (the H200
  records show one per pool, the large pool's starting about 5 MiB past the end of the small one's
  1 1/8 x 150,109,880,320 bytes). A `cuMemCreate` that fails below the cap (the device full of
  other processes' memory) is not modelled either;
- real device addresses: segments get fake ones, which only decide ties between
  equal-sized free blocks. Their order is the driver's: each new segment below the
  earlier ones (`cudaMalloc` hands out virtual addresses top-down: of the segment pairs
  of equal size in the steps recorded on an H100, docs/measurements/h100-80gb/records,
  the later one lies lower in 4674 of 4700 in an amp BERT-base step, 6827 of 6854 in an
  fp32 one, 568 of 639 in a Llama-3.2-1B QLoRA step, the 2 MiB segments that fill gaps
  being the rest). Replayed so, those three steps reach their real peak reserved to the
  byte (with increasing addresses, every tie going the other way: +0.38 %, +0.72 %,
  -0.40 %), and the estimator's max batch is the H100's or one below it in 81 of its 89
  measured cells, never above by more than 2 % (77 and 5 cells above with increasing
  addresses; docs/accuracy.md). Reuse of a released segment's addresses is not modelled:
  the one release recorded (the QLoRA step's) was not reused. Within an expandable segment the
  addresses are the real ones' offsets.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from autotune.backends.estimate.alloc_conf import LARGE_BUFFER, AllocatorConfig
from autotune.errors import OutOfMemory

# Constants of CUDACachingAllocator.cpp, named and quoted from there.
# kMinBlockSize: "all sizes are rounded to at least 512 bytes"
MIN_BLOCK_SIZE = 512
# kSmallSize: "largest 'small' allocation is 1 MiB"
SMALL_SIZE = 1_048_576
# kSmallBuffer: "'small' allocations are packed in 2 MiB blocks"; also the small pool's page of an
# expandable segment (find_expandable_block: "pool->is_small ? kSmallBuffer : kLargeBuffer").
SMALL_BUFFER = 2_097_152
# kMinLargeAlloc: "allocations between 1 and 10 MiB may use kLargeBuffer"
MIN_LARGE_ALLOC = 10_485_760
# kLargeBuffer: "'large' allocations may be packed in 20 MiB blocks"; also the large pool's page of
# an expandable segment, and the default of max_non_split_rounding_mb: LARGE_BUFFER (alloc_conf.py).
# kRoundLarge: "round up large allocations to 2 MiB"
ROUND_LARGE = 2_097_152

# Handle of a 0-byte allocation: the real allocator returns a null pointer and no block.
NULL_HANDLE = 0
# Fake address above the first segment: segments go down from it (see the module's docstring);
# any 512-aligned value far above what a replay cudaMallocs in all would do.
_TOP_ADDRESS = 1 << 56
# Virtual address space of one expandable segment: PyTorch reserves 1 1/8 of the device's memory;
# this is more than any device has (about 175 TB), a whole number of 20 MiB pages.
_EXPANDABLE_SPACE = LARGE_BUFFER * (1 << 23)


def round_size(nbytes: int, config: AllocatorConfig | None = None) -> int:
    """Bytes a request really takes: a multiple of 512, at least 512; or, with the config's
    roundup_power2_divisions, the next division of its power-of-two interval."""
    if nbytes < MIN_BLOCK_SIZE:
        return MIN_BLOCK_SIZE
    divisions = 0 if config is None else config.divisions_for(nbytes)
    if divisions > 1 and nbytes > MIN_BLOCK_SIZE * divisions:
        return _next_power2_division(nbytes, divisions)
    return MIN_BLOCK_SIZE * ((nbytes + MIN_BLOCK_SIZE - 1) // MIN_BLOCK_SIZE)


def _next_power2_division(nbytes: int, divisions: int) -> int:
    """roundup_power2_next_division: e.g. 1200 MiB in 4 divisions of [1024, 2048) MiB -> 1280 MiB."""
    if nbytes & (nbytes - 1) == 0:
        return nbytes
    floor = 1 << (nbytes.bit_length() - 1)
    step = floor >> (divisions.bit_length() - 1)  # divisions is a power of two (parse_alloc_conf)
    if step == 0:
        return floor << 1
    rounded = nbytes & ~(step - 1)
    return nbytes if rounded == nbytes else rounded + step


def segment_size(rounded: int) -> int:
    """get_allocation_size: bytes `cudaMalloc`'d for a new segment serving a request of `rounded`
    bytes (with expandable segments: what the memory cap is checked against)."""
    if rounded <= SMALL_SIZE:
        return SMALL_BUFFER
    if rounded < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return ROUND_LARGE * ((rounded + ROUND_LARGE - 1) // ROUND_LARGE)


def format_size(nbytes: int) -> str:
    """Bytes as the real allocator prints them in its out-of-memory message."""
    if nbytes <= 1024:
        return f"{nbytes} bytes"
    if nbytes <= 1 << 20:
        return f"{nbytes / (1 << 10):.2f} KiB"
    if nbytes <= 1 << 30:
        return f"{nbytes / (1 << 20):.2f} MiB"
    return f"{nbytes / (1 << 30):.2f} GiB"



@dataclass
class AllocatorStats:
    """The figures torch.cuda.memory_stats() would report, in bytes or counts."""

    allocated_bytes: int  # sum of block sizes in use (torch.cuda.memory_allocated)
    reserved_bytes: int  # sum of segment sizes, or of mapped pages (torch.cuda.memory_reserved)
    peak_allocated_bytes: int  # since creation or the last reset_peak()
    peak_reserved_bytes: int
    num_allocs: int  # successful non-empty mallocs so far ("allocation.all.allocated")
    num_segments: int  # current cudaMalloc'd segments ("segment.all.current"; 0 when expandable)
    num_ooms: int  # OutOfMemory raised; a caller that stops at the first sees 0 or 1


@dataclass(frozen=True)
class BlockInfo:
    """One block of a segment in a snapshot()."""

    address: int
    size: int  # bytes
    allocated: bool


@dataclass(frozen=True)
class SegmentInfo:
    """One segment in a snapshot(): a cudaMalloc, or a contiguous mapped range of an expandable one."""

    address: int
    size: int  # bytes
    is_small: bool
    blocks: tuple[BlockInfo, ...]  # in address order, covering the segment
    stream: int = 0  # whose requests its blocks serve (0: the default stream)


class SegmentEvent(NamedTuple):
    """A change of reserved memory, as torch.cuda.memory._record_memory_history traces it."""

    action: str  # segment_alloc, segment_free (cudaMalloc, cudaFree); segment_map, segment_unmap
    address: int
    size: int  # bytes
    is_small: bool  # of the small pool


class _Block:
    """A piece of a segment, linked to its neighbours like Block::prev / Block::next."""

    __slots__ = ("address", "allocated", "gc_base", "is_small", "mapped", "next", "prev", "size", "stream")

    def __init__(self, address: int, size: int, is_small: bool, mapped: bool = True, stream: int = 0) -> None:
        self.address = address
        self.size = size
        self.is_small = is_small
        self.stream = stream  # the stream whose request made its segment (Block::stream)
        self.allocated = False
        self.mapped = mapped  # False: unmapped pages of an expandable segment
        self.gc_base = 0  # the pool's free_calls when the block was cached (gc_count_base)
        self.prev: _Block | None = None
        self.next: _Block | None = None


class _Pool:
    """The free blocks of one BlockPool, searchable by (stream, size, address) in O(log n), and the
    unmapped ranges of its expandable segments by (stream, address) (BlockPool::unmapped)."""

    def __init__(self, is_small: bool) -> None:
        self.is_small = is_small
        self.page_bytes = SMALL_BUFFER if is_small else LARGE_BUFFER  # ExpandableSegment::segment_size_
        # Each stream's free blocks, sorted (size, address): together, in the order of the streams,
        # the order of BlockComparatorSize, (stream, size, address) (module docstring).
        self.keys: dict[int, list[tuple[int, int]]] = {0: []}
        self._blocks: dict[int, _Block] = {}  # address -> free block
        # Free blocks with no neighbour are whole segments: what release_blocks() frees.
        # Blocks gain or lose neighbours only while out of the pool: this stays exact.
        self.whole_segments: dict[int, _Block] = {}
        self._unmapped_keys: list[tuple[int, int]] = []  # sorted (stream, address): BlockComparatorAddress
        self.unmapped: dict[int, _Block] = {}
        self.free_calls = 0  # get_free_blocks_call_count: get_free_block calls, counted for gc

    def insert(self, block: _Block) -> None:
        keys = self.keys.get(block.stream)
        if keys is None:
            keys = self.keys[block.stream] = []
        bisect.insort(keys, (block.size, block.address))
        self._blocks[block.address] = block
        block.gc_base = self.free_calls  # insert_into_blocks
        if block.prev is None and block.next is None:
            self.whole_segments[block.address] = block

    def take(self, keys: list[tuple[int, int]], index: int) -> _Block:
        """The free block at ``index`` of ``keys`` (one stream's, ``of_stream``), out of the pool:
        ``remove(at(index))`` without searching for it again (malloc's hot path)."""
        address = keys.pop(index)[1]
        self.whole_segments.pop(address, None)
        return self._blocks.pop(address)

    def remove(self, block: _Block) -> None:
        keys = self.keys[block.stream]
        del keys[bisect.bisect_left(keys, (block.size, block.address))]
        del self._blocks[block.address]
        self.whole_segments.pop(block.address, None)

    def insert_unmapped(self, block: _Block) -> None:
        bisect.insort(self._unmapped_keys, (block.stream, block.address))
        self.unmapped[block.address] = block

    def remove_unmapped(self, block: _Block) -> None:
        del self._unmapped_keys[bisect.bisect_left(self._unmapped_keys, (block.stream, block.address))]
        del self.unmapped[block.address]

    def unmapped_blocks(self, stream: int) -> list[_Block]:
        """Unmapped ranges of ``stream``'s segments by address."""
        start = bisect.bisect_left(self._unmapped_keys, (stream, 0))
        end = bisect.bisect_left(self._unmapped_keys, (stream + 1, 0))
        return [self.unmapped[address] for _, address in self._unmapped_keys[start:end]]

    def of_stream(self, stream: int) -> list[tuple[int, int]]:
        """``stream``'s free blocks, (size, address) in order (the search stays within them: "(*it)->stream
        != p.stream()" ends it)."""
        return self.keys.get(stream) or []

    def fit_index(self, size: int, stream: int = 0) -> int:
        """Position among ``stream``'s free blocks of the smallest of at least ``size`` bytes, lowest
        address first (their count if none); the search key has a null pointer, like
        AllocParams::search_key."""
        return bisect.bisect_left(self.of_stream(stream), (size, 0))

    def at(self, index: int, stream: int = 0) -> _Block:
        return self._blocks[self.keys[stream][index][1]]

    def __len__(self) -> int:
        return sum(len(keys) for keys in self.keys.values())

    def best_fit(self, size: int, stream: int = 0) -> _Block | None:
        """The smallest free block of ``stream`` of at least `size` bytes, lowest address first."""
        index = self.fit_index(size, stream)
        return self.at(index, stream) if index < len(self.of_stream(stream)) else None

    def blocks(self) -> list[_Block]:
        return list(self._blocks.values())

    def ordered(self) -> list[_Block]:
        """The free blocks in the pool's order: (stream, size, address)."""
        return [self._blocks[address] for stream in sorted(self.keys) for _, address in self.keys[stream]]

    def copy_into(self, other: _Pool, copy: Callable[[_Block], _Block]) -> None:
        other.keys = {stream: list(keys) for stream, keys in self.keys.items()}
        other._blocks = {address: copy(block) for address, block in self._blocks.items()}
        other.whole_segments = {address: copy(block) for address, block in self.whole_segments.items()}
        other._unmapped_keys = list(self._unmapped_keys)
        other.unmapped = {address: copy(block) for address, block in self.unmapped.items()}
        other.free_calls = self.free_calls


def _expandable_size(block: _Block) -> int:
    """get_free_block's expandable_size: a block and the unmapped pages right after it."""
    following = block.next
    return block.size + (following.size if following is not None and not following.mapped else 0)


def _splice(block: _Block, before: _Block | None, after: _Block | None) -> None:
    """Block::splice: put ``block`` between the neighbours ``before`` and ``after``."""
    if before is not None:
        before.next = block
    block.prev = before
    if after is not None:
        after.prev = block
    block.next = after


class CachingAllocatorSim:
    """One device's caching allocator, its streams' blocks kept apart, under ``config``'s settings."""

    def __init__(self, capacity_bytes: int | None = None, config: AllocatorConfig | None = None) -> None:
        # What cudaMalloc can hand out in all (None: unlimited); alloc_block makes
        # the same check for torch.cuda.set_per_process_memory_fraction.
        if capacity_bytes is not None and capacity_bytes < 0:
            raise ValueError(f"capacity_bytes must be >= 0, got {capacity_bytes}")
        self.capacity_bytes = capacity_bytes
        self.config = AllocatorConfig() if config is None else config
        # The config's switches, read on every malloc.
        self._rounding = self.config if self.config.rounds_up else None
        self._expandable = self.config.expandable_segments
        self._max_split = self.config.max_split_size_bytes
        self._collects = self.config.garbage_collection_threshold > 0
        self._small = _Pool(is_small=True)
        self._large = _Pool(is_small=False)
        self._active: dict[int, _Block] = {}  # handle (= block address) -> block in use
        self._lowest_address = _TOP_ADDRESS  # of the segments cudaMalloc'd so far
        self._allocated = 0
        self._reserved = 0
        self._peak_allocated = 0
        self._peak_reserved = 0
        self._capacity_needed = 0
        self._num_allocs = 0
        self._num_segments = 0
        self._num_ooms = 0
        self._events: list[SegmentEvent] = []

    def malloc(self, nbytes: int, stream: int = 0) -> int:
        """Allocate `nbytes` on ``stream`` (0: the default stream; any other number another
        stream); return a handle for free(). Raises OutOfMemory."""
        if nbytes <= 0:
            if nbytes < 0:
                raise ValueError(f"nbytes must be >= 0, got {nbytes}")
            return NULL_HANDLE
        if self._rounding is None:  # round_size without power-of-two divisions, inlined: every event
            size = MIN_BLOCK_SIZE if nbytes < MIN_BLOCK_SIZE else \
                MIN_BLOCK_SIZE * ((nbytes + MIN_BLOCK_SIZE - 1) // MIN_BLOCK_SIZE)
        else:
            size = round_size(nbytes, self._rounding)
        pool = self._small if size <= SMALL_SIZE else self._large
        block = self._free_block_for(pool, size, stream)
        if block is None:
            block = self._allocate(pool, nbytes, size, stream)
        self._hand_out(pool, block, size)
        return block.address

    def free(self, handle: int) -> None:
        """Return an allocation to its pool, merging it with free neighbours."""
        if handle == NULL_HANDLE:
            return
        block = self._active.pop(handle, None)
        if block is None:
            raise ValueError(f"invalid handle {handle:#x}: not in use (double free?)")
        block.allocated = False
        self._allocated -= block.size
        pool = self._small if block.is_small else self._large
        self._merge_free_neighbours(pool, block)
        pool.insert(block)

    def empty_cache(self) -> None:
        """Release every segment with no block in use (torch.cuda.empty_cache); with expandable
        segments, unmap every whole free page."""
        for pool in (self._large, self._small):  # release_cached_blocks' order
            if self._expandable:
                self._unmap_free_pages(pool)
                continue
            for block in sorted(pool.whole_segments.values(), key=lambda b: (b.stream, b.size, b.address)):
                self._release_segment(pool, block)

    def reset_peak(self) -> None:
        """Peaks start again from the current figures (reset_peak_memory_stats)."""
        self._peak_allocated = self._allocated
        self._peak_reserved = self._reserved

    @property
    def reserved_bytes(self) -> int:
        """stats.reserved_bytes, without building the stats."""
        return self._reserved

    @property
    def capacity_needed_bytes(self) -> int:
        """The most any request for new memory so far checked against the capacity (reserved + its
        get_allocation_size, alloc_block): a capacity of at least this refuses none, so a run under
        it is the run without a limit. Classic segments: the peak reserved (reset_peak aside)."""
        return self._capacity_needed

    @property
    def segment_events(self) -> tuple[SegmentEvent, ...]:
        """Every change of reserved memory so far, in order."""
        return tuple(self._events)

    @property
    def stats(self) -> AllocatorStats:
        return AllocatorStats(
            allocated_bytes=self._allocated,
            reserved_bytes=self._reserved,
            peak_allocated_bytes=self._peak_allocated,
            peak_reserved_bytes=self._peak_reserved,
            num_allocs=self._num_allocs,
            num_segments=self._num_segments,
            num_ooms=self._num_ooms,
        )

    def clone(self, capacity_bytes: int | None) -> CachingAllocatorSim:
        """This allocator's state, block for block, under another capacity and the same config:
        where a run with a limit has not yet reached it, it is the same as one without
        (replay.replay starts there)."""
        other = CachingAllocatorSim(capacity_bytes, self.config)
        copies: dict[int, _Block] = {}

        def copy(block: _Block) -> _Block:
            found = copies.get(id(block))
            if found is None:
                found = copies[id(block)] = _Block(block.address, block.size, block.is_small, block.mapped,
                                                   block.stream)
                found.allocated, found.gc_base = block.allocated, block.gc_base
            return found

        self._small.copy_into(other._small, copy)
        self._large.copy_into(other._large, copy)
        other._active = {handle: copy(block) for handle, block in self._active.items()}
        for original in [*self._active.values(), *self._small._blocks.values(), *self._large._blocks.values(),
                         *self._small.unmapped.values(), *self._large.unmapped.values()]:
            twin = copy(original)
            twin.prev = copy(original.prev) if original.prev is not None else None
            twin.next = copy(original.next) if original.next is not None else None
        other._lowest_address = self._lowest_address
        other._allocated, other._reserved = self._allocated, self._reserved
        other._peak_allocated, other._peak_reserved = self._peak_allocated, self._peak_reserved
        other._capacity_needed = self._capacity_needed
        other._num_allocs, other._num_segments, other._num_ooms = (
            self._num_allocs, self._num_segments, self._num_ooms)
        other._events = list(self._events)
        return other

    def snapshot(self) -> list[SegmentInfo]:
        """Every segment and its blocks by address, like torch.cuda.memory_snapshot (which reports
        each contiguous mapped range of an expandable segment as a segment)."""
        blocks = [*self._active.values(), *self._small.blocks(), *self._large.blocks()]
        segments = []
        heads = sorted((b for b in blocks if b.prev is None or not b.prev.mapped), key=lambda b: b.address)
        for head in heads:
            infos = []
            block: _Block | None = head
            while block is not None and block.mapped:
                infos.append(BlockInfo(block.address, block.size, block.allocated))
                block = block.next
            size = sum(info.size for info in infos)
            segments.append(SegmentInfo(head.address, size, head.is_small, tuple(infos), head.stream))
        return segments

    def _free_block_for(self, pool: _Pool, size: int, stream: int) -> _Block | None:
        """get_free_block: the best-fitting free block of ``stream``, taken out of the pool, or None."""
        if self._collects:
            # Counted only with a memory fraction set in PyTorch; a capacity given later (clone)
            # starts where a run with it from the start would be, and without one nothing reads it.
            pool.free_calls += 1
        keys = pool.keys[0] if stream == 0 else pool.of_stream(stream)
        index = bisect.bisect_left(keys, (size, 0))  # pool.fit_index, inlined: malloc's hot path
        if index == len(keys):
            return None
        limit = self._max_split
        if not self._expandable and limit is None:  # PyTorch's defaults: the best fit, taken
            return pool.take(keys, index)
        block = pool.at(index, stream)
        if self._expandable:
            while index + 1 < len(keys) \
                    and _expandable_size(pool.at(index + 1, stream)) < _expandable_size(block):
                index += 1
                block = pool.at(index, stream)
        if limit is not None:
            if size < limit <= block.size:  # "Do not return an oversized block for a large request"
                return None
            if size >= limit and block.size >= size + self.config.max_non_split_rounding_bytes:
                return None
        return pool.take(keys, index)

    def _allocate(self, pool: _Pool, nbytes: int, size: int, stream: int) -> _Block:
        """malloc's way to new memory: garbage collection, alloc_block, then, if the capacity
        refuses it, release_available_cached_blocks or release_cached_blocks and a retry."""
        alloc_size = segment_size(size)
        capacity = self.capacity_bytes
        if capacity is not None and self._collects:
            self._collect_garbage(capacity)
        block = self._alloc_block(pool, size, alloc_size, stream)
        if block is None and self._release_oversize(pool, size, stream):
            block = self._alloc_block(pool, size, alloc_size, stream)
        if block is None:
            self.empty_cache()
            block = self._alloc_block(pool, size, alloc_size, stream)
        if block is None:
            self._num_ooms += 1
            raise self._out_of_memory(nbytes, alloc_size)
        return block

    def _out_of_memory(self, nbytes: int, alloc_size: int) -> OutOfMemory:
        capacity = self.capacity_bytes
        assert capacity is not None  # only a capacity refuses memory
        return OutOfMemory(
            # Worded like the real message, which names the segment size, not the request.
            "CUDA out of memory (simulated)."
            f" Tried to allocate {format_size(alloc_size)}"
            f" for a request of {format_size(nbytes)}."
            f" Capacity {format_size(capacity)},"
            f" of which {format_size(self._allocated)} is allocated"
            f" and {format_size(self._reserved - self._allocated)}"
            " is reserved but unallocated.",
            requested_bytes=nbytes,
            segment_bytes=alloc_size,
            allocated_bytes=self._allocated,
            reserved_bytes=self._reserved,
            capacity_bytes=capacity,
        )

    def _alloc_block(self, pool: _Pool, size: int, alloc_size: int, stream: int) -> _Block | None:
        """alloc_block: a new segment of ``stream`` (or mapped pages of its expandable segment) for a
        request of ``size`` bytes, out of any pool; None where reserved + ``alloc_size`` exceeds the
        capacity."""
        needed = self._reserved + alloc_size
        if self.capacity_bytes is not None and needed > self.capacity_bytes:
            return None
        self._capacity_needed = max(self._capacity_needed, needed)
        if self._expandable:
            return self._grow_expandable(pool, size, stream)
        block = _Block(self._segment_address(alloc_size), alloc_size, pool.is_small, stream=stream)
        self._reserved += alloc_size
        self._peak_reserved = max(self._peak_reserved, self._reserved)
        self._num_segments += 1
        self._events.append(SegmentEvent("segment_alloc", block.address, alloc_size, pool.is_small))
        return block

    def _segment_address(self, alloc_size: int) -> int:
        """Where cudaMalloc puts a new segment: below every earlier one (top-down)."""
        self._lowest_address -= alloc_size
        return self._lowest_address

    def _release_segment(self, pool: _Pool, block: _Block) -> None:
        """release_block: cudaFree a whole cached segment."""
        pool.remove(block)
        self._reserved -= block.size
        self._num_segments -= 1
        self._events.append(SegmentEvent("segment_free", block.address, block.size, pool.is_small))

    def _release_oversize(self, pool: _Pool, size: int, stream: int) -> bool:
        """release_available_cached_blocks: with max_split_size, free the smallest cached segment of
        ``stream`` of at least max(size, max_split_size) bytes, else its largest ones of at least
        max_split_size until that much is freed; whether it got there. Expandable blocks are never
        released."""
        limit = self._max_split
        if limit is None or self._expandable:
            return False
        target = max(size, limit)
        found = pool.fit_index(target, stream)
        if found < len(pool.of_stream(stream)):
            self._release_segment(pool, pool.at(found, stream))
            return True
        released = 0
        for index in range(found - 1, -1, -1):  # "Now on the largest block for the correct stream"
            block = pool.at(index, stream)
            if released >= target or block.size < limit:
                break
            # Blocks of max_split_size or more are never split (should_split): whole segments.
            released += block.size
            self._release_segment(pool, block)
        return released >= target

    def _collect_garbage(self, capacity: int) -> None:
        """garbage_collect_cached_blocks: over threshold x capacity, release the whole cached large
        segments at least as old as their average, round by round, until the excess is freed."""
        threshold = int(self.config.garbage_collection_threshold * capacity)
        if self._reserved <= threshold:
            return
        target = self._reserved - threshold
        pool = self._large
        calls = pool.free_calls
        ages = [calls - block.gc_base for block in pool.whole_segments.values()]
        total_age, count = sum(ages), len(ages)
        reclaimed = 0
        freed = True
        while reclaimed < target and freed and count > 0:
            age_threshold = total_age / count
            freed = False
            for block in pool.ordered():
                age = calls - block.gc_base
                if block.prev is None and block.next is None and age >= age_threshold:
                    freed = True
                    reclaimed += block.size
                    total_age -= age
                    count -= 1
                    self._release_segment(pool, block)

    def _merge_free_neighbours(self, pool: _Pool, block: _Block) -> None:
        """try_merge_blocks with prev, then next: a free neighbour mapped as ``block`` is (which is
        in no container now) leaves its container and joins it."""
        prev = block.prev
        if prev is not None and not prev.allocated and prev.mapped == block.mapped:  # [prev block]
            pool.remove(prev) if prev.mapped else pool.remove_unmapped(prev)
            block.address = prev.address
            block.size += prev.size
            block.prev = prev.prev
            if block.prev is not None:
                block.prev.next = block
        following = block.next
        if following is not None and not following.allocated and following.mapped == block.mapped:
            pool.remove(following) if following.mapped else pool.remove_unmapped(following)
            block.size += following.size
            block.next = following.next
            if block.next is not None:
                block.next.prev = block

    def _grow_expandable(self, pool: _Pool, size: int, stream: int) -> _Block:
        """try_allocate_expandable_block: map the pages a request needs where find_expandable_block
        finds room in ``stream``'s segments; the free block of at least ``size`` bytes, out of the pool."""
        candidate = self._find_expandable(pool, size, stream)
        if not candidate.mapped:
            candidate = self._map(pool, candidate, min(candidate.size, size))
        while candidate.size < size:
            # free -> unmapped -> *: map the unmapped pages after the free block, which they join.
            unmapped = candidate.next
            assert unmapped is not None and not unmapped.mapped
            candidate = self._map(pool, unmapped, min(size - candidate.size, unmapped.size))
        pool.remove(candidate)
        return candidate

    def _find_expandable(self, pool: _Pool, size: int, stream: int) -> _Block:
        """find_expandable_block: the lowest unmapped range of ``stream``'s segments (or the free
        block before it) from which free and unmapped blocks add up to ``size``; else a new
        segment's range, of ``stream``."""
        for candidate in pool.unmapped_blocks(stream):
            if candidate.prev is not None and not candidate.prev.allocated:
                candidate = candidate.prev
            room = 0
            block: _Block | None = candidate
            while room < size and block is not None and not block.allocated:
                room += block.size
                block = block.next
            if room >= size:
                return candidate
        # Every segment starts on a page of either pool.
        base = (self._lowest_address - _EXPANDABLE_SPACE) // LARGE_BUFFER * LARGE_BUFFER
        self._lowest_address = base
        segment = _Block(base, _EXPANDABLE_SPACE, pool.is_small, mapped=False, stream=stream)
        pool.insert_unmapped(segment)
        return segment

    def _map(self, pool: _Pool, block: _Block, nbytes: int) -> _Block:
        """map_block: map the whole pages holding the first ``nbytes`` of the unmapped ``block``;
        the rest of it stays unmapped; the mapped part joins a free block before or after it."""
        mapped = -(-nbytes // pool.page_bytes) * pool.page_bytes
        pool.remove_unmapped(block)
        block.mapped = True
        if mapped < block.size:
            rest = _Block(block.address + mapped, block.size - mapped, pool.is_small, mapped=False,
                          stream=block.stream)
            _splice(rest, block, block.next)
            pool.insert_unmapped(rest)
            block.size = mapped
        self._events.append(SegmentEvent("segment_map", block.address, mapped, pool.is_small))
        self._merge_free_neighbours(pool, block)
        pool.insert(block)
        self._reserved += mapped
        self._peak_reserved = max(self._peak_reserved, self._reserved)
        return block

    def _unmap_free_pages(self, pool: _Pool) -> None:
        """release_blocks, expandable: unmap the whole pages of every free block; release a segment
        left with none mapped (release_expandable_segment)."""
        for block in pool.ordered():
            self._unmap(pool, block)
            if block.prev is None and block.next is None and not block.mapped:
                pool.remove_unmapped(block)

    def _unmap(self, pool: _Pool, block: _Block) -> None:
        """unmap_block: the whole pages inside the free ``block`` go; the pieces of a page before and
        after them stay free and mapped."""
        page = pool.page_bytes
        begin = -(-block.address // page) * page
        end = (block.address + block.size) // page * page
        if begin >= end:
            return
        pool.remove(block)
        if begin > block.address:
            before = _Block(block.address, begin - block.address, pool.is_small, stream=block.stream)
            _splice(before, block.prev, block)
            pool.insert(before)
        if end < block.address + block.size:
            after = _Block(end, block.address + block.size - end, pool.is_small, stream=block.stream)
            _splice(after, block, block.next)
            pool.insert(after)
        block.address, block.size, block.mapped = begin, end - begin, False
        self._merge_free_neighbours(pool, block)
        pool.insert_unmapped(block)
        self._reserved -= end - begin
        self._events.append(SegmentEvent("segment_unmap", begin, end - begin, pool.is_small))

    def _hand_out(self, pool: _Pool, block: _Block, size: int) -> None:
        """alloc_found_block: split off the remainder if should_split(), mark in use."""
        remaining = block.size - size
        if pool.is_small or self._expandable:
            split = remaining >= MIN_BLOCK_SIZE  # should_split: down to kMinBlockSize
        else:  # large blocks only when the remainder is itself a large block (> kSmallSize)
            split = remaining > SMALL_SIZE and (self._max_split is None or size < self._max_split)
        if split:
            rest = _Block(block.address + size, remaining, pool.is_small, stream=block.stream)
            rest.prev = block
            rest.next = block.next
            if block.next is not None:
                block.next.prev = rest
            block.next = rest
            block.size = size
            pool.insert(rest)
        block.allocated = True
        self._active[block.address] = block
        self._allocated += block.size
        if self._allocated > self._peak_allocated:
            self._peak_allocated = self._allocated
        self._num_allocs += 1
