"""What CUDA's embedding backward allocates besides the gradient, for the estimator.

``embedding_dense_backward_cuda`` (aten/src/ATen/native/cuda/Embedding.cu) takes a kernel that
accumulates into the gradient directly for up to 3072 indices (and no ``scale_grad_by_freq``);
for more it sorts the indices and sums the gradient rows in partial segments of up to
``NROWS_PER_THREAD`` rows (EmbeddingBackwardKernel.cu, ``embedding_backward_cuda_kernel``). Without
a device-to-host sync it sizes its buffers for the worst case:

    max_segments        = min(indices, num_weights)
    max_partial_segment = indices / NROWS_PER_THREAD + max_segments
    partial_segment_offset   int64 [max_partial_segment]

then takes one of two paths (PyTorch 2.11 and later: pytorch/pytorch#172454; before, always the
two-pass one):

- two-pass (``compute_grad_weight`` + ``sum_and_scatter``): ``grad_weight_per_segment``
  [max_partial_segment, embedding_dim] in float32 for 16-bit gradients, else the gradient's dtype;
- fused (``compute_grad_weight_atomic_accumulate``), where ``sum_and_scatter`` would run too few
  thread blocks: its grid, ``ceil(max_segments * stride_warped / block)``, below 4 per
  multiprocessor (``MAX_ATOMIC_ACCUM_BLOCKS_PER_SM``) and ``max_partial_segment`` above 4 times it,
  deterministic algorithms off: ``partial_to_segment_idx`` int64 [max_partial_segment], and for a
  16-bit gradient a float32 copy of the gradient to add into (``grad_weight_acc``, zeros).

All are freed as the kernel returns, in the reverse order, after the gradient itself is
allocated. The CPU's kernel has none of them. Measured on an H100 (132 multiprocessors, PyTorch
2.11, docs/measurements/h100-80gb/records): BERT-base's word embeddings (30522 rows, two-pass) at
8192 tokens in float32 allocated 72,088 B and 27,681,792 B (9011 rows of 768 float32), at 16,384
tokens under amp 55,363,584 B, each right after the 93,763,584 B gradient; its token type
embeddings (2 rows: a grid of 2 blocks, fused) no block of a MiB or more, where the two-pass
kernel would have taken 2.41 and 4.80 MiB. The int64 scratch of the sort (a few times 8 B per
index) is left out.

Their sizes are not affine in the batch (an integer division, a minimum, and none up to 3072
indices): like a reduction's buffers (reduce.py) a trace records the index count, even where they
take 0 bytes, and ``EmbeddingPartials`` turns it into bytes. On a card whose multiprocessor count
is unknown (one given only by its size) the two-pass kernel is assumed: it never takes less.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

DIRECT_MAX_INDICES = 3072  # Embedding.cu: num_indices <= 3072 && !scale_grad_by_freq
NROWS_PER_THREAD = 10  # EmbeddingBackwardKernel.cu
MAX_ATOMIC_ACCUM_BLOCKS_PER_SM = 4  # EmbeddingBackwardKernel.cu: the fused kernel below this
WARP_SIZE = 32  # at::cuda::warp_size() on NVIDIA GPUs
MAX_BLOCK_SIZE = 1024  # SortingCommon.cuh
INDEX_BYTES = 8  # the sorted indices are int64 (orig_indices.options())
BUFFERS = ("offsets", "sums", "accumulator")  # in the order the kernel allocates them


@dataclass(frozen=True)
class EmbeddingPartials:
    """One of the three buffers (``BUFFERS``) of an embedding backward over ``num_weights`` rows of
    ``embedding_dim`` elements of ``grad_bytes`` bytes each; ``nbytes`` takes the number of indices.

    offsets: ``partial_segment_offset``; sums: ``grad_weight_per_segment`` (two-pass) or
    ``partial_to_segment_idx`` (fused); accumulator: the fused kernel's ``grad_weight_acc``.
    """

    num_weights: int
    embedding_dim: int
    grad_bytes: int  # the gradient's element size
    direct_max: int  # up to this many indices the kernel needs none (0 with scale_grad_by_freq)
    multiprocessors: int | None  # the device's; None: unknown, the two-pass kernel assumed
    buffer: str  # one of BUFFERS

    def fused(self, indices: int) -> bool:
        """Whether ``indices`` indices take the fused kernel (the module's docstring)."""
        if self.multiprocessors is None:
            return False
        stride_warped = -(-self.embedding_dim // WARP_SIZE) * WARP_SIZE
        block = min(stride_warped, MAX_BLOCK_SIZE)
        max_segments = min(indices, self.num_weights)
        sum_scatter_grid = -(-max_segments * stride_warped // block)
        max_partial_segment = indices // NROWS_PER_THREAD + max_segments
        return (sum_scatter_grid < self.multiprocessors * MAX_ATOMIC_ACCUM_BLOCKS_PER_SM
                and max_partial_segment > sum_scatter_grid * 4)

    def nbytes(self, indices: int) -> int:
        if indices <= self.direct_max:
            return 0
        rows = indices // NROWS_PER_THREAD + min(indices, self.num_weights)
        opmath_bytes = max(self.grad_bytes, 4)  # acc_type: float for half, bfloat16 and float
        if self.buffer == "offsets":
            return rows * INDEX_BYTES
        fused = self.fused(indices)
        if self.buffer == "sums":
            return rows * INDEX_BYTES if fused else rows * self.embedding_dim * opmath_bytes
        if fused and self.grad_bytes < opmath_bytes:
            return self.num_weights * self.embedding_dim * opmath_bytes
        return 0

    def to_json(self) -> dict[str, Any]:
        return {"kind": KIND, "num_weights": self.num_weights, "embedding_dim": self.embedding_dim,
                "grad_bytes": self.grad_bytes, "direct_max": self.direct_max,
                "multiprocessors": self.multiprocessors, "buffer": self.buffer}

    @classmethod
    def from_json(cls, document: Any) -> EmbeddingPartials:
        found = document["multiprocessors"]
        return cls(int(document["num_weights"]), int(document["embedding_dim"]),
                   int(document["grad_bytes"]), int(document["direct_max"]),
                   None if found is None else int(found), str(document["buffer"]))


KIND = "embedding_partials"  # marks these among a trace's workspaces (backend.workspace_from_json)


def partial_sums(grad_output: Any, num_weights: int, scale_grad_by_freq: bool,
                 multiprocessors: int | None = None) -> tuple[EmbeddingPartials, ...]:
    """The buffers of ``embedding_dense_backward(grad_output, indices, num_weights, ...)`` on a
    CUDA device of ``multiprocessors`` multiprocessors, in the order it allocates them; their sizes
    follow from the number of indices."""
    direct_max = 0 if scale_grad_by_freq else DIRECT_MAX_INDICES
    return tuple(
        EmbeddingPartials(num_weights, int(grad_output.shape[-1]), grad_output.dtype.itemsize, direct_max,
                          multiprocessors, buffer)
        for buffer in BUFFERS
    )
