"""The Ray cluster of a fleet: joining it, and what it holds (nodes, GPU kinds, free GPUs).

A node's GPU kind is the GPU preset its label ``autotune/gpu`` names (``ray start --num-gpus 1
--labels autotune/gpu=T4``; the compose file and the KubeRay example set it per worker group).
Without that label, Ray's own ``ray.io/accelerator-type`` (what Ray detected: T4, L4, A10G, ...)
is used when it names one preset; an A100 or an H100 comes in several sizes and needs the label.
Tasks of a kind are sent with a label selector on the label that named it, so Ray places them.

``Cluster`` joins through a Ray driver of its own process (api/fleet/driver.py: Ray ends a driver that
lost its GCS, and the service must outlive that), started and watched in the background. The driver says
what the nodes are every ``refresh_s``; the health check reads the last snapshot and never waits on the
cluster, and the service keeps serving while the cluster is unreachable (``Cluster.reachable`` says so,
with why) and joins it again by itself when it is back.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pickle
import queue
import socket
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from api.fleet import INSTALL_HINT
from autotune.errors import BackendUnavailable, InvalidInput
from autotune.gpus import resolve_gpu
from autotune.processes import SOURCE_ROOT, Child, child_env, exit_reason

log = logging.getLogger("autotune.api")

KIND_LABEL = "autotune/gpu"  # a node's GPU kind, a preset name (autotune gpus)
ACCELERATOR_LABEL = "ray.io/accelerator-type"  # Ray's default label: the card it detected
NAMESPACE = "autotune"  # the Ray namespace of the service's driver
REFRESH_S = 2.0  # the node snapshot's age at most, while connected
RECONNECT_S = 10.0  # between attempts to join a cluster whose head answers but a driver could not join
PROBE_S = 1.0  # between probes of the head's port (two refused in a row: the cluster is unreachable)
PROBE_TIMEOUT_S = 2.0  # for the head's port to take a connection
STALE_S = 30.0  # a driver that says nothing of the nodes this long has lost its GCS (one that stopped)
JOIN_TIMEOUT_S = 120.0  # for a new driver to join: ray.init on a loaded machine takes seconds
DRIVER_COMMAND = (sys.executable, "-m", "api.fleet.driver")


def import_ray() -> ModuleType:
    """Ray, or BackendUnavailable saying how to install it."""
    try:
        import ray
    except ImportError as exc:
        raise BackendUnavailable(f"a fleet runs on Ray, which is not installed: {INSTALL_HINT}") from exc
    return ray


@dataclass(frozen=True)
class Node:
    """One alive node of the cluster, as the last snapshot saw it."""

    node_id: str  # Ray's node id, hex
    address: str  # the address the node advertises
    kind: str | None  # its GPU kind (a preset name); None: no GPU, or a card no label names
    selector: Mapping[str, str]  # the label selector that picks nodes of its kind
    gpus: float
    free_gpus: float
    cpus: float
    free_cpus: float


def node_kind(labels: Mapping[str, str]) -> tuple[str | None, dict[str, str]]:
    """A node's GPU kind and the label selector of that kind, from its labels."""
    named = labels.get(KIND_LABEL)
    if named:
        try:
            return resolve_gpu(named).name, {KIND_LABEL: named}
        except InvalidInput:
            return named, {KIND_LABEL: named}  # a card without a preset: listed, never a target
    detected = labels.get(ACCELERATOR_LABEL)
    if detected:
        try:
            return resolve_gpu(detected).name, {ACCELERATOR_LABEL: detected}
        except InvalidInput:  # A100, H100: more than one size
            return None, {}
    return None, {}


def read_nodes(ray: ModuleType) -> list[Node]:
    """The alive nodes of the cluster ``ray`` is connected to."""
    try:
        from ray._private.state import available_resources_per_node

        free = available_resources_per_node()
    except Exception:  # not through Ray Client (ray://): the free share is not known there
        free = {}
    nodes = []
    for info in ray.nodes():
        if not info.get("Alive"):
            continue
        node_id = info["NodeID"]
        total = info.get("Resources", {})
        available = free.get(node_id, {}) if free else total  # Ray Client: the totals
        gpus = float(total.get("GPU", 0))
        kind, selector = node_kind(info.get("Labels") or {}) if gpus else (None, {})
        nodes.append(Node(node_id=node_id, address=str(info.get("NodeManagerAddress")), kind=kind,
                          selector=selector, gpus=gpus, free_gpus=float(available.get("GPU", 0)),
                          cpus=float(total.get("CPU", 0)), free_cpus=float(available.get("CPU", 0))))
    return nodes


@dataclass(frozen=True)
class Snapshot:
    """What the cluster held when last read."""

    nodes: tuple[Node, ...] = ()
    taken_at: float = field(default_factory=time.time)  # epoch s

    def kinds(self) -> dict[str, list[Node]]:
        """GPU kind -> its nodes, in name order."""
        found: dict[str, list[Node]] = {}
        for node in self.nodes:
            if node.kind is not None:
                found.setdefault(node.kind, []).append(node)
        return dict(sorted(found.items()))

    def selector(self, kind: str) -> dict[str, str] | None:
        """The label selector of ``kind``'s nodes (the first node's, when nodes differ), or None."""
        nodes = self.kinds().get(kind)
        return dict(nodes[0].selector) if nodes else None

    def describe(self) -> dict[str, Any]:
        return {
            "kinds": [{"kind": kind, "nodes": len(nodes), "gpus": sum(n.gpus for n in nodes),
                       "free_gpus": sum(n.free_gpus for n in nodes)} for kind, nodes in self.kinds().items()],
            "nodes": [{"node_id": n.node_id, "address": n.address, "kind": n.kind, "gpus": n.gpus,
                       "free_gpus": n.free_gpus, "cpus": n.cpus, "free_cpus": n.free_cpus}
                      for n in self.nodes],
            "cpus": sum(n.cpus for n in self.nodes),
            "free_cpus": sum(n.free_cpus for n in self.nodes),
        }


def init_options(address: str) -> dict[str, Any]:
    """``ray.init``'s arguments for joining ``address`` as this service's driver."""
    options: dict[str, Any] = {"address": address, "namespace": NAMESPACE, "log_to_driver": False,
                               "configure_logging": False}
    host = address.rpartition(":")[0] if not address.startswith("ray://") else ""
    if host.startswith("127."):
        # A cluster on this machine's loopback: the driver joins it there too, instead of from the
        # address Ray would look up for this host (ray start --node-ip-address 127.0.0.1).
        options["_node_ip_address"] = host
    return options


class Cluster:
    """The service's side of the cluster at ``address``: its Ray driver, a process of its own
    (api/fleet/driver.py), started, watched and replaced by a thread of this one.

    The cluster is reachable while a driver has joined it and keeps saying what its nodes are. It is
    unreachable, with why, from the moment the driver exits (Ray ends a driver that lost the GCS), goes
    quiet for ``stale_s``, or the head's port refuses two probes in a row (every ``probe_s``: a killed
    GCS is seen in seconds, not after Ray's own minute); that driver is then killed, its tasks with it.
    A new one is started once the head's port answers again (after ``reconnect_s`` when a driver
    could not join), and each that joins begins a new ``epoch``: tasks of an earlier one are gone.
    """

    def __init__(self, address: str, *, setup: Any = None, refresh_s: float = REFRESH_S,
                 reconnect_s: float = RECONNECT_S, probe_s: float = PROBE_S, stale_s: float = STALE_S,
                 join_timeout_s: float = JOIN_TIMEOUT_S, command: tuple[str, ...] = DRIVER_COMMAND) -> None:
        import_ray()  # here, to say at once how to install it; this process never joins the cluster
        self.address = address
        self.refresh_s, self.reconnect_s, self.probe_s = refresh_s, reconnect_s, probe_s
        self.stale_s, self.join_timeout_s, self.command = stale_s, join_timeout_s, command
        self._setup = pickle.dumps(setup).hex() if setup is not None else None
        self._lock = threading.Lock()
        self._connected = threading.Event()
        self._stop = threading.Event()
        self._snapshot = Snapshot()
        self._error: str | None = None
        self._since = time.time()  # epoch s: of the current state
        self._driver: Child | None = None
        self._started_at = 0.0  # monotonic s: the driver's start
        self._heard_at = 0.0  # monotonic s: its last word of the nodes
        self._refused: str | None = None  # why the driver could not join, as it said
        self._gcs: str | None = None  # the GCS's HOST:PORT, as a driver said (``auto`` names none)
        self._epoch = 0
        self._messages: queue.Queue[tuple[int, dict[str, Any]]] = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name="ray cluster", daemon=True)
        self._thread.start()

    # --- state ---------------------------------------------------------------------------

    @property
    def reachable(self) -> bool:
        return self._connected.is_set()

    @property
    def epoch(self) -> int | None:
        """The number of the driver that has joined (1, 2, ...), None while unreachable."""
        with self._lock:
            return self._epoch if self.reachable else None

    def wait_connected(self, timeout_s: float) -> bool:
        return self._connected.wait(timeout_s)

    def snapshot(self) -> Snapshot:
        with self._lock:
            return self._snapshot

    def unreachable(self) -> str:
        """Why the cluster cannot take work now (for a 503 and the health check)."""
        with self._lock:
            why = self._error or "still joining it"
        return f"the Ray cluster at {self.address} is unreachable ({why})"

    def describe(self) -> dict[str, Any]:
        with self._lock:
            snapshot, error, since = self._snapshot, self._error, self._since
        state = "connected" if self.reachable else "unreachable"
        return {"address": self.address, "status": state, "error": None if self.reachable else error,
                "since": since, **snapshot.describe()}

    # --- the tasks, through the driver -------------------------------------------------------

    def send(self, task_id: int, backend: str, order: dict[str, Any], selector: dict[str, str]) -> bool:
        """Hand a cell to the driver (api/fleet/driver.py); False when there is none to take it."""
        return self._tell({"op": "send", "id": task_id, "backend": backend, "order": order,
                           "selector": selector})

    def cancel(self, task_id: int) -> None:
        self._tell({"op": "cancel", "id": task_id})

    def messages(self, timeout_s: float) -> list[tuple[int, dict[str, Any]]]:
        """What the drivers said of their tasks since the last call, each with the driver's epoch;
        waits up to ``timeout_s`` for the first."""
        try:
            found = [self._messages.get(timeout=timeout_s)]
        except queue.Empty:
            return []
        with contextlib.suppress(queue.Empty):
            while True:
                found.append(self._messages.get_nowait())
        return found

    def _tell(self, message: dict[str, Any]) -> bool:
        with self._lock:
            driver = self._driver if self.reachable else None
        if driver is None:
            return False
        if not driver.send(json.dumps(message) + "\n"):
            self._set(False, "the Ray driver process is gone")
            return False
        return True

    # --- the driver's thread -----------------------------------------------------------------

    def _loop(self) -> None:
        failed_probes, next_try = 0, 0.0
        while not self._stop.is_set():
            with self._lock:
                driver, gcs = self._driver, self._gcs
            # A driver's GCS, as it said; else the address given (``auto``: none to probe, a driver tries).
            refused = probe(gcs if driver is not None and gcs else self.address)
            failed_probes = failed_probes + 1 if refused else 0
            now = time.monotonic()
            if driver is None:
                if refused:
                    self._set(False, refused)
                elif now >= next_try:
                    self._start()
            else:
                why = self._trouble(driver, now, refused if failed_probes >= 2 else None)
                if why is not None:
                    self._drop(driver, why)
                    next_try = now + (self.probe_s if self._joined_once() else self.reconnect_s)
            self._stop.wait(self.probe_s)

    def _trouble(self, driver: Child, now: float, refused: str | None) -> str | None:
        """Why ``driver`` must go, or None while it does its work."""
        with self._lock:
            heard, refused_join = self._heard_at, self._refused
        if driver.poll() is not None:
            if refused_join is not None:
                return refused_join
            lines = [line.strip() for line in driver.stderr_tail() if line.strip()]
            said = f"; its stderr ends with: {lines[-1][:300]}" if lines else ""
            return f"the Ray driver process {exit_reason(driver.poll())}{said}"
        if refused is not None:
            return refused
        if heard == 0.0 and now - self._started_at > self.join_timeout_s:
            return f"could not join it within {self.join_timeout_s:g} s"
        if heard and now - heard > self.stale_s:
            return f"its GCS has not answered for {now - heard:.0f} s"
        return None

    def _joined_once(self) -> bool:
        with self._lock:
            return self._heard_at != 0.0

    def _start(self) -> None:
        # The driver imports what this process can: the tasks' setup is unpickled there (the tests').
        path = os.pathsep.join([str(SOURCE_ROOT), *(p for p in sys.path if p)])
        driver = Child(self.command, env=child_env({"PYTHONPATH": path}), own_group=True)
        with self._lock:
            self._driver, self._started_at, self._heard_at = driver, time.monotonic(), 0.0
            self._refused = None
        driver.send(json.dumps({"op": "join", "address": self.address, "setup": self._setup,
                                "refresh_s": self.refresh_s}) + "\n")
        threading.Thread(target=self._read, args=(driver,), name="ray driver", daemon=True).start()

    def _read(self, driver: Child) -> None:
        """The driver's lines: its nodes here, its tasks' news to ``messages``."""
        epoch = 0
        for line in driver.replies():
            try:
                message = json.loads(line)
            except ValueError:
                continue
            if message.get("op") == "nodes":
                nodes = tuple(Node(**n) for n in message["nodes"])
                with self._lock:
                    if self._driver is not driver:
                        return
                    joined, self._heard_at = self._heard_at == 0.0, time.monotonic()
                    self._snapshot = Snapshot(nodes)
                    self._gcs = message.get("gcs") or self._gcs
                    if joined:
                        self._epoch += 1
                        epoch = self._epoch
                if joined:
                    kinds = Snapshot(nodes).describe()["kinds"]
                    log.info("joined the Ray cluster at %s: %s", self.address, kinds)
                self._set(True, None)
            elif message.get("op") == "failed":
                with self._lock:
                    self._refused = str(message.get("error"))
                self._set(False, self._refused)
            else:  # of its tasks, sent once it joined: tagged with its own epoch
                self._messages.put((epoch, message))
        with self._lock:
            gone = self._driver is driver
        if gone and self.reachable:  # it exited: Ray ends a driver that lost the GCS
            self._set(False, "the Ray driver process exited")

    def _drop(self, driver: Child, why: str) -> None:
        log.warning("Ray cluster at %s: %s", self.address, why)
        self._set(False, why)
        with self._lock:
            self._driver, self._snapshot = None, Snapshot()
        driver.kill()
        driver.wait(5.0)
        driver.close()

    def _set(self, connected: bool, error: str | None) -> None:
        with self._lock:
            if connected != self.reachable:
                self._since = time.time()
            self._error = error
            if connected:
                self._connected.set()
            else:
                self._connected.clear()

    def close(self) -> None:
        """Stop watching, and end the driver: its stdin closed, it exits, and Ray its tasks."""
        self._stop.set()
        self._thread.join(timeout=10.0)
        with self._lock:
            driver, self._driver = self._driver, None
        self._connected.clear()
        if driver is not None:
            driver.stop(grace_s=5.0)


def probe(address: str) -> str | None:
    """Why the head at ``address`` refuses a connection, or None when it takes one (or the address
    names no port to try: ``auto``)."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        return None
    try:
        with socket.create_connection((host, int(port)), timeout=PROBE_TIMEOUT_S):
            return None
    except OSError as exc:
        return f"its head at {host}:{port} refuses connections: {type(exc).__name__}: {exc.strerror or exc}"
