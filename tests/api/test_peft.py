"""LoRA / QLoRA in the service: POST /v1/tables, GET /v1/check and /v1/explain take the CLI's PEFT
settings (peft, lora_*, load_in_4bit, bnb_4bit_*), the store keeps the adapter in the run's spec and
its dedupe key, a stored table answers a check only for the same adapter, and the dashboard says
which adapter each run trained (or that it was a full fine-tune).

Runs here stay queued (the idle runner) or are written straight into the store; the adapter a run
reports is the one its worker's ``run_table`` emits, called in process and stopped before its first
cell. One check is estimated (QLoRA on tiny-llama) in the session's analysis worker.
"""

from __future__ import annotations

import hashlib
import json
import re
import warnings
from html import unescape
from importlib.metadata import version

import pytest
from storedruns import spec_of, text
from storedruns import store_done_run as _store_done_run

from api.routes.check import _covers
from api.runs.spec import TableSpec
from api.runs.worker import run_table
from autotune.workload.adapters import Adapter

LLAMA = {"model": "tiny-llama", "seq_lens": [32], "modes": ["fp32"], "gpu_memory": "1GiB",
         "backend": "estimate"}
LORA = {"peft": "lora"}
CELL = {"model": "tiny-llama", "seq_len": 32, "batch_size": 4, "gpu_memory": "1GiB"}
LORA_LABEL = "LoRA r=16 alpha=32 dropout 0.05 on q_proj,v_proj: 3.58k of 30.37k parameters trainable (11.80%)"


@pytest.fixture
def client(idle_client):
    return idle_client


def _reported_header(spec: TableSpec) -> dict:
    """The header a run's worker reports (api/runs/worker.py), stopped before its first cell."""
    sent: list[dict] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # transformers' deprecation notices, as the worker
        run_table({"spec": spec.to_json()}, sent.append, lambda: True)
    [header] = [m["header"] for m in sent if m["op"] == "header"]
    return header


# --- POST /v1/tables and the store ------------------------------------------------------------


def test_a_lora_table_is_its_own_run_and_identical_lora_requests_share_one(client):
    full = client.post("/v1/tables", json=LLAMA).json()
    lora = client.post("/v1/tables", json=LLAMA | LORA | {"lora_targets": "v_proj, q_proj"})
    assert lora.status_code == 202 and lora.json()["created"] and lora.json()["id"] != full["id"]
    # The same modules in another spelling and order, the defaults spelled out: the same run.
    again = client.post("/v1/tables", json=LLAMA | LORA | {"lora_targets": ["q_proj", "v_proj"], "lora_r": 16,
                                                          "lora_alpha": 32, "lora_dropout": 0.05})
    assert again.json()["id"] == lora.json()["id"] and again.json()["created"] is False
    # Another rank, QLoRA, PEFT's default targets: runs of their own.
    extras = (LORA | {"lora_r": 8}, {"peft": "qlora"}, LORA, {"peft": "lora", "load_in_4bit": True})
    others = [client.post("/v1/tables", json=LLAMA | extra).json() for extra in extras]
    assert all(o["created"] for o in others[:3]) and len({full["id"], lora.json()["id"],
                                                          *(o["id"] for o in others[:3])}) == 5
    assert others[3]["id"] == others[1]["id"]  # lora over a 4-bit base is qlora

    table = client.get(lora.json()["url"]).json()
    assert table["adapter"] == {
        "method": "lora", "r": 16, "alpha": 32.0, "dropout": 0.05, "targets": ["q_proj", "v_proj"],
        "targets_default": False, "quant_type": "nf4", "double_quant": True, "compute_dtype": None,
        "bias": "none", "modules_to_save": [], "recipe": None,
        "parameters": None,  # until its worker reports them
        "label": "LoRA r=16 alpha=32 dropout 0.05 on q_proj,v_proj",
    }
    assert client.get(full["url"]).json()["adapter"] is None
    listed = client.get("/v1/tables", params={"model": "tiny-llama"}).json()["data"]  # newest first
    assert [t["adapter"] and t["adapter"]["label"] for t in listed] == [
        "LoRA r=16 alpha=32 dropout 0.05 on PEFT's default modules",
        "QLoRA (nf4, double quant, TRL's SFTTrainer recipe) r=16 alpha=32 dropout 0.05 on PEFT's default "
        "modules",
        "LoRA r=8 alpha=32 dropout 0.05 on PEFT's default modules",
        "LoRA r=16 alpha=32 dropout 0.05 on q_proj,v_proj", None]
    queue = client.app.state.queue
    run = queue.store.get_run(lora.json()["id"])
    assert Adapter.from_json(run.spec["adapter"]) == Adapter("lora", targets=("q_proj", "v_proj"))
    # PEFT builds the adapter: its version is part of the run's environment (and key), and a
    # queued run resumes on the same environment after a restart.
    assert run.spec["environment"]["peft"] == table["environment"]["peft"] == version("peft")
    assert "peft" not in queue.store.get_run(full["id"]).spec["environment"]
    assert queue._environment_change(run) is None


def test_a_run_stored_before_adapters_reads_as_a_full_fine_tune_and_still_dedupes(client):
    spec = spec_of(client, LLAMA)
    old = {k: v for k, v in spec.to_json().items()  # then
           if k not in ("adapter", "ckpt_reentrant", "liger", "alloc_conf", "parallel", "trainer")}
    old_key = hashlib.sha256(json.dumps(old, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    store = client.app.state.queue.store
    run, _ = store.create_run(key=old_key, spec=old, model=spec.model, gpu=spec.gpu["name"],
                              backend=spec.backend, total=1)
    assert TableSpec.from_json(store.get_run(run.id).spec).peft() is None
    table = client.get(f"/v1/tables/{run.id}")
    assert table.status_code == 200 and table.json()["adapter"] is None
    assert "full fine-tune" in text(client.get(f"/runs/{run.id}"))
    # The same full fine-tune asked for now meets it; a LoRA one does not.
    assert client.post("/v1/tables", json=LLAMA).json() == {
        "id": run.id, "status": "queued", "url": f"http://localhost/v1/tables/{run.id}", "created": False}
    assert client.post("/v1/tables", json=LLAMA | LORA).json()["id"] != run.id


@pytest.mark.parametrize(("changes", "field", "detail"), [
    ({"peft": "x"}, "peft", "unknown peft 'x': allowed are none, lora, qlora"),
    (LORA | {"lora_r": 0}, "lora_r", "LoRA rank must be an integer from 1 to 4096, got 0"),
    (LORA | {"lora_r": 2**70}, "lora_r", f"LoRA rank must be an integer from 1 to 4096, got {2**70}"),
    (LORA | {"lora_dropout": 1}, "lora_dropout", "LoRA dropout must be a number from 0 up to (not "
                                                 "including) 1, got 1"),
    (LORA | {"lora_targets": "all-linear,q_proj"}, "lora_targets",
     "all-linear stands alone in LoRA targets, got all-linear,q_proj"),
    ({"load_in_4bit": True}, "load_in_4bit", "load_in_4bit trains adapters only"),
    ({"load_in_8bit": True}, "load_in_8bit", "load_in_8bit trains adapters only"),
    (LORA | {"load_in_8bit": True, "load_in_4bit": True}, "load_in_8bit", "load_in_8bit and load_in_4bit ask "
                                                                         "for two bases"),
    ({"lora_r": 8}, "lora_r", "lora_r needs peft lora or peft qlora"),
    (LORA | {"bnb_4bit_quant_type": "fp4"}, "bnb_4bit_quant_type", "bnb_4bit_quant_type set a 4-bit base"),
    ({"peft": "qlora", "bnb_4bit_compute_dtype": "int8"}, "bnb_4bit_compute_dtype",
     "4-bit compute dtype must be one of bfloat16, float16, float32, got 'int8'"),
    ({"peft": "qlora", "qlora_recipe": "unsloth"}, "qlora_recipe",
     "unknown QLoRA recipe 'unsloth': allowed are trl, axolotl, peft"),
    (LORA | {"qlora_recipe": "peft"}, "qlora_recipe", "qlora_recipe prepares a 4- or 8-bit base"),
])
def test_a_table_request_with_bad_peft_settings_is_422_naming_the_field(client, changes, field, detail):
    response = client.post("/v1/tables", json=LLAMA | changes)
    assert response.status_code == 422, response.text
    body = response.json()
    assert body["field"] == field and body["detail"].startswith(detail)
    assert body["errors"][0] == {"field": field, "detail": body["detail"]}
    assert "--" not in body["detail"]  # the fields of the body, never the CLI's flags


def test_the_cli_says_the_same_error_with_its_flags(capsys):
    from autotune.cli import main

    assert main(["check", "tiny-llama", "--seq-len", "64", "--batch-size", "1", "--lora-r", "8"]) == 2
    assert capsys.readouterr().err == "Error: --lora-r needs --peft lora or --peft qlora\n"


def test_check_and_explain_errors_name_their_query_parameters_never_flags(client):
    for route in ("/v1/check", "/v1/explain"):
        response = client.get(route, params={"model": "tiny-llama", "seq_len": 64, "batch_size": 1,
                                             "lora_r": 8, "bnb_4bit_quant_type": "fp4"})
        body = response.json()
        assert response.status_code == 422 and body["field"] == "lora_r", body
        assert body["detail"] == "lora_r, bnb_4bit_quant_type need peft lora or peft qlora"


def test_a_non_finite_alpha_in_a_json_body_is_refused(client):
    # Python's JSON reader takes Infinity and NaN; a run must never store them (its JSON could not be read).
    response = client.post("/v1/tables", content=json.dumps(LLAMA | LORA | {"lora_alpha": float("inf")}),
                           headers={"Content-Type": "application/json"})
    assert response.status_code == 422 and response.json()["field"] == "lora_alpha"


def test_every_invalid_peft_field_is_reported_with_the_others(client):
    response = client.post("/v1/tables", json=LLAMA | {"task": "translation", "peft": "lora", "lora_r": 0,
                                                      "lora_alpha": -1})
    assert [e["field"] for e in response.json()["errors"]] == ["task", "lora_r", "lora_alpha"]


# --- the run's adapter as its worker reports it, and GET /v1/check --------------------------------


def test_a_stored_lora_table_answers_a_lora_check_only(client):
    lora = spec_of(client, LLAMA | LORA)
    header = _reported_header(lora)
    assert header["adapter"]["parameters"] == {"trainable": 3584, "total": 30368}
    assert header["adapter"]["label"] == LORA_LABEL
    run_id = _store_done_run(client, lora, header)
    table = client.get(f"/v1/tables/{run_id}").json()
    assert table["adapter"] == header["adapter"]
    assert table["adapter"]["targets"] == ["q_proj", "v_proj"] and table["adapter"]["targets_default"] is True

    doc = client.get("/v1/check", params=CELL | LORA).json()
    assert doc["table_id"] == run_id and doc["max_batch_size"] == 6 and doc["fits"] is True
    assert doc["adapter"] == header["adapter"]
    assert doc["message"].startswith(f"fits: tiny-llama seq 32 fp32 (causal-lm, fp32 weights, "
                                     f"adamw_torch_fused, attention sdpa, {LORA_LABEL}) on 1 GiB")

    # Which stored runs cover which request: the adapter must be the same.
    full, qlora = spec_of(client, LLAMA), spec_of(client, LLAMA | {"peft": "qlora"})
    assert _covers(lora.to_json(), lora, 32)
    assert not _covers(lora.to_json(), full, 32) and not _covers(lora.to_json(), qlora, 32)
    assert not _covers(full.to_json(), lora, 32)
    old = {k: v for k, v in full.to_json().items() if k != "adapter"}  # stored before adapters
    assert _covers(old, full, 32) and not _covers(old, lora, 32)

    # QLoRA: not from the LoRA table; estimated, with the adapter PEFT built over the 4-bit base.
    doc = client.get("/v1/check", params=CELL | {"peft": "qlora", "bnb_4bit_use_double_quant": "false",
                                                 "qlora_recipe": "axolotl"})
    assert doc.status_code == 200, doc.text
    doc = doc.json()
    assert doc["table_id"] is None and doc["source"] == "estimated"
    assert doc["adapter"]["method"] == "qlora" and doc["adapter"]["double_quant"] is False
    assert doc["adapter"]["parameters"]["trainable"] == 3584
    assert doc["adapter"]["recipe"] == "axolotl"
    assert doc["adapter"]["label"].startswith("QLoRA (nf4, Axolotl recipe) r=16 alpha=32 dropout 0.05 on "
                                              "q_proj,v_proj: 3.58k")
    assert doc["adapter"]["label"] in doc["message"]


@pytest.mark.parametrize("path", ["/v1/check", "/v1/explain"])
@pytest.mark.parametrize(("changes", "field"), [
    ({"peft": "x"}, "peft"),
    ({"load_in_4bit": "true"}, "load_in_4bit"),
    ({"load_in_8bit": "true"}, "load_in_8bit"),
    ({"lora_targets": "q_proj"}, "lora_targets"),
    ({"peft": "qlora", "bnb_4bit_quant_type": "int4"}, "bnb_4bit_quant_type"),
])
def test_a_check_or_explain_with_bad_peft_settings_is_422_naming_the_field(client, path, changes, field):
    response = client.get(path, params=CELL | changes)
    assert response.status_code == 422, response.text
    assert response.json()["field"] == field


@pytest.mark.parametrize("path", ["/v1/check", "/v1/explain"])
@pytest.mark.parametrize(("changes", "loc"), [
    ({"peft": "lora", "lora_r": 0}, "lora_r"),
    ({"peft": "lora", "lora_r": 4097}, "lora_r"),
    ({"peft": "lora", "lora_alpha": 0}, "lora_alpha"),
    ({"peft": "lora", "lora_alpha": "inf"}, "lora_alpha"),
    ({"peft": "lora", "lora_dropout": 1}, "lora_dropout"),
])
def test_peft_numbers_out_of_bounds_are_422_naming_the_query_parameter(client, path, changes, loc):
    response = client.get(path, params=CELL | changes)
    assert response.status_code == 422
    [error] = response.json()["detail"]
    assert error["loc"] == ["query", loc]


def test_the_openapi_document_describes_the_peft_fields(client):
    document = client.get("/openapi.json").json()
    fields = ("peft", "lora_r", "lora_alpha", "lora_dropout", "lora_targets", "load_in_4bit", "load_in_8bit",
              "bnb_4bit_quant_type", "bnb_4bit_use_double_quant", "bnb_4bit_compute_dtype")
    body = document["components"]["schemas"]["TableCreate"]["properties"]
    assert all(body[name]["description"] for name in fields)
    for path in ("/v1/check", "/v1/explain"):
        params = {p["name"]: p for p in document["paths"][path]["get"]["parameters"]}
        assert all(params[name]["description"] for name in fields)
        assert "peft_config" not in params  # the server cannot read a client's file
    assert document["components"]["schemas"]["TablePublic"]["properties"]["adapter"]["description"]


# --- the dashboard ------------------------------------------------------------------------------


def test_the_dashboard_says_each_runs_adapter(client):
    lora = spec_of(client, LLAMA | LORA)
    lora_id = _store_done_run(client, lora, _reported_header(lora))
    full_id = _store_done_run(client, spec_of(client, LLAMA), {"attn": "sdpa"})
    queued = client.post("/v1/tables", json=LLAMA | {"peft": "qlora", "lora_r": 8}).json()["id"]

    assert f"PEFT {LORA_LABEL}" in text(client.get(f"/runs/{lora_id}"))
    assert "PEFT full fine-tune" in text(client.get(f"/runs/{full_id}"))
    # Queued: what was asked for, until the worker says what PEFT built.
    assert ("PEFT QLoRA (nf4, double quant, TRL's SFTTrainer recipe) r=8 alpha=32 dropout 0.05 on PEFT's "
            "default modules") in text(
        client.get(f"/runs/{queued}"))
    home = text(client.get("/"))
    assert "LoRA r=16, 11.80% trainable" in home and "QLoRA r=8" in home

    compare = client.get("/compare", params=[("id", lora_id), ("id", full_id)])
    columns = re.findall(r'<span class="sub adapter" title="([^"]*)">([^<]*)</span>', compare.text)
    assert [(unescape(title), short) for title, short in columns] == [
        (LORA_LABEL, "LoRA r=16, 11.80% trainable"), ("full fine-tune", "full fine-tune")]


def test_the_launch_form_asks_for_the_peft_settings(client):
    page = client.get("/new").text
    assert re.search(r'<select id="peft" name="peft"[^>]*>\s*<option value="none" selected>full fine-tune',
                     page)
    for value in ("lora", "qlora"):
        assert f'<option value="{value}"' in page
    for name in ("lora_r", "lora_alpha", "lora_dropout", "lora_targets"):
        assert f'id="{name}" name="{name}"' in page and f'id="{name}-error"' in page
    assert 'placeholder="PEFT default, or all-linear"' in page
