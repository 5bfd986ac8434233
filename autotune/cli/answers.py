"""A local ``autotune check``'s answers, kept on disk: CI asks the same question before every launch.

An estimate is a function of its inputs alone: the step (model, task, dtype, optimizer, adapter,
...), the target GPU and margin, the ``AUTOTUNE_*`` settings, and the code that computes it
(autotune's own files, torch, transformers, peft). A check answered on the estimator is stored under
a hash of all of them, and the same check in a fresh process is answered from it without importing
torch (BERT-base on a T4: under half a second instead of 5 to 8 s, most of it torch's import).

An answer is kept only where that key is the whole input:

- the model is a preset (its config is data, workload/presets/; a local config or a hub id can
  change under the same name);
- the answer came from the estimator (a measured answer is the GPU's, at that moment), so it is
  looked up for ``--backend estimate``, and for ``auto`` only on a machine without an NVIDIA device
  node, where auto is the estimator (one with a GPU measures: never from here).

Beside each answer its cell is kept (``cells/``): what answers the same check at any other batch
size (analysis.check.CellMemo: the cell's max batch, its levers once searched, the step's
allocations at every batch), read back and replayed without torch (``read_cell``; BERT-base: under
a second in a fresh process instead of 5 s). Its key is the answer's without the batch size and the
accumulation steps.

``--no-cache`` neither reads nor writes. The folder is AUTOTUNE_CACHE_DIR, else
``$XDG_CACHE_HOME/autotune/checks`` (``~/.cache/autotune/checks``); the oldest answers beyond
MAX_ENTRIES are removed. A file that cannot be read or is not the answer of its key is a miss.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from dataclasses import asdict
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.gpus import CUDNN_DEPRIORITIZED_ENV

if TYPE_CHECKING:
    pass
from autotune.request import CheckRequest

FORMAT = 1  # of a stored answer: a new format misses every old one
MAX_ENTRIES = 512
MAX_CELLS = 64  # a cell's memo is larger (BERT-base fp32 at seq 512, its allocations: 90 KB)
PACKAGES = ("torch", "transformers", "peft")  # whose versions change an estimate
# Device nodes of an NVIDIA GPU (Linux, WSL2): with one, ``auto`` may measure.
GPU_DEVICE_NODES = ("/dev/nvidiactl", "/dev/dxg")
# Settings that change no answer of a local check (and a token is no key material).
NOT_KEY_SETTINGS = frozenset({"AUTOTUNE_SERVER", "AUTOTUNE_API_TOKEN", "AUTOTUNE_CACHE_DIR"})


def folder(configured: str | None) -> Path:
    if configured:
        return Path(configured).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "autotune" / "checks"


def key_of(request: CheckRequest) -> dict[str, Any] | None:
    """The whole input of a local check, or None where an answer must not come from here."""
    from autotune.backends.estimate.alloc_conf import alloc_conf_text
    from autotune.workload.liger import parse_kernels
    from autotune.workload.modes import parse_mode
    from autotune.workload.presets import preset_name
    from autotune.workload.trainers import GRPO_FIELDS

    step, target = request.step, request.target
    backend = target.backend
    if backend == "cuda" or (backend == "auto" and any(os.path.exists(p) for p in GPU_DEVICE_NODES)):
        return None
    model = preset_name(step.model)
    if model is None:
        return None
    adapter = step.adapter if step.adapter is not None else step.peft_options.adapter()
    alloc_conf = target.alloc_conf if target.alloc_conf is not None else alloc_conf_text(os.environ)
    return {
        "format": FORMAT,
        "code": _code_fingerprint(),
        "versions": {name: _version(name) for name in PACKAGES},
        "model": model,
        "step": {"seq_len": request.seq_len, "batch_size": request.batch_size, "task": step.task,
                 "dtype": step.dtype, "attn": step.attn, "optimizer": step.optimizer, "loss": step.loss,
                 "accumulation_steps": request.accumulation_steps,
                 "ckpt_reentrant": bool(step.ckpt_reentrant), "liger": list(parse_kernels(step.liger)),
                 **({"experts_kernel": step.experts_kernel} if step.experts_kernel is not None else {}),
                 **({"images_per_sample": step.images_per_sample, "image_size": step.image_size}
                    if step.images_per_sample is not None or step.image_size is not None else {}),
                 **({"trainer": {"trainer": step.trainer, "chosen_nll": step.chosen_nll,
                                 "precompute_ref_log_probs": step.precompute_ref_log_probs,
                                 "kto_loss_type": step.kto_loss_type,
                                 **{name: getattr(step, name) for name in (*GRPO_FIELDS,
                                                                           "max_prompt_length")}}}
                    if step.trainer not in (None, "sft") or step.precompute_ref_log_probs is not None
                    or step.chosen_nll is not None or step.kto_loss_type is not None else {}),
                 **({"parallel": {"gpus": step.gpus, "parallel": step.parallel, "nodes": step.nodes,
                                  "reshard_after_forward": step.reshard_after_forward,
                                  "fsdp_recipe": step.fsdp_recipe,
                                  "fsdp_activation_checkpointing": step.fsdp_activation_checkpointing,
                                  "fsdp_version": step.fsdp_version, "fsdp1_config": step.fsdp1_config,
                                  "offload_params": step.offload_params,
                                  **({"fsdp_wrap": step.fsdp_wrap} if step.fsdp_wrap else {}),
                                  **({"tensor_parallel": step.tensor_parallel}
                                     if step.tensor_parallel not in (None, 1) else {}),
                                  **({"context_parallel": step.context_parallel}
                                     if step.context_parallel not in (None, 1) else {}),
                                  **({"heads_k_stride": step.heads_k_stride}
                                     if step.heads_k_stride not in (None, 1) else {})}}
                    if step.gpus is not None or step.parallel is not None else {}),
                 **_other_fields(step)},
        # no mode: the weights' default (defaults.default_mode_name), fixed by the model and dtype above
        "mode": None if request.mode is None else parse_mode(request.mode).name,
        "adapter": asdict(adapter) if adapter is not None else None,
        "target": {"gpu": target.gpu, "gpu_memory": target.gpu_memory, "backend": backend,
                   "margin": target.margin,
                   **({"multiprocessors": target.multiprocessors} if target.multiprocessors else {}),
                   **({"alloc_conf": alloc_conf} if alloc_conf else {})},
        "settings": {name: value for name, value in sorted(os.environ.items())
                     if name.upper().startswith("AUTOTUNE_") and name.upper() not in NOT_KEY_SETTINGS},
        # PyTorch's own switch of the SDPA kernel, which the estimate follows (estimate/attention.py).
        "sdpa": os.environ.get(CUDNN_DEPRIORITIZED_ENV),
    }


# The Step fields key_of names itself above (some only where set), or that the key has otherwise: the
# model by its preset, the adapter as resolved; hub is refused for a preset's answer (preset_name).
KEYED_FIELDS = frozenset({
    "model", "task", "dtype", "attn", "optimizer", "loss", "ckpt_reentrant", "liger", "experts_kernel",
    "images_per_sample", "image_size", "trainer", "chosen_nll", "precompute_ref_log_probs", "kto_loss_type",
    "num_generations", "max_completion_length", "max_prompt_length", "beta", "steps_per_generation",
    "use_vllm", "vllm_mode", "vllm_gpu_memory_utilization", "gpus", "parallel", "nodes",
    "reshard_after_forward", "fsdp_recipe", "fsdp_activation_checkpointing", "fsdp_version", "fsdp1_config",
    "offload_params", "fsdp_wrap", "tensor_parallel", "context_parallel", "heads_k_stride",
    "peft_options", "adapter", "hub",
})


def _other_fields(step: Any) -> dict[str, Any]:
    """Every other field of the step that is set (not None, False or empty): each changes the step
    (axolotl, llamafactory, qat, unfrozen_parameters, zero_config, ...), so a new one is in the key
    without being named here; unset ones leave the keys of answers stored before they existed."""
    import dataclasses

    values = {field.name: getattr(step, field.name) for field in dataclasses.fields(step)
              if field.name not in KEYED_FIELDS}
    return {name: list(value) if isinstance(value, tuple) else value
            for name, value in sorted(values.items()) if value not in (None, False, (), "")}


def read(where: Path, key: dict[str, Any]) -> dict[str, Any] | None:
    """The stored answer of ``key``, or None."""
    path = where / f"{_digest(key)}.json"
    try:
        stored = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(stored, dict) or stored.get("key") != _canonical(key):
        return None
    result = stored.get("result")
    return result if isinstance(result, dict) else None


def write(where: Path, key: dict[str, Any], result: dict[str, Any]) -> None:
    """Store an estimator's answer (atomically); a cache that cannot be written is skipped."""
    if result.get("backend") != "estimate":
        return
    _store(where, key, result, MAX_ENTRIES)


def cell_key(key: dict[str, Any]) -> dict[str, Any]:
    """The key of the answer's cell: every input but the batch size and the accumulation steps."""
    step = {name: value for name, value in key["step"].items()
            if name not in ("batch_size", "accumulation_steps")}
    return {**key, "step": step}


def read_cell(where: Path, key: dict[str, Any]) -> dict[str, Any] | None:
    """The kept memo of the cell of answer ``key`` (CellMemo.to_json), or None."""
    return read(where / "cells", cell_key(key))


def write_cell(where: Path, key: dict[str, Any], memo: dict[str, Any]) -> None:
    """Keep the memo of the cell of answer ``key`` (an estimator's: only the estimator makes one)."""
    _store(where / "cells", cell_key(key), memo, MAX_CELLS)


def _store(where: Path, key: dict[str, Any], result: dict[str, Any], most: int) -> None:
    with contextlib.suppress(OSError):
        where.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=where, suffix=".tmp", delete=False) as handle:
            json.dump({"key": _canonical(key), "result": result}, handle)
        os.replace(handle.name, where / f"{_digest(key)}.json")
        _prune(where, most)


def _prune(where: Path, most: int) -> None:
    entries = sorted(where.glob("*.json"), key=lambda p: p.stat().st_mtime)
    for old in entries[:max(0, len(entries) - most)]:
        with contextlib.suppress(OSError):
            old.unlink()


def _canonical(key: dict[str, Any]) -> Any:
    """The key as JSON reads it back (tuples become lists), for comparing with a stored one."""
    return json.loads(json.dumps(key, sort_keys=True, default=str))


def _digest(key: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


@cache
def _code_fingerprint() -> str:
    """A hash of autotune's own files (its code and data): an editable install keeps its version
    number while the code changes."""
    root = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        if path.suffix in (".py", ".json") and path.is_file():
            digest.update(str(path.relative_to(root)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()
