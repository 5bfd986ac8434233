"""The project's child processes, both sides: the cuda backend's probe worker (one per cell,
``autotune/backends/cuda/probe_worker.py``), the estimator's parallel workers (``autotune/parallel.py``),
and the service's run worker (one per run, ``api/runs/worker.py``) and analysis workers
(``api/runs/analysis_worker.py``).

All speak lines on stdin/stdout with their parent, so each child keeps a private copy of stdout for
the protocol (``protocol_stream``). The parent starts each as a ``Child``: with autotune importable
(``child_env``), its stdout read by a thread (a read with a deadline: ``Child.reply``), its stderr's
last lines kept for error reports, killed alone or with its process group, and reaped; a child's
death is reported the same way everywhere (``exit_reason``). What the lines mean is each protocol's.
"""

from __future__ import annotations

import collections
import contextlib
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Literal, TextIO

# The folder that holds the ``autotune`` (and ``api``) packages: a child started with ``-m``
# imports them from there, installed or not.
SOURCE_ROOT = Path(__file__).resolve().parent.parent
STDERR_TAIL_LINES = 40  # of a child's stderr, kept for error reports
READERS_JOIN_S = 2.0  # for the readers to reach the end of a dead child's pipes


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


class Child:
    """A child process, as its parent sees it: lines to its stdin, lines from its stdout.

    ``stderr``: "tail" keeps its last STDERR_TAIL_LINES lines (``stderr_tail``), "discard" drops it,
    "inherit" leaves it on this process's stderr. ``own_group``: the child leads a process group of
    its own (a new session), so that ``kill`` and ``close`` reach the processes it started too.
    """

    def __init__(self, command: Sequence[str], *, env: Mapping[str, str] | None = None,
                 stderr: Literal["tail", "discard", "inherit"] = "tail", own_group: bool = False) -> None:
        self._proc = subprocess.Popen(
            list(command), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr={"tail": subprocess.PIPE, "discard": subprocess.DEVNULL, "inherit": None}[stderr],
            env=child_env() if env is None else dict(env), text=True, encoding="utf-8", errors="replace",
            bufsize=1, start_new_session=own_group,
        )
        self.pid = self._proc.pid
        self.own_group = own_group
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._stderr: collections.deque[str] = collections.deque(maxlen=STDERR_TAIL_LINES)
        # Readers on threads: a blocking read cannot time out, and an undrained stderr pipe
        # would block a child that logs a lot.
        self._readers = [threading.Thread(target=self._read_stdout, daemon=True)]
        if self._proc.stderr is not None:
            self._readers.append(threading.Thread(target=self._read_stderr, daemon=True))
        for reader in self._readers:
            reader.start()

    def _read_stdout(self) -> None:
        assert self._proc.stdout is not None
        with contextlib.suppress(ValueError, OSError):  # closed here meanwhile
            for line in self._proc.stdout:
                self._lines.put(line)
        self._lines.put(None)  # end of file: the child exited or closed its stdout

    def _read_stderr(self) -> None:
        assert self._proc.stderr is not None
        with contextlib.suppress(ValueError, OSError):
            for line in self._proc.stderr:
                self._stderr.append(line)

    def send(self, line: str) -> bool:
        """Write one line (ending in a newline) to its stdin; False when it is gone (its exit says why)."""
        assert self._proc.stdin is not None
        try:
            self._proc.stdin.write(line)
            self._proc.stdin.flush()
        except (OSError, ValueError):  # BrokenPipeError: the child is gone; ValueError: closed here
            return False
        return True

    def reply(self, timeout_s: float | None = None) -> str | None:
        """Its next line on stdout, None once it closed stdout (it exited); TimeoutError when no
        line came within ``timeout_s`` (None: wait for ever)."""
        try:
            return self._lines.get(timeout=timeout_s)
        except queue.Empty:
            raise TimeoutError(f"no line from process {self.pid} in {timeout_s:g} s") from None

    def replies(self) -> Iterator[str]:
        """Its lines on stdout until it closes it."""
        while (line := self.reply()) is not None:
            yield line

    def stderr_tail(self) -> list[str]:
        """The last lines of its stderr; once it exited, all of them (the reader is given a second)."""
        if self._proc.poll() is not None and len(self._readers) > 1:
            self._readers[1].join(timeout=1.0)
        return list(self._stderr)

    def poll(self) -> int | None:
        """Its exit code (Popen's: -9 for SIGKILL), None while it runs."""
        return self._proc.poll()

    def wait(self, timeout_s: float | None = None) -> int | None:
        """Its exit code once it exits; None if it still runs after ``timeout_s``."""
        try:
            return self._proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        """SIGKILL it, and its group when it leads one; returns at once (``wait`` reaps it)."""
        if not self.own_group:
            self._proc.kill()  # nothing once it was reaped
        elif self._proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signal.SIGKILL)

    def close_input(self) -> None:
        """Close its stdin: the end of the requests."""
        with contextlib.suppress(OSError):
            assert self._proc.stdin is not None
            self._proc.stdin.close()

    def stop(self, grace_s: float) -> int | None:
        """Close its stdin, which ends it; kill it if it has not exited after ``grace_s``; then
        ``close``. Its exit code."""
        self.close_input()
        if self.wait(grace_s) is None:
            self.kill()
            self.wait()
        self.close()
        return self.poll()

    def close(self) -> None:
        """Kill what is left of its group (orphans of a child that died would hold a GPU), give the
        readers the end of its output, close the pipes. For a child that exited, or was killed."""
        if self.own_group:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signal.SIGKILL)
        deadline = time.monotonic() + READERS_JOIN_S
        for reader in self._readers:
            reader.join(timeout=max(0.0, deadline - time.monotonic()))
        for stream in (self._proc.stdin, self._proc.stdout, self._proc.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
