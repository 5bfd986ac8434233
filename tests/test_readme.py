"""The README's examples print what the README shows (``$ autotune ...`` blocks): the estimator's
answers change with the modelled step, and a README that still shows the old numbers misleads."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from autotune.cli import main

README = Path(__file__).resolve().parent.parent / "README.md"
EXAMPLE = re.compile(r"^```\n\$ (autotune [^\n]+)\n(.*?)^```", re.M | re.S)
# How long it took: the one figure of an example that is not the tool's answer.
SECONDS = re.compile(r", \d+(\.\d+)? s$")


def examples() -> list[tuple[str, list[str]]]:
    return [(command, shown.splitlines()) for command, shown in EXAMPLE.findall(README.read_text())]


def test_the_readme_has_its_examples():
    commands = [command for command, _ in examples()]
    assert "autotune table bert-base-uncased" in commands  # the first screen's main job
    assert any(command.startswith("autotune check") for command in commands)


@pytest.mark.slow
@pytest.mark.parametrize(("command", "shown"), examples(), ids=[command for command, _ in examples()])
def test_an_example_prints_what_the_readme_shows(capsys, command, shown):
    argv = shlex.split(command)[1:]
    if argv[0] in ("table", "check"):
        argv += ["--workers", "1"]  # the same answers (test_parallel.py), one core of the suite's two
    main(argv)
    printed = [SECONDS.sub("", line) for line in capsys.readouterr().out.splitlines()]
    for line in shown:
        assert SECONDS.sub("", line) in printed, line


def test_the_service_docs_name_every_body_field_of_a_table():
    from api.schemas import TableCreate

    docs = (README.parent / "docs" / "service.md").read_text()
    fields = docs[docs.index("Body fields"):docs.index("`modes`\nmay be left out")]
    missing = [name for name in TableCreate.model_fields if f"`{name}`" not in fields]
    assert missing == []
