"""Shared test setup: never reach for the network, keep transformers quiet."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("AUTOTUNE_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


import pytest  # noqa: E402

# The modules that take most of the suite's time, heaviest first (a Ray cluster and its browser view,
# the README's real-size tables, Chromium on the dashboard, live servers, BERT-large and 8B steps),
# as measured with ``--durations=0``. They are handed out before the rest, and xdist keeps the order
# (its default under ``--dist loadscope`` sorts modules by their number of tests, which sends these
# few-test modules last: one worker then ran them alone for a tenth of the suite's wall). With them
# first, the many small modules even out the two workers' ends.
HEAVY_FIRST = ("tests/api/test_fleet.py", "tests/test_readme.py", "tests/api/test_dashboard_e2e.py",
               "tests/api/test_server.py", "tests/api/test_fleet_head.py",
               "tests/autotune/test_training_step_2026.py",
               "tests/autotune/backends/estimate/test_mx_meta.py", "tests/api/test_heavy_reads.py")


def pytest_configure(config):
    if hasattr(config.option, "loadscopereorder"):  # pytest-xdist's --no-loadscope-reorder
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(items):
    rank = {module: position for position, module in enumerate(HEAVY_FIRST)}
    # A stable sort: the rest stays in collection order.
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(HEAVY_FIRST)))


# The base URL of the app's test clients: a host the server answers to by default
# (AUTOTUNE_ALLOWED_HOSTS), where Starlette's own default, testserver, would be answered 400.
LOCAL = "http://localhost"


@pytest.fixture(scope="session")
def analyses():
    """One analysis pool for the session's idle apps: its worker imports torch once, not per test.
    Its cache is shared too, which changes no answer (an answer depends on its order only)."""
    from api.runs.analysis import AnalysisPool
    from api.runs.runner import ANALYSIS_TIMEOUT_S
    from autotune.processes import child_env

    pool = AnalysisPool(workers=1, timeout_s=ANALYSIS_TIMEOUT_S, env=child_env({"CUDA_VISIBLE_DEVICES": ""}))
    yield pool
    pool.close()


@pytest.fixture
def idle_client(tmp_path, analyses):
    """The real app on a temporary database, with a runner that has no lanes: no order ever starts,
    so tests of the request path (check, explain, errors) stay fast and isolated."""
    from fastapi.testclient import TestClient

    from api.main import create_app
    from api.runs.runner import LocalRunner
    from api.settings import Settings

    runner = LocalRunner(estimate_workers=0, gpu_lanes=[], analyses=analyses)
    app = create_app(Settings(db=tmp_path / "idle.db"), runner=runner)
    with TestClient(app, base_url=LOCAL) as client:
        yield client


@pytest.fixture
def make_client(tmp_path, analyses):
    """``make(base_url=LOCAL, **settings)``: a test client of the real app with those settings, on a
    database of its own unless ``db`` is given, with a runner that has no lanes (accepted runs stay
    queued)."""
    from fastapi.testclient import TestClient

    from api.main import create_app
    from api.runs.runner import LocalRunner
    from api.settings import Settings

    clients = []

    def make(base_url=LOCAL, **settings):
        runner = LocalRunner(estimate_workers=0, gpu_lanes=[], analyses=analyses)
        settings.setdefault("db", tmp_path / f"app-{len(clients)}.db")
        app = create_app(Settings(**settings), runner=runner)
        client = TestClient(app, base_url=base_url)
        client.__enter__()  # runs the lifespan: store, runner, queue
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.__exit__(None, None, None)


@pytest.fixture
def hub_watch(monkeypatch):
    """Records each hub lookup (the config download), which fails as an id missing from the hub,
    or from the cache offline, would: a test asserts which names reached the hub."""
    from autotune.errors import UnknownModel
    from autotune.workload import models

    asked: list[str] = []

    def lookup(name):
        asked.append(name)
        raise UnknownModel(f"unknown model '{name}': looked up on the hub")

    monkeypatch.delenv("AUTOTUNE_ALLOW_HUB", raising=False)
    monkeypatch.setattr(models, "_hub_config", lookup)
    return asked


@pytest.fixture
def explain_cli_run(capsys):
    """``autotune explain ARGV...`` in process: (exit code, stdout, stderr)."""
    import argparse

    from autotune.cli import explain as explain_cli

    def run(*argv: str) -> tuple[int, str, str]:
        parser = argparse.ArgumentParser(prog="autotune")
        explain_cli.add_parser(parser.add_subparsers(dest="command", required=True))
        code = explain_cli.run(parser.parse_args(["explain", *argv]))
        out, err = capsys.readouterr()
        return code, out, err

    return run


@pytest.fixture(autouse=True)
def check_answer_cache(tmp_path_factory, monkeypatch):
    """Each test's local checks keep their answers in a folder of its own (cli/answers.py), never
    in ~/.cache, and never find another test's answers."""
    monkeypatch.setenv("AUTOTUNE_CACHE_DIR", str(tmp_path_factory.mktemp("answers")))
