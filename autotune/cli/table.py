"""``autotune table``: the max batch size of each sequence length and mode.

    autotune table MODEL [--seq-lens 64,128,...] [--modes fp32,amp,ckpt,amp+ckpt] [--task T]
                         [--dtype auto|float32|bfloat16|float16] [--optimizer NAME]
                         [--attn sdpa|eager|flash_attention_2|kernels-community/vllm-flash-attn3|
                                 flex_attention]
                     [--loss full|chunked|cce|chunked_nll|dft|eaft|diffusion|axolotl_eaft]
                         [--peft none|lora|qlora] [--lora-r R] [--lora-alpha A] [--lora-dropout P]
                         [--lora-targets M,M|all-linear] [--peft-config PATH] [--load-in-4bit]
                         [--gpu-memory SIZE | --gpu NAME] [--backend auto|cuda|estimate]
                         [--margin F] [--search guided|bisect] [--no-seed-with-estimate]
                         [--workers N] [--max-batch N] [--hub] [--json]

Exit 0 with the table, 2 with ``Error: ...`` on bad input or when a cell failed.
"""

from __future__ import annotations

import argparse
import sys
from typing import IO, TYPE_CHECKING, Any

from autotune import public
from autotune.cli.common import (
    EXIT_ERROR,
    EXIT_OK,
    MODEL_HELP,
    NAMES_AND_SIZES,
    add_fields,
    add_request,
    positive,
    prestart_estimator_workers,
    print_json,
    quiet_transformers,
    request_of,
)
from autotune.defaults import DEFAULT_BACKEND, DEFAULT_MODE_NAMES
from autotune.errors import AutotuneError
from autotune.request import TableRequest
from autotune.units import format_bytes
from autotune.workload.liger import describe as describe_liger
from autotune.workload.modes import parse_mode
from autotune.workload.offload import NAME as OFFLOAD_NAME
from autotune.workload.offload import SINGLE_STREAM_NAME
from autotune.workload.support import weights_label
from autotune.workload.zero import host_note

if TYPE_CHECKING:
    from autotune.tuner import CellResult, TableResult


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``table`` subcommand to ``autotune``'s subparsers."""
    table = subparsers.add_parser("table", help="max batch size table for a model",
                                  description="The max batch size of each sequence length and mode.",
                                  epilog=NAMES_AND_SIZES)
    table.add_argument("model", help=MODEL_HELP)
    add_fields(table, TableRequest, ("seq_lens", "modes"))
    add_request(table, TableRequest)
    add_fields(table, TableRequest, ("search",))
    table.add_argument("--no-seed-with-estimate", dest="seed_with_estimate", action="store_false",
                       help="backend cuda: search each cell on the GPU without first asking the "
                       "estimator where its limit is (default: seeded, two GPU probes per cell "
                       "where the estimate is right)")
    table.add_argument("--workers", type=positive, default=None, metavar="N",
                       help="backend estimate: the modes run in N processes at once, the same answers "
                       "(default: one per mode, up to the usable CPU cores, for models of 10M "
                       "parameters or more; 1: one process)")
    add_fields(table, TableRequest, ("max_batch",))
    table.add_argument("--json", action="store_true", help="print one JSON document")
    return table


def run(args: argparse.Namespace) -> int:
    """Library errors propagate: ``autotune``'s main prints them (exit 2)."""
    from autotune import parallel

    progress = Progress(sys.stderr)
    prestart_workers(args)
    try:
        with quiet_transformers():  # its notices would break the progress line
            request = request_of(TableRequest, args)
            table = public.run_table(request, on_cell=progress.update)
    finally:
        parallel.stop_prestarted()
    progress.close()
    if args.json:
        print_json(table.to_dict())
    else:
        sys.stdout.write(render_table(table))
    return EXIT_OK if all(c.error is None for c in table.cells) else EXIT_ERROR


def prestart_workers(args: argparse.Namespace) -> int:
    """Start the worker processes the table will take (parallel.py) before this process imports
    torch, where that is known without importing it (common.prestart_estimator_workers): a table of
    several modes. Returns how many were started."""
    from autotune.workload.modes import parse_modes

    try:
        # without --modes, those of the weights (2 or 4, defaults.default_mode_names): the float32 ones
        # stand in, the dtype being known once the config is read
        modes = len(parse_modes(args.modes or list(DEFAULT_MODE_NAMES)))
    except AutotuneError:  # the table says what is wrong
        return 0
    return prestart_estimator_workers(args.backend or DEFAULT_BACKEND, args.model, args.workers,
                                      jobs=modes if modes > 1 else 0)


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
    loss = "" if t.loss == "full" else f", {t.loss} loss"
    if t.ckpt_reentrant and any(parse_mode(mode).checkpointing for mode in t.modes):
        loss += ", reentrant checkpointing"
    if t.liger:
        loss += f", {describe_liger(t.liger)}"
    if t.offload_activations:
        loss += f", {OFFLOAD_NAME if t.offload_streams else SINGLE_STREAM_NAME}"
    lines = [
        f"{t.model} ({t.task}, {weights_label(t.weights_dtype)}, {t.optimizer}, attention {t.attn}"
        f"{loss}) on {t.gpu_name}"
        + ("" if t.gpu_name.startswith("custom") or format_bytes(t.gpu_memory_bytes) in t.gpu_name
           else f" {format_bytes(t.gpu_memory_bytes)}"),
        *([f"adapter: {t.adapter['label']}"] if t.adapter else []),
        *([f"images: {t.images['label']}"] if t.images else []),
        *([f"trainer: {t.trainer['label']}"] if t.trainer else []),
        *([f"GPUs: {t.parallel['label']}; each cell is one GPU's micro-batch (global batch = it x "
           f"{t.parallel['gpus']} GPUs x accumulation steps)", f"  {t.parallel['modelled']}"]
          if t.parallel else []),
        f"backend {t.backend}; budget {format_bytes(t.budget_bytes)} for PyTorch = "
        f"(card - {format_bytes(t.context_overhead_bytes)} CUDA context"
        + (f" - {format_bytes(t.parallel['nccl_bytes'])} NCCL buffers" if t.parallel else "")
        + f") x (1 - margin {t.margin})",
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
    if t.weights_dtype != "float32":
        lines.append(_columns_over_weights(t, [str(mode) for mode in modes]))
    cudnn = [mode for mode in modes if any("cuDNN" in str(probe.get("attention", ""))
                                           for c in t.cells if c.mode == mode for probe in c.probe_log)]
    if cudnn:
        lines.append(f"attention: SDPA runs cuDNN on this card for {', '.join(cudnn)}, as PyTorch 2.11+ with "
                     "CUDA 13 does (TORCH_CUDNN_SDPA_DEPRIORITIZED=1 models its other kernels)")
    if str(t.environment.get("chip", "")).startswith("unknown"):
        lines.append(f"chip: {t.environment['chip']}")
    if t.environment.get("alloc_conf"):  # the classic segments are PyTorch's default: said only otherwise
        lines.append(f"allocator: {t.environment.get('allocator') or 'as set'} "
                     f"(PYTORCH_ALLOC_CONF={t.environment['alloc_conf']})")
    if any(c.capped for c in t.cells):
        lines.append(f"+ reached --max-batch {t.max_batch}; more may fit")
    holes = [f"  {c.mode} seq {c.seq_len}: batch {c.also_fits} also fits, {c.max_batch_size + 1} runs out"
             for c in t.cells if c.also_fits is not None and c.max_batch_size is not None]
    if holes:
        lines.append("past the first batch that runs out of memory a larger one fits too (the caching "
                     "allocator fragments differently at the two sizes); each max is below that batch:")
        lines.extend(holes)
    for cell in t.cells:
        if cell.error:
            lines.append(f"error at {cell.mode} seq {cell.seq_len}: {cell.error}")
    per_cell = t.total_probes / max(1, len(t.cells))
    seeded = ", seeded by the estimator" if t.environment.get("seeded_by") else ""
    lines.append(f"{_count(t.total_probes, 'probe')} for {_count(len(t.cells), 'cell')} "
                 f"({per_cell:.2f} per cell, search {t.search}{seeded}), {t.elapsed_s:.1f} s")
    host = max((int(probe.get("host_bytes") or 0) for c in t.cells for probe in c.probe_log), default=0)
    if host:
        lines.append(host_note(host, t.parallel))
    if t.backend == "estimate":
        lines.append("estimated on the CPU: what the training step would allocate on CUDA")
    lines.extend(f"warning: {warning}" for warning in t.warnings)
    if t.outside_allocator_bytes:
        from autotune.analysis.check import paged_note

        lines.append(f"note: {paged_note(t.optimizer, t.outside_allocator_bytes)}")
    return "\n".join(lines) + "\n"


def _count(count: int, noun: str) -> str:
    """``1 cell``, ``2 cells``."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _columns_over_weights(t: TableResult, modes: list[str]) -> str:
    """What the columns of a table over 16-bit weights are: the modes without autocast train the
    weights as they are, the others autocast (under FSDP2: its mixed-precision policy) over them."""
    plain = [mode for mode in modes if mode in ("fp32", "ckpt")]
    cast = [mode for mode in modes if mode not in plain]
    sharded = t.parallel is not None and t.parallel["kind"] == "fsdp"
    parts = []
    if plain:
        one = len(plain) == 1
        how = (f"train{'s' if one else ''} them as they are, with no mixed-precision policy" if sharded else
               f"{'is' if one else 'are'} the step without autocast over {weights_label(t.weights_dtype)}")
        parts.append(f"{' and '.join(plain)} {how}")
    if cast:
        one = len(cast) == 1
        how = (f"run{'s' if one else ''} FSDP2's MixedPrecisionPolicy of the mode's dtype (no autocast)"
               if sharded else f"autocast{'s' if one else ''} on top of them")
        parts.append(f"{', '.join(cast)} {how}")
    return f"weights in {t.weights_dtype}: {'; '.join(parts)}"
