"""No page of this server may be shown inside another site's frame (clickjacking): every response
says so, ``Content-Security-Policy: frame-ancestors 'none'`` for today's browsers and
``X-Frame-Options: DENY`` for older ones.

A dashboard page framed by another site could be made to take clicks its user did not mean (the
New table form, Cancel). Pure ASGI, outermost, so that the answers of the other middleware (a 400
for a Host this server does not answer to, a 401, a 413) carry the headers too. A policy a route
sets (the API docs', api/docs.py) keeps its other directives; its frame-ancestors is 'none'.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

FRAME_ANCESTORS = b"frame-ancestors 'none'"
CSP = b"content-security-policy"


def with_frame_policy(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """``headers`` with frame-ancestors 'none' in their Content-Security-Policy and X-Frame-Options DENY."""
    out, has_policy = [], False
    for name, value in headers:
        lower = name.lower()
        if lower == b"x-frame-options":
            continue
        if lower == CSP:  # its directives kept, but for frame-ancestors: 'none' whatever it said
            has_policy = True
            kept = [d.strip() for d in value.split(b";")
                    if d.strip() and not d.strip().lower().startswith(b"frame-ancestors")]
            value = b"; ".join([*kept, FRAME_ANCESTORS])
        out.append((name, value))
    if not has_policy:
        out.append((CSP, FRAME_ANCESTORS))
    out.append((b"x-frame-options", b"DENY"))
    return out


class NoFraming:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def framed(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": with_frame_policy(list(message.get("headers", [])))}
            await send(message)

        await self.app(scope, receive, framed)
