"""What the dashboard's pages share: the templates, their filters, and how a run reads on a page."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fastapi import Request
from fastapi.templating import Jinja2Templates
from jinja2 import pass_context
from markupsafe import Markup, escape

from api.measurements import measured_on
from api.runs.spec import run_adapter
from api.store import Run
from autotune.analysis.explain import CATEGORY_LABELS, category_labels
from autotune.units import format_bytes

PACKAGE = Path(__file__).resolve().parent.parent
templates = Jinja2Templates(directory=PACKAGE / "templates")

# How much room a cell's max batch leaves, in bands a reader can tell apart without colour
# too (the legend names them, each cell says its number). Upper bounds, exclusive.
BANDS: tuple[tuple[str, str, int | None], ...] = (
    ("none", "batch 1 does not fit", 1),
    ("tight", "1-7: tight", 8),
    ("some", "8-31", 32),
    ("ample", "32 and more", None),
)


def band(max_batch: int | None, capped: bool = False) -> str:
    """The headroom band of a max batch: none, tight, some, ample (or capped, at the search's cap)."""
    if max_batch is None:
        return "failed"
    if capped:
        return "capped"
    for name, _, upper in BANDS:
        if upper is None or max_batch < upper:
            return name
    raise AssertionError("unreachable: the last band has no upper bound")


def size(n: int | None) -> str:
    return "-" if n is None else format_bytes(n)


def when(iso: str | None) -> str:
    """A stored UTC timestamp as 'YYYY-MM-DD HH:MM UTC'."""
    if not iso:
        return "-"
    moment = datetime.fromisoformat(iso).astimezone(UTC)
    return moment.strftime("%Y-%m-%d %H:%M UTC")


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes} min {secs:02d} s" if minutes < 60 else f"{minutes // 60} h {minutes % 60:02d} min"


def commas(text: str) -> Markup:
    """A list joined by commas without spaces (``q_proj,v_proj``) that may wrap after each comma."""
    return Markup(",<wbr>").join(escape(text).split(","))


def breakable(name: str) -> Markup:
    """A dotted name (``bert.encoder.layer.11.attention.self``) that may wrap after each dot: a
    narrow column breaks it between its parts instead of cutting it or widening the table."""
    return Markup(".<wbr>").join(escape(name).split("."))


def slashes(path: str) -> Markup:
    """A path (``docs/measurements/h100-80gb/x.json``) that may wrap after each slash."""
    return Markup("/<wbr>").join(escape(path).split("/"))


def backend_label(backend: str) -> str:
    """What a run's numbers are: measured on a GPU, or estimated on a CPU."""
    return "measured" if backend == "cuda" else "estimated"


def badge(run: Run) -> str:
    """A run's badge: how its numbers were found (measured, estimated), or "failed": a failed run's
    numbers were not, and the green "measured" beside it would say they were."""
    return "failed" if run.status == "failed" else backend_label(run.backend)


def path_for(request: Request, name: str, /, **params: Any) -> str:
    """The path of a route, under the app's root path: links stay right behind a proxy (no host)."""
    return request.scope.get("root_path", "") + str(request.app.url_path_for(name, **params))


@pass_context
def _path_for(context: Any, name: str, /, **params: Any) -> str:
    return path_for(context["request"], name, **params)


templates.env.globals["path_for"] = _path_for
templates.env.filters.update(size=size, when=when, duration=duration, band=band, breakable=breakable,
                             commas=commas, slashes=slashes)
templates.env.globals.update(backend_label=backend_label, BANDS=BANDS, CATEGORY_LABELS=CATEGORY_LABELS,
                             category_labels=category_labels)


@dataclass(frozen=True)
class RunLabel:
    """A run in one line: what it is for, on which card, how it was found."""

    model: str
    task: str
    gpu: str
    budget: str
    backend: str

    def __str__(self) -> str:
        return f"{self.model} · {self.gpu} · {self.backend}"


def run_label(run: Run) -> RunLabel:
    spec = run.spec
    return RunLabel(model=run.model, task=spec["task"], gpu=run.gpu,
                    budget=format_bytes(spec["budget_bytes"]), backend=backend_label(run.backend))


FULL_FINE_TUNE = "full fine-tune"


def adapter_labels(run: Run) -> tuple[str, str]:
    """A run's training setup in words, long and short: the adapter's label (method, rank,
    targets, trainable / total parameters) and ``LoRA r=16, 0.52% trainable``; or "full fine-tune"."""
    adapter = run_adapter(run.spec, run.header)
    if adapter is None:
        return FULL_FINE_TUNE, FULL_FINE_TUNE
    name = {"qlora": "QLoRA", "lora_8bit": "LoRA 8-bit"}.get(adapter["method"], "LoRA")
    short = f"{name} r={adapter['r']}"
    counts = adapter.get("parameters")
    if counts:
        short += f", {100 * counts['trainable'] / max(1, counts['total']):.2f}% trainable"
    return str(adapter["label"]), short


def summary(run: Run) -> dict[str, Any]:
    """The fields of a run the list and the headers show."""
    adapter, adapter_short = adapter_labels(run)
    return {
        "adapter": adapter, "adapter_short": adapter_short,
        "id": run.id, "model": run.model, "task": run.spec["task"], "gpu": run.gpu,
        "gpu_memory": format_bytes(run.spec["gpu"]["total_memory_bytes"]),
        "budget": format_bytes(run.spec["budget_bytes"]), "backend": run.backend,
        "backend_label": backend_label(run.backend), "badge": badge(run), "status": run.status,
        "done": run.done, "total": run.total,
        "percent": round(100 * run.done / run.total) if run.total else 0,
        "created_at": run.created_at, "active": run.active, "error": run.error,
        # Where a cuda run's numbers come from: "measured on <GPU> (imported from <file>)".
        "measured_on": measured_on(run), "imported": run.imported,
    }
