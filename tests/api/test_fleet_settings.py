"""The fleet's configuration without a cluster: AUTOTUNE_RAY_ADDRESS, `autotune serve --ray`, and the
install hint when Ray is missing."""

from __future__ import annotations

import argparse
import importlib.util

import pytest

from api.settings import Settings
from autotune.cli import serve
from autotune.errors import AutotuneError, InvalidInput


@pytest.mark.parametrize("text, address", [
    ("auto", "auto"), (" 127.0.0.1:6379 ", "127.0.0.1:6379"), ("ray://head:10001", "ray://head:10001"),
    ("", None), ("ray-head.fleet.svc:6379", "ray-head.fleet.svc:6379"),
])
def test_the_ray_address_is_auto_host_port_or_a_ray_client_address(text, address):
    assert Settings.from_env({"AUTOTUNE_RAY_ADDRESS": text}).ray_address == address


def test_no_ray_address_is_the_local_runner():
    assert Settings.from_env({}).ray_address is None
    assert Settings().ray_address is None


@pytest.mark.parametrize("text", ["head", "head:", "head:0", "head:70000", "ray://:10001", "head:63 79"])
def test_a_malformed_ray_address_names_the_variable_and_the_allowed_forms(text):
    with pytest.raises(InvalidInput) as raised:
        Settings.from_env({"AUTOTUNE_RAY_ADDRESS": text})
    assert str(raised.value).startswith("AUTOTUNE_RAY_ADDRESS=")
    allowed = "use auto, HOST:PORT (the head's GCS port, 6379 by default) or ray://HOST:PORT"
    assert allowed in str(raised.value)


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="autotune")
    serve.add_parser(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(["serve", *argv])


def test_serve_ray_is_checked_as_the_variable_is(tmp_path):
    with pytest.raises(InvalidInput, match=r"^--ray: 'nowhere' is not a Ray address: use auto, HOST:PORT"):
        serve.run(parse("--ray", "nowhere", "--db", str(tmp_path / "x.db")))
    assert not (tmp_path / "x.db").exists()  # refused before anything opened


def test_without_ray_the_fleet_options_say_how_to_install_it(monkeypatch, tmp_path):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "ray" else real(name, *a))
    with pytest.raises(AutotuneError) as raised:
        serve.run(parse("--ray", "auto", "--db", str(tmp_path / "x.db")))
    assert str(raised.value) == ("a fleet (--ray, AUTOTUNE_RAY_ADDRESS) runs on Ray, which is not installed: "
                                 "pip install 'autotune-batch[fleet]' (or -e \".[fleet]\" from a checkout)")
    monkeypatch.setenv("AUTOTUNE_RAY_ADDRESS", "127.0.0.1:6379")
    with pytest.raises(AutotuneError, match=r"pip install 'autotune-batch\[fleet\]'"):
        serve.run(parse("--db", str(tmp_path / "x.db")))


def test_the_cluster_says_how_to_install_ray_when_it_is_missing(monkeypatch):
    import builtins

    from api.fleet.cluster import import_ray
    from autotune.errors import BackendUnavailable

    real_import = builtins.__import__

    def no_ray(name, *args, **kwargs):
        if name == "ray":
            raise ImportError("No module named 'ray'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_ray)
    with pytest.raises(BackendUnavailable, match=r"^a fleet runs on Ray, which is not installed: "
                                                 r"pip install 'autotune-batch\[fleet\]'$"):
        import_ray()
