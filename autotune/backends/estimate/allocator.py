"""A pure-Python simulator of PyTorch's CUDA caching allocator.

It replays malloc/free events and reports what `torch.cuda.memory_allocated()` and
`torch.cuda.memory_reserved()` would read on a GPU, and whether an allocation would
raise `torch.OutOfMemoryError`, without touching CUDA (or torch).

Source: pytorch/pytorch `c10/cuda/CUDACachingAllocator.cpp`, class
`DeviceCachingAllocator` (read at commit 001074d25084fdb87a799823e395a50f5ec044d3),
with the default `PYTORCH_CUDA_ALLOC_CONF`. Each rule below names the C++ function
it mirrors, so it can be checked against newer releases:

- `round_size`: requests round up to a multiple of 512 bytes, at least 512.
- `get_pool`: rounded sizes <= 1 MiB live in the small pool, the rest in the large one.
- `get_allocation_size`: the size of a new segment (one `cudaMalloc`).
- `get_free_block`: best fit, the smallest free block of the pool with size >= request;
  the pool is a `std::set` ordered by (stream, size, address), so ties go to the
  lowest address.
- `should_split` / `alloc_found_block`: split off the remainder, or hand out the
  whole block (`memory_allocated` then counts the whole block).
- `free_block` / `try_merge_blocks`: a freed block merges with free neighbours of
  its own segment and goes back to its pool.
- `malloc` / `alloc_block` / `release_cached_blocks`: when no free block fits, a new
  segment is allocated; if that exceeds the capacity, every cached segment with no
  block in use is released (`cudaFree`) and the allocation retried once; if it still
  fails, the allocator raises out-of-memory. `empty_cache` is `release_cached_blocks`.

Deliberately left out (none applies with the default settings and one stream):

- several streams, `record_stream` and its CUDA events: a freed block is reusable at
  once, as it is for a tensor used only on the current stream;
- `max_split_size_mb`: `get_free_block` refuses oversize cached blocks for smaller
  large-pool requests, `should_split` never splits them and
  `release_available_cached_blocks` frees them one by one before the full release;
  by default max_split_size is SIZE_MAX, so none of that can trigger;
- `roundup_power2_divisions` in `round_size`, `expandable_segments`,
  `garbage_collection_threshold` (only active with a memory fraction), CUDA-graph
  private pools, and `trigger_free_memory_callbacks`;
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
  the one release recorded (the QLoRA step's) was not reused.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from autotune.errors import OutOfMemory

# Constants of CUDACachingAllocator.cpp, named and quoted from there.
# kMinBlockSize: "all sizes are rounded to at least 512 bytes"
MIN_BLOCK_SIZE = 512
# kSmallSize: "largest 'small' allocation is 1 MiB"
SMALL_SIZE = 1_048_576
# kSmallBuffer: "'small' allocations are packed in 2 MiB blocks"
SMALL_BUFFER = 2_097_152
# kMinLargeAlloc: "allocations between 1 and 10 MiB may use kLargeBuffer"
MIN_LARGE_ALLOC = 10_485_760
# kLargeBuffer: "'large' allocations may be packed in 20 MiB blocks"
LARGE_BUFFER = 20_971_520
# kRoundLarge: "round up large allocations to 2 MiB"
ROUND_LARGE = 2_097_152

# Handle of a 0-byte allocation: the real allocator returns a null pointer and no block.
NULL_HANDLE = 0
# Fake address above the first segment: segments go down from it (see the module's docstring);
# any 512-aligned value far above what a replay cudaMallocs in all would do.
_TOP_ADDRESS = 1 << 56


def round_size(nbytes: int) -> int:
    """Bytes a request really takes: a multiple of 512, at least 512."""
    if nbytes < MIN_BLOCK_SIZE:
        return MIN_BLOCK_SIZE
    return MIN_BLOCK_SIZE * ((nbytes + MIN_BLOCK_SIZE - 1) // MIN_BLOCK_SIZE)


def segment_size(rounded: int) -> int:
    """Bytes `cudaMalloc`'d for a new segment serving a request of `rounded` bytes."""
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
    reserved_bytes: int  # sum of segment sizes (torch.cuda.memory_reserved)
    peak_allocated_bytes: int  # since creation or the last reset_peak()
    peak_reserved_bytes: int
    num_allocs: int  # successful non-empty mallocs so far ("allocation.all.allocated")
    num_segments: int  # current segments ("segment.all.current")
    num_ooms: int  # OutOfMemory raised; a caller that stops at the first sees 0 or 1


@dataclass(frozen=True)
class BlockInfo:
    """One block of a segment in a snapshot()."""

    address: int
    size: int  # bytes
    allocated: bool


@dataclass(frozen=True)
class SegmentInfo:
    """One cudaMalloc'd segment in a snapshot()."""

    address: int
    size: int  # bytes
    is_small: bool
    blocks: tuple[BlockInfo, ...]  # in address order, covering the segment


class _Block:
    """A piece of a segment, linked to its neighbours like Block::prev / Block::next."""

    __slots__ = ("address", "allocated", "is_small", "next", "prev", "size")

    def __init__(self, address: int, size: int, is_small: bool) -> None:
        self.address = address
        self.size = size
        self.is_small = is_small
        self.allocated = False
        self.prev: _Block | None = None
        self.next: _Block | None = None


class _Pool:
    """The free blocks of one BlockPool, searchable by (size, address) in O(log n)."""

    def __init__(self, is_small: bool) -> None:
        self.is_small = is_small
        # Sorted (size, address), the order of BlockComparatorSize for one stream.
        self._keys: list[tuple[int, int]] = []
        self._blocks: dict[int, _Block] = {}  # address -> free block
        # Free blocks with no neighbour are whole segments: what release_blocks() frees.
        # Blocks gain or lose neighbours only while out of the pool: this stays exact.
        self.whole_segments: dict[int, _Block] = {}

    def insert(self, block: _Block) -> None:
        bisect.insort(self._keys, (block.size, block.address))
        self._blocks[block.address] = block
        if block.prev is None and block.next is None:
            self.whole_segments[block.address] = block

    def remove(self, block: _Block) -> None:
        key = (block.size, block.address)
        del self._keys[bisect.bisect_left(self._keys, key)]
        del self._blocks[block.address]
        self.whole_segments.pop(block.address, None)

    def best_fit(self, size: int) -> _Block | None:
        """The smallest free block of at least `size` bytes, lowest address first."""
        # The search key has a null pointer, like AllocParams::search_key.
        i = bisect.bisect_left(self._keys, (size, 0))
        if i == len(self._keys):
            return None
        return self._blocks[self._keys[i][1]]

    def blocks(self) -> list[_Block]:
        return list(self._blocks.values())


class CachingAllocatorSim:
    """One device's caching allocator with default settings and a single stream."""

    def __init__(self, capacity_bytes: int | None = None) -> None:
        # What cudaMalloc can hand out in all (None: unlimited); alloc_block makes
        # the same check for torch.cuda.set_per_process_memory_fraction.
        if capacity_bytes is not None and capacity_bytes < 0:
            raise ValueError(f"capacity_bytes must be >= 0, got {capacity_bytes}")
        self.capacity_bytes = capacity_bytes
        self._small = _Pool(is_small=True)
        self._large = _Pool(is_small=False)
        self._active: dict[int, _Block] = {}  # handle (= block address) -> block in use
        self._lowest_address = _TOP_ADDRESS  # of the segments cudaMalloc'd so far
        self._allocated = 0
        self._reserved = 0
        self._peak_allocated = 0
        self._peak_reserved = 0
        self._num_allocs = 0
        self._num_segments = 0
        self._num_ooms = 0

    def malloc(self, nbytes: int) -> int:
        """Allocate `nbytes`; return a handle for free(). Raises OutOfMemory."""
        if nbytes < 0:
            raise ValueError(f"nbytes must be >= 0, got {nbytes}")
        if nbytes == 0:
            return NULL_HANDLE
        size = round_size(nbytes)
        pool = self._small if size <= SMALL_SIZE else self._large
        block = pool.best_fit(size)
        if block is not None:
            pool.remove(block)
        else:
            block = self._new_segment(pool, nbytes, size)
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
        prev, nxt = block.prev, block.next
        if prev is not None and not prev.allocated:  # [prev block] -> [block]
            pool.remove(prev)
            block.address = prev.address
            block.size += prev.size
            block.prev = prev.prev
            if block.prev is not None:
                block.prev.next = block
        if nxt is not None and not nxt.allocated:  # [block nxt] -> [block]
            pool.remove(nxt)
            block.size += nxt.size
            block.next = nxt.next
            if block.next is not None:
                block.next.prev = block
        pool.insert(block)

    def empty_cache(self) -> None:
        """Release every segment with no block in use (torch.cuda.empty_cache)."""
        for pool in (self._large, self._small):  # release_cached_blocks' order
            for block in list(pool.whole_segments.values()):
                pool.remove(block)
                self._reserved -= block.size
                self._num_segments -= 1

    def reset_peak(self) -> None:
        """Peaks start again from the current figures (reset_peak_memory_stats)."""
        self._peak_allocated = self._allocated
        self._peak_reserved = self._reserved

    @property
    def reserved_bytes(self) -> int:
        """stats.reserved_bytes, without building the stats."""
        return self._reserved

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
        """This allocator's state, block for block, under another capacity: where a run with a limit
        has not yet reached it, it is the same as one without (replay.replay starts there)."""
        other = CachingAllocatorSim(capacity_bytes)
        copies: dict[int, _Block] = {}

        def copy(block: _Block) -> _Block:
            found = copies.get(id(block))
            if found is None:
                found = copies[id(block)] = _Block(block.address, block.size, block.is_small)
                found.allocated = block.allocated
            return found

        for mine, theirs in ((self._small, other._small), (self._large, other._large)):
            theirs._keys = list(mine._keys)
            theirs._blocks = {address: copy(block) for address, block in mine._blocks.items()}
            theirs.whole_segments = {address: copy(block) for address, block in mine.whole_segments.items()}
        other._active = {handle: copy(block) for handle, block in self._active.items()}
        every = [*self._active.values(), *self._small._blocks.values(), *self._large._blocks.values()]
        for original in every:
            twin = copy(original)
            twin.prev = copy(original.prev) if original.prev is not None else None
            twin.next = copy(original.next) if original.next is not None else None
        other._lowest_address = self._lowest_address
        other._allocated, other._reserved = self._allocated, self._reserved
        other._peak_allocated, other._peak_reserved = self._peak_allocated, self._peak_reserved
        other._num_allocs, other._num_segments, other._num_ooms = (
            self._num_allocs, self._num_segments, self._num_ooms)
        return other

    def snapshot(self) -> list[SegmentInfo]:
        """Every segment and its blocks by address, like torch.cuda.memory_snapshot."""
        blocks = [*self._active.values(), *self._small.blocks(), *self._large.blocks()]
        segments = []
        heads = sorted((b for b in blocks if b.prev is None), key=lambda b: b.address)
        for head in heads:
            infos = []
            block: _Block | None = head
            while block is not None:
                infos.append(BlockInfo(block.address, block.size, block.allocated))
                block = block.next
            size = sum(info.size for info in infos)
            info = SegmentInfo(head.address, size, head.is_small, tuple(infos))
            segments.append(info)
        return segments

    def _new_segment(self, pool: _Pool, nbytes: int, size: int) -> _Block:
        """cudaMalloc a segment for `size` bytes; on failure empty the cache, retry."""
        alloc_size = segment_size(size)
        capacity = self.capacity_bytes
        if capacity is not None and self._reserved + alloc_size > capacity:
            # release_available_cached_blocks() returns false at once by default
            # (it frees only oversize blocks): malloc() goes to release_cached_blocks().
            self.empty_cache()
            if self._reserved + alloc_size > capacity:
                self._num_ooms += 1
                raise OutOfMemory(
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
        block = _Block(self._segment_address(alloc_size), alloc_size, pool.is_small)
        self._reserved += alloc_size
        self._peak_reserved = max(self._peak_reserved, self._reserved)
        self._num_segments += 1
        return block

    def _segment_address(self, alloc_size: int) -> int:
        """Where cudaMalloc puts a new segment: below every earlier one (top-down)."""
        self._lowest_address -= alloc_size
        return self._lowest_address

    def _hand_out(self, pool: _Pool, block: _Block, size: int) -> None:
        """alloc_found_block: split off the remainder if should_split(), mark in use."""
        remaining = block.size - size
        # should_split(): small blocks split down to kMinBlockSize; large blocks only
        # when the remainder is itself a large block (> kSmallSize).
        split = remaining >= MIN_BLOCK_SIZE if pool.is_small else remaining > SMALL_SIZE
        if split:
            rest = _Block(block.address + size, remaining, pool.is_small)
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
        self._peak_allocated = max(self._peak_allocated, self._allocated)
        self._num_allocs += 1
