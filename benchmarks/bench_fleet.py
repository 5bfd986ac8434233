"""A 24-cell estimate table through RayRunner on a local Ray cluster against the local runner.

    .venv/bin/python benchmarks/bench_fleet.py [--model bert-base-uncased] [--cpus 2]   # as root

The default BERT-base table (6 sequence lengths x 4 modes) on the estimator, once through
LocalRunner (one worker process runs the table) and once through RayRunner on a cluster of one head
with ``--cpus`` CPUs (a task per cell; the cells of a mode in order, the modes at once). Both must
give the same cells. Ray's start-up (``ray start``, the driver joining) is timed apart from the table.

Like the tests, the cluster runs on loopback inside a network namespace of its own, so nothing leaves
the machine (Ray advertises the address of the default route even when told 127.0.0.1): the benchmark
starts itself again under ``unshare --net`` (it needs root), brings loopback up there, and stops
every Ray process it started before it ends.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from api.fleet.runner import RayRunner  # noqa: E402
from api.runs.runner import LocalRunner, RunOrder  # noqa: E402
from api.runs.spec import normalize  # noqa: E402
from api.settings import Settings  # noqa: E402

RAY = Path(sys.executable).parent / "ray"
IN_NAMESPACE = "AUTOTUNE_BENCH_NAMESPACE"  # set by the run of itself under unshare --net
RAY_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "PYTHONPATH": str(ROOT), "AUTOTUNE_OFFLINE": "1",
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}


class Recorder:
    def __init__(self) -> None:
        self.cells: dict[int, dict[str, Any]] = {}
        self.done = threading.Event()
        self.result: tuple[str, str | None] | None = None

    def started(self, run_id: str, lane: str, pid: int | None) -> bool:
        return True

    def header(self, run_id: str, header: dict[str, Any]) -> None:
        pass

    def cell(self, run_id: str, position: int, cell: dict[str, Any]) -> None:
        self.cells[position] = cell

    def finished(self, run_id: str, status: str, error: str | None, elapsed_s: float | None) -> None:
        self.result = (status, error)
        self.done.set()


def table(runner: Any, spec: dict[str, Any]) -> tuple[float, dict[int, dict[str, Any]]]:
    events = Recorder()
    started = time.perf_counter()
    runner.submit(RunOrder("bench", spec), events)
    assert events.done.wait(1800), "the table did not finish in 30 minutes"
    assert events.result == ("done", None), events.result
    return time.perf_counter() - started, events.cells


def in_own_namespace() -> None:
    """Run this benchmark again in a network namespace with loopback only, and exit with its status."""
    script = 'ip link set lo up && exec "$0" "$@"'
    command = ["unshare", "--net", "--", "sh", "-c", script, sys.executable, *sys.argv]
    sys.exit(subprocess.run(command, env=os.environ | {IN_NAMESPACE: "1"}, check=False).returncode)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def ray_table(spec: dict[str, Any], cpus: int) -> tuple[float, float, float, dict[int, dict[str, Any]]]:
    """(``ray start`` s, the driver joining s, the table s, its cells) on a head of ``cpus`` CPUs."""
    folder = Path(tempfile.mkdtemp(prefix="rb", dir="/tmp"))  # short: Ray's socket paths are limited
    port = free_port()
    started = time.perf_counter()
    subprocess.run([str(RAY), "start", "--head", "--node-ip-address", "127.0.0.1", "--port", str(port),
                    "--disable-usage-stats", "--include-dashboard=false", "--num-gpus", "0",
                    "--num-cpus", str(cpus), "--temp-dir", str(folder)],
                   env=os.environ | RAY_ENV, cwd=folder, check=True, capture_output=True)
    cluster_s = time.perf_counter() - started
    try:
        runner = RayRunner(f"127.0.0.1:{port}", analysis_workers=1)
        assert runner.cluster.wait_connected(120), runner.cluster.unreachable()
        join_s = time.perf_counter() - started - cluster_s
        try:
            table_s, cells = table(runner, spec)
        finally:
            runner.close()
    finally:
        subprocess.run([str(RAY), "stop", "--force"], env=os.environ | RAY_ENV, check=False,
                       capture_output=True)
    return cluster_s, join_s, table_s, cells


def main() -> None:
    if os.environ.get(IN_NAMESPACE) != "1":
        in_own_namespace()
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="bert-base-uncased")
    parser.add_argument("--cpus", type=int, default=2, help="the Ray head's CPUs: cells at once")
    args = parser.parse_args()
    warnings.simplefilter("ignore", FutureWarning)
    local = LocalRunner(estimate_workers=1, gpu_lanes=[], analysis_workers=1)
    spec = normalize({"model": args.model, "backend": "estimate"}, Settings(), local.environment).to_json()
    cells = len(spec["seq_lens"]) * len(spec["modes"])
    try:
        local_s, local_cells = table(local, spec)
    finally:
        local.close()
    print(f"local runner: {cells} cells in {local_s:.1f} s")

    cluster_s, join_s, ray_s, ray_cells = ray_table(spec, args.cpus)
    print(f"Ray start-up: ray start {cluster_s:.1f} s, the driver joining {join_s:.1f} s "
          "(not in the table's time)")
    print(f"RayRunner, {args.cpus} CPUs: {cells} cells in {ray_s:.1f} s")
    # The answers must agree; the probes may not: a cell resumed from stored cells fits its hints from
    # their probe logs (tune_table's memory_model), one run straight through from its own search.
    differ = [p for p, cell in local_cells.items()
              if cell["max_batch_size"] != ray_cells.get(p, {}).get("max_batch_size")]
    print(f"the same max batch in every cell: {not differ and local_cells.keys() == ray_cells.keys()}"
          + (f" (differ at positions {differ})" if differ else ""))
    print("probes: local {}, Ray {}".format(sum(c["probes"] for c in local_cells.values()),
                                            sum(c["probes"] for c in ray_cells.values())))


if __name__ == "__main__":
    main()
