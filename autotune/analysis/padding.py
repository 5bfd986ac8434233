"""Dynamic padding: given the token lengths of a data set, the max batch of each length bucket
against fixed padding to ``seq_len``.

Lengths come from a file of counts (``read_lengths``) or from texts and a local tokenizer
(texts.py). Each bucket's max batch is searched as the table searches a cell.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from autotune.backends import Backend
from autotune.defaults import DEFAULT_MAX_BATCH
from autotune.errors import InvalidInput
from autotune.tuner import search_cell
from autotune.workload import Workload
from autotune.workload.modes import Mode

# Bucket lengths are rounded up to a multiple of 8, as DataCollatorWithPadding(pad_to_multiple_of=8)
# does for tensor cores (NVIDIA's mixed-precision training guide: dimensions multiples of 8).
PAD_MULTIPLE = 8


PERCENTILES = (50, 90, 99)


@dataclass(frozen=True)
class LengthStats:
    count: int
    mean: float
    p50: int
    p90: int
    p99: int
    max: int
    truncated: int  # sequences longer than seq_len, cut to it


@dataclass(frozen=True)
class Bucket:
    max_len: int  # every batch of the bucket is padded to this length
    count: int  # sequences in the bucket
    share: float
    max_batch_size: int
    steps: int | None  # optimizer steps to go through the bucket once; None if batch 0


@dataclass(frozen=True)
class PaddingReport:
    stats: LengthStats
    seq_len: int
    fixed_max_batch: int  # every batch padded to seq_len
    fixed_steps: int | None  # per epoch
    fixed_padding: float  # fraction of the positions computed that are padding
    buckets: list[Bucket]
    bucketed_steps: int | None
    bucketed_padding: float


def read_lengths(path: str | Path) -> list[int]:
    """Token lengths, one positive integer per line (blank lines are skipped)."""
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidInput(f"cannot read lengths file {str(path)!r}: {exc}") from exc
    lengths = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            value = int(line)
        except ValueError:
            value = 0
        if value < 1:
            raise InvalidInput(f"lengths file {str(path)!r}, line {number}: {line.strip()!r} is not a "
                               "positive integer (one token count per line)")
        lengths.append(value)
    if not lengths:
        raise InvalidInput(f"lengths file {str(path)!r} holds no lengths: one token count per line")
    return lengths


def percentile(sorted_values: Sequence[int], p: float) -> int:
    """The nearest-rank percentile: the smallest value with at least p% of values <= it."""
    rank = max(1, math.ceil(p / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


def length_stats(lengths: Sequence[int], seq_len: int) -> LengthStats:
    ordered = sorted(lengths)
    p50, p90, p99 = (percentile(ordered, p) for p in PERCENTILES)
    return LengthStats(count=len(ordered), mean=sum(ordered) / len(ordered), p50=p50, p90=p90,
                       p99=p99, max=ordered[-1], truncated=sum(1 for n in ordered if n > seq_len))


def padded_length(length: int, seq_len: int) -> int:
    """``length`` rounded up to PAD_MULTIPLE, at most ``seq_len``."""
    return min(seq_len, -(-length // PAD_MULTIPLE) * PAD_MULTIPLE)


def bucket_bounds(stats: LengthStats, seq_len: int) -> list[int]:
    """Bucket lengths at p50, p90, p99 and the max, padded (padded_length)."""
    return sorted({padded_length(value, seq_len) for value in (stats.p50, stats.p90, stats.p99, stats.max)})


def dynamic_padding(
    workload: Workload, backend: Backend, lengths: Sequence[int], *, seq_len: int, mode: Mode,
    budget: int, fixed_max: int | None = None, max_batch: int = DEFAULT_MAX_BATCH,
) -> PaddingReport:
    """Length-bucketed batches (each padded to its bucket's length) vs fixed padding to seq_len."""
    stats = length_stats(lengths, seq_len)
    cut = [min(n, seq_len) for n in lengths]
    if fixed_max is None:
        fixed_max = search_cell(backend, workload, mode, seq_len, budget, max_batch=max_batch).max_batch_size
    bounds = bucket_bounds(stats, seq_len)
    counts = dict.fromkeys(bounds, 0)
    for n in cut:
        counts[next(b for b in bounds if b >= n)] += 1
    buckets = []
    for bound in bounds:
        if not counts[bound]:
            continue
        best = fixed_max if bound == seq_len else search_cell(
            backend, workload, mode, bound, budget, max_batch=max_batch).max_batch_size
        buckets.append(Bucket(bound, counts[bound], counts[bound] / len(cut), best,
                              -(-counts[bound] // best) if best else None))
    tokens = sum(cut)
    bucket_steps = [b.steps for b in buckets]
    return PaddingReport(
        stats=stats, seq_len=seq_len, fixed_max_batch=fixed_max,
        fixed_steps=-(-len(cut) // fixed_max) if fixed_max else None,
        fixed_padding=1 - tokens / (len(cut) * seq_len),
        buckets=buckets,
        bucketed_steps=None if None in bucket_steps else sum(s for s in bucket_steps if s is not None),
        bucketed_padding=1 - tokens / sum(b.count * b.max_len for b in buckets),
    )
