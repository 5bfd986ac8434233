"""The Ray cluster of a fleet: joining it, and what it holds (nodes, GPU kinds, free GPUs).

A node's GPU kind is the GPU preset its label ``autotune/gpu`` names (``ray start --num-gpus 1
--labels autotune/gpu=T4``; the compose file and the KubeRay example set it per worker group).
Without that label, Ray's own ``ray.io/accelerator-type`` (what Ray detected: T4, L4, A10G, ...)
is used when it names one preset; an A100 or an H100 comes in several sizes and needs the label.
Tasks of a kind are sent with a label selector on the label that named it, so Ray places them.

``Cluster`` joins in the background and keeps a snapshot of the nodes, refreshed every
``refresh_s``: the health check reads the snapshot and never waits on the cluster, and the service
keeps serving while the cluster is unreachable (``Cluster.reachable`` says so, with why).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from api.fleet import INSTALL_HINT
from autotune.errors import BackendUnavailable, InvalidInput
from autotune.gpus import resolve_gpu

log = logging.getLogger("autotune.api")

KIND_LABEL = "autotune/gpu"  # a node's GPU kind, a preset name (autotune gpus)
ACCELERATOR_LABEL = "ray.io/accelerator-type"  # Ray's default label: the card it detected
NAMESPACE = "autotune"  # the Ray namespace of the service's driver
REFRESH_S = 2.0  # the node snapshot's age at most, while connected
RECONNECT_S = 10.0  # between attempts to join an unreachable cluster


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
    """The connection to the Ray cluster at ``address``, kept up by a thread of its own."""

    def __init__(self, address: str, *, refresh_s: float = REFRESH_S,
                 reconnect_s: float = RECONNECT_S) -> None:
        self.ray = import_ray()
        self.address = address
        self.refresh_s = refresh_s
        self.reconnect_s = reconnect_s
        self._lock = threading.Lock()
        self._connected = threading.Event()
        self._stop = threading.Event()
        self._snapshot = Snapshot()
        self._error: str | None = None
        self._since = time.time()  # epoch s: of the current state
        self._thread = threading.Thread(target=self._loop, name="ray cluster", daemon=True)
        self._thread.start()

    # --- state ---------------------------------------------------------------------------

    @property
    def reachable(self) -> bool:
        return self._connected.is_set()

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

    def lost(self, exc: BaseException) -> None:
        """A call to the cluster failed as if it were gone: read it again (and rejoin if it is)."""
        log.warning("Ray cluster at %s: %s", self.address, exc)
        with contextlib.suppress(Exception):
            self._refresh()

    def describe(self) -> dict[str, Any]:
        with self._lock:
            snapshot, error, since = self._snapshot, self._error, self._since
        state = "connected" if self.reachable else "unreachable"
        return {"address": self.address, "status": state, "error": None if self.reachable else error,
                "since": since, **snapshot.describe()}

    # --- the connection's thread -----------------------------------------------------------

    def _loop(self) -> None:
        while not self._stop.is_set():
            if not self.reachable:
                self._join()
            else:
                with contextlib.suppress(Exception):  # _refresh records what went wrong
                    self._refresh()
            self._stop.wait(self.refresh_s if self.reachable else self.reconnect_s)

    def _join(self) -> None:
        ray = self.ray
        try:
            if ray.is_initialized():
                ray.shutdown()
            ray.init(**init_options(self.address))
            self._refresh()
        except Exception as exc:  # ConnectionError, a timeout, a version mismatch: said as it is
            with contextlib.suppress(Exception):
                ray.shutdown()
            self._set(False, f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc) else ''}")
            return
        log.info("joined the Ray cluster at %s: %s", self.address, self.snapshot().describe()["kinds"])

    def _refresh(self) -> None:
        try:
            nodes = read_nodes(self.ray)
        except Exception as exc:
            self._set(False, f"{type(exc).__name__}: {exc}")
            raise
        with self._lock:
            self._snapshot = Snapshot(tuple(nodes))
        self._set(True, None)

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
        self._stop.set()
        self._thread.join(timeout=5.0)
        if not self._thread.is_alive() and self.ray.is_initialized():
            with contextlib.suppress(Exception):
                self.ray.shutdown()
