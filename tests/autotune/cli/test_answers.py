"""A local check's answer cache (autotune/cli/answers.py): the same check again is answered from disk,
without torch; anything that could change the answer misses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import autotune
from autotune.cli import answers, main

CHECK = ["check", "tiny-bert", "--seq-len", "64", "--batch-size", "8", "--gpu-memory", "1GiB", "--backend",
         "estimate", "--json"]
ROOT = Path(__file__).resolve().parents[3]


def check(capsys, *argv: str) -> tuple[int, dict]:
    code = main([*CHECK, *argv])
    return code, json.loads(capsys.readouterr().out)


@pytest.fixture
def counted(monkeypatch):
    """How many times the library's check ran (a cache hit runs none)."""
    calls = []
    real = autotune.check

    def counting(*args, **kwargs):
        calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(autotune, "check", counting)
    return calls


def test_the_same_check_again_is_answered_from_the_cache(capsys, counted):
    code, first = check(capsys)
    again_code, again = check(capsys)
    assert code == again_code == 0 and len(counted) == 1
    assert first.pop("cached") is False and again.pop("cached") is True
    assert again == first
    main(CHECK[:-1])  # the text output says where the answer came from
    assert "note: answered from the local answer cache" in capsys.readouterr().out


@pytest.mark.parametrize("change", [["--batch-size", "9"], ["--mode", "amp"], ["--peft", "lora"]])
def test_any_other_input_is_computed(capsys, counted, change):
    check(capsys)
    main([*CHECK, *change])
    capsys.readouterr()
    assert len(counted) == 2


def test_a_setting_a_version_or_a_code_change_misses(capsys, counted, monkeypatch):
    check(capsys)
    monkeypatch.setenv("AUTOTUNE_CONTEXT_OVERHEAD", "600MiB")
    assert check(capsys)[1]["cached"] is False
    monkeypatch.setattr(answers, "_version", lambda name: "9.9" if name == "torch" else None)
    assert check(capsys)[1]["cached"] is False
    monkeypatch.setattr(answers, "_code_fingerprint", lambda: "edited")
    assert check(capsys)[1]["cached"] is False
    assert check(capsys)[1]["cached"] is True and len(counted) == 4


def test_no_cache_neither_reads_nor_writes(capsys, counted):
    check(capsys, "--no-cache")
    assert not list(Path(os.environ["AUTOTUNE_CACHE_DIR"]).glob("*.json"))
    check(capsys)
    assert check(capsys, "--no-cache")[1]["cached"] is False and len(counted) == 3


def test_only_an_estimate_of_a_preset_is_kept(tmp_path, monkeypatch):
    plan = {"model": "tiny-bert", "seq_len": 64, "batch_size": 8, "task": None, "dtype": "auto", "attn": None,
            "optimizer": "adamw_torch_fused", "loss": "full", "accumulation_steps": 1, "adapter": None}
    from autotune.workload.modes import parse_mode

    plan["mode"] = parse_mode("fp32")
    target = {"gpu": None, "gpu_memory": "1GiB", "margin": 0.05}
    assert answers.key_of(plan, backend="estimate", **target) is not None
    assert answers.key_of(plan, backend="cuda", **target) is None  # measured: the GPU's, at that moment
    monkeypatch.setattr(answers, "GPU_DEVICE_NODES", (str(tmp_path),))  # a machine with a GPU
    assert answers.key_of(plan, backend="auto", **target) is None
    monkeypatch.setattr(answers, "GPU_DEVICE_NODES", (str(tmp_path / "none"),))
    assert answers.key_of(plan, backend="auto", **target) is not None
    local = {**plan, "model": str(tmp_path / "config.json")}  # a local config can change under its name
    assert answers.key_of(local, backend="estimate", **target) is None
    key = answers.key_of(plan, backend="estimate", **target)
    assert key is not None
    answers.write(tmp_path, key, {"backend": "cuda", "fits": True})
    assert answers.read(tmp_path, key) is None


def test_a_damaged_or_foreign_file_is_a_miss_and_the_oldest_answers_go(tmp_path, monkeypatch):
    key = {"format": 1, "model": "tiny-bert"}
    answers.write(tmp_path, key, {"backend": "estimate", "fits": True})
    assert answers.read(tmp_path, key) == {"backend": "estimate", "fits": True}
    (path,) = tmp_path.glob("*.json")
    path.write_text("{not json")
    assert answers.read(tmp_path, key) is None
    path.write_text(json.dumps({"key": {"format": 1, "model": "other"}, "result": {"fits": False}}))
    assert answers.read(tmp_path, key) is None
    monkeypatch.setattr(answers, "MAX_ENTRIES", 2)
    for size in range(4):
        for older, written in enumerate(sorted(tmp_path.glob("*.json"), key=lambda p: p.stat().st_mtime)):
            os.utime(written, (older, older))  # clearly older than the next write
        answers.write(tmp_path, {**key, "size": size}, {"backend": "estimate", "fits": True})
    assert len(list(tmp_path.glob("*.json"))) == 2
    assert [answers.read(tmp_path, {**key, "size": size}) is not None for size in range(4)] == [
        False, False, True, True]


@pytest.mark.slow
def test_a_hit_in_a_fresh_process_imports_no_torch(tmp_path):
    env = {**os.environ, "AUTOTUNE_CACHE_DIR": str(tmp_path)}
    script = ("import sys; from autotune.cli import main; code = main(sys.argv[1:]); "
              "print('torch imported:', 'torch' in sys.modules, file=sys.stderr); sys.exit(code)")
    runs = [subprocess.run([sys.executable, "-c", script, *CHECK], capture_output=True, text=True, env=env,
                           cwd=ROOT, timeout=300) for _ in range(2)]
    assert [run.returncode for run in runs] == [0, 0]
    assert "torch imported: True" in runs[0].stderr
    assert "torch imported: False" in runs[1].stderr
    assert json.loads(runs[1].stdout)["cached"] is True
