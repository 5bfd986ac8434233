"""Axolotl's keys that act during training (configs/axolotl_callbacks.py): relora
(examples/llama-2/relora.yml), LISA's lisa_* (examples/llama-2/lisa.yml) and flash_attn_fuse_mlp
(examples/llama-2/fft_optimized.yml)."""

from __future__ import annotations

import pytest
from configread import view, write

from autotune.configs import read_training_config
from autotune.configs.axolotl_callbacks import (
    FUSE_MLP_NOTE,
    LISA_REFUSED,
    RELORA_4BIT,
    RELORA_8BIT,
    RELORA_MERGE,
)
from autotune.errors import InvalidInput, UnmodelledSetting

BASE = {"base_model": "meta-llama/Llama-3.2-1B", "sequence_len": 2048, "micro_batch_size": 2,
        "gradient_accumulation_steps": 2, "bf16": True, "attn_implementation": "flash_attention_2",
        "gradient_checkpointing": True, "optimizer": "adamw_torch_fused"}
LORA = {**BASE, "adapter": "lora", "lora_r": 16, "lora_alpha": 32,
        "lora_target_modules": ["q_proj", "v_proj"],
        "lora_mlp_kernel": False, "lora_qkv_kernel": False, "lora_o_kernel": False}
QLORA = {**LORA, "adapter": "qlora", "load_in_4bit": True}
LORA_8BIT = {**LORA, "load_in_8bit": True}
RELORA = {"relora": True, "jagged_restart_steps": 150, "relora_prune_ratio": 0.9}


def _read(tmp_path, data):
    return view(read_training_config(write(tmp_path, data, "axolotl.yml")))


def test_relora_on_a_4bit_base_is_refused_as_the_run_that_fails(tmp_path):
    with pytest.raises(InvalidInput) as error:
        _read(tmp_path, {**QLORA, **RELORA})
    assert not isinstance(error.value, UnmodelledSetting)
    assert str(error.value).endswith(f"with a 4-bit base (adapter: qlora) in '{tmp_path}/axolotl.yml': "
                                     f"{RELORA_4BIT}")


@pytest.mark.parametrize(("data", "why"), [
    ({**LORA_8BIT, **RELORA}, RELORA_8BIT),
    ({**LORA_8BIT, **RELORA, "relora_cpu_offload": True}, RELORA_8BIT),
    ({**LORA, **RELORA}, RELORA_MERGE),
])
def test_relora_merge_is_refused_by_name(tmp_path, data, why):
    with pytest.raises(UnmodelledSetting) as error:
        _read(tmp_path, data)
    assert str(error.value) == f"relora: True in '{tmp_path}/axolotl.yml' is not modelled: {why}"


@pytest.mark.parametrize(("data", "message"), [
    ({**LORA, "relora": True}, "jagged_restart_steps must be set to use ReLoRA"),
    ({**BASE, **RELORA}, "cfg.adapter must support ReLoRA to use ReLoRA restart semantics"),
])
def test_relora_as_axolotl_refuses_it(tmp_path, data, message):
    with pytest.raises(InvalidInput, match=message):
        _read(tmp_path, data)


def test_relora_false_changes_nothing(tmp_path):
    assert _read(tmp_path, {**QLORA, "relora": False, "relora_cpu_offload": False}).request == _read(
        tmp_path, QLORA).request


def test_lisa_is_refused_by_name_where_its_callback_runs(tmp_path):
    with pytest.raises(UnmodelledSetting) as error:
        _read(tmp_path, {**BASE, "lisa_n_layers": 4, "lisa_step_interval": 20,
                         "lisa_layers_attribute": "model.layers"})
    assert str(error.value) == f"lisa_n_layers: 4 in '{tmp_path}/axolotl.yml' is not modelled: {LISA_REFUSED}"


def test_lisa_keys_without_the_callback_change_nothing(tmp_path):
    # core/builders/causal.py: the callback needs lisa_step_interval and lisa_n_layers both
    plan = _read(tmp_path, {**BASE, "lisa_n_layers": 4, "lisa_step_interval": None,
                            "lisa_layers_attribute": "model.layers"})
    assert plan.request == _read(tmp_path, BASE).request and plan.ignored == ()


def test_fuse_mlp_without_an_adapter_is_noted_as_no_effect(tmp_path):
    plan = _read(tmp_path, {**BASE, "flash_attn_fuse_mlp": True})
    assert plan.request == _read(tmp_path, BASE).request
    assert FUSE_MLP_NOTE in plan.notes


@pytest.mark.parametrize("data", [LORA, QLORA])
def test_fuse_mlp_with_an_adapter_is_refused_as_axolotl_refuses_it(tmp_path, data):
    with pytest.raises(InvalidInput, match=r"Axolotl refuses it \(schemas/validation.py check_fused_lora: "
                                           "\"Fused modules are not supported with LoRA/QLoRA\"\\)"):
        _read(tmp_path, {**data, "flash_attn_fuse_mlp": True})


def test_relora_false_with_the_jagged_schedule_changes_nothing(tmp_path):
    # jagged_restart_*: the learning-rate schedule's restarts (utils/schedulers.py JaggedLRRestartScheduler)
    plan = _read(tmp_path, {**QLORA, "relora": False, "jagged_restart_steps": 150,
                            "jagged_restart_warmup_steps": 10, "jagged_restart_anneal_steps": False})
    assert plan.request == _read(tmp_path, QLORA).request and plan.ignored == ()
