"""``autotune check``: exit 0 if the planned step fits, 1 if not, 2 on bad input or an error.

    autotune check MODEL --seq-len N --batch-size B [--mode M] [--task T] [--dtype D]
                   [--optimizer O] [--attn A] [--loss L] [--peft lora|qlora] [--lora-r R] ...
                   [--gpu-memory SIZE | --gpu NAME]
                   [--backend B] [--margin F] [--server URL] [--hub] [--no-cache] [--json]
    autotune check --from-config training_args.json|sft_config.json|axolotl.yml [--gpu T4]

A training config is read whole (analysis/training_config.py): a setting that changes memory
and that autotune does not model (DeepSpeed, FSDP, 8-bit loading, DoRA, ...) is an error naming
the key, never a verdict for another job. LoRA and QLoRA settings (Axolotl's adapter, TRL's
use_peft and lora_*, a PEFT adapter directory) are modelled; PEFT flags given here win over them.

``--server URL`` (or AUTOTUNE_SERVER) asks an autotune service (``GET /v1/check``) instead of
computing locally.
"""

from __future__ import annotations

import argparse
import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

import autotune
from autotune.cli.common import (
    MODEL_HELP,
    NAMES_AND_SIZES,
    add_backend,
    add_hub,
    add_margin,
    add_peft,
    add_step,
    add_target,
    peft_kwargs,
    positive,
    prestart_estimator_workers,
    print_json,
    quiet_transformers,
    report_error,
)
from autotune.defaults import (
    DEFAULT_DTYPE,
    DEFAULT_LOSS,
    DEFAULT_MODE_NAME,
    DEFAULT_OPTIMIZER,
)
from autotune.errors import AutotuneError, InvalidInput
from autotune.units import parse_bytes

EXIT_FITS, EXIT_DOES_NOT_FIT = 0, 1  # errors exit 2 through common.report_error
SERVER_TIMEOUT_S = 600.0  # the service may have to compute a missing cell first
# How many lever searches the command starts workers for before it imports torch: a step that does
# not fit has 3 to 7 (analysis/check.py: lighter modes, checkpointing, 8-bit AdamW, chunked loss,
# LoRA, QLoRA); more are started once the levers are known, where there are cores for them.
EARLY_LEVER_JOBS = 3


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``check`` subcommand to ``autotune``'s subparsers."""
    from autotune.workload.modes import ALLOWED_MODE_NAMES

    check = subparsers.add_parser("check", help="CI gate: exit 0 if a planned step fits, 1 if not",
                                  description="Exit 0 if the planned training step fits, 1 if not, "
                                  "2 on bad input or an error.", epilog=NAMES_AND_SIZES)
    check.add_argument("model", nargs="?", help=f"{MODEL_HELP} (or from --from-config)")
    check.add_argument("--seq-len", type=positive, metavar="N",
                       help="sequence length of the step, in tokens (or from --from-config)")
    check.add_argument("--batch-size", type=positive, metavar="B",
                       help="per-device batch size of the step (or from --from-config)")
    check.add_argument("--mode", default=None,
                       help=f"one of {', '.join(ALLOWED_MODE_NAMES)} (default {DEFAULT_MODE_NAME})")
    add_step(check)
    add_peft(check)
    add_target(check, gpu_help="GPU preset, e.g. T4 (see `autotune gpus`)")
    add_backend(check)
    add_margin(check)
    check.add_argument("--server", default=None,
                       help="answer from an autotune service (default: $AUTOTUNE_SERVER; none: local); "
                       "the service decides on hub ids (its AUTOTUNE_ALLOW_HUB)")
    check.add_argument("--from-config", default=None, metavar="FILE",
                       help="a Hugging Face TrainingArguments JSON, a TRL SFTConfig, an Axolotl "
                       "YAML, or a YAML/JSON of model, seq_len, batch_size, mode; flags win")
    check.add_argument("--workers", type=positive, default=None, metavar="N",
                       help="backend estimate: a step that does not fit has its levers searched in N "
                       "processes at once, the same answers (default: one per lever, up to the usable "
                       "CPU cores, for models of 10M parameters or more; 1: one process)")
    add_hub(check)
    check.add_argument("--no-cache", action="store_true",
                       help="compute the answer again: neither read nor write the local answer cache "
                       "(an estimate of a preset model is kept, keyed by every input and the versions "
                       "of autotune, torch, transformers and peft; AUTOTUNE_CACHE_DIR)")
    check.add_argument("--json", action="store_true",
                       help="print one JSON document (an error too, as {\"error\": ...})")
    return check


# What a training config may set besides model, seq_len, batch_size and mode: flag -> plan key.
# A flag given explicitly wins over the config; its default does not.
_STEP_FIELDS = {"task": None, "dtype": DEFAULT_DTYPE, "optimizer": DEFAULT_OPTIMIZER,
                "attn": None, "loss": DEFAULT_LOSS}


def _plan(args: argparse.Namespace) -> dict[str, Any]:
    """Merge --from-config with the flags (flags win); name what is missing."""
    from autotune.analysis.training_config import missing_fields, read_training_config
    from autotune.workload.modes import parse_mode

    plan: dict[str, Any] = {"model": args.model, "seq_len": args.seq_len,
                            "batch_size": args.batch_size, "mode": None, "accumulation_steps": 1,
                            "notes": [], "ignored": []}
    if args.mode is not None:
        plan["mode"] = parse_mode(args.mode)
    for name, default in _STEP_FIELDS.items():
        given = getattr(args, name)
        plan[name] = given if given != default else None
    if args.from_config:
        planned = read_training_config(args.from_config)
        for key in ("model", "seq_len", "batch_size", "mode", *_STEP_FIELDS):
            if plan[key] is None:
                plan[key] = getattr(planned, key)
        plan["accumulation_steps"] = planned.accumulation_steps
        plan["notes"] = [f"read {args.from_config} as {planned.format}", *planned.notes]
        plan["ignored"] = list(planned.ignored)
        missing = [name for name in missing_fields(planned) if plan[name] is None]
    else:
        missing = [name for name in ("model", "seq_len", "batch_size") if plan[name] is None]
    if missing:
        flags = {"model": "MODEL", "seq_len": "--seq-len", "batch_size": "--batch-size"}
        where = f" in {args.from_config!r} or" if args.from_config else ""
        raise InvalidInput(
            f"missing {', '.join(missing)}: give{where} {', '.join(flags[m] for m in missing)}"
        )
    plan["adapter"] = _adapter(args, getattr(planned, "adapter", None) if args.from_config else None)
    plan["mode"] = plan["mode"] or parse_mode(DEFAULT_MODE_NAME)
    for name, default in _STEP_FIELDS.items():
        if plan[name] is None:
            plan[name] = default
    return plan


def _adapter(args: argparse.Namespace, configured: Any) -> Any:
    """The adapter of the step: the PEFT flags' when any is given (flags win), else the config's;
    ``--qlora-recipe`` alone changes only how the config's 4-bit base is prepared."""
    from dataclasses import replace

    from autotune.workload.adapters import PeftOptions, check_recipe

    flags = peft_kwargs(args)
    given = [name for name, value in flags.items() if value not in (None, False)]
    if given == ["qlora_recipe"] and configured is not None and configured.quantized:
        return replace(configured, recipe=check_recipe(flags["qlora_recipe"]))
    if given:
        return PeftOptions(**flags).adapter()
    return configured


def run_check(args: argparse.Namespace) -> int:
    try:
        plan = _plan(args)
        from autotune.settings import Settings  # pydantic-settings: imported when used

        settings = Settings.from_env()
        server = args.server or settings.server
        result = (_ask_server(server, args, plan, settings.api_token) if server
                  else _check_locally(args, plan, settings.cache_dir))
    except AutotuneError as exc:
        return report_error(exc, as_json=args.json)
    if args.json:
        print_json({**result, "config_notes": plan["notes"], "ignored_keys": plan["ignored"]})
    else:
        print(result["message"])
        if result.get("cached"):
            print("note: answered from the local answer cache (AUTOTUNE_CACHE_DIR, default "
                  "~/.cache/autotune/checks); --no-cache computes it again")
        for note in plan["notes"]:
            print(f"note: {note}")
        if plan["ignored"]:
            print(f"note: ignored (no effect on memory): {', '.join(plan['ignored'])}")
    return EXIT_FITS if result["fits"] else EXIT_DOES_NOT_FIT


def _check_locally(args: argparse.Namespace, plan: dict[str, Any], cache_dir: str | None) -> dict[str, Any]:
    """The check on this machine; an estimator's answer from the answer cache when it has it, or
    from its cell's memo kept there (answers.py), which ``cached`` says."""
    from autotune.cli import answers

    where = answers.folder(cache_dir)
    key = None if args.no_cache else answers.key_of(plan, gpu=args.gpu, gpu_memory=args.gpu_memory,
                                                     backend=args.backend, margin=args.margin)
    stored = answers.read(where, key) if key is not None else None
    if stored is not None:
        return {**stored, "cached": True}
    effective_batch = plan["batch_size"] * plan["accumulation_steps"]
    memo = answers.read_cell(where, key) if key is not None else None
    if key is not None and memo is not None:
        from autotune.analysis.check import CellMemo, check_from_memo

        try:
            found = check_from_memo(CellMemo.from_json(memo), batch_size=plan["batch_size"],
                                    effective_batch=effective_batch)
        except (KeyError, IndexError, TypeError, ValueError, AttributeError):  # unreadable: computed again
            found = None
        if found is not None:
            answer = found.to_dict()
            answers.write(where, key, answer)
            return {**answer, "cached": True}
    from autotune import parallel

    # A step that does not fit has its levers searched in worker processes (parallel.py): started
    # now, they import torch while this process does and searches the cell itself; unused ones
    # are stopped (a step that fits needs none).
    prestart_estimator_workers(args.backend, plan["model"], args.workers, jobs=EARLY_LEVER_JOBS)
    kept: list[Any] = []
    try:
        with quiet_transformers():
            result = autotune.check(
                plan["model"], seq_len=plan["seq_len"], batch_size=plan["batch_size"], mode=plan["mode"].name,
                task=plan["task"], dtype=plan["dtype"], attn=plan["attn"], gpu=args.gpu,
                gpu_memory=args.gpu_memory, backend=args.backend, margin=args.margin,
                optimizer=plan["optimizer"], loss=plan["loss"],
                accumulation_steps=plan["accumulation_steps"], hub=args.hub, adapter=plan["adapter"],
                workers=args.workers, remember=kept.append if key is not None else None,
            )
    finally:
        parallel.stop_prestarted()
    answer = result.to_dict()
    if key is not None:
        answers.write(where, key, answer)
        if kept and answer["backend"] == "estimate":
            answers.write_cell(where, key, kept[-1].to_json())
    return {**answer, "cached": False}


def _ask_server(server: str, args: argparse.Namespace, plan: dict[str, Any], token: str | None
                ) -> dict[str, Any]:
    """GET {server}/v1/check with the plan; the service's 4xx details become our errors."""
    if args.gpu_memory:
        parse_bytes(args.gpu_memory)  # a malformed size is refused here, as it is locally
    query = {
        "model": plan["model"], "seq_len": plan["seq_len"], "batch_size": plan["batch_size"],
        "mode": plan["mode"].name, "margin": args.margin, "dtype": plan["dtype"],
        "optimizer": plan["optimizer"], "loss": plan["loss"],
        "accumulation_steps": plan["accumulation_steps"],
    }
    if plan["task"]:
        query["task"] = plan["task"]
    if args.gpu:
        query["gpu"] = args.gpu
    if args.gpu_memory:
        query["gpu_memory"] = args.gpu_memory
    if plan["attn"]:
        query["attn"] = plan["attn"]
    query.update(_adapter_query(plan["adapter"]))
    url = f"{server.rstrip('/')}/v1/check?{urllib.parse.urlencode(query)}"
    headers = {"Accept": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers),
                                    timeout=SERVER_TIMEOUT_S) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        detail = _detail(exc)
        raise InvalidInput(f"server {server} answered {exc.code}: {detail}") from exc
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise InvalidInput(f"server {server} is unreachable: {reason}") from exc


def _adapter_query(adapter: Any) -> dict[str, Any]:
    """The service's PEFT query parameters for ``adapter`` (a local --peft-config is sent as its
    values: the service cannot read the file)."""
    if adapter is None:
        return {}
    if adapter.bias != "none" or adapter.modules_to_save:
        raise InvalidInput("a PEFT config with bias or modules_to_save is checked locally only: "
                           "the service takes --peft, --lora-* and --bnb-4bit-* values")
    query: dict[str, Any] = {"peft": adapter.method, "lora_r": adapter.r, "lora_alpha": adapter.alpha,
                             "lora_dropout": adapter.dropout}
    if adapter.targets is not None:
        query["lora_targets"] = ",".join(adapter.targets)
    if adapter.quantized:
        query.update({"bnb_4bit_quant_type": adapter.quant_type,
                      "bnb_4bit_use_double_quant": str(adapter.double_quant).lower(),
                      "qlora_recipe": adapter.recipe})
        if adapter.compute_dtype is not None:
            query["bnb_4bit_compute_dtype"] = adapter.compute_dtype
    return query


def _detail(exc: urllib.error.HTTPError) -> str:
    try:
        detail = json.loads(exc.read()).get("detail")
    except (ValueError, AttributeError):
        return exc.reason
    return detail if isinstance(detail, str) else json.dumps(detail)
