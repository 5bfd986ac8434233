"""The planned training step in a training config: a Hugging Face ``TrainingArguments`` JSON, or a
small YAML/JSON of ``model``, ``seq_len``, ``batch_size``, ``mode``.

``read_training_config`` returns what the file says; what it leaves out is named by
``missing_fields`` (``autotune check --from-config`` lets flags fill it in).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.errors import InvalidInput
from autotune.workload.modes import Mode, parse_mode

_MODEL_KEYS = ("model", "model_name_or_path", "model_name")


_SEQ_KEYS = ("seq_len", "max_seq_length", "max_length", "max_seq_len")


_BATCH_KEYS = ("batch_size", "per_device_train_batch_size")


@dataclass(frozen=True)
class TrainingPlan:
    model: str | None
    seq_len: int | None
    batch_size: int | None
    mode: Mode | None
    accumulation_steps: int


def read_training_config(path: str | Path) -> TrainingPlan:
    """The planned training step in a TrainingArguments JSON or a small YAML/JSON; unknown keys ignored."""
    file = Path(path)
    try:
        text = file.read_text()
    except OSError as exc:
        raise InvalidInput(f"cannot read training config {str(path)!r}: {exc.strerror}") from exc
    data = _parse(text, file)
    if not isinstance(data, dict):
        raise InvalidInput(f"training config {str(path)!r} must be a mapping of keys to values")

    def first(keys: tuple[str, ...]) -> Any:
        return next((data[k] for k in keys if data.get(k) is not None), None)

    mode = None
    if data.get("mode") is not None:
        mode = parse_mode(str(data["mode"]))
    elif any(k in data for k in ("fp16", "bf16", "gradient_checkpointing")):
        precision = "amp" if data.get("fp16") else "bf16" if data.get("bf16") else "fp32"
        mode = Mode(precision, bool(data.get("gradient_checkpointing")))  # type: ignore[arg-type]
    return TrainingPlan(
        model=first(_MODEL_KEYS), seq_len=_int(first(_SEQ_KEYS), "sequence length", path),
        batch_size=_int(first(_BATCH_KEYS), "batch size", path), mode=mode,
        accumulation_steps=_int(data.get("gradient_accumulation_steps"), "accumulation steps",
                                path) or 1,
    )


def _parse(text: str, file: Path) -> Any:
    if file.suffix.lower() == ".json":
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise InvalidInput(f"training config {str(file)!r} is not valid JSON: {exc}") from exc
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise InvalidInput(f"training config {str(file)!r} is not valid YAML or JSON: {exc}") from exc


def _int(value: Any, what: str, path: str | Path) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidInput(f"{what} in {str(path)!r} must be a positive integer, got {value!r}")
    return value


def missing_fields(plan: TrainingPlan) -> list[str]:
    names = {"model": plan.model, "seq_len": plan.seq_len, "batch_size": plan.batch_size}
    return [name for name, value in names.items() if value is None]
