"""A 24-cell estimate table through RayRunner on a local Ray cluster against the local runner.

    PYTHONPATH=.:tests .venv/bin/python benchmarks/bench_fleet.py [--model bert-base-uncased] [--cpus 2]

The default BERT-base table (6 sequence lengths x 4 modes) on the estimator, once through
LocalRunner (one worker process runs the table) and once through RayRunner on a cluster of one head
with ``--cpus`` CPUs (a task per cell; the cells of a mode in order, the modes at once). Both must
give the same cells. Ray's start-up (``ray start``, the driver joining) is timed apart from the table.

Like the tests, the cluster runs on loopback inside a network namespace of its own (tests/fleet.py:
it needs root), so nothing leaves the machine.
"""

from __future__ import annotations

import argparse
import threading
import time
import warnings
from typing import Any

from fleet import Namespace, ray_start

from api.runs.runner import LocalRunner, RunOrder
from api.runs.spec import normalize
from api.settings import Settings


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


def main() -> None:
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

    from liveserver import free_port

    from api.fleet.runner import RayRunner

    namespace = Namespace()
    try:
        import tempfile
        from pathlib import Path

        folder = Path(tempfile.mkdtemp(prefix="rb", dir="/tmp"))
        port = free_port()
        started = time.perf_counter()
        ray_start(("--head", "--port", str(port), "--include-dashboard=false", "--num-gpus", "0",
                   "--num-cpus", str(args.cpus), "--temp-dir", str(folder)), temp_dir=folder)
        cluster_s = time.perf_counter() - started
        runner = RayRunner(f"127.0.0.1:{port}", analysis_workers=1)
        assert runner.cluster.wait_connected(120), runner.cluster.unreachable()
        join_s = time.perf_counter() - started - cluster_s
        try:
            ray_s, ray_cells = table(runner, spec)
        finally:
            runner.close()
    finally:
        namespace.close()
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
