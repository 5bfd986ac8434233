"""docker/Dockerfile and docker-compose.yml, checked statically (no Docker engine here)."""

from __future__ import annotations

import argparse
import ast
import json
import re
import shlex
from pathlib import Path

import pytest
import yaml

from autotune.cli.serve import add_parser

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "docker" / "Dockerfile"
COMPOSE = ROOT / "docker-compose.yml"


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile: comments dropped, continuation lines joined."""
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    joined = re.sub(r"\\\n", " ", "\n".join(lines))
    result = []
    for line in joined.splitlines():
        if line.strip():
            keyword, _, rest = line.strip().partition(" ")
            result.append((keyword.upper(), rest.strip()))
    return result


@pytest.fixture(scope="module")
def dockerfile():
    return instructions(DOCKERFILE.read_text())


@pytest.fixture(scope="module")
def compose():
    return yaml.safe_load(COMPOSE.read_text())


def args_of(dockerfile, keyword):
    return [rest for key, rest in dockerfile if key == keyword]


def test_the_base_is_a_cuda_pytorch_image(dockerfile):
    arg = {k: v for k, _, v in (a.partition("=") for a in args_of(dockerfile, "ARG"))}
    base = arg["BASE_IMAGE"]
    assert re.fullmatch(r"pytorch/pytorch:2\.\d+\.\d+-cuda\d+\.\d+-cudnn\d+-runtime", base)
    assert args_of(dockerfile, "FROM") == ["${BASE_IMAGE}"]
    assert dockerfile.index(("FROM", "${BASE_IMAGE}")) > 0  # the ARG comes first, as FROM needs


def test_the_package_is_installed_keeping_the_image_torch(dockerfile):
    copied = [shlex.split(a)[:-1] for a in args_of(dockerfile, "COPY")]
    for sources in copied:
        for source in sources:
            assert (ROOT / source).exists(), f"COPY {source}: not in the repository"
    assert {"autotune", "api", "pyproject.toml"} <= {s for sources in copied for s in sources}
    install = next(r for r in args_of(dockerfile, "RUN") if "pip install" in r)
    assert "--constraint" in install and re.search(r"pip install --constraint \S+ \.", install)


def test_it_runs_as_a_user_without_privileges(dockerfile):
    users = args_of(dockerfile, "USER")
    assert users and users[-1] not in ("root", "0")
    assert any("useradd" in r and users[-1] in r for r in args_of(dockerfile, "RUN"))
    keys = [k for k, _ in dockerfile]
    assert keys.index("USER") < keys.index("CMD")


def test_it_serves_on_all_interfaces_with_a_healthcheck(dockerfile):
    cmd = json.loads(args_of(dockerfile, "CMD")[-1])
    assert cmd[:2] == ["autotune", "serve"]
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(cmd[1:])  # the real `serve` parser accepts the arguments
    assert args.host == "0.0.0.0" and args.port == 8000
    assert args_of(dockerfile, "EXPOSE") == ["8000"]
    healthcheck = args_of(dockerfile, "HEALTHCHECK")[-1]
    exec_form = json.loads(healthcheck[healthcheck.index("CMD ") + 4:])
    assert exec_form[:2] == ["python", "-c"]
    code = exec_form[2]
    assert "http://127.0.0.1:8000/v1/health" in code
    ast.parse(code)  # the probe is valid Python
    assert "--start-period" in healthcheck


def test_the_database_lives_in_a_volume(dockerfile):
    env = " ".join(args_of(dockerfile, "ENV"))
    assert "AUTOTUNE_DB=/data/autotune.db" in env
    assert args_of(dockerfile, "VOLUME") == ['["/data"]']


def test_the_build_context_is_filtered(dockerfile):
    ignore = (ROOT / "docker" / "Dockerfile.dockerignore").read_text().split()
    assert ignore[ignore.index("*") + 1:][:4] == ["!pyproject.toml", "!README.md", "!autotune/", "!api/"]


def test_compose_gpu_service(compose):
    service = compose["services"]["autotune"]
    assert service["build"] == {"context": ".", "dockerfile": "docker/Dockerfile"}
    assert (ROOT / service["build"]["context"] / service["build"]["dockerfile"]).is_file()
    devices = service["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["capabilities"] == ["gpu"] and devices[0]["driver"] == "nvidia"
    assert "profiles" not in service  # started by a plain `docker compose up`
    env = service["environment"]
    assert env["AUTOTUNE_API_TOKEN"].startswith("${AUTOTUNE_API_TOKEN:?")  # from the environment, required
    assert env["AUTOTUNE_DB"] == "/data/autotune.db"
    assert service["ports"] == ["${AUTOTUNE_PUBLISH_ADDR:-127.0.0.1}:${AUTOTUNE_PORT:-8000}:8000"]
    volume, target = service["volumes"][0].split(":")
    assert target == "/data" and volume in compose["volumes"]  # a named volume


def test_compose_cpu_profile_runs_the_estimator(compose):
    service = compose["services"]["autotune-cpu"]
    assert service["profiles"] == ["cpu"]
    assert "deploy" not in service  # no GPU reservation
    assert service["environment"]["AUTOTUNE_BACKEND"] == "estimate"
    assert service["environment"]["AUTOTUNE_API_TOKEN"].startswith("${AUTOTUNE_API_TOKEN:?")
    assert service["build"] == compose["services"]["autotune"]["build"]
    assert service["ports"][0].endswith(":8000")
    assert service["volumes"][0].split(":")[0] in compose["volumes"]
