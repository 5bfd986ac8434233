"""Measured reference tables: a file of docs/measurements/ imported into the store as a finished cuda
run, once (again: unchanged; changed: replaced in place), other runs never touched, bad files refused
with the file and the reason; AUTOTUNE_MEASUREMENTS imports at the app's start."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from api.measurements import import_measurements, read_measurements
from api.runs.spec import TableSpec, normalize
from api.settings import Settings
from api.store import Store
from autotune.errors import InvalidInput

ROOT = Path(__file__).resolve().parent.parent.parent
H100 = ROOT / "docs" / "measurements" / "h100-80gb"
LLAMA_24 = "llama-3.2-1b-24GiB.json"  # 8 cells, all measured
LLAMA_CARD = "llama-3.2-1b-card.json"  # 5 cells, 3 the lease did not reach


@pytest.fixture
def store(tmp_path):
    store = Store(tmp_path / "runs.db")
    yield store
    store.close()


@pytest.fixture
def folder(tmp_path):
    """A copy of the H100 folder's Llama 24 GiB table, as tmp/h100-80gb/llama-3.2-1b-24GiB.json."""
    folder = tmp_path / "h100-80gb"
    folder.mkdir()
    shutil.copy(H100 / LLAMA_24, folder / LLAMA_24)
    return folder


def test_a_measured_table_becomes_a_finished_cuda_run(store):
    (imported,) = import_measurements(store, [H100 / LLAMA_24], Settings())
    run = store.get_run(imported.run.id)
    assert imported.outcome == "imported"
    assert (run.status, run.backend, run.model, run.gpu, run.done, run.total) == (
        "done", "cuda", "meta-llama/Llama-3.2-1B", "custom 24 GiB", 8, 8)
    spec = TableSpec.from_json(run.spec)
    assert (spec.budget_bytes, spec.margin, spec.weights_dtype, spec.attn, spec.adapter) == (
        23971286220, 0.05, "bfloat16", None, None)  # attention: what a request naming none runs (sdpa)
    assert run.header["attn"] == "sdpa"
    assert run.header["environment"]["device_name"] == "NVIDIA H100 80GB HBM3"
    assert run.imported["file"].endswith("docs/measurements/h100-80gb/llama-3.2-1b-24GiB.json")
    assert run.imported == {
        "source": "h100-80gb/llama-3.2-1b-24GiB.json", "file": run.imported["file"],
        "sha256": run.imported["sha256"], "measured_on": "NVIDIA H100 80GB HBM3", "driver": "580.159.04",
        "cuda_version": "13.0", "torch_version": "2.11.0+cu130", "transformers_version": "5.23.0",
        "measured_at": None, "cells_missing": [],
    }
    cells = store.cells(run.id)
    assert [(c["mode"], c["seq_len"]) for c in cells] == [
        (m, s) for m in ("bf16", "bf16+ckpt") for s in (512, 1024, 2048, 4096)]  # the tuner's order
    assert cells[0]["max_batch_size"] == 8 and cells[0]["seeded_by_estimate"] is True  # kept as measured


def test_the_spec_is_the_one_the_service_normalises_for_the_same_request(store):
    """What makes check match an import exactly as it matches a run of this service."""
    (imported,) = import_measurements(store, [H100 / LLAMA_24], Settings())
    asked = normalize({"model": "meta-llama/Llama-3.2-1B", "gpu_memory": "24GiB", "backend": "estimate",
                       "seq_lens": [512, 1024, 2048, 4096], "modes": ["bf16", "bf16+ckpt"]},
                      Settings(), lambda backend, gpu: {"backend": backend})
    stored = TableSpec.from_json(imported.run.spec)
    for field in ("model", "model_type", "model_config", "task", "attn", "optimizer", "weights_dtype", "loss",
                  "seq_lens", "modes", "margin", "budget_bytes", "adapter"):
        assert getattr(stored, field) == getattr(asked, field), field
    assert stored.gpu["name"] == asked.gpu["name"] == "custom 24 GiB"


def test_missing_cells_are_recorded_not_failed(store):
    (imported,) = import_measurements(store, [H100 / LLAMA_CARD], Settings())
    run = imported.run
    assert (run.gpu, run.done, run.total, run.status) == ("NVIDIA H100 80GB HBM3", 5, 8, "done")
    assert run.imported["cells_missing"] == ["bf16+ckpt:1024", "bf16+ckpt:2048", "bf16+ckpt:4096"]
    assert all(c["max_batch_size"] is not None for c in store.cells(run.id))


def test_importing_again_changes_nothing(store, folder):
    first = import_measurements(store, [folder], Settings())
    again = import_measurements(store, [folder / LLAMA_24], Settings())
    assert [i.outcome for i in first] == ["imported"] and [i.outcome for i in again] == ["unchanged"]
    assert again[0].run == first[0].run
    assert store.list_runs()[1] == 1


def test_a_changed_file_replaces_its_import_in_place_and_nothing_else(store, folder, tmp_path):
    other = tmp_path / "a100-80gb"  # the same name in another folder: another import
    other.mkdir()
    shutil.copy(folder / LLAMA_24, other / LLAMA_24)
    (first,) = import_measurements(store, [folder], Settings())
    (elsewhere,) = import_measurements(store, [other], Settings())
    service, _ = store.create_run(key="k", model="tiny-bert", gpu="T4", backend="cuda", spec={}, total=1)
    table = json.loads((folder / LLAMA_24).read_text())
    table["cells"][0]["max_batch_size"] = 9
    table["measured_at"] = "2026-11-23T06:03:05+00:00"
    (folder / LLAMA_24).write_text(json.dumps(table))

    (second,) = import_measurements(store, [folder], Settings())
    assert second.outcome == "replaced" and second.run.id == first.run.id  # links to the run stay
    assert second.run.imported["measured_at"] == "2026-11-23T06:03:05+00:00"
    assert store.cells(first.run.id)[0]["max_batch_size"] == 9 and second.run.done == 8
    assert store.cells(elsewhere.run.id)[0]["max_batch_size"] == 8
    assert store.get_run(service.id) == service
    assert store.list_runs()[1] == 3


def test_a_directory_is_its_json_files_not_its_subfolders(tmp_path, folder):
    (folder / "records").mkdir()
    (folder / "records" / "step.json").write_text("{}")  # an allocator record: not a table
    (folder / "notes.txt").write_text("not read")
    read = read_measurements([folder], Settings())
    assert [m.source for m in read] == ["h100-80gb/llama-3.2-1b-24GiB.json"]
    with pytest.raises(InvalidInput) as info:
        read_measurements([tmp_path], Settings())
    assert str(info.value) == (f"{tmp_path}: no *.json in this directory (its subfolders are not read: give "
                               "the folder of the tables, e.g. docs/measurements/h100-80gb)")


def _without(table, *names):
    return {k: v for k, v in table.items() if k not in names}


def _environment_without_driver(table):
    return {**table, "environment": _without(table["environment"], "driver")}


def _last_cell_dropped(table):
    return {**table, "cells": table["cells"][:-1]}


@pytest.mark.parametrize(("change", "reason"), [
    (lambda t: [t], "not a measured table: a table is a JSON object (autotune table --json), not a list"),
    (lambda t: _without(t, "environment", "cells"),
     "not a measured table (autotune table --backend cuda --json): it lacks environment, cells"),
    (lambda t: {**t, "backend": "estimate"}, "a table of backend 'estimate': only tables measured on a GPU "
     "(backend cuda) are imported as measured references"),
    (_environment_without_driver, "its environment lacks driver: a measured table says where it was "
     "measured (device_name, driver, cuda_version, torch_version, transformers_version)"),
    (lambda t: {**t, "budget_bytes": t["budget_bytes"] + 1}, "budget_bytes 23971286221 does not follow from "
     "gpu_memory_bytes, context_overhead_bytes and margin (they give 23971286220)"),
    (lambda t: {**t, "cells_missing": ["bf16:512"]},
     "cells_missing lists bf16:512, which the table has a cell for"),
    (_last_cell_dropped, "the cells bf16+ckpt:4096 are neither in cells nor in cells_missing"),
    (lambda t: {**t, "model": "/etc/model.json"}, "model '/etc/model.json' is a local path, and this server "
     "reads no local models (AUTOTUNE_MODEL_DIRS is empty): use a preset or a Hugging Face hub id"),
])
def test_a_bad_file_is_refused_naming_it_and_why(store, folder, change, reason):
    bad = folder / "bad.json"
    bad.write_text(json.dumps(change(json.loads((folder / LLAMA_24).read_text()))))
    with pytest.raises(InvalidInput) as info:
        import_measurements(store, [folder], Settings())
    assert str(info.value) == f"{bad}: {reason}"
    assert store.list_runs()[1] == 0  # the good file beside it was not imported either


def test_every_bad_file_is_named(store, folder):
    (folder / "a.json").write_text("not json")
    (folder / "b.json").write_text("{}")
    with pytest.raises(InvalidInput) as info:
        import_measurements(store, [folder], Settings())
    assert str(info.value).splitlines() == [
        "2 files are not measured tables, none imported:",
        f"- {folder / 'a.json'}: not JSON (Expecting value: line 1 column 1 (char 0))",
        f"- {folder / 'b.json'}: not a measured table (autotune table --backend cuda --json): it lacks "
        "model, task, backend, attn, optimizer, weights_dtype, loss, gpu_name, gpu_memory_bytes, "
        "context_overhead_bytes, budget_bytes, margin, search, max_batch, seq_lens, modes, environment, "
        "cells",
    ]


def test_the_app_imports_its_measurements_at_start(make_client, folder):
    client = make_client(measurements=(folder,))
    (table,) = client.get("/v1/tables").json()["data"]
    assert table["measured_on"] == "NVIDIA H100 80GB HBM3"
    assert table["imported"]["source"] == "h100-80gb/llama-3.2-1b-24GiB.json"
    assert table["imported"]["file"] == str(folder / LLAMA_24)


def test_a_bad_measurement_stops_the_start(make_client, folder):
    (folder / "bad.json").write_text("[]")
    with pytest.raises(InvalidInput, match="bad.json: not a measured table"):
        make_client(measurements=(folder,))
