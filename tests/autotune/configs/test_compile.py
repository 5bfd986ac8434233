"""torch_compile read from each format's keys (configs/reading.py read_compile), refused where the
compiled step is not modelled (workload/compile.py), and a compiled config answered, saying so."""

from __future__ import annotations

import json
import re

import configread
import pytest

from autotune.cli import main
from autotune.errors import UnmodelledSetting
from autotune.request import CheckRequest, PeftOptions, Step, TableRequest, Target, resolve

TRAINER = {"model_name_or_path": "tiny-llama", "max_seq_length": 64, "per_device_train_batch_size": 4,
           "bf16": True, "output_dir": "out"}
AXOLOTL = {"base_model": "tiny-llama", "sequence_len": 64, "micro_batch_size": 4, "bf16": True,
           "attn_implementation": "flash_attention_2",
           "datasets": [{"path": "tatsu-lab/alpaca", "type": "alpaca"}]}
LLAMAFACTORY = {"model_name_or_path": "tiny-llama", "stage": "sft", "do_train": True,
                "finetuning_type": "full", "cutoff_len": 64, "per_device_train_batch_size": 4, "bf16": True,
                "output_dir": "out",
                "dataset": "alpaca_en_demo", "template": "llama3"}


@pytest.mark.parametrize(("base", "keys", "compiled"), [
    (TRAINER, {"torch_compile": True}, "default"),
    # TrainingArguments.__post_init__: a backend or a mode alone turns torch_compile on
    (TRAINER, {"torch_compile_backend": "inductor"}, "default"),
    (TRAINER, {"torch_compile_mode": "max-autotune-no-cudagraphs"}, "max-autotune-no-cudagraphs"),
    (TRAINER, {"torch_compile": False}, None),
    (AXOLOTL, {"torch_compile": "auto"}, "default"),  # check_torch_compile_auto: on, torch >= 2.5.1
    # Axolotl passes the mode only under a true torch_compile (_configure_torch_compile)
    (AXOLOTL, {"torch_compile_mode": "max-autotune"}, None),
    (LLAMAFACTORY, {"torch_compile": True}, "default"),
])
def test_torch_compile_is_read_as_the_trainer_reads_it(tmp_path, base, keys, compiled):
    plan = configread.read(tmp_path, {**base, **keys}, "config.yaml" if base is AXOLOTL else "config.json")
    assert plan.request.step.torch_compile == compiled
    assert any(note.startswith("torch_compile: the model under torch.compile") for note in plan.notes) == (
        compiled is not None)


def _resolve(mode: str, **step: object) -> object:
    return resolve(CheckRequest(Step(model="tiny-llama", **step), Target(gpu="H100-80GB"), seq_len=64,
                                batch_size=4, mode=mode))


@pytest.mark.parametrize(("mode", "step", "named"), [
    ("bf16+ckpt", {}, "checkpointed modes (bf16+ckpt)"),
    ("bf16", {"loss": "chunked"}, "loss chunked"),
    ("bf16", {"peft_options": PeftOptions(peft="qlora")}, "a quantized base"),
    ("bf16", {"attn": "flex_attention"}, "attn flex_attention"),
    ("bf16", {"liger": "rms_norm"}, "liger"),
])
def test_a_compiled_step_beside_what_is_traced_eagerly_only_is_refused_by_name(mode, step, named):
    with pytest.raises(UnmodelledSetting, match=re.escape("torch_compile beside " + named)):
        _resolve(mode, torch_compile="default", **step)


def test_a_cuda_graph_mode_is_refused():
    with pytest.raises(UnmodelledSetting, match="reduce-overhead: CUDA graphs"):
        _resolve("bf16", torch_compile="reduce-overhead")


def test_a_compiled_config_is_answered_and_says_it_is_compiled(capsys, tmp_path):
    config = configread.write(tmp_path, {**TRAINER, "torch_compile": True}, "config.json")
    code = main(["check", "tiny-llama", "--from-config", str(config), "--gpu", "H100-80GB", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0 and doc["fits"] and doc["compiled"] == "default"
    said = "compiled step (torch.compile, inductor, mode default): the activations saved for the backward "
    assert any(w.startswith(said + "are AOTAutograd's min-cut partitioner's") for w in doc["warnings"])


def test_a_compiled_table_s_default_modes_leave_checkpointing_out():
    step = Step(model="tiny-llama", torch_compile="default")
    resolved = resolve(TableRequest(step, Target(gpu="H100-80GB"), seq_lens=[64]))
    assert [mode.name for mode in resolved.modes] == ["fp32", "amp"]  # not ckpt, amp+ckpt


def test_a_mode_torch_compile_does_not_have_is_invalid_and_a_cuda_graph_mode_not_modelled():
    from autotune.errors import InvalidInput, UnmodelledSetting
    from autotune.workload.compile import check_mode

    assert check_mode(None) is None and check_mode("default") == "default"
    with pytest.raises(InvalidInput, match="torch.compile's modes are default, ") as raised:
        check_mode("fast")
    assert raised.value.kind == "invalid"
    with pytest.raises(UnmodelledSetting, match="CUDA graphs"):
        check_mode("reduce-overhead")
