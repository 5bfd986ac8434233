"""Dependencies of the routes: the settings, the run queue, and the token check of writes."""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, Header, HTTPException, Request, status

from api.runs.queue import RunQueue
from api.settings import Settings


def get_settings(request: Request) -> Settings:
    return request.app.state.settings


def get_queue(request: Request) -> RunQueue:
    return request.app.state.queue


SettingsDep = Annotated[Settings, Depends(get_settings)]
QueueDep = Annotated[RunQueue, Depends(get_queue)]


def require_token(settings: SettingsDep, authorization: Annotated[str | None, Header()] = None) -> None:
    """With AUTOTUNE_API_TOKEN set, a write needs ``Authorization: Bearer <token>``."""
    token = settings.api_token
    if token is None:
        return
    if not authorization:
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            detail="this server requires an API token for writes: send 'Authorization: Bearer <token>'",
            headers={"WWW-Authenticate": "Bearer"},
        )
    scheme, _, credentials = authorization.partition(" ")
    # compare_digest: the time taken does not tell how much of a guess was right.
    if scheme.lower() != "bearer" or not hmac.compare_digest(credentials.strip().encode(), token.encode()):
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            detail="invalid API token: send 'Authorization: Bearer <token>' with the server's "
                   "AUTOTUNE_API_TOKEN",
            headers={"WWW-Authenticate": 'Bearer error="invalid_token"'},
        )


WriteAccess = Depends(require_token)
