"""/v1/explain: where the memory of a step goes, and the max batch under each lever."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query
from fastapi.concurrency import run_in_threadpool

from api.deps import QueueDep, SettingsDep
from api.errors import ERROR_RESPONSES, query_fields
from api.runs.spec import TableSpec, normalize
from autotune.workload.modes import parse_mode

router = APIRouter(tags=["explain"], dependencies=[Depends(query_fields)])


@router.get("/explain", responses=ERROR_RESPONSES)
async def explain(
    queue: QueueDep, settings: SettingsDep,
    model: Annotated[str, Query(description="preset, hub id, or a config under AUTOTUNE_MODEL_DIRS")],
    seq_len: Annotated[int, Query(ge=1)],
    batch_size: Annotated[int | None, Query(ge=1, description="default: the cell's max batch")] = None,
    mode: str = "fp32", task: str | None = None, attn: str | None = None,
    gpu: str | None = None, gpu_memory: str | None = None, margin: float | None = None,
    levers: Annotated[bool, Query(description="also the max batch under each lever (slower)")] = True,
    dtype: str | None = None, optimizer: str | None = None, loss: str | None = None,
) -> dict[str, Any]:
    """The breakdown of the step's peak, the largest modules, outlier flags, and levers (estimated)."""
    body = {"model": model, "seq_lens": [seq_len], "modes": [mode], "task": task, "attn": attn,
            "gpu": gpu, "gpu_memory": gpu_memory, "margin": margin, "backend": "estimate",
            "dtype": dtype, "optimizer": optimizer, "loss": loss}
    spec = normalize(body, settings, queue.runner.environment)
    wanted = parse_mode(mode)
    return await run_in_threadpool(explain_spec, spec, seq_len, batch_size, wanted, levers)


def explain_spec(
    spec: TableSpec, seq_len: int, batch_size: int | None, mode: Any, levers: bool
) -> dict[str, Any]:
    """autotune.analysis.explain for a normalised request (the estimator on the spec's target), as JSON."""
    import warnings

    from autotune.analysis.explain import explain
    from autotune.backends.estimate.backend import EstimateBackend

    gpu = spec.target_gpu()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        result = explain(spec.workload(), EstimateBackend(gpu), gpu, seq_len=seq_len, mode=mode,
                         margin=spec.margin, batch_size=batch_size, with_levers=levers,
                         max_batch=spec.max_batch,
                         # A GET must not take the server's GPU outside the runner's lanes (one
                         # run per GPU): the 8-bit levers stay emulated here; the CLI measures them.
                         measure_8bit=False)
    return result.to_dict()
