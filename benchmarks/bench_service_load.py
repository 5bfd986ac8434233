"""The service under load (issue #13), on loopback: a real ``autotune serve`` while it runs a 24-cell
table (BERT-base on the estimator):

- 20 clients of mixed reads (health, the tables list, the run, the dashboard's pages, a check a
  stored table answers, and an explain the cache answers after its first time), as fast as they go;
- a burst of 40 abandoned heavy requests (explains of an 8B model with every lever, given up after
  one second) ten seconds in;
- a prober asking /v1/health every 50 ms throughout.

Prints throughput, p50/p95/p99 per kind of read, health latency before, during and after the burst,
and every error (an error is any 5xx other than the 503 of a full analysis pool, or a transport
failure). Goal: health p99 under 100 ms throughout, no error.

    python benchmarks/bench_service_load.py [--seconds 60]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
START_TIMEOUT_S = 90.0  # for the server to answer /v1/health, as tests/liveserver.py waits
HEAVY = "/v1/explain?model=meta-llama/Llama-3.1-8B&levers=true&mode=bf16&seq_len={seq_len}"
CHECK = "/v1/check?model=bert-base-uncased&seq_len=128&batch_size=32&mode=amp&gpu=T4"
EXPLAIN = "/v1/explain?model=tiny-bert&seq_len=64&mode=fp32&levers=false"


PROBER = '''
import sys, time, httpx
url, out = sys.argv[1], sys.argv[2]
with httpx.Client(base_url=url, timeout=30.0) as client, open(out, "w") as f:
    while True:
        t0 = time.perf_counter()
        try:
            ok = client.get("/v1/health").status_code == 200
        except httpx.HTTPError:
            ok = False
        f.write(f"{time.monotonic()}\\t{time.perf_counter() - t0}\\t{int(ok)}\\n")
        f.flush()
        time.sleep(0.05)
'''


@contextlib.contextmanager
def serving(folder: Path) -> Iterator[httpx.Client]:
    """A real ``autotune serve`` (``python -m autotune.cli.serve``) on a free loopback port, with two
    estimate workers, its database and log in ``folder``: a client of it (``base_url`` its URL).
    Stopped on leaving as Ctrl-C stops it (SIGINT), killed if it has not exited 30 s later."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))  # its workers' too
    with (folder / "server.log").open("ab") as log, httpx.Client(base_url=f"http://127.0.0.1:{port}",
                                                                  timeout=10.0) as client:
        proc = subprocess.Popen(
            [sys.executable, "-m", "autotune.cli.serve", "--port", str(port), "--db", str(folder / "load.db"),
             "--log-level", "warning"],
            cwd=ROOT, env=os.environ | {"PYTHONPATH": path, "AUTOTUNE_ESTIMATE_WORKERS": "2"}, stdout=log,
            stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + START_TIMEOUT_S
            while not _healthy(client):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"the server did not start: see {folder / 'server.log'}")
                time.sleep(0.1)
            yield client
        finally:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _healthy(client: httpx.Client) -> bool:
    try:
        return client.get("/v1/health").status_code == 200
    except httpx.TransportError:
        return False


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="how long the clients read (default 60)")
    parser.add_argument("--clients", type=int, default=20, help="concurrent readers (default 20)")
    args = parser.parse_args()

    folder = Path(tempfile.mkdtemp(prefix="autotune-load-"))
    latencies: dict[str, list[float]] = collections.defaultdict(list)
    health: list[tuple[float, float]] = []  # (time since start, latency)
    errors: list[str] = []
    lock = threading.Lock()
    stop = threading.Event()
    with serving(folder) as server:
        base_url = str(server.base_url)
        run = server.post("/v1/tables", json={"model": "bert-base-uncased", "gpu": "T4"}).json()
        run_id = run["id"]
        reads = [("health", "/v1/health"), ("tables", "/v1/tables"), ("run", f"/v1/tables/{run_id}"),
                 ("home", "/"), ("runs", "/runs"), ("run page", f"/runs/{run_id}"), ("check", CHECK),
                 ("explain (cached)", EXPLAIN)]
        server.get(EXPLAIN, timeout=120)  # the explain's first time: later ones hit the cache
        # The 8B model's config class is imported at its first request (seconds, under the GIL): done
        # here, with a length the model refuses, so that the burst measures the pool, not an import.
        server.get(HEAVY.format(seq_len=10**6), timeout=120)
        started = time.monotonic()

        def record(kind: str, seconds: float, status: int | None, detail: str = "") -> None:
            with lock:
                latencies[kind].append(seconds)
                if status is None or (status >= 500 and status != 503):
                    errors.append(f"{kind}: {status} {detail[:200]}")

        def reader(index: int) -> None:
            with httpx.Client(base_url=base_url, timeout=30.0) as client:
                i = index
                while not stop.is_set():
                    kind, url = reads[i % len(reads)]
                    i += 1
                    t0 = time.perf_counter()
                    try:
                        response = client.get(url)
                        record(kind, time.perf_counter() - t0, response.status_code, response.text)
                    except httpx.HTTPError as exc:
                        record(kind, time.perf_counter() - t0, None, repr(exc))

        # The prober is a process of its own: in this one, 60 client threads would make it wait for
        # the GIL, and that wait would be counted as the server's latency.
        probes = folder / "health.tsv"
        prober = subprocess.Popen([sys.executable, "-c", PROBER, base_url, str(probes)])

        burst: dict[str, float] = {}

        # Made before the burst: an httpx client builds an SSL context (milliseconds of CPU), and on
        # this machine the attacker's CPU is the server's.
        burst_clients = [httpx.Client(base_url=base_url, timeout=1.0) for _ in range(40)]

        def abandon(i: int) -> None:
            try:
                with burst_clients[i] as client:
                    status = client.get(HEAVY.format(seq_len=512 * (1 + i % 8))).status_code
                if status != 503:
                    with lock:
                        errors.append(f"heavy: {status}")
            except httpx.TimeoutException:
                pass  # abandoned, as meant

        def burster() -> None:
            stop.wait(10.0)
            burst["start"] = time.monotonic() - started
            threads = [threading.Thread(target=abandon, args=(i,)) for i in range(40)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            burst["end"] = time.monotonic() - started + 5.0  # the workers' kill included

        threads = [threading.Thread(target=reader, args=(i,)) for i in range(args.clients)]
        threads.append(threading.Thread(target=burster))
        for t in threads:
            t.start()
        time.sleep(args.seconds)
        stop.set()
        for t in threads:
            t.join()
        prober.terminate()
        prober.wait()
        elapsed = time.monotonic() - started
        for line in probes.read_text().splitlines():
            at, latency, ok = line.split("\t")
            health.append((float(at) - started, float(latency)))
            if ok != "1":
                errors.append("health: failed")
        final = server.get(f"/v1/tables/{run_id}").json()

    total = sum(len(v) for v in latencies.values())
    progress = final["progress"]
    print(f"{args.clients} clients for {elapsed:.0f} s during a {progress['total']}-cell run (status "
          f"{final['status']}, {progress['done']} cells done): {total} reads, {total / elapsed:.0f}/s")
    print(f"{'read':<18}{'n':>6}{'p50 ms':>9}{'p95 ms':>9}{'p99 ms':>9}")
    for kind, values in latencies.items():
        print(f"{kind:<18}{len(values):>6}{percentile(values, .5) * 1e3:>9.1f}"
              f"{percentile(values, .95) * 1e3:>9.1f}{percentile(values, .99) * 1e3:>9.1f}")
    windows = {"before the burst": lambda t: t < burst.get("start", 1e9),
               "during the burst": lambda t: burst.get("start", 1e9) <= t <= burst.get("end", -1),
               "after the burst": lambda t: t > burst.get("end", 1e9)}
    for name, inside in windows.items():
        values = [latency for t, latency in health if inside(t)]
        if values:
            print(f"health {name:<17} n={len(values):<5} p50 {statistics.median(values) * 1e3:.1f} ms, "
                  f"p99 {percentile(values, .99) * 1e3:.1f} ms, max {max(values) * 1e3:.1f} ms")
    print(f"errors: {len(errors)}" + "".join(f"\n  {e}" for e in errors[:20]))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
