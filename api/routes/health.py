"""/v1/health: is the service up, what does it measure with, which versions, is its database sound."""

from __future__ import annotations

from fastapi import APIRouter

from api.deps import QueueDep
from api.schemas import DatabasePublic, HealthPublic

router = APIRouter(tags=["health"])


@router.get("/health", response_model=HealthPublic)
async def health(queue: QueueDep) -> HealthPublic:
    """Liveness, the backend (cuda and the GPU, or estimate), versions, the queue, the database's state,
    and on a fleet its Ray cluster: GPU kinds, nodes and free GPUs per kind, or why it is unreachable."""
    # On the event loop, not in the threadpool: heavy requests may hold every thread of the pool
    # for a while (a hub lookup), and health must answer at once. Its reads take a millisecond.
    runner = queue.runner.describe()
    store = queue.store
    failure, backlog = store.write_failure, queue.backlog()
    database = DatabasePublic(file=store.path.name, integrity=store.integrity, writable=failure is None,
                              write_error=failure, backlog=backlog)
    sound = store.integrity == "ok" and failure is None and backlog == 0
    return HealthPublic(status="ok" if sound else "degraded", backend=runner["backend"],
                        gpu=runner["gpu"], lanes=runner["lanes"], versions=runner["versions"],
                        queue=store.counts(), database=database, analysis=runner["analysis"],
                        fleet=runner.get("fleet"))
