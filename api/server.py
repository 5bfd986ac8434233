"""The HTTP server under the app: uvicorn, with the bounds on connections that uvicorn lacks.

``serve(app, settings, host=..., port=...)`` is what ``autotune serve`` runs. uvicorn (0.3x to
0.5x, its h11 protocol) closes a connection that is idle *between* requests after
``timeout_keep_alive``, but puts no time limit on a request's head (its request line and
headers) and no limit on how many connections are open: a client that sends a header line every
few seconds holds its connection forever, and a thousand such clients use up the process's file
descriptors ("Too many open files"), after which no one is served. ``GuardedH11Protocol`` adds:

- a deadline for the head: it must arrive whole within ``header_timeout_s`` of the connection
  opening, or of the previous response on the same connection ending. Arriving slowly does not
  extend it (every byte counts against one deadline, not an idle timer). Past it a connection that
  sent part of a head is answered 408 and closed, one that sent nothing is closed;
- a cap on open connections, ``max_connections`` in all and ``max_connections_per_client`` from
  one address (a trusted proxy's connections count only in the total: they carry everyone's
  requests). One more is answered 503 at once and closed, so that one client cannot take the
  server's descriptors nor every connection from the others;
- the descriptor limit raised to fit the cap (``fit_descriptors``): the soft RLIMIT_NOFILE up to
  the hard one where the cap needs it, else the cap lowered to what the limit leaves, with a
  warning that names ``ulimit -n``.

Proxy headers (X-Forwarded-For, X-Forwarded-Proto) are believed only from the addresses of
AUTOTUNE_TRUSTED_PROXIES (none by default): from anyone else they are ignored, so a local client
cannot pass for another address (its share of the line and the pool) nor make the links the API
builds say https.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ipaddress
import json
import logging
import resource
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import h11
import uvicorn
from uvicorn.config import STARTUP_FAILURE
from uvicorn.protocols.http.h11_impl import H11Protocol

from api.settings import Settings

log = logging.getLogger("autotune.api")

# Connections accepted at once, and the listen queue's length: asyncio accepts up to this many in one
# go, each a descriptor before its protocol runs and can refuse it (a burst takes up to about three
# batches before the first refusals close), and the kernel holds the rest; uvicorn's default is 2048.
ACCEPT_BACKLOG = 128
# Descriptors the server needs besides its connections: the database and its -wal and -shm, the
# pipes of run and analysis workers, Python's own files (about 15 at rest), the refused connections
# that linger (MAX_LINGERING) and a burst of accepts (3 x ACCEPT_BACKLOG); generous.
RESERVED_DESCRIPTORS = 512
# A refused connection is answered 503 and then read (and dropped) for up to LINGER_S before it is
# closed, so that the client reads the answer: closing a socket with a request unread sends a reset,
# and the client may lose the 503 and see "connection reset". At most MAX_LINGERING linger at once
# (more are closed at once), so that a flood of refused connections holds few descriptors.
LINGER_S = 1.0
MAX_LINGERING = 64
REFUSALS_LOGGED_EVERY_S = 10.0  # refusals are logged at most this often, with their count (a flood)


@dataclass(frozen=True)
class ConnectionLimits:
    header_timeout_s: float
    max_connections: int
    max_connections_per_client: int
    trusted_proxies: tuple[str, ...] = ()  # addresses or networks (CIDR): only the total counts them

    def is_proxy(self, address: str) -> bool:
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return False
        return any(ip in ipaddress.ip_network(net, strict=False) for net in self.trusted_proxies)


def limits_of(settings: Settings) -> ConnectionLimits:
    return ConnectionLimits(header_timeout_s=settings.header_timeout_s,
                            max_connections=settings.max_connections,
                            max_connections_per_client=settings.max_connections_per_client,
                            trusted_proxies=settings.trusted_proxies)


def _raw_response(status: int, reason: str, detail: str, extra: Sequence[tuple[str, str]] = ()) -> bytes:
    """A whole HTTP/1.1 response that closes the connection: written before (or without) a request."""
    body = json.dumps({"detail": detail}).encode()
    lines = [f"HTTP/1.1 {status} {reason}", "content-type: application/json",
             f"content-length: {len(body)}", "connection: close", *(f"{k}: {v}" for k, v in extra)]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


@dataclass
class _Books:
    """One server's counts: open connections per client address, refused ones lingering."""

    per_address: collections.Counter[str]
    lingering: int = 0
    refused: int = 0  # since the last refusal logged
    logged_at: float = float("-inf")  # loop time of the last refusal logged


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline for each request's head and a cap on connections
    (module docstring). ``guarded_protocol(limits)`` makes the class of one server."""

    limits: ClassVar[ConnectionLimits]
    books: ClassVar[_Books]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_timer: asyncio.TimerHandle | None = None
        self._address: str | None = None  # counted in books.per_address while open
        self._refused = False
        self._lingering: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        peer = transport.get_extra_info("peername")
        address = str(peer[0]) if isinstance(peer, list | tuple) and peer else ""
        limits = self.limits
        refusal = None
        if len(self.connections) >= limits.max_connections:
            refusal = (f"this server has {limits.max_connections} connections open, its limit "
                       "(AUTOTUNE_MAX_CONNECTIONS): try again shortly")
        elif (address and self.books.per_address[address] >= limits.max_connections_per_client
              and not limits.is_proxy(address)):
            refusal = (f"{address} has {limits.max_connections_per_client} connections open to this "
                       "server, the limit of one client (AUTOTUNE_MAX_CONNECTIONS_PER_CLIENT): reuse "
                       "them, or close some")
        if refusal is not None:
            self._refuse(transport, address, refusal)
            return
        if address:
            self._address = address
            self.books.per_address[address] += 1
        super().connection_made(transport)
        self._await_head()

    def _refuse(self, transport: asyncio.Transport, address: str, refusal: str) -> None:
        """503 and closed: after LINGER_S of reading what the client sends, or at once when
        MAX_LINGERING others linger."""
        self._refused = True
        self.transport = transport
        books = self.books
        books.refused += 1
        if self.loop.time() - books.logged_at >= REFUSALS_LOGGED_EVERY_S:
            log.warning("refused %d connection(s) since the last such warning; the latest, from %s: %s",
                        books.refused, address or "unknown", refusal)
            books.refused, books.logged_at = 0, self.loop.time()
        transport.write(_raw_response(503, "Service Unavailable", refusal, [("retry-after", "1")]))
        if self.books.lingering >= MAX_LINGERING or not transport.can_write_eof():
            transport.close()
            return
        self.books.lingering += 1
        transport.write_eof()  # the answer is all; the client's end (eof_received) closes it
        self._lingering = self.loop.call_later(LINGER_S, transport.close)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._refused:
            if self._lingering is not None:
                self._lingering.cancel()
                self._lingering = None
                self.books.lingering -= 1
            return
        self._cancel_head_timer()
        if self._address is not None:
            self.books.per_address[self._address] -= 1
            if self.books.per_address[self._address] <= 0:
                del self.books.per_address[self._address]
            self._address = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return  # a refused connection's request: dropped
        super().data_received(data)
        if self._head_timer is not None and self.conn.their_state is not h11.IDLE:
            self._cancel_head_timer()  # the head arrived: the app's own limits take over

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._await_head()  # the next request's head, unless it arrived already

    def _await_head(self) -> None:
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return
        self._cancel_head_timer()
        self._head_timer = self.loop.call_later(self.limits.header_timeout_s, self._head_too_slow)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_too_slow(self) -> None:
        self._head_timer = None
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return
        received, _ = self.conn.trailing_data  # what arrived of the head, unparsed
        if received:
            detail = (f"the request's line and headers did not arrive within this server's limit of "
                      f"{self.limits.header_timeout_s:g} s (AUTOTUNE_HEADER_TIMEOUT_S): send them at once")
            log.info("connection from %s closed: %s", self._address or "unknown", detail)
            self.transport.write(_raw_response(408, "Request Timeout", detail))
        self.transport.close()


def guarded_protocol(limits: ConnectionLimits) -> type[GuardedH11Protocol]:
    """A GuardedH11Protocol class of its own (its count of connections per address) for one server."""
    return type("GuardedH11Protocol", (GuardedH11Protocol,),
                {"limits": limits, "books": _Books(collections.Counter())})


def fit_descriptors(limits: ConnectionLimits, reserved: int = RESERVED_DESCRIPTORS) -> ConnectionLimits:
    """``limits`` that the process's descriptors can hold: the soft RLIMIT_NOFILE raised (up to the
    hard limit, which needs no privilege) to the cap plus ``reserved``; where even the hard limit is
    lower, the cap lowered to fit it, with a warning."""
    wanted = limits.max_connections + reserved
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            log.warning("cannot raise the descriptor limit from %d to %d: %s", soft, target, exc)
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return limits
    cap = max(1, soft - reserved)
    log.warning("this process may open %d files (ulimit -n), which leaves room for %d connections, not "
                "AUTOTUNE_MAX_CONNECTIONS=%d: raise the limit (docker run --ulimit nofile=65536, "
                "compose's ulimits) to serve that many", soft, cap, limits.max_connections)
    return ConnectionLimits(limits.header_timeout_s, cap, min(cap, limits.max_connections_per_client),
                            limits.trusted_proxies)


def uvicorn_config(app: Any, settings: Settings, *, host: str, port: int, log_level: str = "info",
                   limits: ConnectionLimits | None = None) -> uvicorn.Config:
    """The uvicorn configuration of ``autotune serve``: the guarded protocol, and proxy headers
    believed only from AUTOTUNE_TRUSTED_PROXIES."""
    limits = limits if limits is not None else limits_of(settings)
    proxies = list(settings.trusted_proxies)
    return uvicorn.Config(
        app, host=host, port=port, log_level=log_level, http=guarded_protocol(limits),
        proxy_headers=bool(proxies), forwarded_allow_ips=proxies or [], backlog=ACCEPT_BACKLOG,
        timeout_graceful_shutdown=10,
    )


def serve(app: Any, settings: Settings, *, host: str, port: int, log_level: str = "info") -> None:
    """Run ``app`` until interrupted (``autotune serve``)."""
    limits = fit_descriptors(limits_of(settings))
    server = uvicorn.Server(uvicorn_config(app, settings, host=host, port=port, log_level=log_level,
                                           limits=limits))
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C: the shutdown ran, as uvicorn.run does
        server.run()
    if not server.started:  # e.g. the port is taken: uvicorn logged why
        raise SystemExit(STARTUP_FAILURE)
