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


def test_measurements_are_paths_to_import_at_start():
    assert Settings.from_env({}).measurements == ()
    value = os.pathsep.join(["docs/measurements/h100-80gb", "~/tables/a.json"])
    assert Settings.from_env({"AUTOTUNE_MEASUREMENTS": value}).measurements == (
        Path("docs/measurements/h100-80gb"), Path("~/tables/a.json").expanduser())


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


def test_the_service_settings_are_the_librarys_and_read_its_variables():
    from autotune.settings import Settings as LibrarySettings

    settings = Settings.from_env({"AUTOTUNE_CONTEXT_OVERHEAD": "600MiB", "AUTOTUNE_OFFLINE": "1",
                                  "AUTOTUNE_SERVER": " http://gpu-box:8000 "})
    assert isinstance(settings, LibrarySettings)
    assert (settings.context_overhead, settings.offline, settings.server) == (
        600 * 1024**2, True, "http://gpu-box:8000")


def test_the_library_settings_ignore_the_services_variables():
    from autotune.settings import Settings as LibrarySettings

    settings = LibrarySettings.from_env({"AUTOTUNE_MAX_CELLS": "many", "AUTOTUNE_API_TOKEN": "tok"})
    assert settings.api_token == "tok" and not hasattr(settings, "max_cells")


def test_model_dirs_are_separated_by_pathsep_not_json():
    text = os.pathsep.join(["~/models", "", " ", "/m2"])
    settings = Settings.from_env({"AUTOTUNE_MODEL_DIRS": text})
    assert settings.model_dirs == (Path("~/models").expanduser(), Path("/m2"))
    assert Settings.from_env({"AUTOTUNE_MODEL_DIRS": ""}).model_dirs == ()


def test_empty_variables_mean_their_defaults_or_off():
    settings = Settings.from_env({"AUTOTUNE_DB": " ", "AUTOTUNE_ALLOW_HUB": "", "AUTOTUNE_SERVER": "",
                                  "AUTOTUNE_CONTEXT_OVERHEAD": ""})
    assert settings.db == Path("autotune.db") and not settings.allow_hub
    assert settings.server is None and settings.context_overhead is None


def test_from_env_reads_os_environ_by_default(monkeypatch):
    monkeypatch.setenv("AUTOTUNE_MAX_CELLS", "7")
    assert Settings.from_env().max_cells == 7


def test_the_constructor_reads_no_environment(monkeypatch):
    monkeypatch.setenv("AUTOTUNE_API_TOKEN", "from-env")
    monkeypatch.setenv("AUTOTUNE_MAX_CELLS", "many")  # malformed: never read
    settings = Settings(db=Path("x.db"), max_cells=5)
    assert (settings.db, settings.max_cells, settings.api_token) == (Path("x.db"), 5, None)


def test_settings_are_frozen_and_copied_with_changes():
    settings = Settings(db=Path("a.db"), api_token="tok")
    with pytest.raises(ValueError):  # pydantic's ValidationError
        settings.db = Path("b.db")
    moved = settings.model_copy(update={"db": Path("b.db")})
    assert (moved.db, moved.api_token, settings.db) == (Path("b.db"), "tok", Path("a.db"))


def test_a_misspelt_or_impossible_argument_is_refused():
    with pytest.raises(ValueError):
        Settings(max_cell=4)
    with pytest.raises(ValueError):
        Settings(max_cells=0)


def test_a_bad_context_overhead_names_the_variable():
    with pytest.raises(InvalidInput, match="^AUTOTUNE_CONTEXT_OVERHEAD: invalid memory size 'lots'"):
        Settings.from_env({"AUTOTUNE_CONTEXT_OVERHEAD": "lots"})


def test_the_connection_limits_and_the_trusted_proxies():
    defaults = Settings.from_env({})
    assert (defaults.header_timeout_s, defaults.max_connections, defaults.max_connections_per_client,
            defaults.trusted_proxies) == (10.0, 1000, 100, ())
    settings = Settings.from_env({
        "AUTOTUNE_HEADER_TIMEOUT_S": "2.5", "AUTOTUNE_MAX_CONNECTIONS": "50",
        "AUTOTUNE_MAX_CONNECTIONS_PER_CLIENT": "5",
        "AUTOTUNE_TRUSTED_PROXIES": " 10.0.0.5, 10.1.0.0/16,[::1], 10.0.0.5 ,"})
    assert (settings.header_timeout_s, settings.max_connections, settings.max_connections_per_client) == (
        2.5, 50, 5)
    assert settings.trusted_proxies == ("10.0.0.5", "10.1.0.0/16", "::1")
    assert Settings.from_env({"AUTOTUNE_TRUSTED_PROXIES": ""}).trusted_proxies == ()


@pytest.mark.parametrize(("name", "value", "message"), [
    ("AUTOTUNE_TRUSTED_PROXIES", "proxy.internal",
     "AUTOTUNE_TRUSTED_PROXIES='proxy.internal': 'proxy.internal' is not an IP address or network: give "
     "the addresses of the reverse proxies in front of this server, comma-separated (e.g. "
     "'127.0.0.1,10.0.0.0/24')"),
    ("AUTOTUNE_MAX_CONNECTIONS", "0", "AUTOTUNE_MAX_CONNECTIONS='0': use a positive integer"),
])
def test_malformed_connection_settings_are_named(name, value, message):
    with pytest.raises(InvalidInput) as info:
        Settings.from_env({name: value})
    assert str(info.value) == message
