"""The dashboard's fleet parts: the fleet view (one model on every GPU kind, from the store) and the
launch of a table on all kinds of a fleet (POST /v1/fleet/tables, and the form that offers it).

The fleet is a StaticCluster behind RayRunner's own routing (tests/fleet.py): what the service knows of
a cluster, without starting Ray; its runs stay queued. test_fleet.py runs the same service on a real
cluster, and test_dashboard_e2e.py drives both parts in Chromium against one.
"""

from __future__ import annotations

import re
from html import unescape

import pytest
from conftest import LOCAL
from fleet import StaticCluster, fleet_runner

from api.fleet.launch import NO_FLEET
from api.fleet.step import step_of
from api.runs.spec import normalize
from api.settings import Settings


def cell(seq_len, mode, best, *, capped=False, error=None):
    return {"seq_len": seq_len, "mode": mode, "max_batch_size": best, "peak_memory_bytes": None,
            "peak_allocated_bytes": None, "probes": 1, "capped": capped, "backend": "cuda",
            "step_time_s": None, "error": error, "probe_log": []}


@pytest.fixture
def serve(tmp_path, analyses):
    """``serve(cluster)``: a test client of the real app whose runner has ``cluster`` as its fleet
    (None: no fleet, the runner of one host)."""
    from fastapi.testclient import TestClient

    from api.main import create_app
    from api.runs.runner import LocalRunner

    clients = []

    def make(cluster=None):
        runner = (LocalRunner(estimate_workers=0, gpu_lanes=[], analyses=analyses) if cluster is None
                  else fleet_runner(cluster, analyses))
        client = TestClient(create_app(Settings(db=tmp_path / f"fleet-{len(clients)}.db"), runner=runner),
                            base_url=LOCAL)
        client.__enter__()
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.__exit__(None, None, None)


@pytest.fixture
def client(serve):
    return serve(StaticCluster(("T4", "L4", "A10G")))


@pytest.fixture
def add_run(client):
    """A run of ``body`` measured on its ``gpu`` (cuda on the fleet), in the store with ``cells``."""
    store, environment = client.app.state.queue.store, client.app.state.queue.runner.environment

    def add(body, cells=(), status="done"):
        spec = normalize({"backend": "cuda", **body}, Settings(), environment)
        run, _ = store.create_run(key=f"{spec.key()}-{len(store.list_runs()[0])}", model=spec.model,
                                  gpu=spec.gpu["name"], backend=spec.backend, spec=spec.to_json(),
                                  total=spec.cells, reuse=())
        if status != "queued":
            store.mark_running(run.id, lane="ray:" + spec.gpu["name"], worker_pid=None)
        for position, c in enumerate(cells):
            store.add_cell(run.id, position, c)
        if status == "cancelled":
            store.cancel_run(run.id)
        elif status in ("done", "failed"):
            store.finish_run(run.id, status, error="worker died" if status == "failed" else None)
        return run.id

    return add


TINY = {"model": "tiny-bert", "seq_lens": [32, 64], "modes": ["fp32", "amp"]}


def text(html: str) -> str:
    return re.sub(r"\s+", " ", unescape(re.sub(r"<[^>]+>", " ", html)))


def tables(html: str) -> dict[str, list[list[str]]]:
    """Each mode's table of the page as rows of cell texts, the header row first."""
    found = {}
    for mode, body in re.findall(r'<h2 id="mode-\d+">([^<]+)</h2>(.*?)</table>', html, re.S):
        rows = re.findall(r"<tr>(.*?)</tr>", body, re.S)
        found[mode] = [[text(c).strip() for c in re.findall(r"<t[hd][^>]*>(.*?)</t[hd]>", r, re.S)]
                       for r in rows]
    return found


def full(kind: str, fp32: tuple[int, int], amp: tuple[int, int]) -> tuple[dict, list[dict]]:
    cells = [cell(32, "fp32", fp32[0]), cell(64, "fp32", fp32[1]), cell(32, "amp", amp[0]),
             cell(64, "amp", amp[1])]
    return {**TINY, "gpu": kind}, cells


# -- the fleet view ------------------------------------------------------------------------------------


def test_fleet_view_puts_every_kinds_table_side_by_side_per_mode_with_a_line_per_kind(client, add_run):
    l4 = add_run(*full("L4", (300, 150), (600, 300)))
    t4 = add_run(*full("T4", (200, 100), (400, 200)))
    page = client.get("/fleet", params={"model": "tiny-bert"})
    assert page.status_code == 200
    found = tables(page.text)
    # A table per mode, a column per kind from the smallest card: T4 (15 GiB), then L4 (22 GiB), with
    # the ratio to the first.
    assert list(found) == ["fp32", "amp"]
    assert [h.split(" ")[0] for h in found["fp32"][0]] == ["seq", "T4", "L4"]
    assert found["fp32"][1:] == [["32", "200", "300 ×1.50"], ["64", "100", "150 ×1.50"]]
    assert found["amp"][1:] == [["32", "400", "600 ×1.50"], ["64", "200", "300 ×1.50"]]
    assert f'href="/runs/{t4}">T4</a>' in page.text and f'href="/runs/{l4}">L4</a>' in page.text
    assert "one column per GPU kind; ×N is the ratio to the first GPU kind (T4)" in page.text
    # A chart per mode, a line per kind.
    charts = re.findall(r"<svg class=\"chart\" id=\"chart-\w+\".*?</svg>", page.text, re.S)
    assert len(charts) == 2
    assert all(c.count("<polyline") == 2 for c in charts)
    assert "T4 (32: 200, 64: 100); L4 (32: 300, 64: 150)" in page.text
    # What the columns share, said once.
    facts = text(page.text.split('id="fleet-step"')[1].split("</dl>")[0])
    assert "GPU kinds 2: T4, L4" in facts
    assert "Numbers measured on each kind's GPU" in facts and "Task sequence-classification" in facts
    assert "Step fp32 weights, adamw_torch_fused, attention transformers' choice" in facts
    assert "PEFT full fine-tune" in facts and "Margin 0.05 of each card kept free" in facts
    # The fleet also has an A10G, not measured for this step: the view says so and how to.
    assert "The fleet also has A10G, with no run of this step yet" in text(page.text)
    assert 'href="/new?model=tiny-bert&amp;gpu=all-kinds"' in page.text
    assert "data-live" not in page.text.split('id="fleet-live"')[1].split(">")[0]  # nothing to wait for


def test_runs_of_another_step_are_compared_apart_never_mixed(client, add_run):
    add_run(*full("T4", (200, 100), (400, 200)))
    add_run(*full("L4", (300, 150), (600, 300)))
    sgd = add_run({**TINY, "gpu": "L4", "optimizer": "sgd", "modes": ["fp32"]}, [cell(32, "fp32", 900)])
    lora = add_run({**TINY, "gpu": "T4", "peft": "lora", "modes": ["fp32"]}, [cell(32, "fp32", 700)])
    page = client.get("/fleet", params={"model": "tiny-bert"})
    # The step on the most kinds is shown; the others are listed, each a link to its own view.
    assert [h.split(" ")[0] for h in tables(page.text)["fp32"][0]] == ["seq", "T4", "L4"]
    assert sgd not in page.text and lora not in page.text
    steps = page.text.split('id="fleet-steps"')[1].split("</ul>")[0]
    assert "3 steps of tiny-bert measured; showing one" in text(page.text)
    links = re.findall(r'href="(/fleet\?model=tiny-bert&amp;step=[0-9a-f]{12})">([^<]+)</a>', steps)
    assert len(links) == 2 and "<strong aria-current" in steps
    store = client.app.state.queue.store
    sgd_step = step_of(store.get_run(sgd).spec).id
    sgd_page = client.get("/fleet", params={"model": "tiny-bert", "step": sgd_step})
    assert tables(sgd_page.text)["fp32"] == [["seq len", "L4 measured, budget 20.59 GiB"], ["32", "900"],
                                             ["64", "–"]]
    assert "Step fp32 weights, sgd, attention" in text(sgd_page.text)
    lora_step = step_of(store.get_run(lora).spec).id
    lora_page = client.get("/fleet", params={"model": "tiny-bert", "step": lora_step})
    assert "PEFT LoRA r=16 alpha=32 dropout 0.05 on PEFT's default modules" in text(lora_page.text)
    # An unknown step says so, and shows the default one.
    missing = client.get("/fleet", params={"model": "tiny-bert", "step": "0123456789ab"})
    assert "tiny-bert has no runs of the step '0123456789ab'; showing the one on the most GPU kinds" in text(
        missing.text)
    assert [h.split(" ")[0] for h in tables(missing.text)["fp32"][0]] == ["seq", "T4", "L4"]


def test_the_step_is_what_the_runs_train_not_how_it_was_asked_nor_their_lengths(client):
    environment = client.app.state.queue.runner.environment

    def step(**body):
        return step_of(normalize({**TINY, "gpu": "T4", "backend": "cuda", **body}, Settings(),
                                 environment).to_json())

    same = step(dtype="auto")  # tiny-bert's config: float32
    assert step(dtype="float32") == same and step(gpu="L4") == same
    assert step(seq_lens=[128], modes=["bf16"], max_batch=64, search="bisect") == same
    assert step(optimizer="adamw") == step(optimizer="adamw_torch") != same  # an alias, another optimizer
    for other in ({"dtype": "bfloat16"}, {"attn": "eager"}, {"margin": 0.1}, {"peft": "lora"},
                  {"peft": "lora", "lora_r": 8}, {"backend": "estimate"}, {"task": "masked-lm"}):
        assert step(**other) != same, other
        assert step(**other).id != same.id and len(same.id) == 12


def test_each_kind_shows_its_newest_run_and_the_view_refreshes_while_one_runs(client, add_run):
    add_run(*full("T4", (200, 100), (400, 200)))
    running = add_run({**TINY, "gpu": "T4"}, [cell(32, "fp32", 210)], status="running")
    add_run(*full("L4", (300, 150), (600, 300)))
    add_run({**TINY, "gpu": "L4"}, [], status="failed")  # newer, but a kind with a done run shows it
    add_run({**TINY, "gpu": "A10G"}, [cell(32, "fp32", 320)], status="failed")  # alone: shown, failed
    add_run({**TINY, "gpu": "A10G"}, [], status="cancelled")  # never shown
    page = client.get("/fleet", params={"model": "tiny-bert"})
    fp32 = tables(page.text)["fp32"]
    assert [h.split(" ")[0] for h in fp32[0]] == ["seq", "T4", "L4", "A10G"]
    assert "running 1/4 cells" in fp32[0][1] and "failed 1/4 cells" in fp32[0][3]
    assert fp32[1:] == [["32", "210", "300 ×1.43", "320 ×1.52"], ["64", "–", "150", "–"]]
    assert f'href="/runs/{running}">T4</a>' in page.text
    live = page.text.split('id="fleet-live"')[1].split(">")[0]
    step = step_of(client.app.state.queue.store.get_run(running).spec).id
    assert f'data-live="/fleet/live?model=tiny-bert&amp;step={step}"' in live
    fragment = client.get("/fleet/live", params={"model": "tiny-bert", "step": step})
    assert fragment.text.lstrip().startswith('<div id="fleet-live"') and "<html" not in fragment.text
    assert "running 1/4 cells" in text(fragment.text)


def test_a_failed_run_reads_failed_with_its_error_in_its_kinds_column(client, add_run):
    add_run(*full("L4", (300, 150), (600, 300)))
    add_run({**TINY, "gpu": "T4"}, [], status="failed")  # worker died, before its first cell
    header = tables(client.get("/fleet", params={"model": "tiny-bert"}).text)["fp32"][0]
    assert [h.split(" ")[0] for h in header] == ["seq", "T4", "L4"]
    assert header[1].endswith("failed 0/4 cells worker died")
    assert "running" not in header[1] and "failed" not in header[2]


def test_fleet_view_without_a_model_or_runs_says_what_to_do(client, add_run):
    add_run(*full("T4", (200, 100), (400, 200)))
    page = client.get("/fleet")
    assert page.status_code == 200 and '<a href="/fleet?model=tiny-bert">tiny-bert</a>' in page.text
    assert "All kinds in the fleet\" on New table measures one on every kind of this server's fleet " \
           "(A10G, L4, T4)" in text(page.text)
    none = client.get("/fleet", params={"model": "gpt2"})
    assert "no runs of gpt2 yet" in text(none.text) and "<table" not in none.text
    other_case = client.get("/fleet", params={"model": "TINY-BERT"})  # read as the API reads a preset
    assert tables(other_case.text)["fp32"][1:] == [["32", "200"], ["64", "100"]]


def test_run_page_and_filtered_home_link_to_the_models_fleet_view(client, add_run):
    run_id = add_run(*full("T4", (200, 100), (400, 200)))
    step = step_of(client.app.state.queue.store.get_run(run_id).spec).id
    run_page = client.get(f"/runs/{run_id}")
    link = f'href="/fleet?model=tiny-bert&amp;step={step}" id="run-fleet">Every GPU kind…</a>'
    assert link in run_page.text
    home = client.get("/", params={"model": "tiny-bert"})
    assert 'href="/fleet?model=tiny-bert" id="home-fleet">tiny-bert on every GPU kind</a>' in home.text
    assert '<a href="/fleet" >Fleet</a>' in home.text or '<a href="/fleet">Fleet</a>' in home.text


def test_fleet_view_reads_the_store_on_a_server_without_a_fleet(serve):
    plain = serve(None)
    store = plain.app.state.queue.store
    for kind, bests in (("T4", (200, 100)), ("L4", (300, 150))):
        spec = normalize({**TINY, "modes": ["fp32"], "gpu": kind, "backend": "estimate"}, Settings(),
                         plain.app.state.queue.runner.environment)
        run, _ = store.create_run(key=spec.key(), model=spec.model, gpu=kind, backend="estimate",
                                  spec=spec.to_json(), total=spec.cells, reuse=())
        store.mark_running(run.id, lane="estimate:0", worker_pid=None)
        for position, (seq_len, best) in enumerate(zip((32, 64), bests, strict=True)):
            store.add_cell(run.id, position, {**cell(seq_len, "fp32", best), "backend": "estimate"})
        store.finish_run(run.id, "done")
    page = plain.get("/fleet", params={"model": "tiny-bert"})
    assert tables(page.text)["fp32"][1:] == [["32", "200", "300 ×1.50"], ["64", "100", "150 ×1.50"]]
    assert "Numbers estimated on the CPU" in text(page.text)
    assert "fleet also has" not in page.text


# -- all kinds in the fleet ----------------------------------------------------------------------------


def test_launch_form_offers_all_kinds_of_the_fleet(client):
    form = client.get("/new", params={"model": "tiny-bert", "gpu": "all-kinds"}).text
    assert '<option value="all-kinds" selected>all kinds in the fleet: A10G, L4, T4</option>' in form
    assert 'data-fleet-action="/v1/fleet/tables"' in form and 'data-fleet-url="/fleet"' in form
    assert 'value="tiny-bert"' in form.split('id="model"')[1].split(">")[0]
    assert "one run per GPU kind of this server's Ray cluster (A10G, L4, T4)" in text(form)


@pytest.mark.parametrize(("cluster", "reason"), [
    (None, NO_FLEET),
    (StaticCluster(error="ConnectionError: refused"),
     "the Ray cluster at 127.0.0.1:6379 is unreachable (ConnectionError: refused): no new runs until it is "
     "back"),
    (StaticCluster(()), "the Ray cluster at 127.0.0.1:6379 has no GPU node of a known kind"),
])
def test_launch_form_shows_all_kinds_disabled_with_the_reason(serve, cluster, reason):
    client = serve(cluster)
    form = client.get("/new").text
    disabled = '<option value="all-kinds" disabled>all kinds in the fleet (unavailable: see below)</option>'
    assert disabled in form
    assert f"All kinds in the fleet: unavailable, {reason}" in text(form)
    body = {"model": "tiny-bert", "seq_lens": [32]}
    refused = client.post("/v1/fleet/tables", json=body)
    assert refused.json()["detail"].startswith(reason)
    assert refused.status_code == (422 if cluster is None else 503)
    # Away: ask again soon (the runner joins it again by itself); no GPU node: nothing will change by itself.
    unreachable = cluster is not None and not cluster.reachable
    assert refused.headers.get("Retry-After") == ("10" if unreachable else None)
    assert client.get("/v1/tables").json()["count"] == 0


def test_all_kinds_queues_one_cuda_run_per_kind_then_the_fleet_view_shows_them(client):
    body = {"model": "tiny-bert", "seq_lens": [32, 64], "modes": ["fp32"], "backend": "auto"}
    answer = client.post("/v1/fleet/tables", json=body)
    assert answer.status_code == 202, answer.text
    made = answer.json()
    assert made["model"] == "tiny-bert" and made["kinds"] == ["A10G", "L4", "T4"]
    assert [(r["gpu"], r["status"], r["created"]) for r in made["runs"]] == [
        ("A10G", "queued", True), ("L4", "queued", True), ("T4", "queued", True)]
    for run in made["runs"]:
        table = client.get(f"/v1/tables/{run['id']}").json()
        assert table["backend"] == "cuda" and table["gpu"] == run["gpu"]
        assert table["environment"]["device"] == run["gpu"] and table["environment"]["fleet"] == "ray"
        assert step_of(client.app.state.queue.store.get_run(run["id"]).spec).id == made["step"]
    view = client.get("/fleet", params={"model": made["model"], "step": made["step"]})
    fp32 = tables(view.text)["fp32"]
    assert [h.split(" ")[0] for h in fp32[0]] == ["seq", "T4", "L4", "A10G"]
    assert all("queued 0/2 cells" in h for h in fp32[0][1:])
    assert fp32[1:] == [["32", "–", "–", "–"], ["64", "–", "–", "–"]]
    assert "data-live=" in view.text.split('id="fleet-live"')[1].split(">")[0]
    # The same request again: the same runs.
    again = client.post("/v1/fleet/tables", json=body).json()
    assert [r["id"] for r in again["runs"]] == [r["id"] for r in made["runs"]]
    assert not any(r["created"] for r in again["runs"])


@pytest.mark.parametrize(("extra", "field", "detail"), [
    ({"gpu": "T4"}, "gpu", "all kinds in the fleet sets each run's GPU to one of its kinds (A10G, L4, T4): "
                           "leave gpu (a GPU preset) out"),
    ({"gpu_memory": "12GiB"}, "gpu_memory", "all kinds in the fleet sets each run's GPU to one of its kinds "
                                            "(A10G, L4, T4): leave gpu_memory (a card size) out"),
    ({"backend": "estimate"}, "backend", "all kinds in the fleet measures on each kind's GPU: backend must "
                                         "be cuda or auto, not 'estimate'"),
    ({"seq_lens": [32, 99999]}, "seq_lens", "sequence length 99999 exceeds"),
])
def test_all_kinds_refuses_a_bad_request_naming_its_field_and_queues_nothing(client, extra, field, detail):
    answer = client.post("/v1/fleet/tables", json={"model": "tiny-bert", "seq_lens": [32], **extra})
    assert answer.status_code == 422
    assert answer.json()["field"] == field and answer.json()["detail"].startswith(detail)
    assert client.get("/v1/tables").json()["count"] == 0


def test_all_kinds_needs_the_token_where_writes_do(tmp_path, analyses):
    from fastapi.testclient import TestClient

    from api.main import create_app

    app = create_app(Settings(db=tmp_path / "token.db", api_token="s3cret"),
                     runner=fleet_runner(StaticCluster(), analyses))
    with TestClient(app, base_url=LOCAL) as client:
        body = {"model": "tiny-bert", "seq_lens": [32], "modes": ["fp32"]}
        assert client.post("/v1/fleet/tables", json=body).status_code == 401
        ok = client.post("/v1/fleet/tables", json=body, headers={"Authorization": "Bearer s3cret"})
        assert ok.status_code == 202 and len(ok.json()["runs"]) == 2
