"""Measured reference tables: a table measured on a GPU, kept as JSON (docs/measurements/), imported
into the store as a finished cuda run that ``check`` answers from and the dashboard shows.

A file is a ``TableResult.to_dict()`` of backend cuda (``autotune table --backend cuda --json``, or
benchmarks/gpu_measure.py) whose ``environment`` says where it was measured (``device_name``,
``driver``, ``cuda_version``, ``torch_version``, ``transformers_version``); it may add
``cells_missing`` (the cells its measurement did not reach, as ``mode:seq_len``: shown as not
measured, never as failures), ``measured_at`` (ISO 8601) and, per cell, fields of its own
(``seeded_by_estimate``), which are kept.

The import rebuilds the request the table answers with the service's own ``normalize`` (the same
model config from autotune's presets, task, weights dtype, optimizer, loss and adapter), then puts
back what the file says of the target (GPU name, memory, CUDA context, margin: the budget must follow
from them) and of where it ran. So ``GET /v1/check`` matches an imported table exactly as it matches a
run this service measured (routes/check.py ``_covers``), never more loosely: a 12 GiB budget measured
on an H100 ("custom 12 GiB") answers 12 GiB questions, not T4 ones. No model is built: only configs.

Identity: a file is known by its folder and name (``h100-80gb/llama-3.2-1b-24GiB.json``, its
``source``), wherever the folder lies. Importing it again changes nothing when its bytes are the same,
and replaces the earlier import in place (same run id: links stay) when they changed. Runs of this
service and imports of other files are never touched (Store.import_run).

Every file is read and checked before any is imported: with one bad file nothing is, and the error
names each bad file and what is wrong with it.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from api.runs.spec import TableSpec, normalize
from api.settings import Settings
from api.store import Run, Store
from autotune.errors import AutotuneError, InvalidInput
from autotune.gpus import GpuSpec
from autotune.search import METHODS
from autotune.tuner import budget_bytes

log = logging.getLogger("autotune.api")

# What TableResult.to_dict() has that the import reads; the rest (warnings, probes_total, ...) is
# recomputed or not needed.
TABLE_FIELDS = ("model", "task", "backend", "attn", "optimizer", "weights_dtype", "loss", "gpu_name",
                "gpu_memory_bytes", "context_overhead_bytes", "budget_bytes", "margin", "search",
                "max_batch", "seq_lens", "modes", "environment", "cells")
# Where it was measured: the list (GPU name, driver, CUDA, torch, transformers).
ENVIRONMENT_FIELDS = ("device_name", "driver", "cuda_version", "torch_version", "transformers_version")
CELL_FIELDS = ("seq_len", "mode", "max_batch_size", "peak_memory_bytes", "peak_allocated_bytes", "probes",
               "capped", "backend", "probe_log")
ADAPTER_FIELDS = ("method", "r", "alpha", "dropout", "targets", "targets_default", "quant_type",
                  "double_quant", "compute_dtype", "bias", "modules_to_save", "parameters", "label")
# SDPA is what transformers picks on a CUDA GPU for every model that supports it (step.build_model
# with attn None), so a table that ran SDPA is the table of a request that names no attention; any
# other attention was asked for by name.
DEFAULT_ATTN_USED = "sdpa"


@dataclass(frozen=True)
class Measurement:
    """One file, read and checked: the run it becomes."""

    file: str  # as shown: relative to the working directory when under it
    source: str  # "<folder>/<name>": the import's identity
    spec: TableSpec
    header: dict[str, Any]  # attn, environment, adapter (as a worker reports them) and imported
    cells: list[tuple[int, dict[str, Any]]]  # (position in the tuner's order, cell)
    elapsed_s: float | None

    @property
    def measured_on(self) -> str:
        return str(self.header["environment"]["device_name"])


@dataclass(frozen=True)
class Imported:
    """What importing one file did: ``imported``, ``unchanged`` or ``replaced`` (the earlier import)."""

    run: Run
    outcome: str
    measurement: Measurement

    def __str__(self) -> str:
        m = self.measurement
        return (f"{self.outcome} {m.file} as run {self.run.id}: {m.spec.model} on {m.spec.gpu['name']}, "
                f"measured on {m.measured_on}, {len(m.cells)} of {m.spec.cells} cells")


def measured_on(run: Run) -> str | None:
    """The GPU a cuda run measured on (its worker's device_name), None for an estimate or when unknown."""
    if run.backend != "cuda":
        return None
    device = ((run.header or {}).get("environment") or {}).get("device_name")
    return str(device) if device else None


def measured_label(run: Run) -> str | None:
    """``measured on NVIDIA H100 80GB HBM3 (imported from docs/measurements/h100-80gb/x.json)``; without
    the parenthesis for a run of this service; None for an estimate."""
    if run.backend != "cuda":
        return None
    device = measured_on(run)
    label = f"measured on {device}" if device else "measured"
    return f"{label} (imported from {run.imported['file']})" if run.imported else label


def measurement_files(paths: Iterable[str | Path]) -> list[Path]:
    """The files ``paths`` name: a file as it is, a directory's ``*.json`` (not its subfolders), sorted."""
    files: list[Path] = []
    for given in paths:
        path = Path(given).expanduser()
        if path.is_dir():
            found = sorted(p for p in path.glob("*.json") if p.is_file())
            if not found:
                raise InvalidInput(f"{given}: no *.json in this directory (its subfolders are not read: "
                                   "give the folder of the tables, e.g. docs/measurements/h100-80gb)")
            files.extend(found)
        elif path.is_file():
            files.append(path)
        else:
            raise InvalidInput(f"{given}: no such file or directory")
    return list(dict.fromkeys(files))


def read_measurements(paths: Iterable[str | Path], settings: Settings) -> list[Measurement]:
    """Every file of ``paths`` read and checked; InvalidInput naming each bad file when any is."""
    measurements, problems = [], []
    for path in measurement_files(paths):
        try:
            measurements.append(read_measurement(path, settings))
        except InvalidInput as exc:
            problems.append(str(exc))
    if problems:
        raise InvalidInput("; ".join(problems) if len(problems) == 1 else
                           f"{len(problems)} files are not measured tables, none imported:\n"
                           + "\n".join(f"- {p}" for p in problems))
    sources: dict[str, str] = {}
    for m in measurements:
        if m.source in sources:
            raise InvalidInput(f"{m.file} and {sources[m.source]} have the same folder and name "
                               f"({m.source}), which identifies an import: rename one")
        sources[m.source] = m.file
    return measurements


def import_measurements(store: Store, paths: Iterable[str | Path], settings: Settings) -> list[Imported]:
    """Read and check every file of ``paths``, then import each (Store.import_run)."""
    done = []
    for m in read_measurements(paths, settings):
        run, outcome = store.import_run(key=m.spec.key(), model=m.spec.model, gpu=m.spec.gpu["name"],
                                        spec=m.spec.to_json(), total=m.spec.cells, header=m.header,
                                        cells=m.cells, elapsed_s=m.elapsed_s)
        done.append(Imported(run, outcome, m))
        log.info("%s", done[-1])
    return done


def shown_path(path: Path) -> str:
    """``path`` relative to the working directory when it lies under it, else absolute."""
    absolute = path.resolve()
    try:
        return absolute.relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return absolute.as_posix()


def read_measurement(path: Path, settings: Settings) -> Measurement:
    """One file as the run it becomes; InvalidInput starting with the file's name when it is no
    measured table (not JSON, not a table, a backend other than cuda, a field missing or wrong)."""
    file = shown_path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise InvalidInput(f"{file}: cannot read it: {exc.strerror or exc}") from exc
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise InvalidInput(f"{file}: not JSON ({exc})") from exc
    try:
        return _measurement(data, file, f"{path.resolve().parent.name}/{path.name}",
                            hashlib.sha256(raw).hexdigest(), settings)
    except AutotuneError as exc:
        raise InvalidInput(f"{file}: {exc}") from exc


def _measurement(data: Any, file: str, source: str, digest: str, settings: Settings) -> Measurement:
    if not isinstance(data, dict):
        raise InvalidInput(f"not a measured table: a table is a JSON object (autotune table --json), "
                           f"not a {type(data).__name__}")
    missing = [name for name in TABLE_FIELDS if name not in data]
    if missing:
        raise InvalidInput(f"not a measured table (autotune table --backend cuda --json): it lacks "
                           f"{', '.join(missing)}")
    if data["backend"] != "cuda":
        raise InvalidInput(f"a table of backend {data['backend']!r}: only tables measured on a GPU "
                           "(backend cuda) are imported as measured references")
    for name in ("model", "task", "optimizer", "weights_dtype", "loss"):
        if not isinstance(data[name], str):
            raise InvalidInput(f"{name} must be a string, not {data[name]!r}")
    environment = _environment(data["environment"])
    gpu = _gpu(data)
    spec = _spec(data, gpu, environment, settings)
    found = _cells(data["cells"], spec)
    missing_cells = _cells_missing(data.get("cells_missing"), spec, found)
    grid = _grid(spec)
    cells = [(grid.index(where), found[where]) for where in grid if where in found]
    adapter = data.get("adapter")
    imported = {
        "source": source, "file": file, "sha256": digest, "measured_on": environment["device_name"],
        **{name: environment[name] for name in ENVIRONMENT_FIELDS[1:]},
        "measured_at": _measured_at(data.get("measured_at")),
        "cells_missing": [f"{mode}:{seq_len}" for mode, seq_len in missing_cells],
    }
    header = {"attn": data["attn"], "environment": environment, "adapter": adapter, "imported": imported}
    elapsed = data.get("elapsed_s")
    return Measurement(file, source, spec, header, cells,
                       float(elapsed) if isinstance(elapsed, int | float) else None)


def _environment(environment: Any) -> dict[str, Any]:
    if not isinstance(environment, dict):
        raise InvalidInput("its environment is not an object: it says where the table was measured")
    missing = [name for name in ENVIRONMENT_FIELDS if name not in environment]
    if missing:
        raise InvalidInput(f"its environment lacks {', '.join(missing)}: a measured table says where it "
                           f"was measured ({', '.join(ENVIRONMENT_FIELDS)})")
    if environment.get("backend", "cuda") != "cuda":
        raise InvalidInput(f"its environment is of backend {environment['backend']!r}, not cuda")
    for name in ("device_name", "torch_version", "transformers_version"):
        if not isinstance(environment[name], str) or not environment[name].strip():
            raise InvalidInput(f"its environment's {name} is {environment[name]!r}: give the name it had")
    return dict(environment)


def _integer(data: Mapping[str, Any], name: str) -> int:
    value = data[name]
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidInput(f"{name} must be a byte count (an integer >= 0), not {value!r}")
    return value


def _gpu(data: Mapping[str, Any]) -> GpuSpec:
    """The target card as the file says it; its budget must follow from it (tuner.budget_bytes)."""
    name = data["gpu_name"]
    if not isinstance(name, str) or not name.strip():
        raise InvalidInput(f"gpu_name must be the target card's name, not {name!r}")
    gpu = GpuSpec(name, _integer(data, "gpu_memory_bytes"), _integer(data, "context_overhead_bytes"),
                  _compute_capability(data.get("compute_capability")))
    margin = data["margin"]
    if isinstance(margin, bool) or not isinstance(margin, int | float):
        raise InvalidInput(f"margin must be a fraction, e.g. 0.05, not {margin!r}")
    expected = budget_bytes(gpu, float(margin))
    if _integer(data, "budget_bytes") != expected:
        raise InvalidInput(
            f"budget_bytes {data['budget_bytes']} does not follow from gpu_memory_bytes, "
            f"context_overhead_bytes and margin (they give {expected})"
        )
    env_gpu = data["environment"].get("gpu_name")
    if env_gpu is not None and env_gpu != name:
        raise InvalidInput(f"gpu_name {name!r} differs from its environment's gpu_name {env_gpu!r}")
    return gpu


def _compute_capability(value: Any) -> tuple[int, int] | None:
    """An optional [major, minor]; None (a card taken to be a current one, as a custom size is)."""
    if value is None:
        return None
    if (not isinstance(value, list | tuple) or len(value) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in value)):
        raise InvalidInput(f"compute_capability must be [major, minor], e.g. [9, 0], not {value!r}")
    return (value[0], value[1])


def _spec(data: Mapping[str, Any], gpu: GpuSpec, environment: dict[str, Any],
          settings: Settings) -> TableSpec:
    """The request the table answers, normalised as the service normalises one (the same model config,
    task, dtype, optimizer, loss, modes and adapter), with the file's target GPU, budget and environment."""
    for name in ("seq_lens", "modes"):
        if not isinstance(data[name], list) or not data[name]:
            raise InvalidInput(f"{name} must be a non-empty list, not {data[name]!r}")
    if isinstance(data["max_batch"], bool) or not isinstance(data["max_batch"], int):
        raise InvalidInput(f"max_batch must be an integer, not {data['max_batch']!r}")
    if not isinstance(data["search"], str):
        raise InvalidInput(f"search must be a string, not {data['search']!r}")
    attn = data["attn"]
    method = data["search"].split(";")[0].strip()
    body = {
        "model": data["model"], "task": data["task"], "dtype": data["weights_dtype"],
        "attn": None if attn == DEFAULT_ATTN_USED else attn, "optimizer": data["optimizer"],
        "loss": data["loss"], "seq_lens": data["seq_lens"], "modes": data["modes"],
        "margin": data["margin"], "max_batch": data["max_batch"], "backend": "estimate",
        "search": method if method in METHODS else None, "gpu_memory": gpu.total_memory_bytes,
        **_peft_fields(data.get("adapter")),
    }
    # A request's limits guard the server's work; an import does none, so the file's sizes pass.
    cells = len(data["seq_lens"]) * len(data["modes"])
    roomy = settings.model_copy(update={
        "max_cells": max(settings.max_cells, cells), "max_batch": max(settings.max_batch, data["max_batch"]),
        "max_seq_len": max([settings.max_seq_len, *(s for s in data["seq_lens"] if isinstance(s, int))]),
    })
    spec = normalize(body, roomy, lambda backend, gpu: {"backend": backend})
    return replace(spec, backend="cuda", search=data["search"], environment=environment, gpu={
        "name": gpu.name, "total_memory_bytes": gpu.total_memory_bytes,
        "context_overhead_bytes": gpu.context_overhead_bytes,
        "compute_capability": list(gpu.compute_capability) if gpu.compute_capability else None,
    }, budget_bytes=budget_bytes(gpu, spec.margin))


def _peft_fields(adapter: Any) -> dict[str, Any]:
    """The request fields of the file's adapter (an AdapterSummary.to_json()); none for a full fine-tune."""
    if adapter is None:
        return {}
    if not isinstance(adapter, dict):
        raise InvalidInput(f"adapter must be an object (the adapter's summary) or null, not {adapter!r}")
    missing = [name for name in ADAPTER_FIELDS if name not in adapter]
    if missing:
        raise InvalidInput(f"its adapter lacks {', '.join(missing)}")
    if adapter["bias"] != "none" or adapter["modules_to_save"]:
        raise InvalidInput("its adapter trains biases or whole modules (bias, modules_to_save), which a "
                           "request to the service cannot ask for: no check would match it")
    targets = None if adapter["targets_default"] else adapter["targets"]
    fields = {"peft": "lora" if adapter["method"] == "lora_8bit" else adapter["method"],
              "lora_r": adapter["r"], "lora_alpha": adapter["alpha"], "lora_dropout": adapter["dropout"],
              "lora_targets": targets}
    if adapter["method"] == "lora_8bit":
        fields.update(load_in_8bit=True, qlora_recipe=adapter.get("recipe"))
    if adapter["method"] == "qlora":
        fields.update(load_in_4bit=True, bnb_4bit_quant_type=adapter["quant_type"],
                      bnb_4bit_use_double_quant=adapter["double_quant"],
                      bnb_4bit_compute_dtype=adapter["compute_dtype"], qlora_recipe=adapter.get("recipe"))
    return fields


def _cell_name(text: Any) -> tuple[str, int]:
    mode, _, seq_len = str(text).rpartition(":")
    if not mode or not seq_len.isdigit():
        raise InvalidInput(f"cells_missing entry {text!r} is not 'mode:seq_len', e.g. 'ckpt:128'")
    return mode, int(seq_len)


def _grid(spec: TableSpec) -> list[tuple[str, int]]:
    """The table's cells in the tuner's order: mode by mode, each from the shortest length."""
    return [(mode, seq_len) for mode in spec.modes for seq_len in spec.seq_lens]


def _cells(cells: Any, spec: TableSpec) -> dict[tuple[str, int], dict[str, Any]]:
    """The file's cells by (mode, seq_len), each checked, kept as they are (extra fields included)."""
    if not isinstance(cells, list):
        raise InvalidInput(f"cells must be a list, not {type(cells).__name__}")
    grid = _grid(spec)
    found: dict[tuple[str, int], dict[str, Any]] = {}
    for i, cell in enumerate(cells):
        if not isinstance(cell, dict):
            raise InvalidInput(f"cell {i} is not an object")
        absent = [name for name in CELL_FIELDS if name not in cell]
        if absent:
            raise InvalidInput(f"cell {i} lacks {', '.join(absent)}")
        where, name = (cell["mode"], cell["seq_len"]), f"{cell['mode']}:{cell['seq_len']}"
        if where not in grid:
            raise InvalidInput(f"cell {name} is not a cell of the table (modes {', '.join(spec.modes)}; "
                               f"seq_lens {spec.seq_lens})")
        if where in found:
            raise InvalidInput(f"cell {name} is there twice")
        if cell["backend"] != "cuda":
            raise InvalidInput(f"cell {name} is of backend {cell['backend']!r}, not cuda: a measured "
                               "table's cells are measured")
        best = cell["max_batch_size"]
        if best is not None and (isinstance(best, bool) or not isinstance(best, int) or best < 0):
            raise InvalidInput(f"cell {name} has max_batch_size {best!r}: an integer >= 0, or null for "
                               "a failed cell")
        found[where] = cell
    return found


def _cells_missing(listed: Any, spec: TableSpec,
                   found: Mapping[tuple[str, int], Any]) -> list[tuple[str, int]]:
    """The cells not measured, in the tuner's order: the file's ``cells_missing``, which must account
    for every cell the file lacks and for no other; without it, the cells the file lacks."""
    grid = _grid(spec)
    lacking = [cell for cell in grid if cell not in found]
    if listed is None:
        return lacking
    if not isinstance(listed, list):
        raise InvalidInput(f"cells_missing must be a list of 'mode:seq_len', not {listed!r}")
    named = [_cell_name(text) for text in listed]
    for mode, seq_len in named:
        if (mode, seq_len) not in grid:
            raise InvalidInput(f"cells_missing lists {mode}:{seq_len}, which is not a cell of the table "
                               f"(modes {', '.join(spec.modes)}; seq_lens {spec.seq_lens})")
        if (mode, seq_len) in found:
            raise InvalidInput(f"cells_missing lists {mode}:{seq_len}, which the table has a cell for")
    unaccounted = [f"{mode}:{seq_len}" for mode, seq_len in lacking if (mode, seq_len) not in named]
    if unaccounted:
        raise InvalidInput(f"the cells {', '.join(unaccounted)} are neither in cells nor in cells_missing")
    return lacking


def _measured_at(value: Any) -> str | None:
    if value is None:
        return None
    try:
        return datetime.fromisoformat(str(value)).isoformat()
    except ValueError as exc:
        raise InvalidInput(f"measured_at {value!r} is not an ISO 8601 date, e.g. 2026-11-23") from exc
