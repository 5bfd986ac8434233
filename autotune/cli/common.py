"""What the CLI commands share: argument types, the request's flags (made from its fields,
request.py), JSON output, the error report (fields worded as flags), and transformers kept quiet
while a command runs."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import warnings
from collections.abc import Callable, Iterator
from typing import Any

from autotune.errors import AutotuneError, InvalidInput
from autotune.request import (
    PEFT_FIELDS,
    AnyRequest,
    Field,
    Request,
    Step,
    fields_of,
    flag_names,
    request_from,
    seq_len_list,
)
from autotune.request import positive as request_positive

EXIT_OK, EXIT_ERROR = 0, 2  # `check` adds 1: the step does not fit


def int_list(text: str) -> list[int]:
    """--seq-lens: workload.models.parse_seq_lens, its refusal as argparse's."""
    return _argparse_type(seq_len_list)(text)


def positive(text: str) -> int:
    return _argparse_type(request_positive)(text)


def _argparse_type(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """A field's parser (request.py) as argparse's ``type``: its refusal is argparse's (exit 2,
    with the usage and the flag)."""
    def convert(text: str) -> Any:
        try:
            return parse(text)
        except InvalidInput as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    convert.__name__ = getattr(parse, "__name__", "value")
    return convert


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


# The groups of a request's flags in --help: the fields of each part, in order (request.py).
PEFT_TITLE = ("parameter-efficient fine-tuning", "LoRA and QLoRA, built by the real PEFT (get_peft_model) "
              "over the model")


def add_request(parser: argparse.ArgumentParser, cls: type[Request], *,
                choices: dict[str, tuple[str, ...]] | None = None) -> None:
    """The flags of a request's step, PEFT options and target, made from their fields
    (request.py: one declaration a field): the step's, a group of PEFT's, --gpu-memory, --gpu,
    --multiprocessors, --alloc-conf, --backend, --margin, --hub. Every flag defaults to None, "not given": a
    request built from them (``request_of``) takes its own defaults, and a config's values where it
    reads one.
    ``choices`` narrows a field's allowed values (explain: the estimator only)."""
    choices = choices or {}
    step = [f for f in fields_of(Step) if f.about.cli and f.name != "hub"]
    peft = parser.add_argument_group(*PEFT_TITLE)
    for f in step:
        _add(peft if f.name in PEFT_FIELDS else parser, f, choices.get(f.name))
    target = {f.name: f for f in fields_of(cls)
              if f.name in ("gpu", "gpu_memory", "multiprocessors", "alloc_conf", "backend", "margin")}
    for name in ("gpu_memory", "gpu", "multiprocessors", "alloc_conf"):
        _add(parser, target[name])
    _add(parser, target["backend"], choices.get("backend"))
    _add(parser, target["margin"])
    _add(parser, next(f for f in fields_of(Step) if f.name == "hub"))


def add_fields(parser: argparse.ArgumentParser, cls: type[Request], names: tuple[str, ...]) -> None:
    """The flags of a command's own fields (``seq_len``, ``modes``, ...), made from them."""
    known = {f.name: f for f in fields_of(cls)}
    for name in names:
        _add(parser, known[name])


def _add(container: Any, f: Field, choices: tuple[str, ...] | None = None) -> None:
    """One field's flag: a choice, a parsed value, a switch (store_true; --x/--no-x where None
    means the default), or text."""
    about = f.about
    kwargs: dict[str, Any] = {"help": about.help, "default": None}
    if f.type.startswith("bool"):
        kwargs["action"] = "store_true" if f.default is False else argparse.BooleanOptionalAction
        if f.default is False:
            kwargs["default"] = False
    else:
        kwargs["metavar"] = about.metavar
        if choices or about.choices:
            kwargs["choices"] = choices or about.choices
        if about.parse is not None:
            kwargs["type"] = _argparse_type(about.parse)
    container.add_argument(f.flag, dest=f.name, **kwargs)


def request_of(cls: type[AnyRequest], args: argparse.Namespace, **values: Any) -> AnyRequest:
    """The request the flags ask for (those not given: the request's defaults), with ``values``
    (a command's own: seq_len, modes, ...) on top."""
    given = {f.name: getattr(args, f.name) for f in fields_of(cls) if hasattr(args, f.name)}
    return request_from(cls, {**given, **values})


def print_json(document: object) -> None:
    """One JSON document on stdout, as every ``--json`` prints it."""
    json.dump(document, sys.stdout, indent=2)
    sys.stdout.write("\n")


def report_error(exc: AutotuneError, *, as_json: bool) -> int:
    """``Error: ...`` on stderr (and ``{"error": ..., "kind": ...}`` on stdout for --json: the
    kind of a refused input, autotune/errors.py), the fields it names worded as this command
    line's flags; exit status 2."""
    message = worded(exc)
    if as_json:
        kind = {"kind": exc.kind} if isinstance(exc, InvalidInput) else {}
        json.dump({"error": message, **kind}, sys.stdout)
        sys.stdout.write("\n")
    print(f"Error: {message}", file=sys.stderr)
    return EXIT_ERROR


def worded(exc: AutotuneError) -> str:
    """An error's message with the request fields it names as the CLI's flags (``--lora-r``)."""
    return exc.worded(flag_names())


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
    workload/presets/). Returns how many were started; parallel.stop_prestarted ends those no
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
