"""The service's configuration: the library's `autotune.settings.Settings` and the service's fields.

``ServiceSettings.from_env()`` reads every ``AUTOTUNE_*`` variable, the library's included (a bad
AUTOTUNE_CONTEXT_OVERHEAD stops the service at start, not at its first run), and raises InvalidInput
naming a malformed one; ``ServiceSettings(db=..., ...)`` is exactly the values given plus the
defaults, whatever the environment holds. ``Settings`` is the same class, the name call sites use.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

from pydantic import BeforeValidator, Field
from pydantic_settings import NoDecode

from autotune.defaults import BACKENDS, DEFAULT_BACKEND, DEFAULT_MAX_BATCH
from autotune.settings import PositiveInt, Switch
from autotune.settings import Settings as LibrarySettings

DEFAULT_DB = Path("autotune.db")


def _cpu_count() -> int:
    """CPUs this process may run on (a container's cpuset, not the host's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _db(value: Any) -> Any:
    if isinstance(value, str):
        return Path(value.strip()) if value.strip() else DEFAULT_DB
    return value


def _dirs(value: Any) -> Any:
    """os.pathsep-separated directories (``/a:/b``), ``~`` expanded; blank entries skipped."""
    if isinstance(value, str):
        return tuple(Path(p).expanduser() for p in value.strip().split(os.pathsep) if p.strip())
    return value


def _backend(value: Any) -> Any:
    if isinstance(value, str):
        value = value.strip()
        if value not in BACKENDS:
            raise ValueError(f"use one of {', '.join(BACKENDS)}")
    return value


DbPath = Annotated[Path, BeforeValidator(_db)]  # "" = DEFAULT_DB
Dirs = Annotated[tuple[Path, ...], NoDecode, BeforeValidator(_dirs)]  # not JSON: /a:/b
Backend = Annotated[str, BeforeValidator(_backend)]  # one of BACKENDS


class ServiceSettings(LibrarySettings):
    """The library's settings (context_overhead, offline, server, api_token) and the service's."""

    # api_token (AUTOTUNE_API_TOKEN) is the library's: writes need it as a Bearer token when set.
    db: DbPath = DEFAULT_DB  # AUTOTUNE_DB: the SQLite file of the queue and results
    # AUTOTUNE_MODEL_DIRS (os.pathsep-separated): where local model configs may be read from;
    # empty = none, only presets and hub ids.
    model_dirs: Dirs = ()
    allow_hub: Switch = True  # AUTOTUNE_ALLOW_HUB: resolve Hugging Face hub ids (configs only)
    backend: Backend = DEFAULT_BACKEND  # AUTOTUNE_BACKEND: for requests that name none (auto|cuda|estimate)
    # AUTOTUNE_ESTIMATE_WORKERS: estimate runs at once; default: the CPUs this process may use
    estimate_workers: PositiveInt = Field(default_factory=_cpu_count)
    max_cells: PositiveInt = 64  # AUTOTUNE_MAX_CELLS: seq_lens x modes per request
    max_batch: PositiveInt = DEFAULT_MAX_BATCH  # AUTOTUNE_MAX_BATCH: largest max_batch a request may ask
    max_seq_len: PositiveInt = 8192  # AUTOTUNE_MAX_SEQ_LEN: tokens, whatever the model allows
    max_body_bytes: PositiveInt = 16 * 1024  # AUTOTUNE_MAX_BODY_BYTES: of a request body


Settings = ServiceSettings
