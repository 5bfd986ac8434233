"""Headless Chromium (Debian's) for the dashboard's browser tests (tests/api/test_dashboard_e2e.py, and the
fleet view on the fleet tests' Ray cluster in tests/api/test_fleet.py): a tab on a server's base URL that
fails the test if a page asks another host for anything or logs an error, and the layout checks a page
must pass at a phone's width and a laptop's.

Skipped when Chromium or Playwright is missing, unless AUTOTUNE_REQUIRE_BROWSER=1 (``.ci/run``
installs Chromium and sets it), where their absence fails the test instead.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

import pytest

CHROMIUM = os.environ.get("AUTOTUNE_CHROMIUM", "/usr/bin/chromium")
# Chromium as root in a container, on a machine whose network is closed: no sandbox, no GPU,
# none of the background requests that would be refused at every start.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
TIMEOUT_MS = 240_000  # a limit, not a wait: the fleet's runs took over 90 s at load 6-10
PHONE, LAPTOP = {"width": 390, "height": 844}, {"width": 1280, "height": 900}
# ReDoc 2 draws its "API docs by Redocly" credit with an image from this CDN: the Content-Security-Policy
# of the docs pages (api/docs.py) stops it in the browser, which says so in the console.
REFUSED_BY_CSP = ("https://cdn.redoc.ly/redoc/logo-mini.svg",)

# What a reader of the page at this width cannot read, measured in the browser: the page wider than
# the screen; a table wider than its box where the box does not scroll or scrolls with no cue (the
# "scroll" line app.css puts before a box app.js marks data-overflow); two axis labels of a chart, or
# two legend entries, whose boxes overlap; a label outside its chart.
LAYOUT_PROBLEMS = """() => {
  const problems = [];
  const shown = (el) => { const r = el.getBoundingClientRect(); return r.width > 0 || r.height > 0; };
  const overlap = (a, b) => a.left < b.right - 0.5 && b.left < a.right - 0.5 &&
                            a.top < b.bottom - 0.5 && b.top < a.bottom - 0.5;
  const words = (el) => el.textContent.trim().replace(/\\s+/g, " ").slice(0, 60);
  const page = document.documentElement;
  if (page.scrollWidth > page.clientWidth + 1) problems.push(`the page is ${page.scrollWidth}px wide`);
  for (const table of document.querySelectorAll("main table")) {
    if (!shown(table)) continue;
    const name = words(table.caption || table);
    let box = table.parentElement;
    while (box !== document.body && getComputedStyle(box).overflowX === "visible") box = box.parentElement;
    if (box.scrollWidth <= box.clientWidth + 1) continue;  // the table fits whole
    const cue = getComputedStyle(box, "::before");
    if (!["auto", "scroll"].includes(getComputedStyle(box).overflowX)) {
      problems.push(`${name}: ${box.scrollWidth}px in a ${box.clientWidth}px box that does not scroll`);
    } else if (!box.hasAttribute("data-overflow") || !cue.content.includes("scroll")
               || cue.display === "none") {
      problems.push(`${name}: scrolls (${box.scrollWidth}px in ${box.clientWidth}px) without a cue`);
    }
  }
  for (const svg of document.querySelectorAll("svg.chart")) {
    if (!shown(svg)) continue;
    const frame = svg.getBoundingClientRect();
    const ticks = [...svg.querySelectorAll("text.tick")]
      .map((t) => [t.textContent, t.getBoundingClientRect()]);
    const inside = (r) => r.left >= frame.left - 0.5 && r.right <= frame.right + 0.5 &&
                          r.top >= frame.top - 0.5 && r.bottom <= frame.bottom + 0.5;
    ticks.forEach(([text, r], i) => {
      if (!inside(r)) problems.push(`${svg.id}: tick ${text} outside the chart`);
      for (const [other, q] of ticks.slice(i + 1))
        if (overlap(r, q)) problems.push(`${svg.id}: ticks ${text} and ${other} overlap`);
    });
  }
  // Legend entries: the chart's key and the table's colour bands (lists), or text drawn in an SVG.
  const legends = [...document.querySelectorAll(".chart-legend, ul.legend")].map((l) => [...l.children]);
  for (const svg of document.querySelectorAll("svg.chart")) {
    legends.push([...svg.querySelectorAll("text.legend")]);
  }
  for (const legend of legends) {
    const entries = legend.filter(shown).map((entry) => [words(entry), entry.getBoundingClientRect()]);
    entries.forEach(([text, r], i) => {
      if (r.left < -0.5 || r.right > page.clientWidth + 0.5) problems.push(`legend ${text} off the screen`);
      for (const [other, q] of entries.slice(i + 1))
        if (overlap(r, q)) problems.push(`legend entries ${text} and ${other} overlap`);
    });
  }
  return problems;
}"""


def browser_or_skip():
    required = os.environ.get("AUTOTUNE_REQUIRE_BROWSER") == "1"
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        if required:
            pytest.fail("AUTOTUNE_REQUIRE_BROWSER=1 but playwright is not installed "
                        "(pip install -e '.[test]')")
        pytest.skip("playwright is not installed")
    if not (Path(CHROMIUM).exists() or shutil.which(CHROMIUM)):
        if required:
            pytest.fail(f"AUTOTUNE_REQUIRE_BROWSER=1 but there is no Chromium at {CHROMIUM} "
                        "(apt-get install chromium chromium-driver)")
        pytest.skip(f"no Chromium at {CHROMIUM}")
    return sync_playwright



def screenshots(tmp_path: Path) -> Path:
    """Where a test's screenshots go: AUTOTUNE_SCREENSHOTS (``.ci/run`` sets it and prints the folder)
    or the test's temporary folder."""
    folder = Path(os.environ.get("AUTOTUNE_SCREENSHOTS") or tmp_path / "screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


class Chromium:
    """A headless Chromium with one context on a server's base URL: what its tabs' pages asked of other
    hosts (refused) is in ``foreign``."""

    def __init__(self, context, base_url: str) -> None:
        self.context, self.base_url = context, base_url
        self.foreign: list[str] = []


@contextlib.contextmanager
def chromium(sync_playwright, base_url: str):
    """A Chromium (``Chromium``) on ``base_url``, for the tabs of ``browser_tab``: one start for the
    tests of a module that share a server."""
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        context = browser.new_context(viewport=LAPTOP, base_url=base_url)
        context.set_default_timeout(TIMEOUT_MS)
        # expect() has a timeout of its own (5 s), which the context's default does not reach: the
        # explain panel's estimate can take longer than that on a loaded 2-core machine.
        from playwright.sync_api import expect

        expect.set_options(timeout=TIMEOUT_MS)
        opened = Chromium(context, base_url)

        # Anything the pages ask of another host is recorded and refused: the dashboard and the API
        # docs must work offline.
        def refuse(route):
            opened.foreign.append(route.request.url)
            route.abort()

        context.route(lambda url: not url.startswith((base_url + "/", "data:", "blob:")), refuse)
        try:
            yield opened
        finally:
            browser.close()


@contextlib.contextmanager
def browser_tab(opened: Chromium):
    """A new tab of ``opened``; on leaving, fails the test if a page asked another host for anything
    or logged an error meanwhile."""
    opened.foreign.clear()
    tab = opened.context.new_page()
    errors: list[str] = []
    tab.on("pageerror", lambda exc: errors.append(str(exc)))

    def console(msg):
        # The browser logs every 4xx fetch as an error; those the test provokes are expected: 422, and
        # 404 from POST /v1/tables (an unknown model).
        if msg.type != "error" or "status of 422" in msg.text or (
                "status of 404" in msg.text and msg.location.get("url", "").endswith("/v1/tables")):
            return
        if "Content Security Policy" in msg.text and any(url in msg.text for url in REFUSED_BY_CSP):
            return
        errors.append(msg.text)

    tab.on("console", console)
    yield tab
    tab.close()
    assert not opened.foreign, f"the pages asked other hosts for: {opened.foreign}"
    assert not errors, f"the pages logged errors: {errors}"


@contextlib.contextmanager
def browser_page(sync_playwright, base_url: str):
    """A Chromium tab on ``base_url``; on leaving, fails the test if a page asked another host for
    anything or logged an error."""
    with chromium(sync_playwright, base_url) as opened, browser_tab(opened) as tab:
        yield tab


def assert_readable(page, where: str) -> None:
    problems = page.evaluate(LAYOUT_PROBLEMS)
    assert problems == [], f"{where} at {page.viewport_size['width']}px: {problems}"

