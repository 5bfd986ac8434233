"""Latency of GET /v1/check answered from a stored table (goal: well under 50 ms).

    PYTHONPATH=.:tests python benchmarks/bench_check.py
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

from fastapi.testclient import TestClient

from api.main import create_app
from api.runs.runner import LocalRunner
from api.settings import Settings
from tests.api.test_check import QUERY, _store_measured_table

REQUESTS = 200


def main() -> None:
    db = Path(tempfile.mkdtemp()) / "bench.db"
    app = create_app(Settings(db=db), runner=LocalRunner(estimate_workers=0, gpu_lanes=[]))
    with TestClient(app, base_url="http://localhost") as client:  # a host the server answers to
        _store_measured_table(client, max_batch=6)
        assert client.get("/v1/check", params=QUERY).json()["source"] == "measured"
        times = []
        for _ in range(REQUESTS):
            started = time.perf_counter()
            client.get("/v1/check", params=QUERY)
            times.append((time.perf_counter() - started) * 1000)
    times.sort()
    p95 = times[int(0.95 * REQUESTS)]
    print(f"GET /v1/check from a stored table, {REQUESTS} requests: median "
          f"{statistics.median(times):.1f} ms, p95 {p95:.1f} ms, max {times[-1]:.1f} ms")


if __name__ == "__main__":
    main()
