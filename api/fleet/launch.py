"""All kinds in the fleet: one table run per GPU kind the fleet has, from one request.

The fleet and its kinds are the runner's (``Runner.describe()["fleet"]``, which RayRunner reads from
its cluster's node labels; a runner without a fleet has none): the launch form offers "all kinds"
from ``fleet_of`` and ``POST /v1/fleet/tables`` plans its runs with ``all_kinds_specs`` from the same
call, so the two never disagree. Each run is the request with ``gpu`` set to one kind and backend
``cuda``, validated as ``POST /v1/tables`` validates it (runs.spec.normalize), every one before any
is queued: a request that fails on one kind queues none.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from api.fleet import INSTALL_HINT
from api.runs.runner import ClusterUnreachable, Runner
from api.runs.spec import TableSpec, normalize
from api.settings import Settings
from autotune.errors import BackendUnavailable, InvalidInput

ALL_KINDS = "all-kinds"  # the launch form's GPU choice that means every kind of the fleet
NO_FLEET = ("this server runs no fleet: 'all kinds in the fleet' needs a Ray cluster of GPU nodes "
            f"(autotune serve --ray ADDRESS, with {INSTALL_HINT})")


@dataclass(frozen=True)
class Fleet:
    """The fleet a server runs its tables on, as its runner sees it now."""

    address: str
    kinds: tuple[str, ...]  # GPU kinds (preset names) with at least one node, in name order
    unavailable: str | None  # why no run can go to every kind now; None: they can
    reachable: bool = True  # False: the cluster is away now (503 with Retry-After)

    @property
    def label(self) -> str:
        return ", ".join(self.kinds)


def fleet_of(runner: Runner) -> Fleet | None:
    """The runner's fleet, None on a server that runs its tables on its own host."""
    described = runner.describe().get("fleet")
    if described is None:
        return None
    address = str(described["address"])
    kinds = tuple(k["kind"] for k in described["kinds"])
    unavailable = None
    if described["status"] != "connected":
        # As RayRunner refuses a new run meanwhile (api.fleet.cluster.Cluster.unreachable).
        why = described.get("error") or "still joining it"
        unavailable = f"the Ray cluster at {address} is unreachable ({why}): no new runs until it is back"
    elif not kinds:
        unavailable = (f"the Ray cluster at {address} has no GPU node of a known kind: start each GPU node "
                       "with its kind as a label (ray start --labels autotune/gpu=T4)")
    return Fleet(address=address, kinds=kinds, unavailable=unavailable,
                 reachable=described["status"] == "connected")


def _refused(message: str, field: str) -> InvalidInput:
    error = InvalidInput(message)
    error.field = field
    return error


def all_kinds_specs(body: Mapping[str, Any], settings: Settings, runner: Runner) -> list[TableSpec]:
    """The specs of one run per kind of the runner's fleet for a table request (TableCreate fields
    without ``gpu``), each validated; raises the first error found, naming its field."""
    fleet = fleet_of(runner)
    if fleet is None:
        raise _refused(NO_FLEET, "gpu")
    if fleet.unavailable is not None:
        raise (BackendUnavailable if fleet.reachable else ClusterUnreachable)(fleet.unavailable)
    for field, what in (("gpu", "a GPU preset"), ("gpu_memory", "a card size"),
                        ("multiprocessors", "a chip")):
        if body.get(field) is not None:
            raise _refused(f"all kinds in the fleet sets each run's GPU to one of its kinds ({fleet.label}): "
                           f"leave {field} ({what}) out", field)
    backend = body.get("backend") or "cuda"
    if backend not in ("cuda", "auto"):
        raise _refused(f"all kinds in the fleet measures on each kind's GPU: backend must be cuda or auto, "
                       f"not {backend!r}", "backend")
    return [normalize({**body, "gpu": kind, "backend": "cuda"}, settings, runner.environment)
            for kind in fleet.kinds]
