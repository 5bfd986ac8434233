"""The command line: output shapes, and the exact errors users see (exit 2)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.cli import main
from autotune.errors import AutotuneError
from autotune.workload.modes import parse_mode


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
    assert re.search(r"\n\d+ probes for 1 cell \(", out)


def test_a_mode_is_read_with_ckpt_on_either_side():
    assert parse_mode("ckpt+amp") == parse_mode("amp+ckpt") and parse_mode("CKPT+bf16").name == "bf16+ckpt"
    assert parse_mode("ckpt+fp32").name == "ckpt"
    with pytest.raises(AutotuneError, match="unknown mode 'ckpt\\+ckpt'"):
        parse_mode("ckpt+ckpt")


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
        (["table", "tiny-bert", "--seq-lens", "32", "--gpu-memory", "12"],
         "Error: invalid memory size '12': a size needs a unit, e.g. 12GiB or 12MiB (12B for bytes); "
         "units: KiB, MiB, GiB, TiB, K, M, G, T (powers of 1024), KB, MB, GB, TB (powers of 1000), B\n"),
        (["table", "tiny-bert", "--gpu", "H10"], "Error: unknown GPU 'H10': did you mean H100-80GB, "
         "H100-PCIe or H100-NVL? Presets: T4, "),
        (["table", "tiny-bert", "--gpu", "T-4"], "Error: unknown GPU 'T-4': did you mean T4? Presets: "),
        (["table", "tiny-bret"], "Error: unknown model 'tiny-bret': did you mean tiny-bert? It is not a "
         "built-in preset or a local config (Hugging Face hub ids are looked up only when asked: --hub, "
         "hub=True in Python, or AUTOTUNE_ALLOW_HUB=1). Presets: "),
        (["check", "bert-base-uncase", "--seq-len", "128", "--batch-size", "8"],
         "Error: unknown model 'bert-base-uncase': did you mean bert-base-uncased? It is not "),
        (["explain", "llama-3.2-1b-instruct"],
         "Error: unknown model 'llama-3.2-1b-instruct': did you mean meta-llama/Llama-3.2-1B? It is not "),
        (["table", "tiny-bert", "--seq-lens", "32", "--backend", "cuda"],
         "Error: backend 'cuda' needs a CUDA GPU"),
        (["table", "tiny-bert", "--multiprocessors", "46"],
         "Error: multiprocessors name the chip of a card given by its size: give gpu_memory too"),
        (["table", "tiny-bert", "--gpu", "T4", "--gpu-memory", "16GiB"],
         "Error: GPU memory 16 GiB is more than the 14.56 GiB of T4: give at most its size, or another GPU"),
        (["table", "tiny-bert", "--gpu-memory", "1GiB", "--multiprocessors", "0"],
         "Error: multiprocessors '0': give the chip's multiprocessor count, e.g. 46"),
        # a value that starts with a dash is the option's value, not another option
        (["table", "tiny-bert", "--seq-lens", "32", "--gpu-memory", "-5GiB"],
         "Error: invalid memory size '-5GiB': must be greater than 0 bytes"),
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
        (["table", "tiny-bert", "--margin", "-0.1"], "invalid margin '-0.1'"),
        (["check", "tiny-bert", "--seq-len", "32", "--batch-size", "-3"],
         "batch_size must be an integer >= 1"),
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


# --- offline by default: the hub only when asked ------------------------------------------------


# hub_watch (tests/conftest.py) records each hub lookup.


HUB_ARGS = {
    "table": ["table", "someone/bert-huge", "--seq-lens", "32", "--modes", "fp32"],
    "check": ["check", "someone/bert-huge", "--seq-len", "32", "--batch-size", "8"],
    "explain": ["explain", "someone/bert-huge", "--seq-len", "32", "--batch-size", "8"],
}


@pytest.mark.parametrize("command", HUB_ARGS)
def test_a_name_that_is_no_preset_is_not_looked_up_on_the_hub_by_default(capsys, hub_watch, command):
    code, _, err = run(capsys, *HUB_ARGS[command])
    assert code == 2 and hub_watch == []
    assert err.startswith("Error: unknown model 'someone/bert-huge': not a built-in preset or a local config "
                          "(Hugging Face hub ids are looked up only when asked: --hub, hub=True in Python, "
                          "or AUTOTUNE_ALLOW_HUB=1). Presets: "), err


@pytest.mark.parametrize("command", HUB_ARGS)
def test_hub_asks_the_hub(capsys, hub_watch, command):
    code, _, err = run(capsys, *HUB_ARGS[command], "--hub")
    assert code == 2 and hub_watch == ["someone/bert-huge"]
    assert err == "Error: unknown model 'someone/bert-huge': looked up on the hub\n"


def test_the_hub_setting_turns_lookups_on_and_no_hub_off(capsys, hub_watch, monkeypatch):
    monkeypatch.setenv("AUTOTUNE_ALLOW_HUB", "1")
    assert run(capsys, *HUB_ARGS["table"])[0] == 2 and hub_watch == ["someone/bert-huge"]
    code, _, err = run(capsys, *HUB_ARGS["table"], "--no-hub")
    assert code == 2 and hub_watch == ["someone/bert-huge"]  # not asked again
    assert "looked up only when asked: --hub" in err


def test_with_hub_offline_only_the_local_cache_is_read(capsys, monkeypatch):
    # conftest sets HF_HUB_OFFLINE=1: --hub reads the local Hugging Face cache and nothing else.
    monkeypatch.delenv("AUTOTUNE_ALLOW_HUB", raising=False)
    code, _, err = run(capsys, *HUB_ARGS["table"], "--hub")
    assert code == 2
    assert "(offline: only the local Hugging Face cache was searched)" in err


def test_a_malformed_hub_setting_is_named(capsys, monkeypatch):
    monkeypatch.setenv("AUTOTUNE_ALLOW_HUB", "maybe")
    code, _, err = run(capsys, *HUB_ARGS["table"])
    assert (code, err) == (2, "Error: AUTOTUNE_ALLOW_HUB='maybe': use 1 or 0 (true/false, yes/no, on/off)\n")


def test_a_size_without_its_unit_is_refused_before_asking_a_server(capsys):
    # Port 9 (discard): were the server asked, the error would say it is unreachable.
    code, out, err = run(capsys, "check", "tiny-bert", "--seq-len", "32", "--batch-size", "8",
                         "--gpu-memory", "12", "--server", "http://127.0.0.1:9")
    assert code == 2 and out == ""
    assert err.startswith("Error: invalid memory size '12': a size needs a unit, e.g. 12GiB"), err


# --- default sequence lengths within the model's limit -----------------------------------------


@pytest.mark.parametrize("model", ["tiny-bert", "tiny-gpt2", "tiny-roberta", "tiny-llama"])
def test_a_tiny_preset_gets_default_rows_within_its_128_positions(capsys, model):
    code, out, _ = run(capsys, "table", model, "--modes", "fp32", "--gpu-memory", "1GiB",
                       "--backend", "estimate", "--max-batch", "8", "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["seq_lens"] == [64, 128]
    assert [cell["max_batch_size"] for cell in doc["cells"]] == [8, 8]


def test_table_and_check_say_the_adapter_they_modelled(capsys):
    code, out, _ = run(capsys, "table", "tiny-llama", "--seq-lens", "32", "--modes", "bf16", "--gpu-memory",
                       "1GiB", "--backend", "estimate", "--max-batch", "8", "--dtype", "bfloat16",
                       "--peft", "qlora", "--lora-r", "8", "--qlora-recipe", "axolotl")
    assert code == 0
    assert ("adapter: QLoRA (nf4, double quant, Axolotl recipe) r=8 alpha=32 dropout 0.05 on "
            "q_proj,v_proj: 1.79k of ") in out
    code, out, _ = run(capsys, "check", "tiny-llama", "--seq-len", "32", "--batch-size", "2", "--mode",
                       "bf16", "--gpu-memory", "1GiB", "--peft", "lora", "--lora-targets", "all-linear",
                       "--json")
    assert code == 0
    adapter = json.loads(out)["adapter"]
    assert (adapter["method"], adapter["r"], adapter["recipe"], adapter["targets_default"]) == (
        "lora", 16, None, False)
    assert adapter["parameters"]["trainable"] < adapter["parameters"]["total"]
    code, out, err = run(capsys, "check", "tiny-llama", "--seq-len", "32", "--batch-size", "2",
                         "--peft", "lora", "--qlora-recipe", "trl")
    assert code == 2 and err.startswith("Error: --qlora-recipe prepares a 4- or 8-bit base: add")


def test_table_check_and_explain_say_where_sdpa_ran_cudnn(capsys, monkeypatch):
    monkeypatch.delenv("TORCH_CUDNN_SDPA_DEPRIORITIZED", raising=False)
    cell = ("tiny-bert", "--gpu", "H100-80GB", "--backend", "estimate")
    code, out, _ = run(capsys, "table", *cell, "--seq-lens", "32", "--modes", "fp32,amp", "--max-batch", "8")
    assert code == 0
    assert "attention: SDPA runs cuDNN on this card for amp, as PyTorch 2.11+ with CUDA 13 does" in out
    kernels = {}
    for mode in ("fp32", "amp"):
        code, out, _ = run(capsys, "check", *cell, "--seq-len", "32", "--batch-size", "2", "--mode", mode,
                           "--json", "--no-cache")
        kernels[mode] = json.loads(out)["attention_kernel"]
    assert kernels == {"fp32": "memory-efficient", "amp": "cuDNN"}  # cuDNN takes 16-bit inputs only
    code, out, _ = run(capsys, "explain", *cell[:3], "--seq-len", "32", "--batch-size", "2", "--mode", "amp",
                       "--no-levers")  # the header is the base step's: no what-if search needed
    assert "attention sdpa (cuDNN), loss full" in out
    monkeypatch.setenv("TORCH_CUDNN_SDPA_DEPRIORITIZED", "1")  # the job's own switch, read here too
    code, out, _ = run(capsys, "check", *cell, "--seq-len", "32", "--batch-size", "2", "--mode", "amp",
                       "--json", "--no-cache")
    assert json.loads(out)["attention_kernel"] == "memory-efficient"  # a padded batch: no flash


# -- the command's process: its exit ----------------------------------------------------------

ROOT = Path(__file__).resolve().parents[3]


def command(*argv: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "autotune", *argv], capture_output=True, text=True,
                          cwd=ROOT, timeout=300, **kwargs)


@pytest.mark.slow
def test_a_command_that_ends_at_once_keeps_its_output_and_exit_status(tmp_path):
    """table, check, ... end with os._exit (no finalization of torch's modules): every line is out
    first, and check's exit status is still its verdict."""
    env = {**os.environ, "AUTOTUNE_CACHE_DIR": str(tmp_path)}
    done = command("check", "tiny-bert", "--seq-len", "64", "--batch-size", "100000", "--gpu-memory", "1GiB",
                   "--json", env=env)
    assert done.returncode == 1  # does not fit
    assert json.loads(done.stdout)["fits"] is False
    listed = command("models")
    assert listed.returncode == 0 and listed.stdout.count("\n") >= 40  # every preset, flushed


def test_a_reader_that_goes_away_ends_the_command_quietly():
    process = subprocess.Popen([sys.executable, "-m", "autotune", "models"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, cwd=ROOT)
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()  # before it writes a line: as `| head -0` would
    assert process.wait(timeout=300) == 2
    assert "Traceback" not in process.stderr.read().decode()


def test_serve_and_import_end_as_python_does(monkeypatch, tmp_path):
    """Their servers, Ray and SQLite finish their work at exit: no os._exit (which would also end
    this test's process)."""
    from autotune.cli import QUICK_EXIT
    from autotune.cli import run as run_command

    assert not QUICK_EXIT & {"serve", "import"}
    monkeypatch.setattr(sys, "argv", ["autotune", "import", str(tmp_path / "missing")])
    with pytest.raises(SystemExit) as ended:
        run_command()
    assert ended.value.code == 2


def test_an_attention_the_model_cannot_run_is_an_error_not_a_verdict(capsys):
    # Gemma 2 has no SDPA implementation in transformers 5: refused by name (exit 2), never "does not
    # fit" (exit 1)
    argv = ["check", "tiny-gemma2", "--seq-len", "32", "--batch-size", "1", "--attn", "sdpa",
            "--mode", "bf16", "--gpu", "H100-80GB", "--backend", "estimate", "--no-cache", "--workers", "1"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("Error: attn sdpa cannot be modelled for this model") and "Traceback" not in err


def test_flash_attention_2_is_modelled_where_the_model_has_no_sdpa(capsys):
    # Gemma 2 runs flash_attention_2 (its softcap inside the kernel): the estimator's flash stand-in
    # needs no SDPA implementation of the model (step.py _register_flash_stand_in)
    argv = ["check", "tiny-gemma2", "--seq-len", "32", "--batch-size", "1", "--attn", "flash_attention_2",
            "--mode", "bf16", "--gpu", "H100-80GB", "--backend", "estimate", "--no-cache", "--workers", "1",
            "--json"]
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["fits"] and doc["attn"] == "flash_attention_2" and doc["attention_kernel"] == "flash"


def test_an_unexpected_failure_inside_a_command_exits_2_with_the_traceback(capsys, monkeypatch):
    from autotune import public

    def broken(*args, **kwargs):
        raise RuntimeError("a library failed")

    monkeypatch.setattr(public, "run_check", broken)
    argv = ["check", "tiny-bert", "--seq-len", "32", "--batch-size", "1", "--backend", "estimate",
            "--no-cache"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and err.rstrip().endswith(
        "Error: internal error (RuntimeError: a library failed); please report it with the traceback above")


def test_a_json_refusal_says_its_kind_an_unmodelled_key_from_a_job_that_fails(capsys, tmp_path):
    # autotune/errors.py: "not modelled" is autotune's gap (the job may run), "job fails" the real
    # job's own failure (here flash-attn on a T4, refused by transformers' check as by the kernel)
    cell = ["--seq-len", "32", "--batch-size", "1", "--json"]
    code, out, _ = run(capsys, "check", "tiny-llama", "--attn", "flash_attention_2", "--gpu", "T4",
                       "--mode", "amp", *cell)
    assert code == 2 and json.loads(out) == {
        "error": "flash_attention_2 needs compute capability 8.0 or newer; T4 has 7.5: use sdpa or eager",
        "kind": "job fails"}
    config = tmp_path / "train.yaml"
    config.write_text("base_model: tiny-llama\ntorch_compile: true\ntorch_compile_mode: reduce-overhead\n"
                      "sequence_len: 32\nmicro_batch_size: 1\n")
    code, out, _ = run(capsys, "check", "tiny-llama", "--from-config", str(config), "--gpu", "T4", "--json")
    assert code == 2 and json.loads(out)["kind"] == "not modelled", out
    code, out, _ = run(capsys, "check", "tiny-bert", "--seq-len", "4096", "--batch-size", "1", "--json")
    assert code == 2 and json.loads(out)["kind"] == "invalid", out


@pytest.mark.parametrize("keys", [
    "adapter: qlora\nload_in_8bit: true\n",  # schemas/peft.py validate_qlora: "Can't load qlora in 8bit"
    "qat:\n  weight_dtype: int8\nbf16: true\nattn_implementation: flash_attention_2\n",  # int8 weight-only
])
def test_a_config_its_own_trainer_refuses_is_a_job_that_fails(capsys, tmp_path, keys):
    config = tmp_path / "train.yaml"
    config.write_text(f"base_model: tiny-llama\nsequence_len: 32\nmicro_batch_size: 1\n{keys}")
    code, out, _ = run(capsys, "check", "tiny-llama", "--from-config", str(config), "--gpu", "H100-80GB",
                       "--json")
    assert code == 2 and json.loads(out)["kind"] == "job fails", out
    assert "Axolotl refuses" in json.loads(out)["error"]
