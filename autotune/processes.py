"""What the two kinds of child process share: the cuda backend's probe worker (one per cell,
``autotune/backends/cuda/probe_worker.py``) and the service's run worker (one per run,
``api/runs/worker.py``).

Both speak JSON lines on stdin/stdout with their parent, so both keep a private copy of stdout
for the protocol (``protocol_stream``); both are started with autotune importable
(``child_env``); and a parent reports the death of either the same way (``exit_reason``).
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TextIO

# The folder that holds the ``autotune`` (and ``api``) packages: a child started with ``-m``
# imports them from there, installed or not.
SOURCE_ROOT = Path(__file__).resolve().parent.parent


def signal_name(number: int) -> str:
    """SIGKILL for 9: how a process that died by a signal is reported."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)


def exit_reason(code: int | None) -> str:
    """"was killed by signal SIGKILL" or "exited with code 1", from a Popen return code."""
    if code is not None and code < 0:
        return f"was killed by signal {signal_name(-code)}"
    return f"exited with code {code}"


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment (PYTORCH_CUDA_ALLOC_CONF included), autotune importable,
    with ``extra`` on top (e.g. CUDA_VISIBLE_DEVICES of a lane)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SOURCE_ROOT), env.get("PYTHONPATH")) if p)
    env.update(extra or {})
    return env


def protocol_stream() -> TextIO:
    """A private copy of stdout for protocol replies; file descriptor 1 then points at stderr.

    torch, transformers and C libraries may print to stdout, and one stray line would be read
    as a reply.
    """
    sys.stdout.flush()
    stream = os.fdopen(os.dup(sys.stdout.fileno()), "w", encoding="utf-8")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    return stream
