"""``autotune explain``: where the memory of a training step goes, and what each lever would buy.

    autotune explain MODEL [--seq-len N] [--batch-size B] [--mode M] [--gpu NAME | --gpu-memory SIZE]
                           [--task T] [--dtype D] [--optimizer O] [--attn A] [--loss L] [--margin F]
                           [--backend estimate] [--no-levers] [--hub] [--json]
                           [--lengths FILE | --texts FILE [--text-column NAME[,NAME]] [--tokenizer DIR]]

Dynamic padding needs the token lengths of the data: ``--lengths FILE`` (one count a line), or
``--texts FILE`` (.csv, .tsv, .jsonl/.jsonlines, or .txt with one text a line) tokenized by the
tokenizer in a local directory (``--tokenizer DIR``, default MODEL when it is a directory; the
network is never used). ``--text-column`` names the column (key) of the text, or a pair such as
``question,context`` tokenized as ``tokenizer(question, context)``; it may be left out when the
file has one column. A length counts special tokens and is never truncated.

Exit 0 with the explanation (also when the batch does not fit: that is what it explains),
2 with ``Error: ...`` on bad input or an error.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune import public
from autotune.analysis.check import also_fits_note
from autotune.analysis.explain import category_labels
from autotune.cli.common import (
    EXIT_OK,
    MODEL_HELP,
    NAMES_AND_SIZES,
    add_fields,
    add_request,
    positive,
    prestart_estimator_workers,
    print_json,
    quiet_transformers,
    report_error,
    request_of,
)
from autotune.defaults import EXPLAIN_BACKEND
from autotune.errors import AutotuneError, InvalidInput
from autotune.request import ExplainRequest
from autotune.units import format_bytes
from autotune.workload.offload import NAME as OFFLOAD_NAME
from autotune.workload.offload import SINGLE_STREAM_NAME
from autotune.workload.zero import host_note

if TYPE_CHECKING:
    from autotune.analysis.explain import Explanation
    from autotune.analysis.padding import PaddingReport

TOP = 5  # modules per table in the text report (--json has explain.TOP_MODULES)


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``explain`` subcommand to ``autotune``'s subparsers."""
    parser = subparsers.add_parser(
        "explain", help="where the memory goes at a batch, and the max batch under each lever",
        description="Where the memory of a training step goes, and what each lever would buy.",
        epilog=NAMES_AND_SIZES)
    parser.add_argument("model", help=MODEL_HELP)
    add_fields(parser, ExplainRequest, ("seq_len", "batch_size", "mode"))
    add_request(parser, ExplainRequest, choices={"backend": (EXPLAIN_BACKEND,)})
    data = parser.add_mutually_exclusive_group()
    data.add_argument("--lengths", default=None, metavar="FILE",
                      help="token lengths of the data, one per line: percentiles and dynamic padding")
    data.add_argument("--texts", default=None, metavar="FILE",
                      help="texts of the data (.csv, .tsv, .jsonl, .jsonlines, or .txt: one a line), "
                      "tokenized locally for the same report as --lengths")
    parser.add_argument("--text-column", default=None, metavar="NAME[,NAME]",
                        help="column (key) of the text in --texts, or a pair as question,context "
                        "(default: the only column)")
    parser.add_argument("--tokenizer", default=None, metavar="DIR",
                        help="local directory of the tokenizer for --texts (default: MODEL, when it is "
                        "a directory); never downloaded")
    parser.add_argument("--no-levers", action="store_true", help="skip the what-if searches")
    parser.add_argument("--workers", type=positive, default=None, metavar="N",
                        help="the levers are searched in N processes at once, the same answers (default: "
                        "up to the usable CPU cores, for models of 10M parameters or more; 1: one process)")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    return parser


def run(args: argparse.Namespace) -> int:
    try:
        explanation = _explain(args)
    except AutotuneError as exc:
        return report_error(exc, as_json=args.json)
    if args.json:
        print_json(explanation.to_dict())
    else:
        sys.stdout.write(render(explanation))
    return EXIT_OK


def _explain(args: argparse.Namespace) -> Explanation:
    from autotune import parallel
    from autotune.analysis.levers import LEVERS_AT_MOST

    if not args.no_levers:  # their workers import torch while this process does (parallel.py)
        prestart_estimator_workers(args.backend or EXPLAIN_BACKEND, args.model, args.workers,
                                   jobs=LEVERS_AT_MOST)
    try:
        with quiet_transformers():
            lengths = _lengths(args)
            request = request_of(ExplainRequest, args, model=args.model, levers=not args.no_levers,
                                 lengths=None if lengths is None else tuple(lengths))
            return public.run_explain(request)
    finally:
        parallel.stop_prestarted()


def _lengths(args: argparse.Namespace) -> list[int] | None:
    """The token lengths from --lengths or --texts; None without either."""
    from autotune.analysis.padding import read_lengths
    from autotune.analysis.texts import lengths_from_texts

    if args.texts is None and (args.text_column is not None or args.tokenizer is not None):
        raise InvalidInput("--text-column and --tokenizer go with --texts FILE")
    if args.lengths is not None:
        return read_lengths(args.lengths)
    if args.texts is None:
        return None
    tokenizer = args.tokenizer
    if tokenizer is None:
        if not Path(args.model).is_dir():
            raise InvalidInput(f"--texts needs a tokenizer: give --tokenizer DIR, a local directory with the "
                               f"tokenizer's files ({args.model!r} is not a local directory)")
        tokenizer = args.model
    return lengths_from_texts(args.texts, args.text_column, tokenizer)


# -- the text report ------------------------------------------------------------------------------


def _gpu(e: Explanation) -> str:
    if e.gpu_name.startswith("custom"):
        return e.gpu_name
    return f"{e.gpu_name} ({format_bytes(e.gpu_memory_bytes)})"


def _pct(part: float, whole: float) -> str:
    return f"{100 * part / whole:5.1f}%" if whole else "     -"


def render(e: Explanation) -> str:
    """The readable report: the breakdown, modules, flags, levers, dynamic padding."""
    b = e.breakdown
    lines = [
        f"{e.model}, seq {e.seq_len}, {e.mode} on {_gpu(e)}",
        f"step: task {e.task}, weights {e.weights_dtype}, optimizer {e.optimizer}, attention {e.attn}"
        f"{f' ({e.attention_kernel})' if e.attention_kernel else ''}, loss {e.loss}",
        *([f"adapter: {e.adapter['label']}"] if e.adapter is not None else []),
        *([e.compiled] if e.compiled is not None else []),
        *([f"images: {e.images['label']}"] if e.images is not None else []),
        *([f"{OFFLOAD_NAME if e.offload_streams else SINGLE_STREAM_NAME}: saved activations in pinned "
           f"host memory, at most {format_bytes(e.host_offload_bytes)} at batch {e.batch_size}"]
          if e.host_offload_bytes is not None else []),
        *([f"trainer: {e.trainer['label']}"] if e.trainer is not None else []),
        *([f"  the reference model's frozen weights: {format_bytes(e.trainer['reference_weight_bytes'])} "
           "of the parameters and buffers below"]
          if e.trainer is not None and "reference_weight_bytes" in e.trainer else []),
        *_grpo_lines(e.trainer),
        *_job_lines(e),
        f"budget {format_bytes(e.budget_bytes)} for PyTorch = (card - {format_bytes(b.context_bytes)} "
        f"CUDA context{_nccl(e)}{_vllm(e.trainer)}) x (1 - margin {e.margin})",
        f"max batch {e.max_batch_size}{'+' if e.capped else ''} (estimated); " + _which_batch(e),
    ]
    if e.also_fits is not None:
        lines.append(f"note: {also_fits_note(e.max_batch_size, e.also_fits)}")
    if e.does_not_fit:
        lines.append(e.does_not_fit)
    lines += ["", f"peak of the step at batch {e.batch_size}: {format_bytes(b.peak_allocated_bytes)} "
                  f"allocated, in the {b.peak_phase} of step {b.peak_step}"]
    labels = category_labels(e.adapter, e.parallel)
    w = max([32] + [len(label) + 2 for label in labels.values()])
    for kind, label in labels.items():
        nbytes = b.categories.get(kind, 0)
        lines.append(f"  {label:{w}}{format_bytes(nbytes):>12}  {_pct(nbytes, b.peak_allocated_bytes)}")
    verdict = "fits" if b.fits else "does not fit"
    lines += [
        f"  {'= peak allocated':{w}}{format_bytes(b.peak_allocated_bytes):>12}",
        f"  {'+ cached, not in use at the peak':{w}}{format_bytes(b.cached_bytes):>12}",
        f"  {'= PyTorch needs':{w}}{format_bytes(b.demand_bytes):>12}  of the "
        f"{format_bytes(b.budget_bytes)} budget: {verdict}",
        f"  {'+ CUDA context':{w}}{format_bytes(b.context_bytes):>12}  (outside PyTorch's allocator)",
        *([f"  {'+ NCCL buffers':{w}}{format_bytes(nccl):>12}  (outside it too, from NCCL's source)"]
          if (nccl := 0 if e.parallel is None else int(e.parallel.get("nccl_bytes") or 0)) else []),
        "",
        f"largest modules by parameters ({e.total_params:,} in all{_shards(e)}):",
    ]
    params, acts = e.top_parameters[:TOP], e.top_activations[:TOP]
    width = max([len(row.name) for row in params] + [len(a.name) for a in acts] + [8])
    for row in params:
        lines.append(f"  {row.name or '(model)':{width}}  {row.description[:40]:40} {row.params:>13,} "
                     f"{format_bytes(row.param_bytes):>11} {row.share:6.1%}")
    lines.append(f"largest modules by activations saved for backward (batch {e.batch_size}):")
    for act in acts:
        shape = " x ".join(map(str, act.output_shape)) if act.output_shape else "?"
        what = act.type if act.type and not act.output_shape else f"{act.type} -> {shape}"
        lines.append(f"  {act.name or '(model)':{width}}  {what:54} "
                     f"{format_bytes(act.activation_bytes):>11} {act.share:6.1%}")
    if e.flags:
        lines += ["", "flags:"] + [f"  ! {flag.message}" for flag in e.flags]
    if e.levers:
        lines += ["", f"what would fit at seq {e.seq_len} on {_gpu(e)} (now: max batch {e.max_batch_size}):"]
        lines += [_lever_line(lever, e.max_batch_size) for lever in e.levers]
    if e.risks:
        lines += ["", *_risk_lines(e)]
    if e.padding is not None:
        lines += ["", *_padding_lines(e.padding)]
    return "\n".join(lines) + "\n"


def _job_lines(e: Explanation) -> list[str]:
    """A multi-GPU job's line: what it is, and that every figure is one GPU's."""
    if e.parallel is None:
        return []
    lines = [f"job: {e.parallel['label']}; every figure below is one GPU's (rank 0), the batch its "
             "micro-batch"]
    if str(e.parallel["kind"]).startswith("zero"):  # no allocation regions in deepspeed.py yet
        lines.append("ZeRO's own buffers (its flat 16-bit and float32 partitions, gradient buckets, "
                     "stage 3's gathers) are not told apart yet: they are counted under the categories "
                     "below as the tracker meets them (parameters, temporaries); the total is the traced "
                     "engine's")
    if e.host_memory_bytes:
        lines.append(f"{host_note(e.host_memory_bytes, e.parallel)}; not in the GPU's figures below")
    return lines


def _nccl(e: Explanation) -> str:
    nccl = 0 if e.parallel is None else int(e.parallel.get("nccl_bytes") or 0)
    return f" - {format_bytes(nccl)} NCCL buffers" if nccl else ""


def _shards(e: Explanation) -> str:
    """Under fsdp the table's sizes are whole modules, of which each GPU holds a shard."""
    if e.parallel is None or e.parallel["kind"] != "fsdp":
        return ""
    where = "in host memory (CPU offload)" if e.parallel.get("offload_params") else "on a GPU"
    version = e.parallel.get("fsdp_version") or 2
    return f"; whole modules: FSDP{version} keeps 1/{e.parallel['shard_size']} of each {where}"


def _which_batch(e: Explanation) -> str:
    if e.max_batch_size == 0:
        return "explained at batch 1"
    if e.requested_batch_size is None:
        return f"explained at batch {e.batch_size}, the max"
    return f"batch {e.batch_size} {'fits' if e.fits else 'does not fit'}"


LEVER_LABEL_WIDTH = 58


def _lever_line(lever: Any, now: int) -> str:
    """A lever's line; a label too long for its column has a line of its own, never cut."""
    if len(lever.label) > LEVER_LABEL_WIDTH:
        return f"  {lever.label}\n" + _lever_line(replace(lever, label=""), now)
    label = f"  {lever.label:{LEVER_LABEL_WIDTH}}"
    if lever.max_batch_size is None:
        return f"{label} n/a: {lever.error}"
    if lever.name == "accumulation":
        return f"{label} {lever.note}"
    change = f"{(lever.max_batch_size - now) / now:+.0%}" if now else ""
    text = f"{label} {lever.max_batch_size:>7}{'+' if lever.capped else ' '} {change:>6}"
    notes = [n for n in (None if lever.estimated == "as the table" else lever.estimated, lever.note) if n]
    return text + (f"  ({'; '.join(notes)})" if notes else "")


def _risk_lines(e: Explanation) -> list[str]:
    """What could make batch N run out of memory on some runs: each risk with the max it leaves,
    those that break batch N marked; the headroom first."""
    b = e.breakdown
    headroom = b.budget_bytes - b.demand_bytes
    broken = sum(risk.breaks for risk in e.risks)
    lines = [f"why batch {e.batch_size} could run out of memory on some runs and not others "
             f"(headroom {format_bytes(max(headroom, 0))}, {max(headroom, 0) / b.budget_bytes:.0%} of the "
             f"budget; {broken} of these would break it, marked !):"]
    for risk in e.risks:
        mark = "!" if risk.breaks else " "
        if risk.max_batch_size is None:
            answer = f"n/a: {risk.error}" if risk.error else ""
        else:
            answer = f"max {risk.max_batch_size}"
        lines.append(f"  {mark} {risk.label}" + (f": {answer}" if answer else ""))
    return lines


def _padding_lines(p: PaddingReport) -> list[str]:
    s = p.stats
    cut = f"; {s.truncated:,} longer than {p.seq_len}, truncated" if s.truncated else ""
    lines = [f"dynamic padding ({s.count:,} lengths; mean {s.mean:.1f}, p50 {s.p50}, p90 {s.p90}, "
             f"p99 {s.p99}, max {s.max}{cut}):",
             f"  fixed padding to {p.seq_len}: batch {p.fixed_max_batch}, {_steps(p.fixed_steps)}, "
             f"{p.fixed_padding:.0%} of positions are padding"]
    for bucket in p.buckets:
        lines.append(f"  bucket <= {bucket.max_len:>5}: {bucket.share:6.1%} of sequences, "
                     f"batch {bucket.max_batch_size}")
    lines.append(f"  bucketed by length: {_steps(p.bucketed_steps)}, {p.bucketed_padding:.0%} of "
                 "positions are padding")
    return lines


def _steps(steps: int | None) -> str:
    if steps is None:
        return "does not fit"
    return f"{steps:,} step{'s' if steps != 1 else ''} per epoch"


def _grpo_lines(trainer: dict[str, Any] | None) -> list[str]:
    """A GRPO step's phases, its generation cache, a colocated vLLM engine's share, and the levers."""
    grpo = None if trainer is None else trainer.get("grpo")
    if not grpo or grpo.get("training_peak_allocated_bytes") is None:
        return []
    lines = [f"  generation of {grpo['generation_rows']} completions: peak "
             f"{format_bytes(grpo['generation_peak_allocated_bytes'] or 0)} allocated; training step: peak "
             f"{format_bytes(grpo['training_peak_allocated_bytes'])} (the job's peak is the larger)"]
    if grpo.get("generation_cache_bytes"):
        cache = format_bytes(grpo["generation_cache_bytes"])
        lines.append(f"  generation cache (KV, emulated decode): {cache}, all completions at full length")
    if grpo.get("vllm_bytes"):
        share = format_bytes(grpo["vllm_bytes"])
        lines.append(f"  colocated vLLM engine: {share} of the GPU, off the budget")
    lines.append("  levers: fewer generations per prompt (num_generations) or steps_per_generation, shorter "
                 "completions (max_completion_length), vLLM server mode on another GPU")
    return lines


def _vllm(trainer: dict[str, Any] | None) -> str:
    """The budget's colocated vLLM engine (GRPO), where there is one."""
    share = ((trainer or {}).get("grpo") or {}).get("vllm_bytes")
    return f" - {format_bytes(share)} colocated vLLM" if share else ""

