"""The queue of table runs: the store holds it, a Runner executes it, and this joins the two.

``RunQueue.submit`` finds or creates the run of a normalised request in one store transaction (so
identical requests, even at once, share a run) and hands a new run to the runner.
``RunQueue.start`` resumes after a restart: runs the last server left running go back to the queue
with their finished cells, and every queued run is handed to the runner, oldest first.
The runner's events (RunEvents) become store writes here.
"""

from __future__ import annotations

import logging
from typing import Any

from api.runs.runner import Runner, RunOrder
from api.runs.spec import TableSpec
from api.store import ACTIVE, REUSABLE, Run, Store
from autotune.errors import AutotuneError

log = logging.getLogger("autotune.api")


class RunQueue:
    def __init__(self, store: Store, runner: Runner) -> None:
        self.store = store
        self.runner = runner

    def start(self) -> None:
        """Requeue interrupted runs and hand every queued run to the runner."""
        for run_id in self.store.requeue_interrupted():
            log.info("run %s was interrupted by a restart: it resumes, keeping its finished cells", run_id)
        for run in self.store.queued_runs():
            changed = self._environment_change(run)
            if changed is None:
                self._hand_over(run)
            else:
                self.store.finish_run(run.id, "failed", error=changed)

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
            now = self.runner.environment(recorded["backend"])
        except AutotuneError as exc:
            return f"the run cannot resume on this server: {exc}"
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
        return self.store.mark_running(run_id, lane=lane, worker_pid=pid)

    def header(self, run_id: str, header: dict[str, Any]) -> None:
        self.store.set_header(run_id, header)

    def cell(self, run_id: str, position: int, cell: dict[str, Any]) -> None:
        self.store.add_cell(run_id, position, cell)

    def finished(self, run_id: str, status: str, error: str | None, elapsed_s: float | None) -> None:
        if status == "failed":
            log.warning("run %s failed: %s", run_id, error)
        self.store.finish_run(run_id, status, error=error, elapsed_s=elapsed_s)
