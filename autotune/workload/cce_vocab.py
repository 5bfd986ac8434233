"""Cut Cross-Entropy over a tensor-parallel lm_head: the fork's vocabulary-parallel path, emulated.

Under Axolotl's tensor parallelism (transformers' tp_plan, lm_head "colwise_gather_output") the
classifier is a DTensor sharded over the vocabulary on the mesh's "tp" dim. The fork's ``apply_lce``
(axolotl-ai-cloud/ml-cross-entropy@5f0c7a7, cut_cross_entropy/transformers/utils.py) takes that
branch: ``VocabParallelOptions.from_vocab(c.size(0), device_mesh.get_group("tp"),
reduce_e_grad=True)`` (vocab_parallel/utils.py: this rank's [start, stop) by
``partition_n_into_range``) and ``c.to_local()``; ``linear_cross_entropy`` then checks
``c.size(0) == stop - start`` and ``LinearCrossEntropyFunction`` (cce.py) runs its kernels on the
local rows, reducing across the tp group what needs the whole vocabulary:

    forward:  ``vp_reduce_lse`` (torch.compile'd: a clone, exp, log of [N] float32), then the rows
              whose target this rank holds (``nonzero`` of a range test), their negative dot
              ([K] float32), scattered into a [N] float32 zero buffer that ``vp_reduce_correct_logit``
              copies (``.to(copy=True)``) and all-reduces;
    backward: ``targets - start`` where this rank holds the target, ``c.size(0) + 1`` (padding)
              elsewhere (a [T] int64 ``torch.where``), the kernel's de [rows, D] and dc [V/tp, D],
              then ``vp_reduce_e_grad`` (torch.compile'd): de copied to float32, all-reduced, cast back.

The fake process group's collectives move nothing (backends/distributed.py): the buffers are made as
the source makes them, the values are rank 0's own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from autotune.errors import JobFails

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class VocabShard:
    """This rank's rows [start, stop) of the classifier (VocabParallelOptions), and its tp group."""

    start: int
    stop: int
    group: Any = None  # the tp dim's ProcessGroup (the real path's all-reduces)


def partition(vocab: int, rank: int, world: int) -> tuple[int, int]:
    """vocab_parallel/utils.py ``partition_n_into_range``: the first ``vocab % world`` ranks one more."""
    start = rank * (vocab // world) + min(rank, vocab % world)
    return start, start + vocab // world + (1 if rank < vocab % world else 0)


def local_classifier(c: Any) -> tuple[Any, VocabShard | None]:
    """``apply_lce``'s DTensor branch: the local rows of ``c`` and, where its first placement shards
    it (the vocabulary), this rank's range; a plain tensor as it is. Every rank's piece of a
    ``Shard(0)`` DTensor (torch's chunking: ceil(V / tp) rows to each rank but the last) is checked
    against the fork's partition, as ``linear_cross_entropy`` checks it on each rank."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor, Shard

    if not isinstance(c, DTensor):
        return c, None
    if not isinstance(c.placements[0], Shard):
        return c.to_local(), None
    group = c.device_mesh.get_group("tp")
    vocab, world = c.size(0), dist.get_world_size(group)
    chunk = -(-vocab // world)  # torch.chunk's rows per rank (DTensor Shard._split_tensor)
    for rank in range(world):
        start, stop = partition(vocab, rank, world)
        held = max(0, min(chunk, vocab - rank * chunk))
        if held != stop - start:
            raise JobFails(f"Cut Cross-Entropy over a tensor-parallel lm_head of {vocab} rows on {world} "
                           f"ranks: rank {rank} holds {held} rows, and the fork's linear_cross_entropy "
                           f"raises \"Expected c.size(0) to be {stop - start}, got {held}.\" "
                           "(linear_cross_entropy.py, VocabParallelOptions.from_vocab's partition)")
    start, stop = partition(vocab, dist.get_rank(group), world)
    return c.to_local(), VocabShard(start, stop, group)


def reduce_lse(lse: torch.Tensor) -> torch.Tensor:
    """``vp_reduce_lse``: ``lse_max = lse.clone()`` (all-reduced MAX), ``(lse - lse_max).exp()``
    (all-reduced SUM), ``lse_max + lse.log()``; inductor fuses each step's pointwise ops into one
    [N] float32 buffer."""
    lse_max = lse.clone()
    summed = (lse - lse_max).exp()
    return lse_max + summed.log()


def held_rows(targets: torch.Tensor, valids: torch.Tensor, shard: VocabShard,
              count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The forward's rows whose target this rank holds: ``targets[valids + shift]``, the range test,
    ``.nonzero().to(torch.int32)`` squeezed (``vp_valids``), and ``valids[vp_valids]``
    (``neg_dot_valids``). ``nonzero`` sized by ``count``: a fake tensor cannot count, and the
    estimator takes the rank that holds every label (cce.py ``_valid_count``)."""
    import torch

    labelled = targets[valids + 1]
    mask = (labelled >= shard.start) & (labelled < shard.stop)
    vp_valids = torch.nonzero_static(mask, size=count).to(torch.int32).squeeze(-1)
    return vp_valids, valids[vp_valids]


def gather_neg_dot(neg_dot: torch.Tensor, vp_valids: torch.Tensor, rows: int) -> torch.Tensor:
    """``global_neg_dot = neg_dot.new_zeros(lse.size())``, its held rows set, then
    ``vp_reduce_correct_logit``'s ``.to(dtype, copy=True)`` (all-reduced SUM)."""
    whole = neg_dot.new_zeros((rows,))
    whole[vp_valids] = neg_dot
    return whole.to(dtype=whole.dtype, copy=True)


def local_targets(targets: torch.Tensor, shard: VocabShard, rows: int) -> torch.Tensor:
    """The backward's targets: ``targets - start`` where held, ``c.size(0) + 1`` (the kernel's
    padding value) elsewhere (cce.py ``LinearCrossEntropyFunction.backward``)."""
    import torch

    mine = (targets >= shard.start) & (targets < shard.stop)
    return torch.where(mine, targets - shard.start, targets.new_full((), rows + 1))


def reduce_e_grad(de: torch.Tensor) -> torch.Tensor:
    """``vp_reduce_e_grad`` (cce_backward.py ``cce_backward_kernel``'s end): de copied to float32,
    all-reduced SUM across the tp group, then ``type_as(de)``."""
    import torch

    reduced = de.to(dtype=torch.float32, copy=True)
    return reduced.type_as(de)
