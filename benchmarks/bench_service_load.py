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

``--attack slow-headers`` (issue #37) measures instead the latency of ``/v1/tables`` and of the
dashboard (``/``) for a few readers before and during a slowloris: ``--connections`` (1,000)
connections from ``--addresses`` other loopback addresses (127.0.0.2 and up) that each send a request
line, then a header line every 5 s and never the blank line that ends the head; a connection the
server closes (408 after AUTOTUNE_HEADER_TIMEOUT_S) or refuses (503 beyond
AUTOTUNE_MAX_CONNECTIONS_PER_CLIENT or AUTOTUNE_MAX_CONNECTIONS) is opened again at once, or a second
later when refused. Prints p50/p95/p99 per page and window, and what the attack's connections met.
Goal: p99 under 100 ms throughout.

``--attack slow-bodies`` does the same with ``--connections`` (40) POSTs of /v1/tables that send
their head whole, then one byte of a 10 kB body (under the server's 16 kB limit) every 5 s: each
is answered 408 after AUTOTUNE_BODY_TIMEOUT_S and opened again at once, so the attack never lets go.

    python benchmarks/bench_service_load.py [--seconds 60]
    python benchmarks/bench_service_load.py --attack slow-headers [--seconds 40] [--connections 1000]
    python benchmarks/bench_service_load.py --attack slow-bodies [--seconds 40] [--connections 40]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import resource
import selectors
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
SERVER_PIDS: dict[Path, int] = {}  # the server process of each serving() folder
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
        SERVER_PIDS[folder] = proc.pid
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


SLOW_LINE_S = 5.0  # a slowloris's header line (or a slow body's byte), every this many seconds
# A slow body: a POST's whole head, then the body's first byte; one more byte every SLOW_LINE_S.
SLOW_BODY_HEAD = (b"POST /v1/tables HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 10000\r\n\r\n{")


class Slowloris:
    """``connections`` slow-header (or, with ``bodies``, slow-body) connections from ``addresses``
    loopback addresses, kept up from one thread with a selector (opened again as the server closes
    or refuses them)."""

    def __init__(self, port: int, connections: int, addresses: int, bodies: bool = False) -> None:
        self.port, self.connections, self.addresses, self.bodies = port, connections, addresses, bodies
        self.counts: collections.Counter[str] = collections.Counter()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="slowloris", daemon=True)

    def _open(self, selector: selectors.BaseSelector, index: int) -> None:
        source = f"127.0.0.{2 + index % self.addresses}"
        try:
            sock = socket.create_connection(("127.0.0.1", self.port), timeout=5.0, source_address=(source, 0))
            sock.sendall(SLOW_BODY_HEAD if self.bodies else b"GET /v1/tables HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        except OSError:
            self.counts["connect failed"] += 1
            return
        sock.setblocking(False)
        selector.register(sock, selectors.EVENT_READ, index)
        self.counts["opened"] += 1

    def _run(self) -> None:
        selector = selectors.DefaultSelector()
        later: list[tuple[float, int]] = []  # (when, index): refused, opened again a second later
        for index in range(self.connections):
            self._open(selector, index)
        next_line = time.monotonic() + SLOW_LINE_S
        while not self.stop.is_set():
            for key, _ in selector.select(timeout=0.1):
                sock = key.fileobj
                try:
                    data = sock.recv(4096)  # type: ignore[union-attr]
                except OSError:
                    data = b""
                selector.unregister(sock)
                sock.close()  # type: ignore[union-attr]
                if data.startswith(b"HTTP/1.1 503"):
                    self.counts["refused (503)"] += 1
                    later.append((time.monotonic() + 1.0, key.data))
                else:
                    status = data.split(b" ", 2)[1].decode() if data.startswith(b"HTTP/1.1 ") else ""
                    self.counts[f"closed ({status})" if status else "closed"] += 1
                    self._open(selector, key.data)
            now = time.monotonic()
            for when, index in [item for item in later if item[0] <= now]:
                later.remove((when, index))
                self._open(selector, index)
            if now >= next_line:
                next_line = now + SLOW_LINE_S
                for key in list(selector.get_map().values()):
                    with contextlib.suppress(OSError):
                        key.fileobj.send(b" " if self.bodies else b"X-Slow: 1\r\n")  # type: ignore[union-attr]
        self.counts["open at the end"] = len(selector.get_map())
        for key in list(selector.get_map().values()):
            key.fileobj.close()  # type: ignore[union-attr]
        selector.close()


def under_attack(args: argparse.Namespace) -> int:
    """The ``--attack slow-headers`` and ``slow-bodies`` benchmarks (module docstring)."""
    folder = Path(tempfile.mkdtemp(prefix="autotune-slowloris-"))
    samples: dict[tuple[str, str], list[float]] = collections.defaultdict(list)
    errors: list[str] = []
    window = ["before"]
    stop = threading.Event()
    with serving(folder) as server:
        base_url = str(server.base_url)
        port = server.base_url.port
        assert port is not None

        def reader(index: int) -> None:
            pages = [("tables", "/v1/tables"), ("dashboard", "/")]
            with httpx.Client(base_url=base_url, timeout=30.0) as client:
                i = index
                while not stop.is_set():
                    kind, url = pages[i % 2]
                    i += 1
                    t0 = time.perf_counter()
                    try:
                        status = client.get(url).status_code
                    except httpx.HTTPError as exc:
                        errors.append(f"{kind}: {exc!r}")
                        continue
                    samples[(window[0], kind)].append(time.perf_counter() - t0)
                    if status != 200:
                        errors.append(f"{kind}: {status}")
                    time.sleep(0.05)

        readers = [threading.Thread(target=reader, args=(i,)) for i in range(args.clients)]
        for t in readers:
            t.start()
        time.sleep(10.0)
        # The attacker's descriptors, raised once the server started with the shell's (ulimit -n).
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft < args.connections + 256:
            resource.setrlimit(resource.RLIMIT_NOFILE, (min(args.connections + 256, hard), hard))
        attack = Slowloris(port, args.connections, args.addresses, bodies=args.attack == "slow-bodies")
        window[0] = "during"
        attack.thread.start()
        fds = []  # the server's open descriptors, once a second
        for _ in range(int(args.seconds)):
            time.sleep(1.0)
            with contextlib.suppress(OSError):
                fds.append(len(os.listdir(f"/proc/{SERVER_PIDS[folder]}/fd")))
        stop.set()
        for t in readers:
            t.join()
        attack.stop.set()
        attack.thread.join()

    what = "a body byte" if attack.bodies else "a header line"
    print(f"{args.attack}: {args.connections} connections from {args.addresses} address(es), {what} "
          f"every {SLOW_LINE_S:g} s, for {args.seconds:.0f} s; {args.clients} readers from 127.0.0.1; "
          f"load average {os.getloadavg()[0]:.1f}")
    print("attack: " + ", ".join(f"{k} {v}" for k, v in attack.counts.items()))
    if fds:
        print(f"server's open descriptors during the attack: median {statistics.median(fds):.0f}, "
              f"max {max(fds)}")
    print(f"{'page':<11}{'window':<8}{'n':>6}{'p50 ms':>9}{'p95 ms':>9}{'p99 ms':>9}{'max ms':>9}")
    for (name, kind), values in sorted(samples.items(), key=lambda kv: (kv[0][1], kv[0][0] != "before")):
        print(f"{kind:<11}{name:<8}{len(values):>6}{percentile(values, .5) * 1e3:>9.1f}"
              f"{percentile(values, .95) * 1e3:>9.1f}{percentile(values, .99) * 1e3:>9.1f}"
              f"{max(values) * 1e3:>9.1f}")
    print(f"errors: {len(errors)}" + "".join(f"\n  {e}" for e in errors[:20]))
    return 1 if errors else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="how long the clients read (default 60)")
    parser.add_argument("--clients", type=int, default=None,
                        help="concurrent readers (default 20; 4 with --attack)")
    parser.add_argument("--attack", choices=("slow-headers", "slow-bodies"), default=None,
                        help="measure the pages during this attack instead (module docstring)")
    parser.add_argument("--connections", type=int, default=None,
                        help="the attack's connections (default 1000 slow headers, 40 slow bodies)")
    parser.add_argument("--addresses", type=int, default=1,
                        help="loopback addresses the slow headers come from, 127.0.0.2 and up (default 1)")
    args = parser.parse_args()
    if args.attack is not None:
        args.clients = 4 if args.clients is None else args.clients
        if args.connections is None:
            args.connections = 1000 if args.attack == "slow-headers" else 40
        return under_attack(args)
    args.clients = 20 if args.clients is None else args.clients

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
