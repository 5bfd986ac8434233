"""The home page: every run, newest first, filtered by model, GPU and status."""

from __future__ import annotations

from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse

from api.deps import QueueDep
from api.routes.tables import Offset, run_filters
from api.store import STATUSES
from api.views.common import path_for, summary, templates

router = APIRouter()

PAGE_SIZE = 25
LIVE_INTERVAL_MS = 2000  # how often the list refreshes while a run on it is active


def _context(request: Request, queue: Any, model: str | None, gpu: str | None, status: str | None,
             offset: int) -> dict[str, Any]:
    model, gpu = run_filters(model, gpu)
    status = status if status in STATUSES else None
    runs, count = queue.store.list_runs(model=model, gpu=gpu, status=status, limit=PAGE_SIZE, offset=offset)
    filters = {"model": model, "gpu": gpu, "status": status}
    query = {k: v for k, v in filters.items() if v}
    home = path_for(request, "home")

    def page(at: int) -> str:
        params = {**query, **({"offset": at} if at else {})}
        return home + (f"?{urlencode(params)}" if params else "")

    views = [summary(r) for r in runs]
    return {
        "page": "home", "runs": views, "count": count, "offset": offset, "filters": filters,
        "filtered": bool(query),
        "any_active": any(r["active"] for r in views),
        "live_url": path_for(request, "home_live") + (f"?{urlencode({**query, 'offset': offset})}"),
        "interval_ms": LIVE_INTERVAL_MS,
        "prev_url": page(max(0, offset - PAGE_SIZE)) if offset else None,
        "next_url": page(offset + PAGE_SIZE) if offset + PAGE_SIZE < count else None,
    }


Filter = Annotated[str | None, Query(max_length=300)]


@router.get("/", response_class=HTMLResponse, name="home")
def home(request: Request, queue: QueueDep, model: Filter = None, gpu: Filter = None, status: Filter = None,
         offset: Offset = 0) -> HTMLResponse:
    """Every run, newest first, with its progress."""
    context = _context(request, queue, model, gpu, status, offset)
    # The filters' choices: on the page only, not in the list it refreshes.
    context.update(statuses=STATUSES, known_models=queue.store.distinct("model"),
                   known_gpus=queue.store.distinct("gpu"))
    return templates.TemplateResponse(request, "home.html", context)


@router.get("/runs", response_class=HTMLResponse, name="home_live")
def home_live(request: Request, queue: QueueDep, model: Filter = None, gpu: Filter = None,
              status: Filter = None, offset: Offset = 0) -> HTMLResponse:
    """The list of runs alone, for the home page's script to swap in while runs are active."""
    context = _context(request, queue, model, gpu, status, offset)
    return templates.TemplateResponse(request, "_runs.html", context)
