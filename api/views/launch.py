"""The launch form: a new table run. The page's script posts it to ``POST /v1/tables`` and shows
the API's validation errors next to their fields; on success it opens the new run's page.

On a fleet server the GPU choice offers "all kinds in the fleet": the script posts the form to
``POST /v1/fleet/tables`` instead (one run per kind) and opens the fleet view of the model. Without a
fleet, or while it cannot take runs, the choice is shown disabled with the reason. ``?model=`` and
``?gpu=`` fill in the form (the fleet view's "measure it on all kinds" link)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse

from api.deps import QueueDep, SettingsDep
from api.fleet.launch import ALL_KINDS, NO_FLEET, fleet_of
from api.views.common import templates
from autotune.defaults import (
    BACKENDS,
    DEFAULT_DTYPE,
    DEFAULT_GPU_NAME,
    DEFAULT_MARGIN,
    DEFAULT_MAX_BATCH,
    DEFAULT_MODES_HELP,
    DEFAULT_OPTIMIZER,
    DEFAULT_SEQ_LENS,
)
from autotune.gpus import GPU_PRESETS
from autotune.search import METHODS
from autotune.units import format_bytes
from autotune.workload.adapters import DEFAULT_ALPHA, DEFAULT_DROPOUT, DEFAULT_R
from autotune.workload.loss import LOSSES
from autotune.workload.models import DTYPES, LONG_SEQ_LENS, PRESETS, TASKS
from autotune.workload.modes import ALLOWED_MODE_NAMES
from autotune.workload.optimizers import OPTIMIZERS
from autotune.workload.parallel import DDP, FSDP
from autotune.workload.step import ATTN_CHOICES

router = APIRouter()

# The fine-tuning methods of the form (POST /v1/tables' peft): value, label.
PEFT_METHODS = (
    ("none", "full fine-tune (every weight trained)"),
    ("lora", "LoRA (frozen base, adapters trained)"),
    ("qlora", "QLoRA (LoRA over a 4-bit base)"),
    ("lora_8bit", "LoRA over an 8-bit base (LLM.int8)"),  # sent as peft lora + load_in_8bit (app.js)
)
# How a multi-GPU job spreads over its GPUs (POST /v1/tables' parallel), those modelled: value, label.
PARALLEL_LABELS = (
    (DDP, "DDP: each GPU holds the whole model"),
    (FSDP, "FSDP2 full shard: parameters, gradients and optimizer state split"),
)
# How a 4-bit base is prepared (POST /v1/tables' qlora_recipe), the default first: value, label.
QLORA_RECIPE_LABELS = (
    ("trl", "TRL's SFTTrainer: adapters in bf16, the rest in the model's dtype"),
    ("axolotl", "Axolotl: norms and embeddings in the model's dtype, adapters fp32"),
    ("peft", "prepare_model_for_kbit_training: every unquantized weight fp32"),
)


@router.get("/new", response_class=HTMLResponse, name="launch")
def launch(request: Request, queue: QueueDep, settings: SettingsDep,
           model: Annotated[str | None, Query(max_length=300)] = None,
           gpu: Annotated[str | None, Query(max_length=300)] = None) -> HTMLResponse:
    """The form that asks for a new table."""
    runner = queue.runner.describe()
    fleet = fleet_of(queue.runner)
    gpus = [(name, format_bytes(spec.total_memory_bytes)) for name, spec in GPU_PRESETS.items()]
    context = {
        "page": "launch", "models": sorted(PRESETS, key=lambda m: (m.startswith("tiny-"), m)),
        "tasks": TASKS, "dtypes": DTYPES, "default_dtype": DEFAULT_DTYPE, "modes": ALLOWED_MODE_NAMES,
        "default_modes_help": DEFAULT_MODES_HELP, "seq_lens": ", ".join(map(str, DEFAULT_SEQ_LENS)),
        "long_seq_lens": ", ".join(map(str, LONG_SEQ_LENS)), "losses": LOSSES,
        "default_optimizer": DEFAULT_OPTIMIZER,
        "gpus": gpus, "default_gpu": runner["gpu"] or DEFAULT_GPU_NAME, "local_gpu": runner["gpu"],
        "backends": BACKENDS, "default_backend": settings.backend, "auto_means": runner["backend"],
        "attns": ATTN_CHOICES, "optimizers": OPTIMIZERS, "searches": METHODS, "margin": DEFAULT_MARGIN,
        "max_batch": min(settings.max_batch, DEFAULT_MAX_BATCH),
        "needs_token": settings.api_token is not None,
        "peft_methods": PEFT_METHODS, "qlora_recipes": QLORA_RECIPE_LABELS, "parallels": PARALLEL_LABELS,
        "lora_defaults": {"r": DEFAULT_R, "alpha": DEFAULT_ALPHA, "dropout": DEFAULT_DROPOUT},
        "fleet": fleet, "all_kinds": ALL_KINDS,
        "all_kinds_unavailable": NO_FLEET if fleet is None else fleet.unavailable,
        "asked": {"model": (model or "").strip(), "gpu": (gpu or "").strip()},
    }
    return templates.TemplateResponse(request, "launch.html", context)
