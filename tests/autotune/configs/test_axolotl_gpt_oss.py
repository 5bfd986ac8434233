"""Axolotl's gpt-oss examples (examples/gpt-oss/*.yaml): model_quantization_config Mxfp4Config
dequantized at load (the model traced), experimental_skip_move_to_device (load-time placement only),
use_kernels' hub kernels emulated (workload/hub_kernels.py, megablocks.py): answered without autocast
(FSDP2's mixed-precision policy), refused under it, where MegaBlocks' own scatter raises."""

from __future__ import annotations

from dataclasses import replace

import pytest
from configread import view, write

from autotune.cli import main
from autotune.configs import read_training_config
from autotune.configs.axolotl import check_patched_model
from autotune.errors import InvalidInput, UnmodelledSetting

# examples/gpt-oss/gpt-oss-20b-sft-lora-singlegpu.yaml, its keys that reach the reader (the plugin,
# datasets and logging keys left out)
LORA = {"base_model": "openai/gpt-oss-20b", "use_kernels": True, "model_quantization_config": "Mxfp4Config",
        "model_quantization_config_kwargs": {"dequantize": True}, "experimental_skip_move_to_device": True,
        "datasets": [{"path": "HuggingFaceH4/Multilingual-Thinking", "type": "chat_template"}],
        "sequence_len": 4096, "sample_packing": True, "adapter": "lora", "lora_r": 8, "lora_alpha": 16,
        "lora_dropout": 0.0, "lora_target_linear": True, "gradient_accumulation_steps": 8,
        "micro_batch_size": 1, "optimizer": "adamw_torch_8bit", "bf16": True, "tf32": True,
        "attn_implementation": "kernels-community/vllm-flash-attn3", "gradient_checkpointing": True,
        "activation_offloading": True}


def _read(tmp_path, data, model="openai/gpt-oss-20b"):
    """The config read, then checked against ``model`` as ``check`` does once the model is known."""
    config = read_training_config(write(tmp_path, data, "gpt-oss.yaml"))
    check_patched_model(config, replace(config.request, step=replace(config.request.step, model=model)))
    return view(config)


def test_the_mxfp4_checkpoint_dequantized_at_load_is_the_model_traced(tmp_path):
    config = _read(tmp_path, {**LORA, "use_kernels": False})
    assert config.adapter.method == "lora" and config.dtype == "bfloat16"
    assert any(n.startswith("model_quantization_config: Mxfp4Config(dequantize=True): the checkpoint's MXFP4 "
                            "experts dequantized at load") for n in config.notes)
    assert any(n.startswith("experimental_skip_move_to_device: true: where the model is placed")
               for n in config.notes)


def test_use_kernels_on_gpt_oss_runs_the_emulated_hub_kernels(tmp_path):
    config = _read(tmp_path, LORA)
    assert config.request.step.use_kernels is True
    assert any(n.startswith("use_kernels: transformers' kernelize swaps kernels-community/liger-kernels "
                            "LigerRMSNorm in") and "kernels-community/megablocks MegaBlocksMoeMLP" in n
               for n in config.notes)
    with pytest.raises(UnmodelledSetting, match=r"^use_kernels: true in .* \(Axolotl passes it to "
                       r"from_pretrained, loaders/model.py\) is not modelled for model type llama: "
                       r"transformers' kernelize swaps hub kernels in .* read for gemma4, .*gpt_oss, "
                       r".* only$"):
        _read(tmp_path, {**LORA, "model_quantization_config": None}, model="tiny-llama")
    assert _read(tmp_path, {**LORA, "use_kernels": False}).request.step.use_kernels is None


def test_mxfp4_without_dequantize_is_refused_unless_use_kernels_dequantizes_it(tmp_path):
    quantized = {**LORA, "use_kernels": False, "model_quantization_config_kwargs": None}
    with pytest.raises(UnmodelledSetting, match="^model_quantization_config: 'Mxfp4Config' .* without "
                       "dequantize: true the experts stay MXFP4"):
        _read(tmp_path, quantized)
    # quantizer_mxfp4.py: use_kernels on a CUDA card dequantizes
    config = read_training_config(write(tmp_path, {**quantized, "use_kernels": True}, "gpt-oss.yaml"))
    assert any("transformers dequantizes on a CUDA card" in n for n in config.notes)


def test_mxfp4_is_refused_for_a_model_other_than_gpt_oss(tmp_path):
    data = {**LORA, "use_kernels": False}
    with pytest.raises(UnmodelledSetting, match="^model_quantization_config: Mxfp4Config .* not modelled for "
                       "tiny-llama .*swaps GptOssMLP only"):
        _read(tmp_path, data, model="tiny-llama")


@pytest.mark.parametrize(("change", "error", "message"), [
    ({"model_quantization_config": "FineGrainedFP8Config"}, UnmodelledSetting,
     "^model_quantization_config: 'FineGrainedFP8Config' .* fp8 weights"),
    ({"model_quantization_config_kwargs": {"dequantize": True, "group_size": 32}}, UnmodelledSetting,
     "^model_quantization_config_kwargs.group_size: 32 .* Mxfp4Config's keywords read are dequantize"),
    ({"adapter": "qlora", "load_in_4bit": True}, InvalidInput,
     "^model_quantization_config with load_in_4bit: true .* check_model_quantization_config_vs_bnb"),
    ({"fsdp_version": 2, "fsdp_config": {"cpu_ram_efficient_loading": True}}, InvalidInput,
     "^model_quantization_config: Mxfp4Config with fsdp_config.cpu_ram_efficient_loading .* "
     "check_gpt_oss_fsdp_loading"),
    ({"experimental_skip_move_to_device": False, "fsdp_version": 2,
      "fsdp_config": {"transformer_layer_cls_to_wrap": "GptOssDecoderLayer"}}, UnmodelledSetting,
     "^experimental_skip_move_to_device: False .* before it is sharded"),
])
def test_what_is_not_modelled_or_axolotl_refuses_is_refused_by_name(tmp_path, change, error, message):
    with pytest.raises(error, match=message):
        _read(tmp_path, {**LORA, "use_kernels": False, **change})


def test_skip_move_to_device_false_on_one_gpu_is_the_same_step(tmp_path):
    config = _read(tmp_path, {**LORA, "use_kernels": False, "experimental_skip_move_to_device": False})
    assert any(n.startswith("experimental_skip_move_to_device: false") for n in config.notes)


def test_the_lora_example_without_use_kernels_is_answered_on_tiny_gpt_oss(tmp_path, capsys):
    # Axolotl's fused LoRA kernels, on by default, are not emulated for gpt_oss (workload/lora_kernels.py)
    off = {key: False for key in ("lora_mlp_kernel", "lora_qkv_kernel", "lora_o_kernel")}
    path = write(tmp_path, {**LORA, **off, "use_kernels": False, "sequence_len": 64}, "gpt-oss.yaml")
    code = main(["check", "tiny-gpt_oss", "--from-config", str(path), "--gpu", "H100-80GB", "--no-cache",
                 "--workers", "1"])
    out = capsys.readouterr()
    assert code in (0, 1), out.err
    assert "attention kernels-community/vllm-flash-attn3" in out.out
    assert "note: model_quantization_config: Mxfp4Config(dequantize=True)" in out.out


# examples/gpt-oss/gpt-oss-20b-fft-fsdp2-offload.yaml's step keys
FSDP2_OFFLOAD = {**{k: v for k, v in LORA.items() if not k.startswith("lora_") and k != "adapter"},
                 "optimizer": "adamw_torch_fused", "gradient_accumulation_steps": 2, "fsdp_version": 2,
                 "fsdp_config": {"offload_params": True, "state_dict_type": "SHARDED_STATE_DICT",
                                 "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
                                 "transformer_layer_cls_to_wrap": "GptOssDecoderLayer",
                                 "reshard_after_forward": True}}


def test_the_fsdp2_example_with_use_kernels_is_answered_on_tiny_gpt_oss(tmp_path, capsys):
    # FSDP2 casts by its mixed-precision policy, no autocast: MegaBlocks' router scatter runs
    path = write(tmp_path, {**FSDP2_OFFLOAD, "sequence_len": 64}, "gpt-oss.yaml")
    code = main(["check", "tiny-gpt_oss", "--from-config", str(path), "--gpu", "H100-80GB", "--gpus", "2",
                 "--no-cache", "--workers", "1"])
    out = capsys.readouterr()
    assert code in (0, 1), out.err
    assert "note: use_kernels: transformers' kernelize swaps" in out.out


def test_the_lora_example_with_use_kernels_under_autocast_is_refused(tmp_path, capsys):
    off = {key: False for key in ("lora_mlp_kernel", "lora_qkv_kernel", "lora_o_kernel")}
    path = write(tmp_path, {**LORA, **off, "sequence_len": 64}, "gpt-oss.yaml")
    code = main(["check", "tiny-gpt_oss", "--from-config", str(path), "--gpu", "H100-80GB", "--no-cache",
                 "--workers", "1"])
    out = capsys.readouterr()
    assert code == 2
    assert "MegaBlocksMoeMLP does not run this step" in out.err and "bf16: full" in out.err
