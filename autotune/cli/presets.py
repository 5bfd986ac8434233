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
    from autotune.workload.presets import PRESETS

    print("\n".join(sorted(PRESETS)))
    return EXIT_OK


def run_gpus(args: argparse.Namespace) -> int:
    from autotune.gpus import GPU_PRESETS

    for name, spec in GPU_PRESETS.items():
        print(f"{name:14} {format_bytes(spec.total_memory_bytes)}")
    return EXIT_OK
