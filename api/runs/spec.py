"""A table request, normalised: everything that decides the table, and the key of identical runs.

``normalize`` validates a request at the entry point, with the core's messages (which name the
allowed values), checking every field so that a request with several wrong fields hears of all of
them, and fills in the defaults. Two requests that normalise to the same ``TableSpec``
(same model config, task, sequence lengths, modes, target GPU, margin, ...) on the same
environment (backend, GPU kind, torch / transformers / autotune versions) have the same ``key``:
the service answers the second with the first's run.

Model names: a preset or a hub id; a local config only as an absolute path inside one of
AUTOTUNE_MODEL_DIRS. Anything else that looks like a path is refused (ModelPathRefused) before
the file system is read. Remote code is never enabled (models.py).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from api.limits import MAX_GPU_MEMORY_BYTES
from api.settings import Settings
from autotune.backends import make_backend
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
from autotune.search import METHODS
from autotune.tuner import budget_bytes
from autotune.units import format_bytes, parse_bytes
from autotune.workload import Workload
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

    def workload(self) -> Workload:
        """The workload to probe, its config rebuilt from transformers' own classes (no remote code)."""
        model = model_from_json(self.model, self.model_source, self.model_type, self.model_config,
                                self.max_seq_len)
        return Workload(model, self.task, self.attn, self.optimizer, self.steps,
                        weights_dtype=self.weights_dtype, loss=self.loss)

    def target_gpu(self) -> GpuSpec:
        cc = self.gpu["compute_capability"]
        return GpuSpec(self.gpu["name"], self.gpu["total_memory_bytes"],
                       self.gpu["context_overhead_bytes"], tuple(cc) if cc else None)  # type: ignore[arg-type]

    def key(self) -> str:
        """sha256 of the whole spec: identical requests on an identical environment."""
        text = json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()


def run_warnings(spec: TableSpec) -> list[str]:
    """What the target card does not support of the spec's steps (workload.support)."""
    return dtype_warnings(spec.weights_dtype, parse_modes(spec.modes), spec.target_gpu())


EnvironmentFn = Callable[[str], dict[str, Any]]


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
    if found.ok("backend"):
        with found.about("backend"):
            env = environment(backend_name)
    gpu_field = "gpu" if body.get("gpu") is not None else "gpu_memory"
    if found.ok("backend", "gpu_memory"):
        with found.about(gpu_field):
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
    found.raise_first()  # none found: every check above ran, and every name is bound
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
        environment=env,
        dtype=dtype,
        weights_dtype=weights_dtype,
        loss=loss,
    )


class Findings:
    """The errors found in one request, in the order checked, each naming its field."""

    def __init__(self) -> None:
        self.errors: list[AutotuneError] = []

    @contextmanager
    def about(self, field: str) -> Iterator[None]:
        """Errors raised inside are about request field ``field`` (unless they already name one),
        and are kept: the checks go on."""
        try:
            yield
        except AutotuneError as exc:
            self.errors.append(_on(field, exc))

    def ok(self, *fields: str) -> bool:
        """No error found so far about any of ``fields``."""
        return not any(exc.field in fields for exc in self.errors)

    def raise_first(self) -> None:
        """Raise the first error found, the others in its ``others``; nothing when none was."""
        if self.errors:
            first, *others = self.errors
            first.others = tuple(others)
            raise first


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
