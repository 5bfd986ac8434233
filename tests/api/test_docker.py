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


# --- a fleet: docker-compose.fleet.yml and the KubeRay example ------------------------------------

FLEET_COMPOSE = ROOT / "docker-compose.fleet.yml"
RAYCLUSTER = ROOT / "deploy" / "kuberay" / "raycluster.yaml"


@pytest.fixture(scope="module")
def fleet_compose():
    return yaml.safe_load(FLEET_COMPOSE.read_text())


def ray_start_options(words: list[str]) -> dict[str, str]:
    """``--name value`` pairs of a ray start command line (flags without a value map to "")."""
    options, i = {}, 0
    while i < len(words):
        if words[i].startswith("--"):
            name, _, value = words[i][2:].partition("=")
            if not value and i + 1 < len(words) and not words[i + 1].startswith("--"):
                value, i = words[i + 1], i + 1
            options[name] = value
        i += 1
    return options


def test_dockerfile_installs_the_extras_it_is_built_with(dockerfile):
    arg = {k: v for k, _, v in (a.partition("=") for a in args_of(dockerfile, "ARG"))}
    assert arg["EXTRAS"] == "service"  # the plain image has no Ray
    install = next(r for r in args_of(dockerfile, "RUN") if "pip install" in r)
    assert ".[${EXTRAS}]" in install


def test_fleet_compose_runs_the_service_beside_the_ray_head(fleet_compose):
    service = fleet_compose["services"]["autotune"]
    assert service["build"]["args"]["EXTRAS"] == "fleet"
    script = service["command"][0]
    head, serve = (shlex.split(part) for part in script.split("&&"))
    assert head[:3] == ["ray", "start", "--head"]
    options = ray_start_options(head[3:])
    assert options["port"] == "6379" and options["num-gpus"] == "0" and "disable-usage-stats" in options
    assert serve[0] == "exec"
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(serve[2:])  # the real `serve` parser accepts it
    assert args.ray == "auto" and args.host == "0.0.0.0"
    assert service["environment"]["RAY_USAGE_STATS_ENABLED"] == "0"
    assert service["environment"]["AUTOTUNE_API_TOKEN"].startswith("${AUTOTUNE_API_TOKEN:?")
    assert service["ports"] == ["${AUTOTUNE_PUBLISH_ADDR:-127.0.0.1}:${AUTOTUNE_PORT:-8000}:8000"]
    assert service["volumes"][0].split(":")[0] in fleet_compose["volumes"]
    assert "deploy" not in service  # no GPU: the workers have them


def test_fleet_compose_has_a_gpu_worker_per_kind_labelled_with_a_preset(fleet_compose):
    from autotune.gpus import GPU_PRESETS

    workers = {name: s for name, s in fleet_compose["services"].items() if name.startswith("worker-")}
    kinds = []
    for name, worker in workers.items():
        assert worker["entrypoint"] == ["ray", "start"]
        options = ray_start_options(worker["command"])
        assert options["address"] == "autotune:6379"
        assert "block" in options and "disable-usage-stats" in options
        key, _, kind = options["labels"].partition("=")
        assert key == "autotune/gpu" and kind in GPU_PRESETS and name == f"worker-{kind.lower()}"
        devices = worker["deploy"]["resources"]["reservations"]["devices"]
        assert devices[0]["capabilities"] == ["gpu"] and devices[0]["driver"] == "nvidia"
        assert worker["environment"]["RAY_USAGE_STATS_ENABLED"] == "0"
        assert worker["image"] == fleet_compose["services"]["autotune"]["image"]
        kinds.append(kind)
    assert len(kinds) >= 2 and len(set(kinds)) == len(kinds)


def test_the_kuberay_example_has_a_worker_group_per_gpu_type():
    from autotune.gpus import GPU_PRESETS

    cluster, deployment, claim = yaml.safe_load_all(RAYCLUSTER.read_text())
    assert (cluster["apiVersion"], cluster["kind"]) == ("ray.io/v1", "RayCluster")
    assert cluster["spec"]["rayVersion"] == "2.60.0"
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert '"ray==2.60.0"' in pyproject  # the image's Ray is the cluster's
    assert cluster["spec"]["headGroupSpec"]["rayStartParams"]["num-gpus"] == "0"
    groups = cluster["spec"]["workerGroupSpecs"]
    kinds = []
    for group in groups:
        params = group["rayStartParams"]
        key, _, kind = params["labels"].partition("=")
        assert key == "autotune/gpu" and kind in GPU_PRESETS and params["num-gpus"] == "1"
        container = group["template"]["spec"]["containers"][0]
        assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
        assert {"name": "RAY_USAGE_STATS_ENABLED", "value": "0"} in container["env"]
        assert group["template"]["spec"]["nodeSelector"]  # the pods land on nodes with the card
        kinds.append(kind)
    assert len(kinds) >= 2 and len(set(kinds)) == len(kinds)
    # The service: one replica (one writer), joining through Ray Client on the head's service.
    assert deployment["kind"] == "Deployment" and deployment["spec"]["replicas"] == 1
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["AUTOTUNE_RAY_ADDRESS"] == f"ray://{cluster['metadata']['name']}-head-svc:10001"
    from api.settings import _ray_address

    assert _ray_address(env["AUTOTUNE_RAY_ADDRESS"]) == env["AUTOTUNE_RAY_ADDRESS"]
    assert claim["kind"] == "PersistentVolumeClaim"


def test_every_serving_container_may_open_the_connections_the_server_holds(compose, fleet_compose):
    # Issue #37: with 1024 descriptors, 1100 slow connections took the server off the air. The
    # compose files raise the limit above AUTOTUNE_MAX_CONNECTIONS and the server's own files.
    from api.server import RESERVED_DESCRIPTORS
    from api.settings import Settings

    needed = Settings().max_connections + RESERVED_DESCRIPTORS
    for name, service in [("autotune", compose["services"]["autotune"]),
                          ("autotune-cpu", compose["services"]["autotune-cpu"]),
                          ("fleet autotune", fleet_compose["services"]["autotune"])]:
        nofile = service["ulimits"]["nofile"]
        assert nofile["soft"] >= needed and nofile["hard"] >= nofile["soft"], name
        assert "AUTOTUNE_TRUSTED_PROXIES" in service["environment"], name
    assert "--ulimit nofile=" in DOCKERFILE.read_text()  # the docker run line says it too
