"""The exception tree of autotune: every exception class autotune defines is here.

    AutotuneError                 base of everything autotune raises on purpose
    ├── InvalidInput              bad input from a user: CLI exit 2, HTTP 422
    │   ├── UnknownModel          a model name that resolves nowhere (lists the presets): HTTP 404
    │   ├── UnknownGpu            a GPU name that is not a preset (lists the presets)
    │   ├── SequenceTooLong       seq_len beyond the model's max_position_embeddings
    │   ├── UnmodelledSetting     a training config key that changes memory in a way autotune does
    │   │                         not model (LoRA, DeepSpeed, ...): refused, never ignored
    │   ├── UnknownSetting        a training config key its format does not have (a typo, most
    │   │                         often): refused with the closest known keys, never ignored
    │   ├── JobFails              the job as written fails in its own libraries, for a reason
    │   │                         other than memory (a patch that asserts, a config check that
    │   │                         raises): no batch fits it; the message quotes where it fails
    │   └── ModelPathRefused      a model path the service may not read: HTTP 403
    ├── BackendUnavailable        e.g. backend cuda on a machine without CUDA: HTTP 503
    ├── Overloaded                the service has no room for a request now (every analysis worker
    │                             busy, or the request runs past the time limit): HTTP 503 with
    │                             Retry-After
    ├── ProbeError                a probe failed for a reason other than out-of-memory
    │   ├── SearchError           a search stopped at a probe that failed (carries its probes)
    │   ├── WorkerFailed          a cuda probe worker died, hung, or broke the protocol
    │   └── ProtocolError         a line that is not a message of the probe worker protocol
    ├── OutOfMemory               the allocator simulator refused an allocation (the estimator
    │                             catches it: a probe's "oom", never an error a user sees)
    ├── StoreError                the service's database cannot be opened or is not autotune's
    └── ServiceError              an autotune service asked by ``check --server`` failed (a 5xx) or
                                  could not be reached (its 4xx are the user's: InvalidInput)

Each InvalidInput has a ``kind``, which the CLI's ``--json`` and the API answer beside the message:
"invalid" (the request itself), "not modelled" (UnmodelledSetting: autotune's gap, the job may run),
"unknown key" (UnknownSetting) and "job fails" (JobFails: the real job would fail too), so a user or a
benchmark tells autotune's gaps from jobs that would not start.

Errors become exit codes or HTTP responses only at the edges: ``autotune/cli`` (exit 2 with
``Error: ...``) and ``api/errors.py`` (one exception handler for the whole app). Messages name
request fields (``seq_len``, ``gpu_memory``), not CLI flags: they reach HTTP users too. A message
that names fields is written with them in braces (``naming``); the CLI words them as its flags.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, Self

# A request field named in an error's message: ``{lora_r}`` (AutotuneError.naming).
_FIELD = re.compile(r"\{([a-z][a-z0-9_]*)\}")


class AutotuneError(Exception):
    """Base class of every error autotune raises on purpose.

    ``field``: the request field the error is about, when an entry point knows it (the API
    answers it beside the message, so a form can show the error next to that field).
    ``others``: errors of the same request found after this one, each with its field: an entry
    point that checks every field (the service's normalize) raises the first and carries the rest.
    """

    field: str | None = None
    others: tuple[AutotuneError, ...] = ()
    # The message with the request fields it names in braces ("{lora_r} needs {peft} lora"); None:
    # the message names none.
    template: str | None = None
    # The message in one line, where the message is long (an unknown model's lists every preset and
    # says why the hub could not be asked): what a form shows next to the field. None: the message.
    brief: str | None = None

    @classmethod
    def naming(cls, template: str) -> Self:
        """An error whose message names request fields, written ``{name}``: its text says the
        field names (``lora_r needs peft lora``), ``worded`` says them another way (the CLI's
        flags). For the classes whose constructor takes the message alone."""
        exc = cls(_FIELD.sub(r"\1", template))
        exc.template = template
        return exc

    def worded(self, names: Mapping[str, str]) -> str:
        """The message with each field it names as ``names`` calls it (a name not in ``names`` kept)."""
        if self.template is None:
            return str(self)
        return _FIELD.sub(lambda match: names.get(match[1], match[1]), self.template)


class InvalidInput(AutotuneError, ValueError):
    """The user asked for something that is not allowed; the message says what is."""

    kind = "invalid"  # the module docstring lists the kinds

    def within(self, where: str) -> InvalidInput:
        """This refusal said of ``where`` (a config file, quoted): its message followed by it, of the
        same kind (a job that fails stays one)."""
        kinds = (JobFails, UnmodelledSetting, UnknownSetting)
        kind = next((cls for cls in kinds if isinstance(self, cls)), InvalidInput)
        return kind(f"{self} (in {where!r})")


class UnknownModel(InvalidInput):
    """A model name that is neither a preset, a local config, nor a reachable hub id."""


class UnknownGpu(InvalidInput):
    """A GPU name that is not one of the presets."""


class SequenceTooLong(InvalidInput):
    """A sequence length beyond the model's position-embedding limit."""

    def __init__(self, message: str, limit: int) -> None:
        super().__init__(message)
        self.limit = limit


class UnmodelledSetting(InvalidInput):
    """A training config (or PyTorch's allocator settings, PYTORCH_ALLOC_CONF) sets a key that
    changes memory in a way autotune does not model.

    The message names the key, its value and the file; a verdict for a different job is worse
    than none, so such keys are refused, never ignored.
    """

    kind = "not modelled"


class UnknownSetting(InvalidInput):
    """A training config (or PYTORCH_ALLOC_CONF) sets a key that autotune does not know for its
    format: a typo, or a key of a newer release. Whether it changes memory cannot be told, so it is
    refused, naming the known keys closest to it, never listed as ignored."""

    kind = "unknown key"


class JobFails(InvalidInput):
    """The job as written fails in the real libraries before it trains, for a reason other than
    memory: Axolotl's patch asserts on a model's attention, a config check of Axolotl, TRL or
    DeepSpeed raises, a trainable parameter gets no gradient. No batch size makes such a job fit,
    so it is an error (exit 2), not a verdict; the message quotes the library's error and where it
    is raised, and how to write the job so that it runs."""

    kind = "job fails"


class ModelPathRefused(InvalidInput):
    """A model name that is a path this server may not read (HTTP 403)."""


class BackendUnavailable(AutotuneError):
    """The requested backend cannot run on this machine."""


class Overloaded(AutotuneError):
    """The service cannot take this request now; ``retry_after_s``: when asking again may help."""

    def __init__(self, message: str, *, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class ProbeError(AutotuneError):
    """A probe failed for a reason other than running out of memory.

    Never read as "does not fit": the table reports it as an error.
    """


class SearchError(ProbeError):
    """A probe ended in an error, not in fits or out-of-memory.

    ``probes`` holds every probe made, the failing one last; ``probe`` is the failing one.
    """

    # Probes are search.Probe; typed Any so that this module, the root of the tree, imports nothing.
    def __init__(self, message: str, probes: Sequence[Any], probe: Any) -> None:
        super().__init__(message)
        self.probes = tuple(probes)
        self.probe = probe


class WorkerFailed(ProbeError):
    """A probe worker process died, hung, or broke the protocol."""

    def __init__(self, message: str, *, exit_code: int | None = None, stderr_tail: str = "") -> None:
        # The last line of stderr is usually the exception or the crash; the rest is in details.
        last = stderr_tail.strip().splitlines()[-1] if stderr_tail.strip() else ""
        super().__init__(message + (f"; its stderr ends with: {last}" if last else ""))
        self.exit_code = exit_code
        self.stderr_tail = stderr_tail


class ProtocolError(ProbeError):
    """A line that is not a message of the probe worker protocol."""


class OutOfMemory(AutotuneError):
    """The simulated allocator cannot serve a request: torch.OutOfMemoryError.

    The message is worded like the real one (the allocator simulator writes it).
    """

    def __init__(
        self,
        message: str,
        *,
        requested_bytes: int,
        segment_bytes: int,
        allocated_bytes: int,
        reserved_bytes: int,
        capacity_bytes: int,
    ) -> None:
        super().__init__(message)
        self.requested_bytes = requested_bytes  # what the caller asked for
        self.segment_bytes = segment_bytes  # the cudaMalloc that failed
        self.allocated_bytes = allocated_bytes
        self.reserved_bytes = reserved_bytes
        self.capacity_bytes = capacity_bytes


class StoreError(AutotuneError):
    """The database cannot be opened or is not an autotune database."""


class ServiceError(AutotuneError):
    """An autotune service asked for an answer (``check --server``) failed or was unreachable."""
