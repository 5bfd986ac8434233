"""A table request, normalised: everything that decides the table, and the key of identical runs.

``normalize`` validates a request at the entry point, with the core's messages (which name the
allowed values), checking every field so that a request with several wrong fields hears of all of
them, and fills in the defaults. Two requests that normalise to the same ``TableSpec``
(same model config, task, sequence lengths, modes, target GPU, margin, ...) on the same
environment (backend, GPU kind, torch / transformers / autotune versions, and PEFT's for a run
with an adapter) have the same ``key``: the service answers the second with the first's run.

LoRA / QLoRA (``peft``, ``lora_*``, ``load_in_4bit``, ``bnb_4bit_*``: the CLI's options, as
autotune.request.PeftOptions names them) is part of the spec: ``adapter`` holds the
Adapter asked for (``Adapter.to_json()``), None for a full fine-tune, so a LoRA table and a full
fine-tune table of one model are different runs. A full fine-tune's key leaves ``adapter`` out:
it is the key such a run had before adapters were modelled, and identical requests still meet
the runs stored then.

A preference or RL trainer (``trainer``: dpo, orpo, simpo, kto, reward, grpo, and its settings as
asked: workload.trainers.Trainer.settings()) is part of the spec too, None for supervised
fine-tuning: a DPO table and an SFT table of one model are different runs. An SFT run's key leaves
``trainer`` out, the key such a run had before trainers were stored. The spec is stored as JSON
(the runs table's ``spec`` column): the field needs no migration, and a run stored before it reads
as SFT, which every stored run was.

Model names: a preset or a hub id; a local config only as an absolute path inside one of
AUTOTUNE_MODEL_DIRS, in one spelling (``local_model_name``: ``/m/./ok/`` and ``/m/ok/config.json``
are ``/m/ok``). Anything else that looks like a path is refused (ModelPathRefused) before
the file system is read. Remote code is never enabled (models.py).
"""

from __future__ import annotations

import hashlib
import json
import math
import posixpath
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from api.limits import (
    MAX_GENERATIONS,
    MAX_GPU_MEMORY_BYTES,
    MAX_LORA_R,
    MAX_LORA_TARGET_CHARS,
    MAX_LORA_TARGETS,
    MAX_LORA_TARGETS_CHARS,
)
from api.settings import Settings
from autotune.backends import make_backend, target_gpu
from autotune.backends.estimate.alloc_conf import parse_alloc_conf
from autotune.defaults import (
    BACKENDS,
    DEFAULT_DTYPE,
    DEFAULT_LOSS,
    DEFAULT_MAX_BATCH,
    DEFAULT_METHOD,
    DEFAULT_MODE_NAMES,
    DEFAULT_OPTIMIZER,
    default_mode_names,
)
from autotune.errors import AutotuneError, InvalidInput, ModelPathRefused
from autotune.gpus import GpuSpec
from autotune.request import (
    PEFT_FIELDS,
    Findings,
    ModelAccess,
    Step,
    TableRequest,
    request_from,
    resolve_adapter,
    resolve_model,
    target_field,
)
from autotune.search import METHODS
from autotune.tuner import budget_bytes
from autotune.units import format_bytes, parse_bytes
from autotune.workload import Workload
from autotune.workload.adapters import (
    PEFT_CHOICES,
    Adapter,
    check_compute_dtype,
    check_quant_type,
    check_recipe,
    parse_targets,
)
from autotune.workload.fsdp_wrap import resolve_wrap
from autotune.workload.liger import check_kernels
from autotune.workload.loss import check_loss
from autotune.workload.models import (
    ModelSpec,
    check_dtype,
    check_seq_len,
    check_task,
    config_to_json,
    configured_dtype,
    default_seq_lens,
    model_from_json,
    preset_name,
    resolve_dtype,
    seq_len_warnings,
    task_for,
)
from autotune.workload.modes import ALLOWED_MODE_NAMES, parse_modes
from autotune.workload.optimizers import check_optimizer
from autotune.workload.parallel import Parallel, check_sharded, make_parallel
from autotune.workload.step import MIN_STEPS, check_attn
from autotune.workload.support import dtype_warnings
from autotune.workload.trainers import (
    GRPO_FIELDS,
    REWARD,
    REWARD_TASK,
    Trainer,
    check_grpo_rows,
    check_step,
    check_trainer,
    reward_config,
)
from autotune.workload.vision import IMAGE_TEXT_TO_TEXT

MAX_MODEL_NAME_CHARS = 300  # hub ids are at most 96 characters; paths get some room


@dataclass(frozen=True)
class TableSpec:
    model: str  # the preset's name, or the name as given
    model_source: str  # preset | local | hub
    model_type: str  # a key of transformers' CONFIG_MAPPING: no remote code
    model_config: dict[str, Any]  # PretrainedConfig.to_dict(), as JSON: the worker rebuilds it
    max_seq_len: int  # usable positions of the model
    task: str  # as asked, else the config's (models.infer_task)
    attn: str | None  # None: what transformers picks on CUDA
    optimizer: str  # a canonical Trainer optim name (workload.optimizers)
    steps: int  # training steps per probe
    seq_lens: list[int]  # ascending, no repeats
    modes: list[str]  # canonical names, in ALLOWED_MODE_NAMES order
    gpu: dict[str, Any]  # the target: name, total_memory_bytes, context_overhead_bytes, compute_capability
    backend: str  # cuda | estimate (auto resolved)
    margin: float
    max_batch: int
    search: str
    budget_bytes: int  # what the allocator may use on the target (tuner.budget_bytes)
    environment: dict[str, Any]  # where it runs: backend, device, versions
    dtype: str = DEFAULT_DTYPE  # the weights dtype asked for (auto: the config's)
    weights_dtype: str = "float32"  # what the weights are (models.resolve_dtype)
    loss: str = DEFAULT_LOSS
    # LoRA / QLoRA: adapters.Adapter.to_json() (targets sorted; None: PEFT's default modules);
    # None for a full fine-tune, and for every run stored before adapters were modelled.
    adapter: dict[str, Any] | None = None
    # Checkpointed modes with use_reentrant=True; false (left out of the key) for every run stored
    # before it was modelled.
    ckpt_reentrant: bool = False
    # Liger Kernel's kernels swapped in (workload.liger.check_kernels: those the model type's patch
    # takes); empty (left out of the key) for every run stored before they were modelled.
    liger: list[str] = field(default_factory=list)
    # PyTorch's caching-allocator settings (alloc_conf.AllocatorConfig.conf_text: "" for its default,
    # left out of the key, as for every run stored before they were modelled).
    alloc_conf: str = ""
    # A multi-GPU job (workload.parallel.Parallel's fields: kind, gpus, nodes, reshard_after_forward,
    # recipe); None (left out of the key) for one GPU, as for every run stored before jobs had more.
    parallel: dict[str, Any] | None = None
    # A preference or RL trainer's step (workload.trainers.Trainer.settings(): name and the settings
    # that apply to it); None (left out of the key) for supervised fine-tuning, as every run stored
    # before trainers were.
    trainer: dict[str, Any] | None = None

    @property
    def cells(self) -> int:
        return len(self.seq_lens) * len(self.modes)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TableSpec:
        """A stored spec; one stored before weights dtypes were explicit loaded its weights as
        ``auto`` does, in the dtype its config names."""
        if data.get("optimizer") == "adamw":  # the name before Trainer names: adamw_torch
            data = {**data, "optimizer": "adamw_torch"}
        if "weights_dtype" not in data:
            config = data["model_config"]
            configured = configured_dtype(config.get("dtype") or config.get("torch_dtype"))
            data = {**data, "dtype": "auto", "weights_dtype": configured}
        return cls(**data)

    def peft(self) -> Adapter | None:
        """The Adapter of the spec, None for a full fine-tune."""
        return None if self.adapter is None else Adapter.from_json(self.adapter)

    def workload(self) -> Workload:
        """The workload to probe, its config rebuilt from transformers' own classes (no remote code)."""
        model = model_from_json(self.model, self.model_source, self.model_type, self.model_config,
                                self.max_seq_len)
        return Workload(model, self.task, self.attn, self.optimizer, self.steps,
                        weights_dtype=self.weights_dtype, loss=self.loss, adapter=self.peft(),
                        ckpt_reentrant=self.ckpt_reentrant, liger=tuple(self.liger),
                        parallel=self.workload_parallel(), trainer=self.workload_trainer())

    def workload_trainer(self) -> Trainer | None:
        """The trainer whose step is tabled (None: supervised fine-tuning), without building the model."""
        return None if self.trainer is None else Trainer(**self.trainer)

    def workload_parallel(self) -> Parallel | None:
        """The job's GPUs (None: one), without building the model."""
        return None if self.parallel is None else Parallel(**self.parallel)

    def target_gpu(self) -> GpuSpec:
        cc, chip = self.gpu["compute_capability"], self.gpu.get("multiprocessors")
        return GpuSpec(self.gpu["name"], self.gpu["total_memory_bytes"],
                       self.gpu["context_overhead_bytes"], tuple(cc) if cc else None,  # type: ignore[arg-type]
                       tuple(chip) if chip else None)  # type: ignore[arg-type]

    def key(self) -> str:
        """sha256 of the whole spec: identical requests on an identical environment. A full
        fine-tune's leaves ``adapter`` out, and one without reentrant checkpointing
        ``ckpt_reentrant``, and one without Liger kernels ``liger``: the keys their runs had before
        those were modelled (and so ``alloc_conf``, ``parallel`` and an SFT run's ``trainer`` at their
        defaults)."""
        data = self.to_json()
        if data["adapter"] is None:
            del data["adapter"]
        if not data["ckpt_reentrant"]:
            del data["ckpt_reentrant"]
        if not data["liger"]:
            del data["liger"]
        if not data["alloc_conf"]:
            del data["alloc_conf"]
        if data["parallel"] is None:
            del data["parallel"]
        if data["trainer"] is None:
            del data["trainer"]
        text = json.dumps(data, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()


def run_adapter(spec: Mapping[str, Any], header: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """What a run of the stored ``spec`` says of its adapter (None: a full fine-tune): the
    AdapterSummary its worker reported when it started (the modules PEFT resolved, the parameter
    counts), else, until then, the settings asked for, with ``parameters`` None and ``targets`` as
    asked (None: PEFT's default). The server builds no model for it."""
    if spec.get("adapter") is None:  # a full fine-tune, or a run stored before adapters
        return None
    adapter = Adapter.from_json(spec["adapter"])
    reported = (header or {}).get("adapter")
    if reported is not None:
        return dict(reported)
    return {**adapter.to_json(), "targets_default": adapter.targets is None, "parameters": None,
            "label": adapter.label()}


def run_trainer(spec: TableSpec) -> dict[str, Any] | None:
    """What a run says of its trainer: its stored ``settings`` and tuner.trainer_summary's words (TRL's
    class, what a row is, the reference, a colocated vLLM engine's bytes on the target); None for
    supervised fine-tuning."""
    from autotune.tuner import trainer_summary

    trainer = spec.workload_trainer()
    if trainer is None:
        return None
    return {"settings": trainer.settings(),
            **trainer_summary(trainer, peft=spec.adapter is not None, gpu=spec.target_gpu())}


def run_warnings(spec: TableSpec) -> list[str]:
    """What the target card does not support of the spec's steps (workload.support), and a sequence
    past the positions a RoPE model was trained for (models.seq_len_warnings)."""
    warnings = dtype_warnings(spec.weights_dtype, parse_modes(spec.modes), spec.target_gpu())
    longest = max(spec.seq_lens, default=0)
    if longest > spec.max_seq_len:  # the config is rebuilt only then
        model = model_from_json(spec.model, spec.model_source, spec.model_type, spec.model_config,
                                spec.max_seq_len)
        warnings += seq_len_warnings(model, longest)
    return warnings


EnvironmentFn = Callable[[str, str | None], dict[str, Any]]  # Runner.environment(backend, gpu)


def normalize(body: Mapping[str, Any], settings: Settings, environment: EnvironmentFn) -> TableSpec:
    """Validate a request body (TableCreate fields) and fill in defaults.

    The body is read once as the library's request (``table_request``: autotune.request's fields
    and defaults); what this adds is the service's own policy: which model names it may read
    (``check_model_name``, AUTOTUNE_MODEL_DIRS, AUTOTUNE_ALLOW_HUB), its limits (cells, batch,
    sequence length, card size, LoRA settings: api/limits.py, Settings), and where a run goes:
    ``environment(backend)`` resolves ``auto`` (Runner.environment). Raises the core's errors:
    UnknownModel, SequenceTooLong, UnknownGpu, InvalidInput (malformed sizes, modes, limits),
    BackendUnavailable, and ModelPathRefused.

    Every field is checked, each once the fields it depends on are valid (the sequence lengths
    against the model once it resolved, the margin once the target GPU is known): the error raised
    is the first found in the order of ``_Normalizing.spec``, with the others found in its ``others``.
    """
    return _Normalizing(table_request(body, settings), settings, environment).spec()


def table_request(body: Mapping[str, Any], settings: Settings) -> TableRequest:
    """The library's request for a body (None: the field's default), with the server's defaults
    where it has its own: its backend (AUTOTUNE_BACKEND) and its largest batch (AUTOTUNE_MAX_BATCH)."""
    max_batch = body.get("max_batch")
    return request_from(TableRequest, {
        **body, "backend": body.get("backend") or settings.backend,
        "max_batch": min(DEFAULT_MAX_BATCH, settings.max_batch) if max_batch is None else max_batch})


class _Normalizing:
    """``normalize`` of one request. Each value below is set once its field passed its checks (as
    a local name is bound), and read only when every check passed."""

    name: str  # the model name, stripped
    asked_task: str | None
    dtype: str  # as asked (auto: the config's)
    attn: str | None
    optimizer: str
    search: str
    mode_names: list[str]
    asked_seq_lens: list[int] | None
    max_batch: int
    margin: float
    env: dict[str, Any] | None
    gpu: GpuSpec
    budget: int
    model: ModelSpec
    seq_lens: list[int]
    task: str
    weights_dtype: str
    loss: str
    liger: tuple[str, ...]
    adapter: Adapter | None
    parallel: Parallel | None
    trainer: Trainer | None

    def __init__(self, request: TableRequest, settings: Settings, environment: EnvironmentFn) -> None:
        self.request, self.settings, self.environment = request, settings, environment
        self.found = Findings()
        self.env = None
        self.alloc_conf = ""  # PyTorch's default allocator, unless the request sets it
        # One GPU until check_fields says otherwise: its error may name another field (gpus, nodes),
        # and the budget is still checked with the request refused for it.
        self.parallel = None
        self.trainer = None

    def spec(self) -> TableSpec:
        """The checks in their order: the fields on their own, the target, then what needs the
        model (which is resolved last of the three: its 404 comes after the others), the adapter."""
        self.check_fields()
        self.check_target()
        if self.found.ok("model"):
            self.on_the_model()
        self.adapter = _adapter(self.request.step, self.found)
        if self.found.ok("parallel", "optimizer"):
            with self.found.about("parallel"):
                check_sharded(self.parallel, None if self.adapter is None else self.adapter.base_bits,
                              self.optimizer, None if self.adapter is None else self.adapter.recipe)
        if self.parallel is not None and self.parallel.wrap_classes and self.found.ok("model", "task"):
            with self.found.about("fsdp_wrap"):  # named classes of the model's, () where its default
                self.parallel = replace(self.parallel, wrap_classes=resolve_wrap(
                    self.model, self.task, self.parallel.wrap_classes))
        if self.trainer is not None and self.found.ok("model", "task", "loss", "liger", "parallel"):
            with self.found.about("trainer"):
                check_step(self.trainer, self.task, loss=self.loss, liger=self.liger, parallel=self.parallel,
                           images=None)
        self.found.raise_first()  # none found: every check above ran, and every value is set
        assert self.env is not None
        return TableSpec(
            model=preset_name(self.name) or self.name,
            model_source=self.model.source,
            model_type=self.model.config.model_type,
            model_config=config_to_json(self.model.config),
            max_seq_len=self.model.max_seq_len,
            task=self.task,
            attn=self.attn,
            optimizer=self.optimizer,
            steps=MIN_STEPS,
            seq_lens=self.seq_lens,
            modes=self.mode_names,
            gpu={
                "name": self.gpu.name,
                "total_memory_bytes": self.gpu.total_memory_bytes,
                "context_overhead_bytes": self.gpu.context_overhead_bytes,
                "compute_capability": list(self.gpu.compute_capability) if self.gpu.compute_capability
                else None,
                # the chip where one was named: left out otherwise, as in the keys of runs stored before
                **({"multiprocessors": list(self.gpu.multiprocessors)} if self.gpu.multiprocessors else {}),
            },
            backend=self.env["backend"],
            margin=self.margin,
            max_batch=self.max_batch,
            search=self.search,
            budget_bytes=self.budget,
            environment=self.env if self.adapter is None else adapter_environment(self.env),
            dtype=self.dtype,
            weights_dtype=self.weights_dtype,
            loss=self.loss,
            adapter=None if self.adapter is None else self.adapter.to_json(),
            ckpt_reentrant=bool(self.request.step.ckpt_reentrant),
            liger=list(self.liger),
            alloc_conf=self.alloc_conf,
            parallel=None if self.parallel is None else asdict(self.parallel),
            trainer=None if self.trainer is None else self.trainer.settings(),
        )

    def check_fields(self) -> None:
        """The fields that need no model nor card: their names, and the server's limits."""
        found, request, step, settings = self.found, self.request, self.request.step, self.settings
        with found.about("model"):
            self.name = check_model_name(step.model, settings.model_dirs)
        with found.about("task"):
            self.asked_task = check_task(step.task) if step.task else None
        with found.about("dtype"):
            self.dtype = check_dtype(step.dtype or DEFAULT_DTYPE)
        _check_trainer_values(step, found)
        if found.ok(*_TRAINER_VALUES):
            with found.about("trainer"):
                self.trainer = check_trainer(
                    step.trainer, precompute_ref_log_probs=step.precompute_ref_log_probs,
                    chosen_nll=step.chosen_nll, kto_loss_type=step.kto_loss_type,
                    grpo={name: getattr(step, name) for name in GRPO_FIELDS})
        with found.about("attn"):
            self.attn = check_attn(step.attn)
        with found.about("optimizer"):
            self.optimizer = check_optimizer(step.optimizer or DEFAULT_OPTIMIZER)
        with found.about("search"):
            self.search = request.search or DEFAULT_METHOD
            if self.search not in METHODS:
                raise InvalidInput(f"unknown search {self.search!r}: allowed are {', '.join(METHODS)}")
        with found.about("modes"):
            # none asked: the weights' (defaults.default_mode_names), once the model says its dtype;
            # the cells are counted with the most there can be (float32 weights: four)
            self.mode_names = _mode_names(request.modes)
        with found.about("seq_lens"):
            asked = request.seq_lens
            self.asked_seq_lens = None if asked is None else _seq_lens(asked, settings)
            if self.asked_seq_lens is not None and found.ok("modes"):
                _check_cells(self.asked_seq_lens, self.mode_names, settings)
        with found.about("max_batch"):
            self.max_batch = _max_batch(request.max_batch, settings)
        with found.about("parallel"):
            self.parallel = make_parallel(step.gpus, step.parallel, nodes=step.nodes,
                                          reshard_after_forward=step.reshard_after_forward,
                                          recipe=step.fsdp_recipe, zero_config=step.zero_config,
                                          activation_checkpointing=step.fsdp_activation_checkpointing,
                                          fsdp_version=step.fsdp_version, fsdp1_config=step.fsdp1_config,
                                          offload_params=step.offload_params, fsdp_wrap=step.fsdp_wrap,
                                          tensor_parallel=step.tensor_parallel,
                                          context_parallel=step.context_parallel,
                                          heads_k_stride=step.heads_k_stride)

    def check_target(self) -> None:
        """The backend, where its run goes, the card and the budget the margin leaves on it."""
        found, target = self.found, self.request.target
        self.margin = float(target.margin)
        with found.about("alloc_conf"):  # the request's alone: the server's environment is not the job's
            self.alloc_conf = parse_alloc_conf(target.alloc_conf).conf_text()
        with found.about("backend"):
            if target.backend not in BACKENDS:
                raise InvalidInput(f"unknown backend {target.backend!r}: allowed are {', '.join(BACKENDS)}")
        with found.about("gpu_memory"):
            if target.gpu_memory is not None:
                _check_gpu_memory(target.gpu_memory)
        if found.ok("backend"):
            with found.about("backend"):
                self.env = self.environment(target.backend, target.gpu)
        if self.env is None or not found.ok("gpu_memory", "alloc_conf"):
            return
        gpu_field = target_field(target, found)
        if gpu_field is None:
            return
        with found.about(gpu_field):
            if self.env.get("fleet") is not None:  # measured on a node of the kind: the preset is its card
                self.gpu = target_gpu(target.gpu, target.gpu_memory, local=None, chip=target.multiprocessors)
            else:
                _, self.gpu = make_backend(self.env["backend"], target.gpu, target.gpu_memory,
                                           chip=target.multiprocessors, alloc_conf=self.alloc_conf)
        if found.ok(gpu_field):
            with found.about("margin"):
                # checks the margin; a multi-GPU job's NCCL buffers come off the card too
                self.budget = budget_bytes(self.gpu, self.margin,
                                           self.parallel if found.ok("parallel") else None,
                                           self.trainer if found.ok("trainer") else None)

    def on_the_model(self) -> None:
        """The model, resolved as this server may (AUTOTUNE_MODEL_DIRS, AUTOTUNE_ALLOW_HUB), and
        what depends on it: the sequence lengths, the task, the weights' dtype, the loss."""
        found, settings = self.found, self.settings
        access = ModelAccess(allow_local=self.name.startswith("/"),  # check_model_name let it through
                             allow_hub=settings.allow_hub, local_dirs=tuple(settings.model_dirs),
                             hub_hint=None)  # the library's hint names the CLI's flag: a body has none
        model = resolve_model(replace(self.request.step, model=self.name), found, access)
        if model is None:
            return
        if self.trainer is not None and self.trainer.name == REWARD:
            # RewardTrainer's AutoModelForSequenceClassification, num_labels=1 (stored in model_config)
            self.asked_task = self.asked_task or REWARD_TASK
            model = replace(model, config=reward_config(model.config))
        self.model = model
        if found.ok("seq_lens"):
            with found.about("seq_lens"):
                if self.asked_seq_lens is not None:
                    self.seq_lens = self.asked_seq_lens  # its cells were counted before the model resolved
                else:
                    self.seq_lens = _seq_lens(default_seq_lens(model, settings.max_seq_len), settings)
                    if found.ok("modes"):
                        _check_cells(self.seq_lens, self.mode_names, settings)
                for seq_len in self.seq_lens:
                    check_seq_len(model, seq_len)
            if self.trainer is not None and found.ok("seq_lens"):
                with found.about("max_completion_length"):
                    for seq_len in self.seq_lens:
                        check_grpo_rows(self.trainer, seq_len)
        if found.ok("task"):
            with found.about("task"):
                self.task = task_for(model, self.asked_task)
                if self.task == IMAGE_TEXT_TO_TEXT:  # its answer depends on images the spec does not carry
                    raise InvalidInput(
                        f"{model.name} is a vision-language model (task {IMAGE_TEXT_TO_TEXT}): its step "
                        "depends on the images of each sample, which the service does not take yet; ask "
                        "autotune check, table or explain (--images-per-sample, --image-size)")
        if found.ok("dtype"):
            with found.about("dtype"):
                self.weights_dtype = resolve_dtype(model, self.dtype)
            if self.request.modes is None:
                self.mode_names = _mode_names(default_mode_names(self.weights_dtype))
        if found.ok("task"):
            with found.about("loss"):
                self.loss = check_loss(self.request.step.loss or DEFAULT_LOSS, self.task)
        if found.ok("task", "loss"):
            with found.about("liger"):
                self.liger = check_kernels(self.request.step.liger, model.config, self.task, self.loss)


# The trainer's settings a body carries as numbers, and what each may be (check_trainer checks the
# rest: the trainer they belong to, GRPOConfig's own rules).
_TRAINER_VALUES: dict[str, tuple[str, Callable[[float], bool]]] = {
    "beta": ("a finite number of 0 or more", lambda x: x >= 0),
    "vllm_gpu_memory_utilization": ("a fraction of the GPU's memory, above 0 and below 1",
                                    lambda x: 0 < x < 1),
    "num_generations": (f"an integer from 2 to {MAX_GENERATIONS}", lambda x: 2 <= x <= MAX_GENERATIONS),
    "steps_per_generation": (f"an integer from 1 to {MAX_GENERATIONS}", lambda x: 1 <= x <= MAX_GENERATIONS),
    "max_completion_length": ("an integer of 1 or more", lambda x: x >= 1),
}


_FRACTIONS = ("beta", "vllm_gpu_memory_utilization")


def _check_trainer_values(step: Step, found: Findings) -> None:
    """The trainer's numbers, each on its own against the service's bounds (a JSON body may carry NaN
    and Infinity, and the generations are traced rows: api/limits.py)."""
    for name, (allowed, ok) in _TRAINER_VALUES.items():
        with found.about(name):
            value = getattr(step, name)
            _check_number(value, name, allowed, ok)
            if name not in _FRACTIONS and value is not None and not isinstance(value, int):
                raise InvalidInput(f"{name} must be {allowed}, got {value!r}")


# --- LoRA / QLoRA -----------------------------------------------------------------------------


def adapter_environment(env: Mapping[str, Any]) -> dict[str, Any]:
    """The environment of a run with an adapter: ``env`` and PEFT's version, which builds it (a run
    without one keeps the environment, and the key, it had before adapters were modelled)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        peft = version("peft")
    except PackageNotFoundError:
        peft = None
    return {**env, "peft": peft}


def _adapter(step: Step, found: Findings) -> Adapter | None:
    """The Adapter the step's PEFT fields ask for (request.PeftOptions), None for a full fine-tune.

    Each field is checked on its own first, against the server's limits, so that an error names
    it; then the library checks them together (request.resolve_adapter: a LoRA setting without
    ``peft``, a 4-bit setting without a 4-bit base, ...), its error naming the field to change.
    The targets are sorted: the same modules in another order are the same run.
    """
    options = step.peft_options
    with found.about("peft"):
        peft = options.peft
        if peft is not None and str(peft).strip().lower() not in PEFT_CHOICES:
            raise InvalidInput(f"unknown peft {peft!r}: allowed are {', '.join(PEFT_CHOICES)}")
    with found.about("lora_r"):
        _check_rank(options.lora_r)
    with found.about("lora_alpha"):
        _check_number(options.lora_alpha, "LoRA alpha", "a positive number", lambda x: x > 0)
    with found.about("lora_dropout"):
        _check_number(options.lora_dropout, "LoRA dropout",
                      "a number from 0 up to (not including) 1", lambda x: 0 <= x < 1)
    targets: tuple[str, ...] | None = None
    with found.about("lora_targets"):
        targets = _lora_targets(options.lora_targets)
    with found.about("bnb_4bit_quant_type"):
        if options.bnb_4bit_quant_type is not None:
            check_quant_type(options.bnb_4bit_quant_type)
    with found.about("bnb_4bit_compute_dtype"):
        check_compute_dtype(options.bnb_4bit_compute_dtype)
    with found.about("qlora_recipe"):
        if options.qlora_recipe is not None:
            check_recipe(options.qlora_recipe)
    if not found.ok(*PEFT_FIELDS):
        return None
    adapter = resolve_adapter(replace(step, peft_options=replace(options, lora_targets=targets)), found)
    if adapter is not None and adapter.targets is not None:
        adapter = replace(adapter, targets=tuple(sorted(adapter.targets)))
    return adapter


def _check_rank(value: Any) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_LORA_R:
        raise InvalidInput(f"LoRA rank must be an integer from 1 to {MAX_LORA_R}, got {value!r}")


def _check_number(value: Any, what: str, allowed: str, ok: Callable[[float], bool]) -> None:
    """A finite number that ``ok`` accepts (JSON bodies may carry NaN and Infinity: refused)."""
    if value is None:
        return
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if not number or not math.isfinite(value) or not ok(value):
        raise InvalidInput(f"{what} must be {allowed}, got {value!r}")


def _lora_targets(value: Any) -> tuple[str, ...] | None:
    """Module names (a comma-separated string or a list), or all-linear; None: PEFT's default."""
    if value is None:
        return None
    if isinstance(value, str) and len(value) > MAX_LORA_TARGETS_CHARS:
        raise InvalidInput(f"LoRA targets of {len(value)} characters are too long: at most "
                           f"{MAX_LORA_TARGETS} module names of at most {MAX_LORA_TARGET_CHARS} characters")
    if not isinstance(value, str) and len(value) > MAX_LORA_TARGETS:
        raise InvalidInput(f"{len(value)} LoRA targets are too many: at most {MAX_LORA_TARGETS} module names")
    targets = parse_targets(value)
    assert targets is not None  # parse_targets refuses an empty list
    if len(targets) > MAX_LORA_TARGETS:
        raise InvalidInput(f"{len(targets)} LoRA targets are too many: at most {MAX_LORA_TARGETS} "
                           "module names")
    for name in targets:
        if len(name) > MAX_LORA_TARGET_CHARS:
            raise InvalidInput(f"LoRA target {name[:40]!r}... is too long: module names have at most "
                               f"{MAX_LORA_TARGET_CHARS} characters")
        if not name.isprintable() or any(ch.isspace() for ch in name):
            raise InvalidInput(f"LoRA target {name!r} is not a module name: no spaces or control characters")
    return targets


def _on(field: str, exc: AutotuneError) -> AutotuneError:
    if exc.field is None:
        exc.field = field
    return exc


def _mode_names(modes: str | Sequence[str] | None) -> list[str]:
    """Canonical mode names in ALLOWED_MODE_NAMES order; None is the defaults, empty is refused."""
    if modes is None:
        modes = list(DEFAULT_MODE_NAMES)
    elif not (modes.strip() if isinstance(modes, str) else modes):
        raise InvalidInput(f"modes is empty: give at least one of {', '.join(ALLOWED_MODE_NAMES)}")
    parsed = parse_modes(modes if isinstance(modes, str) else list(modes))
    return sorted({m.name for m in parsed}, key=ALLOWED_MODE_NAMES.index)


def _check_gpu_memory(value: str | int) -> None:
    """A target size the API models: within MAX_GPU_MEMORY_BYTES (sizes are checked for form by
    make_backend, and refused here first only when too large)."""
    try:
        nbytes = parse_bytes(value)
    except InvalidInput:
        return  # make_backend refuses it with the forms allowed
    if nbytes > MAX_GPU_MEMORY_BYTES:
        # A huge byte count has no float for format_bytes: it is shown as given.
        shown = format_bytes(nbytes) if nbytes.bit_length() < 1000 else f"{value!r}"[:40] + "..."
        raise InvalidInput(
            f"GPU memory {shown} is too large: at most {format_bytes(MAX_GPU_MEMORY_BYTES)} (the "
            "largest cards today have 288 GB)"
        )


def _check_cells(seq_lens: Sequence[int], mode_names: Sequence[str], settings: Settings) -> None:
    cells = len(seq_lens) * len(mode_names)
    if cells > settings.max_cells:
        raise _on("seq_lens", InvalidInput(
            f"{len(seq_lens)} sequence lengths x {len(mode_names)} modes = {cells} cells exceeds "
            f"this server's limit of {settings.max_cells} cells per request (AUTOTUNE_MAX_CELLS)"
        ))


def _seq_lens(values: Sequence[Any], settings: Settings) -> list[int]:
    if not values:
        raise InvalidInput("seq_lens is empty: give at least one sequence length, e.g. [128, 256]")
    for seq_len in values:
        if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1:
            raise InvalidInput(f"sequence length must be an integer >= 1, got {seq_len!r}")
        if seq_len > settings.max_seq_len:
            raise InvalidInput(
                f"sequence length {seq_len} exceeds this server's limit of {settings.max_seq_len} "
                "tokens (AUTOTUNE_MAX_SEQ_LEN)"
            )
    return sorted(set(values))


def _max_batch(value: int | None, settings: Settings) -> int:
    if value is None:
        return min(DEFAULT_MAX_BATCH, settings.max_batch)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidInput(f"max_batch must be an integer >= 1, got {value!r}")
    if value > settings.max_batch:
        raise InvalidInput(
            f"max_batch {value} exceeds this server's limit of {settings.max_batch} (AUTOTUNE_MAX_BATCH)"
        )
    return value


_PATH_SEPARATORS = re.compile(r"[/\\]")


def check_model_name(name: str, model_dirs: Sequence[Path]) -> str:
    """``name`` stripped, if the server may resolve it; ModelPathRefused for paths it may not read.

    A preset or a hub id (``org/name``) passes. A path passes only when it is absolute and,
    symlinks resolved, inside one of ``model_dirs``; ``..`` is refused outright.
    """
    name = name.strip()
    if not name:
        raise InvalidInput("empty model name: use a preset (`autotune models`) or a hub id")
    if len(name) > MAX_MODEL_NAME_CHARS:
        raise InvalidInput(
            f"model name of {len(name)} characters is too long (at most {MAX_MODEL_NAME_CHARS})"
        )
    if any(not ch.isprintable() for ch in name):
        raise InvalidInput(f"model name {name!r} contains control characters")
    if preset_name(name) is not None:
        return name
    if ".." in _PATH_SEPARATORS.split(name):
        raise ModelPathRefused(f"model name '{name}' contains '..': paths that leave a directory are refused")
    looks_like_path = (
        name.startswith(("/", "~", ".", "\\")) or "\\" in name or name.count("/") > 1
        or name.lower().endswith(".json")
    )
    if not looks_like_path:
        return name
    if not model_dirs:
        raise ModelPathRefused(
            f"model '{name}' is a local path, and this server reads no local models "
            "(AUTOTUNE_MODEL_DIRS is empty): use a preset or a Hugging Face hub id"
        )
    allowed = [Path(d).expanduser().resolve() for d in model_dirs]
    dirs = ", ".join(str(d) for d in allowed)
    if not name.startswith("/"):
        raise ModelPathRefused(f"local model path '{name}' must be absolute, inside {dirs}")
    resolved = Path(name).resolve()
    if not any(resolved.is_relative_to(d) for d in allowed):
        raise ModelPathRefused(f"local model path '{name}' is outside the allowed directories: {dirs}")
    return local_model_name(name)


def local_model_name(name: str) -> str:
    """One spelling of an absolute local model path, so that one model is one run (its name is part
    of the run's key): ``/m/./ok``, ``//m/ok``, ``/m/ok/`` and ``/m/ok/config.json`` are ``/m/ok``.
    Lexical (symlinks stay as named, as the run is shown), and a config file named otherwise than
    config.json stays a file."""
    path = Path(posixpath.normpath("/" + name.lstrip("/")))  # normpath keeps a leading '//'
    if path.name == "config.json" and path.is_file() and path.parent != path:
        path = path.parent  # the directory reads as its config.json (autotune.workload.models)
    return str(path)
