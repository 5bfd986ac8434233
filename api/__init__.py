"""autotune's HTTP service and dashboard (``autotune serve``): runs of tables, stored and shown.

    main.py        builds the FastAPI app (create_app)
    settings.py    the service's AUTOTUNE_* configuration (extends autotune.settings)
    errors.py      the one mapping of autotune's errors to HTTP responses
    deps.py        route dependencies: settings, the run queue, the token check
    limits.py      the request body's size and arrival time, and the numbers' bounds
    hosts.py       the Host names the server answers to (AUTOTUNE_ALLOWED_HOSTS)
    framing.py     every answer forbids framing (frame-ancestors 'none', X-Frame-Options)
    admission.py   requests at once, with /v1/health and the heavy reads outside the line
    server.py      uvicorn for `autotune serve`: a deadline for request heads, caps on connections,
                   proxy headers only from AUTOTUNE_TRUSTED_PROXIES
    schemas.py     request and response bodies
    store.py       SQLite: runs, cells, migrations, one writer, retries, the claim of the file
    runs/          the run machinery: a request normalised (spec.py), the queue and its reconciler
                   (queue.py), runners (runner.py: lanes of run workers, the watchdog), the run
                   worker process (worker.py), heavy reads in a pool of analysis workers
                   (analysis.py, analysis_worker.py)
    routes/        the JSON API, one module per resource: health, tables, check, explain
    views/         the dashboard, one module per page, with templates/ and static/
    chart.py       the SVG chart of the dashboard
    docs.py        the API docs (/docs, /redoc), their assets served from static/docs, no CDN

A *table* is what a request asks for; a *run* is one execution of it (queued, running, done,
failed, cancelled), carried out by a run worker (one process per run); the cuda backend below it
starts a probe worker per cell.
"""
