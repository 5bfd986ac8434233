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

A place in the line is taken only once the request's body has arrived whole (api.limits.BodyLimits
runs first, timed), and a write without the server's token is refused before its body is read
(``TokenGate``): a client that sends a body byte by byte, or many that send no token, hold no
place. One client (``client_of``: its address, told apart from the same address's anonymous
requests when it sends the server's token) holds at most ``per_client`` of the places (all but
one), so that another client always finds one. The analysis pool shares its workers out by the
same client (api/runs/analysis.py).
"""

from __future__ import annotations

import asyncio
import json
import re

from starlette.types import ASGIApp, Receive, Scope, Send

from api.tokens import token_refusal

# Handled at once: enough to keep one process busy (the benchmark's 20 readers get the same
# throughput at 4 as at 40), few enough that health never waits behind many.
REQUESTS_AT_ONCE = 4
OUTSIDE_THE_LINE = re.compile(r"^/v1/(health|check|explain)$|^/runs/[^/]+/explain$")


class Admission:
    def __init__(self, app: ASGIApp, limit: int = REQUESTS_AT_ONCE, per_client: int | None = None,
                 token: str | None = None) -> None:
        self.app = app
        self.limit = limit
        self.token = token  # the server's API token (AUTOTUNE_API_TOKEN), None: none
        self.per_client = per_client if per_client is not None else max(1, limit - 1)
        self._slots: asyncio.Semaphore | None = None  # made on the server's loop, at the first request
        self._clients: dict[str, tuple[asyncio.Semaphore, int]] = {}  # client -> its places, requests

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or OUTSIDE_THE_LINE.match(scope["path"]):
            await self.app(scope, receive, send)
            return
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.limit)
        client = client_of(scope, self.token)
        share, waiting = self._clients.get(client, (asyncio.Semaphore(self.per_client), 0))
        self._clients[client] = (share, waiting + 1)
        try:
            async with share, self._slots:
                await self.app(scope, receive, send)
        finally:
            share, waiting = self._clients[client]
            if waiting == 1:
                del self._clients[client]
            else:
                self._clients[client] = (share, waiting - 1)


def client_of(scope: Scope, token: str | None = None) -> str:
    """Who sends a request, for its share of the line and of the analysis workers: its address
    (the client's, as a trusted proxy names it: api/server.py), and apart from that address's
    anonymous requests when it sends the server's ``token``. Any other Authorization header counts
    for nothing: a client cannot make itself many clients by sending made-up tokens."""
    address = scope.get("client")
    who = "address " + (str(address[0]) if address else "unknown")
    if token is not None:
        authorization = dict(scope.get("headers") or []).get(b"authorization")
        if authorization and token_refusal(token, authorization.decode("latin-1")) is None:
            return who + " with the token"
    return who


WRITES = frozenset({"POST", "PUT", "PATCH", "DELETE"})


class TokenGate:
    """With a token set, a write to the API (/v1/...) without it is answered 401 before its body is
    read (api.deps.token_refusal, the same check the routes declare)."""

    def __init__(self, app: ASGIApp, token: str | None) -> None:
        self.app = app
        self.token = token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (self.token is None or scope["type"] != "http" or scope["method"] not in WRITES
                or not scope["path"].startswith("/v1/")):
            await self.app(scope, receive, send)
            return
        header = dict(scope["headers"]).get(b"authorization")
        refusal = token_refusal(self.token, None if header is None else header.decode("latin-1"))
        if refusal is None:
            await self.app(scope, receive, send)
            return
        detail, challenge = refusal
        body = json.dumps({"detail": detail}).encode()
        await send({"type": "http.response.start", "status": 401, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
            (b"www-authenticate", challenge.encode()), (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})
