"""``autotune check``: exit 0 if the planned step fits, 1 if not, 2 on bad input or an error."""

from __future__ import annotations

import argparse
import json
import os
import urllib.error
import urllib.parse
import urllib.request
import warnings
from typing import Any

from autotune.cli import print_json, report_error
from autotune.errors import AutotuneError, InvalidInput

EXIT_FITS, EXIT_DOES_NOT_FIT = 0, 1  # errors exit 2 through cli.report_error
SERVER_TIMEOUT_S = 600.0  # the service may have to compute a missing cell first


def _plan(args: argparse.Namespace) -> dict[str, Any]:
    """Merge --from-config with the flags (flags win); name what is missing."""
    from autotune.check import missing_fields, read_training_config
    from autotune.modes import parse_mode

    plan: dict[str, Any] = {"model": args.model, "seq_len": args.seq_len,
                            "batch_size": args.batch_size, "mode": None, "accumulation_steps": 1}
    if args.mode is not None:
        plan["mode"] = parse_mode(args.mode)
    if args.from_config:
        job = read_training_config(args.from_config)
        for key in ("model", "seq_len", "batch_size", "mode"):
            if plan[key] is None:
                plan[key] = getattr(job, key)
        plan["accumulation_steps"] = job.accumulation_steps
        missing = [name for name in missing_fields(job) if plan[name] is None]
    else:
        missing = [name for name in ("model", "seq_len", "batch_size") if plan[name] is None]
    if missing:
        flags = {"model": "MODEL", "seq_len": "--seq-len", "batch_size": "--batch-size"}
        where = f" in {args.from_config!r} or" if args.from_config else ""
        raise InvalidInput(
            f"missing {', '.join(missing)}: give{where} {', '.join(flags[m] for m in missing)}"
        )
    plan["mode"] = plan["mode"] or parse_mode("fp32")
    return plan


def run_check(args: argparse.Namespace) -> int:
    try:
        plan = _plan(args)
        server = args.server or os.environ.get("AUTOTUNE_SERVER")
        result = _ask_server(server, args, plan) if server else _check_locally(args, plan)
    except AutotuneError as exc:
        return report_error(exc, as_json=args.json)
    if args.json:
        print_json(result)
    else:
        print(result["message"])
    return EXIT_FITS if result["fits"] else EXIT_DOES_NOT_FIT


def _check_locally(args: argparse.Namespace, plan: dict[str, Any]) -> dict[str, Any]:
    from autotune.backends import make_backend
    from autotune.check import check_step
    from autotune.models import check_seq_len, resolve_model
    from autotune.workload import Workload

    spec = resolve_model(plan["model"])
    check_seq_len(spec, plan["seq_len"])
    backend, gpu = make_backend(args.backend, args.gpu, args.gpu_memory)
    workload = Workload(spec, args.task, args.attn, args.optimizer)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        from transformers.utils import logging as transformers_logging

        transformers_logging.set_verbosity_error()
        result = check_step(
            workload, backend, gpu, seq_len=plan["seq_len"], batch_size=plan["batch_size"],
            mode=plan["mode"], margin=args.margin,
            effective_batch=plan["batch_size"] * plan["accumulation_steps"],
        )
    return result.to_dict()


def _ask_server(server: str, args: argparse.Namespace, plan: dict[str, Any]) -> dict[str, Any]:
    """GET {server}/v1/check with the plan; the service's 4xx details become our errors."""
    query = {
        "model": plan["model"], "seq_len": plan["seq_len"], "batch_size": plan["batch_size"],
        "mode": plan["mode"].name, "task": args.task, "margin": args.margin,
        "accumulation_steps": plan["accumulation_steps"],
    }
    if args.gpu:
        query["gpu"] = args.gpu
    if args.gpu_memory:
        query["gpu_memory"] = args.gpu_memory
    if args.attn:
        query["attn"] = args.attn
    url = f"{server.rstrip('/')}/v1/check?{urllib.parse.urlencode(query)}"
    headers = {"Accept": "application/json"}
    token = os.environ.get("AUTOTUNE_API_TOKEN")
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


def _detail(exc: urllib.error.HTTPError) -> str:
    try:
        detail = json.loads(exc.read()).get("detail")
    except (ValueError, AttributeError):
        return exc.reason
    return detail if isinstance(detail, str) else json.dumps(detail)
