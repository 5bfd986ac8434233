"""The cross-block buffers of CUDA's reduction kernels (a bias gradient's sum), for the estimator.

A sum or mean on CUDA runs ``gpu_reduce_kernel`` (pytorch/pytorch
aten/src/ATen/native/cuda/Reduce.cuh). Where each output has many inputs and there are few outputs,
``setReduceConfig`` splits every output's inputs across ``ctas_per_output`` thread blocks, and the
partial results meet in a staging buffer: the kernel takes ``ReduceConfig::global_memory_size()``
bytes and a semaphore per block column (``semaphore_size()``) from the caching allocator, after the
output, and gives both back once the kernel is queued. Nothing on the CPU allocates them, so the
estimator adds them (``workspaces``), for the sums autograd runs too (the bias gradient of every
``nn.Linear``: ``grad.sum(0)`` over all tokens).

Measured: an H100 80GB step of BERT-base in fp32 at batch 64 x seq 128 (8192 tokens) allocated
50,331,648 bytes then 24 bytes right after each FFN output layer's 768-float bias gradient
(docs/measurements/h100-80gb/records/bert-base-fp32-128x64.json); the peak of the step fell on one,
and ``workspace_bytes`` gives exactly (50331648, 24) for that sum. Without them the estimator was
0.8 % low on the peak of every fp32 BERT cell measured, and its max batch 1-3 % above the measured.

Their size depends on the batch through ``ctas_per_output`` (a minimum of two ratios), so it is not
affine in the batch size as every tensor's is (trace.py). A trace therefore records, for these two
allocations, the input's element count (affine) and a ``Workspace`` that turns it into bytes when
the trace is replayed: the input's outermost dimension (the batch's) sized to that count.

Left out: reductions over more than 2**31 - 1 elements (CUDA splits them into sub-iterators, each
with its own buffer, one at a time); the other reductions (max, norm, var, ...), whose buffers are
not on a training step's peak in the traces measured.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

WARP_SIZE = 32
MAX_NUM_THREADS = 512  # mnt_wrapper<T>::MAX_NUM_THREADS for every real dtype (256: complex double)
INPUT_VEC_SIZE = 4  # ReduceConfig::input_vec_size
VT0 = 4  # gpu_reduce_kernel's default values per thread and load
MIN_VALUES_PER_THREAD = 16
MAX_VALUES_PER_THREAD = 256
SEMAPHORE_BYTES = 4  # sizeof(int)
INT32_MAX = 2**31 - 1  # past it, TensorIterator::can_use_32bit_indexing is false


@dataclass(frozen=True)
class Multiprocessors:
    """What ``setReduceConfig`` reads from the device properties."""

    count: int  # multiProcessorCount
    max_threads: int  # maxThreadsPerMultiProcessor
    # False for a chip taken to be one (gpus.size_only_chip): what grows with a larger chip is sized
    # for it, what a kernel choice on it would save is not (the embedding backward: embedding.py)
    known: bool = True


@dataclass(frozen=True)
class ReduceInput:
    """A reduction as CUDA's TensorIterator sees it: (size, stride in elements, reduced) per dim,
    reduced dims first, each group fastest first, adjacent dims coalesced; size-1 dims dropped.

    The outermost dim (the largest stride: the batch's) is stored with size 1, its size being the
    reduction's element count over the others' (``sized``): a reduction that differs only in the
    batch size is the same ReduceInput, as traces at two batch sizes need (trace.py).
    """

    dims: tuple[tuple[int, int, bool], ...]
    acc_bytes: int  # sizeof(arg_t): float for float, half and bfloat16 inputs; 8 for double

    def sized(self, numel: int) -> tuple[tuple[int, int, bool], ...]:
        """The dims of this reduction over ``numel`` elements."""
        outer = max(range(len(self.dims)), key=lambda i: self.dims[i][1])
        rest = 1
        for size, _, _ in self.dims:
            rest *= size
        dims = list(self.dims)
        _, stride, reduced = dims[outer]
        dims[outer] = (max(1, -(-numel // rest)), stride, reduced)
        return tuple(dims)


def reduce_input(tensor: torch.Tensor, dims: Any, dtype: torch.dtype | None = None) -> ReduceInput | None:
    """The TensorIterator of ``tensor.sum(dims)`` (``dims`` None or empty: every dim)."""
    import torch  # here, not above: a trace's replay (Workspace.nbytes) runs without torch

    if tensor.dim() == 0 or tensor.numel() <= 1:
        return None
    ndim = tensor.dim()
    listed = [dims] if isinstance(dims, int) else (dims or [])
    reduced = {d % ndim for d in listed} or set(range(ndim))
    # opmath: float for float, half and bfloat16 inputs, 8 bytes for double and int64
    acc_bytes = 8 if (dtype or tensor.dtype) in (torch.float64, torch.int64) else 4
    kept = [(tensor.shape[d], tensor.stride(d), d in reduced) for d in range(ndim) if tensor.shape[d] != 1]
    if not any(r for _, _, r in kept):
        return None  # nothing reduced: a copy, no reduction kernel
    ordered = sorted((d for d in kept if d[2]), key=lambda d: d[1]) + sorted(
        (d for d in kept if not d[2]), key=lambda d: d[1])
    coalesced: list[tuple[int, int, bool]] = []
    for size, stride, red in ordered:
        if coalesced and coalesced[-1][2] == red and coalesced[-1][0] * coalesced[-1][1] == stride:
            prev_size, prev_stride, _ = coalesced[-1]
            coalesced[-1] = (prev_size * size, prev_stride, red)
        else:
            coalesced.append((size, stride, red))
    outer = max(range(len(coalesced)), key=lambda i: coalesced[i][1])
    coalesced[outer] = (1, coalesced[outer][1], coalesced[outer][2])
    return ReduceInput(tuple(coalesced), acc_bytes)


def _last_pow2(n: int) -> int:
    return max(1, 1 << (n.bit_length() - 1)) if n > 0 else 1


def _div_up(a: int, b: int) -> int:
    return -(-a // b)


def _vectorized(dims: tuple[tuple[int, int, bool], ...], num_reduce: int, inputs_per_output: int,
                num_outputs: int) -> tuple[bool, int, int, int]:
    """(whether the reduced dims are the fastest, dim0, dim1, output_vec_size): ``setReduceConfig``'s
    block extents before ``set_block_dimension``, vectorized along the input (``input_vec_size``)
    or the output (``get_output_vec_size``) where the fastest dim is contiguous."""
    fastest = num_reduce == len(dims) or dims[0][1] < dims[num_reduce][1]
    if fastest:
        dim0, dim1, fastest_stride = inputs_per_output, num_outputs, dims[0][1]
    else:
        dim0, dim1, fastest_stride = num_outputs, inputs_per_output, dims[num_reduce][1]
    output_vec_size = 1
    if fastest_stride == 1:
        if fastest and dim0 > 128 and num_reduce == 1 and VT0 >= INPUT_VEC_SIZE:
            dim0 //= INPUT_VEC_SIZE  # vectorize along the input
        elif not fastest:  # vectorize along the output: get_output_vec_size (aligned storage)
            output_vec_size = 4
            for value in [dims[num_reduce][0]] + [s for i, (_, s, _) in enumerate(dims) if i != num_reduce]:
                while value % output_vec_size:
                    output_vec_size //= 2
            dim0 //= output_vec_size
    return fastest, dim0, dim1, output_vec_size


def _block_dimension(dim0: int, dim1: int, output_vec_size: int) -> tuple[int, int]:
    """(block_width, block_height): ``ReduceConfig::set_block_dimension``."""
    max_threads = MAX_NUM_THREADS // output_vec_size
    dim0_pow2 = _last_pow2(dim0) if dim0 < max_threads else max_threads
    dim1_pow2 = _last_pow2(dim1) if dim1 < max_threads else max_threads
    block_width = min(dim0_pow2, WARP_SIZE)
    block_height = min(dim1_pow2, max_threads // block_width)
    block_width = min(dim0_pow2, max_threads // block_height)
    return block_width, block_height


@functools.lru_cache(maxsize=4096)  # a trace's buffer and semaphores, replayed at every probe
def workspace_bytes(reduction: ReduceInput, numel: int, device: Multiprocessors | None) -> tuple[int, int]:
    """(staging buffer, semaphores) bytes ``gpu_reduce_kernel`` takes for ``reduction`` over
    ``numel`` elements: Reduce.cuh's ``setReduceConfig``, ``global_memory_size`` and
    ``semaphore_size``, step by step.

    ``device`` None takes the most blocks per output any card could: ``ctas_per_output`` is then
    limited by the values per thread alone, the larger buffer (the estimator always passes a chip:
    a card known only by its size is gpus.size_only_chip's; None is an upper bound for tests).
    """
    dims = reduction.sized(numel)
    if numel <= 1 or numel > INT32_MAX:
        return 0, 0
    num_reduce = sum(1 for _, _, r in dims if r)
    num_outputs = 1
    for size, _, reduced in dims:
        if not reduced:
            num_outputs *= size
    inputs_per_output = numel // num_outputs
    fastest, dim0, dim1, output_vec_size = _vectorized(dims, num_reduce, inputs_per_output, num_outputs)
    block_width, block_height = _block_dimension(dim0, dim1, output_vec_size)
    num_threads = block_width * block_height
    step_input = step_output = 1
    block_x_reduce = fastest
    if fastest:
        step_input *= block_width
    else:
        step_output *= block_width
    values_per_thread = _div_up(inputs_per_output, step_input)
    split_y = values_per_thread >= block_height * 16 or values_per_thread >= MAX_VALUES_PER_THREAD
    if split_y:
        step_input *= block_height
    else:
        step_output *= block_height
    values_per_thread = _div_up(inputs_per_output, step_input)
    grid_x = _div_up(num_outputs // output_vec_size, step_output)
    if device is None:
        target_grid = None
    else:
        target_grid = device.count * (device.max_threads // num_threads)
    if not (split_y and values_per_thread >= MAX_VALUES_PER_THREAD
            and (target_grid is None or grid_x <= target_grid)):
        return 0, 0
    by_values = _div_up(values_per_thread, MIN_VALUES_PER_THREAD)
    ctas = by_values if target_grid is None else min(_div_up(target_grid, grid_x), by_values)
    ctas = max(ctas, _div_up(values_per_thread, MAX_VALUES_PER_THREAD))
    if ctas <= 1:
        return 0, 0
    size = reduction.acc_bytes * num_outputs * ctas
    if not block_x_reduce:
        size *= block_width * output_vec_size
    return size, SEMAPHORE_BYTES * grid_x


@dataclass(frozen=True)
class Workspace:
    """One of a reduction's two allocations in a trace, whose recorded size is the reduction's
    element count; ``nbytes`` turns a count into bytes."""

    reduction: ReduceInput
    device: Multiprocessors | None
    semaphores: bool  # the semaphores, else the staging buffer

    def nbytes(self, count: int) -> int:
        buffer, semaphores = workspace_bytes(self.reduction, count, self.device)
        return semaphores if self.semaphores else buffer

    def to_json(self) -> dict[str, Any]:
        chip = self.device
        device = None if chip is None else [chip.count, chip.max_threads, chip.known]
        return {"dims": [list(dim) for dim in self.reduction.dims], "acc_bytes": self.reduction.acc_bytes,
                "device": device, "semaphores": self.semaphores}

    @classmethod
    def from_json(cls, document: Any) -> Workspace:
        dims = tuple((int(size), int(stride), bool(reduced)) for size, stride, reduced in document["dims"])
        reduction = ReduceInput(dims, int(document["acc_bytes"]))
        # [count, threads, known]; the two first alone in a trace kept before chips were assumed
        device = None if document["device"] is None else Multiprocessors(*document["device"])
        return cls(reduction, device, bool(document["semaphores"]))


@functools.cache
def _sums() -> frozenset[Any]:
    import torch

    return frozenset({torch.ops.aten.sum.default, torch.ops.aten.sum.dim_IntList,
                      torch.ops.aten.mean.default, torch.ops.aten.mean.dim})


def reduction_of(func: Any, args: Any, kwargs: Any) -> tuple[ReduceInput, int] | None:
    """The reduction an aten sum or mean runs on CUDA and its element count; None for other ops."""
    if func not in _sums() or not args:  # every op of a step passes here: the common case first
        return None
    import torch

    if not isinstance(args[0], torch.Tensor):
        return None
    dims = args[1] if len(args) > 1 else kwargs.get("dim")
    reduction = reduce_input(args[0], dims, kwargs.get("dtype"))
    return None if reduction is None else (reduction, args[0].numel())
