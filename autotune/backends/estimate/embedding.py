"""What CUDA's embedding backward allocates besides the gradient, for the estimator.

``embedding_dense_backward_cuda`` (aten/src/ATen/native/cuda/Embedding.cu) takes a kernel that
accumulates into the gradient directly for up to 3072 indices (and no ``scale_grad_by_freq``);
for more it sorts the indices and sums the gradient rows in partial segments of up to
``NROWS_PER_THREAD`` rows (EmbeddingBackwardKernel.cu, ``embedding_backward_cuda_kernel``). Without
a device-to-host sync it sizes those buffers for the worst case:

    max_segments        = min(indices, num_weights)
    max_partial_segment = indices / NROWS_PER_THREAD + max_segments
    partial_segment_offset   int64 [max_partial_segment]
    grad_weight_per_segment  [max_partial_segment, embedding_dim] in float32 for 16-bit gradients,
                             else in the gradient's dtype

both freed as the kernel returns, after the gradient itself is allocated. The CPU's kernel has
none of them. Measured on an H100 (PyTorch 2.11, docs/measurements/h100-80gb/records): BERT-base's
word embeddings at 8192 tokens in float32 allocated 72,088 B and 27,681,792 B (9011 rows of 768
float32), at 16,384 tokens under amp 55,363,584 B, each right after the 93,763,584 B gradient.
The int64 scratch of the sort (a few times 8 B per index) is left out.

Their sizes are not affine in the batch (an integer division, a minimum, and none up to 3072
indices): like a reduction's buffers (reduce.py) a trace records the index count, even where they
take 0 bytes, and ``EmbeddingPartials`` turns it into bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

DIRECT_MAX_INDICES = 3072  # Embedding.cu: num_indices <= 3072 && !scale_grad_by_freq
NROWS_PER_THREAD = 10  # EmbeddingBackwardKernel.cu
INDEX_BYTES = 8  # the sorted indices are int64 (orig_indices.options())


@dataclass(frozen=True)
class EmbeddingPartials:
    """One of the two buffers, of an embedding of ``num_weights`` rows of ``row_bytes`` bytes in the
    partial sums' dtype; ``nbytes`` takes the number of indices."""

    num_weights: int
    row_bytes: int  # embedding_dim x the partial sums' element size
    direct_max: int  # up to this many indices the kernel needs neither (0 with scale_grad_by_freq)
    sums: bool  # grad_weight_per_segment, else partial_segment_offset

    def nbytes(self, indices: int) -> int:
        if indices <= self.direct_max:
            return 0
        rows = indices // NROWS_PER_THREAD + min(indices, self.num_weights)
        return rows * (self.row_bytes if self.sums else INDEX_BYTES)

    def to_json(self) -> dict[str, Any]:
        return {"kind": KIND, "num_weights": self.num_weights, "row_bytes": self.row_bytes,
                "direct_max": self.direct_max, "sums": self.sums}

    @classmethod
    def from_json(cls, document: Any) -> EmbeddingPartials:
        return cls(int(document["num_weights"]), int(document["row_bytes"]), int(document["direct_max"]),
                   bool(document["sums"]))


KIND = "embedding_partials"  # marks these among a trace's workspaces (backend.workspace_from_json)


def partial_sums(grad_output: Any, num_weights: int, scale_grad_by_freq: bool
                 ) -> tuple[EmbeddingPartials, EmbeddingPartials]:
    """The two buffers of ``embedding_dense_backward(grad_output, indices, num_weights, ...)`` on
    CUDA, in the order it allocates them; their sizes follow from the number of indices."""
    import torch

    dtype = grad_output.dtype
    partial = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    row_bytes = grad_output.shape[-1] * partial.itemsize
    direct_max = 0 if scale_grad_by_freq else DIRECT_MAX_INDICES
    return (EmbeddingPartials(num_weights, row_bytes, direct_max, sums=False),
            EmbeddingPartials(num_weights, row_bytes, direct_max, sums=True))
