"""/v1/check: the CI gate over HTTP, answered from stored tables when they cover the cell.

A cell no stored table covers is estimated in an analysis worker (api/runs/analysis.py), never in
the server process: bounded in number and time, cached, dropped when the client leaves.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request

from api.admission import client_of
from api.deps import QueueDep, SettingsDep
from api.errors import ERROR_RESPONSES, query_fields
from api.measurements import measured_label, measured_on
from api.runs.analysis import AnalysisOrder, prepare, run_analysis
from api.runs.spec import TableSpec, normalize
from api.schemas import CheckPublic, CheckQuery, mode_of, table_body

router = APIRouter(tags=["check"], dependencies=[Depends(query_fields)])

# Which stored runs may answer, best first: a measurement (of this service's GPUs, or a measured
# reference table imported from docs/measurements: api/measurements.py) beats an estimate.
_SOURCES = ("cuda", "estimate")
_RUNS_SCANNED = 200  # newest done runs of the model looked at for a covering table


@router.get("/check", response_model=CheckPublic, responses=ERROR_RESPONSES)
async def check(
    request: Request, queue: QueueDep, settings: SettingsDep, query: Annotated[CheckQuery, Query()],
) -> dict[str, Any]:
    """Does the step fit? From a stored measured table, else a stored estimate, else estimated now.

    ``table_id`` names the stored table that answered (null: estimated now); ``measured_on`` the GPU
    it was measured on, and ``imported_from`` the file of a measured reference table (null
    otherwise). With LoRA / QLoRA (peft, lora_*, bnb_4bit_*), only a stored table of the same
    adapter answers; the answer's ``adapter`` says it (null: a full fine-tune), and its message names it."""
    body = table_body(query)
    # In the threadpool: resolving a hub id reads the network; a store scan reads the disk.
    preparing = request.app.state.preparing
    spec = await prepare(preparing, normalize, body, settings, queue.runner.environment)
    seq_len, batch_size, wanted = query.seq_len, query.batch_size, mode_of(query, spec.weights_dtype)
    effective = batch_size * query.accumulation_steps
    stored = await prepare(preparing, _from_store, queue, spec, seq_len, batch_size, wanted, effective)
    if stored is not None:
        return stored
    if spec.backend != "estimate":
        # A measurement takes minutes: queue the table (POST /v1/tables) and answer meanwhile
        # from the estimator, which says so in "source".
        spec = await prepare(preparing, normalize, {**body, "backend": "estimate"}, settings,
                             queue.runner.environment)
    order = AnalysisOrder("check", spec.to_json(), {"seq_len": seq_len, "batch_size": batch_size,
                                                    "mode": wanted.name, "effective_batch": effective})
    return await run_analysis(queue.runner, order, request.is_disconnected,
                              client_of(request.scope, settings.api_token))


def _covers(run_spec: dict[str, Any], spec: TableSpec, seq_len: int) -> bool:
    same = ("task", "attn", "optimizer", "margin", "budget_bytes", "model_type", "model_config",
            "weights_dtype", "loss", "alloc_conf", "parallel", "trainer")
    stored = TableSpec.from_json(run_spec)  # a run stored before weights_dtype: its dtype filled in
    return (
        all(getattr(stored, key) == getattr(spec, key) for key in same)
        and stored.peft() == spec.peft()  # a run stored before adapters: a full fine-tune
        and run_spec["gpu"]["name"] == spec.gpu["name"]
        and seq_len in run_spec["seq_lens"]
    )


def _from_store(
    queue: QueueDep, spec: TableSpec, seq_len: int, batch_size: int, mode: Any, effective: int
) -> dict[str, Any] | None:
    from autotune.analysis.check import check_from_cells, format_message

    runs, _ = queue.store.list_runs(model=spec.model, status="done", limit=_RUNS_SCANNED)
    for source in _SOURCES:
        for run in runs:
            if run.backend != source or not _covers(run.spec, spec, seq_len):
                continue
            cells = {c["mode"]: c for c in queue.store.cells(run.id) if c["seq_len"] == seq_len}
            workload = spec.workload()
            # The adapter as the run's worker reported it: the server builds no model to say it.
            reported = (run.header or {}).get("adapter") if workload.adapter is not None else None
            result = check_from_cells(
                cells, workload=workload if reported is None else replace(workload, adapter=None),
                gpu=spec.target_gpu(), seq_len=seq_len, batch_size=batch_size, mode=mode,
                budget=spec.budget_bytes, backend_name=run.backend, attn=(run.header or {}).get("attn"),
                effective_batch=effective,
            )
            if result is not None:
                result.alloc_conf = spec.alloc_conf or None  # the stored table's, as _covers checked
                if reported is not None:
                    result.adapter = reported
                result.message = format_message(result)
                label = measured_label(run)
                if label is not None:  # which table, and on which GPU: a CI log says so
                    result.message += f"\nnote: from table {run.id}, {label}"
                return {**result.to_dict(), "table_id": run.id, "measured_on": measured_on(run),
                        "imported_from": run.imported["file"] if run.imported else None}
    return None

