"""The command line: output shapes, and the exact errors users see (exit 2)."""

from __future__ import annotations

import json

import pytest

from autotune.cli import main


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_table_json_has_the_documented_fields(capsys):
    code, out, err = run(capsys, "table", "tiny-bert", "--seq-lens", "32,64", "--modes", "fp32,amp",
                         "--gpu-memory", "1GiB", "--backend", "estimate", "--max-batch", "256", "--json")
    assert code == 0
    doc = json.loads(out)
    for key in ("model", "backend", "gpu_memory_bytes", "budget_bytes", "margin", "attn", "cells"):
        assert key in doc
    assert doc["model"] == "tiny-bert" and doc["backend"] == "estimate"
    assert doc["gpu_memory_bytes"] == 1024**3
    assert len(doc["cells"]) == 4
    for cell in doc["cells"]:
        for key in ("seq_len", "mode", "max_batch_size", "peak_memory_bytes", "probes", "probe_log"):
            assert key in cell
    assert "4/4" in err  # the progress bar went to stderr


def test_table_text_output(capsys):
    code, out, _ = run(capsys, "table", "tiny-gpt2", "--task", "causal-lm", "--seq-lens", "32",
                       "--modes", "fp32", "--gpu", "T4", "--backend", "estimate", "--max-batch", "64")
    assert code == 0
    assert "tiny-gpt2 (causal-lm" in out and "seq_len" in out and "64+" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["table", "bert-huge"], "Error: unknown model 'bert-huge'"),
        (["table", "bert-base-uncased", "--seq-lens", "128,1024"],
         "Error: sequence length 1024 exceeds max_position_embeddings=512 of bert-base-uncased"),
        (["table", "tiny-bert", "--modes", "fp8"], "Error: unknown mode 'fp8': allowed modes are"),
        (["table", "tiny-bert", "--seq-lens", "32", "--gpu", "K80"], "Error: unknown GPU"),
        (["table", "tiny-bert", "--seq-lens", "32", "--gpu-memory", "12 gigs"],
         "Error: invalid memory size '12 gigs'"),
        (["table", "tiny-bert", "--seq-lens", "32", "--backend", "cuda"],
         "Error: backend 'cuda' needs a CUDA GPU"),
    ],
)
def test_bad_input_exits_2_with_a_clear_message(capsys, argv, message):
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == ""
    assert err.startswith(message), err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["table", "tiny-bert", "--seq-lens", "abc"], "invalid sequence lengths 'abc'"),
        (["table", "tiny-bert", "--margin", "2"], "invalid margin '2'"),
        (["table", "tiny-bert", "--gpu", "T4", "--gpu-memory", "12GiB"], "not allowed with argument"),
    ],
)
def test_malformed_arguments_exit_2(capsys, argv, message):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_presets_are_listed(capsys):
    lines = run(capsys, "models")[1].splitlines()
    rows = {line.split()[0]: line.split()[1:] for line in lines}
    assert rows["bert-base-uncased"] == ["sequence-classification", "float32", "512", "positions"]
    assert rows["meta-llama/Llama-3.2-1B"] == ["causal-lm", "bfloat16", "131072", "positions"]
    assert "H100-80GB" in run(capsys, "gpus")[1]


def test_serve_without_the_service_extra_names_it(monkeypatch, capsys):
    from autotune.cli import main, serve

    monkeypatch.setattr(serve, "SERVICE_PACKAGES", ("fastapi", "no_such_package_for_autotune"))
    assert main(["serve", "--port", "8765"]) == 2
    assert capsys.readouterr().err == (
        "Error: autotune serve needs no_such_package_for_autotune, which is not installed: "
        "pip install 'autotune-batch[service]' (or -e \".[service]\" from a checkout)\n")
