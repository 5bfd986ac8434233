"""Cut Cross-Entropy as Axolotl's CutCrossEntropyPlugin runs it, emulated: its memory, loss and gradients.

Axolotl (src/axolotl/integrations/cut_cross_entropy/__init__.py) installs its fork of Apple's
package, axolotl-ai-cloud/ml-cross-entropy at 5f0c7a7 (the commit read here), and ``cce_patch``
replaces ``<Model>ForCausalLM.forward`` by ``cce_forward`` (transformers/llama.py, the generic patch
of every model type without its own): the base model's last hidden states and ``lm_head.weight`` go
to ``apply_lce`` (transformers/utils.py) with ``shift=True`` and no bias, ``cce_patch``'s defaults
(impl "cce", filter_eps "auto", accum_e_fp32 and accum_c_fp32 False, gradient filtering on). Its
``linear_cross_entropy`` runs ``LinearCrossEntropyFunction`` (cce.py), whose Triton kernels never
hold the logits: the forward computes each row's log-sum-exp block by block, the backward recomputes
the blocks and writes the gradients of the embeddings (e) and the classifier (c) in place.

The kernels run on a GPU only. What their Python wrappers allocate with torch is made here with the
same calls, sizes, dtypes and order (each cited below); what the kernels compute in registers is done
by torch temporaries inside ``registers()`` (the estimator: outside the caching allocator,
tracker.outside_allocator; on a CPU none, where the values are what is checked) and copied into the
buffers the kernels write. Gradient filtering (``filter_eps``) skips blocks whose softmax is below
eps: it changes the gradients' values by less than eps, never memory; the gradients here are exact.

Memory, with N the labelled tokens after the shift, V the vocabulary, D the hidden size:
    forward, kept for backward:  lse [N] float32, valids [N] int64, logit_avg [V] float32 (and e,
                                 c, the labels themselves: no copy)
    forward, freed:              locks [cdiv(N, 128)] uint32, the dot products [N] float32, the
                                 nonzero indices [N, 2] int64 and their int32 copy
    backward:                    de like e, dc like c (their dtypes), de_locks [cdiv(N, 128),
                                 cdiv(D, 64)] and dc_locks [cdiv(V, 128), cdiv(D, 64)] int32, the
                                 vocabulary ordering (argsort of logit_avg) [V] int32
where Liger's fused loss (workload/loss.py) holds a chunk of logits and both gradient accumulators
from its forward on.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from autotune.errors import BackendUnavailable, InvalidInput, JobFails
from autotune.workload.cce_vocab import (
    VocabShard,
    gather_neg_dot,
    held_rows,
    local_classifier,
    local_targets,
    reduce_e_grad,
    reduce_lse,
)
from autotune.workload.chunks import LockRows, record
from autotune.workload.loss import IGNORE_INDEX, check_logits, lm_hidden_states

if TYPE_CHECKING:
    import torch

Registers = Callable[[], AbstractContextManager[Any]]
NAME = "cce"  # the loss's name (workload/loss.py LOSSES)
FORK = "axolotl-ai-cloud/ml-cross-entropy@5f0c7a7"  # Axolotl's pin (integrations/cut_cross_entropy)
LOCK_ROWS = 128  # rows per lock: cce_lse_forward_kernel's locks, cce_backward_kernel's de_locks
LOCK_COLS = 64  # hidden columns per lock: cce_backward_kernel's ``nd_locks = triton.cdiv(c.size(1), 64)``


def cce_lm_loss(model: Any, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The causal-LM loss of ``batch`` as the fork's ``cce_forward`` computes it with ``apply_lce``."""
    import torch

    hidden, head = lm_hidden_states(model, batch, NAME)
    # The gemma patches pass final_logit_softcapping as CCE's softcap (transformers/gemma3.py); no patch
    # applies logit_scale to the logits (cohere.py scales the hidden states first: not modelled).
    check_logits(model, NAME, modelled=("final_logit_softcapping",))
    if head.bias is not None:
        raise InvalidInput(f"loss 'cce': {type(model).__name__}'s lm_head has a bias, which the fork's "
                           "cce_forward does not pass (transformers/llama.py apply_lce)")
    # apply_lce: a classifier sharded by tensor parallelism runs vocabulary-parallel (cce_vocab.py)
    c, vocab = local_classifier(head.weight)
    if c.dtype not in (torch.float16, torch.bfloat16):
        raise JobFails(f"loss 'cce' with lm_head weights in {str(c.dtype).removeprefix('torch.')}: Cut "
                       "Cross-Entropy's backward requires bf16 or fp16 embeddings and classifier "
                       "(cce_backward.py cce_backward_kernel's asserts); load the weights in 16 bits")
    if c.dtype == torch.bfloat16 and hidden.dtype == torch.float32:
        hidden = hidden.to(c.dtype)  # apply_lce: "the case we've seen with DoRA"
    if hidden.dtype != c.dtype:
        raise JobFails(f"loss 'cce' with hidden states in {hidden.dtype} beside an lm_head in {c.dtype}: "
                       "cce_backward_kernel asserts 16-bit embeddings")
    softcap = getattr(model.config.get_text_config(), "final_logit_softcapping", None)
    return linear_cross_entropy(hidden, c, batch["labels"], softcap, vocab=vocab)


def linear_cross_entropy(e: torch.Tensor, c: torch.Tensor, targets: torch.Tensor,
                         softcap: float | None = None, *, vocab: VocabShard | None = None,
                         registers: Registers = contextlib.nullcontext) -> torch.Tensor:
    """cce.py ``cce_linear_cross_entropy`` with shift 1, reduction "mean", no bias, on e [batch, seq,
    D], c [V, D] and targets [batch, seq]. A torch function: the estimator's emulation sees the call
    and gives its ``registers`` (backends/estimate/emulation.py). On a CUDA device the fork itself
    runs, where it is installed: the cuda backend measures the real kernels. ``vocab``: c holds
    those rows of the classifier (tensor parallel, cce_vocab.py)."""
    from torch.overrides import handle_torch_function, has_torch_function

    if has_torch_function((e, c, targets)):
        return handle_torch_function(  # type: ignore[no-any-return]
            linear_cross_entropy, (e, c, targets), e, c, targets, softcap, vocab=vocab, registers=registers)
    if e.device.type == "cuda":
        return _real(e, c, targets, softcap, vocab)
    e = e.contiguous()
    targets = targets.contiguous()
    # targets' data_ptr % 16 alignment pad: a fresh tensor is aligned to 512 bytes by the caching
    # allocator, and a fake tensor has no pointer: not taken.
    valids = _build_flat_valids(targets, shift=1)
    e = e.flatten(0, -2)
    targets = targets.flatten()
    return _function().apply(e, c, targets, valids, softcap, vocab, registers)  # type: ignore[no-any-return]


def _real(e: torch.Tensor, c: torch.Tensor, targets: torch.Tensor, softcap: float | None,
          vocab: VocabShard | None) -> torch.Tensor:
    try:  # an optional package of a CUDA machine, without type information
        from cut_cross_entropy import linear_cross_entropy as real  # type: ignore[import-not-found]
    except ImportError as exc:
        raise BackendUnavailable(f"loss 'cce' on the cuda backend needs Axolotl's fork of cut-cross-entropy "
                                 f"(pip install git+https://github.com/{FORK.replace('@', '.git@')}); the "
                                 "estimate backend emulates it") from exc
    options = None
    if vocab is not None:
        from cut_cross_entropy import VocabParallelOptions

        options = VocabParallelOptions(vocab.start, vocab.stop, vocab.group, reduce_e_grad=True)
    return real(e, c, targets, shift=True, softcap=softcap,  # type: ignore[no-any-return]
                vocab_parallel_options=options)


def _valid_count(mask: torch.Tensor) -> int:
    """How many labels count. A fake tensor (the estimator) cannot answer: autotune's batches label
    every token (workload/step.py make_batch), so all of them."""
    from torch._subclasses.fake_tensor import FakeTensor

    return mask.numel() if isinstance(mask, FakeTensor) else int(mask.sum())


def _build_flat_valids(targets: torch.Tensor, shift: int) -> torch.Tensor:
    """utils.py ``_build_flat_valids`` with a shift: ``(targets[..., shift:] != ignore_index).nonzero()
    .to(torch.int32)``, the row index scaled by the row stride in place, then ``.sum(1)`` (int64): the
    flat index of each labelled target. ``nonzero`` sized by the count (``nonzero_static``: the same
    [N, 2] int64 output, which a fake tensor can make)."""
    import torch

    shifted = targets[..., shift:]
    mask = shifted != IGNORE_INDEX
    valids = torch.nonzero_static(mask, size=_valid_count(mask)).to(torch.int32)
    for i in range(shifted.ndim - 1):
        valids[:, i] *= shifted.stride(i)
    return valids.sum(1)


def _logits(e: torch.Tensor, c: torch.Tensor, rows: torch.Tensor, softcap: float | None) -> torch.Tensor:
    """The float32 logits of ``rows`` of e, soft-capped (the kernels' ``accum`` block, in registers).
    A labelled target's flat index is ``valids + shift`` and its row of e ``valids`` (the kernels load
    e at ``Valids`` and the target at ``Valids + shift``)."""
    import torch

    logits = e[rows].float() @ c.float().t()
    return logits if softcap is None else torch.tanh(logits / softcap) * softcap


def _row_sums(x: torch.Tensor) -> torch.Tensor:
    """Each row's sum of a [rows, n] tensor: a matmul, not ``torch.sum``, whose CUDA reduction's
    buffers the estimator records (as liger_kernels.py sums a kernel's rows). No max is subtracted
    before ``exp``: the values are checked on a CPU with small logits (far from float32 exp's
    overflow at 88); the estimator's have none, and a GPU runs the fork itself."""
    return (x @ x.new_ones(x.shape[1], 1)).squeeze(1)


def _neg_dot(logits: torch.Tensor, targets: torch.Tensor, valids: torch.Tensor, rows: torch.Tensor | None,
             softcap: float | None, registers: Registers) -> torch.Tensor:
    """indexed_neg_dot_forward_kernel over ``valids``: ``out = e.new_zeros((B,), dtype=torch.float32)``,
    then with a softcap ``softcapping(out, softcap)`` (torch.compile'd: one new [B] float32), then
    ``out.to(out_dtype)`` with lse's float32 (no copy). ``rows``: those of ``logits`` (the forward's
    labelled rows) that ``valids`` are, where a subset (vocabulary-parallel)."""
    import torch

    neg_dot = logits.new_zeros((valids.numel(),), dtype=torch.float32)
    if softcap is not None:
        neg_dot = torch.empty_like(neg_dot)
    with registers():
        picked = logits if rows is None else logits[rows.long()]
        # the dot of the soft-capped logit (tanh is odd)
        neg_dot.copy_(-picked.gather(1, targets[valids + 1].unsqueeze(1)).squeeze(1))
    return neg_dot


@functools.cache
def _function() -> Any:
    """cce.py ``LinearCrossEntropyFunction`` (reduction "mean"), defined on first use."""
    import torch

    class LinearCrossEntropyFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, e: torch.Tensor, c: torch.Tensor, targets: torch.Tensor,
                    valids: torch.Tensor, softcap: float | None, vocab: VocabShard | None,
                    registers: Registers) -> torch.Tensor:
            count = valids.numel()
            record(LockRows(LOCK_ROWS), count)
            # cce_lse_forward_kernel: lse, locks and (return_logit_avg: gradients wanted with
            # filter_eps set) logit_avg, allocated in that order.
            lse = e.new_full((count,), -float("inf"), dtype=torch.float32)
            locks = e.new_full((-(-count // LOCK_ROWS),), 0, dtype=torch.uint32)
            logit_avg = e.new_full((c.shape[0],), 0.0, dtype=torch.float32)
            with registers():
                logits = _logits(e, c, valids, softcap)
                lse.copy_(_row_sums(logits.exp()).log())
                if count:  # each column's mean logit: it orders the backward's vocabulary blocks only
                    logit_avg.copy_((logits.new_ones(1, count) @ logits).squeeze(0) / count)
            del locks
            if vocab is None:
                neg_dot = _neg_dot(logits, targets, valids, None, softcap, registers)
            else:  # the logsumexp over every rank's rows, then the dots of the targets this rank holds
                lse = reduce_lse(lse)
                held, valids_held = held_rows(targets, valids, vocab, _valid_count(valids))
                local = targets - vocab.start  # neg_dot_targets
                neg_dot = _neg_dot(logits, local, valids_held, held, softcap, registers)
                del local
                neg_dot = gather_neg_dot(neg_dot, held, count)
            nll = neg_dot.add_(lse)
            loss = nll.mean()
            ctx.save_for_backward(e, c, lse, targets, valids, logit_avg)
            ctx.softcap, ctx.vocab, ctx.registers = softcap, vocab, registers
            return loss

        @staticmethod
        def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
            e, c, lse, targets, valids, logit_avg = ctx.saved_tensors
            # sort_logit_avg (torch.compile'd): argsort, then .to(torch.int32)
            vocab_ordering = torch.argsort(logit_avg).to(torch.int32)
            count = lse.numel()
            if ctx.vocab is not None:
                targets = local_targets(targets, ctx.vocab, c.shape[0])
            grad_scale = 1 / count if count else 1.0
            # cce_backward_kernel: de, dc (accum_e_fp32 / accum_c_fp32 off: the inputs' dtypes), then
            # de_locks and dc_locks, ``nd_locks = triton.cdiv(c.size(1), 64)`` columns each.
            de = torch.zeros_like(e) if ctx.needs_input_grad[0] else None
            dc = torch.zeros_like(c) if ctx.needs_input_grad[1] else None
            nd_locks = -(-c.shape[1] // LOCK_COLS)
            de_locks = e.new_zeros((-(-count // LOCK_ROWS), nd_locks), dtype=torch.int32) if de is not None \
                else None
            dc_locks = c.new_zeros((-(-c.shape[0] // LOCK_ROWS), nd_locks), dtype=torch.int32) \
                if dc is not None else None
            if count:
                with ctx.registers():
                    rows = valids
                    logits = _logits(e, c, rows, ctx.softcap)
                    grad = torch.exp(logits - lse.unsqueeze(1))
                    labels = targets[valids + 1]
                    held = labels < c.shape[0]  # another rank's target: the padding value
                    grad[torch.arange(count), labels.clamp(max=c.shape[0] - 1)] -= held.to(grad.dtype)
                    grad *= grad_scale * grad_out
                    if ctx.softcap is not None:  # d/dx softcap * tanh(x / softcap)
                        grad *= 1 - (logits / ctx.softcap) ** 2
                    if de is not None:
                        de.index_add_(0, rows, (grad @ c.float()).to(de.dtype))
                    if dc is not None:
                        dc.add_((grad.t() @ e[rows].float()).to(dc.dtype))
            del vocab_ordering, de_locks, dc_locks
            if ctx.vocab is not None and de is not None:
                de = reduce_e_grad(de)
            # ``dc.to(dtype=c.dtype)``, ``de.to(dtype=e.dtype)``: their own dtypes, no copy
            return de, dc, None, None, None, None, None

    return LinearCrossEntropyFunction
