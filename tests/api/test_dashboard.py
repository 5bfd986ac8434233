"""The dashboard's pages through the app's test client, on runs written straight into the store.

The browser test (test_dashboard_e2e.py) drives the same pages in Chromium; these pin what each
page says for each state of a run: done, failed and pending cells, live updates, compare, errors.
"""

from __future__ import annotations

import re
from html import unescape

import pytest

from api.runs.spec import normalize
from api.settings import Settings
from api.views.common import band
from api.views.compare import reference_key

BUDGET_PROBE = {"peak_allocated_bytes": 90 << 20, "peak_reserved_bytes": 100 << 20, "estimate": "traced"}


def cell(seq_len, mode, best, *, capped=False, error=None):
    """A finished cell as the tuner stores it: a fitting probe at ``best`` and an OOM above it."""
    probes = []
    if best is not None:
        probes = [
            {"batch_size": best, "outcome": "fits", "peak_bytes": 400 << 20, **BUDGET_PROBE},
            {"batch_size": best + 1, "outcome": "oom", "peak_bytes": 520 << 20, **BUDGET_PROBE},
        ]
    return {"seq_len": seq_len, "mode": mode, "max_batch_size": best,
            "peak_memory_bytes": 400 << 20 if best else None,
            "peak_allocated_bytes": 380 << 20 if best else None, "probes": len(probes), "capped": capped,
            "backend": "estimate", "step_time_s": None, "error": error, "probe_log": probes}


@pytest.fixture
def store(idle_client):
    return idle_client.app.state.queue.store


@pytest.fixture
def add_run(idle_client, store):
    """A run of ``body`` in the store, with ``cells`` finished and the status given."""
    settings = Settings()
    environment = idle_client.app.state.queue.runner.environment

    def add(body, cells=(), status="done", error=None, force_key=None):
        spec = normalize({"backend": "estimate", **body}, settings, environment)
        run, _ = store.create_run(key=force_key or spec.key(), model=spec.model, gpu=spec.gpu["name"],
                                  backend=spec.backend, spec=spec.to_json(), total=spec.cells, reuse=())
        if status != "queued":
            store.mark_running(run.id, lane="estimate:0", worker_pid=None)
        for position, c in enumerate(cells):
            store.add_cell(run.id, position, c)
        if status in ("done", "failed", "cancelled"):
            if status == "cancelled":
                store.cancel_run(run.id)
            else:
                store.finish_run(run.id, status, error=error)
        return run.id

    return add


TINY = {"model": "tiny-bert", "seq_lens": [32, 64], "modes": ["fp32", "amp"], "gpu_memory": "1GiB"}


def text(response) -> str:
    """The page's text, tags dropped and whitespace folded: what a reader sees."""
    return re.sub(r"\s+", " ", unescape(re.sub(r"<[^>]+>", " ", response.text)))


# -- home -------------------------------------------------------------------------------------------


def test_home_without_runs_invites_the_first_table(idle_client):
    page = idle_client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "No runs yet. Make the first table ." in text(page)


def test_home_lists_runs_newest_first_with_progress_and_filters(idle_client, add_run):
    add_run(TINY, [cell(32, "fp32", 100)], status="failed", error="worker died")
    add_run({**TINY, "model": "tiny-roberta", "gpu": "T4", "gpu_memory": None}, status="queued")
    page = idle_client.get("/")
    rows = re.findall(r'<tr data-run="([0-9a-f]+)">(.*?)</tr>', page.text, re.S)
    assert [re.search(r'<a href="/runs/[0-9a-f]+">([^<]+)</a>', r).group(1) for _, r in rows] == [
        "tiny-roberta", "tiny-bert"]
    assert 'max="4" value="1"' in rows[1][1] and "1/4 cells" in rows[1][1]
    assert "failed" in rows[1][1] and "queued" in rows[0][1]
    assert "estimated" in rows[0][1]
    # An active run keeps the list refreshing; the choices of the filters are the runs' values.
    assert 'data-live="/runs?offset=0"' in page.text
    assert '<option value="T4" >T4</option>' in page.text or '<option value="T4">T4</option>' in page.text
    filtered = idle_client.get("/", params={"gpu": "t4"})  # resolved as the API resolves it
    assert "1 run matching the filters" in text(filtered) and "tiny-bert</a>" not in filtered.text
    by_status = idle_client.get("/", params={"status": "failed"})
    assert "tiny-bert</a>" in by_status.text and "tiny-roberta</a>" not in by_status.text
    assert "No runs match these filters." in text(idle_client.get("/", params={"model": "gpt2"}))


def test_a_failed_run_carries_a_failed_badge_not_how_its_numbers_were_found(idle_client, add_run):
    failed = add_run(TINY, [cell(32, "fp32", 100)], status="failed", error="worker died")
    done = add_run({**TINY, "gpu_memory": "2GiB"}, [cell(32, "fp32", 100)])
    rows = dict(re.findall(r'<tr data-run="([0-9a-f]+)">(.*?)</tr>', idle_client.get("/").text, re.S))
    assert re.findall(r'class="badge (\w+)">(\w+)<', rows[failed]) == [("failed", "failed")]
    assert re.findall(r'class="badge (\w+)">(\w+)<', rows[done]) == [("estimated", "estimated")]
    page = idle_client.get(f"/runs/{failed}").text
    assert '<span class="badge failed">failed</span>' in page and "badge estimated" not in page


def test_home_stops_refreshing_when_no_run_is_active(idle_client, add_run):
    add_run(TINY, [cell(32, "fp32", 100)])
    fragment = idle_client.get("/runs")
    assert fragment.text.lstrip().startswith('<div id="runs"') and "data-live" not in fragment.text


# -- run page --------------------------------------------------------------------------------------


def test_run_page_shows_each_cell_by_state_while_running(idle_client, add_run):
    run_id = add_run(TINY, [cell(32, "fp32", 3000), cell(64, "fp32", 0)], status="running")
    page = idle_client.get(f"/runs/{run_id}")
    assert page.status_code == 200
    html = page.text
    assert f'data-live="/runs/{run_id}/live"' in html
    # Done cells carry their number and headroom band; the next in the tuner's order (amp at the
    # shortest length) is being measured; the rest are queued.
    assert re.search(r'band-ample state-done">\s*<button[^>]*aria-label="seq 32, fp32: max batch 3000"', html)
    assert re.search(r'band-none state-done">\s*<button[^>]*aria-label="seq 64, fp32: max batch 0"', html)
    assert re.search(r'state-measuring">\s*<button[^>]*data-cell="32-amp"', html)
    assert re.search(r'state-queued">\s*<button[^>]*data-cell="64-amp"', html)
    assert "Batch 1 does not fit in 486.4 MiB." in text(page)
    # The chart: one line per mode, the unknown points left out of its text.
    assert "fp32 (32: 3000, 64: 0); amp (32: pending, 64: pending)" in html


def test_run_page_cell_details_give_memory_against_budget_and_probes(idle_client, add_run):
    run_id = add_run(TINY, [cell(s, m, 700) for m in ("fp32", "amp") for s in (32, 64)])
    page = idle_client.get(f"/runs/{run_id}")
    assert "data-live" not in page.text.split('id="run-live"')[1].split(">")[0]
    detail = page.text.split('id="detail-64-amp"')[1].split("</article>")[0]
    words = re.sub(r"\s+", " ", unescape(re.sub(r"<[^>]+>", " ", detail)))
    assert "At batch 700 the step needs 400 MiB of the 486.4 MiB budget (82.2%, 86.4 MiB free)" in words
    assert "Batch 701 ran out of memory (needs 520 MiB)." in words
    assert "2 probes, in the order made" in words and "oom" in words


def test_failed_cells_and_failed_runs_show_their_errors(idle_client, add_run):
    failing = cell(64, "amp", None, error="probe failed: CUDA error: an illegal memory access")
    run_id = add_run(TINY, [cell(32, "fp32", 10), failing], status="failed",
                     error="worker exited with SIGKILL")
    words = text(idle_client.get(f"/runs/{run_id}"))
    assert "Run failed: worker exited with SIGKILL" in words
    assert "seq 64, amp: failed probe failed: CUDA error: an illegal memory access" in words
    assert words.count("not measured") >= 1


def test_unknown_run_is_404(idle_client):
    assert idle_client.get("/runs/nope").status_code == 404
    assert idle_client.get("/runs/nope/live").status_code == 404


def test_explain_panel_of_a_cell(idle_client, add_run):
    run_id = add_run(TINY, [cell(32, "fp32", 2365)])
    panel = idle_client.get(f"/runs/{run_id}/explain", params={"seq_len": 32, "mode": "fp32"})
    assert panel.status_code == 200
    words = text(panel)
    assert "Where the memory goes: seq 32, fp32" in words
    assert "Peak memory of the step at batch 2365, by kind" in words  # the table's max (estimated)
    assert "activations saved for backward" in words and "What would fit?" in words
    query = {"seq_len": 32, "mode": "fp32", "levers": 1}
    levers = text(idle_client.get(f"/runs/{run_id}/explain", params=query))
    assert "What would fit at seq 32" in levers
    assert "could run out of memory on some runs and not others" in levers and "eager attention" in levers
    missing = idle_client.get(f"/runs/{run_id}/explain", params={"seq_len": 48, "mode": "fp32"})
    assert missing.status_code == 404 and "its sequence lengths are [32, 64]" in missing.json()["detail"]


# -- launch -----------------------------------------------------------------------------------------


def test_launch_form_offers_presets_modes_and_gpus(idle_client):
    html = idle_client.get("/new").text
    assert '<option value="bert-base-uncased">' in html and '<option value="tiny-bert">' in html
    # none checked: the server's default, the modes of the weights' dtype
    assert re.search(r'name="modes" value="amp\+ckpt">', html)
    assert not re.search(r'name="modes" value="[^"]+" checked', html)
    assert "None checked: those of the weights' dtype (fp32,amp,ckpt,amp+ckpt; bf16,bf16+ckpt for " in html
    assert '<option value="T4">T4 (14.56 GiB)</option>' in html
    assert 'id="token"' not in html  # the server asks for no token


def test_launch_form_asks_for_the_token_when_the_server_needs_one(tmp_path):
    from fastapi.testclient import TestClient

    from api.main import create_app
    from api.runs.runner import LocalRunner

    app = create_app(Settings(db=tmp_path / "t.db", api_token="s3cret"),
                     runner=LocalRunner(estimate_workers=0, gpu_lanes=[]))
    with TestClient(app, base_url="http://localhost") as client:
        assert 'id="token" name="token" type="password"' in client.get("/new").text


@pytest.mark.parametrize(("body", "status", "field", "message"), [
    ({"seq_lens": [32, 99999]}, 422, "seq_lens", "exceeds this server's limit of 8192 tokens"),
    ({"model": "no-such-model"}, 404, "model", "unknown model 'no-such-model'"),
    ({"modes": ["fp32", "fp8"]}, 422, "modes", "unknown mode 'fp8'"),
    ({"gpu": "T4", "gpu_memory": "20GiB"}, 422, "gpu_memory",
     "GPU memory 20 GiB is more than the 14.56 GiB of T4"),
    ({"gpu_memory": "lots"}, 422, "gpu_memory", "lots"),
    ({"margin": 1.5}, 422, "margin", "margin"),
    ({"task": "translation"}, 422, "task", "translation"),
    ({"max_batch": 10**9}, 422, "max_batch", "exceeds this server's limit"),
    ({"model": "../etc/passwd"}, 403, "model", "'..'"),
])
def test_api_errors_name_the_field_for_the_form(idle_client, body, status, field, message):
    response = idle_client.post("/v1/tables", json={**TINY, **body})
    assert response.status_code == status
    assert response.json()["field"] == field and message in response.json()["detail"]


def test_one_cell_routes_name_their_own_query_fields(idle_client):
    response = idle_client.get("/v1/explain", params={"model": "tiny-bert", "seq_len": 32, "mode": "fp8"})
    assert response.status_code == 422 and response.json()["field"] == "mode"
    response = idle_client.get("/v1/check", params={"model": "tiny-bert", "seq_len": 9999, "batch_size": 1})
    assert response.status_code == 422 and response.json()["field"] == "seq_len"


# -- compare ---------------------------------------------------------------------------------------


def test_compare_puts_runs_side_by_side_with_ratios(idle_client, add_run):
    small = add_run(TINY, [cell(32, "fp32", 100), cell(64, "fp32", 50), cell(32, "amp", 120)])
    large = add_run({**TINY, "gpu_memory": "2GiB"},
                    [cell(32, "fp32", 300), cell(64, "fp32", 150, capped=True)])
    page = idle_client.get("/compare", params=[("id", small), ("id", large)])
    html = page.text
    fp32 = html.split('id="mode-1"')[1].split("</section>")[0]
    assert fp32.count('<th scope="col"') == 3  # seq len and two runs
    assert "custom 1 GiB" in fp32 and "custom 2 GiB" in fp32
    assert "×3.00" in fp32  # 300 / 100
    assert "150+" in fp32 and "×3.00" in fp32 and "×1.50" not in fp32  # no ratio against a capped cell
    amp = html.split('id="mode-2"')[1].split("</section>")[0]
    assert "n/a" not in amp and "–" in amp  # the 2 GiB run has amp cells pending
    assert "BERT README" not in fp32  # neither run is a BERT
    assert "Why PyTorch numbers differ" in html


def test_compare_shows_the_bert_readme_beside_bert_base(idle_client, add_run):
    bert = {"model": "bert-base-uncased", "seq_lens": [128, 512], "modes": ["fp32"], "gpu": "TITAN-X-12GB"}
    run_id = add_run(bert, [cell(128, "fp32", 126), cell(512, "fp32", 30)])
    html = idle_client.get("/compare", params={"id": run_id}).text
    fp32 = html.split('id="mode-1"')[1].split("</section>")[0]
    assert "bert-base · BERT README" in fp32 and "TensorFlow, Titan X 12 GB, fp32" in fp32
    def row(seq_len):
        html = fp32.split(f'<th scope="row">{seq_len}</th>')[1].split("</tr>")[0]
        return re.sub(r"<[^>]+>", " ", html).split()

    assert row(512) == ["30", "6"]
    assert row(64) == ["n/a", "64"]  # the README has 64, this run does not


def test_compare_reports_unknown_and_too_many_runs(idle_client, add_run):
    run_id = add_run(TINY, [cell(32, "fp32", 100)])
    page = idle_client.get("/compare", params=[("id", run_id), ("id", "nope"), ("id", "<b>x</b>")])
    assert "no table run with id 'nope'" in text(page)
    assert "<b>x</b>" not in page.text and "&lt;b&gt;x&lt;/b&gt;" in page.text  # escaped
    many = [("id", f"x{i}") for i in range(10)]
    assert "10 runs asked for: the page compares at most 8" in text(idle_client.get("/compare", params=many))
    picker = idle_client.get("/compare").text
    assert f'value="{run_id}"' in picker and "Choose runs (0 chosen)" in picker


def test_reference_key_matches_bert_sizes_only():
    assert reference_key("bert-base-uncased") == "bert-base"
    assert reference_key("google-bert/bert-large-cased") == "bert-large"
    assert reference_key("roberta-base") is None and reference_key("distilbert-base-uncased") is None


# -- pieces -----------------------------------------------------------------------------------------


def test_bands_of_headroom():
    assert [band(b) for b in (0, 1, 7, 8, 31, 32, 5000)] == [
        "none", "tight", "tight", "some", "some", "ample", "ample"]
    assert band(4096, capped=True) == "capped" and band(None) == "failed"


def test_explain_over_http_never_takes_the_gpu_for_8bit_levers(idle_client, monkeypatch):
    import autotune.analysis.levers

    def refuse(target):
        raise AssertionError("the API measured the 8-bit levers outside the runner's GPU lanes")

    monkeypatch.setattr(autotune.analysis.levers, "real_8bit", refuse)
    response = idle_client.get("/v1/explain", params={"model": "tiny-bert", "seq_len": 32,
                                                      "gpu_memory": "1GiB"})
    assert response.status_code == 200
    eight_bit = [lever for lever in response.json()["levers"] if lever["name"].startswith("adamw-8bit")]
    assert eight_bit and all(lever["estimated"].startswith("emulated") for lever in eight_bit)


# -- measured reference tables (api/measurements.py) -------------------------------------------------


def test_an_imported_measured_table_says_where_it_was_measured(idle_client, store):
    from pathlib import Path

    from api.measurements import import_measurements

    card = Path(__file__).resolve().parents[2] / "docs/measurements/h100-80gb/llama-3.2-1b-card.json"
    (imported,) = import_measurements(store, [card], Settings())
    file = imported.measurement.file  # docs/measurements/h100-80gb/llama-3.2-1b-card.json, from the root
    label = f"measured on NVIDIA H100 80GB HBM3 (imported from {file})"

    def seen(html: str) -> str:  # text(), the paths' line-break hints dropped
        return re.sub(r"\s+", " ", unescape(re.sub(r"<[^>]+>", " ", html.replace("<wbr>", ""))))

    page = idle_client.get(f"/runs/{imported.run.id}")
    words = seen(page.text)
    assert f"{label} (cuda)" in words
    assert ("driver 580.159.04, CUDA 13.0, torch 2.11.0+cu130, transformers 5.23.0; a measured reference "
            "table, 3 of its cells not measured (the measurement did not reach them)") in words
    # The cells the lease did not reach: not measured, not failures.
    for seq_len in (1024, 2048, 4096):
        assert re.search(rf'state-not-measured">\s*<button[^>]*aria-label="seq {seq_len}, bf16\+ckpt: not '
                         'measured"', page.text)
    assert "state-failed" not in page.text and "band-failed state" not in page.text
    detail = seen(page.text.split('id="detail-1024-bf16_ckpt"')[1].split("</article>")[0])
    assert f"Not measured: the measurement imported from {file} did not reach this cell" in detail
    assert "max batch 35" in words  # a measured cell: seq 512, bf16

    assert label in seen(idle_client.get("/").text)  # the runs list says it too
    compare = seen(idle_client.get("/compare", params={"id": imported.run.id}).text)
    assert "measured on NVIDIA H100 80GB HBM3 (imported), budget 74.63 GiB" in compare
