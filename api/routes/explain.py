"""/v1/explain: where the memory of a step goes, and the max batch under each lever.

Computed in an analysis worker (api/runs/analysis.py), never in the server process.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request

from api.deps import QueueDep, SettingsDep
from api.errors import ERROR_RESPONSES, query_fields
from api.limits import MAX_BATCH_SIZE
from api.routes.check import Peft
from api.runs.analysis import AnalysisOrder, prepare, run_analysis
from api.runs.spec import normalize
from autotune.workload.modes import parse_mode

router = APIRouter(tags=["explain"], dependencies=[Depends(query_fields)])


@router.get("/explain", responses=ERROR_RESPONSES)
async def explain(
    request: Request, queue: QueueDep, settings: SettingsDep,
    model: Annotated[str, Query(description="preset, hub id, or a config under AUTOTUNE_MODEL_DIRS")],
    seq_len: Annotated[int, Query(ge=1)],
    batch_size: Annotated[int | None, Query(ge=1, le=MAX_BATCH_SIZE,
                                            description="default: the cell's max batch")] = None,
    *,
    mode: str = "fp32", task: str | None = None, attn: str | None = None,
    gpu: str | None = None, gpu_memory: str | None = None, margin: float | None = None,
    levers: Annotated[bool, Query(description="also the max batch under each lever (slower)")] = True,
    dtype: str | None = None, optimizer: str | None = None, loss: str | None = None,
    peft: Peft,
) -> dict[str, Any]:
    """The breakdown of the step's peak, the largest modules, outlier flags, and levers (estimated).

    With LoRA / QLoRA (peft, lora_*, bnb_4bit_*) the step is PEFT's; ``adapter`` says it (null: a
    full fine-tune)."""
    body = {"model": model, "seq_lens": [seq_len], "modes": [mode], "task": task, "attn": attn,
            "gpu": gpu, "gpu_memory": gpu_memory, "margin": margin, "backend": "estimate",
            "dtype": dtype, "optimizer": optimizer, "loss": loss, **peft.fields}
    spec = await prepare(request.app.state.preparing, normalize, body, settings, queue.runner.environment)
    order = AnalysisOrder("explain", spec.to_json(), {"seq_len": seq_len, "batch_size": batch_size,
                                                      "mode": parse_mode(mode).name, "levers": levers})
    return await run_analysis(queue.runner, order, request.is_disconnected)

