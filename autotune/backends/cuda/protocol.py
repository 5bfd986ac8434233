"""The protocol between the cuda backend (backend.py) and its probe workers (probe_worker.py).

JSON objects, one per line, UTF-8. The backend writes requests to the worker's stdin; the worker
answers each with exactly one line on stdout. Its stderr is free text (logs, tracebacks) that the
backend keeps for error reports. The worker exits when stdin closes.

    backend -> worker                         worker -> backend
    {"op": "init", "protocol": 1,             {"op": "ready", "attn", "free_bytes", "total_bytes",
     "cell": CellSpec}                          "device_name", "compute_capability",
                                                "model_bytes", "model_oom": null | message}
                                              or {"op": "failed", "error_type", "error", ...}
    {"op": "probe", "batch_size": n}          {"op": "result", "batch_size": n,
                                                "outcome": "fits" | "oom" | "error",
                                                "peak_allocated_bytes", "peak_reserved_bytes",
                                                "step_time_s", "samples_per_s", "error_type",
                                                "error", "clean", "allocated_after_bytes", ...}
    {"op": "exit"}, or stdin closed           (exits 0)

A ``CellSpec`` carries everything a worker needs to rebuild one cell, in JSON types only.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from autotune.errors import ProtocolError
from autotune.workload import Workload
from autotune.workload.adapters import Adapter
from autotune.workload.fp8 import parse_fp8
from autotune.workload.frozen import parse_frozen, parse_unfrozen
from autotune.workload.liger import parse_kernels
from autotune.workload.loss import check_loss
from autotune.workload.models import check_dtype, check_task, config_to_json, model_from_json
from autotune.workload.modes import Mode, parse_mode
from autotune.workload.optimizers import check_optimizer
from autotune.workload.parallel import Parallel
from autotune.workload.qat import parse_qat
from autotune.workload.step import check_attn
from autotune.workload.trainers import Trainer
from autotune.workload.vision import make_images

PROTOCOL = 1


REQUESTS = ("init", "probe", "exit")


REPLIES = ("ready", "failed", "result")


def encode(message: Mapping[str, Any]) -> str:
    """One protocol line: a JSON object with a known ``op``, ending in a newline."""
    op = message.get("op")
    if op not in REQUESTS + REPLIES:
        raise ProtocolError(f"unknown op {op!r}: allowed are {', '.join(REQUESTS + REPLIES)}")
    # allow_nan=False: NaN and Infinity are not JSON; a reply carrying one is a bug to surface.
    return json.dumps(dict(message), allow_nan=False, separators=(",", ":")) + "\n"


def decode(line: str) -> dict[str, Any]:
    """The message of one protocol line; ProtocolError for anything else."""
    try:
        message = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ProtocolError(f"not a JSON line: {line[:200]!r}") from exc
    if not isinstance(message, dict) or message.get("op") not in REQUESTS + REPLIES:
        raise ProtocolError(f"not a protocol message: {line[:200]!r}")
    return message


@dataclasses.dataclass(frozen=True)
class CellSpec:
    """Everything a worker needs to rebuild one cell, in JSON types only."""

    model_name: str
    model_source: str
    model_type: str  # a key of transformers' CONFIG_MAPPING: no remote code
    config: dict[str, Any]  # PretrainedConfig.to_dict(), as JSON
    max_seq_len: int  # usable positions of the model
    task: str
    attn: str | None
    optimizer: str
    steps: int  # full training steps per probe
    mode: str  # a mode name, e.g. "amp+ckpt"
    seq_len: int  # tokens per sequence
    budget_bytes: int  # what the caching allocator may reserve
    device_index: int
    bnb_optimizer: str | None = None  # a bnb.BNB_OPTIMIZERS setup instead of ``optimizer``
    weights_dtype: str = "float32"  # float32 | bfloat16 | float16
    loss: str = "full"  # workload.loss.LOSSES
    adapter: dict[str, Any] | None = None  # workload.adapters.Adapter.to_json(); None: full fine-tune
    ckpt_reentrant: bool = False  # checkpointed modes with use_reentrant=True
    liger: list[str] = dataclasses.field(default_factory=list)  # workload.liger's kernels, swapped in
    # A multi-GPU job's rank (workload.parallel.Parallel's fields); None: one GPU's step
    parallel: dict[str, Any] | None = None
    # A vision-language model's images (workload.vision.Images' fields); None: no image-text-to-text
    images: dict[str, Any] | None = None
    offload_activations: bool = False  # TRL's OffloadActivations around each step (workload.offload)
    # A preference trainer's step (workload.preference.Trainer's fields); None: supervised fine-tuning
    trainer: dict[str, Any] | None = None
    frozen: list[str] = dataclasses.field(default_factory=list)  # workload.frozen: untrained modules
    unfrozen: list[str] = dataclasses.field(default_factory=list)  # workload.unfrozen: Axolotl's regexes
    fused_attention: bool = False  # workload.fused_attention: Axolotl's Gemma 4 attention forward
    qat: dict[str, Any] | None = None  # workload.qat.Qat's fields; None: no quantization-aware training
    fp8: dict[str, Any] | None = None  # workload.fp8.Fp8's fields; None: no fp8 training
    linearized_experts: bool = False  # ModelSpec's: Axolotl's Llama 4 experts (workload.llama4)
    float32_embeddings: bool = False  # workload.float32_embeddings: Axolotl's float32 modules (upcast)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Any) -> CellSpec:
        names = {f.name for f in dataclasses.fields(cls)}
        if not isinstance(data, dict) or set(data) != names:
            got = sorted(data) if isinstance(data, dict) else type(data).__name__
            raise ProtocolError(f"a cell needs exactly the fields {sorted(names)}, got {got}")
        return cls(**data)


def cell_spec(
    workload: Workload, mode: Mode, seq_len: int, budget_bytes: int, device_index: int = 0,
    bnb_optimizer: str | None = None,
) -> CellSpec:
    """The spec of one cell, for the worker to rebuild it."""
    config = workload.model.config
    return CellSpec(
        model_name=workload.model.name,
        model_source=workload.model.source,
        model_type=config.model_type,
        config=config_to_json(config),
        max_seq_len=workload.model.max_seq_len,
        task=workload.task,
        attn=workload.attn,
        optimizer=workload.optimizer,
        steps=workload.steps,
        mode=mode.name,
        seq_len=seq_len,
        budget_bytes=budget_bytes,
        device_index=device_index,
        bnb_optimizer=bnb_optimizer,
        weights_dtype=workload.weights_dtype,
        loss=workload.loss,
        adapter=None if workload.adapter is None else workload.adapter.to_json(),
        ckpt_reentrant=workload.ckpt_reentrant,
        liger=list(workload.liger),
        parallel=None if workload.parallel is None else dataclasses.asdict(workload.parallel),
        images=None if workload.images is None else dataclasses.asdict(workload.images),
        offload_activations=workload.offload_activations,
        trainer=None if workload.trainer is None else dataclasses.asdict(workload.trainer),
        frozen=list(workload.frozen),
        unfrozen=list(workload.unfrozen),
        fused_attention=workload.fused_attention,
        qat=None if workload.qat is None else dataclasses.asdict(workload.qat),
        fp8=None if workload.fp8 is None else dataclasses.asdict(workload.fp8),
        linearized_experts=workload.model.linearized_experts,
        float32_embeddings=workload.float32_embeddings,
    )


def rebuild_workload(spec: CellSpec) -> tuple[Workload, Mode]:
    """The workload and mode a spec describes; the config built from transformers' own classes."""
    model = model_from_json(spec.model_name, spec.model_source, spec.model_type, spec.config,
                            spec.max_seq_len)
    model = dataclasses.replace(model, linearized_experts=spec.linearized_experts is True)
    workload = Workload(
        model=model,
        task=check_task(spec.task),
        attn=check_attn(spec.attn),
        optimizer=check_optimizer(spec.optimizer),
        steps=spec.steps,
        weights_dtype=check_dtype(spec.weights_dtype),
        loss=check_loss(spec.loss, spec.task),
        adapter=None if spec.adapter is None else Adapter.from_json(spec.adapter),
        ckpt_reentrant=spec.ckpt_reentrant is True,
        liger=parse_kernels(spec.liger),
        parallel=None if spec.parallel is None else Parallel(**spec.parallel),
        images=None if spec.images is None else make_images(spec.images["per_sample"], spec.images["size"]),
        offload_activations=spec.offload_activations is True,
        trainer=None if spec.trainer is None else Trainer(**spec.trainer),
        frozen=parse_frozen(spec.frozen),
        unfrozen=parse_unfrozen(spec.unfrozen),
        fused_attention=spec.fused_attention is True,
        qat=None if spec.qat is None else parse_qat(spec.qat),
        fp8=None if spec.fp8 is None else parse_fp8(spec.fp8),
        float32_embeddings=spec.float32_embeddings is True,
    )
    return workload, parse_mode(spec.mode)


def failed_reply(exc: BaseException) -> dict[str, Any]:
    return {"op": "failed", "error_type": type(exc).__name__, "error": str(exc)}
