"""Offline: the API docs and the dashboard name no other host, and every asset they name is served.

FastAPI's own /docs and /redoc load Swagger UI and ReDoc from a CDN (blank without the network);
api/docs.py serves them from api/static/docs instead. The browser test
(test_dashboard_e2e.py) also watches the requests Chromium makes for them.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path, PurePosixPath
from urllib.parse import urljoin, urlsplit

import pytest

from api.runs.spec import normalize
from api.settings import Settings

ORIGIN = "http://localhost"  # the test client's base URL
# Attributes whose value the browser fetches, follows or posts to (spec-url: ReDoc's element;
# data-live / data-url: the dashboard's script fetches them).
URL_ATTRIBUTES = {"src", "href", "action", "formaction", "poster", "spec-url", "data-live", "data-url"}
# URLs in inline scripts and styles: Swagger UI's `url: '/openapi.json'`, its OAuth2 redirect,
# CSS url(...) and @import.
SCRIPT_URLS = re.compile(r"""(?:\burl\s*:\s*|\+\s*)['"]([^'"]+)['"]|url\(\s*['"]?([^'")]+)""")
# An absolute or protocol-relative URL anywhere in the text: http://x, https://x, //cdn...
ANY_HOST = re.compile(r"""(?:\b[a-z][a-z0-9+.-]*:)?//[a-z0-9.-]+""", re.I)
# XML namespace names are identifiers, never fetched (the chart's inline SVG carries one).
NAMESPACES = re.compile(r"""\bxmlns(?::\w+)?="[^"]*\"""")
CONTENT_TYPES = {".js": ("text/javascript", "application/javascript"), ".css": ("text/css",),
                 ".png": ("image/png",)}


class References(HTMLParser):
    """The URLs a page names: in its URL attributes, its inline scripts and its styles."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []
        self._inline = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if name in URL_ATTRIBUTES and value:
                self.urls.append(value)
            elif name == "style" and value:
                self.urls.extend(_in_code(value))
        self._inline = tag in ("script", "style")

    def handle_endtag(self, tag: str) -> None:
        self._inline = False

    def handle_data(self, data: str) -> None:
        if self._inline:
            self.urls.extend(_in_code(data))


def _in_code(code: str) -> list[str]:
    return [a or b for a, b in SCRIPT_URLS.findall(code)]


def references(html: str) -> list[str]:
    parser = References()
    parser.feed(html)
    return parser.urls


def same_origin(url: str) -> bool:
    """Relative, or on this server; a data: URL carries its content (the dashboard's empty favicon)."""
    if url.startswith(("data:", "#")):
        return True
    parts = urlsplit(urljoin(ORIGIN + "/", url))
    return f"{parts.scheme}://{parts.netloc}" == ORIGIN


def assert_offline(html: str, *, names_urls: bool = True) -> list[str]:
    """Every URL the page names is same-origin, and no other host appears at all; the URLs, resolved."""
    urls = references(html)
    assert bool(urls) == names_urls, f"the page names the URLs {urls}"
    assert [u for u in urls if not same_origin(u)] == []
    hosts = ANY_HOST.findall(NAMESPACES.sub("", html))
    assert [h for h in hosts if not h.lower().startswith(ORIGIN)] == []
    return [urljoin(ORIGIN + "/", u) for u in urls if not u.startswith(("data:", "#"))]


def assert_served(client, url: str) -> None:
    path = urlsplit(url).path
    response = client.get(url)
    assert response.status_code == 200, f"{url}: {response.status_code}"
    for suffix, types in CONTENT_TYPES.items():
        if path.endswith(suffix):
            assert response.headers["content-type"].split(";")[0] in types, (url, response.headers)


def test_references_finds_attributes_scripts_and_styles():
    html = ("<link href='/a.css'><script src=\"//cdn.example/x.js\"></script><redoc spec-url='/o.json'>"
            "<script>SwaggerUIBundle({url: '/openapi.json', r: window.location.origin + '/cb'})</script>"
            "<style>body { background: url(https://fonts.example/f.png) }</style>")
    assert references(html) == ["/a.css", "//cdn.example/x.js", "/o.json", "/openapi.json", "/cb",
                                "https://fonts.example/f.png"]
    assert [same_origin(u) for u in references(html)] == [True, False, True, True, True, False]
    with pytest.raises(AssertionError):
        assert_offline("<p>see https://cdn.jsdelivr.net/npm/x</p><a href='/'>home</a>")
    assert_offline('<svg xmlns="http://www.w3.org/2000/svg"></svg><a href="/">home</a>')


@pytest.mark.parametrize(("path", "assets"), [
    ("/docs", {"/static/docs/swagger-ui-bundle.js", "/static/docs/swagger-ui.css",
               "/static/docs/favicon-32x32.png", "/openapi.json", "/docs/oauth2-redirect"}),
    ("/redoc", {"/static/docs/redoc.standalone.js", "/static/docs/favicon-32x32.png", "/openapi.json"}),
])
def test_api_docs_load_everything_from_this_server(idle_client, path, assets):
    page = idle_client.get(path)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    urls = assert_offline(page.text)
    assert {urlsplit(u).path for u in urls} == assets
    for url in urls:
        assert_served(idle_client, url)


@pytest.mark.parametrize("path", ["/docs", "/redoc"])
def test_api_docs_tell_the_browser_to_ask_no_other_host(idle_client, path):
    # Whatever the bundles hold (ReDoc's credit loads a logo from cdn.redoc.ly), the browser refuses it.
    policy = idle_client.get(path).headers["content-security-policy"]
    directives = dict(d.split(" ", 1) for d in policy.split("; "))
    assert directives["default-src"] == "'self'" and directives["img-src"].startswith("'self'")
    sources = {source for value in directives.values() for source in value.split()}
    assert sources <= {"'self'", "'unsafe-inline'", "data:", "blob:", "'none'"}
    assert directives["frame-ancestors"] == "'none'"  # nor may another site frame them (api/framing.py)


def test_swagger_ui_never_asks_the_online_validator(idle_client):
    # Without validatorUrl: null, Swagger UI sends the spec's URL to validator.swagger.io.
    assert '"validatorUrl": null' in idle_client.get("/docs").text


def test_swagger_ui_oauth2_redirect_page_loads_nothing(idle_client):
    page = idle_client.get("/docs/oauth2-redirect")
    assert page.status_code == 200
    assert not re.search(r"\bsrc=|\bhref=", page.text)
    assert [h for h in ANY_HOST.findall(page.text) if not h.startswith(ORIGIN)] == []


def test_the_vendored_assets_carry_their_licences(idle_client):
    for name in ("swagger-ui-dist.LICENSE", "swagger-ui-dist.NOTICE", "redoc.LICENSE",
                 "swagger-ui-bundle.js.LICENSE.txt", "redoc.standalone.js.LICENSE.txt"):
        assert idle_client.get(f"/static/docs/{name}").status_code == 200, name
    assert "Apache License" in idle_client.get("/static/docs/swagger-ui-dist.LICENSE").text
    assert "MIT License" in idle_client.get("/static/docs/redoc.LICENSE").text


def test_the_vendored_assets_are_package_data():
    # setuptools' package-data globs do not descend into folders: "static/*" misses static/docs/.
    import tomllib

    root = Path(__file__).resolve().parents[2]
    patterns = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    files = [PurePosixPath(p.relative_to(root / "api").as_posix())
             for p in (root / "api" / "static" / "docs").iterdir()]
    assert len(files) >= 8
    globs = [PurePosixPath(g) for g in patterns["api"]]

    def packaged(f: PurePosixPath) -> bool:
        return any(len(f.parts) == len(g.parts) and f.match(str(g)) for g in globs)

    assert [str(f) for f in files if not packaged(f)] == []


def test_docs_follow_the_root_path_behind_a_proxy(tmp_path):
    from fastapi.testclient import TestClient

    from api.main import create_app
    from api.runs.runner import LocalRunner

    app = create_app(Settings(db=tmp_path / "p.db"), runner=LocalRunner(estimate_workers=0, gpu_lanes=[]))
    with TestClient(app, base_url=ORIGIN, root_path="/autotune") as client:
        docs = client.get("/docs").text
        assert 'src="/autotune/static/docs/swagger-ui-bundle.js"' in docs
        assert "url: '/autotune/openapi.json'" in docs
        assert 'spec-url="/autotune/openapi.json"' in client.get("/redoc").text
        assert 'href="/autotune/docs">API</a>' in client.get("/").text


def _finished_run(client, body, best) -> str:
    """A done run of ``body`` in the app's store, every cell fitting ``best``."""
    store = client.app.state.queue.store
    spec = normalize({"backend": "estimate", **body}, Settings(), client.app.state.queue.runner.environment)
    run, _ = store.create_run(key=spec.key(), model=spec.model, gpu=spec.gpu["name"], backend=spec.backend,
                              spec=spec.to_json(), total=spec.cells, reuse=())
    store.mark_running(run.id, lane="estimate:0", worker_pid=None)
    position = 0
    for mode in body["modes"]:
        for seq_len in body["seq_lens"]:
            probe = {"batch_size": best, "outcome": "fits", "peak_bytes": 400 << 20,
                     "peak_allocated_bytes": 380 << 20, "peak_reserved_bytes": 400 << 20}
            store.add_cell(run.id, position, {
                "seq_len": seq_len, "mode": mode, "max_batch_size": best, "peak_memory_bytes": 400 << 20,
                "peak_allocated_bytes": 380 << 20, "probes": 1, "capped": False, "backend": "estimate",
                "step_time_s": None, "error": None, "probe_log": [probe]})
            position += 1
    store.finish_run(run.id, "done")
    return run.id


def test_every_dashboard_page_names_only_this_server(idle_client):
    tiny = {"model": "tiny-bert", "seq_lens": [32, 64], "modes": ["fp32", "amp"]}
    first = _finished_run(idle_client, {**tiny, "gpu_memory": "1GiB"}, 100)
    bert = _finished_run(idle_client, {**tiny, "model": "bert-base-uncased", "gpu": "T4"}, 40)
    pages = ["/", "/runs", "/new", "/compare", f"/compare?id={first}&id={bert}", f"/runs/{first}"]
    assets = set()
    for path in pages:
        page = idle_client.get(path)
        assert page.status_code == 200, path
        assets |= {u for u in assert_offline(page.text) if "/static/" in u}
    # The part of a finished run's page its script swaps in: no links, and no host either.
    assert_offline(idle_client.get(f"/runs/{first}/live").text, names_urls=False)
    assert {urlsplit(u).path for u in assets} == {"/static/app.css", "/static/app.js"}
    for url in assets:
        assert_served(idle_client, url)
        assert [h for h in ANY_HOST.findall(idle_client.get(url).text) if not h.startswith(ORIGIN)] == []


@pytest.mark.slow
def test_the_explain_panel_names_only_this_server(idle_client):
    run_id = _finished_run(idle_client, {"model": "tiny-bert", "seq_lens": [32], "modes": ["fp32"],
                                         "gpu_memory": "1GiB"}, 100)
    panel = idle_client.get(f"/runs/{run_id}/explain", params={"seq_len": 32, "mode": "fp32"})
    assert panel.status_code == 200 and "Where the memory goes" in panel.text
    assert_offline(panel.text, names_urls=False)  # a fragment: its buttons carry data, not URLs
