"""A local check's answer cache (autotune/cli/answers.py): the same check again is answered from disk,
without torch; anything that could change the answer misses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from autotune import public
from autotune.cli import answers, main
from autotune.request import CheckRequest, Step, Target

# Max batch 150 on 640 MiB (a budget of 88 MiB past the context): a search settles its boundary
# by replays over a tenth of it below (estimate/backend.py _settle), on 1 GiB (1,406) ten times as
# many, for every computed check and lever search of these tests (issue 39).
CHECK = ["check", "tiny-bert", "--seq-len", "64", "--batch-size", "8", "--gpu-memory", "640MiB", "--backend",
         "estimate", "--json"]
ROOT = Path(__file__).resolve().parents[3]


def check(capsys, *argv: str) -> tuple[int, dict]:
    code = main([*CHECK, *argv])
    return code, json.loads(capsys.readouterr().out)


@pytest.fixture
def counted(monkeypatch):
    """How many times the library's check ran (a cache hit runs none)."""
    calls = []
    real = public.run_check

    def counting(*args, **kwargs):
        calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(public, "run_check", counting)
    return calls


def test_the_same_check_again_is_answered_from_the_cache(capsys, counted):
    code, first = check(capsys)
    again_code, again = check(capsys)
    assert code == again_code == 0 and len(counted) == 1
    assert first.pop("cached") is False and again.pop("cached") is True
    assert again == first
    main(CHECK[:-1])  # the text output says where the answer came from
    assert "note: answered from the local answer cache" in capsys.readouterr().out


@pytest.mark.parametrize("change", [["--mode", "amp"], ["--peft", "lora"], ["--seq-len", "32"],
                                    ["--gpu-memory", "2GiB"]])
def test_any_other_input_but_the_batch_is_computed(capsys, counted, change):
    check(capsys)
    main([*CHECK, *change])
    capsys.readouterr()
    assert len(counted) == 2


def test_a_setting_a_version_or_a_code_change_misses(capsys, counted, monkeypatch):
    check(capsys)
    monkeypatch.setenv("AUTOTUNE_CONTEXT_OVERHEAD", "600MiB")
    assert check(capsys)[1]["cached"] is False
    monkeypatch.setenv("TORCH_CUDNN_SDPA_DEPRIORITIZED", "1")  # PyTorch's, but it changes the kernel
    assert check(capsys)[1]["cached"] is False
    monkeypatch.setattr(answers, "_version", lambda name: "9.9" if name == "torch" else None)
    assert check(capsys)[1]["cached"] is False
    monkeypatch.setattr(answers, "_code_fingerprint", lambda: "edited")
    assert check(capsys)[1]["cached"] is False
    assert check(capsys)[1]["cached"] is True and len(counted) == 5


def test_no_cache_neither_reads_nor_writes(capsys, counted):
    check(capsys, "--no-cache")
    assert not list(Path(os.environ["AUTOTUNE_CACHE_DIR"]).rglob("*.json"))
    check(capsys)
    assert check(capsys, "--no-cache")[1]["cached"] is False and len(counted) == 3


@pytest.mark.parametrize("change", [
    {"axolotl": True}, {"llamafactory": True}, {"fused_attn_kernel": True}, {"offload_activations": True},
    {"use_kernels": True}, {"float32_embeddings": True},
    {"qat": '{"weight_dtype": "int4"}'}, {"unfrozen_parameters": ("lm_head",)},
    {"fp8": "tensorwise"},
    {"frozen_modules": ("embed",)},
    {"config_overrides": '{"output_router_logits": true}'}, {"zero_config": '{"stage": 3}'},
])
def test_every_field_of_the_step_is_in_the_key(change):
    # A field the key left out answered another job from the cache (axolotl, qat, ... were).
    def key(**fields) -> dict:
        request = CheckRequest(Step("tiny-bert", **fields), Target(gpu_memory="1GiB", backend="estimate"),
                               seq_len=64, batch_size=8)
        found = answers.key_of(request)
        assert found is not None
        return found

    assert key(**change) != key()
    assert set(answers._other_fields(Step("tiny-bert", **change))) == set(change)


def test_only_an_estimate_of_a_preset_is_kept(tmp_path, monkeypatch):
    def request(backend: str, model: str = "tiny-bert") -> CheckRequest:
        return CheckRequest(Step(model), Target(gpu_memory="1GiB", backend=backend), seq_len=64, batch_size=8)

    assert answers.key_of(request("estimate")) is not None
    assert answers.key_of(request("cuda")) is None  # measured: the GPU's, at that moment
    monkeypatch.setattr(answers, "GPU_DEVICE_NODES", (str(tmp_path),))  # a machine with a GPU
    assert answers.key_of(request("auto")) is None
    monkeypatch.setattr(answers, "GPU_DEVICE_NODES", (str(tmp_path / "none"),))
    assert answers.key_of(request("auto")) is not None
    # a local config can change under its name
    assert answers.key_of(request("estimate", str(tmp_path / "config.json"))) is None
    key = answers.key_of(request("estimate"))
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


def with_batch(batch: int) -> list[str]:
    return ["--batch-size", str(batch)]  # after CHECK's own: the later flag wins


def test_another_batch_of_a_seen_cell_is_answered_from_its_memo(capsys, counted):
    """The same answer as computing it: below the max, at it, just above it and far above (the
    levers: searched once the step does not fit, then kept)."""
    code, first = check(capsys)
    best = first["max_batch_size"]
    assert code == 0 and 8 < best < 4096 and len(counted) == 1
    assert list(Path(os.environ["AUTOTUNE_CACHE_DIR"]).glob("cells/*.json"))
    for batch in (9, best, best + 1, best + 7, 5000):
        before = len(counted)
        code, answer = check(capsys, *with_batch(batch))
        from_memo = batch != best + 1  # best + 1 does not fit: its levers were not searched yet
        assert len(counted) == before + (not from_memo), batch
        assert answer.pop("cached") is from_memo
        fresh_code, fresh = check(capsys, *with_batch(batch), "--no-cache")
        assert fresh.pop("cached") is False
        assert (code, answer) == (fresh_code, fresh), batch
    assert fresh["fits"] is False and fresh["levers"]


def test_a_memo_answers_only_what_it_knows(capsys):
    """A max at the search's cap may be higher under another cap, and so may a lever's; a memo that
    cannot be read is computed again."""
    from dataclasses import replace

    from autotune.analysis.check import CellMemo, Lever, check_from_memo

    kept: list[CellMemo] = []
    public.check("tiny-bert", seq_len=64, batch_size=8, gpu_memory="1GiB", backend="estimate",
                   remember=kept.append)
    (memo,) = kept
    assert memo.cap == 4096 and memo.levers is None  # the step fitted: no lever searched
    assert check_from_memo(memo, batch_size=10) is not None
    assert check_from_memo(memo, batch_size=memo.max_batch_size + 1) is None  # needs the levers
    at_cap = replace(memo, max_batch_size=memo.cap, levers=[])
    assert check_from_memo(at_cap, batch_size=10) is not None  # the same cap
    assert check_from_memo(at_cap, batch_size=6000) is None  # a larger cap: the max may be larger
    lever_at_cap = replace(memo, levers=[Lever("mode", "mode bf16+ckpt", 4096)])
    assert check_from_memo(lever_at_cap, batch_size=6000) is None
    assert check_from_memo(replace(memo, levers=[]), batch_size=6000) is not None
    assert CellMemo.from_json(json.loads(json.dumps(memo.to_json()))) == memo
    # A chunked loss's form (trace.ChunkLine): Liger's 4 chunks of 8 x batch rows hold at 2, 4, 8,
    # ...; at 10 its chunks are 3 of 128 rows, which the form does not give: computed again.
    from autotune.backends.estimate.trace import ChunkLine
    from autotune.workload.chunks import LigerChunks

    line = ChunkLine(LigerChunks(hidden=32, vocab=128), (0, 32), (4, 0, 0), (0, 8, 8))
    chunked = replace(memo, form=replace(memo.form, chunks=(line,)))
    assert check_from_memo(chunked, batch_size=8) is not None
    assert check_from_memo(chunked, batch_size=10) is None
    assert CellMemo.from_json(json.loads(json.dumps(chunked.to_json()))) == chunked


def test_a_damaged_memo_is_computed_again(capsys, counted):
    check(capsys)
    (path,) = Path(os.environ["AUTOTUNE_CACHE_DIR"]).glob("cells/*.json")
    stored = json.loads(path.read_text())
    stored["result"]["form"] = {"fixed": "damaged"}
    path.write_text(json.dumps(stored))
    assert check(capsys, *with_batch(9))[1]["cached"] is False and len(counted) == 2


@pytest.mark.slow
def test_a_hit_in_a_fresh_process_imports_no_torch(tmp_path):
    """The same check again, and the same cell at another batch (its memo replayed)."""
    env = {**os.environ, "AUTOTUNE_CACHE_DIR": str(tmp_path)}
    script = ("import sys; from autotune.cli import main; code = main(sys.argv[1:]); "
              "print('torch imported:', 'torch' in sys.modules, file=sys.stderr); sys.exit(code)")
    runs = [subprocess.run([sys.executable, "-c", script, *CHECK, *extra], capture_output=True, text=True,
                           env=env, cwd=ROOT, timeout=300) for extra in ([], [], with_batch(9))]
    assert [run.returncode for run in runs] == [0, 0, 0]
    assert "torch imported: True" in runs[0].stderr
    assert "torch imported: False" in runs[1].stderr and "torch imported: False" in runs[2].stderr
    assert json.loads(runs[1].stdout)["cached"] is True
    assert json.loads(runs[2].stdout)["cached"] is True and json.loads(runs[2].stdout)["batch_size"] == 9
