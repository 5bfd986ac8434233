"""The fleet view: one model's table on every GPU kind side by side, from the stored runs.

``/fleet?model=M`` groups the model's runs by their step (api.fleet.step: what they measure and
how) and shows one group, ``step=ID`` or the one on the most kinds: a table per mode with a column
per GPU kind, and a chart per mode with a line per kind (compare.mode_sections). It reads the store
only, so it shows what a fleet measured with or without the cluster; on a fleet server it also names
the kinds the fleet has that the group lacks. ``/fleet/live`` is its changing part, which the page's
script fetches and swaps in while a run shown is queued or running (the runs "all kinds in the
fleet" just queued).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse

from api.deps import QueueDep
from api.fleet.launch import ALL_KINDS, fleet_of
from api.fleet.step import Step, step_of
from api.routes.tables import run_filters
from api.store import Run
from api.views.common import path_for, templates
from api.views.compare import mode_sections

router = APIRouter()

MAX_RUNS = 1000  # of a model read, newest first: far more than a fleet's kinds times its steps
LIVE_INTERVAL_MS = 2000  # how often the view refreshes while a run on it is active
SHOWN = ("done", "queued", "running")  # a kind's run shown: its newest of these, else its newest failed

Param = Annotated[str | None, Query(max_length=300)]


@dataclass
class Group:
    """A model's runs of one step, and the run shown per GPU kind."""

    step: Step
    runs: list[Run] = field(default_factory=list)  # newest first

    def shown(self) -> list[Run]:
        """Per GPU kind its newest run done, queued or running (else its newest failed one; cancelled
        runs are left out), by the card's memory, then name: the ratios read from the smallest."""
        chosen: dict[str, Run] = {}
        for run in self.runs:  # newest first
            current = chosen.get(run.gpu)
            if run.status in (*SHOWN, "failed") and (
                    current is None or (current.status == "failed" and run.status in SHOWN)):
                chosen[run.gpu] = run
        return sorted(chosen.values(), key=lambda r: (r.spec["gpu"]["total_memory_bytes"], r.gpu))

    @property
    def kinds(self) -> list[str]:
        return [run.gpu for run in self.shown()]


def groups_of(runs: list[Run]) -> list[Group]:
    """A model's runs by step: the group on the most kinds first, then the one run newest."""
    groups: dict[str, Group] = {}
    for run in runs:  # newest first
        if run.status == "cancelled":
            continue
        step = step_of(run.spec)
        groups.setdefault(step.id, Group(step)).runs.append(run)
    return sorted(groups.values(), key=lambda g: -len(g.kinds))  # stable: newest first among equals


def view_url(request: Request, name: str, model: str, step: str | None = None) -> str:
    params = {"model": model, **({"step": step} if step else {})}
    return path_for(request, name) + "?" + urlencode(params)


def _context(request: Request, queue: Any, model: str | None, step: str | None) -> dict[str, Any]:
    model, _ = run_filters(model, None)
    context: dict[str, Any] = {
        "page": "fleet", "model": model, "problems": [], "groups": [], "group": None, "sections": [],
        "interval_ms": LIVE_INTERVAL_MS, "live_url": None, "column_noun": "GPU kind", "missing_kinds": [],
        "fleet": fleet_of(queue.runner),
    }
    if model is None:
        return context
    runs = queue.store.list_runs(model=model, limit=MAX_RUNS)[0]
    groups = groups_of(runs)
    if not groups:
        context["problems"].append(f"no runs of {model} yet: launch it on every GPU kind of a fleet, or on "
                                   "one GPU at a time, from New table")
        return context
    group = next((g for g in groups if g.step.id == step), None)
    if group is None:
        if step:
            context["problems"].append(f"{model} has no runs of the step '{step}'; showing the one on the "
                                       "most GPU kinds")
        group = groups[0]
    shown = group.shown()
    cells = {run.id: queue.store.cells(run.id) for run in shown}
    context.update(
        model=shown[0].model, groups=[{
            "step": g.step, "kinds": g.kinds, "runs": len(g.runs), "current": g is group,
            "url": view_url(request, "fleet", model, g.step.id),
        } for g in groups], group=group, runs=shown,
        sections=mode_sections(shown, cells, request, heading=lambda run: run.gpu, reference_columns=False,
                               adapters=False,  # the step's, said once above the tables
                               title=f"Max batch size of {model} by sequence length, {{mode}}: a line "
                                     "per GPU kind"),
        launch_url=path_for(request, "launch") + "?" + urlencode({"model": model, "gpu": ALL_KINDS}),
    )
    if any(run.active for run in shown):
        context["live_url"] = view_url(request, "fleet_live", model, group.step.id)
    fleet = context["fleet"]
    if fleet is not None and group.step.backend == "cuda":
        context["missing_kinds"] = [k for k in fleet.kinds if k not in group.kinds]
    return context


@router.get("/fleet", response_class=HTMLResponse, name="fleet")
def fleet_view(request: Request, queue: QueueDep, model: Param = None, step: Param = None) -> HTMLResponse:
    """One model on every GPU kind: a table per mode with a column per kind, and a chart per mode."""
    context = _context(request, queue, model, step)
    context["known_models"] = queue.store.distinct("model")
    return templates.TemplateResponse(request, "fleet.html", context)


@router.get("/fleet/live", response_class=HTMLResponse, name="fleet_live")
def fleet_live(request: Request, queue: QueueDep, model: Param = None, step: Param = None) -> HTMLResponse:
    """The changing part of the fleet view, for its script to swap in while its runs go on."""
    return templates.TemplateResponse(request, "_fleet_live.html", _context(request, queue, model, step))
