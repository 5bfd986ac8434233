"""TRL's row loops as the estimator runs them: their allocations, in a trace that does not grow with
the batch.

TRL computes per-token log-probs and the logged entropy one row (or 128 flattened rows) at a time
(trl/trainer/utils.py ``selective_log_softmax``, ``entropy_from_logits``: workload/preference.py
has them as TRL writes them, which the cuda backend runs). Run as written, the trace has a few
allocations per row, so two batch sizes never give the same sequence and no probe extrapolates
(trace.py): a DPO table of tiny-llama took minutes. These Functions allocate what the loops hold
at their peaks, in allocations whose number is fixed and whose sizes are affine in the batch:

- ``selective_log_softmax``, float32 logits (accelerate's upcast outputs): forward, one row's
  ``logsumexp`` (its [seq, vocab] temporary, run for real on row 0), each row's [seq] result
  (saved by its backward node: one [rows, seq] block) and their ``torch.stack``. Backward, as
  autograd runs the rows' ``LogsumexpBackward`` (``grad * (self - result).exp()``) into the
  ``unbind`` of the logits: every row's [seq, vocab] gradient held until the last (one block),
  with the last row's temporary beside them, then their ``stack`` (``unbind_backward``) while
  they are still held.
- 16-bit logits (no autocast): forward, each row's ``log_softmax`` saved for backward (a block)
  and the gathered [seq, 1] values; backward, the rows' ``log_softmax`` outputs are let go as
  their gradients appear (one block for the other), the gather's zero-filled gradient and the
  log-softmax gradient of one row beside them, then the ``stack``.
- ``entropy_from_logits`` (no graph: the logits are detached): the flattened copy, the first
  chunk's log-softmax, exp and product (every chunk's are the same size and freed in turn), the
  chunks' [128] entropies (one block) and their ``torch.cat``.

Under no_grad (the reference's forward) nothing is saved: a row's temporaries and the results.
Where a row's exact sequence of frees is not kept (a block for many storages of the same total
bytes), the peak is the loop's: the largest number of rows alive at once.
"""

from __future__ import annotations

from typing import Any

import torch

from autotune.workload.chunks import FirstChunk, record
from autotune.workload.preference import ENTROPY_CHUNK_ROWS, LogProbs


class _RowLogsumexp(torch.autograd.Function):
    """``torch.stack([torch.logsumexp(row, dim=-1) for row in logits])`` (module docstring)."""

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor) -> torch.Tensor:
        rows, seq, vocab = logits.shape
        transient = torch.logsumexp(logits[0], dim=-1)  # one row's temporaries, for real
        del transient
        results = logits.new_empty((rows, seq))  # each row's result, saved by its backward node
        stacked = logits.new_empty((rows, seq))
        ctx.shape, ctx.dtype = (rows, seq, vocab), logits.dtype
        ctx.results = results if logits.requires_grad else None
        return stacked

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        rows, seq, vocab = ctx.shape
        held = grad.new_empty((rows, seq, vocab), dtype=ctx.dtype)  # every row's gradient, until the last
        temporary = grad.new_empty((seq, vocab), dtype=ctx.dtype)  # the last row's exp
        del temporary
        stacked = grad.new_empty((rows, seq, vocab), dtype=ctx.dtype)  # unbind_backward: torch.stack
        del held
        ctx.results = None
        return stacked


class _RowLogSoftmaxGather(torch.autograd.Function):
    """TRL's 16-bit path: ``log_softmax`` then ``gather`` per row, stacked (module docstring)."""

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        rows, seq, vocab = logits.shape
        saving = logits.requires_grad  # (the forward of a Function runs without grad mode)
        if saving:
            ctx.outputs = logits.new_empty((rows, seq, vocab))  # each row's log_softmax, saved
        else:
            transient = torch.log_softmax(logits[0], dim=-1)  # one row's at a time, freed after its gather
            del transient
        gathered = logits.new_empty((rows, seq, 1))  # the rows' gathered values, until stacked
        stacked = logits.new_empty((rows, seq, 1))
        del gathered
        ctx.shape, ctx.dtype = (rows, seq, vocab), logits.dtype
        return stacked

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        rows, seq, vocab = ctx.shape
        # row by row, a row's saved output is let go once its gradient is made: as many rows alive
        ctx.outputs = None
        held = grad.new_empty((rows, seq, vocab), dtype=ctx.dtype)
        zeros = grad.new_empty((seq, vocab), dtype=ctx.dtype)  # gather's backward: zeros, scatter_add_
        row = grad.new_empty((seq, vocab), dtype=ctx.dtype)  # the last row's log_softmax backward
        del zeros, row
        stacked = grad.new_empty((rows, seq, vocab), dtype=ctx.dtype)
        del held
        return stacked, None


def selective_log_softmax(logits: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """TRL's ``selective_log_softmax`` (workload/preference.py) with the allocations above."""
    index = index.unsqueeze(-1)
    if logits.dtype in (torch.float32, torch.float64):
        selected = torch.gather(logits, dim=-1, index=index)
        per_token = selected - _RowLogsumexp.apply(logits).unsqueeze(-1)
    else:
        per_token = _RowLogSoftmaxGather.apply(logits, index)
    return per_token.squeeze(-1)


def entropy_from_logits(logits: torch.Tensor, chunk_size: int = ENTROPY_CHUNK_ROWS) -> torch.Tensor:
    """TRL's ``entropy_from_logits`` (workload/preference.py) with the allocations above."""
    import torch.nn.functional as F

    shape = logits.shape[:-1]
    flat = logits.reshape(-1, logits.shape[-1])
    record(FirstChunk(chunk_size), flat.shape[0])  # the chunk is min(chunk_size, rows) rows: a layout
    chunk = flat[:chunk_size]
    logps = F.log_softmax(chunk, dim=-1)
    first = -(torch.exp(logps) * logps).sum(-1)
    del logps, first
    entropies = flat.new_empty((flat.shape[0],))  # the chunks' results, until concatenated
    joined = flat.new_empty((flat.shape[0],))
    del entropies, flat
    return joined.reshape(shape)


EMULATED_LOG_PROBS = LogProbs(selective_log_softmax, entropy_from_logits)
