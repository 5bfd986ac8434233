"""The host names this server answers to (AUTOTUNE_ALLOWED_HOSTS), checked before anything else.

A page on any web site can make a browser send requests to a server on its loopback, by pointing
a name it owns at 127.0.0.1 (DNS rebinding); the request's Host header still carries that name.
Answering only the names the server is reached by refuses such requests, and keeps the URLs the
API builds from Host (``url`` and ``Location`` of a new table) pointing at this server.

Names are matched without port, case-insensitively; ``*`` allows any host and ``*.example.com``
any name under example.com (not example.com itself), as Starlette's TrustedHostMiddleware does.
That middleware is not used because it reads ``[::1]:8000`` as the host ``[``, and answers plain
text where this API answers JSON.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

# What a client on this machine calls it: the default of AUTOTUNE_ALLOWED_HOSTS.
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")

_NAME = re.compile(r"(\*\.)?[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?(\.[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?)*")
HOSTS_FORMS = ("use host names or IP addresses without scheme or port, comma-separated "
               "(e.g. 'localhost,gpu-box.internal'), '*.example.com' for the names under a domain, "
               "or '*' for any")


def parse_hosts(text: str) -> tuple[str, ...]:
    """AUTOTUNE_ALLOWED_HOSTS: comma-separated names, lower-cased, brackets of IPv6 addresses
    dropped; blank is the default (LOOPBACK_HOSTS). ValueError(the forms allowed) on a bad one."""
    hosts = []
    for item in text.split(","):
        host = _bare(item.strip().lower())
        if not host:
            continue
        if host != "*" and not _NAME.fullmatch(host) and not _is_address(host):
            raise ValueError(f"{item.strip()!r} is not a host name: {HOSTS_FORMS}")
        hosts.append(host)
    return tuple(dict.fromkeys(hosts)) or LOOPBACK_HOSTS


def with_host(hosts: Sequence[str], bind: str) -> tuple[str, ...]:
    """``hosts`` and the address a server binds to, which its clients may use as its name; not a
    wildcard address (0.0.0.0, ::), which no client uses: those name no host."""
    host = _bare(bind.strip().lower())
    if not host or (_is_address(host) and ipaddress.ip_address(host).is_unspecified):
        return tuple(hosts)
    return tuple(dict.fromkeys([*hosts, host]))


def host_of(header: str) -> str | None:
    """The host of a Host header (``name``, ``name:port``, ``[v6]:port``), lower case, without port
    or brackets; None when there is none."""
    value = header.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        host, rest = (value[1:end], value[end + 1:]) if end > 0 else ("", "")
        if rest and not (rest.startswith(":") and rest[1:].isdigit()):
            return None
    elif value.count(":") == 1:
        host, _, port = value.partition(":")
        if port and not port.isdigit():
            return None
    else:  # no port, or an IPv6 address without the brackets it needs; it will not match a name
        host = value
    return _bare(host) or None


def allows(patterns: Sequence[str], host: str) -> bool:
    return any(
        pattern == "*" or host == pattern or (pattern.startswith("*.") and host.endswith(pattern[1:]))
        for pattern in patterns
    )


class TrustedHosts:
    """Answer 400 to a request whose Host header is missing or names a host not in ``allowed``."""

    def __init__(self, app: ASGIApp, allowed: Sequence[str]) -> None:
        self.app = app
        self.allowed = tuple(allowed)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # lifespan; this app serves no websockets
            await self.app(scope, receive, send)
            return
        header = next((v for k, v in scope["headers"] if k == b"host"), None)
        host = host_of(header.decode("latin-1")) if header is not None else None
        if host is not None and allows(self.allowed, host):
            await self.app(scope, receive, send)
            return
        if header is None:
            detail = "the request has no Host header: HTTP/1.1 requires one"
        else:
            shown = header.decode("latin-1")[:100]
            detail = (f"host {shown!r} is not one this server answers to: name it in the server's "
                      "AUTOTUNE_ALLOWED_HOSTS")
        await JSONResponse({"detail": detail}, status_code=400)(scope, receive, send)


def _bare(host: str) -> str:
    """A host without IPv6 brackets or the trailing dot of a fully qualified name."""
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host[:-1] if host.endswith(".") and host != "." else host


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
