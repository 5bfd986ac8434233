"""/v1/tables: ask for a table, read it as its cells finish, list and cancel runs."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query, Request, Response, status

from api.deps import QueueDep, SettingsDep, WriteAccess
from api.errors import ERROR_RESPONSES
from api.limits import MAX_OFFSET
from api.measurements import measured_on
from api.runs.spec import TableSpec, normalize, run_adapter, run_trainer, run_warnings
from api.schemas import (
    AdapterPublic,
    CellPublic,
    GpuPublic,
    ImportedPublic,
    Progress,
    Status,
    TableAccepted,
    TableCreate,
    TablePublic,
    TablesPublic,
    TableSummary,
)
from api.store import Run
from autotune.errors import InvalidInput
from autotune.gpus import resolve_gpu
from autotune.workload.models import preset_name

router = APIRouter(prefix="/tables", tags=["tables"])

# Where a page of a run list starts (here and on the dashboard's pages).
Offset = Annotated[int, Query(ge=0, le=MAX_OFFSET, description="runs skipped, newest first")]

def _url(request: Request, run_id: str) -> str:
    return str(request.url_for("read_table", table_id=run_id))


def _summary(run: Run, request: Request) -> dict[str, Any]:
    return {
        "id": run.id, "url": _url(request, run.id), "model": run.model, "status": run.status,
        "progress": Progress(done=run.done, total=run.total), "task": run.spec["task"],
        "backend": run.backend, "gpu": run.gpu, "created_at": run.created_at,
        "finished_at": run.finished_at, "error": run.error,
        "adapter": None if (adapter := run_adapter(run.spec, run.header)) is None
        else AdapterPublic.model_validate(adapter),
        "measured_on": measured_on(run),
        "imported": None if run.imported is None else ImportedPublic.model_validate(run.imported),
    }


def _public(run: Run, cells: list[dict[str, Any]], request: Request) -> TablePublic:
    spec, header = run.spec, run.header or {}
    stored = TableSpec.from_json(spec)
    return TablePublic(
        **_summary(run, request),
        cells=[CellPublic.model_validate(cell) for cell in cells],
        seq_lens=spec["seq_lens"], modes=spec["modes"],
        gpu_spec=GpuPublic(**{k: spec["gpu"][k] for k in GpuPublic.model_fields}),
        budget_bytes=spec["budget_bytes"], margin=spec["margin"], max_batch=spec["max_batch"],
        search=spec["search"], attn=spec["attn"], attn_used=header.get("attn"), optimizer=spec["optimizer"],
        dtype=spec.get("dtype", "auto"), weights_dtype=stored.weights_dtype, loss=stored.loss,
        parallel=None if (parallel := stored.workload_parallel()) is None else parallel.to_json(),
        trainer=run_trainer(stored),
        warnings=run_warnings(stored),
        environment={**spec["environment"], **header.get("environment", {})},
        started_at=run.started_at, elapsed_s=run.elapsed_s, attempts=run.attempts,
    )


def read_run(queue: QueueDep, table_id: str) -> tuple[Run, list[dict[str, Any]]]:
    """A run and its finished cells; 404 naming the id when there is no such run."""
    run = queue.store.get_run(table_id)
    if run is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no table run with id '{table_id}'")
    return run, queue.store.cells(table_id)


@router.post(
    "", status_code=status.HTTP_202_ACCEPTED, response_model=TableAccepted, dependencies=[WriteAccess],
    responses={200: {"model": TableAccepted, "description": "an identical run has finished"},
               **ERROR_RESPONSES},
)
def create_table(
    body: TableCreate, request: Request, response: Response, queue: QueueDep, settings: SettingsDep,
    force: Annotated[bool, Query(description="measure again even if an identical run has finished")] = False,
) -> TableAccepted:
    """Queue a table run; an identical request gets the existing run (200 when done, 202 while it runs)."""
    spec = normalize(body.model_dump(), settings, queue.runner.environment)
    run, created = queue.submit(spec, force=force)
    url = _url(request, run.id)
    response.status_code = status.HTTP_200_OK if run.status == "done" else status.HTTP_202_ACCEPTED
    response.headers["Location"] = url
    return TableAccepted(id=run.id, status=run.status, url=url, created=created)  # type: ignore[arg-type]


def run_filters(model: str | None, gpu: str | None) -> tuple[str | None, str | None]:
    """A model and GPU filter as stored: preset aliases and GPU names resolved, blanks dropped."""
    model = (model or "").strip() or None
    gpu = (gpu or "").strip() or None
    if model is not None:
        model = preset_name(model) or model
    if gpu is not None:
        try:
            gpu = resolve_gpu(gpu).name
        except InvalidInput:
            pass  # a custom size, e.g. "custom 12 GiB"
    return model, gpu


@router.get("", response_model=TablesPublic)
def list_tables(
    request: Request, queue: QueueDep,
    model: Annotated[str | None, Query(description="a model name (preset aliases match)")] = None,
    gpu: Annotated[str | None, Query(description="the target GPU, e.g. T4")] = None,
    status_: Annotated[Status | None, Query(alias="status")] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    offset: Offset = 0,
) -> TablesPublic:
    """Table runs, newest first, a page at a time."""
    model, gpu = run_filters(model, gpu)
    runs, count = queue.store.list_runs(model=model, gpu=gpu, status=status_, limit=limit, offset=offset)
    return TablesPublic(data=[TableSummary(**_summary(r, request)) for r in runs], count=count,
                        limit=limit, offset=offset)


@router.get("/{table_id}", response_model=TablePublic, responses={404: {"description": "no such run"}})
def read_table(table_id: str, request: Request, queue: QueueDep) -> TablePublic:
    """A table run: its status, progress and the cells finished so far."""
    run, cells = read_run(queue, table_id)
    return _public(run, cells, request)


@router.delete(
    "/{table_id}", response_model=TablePublic, dependencies=[WriteAccess],
    responses={401: ERROR_RESPONSES[401], 404: {"description": "no such run"},
               409: {"description": "the run has finished already"}},
)
def cancel_table(table_id: str, request: Request, queue: QueueDep) -> TablePublic:
    """Cancel a queued or running run; the cells it finished stay."""
    run = queue.cancel(table_id)
    if run is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no table run with id '{table_id}'")
    if run.status != "cancelled":
        raise HTTPException(
            status.HTTP_409_CONFLICT,
            detail=f"table run '{table_id}' is {run.status} already: only queued or running runs "
                   "can be cancelled",
        )
    return _public(run, queue.store.cells(table_id), request)
