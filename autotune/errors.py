"""The exception tree of autotune.

    AutotuneError                 base of everything autotune raises on purpose
    ├── InvalidInput              bad input from a user: CLI exit 2, HTTP 4xx
    │   ├── UnknownModel          a model name that resolves nowhere (lists the presets)
    │   ├── UnknownGpu            a --gpu name that is not a preset (lists the presets)
    │   └── SequenceTooLong       seq_len beyond the model's max_position_embeddings
    ├── BackendUnavailable        e.g. --backend cuda on a machine without CUDA
    └── ProbeError                a probe failed for a reason other than out-of-memory

Errors become exit codes or HTTP responses only at the edges (cli.py, api/).
"""

from __future__ import annotations


class AutotuneError(Exception):
    """Base class of every error autotune raises on purpose.

    ``field``: the request field the error is about, when an entry point knows it (the API
    answers it beside the message, so a form can show the error next to that field).
    """

    field: str | None = None


class InvalidInput(AutotuneError, ValueError):
    """The user asked for something that is not allowed; the message says what is."""


class UnknownModel(InvalidInput):
    """A model name that is neither a preset, a local config, nor a reachable hub id."""


class UnknownGpu(InvalidInput):
    """A GPU name that is not one of the presets."""


class SequenceTooLong(InvalidInput):
    """A sequence length beyond the model's position-embedding limit."""

    def __init__(self, message: str, limit: int) -> None:
        super().__init__(message)
        self.limit = limit


class BackendUnavailable(AutotuneError):
    """The requested backend cannot run on this machine."""


class ProbeError(AutotuneError):
    """A probe failed for a reason other than running out of memory.

    Never read as "does not fit": the table reports it as an error.
    """
