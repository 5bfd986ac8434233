"""Dependencies of the routes: the settings, the run queue, and the token check of writes."""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from api.runs.queue import RunQueue
from api.settings import Settings


def get_settings(request: Request) -> Settings:
    return request.app.state.settings


def get_queue(request: Request) -> RunQueue:
    return request.app.state.queue


SettingsDep = Annotated[Settings, Depends(get_settings)]
QueueDep = Annotated[RunQueue, Depends(get_queue)]


# The OpenAPI document's security scheme of writes. auto_error=False: require_token answers, with
# its own messages, and only when the server has a token.
bearer = HTTPBearer(auto_error=False, description="AUTOTUNE_API_TOKEN: writes (POST, DELETE) need it "
                                                  "when the server sets one; reads are open")


def require_token(
    settings: SettingsDep, request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> None:
    """With AUTOTUNE_API_TOKEN set, a write needs ``Authorization: Bearer <token>``."""
    token = settings.api_token
    if token is None:
        return
    if not request.headers.get("authorization"):
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            detail="this server requires an API token for writes: send 'Authorization: Bearer <token>'",
            headers={"WWW-Authenticate": "Bearer"},
        )
    given = credentials.credentials if credentials is not None else ""  # None: not a Bearer header
    # compare_digest: the time taken does not tell how much of a guess was right.
    if not hmac.compare_digest(given.encode(), token.encode()):
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            detail="invalid API token: send 'Authorization: Bearer <token>' with the server's "
                   "AUTOTUNE_API_TOKEN",
            headers={"WWW-Authenticate": 'Bearer error="invalid_token"'},
        )


WriteAccess = Depends(require_token)
