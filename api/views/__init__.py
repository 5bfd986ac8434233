"""The dashboard: server-rendered pages over the same store as the API, one module per page.

home (``/``), launch (``/new``), runs (``/runs/{id}``), compare (``/compare``),
fleet (``/fleet?model=``: one model on every GPU kind); templates in
``api/templates``, the stylesheet and the one small script in ``api/static`` (no CDN, no build).
"""

from fastapi import APIRouter

from api.views import compare, fleet, home, launch, runs

pages_router = APIRouter(include_in_schema=False)
for module in (home, launch, runs, compare, fleet):
    pages_router.include_router(module.router)

__all__ = ["pages_router"]
