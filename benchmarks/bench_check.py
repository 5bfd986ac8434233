"""Latency of a check, the question CI asks before every launch (issue 15's goals in brackets):

- ``GET /v1/check`` answered from a stored table (well under 50 ms): the H100's measured BERT-base
  12 GiB table (docs/measurements/h100-80gb/), imported at the service's start as a deployment does;
- ``GET /v1/check`` with no stored table, on the estimator: the first request, the same request
  again (the server's answer cache), and the same spec at other batch sizes (the analysis worker
  keeps the spec's estimator and traces: 0.3 s);
- ``autotune check`` of a BERT-base cell in a fresh process, wall (2 s): the first, then the same
  check again, answered from the local answer cache (cli/answers.py), and the same cell at other
  batch sizes (its memo there, replayed without torch);
- the README's check of a step that does not fit (its levers searched), first answer, fresh process:
  the levers over the usable cores (the default) and in one process (``--workers 1``).

    .venv/bin/python benchmarks/bench_check.py [--requests 200] [--cli-runs 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fastapi.testclient import TestClient  # noqa: E402

from api.main import create_app  # noqa: E402
from api.runs.runner import LocalRunner  # noqa: E402
from api.settings import Settings  # noqa: E402

MEASURED = ROOT / "docs" / "measurements" / "h100-80gb" / "bert-base-uncased-12GiB.json"
# A cell of that table: sequence classification, fp32, seq 128 on the custom 12 GiB budget (max 122).
QUERY = {"model": "bert-base-uncased", "seq_len": 128, "batch_size": 96, "mode": "fp32",
         "gpu_memory": "12GiB"}
CELL = {"model": "bert-base-uncased", "seq_len": 128, "mode": "amp", "gpu": "T4"}
CLI = [sys.executable, "-m", "autotune", "check", "bert-base-uncased", "--seq-len", "128",
       "--batch-size", "32", "--mode", "amp", "--gpu", "T4"]
NOT_FITTING = [sys.executable, "-m", "autotune", "check", "bert-base-uncased", "--seq-len", "512",
               "--batch-size", "64", "--gpu-memory", "12GiB"]


def timed(client: TestClient, params: dict[str, object]) -> float:
    started = time.perf_counter()
    response = client.get("/v1/check", params=params)
    assert response.status_code == 200, response.text
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--cli-runs", type=int, default=3)
    args = parser.parse_args()
    db = Path(tempfile.mkdtemp()) / "bench.db"
    app = create_app(Settings(db=db, measurements=(MEASURED,)),
                     runner=LocalRunner(estimate_workers=0, gpu_lanes=[]))
    with TestClient(app, base_url="http://localhost") as client:  # a host the server answers to
        assert client.get("/v1/check", params=QUERY).json()["source"] == "measured"
        times = sorted(timed(client, QUERY) * 1000 for _ in range(args.requests))
        p95 = times[int(0.95 * len(times))]
        print(f"GET /v1/check from a stored table, {args.requests} requests: median "
              f"{statistics.median(times):.1f} ms, p95 {p95:.1f} ms, max {times[-1]:.1f} ms")

        first = timed(client, {**CELL, "batch_size": 32})
        again = timed(client, {**CELL, "batch_size": 32})
        others = [timed(client, {**CELL, "batch_size": batch}) for batch in (24, 40, 48, 64)]
        print(f"GET /v1/check, no stored table (BERT-base amp seq 128 on a T4): first {first:.2f} s "
              f"(worker start, model, traces), same request {again * 1000:.0f} ms, other batch sizes "
              f"median {statistics.median(others):.2f} s, max {max(others):.2f} s")

    cache = {**os.environ, "AUTOTUNE_CACHE_DIR": tempfile.mkdtemp()}  # cold first: an empty answer cache
    walls = []
    for _ in range(1 + args.cli_runs):
        started = time.perf_counter()
        subprocess.run(CLI, check=False, capture_output=True, cwd=ROOT, env=cache)
        walls.append(time.perf_counter() - started)
    others = []
    for batch in (24, 40, 48, 64):
        started = time.perf_counter()
        done = subprocess.run([*CLI, "--batch-size", str(batch), "--json"], check=False, capture_output=True,
                              cwd=ROOT, env=cache, text=True)
        others.append(time.perf_counter() - started)
        assert '"cached": true' in done.stdout, done.stdout[-300:]
    print(f"autotune check (fresh process, BERT-base amp seq 128 batch 32 on a T4): first {walls[0]:.2f} s, "
          f"again (the answer cache) median {statistics.median(walls[1:]):.2f} s over {args.cli_runs} runs, "
          f"other batch sizes (the cell's memo) median {statistics.median(others):.2f} s")

    for extra, label in (([], "levers over the usable cores"), (["--workers", "1"], "one process")):
        started = time.perf_counter()
        done = subprocess.run([*NOT_FITTING, *extra, "--no-cache"], check=False, capture_output=True,
                              cwd=ROOT, text=True)
        assert done.returncode == 1, done.stderr  # does not fit
        print(f"autotune check, a step that does not fit (BERT-base fp32 seq 512 batch 64 on 12 GiB), "
              f"{label}: {time.perf_counter() - started:.2f} s")


if __name__ == "__main__":
    main()
