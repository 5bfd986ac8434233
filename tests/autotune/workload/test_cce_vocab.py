"""Cut Cross-Entropy over a tensor-parallel lm_head (workload/cce_vocab.py): the fork's apply_lce
takes a vocabulary-sharded DTensor classifier to its local rows and runs vocabulary-parallel."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from autotune.errors import JobFails
from autotune.workload.cce import linear_cross_entropy
from autotune.workload.cce_vocab import VocabShard, local_classifier, partition

ROWS, SEQ, HIDDEN, VOCAB = 2, 16, 24, 40


class Outputs(TorchDispatchMode):
    """Every op's output (shape, dtype): the tensors the emulation makes."""

    def __init__(self) -> None:
        super().__init__()
        self.made: list[tuple[tuple[int, ...], torch.dtype]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if isinstance(out, torch.Tensor):
            self.made.append((tuple(out.shape), out.dtype))
        return out


def _inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    e = torch.randn(ROWS, SEQ, HIDDEN, dtype=torch.bfloat16, requires_grad=True)
    c = torch.randn(VOCAB, HIDDEN, dtype=torch.bfloat16, requires_grad=True)
    return e, c, torch.randint(0, VOCAB, (ROWS, SEQ))


def test_a_shard_of_the_whole_vocabulary_gives_the_plain_loss_and_gradients():
    e, c, targets = _inputs()
    plain = linear_cross_entropy(e, c, targets)
    parallel = linear_cross_entropy(e, c, targets, vocab=VocabShard(0, VOCAB))
    assert torch.equal(plain, parallel)
    for one, other in zip(torch.autograd.grad(plain, (e, c)), torch.autograd.grad(parallel, (e, c)),
                          strict=True):
        assert torch.equal(one, other)


def test_a_rank_s_rows_give_the_gradient_of_its_classifier_rows():
    # rank 0 of 2 holds rows [0, 20): its dc is the whole loss's dc of those rows where the logsumexp
    # is its own (the fake group reduces nothing), so compare against the loss over those rows only,
    # the targets it does not hold padded out of its softmax's gradient
    e, c, targets = _inputs()
    mine = targets < VOCAB // 2
    local = c[:VOCAB // 2].detach().requires_grad_()
    loss = linear_cross_entropy(e, local, targets, vocab=VocabShard(0, VOCAB // 2))
    logits = e[:, :-1].float() @ local.float().t()
    lse = logits.logsumexp(-1)
    picked = logits.gather(-1, targets[:, 1:].clamp(max=VOCAB // 2 - 1).unsqueeze(-1)).squeeze(-1)
    expected = (lse - picked * mine[:, 1:]).mean()
    assert torch.allclose(loss, expected, rtol=1e-4)
    grad, = torch.autograd.grad(loss, local)
    want, = torch.autograd.grad(expected, local)
    assert torch.allclose(grad.float(), want.float(), atol=2e-2)


def test_vocabulary_parallel_makes_the_fork_s_extra_buffers():
    # vp_reduce_e_grad copies de to float32 and back; the backward's targets are a [T] int64 where;
    # the forward scatters the held rows' dots into a [N] float32 buffer and copies it to reduce it
    e, c, targets = _inputs()
    made = {}
    for shard in (None, VocabShard(0, VOCAB // 2)):
        weight = c if shard is None else c[:VOCAB // 2].detach().requires_grad_()
        with Outputs() as outputs:
            loss = linear_cross_entropy(e, weight, targets, vocab=shard)
            torch.autograd.grad(loss, (e, weight))
        made[shard is not None] = outputs.made
    de_copy = ((ROWS * SEQ, HIDDEN), torch.float32)
    assert de_copy not in made[False]
    assert de_copy in made[True]
    assert made[True].count(((ROWS * SEQ, HIDDEN), torch.bfloat16)) \
        == made[False].count(((ROWS * SEQ, HIDDEN), torch.bfloat16)) + 1  # type_as(de)
    assert made[True].count(((ROWS * SEQ,), torch.int64)) > made[False].count(((ROWS * SEQ,), torch.int64))
    dc = ((VOCAB // 2, HIDDEN), torch.bfloat16)
    assert dc in made[True] and ((VOCAB, HIDDEN), torch.bfloat16) not in made[True]


def _sharded(vocab: int, tp: int) -> Any:
    from torch.distributed.tensor import Shard, distribute_tensor

    from autotune.backends.distributed import _mesh

    mesh = _mesh((tp,), "cpu", ("tp",))
    return distribute_tensor(torch.zeros(vocab, HIDDEN), mesh, [Shard(0)])


def test_a_vocabulary_sharded_classifier_is_taken_to_rank_0_s_rows():
    local, shard = local_classifier(_sharded(VOCAB, 2))
    assert local.shape == (VOCAB // 2, HIDDEN)
    assert shard is not None and (shard.start, shard.stop) == (0, VOCAB // 2)
    plain = torch.zeros(VOCAB, HIDDEN)
    assert local_classifier(plain) == (plain, None)


def test_a_vocabulary_torch_and_the_fork_split_differently_fails_as_the_fork_does():
    # 10 rows on 4 ranks: torch's Shard(0) gives 3, 3, 3, 1; partition_n_into_range 3, 3, 2, 2
    assert [partition(10, rank, 4) for rank in range(4)] == [(0, 3), (3, 6), (6, 8), (8, 10)]
    with pytest.raises(JobFails, match=r"rank 2 holds 3 rows.*Expected c.size\(0\) to be 2, got 3"):
        local_classifier(_sharded(10, 4))
