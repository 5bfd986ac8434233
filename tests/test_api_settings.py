"""The service's settings from AUTOTUNE_* variables, and the errors for malformed ones."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from api.settings import Settings
from autotune.errors import InvalidInput


def test_defaults_bind_nothing_open_and_read_no_local_models():
    settings = Settings.from_env({})
    assert settings.db == Path("autotune.db") and settings.api_token is None
    assert settings.model_dirs == () and settings.allow_hub and settings.backend == "auto"
    assert settings.estimate_workers >= 1
    assert (settings.max_cells, settings.max_batch, settings.max_seq_len, settings.max_body_bytes) == (
        64, 4096, 8192, 16384)


def test_every_setting_reads_its_variable():
    settings = Settings.from_env({
        "AUTOTUNE_DB": "/data/a.db", "AUTOTUNE_API_TOKEN": "tok",
        "AUTOTUNE_MODEL_DIRS": os.pathsep.join(["/m1", "/m2"]),
        "AUTOTUNE_ALLOW_HUB": "no", "AUTOTUNE_BACKEND": "estimate", "AUTOTUNE_ESTIMATE_WORKERS": "3",
        "AUTOTUNE_MAX_CELLS": "10", "AUTOTUNE_MAX_BATCH": "512", "AUTOTUNE_MAX_SEQ_LEN": "1024",
        "AUTOTUNE_MAX_BODY_BYTES": "2048", "AUTOTUNE_UNRELATED": "ignored",
    })
    assert settings == Settings(db=Path("/data/a.db"), api_token="tok", model_dirs=(Path("/m1"), Path("/m2")),
                                allow_hub=False, backend="estimate", estimate_workers=3, max_cells=10,
                                max_batch=512, max_seq_len=1024, max_body_bytes=2048)


def test_an_empty_token_is_no_token():
    assert Settings.from_env({"AUTOTUNE_API_TOKEN": "  "}).api_token is None


@pytest.mark.parametrize(("name", "value", "message"), [
    ("AUTOTUNE_MAX_CELLS", "many", "AUTOTUNE_MAX_CELLS='many': use a positive integer"),
    ("AUTOTUNE_ESTIMATE_WORKERS", "0", "AUTOTUNE_ESTIMATE_WORKERS='0': use a positive integer"),
    ("AUTOTUNE_ALLOW_HUB", "maybe", "AUTOTUNE_ALLOW_HUB='maybe': use 1 or 0 (true/false, yes/no, on/off)"),
    ("AUTOTUNE_BACKEND", "tpu", "AUTOTUNE_BACKEND='tpu': use one of auto, cuda, estimate"),
])
def test_malformed_variables_are_named(name, value, message):
    with pytest.raises(InvalidInput) as info:
        Settings.from_env({name: value})
    assert str(info.value) == message
