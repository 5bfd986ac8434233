"""``autotune models`` and ``autotune gpus``: the offline presets a name can stand for."""

from __future__ import annotations

import argparse
from typing import Any

from autotune.cli.common import EXIT_OK
from autotune.units import format_bytes


def add_parsers(subparsers: Any) -> None:
    """Add the ``models`` and ``gpus`` subcommands to ``autotune``'s subparsers."""
    subparsers.add_parser("models", help="list the offline model presets")
    subparsers.add_parser("gpus", help="list the GPU presets")


def run_models(args: argparse.Namespace) -> int:
    """One preset a line: its name, the task and weights dtype a table defaults to, its positions."""
    from autotune.cli.common import quiet_transformers
    from autotune.workload.models import infer_task, resolve_dtype, resolve_model
    from autotune.workload.presets import PRESETS

    names = sorted(PRESETS, key=str.lower)
    width = max(map(len, names))
    with quiet_transformers():
        for name in names:
            spec = resolve_model(name, allow_local=False, allow_hub=False)
            print(f"{name:{width}}  {infer_task(spec.config)[0]:23}  {resolve_dtype(spec):8}  "
                  f"{spec.max_seq_len} positions")
    return EXIT_OK


def run_gpus(args: argparse.Namespace) -> int:
    from autotune.gpus import GPU_PRESETS

    for name, spec in GPU_PRESETS.items():
        print(f"{name:14} {format_bytes(spec.total_memory_bytes)}")
    return EXIT_OK
