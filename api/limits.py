"""Limits on what a request may ask: the size and arrival time of its body, and the ranges of the
numbers it may give.

The body limits are ASGI middleware, checked before the body reaches a route; the numeric bounds
are constants that the routes' declarations (and the table request's normaliser) name, so that a
number too large for what handles it is a 422 naming the field, never a 500 from deep inside.
"""

from __future__ import annotations

import json

import anyio
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from autotune.workload.adapters import MAX_R

# Offsets of the run lists (/v1/tables, the dashboard's pages) are bound as SQLite integers, which
# are signed 64-bit (https://www.sqlite.org/datatype3.html): one more is an OverflowError.
MAX_OFFSET = 2**63 - 1
# The largest batch /v1/check and /v1/explain take. A batch of 2**20 sequences of 8192 tokens over
# a 256k vocabulary still has logits of 2**51 elements, within the int64 sizes of the estimator's
# (fake) tensors; at 2**62 torch's storage size calculation overflowed (a 500). No device trains a
# micro-batch of a million sequences.
MAX_BATCH_SIZE = 2**20
MAX_ACCUMULATION_STEPS = 2**20  # the same bound for gradient accumulation steps
# GRPO's num_generations and steps_per_generation: a generation batch is batch x steps_per_generation
# rows, traced on fake tensors; TRL's recipes use 2 to 64 generations and a few steps per generation.
MAX_GENERATIONS = 1024
# The largest target card (gpu_memory). Today's largest hold 288 GB (B300, MI355X); 4 TiB leaves
# room for generations of them and keeps every byte count well inside SQLite's integers.
MAX_GPU_MEMORY_BYTES = 4 * 1024**4
# LoRA (autotune.workload.adapters): the rank within adapters.MAX_R (far above any rank in use),
# alpha a positive finite number, dropout in [0, 1). Target modules: names of modules of the model
# (a Llama layer has 7 linear ones), at most MAX_LORA_TARGETS of at most MAX_LORA_TARGET_CHARS each.
MAX_LORA_R = MAX_R
MAX_LORA_TARGETS = 64
MAX_LORA_TARGET_CHARS = 100
MAX_LORA_TARGETS_CHARS = MAX_LORA_TARGETS * (MAX_LORA_TARGET_CHARS + 1)  # as one comma-separated string


class BodyLimits:
    """Answer 413 to a body larger than ``max_bytes``, by Content-Length or as it streams in, and
    408 to one that has not arrived whole ``timeout_s`` seconds after the request's headers.

    Pure ASGI: the body is read here, up to the limit, and handed on whole, so a chunked body
    without a Content-Length is counted too, and a route never waits on a client that stalls (a
    slow-body client would otherwise hold a connection and its memory for as long as it likes).
    The bodies of this API are small JSON documents.
    """

    def __init__(self, app: ASGIApp, max_bytes: int, timeout_s: float) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None:
            if not length.isdigit():
                await _reply(send, 400, f"invalid Content-Length {length.decode(errors='replace')!r}")
                return
            if int(length) > self.max_bytes:
                await _reply(send, 413, self._too_large(str(int(length))))
                return
        try:
            with anyio.fail_after(self.timeout_s):
                read = await self._read(receive)
        except TimeoutError:
            await _reply(send, 408, self._too_slow(), close=True)
            return
        if read is None:
            await _reply(send, 413, self._too_large(f"more than {self.max_bytes}"))
            return
        pending: list[Message] = [read]

        async def replay() -> Message:
            return pending.pop() if pending else await receive()

        await self.app(scope, replay, send)

    async def _read(self, receive: Receive) -> Message | None:
        """The whole body as one message (or the disconnect that ended it); None when too large."""
        body = b""
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away: let the app see it
                return message
            body += message.get("body", b"")
            if len(body) > self.max_bytes:
                return None
            if not message.get("more_body", False):
                return {"type": "http.request", "body": body, "more_body": False}

    def _too_large(self, size: str) -> str:
        return (f"request body of {size} bytes exceeds this server's limit of {self.max_bytes} bytes "
                "(AUTOTUNE_MAX_BODY_BYTES)")

    def _too_slow(self) -> str:
        return (f"the request body did not arrive within this server's limit of {self.timeout_s:g} s "
                "(AUTOTUNE_BODY_TIMEOUT_S): send the whole body at once")


async def _reply(send: Send, status: int, detail: str, *, close: bool = False) -> None:
    """A JSON error answered before the app; ``close``: the connection too (its request is unread)."""
    body = json.dumps({"detail": detail}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
