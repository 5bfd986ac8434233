"""Axolotl's Llama 4 examples (examples/llama-4): llama4_linearized_experts, a base_model saved in
bitsandbytes nf4, and model_type naming the vision-language class (configs/axolotl.py)."""

from __future__ import annotations

import pytest
import yaml

from autotune.configs import read_training_config
from autotune.errors import InvalidInput, UnmodelledSetting
from autotune.request import resolve

# The keys of examples/llama-4/scout-qlora-single-h100-flex.yaml that shape the model, on tiny-llama4.
SCOUT = {"base_model": "tiny-llama4", "model_type": "Llama4ForConditionalGeneration",
         "llama4_linearized_experts": True, "load_in_4bit": True, "adapter": "qlora", "lora_r": 32,
         "lora_alpha": 64, "lora_target_modules": ["self_attn.q_proj", "shared_expert.gate_proj"],
         "sequence_len": 256, "micro_batch_size": 1, "gradient_accumulation_steps": 1, "bf16": True,
         "optimizer": "adamw_torch_4bit", "gradient_checkpointing": True,
         # Axolotl turns them on where unset, and patch_self_attn_lora fails on Llama4TextAttention
         "lora_mlp_kernel": False, "lora_qkv_kernel": False, "lora_o_kernel": False}
QUANTS = "axolotl-quants/Llama-4-Scout-17B-16E-Linearized-bnb-nf4-bf16"


def read(tmp_path, data):
    path = tmp_path / "axolotl.yml"
    path.write_text(yaml.safe_dump(data))
    return read_training_config(path)


def test_linearized_experts_build_the_model_with_axolotls_experts(tmp_path):
    config = read(tmp_path, SCOUT)
    assert config.request.step.llama4_linearized_experts is True
    assert any(note.startswith("llama4_linearized_experts: Axolotl's Llama 4 experts as per-expert nn.Linear")
               for note in config.notes)
    assert resolve(config.request, make_target=False).workload.model.linearized_experts
    plain = read(tmp_path, {**SCOUT, "llama4_linearized_experts": False})
    assert not resolve(plain.request, make_target=False).workload.model.linearized_experts


def test_linearized_experts_of_another_model_are_refused_by_name(tmp_path):
    config = read(tmp_path, {**SCOUT, "base_model": "tiny-mixtral", "model_type": "AutoModelForCausalLM"})
    with pytest.raises(InvalidInput, match="llama4_linearized_experts: tiny-mixtral is model type 'mixtral'"):
        resolve(config.request, make_target=False)


def test_model_type_naming_the_vision_language_class_trains_its_text(tmp_path):
    config = read(tmp_path, {**SCOUT, "base_model": QUANTS})
    step = config.request.step
    assert (step.task, step.images_per_sample) == ("image-text-to-text", 0)
    loads = "model_type: Llama4ForConditionalGeneration: Axolotl loads the model with that class"
    assert any(note.startswith(loads) for note in config.notes)
    causal = read(tmp_path, {**SCOUT, "base_model": QUANTS, "model_type": "AutoModelForCausalLM"})
    assert causal.request.step.task == "causal-lm"


def test_a_base_saved_in_nf4_is_a_4_bit_base(tmp_path):
    config = read(tmp_path, {**SCOUT, "base_model": QUANTS})
    assert any(note.startswith(f"base_model: {QUANTS}: saved in bitsandbytes nf4") for note in config.notes)
    assert config.request.step.adapter.base_bits == 4
    lora = {key: value for key, value in SCOUT.items() if key != "load_in_4bit"}
    with pytest.raises(UnmodelledSetting, match="base_model"):
        read(tmp_path, {**lora, "base_model": QUANTS, "adapter": "lora"})
