"""/v1/fleet: the tables of a fleet of GPU kinds, one run per kind (autotune serve --ray)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, status

from api.deps import QueueDep, SettingsDep, WriteAccess
from api.errors import ERROR_RESPONSES
from api.fleet.launch import all_kinds_specs
from api.fleet.step import step_of
from api.schemas import FleetRunAccepted, FleetTablesAccepted, TableCreate

router = APIRouter(prefix="/fleet", tags=["fleet"])


@router.post("/tables", status_code=status.HTTP_202_ACCEPTED, response_model=FleetTablesAccepted,
             dependencies=[WriteAccess], responses=ERROR_RESPONSES)
def create_fleet_tables(
    body: TableCreate, request: Request, queue: QueueDep, settings: SettingsDep,
    force: Annotated[bool, Query(description="measure again even if an identical run has finished")] = False,
) -> FleetTablesAccepted:
    """Queue one table run per GPU kind of the fleet (backend cuda, gpu that kind); every run is checked
    before any is queued. Without gpu and gpu_memory; an identical request gets its existing runs."""
    specs = all_kinds_specs(body.model_dump(), settings, queue.runner)
    runs = []
    for spec in specs:
        run, created = queue.submit(spec, force=force)
        url = str(request.url_for("read_table", table_id=run.id))
        runs.append(FleetRunAccepted(id=run.id, status=run.status, url=url,  # type: ignore[arg-type]
                                     created=created, gpu=run.gpu))
    return FleetTablesAccepted(model=specs[0].model, step=step_of(specs[0].to_json()).id,
                               kinds=[spec.gpu["name"] for spec in specs], runs=runs)
