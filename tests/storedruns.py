"""Runs written straight into the real store, and a page's text: the API tests' shared helpers
(tests/api/test_peft.py, test_trainers.py)."""

from __future__ import annotations

import re
from html import unescape
from typing import Any

from api.runs.spec import TableSpec, normalize


def spec_of(client: Any, body: dict[str, Any]) -> TableSpec:
    """The spec the server makes of a POST /v1/tables ``body`` (its settings, its runner's environment)."""
    queue = client.app.state.queue
    return normalize(body, client.app.state.settings, queue.runner.environment)


def store_done_run(client: Any, spec: TableSpec, header: dict, max_batch: int = 6) -> str:
    """A finished run of ``spec`` with one fp32 cell at seq 32, as the queue records it."""
    store = client.app.state.queue.store
    run, _ = store.create_run(key=spec.key(), spec=spec.to_json(), model=spec.model, gpu=spec.gpu["name"],
                              backend=spec.backend, total=spec.cells, reuse=())
    store.mark_running(run.id, lane="estimate:0", worker_pid=None)
    store.set_header(run.id, header)
    probes = [{"batch_size": b, "outcome": "fits" if b <= max_batch else "oom", "peak_bytes": 1000 * b,
               "peak_allocated_bytes": 900 * b, "peak_reserved_bytes": 1000 * b}
              for b in (2, max_batch, max_batch + 1)]
    store.add_cell(run.id, 0, {
        "seq_len": 32, "mode": "fp32", "max_batch_size": max_batch, "peak_memory_bytes": 1000 * max_batch,
        "peak_allocated_bytes": 900 * max_batch, "probes": 3, "capped": False, "backend": spec.backend,
        "step_time_s": None, "error": None, "probe_log": probes})
    store.finish_run(run.id, "done")
    return run.id


def text(response: Any) -> str:
    """The page's text as a reader sees it (a <wbr> is a place to wrap, not a space)."""
    return re.sub(r"\s+", " ", unescape(re.sub(r"<[^>]+>", " ", response.text.replace("<wbr>", ""))))
