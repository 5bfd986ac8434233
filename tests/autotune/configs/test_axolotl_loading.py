"""Axolotl's keys about how the model is built and launched (configs/axolotl_loading.py): use_ray
(examples/llama-3/lora-1b-ray.yml), reinit_weights (examples/qwen2/adamw-pretrain-fsdp2.yaml),
freeze_mm_modules (examples/gemma4/e2b-vision-lora.yaml), gemma4_hybrid_attn_impl
(examples/gemma4/31b-qlora.yaml) and test_value, which Axolotl's schema drops."""

from __future__ import annotations

from dataclasses import replace

import pytest
from configread import view, write

from autotune.configs import read_training_config
from autotune.configs.axolotl import check_patched_model
from autotune.configs.axolotl_loading import _language_model_only
from autotune.errors import InvalidInput, JobFails, UnmodelledSetting

BASE = {"base_model": "meta-llama/Llama-3.2-1B", "sequence_len": 2048, "micro_batch_size": 2,
        "gradient_accumulation_steps": 2, "bf16": True, "attn_implementation": "flash_attention_2",
        "gradient_checkpointing": True, "optimizer": "adamw_torch_fused"}
LORA = {**BASE, "adapter": "lora", "lora_r": 16, "lora_alpha": 32,
        "lora_target_modules": ["q_proj", "v_proj"],
        "lora_mlp_kernel": False, "lora_qkv_kernel": False, "lora_o_kernel": False}


def _config(tmp_path, data):
    return read_training_config(write(tmp_path, data, "axolotl.yml"))


def _read(tmp_path, data):
    return view(_config(tmp_path, data))


def _checked(tmp_path, data, model):
    """Read, then checked against ``model`` as ``check`` does once the model is known."""
    config = _config(tmp_path, data)
    check_patched_model(config, replace(config.request, step=replace(config.request.step, model=model)))
    return view(config)


def test_test_value_is_dropped_by_axolotl_s_schema(tmp_path):
    assert _read(tmp_path, {**LORA, "test_value": True}).request == _read(tmp_path, LORA).request


def test_ray_runs_the_job_on_its_workers_one_gpu_each(tmp_path):
    plan = _read(tmp_path, {**LORA, "use_ray": True, "ray_num_workers": 4, "ray_run_name": "run"})
    assert plan.request == replace(_read(tmp_path, LORA).request,
                                   step=replace(_read(tmp_path, LORA).request.step, gpus=4))
    assert any(n.startswith("use_ray: true: Ray Train's TorchTrainer runs 4 worker(s)") for n in plan.notes)
    assert _read(tmp_path, {**LORA, "use_ray": True}).request.step.gpus == 1  # RayConfig's default


def test_ray_keys_without_use_ray_change_nothing(tmp_path):
    plan = _read(tmp_path, {**LORA, "use_ray": False, "ray_num_workers": 4})
    assert plan.request == _read(tmp_path, LORA).request


def test_ray_with_more_than_one_gpu_per_worker_is_refused(tmp_path):
    with pytest.raises(UnmodelledSetting, match="resources_per_worker.*one GPU per worker"):
        _read(tmp_path, {**LORA, "use_ray": True, "resources_per_worker": {"GPU": 2}})
    with pytest.raises(InvalidInput, match="ray_num_workers"):
        _read(tmp_path, {**LORA, "use_ray": True, "ray_num_workers": 0})


def test_reinit_weights_is_the_same_step_in_the_checkpoint_s_dtype(tmp_path):
    data = {**BASE, "base_model": "Qwen/Qwen2.5-0.5B", "reinit_weights": True}
    plan = _checked(tmp_path, data, "Qwen/Qwen2.5-0.5B")  # config.json: torch_dtype bfloat16
    assert plan.request == _read(tmp_path, {**BASE, "base_model": "Qwen/Qwen2.5-0.5B"}).request
    assert any(n.startswith("reinit_weights: true: random weights") for n in plan.notes)


def test_reinit_weights_where_the_checkpoint_s_dtype_differs_is_refused(tmp_path):
    # tiny-llama's config sets no dtype: from_config builds float32 weights, not bf16's bfloat16
    with pytest.raises(UnmodelledSetting, match=r"reinit_weights.*checkpoint config's dtype \(float32"):
        _checked(tmp_path, {**BASE, "base_model": "tiny-llama", "reinit_weights": True}, "tiny-llama")


def test_reinit_weights_of_a_quantized_base_is_refused(tmp_path):
    with pytest.raises(UnmodelledSetting, match="reinit_weights.*built unquantized"):
        _read(tmp_path, {**LORA, "adapter": "qlora", "load_in_4bit": True, "reinit_weights": True})


def test_freeze_mm_modules_beside_language_model_lora_changes_nothing(tmp_path):
    target = r"model.language_model.layers.[\d]+.(_checkpoint_wrapped_module.)?(mlp|self_attn).(up|q)_proj"
    data = {**LORA, "lora_target_modules": target}
    plan = _read(tmp_path, {**data, "freeze_mm_modules": True})
    assert plan.request == _read(tmp_path, data).request
    assert any(n.startswith("freeze_mm_modules: true: freezes the vision/audio towers") for n in plan.notes)


@pytest.mark.parametrize("extra", [
    {"lora_target_modules": ["q_proj", "v_proj"]},  # may reach the towers' attention
    {"lora_target_linear": True},
    {"lora_target_modules": "model.language_model.layers.0.mlp.up_proj", "lora_modules_to_save": ["lm_head"]},
])
def test_freeze_mm_modules_that_may_freeze_adapters_is_refused(tmp_path, extra):
    with pytest.raises(UnmodelledSetting, match="freeze_mm_modules.*adapters frozen"):
        _read(tmp_path, {**LORA, **extra, "freeze_mm_modules": True})


def test_freeze_mm_modules_in_a_full_fine_tune_is_refused(tmp_path):
    with pytest.raises(UnmodelledSetting, match="freeze_mm_modules.*full fine-tune"):
        _read(tmp_path, {**BASE, "freeze_mm_modules": True})
    assert _read(tmp_path, {**BASE, "freeze_mm_modules": False}).request == _read(tmp_path, BASE).request


@pytest.mark.parametrize(("pattern", "only"), [
    (r"model.language_model.layers.[\d]+.mlp.up_proj", True),
    (r"model\.language_model\.layers\.0\.mlp\.up_proj", True),
    (r"model.vision_tower.language_model.x", False),
    (r".*language_model.*", False),
    (r"model.layers.[\d]+.mlp.up_proj", False),
    ("language_model", False),
])
def test_language_model_only_targets(pattern, only):
    assert _language_model_only(pattern) is only


def test_gemma4_hybrid_attention_sets_the_two_attentions_packed_as_the_batches(tmp_path):
    packed = _read(tmp_path, {**LORA, "gemma4_hybrid_attn_impl": True, "sample_packing": True})
    assert packed.request.step.gemma4_hybrid_attn == "packed"
    assert packed.request.step.attn == "flash_attention_2"
    unpacked = _read(tmp_path, {**LORA, "gemma4_hybrid_attn_impl": True})
    assert unpacked.request.step.gemma4_hybrid_attn == "unpacked"
    off = _read(tmp_path, {**LORA, "gemma4_hybrid_attn_impl": False})
    assert off.request == _read(tmp_path, LORA).request and off.request.step.gemma4_hybrid_attn is None


def test_gemma4_hybrid_attention_defaults_the_attention_as_axolotl_s_schema(tmp_path):
    # utils/schemas/config.py normalize_attn_implementation: flash_attention_2 where none is given
    plan = _read(tmp_path, {**{k: v for k, v in LORA.items() if k != "attn_implementation"},
                            "gemma4_hybrid_attn_impl": True})
    assert plan.request.step.attn == "flash_attention_2"
    assert any(note.startswith("attn_implementation: not set: flash_attention_2") for note in plan.notes)


def test_gemma4_hybrid_attention_with_another_attention_fails_as_axolotl_refuses_it(tmp_path):
    with pytest.raises(JobFails, match="requires attn_implementation=flash_attention_2"):
        _read(tmp_path, {**LORA, "attn_implementation": "sdpa", "gemma4_hybrid_attn_impl": True})
    with pytest.raises(UnmodelledSetting, match="gemma4_hybrid_attn_impl.*with attention sdpa"):
        _read(tmp_path, {**{k: v for k, v in LORA.items() if k != "attn_implementation"},
                         "sdp_attention": True, "gemma4_hybrid_attn_impl": True})


def test_the_large_head_triton_kernel_is_refused_by_name(tmp_path):
    hybrid = {**LORA, "gemma4_hybrid_attn_impl": True}
    with pytest.raises(UnmodelledSetting, match="large_head_attention.*flash_d512"):
        _read(tmp_path, {**hybrid, "large_head_attention": "auto"})
    with pytest.raises(UnmodelledSetting, match="flash_attn_d512"):
        _read(tmp_path, {**hybrid, "flash_attn_d512": True})
    with pytest.raises(InvalidInput, match="large_head_attention.*sdpa, auto, triton_flash"):
        _read(tmp_path, {**hybrid, "large_head_attention": "fast"})
    sdpa = _read(tmp_path, {**hybrid, "large_head_attention": "sdpa"})
    assert sdpa.request == _read(tmp_path, hybrid).request


def test_cls_model_config_naming_the_models_config_class_changes_nothing(tmp_path):
    # examples/eaft/eaft-example.yml: Gemma3TextConfig for google/gemma-3-1b-it, whose config it is
    plan = _checked(tmp_path, {**BASE, "cls_model_config": "LlamaConfig"}, "meta-llama/Llama-3.2-1B")
    assert plan.request.step == _read(tmp_path, BASE).request.step and plan.ignored == ()
    assert any(note.startswith("cls_model_config: LlamaConfig: the model's config built with it")
               for note in plan.notes)


def test_cls_model_config_naming_another_class_is_refused_by_name(tmp_path):
    with pytest.raises(UnmodelledSetting, match=r"^cls_model_config: 'MistralConfig' in .* is not modelled: "
                                                r"the model's config class is LlamaConfig"):
        _checked(tmp_path, {**BASE, "cls_model_config": "MistralConfig"}, "meta-llama/Llama-3.2-1B")
    with pytest.raises(InvalidInput, match="cls_model_config 'NoSuchConfig' .* transformers has no such"):
        _read(tmp_path, {**BASE, "cls_model_config": "NoSuchConfig"})
