"""Axolotl's vision-language configs (configs/axolotl.py ``_axolotl_multimodal``): processor_type and
the image keys read as Axolotl reads them, into an image-text-to-text check."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from autotune.cli import main
from autotune.configs import read_training_config
from autotune.errors import InvalidInput, UnmodelledSetting

EXAMPLES = Path(__file__).parents[3] / "examples"

# The keys Axolotl's VLM examples set (examples/qwen2-vl/lora-7b.yaml), on a tiny Qwen2-VL.
VLM = {"base_model": "tiny-qwen2_vl", "processor_type": "AutoProcessor", "skip_prepare_dataset": True,
       "remove_unused_columns": False, "sample_packing": False, "chat_template": "qwen2_vl",
       "datasets": [{"path": "HuggingFaceH4/llava-instruct-mix-vsft", "type": "chat_template"}],
       "sequence_len": 512, "micro_batch_size": 2, "gradient_accumulation_steps": 4, "bf16": True,
       "adapter": "lora", "lora_r": 8, "lora_alpha": 16, "lora_dropout": 0.05,
       "lora_target_modules": r"model.language_model.layers.[\d]+.(mlp|self_attn).(up|down|gate|q|v)_proj",
       "lora_mlp_kernel": False, "lora_qkv_kernel": False, "lora_o_kernel": False,
       "gradient_checkpointing": True, "attn_implementation": "flash_attention_2"}


def read(tmp_path, data, name="axolotl.yml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return read_training_config(path)


def test_processor_type_makes_an_image_text_to_text_step(tmp_path):
    config = read(tmp_path, VLM)
    step = config.request.step
    assert step.task == "image-text-to-text"
    assert (step.images_per_sample, step.image_size) == (None, None)  # autotune's defaults: 1, 640x480
    assert any(note.startswith("processor_type: AutoProcessor: Axolotl trains it as a vision-language model")
               for note in config.notes)
    assert any("one image per sample" in note for note in config.notes)
    assert config.ignored == ()  # skip_prepare_dataset, remove_unused_columns: no effect on memory


@pytest.mark.parametrize(("value", "size", "said"), [
    (448, "448x448", "padded to a 448x448 square"),
    ([640, 360], "640x360", "resized to 640x360 (width x height"),
])
def test_image_size_is_read_as_axolotl_applies_it(tmp_path, value, size, said):
    config = read(tmp_path, {**VLM, "image_size": value, "image_resize_algorithm": "bicubic"})
    assert config.request.step.image_size == size
    assert any(said in note for note in config.notes)
    assert any(note.startswith("image_resize_algorithm: bicubic") for note in config.notes)


def test_a_vlm_base_model_without_processor_type_trains_text_only(tmp_path):
    # normalize_config: is_multimodal from the model type (transformers' image-text-to-text mapping),
    # so the whole checkpoint is loaded; without processor_type no processor prepares the data and
    # the collator is a text one (packing allowed): a text-only step of the VLM.
    data = {key: value for key, value in VLM.items() if key != "processor_type"}
    config = read(tmp_path, {**data, "base_model": "Qwen/Qwen2-VL-7B-Instruct", "sample_packing": True})
    assert (config.request.step.task, config.request.step.images_per_sample) == ("image-text-to-text", 0)
    assert any("without processor_type" in note and "text-only step" in note for note in config.notes)
    assert read(tmp_path, {**data, "base_model": "Qwen/Qwen2.5-0.5B"}).request.step.task == "causal-lm"


def test_sample_packing_with_images_is_refused_as_axolotl_refuses_it(tmp_path):
    with pytest.raises(InvalidInput, match="Packing is currently not supported"):
        read(tmp_path, {**VLM, "sample_packing": True})


@pytest.mark.parametrize("processor", ["VoxtralProcessor", "Gemma3nProcessor"])
def test_audio_processors_are_refused_by_name(tmp_path, processor):
    with pytest.raises(UnmodelledSetting, match=f"processor_type: '{processor}'.*audio inputs"):
        read(tmp_path, {**VLM, "processor_type": processor})


def test_another_processor_config_is_refused(tmp_path):
    with pytest.raises(UnmodelledSetting, match="processor_config"):
        read(tmp_path, {**VLM, "processor_config": "someone/other-processor"})


def test_cut_cross_entropy_over_a_vlm_is_the_cce_loss(tmp_path):
    # CutCrossEntropy patches the VLMs' forward (its README lists llava, mistral3, qwen2_vl...): the
    # base model's hidden states and the head's weight to its kernels, as on a causal LM.
    data = {**VLM, "plugins": ["axolotl.integrations.cut_cross_entropy.CutCrossEntropyPlugin"]}
    config = read(tmp_path, data)
    assert (config.request.step.task, config.request.step.loss) == ("image-text-to-text", "cce")


def test_the_example_config_is_read():
    config = read_training_config(EXAMPLES / "axolotl_qwen2_vl_lora.yml")
    request = config.request
    assert (request.step.model, request.step.task, request.step.image_size) == (
        "Qwen/Qwen2-VL-7B-Instruct", "image-text-to-text", "448x448")
    assert (request.seq_len, request.batch_size, request.mode) == (4096, 2, "bf16+ckpt")
    assert request.step.adapter is not None and request.step.adapter.target_pattern is not None


def test_check_answers_an_axolotl_vlm_config_and_says_its_images(tmp_path, capsys):
    path = tmp_path / "qwen2-vl-lora.yml"
    path.write_text(yaml.safe_dump({**VLM, "image_size": 224}))
    code = main(["check", "--from-config", str(path), "--gpu-memory", "4GiB", "--json", "--no-cache"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0 and doc["fits"] is True
    assert (doc["task"], doc["seq_len"], doc["batch_size"], doc["attn"]) == (
        "image-text-to-text", 512, 2, "flash_attention_2")
    assert doc["images"]["per_sample"] == 1 and doc["images"]["size"] == [224, 224]
    assert doc["images"]["tokens"] == 64  # (224/14)**2 / 2**2
    assert "images: 1 image per sample, 224x224" in doc["message"]
    assert doc["adapter"]["method"] == "lora"


def test_axolotls_lora_kernels_on_qwen2_vl_are_refused_as_axolotl_fails(tmp_path, capsys):
    # check_auto_enable_lora_kernels turns them on; get_attention_cls_from_config then finds no
    # Qwen2VlAttention (qwen2_vl is in no causal-LM mapping), and Axolotl raises.
    data = {key: value for key, value in VLM.items() if not key.endswith("_kernel")}
    path = tmp_path / "kernels.yml"
    path.write_text(yaml.safe_dump(data))
    assert main(["check", "--from-config", str(path), "--gpu-memory", "4GiB", "--no-cache"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "fail on model type qwen2_vl" in err and "no Qwen2VlAttention in transformers" in err
    assert "check_auto_enable_lora_kernels turns them on where no lora_*_kernel is set" in err


def test_axolotl_turns_its_lora_kernels_off_on_paddleocr_vl_set_or_not(tmp_path):
    # model_support/paddleocr_vl declares lora_kernels Unsupported: normalize_config turns every
    # lora_*_kernel off, set true or auto-enabled (examples/paddleocr-vl sets none).
    base = {key: value for key, value in VLM.items() if not key.endswith("_kernel")}
    for data in ({**base, "base_model": "PaddlePaddle/PaddleOCR-VL-1.6"},
                 {**base, "base_model": "PaddlePaddle/PaddleOCR-VL-1.6", "lora_qkv_kernel": True}):
        config = read(tmp_path, data)
        assert config.request.step.adapter.kernels == ()
        assert any(note.startswith("lora_*_kernel: Axolotl turns its fused LoRA kernels off for model_type "
                                   "paddleocr_vl") for note in config.notes)


def test_gemma4_unified_under_axolotl_runs_its_fused_attention_emulated(tmp_path):
    # gemma4_unified takes monkeypatch/models/gemma4_unified/fused_attn.py's forward: gemma4's kernels,
    # emulated (workload/gemma4_fused_attn.py), so the patch no longer stops the check; the global
    # layers' hybrid attention is modelled for it, and flash_attention_2 runs under Axolotl's pin.
    from autotune.configs.axolotl import check_patched_model
    from autotune.request import check_hybrid
    from autotune.workload.models import resolve_model
    from autotune.workload.step import flash_at_axolotl_pin, flash_refused
    from autotune.workload.vision import IMAGE_TEXT_TO_TEXT

    config = read(tmp_path, {**VLM, "base_model": "google/gemma-4-12B-it"})
    check_patched_model(config, config.request)  # no refusal
    spec = resolve_model("google/gemma-4-12B-it")
    assert flash_refused(spec.config, IMAGE_TEXT_TO_TEXT) is None
    assert flash_at_axolotl_pin(spec.config, IMAGE_TEXT_TO_TEXT, "flash_attention_2")
    assert check_hybrid("packed", "gemma4_unified", "flash_attention_2") == "packed"


@pytest.mark.parametrize("checkpointing", [False, True])
def test_gemma4_under_axolotl_runs_its_fused_attention_emulated(tmp_path, capsys, checkpointing):
    # Axolotl's fused attention forward (and its shared-KV side channel under checkpointing): emulated,
    # and said so.
    data = {**VLM, "base_model": "tiny-gemma4", "gradient_checkpointing": checkpointing,
            "attn_implementation": "sdpa"}
    path = tmp_path / "gemma4.yml"
    path.write_text(yaml.safe_dump(data))
    code = main(["check", "--from-config", str(path), "--images-per-sample", "0", "--gpu-memory", "4GiB",
                 "--no-cache", "--workers", "1"])
    out = capsys.readouterr()
    assert code in (0, 1), out.err
    assert "Axolotl's fused Gemma 4 attention forward (emulated)" in out.out + out.err


def test_an_axolotl_job_of_gemma4_swaps_in_the_fused_attention(tmp_path):
    from autotune.configs.axolotl import check_patched_model
    from autotune.request import resolve

    data = {**VLM, "base_model": "tiny-gemma4", "gradient_checkpointing": False,
            "attn_implementation": "sdpa"}
    config = read(tmp_path, data)
    assert config.request.step.axolotl is True
    check_patched_model(config, config.request)  # not refused
    assert resolve(config.request, make_target=False).workload.fused_attention
    qwen = read(tmp_path, {**VLM, "gradient_checkpointing": False})
    assert not resolve(qwen.request, make_target=False).workload.fused_attention


def test_gemma4_without_axolotl_is_not_refused_for_axolotls_patch(tmp_path, capsys):
    path = tmp_path / "gemma4.json"
    path.write_text(json.dumps({"output_dir": "out", "per_device_train_batch_size": 1, "bf16": True}))
    code = main(["check", "tiny-gemma4", "--from-config", str(path), "--seq-len", "128",
                 "--images-per-sample", "0", "--gpu-memory", "4GiB", "--no-cache"])
    assert "patch_gemma4_fused_attn" not in capsys.readouterr().err
    assert code in (0, 1)


def test_an_axolotl_gemma3_vlm_runs_flash_attention_2_as_axolotls_pinned_transformers_does(tmp_path, capsys):
    # transformers 5.24 marks Gemma3ForConditionalGeneration _supports_flash_attn = False; Axolotl's
    # pin (5.14.1) runs flash_attention_2 on it (examples/gemma3/gemma-3-4b-vision-qlora.yml).
    path = tmp_path / "gemma3.yml"
    path.write_text(yaml.safe_dump({**VLM, "base_model": "tiny-gemma3", "image_size": 56}))
    code = main(["check", "--from-config", str(path), "--gpu-memory", "4GiB", "--json", "--no-cache",
                 "--workers", "1"])
    out = capsys.readouterr()
    assert code in (0, 1), out.err
    doc = json.loads(out.out)
    assert (doc["task"], doc["attn"]) == ("image-text-to-text", "flash_attention_2")
    notes = " ".join(doc["config_notes"])
    assert ("attn flash_attention_2: Gemma3ForConditionalGeneration runs it under transformers 5.14.1, "
            "Axolotl's pin (pyproject.toml), traced so (its flash kernel emulated)") in notes


def test_gemma3_vlm_flash_attention_2_outside_axolotl_is_refused_as_transformers_refuses_it(tmp_path, capsys):
    path = tmp_path / "gemma3.json"
    path.write_text(json.dumps({"output_dir": "out", "per_device_train_batch_size": 1, "bf16": True}))
    code = main(["check", "tiny-gemma3", "--from-config", str(path), "--seq-len", "128", "--attn",
                 "flash_attention_2", "--images-per-sample", "0", "--gpu-memory", "4GiB", "--no-cache",
                 "--workers", "1"])
    assert code == 2
    assert "Gemma3ForConditionalGeneration does not support flash_attention_2 in transformers" in \
        capsys.readouterr().err
