"""The FastAPI app: ``create_app(settings)`` builds it, ``autotune serve`` runs it with uvicorn.

On startup the app opens the store (and claims it: one server per database), imports the measured
tables of AUTOTUNE_MEASUREMENTS (api/measurements.py: a bad file stops the start), starts the
runner, and resumes the queue (runs.queue.RunQueue.start); on shutdown it stops the runner's workers,
leaving their runs to the next start.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

import autotune
from api import docs, errors
from api.admission import Admission, TokenGate
from api.framing import NoFraming
from api.hosts import LOOPBACK_HOSTS, TrustedHosts
from api.limits import BodyLimits
from api.measurements import import_measurements
from api.routes import api_router
from api.runs.analysis import PREPARING_AT_ONCE
from api.runs.queue import RunQueue
from api.runs.runner import LocalRunner, Runner
from api.settings import Settings
from api.store import Store
from api.views import pages_router
from api.views.common import PACKAGE, templates

DESCRIPTION = (
    "The largest training batch that fits in GPU memory, per sequence length, for a transformers "
    "model. POST /v1/tables queues a table; GET /v1/tables/{id} shows its cells as they finish."
)


def make_runner(settings: Settings) -> Runner:
    """The runner the settings ask for: the Ray cluster of AUTOTUNE_RAY_ADDRESS (a fleet), else this
    host's, with its lanes, watchdog and analysis workers."""
    if settings.ray_address is not None:
        from api.fleet.runner import RayRunner

        return RayRunner(settings.ray_address, analysis_workers=settings.analysis_workers,
                         analysis_timeout_s=settings.analysis_timeout_s, watchdog_s=settings.watchdog_s)
    return LocalRunner(estimate_workers=settings.estimate_workers, watchdog_s=settings.watchdog_s,
                       analysis_workers=settings.analysis_workers,
                       analysis_timeout_s=settings.analysis_timeout_s)


def create_app(
    settings: Settings | None = None, *, store: Store | None = None, runner: Runner | None = None
) -> FastAPI:
    """The app; ``store`` and ``runner`` are made from ``settings`` at startup unless given.

    The app closes both on shutdown, given or not.
    """
    settings = settings if settings is not None else Settings.from_env()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app_store = store
        if app_store is None:
            app_store = Store(settings.db, claim=True)
        if settings.measurements:  # opt-in: AUTOTUNE_MEASUREMENTS
            try:
                await anyio.to_thread.run_sync(import_measurements, app_store, settings.measurements,
                                               settings)
            except BaseException:  # the start fails: close what the shutdown would have closed
                app_store.close()
                if runner is not None:
                    runner.close()
                raise
        app_runner = runner if runner is not None else make_runner(settings)
        queue = RunQueue(app_store, app_runner, reconcile_s=settings.reconcile_s)
        queue.start()
        app.state.queue = queue
        app.state.preparing = anyio.CapacityLimiter(PREPARING_AT_ONCE)  # see api.runs.analysis
        try:
            yield
        finally:
            queue.close()
            app_runner.close()
            app_store.close()

    app = FastAPI(title="autotune", version=autotune.__version__, description=DESCRIPTION, lifespan=lifespan,
                  docs_url=None, redoc_url=None)  # api.docs serves them without a CDN
    app.state.settings = settings

    errors.install(app)
    # The last added runs first: framing forbidden, the Host checked, a write's token, the body read
    # whole (timed), and only then a place in the line (health skips it), so that a slow client holds none.
    app.add_middleware(Admission, token=settings.api_token)
    app.add_middleware(BodyLimits, max_bytes=settings.max_body_bytes, timeout_s=settings.body_timeout_s)
    app.add_middleware(TokenGate, token=settings.api_token)
    # The loopback names are always answered: no rebinding page can send them (its origin would have
    # to be this machine), and the container's health check and local tools use them.
    allowed = tuple(dict.fromkeys((*LOOPBACK_HOSTS, *settings.allowed_hosts)))
    app.add_middleware(TrustedHosts, allowed=allowed)
    app.add_middleware(NoFraming)  # outermost: every answer, the ones above included, forbids framing
    app.include_router(api_router, prefix="/v1")
    app.include_router(pages_router)
    app.mount("/static", StaticFiles(directory=PACKAGE / "static"), name="static")
    docs.install(app)
    templates.env.globals["version"] = autotune.__version__
    return app
