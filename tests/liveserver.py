"""A real ``autotune serve`` process on a free loopback port, for the tests that need the network
path (the HTTP flow, restarts, the dashboard in a browser)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT_S = 90.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """``python -m autotune.cli.serve`` on a free loopback port (what ``autotune serve`` runs)."""

    def __init__(self, db: Path, log: Path, **env: str) -> None:
        self.db, self.port = db, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log.open("ab")
        path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
        environ = os.environ | {"PYTHONPATH": path, "AUTOTUNE_ESTIMATE_WORKERS": "2"} | env
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "autotune.cli.serve", "--port", str(self.port), "--db", str(db),
             "--log-level", "warning"],
            cwd=ROOT, env=environ, stdout=self.log, stderr=subprocess.STDOUT,
        )
        self.client = httpx.Client(base_url=self.url, timeout=10.0)
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            assert self.proc.poll() is None, f"the server exited: {log.read_text()[-2000:]}"
            with contextlib.suppress(httpx.TransportError):
                if self.client.get("/v1/health").status_code == 200:
                    return
            assert time.monotonic() < deadline, "the server did not answer /v1/health"
            time.sleep(0.1)

    def kill(self) -> None:
        """SIGKILL: no shutdown handler runs, as in a crash or an OOM kill."""
        self.proc.kill()
        self.proc.wait()
        self.client.close()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.client.close()
        self.log.close()

    def wait_for(self, url, predicate, step_s: float = 0.25):
        """The table at ``url`` once ``predicate`` holds, polled every ``step_s``: each poll is a
        request the server answers (2 ms of CPU on both sides), so a run of a minute polled every
        20 ms cost seconds of the suite's two cores; a test that acts on a passing state polls faster."""
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            table = self.client.get(url).json()
            if predicate(table):
                return table
            assert time.monotonic() < deadline, f"gave up waiting; the run is {table}"
            time.sleep(step_s)
