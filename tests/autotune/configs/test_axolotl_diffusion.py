"""Axolotl's DiffusionPlugin and its diffusion: block (configs/axolotl_diffusion.py), as
examples/llama-3/diffusion/sft-1b.yaml and pretrain-1b.yaml set them."""

from __future__ import annotations

import pytest
from configread import read

from autotune.configs.axolotl_diffusion import DIFFUSION_PLUGIN, GENERATION_NOTE, STEP_NOTE
from autotune.errors import InvalidInput, UnmodelledSetting

# examples/llama-3/diffusion/sft-1b.yaml's block (eps: 1e-3, which YAML 1.1 reads as a string)
BLOCK = {"noise_schedule": "cosine", "min_mask_ratio": 0.1, "max_mask_ratio": 0.9, "num_diffusion_steps": 128,
         "eps": "1e-3", "importance_weighting": True, "mask_token_id": 128002, "generate_samples": True,
         "generation_interval": 250}
# a LoRA step (the embeddings cast back to the weights' dtype) under sdpa, as the examples' attention
LORA = {"base_model": "meta-llama/Llama-3.2-1B", "sequence_len": 512, "micro_batch_size": 4, "bf16": True,
        "attn_implementation": "sdpa", "adapter": "lora", "lora_r": 16, "lora_alpha": 32,
        "lora_target_linear": True, "lora_mlp_kernel": False, "lora_qkv_kernel": False,
        "lora_o_kernel": False}
PLUGIN = {**LORA, "plugins": [DIFFUSION_PLUGIN], "diffusion": BLOCK}


def test_the_diffusion_plugin_is_the_diffusion_loss_with_its_block_read(tmp_path):
    plan = read(tmp_path, PLUGIN, "axolotl.yml")
    assert plan.loss == "diffusion" and plan.ignored == ()
    assert STEP_NOTE in plan.notes and GENERATION_NOTE in plan.notes
    assert any(note.startswith("diffusion.mask_token_id: 128002: a token of the tokenizer's")
               for note in plan.notes)
    assert any(note.startswith("diffusion.noise_schedule, diffusion.min_mask_ratio, "
                               "diffusion.max_mask_ratio, diffusion.num_diffusion_steps, diffusion.eps: "
                               "no effect on memory") for note in plan.notes)


def test_the_block_without_the_plugin_changes_nothing(tmp_path):
    plan = read(tmp_path, {**LORA, "diffusion": BLOCK}, "axolotl.yml")
    assert plan.request == read(tmp_path, LORA, "axolotl.yml").request
    assert any(note.startswith("diffusion: no effect without the DiffusionPlugin") for note in plan.notes)


def test_an_unknown_key_of_the_block_is_refused_by_name(tmp_path):
    with pytest.raises(UnmodelledSetting, match=r"^diffusion.mask_ratio: 0.5 in .* is not modelled: not a "
                                                r"key of the plugin's DiffusionConfig"):
        read(tmp_path, {**PLUGIN, "diffusion": {**BLOCK, "mask_ratio": 0.5}}, "axolotl.yml")


@pytest.mark.parametrize(("extra", "key"), [
    ({"attn_implementation": "flash_attention_2"}, "attn_implementation"),
    ({"plugins": ["axolotl.integrations.cut_cross_entropy.CutCrossEntropyPlugin", DIFFUSION_PLUGIN]},
     "cut_cross_entropy"),
    ({"plugins": ["axolotl.integrations.liger.LigerPlugin", DIFFUSION_PLUGIN],
      "liger_fused_linear_cross_entropy": True}, "liger_fused_linear_cross_entropy"),
])
def test_what_the_plugins_step_is_not_modelled_with_is_refused_by_name(tmp_path, extra, key):
    with pytest.raises(UnmodelledSetting, match=rf"^{key}: .* beside the DiffusionPlugin|^{key}: .*with the "
                                                r"DiffusionPlugin"):
        read(tmp_path, {**PLUGIN, **extra}, "axolotl.yml")


def test_mask_ratios_axolotl_refuses_are_refused(tmp_path):
    with pytest.raises(InvalidInput, match="min_mask_ratio must be ≤ max_mask_ratio"):
        read(tmp_path, {**PLUGIN, "diffusion": {**BLOCK, "min_mask_ratio": 0.9, "max_mask_ratio": 0.1}},
             "axolotl.yml")
