"""/v1/explain: where the memory of a step goes, and the max batch under each lever.

Computed in an analysis worker (api/runs/analysis.py), never in the server process.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request

from api.admission import client_of
from api.deps import QueueDep, SettingsDep
from api.errors import ERROR_RESPONSES, query_fields
from api.runs.analysis import AnalysisOrder, prepare, run_analysis
from api.runs.spec import normalize
from api.schemas import ExplainPublic, ExplainQuery, mode_of, table_body

router = APIRouter(tags=["explain"], dependencies=[Depends(query_fields)])


@router.get("/explain", response_model=ExplainPublic, responses=ERROR_RESPONSES)
async def explain(
    request: Request, queue: QueueDep, settings: SettingsDep, query: Annotated[ExplainQuery, Query()],
) -> dict[str, Any]:
    """The breakdown of the step's peak, the largest modules, outlier flags, and levers (estimated).

    With LoRA / QLoRA (peft, lora_*, bnb_4bit_*) the step is PEFT's; ``adapter`` says it (null: a
    full fine-tune)."""
    body = table_body(query, backend="estimate")
    spec = await prepare(request.app.state.preparing, normalize, body, settings, queue.runner.environment)
    params = {"seq_len": query.seq_len, "batch_size": query.batch_size,
              "mode": mode_of(query, spec.weights_dtype).name,
              "levers": query.levers}
    order = AnalysisOrder("explain", spec.to_json(), params)
    return await run_analysis(queue.runner, order, request.is_disconnected,
                              client_of(request.scope, settings.api_token))
