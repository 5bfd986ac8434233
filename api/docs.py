"""The API docs, ``/docs`` (Swagger UI) and ``/redoc`` (ReDoc), with their assets served by the app.

FastAPI's built-in pages load Swagger UI and ReDoc from cdn.jsdelivr.net, their favicon from
fastapi.tiangolo.com and ReDoc's fonts from Google, so they are blank offline. These are the same
pages, made by FastAPI's own ``get_swagger_ui_html`` / ``get_redoc_html`` as its how-to "Custom Docs
UI Static Assets (Self-Hosting)" shows, pointed at files vendored from the npm packages
swagger-ui-dist and redoc into ``api/static/docs`` (its README.md says which versions and how to
update them). ``install(app)`` adds them to an app made with ``docs_url=None, redoc_url=None``.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import HTMLResponse

DOCS_URL = "/docs"
REDOC_URL = "/redoc"
OAUTH2_REDIRECT_URL = "/docs/oauth2-redirect"  # FastAPI's default, where Swagger UI's OAuth2 flow returns
ASSETS = "docs"  # the folder of the vendored files under the app's /static mount

# Swagger UI sends the spec's URL to validator.swagger.io for its "valid" badge unless the spec is on
# localhost (swagger-ui's OnlineValidatorBadge); null switches the validator off.
SWAGGER_UI_PARAMETERS: dict[str, Any] = {"validatorUrl": None}

# And the browser is told to ask no other host, whatever the bundles hold: ReDoc 2 draws the
# "API docs by Redocly" credit with an image from cdn.redoc.ly (no option turns it off; the image
# hides itself when it does not load). Both UIs run an inline start script and inline styles, use
# data: images, and ReDoc runs its search in a worker made from a blob: URL.
CONTENT_SECURITY_POLICY = "; ".join((
    "default-src 'self'",
    "script-src 'self' 'unsafe-inline' blob:",
    "worker-src 'self' blob:",
    "style-src 'self' 'unsafe-inline'",
    "img-src 'self' data: blob:",
    "font-src 'self' data:",
    "connect-src 'self'",
    "base-uri 'self'",
    "form-action 'self'",
))


def _root(request: Request) -> str:
    """The app's root path (behind a proxy), as FastAPI's own docs routes prefix their URLs."""
    return str(request.scope.get("root_path", "")).rstrip("/")


def asset_url(request: Request, name: str) -> str:
    """The path of a vendored file: same origin, under the root path, never a CDN."""
    return _root(request) + str(request.app.url_path_for("static", path=f"{ASSETS}/{name}"))


def same_origin_only(page: HTMLResponse) -> HTMLResponse:
    """The page, with CONTENT_SECURITY_POLICY: the browser refuses anything from another host."""
    page.headers["Content-Security-Policy"] = CONTENT_SECURITY_POLICY
    return page


def install(app: FastAPI) -> None:
    """Add ``/docs`` (and its OAuth2 redirect page) and ``/redoc``, served from the app's own files."""
    openapi_url = app.openapi_url
    if openapi_url is None:  # no schema, nothing to document
        return

    @app.get(DOCS_URL, include_in_schema=False, name="swagger_ui")
    async def swagger_ui(request: Request) -> HTMLResponse:
        return same_origin_only(get_swagger_ui_html(
            openapi_url=_root(request) + openapi_url,
            title=f"{app.title} - Swagger UI",
            swagger_js_url=asset_url(request, "swagger-ui-bundle.js"),
            swagger_css_url=asset_url(request, "swagger-ui.css"),
            swagger_favicon_url=asset_url(request, "favicon-32x32.png"),
            oauth2_redirect_url=_root(request) + OAUTH2_REDIRECT_URL,
            init_oauth=app.swagger_ui_init_oauth,
            swagger_ui_parameters={**(app.swagger_ui_parameters or {}), **SWAGGER_UI_PARAMETERS},
        ))

    @app.get(OAUTH2_REDIRECT_URL, include_in_schema=False, name="swagger_ui_oauth2_redirect")
    async def swagger_ui_redirect() -> HTMLResponse:
        return same_origin_only(get_swagger_ui_oauth2_redirect_html())  # an inline script, nothing loaded

    @app.get(REDOC_URL, include_in_schema=False, name="redoc")
    async def redoc(request: Request) -> HTMLResponse:
        return same_origin_only(get_redoc_html(
            openapi_url=_root(request) + openapi_url,
            title=f"{app.title} - ReDoc",
            redoc_js_url=asset_url(request, "redoc.standalone.js"),
            redoc_favicon_url=asset_url(request, "favicon-32x32.png"),
            with_google_fonts=False,  # the system fonts instead of fonts.googleapis.com
        ))
