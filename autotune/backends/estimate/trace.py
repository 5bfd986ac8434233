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

A chunked loss breaks the premise between batches, not within a pair: its library chooses the
chunks from the rows by a formula that is not affine (Liger's fused linear cross-entropy rounds the
chunk size to a power of two: workload/chunks.py), so two traces with the same chunk count align
and their form is wrong at a batch whose chunks are laid out otherwise (another count: another
sequence; the same count: other sizes). A trace keeps each such loop's rule and rows (``Chunks``),
a form the line of their layouts through its pair (``ChunkLine``), and a form answers only at the
batches where the rule's own layout is on that line (``Affine.covers``): elsewhere the batch is traced.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

Event = tuple[int, int]  # (storage key, nbytes); nbytes == -1 marks a free
# What a replay takes (replay.py): an Event, or (key, nbytes, stream) for an allocation made on
# another stream than the default one (stream >= 1; ``OnStream``).
ReplayEvent = tuple[int, ...]


class Workspace(Protocol):
    """What turns a recorded element count into bytes: reduce.Workspace (a CUDA reduction's buffer),
    embedding.EmbeddingPartials (an embedding backward's)."""

    def nbytes(self, count: int) -> int: ...

    def to_json(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class PlusFixed:
    """A kernel's buffer whose recorded size is its per-sample part and whose bytes add a fixed
    part (cuDNN's attention backward workspace: its float32 accumulators, then 256 bytes of the
    graph's own; attention.py). Kept apart, the recorded size has no fixed term, and a trace of a
    cell rescales from another length's pair (``rescaled``)."""

    fixed: int

    def nbytes(self, count: int) -> int:
        return count + self.fixed

    def to_json(self) -> dict[str, Any]:
        return {"kind": PLUS_FIXED, "fixed": self.fixed}


PLUS_FIXED = "plus_fixed"  # marks it among a trace's workspaces (backend.workspace_from_json)


@dataclass(frozen=True)
class OnStream:
    """An allocation made on another CUDA stream than the default one (FSDP2's all-gather and
    reduce-scatter buffers: estimate/rank.py), numbered 1, 2, ... in the order the trace first
    allocated on each. The caching allocator serves it only from that stream's blocks (allocator.py);
    kept among a trace's workspaces so that it travels with the allocation (steps.py, ``Affine``).
    ``inner``: the workspace of a kernel's buffer allocated on that stream, which gives its bytes;
    None: an allocation in bytes."""

    stream: int
    inner: Workspace | None = None

    def nbytes(self, count: int) -> int:
        return count if self.inner is None else self.inner.nbytes(count)

    def to_json(self) -> dict[str, Any]:
        inner = None if self.inner is None else self.inner.to_json()
        return {"kind": ON_STREAM, "stream": self.stream, "inner": inner}


ON_STREAM = "on_stream"  # marks it among a trace's workspaces (backend.workspace_from_json)


class Chunking(Protocol):
    """How a loop chooses its chunks from its rows (workload/chunks.py): ``layout(rows)`` the
    integers that size its allocations, in a loop of the library's own formula."""

    def layout(self, rows: int) -> tuple[int, ...]: ...

    def to_json(self) -> dict[str, Any]: ...


# Each chunked loop a trace ran (workload/chunks.recording): its rule and the rows it ran over.
Chunks = tuple[tuple[Chunking, int], ...]


@dataclass(frozen=True)
class ChunkLine:
    """A chunked loop's rows and layout as lines in the batch, through a form's pair of traces:
    the form holds at a batch where the rule lays its chunks out on the line (``holds``), since
    every allocation of the loop is then sized by the line's integers, as in the pair."""

    chunking: Chunking
    rows: tuple[int, int]  # fixed, per sample
    fixed: tuple[int, ...]
    per_sample: tuple[int, ...]

    def holds(self, batch_size: int) -> bool:
        rows = self.rows[0] + self.rows[1] * batch_size
        expected = tuple(f + p * batch_size for f, p in zip(self.fixed, self.per_sample, strict=True))
        return rows >= 1 and self.chunking.layout(rows) == expected

    def to_json(self) -> dict[str, Any]:
        return {"chunking": self.chunking.to_json(), "rows": list(self.rows), "fixed": list(self.fixed),
                "per_sample": list(self.per_sample)}


def _line(a: int, b: int, batch_a: int, span: int) -> tuple[int, int] | None:
    """(fixed, per sample) of the integer line through ``a`` at ``batch_a`` and ``b`` ``span``
    batches later; None if the slope is not whole."""
    slope, remainder = divmod(b - a, span)
    return None if remainder else (a - slope * batch_a, slope)


def chunk_lines(a: Trace, b: Trace) -> tuple[ChunkLine, ...] | None:
    """The lines of ``a``'s and ``b``'s chunked loops (the same rules, in the same order); None if
    their rules differ or a line is not whole."""
    span = b.batch_size - a.batch_size
    if span == 0 or [rule for rule, _ in a.chunks] != [rule for rule, _ in b.chunks]:
        return None
    lines = []
    for (rule, rows_a), (_, rows_b) in zip(a.chunks, b.chunks, strict=True):
        rows = _line(rows_a, rows_b, a.batch_size, span)
        parts = [_line(x, y, a.batch_size, span)
                 for x, y in zip(rule.layout(rows_a), rule.layout(rows_b), strict=True)]
        if rows is None or any(part is None for part in parts):
            return None
        lines.append(ChunkLine(rule, rows, tuple(p[0] for p in parts if p is not None),
                               tuple(p[1] for p in parts if p is not None)))
    return tuple(lines)


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
    chunks: Chunks = ()  # the step's chunked loops (module docstring)

    @classmethod
    def from_events(cls, batch_size: int, events: Sequence[Event],
                    workspaces: Mapping[int, Workspace] | None = None, chunks: Chunks = ()) -> Trace:
        """Number the allocations of a (storage key, nbytes | -1) event list in order; the keys in
        ``workspaces`` are reductions' buffers, their nbytes the reduction's element count;
        ``chunks`` the step's chunked loops."""
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
        return cls(batch_size, tuple(sizes), tuple(order), tuple(found), tuple(chunks))

    def events(self) -> list[ReplayEvent]:
        """Back to the event form ``replay.replay`` takes (allocation index as the key), each
        reduction's buffer in bytes, an allocation on another stream with its stream (``OnStream``)."""
        nbytes = list(self.sizes)
        streams: dict[int, int] = {}
        for index, workspace in self.workspaces:
            nbytes[index] = workspace.nbytes(self.sizes[index])
            if isinstance(workspace, OnStream):
                streams[index] = workspace.stream
        if not streams:
            return [(i, nbytes[i]) if i >= 0 else (~i, -1) for i in self.order]
        return [((i, nbytes[i], streams[i]) if i in streams else (i, nbytes[i])) if i >= 0 else (~i, -1)
                for i in self.order]


@dataclass(frozen=True)
class Affine:
    """Every allocation's size as ``fixed + per_sample * batch``: the traces at all batch sizes.

    Read off once (a pair of traces, or a pair at another length), then ``at`` writes the trace at
    any batch it ``covers`` in one pass. ``exact`` forms come from traces and hold whole bytes; a
    synthesized one (``synthesized``) holds the fractions its interpolation gave and rounds each size.
    ``chunks``: where the step has chunked loops, their lines (``ChunkLine``): the batches covered.
    """

    fixed: tuple[float, ...]
    per_sample: tuple[float, ...]
    order: tuple[int, ...]
    workspaces: tuple[tuple[int, Workspace], ...] = ()
    exact: bool = True
    chunks: tuple[ChunkLine, ...] = ()

    def covers(self, batch_size: int) -> bool:
        """Whether the form gives the trace at ``batch_size``: every chunked loop of the step lays
        its chunks out there on the line through the form's pair (a synthesized form: a guess anyway)."""
        return batch_size >= 1 and all(line.holds(batch_size) for line in self.chunks)

    def at(self, batch_size: int) -> Trace:
        """The trace at ``batch_size``; ValueError at a batch the form does not cover."""
        if not self.covers(batch_size):
            raise ValueError(f"batch {batch_size} lays its chunks out otherwise than the form's traces")
        if self.exact:
            sizes = tuple(int(f + p * batch_size) for f, p in zip(self.fixed, self.per_sample, strict=True))
        else:
            sizes = tuple(max(0, round(f + p * batch_size))
                          for f, p in zip(self.fixed, self.per_sample, strict=True))
        chunks = tuple((line.chunking, line.rows[0] + line.rows[1] * batch_size) for line in self.chunks)
        return Trace(batch_size, sizes, self.order, self.workspaces, chunks)

    def to_json(self) -> dict[str, Any]:
        """The form as JSON (an exact one: whole bytes), to be read back by ``from_json``."""
        if not self.exact:
            raise ValueError("only an exact form is kept: a synthesized one is a guess")
        return {"fixed": [int(f) for f in self.fixed], "per_sample": [int(p) for p in self.per_sample],
                "order": list(self.order),
                "workspaces": [[index, workspace.to_json()] for index, workspace in self.workspaces],
                "chunks": [line.to_json() for line in self.chunks]}

    @classmethod
    def from_json(cls, document: Mapping[str, Any], workspace: Callable[[Any], Workspace],
                  chunking: Callable[[Any], Chunking] | None = None) -> Affine:
        """``to_json``'s form back; ``workspace`` reads a workspace's JSON (backend.workspace_from_json),
        ``chunking`` a chunked loop's rule (workload/chunks.from_json), needed where the form has any."""
        lines = document.get("chunks") or []
        if lines and chunking is None:
            raise ValueError("a form with chunked loops needs their rules' reader")
        read = chunking or (lambda found: found)
        chunks = tuple(ChunkLine(read(line["chunking"]), (int(line["rows"][0]), int(line["rows"][1])),
                                 tuple(line["fixed"]), tuple(line["per_sample"])) for line in lines)
        return cls(tuple(document["fixed"]), tuple(document["per_sample"]), tuple(document["order"]),
                   tuple((int(index), workspace(found)) for index, found in document["workspaces"]),
                   chunks=chunks)


def affine(a: Trace, b: Trace) -> Affine | None:
    """The exact affine form through traces ``a`` and ``b``, or None if they are not affine."""
    span = b.batch_size - a.batch_size
    lines = chunk_lines(a, b)
    if span == 0 or a.order != b.order or lines is None:
        return None
    fixed, per_sample = [], []
    for size_a, size_b in zip(a.sizes, b.sizes, strict=True):
        slope, remainder = divmod(size_b - size_a, span)
        intercept = size_a - slope * a.batch_size
        if remainder or slope < 0 or intercept < 0:
            return None
        fixed.append(intercept)
        per_sample.append(slope)
    return Affine(tuple(fixed), tuple(per_sample), a.order, a.workspaces, chunks=lines)


def extrapolate(a: Trace, b: Trace, batch_size: int) -> Trace | None:
    """The trace at ``batch_size`` from traces ``a`` and ``b``, or None if they are not affine or
    their form does not cover the batch (a chunked loop laid out otherwise there)."""
    form = affine(a, b) if batch_size >= 1 else None
    return None if form is None or not form.covers(batch_size) else form.at(batch_size)


def rescaled(reference: tuple[Trace, Trace], single: Trace) -> Affine | None:
    """The affine form of a cell from one trace of it and an aligned pair of another.

    A cell at a new sequence length runs the same ops, so its trace has the same order; what the
    pair from the other cell adds is which allocations depend on the batch. That is read off
    exactly when every allocation there is either batch-independent (its size at this length is
    the single trace's) or purely per-sample (its size divides by the single trace's batch).
    An allocation with both parts, or any other mismatch, returns None.
    """
    a, b = reference
    span = b.batch_size - a.batch_size
    lines = _rescaled_lines(reference, single)
    if span == 0 or not (single.order == a.order == b.order) or lines is None:
        return None
    fixed, per_sample = [], []
    for size_a, size_b, size in zip(a.sizes, b.sizes, single.sizes, strict=True):
        slope, remainder = divmod(size_b - size_a, span)
        intercept = size_a - slope * a.batch_size
        if remainder or slope < 0 or intercept < 0 or (slope and intercept):
            return None
        if slope == 0:
            fixed.append(size)
            per_sample.append(0)
            continue
        slope_here, remainder = divmod(size, single.batch_size)
        if remainder:
            return None
        fixed.append(0)
        per_sample.append(slope_here)
    return Affine(tuple(fixed), tuple(per_sample), single.order, single.workspaces, chunks=lines)


def _rescaled_lines(reference: tuple[Trace, Trace], single: Trace) -> tuple[ChunkLine, ...] | None:
    """The lines of ``single``'s chunked loops, read as ``rescaled`` reads its sizes: the rows and
    each layout integer either batch-independent or purely per-sample in the reference's lines."""
    lines = chunk_lines(*reference)
    if lines is None or [line.chunking for line in lines] != [rule for rule, _ in single.chunks]:
        return None
    found = []
    for line, (rule, rows) in zip(lines, single.chunks, strict=True):
        parts = []
        for (fixed, slope), value in zip((line.rows, *zip(line.fixed, line.per_sample, strict=True)),
                                         (rows, *rule.layout(rows)), strict=True):
            if slope and fixed:
                return None
            if slope and value % single.batch_size:
                return None
            parts.append((0, value // single.batch_size) if slope else (value, 0))
        layout = parts[1:]
        found.append(ChunkLine(rule, parts[0], tuple(f for f, _ in layout), tuple(p for _, p in layout)))
    return tuple(found)


def rescale(reference: tuple[Trace, Trace], single: Trace, batch_size: int) -> Trace | None:
    """The trace at ``batch_size`` from one trace of this cell and an aligned pair of another
    (``rescaled``), or None (also where the form does not cover the batch)."""
    form = rescaled(reference, single) if batch_size >= 1 else None
    return None if form is None or not form.covers(batch_size) else form.at(batch_size)


def aligned_pair(traces: Sequence[Trace]) -> tuple[Trace, Trace] | None:
    """The latest two traces that extrapolate exactly, if any."""
    for i in range(len(traces) - 1, 0, -1):
        for j in range(i - 1, -1, -1):
            if affine(traces[j], traces[i]) is not None:
                return traces[j], traces[i]
    return None


def synthesized(pairs: Mapping[int, tuple[Trace, Trace]], seq_len: int) -> Affine | None:
    """A *guess* at the affine form of another sequence length, from aligned pairs at other lengths.

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
    fixed, per_sample = [], []
    for i in range(len(pairs[known[0]][0].sizes)):
        fixed.append(_at_length([(s, parts[s][i][0]) for s in known], seq_len, 0))  # type: ignore[index]
        per_sample.append(_at_length([(s, parts[s][i][1]) for s in known], seq_len, 1))  # type: ignore[index]
    return Affine(tuple(fixed), tuple(per_sample), orders.pop(), pairs[known[0]][0].workspaces, exact=False)


def synthesize(pairs: Mapping[int, tuple[Trace, Trace]], seq_len: int, batch_size: int) -> Trace | None:
    """The trace at ``batch_size`` of ``synthesized``'s guess, or None."""
    form = synthesized(pairs, seq_len)
    return None if form is None else form.at(batch_size)


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
