"""The service's configuration: one frozen object read from ``AUTOTUNE_*`` environment variables.

pydantic-settings would do the same; a small dataclass avoids a dependency for ten fields.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path

from autotune.backends import BACKENDS
from autotune.errors import InvalidInput

ENV_PREFIX = "AUTOTUNE_"
_TRUE, _FALSE = {"1", "true", "yes", "on"}, {"0", "false", "no", "off", ""}


def _cpu_count() -> int:
    """CPUs this process may run on (a container's cpuset, not the host's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


@dataclass(frozen=True)
class Settings:
    db: Path = Path("autotune.db")  # AUTOTUNE_DB: the SQLite file of the queue and results
    api_token: str | None = None  # AUTOTUNE_API_TOKEN: Bearer token for writes; None = open
    # AUTOTUNE_MODEL_DIRS (os.pathsep-separated): where local model configs may be read from;
    # empty = none, only presets and hub ids.
    model_dirs: tuple[Path, ...] = ()
    allow_hub: bool = True  # AUTOTUNE_ALLOW_HUB: resolve Hugging Face hub ids (configs only)
    backend: str = "auto"  # AUTOTUNE_BACKEND: for requests that name none (auto|cuda|estimate)
    estimate_workers: int = field(default_factory=_cpu_count)  # AUTOTUNE_ESTIMATE_WORKERS: parallel runs
    max_cells: int = 64  # AUTOTUNE_MAX_CELLS: seq_lens x modes per request
    max_batch: int = 4096  # AUTOTUNE_MAX_BATCH: the largest max_batch a request may ask for
    max_seq_len: int = 8192  # AUTOTUNE_MAX_SEQ_LEN: tokens, whatever the model allows
    max_body_bytes: int = 16 * 1024  # AUTOTUNE_MAX_BODY_BYTES: of a request body

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Settings from ``AUTOTUNE_<FIELD>`` variables; InvalidInput naming a malformed one."""
        env = os.environ if environ is None else environ
        values: dict[str, object] = {}
        for f in fields(cls):
            name = ENV_PREFIX + f.name.upper()
            text = env.get(name)
            if text is None:
                continue
            text = text.strip()
            if f.name == "db":
                values["db"] = Path(text) if text else Path("autotune.db")
            elif f.name == "api_token":
                values["api_token"] = text or None
            elif f.name == "model_dirs":
                dirs = [p for p in text.split(os.pathsep) if p.strip()]
                values["model_dirs"] = tuple(Path(p).expanduser() for p in dirs)
            elif f.name == "allow_hub":
                values["allow_hub"] = _boolean(name, text)
            elif f.name == "backend":
                if text not in BACKENDS:
                    raise InvalidInput(f"{name}={text!r}: use one of {', '.join(BACKENDS)}")
                values["backend"] = text
            else:
                values[f.name] = _positive(name, text)
        return cls(**values)  # type: ignore[arg-type]


def _boolean(name: str, text: str) -> bool:
    lowered = text.lower()
    if lowered in _TRUE | _FALSE:
        return lowered in _TRUE
    raise InvalidInput(f"{name}={text!r}: use 1 or 0 (true/false, yes/no, on/off)")


def _positive(name: str, text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise InvalidInput(f"{name}={text!r}: use a positive integer")
    return value
