"""What would fit: the max batch under each change a user can make, and dynamic padding.

Every lever is a max batch for the same model, sequence and GPU, searched as the table searches a
cell (``check.max_batch`` on the same backend), so a lever that is a table mode (amp, bf16, ckpt,
amp+ckpt) or a table option (``--optimizer sgd``, another sequence length) gives the table's
number. Levers the table has no column for change the step itself (instrument.Variant) and are
searched the same way on an ``InstrumentedBackend``:

- 8-bit AdamW: once with every parameter at 8 bits (``bnb.optim.AdamW8bit`` used directly) and
  once as transformers' Trainer sets it up (``optim="adamw_bnb_8bit"``: embeddings keep 32-bit
  state). Where this machine has a CUDA GPU and bitsandbytes (bnb.real_8bit), both are measured:
  the cuda backend runs the step with bitsandbytes' own optimizer (bnb.py) at the same budget,
  one worker per cell as for a table. Elsewhere, or when the measurement fails (the lever's note
  says why), bitsandbytes' state sizes are emulated on the estimator (instrument.AdamW8bitState).
- frozen embeddings: ``requires_grad=False`` on every ``nn.Embedding`` parameter (with tied
  weights, the output projection tied to them freezes too, as it does in training).

Gradient accumulation needs no search: the largest micro-batch that divides the effective batch
and fits (check.accumulation_plan). Dynamic padding (``dynamic_padding``): given the token lengths
of a data set (``read_lengths``, or ``lengths_from_texts`` from a column of texts and a local
tokenizer), the max batch of each length bucket against fixed padding to ``seq_len``.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from itertools import islice
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from autotune.bnb import BNB_OPTIMIZERS, Real8bit
from autotune.check import accumulation_plan, max_batch
from autotune.errors import AutotuneError, InvalidInput, ProbeError
from autotune.modes import Mode
from autotune.search import DEFAULT_MAX_BATCH
from autotune.tuner import Backend
from autotune.units import format_bytes
from autotune.workload import Workload

if TYPE_CHECKING:
    from autotune.instrument import Variant

AS_THE_TABLE = "as the table"
EMULATED_8BIT = "emulated: bitsandbytes' 8-bit state sizes"
# Bucket lengths are rounded up to a multiple of 8, as DataCollatorWithPadding(pad_to_multiple_of=8)
# does for tensor cores (NVIDIA's mixed-precision training guide: dimensions multiples of 8).
PAD_MULTIPLE = 8
PERCENTILES = (50, 90, 99)
NOTE_CHARS = 300  # of a failed measurement's message, in a lever's note


@dataclass(frozen=True)
class Lever:
    name: str  # amp, bf16, ckpt, amp+ckpt, adamw-8bit, adamw-8bit-trainer, sgd, frozen-embeddings,
    #            seq-N, accumulation
    label: str
    max_batch_size: int | None  # None when the lever does not apply (see error)
    mode: str
    seq_len: int
    optimizer: str
    estimated: str  # AS_THE_TABLE, or how the lever was emulated or measured
    capped: bool = False
    note: str | None = None
    error: str | None = None


def what_if(
    workload: Workload, backend: Backend, *, seq_len: int, mode: Mode, budget: int, base_max: int,
    effective_batch: int | None = None, shorter_seq_lens: Sequence[int] | None = None,
    max_batch_size: int = DEFAULT_MAX_BATCH, real: Real8bit | None = None,
) -> list[Lever]:
    """Each lever that changes something from (workload, mode, seq_len), with its max batch.

    ``real``: where the 8-bit levers are measured (bnb.real_8bit); None emulates them.
    """
    from autotune.instrument import InstrumentedBackend, Variant, embedding_parameters

    def search(name: str, label: str, target: Backend, wl: Workload, m: Mode, s: int,
               estimated: str = AS_THE_TABLE, note: str | None = None) -> Lever:
        return search_lever(name, label, target, wl, m, s, budget=budget, max_batch_size=max_batch_size,
                            estimated=estimated, note=note)

    def eight_bit(name: str, label: str, variant: Variant, note: str | None = None) -> Lever:
        return eight_bit_lever(name, label, variant, backend=backend, workload=workload, mode=mode,
                               seq_len=seq_len, budget=budget, max_batch_size=max_batch_size,
                               real=real, note=note)

    levers = []
    for precision, label in (("amp", "AMP fp16 (autocast float16 + GradScaler)"),
                             ("bf16", "bf16 (autocast bfloat16)")):
        if mode.precision != precision:
            levers.append(search(precision if not mode.checkpointing else f"{precision}+ckpt",
                                 label, backend, workload, Mode(precision, mode.checkpointing),  # type: ignore[arg-type]
                                 seq_len, note=_bf16_note(backend) if precision == "bf16" else None))
    if not mode.checkpointing:
        levers.append(search("ckpt" if mode.precision == "fp32" else f"{mode.precision}+ckpt",
                             "gradient checkpointing", backend, workload, Mode(mode.precision, True),
                             seq_len))
        if mode.precision == "fp32":
            levers.append(search("amp+ckpt", "AMP fp16 + gradient checkpointing", backend, workload,
                                 Mode("amp", True), seq_len))
    has_embeddings = bool(embedding_parameters(backend._model(workload).model))  # type: ignore[attr-defined]
    if workload.optimizer == "adamw":
        levers.append(eight_bit("adamw-8bit", "8-bit AdamW (bitsandbytes AdamW8bit, every parameter)",
                                Variant(optimizer="adamw-8bit")))
        if has_embeddings:
            levers.append(eight_bit(
                "adamw-8bit-trainer", "8-bit AdamW as Trainer(optim='adamw_bnb_8bit') sets it up",
                Variant(optimizer="adamw-8bit", fp32_state_for_embeddings=True),
                note="the Trainer keeps 32-bit state for every nn.Embedding weight",
            ))
        levers.append(search("sgd", "SGD instead of AdamW (no momentum: no optimizer state)", backend,
                             replace(workload, optimizer="sgd"), mode, seq_len))
    if has_embeddings:
        levers.append(search(
            "frozen-embeddings", "frozen embeddings (requires_grad=False on nn.Embedding)",
            InstrumentedBackend(backend, Variant(freeze_embeddings=True)),  # type: ignore[arg-type]
            workload, mode, seq_len, "the table's step with the embeddings frozen",
        ))
    for shorter in sorted(set(shorter_seq_lens or [seq_len // 2]), reverse=True):
        if 1 <= shorter < seq_len:
            levers.append(search(f"seq-{shorter}", f"max sequence length {shorter}", backend,
                                 workload, mode, shorter))
    if effective_batch is not None:
        levers.append(_accumulation(effective_batch, base_max, mode, seq_len, workload.optimizer))
    return levers


def search_lever(name: str, label: str, target: Backend, workload: Workload, mode: Mode, seq_len: int, *,
                 budget: int, max_batch_size: int, estimated: str = AS_THE_TABLE,
                 note: str | None = None) -> Lever:
    """The lever's max batch, searched as the table searches a cell, on ``target``."""
    try:
        best, _ = max_batch(target, workload, mode, seq_len, budget, max_batch_size=max_batch_size)
    except (InvalidInput, ProbeError) as exc:  # e.g. a model without gradient checkpointing
        return Lever(name, label, None, mode.name, seq_len, workload.optimizer, estimated, error=str(exc))
    return Lever(name, label, best, mode.name, seq_len, workload.optimizer, estimated,
                 capped=best >= max_batch_size, note=note)


def eight_bit_lever(name: str, label: str, variant: Variant, *, backend: Backend, workload: Workload,
                    mode: Mode, seq_len: int, budget: int, max_batch_size: int, real: Real8bit | None,
                    note: str | None = None) -> Lever:
    """An 8-bit AdamW lever (``name``: a bnb.BNB_OPTIMIZERS setup): measured with bitsandbytes where
    ``real`` says how, else (or when that fails, as the note then says) emulated on ``backend``
    (an EstimateBackend) with ``variant`` (instrument.Variant)."""
    from autotune.instrument import InstrumentedBackend

    if real is not None:
        if budget > real.gpu.total_memory_bytes:  # make_backend refuses a larger target too
            why = (f"the budget of {format_bytes(budget)} exceeds the local {real.gpu.name}'s "
                   f"{format_bytes(real.gpu.total_memory_bytes)}")
        else:
            try:
                best, _ = max_batch(real.backend(name), workload, mode, seq_len, budget,
                                    max_batch_size=max_batch_size)
            except AutotuneError as exc:  # no worker, a probe that failed, no bitsandbytes there
                lines = str(exc).strip().splitlines()
                why = f"the measurement failed: {lines[0][:NOTE_CHARS] if lines else type(exc).__name__}"
            else:
                return Lever(name, label, best, mode.name, seq_len, workload.optimizer,
                             f"measured: bitsandbytes {BNB_OPTIMIZERS[name]} on {real.gpu.name}",
                             capped=best >= max_batch_size, note=note)
        fallback = f"not measured ({why}): emulated instead"
        note = f"{note}; {fallback}" if note else fallback
    return search_lever(name, label, InstrumentedBackend(backend, variant), workload, mode, seq_len,  # type: ignore[arg-type]
                        budget=budget, max_batch_size=max_batch_size, estimated=EMULATED_8BIT, note=note)


def _bf16_note(backend: Backend) -> str | None:
    gpu = getattr(backend, "gpu", None)
    if gpu is None or gpu.compute_capability is None or gpu.supports_bf16:
        return None
    major, minor = gpu.compute_capability
    return (f"{gpu.name} (sm{major}{minor}) has no bfloat16 tensor cores: transformers' Trainer "
            "refuses bf16=True there")


def _accumulation(effective: int, base_max: int, mode: Mode, seq_len: int, optimizer: str) -> Lever:
    label = f"gradient accumulation to an effective batch of {effective}"
    if base_max < 1:
        return Lever("accumulation", label, None, mode.name, seq_len, optimizer, AS_THE_TABLE,
                     error="even batch 1 does not fit: accumulation cannot help")
    micro, steps = accumulation_plan(effective, base_max)
    note = (f"batch {effective} fits without accumulation" if effective <= base_max else
            f"batch {micro} x {steps} accumulation steps = {micro * steps}")
    return Lever("accumulation", label, micro, mode.name, seq_len, optimizer, AS_THE_TABLE, note=note)


# -- dynamic padding ----------------------------------------------------------------------------


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
    budget: int, fixed_max: int | None = None, max_batch_size: int = DEFAULT_MAX_BATCH,
) -> PaddingReport:
    """Length-bucketed batches (each padded to its bucket's length) vs fixed padding to seq_len."""
    stats = length_stats(lengths, seq_len)
    cut = [min(n, seq_len) for n in lengths]
    if fixed_max is None:
        fixed_max, _ = max_batch(backend, workload, mode, seq_len, budget, max_batch_size=max_batch_size)
    bounds = bucket_bounds(stats, seq_len)
    counts = dict.fromkeys(bounds, 0)
    for n in cut:
        counts[next(b for b in bounds if b >= n)] += 1
    buckets = []
    for bound in bounds:
        if not counts[bound]:
            continue
        best = fixed_max if bound == seq_len else max_batch(
            backend, workload, mode, bound, budget, max_batch_size=max_batch_size)[0]
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


# -- token lengths of texts ---------------------------------------------------------------------

TEXT_FORMATS = {".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl", ".jsonlines": "jsonl", ".txt": "txt"}
# Texts per tokenizer call: a fast tokenizer encodes a batch on all cores, and memory stays bounded.
TOKENIZE_BATCH = 1000
# Any one of these marks a directory written by save_pretrained (or a hub snapshot) as a tokenizer's;
# without them AutoTokenizer can build a tokenizer with an empty vocabulary from config.json alone.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json", "tokenizer.model",
                   "spiece.model", "sentencepiece.bpe.model")
# csv's default field limit is 128 KiB of text; a long document is a legitimate training text.
CSV_FIELD_LIMIT = 2**31 - 1

# JSON's names for what json.loads returns, for a message about a value that is not a string
JSON_KINDS = {bool: "a boolean", int: "a number", float: "a number", list: "an array", dict: "an object"}
Row = tuple[str, tuple[str, ...]]  # (where, e.g. "row 3" or "line 7"; the text, or the pair of texts)


def lengths_from_texts(path: str | Path, column: str | None, tokenizer_dir: str | Path) -> list[int]:
    """Token lengths of the texts in a file, as the tokenizer in ``tokenizer_dir`` counts them.

    ``path``: .csv, .tsv, .jsonl/.jsonlines (one JSON object a line) or .txt (one text a line, blank
    lines skipped). ``column``: the text column (key), or a pair "question,context" tokenized as
    ``tokenizer(question, context)``; may be None when the file has one column, and must be for .txt.
    Lengths count special tokens and truncate nothing, as a collator with dynamic padding sees them.
    """
    path = Path(path)
    if not path.exists():
        raise InvalidInput(f"texts file {str(path)!r} not found")
    kind = TEXT_FORMATS.get(path.suffix.lower())
    if kind is None:
        raise InvalidInput(f"texts file {str(path)!r}: unknown extension {path.suffix!r}; allowed: "
                           f"{', '.join(TEXT_FORMATS)}")
    columns = tuple(name.strip() for name in column.split(",")) if column is not None else None
    if columns is not None and (len(columns) > 2 or not all(columns)):
        raise InvalidInput(f"text column {column!r}: give one column, or a pair of columns as A,B")
    if kind == "txt" and columns is not None:
        raise InvalidInput(f"texts file {str(path)!r} holds one text a line and has no columns: "
                           "drop the text column, or use .csv, .tsv or .jsonl")
    tokenizer = load_tokenizer(tokenizer_dir)
    lengths: list[int] = []
    old_limit = csv.field_size_limit(CSV_FIELD_LIMIT)
    try:
        with path.open(encoding="utf-8-sig", newline="" if kind in ("csv", "tsv") else None) as file:
            rows = _rows(file, kind, columns, path)
            while batch := list(islice(rows, TOKENIZE_BATCH)):
                lengths += _token_counts(tokenizer, batch, path)
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise InvalidInput(f"cannot read texts file {str(path)!r}: {exc}") from exc
    finally:
        csv.field_size_limit(old_limit)
    if not lengths:
        raise InvalidInput(f"texts file {str(path)!r} holds no texts")
    return lengths


def load_tokenizer(tokenizer_dir: str | Path) -> Any:
    """The (fast, where one exists) tokenizer saved in a local directory; never the network."""
    directory = Path(tokenizer_dir)
    if not directory.is_dir():
        raise InvalidInput(f"tokenizer directory {str(tokenizer_dir)!r} not found: give a local directory "
                           "with the tokenizer's files (as save_pretrained writes them)")
    if not any((directory / name).is_file() for name in TOKENIZER_FILES):
        raise InvalidInput(f"tokenizer directory {str(tokenizer_dir)!r} holds no tokenizer files: expected "
                           f"one of {', '.join(TOKENIZER_FILES)}")
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(directory), local_files_only=True, use_fast=True)
    except Exception as exc:  # whatever a bad file makes transformers raise: the user's input, not ours
        raise InvalidInput(f"cannot load the tokenizer in {str(tokenizer_dir)!r}: "
                           f"{type(exc).__name__}: {exc}") from exc
    if len(tokenizer) <= len(set(tokenizer.all_special_ids)):
        raise InvalidInput(f"the tokenizer in {str(tokenizer_dir)!r} has no vocabulary besides its special "
                           "tokens: its vocabulary file is missing")
    return tokenizer


def _token_counts(tokenizer: Any, batch: list[Row], path: Path) -> list[int]:
    texts = [list(side) for side in zip(*(pair for _, pair in batch), strict=True)]
    encoded = tokenizer(*texts, add_special_tokens=True, truncation=False, return_attention_mask=False,
                        return_token_type_ids=False)["input_ids"]
    counts = [len(ids) for ids in encoded]
    for (where, _), count in zip(batch, counts, strict=True):
        if count == 0:
            raise InvalidInput(f"texts file {str(path)!r}, {where}: the text makes no tokens; "
                               "drop empty texts")
    return counts


def _rows(file: IO[str], kind: str, columns: tuple[str, ...] | None, path: Path) -> Iterator[Row]:
    if kind == "txt":
        return ((f"line {n}", (line.rstrip("\r\n"),)) for n, line in enumerate(file, start=1) if line.strip())
    if kind == "jsonl":
        return _jsonl_rows(file, columns, path)
    return _csv_rows(file, "\t" if kind == "tsv" else ",", columns, path)


def _csv_rows(file: IO[str], delimiter: str, columns: tuple[str, ...] | None, path: Path) -> Iterator[Row]:
    reader = csv.DictReader(file, delimiter=delimiter)
    if not reader.fieldnames:
        return
    columns = _pick_columns(columns, list(reader.fieldnames), path)
    for number, record in enumerate(reader, start=1):
        values = []
        for name in columns:
            value = record[name]
            if value is None:  # a row shorter than the header
                raise InvalidInput(f"texts file {str(path)!r}, row {number} (after the header) has no "
                                   f"value in column {name!r}")
            values.append(value)
        yield f"row {number}", tuple(values)


def _jsonl_rows(file: IO[str], columns: tuple[str, ...] | None, path: Path) -> Iterator[Row]:
    chosen: tuple[str, ...] | None = None  # from the first object: checked against its keys
    for number, line in enumerate(file, start=1):
        if not line.strip():
            continue
        where = f"texts file {str(path)!r}, line {number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InvalidInput(f"{where} is not JSON: {exc}") from exc
        if not isinstance(record, dict):
            raise InvalidInput(f"{where} is not a JSON object: one object a line, with the text under a key")
        if chosen is None:
            chosen = _pick_columns(columns, list(record), path)
        values = []
        for name in chosen:
            if name not in record:
                raise InvalidInput(f"{where} has no key {name!r}; its keys: {', '.join(record) or 'none'}")
            value = record[name]
            if not isinstance(value, str):
                shown = json.dumps(value)
                kind = JSON_KINDS.get(type(value), type(value).__name__)
                what = "null" if value is None else f"{shown}, {kind}" if len(shown) <= 40 else kind
                raise InvalidInput(f"{where}: {name!r} is {what}, not a string")
            values.append(value)
        yield f"line {number}", tuple(values)


def _pick_columns(columns: tuple[str, ...] | None, present: list[str], path: Path) -> tuple[str, ...]:
    listing = ", ".join(repr(name) for name in present) or "none"
    if columns is None:
        if len(present) == 1:
            return (present[0],)
        raise InvalidInput(f"texts file {str(path)!r} has {len(present)} columns ({listing}): name the text "
                           "column with --text-column NAME, or a pair with --text-column A,B")
    for name in columns:
        if name not in present:
            raise InvalidInput(f"column {name!r} not found in texts file {str(path)!r}; "
                               f"its columns: {listing}")
    return columns
