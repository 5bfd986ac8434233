"""The parser itself: every option of every command says what it is for, and --version."""

from __future__ import annotations

import argparse

import pytest

import autotune
from autotune.cli import build_parser, main


def _commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """``autotune`` itself (as "") and each of its subcommands, by name."""
    commands = {"": parser}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            commands.update(action.choices)
    return commands


def _actions_without_help(parser: argparse.ArgumentParser) -> list[str]:
    return [
        f"{name or 'autotune'} {'/'.join(action.option_strings) or action.dest}"
        for name, command in _commands(parser).items()
        for action in command._actions
        if not action.help or action.help == argparse.SUPPRESS or not action.help.strip()
    ]


def test_every_option_of_every_command_has_help():
    parser = build_parser()
    assert set(_commands(parser)) == {"", "table", "check", "explain", "serve", "import", "models", "gpus"}
    assert _actions_without_help(parser) == []


def test_the_walk_sees_an_option_without_help():
    # The assertion above can fail: an option added without help is caught.
    parser = build_parser()
    _commands(parser)["table"].add_argument("--undocumented")
    assert _actions_without_help(parser) == ["table --undocumented"]


@pytest.mark.parametrize("command", ["table", "check", "explain", "serve", "import", "models", "gpus"])
def test_every_command_has_its_help_page(capsys, command):
    with pytest.raises(SystemExit) as exc:
        main([command, "--help"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: autotune {command}")


@pytest.mark.parametrize("command", ["table", "check", "explain"])
def test_the_help_of_a_model_command_says_how_names_and_sizes_read(capsys, command):
    with pytest.raises(SystemExit):
        main([command, "--help"])
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    for needle in ("--hub, --no-hub", "AUTOTUNE_ALLOW_HUB=1", "HF_HUB_OFFLINE=1", "Offline by default",
                   "--gpu-memory 12GiB", "a number alone is refused"):
        assert needle in text, needle


def test_version(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out == f"autotune {autotune.__version__}\n"
