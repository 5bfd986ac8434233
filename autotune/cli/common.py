"""What the CLI commands share: argument types, the target and workload options, JSON output,
the error report, and transformers kept quiet while a command runs."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import warnings
from collections.abc import Iterator

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


def add_target(parser: argparse.ArgumentParser, *, gpu_help: str = "GPU preset, e.g. T4, A100-80GB "
               "(see `autotune gpus`)") -> None:
    """--gpu-memory | --gpu: the card the answer is for."""
    target = parser.add_mutually_exclusive_group()
    target.add_argument("--gpu-memory", help="total memory of the target card, e.g. 12GiB")
    target.add_argument("--gpu", help=gpu_help)


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
