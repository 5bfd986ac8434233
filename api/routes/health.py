"""/v1/health: is the service up, what does it measure with, which versions."""

from __future__ import annotations

from fastapi import APIRouter

from api.deps import QueueDep
from api.schemas import HealthPublic

router = APIRouter(tags=["health"])


@router.get("/health", response_model=HealthPublic)
def health(queue: QueueDep) -> HealthPublic:
    """Liveness, the backend available (cuda and the GPU, or estimate), versions and the queue."""
    runner = queue.runner.describe()
    return HealthPublic(status="ok", backend=runner["backend"], gpu=runner["gpu"], lanes=runner["lanes"],
                        versions=runner["versions"], queue=queue.store.counts())
