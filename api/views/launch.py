"""The launch form: a new table run. The page's script posts it to ``POST /v1/tables`` and shows
the API's validation errors next to their fields; on success it opens the new run's page.

On a fleet server the GPU choice offers "all kinds in the fleet": the script posts the form to
``POST /v1/fleet/tables`` instead (one run per kind) and opens the fleet view of the model. Without a
fleet, or while it cannot take runs, the choice is shown disabled with the reason. ``?model=`` and
``?gpu=`` fill in the form (the fleet view's "measure it on all kinds" link).

The trainer (sft, or a preference or RL trainer the service takes) shows its own memory settings
only: those POST /v1/tables takes for it (workload.trainers.check_trainer's)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse

from api.deps import QueueDep, SettingsDep
from api.fleet.launch import ALL_KINDS, NO_FLEET, fleet_of
from api.limits import MAX_GENERATIONS
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
from autotune.workload.trainers import (
    DPO,
    EBFT,
    GRPO,
    KTO,
    KTO_LOSS_TYPES,
    NOT_YET,
    ORPO,
    REFERENCED,
    REWARD,
    SFT,
    SIMPO,
    TRAINERS,
    TRL_CLASSES,
    VLLM_MODES,
    Trainer,
)

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

# The trainers of the form (POST /v1/tables' trainer), those the service takes: value, label.
_TRAINER_WORDS = {
    SFT: "supervised fine-tuning", DPO: "pairs, with a reference model", ORPO: "pairs, no reference",
    SIMPO: "pairs, no reference", KTO: "labelled examples, with a reference model",
    REWARD: "a one-score classifier on pairs", GRPO: "generation, then the policy's step",
    EBFT: "GRPO's step, a feature network's forward as reward",
}
TRAINER_LABELS = tuple((name, f"{name}: {_TRAINER_WORDS[name]} ({TRL_CLASSES[name]})")
                       for name in TRAINERS if name not in NOT_YET)
# KTOConfig loss_type (POST /v1/tables' kto_loss_type), the default first: value, label.
_KTO_LOSS_WORDS = {"kto": "the KL batch runs (KTOConfig's default)", "apo_zero_unpaired": "no KL batch"}
KTO_LOSS_LABELS = tuple((name, f"{name}: {_KTO_LOSS_WORDS[name]}") for name in KTO_LOSS_TYPES)
# GRPO's generation (POST /v1/tables' use_vllm and vllm_mode: app.js): value, label; "" is
# transformers' model.generate (use_vllm off).
_VLLM_WORDS = {"colocate": "vLLM colocated on this GPU", "server": "vLLM server on other GPUs"}
GENERATION_LABELS = (("", "model.generate on this GPU"),
                     *((mode, _VLLM_WORDS[mode]) for mode in VLLM_MODES))
# GRPO's settings left empty: the service's defaults (Trainer's: GRPOConfig's, but steps_per_generation
# 1 where GRPOConfig's follows gradient_accumulation_steps).
GRPO_DEFAULTS = {name: getattr(Trainer(GRPO), name) for name in (
    "num_generations", "max_completion_length", "beta", "steps_per_generation",
    "vllm_gpu_memory_utilization")}


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
        "trainers": TRAINER_LABELS, "referenced": " ".join(REFERENCED), "kto_loss_types": KTO_LOSS_LABELS,
        "generations": GENERATION_LABELS, "grpo_defaults": GRPO_DEFAULTS, "max_generations": MAX_GENERATIONS,
        "fleet": fleet, "all_kinds": ALL_KINDS,
        "all_kinds_unavailable": NO_FLEET if fleet is None else fleet.unavailable,
        "asked": {"model": (model or "").strip(), "gpu": (gpu or "").strip()},
    }
    return templates.TemplateResponse(request, "launch.html", context)
