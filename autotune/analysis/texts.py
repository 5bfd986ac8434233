"""Token lengths of a column of texts, counted by a tokenizer from a local directory.

For dynamic padding (padding.py): ``lengths_from_texts`` reads .csv, .tsv, .jsonl/.jsonlines or
.txt, tokenizes with ``AutoTokenizer.from_pretrained(DIR, local_files_only=True)`` (never the
network), counts special tokens and truncates nothing, as a collator with dynamic padding sees
the texts.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from itertools import islice
from pathlib import Path
from typing import IO, Any

from autotune.errors import InvalidInput

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
