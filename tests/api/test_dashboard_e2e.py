"""The dashboard end to end: real headless Chromium (Debian's, tests/browser.py) against ``autotune serve``
on loopback.

Open the home page, launch a tiny-model run with the form (after the API turned down a bad
sequence length next to its field), watch the table fill in without a reload, open a cell and its
explain panel, then compare three runs (one of them LoRA); then the same pages at a phone's width
(390 px) and a laptop's (1280 px), where every table must fit its box or scroll inside it with a
cue, every run must have its column in compare, and no two legend entries or axis labels may
overlap; at a phone's width the runs list keeps a run's status in view and its GPU's name on one line, and
the fleet view says a failed run failed, and why; a LoRA run's page, and on the launch form an unknown
model's closest presets in a line and the fine-tuning settings, at a phone's width; the trainer's
settings shown with their trainer only, GRPO's refused next to them, and a DPO run launched, its page
saying so. The API docs (/docs, /redoc) render from the server's own files. No page asks another host
for anything. The fleet view on a real Ray cluster of two GPU kinds is tests/api/test_fleet.py's (on
that module's cluster, which starting again here would cost a cluster's start).
Screenshots go to AUTOTUNE_SCREENSHOTS (``.ci/run`` sets it and prints the folder) or the test's
temporary folder.

Skipped when Chromium or Playwright is missing, unless AUTOTUNE_REQUIRE_BROWSER=1 (``.ci/run``
installs Chromium and sets it), where their absence fails the test instead.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from browser import PHONE, TIMEOUT_MS, assert_readable, browser_or_skip, browser_tab, chromium, screenshots
from liveserver import Server

from autotune.workload.trainers import GRPO_FIELDS

# Each compare table's run columns: the run's page it links to, and whether its header lies within
# the visible part of the table's box.
COMPARE_COLUMNS = """() => [...document.querySelectorAll("table.compare")].map((table) => {
  const box = table.closest(".scroll").getBoundingClientRect();
  return [...table.querySelectorAll("thead th a")].map((a) => {
    const r = a.closest("th").getBoundingClientRect();
    return [a.getAttribute("href"), r.left >= box.left - 0.5 && r.right <= box.right + 0.5];
  });
})"""




@pytest.fixture
def shots(tmp_path):
    return screenshots(tmp_path)


# One server and one Chromium for the module, a tab of its own for each test: each started again per
# test cost a server's start (it imports torch) and a browser's, seconds apiece on a loaded 2-core
# machine (issue #39). The launch test expects the store empty: it is the module's first.
@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("dash")
    started = Server(folder / "dash.db", folder / "dash.log")
    yield started
    started.stop()


@pytest.fixture(scope="module")
def browser(server):
    with chromium(browser_or_skip(), server.url) as opened:
        yield opened


@pytest.fixture
def page(browser):
    with browser_tab(browser) as tab:
        yield tab


# Where the text of the element ``selector`` that says ``text`` lies: the boxes of its lines and the
# screen's width. One box: the text is on one line.
TEXT_BOXES = """([selector, text]) => {
  const element = document.querySelector(selector);
  const walker = document.createTreeWalker(element, NodeFilter.SHOW_TEXT);
  while (walker.nextNode() && !walker.currentNode.textContent.includes(text));
  const range = document.createRange();
  const start = walker.currentNode.textContent.indexOf(text);
  range.setStart(walker.currentNode, start);
  range.setEnd(walker.currentNode, start + text.length);
  return [[...range.getClientRects()].map((r) => [r.left, r.right]), document.documentElement.clientWidth];
}"""


def add_failed_run(db: Path, gpu: str, error: str) -> tuple[str, str]:
    """A run of tiny-bert measured on a fleet's ``gpu`` that failed before its first cell, written to the
    server's store as a fleet's runner ends one: its id and its step's."""
    from api.fleet.step import step_of
    from api.runs.spec import normalize
    from api.settings import Settings
    from api.store import Store

    def on_the_fleet(backend: str, gpu: str | None = None) -> dict:  # as RayRunner.environment answers
        return {"backend": "cuda", "device": gpu, "fleet": "ray"}

    spec = normalize({"model": "tiny-bert", "seq_lens": [32, 64], "modes": ["fp32"], "backend": "cuda",
                      "gpu": gpu}, Settings(), on_the_fleet)
    store = Store(db)
    try:
        run, _ = store.create_run(key=spec.key(), model=spec.model, gpu=gpu, backend=spec.backend,
                                  spec=spec.to_json(), total=spec.cells, reuse=())
        assert store.finish_run(run.id, "failed", error=error)
    finally:
        store.close()
    return run.id, step_of(run.spec).id


def test_launch_watch_explain_and_compare_in_a_real_browser(page, server, shots):
    from playwright.sync_api import expect

    # Home, empty.
    page.goto("/")
    expect(page.get_by_role("heading", name="Table runs")).to_be_visible()
    expect(page.get_by_text("No runs yet")).to_be_visible()
    page.screenshot(path=shots / "01-home-empty.png", full_page=True)

    # The launch form: the API turns down a sequence length and a size without a unit, and says so
    # next to each field (every invalid field, not only the first).
    page.get_by_role("link", name="New table").first.click()
    expect(page).to_have_url(re.compile(r"/new$"))
    page.get_by_label("Model").fill("tiny-bert")
    page.get_by_label("Sequence lengths").fill("32, 64, 99999")
    page.locator("#gpu_memory").fill("12")
    page.get_by_role("button", name="Make the table").click()
    error = page.locator("#seq_lens-error")
    expect(error).to_be_visible()
    expect(error).to_contain_text("sequence length 99999 exceeds this server's limit")
    expect(page.get_by_label("Sequence lengths")).to_have_attribute("aria-invalid", "true")
    expect(page.locator("#gpu_memory-error")).to_contain_text("a size needs a unit")
    page.locator("#gpu_memory").fill("")
    expect(page).to_have_url(re.compile(r"/new$"))
    page.screenshot(path=shots / "02-launch-field-error.png", full_page=True)

    # Fixed, with two modes and a 1 GiB card: the new run's page opens.
    page.get_by_label("Sequence lengths").fill("32, 64, 128")
    for mode in ("fp32", "amp"):
        page.get_by_label(mode, exact=True).check()
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
    expect(panel.locator(".scroll[data-overflow]")).to_have_count(0)  # every column of explain in view
    assert_readable(page, "the run page, a cell and its explain panel")
    page.screenshot(path=shots / "04-run-done-cell-explain.png", full_page=True)

    # Two more runs through the API, one on a GPU preset, one with LoRA, then the three side by side
    # from the home page.
    others = [server.client.post("/v1/tables", json={
        "model": "tiny-bert", "seq_lens": [32, 64, 128], "modes": ["fp32", "amp"], **target,
    }).json()["id"] for target in ({"gpu": "T4"}, {"gpu_memory": "2GiB", "peft": "lora"})]
    for other in others:
        server.wait_for(f"/v1/tables/{other}", lambda t: t["status"] == "done")
    page.goto("/")
    rows = page.locator("table.list tbody tr")
    expect(rows).to_have_count(3)
    expect(rows.first).to_contain_text("custom 2 GiB")  # newest first
    expect(page.locator("table.list .status.done")).to_have_count(3)
    assert_readable(page, "the runs")
    page.screenshot(path=shots / "05-home-three-runs.png", full_page=True)
    for box in page.locator("table.list input[type=checkbox]").all():
        box.check()
    page.get_by_role("button", name="Compare selected runs").click()
    expect(page).to_have_url(re.compile(r"/compare\?id="))
    compare_url = page.url
    fp32 = page.get_by_role("table", name=re.compile("^Max batch size, fp32"))
    expect(fp32.locator("thead th")).to_have_count(4)  # seq len + three runs
    for target in ("custom 1 GiB", "T4", "custom 2 GiB"):
        expect(fp32).to_contain_text(target)
    expect(fp32.locator("thead .sub.adapter")).to_have_text(
        [re.compile(r"^LoRA r=16, [\d.]+% trainable$"), "full fine-tune", "full fine-tune"])  # newest first
    expect(page.locator("#reference-note")).to_contain_text("Why PyTorch numbers differ")
    expect(page.get_by_role("table", name=re.compile("BERT README"))).to_contain_text("bert-large")
    assert_every_run_has_its_column(page, [run_id, *others])
    assert_readable(page, "compare")
    page.screenshot(path=shots / "06-compare.png", full_page=True)

    # A phone's width: each table fits its box or scrolls inside it with a cue, the page never does.
    page.set_viewport_size(PHONE)
    page.goto(f"/runs/{run_id}#cell-64-amp")
    detail = page.locator("#detail-64-amp")
    expect(detail).to_be_visible()
    # Seven columns of probes do not fit 390 px: they scroll, and say so.
    cue = detail.locator(".scroll[data-overflow]")
    expect(cue).to_have_count(1)
    assert "scroll" in cue.evaluate("box => getComputedStyle(box, '::before').content")
    detail.get_by_role("button", name="Where does the memory go?").click()
    expect(panel.get_by_role("table", name=re.compile("Largest modules by activations"))).to_be_visible()
    expect(panel.locator(".scroll[data-overflow]")).to_have_count(0)  # every column of explain in view
    assert_readable(page, "the run page, a cell and its explain panel")
    page.screenshot(path=shots / "07-phone-run.png", full_page=True)
    page.goto(compare_url)
    assert_every_run_has_its_column(page, [run_id, *others])
    assert_readable(page, "compare")
    page.screenshot(path=shots / "08-phone-compare.png", full_page=True)
    # A failed run on a fleet's TITAN X: in the runs list its status stays in view and its GPU on one
    # line, its badge says failed (not "measured"); the fleet view says it failed, and why.
    error = "the Ray task failed: RuntimeError: CUDA error: no kernel image is available"
    failed, step = add_failed_run(server.db, "TITAN-X-12GB", error)
    page.goto("/")
    row = f'tr[data-run="{failed}"]'
    expect(page.locator(f"{row} .status")).to_have_text("failed")
    status = page.locator(f"{row} td.status-cell").bounding_box()
    assert 0 <= status["x"] and status["x"] + status["width"] <= PHONE["width"], status
    lines, width = page.evaluate(TEXT_BOXES, [row, "TITAN-X-12GB"])
    assert len(lines) == 1 and lines[0][1] <= width, f"TITAN-X-12GB at {PHONE['width']}px: {lines}"
    expect(page.locator(f"{row} .badge")).to_have_text("failed")
    assert_readable(page, "the runs")
    page.screenshot(path=shots / "09-phone-home.png", full_page=True)
    page.goto(f"/fleet?model=tiny-bert&step={step}")
    column = page.get_by_role("table", name=re.compile("^Max batch size, fp32")).locator("thead th").nth(1)
    expect(column).to_contain_text(re.compile(r"TITAN-X-12GB.*failed 0/2 cells"))
    expect(column).to_contain_text(error)
    assert_readable(page, "the fleet view of a failed run")
    page.screenshot(path=shots / "09c-phone-fleet-failed.png", full_page=True)
    page.goto(f"/runs/{others[1]}")  # the LoRA run: its adapter's label among the facts
    expect(page.locator("#run-adapter")).to_contain_text("LoRA r=16 alpha=32 dropout 0.05 on query,value")
    assert_readable(page, "a LoRA run")
    page.screenshot(path=shots / "09a-phone-lora-run.png", full_page=True)
    page.goto("/new")  # an unknown model: the closest presets, in a line
    page.get_by_label("Model").fill("tiny-bret")
    page.get_by_role("button", name="Make the table").click()
    expect(page.locator("#model-error")).to_have_text("unknown model 'tiny-bret': did you mean tiny-bert?")
    # The fine-tuning settings reach the API, which says what is wrong next to them.
    page.get_by_label("Model").fill("tiny-llama")
    page.get_by_label("Method").select_option("lora")
    page.get_by_label("LoRA rank (r)").fill("0")
    page.get_by_label("LoRA target modules").fill("q_proj,v_proj")
    page.get_by_role("button", name="Make the table").click()
    expect(page.locator("#lora_r-error")).to_contain_text(
        "LoRA rank must be an integer from 1 to 4096, got 0")
    expect(page.get_by_label("LoRA rank (r)")).to_have_attribute("aria-invalid", "true")
    page.get_by_label("Method").select_option("lora_8bit")  # asked for as transformers does
    with page.expect_request(lambda r: r.method == "POST" and r.url.endswith("/v1/tables")) as posted:
        page.get_by_role("button", name="Make the table").click()
    body = posted.value.post_data_json
    assert (body["peft"], body["load_in_8bit"]) == ("lora", True)
    expect(page.locator("#lora_r-error")).to_contain_text("LoRA rank must be an integer")
    page.get_by_label("GPUs", exact=True).fill("8")  # a multi-GPU job: its settings reach the API
    page.get_by_label("Spread").select_option("fsdp")
    page.get_by_label("FSDP2: keep each layer gathered").check()
    with page.expect_request(lambda r: r.method == "POST" and r.url.endswith("/v1/tables")) as posted:
        page.get_by_role("button", name="Make the table").click()
    body = posted.value.post_data_json
    assert (body["gpus"], body["parallel"], body["reshard_after_forward"]) == (8, "fsdp", False)
    assert "nodes" not in body
    assert_readable(page, "the launch form")
    page.screenshot(path=shots / "09b-phone-launch.png", full_page=True)
    # A trainer: each one's settings shown with it only; the API turns down GRPO's 512 completion tokens
    # in a row of 32 next to them; then a DPO run, whose page says its trainer.
    started = time.monotonic()
    page.goto("/new")
    page.get_by_label("Model").fill("tiny-llama")
    page.get_by_label("Sequence lengths").fill("32")
    page.get_by_label("fp32", exact=True).check()
    page.get_by_label("or its memory").fill("1GiB")
    completion, share = page.get_by_label("Completion tokens"), page.get_by_label("vLLM's share of the GPU")
    expect(completion).to_be_hidden()
    page.get_by_label("TRL trainer").select_option("grpo")
    expect(completion).to_be_visible()
    expect(share).to_be_hidden()
    page.get_by_label("Generation", exact=True).select_option("colocate")  # a colocated engine's share
    expect(share).to_be_visible()
    page.get_by_label("Generation", exact=True).select_option("")
    expect(share).to_be_hidden()
    page.get_by_role("button", name="Make the table").click()
    expect(page.locator("#max_completion_length-error")).to_contain_text(
        "sequence length 32 leaves no prompt beside max_completion_length 512")
    expect(completion).to_have_attribute("aria-invalid", "true")
    assert_readable(page, "the launch form's GRPO settings")
    page.screenshot(path=shots / "09d-phone-launch-grpo.png", full_page=True)
    page.get_by_label("TRL trainer").select_option("dpo")
    expect(completion).to_be_hidden()
    expect(page.get_by_label("Reference log-probs computed before training")).to_be_visible()
    with page.expect_request(lambda r: r.method == "POST" and r.url.endswith("/v1/tables")) as posted:
        page.get_by_role("button", name="Make the table").click()
    body = posted.value.post_data_json
    assert body["trainer"] == "dpo" and not set(body) & {  # GRPO's settings hidden, none sent
        "precompute_ref_log_probs", "chosen_nll", "kto_loss_type", "use_vllm", *GRPO_FIELDS}, body
    expect(page).to_have_url(re.compile(r"/runs/[0-9a-f]{32}$"))
    expect(page.locator("#run-trainer")).to_contain_text("dpo (DPOTrainer)")
    page.screenshot(path=shots / "09e-phone-dpo-run.png", full_page=True)
    print(f"the trainer's part of the flow: {time.monotonic() - started:.1f} s")
    print(f"dashboard screenshots: {shots}")


def assert_every_run_has_its_column(page, run_ids: list[str]) -> None:
    tables = page.evaluate(COMPARE_COLUMNS)
    assert tables, "no compare table"
    for columns in tables:
        assert sorted(href.rsplit("/", 1)[1] for href, _ in columns) == sorted(run_ids), columns
        cut = [href for href, inside in columns if not inside]
        assert not cut, f"at {page.viewport_size['width']}px the columns of {cut} are cut off"


def test_api_docs_render_from_the_server_itself(page, server, shots):
    """Swagger UI and ReDoc from the app's own files: the page fixture refuses and reports any other host."""
    from playwright.sync_api import expect

    page.goto("/")
    page.get_by_role("link", name="API").click()
    expect(page).to_have_url(re.compile(r"/docs$"))
    expect(page.locator(".swagger-ui .info .title")).to_contain_text("autotune")
    expect(page.get_by_text("/v1/tables/{table_id}").first).to_be_visible()
    page.screenshot(path=shots / "10-api-docs.png")
    page.goto("/redoc")
    expect(page.locator("h1", has_text="autotune")).to_be_visible()
    expect(page.get_by_text("/v1/tables/{table_id}").first).to_be_attached()
    page.screenshot(path=shots / "11-api-redoc.png")


