"""Axolotl's quantize_moe_experts read from a config: the adapter's experts quantized on load in
the base's bits, under the conditions of Axolotl's schemas/config.py check_quantize_moe_experts."""

from __future__ import annotations

import pytest
from configread import read

from autotune.errors import InvalidInput

# examples/glm47-flash/qlora.yaml, its keys that reach the reader
GLM_QLORA = {"base_model": "zai-org/GLM-4.7-Flash", "load_in_4bit": True, "quantize_moe_experts": True,
             "adapter": "qlora", "sequence_len": 2048, "sample_packing": True, "lora_r": 32, "lora_alpha": 16,
             "lora_dropout": 0, "lora_target_modules": ["q_proj", "v_proj", "k_proj", "o_proj"],
             "lora_mlp_kernel": False, "lora_qkv_kernel": False, "lora_o_kernel": False,
             "gradient_accumulation_steps": 4, "micro_batch_size": 2, "optimizer": "adamw_torch_8bit",
             "bf16": True, "gradient_checkpointing": True, "attn_implementation": "flash_attention_2"}


def test_a_4bit_base_quantizes_its_experts_in_4_bits(tmp_path):
    config = read(tmp_path, GLM_QLORA, "qlora.yaml")
    assert config.adapter.method == "qlora" and config.adapter.quantize_experts
    assert "experts quantized on load" in config.adapter.label()
    assert any(n.startswith("quantize_moe_experts: the experts' 3D weights quantized on load to 4 bits")
               for n in config.notes)


def test_an_8bit_base_quantizes_them_in_8_bits_dequantized_to_float32(tmp_path):
    data = {**GLM_QLORA, "load_in_4bit": False, "load_in_8bit": True, "adapter": "lora"}
    config = read(tmp_path, data, "lora.yaml")
    assert config.adapter.method == "lora_8bit" and config.adapter.quantize_experts
    assert any("to 8 bits" in n and "float32" in n for n in config.notes)


def test_false_leaves_the_experts_in_16_bits(tmp_path):
    config = read(tmp_path, {**GLM_QLORA, "quantize_moe_experts": False}, "qlora.yaml")
    assert not config.adapter.quantize_experts


NO_BASE = "^quantize_moe_experts in .* without a 4- or 8-bit base"


@pytest.mark.parametrize(("change", "message"), [
    ({"adapter": None, "load_in_4bit": False}, NO_BASE),
    ({"adapter": "lora", "load_in_4bit": False}, NO_BASE),
    ({"lora_target_linear": True, "lora_target_modules": None},
     "^quantize_moe_experts with lora_target_linear"),
])
def test_axolotl_s_refusals_are_errors_naming_the_key(tmp_path, change, message):
    with pytest.raises(InvalidInput, match=message):
        read(tmp_path, {**GLM_QLORA, **change}, "qlora.yaml")
