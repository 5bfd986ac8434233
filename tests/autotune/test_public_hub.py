"""The Python API offline by default: a hub lookup only with hub=True or AUTOTUNE_ALLOW_HUB=1."""

from __future__ import annotations

import pytest

import autotune
from autotune.errors import InvalidInput, UnknownModel
from autotune.public import HUB_HINT

NAME = "someone/bert-huge"
CALLS = {
    "table": lambda **kw: autotune.table(NAME, seq_lens=[32], modes="fp32", **kw),
    "check": lambda **kw: autotune.check(NAME, seq_len=32, batch_size=8, **kw),
    "explain": lambda **kw: autotune.explain(NAME, seq_len=32, batch_size=8, levers=False, **kw),
    "max_batch_size": lambda **kw: autotune.max_batch_size(NAME, seq_len=32, **kw),
}


# hub_watch (tests/conftest.py) records each hub lookup.


@pytest.mark.parametrize("function", CALLS)
def test_no_hub_lookup_unless_asked(hub_watch, function):
    with pytest.raises(UnknownModel) as info:
        CALLS[function](gpu_memory="1GiB", backend="estimate")
    assert hub_watch == []
    assert str(info.value).startswith(
        f"unknown model '{NAME}': not a built-in preset or a local config ({HUB_HINT}). Presets: ")


@pytest.mark.parametrize("function", CALLS)
def test_hub_true_looks_the_name_up(hub_watch, function):
    with pytest.raises(UnknownModel, match="looked up on the hub"):
        CALLS[function](gpu_memory="1GiB", backend="estimate", hub=True)
    assert hub_watch == [NAME]


def test_the_setting_is_the_default_and_hub_false_wins(hub_watch, monkeypatch):
    monkeypatch.setenv("AUTOTUNE_ALLOW_HUB", "1")
    with pytest.raises(UnknownModel, match="looked up on the hub"):
        CALLS["check"](gpu_memory="1GiB", backend="estimate")
    with pytest.raises(UnknownModel, match="looked up only when asked"):
        CALLS["check"](gpu_memory="1GiB", backend="estimate", hub=False)
    assert hub_watch == [NAME]


def test_hub_must_be_a_bool(hub_watch):
    with pytest.raises(InvalidInput, match="^hub must be True, False or None, got 'yes'$"):
        CALLS["check"](gpu_memory="1GiB", backend="estimate", hub="yes")


def test_a_preset_needs_no_hub(hub_watch):
    assert autotune.check("tiny-bert", seq_len=32, batch_size=1, gpu_memory="1GiB",
                          backend="estimate").fits
    assert hub_watch == []


@pytest.mark.parametrize(("size", "said"), [("12", "12 B"), ("1024", "1 KiB")])
def test_gpu_memory_text_needs_a_unit_and_an_int_is_bytes(size, said):
    with pytest.raises(InvalidInput, match=f"^invalid memory size '{size}': a size needs a unit"):
        autotune.check("tiny-bert", seq_len=32, batch_size=1, gpu_memory=size, backend="estimate")
    # The same figure as an int is a byte count: too small a card.
    with pytest.raises(InvalidInput, match=f"^GPU memory {said} is too small"):
        autotune.check("tiny-bert", seq_len=32, batch_size=1, gpu_memory=int(size), backend="estimate")


def test_the_library_setting_is_off_unless_set():
    from autotune.settings import Settings

    assert Settings().allow_hub is False and Settings.from_env({}).allow_hub is False
    assert Settings.from_env({"AUTOTUNE_ALLOW_HUB": "1"}).allow_hub is True
