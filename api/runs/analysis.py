"""Heavy reads away from the server process: ``check`` and ``explain`` that need the estimator.

A GET must not be able to hang the service. So the estimator never runs in the server: an
``AnalysisOrder`` goes to one of a bounded number of worker processes
(``python -m api.runs.analysis_worker``, protocol there), and:

- at most ``workers`` orders run at once, and one client (``client``: its address, with the
  server's token where it sends it; api.admission.client_of) starts at most ``share`` of them, all
  but one (at least one): another client always finds a worker, or the next one to come free;
- an order that finds every worker busy waits for one, if its client has no other order waiting
  and the line is shorter than ``MAX_WAITING``; a worker that comes free goes to the waiting client
  that holds the fewest workers, the longest waiting first, so that one client asking one order
  after another takes turns with the others instead of taking every worker as it frees. An order
  that waited ``timeout_s`` without a worker, or one beyond the client's share or the line, gets
  ``Overloaded`` (HTTP 503 with Retry-After);
- an order that runs past ``timeout_s`` has its worker killed and gets ``Overloaded``; the
  key is remembered for ``TIMEOUT_MEMORY_S`` so that asking again does not burn another worker
  on the same hopeless order;
- an order every waiter abandoned (the client disconnected) has its worker killed;
- results (and refusals such as an unknown model) are cached per order, so the same explain is
  instant the second time; identical orders in flight share one worker.

Workers stay up between orders (importing torch and transformers takes seconds) and are
replaced after ``JOBS_PER_WORKER`` orders, so memory a large model left in one is given back.
"""

from __future__ import annotations

import collections
import concurrent.futures
import hashlib
import json
import logging
import math
import os
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from autotune import errors
from autotune.errors import AutotuneError, Overloaded
from autotune.processes import Child, exit_reason

log = logging.getLogger("autotune.api")
T = TypeVar("T")

ANALYSIS_COMMAND = (sys.executable, "-m", "api.runs.analysis_worker")
KINDS = ("check", "explain")
JOBS_PER_WORKER = 25  # orders a worker answers before it is replaced (memory of large models)
CACHE_ENTRIES = 512  # answers kept, least recently used dropped first
TIMEOUT_MEMORY_S = 300.0  # how long an order that ran past the limit is refused at once
KILL_WAIT_S = 5.0  # for a killed worker to be reaped before its pipes are closed
POLL_S = 0.1  # how often a waiting order looks at its deadline and its waiters
DISCONNECT_POLL_S = 0.25  # how often a waiting request asks whether its client is still there
# Requests of check and explain preparing their order at once (normalising the request, reading the
# stored tables): threads of the server process, so a burst of them would keep the event loop (and
# /v1/health) waiting for the GIL; the rest wait their turn without using the CPU.
PREPARING_AT_ONCE = 2
WAITING_PER_WORKER = 4  # the line for a worker: this many orders per worker (at least MIN_WAITING)
MIN_WAITING = 8


@dataclass(frozen=True)
class AnalysisOrder:
    """One check or explain on the estimator: a normalised spec and the cell's parameters."""

    kind: str  # check | explain
    spec: dict[str, Any]  # TableSpec.to_json(): its environment is part of the key
    params: dict[str, Any]  # seq_len, batch_size, mode, ... (JSON)

    @property
    def key(self) -> str:
        text = json.dumps([self.kind, self.spec, self.params], sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()


@dataclass
class _Job:
    order: AnalysisOrder
    future: concurrent.futures.Future[dict[str, Any]] = field(default_factory=concurrent.futures.Future)
    waiters: int = 1
    abandoned: threading.Event = field(default_factory=threading.Event)
    started: float = field(default_factory=time.monotonic)  # given a worker (or queued, until then)
    client: str = ""  # who asked first: the one whose share it counts in


class Ticket:
    """A request's hold on an order's answer; ``release()`` when the request ends, answered or not."""

    def __init__(self, pool: AnalysisPool, job: _Job) -> None:
        self._pool, self._job, self._released = pool, job, False

    @property
    def future(self) -> concurrent.futures.Future[dict[str, Any]]:
        return self._job.future

    async def result(self, is_disconnected: Callable[[], Awaitable[bool]]) -> dict[str, Any]:
        """The answer (or its error); ``ClientGone`` once ``is_disconnected()`` says so."""
        import asyncio

        waiting = asyncio.wrap_future(self._job.future)
        while True:
            done, _ = await asyncio.wait({waiting}, timeout=DISCONNECT_POLL_S)
            if done:
                return waiting.result()
            if await is_disconnected():
                raise ClientGone()
            self._pool._expire(self._job)  # waited too long for a worker: answered Overloaded

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._pool._release(self._job)


class ClientGone(Exception):
    """The request's client went away while its order ran (nobody to answer)."""


class _Worker(Child):
    """One analysis worker process, answering one order at a time; in a process group of its own
    (killing it reaches any process it started)."""

    def __init__(self, command: Sequence[str], env: Mapping[str, str]) -> None:
        super().__init__(command, env=env, stderr="discard", own_group=True)
        self.jobs = 0

    def end(self) -> None:
        """Kill its group, reap it (for a few seconds at most) and close its pipes."""
        self.kill()
        self.wait(KILL_WAIT_S)
        self.close()


def _error(message: dict[str, Any]) -> AutotuneError:
    """The worker's refusal as the same kind of error (InvalidInput stays a 422, ...)."""
    cls = getattr(errors, str(message.get("error_type")), None)
    text = str(message.get("error"))
    kinds = cls.__mro__ if isinstance(cls, type) and issubclass(cls, AutotuneError) else (AutotuneError,)
    for kind in kinds:  # the class itself, else the nearest base that takes just a message
        if isinstance(kind, type) and issubclass(kind, AutotuneError):
            try:
                exc = kind(text)
            except TypeError:  # e.g. SequenceTooLong(message, limit): its base InvalidInput is a 422 too
                continue
            exc.field = message.get("field")
            return exc
    raise AssertionError("AutotuneError takes a message")


class AnalysisPool:
    """Runs AnalysisOrders in worker processes; see the module docstring."""

    def __init__(
        self,
        *,
        workers: int,
        timeout_s: float,
        command: Sequence[str] = ANALYSIS_COMMAND,
        env: Mapping[str, str] | None = None,
        cache_entries: int = CACHE_ENTRIES,
    ) -> None:
        self.workers = workers
        self.timeout_s = timeout_s
        self.command = tuple(command)
        self.env = dict(os.environ if env is None else env)
        self._lock = threading.Lock()
        self._idle: list[_Worker] = []
        self._running: dict[str, _Job] = {}
        self._busy: set[_Worker] = set()
        self._cache: collections.OrderedDict[str, tuple[dict[str, Any] | None, AutotuneError | None]] = (
            collections.OrderedDict())
        self._cache_entries = cache_entries
        self._too_slow: dict[str, float] = {}  # key -> monotonic time it is refused until
        self._closed = False
        self.share = max(1, workers - 1)  # workers one client's orders may hold at once
        self.max_waiting = max(MIN_WAITING, WAITING_PER_WORKER * workers)
        self._held: collections.Counter[str] = collections.Counter()  # client -> its running orders
        # Orders waiting for a worker, the oldest first: one per client, by key (identical orders join).
        self._waiting: collections.OrderedDict[str, _Job] = collections.OrderedDict()

    # --- requests ---------------------------------------------------------------------------

    def analyze(self, order: AnalysisOrder, client: str = "") -> Ticket:
        """A ticket for the order's answer: cached, shared with an identical order, or a new job,
        running or waiting in line for a worker.

        Overloaded when ``client`` holds its share of the workers already, when every worker is
        busy and the client has an order waiting or the line is full, or when the same order ran
        past the limit lately.
        """
        if order.kind not in KINDS:
            raise ValueError(f"an analysis is one of {KINDS}, not {order.kind!r}")
        key = order.key
        with self._lock:
            if self._closed:
                raise Overloaded("the server is shutting down", retry_after_s=5)
            if key in self._cache:
                self._cache.move_to_end(key)
                job = _Job(order, waiters=0)
                result, error = self._cache[key]
                if error is not None:  # a fresh one: each raise would add to a shared one's traceback
                    job.future.set_exception(_error({"error_type": type(error).__name__, "error": str(error),
                                                     "field": error.field}))
                else:
                    assert result is not None
                    job.future.set_result(result)
                return Ticket(self, job)
            until = self._too_slow.get(key)
            if until is not None and until > time.monotonic():
                raise self._timeout_error(order, retry_after_s=math.ceil(until - time.monotonic()))
            joined = self._running.get(key) or self._waiting.get(key)
            if joined is not None:
                if joined.abandoned.is_set():  # its worker is being killed: it will not answer
                    raise Overloaded("the same request was just given up by its client and is being "
                                     "stopped: ask again in a second", retry_after_s=1)
                joined.waiters += 1
                return Ticket(self, joined)
            self._admit(client)
            job = _Job(order, client=client)
            now = len(self._running) < self.workers
            if now:
                self._start(job)
            else:
                self._waiting[key] = job  # handed a worker by _dispatch, or refused by _expire
        if now:
            self._thread(job)
        return Ticket(self, job)

    def _admit(self, client: str) -> None:
        """Overloaded unless ``client`` may have one more order, now or in line (under the lock)."""
        held = self._held[client]
        busy = len(self._running) >= self.workers
        if held >= self.share:
            where = (f"all {self.workers} analysis workers of this server are busy" if busy else
                     f"{held} of the {self.workers} analysis workers of this server are busy")
            raise Overloaded(
                f"{where} (AUTOTUNE_ANALYSIS_WORKERS), {held} of them with your requests, the most "
                f"one client may hold ({self.share}): ask again when one of them is answered",
                retry_after_s=self._retry_after())
        if not busy:
            return
        if any(job.client == client for job in self._waiting.values()):
            raise Overloaded(
                f"all {self.workers} analysis workers of this server are busy "
                "(AUTOTUNE_ANALYSIS_WORKERS), and another request of yours waits for one: ask again "
                "when it is answered", retry_after_s=self._retry_after())
        if len(self._waiting) >= self.max_waiting:
            raise Overloaded(
                f"all {self.workers} analysis workers of this server are busy "
                f"(AUTOTUNE_ANALYSIS_WORKERS) and {len(self._waiting)} requests wait for one: ask "
                "again shortly", retry_after_s=self._retry_after())

    def _start(self, job: _Job) -> None:
        """Give ``job`` a worker (under the lock; its thread is started by the caller)."""
        job.started = time.monotonic()
        self._running[job.order.key] = job
        self._held[job.client] += 1

    def _thread(self, job: _Job) -> None:
        threading.Thread(target=self._execute, args=(job,), name=f"analysis {job.order.key[:8]}",
                         daemon=True).start()

    def _dispatch(self) -> list[_Job]:
        """Free workers to waiting orders (under the lock): the client holding the fewest workers
        first, then the longest waiting. The jobs started, for the caller to start their threads."""
        started = []
        while self._waiting and len(self._running) < self.workers and not self._closed:
            eligible = [job for job in self._waiting.values() if self._held[job.client] < self.share]
            if not eligible:
                break
            job = min(eligible, key=lambda j: self._held[j.client])  # min is stable: the oldest of ties
            del self._waiting[job.order.key]
            self._start(job)
            started.append(job)
        return started

    def _expire(self, job: _Job) -> None:
        """Refuse a waiting order that has waited ``timeout_s`` for a worker."""
        with self._lock:
            waited = time.monotonic() - job.started
            if self._waiting.get(job.order.key) is not job or waited < self.timeout_s:
                return
            del self._waiting[job.order.key]
            retry = self._retry_after()
        job.future.set_exception(Overloaded(
            f"all {self.workers} analysis workers of this server stayed busy for {waited:.0f} s "
            "(AUTOTUNE_ANALYSIS_WORKERS, AUTOTUNE_ANALYSIS_TIMEOUT_S): ask again shortly",
            retry_after_s=retry))

    def describe(self) -> dict[str, int]:
        with self._lock:
            return {"workers": self.workers, "busy": len(self._running), "waiting": len(self._waiting),
                    "cached": len(self._cache)}

    def close(self) -> None:
        with self._lock:
            self._closed = True
            workers = [*self._idle, *self._busy]
            self._idle.clear()
            for job in self._running.values():
                job.abandoned.set()
            waiting = list(self._waiting.values())
            self._waiting.clear()
        for job in waiting:
            job.future.set_exception(Overloaded("the server is shutting down", retry_after_s=5))
        for worker in workers:
            worker.end()

    # --- inside -----------------------------------------------------------------------------

    def _retry_after(self) -> int:
        """Seconds until a worker is sure to be free: the running order nearest its limit."""
        now = time.monotonic()
        left = [self.timeout_s - (now - job.started) for job in self._running.values()]
        return max(1, math.ceil(min(left, default=1.0)))

    def _timeout_error(self, order: AnalysisOrder, *, retry_after_s: int) -> Overloaded:
        return Overloaded(
            f"this {order.kind} takes longer than this server's limit of {self.timeout_s:g} s "
            "(AUTOTUNE_ANALYSIS_TIMEOUT_S): run it with the CLI (autotune "
            f"{order.kind} ...), which has no limit, or ask the server's operator to raise it",
            retry_after_s=retry_after_s,
        )

    def _release(self, job: _Job) -> None:
        with self._lock:
            job.waiters -= 1
            if job.waiters <= 0 and not job.future.done():
                job.abandoned.set()  # nobody is waiting: its worker is killed
                if self._waiting.get(job.order.key) is job:  # or, still in line, it leaves it
                    del self._waiting[job.order.key]

    def _worker(self) -> _Worker:
        with self._lock:
            worker = self._idle.pop() if self._idle else None
        if worker is None or worker.poll() is not None:
            worker = _Worker(self.command, self.env)
        with self._lock:
            self._busy.add(worker)
        return worker

    def _execute(self, job: _Job) -> None:
        key, outcome = job.order.key, None
        worker: _Worker | None = None
        try:
            worker = self._worker()
            outcome = self._ask(worker, job)
        except Exception as exc:  # noqa: BLE001 - a bug here must still answer the request
            log.exception("analysis %s", key[:8])
            outcome = ("error", AutotuneError(f"internal error in the analysis pool: {exc!r}"))
        finally:
            kind, value = outcome if outcome is not None else ("error", None)
            with self._lock:  # one step: an identical order finds it running or its answer cached
                self._running.pop(key, None)
                self._held[job.client] -= 1
                if self._held[job.client] <= 0:
                    del self._held[job.client]
                if kind == "result":
                    assert isinstance(value, dict)
                    self._remember(key, (value, None))
                elif kind == "refused":
                    assert isinstance(value, AutotuneError)
                    self._remember(key, (None, value))
                elif kind == "timeout":
                    self._too_slow[key] = time.monotonic() + TIMEOUT_MEMORY_S
                if worker is not None:
                    self._busy.discard(worker)
                    if kind in ("result", "refused") and not self._closed and worker.jobs < JOBS_PER_WORKER:
                        self._idle.append(worker)
                        worker = None
                started = self._dispatch()  # the worker freed goes to an order in line
            for waiting in started:
                self._thread(waiting)
            if worker is not None:
                worker.end()
        if kind == "abandoned":  # nobody waits, unless the pool was closed under them
            value = Overloaded("the server is shutting down", retry_after_s=5)
        if isinstance(value, BaseException):
            job.future.set_exception(value)
        elif isinstance(value, dict):
            job.future.set_result(value)

    def _remember(self, key: str, entry: tuple[dict[str, Any] | None, AutotuneError | None]) -> None:
        self._cache[key] = entry
        self._cache.move_to_end(key)
        while len(self._cache) > self._cache_entries:
            self._cache.popitem(last=False)
        now = time.monotonic()
        for stale in [k for k, until in self._too_slow.items() if until <= now]:
            del self._too_slow[stale]

    def _ask(self, worker: _Worker, job: _Job) -> tuple[str, dict[str, Any] | AutotuneError | None]:
        """Send the order and wait for its answer, its deadline, or its last waiter to leave.

        ("result", answer) | ("refused", error) | ("error", error) | ("timeout", error) |
        ("abandoned", None).
        """
        order = job.order
        worker.jobs += 1
        request = {"kind": order.kind, "spec": order.spec, "params": order.params}
        if not worker.send(json.dumps(request) + "\n"):
            return "error", AutotuneError(f"the analysis worker (pid {worker.pid}) is gone")
        deadline = job.started + self.timeout_s
        while True:
            if job.abandoned.is_set():
                return "abandoned", None
            left = deadline - time.monotonic()
            if left <= 0:
                log.warning("analysis %s ran past %g s: its worker is killed", order.key[:8], self.timeout_s)
                return "timeout", self._timeout_error(order, retry_after_s=math.ceil(TIMEOUT_MEMORY_S))
            try:
                line = worker.reply(min(POLL_S, left))
            except TimeoutError:
                continue
            if line is None:
                code = worker.wait()
                return "error", AutotuneError(
                    f"the analysis worker (pid {worker.pid}) {exit_reason(code)} before it answered")
            try:
                message = json.loads(line)
            except ValueError:
                why = f"the analysis worker broke the protocol: {line.strip()[:200]!r}"
                return "error", AutotuneError(why)
            if "result" in message:
                return "result", message["result"]
            error = _error(message)
            # An error the core raises on purpose (unknown model, a step it cannot model) is the
            # same next time; anything else is not remembered.
            return ("refused" if message.get("expected") else "error"), error


async def prepare(limiter: Any, func: Callable[..., T], *args: Any) -> T:
    """``func(*args)`` in a thread of the server, at most ``limiter``'s count at once (an
    anyio.CapacityLimiter made by the app at startup: app.state.preparing)."""
    import functools

    import anyio.to_thread

    return await anyio.to_thread.run_sync(functools.partial(func, *args), limiter=limiter)


class Analyzer(Protocol):
    def analyze(self, order: AnalysisOrder, client: str = "") -> Ticket: ...


async def run_analysis(
    runner: Analyzer, order: AnalysisOrder, is_disconnected: Callable[[], Awaitable[bool]], client: str = "",
) -> dict[str, Any]:
    """The order's answer, computed away from the server: what a route awaits. ``client``: who
    asks (api.admission.client_of), for its share of the workers.

    Overloaded (503) when there is no room or it ran past the limit; ClientGone when the client
    left first (its worker is then killed unless another request waits on the same order).
    """
    ticket = runner.analyze(order, client)
    try:
        return await ticket.result(is_disconnected)
    finally:
        ticket.release()
