"""A limit on the size of request bodies, checked before the body reaches a route."""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send


class BodySizeLimit:
    """Answer 413 to a body larger than ``max_bytes``, by Content-Length or as it streams in.

    Pure ASGI: the body is read here, up to the limit, and handed on whole, so a chunked body
    without a Content-Length is counted too. The bodies of this API are small JSON documents.
    """

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None:
            if not length.isdigit():
                await self._reply(send, 400, f"invalid Content-Length {length.decode(errors='replace')!r}")
                return
            if int(length) > self.max_bytes:
                await self._reply(send, 413, self._detail(str(int(length))))
                return
        body, first = b"", None
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away: let the app see it
                first = message
                break
            body += message.get("body", b"")
            if len(body) > self.max_bytes:
                await self._reply(send, 413, self._detail(f"more than {self.max_bytes}"))
                return
            if not message.get("more_body", False):
                break
        pending: list[Message] = [first or {"type": "http.request", "body": body, "more_body": False}]

        async def replay() -> Message:
            return pending.pop() if pending else await receive()

        await self.app(scope, replay, send)

    def _detail(self, size: str) -> str:
        return (f"request body of {size} bytes exceeds this server's limit of {self.max_bytes} bytes "
                "(AUTOTUNE_MAX_BODY_BYTES)")

    @staticmethod
    async def _reply(send: Send, status: int, detail: str) -> None:
        body = json.dumps({"detail": detail}).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
