"""Requests at once, with /v1/health ahead of the line: the service answers its health check
promptly however many clients read it.

One process serves every request on one event loop (the runner owns the GPUs, so there is one
server). Under more reads than it can serve, every request waits behind the others' work, health
included, and a load balancer or the container's health check would call a saturated but healthy
server dead. So at most ``limit`` requests are handled at once; the others wait in line, which
costs nothing while they wait.

Two kinds of request do not stand in the line: /v1/health, and the heavy reads (check, explain,
the dashboard's explain panel), which spend their time waiting for an analysis worker: holding a
place in the line for that long would stop every page. They are bounded by the analysis pool and
the limiter of their preparation instead (api/runs/analysis.py).
"""

from __future__ import annotations

import asyncio
import re

from starlette.types import ASGIApp, Receive, Scope, Send

# Handled at once: enough to keep one process busy (the benchmark's 20 readers get the same
# throughput at 4 as at 40), few enough that health never waits behind many.
REQUESTS_AT_ONCE = 4
OUTSIDE_THE_LINE = re.compile(r"^/v1/(health|check|explain)$|^/runs/[^/]+/explain$")


class Admission:
    def __init__(self, app: ASGIApp, limit: int = REQUESTS_AT_ONCE) -> None:
        self.app = app
        self.limit = limit
        self._slots: asyncio.Semaphore | None = None  # made on the server's loop, at the first request

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or OUTSIDE_THE_LINE.match(scope["path"]):
            await self.app(scope, receive, send)
            return
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.limit)
        async with self._slots:
            await self.app(scope, receive, send)
