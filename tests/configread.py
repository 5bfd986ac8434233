"""A training config read as the config tests compare it: the request's fields flat."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import yaml

from autotune.configs import TrainingConfig, read_training_config
from autotune.request import values_of
from autotune.workload.modes import parse_mode


class Read(SimpleNamespace):
    """A config read, its request's fields flat (``mode`` a Mode, None where the file sets none: the
    weights' default): what the assertions compare."""


def write(tmp_path: Path, data: dict, name: str) -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data) if name.endswith(".json") else yaml.safe_dump(data))
    return path


def view(config: TrainingConfig) -> Read:
    values = values_of(config.request)
    return Read(format=config.format, notes=config.notes, ignored=config.ignored, request=config.request,
                parallel_key=config.parallel_key,
                **{**values, "mode": None if values["mode"] is None else parse_mode(values["mode"])})


def read(tmp_path: Path, data: dict, name: str) -> Read:
    """``data`` written to ``tmp_path / name`` (JSON for a .json name, else YAML) and read."""
    return view(read_training_config(write(tmp_path, data, name)))
