"""trust_remote_code: true over a checkpoint that ships its own modeling code (its config.json
auto_map, workload/remote_code.py): refused by name where the config's tool loads that code in
place of transformers' class autotune traces; answered as before where it is false or unset, where
the checkpoint has no auto_map, and under TRL (which loads the class config.json's architectures
names)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from configread import write

from autotune.cli import main
from autotune.configs import check_remote_code, read_training_config, read_training_configs
from autotune.errors import InvalidInput, UnmodelledSetting
from autotune.workload.models import resolve_model
from autotune.workload.presets import PRESETS
from autotune.workload.remote_code import REMOTE_CODE, remote_module

DEEPSEEK = "deepseek-ai/DeepSeek-V2-Lite"
PHI = "microsoft/Phi-3.5-mini-instruct"
LLAMA = "meta-llama/Llama-3.1-8B"

# One config per format that reads trust_remote_code, the model left to the test.
AXOLOTL = {"sequence_len": 512, "micro_batch_size": 1, "bf16": False}
LLAMAFACTORY = {"stage": "sft", "finetuning_type": "full", "cutoff_len": 512,
                "per_device_train_batch_size": 1}
LLAMAFACTORY_V1 = {"micro_batch_size": 1, "train_dataset": "d.yaml", "cutoff_len": 512,
                   "dist_config": {"name": "fsdp2"}}
TRAINER = {"per_device_train_batch_size": 1, "block_size": 512}  # transformers' run_clm.py
TRL_SFT = {"max_length": 512, "per_device_train_batch_size": 1, "dataset_text_field": "text"}
FORMATS = {  # format -> (its keys, the key naming the model)
    "axolotl": (AXOLOTL, "base_model"),
    "llamafactory": (LLAMAFACTORY, "model_name_or_path"),
    "llamafactory-v1": (LLAMAFACTORY_V1, "model"),
    "trainer": (TRAINER, "model_name_or_path"),
    "trl-sft": (TRL_SFT, "model_name_or_path"),
}


def _config(tmp_path, fmt, model, **changes):
    keys, model_key = FORMATS[fmt]
    return read_training_config(write(tmp_path, {**keys, model_key: model, **changes}, "train.yaml"))


def _check(tmp_path, fmt, model, **changes):
    config = _config(tmp_path, fmt, model, **changes)
    return check_remote_code(config, config.request)


@pytest.mark.parametrize("fmt", ["axolotl", "llamafactory", "llamafactory-v1", "trainer", "trl-sft"])
def test_each_reader_keeps_the_key_that_sets_trust_remote_code(tmp_path, fmt):
    config = _config(tmp_path, fmt, LLAMA, trust_remote_code=True)
    assert config.format == fmt.removesuffix("-v1") and config.trust_remote_code == "trust_remote_code"
    assert _config(tmp_path, fmt, LLAMA, trust_remote_code=False).trust_remote_code is None
    assert _config(tmp_path, fmt, LLAMA).trust_remote_code is None
    with pytest.raises(InvalidInput, match="trust_remote_code in '.*' must be true or false, got 'yes'"):
        _config(tmp_path, fmt, LLAMA, trust_remote_code="yes")


def test_trl_model_init_kwargs_trust_remote_code_is_kept_too(tmp_path):
    config = _config(tmp_path, "trl-sft", PHI, model_init_kwargs={"trust_remote_code": True})
    assert config.trust_remote_code == "model_init_kwargs.trust_remote_code"
    assert _config(tmp_path, "trl-sft", PHI, model_init_kwargs=json.dumps({"trust_remote_code": True})
                   ).trust_remote_code == "model_init_kwargs.trust_remote_code"


@pytest.mark.parametrize(("fmt", "tool"), [("axolotl", "Axolotl"), ("llamafactory", "LLaMA-Factory"),
                                           ("llamafactory-v1", "LLaMA-Factory"),
                                           ("trainer", "the Trainer's script")])
def test_remote_code_loaded_through_an_auto_class_is_refused_by_name(tmp_path, fmt, tool):
    with pytest.raises(UnmodelledSetting) as info:
        _check(tmp_path, fmt, DEEPSEEK, trust_remote_code=True)
    assert str(info.value) == (
        f"trust_remote_code: true in '{tmp_path / 'train.yaml'}' is not modelled for {DEEPSEEK}: "
        f"{tool} loads {DEEPSEEK}'s own modeling_deepseek.py (its config.json auto_map, for "
        "AutoModelForCausalLM), not transformers' DeepseekV2ForCausalLM that autotune traces; set it false, "
        "or leave it out, to train transformers' DeepseekV2ForCausalLM")
    with pytest.raises(UnmodelledSetting, match=f"{tool} loads {PHI}'s own modeling_phi3.py .*Phi3For"):
        _check(tmp_path, fmt, PHI, trust_remote_code=True)


@pytest.mark.parametrize("fmt", ["axolotl", "llamafactory", "llamafactory-v1", "trainer", "trl-sft"])
def test_false_unset_or_a_checkpoint_without_auto_map_is_answered_as_before(tmp_path, fmt):
    assert _check(tmp_path, fmt, DEEPSEEK, trust_remote_code=False) == ()
    assert _check(tmp_path, fmt, DEEPSEEK) == ()
    assert _check(tmp_path, fmt, LLAMA, trust_remote_code=True) == ()


def test_trl_loads_the_architectures_class_and_says_so(tmp_path):
    # trl/trainer/utils.py create_model_from_path: getattr(transformers, config.architectures[0])
    for changes in ({"trust_remote_code": True}, {"model_init_kwargs": {"trust_remote_code": True}}):
        notes = _check(tmp_path, "trl-sft", DEEPSEEK, **changes)
        assert len(notes) == 1 and "TRL loads transformers' DeepseekV2ForCausalLM" in notes[0]


def test_the_model_given_over_the_config_is_the_one_checked(tmp_path):
    config = _config(tmp_path, "axolotl", LLAMA, trust_remote_code=True)
    request = replace(config.request, step=replace(config.request.step, model=PHI))
    with pytest.raises(UnmodelledSetting, match="modeling_phi3.py"):
        check_remote_code(config, request)


def test_a_local_config_json_with_its_own_auto_map_is_refused(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 128,
        "auto_map": {"AutoModelForCausalLM": "acme/code--modeling_acme.AcmeForCausalLM"}}))
    assert remote_module(resolve_model(str(model)), "AutoModelForCausalLM") == "acme/code's modeling_acme.py"
    with pytest.raises(UnmodelledSetting, match="'s own acme/code's modeling_acme.py .* LlamaForCausalLM"):
        _check(tmp_path, "axolotl", str(model), trust_remote_code=True)


def test_every_remote_code_fact_is_a_preset_whose_causal_lm_class_is_its_own_module():
    for name, auto_map in REMOTE_CODE.items():
        assert name in PRESETS, name
        assert auto_map["AutoModelForCausalLM"].startswith("modeling_"), name
        architecture = PRESETS[name]["architectures"][0]
        assert auto_map["AutoModelForCausalLM"].endswith("." + architecture), name


def test_the_axolotl_deepseek_fsdp_example_is_refused_with_exit_2(tmp_path, capsys):
    # examples/deepseek-v2/fft-fsdp-16b.yaml's keys that decide it
    path = write(tmp_path, {**AXOLOTL, "base_model": DEEPSEEK, "trust_remote_code": True}, "ds.yaml")
    code = main(["check", "--from-config", str(path), "--gpu", "H100-80GB", "--no-cache", "--workers", "1"])
    assert code == 2
    assert "Axolotl loads deepseek-ai/DeepSeek-V2-Lite's own modeling_deepseek.py" in capsys.readouterr().err


def test_an_accelerate_config_beside_the_training_config_keeps_its_trust_remote_code(tmp_path):
    train = write(tmp_path, {**TRAINER, "model_name_or_path": PHI, "trust_remote_code": True}, "train.yaml")
    launch = write(tmp_path, {"compute_environment": "LOCAL_MACHINE", "distributed_type": "NO",
                              "num_processes": 1, "mixed_precision": "bf16"}, "acc.yaml")
    config = read_training_configs([str(launch), str(train)])
    assert config.trust_remote_code == "trust_remote_code"
    with pytest.raises(UnmodelledSetting, match="the Trainer's script loads .*modeling_phi3.py"):
        check_remote_code(config, config.request)
