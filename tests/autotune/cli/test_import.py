"""``autotune import``: measured tables into the service's database, what became of each file, and the
exact errors users see (exit 2, nothing imported)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from api.store import Store
from autotune.cli import main

H100 = Path(__file__).resolve().parents[3] / "docs" / "measurements" / "h100-80gb"
LLAMA_24 = "llama-3.2-1b-24GiB.json"


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def folder(tmp_path):
    folder = tmp_path / "h100-80gb"
    folder.mkdir()
    shutil.copy(H100 / LLAMA_24, folder)
    return folder


def _runs(db: Path):
    store = Store(db)
    try:
        return store.list_runs()
    finally:
        store.close()


def test_import_a_directory_then_again(capsys, tmp_path, folder):
    db = tmp_path / "service.db"
    code, out, _ = run(capsys, "import", str(folder), "--db", str(db))
    (runs,), count = _runs(db)
    assert code == 0 and count == 1
    assert out == (f"imported {folder / LLAMA_24} as run {runs.id}: meta-llama/Llama-3.2-1B on custom 24 "
                   "GiB, measured on NVIDIA H100 80GB HBM3, 8 of 8 cells\n")
    code, out, _ = run(capsys, "import", str(folder / LLAMA_24), "--db", str(db), "--json")
    assert code == 0 and _runs(db)[1] == 1
    assert json.loads(out) == [{
        "file": str(folder / LLAMA_24), "source": "h100-80gb/llama-3.2-1b-24GiB.json", "outcome": "unchanged",
        "run_id": runs.id, "model": "meta-llama/Llama-3.2-1B", "gpu": "custom 24 GiB",
        "measured_on": "NVIDIA H100 80GB HBM3", "cells": 8, "total": 8,
    }]


def test_import_reads_the_database_of_the_service(capsys, monkeypatch, tmp_path, folder):
    monkeypatch.setenv("AUTOTUNE_DB", str(tmp_path / "from-env.db"))
    assert run(capsys, "import", str(folder))[0] == 0
    assert _runs(tmp_path / "from-env.db")[1] == 1


def test_a_table_of_another_backend_is_refused(capsys, tmp_path, folder):
    table = json.loads((folder / LLAMA_24).read_text())
    (folder / "estimated.json").write_text(json.dumps({**table, "backend": "estimate"}))
    code, out, err = run(capsys, "import", str(folder), "--db", str(tmp_path / "service.db"))
    assert (code, out) == (2, "")
    assert err == (f"Error: {folder / 'estimated.json'}: a table of backend 'estimate': only tables measured "
                   "on a GPU (backend cuda) are imported as measured references\n")
    assert _runs(tmp_path / "service.db")[1] == 0


def test_a_path_that_is_not_there_is_named(capsys, tmp_path):
    code, _, err = run(capsys, "import", str(tmp_path / "nope.json"), "--db", str(tmp_path / "service.db"))
    assert code == 2 and err == f"Error: {tmp_path / 'nope.json'}: no such file or directory\n"
