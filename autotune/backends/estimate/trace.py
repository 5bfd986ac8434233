"""Allocation traces of a training step, and their exact extrapolation in the batch size.

Running the step on fake tensors at batch ``b`` gives a sequence of allocations and frees. The
sequence does not depend on ``b`` for a transformers model (no data, no batch-dependent control
flow), and every tensor's size is affine in ``b``: ``bytes = fixed + per_sample * b`` (a tensor
has the batch dimension once, or not at all). Two traces at different batch sizes with the same
sequence therefore determine the trace at any batch size, which is replayed through the allocator
simulator in milliseconds instead of running the model again (about a second for BERT-base).

The premise is checked, not assumed: the two traces must have the same sequence of allocations
and frees, and every size difference must divide exactly by the batch difference with a
non-negative fixed part; otherwise ``extrapolate`` returns None and the caller runs the model.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

Event = tuple[int, int]  # (storage key, nbytes); nbytes == -1 marks a free


class Workspace(Protocol):
    """What turns a recorded element count into bytes (reduce.Workspace, a CUDA reduction's buffer)."""

    def nbytes(self, count: int) -> int: ...


@dataclass(frozen=True)
class Trace:
    """One probe's allocations: ``order`` lists ``i`` to allocate ``sizes[i]``, ``~i`` to free it.

    ``workspaces`` maps the index of a CUDA reduction's buffer or semaphores (reduce.py) to what
    turns its recorded size, the reduction's element count, into bytes: the one kind of
    allocation whose bytes are not affine in the batch, while its element count is.
    """

    batch_size: int
    sizes: tuple[int, ...]
    order: tuple[int, ...]
    workspaces: tuple[tuple[int, Workspace], ...] = ()

    @classmethod
    def from_events(cls, batch_size: int, events: Sequence[Event],
                    workspaces: Mapping[int, Workspace] | None = None) -> Trace:
        """Number the allocations of a (storage key, nbytes | -1) event list in order; the keys in
        ``workspaces`` are reductions' buffers, their nbytes the reduction's element count."""
        index_of: dict[int, int] = {}
        sizes: list[int] = []
        order: list[int] = []
        found: list[tuple[int, Workspace]] = []
        for key, nbytes in events:
            if nbytes < 0:
                order.append(~index_of.pop(key))
            else:
                index_of[key] = len(sizes)
                if workspaces and key in workspaces:
                    found.append((len(sizes), workspaces[key]))
                order.append(len(sizes))
                sizes.append(nbytes)
        return cls(batch_size, tuple(sizes), tuple(order), tuple(found))

    def events(self) -> list[Event]:
        """Back to the event form ``accounting.replay`` takes (allocation index as the key), each
        reduction's buffer in bytes."""
        nbytes = list(self.sizes)
        for index, workspace in self.workspaces:
            nbytes[index] = workspace.nbytes(self.sizes[index])
        return [(i, nbytes[i]) if i >= 0 else (~i, -1) for i in self.order]


def extrapolate(a: Trace, b: Trace, batch_size: int) -> Trace | None:
    """The trace at ``batch_size`` from traces ``a`` and ``b``, or None if they are not affine."""
    span = b.batch_size - a.batch_size
    if span == 0 or a.order != b.order or batch_size < 1:
        return None
    sizes = []
    for size_a, size_b in zip(a.sizes, b.sizes, strict=True):
        per_sample, remainder = divmod(size_b - size_a, span)
        fixed = size_a - per_sample * a.batch_size
        if remainder or per_sample < 0 or fixed < 0:
            return None
        sizes.append(fixed + per_sample * batch_size)
    return Trace(batch_size, tuple(sizes), a.order, a.workspaces)


def rescale(reference: tuple[Trace, Trace], single: Trace, batch_size: int) -> Trace | None:
    """The trace at ``batch_size`` from one trace of this cell and an aligned pair of another.

    A cell at a new sequence length runs the same ops, so its trace has the same order; what the
    pair from the other cell adds is which allocations depend on the batch. That is read off
    exactly when every allocation there is either batch-independent (its size at this length is
    the single trace's) or purely per-sample (its size divides by the single trace's batch).
    An allocation with both parts, or any other mismatch, returns None.
    """
    a, b = reference
    span = b.batch_size - a.batch_size
    if span == 0 or not (single.order == a.order == b.order) or batch_size < 1:
        return None
    sizes = []
    for size_a, size_b, size in zip(a.sizes, b.sizes, single.sizes, strict=True):
        per_sample, remainder = divmod(size_b - size_a, span)
        fixed = size_a - per_sample * a.batch_size
        if remainder or per_sample < 0 or fixed < 0 or (per_sample and fixed):
            return None
        if per_sample == 0:
            sizes.append(size)
            continue
        per_sample_here, remainder = divmod(size, single.batch_size)
        if remainder:
            return None
        sizes.append(per_sample_here * batch_size)
    return Trace(batch_size, tuple(sizes), single.order, single.workspaces)


def aligned_pair(traces: Sequence[Trace]) -> tuple[Trace, Trace] | None:
    """The latest two traces that extrapolate exactly, if any."""
    for i in range(len(traces) - 1, 0, -1):
        for j in range(i - 1, -1, -1):
            other = traces[i].batch_size + (1 if traces[i].batch_size != traces[j].batch_size + 1 else 2)
            if extrapolate(traces[j], traces[i], other) is not None:
                return traces[j], traces[i]
    return None


def synthesize(pairs: Mapping[int, tuple[Trace, Trace]], seq_len: int, batch_size: int) -> Trace | None:
    """A *guess* at the trace of another sequence length, from aligned pairs at other lengths.

    Each allocation's fixed and per-sample sizes are functions of the sequence length: a tensor
    has the length as a dimension once (activations), twice (attention scores, masks) or not at
    all, so most sizes are ``c * L**k`` with k in 0, 1, 2, and that is read off exactly from two
    lengths. Other sizes are interpolated as polynomials through the nearest lengths known
    (degree up to 2). Not exact in general, so it is only used to choose a cell's first probe,
    never as a probe.
    """
    if not pairs:
        return None
    known = sorted(pairs, key=lambda s: (abs(s - seq_len), s))[:3]
    orders = {pairs[s][0].order for s in known}
    if len(orders) != 1:
        return None
    parts = {s: _parts(*pairs[s]) for s in known}
    if any(p is None for p in parts.values()):
        return None
    sizes = []
    for i in range(len(pairs[known[0]][0].sizes)):
        fixed = _at_length([(s, parts[s][i][0]) for s in known], seq_len, 0)  # type: ignore[index]
        per_sample = _at_length([(s, parts[s][i][1]) for s in known], seq_len, 1)  # type: ignore[index]
        sizes.append(max(0, round(fixed + per_sample * batch_size)))
    return Trace(batch_size, tuple(sizes), orders.pop(), pairs[known[0]][0].workspaces)


def _at_length(points: Sequence[tuple[int, int]], length: int, alone: int) -> float:
    """A size at ``length`` from its sizes at other lengths: ``c * L**k`` (k = 0, 1, 2) where that
    holds at every length known, else a polynomial through them; from one length, ``c * L**alone``
    (the fixed part of an allocation is taken not to grow with the length, the per-sample part
    to grow in proportion)."""
    (first, value), rest = points[0], points[1:]
    if not rest:
        return value * (length / first) ** alone
    for power in (0, 1, 2):
        if all(size * first**power == value * other**power for other, size in rest):
            return value * (length / first) ** power
    return _lagrange(points, length)


def _parts(a: Trace, b: Trace) -> list[tuple[int, int]] | None:
    span = b.batch_size - a.batch_size
    if span == 0 or a.order != b.order:
        return None
    parts = []
    for size_a, size_b in zip(a.sizes, b.sizes, strict=True):
        per_sample = (size_b - size_a) // span
        parts.append((size_a - per_sample * a.batch_size, per_sample))
    return parts


def _lagrange(points: Sequence[tuple[int, float]], x: int) -> float:
    total = 0.0
    for j, (xj, yj) in enumerate(points):
        term = float(yj)
        for k, (xk, _) in enumerate(points):
            if k != j:
                term *= (x - xk) / (xj - xk)
        total += term
    return total
