"""The dashboard end to end: real headless Chromium (Debian's) against ``autotune serve`` on loopback.

Open the home page, launch a tiny-model run with the form (after the API turned down a bad
sequence length next to its field), watch the table fill in without a reload, open a cell and its
explain panel, then compare two runs. Screenshots go to AUTOTUNE_SCREENSHOTS (``.ci/run`` sets it
and prints the folder) or the test's temporary folder.

Skipped when Chromium or Playwright is missing, unless AUTOTUNE_REQUIRE_BROWSER=1 (``.ci/run``
installs Chromium and sets it), where their absence fails the test instead.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from pathlib import Path

import pytest
from liveserver import Server

CHROMIUM = os.environ.get("AUTOTUNE_CHROMIUM", "/usr/bin/chromium")
# Chromium as root in a container, on a machine whose network is closed: no sandbox, no GPU,
# none of the background requests that would be refused at every start.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
TIMEOUT_MS = 90_000


def _browser_or_skip():
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


@pytest.fixture
def shots(tmp_path):
    folder = Path(os.environ.get("AUTOTUNE_SCREENSHOTS") or tmp_path / "screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture
def server(tmp_path):
    started = Server(tmp_path / "dash.db", tmp_path / "dash.log")
    yield started
    started.stop()


@pytest.fixture
def page(server):
    sync_playwright = _browser_or_skip()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        context = browser.new_context(viewport={"width": 1280, "height": 900}, base_url=server.url)
        context.set_default_timeout(TIMEOUT_MS)
        # expect() has a timeout of its own (5 s), which the context's default does not reach: the
        # explain panel's estimate can take longer than that on a loaded 2-core machine.
        from playwright.sync_api import expect

        expect.set_options(timeout=TIMEOUT_MS)
        tab = context.new_page()
        errors: list[str] = []
        tab.on("pageerror", lambda exc: errors.append(str(exc)))
        # The browser logs every 4xx fetch as an error; the one the test provokes (422) is expected.
        tab.on("console", lambda msg: errors.append(msg.text)
               if msg.type == "error" and "status of 422" not in msg.text else None)
        yield tab
        browser.close()
    assert not errors, f"the pages logged errors: {errors}"


def test_launch_watch_explain_and_compare_in_a_real_browser(page, server, shots):
    from playwright.sync_api import expect

    # Home, empty.
    page.goto("/")
    expect(page.get_by_role("heading", name="Table runs")).to_be_visible()
    expect(page.get_by_text("No runs yet")).to_be_visible()
    page.screenshot(path=shots / "01-home-empty.png", full_page=True)

    # The launch form: the API turns down a sequence length, and says so next to the field.
    page.get_by_role("link", name="New table").first.click()
    expect(page).to_have_url(re.compile(r"/new$"))
    page.get_by_label("Model").fill("tiny-bert")
    page.get_by_label("Sequence lengths").fill("32, 64, 99999")
    page.get_by_role("button", name="Make the table").click()
    error = page.locator("#seq_lens-error")
    expect(error).to_be_visible()
    expect(error).to_contain_text("sequence length 99999 exceeds this server's limit")
    expect(page.get_by_label("Sequence lengths")).to_have_attribute("aria-invalid", "true")
    expect(page).to_have_url(re.compile(r"/new$"))
    page.screenshot(path=shots / "02-launch-field-error.png", full_page=True)

    # Fixed, with two modes and a 1 GiB card: the new run's page opens.
    page.get_by_label("Sequence lengths").fill("32, 64, 128")
    for mode in ("ckpt", "amp+ckpt"):
        page.get_by_label(mode, exact=True).uncheck()
    page.get_by_label("or its memory").fill("1GiB")
    page.get_by_role("button", name="Make the table").click()
    expect(page).to_have_url(re.compile(r"/runs/[0-9a-f]{32}$"))
    run_id = page.url.rsplit("/", 1)[1]

    # The table fills in without a reload: a marker set on this document survives to the end.
    page.evaluate("window.__sameDocument = true")
    cells = page.locator("td.cell.state-done")
    counts, deadline = [], time.monotonic() + TIMEOUT_MS / 1000
    while page.locator("#run-status").text_content() != "done":
        assert time.monotonic() < deadline, f"the run did not finish; cells seen done: {counts}"
        if not counts or cells.count() != counts[-1]:
            counts.append(cells.count())
            if len(counts) == 2:
                page.screenshot(path=shots / "03-run-filling-in.png", full_page=True)
        page.wait_for_timeout(100)
    counts.append(cells.count())
    assert len(set(counts)) >= 2 and counts == sorted(counts), f"the table did not fill in live: {counts}"
    expect(cells).to_have_count(6)
    assert page.evaluate("window.__sameDocument") is True, "the page reloaded instead of updating"
    assert page.locator("#run-live").get_attribute("data-live") is None, "a finished run still polls"
    numbers = [int(t.strip().rstrip("+")) for t in page.locator("td.cell .cell-button").all_inner_texts()]
    assert all(n > 0 for n in numbers), numbers
    table = server.client.get(f"/v1/tables/{run_id}").json()
    assert sorted(numbers) == sorted(c["max_batch_size"] for c in table["cells"])
    expect(page.locator("svg.chart polyline")).to_have_count(2)  # one line per mode

    # A cell: its memory against the budget and its probes; then where the memory goes.
    page.get_by_role("button", name=re.compile(r"^seq 64, amp: max batch \d+")).click()
    detail = page.locator("#detail-64-amp")
    expect(detail).to_be_visible()
    expect(detail).to_contain_text("of the 486.4 MiB budget")
    expect(detail.locator("table.probes tbody tr").first).to_be_visible()
    expect(detail.locator("table.probes")).to_contain_text("oom")
    assert page.url.endswith("#cell-64-amp")
    detail.get_by_role("button", name="Where does the memory go?").click()
    panel = page.locator("#explain")
    expect(panel.get_by_role("table", name=re.compile("Peak memory of the step"))).to_be_visible()
    expect(panel).to_contain_text("activations saved for backward")
    expect(panel).to_contain_text("Largest modules by parameters")
    page.screenshot(path=shots / "04-run-done-cell-explain.png", full_page=True)

    # A second run through the API, then both side by side from the home page.
    second = server.client.post("/v1/tables", json={
        "model": "tiny-bert", "seq_lens": [32, 64, 128], "modes": ["fp32", "amp"], "gpu_memory": "2GiB",
    }).json()
    server.wait_for(f"/v1/tables/{second['id']}", lambda t: t["status"] == "done")
    page.goto("/")
    rows = page.locator("table.list tbody tr")
    expect(rows).to_have_count(2)
    expect(rows.first).to_contain_text("custom 2 GiB")  # newest first
    expect(page.locator("table.list .status.done")).to_have_count(2)
    page.screenshot(path=shots / "05-home-two-runs.png", full_page=True)
    for box in page.locator("table.list input[type=checkbox]").all():
        box.check()
    page.get_by_role("button", name="Compare selected runs").click()
    expect(page).to_have_url(re.compile(r"/compare\?id="))
    fp32 = page.get_by_role("table", name=re.compile("^Max batch size, fp32"))
    expect(fp32.locator("thead th")).to_have_count(3)  # seq len + two runs
    expect(fp32).to_contain_text("custom 1 GiB")
    expect(fp32).to_contain_text("custom 2 GiB")
    expect(page.locator("#reference-note")).to_contain_text("Why PyTorch numbers differ")
    expect(page.get_by_role("table", name=re.compile("BERT README"))).to_contain_text("bert-large")
    page.screenshot(path=shots / "06-compare.png", full_page=True)

    # A phone's width: the table scrolls inside its box, the page does not.
    page.set_viewport_size({"width": 390, "height": 844})
    page.goto(f"/runs/{run_id}#cell-128-fp32")
    expect(page.locator("#detail-128-fp32")).to_be_visible()
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= 390 + 1, f"the page is {width}px wide on a 390px screen"
    page.screenshot(path=shots / "07-phone-run.png", full_page=True)
    print(f"dashboard screenshots: {shots}")
