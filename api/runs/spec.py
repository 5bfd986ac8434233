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

Model names: a preset or a hub id; a local config only as an absolute path inside one of
AUTOTUNE_MODEL_DIRS. Anything else that looks like a path is refused (ModelPathRefused) before
the file system is read. Remote code is never enabled (models.py).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from api.limits import (
    MAX_GPU_MEMORY_BYTES,
    MAX_LORA_R,
    MAX_LORA_TARGET_CHARS,
    MAX_LORA_TARGETS,
    MAX_LORA_TARGETS_CHARS,
)
from api.settings import Settings
from autotune.backends import make_backend, target_gpu
from autotune.defaults import (
    BACKENDS,
    DEFAULT_DTYPE,
    DEFAULT_LOSS,
    DEFAULT_MARGIN,
    DEFAULT_MAX_BATCH,
    DEFAULT_METHOD,
    DEFAULT_MODE_NAMES,
    DEFAULT_OPTIMIZER,
)
from autotune.errors import AutotuneError, InvalidInput, ModelPathRefused
from autotune.gpus import GpuSpec
from autotune.request import PEFT_FIELDS, Findings, PeftOptions
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
from autotune.workload.loss import check_loss
from autotune.workload.models import (
    check_dtype,
    check_seq_len,
    check_task,
    config_to_json,
    configured_dtype,
    default_seq_lens,
    model_from_json,
    preset_name,
    resolve_dtype,
    resolve_model,
    task_for,
)
from autotune.workload.modes import ALLOWED_MODE_NAMES, parse_modes
from autotune.workload.optimizers import check_optimizer
from autotune.workload.step import MIN_STEPS, check_attn
from autotune.workload.support import dtype_warnings

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
                        weights_dtype=self.weights_dtype, loss=self.loss, adapter=self.peft())

    def target_gpu(self) -> GpuSpec:
        cc = self.gpu["compute_capability"]
        return GpuSpec(self.gpu["name"], self.gpu["total_memory_bytes"],
                       self.gpu["context_overhead_bytes"], tuple(cc) if cc else None)  # type: ignore[arg-type]

    def key(self) -> str:
        """sha256 of the whole spec: identical requests on an identical environment. A full
        fine-tune's leaves ``adapter`` out: the key its run had before adapters were modelled."""
        data = self.to_json()
        if data["adapter"] is None:
            del data["adapter"]
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


def run_warnings(spec: TableSpec) -> list[str]:
    """What the target card does not support of the spec's steps (workload.support)."""
    return dtype_warnings(spec.weights_dtype, parse_modes(spec.modes), spec.target_gpu())


EnvironmentFn = Callable[[str, str | None], dict[str, Any]]  # Runner.environment(backend, gpu)


def normalize(body: Mapping[str, Any], settings: Settings, environment: EnvironmentFn) -> TableSpec:
    """Validate a request body (TableCreate fields) and fill in defaults.

    ``environment(backend)`` resolves ``auto`` and says where a run of that backend goes
    (Runner.environment). Raises the core's errors: UnknownModel, SequenceTooLong, UnknownGpu,
    InvalidInput (malformed sizes, modes, limits), BackendUnavailable, and ModelPathRefused.

    Every field is checked, each once the fields it depends on are valid (the sequence lengths
    against the model once it resolved, the margin once the target GPU is known): the error raised
    is the first found in the order below, with the others found in its ``others``.
    """
    found = Findings()
    with found.about("model"):
        name = check_model_name(body["model"], settings.model_dirs)
    with found.about("task"):
        asked_task = check_task(body["task"]) if body.get("task") else None
    with found.about("dtype"):
        dtype = check_dtype(body.get("dtype") or DEFAULT_DTYPE)
    with found.about("attn"):
        attn = check_attn(body.get("attn"))
    with found.about("optimizer"):
        optimizer = check_optimizer(body.get("optimizer") or DEFAULT_OPTIMIZER)
    with found.about("search"):
        search = body.get("search") or DEFAULT_METHOD
        if search not in METHODS:
            raise InvalidInput(f"unknown search {search!r}: allowed are {', '.join(METHODS)}")
    with found.about("modes"):
        mode_names = _mode_names(body.get("modes"))
    with found.about("seq_lens"):
        asked_seq_lens = None if body.get("seq_lens") is None else _seq_lens(body["seq_lens"], settings)
        if asked_seq_lens is not None and found.ok("modes"):
            _check_cells(asked_seq_lens, mode_names, settings)
    with found.about("max_batch"):
        max_batch = _max_batch(body.get("max_batch"), settings)
    margin = DEFAULT_MARGIN if body.get("margin") is None else float(body["margin"])
    with found.about("backend"):
        backend_name = body.get("backend") or settings.backend
        if backend_name not in BACKENDS:
            raise InvalidInput(f"unknown backend {backend_name!r}: allowed are {', '.join(BACKENDS)}")
    with found.about("gpu_memory"):
        if body.get("gpu") is not None and body.get("gpu_memory") is not None:
            raise InvalidInput("give either gpu (a preset name) or gpu_memory (a size), not both")
        if body.get("gpu_memory") is not None:
            _check_gpu_memory(body["gpu_memory"])
    env: dict[str, Any] | None = None
    if found.ok("backend"):
        with found.about("backend"):
            env = environment(backend_name, body.get("gpu"))
    gpu_field = "gpu" if body.get("gpu") is not None else "gpu_memory"
    if env is not None and found.ok("gpu_memory"):
        with found.about(gpu_field):
            if env.get("fleet") is not None:  # measured on a node of the kind: the preset is its card
                gpu = target_gpu(body.get("gpu"), body.get("gpu_memory"), local=None)
            else:
                _, gpu = make_backend(env["backend"], body.get("gpu"), body.get("gpu_memory"))
        if found.ok(gpu_field):
            with found.about("margin"):
                budget = budget_bytes(gpu, margin)  # checks the margin
    if found.ok("model"):
        with found.about("model"):
            model = resolve_model(
                name,
                allow_local=name.startswith("/"),  # check_model_name let it through: inside model_dirs
                allow_hub=settings.allow_hub,
                local_dirs=list(settings.model_dirs),
            )
    if found.ok("model", "seq_lens"):
        with found.about("seq_lens"):
            if asked_seq_lens is not None:
                seq_lens = asked_seq_lens  # its cells were counted before the model was resolved
            else:
                seq_lens = _seq_lens(default_seq_lens(model, settings.max_seq_len), settings)
                if found.ok("modes"):
                    _check_cells(seq_lens, mode_names, settings)
            for seq_len in seq_lens:
                check_seq_len(model, seq_len)
    if found.ok("model", "task"):
        with found.about("task"):
            task = task_for(model, asked_task)
    if found.ok("model", "dtype"):
        with found.about("dtype"):
            weights_dtype = resolve_dtype(model, dtype)
    if found.ok("model", "task"):
        with found.about("loss"):
            loss = check_loss(body.get("loss") or DEFAULT_LOSS, task)
    adapter = _adapter(body, found)
    found.raise_first()  # none found: every check above ran, and every name is bound
    assert env is not None
    return TableSpec(
        model=preset_name(name) or name,
        model_source=model.source,
        model_type=model.config.model_type,
        model_config=config_to_json(model.config),
        max_seq_len=model.max_seq_len,
        task=task,
        attn=attn,
        optimizer=optimizer,
        steps=MIN_STEPS,
        seq_lens=seq_lens,
        modes=mode_names,
        gpu={
            "name": gpu.name,
            "total_memory_bytes": gpu.total_memory_bytes,
            "context_overhead_bytes": gpu.context_overhead_bytes,
            "compute_capability": list(gpu.compute_capability) if gpu.compute_capability else None,
        },
        backend=env["backend"],
        margin=margin,
        max_batch=max_batch,
        search=search,
        budget_bytes=budget,
        environment=env if adapter is None else adapter_environment(env),
        dtype=dtype,
        weights_dtype=weights_dtype,
        loss=loss,
        adapter=None if adapter is None else adapter.to_json(),
    )


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


def _adapter(body: Mapping[str, Any], found: Findings) -> Adapter | None:
    """The Adapter the PEFT fields ask for (request.PeftOptions), None for a full fine-tune.

    Each field is checked on its own first, so that an error names it; then PeftOptions checks
    them together (a LoRA setting without ``peft``, a 4-bit setting without a 4-bit base, ...),
    its error naming the field to change (request.py). The targets are sorted: the same modules in
    another order are the same run.
    """
    with found.about("peft"):
        peft = body.get("peft")
        if peft is not None and str(peft).strip().lower() not in PEFT_CHOICES:
            raise InvalidInput(f"unknown peft {peft!r}: allowed are {', '.join(PEFT_CHOICES)}")
    with found.about("lora_r"):
        _check_rank(body.get("lora_r"))
    with found.about("lora_alpha"):
        _check_number(body.get("lora_alpha"), "LoRA alpha", "a positive number", lambda x: x > 0)
    with found.about("lora_dropout"):
        _check_number(body.get("lora_dropout"), "LoRA dropout",
                      "a number from 0 up to (not including) 1", lambda x: 0 <= x < 1)
    targets: tuple[str, ...] | None = None
    with found.about("lora_targets"):
        targets = _lora_targets(body.get("lora_targets"))
    with found.about("bnb_4bit_quant_type"):
        if body.get("bnb_4bit_quant_type") is not None:
            check_quant_type(body["bnb_4bit_quant_type"])
    with found.about("bnb_4bit_compute_dtype"):
        check_compute_dtype(body.get("bnb_4bit_compute_dtype"))
    with found.about("qlora_recipe"):
        if body.get("qlora_recipe") is not None:
            check_recipe(body["qlora_recipe"])
    with found.about("load_in_8bit"):
        if body.get("load_in_8bit"):
            PeftOptions(load_in_8bit=True).adapter()  # refused, with the library's reason
    if not found.ok(*PEFT_FIELDS):
        return None
    options = PeftOptions(
        peft=body.get("peft"), lora_r=body.get("lora_r"), lora_alpha=body.get("lora_alpha"),
        lora_dropout=body.get("lora_dropout"), lora_targets=targets,
        load_in_4bit=bool(body.get("load_in_4bit")),
        bnb_4bit_quant_type=body.get("bnb_4bit_quant_type"),
        bnb_4bit_use_double_quant=body.get("bnb_4bit_use_double_quant"),
        bnb_4bit_compute_dtype=body.get("bnb_4bit_compute_dtype"),
        qlora_recipe=body.get("qlora_recipe"),
    )
    with found.about("peft"):  # an error of the fields together names the one to change
        adapter = options.adapter()
        if adapter is not None and adapter.targets is not None:
            adapter = replace(adapter, targets=tuple(sorted(adapter.targets)))
        return adapter
    return None


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


def _mode_names(modes: str | list[str] | None) -> list[str]:
    """Canonical mode names in ALLOWED_MODE_NAMES order; None is the defaults, empty is refused."""
    if modes is None:
        modes = list(DEFAULT_MODE_NAMES)
    elif not (modes.strip() if isinstance(modes, str) else modes):
        raise InvalidInput(f"modes is empty: give at least one of {', '.join(ALLOWED_MODE_NAMES)}")
    return sorted({m.name for m in parse_modes(modes)}, key=ALLOWED_MODE_NAMES.index)


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


def _seq_lens(values: Sequence[int], settings: Settings) -> list[int]:
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
    return name
