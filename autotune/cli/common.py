"""What the CLI commands share: argument types, the target and workload options, JSON output,
the error report, and transformers kept quiet while a command runs."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import warnings
from collections.abc import Iterator
from typing import Any

from autotune.errors import AutotuneError

EXIT_OK, EXIT_ERROR = 0, 2  # `check` adds 1: the step does not fit


def int_list(text: str) -> list[int]:
    """--seq-lens: workload.models.parse_seq_lens, its refusal as argparse's."""
    from autotune.errors import InvalidInput
    from autotune.workload.models import parse_seq_lens

    try:
        return parse_seq_lens(text)
    except InvalidInput as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid margin {text!r}: use a fraction, e.g. 0.05") from None
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"invalid margin {text!r}: use a fraction in [0, 1), e.g. 0.05")
    return value


def positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"invalid value {text!r}: use a positive integer")
    return value


# The MODEL argument of table, check and explain.
MODEL_HELP = ("a preset (see `autotune models`), a local config directory or config.json, or with "
              "--hub a Hugging Face hub id")

# The epilog of `autotune --help` and of the commands that take a model: how names and sizes read.
NAMES_AND_SIZES = (
    "Offline by default: MODEL is a preset or a local config, and a Hugging Face hub id is looked "
    "up (its config.json only, never weights) only with --hub or AUTOTUNE_ALLOW_HUB=1; with "
    "HF_HUB_OFFLINE=1 (or AUTOTUNE_OFFLINE=1) that lookup reads only the local Hugging Face cache. "
    "A mistyped model or GPU name is refused naming the closest presets. Sizes need a unit: "
    "--gpu-memory 12GiB (or 16GB, 512MiB, 12G; B for bytes); a number alone is refused."
)


def add_target(parser: argparse.ArgumentParser, *, gpu_help: str = "GPU preset, e.g. T4, A100-80GB "
               "(see `autotune gpus`)") -> None:
    """--gpu-memory | --gpu: the card the answer is for."""
    target = parser.add_mutually_exclusive_group()
    target.add_argument("--gpu-memory", metavar="SIZE",
                        help="total memory of the target card, with its unit: 12GiB, 16GB, 512MiB, "
                        "12G (GiB); a number alone is refused (default: the local GPU with the cuda "
                        "backend, else a T4)")
    target.add_argument("--gpu", help=gpu_help)


def add_hub(parser: argparse.ArgumentParser) -> None:
    """--hub / --no-hub: may MODEL be looked up on the Hugging Face hub (default: AUTOTUNE_ALLOW_HUB)."""
    parser.add_argument("--hub", action=argparse.BooleanOptionalAction, default=None,
                        help="look MODEL up on the Hugging Face hub when it is neither a preset nor a "
                        "local config (its config.json only; HF_HUB_OFFLINE=1 keeps to the local "
                        "cache). Default: off, unless AUTOTUNE_ALLOW_HUB=1")


def add_backend(parser: argparse.ArgumentParser) -> None:
    """--backend: who answers, the GPU (cuda) or the estimator."""
    from autotune.defaults import BACKENDS, DEFAULT_BACKEND

    parser.add_argument("--backend", default=DEFAULT_BACKEND, choices=BACKENDS,
                        help="cuda measures on the local GPU, estimate runs on the CPU; auto: cuda "
                        "when there is a GPU (default: %(default)s)")


def add_margin(parser: argparse.ArgumentParser) -> None:
    """--margin: the share of the allocator's memory kept free."""
    from autotune.defaults import DEFAULT_MARGIN

    parser.add_argument("--margin", type=fraction, default=DEFAULT_MARGIN,
                        help="fraction of the allocator's memory kept free (default: %(default)s)")


def add_step(parser: argparse.ArgumentParser) -> None:
    """--task, --dtype, --optimizer, --attn, --loss: the training step a command models."""
    from autotune.defaults import DEFAULT_DTYPE, DEFAULT_LOSS, DEFAULT_OPTIMIZER
    from autotune.workload.loss import LOSSES
    from autotune.workload.models import DTYPES, TASKS
    from autotune.workload.optimizers import OPTIMIZER_NAMES
    from autotune.workload.step import ATTN_CHOICES

    parser.add_argument("--task", default=None, choices=TASKS,
                        help="the head trained (default: from the config's architectures; without "
                        "them causal-lm for decoder-only models, sequence-classification else)")
    parser.add_argument("--dtype", default=DEFAULT_DTYPE, choices=DTYPES,
                        help="dtype of the weights (default auto: the config's torch_dtype, as "
                        "from_pretrained loads it, else float32); modes autocast on top of it")
    parser.add_argument("--optimizer", default=DEFAULT_OPTIMIZER, choices=OPTIMIZER_NAMES,
                        help="a Trainer optim name (default %(default)s, the Trainer's)")
    parser.add_argument("--attn", choices=ATTN_CHOICES, default=None,
                        help="attention implementation (default: what transformers picks on CUDA)")
    parser.add_argument("--loss", default=DEFAULT_LOSS, choices=LOSSES,
                        help="full: the model's loss over full logits; chunked: a fused linear "
                        "cross-entropy that never holds them (Liger's; causal-lm)")


def add_peft(parser: argparse.ArgumentParser) -> None:
    """--peft, --lora-*, --peft-config, --load-in-4bit/8bit, --bnb-4bit-*: LoRA and QLoRA."""
    from autotune.workload.adapters import (
        DEFAULT_ALPHA,
        DEFAULT_DROPOUT,
        DEFAULT_R,
        PEFT_CHOICES,
        QLORA_RECIPES,
        QUANT_TYPES,
    )

    group = parser.add_argument_group(
        "parameter-efficient fine-tuning",
        "LoRA and QLoRA, built by the real PEFT (get_peft_model) over the model")
    group.add_argument("--peft", choices=PEFT_CHOICES, default=None,
                       help="none: a full fine-tune (default); lora: LoRA over a frozen base in the "
                       "weights' dtype; qlora: LoRA over a 4-bit (bitsandbytes NF4) base")
    group.add_argument("--lora-r", type=positive, default=None, metavar="R",
                       help=f"LoRA rank (default: {DEFAULT_R})")
    group.add_argument("--lora-alpha", type=float, default=None, metavar="A",
                       help=f"LoRA alpha (default: {DEFAULT_ALPHA})")
    group.add_argument("--lora-dropout", type=float, default=None, metavar="P",
                       help=f"dropout on the adapters' input (default: {DEFAULT_DROPOUT})")
    group.add_argument("--lora-targets", default=None, metavar="MODULES",
                       help="comma-separated module names (q_proj,v_proj), or all-linear (default: "
                       "PEFT's own default target modules for the architecture)")
    group.add_argument("--peft-config", default=None, metavar="PATH",
                       help="PEFT's adapter_config.json (or its directory) instead of the "
                       "--lora-* flags")
    group.add_argument("--load-in-4bit", action="store_true",
                       help="a 4-bit base (with --peft lora: QLoRA), as "
                       "BitsAndBytesConfig(load_in_4bit=True)")
    group.add_argument("--load-in-8bit", action="store_true",
                       help="an 8-bit (LLM.int8) base: not modelled yet, refused with the reason")
    group.add_argument("--bnb-4bit-quant-type", choices=QUANT_TYPES, default=None,
                       help="4-bit data type (default: nf4)")
    group.add_argument("--bnb-4bit-use-double-quant", action=argparse.BooleanOptionalAction,
                       default=None, help="quantize the quantization constants too (default: on)")
    group.add_argument("--bnb-4bit-compute-dtype", choices=("bfloat16", "float16", "float32"),
                       default=None, help="dtype the 4-bit layers compute in (default: bfloat16, "
                       "float16 on cards without bfloat16)")
    group.add_argument("--qlora-recipe", choices=QLORA_RECIPES, default=None,
                       help="how the 4-bit base is prepared, as the trainer that runs it does: trl "
                       "(TRL's SFTTrainer: non-4-bit weights in the model's dtype, adapters cast to "
                       "bfloat16; the default), axolotl (norms and embeddings in the model's dtype, "
                       "adapters float32), peft (prepare_model_for_kbit_training alone: every "
                       "non-4-bit weight float32)")


def peft_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """The PEFT flags as the Python API's keyword arguments."""
    return {"peft": args.peft, "lora_r": args.lora_r, "lora_alpha": args.lora_alpha,
            "lora_dropout": args.lora_dropout, "lora_targets": args.lora_targets,
            "peft_config": args.peft_config, "load_in_4bit": args.load_in_4bit,
            "load_in_8bit": args.load_in_8bit, "bnb_4bit_quant_type": args.bnb_4bit_quant_type,
            "bnb_4bit_use_double_quant": args.bnb_4bit_use_double_quant,
            "bnb_4bit_compute_dtype": args.bnb_4bit_compute_dtype,
            "qlora_recipe": args.qlora_recipe}


def print_json(document: object) -> None:
    """One JSON document on stdout, as every ``--json`` prints it."""
    json.dump(document, sys.stdout, indent=2)
    sys.stdout.write("\n")


def report_error(exc: AutotuneError, *, as_json: bool) -> int:
    """``Error: ...`` on stderr (and ``{"error": ...}`` on stdout for --json); exit status 2."""
    if as_json:
        json.dump({"error": str(exc)}, sys.stdout)
        sys.stdout.write("\n")
    print(f"Error: {exc}", file=sys.stderr)
    return EXIT_ERROR


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """transformers' deprecation notices and info logs off: they would break progress lines and
    reports (a tokenizer's "longer than the maximum" is counted by the report itself)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        from transformers.utils import logging as transformers_logging

        transformers_logging.set_verbosity_error()
        yield


def prestart_estimator_workers(backend: str, model: str | None, workers: int | None, *, jobs: int) -> int:
    """Start the worker processes an estimator run of ``jobs`` jobs (a table's modes, a check's
    lever searches; parallel.py) will take, before this process imports torch, so that their
    imports overlap with its own: where that is known without importing it, the estimator
    (``auto`` on a machine without an NVIDIA device node) and a preset model (its size is data,
    workload/presets.py). Returns how many were started; parallel.stop_prestarted ends those no
    run took."""
    import os

    from autotune import parallel
    from autotune.cli.answers import GPU_DEVICE_NODES
    from autotune.workload.presets import PRESETS, preset_name

    if jobs < 2 or backend == "cuda" or (backend == "auto" and any(map(os.path.exists, GPU_DEVICE_NODES))):
        return 0
    name = None if model is None else preset_name(model)
    if name is None or (workers is not None and workers < 1):
        return 0
    count = parallel.preset_workers(PRESETS[name], jobs, workers) - 1
    parallel.prestart(count)
    return count
