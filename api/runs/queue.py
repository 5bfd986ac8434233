"""The queue of table runs: the store holds it, a Runner executes it, and this joins the two.

``RunQueue.submit`` finds or creates the run of a normalised request in one store transaction (so
identical requests, even at once, share a run) and hands a new run to the runner.
``RunQueue.start`` resumes after a restart: runs the last server left running go back to the queue
with their finished cells, and every queued run is handed to the runner, oldest first.
The runner's events (RunEvents) become store writes here.

Every state change of a run is recorded or retried: a write that fails (a full or read-only
disk) is kept, in order, in the run's backlog and retried on the next pass of the reconciler
(every ``reconcile_s``), so no finished cell is lost and no run stays "running" without a
worker. A pass also compares the store with the runner: a run the store says is running but no
lane holds is requeued with its cells (failed after MAX_ATTEMPTS starts), and a queued run the
runner does not have is handed over again.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Callable
from typing import Any

from api.runs.runner import ClusterUnreachable, Runner, RunOrder
from api.runs.spec import TableSpec, adapter_environment
from api.settings import RECONCILE_S
from api.store import ACTIVE, REUSABLE, Run, Store
from autotune.errors import AutotuneError, StoreError

log = logging.getLogger("autotune.api")

MAX_ATTEMPTS = 3  # starts of one run before a lost one is failed instead of requeued
_WRITE_ERRORS = (StoreError, sqlite3.Error)


class RunQueue:
    def __init__(self, store: Store, runner: Runner, *, reconcile_s: float = RECONCILE_S) -> None:
        self.store = store
        self.runner = runner
        self.reconcile_s = reconcile_s
        self._lock = threading.RLock()
        # run id -> its writes that failed, oldest first: (what, write); retried in order.
        self._backlog: dict[str, list[tuple[str, Callable[[], object]]]] = {}
        self._pending = 0  # writes in the backlog, all runs together
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Requeue interrupted runs, hand every queued run to the runner, start the reconciler."""
        for run_id in self.store.requeue_interrupted():
            log.info("run %s was interrupted by a restart: it resumes, keeping its finished cells", run_id)
        for run in self.store.queued_runs():
            self._resume(run)
        self._thread = threading.Thread(target=self._reconcile_loop, name="reconciler", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop the reconciler (writes still in a backlog are lost with the process; their runs
        resume at the next start from the cells the store has)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10.0)

    def _resume(self, run: Run) -> None:
        try:
            changed = self._environment_change(run)
        except ClusterUnreachable as exc:  # a fleet's cluster is away: the run waits, queued
            log.info("run %s stays queued: %s", run.id, exc)
            return
        if changed is None:
            self._hand_over(run)
        else:
            self.store.finish_run(run.id, "failed", error=changed)

    # --- the reconciler -----------------------------------------------------------------

    def _reconcile_loop(self) -> None:
        while not self._stop.wait(self.reconcile_s):
            try:
                self.reconcile()
            except _WRITE_ERRORS as exc:
                log.warning("reconciler: the database is not usable now (%s): next pass in %g s",
                            exc, self.reconcile_s)
            except Exception:  # a bug here must not end the reconciler
                log.exception("reconciler")

    def reconcile(self) -> list[str]:
        """One pass: retry failed writes, requeue lost runs, hand over forgotten ones; what it did."""
        actions = []
        with self._lock:
            for run_id in list(self._backlog):
                if self._flush(run_id):
                    actions.append(f"wrote the backlog of run {run_id}")
        if self.store.write_failure is not None and self.store.probe_writable():
            log.info("the database %s can be written again", self.store.path)
            actions.append("found the database writable again")
        # The runner first: a run leaves it only after its last event was written or put in the
        # backlog, so a run it no longer holds and with no backlog has nothing more coming.
        held = self.runner.held()
        running, _ = self.store.list_runs(status="running", limit=1_000_000)
        for run in running:
            if run.id in held or self._waiting(run.id):
                continue
            if run.attempts >= MAX_ATTEMPTS:
                error = (f"the run lost its worker {run.attempts} times without a word (last on lane "
                         f"{run.lane}): given up")
                if self.store.finish_run(run.id, "failed", error=error):
                    actions.append(f"failed run {run.id}")
                continue
            if self.store.requeue_run(run.id):
                log.warning("run %s was running with no worker (lane %s): requeued with its %d cells",
                            run.id, run.lane, run.done)
                actions.append(f"requeued run {run.id}")
        held = self.runner.held()
        for run in self.store.queued_runs():
            if run.id not in held and not self._waiting(run.id):
                self._resume(run)
                actions.append(f"handed over run {run.id}")
        return actions

    def _waiting(self, run_id: str) -> bool:
        with self._lock:
            return run_id in self._backlog

    def backlog(self, run_id: str | None = None) -> int:
        """Writes waiting for the database (a full or read-only disk): of one run, or of all.
        Without the lock, which a write being retried holds for a while: health asks on the event
        loop (a dict's get, a list's len and an int are read whole)."""
        if run_id is not None:
            return len(self._backlog.get(run_id, ()))
        return self._pending

    def _record(self, run_id: str, what: str, write: Callable[[], object]) -> None:
        """Write now, after the run's earlier failed writes; on failure keep it for the reconciler."""
        with self._lock:
            self._backlog.setdefault(run_id, []).append((what, write))
            self._pending += 1
            self._flush(run_id)

    def _flush(self, run_id: str) -> bool:
        """Write the run's backlog in order; False (and kept) from the first write that fails."""
        with self._lock:
            backlog = self._backlog.get(run_id, [])
            while backlog:
                what, write = backlog[0]
                try:
                    write()
                except _WRITE_ERRORS as exc:
                    log.warning("run %s: could not record %s (%s): retried in %g s", run_id, what, exc,
                                self.reconcile_s)
                    return False
                backlog.pop(0)
                self._pending -= 1
            self._backlog.pop(run_id, None)
            return True

    def submit(self, spec: TableSpec, *, force: bool = False) -> tuple[Run, bool]:
        """The run of ``spec``: an identical one if there is one, else a new queued run.

        ``force`` measures again instead of answering with a finished run; a run of the same
        spec still in progress is a fresh measurement, and is returned.
        """
        run, created = self.store.create_run(
            key=spec.key(), model=spec.model, gpu=spec.gpu["name"], backend=spec.backend,
            spec=spec.to_json(), total=spec.cells, reuse=ACTIVE if force else REUSABLE,
        )
        if created:
            self._hand_over(run)
        return run, created

    def cancel(self, run_id: str) -> Run | None:
        """Cancel a queued or running run (finished cells stay); the run, None if unknown."""
        run = self.store.cancel_run(run_id)
        if run is not None and run.status == "cancelled":
            self.runner.cancel(run_id)
        return run

    def _environment_change(self, run: Run) -> str | None:
        """Why a queued run cannot go on here (its cells would mix environments), or None."""
        recorded = run.spec["environment"]
        try:
            now = self.runner.environment(recorded["backend"], (run.spec.get("gpu") or {}).get("name"))
        except ClusterUnreachable:
            raise
        except AutotuneError as exc:
            return f"the run cannot resume on this server: {exc}"
        if "peft" in recorded:  # a run with an adapter: PEFT builds it
            now = adapter_environment(now)
        diffs = [f"{k} {recorded.get(k)} -> {now.get(k)}" for k in sorted(set(recorded) | set(now))
                 if recorded.get(k) != now.get(k)]
        if not diffs:
            return None
        return (f"the server's environment changed since the run was queued ({', '.join(diffs)}): "
                "ask again for a table measured on one environment")

    def _hand_over(self, run: Run) -> None:
        self.runner.submit(RunOrder(run.id, run.spec, tuple(self.store.cells(run.id))), self)

    # --- RunEvents ------------------------------------------------------------------------

    def started(self, run_id: str, lane: str, pid: int | None) -> bool:
        try:
            return self.store.mark_running(run_id, lane=lane, worker_pid=pid)
        except _WRITE_ERRORS as exc:  # still queued in the store: the reconciler hands it over again
            log.warning("run %s: could not mark it running (%s): not started now", run_id, exc)
            return False

    def header(self, run_id: str, header: dict[str, Any]) -> None:
        self._record(run_id, "its header", lambda: self.store.set_header(run_id, header))

    def cell(self, run_id: str, position: int, cell: dict[str, Any]) -> None:
        self._record(run_id, f"cell {position}", lambda: self.store.add_cell(run_id, position, cell))

    def finished(self, run_id: str, status: str, error: str | None, elapsed_s: float | None) -> None:
        if status == "failed":
            log.warning("run %s failed: %s", run_id, error)
        self._record(run_id, f"its end ({status})",
                     lambda: self.store.finish_run(run_id, status, error=error, elapsed_s=elapsed_s))
