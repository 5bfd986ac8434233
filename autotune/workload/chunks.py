"""Loops over chunks of rows whose count and size a library computes from the number of rows.

A chunked loss runs its rows (batch x sequence tokens) a chunk at a time, and the library chooses
the chunks from the row count by a formula that is not affine in it: Liger's fused linear
cross-entropy rounds the chunk size to a power of two (``LigerChunks``), TRL's chunked_nll takes
fixed 256-token chunks (``FixedChunks``), so the chunk count and the last chunk's size jump from
one batch to the next; Cut Cross-Entropy has no loop, but sizes its lock arrays by the rows
rounded up to blocks of 128 (``LockRows``). The trace of a step at one batch then says
nothing exact of a batch whose chunks are laid out otherwise (backends/estimate/trace.py), and the
estimator must know where the layout changes. Each such loop reports its rule and its row count
here while it runs (``record``); a recording (``recording``) keeps them, in the order first seen.

A rule is a frozen dataclass with ``layout(rows)``: the integers that size the loop's allocations
(for a loop of ``n`` chunks of ``c`` rows, the last one ``last``: ``(n, c, last)``), and ``to_json``;
``from_json`` reads one back (a check's memo keeps them, analysis/check.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol


class Chunking(Protocol):
    """How a loop chooses its chunks from its number of rows (backends/estimate/trace.Chunking)."""

    def layout(self, rows: int) -> tuple[int, ...]: ...

    def to_json(self) -> dict[str, Any]: ...


LIGER = "liger_fused_linear_cross_entropy"
ENTROPY = "trl_entropy_from_logits"
TRL_NLL = "trl_chunked_nll"
CCE_LOCKS = "cce_locks"


@dataclass(frozen=True)
class LigerChunks:
    """Liger's fused linear cross-entropy over ``rows`` tokens of a ``hidden``-wide input and a
    ``vocab``-row head (liger_kernel/ops/fused_linear_cross_entropy.py
    ``fused_linear_cross_entropy_forward``: ``inc_factor = triton.cdiv(V, H)``,
    ``chunk_size = triton.next_power_of_2(triton.cdiv(BT, inc_factor))``,
    ``num_chunks = triton.cdiv(BT, chunk_size)``; workload/loss.py runs it)."""

    hidden: int
    vocab: int

    def chunk_size(self, rows: int) -> int:
        """Tokens per chunk (e.g. rows 16,384, vocab 32,000, hidden 4096: inc_factor 8, chunk 2048)."""
        inc_factor = -(-self.vocab // self.hidden)
        return 1 << max(0, (-(-rows // inc_factor) - 1).bit_length())

    def layout(self, rows: int) -> tuple[int, ...]:
        """(chunks, rows of each but the last, rows of the last); one chunk: its rows, twice (the
        rounded size sizes nothing then)."""
        size = self.chunk_size(rows)
        count = -(-rows // size)
        last = rows - (count - 1) * size
        return count, size if count > 1 else last, last

    def to_json(self) -> dict[str, Any]:
        return {"kind": LIGER, "hidden": self.hidden, "vocab": self.vocab}


@dataclass(frozen=True)
class FixedChunks:
    """TRL's chunked_nll over ``rows`` valid tokens (trl/trainer/sft_trainer.py
    ``_chunked_cross_entropy_loss``: ``for start in range(0, n_padded, chunk_size)`` with
    ``n_padded`` the valid count rounded up to whole chunks, each chunk ``hidden[start : start +
    chunk_size]``, so the last one has what is left; workload/chunked_nll.py runs it)."""

    chunk_rows: int

    def layout(self, rows: int) -> tuple[int, ...]:
        """(chunks, rows of each but the last, rows of the last), as LigerChunks.layout."""
        count = -(-rows // self.chunk_rows)
        last = rows - (count - 1) * self.chunk_rows
        return count, self.chunk_rows if count > 1 else last, last

    def to_json(self) -> dict[str, Any]:
        return {"kind": TRL_NLL, "chunk_rows": self.chunk_rows}


@dataclass(frozen=True)
class LockRows:
    """Cut Cross-Entropy's lock arrays, one lock per ``block_rows`` rows (cut_cross_entropy/
    cce_lse_forward.py ``cce_lse_forward_kernel``: ``locks`` of ``triton.cdiv(B, 128)``;
    cce_backward.py ``cce_backward_kernel``: ``de_locks`` of ``triton.cdiv(B, 128)`` rows): no loop,
    but a size rounded up, not affine in the rows (workload/cce.py)."""

    block_rows: int

    def layout(self, rows: int) -> tuple[int, ...]:
        return (-(-rows // self.block_rows),)

    def to_json(self) -> dict[str, Any]:
        return {"kind": CCE_LOCKS, "block_rows": self.block_rows}


@dataclass(frozen=True)
class FirstChunk:
    """A loop that the estimator writes as its first chunk of ``chunk_rows`` rows and its results
    (backends/estimate/preference.py ``entropy_from_logits``, TRL's ``entropy_from_logits``
    ``chunk_size=128``): the chunk has ``min(chunk_rows, rows)`` rows."""

    chunk_rows: int

    def layout(self, rows: int) -> tuple[int, ...]:
        return (min(self.chunk_rows, rows),)

    def to_json(self) -> dict[str, Any]:
        return {"kind": ENTROPY, "chunk_rows": self.chunk_rows}


def from_json(document: Mapping[str, Any]) -> Chunking:
    """A rule's ``to_json`` back."""
    if document["kind"] == LIGER:
        return LigerChunks(int(document["hidden"]), int(document["vocab"]))
    if document["kind"] == ENTROPY:
        return FirstChunk(int(document["chunk_rows"]))
    if document["kind"] == TRL_NLL:
        return FixedChunks(int(document["chunk_rows"]))
    if document["kind"] == CCE_LOCKS:
        return LockRows(int(document["block_rows"]))
    raise ValueError(f"unknown chunking {document['kind']!r}")


_RECORDINGS: list[list[tuple[Chunking, int]]] = []  # the recordings open, innermost last


@contextlib.contextmanager
def recording() -> Iterator[list[tuple[Chunking, int]]]:
    """What the loops run inside report: each rule with the rows it ran over, in the order first
    seen, each (rule, rows) once (a trace runs its step more than once: steps.py)."""
    found: list[tuple[Chunking, int]] = []
    _RECORDINGS.append(found)
    try:
        yield found
    finally:
        _RECORDINGS.pop()


def record(rule: Chunking, rows: int) -> None:
    """A loop of ``rule`` over ``rows`` rows ran (nothing where no recording is open: a GPU run)."""
    for found in _RECORDINGS:
        if (rule, rows) not in found:
            found.append((rule, rows))
