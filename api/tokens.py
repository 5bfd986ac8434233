"""The API token of writes (AUTOTUNE_API_TOKEN): whether a request's Authorization header carries it.

Checked twice with one function: by api.admission.TokenGate before a write's body is read, and by
the routes' dependency (api.deps.require_token), which the OpenAPI document declares.
"""

from __future__ import annotations

import hmac

NO_TOKEN = "this server requires an API token for writes: send 'Authorization: Bearer <token>'"
BAD_TOKEN = ("invalid API token: send 'Authorization: Bearer <token>' with the server's "
             "AUTOTUNE_API_TOKEN")
NO_TOKEN_CHALLENGE, BAD_TOKEN_CHALLENGE = "Bearer", 'Bearer error="invalid_token"'


def token_refusal(token: str | None, authorization: str | None) -> tuple[str, str] | None:
    """Why a write with this Authorization header is refused (detail, WWW-Authenticate), or None
    when the server has no token or it was given."""
    if token is None:
        return None
    if not authorization:
        return NO_TOKEN, NO_TOKEN_CHALLENGE
    scheme, _, given = authorization.partition(" ")
    given = given.strip() if scheme.lower() == "bearer" else ""
    # compare_digest: the time taken does not tell how much of a guess was right.
    if not hmac.compare_digest(given.encode(), token.encode()):
        return BAD_TOKEN, BAD_TOKEN_CHALLENGE
    return None
