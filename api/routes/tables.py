"""/v1/tables: ask for a table, read it as its cells finish, list and cancel runs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query, Request, Response, status

from api.deps import JobsDep, SettingsDep, WriteAccess
from api.schemas import (
    CellPublic,
    GpuPublic,
    Progress,
    Status,
    TableAccepted,
    TableCreate,
    TablePublic,
    TablesPublic,
    TableSummary,
)
from api.spec import ModelPathRefused, normalize
from autotune.errors import AutotuneError, BackendUnavailable, InvalidInput, UnknownModel
from autotune.gpus import resolve_gpu
from autotune.models import preset_name
from autotune.store import Run

router = APIRouter(prefix="/tables", tags=["tables"])

_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"description": "a write without the server's API token"},
    403: {"description": "a model path this server may not read"},
    404: {"description": "unknown model (the detail lists the presets) or run"},
    413: {"description": "request body too large"},
    422: {"description": "invalid input: the detail says what is allowed"},
}


class FieldError(HTTPException):
    """An HTTP error about one request field: answered as ``{"detail": ..., "field": ...}``."""

    def __init__(self, status_code: int, detail: str, field: str) -> None:
        super().__init__(status_code, detail=detail)
        self.field = field


# Fields of a table request as the one-cell query routes (check, explain) name them.
QUERY_FIELDS = {"seq_lens": "seq_len", "modes": "mode"}


def http_error(exc: AutotuneError, fields: Mapping[str, str] | None = None) -> HTTPException:
    """The response for an error of the core: the status for its kind, its message as detail,
    and the request field it is about when the core's error names one (renamed by ``fields``)."""
    if isinstance(exc, UnknownModel):
        code = status.HTTP_404_NOT_FOUND
    elif isinstance(exc, ModelPathRefused):
        code = status.HTTP_403_FORBIDDEN
    elif isinstance(exc, InvalidInput):
        code = 422  # HTTP_422_UNPROCESSABLE_CONTENT, named _ENTITY before Starlette 0.48
    elif isinstance(exc, BackendUnavailable):
        code = status.HTTP_503_SERVICE_UNAVAILABLE
    else:
        code = status.HTTP_500_INTERNAL_SERVER_ERROR
    if exc.field is not None:
        return FieldError(code, str(exc), (fields or {}).get(exc.field, exc.field))
    return HTTPException(code, detail=str(exc))


def _url(request: Request, run_id: str) -> str:
    return str(request.url_for("read_table", table_id=run_id))


def _summary(run: Run, request: Request) -> dict[str, Any]:
    return {
        "id": run.id, "url": _url(request, run.id), "model": run.model, "status": run.status,
        "progress": Progress(done=run.done, total=run.total), "task": run.spec["task"],
        "backend": run.backend, "gpu": run.gpu, "created_at": run.created_at,
        "finished_at": run.finished_at, "error": run.error,
    }


def _public(run: Run, cells: list[dict[str, Any]], request: Request) -> TablePublic:
    spec, header = run.spec, run.header or {}
    return TablePublic(
        **_summary(run, request),
        cells=[CellPublic.model_validate(cell) for cell in cells],
        seq_lens=spec["seq_lens"], modes=spec["modes"],
        gpu_spec=GpuPublic(**{k: spec["gpu"][k] for k in GpuPublic.model_fields}),
        budget_bytes=spec["budget_bytes"], margin=spec["margin"], max_batch=spec["max_batch"],
        search=spec["search"], attn=spec["attn"], attn_used=header.get("attn"), optimizer=spec["optimizer"],
        environment={**spec["environment"], **header.get("environment", {})},
        started_at=run.started_at, elapsed_s=run.elapsed_s, attempts=run.attempts,
    )


def read_run(jobs: JobsDep, table_id: str) -> tuple[Run, list[dict[str, Any]]]:
    """A run and its finished cells; 404 naming the id when there is no such run."""
    run = jobs.store.get_run(table_id)
    if run is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no table run with id '{table_id}'")
    return run, jobs.store.cells(table_id)


@router.post(
    "", status_code=status.HTTP_202_ACCEPTED, response_model=TableAccepted, dependencies=[WriteAccess],
    responses={200: {"model": TableAccepted, "description": "an identical run has finished"}, **_ERRORS},
)
def create_table(
    body: TableCreate, request: Request, response: Response, jobs: JobsDep, settings: SettingsDep,
    force: Annotated[bool, Query(description="measure again even if an identical run has finished")] = False,
) -> TableAccepted:
    """Queue a table run; an identical request gets the existing run (200 when done, 202 while it runs)."""
    try:
        spec = normalize(body.model_dump(), settings, jobs.runner.environment)
    except AutotuneError as exc:
        raise http_error(exc) from exc
    run, created = jobs.submit(spec, force=force)
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
    request: Request, jobs: JobsDep,
    model: Annotated[str | None, Query(description="a model name (preset aliases match)")] = None,
    gpu: Annotated[str | None, Query(description="the target GPU, e.g. T4")] = None,
    status_: Annotated[Status | None, Query(alias="status")] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    offset: Annotated[int, Query(ge=0)] = 0,
) -> TablesPublic:
    """Table runs, newest first, a page at a time."""
    model, gpu = run_filters(model, gpu)
    runs, count = jobs.store.list_runs(model=model, gpu=gpu, status=status_, limit=limit, offset=offset)
    return TablesPublic(data=[TableSummary(**_summary(r, request)) for r in runs], count=count,
                        limit=limit, offset=offset)


@router.get("/{table_id}", response_model=TablePublic, responses={404: {"description": "no such run"}})
def read_table(table_id: str, request: Request, jobs: JobsDep) -> TablePublic:
    """A table run: its status, progress and the cells finished so far."""
    run, cells = read_run(jobs, table_id)
    return _public(run, cells, request)


@router.delete(
    "/{table_id}", response_model=TablePublic, dependencies=[WriteAccess],
    responses={401: _ERRORS[401], 404: {"description": "no such run"},
               409: {"description": "the run has finished already"}},
)
def cancel_table(table_id: str, request: Request, jobs: JobsDep) -> TablePublic:
    """Cancel a queued or running run; the cells it finished stay."""
    run = jobs.cancel(table_id)
    if run is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no table run with id '{table_id}'")
    if run.status != "cancelled":
        raise HTTPException(
            status.HTTP_409_CONFLICT,
            detail=f"table run '{table_id}' is {run.status} already: only queued or running runs "
                   "can be cancelled",
        )
    return _public(run, jobs.store.cells(table_id), request)
