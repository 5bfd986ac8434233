"""The compare page: runs side by side, mode by mode, and the BERT README's table beside BERT.

The reference (``api/data/google_bert_oom_table.json``) is the table in google-research/bert's
README: TensorFlow 1.11 on a 12 GB Titan X, fp32. It is shown as the shape users know, not as a
target: a PyTorch step on another card uses memory differently (REFERENCE_NOTE).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse

from api.chart import Series, line_chart
from api.deps import QueueDep
from api.measurements import measured_on
from api.store import Run
from api.views.common import PACKAGE, adapter_labels, path_for, run_label, summary, templates
from autotune.workload.modes import ALLOWED_MODE_NAMES

router = APIRouter()

MAX_RUNS = 8  # side by side; more would not be readable
PICKER_RUNS = 50
REFERENCE_NOTE = (
    "Why PyTorch numbers differ: the README measured TensorFlow 1.11 on a 12 GB Titan X, whose "
    "graph allocator, attention and Adam keep other buffers than a PyTorch step (caching allocator, "
    "SDPA attention, AdamW) on another card; compare the shape (the batch roughly halves as the "
    "length doubles), not the numbers."
)


@cache
def reference() -> dict[str, Any]:
    """The BERT README's table, as shipped in the package."""
    return json.loads((PACKAGE / "data" / "google_bert_oom_table.json").read_text())


def reference_key(model: str) -> str | None:
    """The reference row a model compares with: bert-base or bert-large (any casing variant)."""
    name = model.lower().rsplit("/", 1)[-1]
    for key in ("bert-base", "bert-large"):
        if name.startswith(key):
            return key
    return None


@dataclass
class Column:
    label: str
    sub: str
    url: str | None
    values: dict[int, int | None]  # seq_len -> max batch (None: failed or not measured)
    capped: frozenset[int]
    reference: bool = False
    adapter: str = ""  # the run's training setup, short: "LoRA r=16, 0.52% trainable", "full fine-tune"
    adapter_label: str = ""  # and in full (the adapter's label)
    status: str = "done"  # the run's: a column of a run not done says so
    progress: str = ""  # "1/4 cells"
    error: str = ""  # why the run failed


Heading = Callable[[Run], str]


def run_heading(run: Run) -> str:
    """A column's heading on the compare page: the run's model and target."""
    label = run_label(run)
    return f"{label.model} · {label.gpu}"


def _columns(runs: list[Run], cells: dict[str, list[dict[str, Any]]], mode: str, request: Request,
             heading: Heading, reference_columns: bool, adapters: bool) -> list[Column]:
    columns = []
    for run in runs:
        if mode not in run.spec["modes"]:
            continue
        found = {c["seq_len"]: c for c in cells[run.id] if c["mode"] == mode}
        label = run_label(run)
        adapter_label, adapter = adapter_labels(run)
        device = measured_on(run)
        backend = f"{label.backend} on {device}" if device else label.backend
        if run.imported:
            backend += " (imported)"
        columns.append(Column(
            label=heading(run), sub=f"{backend}, budget {label.budget}",
            url=path_for(request, "run_page", run_id=run.id),
            values={s: found[s]["max_batch_size"] if s in found else None for s in run.spec["seq_lens"]},
            capped=frozenset(s for s, c in found.items() if c.get("capped")),
            adapter=adapter if adapters else "", adapter_label=adapter_label,
            status=run.status, progress=f"{run.done}/{run.total} cells", error=run.error or "",
        ))
    if mode == "fp32" and reference_columns:
        ref = reference()
        for key in dict.fromkeys(k for r in runs if (k := reference_key(r.model))):
            columns.append(Column(
                label=f"{key} · BERT README", sub="TensorFlow, Titan X 12 GB, fp32", url=None,
                values={int(s): v for s, v in ref["max_batch_size"][key].items()},
                capped=frozenset(), reference=True,
            ))
    return columns


def mode_sections(runs: list[Run], cells: dict[str, list[dict[str, Any]]], request: Request, *,
                  heading: Heading = run_heading, reference_columns: bool = True, adapters: bool = True,
                  title: str = "Max batch size by sequence length, {mode}") -> list[dict[str, Any]]:
    """A table and a chart per mode any of ``runs`` has: a column (and a line) per run, headed by
    ``heading(run)`` and with its training setup under it when ``adapters``, and the BERT README's
    beside BERT runs when ``reference_columns``."""
    modes = [m for m in ALLOWED_MODE_NAMES if any(m in r.spec["modes"] for r in runs)]
    sections = []
    for mode in modes:
        columns = _columns(runs, cells, mode, request, heading, reference_columns, adapters)
        seq_lens = sorted({s for c in columns for s in c.values})
        series = [Series(c.label, [(s, c.values.get(s)) for s in seq_lens if s in c.values], c.capped,
                         dashed=c.reference) for c in columns]
        first = next((c for c in columns if not c.reference), None)
        sections.append({
            "mode": mode, "columns": columns, "seq_lens": seq_lens, "first": first,
            "chart": line_chart(series, title=title.format(mode=mode),
                                chart_id=f"chart-{mode.replace('+', '_')}"),
        })
    return sections


@router.get("/compare", response_class=HTMLResponse, name="compare")
def compare(
    request: Request, queue: QueueDep,
    id: Annotated[list[str] | None, Query(description="run ids, two or more")] = None,
) -> HTMLResponse:
    """Runs side by side per mode, with a chart, and the BERT README table beside BERT runs."""
    wanted = list(dict.fromkeys(i.strip() for i in id or [] if i.strip()))
    problems = []
    if len(wanted) > MAX_RUNS:
        problems.append(f"{len(wanted)} runs asked for: the page compares at most {MAX_RUNS}; "
                        f"showing the first {MAX_RUNS}")
        wanted = wanted[:MAX_RUNS]
    runs = []
    for run_id in wanted:
        run = queue.store.get_run(run_id)
        if run is None:
            problems.append(f"no table run with id '{run_id}'")
        else:
            runs.append(run)
    cells = {run.id: queue.store.cells(run.id) for run in runs}
    sections = mode_sections(runs, cells, request)
    recent, _ = queue.store.list_runs(limit=PICKER_RUNS)
    context = {
        "page": "compare", "runs": [summary(r) for r in runs], "sections": sections,
        "problems": problems, "picker": [summary(r) for r in recent], "chosen": {r.id for r in runs},
        "reference": reference(), "reference_note": REFERENCE_NOTE,
        "reference_seq_lens": sorted(int(s) for s in reference()["max_batch_size"]["bert-base"]),
    }
    return templates.TemplateResponse(request, "compare.html", context)
