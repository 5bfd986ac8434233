"""The run page: the table with cells coloured by headroom, the chart, and each cell's probes.

``/runs/{id}`` is the page; ``/runs/{id}/live`` is the part of it that changes while the run
goes on (status, table, chart, cell details), which the page's script fetches and swaps in until
the run ends; ``/runs/{id}/explain`` is the explain panel of one cell, computed on request.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import APIRouter, HTTPException, Query, Request, status
from fastapi.responses import HTMLResponse

from api.admission import client_of
from api.chart import Series, line_chart
from api.deps import QueueDep
from api.fleet.step import step_of
from api.routes.tables import read_run
from api.runs.spec import TableSpec, run_trainer, run_warnings
from api.store import Run
from api.views.common import band, path_for, summary, templates
from autotune.errors import AutotuneError, Overloaded
from autotune.workload.support import weights_label

router = APIRouter()

LIVE_INTERVAL_MS = 1000  # how often an open run page asks for news while the run goes on


@dataclass
class CellView:
    seq_len: int
    mode: str
    key: str  # for element ids: "128-amp_ckpt"
    state: str  # done | failed | measuring | queued | not measured
    max_batch: int | None = None
    capped: bool = False
    band: str = "pending"
    peak_bytes: int | None = None  # at the max batch: what the budget bounds
    peak_allocated_bytes: int | None = None
    used: float | None = None  # peak_bytes / budget
    oom_batch: int | None = None  # the smallest batch above the max that ran out of memory
    oom_peak_bytes: int | None = None
    # The largest batch that fitted where the trainer does not run it (a GRPO cell rounded down to
    # whole prompt groups, a KTO cell where only batch 1 fits), and why; None: the max is what fitted
    fitted_batch: int | None = None
    not_run_because: str | None = None
    step_time_s: float | None = None
    error: str | None = None
    probes: list[dict[str, Any]] = field(default_factory=list)
    backend: str = ""


def cell_key(seq_len: int, mode: str) -> str:
    return f"{seq_len}-{mode.replace('+', '_')}"


def cell_view(seq_len: int, mode: str, cell: dict[str, Any] | None, state: str, budget: int,
              not_run_because: str | None = None) -> CellView:
    """A cell of the run page; ``not_run_because``: why the run's trainer does not run every batch
    that fits (Trainer.why_not_run), None where it runs them all."""
    view = CellView(seq_len, mode, cell_key(seq_len, mode), state)
    if cell is None:
        return view
    best = cell["max_batch_size"]
    view.state = "failed" if cell.get("error") and best is None else "done"
    view.max_batch, view.capped = best, bool(cell.get("capped"))
    view.band = band(best, view.capped)
    view.peak_bytes = cell.get("peak_memory_bytes")
    view.peak_allocated_bytes = cell.get("peak_allocated_bytes")
    view.used = view.peak_bytes / budget if view.peak_bytes is not None and budget else None
    view.step_time_s, view.error, view.backend = cell.get("step_time_s"), cell.get("error"), cell["backend"]
    view.probes = list(cell.get("probe_log") or [])
    above = [p for p in view.probes if p["outcome"] == "oom" and best is not None and p["batch_size"] > best]
    if above:
        first = min(above, key=lambda p: p["batch_size"])
        view.oom_batch, view.oom_peak_bytes = first["batch_size"], first.get("peak_bytes")
    fitted = max((p["batch_size"] for p in view.probes if p["outcome"] == "fits"), default=None)
    if best is not None and fitted is not None and fitted > best and not_run_because:
        view.fitted_batch, view.not_run_because = fitted, not_run_because
    return view


def grid(run: Run, cells: list[dict[str, Any]], stored: TableSpec) -> list[tuple[int, list[CellView]]]:
    """Rows of the table: one per sequence length, a cell per mode, finished or not (``stored``: the
    run's spec, read once by the page)."""
    spec = run.spec
    found = {(c["seq_len"], c["mode"]): c for c in cells}
    # The tuner goes mode by mode, each from the shortest length: the first cell missing in that
    # order is the one being measured.
    order = [(seq_len, mode) for mode in spec["modes"] for seq_len in spec["seq_lens"]]
    pending = [k for k in order if k not in found]
    measuring = pending[0] if pending and run.status == "running" else None
    missing = "queued" if run.active else "not measured"
    trainer = stored.workload_trainer()
    why = trainer.why_not_run() if trainer is not None else None
    rows = []
    for seq_len in spec["seq_lens"]:
        row = []
        for mode in spec["modes"]:
            state = "measuring" if (seq_len, mode) == measuring else missing
            row.append(cell_view(seq_len, mode, found.get((seq_len, mode)), state, spec["budget_bytes"], why))
        rows.append((seq_len, row))
    return rows


def chart_of(run: Run, rows: list[tuple[int, list[CellView]]]) -> Any:
    series = []
    for i, mode in enumerate(run.spec["modes"]):
        points = [(seq_len, row[i].max_batch) for seq_len, row in rows]
        capped = frozenset(seq_len for seq_len, row in rows if row[i].capped)
        series.append(Series(mode, points, capped))
    return line_chart(series, title=f"Max batch size of {run.model} on {run.gpu}, by sequence length",
                      chart_id=f"chart-{run.id}")


def _context(run: Run, cells: list[dict[str, Any]], queue: QueueDep) -> dict[str, Any]:
    stored = TableSpec.from_json(run.spec)
    rows = grid(run, cells, stored)
    return {
        # A database that cannot be written now (a full disk): why, and this run's results waiting.
        "write_failure": queue.store.write_failure, "unwritten": queue.backlog(run.id),
        "reconcile_s": queue.reconcile_s,
        "run": summary(run), "spec": run.spec, "header": run.header or {}, "rows": rows,
        "stored": stored, "warnings": run_warnings(stored),
        "weights": weights_label(stored.weights_dtype),
        "gpus": None if (parallel := stored.workload_parallel()) is None else parallel.label,
        "trainer": None if (trainer := run_trainer(stored)) is None else trainer["label"],
        "modes": run.spec["modes"], "chart": chart_of(run, rows), "elapsed_s": run.elapsed_s,
        "started_at": run.started_at, "finished_at": run.finished_at, "attempts": run.attempts,
        "interval_ms": LIVE_INTERVAL_MS,
    }


@router.get("/runs/{run_id}", response_class=HTMLResponse, name="run_page")
def run_page(run_id: str, request: Request, queue: QueueDep) -> HTMLResponse:
    """A run: table, chart, and per cell its memory and probes; updates itself while it runs."""
    run, cells = read_run(queue, run_id)
    context = _context(run, cells, queue)
    # The model's runs of this step on every GPU kind (views/fleet.py).
    context["fleet_url"] = path_for(request, "fleet") + "?" + urlencode(
        {"model": run.model, "step": step_of(run.spec).id})
    return templates.TemplateResponse(request, "run.html", context)


@router.get("/runs/{run_id}/live", response_class=HTMLResponse, name="run_live")
def run_live(run_id: str, request: Request, queue: QueueDep) -> HTMLResponse:
    """The changing part of the run page, for its script to swap in."""
    run, cells = read_run(queue, run_id)
    return templates.TemplateResponse(request, "_run_live.html", _context(run, cells, queue))


@router.get("/runs/{run_id}/explain", response_class=HTMLResponse, name="run_explain")
async def run_explain(
    run_id: str, request: Request, queue: QueueDep,
    seq_len: Annotated[int, Query(ge=1)], mode: str,
    levers: Annotated[bool, Query(description="also the max batch under each lever (slower)")] = False,
) -> HTMLResponse:
    """Where the memory of one cell's step goes, at its max batch (estimated), as a panel."""
    from api.runs.analysis import AnalysisOrder, run_analysis

    run, cells = read_run(queue, run_id)
    if seq_len not in run.spec["seq_lens"] or mode not in run.spec["modes"]:
        raise HTTPException(
            status.HTTP_404_NOT_FOUND,
            detail=f"run '{run_id}' has no cell seq_len={seq_len}, mode={mode!r}: its sequence lengths "
                   f"are {run.spec['seq_lens']} and its modes {run.spec['modes']}",
        )
    # A measured cell is explained at its measured max batch; an estimated one at the estimator's,
    # which is the table's.
    cell = next((c for c in cells if (c["seq_len"], c["mode"]) == (seq_len, mode)), None)
    at = cell["max_batch_size"] if cell and run.backend == "cuda" and cell["max_batch_size"] else None
    context: dict[str, Any] = {"run": summary(run), "seq_len": seq_len, "mode": mode, "levers": levers}
    try:
        order = AnalysisOrder("explain", run.spec,
                              {"seq_len": seq_len, "batch_size": at, "mode": mode, "levers": levers})
        client = client_of(request.scope, request.app.state.settings.api_token)
        result = await run_analysis(queue.runner, order, request.is_disconnected, client)
    except Overloaded:
        raise  # 503 with Retry-After: the panel's script says so
    except AutotuneError as exc:
        context["error"] = str(exc)
    else:
        context["e"] = result
    return templates.TemplateResponse(request, "_explain.html", context)
