"""autotune's HTTP service (``autotune serve``).

    main.py        builds the FastAPI app (create_app)
    settings.py    the AUTOTUNE_* configuration
    deps.py        route dependencies: settings, the job queue, the token check
    schemas.py     request and response bodies
    routes/        one module per resource: health, tables
    spec.py        a request normalised, and the key of identical runs
    jobs.py        the queue: store + runner
    runner.py      the Runner interface and LocalRunner (lanes of worker processes)
    worker.py      the process that fills one table (python -m api.worker)
    limits.py      the request body size limit

The store of runs and cells is autotune/store.py.
"""
