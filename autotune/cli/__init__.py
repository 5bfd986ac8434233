"""The ``autotune`` command line: one module per command, each only translating. Arguments become
a call of the Python API (``autotune.table``, ``check``, ``explain``); library errors become
``Error: ...`` and exit status 2.

    autotune table MODEL [...]     the max batch size table (table.py)
    autotune check MODEL [...]     the CI gate: exit 0 fits, 1 does not (check.py)
    autotune explain MODEL [...]   where the memory goes, and what each lever buys (explain.py)
    autotune serve [...]           the HTTP service and dashboard (serve.py: the one module that imports api)
    autotune import PATH...        measured tables (docs/measurements/) into the service's database (serve.py)
    autotune models | gpus         the offline presets (presets.py)
    autotune --version             the version (autotune.__version__)

Only argparse at import, so ``autotune --help`` stays fast.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import traceback
from collections.abc import Sequence

from autotune import __version__
from autotune.cli import check, explain, presets, serve, table
from autotune.cli.common import EXIT_ERROR, NAMES_AND_SIZES, worded
from autotune.errors import AutotuneError

COMMANDS = {
    "table": table.run,
    "check": check.run_check,
    "explain": explain.run,
    "serve": serve.run,
    "import": serve.run_import,
    "models": presets.run_models,
    "gpus": presets.run_gpus,
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="autotune",
        description="The largest training batch that fits in GPU memory, per sequence length.",
        epilog=NAMES_AND_SIZES,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}",
                        help="print the version and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                help="table, check, explain, serve, import, models or gpus; "
                                "`autotune COMMAND --help` for its options")
    table.add_parser(sub)
    check.add_parser(sub)
    explain.add_parser(sub)
    presets.add_parsers(sub)
    serve.add_parser(sub)
    return parser


# Commands that leave nothing to tear down once they return: their process ends at once (os._exit,
# streams flushed) instead of running Python's finalization of torch's and transformers' modules,
# 0.8 s of every such command on 2 cores (measured: importing torch and transformers, then exiting,
# takes 3.7 s, and 3.0 s with os._exit). serve and import end normally (uvicorn, Ray, SQLite).
QUICK_EXIT = frozenset({"table", "check", "explain", "models", "gpus"})


def run() -> None:
    """The ``autotune`` command (and ``python -m autotune``): ``main``, then the exit. A reader of
    the output that went away (``autotune models | head``) ends it quietly, exit status 2."""
    try:
        code = main()
    except BrokenPipeError:
        # What Python's documentation advises (signal's "Note on SIGPIPE"): the rest of the output
        # to /dev/null, so that the flush at exit does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = EXIT_ERROR
    command = next((arg for arg in sys.argv[1:] if not arg.startswith("-")), None)
    if command not in QUICK_EXIT:
        raise SystemExit(code)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a reader that went away (`| head`), a closed stream
            pass
    os._exit(code)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(_negatives_joined(sys.argv[1:] if argv is None else argv))
    try:
        return COMMANDS[args.command](args)
    except AutotuneError as exc:
        print(f"Error: {worded(exc)}", file=sys.stderr)
        return EXIT_ERROR
    except BrokenPipeError:
        raise  # a reader that went away: run() ends quietly
    except Exception as exc:  # a bug, or a library failing inside a step: an error, never a verdict
        traceback.print_exc()
        print(f"Error: internal error ({type(exc).__name__}: {exc}); please report it with the "
              "traceback above", file=sys.stderr)
        return EXIT_ERROR


def _negatives_joined(argv: Sequence[str]) -> list[str]:
    """``--gpu-memory -5GiB`` as ``--gpu-memory=-5GiB``: argparse takes a word that starts with a dash
    and is not a plain number for an option (``expected one argument``), where the option's own
    check says what is wrong with the value."""
    joined: list[str] = []
    for word in argv:
        if (joined and joined[-1].startswith("--") and "=" not in joined[-1]
                and re.match(r"-\.?\d", word) and joined[-1] != "--"):
            joined[-1] = f"{joined[-1]}={word}"
        else:
            joined.append(word)
    return joined
