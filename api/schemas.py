"""Request and response bodies of the API (the OpenAPI schema at /docs is made from these)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt

from autotune.request import PEFT_FIELDS, CheckRequest, ExplainRequest, TableRequest, fields_of

# What each field of a request is, in the words every entrance uses (autotune/request.py declares
# it once); the service's own limits are added where it has them.
DESCRIPTIONS = {f.name: f.about.help for cls in (TableRequest, CheckRequest, ExplainRequest)
                for f in fields_of(cls)}
# The LoRA / QLoRA fields of a table request, and the query parameters of check and explain.
PEFT_DESCRIPTIONS = {name: DESCRIPTIONS[name] for name in PEFT_FIELDS if name != "peft_config"}
ADAPTER_DESCRIPTION = (
    "LoRA / QLoRA: the method, rank, alpha, dropout, the target modules PEFT resolved on the model, "
    "the trainable and total parameters (PEFT's get_nb_trainable_parameters) and a label saying "
    "them in words; null for a full fine-tune"
)

Status = Literal["queued", "running", "done", "failed", "cancelled"]


class TableCreate(BaseModel):
    """A table to measure; every field but ``model`` has the CLI's default."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{
        "model": "bert-base-uncased", "seq_lens": [128, 256, 512], "modes": ["fp32", "amp"], "gpu": "T4",
    }]})

    model: str = Field(description="a preset (`autotune models`), a Hugging Face hub id, or an absolute "
                                   "path inside AUTOTUNE_MODEL_DIRS")
    task: str | None = Field(None, description=DESCRIPTIONS["task"])
    dtype: str | None = Field(None, description=DESCRIPTIONS["dtype"])
    seq_lens: list[StrictInt] | None = Field(None, description=DESCRIPTIONS["seq_lens"])
    modes: list[str] | str | None = Field(None, description=DESCRIPTIONS["modes"])
    gpu_memory: str | StrictInt | None = Field(None, description=DESCRIPTIONS["gpu_memory"])
    gpu: str | None = Field(None, description=DESCRIPTIONS["gpu"])
    backend: str | None = Field(None, description=DESCRIPTIONS["backend"])
    margin: float | None = Field(None, description=DESCRIPTIONS["margin"])
    max_batch: StrictInt | None = Field(None, description=DESCRIPTIONS["max_batch"])
    attn: str | None = Field(None, description=DESCRIPTIONS["attn"])
    optimizer: str | None = Field(None, description=DESCRIPTIONS["optimizer"])
    loss: str | None = Field(None, description=DESCRIPTIONS["loss"])
    search: str | None = Field(None, description=DESCRIPTIONS["search"])
    peft: str | None = Field(None, description=PEFT_DESCRIPTIONS["peft"])
    lora_r: StrictInt | None = Field(None, description=PEFT_DESCRIPTIONS["lora_r"])
    lora_alpha: float | None = Field(None, description=PEFT_DESCRIPTIONS["lora_alpha"])
    lora_dropout: float | None = Field(None, description=PEFT_DESCRIPTIONS["lora_dropout"])
    lora_targets: str | list[str] | None = Field(
        None, description=PEFT_DESCRIPTIONS["lora_targets"] + "; a comma-separated string or a list")
    load_in_4bit: bool | None = Field(None, description=PEFT_DESCRIPTIONS["load_in_4bit"])
    load_in_8bit: bool | None = Field(None, description=PEFT_DESCRIPTIONS["load_in_8bit"])
    bnb_4bit_quant_type: str | None = Field(None, description=PEFT_DESCRIPTIONS["bnb_4bit_quant_type"])
    bnb_4bit_use_double_quant: bool | None = Field(
        None, description=PEFT_DESCRIPTIONS["bnb_4bit_use_double_quant"])
    bnb_4bit_compute_dtype: str | None = Field(None, description=PEFT_DESCRIPTIONS["bnb_4bit_compute_dtype"])
    qlora_recipe: str | None = Field(None, description=PEFT_DESCRIPTIONS["qlora_recipe"])


class TableAccepted(BaseModel):
    id: str
    status: Status
    url: str
    created: bool = Field(description="false when an identical run answered the request")


class FleetRunAccepted(TableAccepted):
    gpu: str = Field(description="the GPU kind this run measures on")


class FleetTablesAccepted(BaseModel):
    """One table run per GPU kind of the fleet (POST /v1/fleet/tables)."""

    model: str
    step: str = Field(description="the id of what the runs share (task, dtype, optimizer, attention, loss, "
                                  "adapter, margin, backend): the dashboard's fleet view of the model shows "
                                  "them side by side at /fleet?model=MODEL&step=STEP")
    kinds: list[str] = Field(description="the fleet's GPU kinds, one run each")
    runs: list[FleetRunAccepted]


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


class ParametersPublic(BaseModel):
    trainable: int
    total: int = Field(description="4-bit weights counted as their elements, as PEFT counts them")


class AdapterPublic(BaseModel):
    """A run's LoRA / QLoRA setup (autotune.workload.adapters.AdapterSummary)."""

    model_config = ConfigDict(extra="allow")

    method: Literal["lora", "qlora"]
    r: int
    alpha: float
    dropout: float
    targets: list[str] | None = Field(
        description="the modules PEFT put LoRA on; until the run has started, the modules asked for "
                    "(null: PEFT's default)")
    targets_default: bool = Field(description="whether the targets are PEFT's default for the architecture")
    quant_type: str = Field(description="qlora: the 4-bit storage, nf4 or fp4")
    double_quant: bool = Field(description="qlora: whether the quantization constants are quantized too")
    compute_dtype: str | None = Field(description="qlora: the 4-bit layers' compute dtype (null: bfloat16, "
                                                  "float16 on a card without it)")
    bias: str
    modules_to_save: list[str]
    parameters: ParametersPublic | None = Field(
        description="trainable and total parameters; null until the run has started")
    label: str


class GpuPublic(BaseModel):
    name: str
    total_memory_bytes: int
    context_overhead_bytes: int


class ImportedPublic(BaseModel):
    """Where a measured reference table came from: a file of docs/measurements/ (api/measurements.py)."""

    model_config = ConfigDict(extra="allow")

    source: str = Field(description="the file's folder and name, e.g. h100-80gb/x.json: what identifies "
                                    "the import (importing it again replaces it when it changed)")
    file: str = Field(description="the file as it was imported")
    sha256: str = Field(description="of the file's bytes")
    measured_on: str = Field(description="the GPU the table was measured on")
    driver: str | None
    cuda_version: str | None
    torch_version: str
    transformers_version: str
    measured_at: str | None = Field(description="when it was measured, when the file says")
    cells_missing: list[str] = Field(description="the cells the measurement did not reach, as mode:seq_len "
                                                 "(not measured, not failed)")


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
    adapter: AdapterPublic | None = Field(description=ADAPTER_DESCRIPTION)
    measured_on: str | None = Field(default=None, description="the GPU a cuda run measured on (null: "
                                                              "an estimate, or not known)")
    imported: ImportedPublic | None = Field(default=None, description="a measured reference table imported "
                                                                      "from a file: where it came from; null "
                                                                      "for a run of this service")


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


class FleetKindPublic(BaseModel):
    kind: str = Field(description="a GPU kind, as the GPU preset its nodes' label autotune/gpu names")
    nodes: int
    gpus: float
    free_gpus: float = Field(description="GPUs no task holds now")


class FleetNodePublic(BaseModel):
    node_id: str
    address: str
    kind: str | None = Field(description="its GPU kind; null: no GPU, or a card no label names")
    gpus: float
    free_gpus: float
    cpus: float
    free_cpus: float


class FleetPublic(BaseModel):
    """The Ray cluster a fleet server runs its tables on (autotune serve --ray)."""

    address: str
    status: Literal["connected", "unreachable"] = Field(
        description="unreachable: new runs are answered 503, queued ones wait for it")
    error: str | None = Field(description="why it is unreachable")
    since: float = Field(description="when it became connected or unreachable (Unix time, s)")
    kinds: list[FleetKindPublic]
    nodes: list[FleetNodePublic]
    cpus: float
    free_cpus: float
    runs: int = Field(description="runs on the cluster now")
    tasks: int = Field(description="cells in flight (Ray tasks)")


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
    fleet: FleetPublic | None = Field(default=None, description="the Ray cluster of a fleet server (GPU "
                                                                "kinds, nodes, free GPUs); null on one host")
