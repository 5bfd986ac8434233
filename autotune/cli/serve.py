"""``autotune serve``: the HTTP API (api/) under uvicorn; ``autotune import``: measured tables into its
database.

    autotune serve [--host 127.0.0.1] [--port 8000] [--db PATH] [--measurements PATH]... [--ray ADDRESS]
    autotune import PATH... [--db PATH] [--json]

Binds to loopback unless told otherwise; binding anywhere else exposes the API beyond this
machine and needs AUTOTUNE_API_TOKEN, which write requests must then send as a Bearer token, and
AUTOTUNE_ALLOWED_HOSTS naming the host names clients use (a request for any other Host is answered
400; by default only the loopback names are allowed, and the --host address always is).
The database is --db, else AUTOTUNE_DB, else ./autotune.db. One process: the runner in it owns
the GPUs and the database has one writer, so there are no uvicorn workers and no reload.

``autotune import`` (and ``serve --measurements`` or AUTOTUNE_MEASUREMENTS, at start) turns measured
tables kept as JSON (docs/measurements/) into finished cuda runs that ``check`` answers from and the
dashboard shows (api/measurements.py): files, or directories (their ``*.json``, not subfolders).
Both commands are here because this is the one CLI module that imports the service (api/).

``--ray ADDRESS`` (or AUTOTUNE_RAY_ADDRESS) runs the tables on a Ray cluster, a fleet of GPU kinds
(api/fleet/): ``auto`` joins the cluster this machine is part of (``ray start`` ran here), HOST:PORT
is its head. It needs the [fleet] extra; without Ray the option says how to install it.

Only argparse and ipaddress at import: ``autotune --help`` stays fast.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import sys
from collections.abc import Sequence
from typing import Any

from autotune.errors import AutotuneError, InvalidInput

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``serve`` subcommand to ``subparsers`` (argparse's add_subparsers())."""
    parser = subparsers.add_parser("serve", help="run the HTTP API (OpenAPI docs at /docs)",
                                   description="Run the HTTP API: POST /v1/tables, GET /v1/tables/{id}, ...")
    parser.add_argument("--host", default=DEFAULT_HOST,
                        help="address to bind (default: %(default)s; another needs AUTOTUNE_API_TOKEN, "
                             "and AUTOTUNE_ALLOWED_HOSTS naming the host names clients use)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT,
                        help="TCP port to listen on (default: %(default)s)")
    parser.add_argument("--db", default=None, help="SQLite file of the queue and results "
                                                   "(default: $AUTOTUNE_DB, else ./autotune.db)")
    parser.add_argument("--log-level", default="info",
                        choices=("critical", "error", "warning", "info", "debug"),
                        help="uvicorn's log level (default: %(default)s)")
    parser.add_argument("--measurements", action="append", default=None, metavar="PATH",
                        help="import these measured tables at start, as `autotune import` does (a file or a "
                             "directory of *.json; repeatable; default: $AUTOTUNE_MEASUREMENTS, "
                             f"{os.pathsep}-separated)")
    parser.add_argument("--ray", default=None, metavar="ADDRESS",
                        help="run the tables on the Ray cluster at ADDRESS, a fleet of GPU kinds: auto "
                             "(the cluster this machine is part of), HOST:PORT of its head, or "
                             "ray://HOST:PORT; needs pip install 'autotune-batch[fleet]' (default: "
                             "$AUTOTUNE_RAY_ADDRESS, else this host's GPUs)")
    add_import_parser(subparsers)
    return parser


def add_import_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``import`` subcommand: measured tables into the service's database."""
    parser = subparsers.add_parser(
        "import", help="import measured tables (JSON, e.g. docs/measurements/) into the service's database",
        description="Import tables measured on a GPU (autotune table --backend cuda --json, as kept in "
                    "docs/measurements/) into the service's database as finished runs, which `check` "
                    "answers from and the dashboard shows. Importing a file again changes nothing; a "
                    "changed file replaces its earlier import. A bad file is an error naming it, and "
                    "then nothing is imported.")
    parser.add_argument("paths", nargs="+", metavar="PATH",
                        help="a table's JSON file, or a directory: its *.json (not its subfolders)")
    parser.add_argument("--db", default=None, help="SQLite file of the service "
                                                   "(default: $AUTOTUNE_DB, else ./autotune.db)")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON document: what became of each file")
    return parser


def is_loopback(host: str) -> bool:
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip().strip("[]")).is_loopback
    except ValueError:  # a host name: it may resolve anywhere
        return False


def check_bind(host: str, api_token: str | None) -> None:
    """InvalidInput when ``host`` is reachable from other machines and no token guards writes."""
    if api_token is None and not is_loopback(host):
        raise InvalidInput(
            f"binding to {host} makes the API reachable from other machines: set AUTOTUNE_API_TOKEN "
            "(write requests must then send 'Authorization: Bearer <token>'), or bind to 127.0.0.1"
        )


# What `autotune serve` needs beyond the core: the distribution's [service] extra.
SERVICE_PACKAGES = ("fastapi", "uvicorn", "jinja2")


def check_service_installed() -> None:
    """AutotuneError naming the extra when a package of the service is not installed."""
    import importlib.util

    missing = [name for name in SERVICE_PACKAGES if importlib.util.find_spec(name) is None]
    if missing:
        raise AutotuneError(
            f"autotune serve needs {', '.join(missing)}, which {'is' if len(missing) == 1 else 'are'} "
            "not installed: pip install 'autotune-batch[service]' (or -e \".[service]\" from a checkout)"
        )


def ray_address(text: str) -> str | None:
    """``--ray``'s address, checked as AUTOTUNE_RAY_ADDRESS is; InvalidInput saying what is allowed."""
    from api.settings import _ray_address

    try:
        return _ray_address(text)
    except ValueError as exc:
        raise InvalidInput(f"--ray: {exc}") from None


def check_fleet_installed() -> None:
    """AutotuneError naming the extra when Ray is not installed."""
    import importlib.util

    if importlib.util.find_spec("ray") is None:
        raise AutotuneError("a fleet (--ray, AUTOTUNE_RAY_ADDRESS) runs on Ray, which is not installed: "
                            "pip install 'autotune-batch[fleet]' (or -e \".[fleet]\" from a checkout)")


def run(args: argparse.Namespace) -> int:
    """Serve until interrupted; library errors propagate (the CLI prints them, exit 2)."""
    from pathlib import Path

    check_service_installed()

    from api.hosts import with_host
    from api.settings import Settings

    settings = Settings.from_env()
    if args.db is not None:
        settings = settings.model_copy(update={"db": Path(args.db)})
    if args.measurements is not None:
        settings = settings.model_copy(update={"measurements": tuple(Path(p) for p in args.measurements)})
    settings = settings.model_copy(update={"allowed_hosts": with_host(settings.allowed_hosts, args.host)})
    if args.ray is not None:
        settings = settings.model_copy(update={"ray_address": ray_address(args.ray)})
    if settings.ray_address is not None:
        check_fleet_installed()
    check_bind(args.host, settings.api_token)
    if not 0 < args.port < 65536:
        raise InvalidInput(f"port {args.port} is out of range: use 1 to 65535")

    from api.main import create_app, make_runner
    from api.server import serve
    from api.store import Store

    # Opened here, not at the app's startup, so that a database another server holds, or a bad
    # measured table, is a one-line error before anything binds.
    store = Store(settings.db, claim=True)  # claimed before SQLite opens it (api/store.py)
    try:
        _import(store, settings)
        settings = settings.model_copy(update={"measurements": ()})  # done: not again at startup
        runner = make_runner(settings)
    except BaseException:
        store.close()
        raise
    app = create_app(settings, store=store, runner=runner)
    # uvicorn, with a deadline for request heads and a cap on connections (api/server.py).
    serve(app, settings, host=args.host, port=args.port, log_level=args.log_level)
    return 0


def _import(store: Any, settings: Any) -> list[Any]:
    """Import ``settings.measurements`` into ``store``, saying what became of each file on stderr."""
    from api.measurements import import_measurements
    from autotune.cli.common import quiet_transformers

    if not settings.measurements:
        return []
    with quiet_transformers():
        done = import_measurements(store, settings.measurements, settings)
    for imported in done:
        print(imported, file=sys.stderr)
    return done


def run_import(args: argparse.Namespace) -> int:
    """``autotune import``: each file's outcome on stdout; library errors propagate (exit 2).

    No claim on the database: a server may be running on it (SQLite serialises the writes), and it
    answers from the imported tables at once.
    """
    from pathlib import Path

    check_service_installed()

    from api.measurements import import_measurements
    from api.settings import Settings
    from api.store import Store
    from autotune.cli.common import print_json, quiet_transformers

    settings = Settings.from_env()
    if args.db is not None:
        settings = settings.model_copy(update={"db": Path(args.db)})
    store = Store(settings.db)
    try:
        with quiet_transformers():
            done = import_measurements(store, args.paths, settings)
    finally:
        store.close()
    if args.json:
        print_json([{"file": d.measurement.file, "source": d.measurement.source, "outcome": d.outcome,
                     "run_id": d.run.id, "model": d.run.model, "gpu": d.run.gpu,
                     "measured_on": d.measurement.measured_on, "cells": d.run.done, "total": d.run.total}
                    for d in done])
    else:
        for imported in done:
            print(imported)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m autotune.cli.serve``: the same as ``autotune serve``."""
    parser = argparse.ArgumentParser(prog="autotune")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["serve", *(sys.argv[1:] if argv is None else argv)])
    try:
        return run(args)
    except AutotuneError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
