"""The one mapping from autotune's errors to HTTP responses, installed as the app's exception handler.

Routes let the core's errors (autotune.errors) propagate; ``install`` answers each as JSON
``{"detail": message}`` with the status of its kind (an invalid input's ``"kind"`` beside it:
"invalid", "not modelled", "unknown key", "job fails"), plus ``"field"`` when the error names the
request field it is about (a form shows it next to that field), and then ``"errors"``: every
invalid field of the request, ``[{"field": ..., "detail": ...}, ...]``, the one of ``detail`` first
(the status is that first error's), with ``"brief"`` where the message is long: the error in one
line, which the launch form shows (an unknown model's closest presets, without the list of them all).
Routes that take one cell as query parameters (check, explain) name two fields differently from a
table request: their router's ``query_fields`` dependency renames them. A request refused by
pydantic (its shape) is FastAPI's 422, whose ``detail`` already lists every error, with its ``loc``.
"""

from __future__ import annotations

import math
from typing import Any

from fastapi import FastAPI, Request, status
from fastapi.responses import JSONResponse, Response

from api.runs.analysis import ClientGone
from api.runs.runner import ClusterUnreachable
from api.store import is_unavailable
from autotune.errors import (
    AutotuneError,
    BackendUnavailable,
    InvalidInput,
    ModelPathRefused,
    Overloaded,
    UnknownModel,
)

# The error responses every route that reads a request can give, for the OpenAPI document.
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {"description": "a body that is not JSON text, a malformed Content-Length, or a Host header "
                         "this server does not answer to (AUTOTUNE_ALLOWED_HOSTS)"},
    401: {"description": "a write without the server's API token"},
    403: {"description": "a model path this server may not read"},
    404: {"description": "unknown model (the detail lists the presets) or run"},
    408: {"description": "the request body did not arrive whole in time (AUTOTUNE_BODY_TIMEOUT_S)"},
    413: {"description": "request body too large"},
    422: {"description": "invalid input: the detail says what is allowed"},
    500: {"description": "a probe failed (the detail says why), or an internal error"},
    503: {"description": "the backend asked for cannot run on this server, the server has no room for the "
                         "request now, or its database cannot be written now (a full disk): Retry-After "
                         "says when to ask again"},
}

CLIENT_CLOSED_REQUEST = 499  # not in the RFCs: nginx's status for a client that left first

# Fields of a table request as the one-cell query routes (check, explain) name them.
QUERY_FIELDS = {"seq_lens": "seq_len", "modes": "mode"}


def status_of(exc: AutotuneError) -> int:
    """The HTTP status of an error of the core, by its kind (autotune.errors draws the tree)."""
    if isinstance(exc, UnknownModel):
        return status.HTTP_404_NOT_FOUND
    if isinstance(exc, ModelPathRefused):
        return status.HTTP_403_FORBIDDEN
    if isinstance(exc, InvalidInput):
        return 422  # HTTP_422_UNPROCESSABLE_CONTENT, named _ENTITY before Starlette 0.48
    if isinstance(exc, BackendUnavailable | Overloaded) or is_unavailable(exc):
        return status.HTTP_503_SERVICE_UNAVAILABLE
    # ProbeError (a probe or search failed), StoreError: the server could not answer.
    return status.HTTP_500_INTERNAL_SERVER_ERROR


def query_fields(request: Request) -> None:
    """A router dependency: errors of this router's routes name the query parameters."""
    request.state.field_names = QUERY_FIELDS


def install(app: FastAPI) -> None:
    """The app's exception handlers: the core's errors by kind, anything else a JSON 500."""

    @app.exception_handler(AutotuneError)
    async def autotune_error(request: Request, exc: AutotuneError) -> JSONResponse:
        body: dict[str, Any] = {"detail": str(exc)}
        if isinstance(exc, InvalidInput):  # the kind of refusal (autotune/errors.py)
            body["kind"] = exc.kind
        retry_after = exc.retry_after_s if isinstance(exc, Overloaded | ClusterUnreachable) else None
        headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
        if is_unavailable(exc):  # a full disk, a lock: nothing was stored, and it may clear up
            retry = max(1, math.ceil(request.app.state.settings.reconcile_s))
            body["detail"] = (f"{exc}: the database cannot be used now, and nothing of this request was "
                              f"stored; ask again in {retry} s")
            headers = {"Retry-After": str(retry)}
        if exc.field is not None:
            renamed = getattr(request.state, "field_names", {})
            body["field"] = renamed.get(exc.field, exc.field)
            body["errors"] = [{"field": renamed.get(e.field, e.field), "detail": str(e),
                               **({"brief": e.brief} if e.brief else {})} for e in (exc, *exc.others)]
        return JSONResponse(body, status_code=status_of(exc), headers=headers)

    @app.exception_handler(ClientGone)
    async def client_gone(request: Request, exc: ClientGone) -> Response:
        # Nobody reads this: the client left while its check or explain ran (nginx's 499).
        return Response(status_code=CLIENT_CLOSED_REQUEST)

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> JSONResponse:
        # Errors are JSON everywhere, a bug included; uvicorn logs the traceback.
        return JSONResponse({"detail": f"internal server error ({type(exc).__name__})"}, status_code=500)
