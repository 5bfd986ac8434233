"""The ``autotune`` command line. Only translates: library errors become ``Error: ...`` + exit 2.

    autotune table MODEL [--seq-lens 64,128,...] [--modes fp32,amp,ckpt,amp+ckpt] [--task T]
                         [--attn sdpa|eager] [--gpu-memory SIZE | --gpu NAME]
                         [--backend auto|cuda|estimate] [--margin F] [--search guided|bisect]
                         [--max-batch N] [--optimizer adamw|sgd] [--json]
    autotune check MODEL --seq-len N --batch-size B [...]   the CI gate (see check_cli.py)
    autotune explain MODEL [--seq-len N] [--batch-size B] [...]   where the memory goes, levers
    autotune serve [--host H] [--port P] [--db PATH]        the HTTP service (see serve.py)
    autotune models      the offline presets
    autotune gpus        the GPU presets
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from collections.abc import Sequence
from typing import IO, TYPE_CHECKING

from autotune import serve
from autotune.errors import AutotuneError
from autotune.units import format_bytes

if TYPE_CHECKING:
    from autotune.tuner import CellResult, TableResult

EXIT_OK, EXIT_ERROR = 0, 2


def _int_list(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"invalid sequence lengths {text!r}: use comma-separated integers, e.g. 128,256,512"
        ) from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(
            f"invalid sequence lengths {text!r}: each must be a positive integer"
        )
    return values


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid margin {text!r}: use a fraction, e.g. 0.05") from None
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"invalid margin {text!r}: use a fraction in [0, 1), e.g. 0.05")
    return value


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"invalid value {text!r}: use a positive integer")
    return value


def build_parser() -> argparse.ArgumentParser:
    from autotune.models import DEFAULT_TASK, TASKS
    from autotune.modes import ALLOWED_MODE_NAMES, DEFAULT_MODE_NAMES
    from autotune.search import DEFAULT_MAX_BATCH, METHODS
    from autotune.step import ATTN_CHOICES, OPTIMIZERS
    from autotune.tuner import DEFAULT_MARGIN, DEFAULT_SEQ_LENS

    parser = argparse.ArgumentParser(
        prog="autotune",
        description="The largest training batch that fits in GPU memory, per sequence length.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    table = sub.add_parser("table", help="max batch size table for a model")
    table.add_argument("model", help="preset name, local config dir/file, or hub id")
    table.add_argument("--seq-lens", type=_int_list, default=list(DEFAULT_SEQ_LENS),
                       help="comma-separated sequence lengths (default: %(default)s)")
    table.add_argument("--modes", default=",".join(DEFAULT_MODE_NAMES),
                       help=f"comma-separated modes from {', '.join(ALLOWED_MODE_NAMES)} "
                       "(default: %(default)s)")
    table.add_argument("--task", default=DEFAULT_TASK, choices=TASKS)
    table.add_argument("--attn", choices=ATTN_CHOICES, default=None,
                       help="attention implementation (default: what transformers picks on CUDA)")
    target = table.add_mutually_exclusive_group()
    target.add_argument("--gpu-memory", help="total memory of the target card, e.g. 12GiB")
    target.add_argument("--gpu", help="GPU preset, e.g. T4, A100-80GB (see `autotune gpus`)")
    table.add_argument("--backend", default="auto", choices=("auto", "cuda", "estimate"))
    table.add_argument("--margin", type=_fraction, default=DEFAULT_MARGIN,
                       help="fraction of the allocator's memory kept free (default: %(default)s)")
    table.add_argument("--search", default="guided", choices=METHODS)
    table.add_argument("--max-batch", type=_positive, default=DEFAULT_MAX_BATCH)
    table.add_argument("--optimizer", default="adamw", choices=OPTIMIZERS)
    table.add_argument("--json", action="store_true", help="print one JSON document")
    check = sub.add_parser("check", help="CI gate: exit 0 if a planned step fits, 1 if not")
    check.add_argument("model", nargs="?", help="as for `table` (or from --from-config)")
    check.add_argument("--seq-len", type=_positive)
    check.add_argument("--batch-size", type=_positive)
    check.add_argument("--mode", default=None, help=f"one of {', '.join(ALLOWED_MODE_NAMES)} (default fp32)")
    check.add_argument("--task", default=DEFAULT_TASK, choices=TASKS)
    check.add_argument("--attn", choices=ATTN_CHOICES, default=None)
    check_target = check.add_mutually_exclusive_group()
    check_target.add_argument("--gpu-memory", help="total memory of the target card, e.g. 12GiB")
    check_target.add_argument("--gpu", help="GPU preset, e.g. T4")
    check.add_argument("--backend", default="auto", choices=("auto", "cuda", "estimate"))
    check.add_argument("--margin", type=_fraction, default=DEFAULT_MARGIN)
    check.add_argument("--optimizer", default="adamw", choices=OPTIMIZERS)
    check.add_argument("--server", default=None,
                       help="answer from an autotune service (default: $AUTOTUNE_SERVER; none: local)")
    check.add_argument("--from-config", default=None, metavar="FILE",
                       help="TrainingArguments JSON or a YAML/JSON of model, seq_len, batch_size, mode")
    check.add_argument("--json", action="store_true")
    from autotune.explain_cli import add_parser as add_explain_parser

    add_explain_parser(sub)
    sub.add_parser("models", help="list the offline model presets")
    sub.add_parser("gpus", help="list the GPU presets")
    serve.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "serve":
            return serve.run(args)
        if args.command == "table":
            return _table(args)
        if args.command == "explain":
            from autotune.explain_cli import run as run_explain

            return run_explain(args)
        if args.command == "check":
            from autotune.check_cli import run_check

            return run_check(args)
        if args.command == "models":
            from autotune.models import PRESETS

            print("\n".join(sorted(PRESETS)))
            return EXIT_OK
        if args.command == "gpus":
            from autotune.gpus import GPU_PRESETS

            for name, spec in GPU_PRESETS.items():
                print(f"{name:14} {format_bytes(spec.total_memory_bytes)}")
            return EXIT_OK
    except AutotuneError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    parser.error(f"unknown command {args.command}")
    return EXIT_ERROR


def _table(args: argparse.Namespace) -> int:
    from autotune.backends import make_backend
    from autotune.models import check_seq_len, resolve_model
    from autotune.modes import parse_modes
    from autotune.tuner import tune_table
    from autotune.workload import Workload

    modes = parse_modes(args.modes)
    spec = resolve_model(args.model)
    for seq_len in args.seq_lens:  # fail before any model is built
        check_seq_len(spec, seq_len)
    backend, gpu = make_backend(args.backend, args.gpu, args.gpu_memory)
    workload = Workload(spec, args.task, args.attn, args.optimizer)
    progress = Progress(sys.stderr)
    with warnings.catch_warnings():
        # transformers' deprecation notices would break the progress line.
        warnings.simplefilter("ignore", FutureWarning)
        from transformers.utils import logging as transformers_logging

        transformers_logging.set_verbosity_error()
        table = tune_table(
            workload, backend, gpu, seq_lens=args.seq_lens, modes=modes, margin=args.margin,
            method=args.search, max_batch=args.max_batch, on_cell=progress.update,
        )
    progress.close()
    if args.json:
        print_json(table.to_dict())
    else:
        sys.stdout.write(render_table(table))
    return EXIT_OK if all(c.error is None for c in table.cells) else EXIT_ERROR


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


class Progress:
    """A one-line progress bar on stderr (a line per cell when stderr is not a terminal)."""

    WIDTH = 24

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream
        self.tty = stream.isatty()

    def update(self, cell: CellResult, done: int, total: int) -> None:
        filled = self.WIDTH * done // total
        bar = "#" * filled + "-" * (self.WIDTH - filled)
        answer = "error" if cell.error else cell.max_batch_size
        text = (f"[{bar}] {done}/{total} {cell.mode} seq {cell.seq_len}: max batch {answer} "
                f"({cell.probes} probes)")
        if self.tty:
            self.stream.write("\r" + text.ljust(78))
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


def render_table(t: TableResult) -> str:
    """The readable table: rows are sequence lengths, columns modes, cells the max batch."""
    lines = [
        f"{t.model} ({t.task}, attention {t.attn}, {t.optimizer}) on {t.gpu_name}"
        + ("" if t.gpu_name.startswith("custom") else f" {format_bytes(t.gpu_memory_bytes)}"),
        f"backend {t.backend}; budget {format_bytes(t.budget_bytes)} for PyTorch = "
        f"(card - {format_bytes(t.context_overhead_bytes)} CUDA context) x (1 - margin {t.margin})",
        "",
        "max batch size per sequence length:",
    ]
    modes = t.modes
    width = max(10, *(len(m) + 2 for m in modes))
    lines.append("seq_len".rjust(8) + "".join(m.rjust(width) for m in modes))
    for seq_len in t.seq_lens:
        row = str(seq_len).rjust(8)
        for mode in modes:
            cell = t.cell(mode, seq_len)
            if cell is None or cell.error:
                value = "error"
            else:
                value = f"{cell.max_batch_size}{'+' if cell.capped else ''}"
            row += value.rjust(width)
        lines.append(row)
    lines.append("")
    if any(c.capped for c in t.cells):
        lines.append(f"+ reached --max-batch {t.max_batch}; more may fit")
    for cell in t.cells:
        if cell.error:
            lines.append(f"error at {cell.mode} seq {cell.seq_len}: {cell.error}")
    per_cell = t.total_probes / max(1, len(t.cells))
    lines.append(f"{t.total_probes} probes for {len(t.cells)} cells ({per_cell:.2f} per cell, "
                 f"search {t.search}), {t.elapsed_s:.1f} s")
    if t.backend == "estimate":
        lines.append("estimated on the CPU: what the training step would allocate on CUDA")
    return "\n".join(lines) + "\n"
