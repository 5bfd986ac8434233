"""Request and response bodies of the API (the OpenAPI schema at /docs is made from these)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt

from autotune.defaults import DEFAULT_MAX_BATCH

Status = Literal["queued", "running", "done", "failed", "cancelled"]


class TableCreate(BaseModel):
    """A table to measure; every field but ``model`` has the CLI's default."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{
        "model": "bert-base-uncased", "seq_lens": [128, 256, 512], "modes": ["fp32", "amp"], "gpu": "T4",
    }]})

    model: str = Field(description="a preset (`autotune models`), a Hugging Face hub id, or an absolute "
                                   "path inside AUTOTUNE_MODEL_DIRS")
    task: str | None = Field(None, description="sequence-classification, question-answering, masked-lm, "
                                               "causal-lm, token-classification (default: from the "
                                               "config's architectures; without them causal-lm for "
                                               "decoder-only models, else sequence-classification)")
    dtype: str | None = Field(None, description="weights dtype: auto (default: the config's torch_dtype, "
                                                "else float32), float32, bfloat16, float16")
    seq_lens: list[StrictInt] | None = Field(None, description="default [64, 128, 256, 320, 384, 512] for "
                                             "models of at most 512 positions, else [512, 1024, 2048, "
                                             "4096, 8192]; within the model's limit")
    modes: list[str] | str | None = Field(None, description="from fp32, amp, bf16, ckpt, amp+ckpt, "
                                                            "bf16+ckpt; default (null) fp32, amp, ckpt, "
                                                            "amp+ckpt; at least one")
    gpu_memory: str | StrictInt | None = Field(None, description="the target card's memory, e.g. '12GiB' "
                                                                 "or a byte count; at most 4 TiB")
    gpu: str | None = Field(None, description="a GPU preset, e.g. 'T4', 'A100-80GB'")
    backend: str | None = Field(None, description="auto (default), cuda or estimate")
    margin: float | None = Field(None, description="fraction of the allocator's memory kept free (0.05)")
    max_batch: StrictInt | None = Field(None, description=f"the largest batch probed ({DEFAULT_MAX_BATCH})")
    attn: str | None = Field(None, description="sdpa, eager or flash_attention_2 (default: what "
                                               "transformers picks on CUDA)")
    optimizer: str | None = Field(None, description="a Trainer optim name: adamw_torch_fused (default), "
                                                    "adamw_torch (adamw), adafactor, adamw_bnb_8bit "
                                                    "(adamw_8bit), paged_adamw_8bit, paged_adamw_32bit, sgd")
    loss: str | None = Field(None, description="full (default) or chunked: a fused linear cross-entropy "
                                               "that never holds the full logits (causal-lm)")
    search: str | None = Field(None, description="guided (default) or bisect")


class TableAccepted(BaseModel):
    id: str
    status: Status
    url: str
    created: bool = Field(description="false when an identical run answered the request")


class Progress(BaseModel):
    done: int  # cells finished
    total: int


class ProbePublic(BaseModel):
    """One trial training step; the backend's extra details ride along."""

    model_config = ConfigDict(extra="allow")

    batch_size: int
    outcome: Literal["fits", "oom", "error"]
    peak_allocated_bytes: int | None = None
    peak_reserved_bytes: int | None = None
    step_time_s: float | None = None  # measured on a GPU only
    peak_bytes: int | None = None  # what the budget bounds (estimate: the demand)
    error: str | None = None


class CellPublic(BaseModel):
    """A cell as ``autotune table --json`` prints it, with every probe made for it."""

    model_config = ConfigDict(extra="allow")

    seq_len: int
    mode: str
    max_batch_size: int | None
    peak_memory_bytes: int | None
    peak_allocated_bytes: int | None
    probes: int
    capped: bool
    backend: str
    step_time_s: float | None = None
    error: str | None = None
    probe_log: list[ProbePublic]


class GpuPublic(BaseModel):
    name: str
    total_memory_bytes: int
    context_overhead_bytes: int


class TableSummary(BaseModel):
    id: str
    url: str
    model: str
    status: Status
    progress: Progress
    task: str
    backend: str
    gpu: str
    created_at: str
    finished_at: str | None
    error: str | None


class TablePublic(TableSummary):
    cells: list[CellPublic]
    seq_lens: list[int]
    modes: list[str]
    gpu_spec: GpuPublic
    budget_bytes: int
    margin: float
    max_batch: int
    search: str
    attn: str | None = Field(description="the attention asked for (null: transformers' choice)")
    attn_used: str | None = Field(description="the attention the model runs, once the run started")
    optimizer: str
    dtype: str = Field(description="the weights dtype asked for (auto: the config's)")
    weights_dtype: str = Field(description="the dtype the weights had: float32, bfloat16 or float16")
    loss: str
    warnings: list[str] = Field(description="what the target card does not support of this step")
    environment: dict[str, Any]
    started_at: str | None
    elapsed_s: float | None
    attempts: int = Field(description="how many times the run started (more than 1 after a restart)")


class TablesPublic(BaseModel):
    data: list[TableSummary]
    count: int = Field(description="runs matching the filters, on all pages")
    limit: int
    offset: int


class DatabasePublic(BaseModel):
    # The name only: health is open to anyone who reaches the server; the path is in its log.
    file: str = Field(description="the name of the SQLite file of the queue and results")
    integrity: str = Field(description="what PRAGMA quick_check said when the server opened it: 'ok', or "
                                       "its first problems")


class HealthPublic(BaseModel):
    status: Literal["ok", "degraded"] = Field(description="degraded: the database failed its integrity check")
    backend: str = Field(description="what backend auto means here: cuda or estimate")
    gpu: str | None = Field(description="the GPU kind the cuda backend measures on")
    lanes: dict[str, int] = Field(description="runs at once per backend")
    versions: dict[str, str | None]
    queue: dict[str, int] = Field(description="runs per status")
    database: DatabasePublic
    analysis: dict[str, int] = Field(
        description="heavy reads (check and explain on the estimator): workers, busy now, answers cached")
