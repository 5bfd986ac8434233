"""The API's routers, one module per resource, all under /v1."""

from __future__ import annotations

from fastapi import APIRouter

from api.routes import check, explain, fleet, health, tables

api_router = APIRouter()
api_router.include_router(health.router)
api_router.include_router(tables.router)
api_router.include_router(check.router)
api_router.include_router(explain.router)
api_router.include_router(fleet.router)
