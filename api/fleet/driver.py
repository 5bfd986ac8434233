"""The fleet's Ray driver, a process of its own (``python -m api.fleet.driver``) that the service starts
and watches (api/fleet/cluster.py ``Cluster``): the service itself never joins the cluster.

Why apart: a Ray driver's core worker ends its own process when it loses the cluster's GCS. Ray 2.60's
GCS client (``src/ray/gcs_rpc_client/rpc_client.h``, in ``ray/_raylet.so``) retries for
``gcs_rpc_server_reconnect_timeout_s`` (60 s; ``RAY_gcs_rpc_server_reconnect_timeout_s``), then logs
"Failed to connect to GCS within 60 seconds. GCS may have been killed..." and exits the process. With the
driver in the server, a head whose GCS died took the whole service with it a minute later (issue #37.3),
and until then ``ray.nodes()`` answered from the driver's cache, so the service said "connected". Here
only this process goes; the service sees it go (or stop speaking) and says the cluster is unreachable.

The protocol, a JSON object a line. To the driver:

- ``{"op": "join", "address", "setup"}``: the first line; ``setup`` a hex pickle of the tasks' setup
  (RayRunner's, the tests'), or null;
- ``{"op": "send", "id", "backend", "order", "selector"}``: run a cell (api/fleet/task.py), ``cuda``
  on the nodes ``selector`` picks, ``estimate`` on any CPU;
- ``{"op": "cancel", "id"}``: stop it (``ray.cancel(force=True)``: its worker is killed).

From the driver: ``{"op": "nodes", "nodes": [Node's fields], "gcs"}`` once joined and then every ``refresh_s``
(the service's sign that the cluster answers); ``{"op": "failed", "error"}`` when it cannot join (it then
exits); per task ``{"op": "started", "id", "node", "pid"}``, ``{"op": "progress", "id"}``, and at the end
``{"op": "result", "id", "result"}`` or ``{"op": "error", "id", "type", "error", "sent"}`` (``sent``:
false when Ray refused the task). Its stdin closed, it exits: Ray ends the tasks of a gone owner.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import pickle
import queue
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from api.fleet.cluster import REFRESH_S, import_ray, init_options, read_nodes
from autotune.processes import protocol_stream

WAIT_S = 0.2  # the longest wait for a task's next word before looking at new commands


class Driver:
    """The tasks in flight of this driver, by the service's task id."""

    def __init__(self, ray: Any, say: Callable[[dict[str, Any]], None], setup: Any) -> None:
        self.ray, self.say, self.setup = ray, say, setup
        self.tasks: dict[int, Any] = {}  # id -> its ObjectRefGenerator

    def command(self, message: dict[str, Any]) -> None:
        if message["op"] == "send":
            self.send(int(message["id"]), message)
        elif message["op"] == "cancel":
            generator = self.tasks.pop(int(message["id"]), None)
            if generator is not None:
                try:
                    self.ray.cancel(generator, force=True)
                except Exception as exc:  # finished meanwhile
                    print(f"cancel {message['id']}: {exc!r}", file=sys.stderr)

    def send(self, task_id: int, message: dict[str, Any]) -> None:
        from api.fleet.task import estimate_cell, measure_cell

        try:
            if message["backend"] == "cuda":
                remote = measure_cell.options(label_selector=message["selector"])
                generator = remote.remote(message["order"], self.setup)
            else:
                generator = estimate_cell.remote(message["order"], self.setup)
        except Exception as exc:  # Ray refused it (arguments it cannot serialize, a bad selector)
            self.say({"op": "error", "id": task_id, "type": type(exc).__name__, "error": str(exc),
                      "sent": False})
            return
        self.tasks[task_id] = generator

    def follow(self) -> None:
        """Relay what the tasks that have news say (waiting up to WAIT_S for one)."""
        if not self.tasks:
            return
        ids = {generator: task_id for task_id, generator in self.tasks.items()}
        ready, _ = self.ray.wait(list(ids), num_returns=1, timeout=WAIT_S)
        for generator in ready:
            task_id = ids[generator]
            try:
                item = self.ray.get(next(generator))
            except StopIteration:
                item = {"op": "error", "type": "TaskEnded", "error": "the task ended without a result"}
            except Exception as exc:  # the task's worker or node died, or it was cancelled
                item = {"op": "error", "type": type(exc).__name__, "error": str(exc)}
            if item["op"] in ("result", "error"):
                self.tasks.pop(task_id, None)
            self.say({**item, "id": task_id, **({"sent": True} if item["op"] == "error" else {})})


def report_nodes(ray: Any, say: Callable[[dict[str, Any]], None], refresh_s: float) -> None:
    """The nodes every ``refresh_s``, with the GCS's address (the service probes it: ``auto`` names
    none): while the GCS does not answer, nothing (the service notices)."""
    gcs = None
    with contextlib.suppress(Exception):  # Ray Client: not said; the service probes the address it has
        gcs = str(ray.get_runtime_context().gcs_address)
    while True:
        try:
            say({"op": "nodes", "nodes": [dataclasses.asdict(node) for node in read_nodes(ray)], "gcs": gcs})
        except Exception as exc:
            print(f"reading the nodes: {exc!r}", file=sys.stderr)
        time.sleep(refresh_s)


def main() -> int:
    out = protocol_stream()
    lock = threading.Lock()

    def say(message: dict[str, Any]) -> None:
        with lock:
            out.write(json.dumps(message) + "\n")
            out.flush()

    join = json.loads(sys.stdin.readline() or "{}")
    try:
        ray = import_ray()
        ray.init(**init_options(join["address"]))
        setup = pickle.loads(bytes.fromhex(join["setup"])) if join.get("setup") else None
    except Exception as exc:  # ConnectionError, a timeout, a version mismatch: said as it is
        lines = str(exc).strip().splitlines()
        say({"op": "failed", "error": f"{type(exc).__name__}: {lines[0] if lines else ''}"})
        return 1
    commands: queue.Queue[dict[str, Any] | None] = queue.Queue()

    def read() -> None:
        for line in sys.stdin:
            commands.put(json.loads(line))
        commands.put(None)  # the service closed our stdin, or is gone

    refresh_s = float(join.get("refresh_s") or REFRESH_S)
    threading.Thread(target=read, name="commands", daemon=True).start()
    threading.Thread(target=report_nodes, args=(ray, say, refresh_s), name="nodes", daemon=True).start()
    driver = Driver(ray, say, setup)
    while True:
        try:
            message = commands.get(timeout=0 if driver.tasks else WAIT_S)
        except queue.Empty:
            message = {"op": "none"}
        while message is not None:
            driver.command(message)
            try:
                message = commands.get_nowait()
            except queue.Empty:
                break
        if message is None:
            return 0
        driver.follow()


if __name__ == "__main__":
    sys.exit(main())
