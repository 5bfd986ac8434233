"""Request and response bodies of the API (the OpenAPI schema at /docs is made from these).

The table body (``TableCreate``) and the query parameters of check and explain (``CheckQuery``,
``ExplainQuery``) are made from the request's fields (autotune/request.py declares each once: its
name, type, default and help, and whether the service takes it), so that a field added there is
a property of the body and a parameter of the queries, described by its help. What the service
adds is its own:

- how each carries a value (``_body_type``, ``_query_type``): a JSON body integers as integers
  (StrictInt: "8" and 8.5 are refused) and sequences as lists; a query everything as text, read
  by the library where the CLI reads text (a size, comma-separated names);
- what a request leaves out (``_default``);
- the model names it may read (``MODEL``), its bounds on a query's numbers (``QUERY_LIMITS``, from
  api/limits.py; a body's are checked by normalize, whose messages name the allowed values), and
  its words where its form differs from the CLI's (``ADDED``, and each model's ``descriptions``).
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Collection, Mapping, Sequence
from types import NoneType, UnionType
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, StrictInt, create_model

from api.limits import MAX_ACCUMULATION_STEPS, MAX_BATCH_SIZE, MAX_LORA_R, MAX_LORA_TARGETS_CHARS
from autotune.request import CheckRequest, ExplainRequest, TableRequest, field_types, fields_of
from autotune.request import Field as RequestField

Location = Literal["body", "query"]

# The model names the service may read (api/runs/spec.py check_model_name), as each says them.
MODEL = {"body": "a preset (`autotune models`), a Hugging Face hub id, or an absolute path inside "
                 "AUTOTUNE_MODEL_DIRS",
         "query": "preset, hub id, or a config under AUTOTUNE_MODEL_DIRS"}
# The query's bounds: a number beyond them is pydantic's 422 naming the parameter, never a 500 from
# what handles it (api/limits.py says why each).
QUERY_LIMITS: dict[str, dict[str, Any]] = {
    "seq_len": {"ge": 1},
    "batch_size": {"ge": 1, "le": MAX_BATCH_SIZE},
    "accumulation_steps": {"ge": 1, "le": MAX_ACCUMULATION_STEPS},
    "lora_r": {"ge": 1, "le": MAX_LORA_R},
    "lora_alpha": {"gt": 0, "allow_inf_nan": False},
    "lora_dropout": {"ge": 0, "lt": 1, "allow_inf_nan": False},
    "lora_targets": {"max_length": MAX_LORA_TARGETS_CHARS},
}
# Words added to a field's help where the service's form differs from the CLI's.
ADDED = {("body", "lora_targets"): "; a comma-separated string or a list",
         ("query", "lora_targets"): "; comma-separated"}
TABLE_FIELDS = frozenset(f.name for f in fields_of(TableRequest) if f.about.http)


def request_model(cls: type, location: Location, *, omit: Collection[str] = (),
                  required: Collection[str] = (), types: Mapping[str, Any] | None = None,
                  descriptions: Mapping[str, str] | None = None) -> type[BaseModel]:
    """A pydantic model of the fields of ``cls`` the service takes (``About.http``), as the
    ``location`` carries them: the required first, then a query's own (its cell), then the rest.

    A field is required when its type has no None and its default is None (``model``, a check's
    ``seq_len`` and ``batch_size``: the library names them missing), or is named in ``required``.
    ``types`` and ``descriptions`` replace what the fields say, for this model."""
    hints, types, descriptions = field_types(cls), types or {}, descriptions or {}
    made: dict[str, Any] = {}  # name -> (type, FieldInfo)
    needed = set(required)
    for f in fields_of(cls):
        if not f.about.http or f.name in omit:
            continue
        members, optional = _members(hints[f.name])
        if f.default is None and not optional:
            needed.add(f.name)
        default = ... if f.name in needed else _default(f, location)
        kind = types.get(f.name) or (functools.reduce(operator.or_, map(_body_type, members))
                                     if location == "body" else _query_type(members))
        limits = QUERY_LIMITS.get(f.name, {}) if location == "query" else {}
        description = descriptions.get(f.name, f.about.help + ADDED.get((location, f.name), ""))
        made[f.name] = (kind if default is not None or f.name in types else kind | None,
                        Field(default, description=description, **limits))

    def place(name: str) -> int:
        return 0 if name in needed else 1 if name not in TABLE_FIELDS else 2

    return create_model(f"{cls.__name__}{location.title()}",  # e.g. CheckRequestQuery
                        **{name: made[name] for name in sorted(made, key=place)})


def _default(f: RequestField, location: Location) -> Any:
    """A field a request leaves out: None in a body (normalize fills in the default, the server's
    backend among them), and so in a query for the fields a table's body has too, but switches;
    the field's own default for a query's own (a check's mode, its accumulation steps)."""
    if location == "body" or (f.name in TABLE_FIELDS and not isinstance(f.default, bool)):
        return None
    return f.default


def _members(hint: Any) -> tuple[list[Any], bool]:
    """The types of a union (or the one type), None apart, and whether None was one of them."""
    args = get_args(hint) if get_origin(hint) in (Union, UnionType) else (hint,)
    return [a for a in args if a is not NoneType], NoneType in args


def _is_sequence(hint: Any) -> bool:
    return get_origin(hint) in (Sequence, list, tuple)


def _body_type(hint: Any) -> Any:
    """How a JSON body carries a value of ``hint`` (one type, not a union)."""
    if hint is int:
        return StrictInt
    if _is_sequence(hint):
        return list[_body_type(get_args(hint)[0])]  # type: ignore[misc]
    return hint


def _query_type(members: list[Any]) -> Any:
    """How a query carries a value of one of ``members``: as text where the library reads text."""
    if str in members:
        return str
    [hint] = members  # two kinds of number, say, would need the service to choose: it must
    return list[get_args(hint)[0]] if _is_sequence(hint) else hint  # type: ignore[misc]


class TableCreate(request_model(  # type: ignore[misc]  # a base made at import: mypy sees Any
        TableRequest, "body", types={"seq_lens": list[StrictInt] | None},
        descriptions={"model": MODEL["body"]})):
    """A table to measure; every field but ``model`` has the CLI's default."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{
        "model": "bert-base-uncased", "seq_lens": [128, 256, 512], "modes": ["fp32", "amp"], "gpu": "T4",
    }]})


# A check's and an explain's one cell: the fields of their request, as query parameters (unknown
# parameters are ignored, as FastAPI ignores them). No peft_config: the server cannot read a
# client's file (the CLI sends its values).
class CheckQuery(request_model(  # type: ignore[misc]
        CheckRequest, "query", descriptions={"model": MODEL["query"]})):
    """GET /v1/check: one training step, and the card it is for."""


class ExplainQuery(request_model(  # type: ignore[misc]
        # The estimator answers (no backend to choose); the sequence length is required, the
        # lengths that would give its default are not taken.
        ExplainRequest, "query", omit={"backend"}, required={"seq_len"},
        descriptions={"model": MODEL["query"], "seq_len": "sequence length of the step, in tokens",
                      "batch_size": "default: the cell's max batch"})):
    """GET /v1/explain: one training step, and the card it is for."""


def mode_of(query: BaseModel, weights_dtype: str) -> Any:
    """The mode of a check's or an explain's query: as asked, else the weights' default."""
    from autotune.defaults import default_mode_name
    from autotune.workload.modes import parse_mode

    mode = query.model_dump()["mode"]
    return parse_mode(mode if mode is not None else default_mode_name(weights_dtype))


def table_body(query: BaseModel, **changes: Any) -> dict[str, Any]:
    """The table request (TableCreate's fields) of a check's or an explain's one cell."""
    values = query.model_dump()
    body = {name: value for name, value in values.items() if name in TABLE_FIELDS}
    # no mode: the table's modes of the weights (defaults.default_mode_names), the first of them the
    # check's (the route's ``mode_of``)
    modes = None if values["mode"] is None else [values["mode"]]
    return {**body, "seq_lens": [values["seq_len"]], "modes": modes, **changes}


ADAPTER_DESCRIPTION = (
    "LoRA / QLoRA: the method, rank, alpha, dropout, the target modules PEFT resolved on the model, "
    "the trainable and total parameters (PEFT's get_nb_trainable_parameters) and a label saying "
    "them in words; null for a full fine-tune"
)

Status = Literal["queued", "running", "done", "failed", "cancelled"]


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
    also_fits: int | None = Field(default=None, description="a larger batch that also fits, past "
                                  "max_batch_size + 1 that runs out of memory (the caching allocator's "
                                  "fragmentation); null: none known")


class ParametersPublic(BaseModel):
    trainable: int
    total: int = Field(description="4-bit weights counted as their elements, as PEFT counts them")


class AdapterPublic(BaseModel):
    """A run's LoRA / QLoRA setup (autotune.workload.adapters.AdapterSummary)."""

    model_config = ConfigDict(extra="allow")

    method: Literal["lora", "qlora", "lora_8bit"]
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


TRAINER_DESCRIPTION = ("a preference or RL trainer's step (name, trl_class, rows_per_sample, reference, "
                       "label; grpo: its generation settings and a colocated vLLM engine's vllm_bytes; kto: "
                       "loss_type, kl_batch, min_batch); null: supervised fine-tuning. Each max batch counts "
                       "what the trainer's batch counts (pairs, examples, completions)")


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
    parallel: dict[str, Any] | None = Field(default=None, description="a multi-GPU job: kind (ddp, fsdp), "
                                            "gpus, nodes, reshard_after_forward, shard_size, label, "
                                            "modelled; every max batch is one GPU's. null: one GPU")
    trainer: dict[str, Any] | None = Field(default=None, description=(
        "the preference or RL trainer whose step the table is for: settings (as stored in the run's spec: "
        "name and the settings that apply to it), and " + TRAINER_DESCRIPTION))
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
    writable: bool = Field(default=True, description="false: the last write failed (a full disk, a lock, an "
                                                     "I/O error) and none has succeeded since")
    write_error: str | None = Field(
        default=None, description="why the last write failed, as SQLite says it (e.g. 'database or disk is "
                                  "full'); null when writable")
    backlog: int = Field(
        default=0, description="results of runs (cells, ends) waiting to be written, kept in memory and "
                               "retried every AUTOTUNE_RECONCILE_S")


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
    status: Literal["ok", "degraded"] = Field(
        description="degraded: the database failed its integrity check, cannot be written now, or has "
                    "results waiting to be written (database)")
    backend: str = Field(description="what backend auto means here: cuda or estimate")
    gpu: str | None = Field(description="the GPU kind the cuda backend measures on")
    lanes: dict[str, int] = Field(description="runs at once per backend")
    versions: dict[str, str | None]
    queue: dict[str, int] = Field(description="runs per status")
    database: DatabasePublic
    analysis: dict[str, int] = Field(
        description="heavy reads (check and explain on the estimator): workers, busy now, waiting for one, "
                    "answers cached")
    fleet: FleetPublic | None = Field(default=None, description="the Ray cluster of a fleet server (GPU "
                                                                "kinds, nodes, free GPUs); null on one host")


# --- GET /v1/check and /v1/explain: what they answer ------------------------------------------------
# Each key of autotune.analysis's answers (check.CheckResult, explain.Explanation), in their order
# (tests/api/test_check.py and test_explain.py pin the two together); unknown keys would pass.


class CheckLeverPublic(BaseModel):
    """A change to the step and the cell's max batch with it (autotune.analysis.levers.Lever)."""

    model_config = ConfigDict(extra="allow")

    lever: str = Field(description="mode, checkpointing, optimizer, loss, adapter, combined or seq_len")
    label: str = Field(description="what to do, e.g. mode bf16+ckpt")
    max_batch_size: int


class CheckPublic(BaseModel):
    """Does the step fit at the batch asked for; if not, the cell's max batch and what would fit."""

    model_config = ConfigDict(extra="allow")

    fits: bool
    max_batch_size: int = Field(description="of the cell: the step's sequence length and mode")
    peak_memory_bytes: int | None = Field(description="of the step at the batch asked for")
    budget_bytes: int = Field(description="what the allocator may use on the card (the margin kept free)")
    source: Literal["measured", "estimated"]
    backend: str = Field(description="cuda (measured) or estimate")
    suggestion: str | None = Field(description="when it does not fit: accumulation steps to the same "
                                               "effective batch, then the levers that help, best first")
    model: str
    seq_len: int
    mode: str
    batch_size: int
    gpu_name: str
    gpu_memory_bytes: int
    message: str = Field(description="the answer in words, as `autotune check` prints it")
    task: str | None
    weights_dtype: str | None
    optimizer: str | None
    attn: str | None
    loss: str | None
    warnings: list[str] = Field(description="what the target card does not support of this step")
    levers: list[CheckLeverPublic] = Field(description="what raises the max batch, best first")
    outside_allocator_bytes: int = Field(description="a paged optimizer's state, in unified memory")
    adapter: dict[str, Any] | None = Field(description=ADAPTER_DESCRIPTION)
    attention_kernel: str | None = Field(description="the SDPA kernel the estimated step ran (cuDNN, "
                                                     "memory-efficient, ...); null without SDPA or measured")
    ckpt_reentrant: bool = Field(description="checkpointed modes with use_reentrant=True")
    liger: list[str] = Field(description="Liger Kernel's kernels swapped in, emulated from its source "
                                         "(rms_norm, rope, swiglu, ...); empty without")
    alloc_conf: str | None = Field(default=None, description="PyTorch's caching-allocator settings the step "
                                   "was answered under (PYTORCH_ALLOC_CONF); null: its default")
    chip_assumed: str | None = Field(default=None, description="the preset whose chip a card given by its "
                                     "size alone was taken to be; null where the chip is known")
    parallel: dict[str, Any] | None = Field(default=None, description="a multi-GPU job: kind (ddp, fsdp), "
                                            "gpus, nodes, reshard_after_forward, shard_size, label; the "
                                            "batch is per GPU. null: one GPU")
    images: dict[str, Any] | None = Field(default=None, description="a vision-language model's images in "
                                          "every row; always null here: the service refuses those models")
    offload_activations: bool = Field(default=False, description="TRL's OffloadActivations around each step; "
                                      "always false here: the service does not take it")
    offload_streams: bool = Field(default=True, description="with offload_activations, TRL's use_streams; "
                                  "always true here: the service does not take offloading")
    compiled: str | None = Field(default=None, description="torch.compile's mode around the model "
                                 "(torch_compile); always null here: the service does not take it")
    trainer: dict[str, Any] | None = Field(default=None, description=TRAINER_DESCRIPTION)
    host_memory_bytes: int = Field(default=0, description="pinned host memory a GPU's rank holds "
                                   "(FSDP's CPU offload: shards, gradients, optimizer state; ZeRO-Offload's "
                                   "buffers, CPU Adam state); 0: none")
    also_fits: int | None = Field(default=None, description="a larger batch than the max that also fits, "
                                  "past max_batch_size + 1 that runs out of memory (the caching allocator's "
                                  "fragmentation); null: none known")
    table_id: str | None = Field(description="the stored table that answered (null: estimated now)")
    measured_on: str | None = Field(description="the GPU that table was measured on")
    imported_from: str | None = Field(description="the file of a measured reference table it came from")


class BreakdownPublic(BaseModel):
    """Allocated memory at the peak of the step, by category (allocator blocks, in bytes)."""

    model_config = ConfigDict(extra="allow")

    batch_size: int
    peak_allocated_bytes: int = Field(description="the sum of the categories")
    peak_step: int = Field(description="the training step of the peak, from 1")
    peak_phase: str = Field(description="forward, backward or optimizer step (or setup)")
    categories: dict[str, int] = Field(
        description="parameters, gradients, optimizer_state, autocast_copies, activations, temporaries, "
                    "inputs, workspaces; with an adapter, parameters is frozen_base, base_4bit (a 4-bit "
                    "base) or base_8bit (an 8-bit one) and adapter_weights, and dequantization (a 4-bit "
                    "base) or int8_matmul (an 8-bit one) follows activations; on a rank of a multi-GPU "
                    "job communication_buffers (and under fsdp gathered_parameters before it) follows "
                    "optimizer_state")
    demand_bytes: int = Field(description="the smallest capacity the step runs in (what the budget bounds)")
    cached_bytes: int = Field(description="reserved but not in use at the peak")
    context_bytes: int = Field(description="the CUDA context, outside PyTorch's allocator")
    budget_bytes: int
    fits: bool


class ModuleParamsPublic(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str = Field(description="the module's name (empty: the model itself)")
    type: str
    description: str = Field(description="e.g. Embedding(868000, 32)")
    shapes: list[list[int]] = Field(description="of its own parameters")
    params: int
    param_bytes: int
    share: float = Field(description="of all parameters")


class ModuleActivationsPublic(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str
    type: str
    output_shape: list[int] | None
    activation_bytes: int = Field(description="tensor bytes it allocated in the forward, saved for backward")
    share: float = Field(description="of all activations")


class FlagPublic(BaseModel):
    model_config = ConfigDict(extra="allow")

    kind: str = Field(description="dominant-module, huge-vocabulary, flattened-sequence or loss-logits")
    module: str
    message: str


class ExplainLeverPublic(BaseModel):
    """One lever and the cell's max batch with it (autotune.analysis.levers.LeverReport)."""

    model_config = ConfigDict(extra="allow")

    name: str = Field(description="amp, bf16, ckpt, amp+ckpt, adamw-8bit, adamw-8bit-trainer, sgd, "
                                  "frozen-embeddings, fused-cross-entropy, lora, qlora, lora-rN, qlora-rN, "
                                  "seq-N or accumulation")
    label: str
    max_batch_size: int | None = Field(description="null when the lever does not apply (see error)")
    mode: str
    seq_len: int
    optimizer: str
    estimated: str = Field(description="as the table, or how the lever was emulated or measured")
    capped: bool
    note: str | None
    error: str | None
    adapter: dict[str, Any] | None = Field(description="the PEFT setup of a lever that changes it")


class ExplainRiskPublic(BaseModel):
    """What could make a run of the step need more than its estimate (autotune.analysis.risks.Risk)."""

    model_config = ConfigDict(extra="allow")

    kind: str = Field(description="eager-attention, longer-batch, earlier-model, fragmentation or "
                                  "evaluation-outputs")
    label: str
    max_batch_size: int | None = Field(description="the cell's max with it; null for evaluation-outputs "
                                                   "(see samples) or where it cannot be searched (see error)")
    breaks: bool = Field(description="batch_size runs out of memory with it")
    bytes: int | None = Field(description="what it takes: the earlier model, the cached blocks, one "
                                          "sample's outputs")
    samples: int | None = Field(description="evaluation-outputs: the samples the memory left holds")
    error: str | None


class ExplainPublic(BaseModel):
    """Where the memory of the step goes, the largest modules, outlier flags, and the levers."""

    model_config = ConfigDict(extra="allow")

    model: str
    task: str
    attn: str
    optimizer: str
    weights_dtype: str = Field(description="float32, bfloat16 or float16")
    loss: str = Field(description="full, chunked (Liger's), cce (Cut Cross-Entropy), chunked_nll (TRL's), "
                                  "dft or eaft (LLaMA-Factory's)")
    mode: str
    seq_len: int
    gpu_name: str
    gpu_memory_bytes: int
    budget_bytes: int
    margin: float
    max_batch_size: int = Field(description="of the cell; 0: even batch 1 does not fit")
    capped: bool = Field(description="the max batch reached the search's limit")
    requested_batch_size: int | None
    batch_size: int = Field(description="the batch the breakdown is for")
    fits: bool = Field(description="at batch_size")
    breakdown: BreakdownPublic
    total_params: int
    top_parameters: list[ModuleParamsPublic]
    top_activations: list[ModuleActivationsPublic]
    flags: list[FlagPublic]
    does_not_fit: str | None = Field(description="why even batch 1 does not fit, when it does not")
    levers: list[ExplainLeverPublic] = Field(description="empty with levers=false")
    risks: list[ExplainRiskPublic] = Field(default_factory=list, description="with the levers: what could "
                                           "make a run need more than the estimate on some runs")
    padding: dict[str, Any] | None = Field(description="dynamic padding over the data's lengths: null "
                                                       "here (the service takes no lengths)")
    adapter: dict[str, Any] | None = Field(description=ADAPTER_DESCRIPTION)
    weight_bytes: dict[str, int] | None = Field(description="with an adapter: tensor bytes of the "
                                                           "parameters and buffers by category")
    attention_kernel: str | None = Field(description="the SDPA kernel the step ran; null without SDPA")
    parallel: dict[str, Any] | None = Field(default=None, description="a multi-GPU job: kind (ddp, fsdp), "
                                            "gpus, nodes, reshard_after_forward, shard_size, label, "
                                            "modelled, nccl_bytes; every figure is one GPU's (rank 0). "
                                            "null: one GPU")
    images: dict[str, Any] | None = Field(default=None, description="a vision-language model's images in "
                                          "every row; always null here: the service refuses those models")
    host_offload_bytes: int | None = Field(default=None, description="with activation offloading, the host "
                                           "memory its copies held; always null here: the service does "
                                           "not take it")
    offload_streams: bool = Field(default=True, description="with activation offloading, TRL's use_streams; "
                                  "always true here: the service does not take offloading")
    compiled: str | None = Field(default=None, description="how a compiled step (torch_compile) was "
                                 "modelled; always null here: the service does not take it")
    host_memory_bytes: int | None = Field(default=None, description="with FSDP's CPU offload or "
                                          "ZeRO-Offload: the host memory one rank held at the batch "
                                          "explained; null without an offload")
    trainer: dict[str, Any] | None = Field(default=None, description=TRAINER_DESCRIPTION)
    also_fits: int | None = Field(default=None, description="a larger batch than the max that also fits, "
                                  "past max_batch_size + 1 that runs out of memory (the caching allocator's "
                                  "fragmentation); null: none known")
