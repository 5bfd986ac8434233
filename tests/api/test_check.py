"""GET /v1/check: from a stored measured table when one covers the cell, else estimated; and
`autotune check --server` against a real server."""

from __future__ import annotations

import json
import shutil
from dataclasses import fields
from pathlib import Path

import pytest
from liveserver import Server

from api.runs.spec import normalize
from api.schemas import CheckLeverPublic, CheckPublic
from autotune.analysis.check import CheckResult
from autotune.cli import main

QUERY = {"model": "tiny-bert", "seq_len": 64, "batch_size": 8, "gpu_memory": "1GiB"}


@pytest.fixture
def client(idle_client):
    return idle_client


def _store_measured_table(client, max_batch: int) -> str:
    """A finished cuda-backend run covering tiny-bert seq 64 fp32 on 1 GiB, as a GPU host stores it."""
    queue = client.app.state.queue
    body = {"model": "tiny-bert", "seq_lens": [64], "modes": ["fp32", "amp+ckpt"], "gpu_memory": "1GiB",
            "backend": "estimate"}
    spec = normalize(body, client.app.state.settings, queue.runner.environment)
    spec = type(spec).from_json({**spec.to_json(), "backend": "cuda",
                                 "environment": {**spec.environment, "backend": "cuda"}})
    run, _ = queue.store.create_run(key=spec.key(), spec=spec.to_json(), model=spec.model,
                                   gpu=spec.gpu["name"], backend="cuda", total=2)
    queue.store.mark_running(run.id, lane="cuda:0", worker_pid=None)
    probes = [{"batch_size": b, "outcome": "fits" if b <= max_batch else "oom",
               "peak_bytes": 1000 * b, "peak_reserved_bytes": 1000 * b}
              for b in (4, max_batch, max_batch + 1)]
    for position, (mode, best) in enumerate((("fp32", max_batch), ("amp+ckpt", 3 * max_batch))):
        queue.store.add_cell(run.id, position, {
            "seq_len": 64, "mode": mode, "max_batch_size": best, "peak_memory_bytes": 1000 * best,
            "peak_allocated_bytes": 900 * best, "probes": 3, "capped": False, "backend": "cuda",
            "step_time_s": 0.01, "error": None, "probe_log": probes})
    queue.store.finish_run(run.id, "done")
    return run.id


def test_a_stored_measured_table_answers(client):
    table_id = _store_measured_table(client, max_batch=6)
    doc = client.get("/v1/check", params=QUERY).json()
    assert doc["source"] == "measured" and doc["table_id"] == table_id
    assert doc["fits"] is False and doc["max_batch_size"] == 6
    assert doc["suggestion"] == ("use batch 4 x 2 accumulation steps for an effective 8, "
                                 "or mode amp+ckpt (max 18)")
    assert doc["peak_memory_bytes"] == 8000  # on the line through the probes at 4 and 6
    fitting = client.get("/v1/check", params=QUERY | {"batch_size": 4}).json()
    assert fitting["fits"] is True and fitting["peak_memory_bytes"] == 4000


def test_without_a_stored_table_the_estimator_answers(client):
    doc = client.get("/v1/check", params=QUERY).json()
    assert doc["source"] == "estimated" and doc["backend"] == "estimate" and doc["table_id"] is None
    assert doc["fits"] is True and doc["max_batch_size"] > 8
    for key in ("peak_memory_bytes", "budget_bytes", "suggestion", "message"):
        assert key in doc


def test_the_answer_is_what_the_openapi_document_describes(client):
    # CheckPublic: autotune.analysis.check.CheckResult's keys, in order, then which table answered.
    assert list(CheckPublic.model_fields) == [f.name for f in fields(CheckResult)] + [
        "table_id", "measured_on", "imported_from"]
    _store_measured_table(client, max_batch=6)
    for query in (QUERY, QUERY | {"seq_len": 32}):  # from the stored table; estimated now
        doc = client.get("/v1/check", params=query).json()
        assert list(doc) == list(CheckPublic.model_fields)
        assert all(list(lever) == list(CheckLeverPublic.model_fields) for lever in doc["levers"])
    assert doc["source"] == "estimated" and client.get("/v1/check", params=QUERY).json()["levers"]
    document = client.get("/openapi.json").json()
    response = document["paths"]["/v1/check"]["get"]["responses"]["200"]["content"]["application/json"]
    assert response["schema"] == {"$ref": "#/components/schemas/CheckPublic"}


@pytest.mark.parametrize(("changes", "status", "text"), [
    ({"model": "no-such-model"}, 404, "unknown model 'no-such-model'"),
    ({"seq_len": 1024}, 422, "sequence length 1024 exceeds max_position_embeddings=128 of tiny-bert"),
    ({"gpu_memory": "12 gigs"}, 422, "invalid memory size '12 gigs'"),
    ({"mode": "fp8"}, 422, "unknown mode 'fp8'"),
])
def test_bad_input(client, changes, status, text):
    response = client.get("/v1/check", params=QUERY | changes)
    assert response.status_code == status and text in response.json()["detail"]


# -- measured reference tables (api/measurements.py) -------------------------------------------------

H100 = Path(__file__).resolve().parent.parent.parent / "docs" / "measurements" / "h100-80gb"
BERT_16 = {"model": "bert-base-uncased", "seq_len": 128, "batch_size": 64, "mode": "fp32"}


def _import(client, name: str) -> str:
    from api.measurements import import_measurements

    (imported,) = import_measurements(client.app.state.queue.store, [H100 / name], client.app.state.settings)
    return imported.run.id


def _store_estimate(client, body, best: int) -> str:
    """A finished estimate run of ``body`` whose every cell has max batch ``best``."""
    queue = client.app.state.queue
    spec = normalize({**body, "backend": "estimate"}, client.app.state.settings, queue.runner.environment)
    run, _ = queue.store.create_run(key=spec.key(), spec=spec.to_json(), model=spec.model,
                                   gpu=spec.gpu["name"], backend="estimate", total=spec.cells)
    queue.store.mark_running(run.id, lane="estimate:0", worker_pid=None)
    for position, (mode, seq_len) in enumerate((m, s) for m in spec.modes for s in spec.seq_lens):
        queue.store.add_cell(run.id, position, {
            "seq_len": seq_len, "mode": mode, "max_batch_size": best, "peak_memory_bytes": 1000 * best,
            "peak_allocated_bytes": 900 * best, "probes": 1, "capped": False, "backend": "estimate",
            "step_time_s": None, "error": None,
            "probe_log": [{"batch_size": best, "outcome": "fits", "peak_bytes": 1000 * best}]})
    queue.store.finish_run(run.id, "done")
    return run.id


def test_an_imported_measured_table_answers_before_an_estimate_and_says_where_it_was_measured(client):
    table_id = _import(client, "bert-base-uncased-16GiB.json")
    _store_estimate(client, {"model": "bert-base-uncased", "seq_lens": [128], "modes": ["fp32"],
                             "gpu_memory": "16GiB"}, best=999)  # newer, and covers the same cell
    doc = client.get("/v1/check", params=BERT_16 | {"gpu_memory": "16GiB"}).json()
    assert (doc["source"], doc["backend"], doc["table_id"]) == ("measured", "cuda", table_id)
    assert doc["fits"] is True and doc["max_batch_size"] == 170  # the H100's cell, not the estimate's 999
    assert doc["measured_on"] == "NVIDIA H100 80GB HBM3"
    assert doc["imported_from"].endswith("docs/measurements/h100-80gb/bert-base-uncased-16GiB.json")
    assert doc["message"].splitlines()[-1] == (f"note: from table {table_id}, measured on NVIDIA H100 80GB "
                                               f"HBM3 (imported from {doc['imported_from']})")


def test_an_imported_table_answers_only_the_card_it_was_measured_for(client):
    """16 GiB measured on an H100 is "custom 16 GiB": no answer for a T4 (15 GiB, another name)."""
    _import(client, "bert-base-uncased-16GiB.json")
    t4 = _store_estimate(client, {"model": "bert-base-uncased", "seq_lens": [128], "modes": ["fp32"],
                                  "gpu": "T4"}, best=50)
    doc = client.get("/v1/check", params=BERT_16 | {"gpu": "T4"}).json()
    assert (doc["source"], doc["table_id"], doc["max_batch_size"]) == ("estimated", t4, 50)
    assert doc["measured_on"] is None and doc["imported_from"] is None
    assert "note: from table" not in doc["message"]


def test_a_cell_the_measurement_did_not_reach_is_not_answered_from_it(client):
    table_id = _import(client, "bert-base-uncased-16GiB.json")  # ckpt:128 is in its cells_missing
    estimate = _store_estimate(client, {"model": "bert-base-uncased", "seq_lens": [128], "modes": ["ckpt"],
                                        "gpu_memory": "16GiB"}, best=300)
    doc = client.get("/v1/check", params=BERT_16 | {"gpu_memory": "16GiB", "mode": "ckpt"}).json()
    assert doc["table_id"] == estimate != table_id and doc["source"] == "estimated"


@pytest.fixture(scope="module")
def real_server(tmp_path_factory):
    """One ``autotune serve`` process for the CLI's checks against a server (a start is seconds of CPU),
    importing the H100's measured bert-base table at its start as AUTOTUNE_MEASUREMENTS says; and the
    folder it imported."""
    folder = tmp_path_factory.mktemp("served") / "h100-80gb"
    folder.mkdir()
    shutil.copy(H100 / "bert-base-uncased-16GiB.json", folder)
    server = Server(folder.parent / "server.db", folder.parent / "server.log",
                    AUTOTUNE_MEASUREMENTS=str(folder))
    yield server, folder
    server.stop()


def test_cli_check_against_a_real_server(real_server, capsys):
    server, _ = real_server
    code = main(["check", "tiny-bert", "--seq-len", "64", "--batch-size", "8", "--gpu-memory", "1GiB",
                 "--server", server.url, "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0 and doc["fits"] is True and doc["source"] == "estimated"
    # a multi-GPU job's settings reach the server, which answers for one of its GPUs
    code = main(["check", "tiny-llama", "--seq-len", "64", "--batch-size", "2", "--gpu-memory", "4GiB",
                 "--gpus", "4", "--parallel", "fsdp", "--no-reshard-after-forward", "--ckpt-reentrant",
                 "--server", server.url, "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0 and (doc["parallel"]["gpus"], doc["parallel"]["reshard_after_forward"]) == (4, False)
    assert doc["ckpt_reentrant"] is True
    code = main(["check", "tiny-bert", "--seq-len", "1024", "--batch-size", "8", "--server", server.url])
    assert code == 2
    assert "answered 422: sequence length 1024 exceeds" in capsys.readouterr().err


def test_cli_check_against_a_server_that_imported_measurements_at_start(real_server, capsys):
    server, folder = real_server
    code = main(["check", "bert-base-uncased", "--seq-len", "128", "--batch-size", "200", "--gpu-memory",
                 "16GiB", "--server", server.url])
    out = capsys.readouterr().out
    assert code == 1 and out.startswith("does not fit: bert-base-uncased seq 128 fp32")
    assert "max batch 170" in out
    assert ("measured on NVIDIA H100 80GB HBM3 (imported from "
            f"{folder / 'bert-base-uncased-16GiB.json'})") in out
    assert "imported " in (folder.parent / "server.log").read_text()  # serve says what it imported


def test_a_request_without_modes_takes_those_of_the_weights(client):
    # bfloat16 weights: bf16 and bf16+ckpt (defaults.default_mode_names); a check, the first of them
    query = {"model": "tiny-llama", "dtype": "bfloat16", "seq_len": 64, "batch_size": 2, "gpu_memory": "1GiB"}
    doc = client.get("/v1/check", params=query).json()
    assert doc == client.get("/v1/check", params=query | {"mode": "bf16"}).json()
    assert doc != client.get("/v1/check", params=query | {"mode": "fp32"}).json()
    created = client.post("/v1/tables", json={"model": "tiny-llama", "dtype": "bfloat16", "seq_lens": [64],
                                              "gpu_memory": "1GiB", "backend": "estimate"})
    assert created.status_code in (200, 202), created.text
    assert client.get(f"/v1/tables/{created.json()['id']}").json()["modes"] == ["bf16", "bf16+ckpt"]


def test_a_vision_language_model_is_refused_by_name_not_answered_for_images_unsaid(client):
    # Its step depends on the images of each sample, which a request to the service cannot give yet.
    for response in (client.post("/v1/tables", json={"model": "tiny-qwen2_vl", "gpu_memory": "1GiB"}),
                     client.get("/v1/check", params=QUERY | {"model": "tiny-qwen2_vl"})):
        assert response.status_code == 422, response.text
        assert "tiny-qwen2_vl is a vision-language model" in response.text
        assert "autotune check, table or explain (--images-per-sample, --image-size)" in response.text
