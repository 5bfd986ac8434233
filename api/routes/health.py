"""/v1/health: is the service up, what does it measure with, which versions."""

from __future__ import annotations

from fastapi import APIRouter

from api.deps import JobsDep
from api.schemas import HealthPublic

router = APIRouter(tags=["health"])


@router.get("/health", response_model=HealthPublic)
def health(jobs: JobsDep) -> HealthPublic:
    """Liveness, the backend available (cuda and the GPU, or estimate), versions and the queue."""
    runner = jobs.runner.describe()
    return HealthPublic(status="ok", backend=runner["backend"], gpu=runner["gpu"], lanes=runner["lanes"],
                        versions=runner["versions"], queue=jobs.store.counts())
