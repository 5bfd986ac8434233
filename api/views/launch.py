"""The launch form: a new table run. The page's script posts it to ``POST /v1/tables`` and shows
the API's validation errors next to their fields; on success it opens the new run's page."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from api.deps import JobsDep, SettingsDep
from api.views.common import templates
from autotune.backends import BACKENDS
from autotune.gpus import DEFAULT_GPU_NAME, GPU_PRESETS
from autotune.models import DEFAULT_TASK, PRESETS, TASKS
from autotune.modes import ALLOWED_MODE_NAMES, DEFAULT_MODE_NAMES
from autotune.search import METHODS
from autotune.step import ATTN_CHOICES, OPTIMIZERS
from autotune.tuner import DEFAULT_MARGIN, DEFAULT_SEQ_LENS
from autotune.units import format_bytes

router = APIRouter()


@router.get("/new", response_class=HTMLResponse, name="launch")
def launch(request: Request, jobs: JobsDep, settings: SettingsDep) -> HTMLResponse:
    """The form that asks for a new table."""
    runner = jobs.runner.describe()
    gpus = [(name, format_bytes(spec.total_memory_bytes)) for name, spec in GPU_PRESETS.items()]
    context = {
        "page": "launch", "models": sorted(PRESETS, key=lambda m: (m.startswith("tiny-"), m)),
        "tasks": TASKS, "default_task": DEFAULT_TASK, "modes": ALLOWED_MODE_NAMES,
        "default_modes": DEFAULT_MODE_NAMES, "seq_lens": ", ".join(map(str, DEFAULT_SEQ_LENS)),
        "gpus": gpus, "default_gpu": runner["gpu"] or DEFAULT_GPU_NAME, "local_gpu": runner["gpu"],
        "backends": BACKENDS, "default_backend": settings.backend, "auto_means": runner["backend"],
        "attns": ATTN_CHOICES, "optimizers": OPTIMIZERS, "searches": METHODS, "margin": DEFAULT_MARGIN,
        "max_batch": min(settings.max_batch, 4096), "needs_token": settings.api_token is not None,
    }
    return templates.TemplateResponse(request, "launch.html", context)
