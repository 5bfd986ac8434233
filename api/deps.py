"""Dependencies of the routes: the settings, the run queue, and the token check of writes."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from api.runs.queue import RunQueue
from api.settings import Settings
from api.tokens import token_refusal


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
    """With AUTOTUNE_API_TOKEN set, a write needs ``Authorization: Bearer <token>`` (checked first
    by api.admission.TokenGate, before the body is read; here for the OpenAPI document)."""
    refusal = token_refusal(settings.api_token, request.headers.get("authorization"))
    if refusal is not None:
        detail, challenge = refusal
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, detail=detail,
                            headers={"WWW-Authenticate": challenge})


WriteAccess = Depends(require_token)
