"""A real Ray cluster for the fleet tests, on loopback only, inside a network namespace of its own.

Ray advertises the address its host has towards the internet even when told 127.0.0.1 (it resolves
"127.0.0.1" to the interface of the default route, which it finds by a connection towards 8.8.8.8).
So the cluster, and every process of the test that talks to it, runs in a network namespace this
helper makes, which has a loopback interface and nothing else: no traffic can leave the machine,
and what Ray advertises is 127.0.0.1. The test's own thread joins the namespace (setns), so the
driver Ray starts in the test process, the servers it starts and the browser are all inside.

``FleetCluster`` is a head (CPUs only) and one worker node per GPU kind, each with one logical
GPU (``--num-gpus 1``) and the label ``autotune/gpu=KIND``. ``cpu_probes`` is the setup each task
runs first: the cuda backend's probes go to the CPU memory stand-in (tests/cpumemory.py), and the
task says where it ran in ``tasks.jsonl``.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
RAY = Path(sys.executable).parent / "ray"
CLONE_NEWNET = 0x40000000
START_TIMEOUT_S = 60.0
ENV = {"RAY_USAGE_STATS_ENABLED": "0", "PYTHONPATH": os.pathsep.join([str(ROOT), str(TESTS)]),
       "AUTOTUNE_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}


def ray_or_skip() -> None:
    required = os.environ.get("AUTOTUNE_REQUIRE_FLEET") == "1"
    try:
        import ray  # noqa: F401
    except ImportError:
        if required:
            pytest.fail("AUTOTUNE_REQUIRE_FLEET=1 but Ray is not installed (pip install -e '.[test]')")
        pytest.skip("Ray is not installed (the [fleet] extra)")


class Namespace:
    """A network namespace with only loopback, which the calling thread (and what it starts) joins."""

    def __init__(self) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        self._setns = libc.setns
        self.holder = subprocess.Popen(["unshare", "--net", "--", "sleep", "infinity"])
        path = f"/proc/{self.holder.pid}/ns/net"
        deadline = time.monotonic() + 10
        while os.readlink(path) == os.readlink("/proc/self/ns/net"):  # unshare has not run yet
            assert self.holder.poll() is None, "unshare --net failed (it needs root)"
            assert time.monotonic() < deadline
            time.sleep(0.01)
        self.inode = os.readlink(path)
        self._theirs = os.open(path, os.O_RDONLY)
        self._ours = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        subprocess.run(["nsenter", "-t", str(self.holder.pid), "-n", "ip", "link", "set", "lo", "up"],
                       check=True)
        if self._setns(self._theirs, CLONE_NEWNET) != 0:
            self.close()
            raise OSError(ctypes.get_errno(), "setns into the test's network namespace")

    def pids(self) -> list[int]:
        """The processes in the namespace, this one and its holder left out."""
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit() and int(entry.name) not in (os.getpid(), self.holder.pid):
                with contextlib.suppress(OSError):
                    if os.readlink(entry / "ns" / "net") == self.inode:
                        found.append(int(entry.name))
        return found

    def addresses(self) -> set[str]:
        """The hosts of every TCP and UDP socket in the namespace (``ss -tuan``): where each listens
        or is bound, and the peer of each connected one."""
        out = subprocess.run(["ss", "-Htuan"], capture_output=True, text=True, check=True).stdout
        hosts = set()
        for line in out.splitlines():
            for address in line.split()[4:6]:
                host, _, port = address.rpartition(":")
                if port != "*":  # a listening socket's peer
                    hosts.add(host.strip("[]").removeprefix("::ffff:"))
        return hosts

    def close(self) -> None:
        """End every process left in the namespace (ours: it holds nothing else), then leave it."""
        for pid in self.pids():  # SIGKILL: a test's cluster has nothing to save
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while self.pids() and time.monotonic() < deadline:
            time.sleep(0.05)
        self._setns(self._ours, CLONE_NEWNET)
        self.holder.kill()
        self.holder.wait()
        os.close(self._theirs)
        os.close(self._ours)


def namespace_or_skip() -> Namespace:
    required = os.environ.get("AUTOTUNE_REQUIRE_FLEET") == "1"
    if shutil.which("unshare") is None or shutil.which("nsenter") is None or os.geteuid() != 0:
        why = "the fleet tests run Ray inside a network namespace of their own, which needs root"
        if required:
            pytest.fail(f"AUTOTUNE_REQUIRE_FLEET=1 but {why}")
        pytest.skip(why)
    return Namespace()


def ray_start(*nodes: tuple[str, ...], temp_dir: Path) -> None:
    """``ray start`` of each node at once (loopback, no usage stats); fails the test if one fails."""
    commands = [[str(RAY), "start", "--node-ip-address", "127.0.0.1", "--disable-usage-stats",
                 "--num-cpus", "1", *args] for args in nodes]
    procs = [subprocess.Popen(command, env=os.environ | ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, cwd=temp_dir) for command in commands]
    for command, proc in zip(commands, procs, strict=True):
        out = proc.communicate(timeout=START_TIMEOUT_S)[0]
        assert proc.returncode == 0, f"{' '.join(command)}:\n{out[-3000:]}"


class FleetCluster:
    """A head and one worker node per kind, in ``namespace``; ``address`` is the head's."""

    def __init__(self, namespace: Namespace, kinds: tuple[str, ...] = ("T4", "L4")) -> None:
        self.namespace = namespace
        self.dir = Path(tempfile.mkdtemp(prefix="rf", dir="/tmp"))  # short: Ray's socket paths
        self.records = self.dir / "tasks.jsonl"
        from liveserver import free_port

        port = free_port()
        self.address = f"127.0.0.1:{port}"
        started = time.monotonic()
        ray_start(("--head", "--port", str(port), "--include-dashboard=false", "--num-gpus", "0",
                   "--temp-dir", str(self.dir)), temp_dir=self.dir)
        # One node after another: nodes started at once in one temp dir may pick the same name for
        # their object store's socket, and the second raylet then dies ("bind: Address already in use").
        for kind in kinds:
            ray_start(("--address", self.address, "--num-gpus", "1", "--labels", f"autotune/gpu={kind}"),
                      temp_dir=self.dir)
        self.start_s = time.monotonic() - started

    def kill_gcs(self) -> int:
        """SIGKILL the head's GCS (``gcs_server``): the head lost, as in issue #37.3. Its pid."""
        [pid] = [p for p in self.namespace.pids() if "gcs_server" in command_of(p)]
        os.kill(pid, signal.SIGKILL)
        return pid

    def restart_head(self, keep: int) -> None:
        """End what is left of the cluster (every process in the namespace but ``keep``'s tree: the
        server and its driver) and start a head on the same port: the head back, a new cluster."""
        for pid in self.namespace.pids():
            if keep not in ancestors(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        wait_until(lambda: all(keep in ancestors(p) for p in self.namespace.pids()), "the old cluster to end",
                   timeout_s=30)
        port = self.address.rpartition(":")[2]
        ray_start(("--head", "--port", port, "--include-dashboard=false", "--num-gpus", "0",
                   "--temp-dir", str(self.dir)), temp_dir=self.dir)

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def command_of(pid: int) -> str:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    return ""


def ancestors(pid: int) -> set[int]:
    """``pid`` and the processes above it."""
    found = set()
    while pid > 1 and pid not in found:
        found.add(pid)
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return found


def tasks(records: Path) -> list[dict[str, Any]]:
    """What each task's setup recorded, in order."""
    if not records.exists():
        return []
    return [json.loads(line) for line in records.read_text().splitlines() if line.strip()]


# A limit, not a wait (polled every step_s): ample, as a Ray task importing torch on a 2-core machine
# whose cores are both taken (the fresh-clone CI beside a corpus run: load 6-10) took over a minute.
# It stretches with the load: timeout_s is for a machine with a core free, and a limit of 300 s ran
# out at load 7-10 (a fresh clone's CI beside the corpus and seven other jobs); at a load of L on N
# cores each process gets about N/L of a core, so the limit is timeout_s x L/N where L > N (the
# highest one-minute load seen while waiting).
def wait_until(predicate, what: str, timeout_s: float = 180.0, step_s: float = 0.05):
    start, stretch = time.monotonic(), 1.0
    while True:
        value = predicate()
        if value:
            return value
        stretch = max(stretch, os.getloadavg()[0] / (os.cpu_count() or 1))
        assert time.monotonic() - start < timeout_s * stretch, \
            f"gave up waiting for {what} ({timeout_s * stretch:.0f} s at load {os.getloadavg()[0]:.1f})"
        time.sleep(step_s)


def records_of(fleet: FleetCluster, run_id: str) -> list[dict[str, Any]]:
    """What the tasks of one run recorded, in order."""
    return [r for r in tasks(fleet.records) if r["run_id"] == run_id]


def finished(client: Any, run_id: str, timeout_s: float = 300.0) -> dict[str, Any]:
    """The run once it is done, failed or cancelled. Ample: each cell is a Ray task in a fresh process
    importing torch, slow on a loaded 2-core machine (CI ran three of these past a 90 s limit while
    another job held the cores). Polled every quarter second: each poll is a request the service
    answers, and a finished run stays finished."""
    return wait_until(lambda: (t := client.get(f"/v1/tables/{run_id}").json())["status"] in
                      ("done", "failed", "cancelled") and t, f"run {run_id} to finish", timeout_s,
                      step_s=0.25)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


PROBE_WORKER = (f"import sys; sys.path.insert(0, {str(TESTS)!r}); "
                "import cpumemory, autotune.backends.cuda.probe_worker as w; "
                "sys.exit(w.main(cpumemory.CpuMemory))")


class CpuProbes:
    """A task's setup: the CPU memory stand-in for the GPU, and a line saying where the task runs.

    ``hold``: a folder; while it holds a file named for the task's sequence length, the task waits
    (up to a minute) before its cell, so a test can act on a task in flight."""

    def __init__(self, records: Path, hold: Path | None = None) -> None:
        self.records, self.hold = records, hold

    def __call__(self, order: dict[str, Any]) -> None:
        import ray

        from autotune.backends.cuda import backend

        backend.CudaBackend.__init__.__kwdefaults__["worker_command"] = (sys.executable, "-c", PROBE_WORKER)
        record = {"run_id": order["run_id"], "mode": order["spec"]["modes"][0],
                  "seq_len": order["spec"]["seq_lens"][-1], "pid": os.getpid(),
                  "node": ray.get_runtime_context().get_node_id(),
                  "gpus": os.environ.get("CUDA_VISIBLE_DEVICES"), "t": time.time()}
        with self.records.open("a") as out:
            out.write(json.dumps(record) + "\n")
        deadline = time.monotonic() + 60
        while self.hold is not None and (self.hold / str(record["seq_len"])).exists():
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)


SERVER = """
import sys
from pathlib import Path
sys.path[:0] = [{root!r}, {tests!r}]
import uvicorn
from fleet import CpuProbes
from api.main import create_app
from api.fleet.runner import RayRunner
from api.settings import Settings

runner = RayRunner({address!r}, setup=CpuProbes(Path({records!r}), Path({hold!r})), analysis_workers=1,
                   watchdog_s={watchdog_s!r})
app = create_app(Settings(db=Path({db!r}), reconcile_s=1.0), runner=runner)
uvicorn.run(app, host="127.0.0.1", port={port}, log_level="warning")
"""


class FleetServer:
    """The service with a RayRunner (its tasks on the CPU stand-in) in a process of its own, on a free
    loopback port: what ``autotune serve --ray ADDRESS`` runs, for the tests that kill it (and the
    browser's). ``connected``: wait until it has joined the cluster too."""

    def __init__(self, db: Path, log: Path, address: str, records: Path, hold: Path, *,
                 connected: bool = True, watchdog_s: float = 900.0,
                 env: dict[str, str] | None = None) -> None:
        import httpx
        from liveserver import free_port

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log.open("ab")
        script = SERVER.format(root=str(ROOT), tests=str(TESTS), address=address, records=str(records),
                               hold=str(hold), db=str(db), port=self.port, watchdog_s=watchdog_s)
        self.proc = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT,
                                     env=os.environ | ENV | (env or {}), stdout=self.log,
                                     stderr=subprocess.STDOUT)
        self.client = httpx.Client(base_url=self.url, timeout=10.0)

        def answers() -> bool:
            assert self.proc.poll() is None, f"the server exited: {log.read_text()[-2000:]}"
            with contextlib.suppress(httpx.TransportError):
                return self.client.get("/v1/health").status_code == 200
            return False

        wait_until(answers, "the server to answer /v1/health", timeout_s=90)
        if connected:  # it joins the cluster in the background: until then new runs are answered 503
            wait_until(lambda: self.client.get("/v1/health").json()["fleet"]["status"] == "connected",
                       "the server to join the Ray cluster", timeout_s=60)

    def kill(self) -> None:
        """SIGKILL: no shutdown handler runs, as in a crash."""
        self.proc.kill()
        self.proc.wait()
        self.client.close()
        self.log.close()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.client.close()
        self.log.close()


# -- a fleet without Ray ----------------------------------------------------------------------------


class StaticCluster:
    """A stand-in for api.fleet.cluster.Cluster whose nodes never change (one GPU node per kind), or
    that is unreachable (``error``): what the routing and the health check read of a cluster, for the
    tests of the dashboard's fleet parts, where starting Ray would only cost time."""

    def __init__(self, kinds: tuple[str, ...] = ("T4", "L4"), *, error: str | None = None,
                 address: str = "127.0.0.1:6379") -> None:
        from api.fleet.cluster import Node, Snapshot

        self.address, self.error = address, error
        self._snapshot = Snapshot(tuple(
            Node(node_id=f"{i:056x}", address="127.0.0.1", kind=kind, selector={"autotune/gpu": kind},
                 gpus=1.0, free_gpus=1.0, cpus=1.0, free_cpus=1.0) for i, kind in enumerate(kinds, 1)))

    @property
    def reachable(self) -> bool:
        return self.error is None

    def snapshot(self):
        from api.fleet.cluster import Snapshot

        return self._snapshot if self.reachable else Snapshot()

    def unreachable(self) -> str:
        return f"the Ray cluster at {self.address} is unreachable ({self.error})"

    def describe(self) -> dict[str, Any]:
        return {"address": self.address, "status": "connected" if self.reachable else "unreachable",
                "error": self.error, "since": 0.0, **self.snapshot().describe()}


def fleet_runner(cluster: StaticCluster, analyses):
    """A runner with no lanes (its runs stay queued) that routes and describes a fleet as RayRunner
    does, with RayRunner's own ``environment`` over ``cluster``."""
    from api.fleet.runner import RayRunner
    from api.runs.runner import LocalRunner

    class FleetRunner(LocalRunner):
        environment = RayRunner.environment

        def describe(self) -> dict[str, Any]:
            return {**super().describe(), "fleet": {**self.cluster.describe(), "runs": 0, "tasks": 0}}

    runner = FleetRunner(estimate_workers=0, gpu_lanes=[], analyses=analyses)
    runner.cluster = cluster
    return runner
