"""Qwen3.5-35B-A3B as the vision-language model it is (presets/qwen_hybrid.py; workload/vision.py
QWEN3_FAMILIES): its processor's layout against the processor's own source, the batch the real model
takes, the estimator's trace of it, and the preset's parameter count."""

from __future__ import annotations

import pytest
import torch
from processors import SIZES, given_positions_are_the_models_own, real_model_takes

import autotune
from autotune.workload.models import infer_task, resolve_model
from autotune.workload.step import build_model, make_batch
from autotune.workload.vision import IMAGE_TEXT_TO_TEXT, Images, image_layout

VLM = IMAGE_TEXT_TO_TEXT


def test_qwen3_5_35b_a3b_is_its_vlm_of_35b():
    # Model card: 35B in total; the text model's 34.66B (test_presets_qwen_hybrid.py) and the tower's.
    from transformers import AutoModelForImageTextToText

    spec = resolve_model("Qwen/Qwen3.5-35B-A3B")
    assert infer_task(spec.config)[0] == VLM
    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(spec.config)
    assert type(model).__name__ == "Qwen3_5MoeForConditionalGeneration"
    assert sum(p.numel() for p in model.model.visual.parameters()) == 446_571_248
    assert round(sum(p.numel() for p in model.parameters()) / 1e9) == 35


@pytest.mark.parametrize("model_type", ["qwen3_5", "qwen3_5_moe"])
def test_qwen3_5_s_processor_is_qwen3_vl_s(model_type):
    # transformers maps qwen3_5 and qwen3_5_moe to Qwen3VLProcessor and Qwen2VLImageProcessor.
    from transformers.models.auto import image_processing_auto, processing_auto

    assert processing_auto.PROCESSOR_MAPPING_NAMES[model_type] == "Qwen3VLProcessor"
    assert image_processing_auto.IMAGE_PROCESSOR_MAPPING_NAMES[model_type]["torchvision"] == \
        "Qwen2VLImageProcessor"


# Qwen3.5's dense checkpoints (0.8B to 9B) and its mixtures of experts, as their tiny VLMs.
TINY_QWEN3_5 = ["tiny-qwen3_5", "tiny-qwen3_5_moe"]


@pytest.mark.parametrize("preset", TINY_QWEN3_5)
@pytest.mark.parametrize("count", [0, 1, 3])
def test_the_qwen3_5_batch_is_what_the_real_model_takes(preset, count):
    real_model_takes(preset, count, 300)


@pytest.mark.parametrize("preset", [*TINY_QWEN3_5, "tiny-glm4v"])
def test_the_given_qwen3_5_and_glm4v_positions_are_the_models_own(preset):
    # position_ids (get_rope_index: Qwen3.5's, GLM-4V's) and the tower's indices, given, make the
    # model's own logits.
    given_positions_are_the_models_own(preset, 300)


@pytest.mark.parametrize("preset", TINY_QWEN3_5)
def test_a_tiny_qwen3_5_check_answers_and_more_images_raise_the_peak(preset):
    def check(count):
        return autotune.check(preset, seq_len=512, batch_size=2, gpu_memory="1GiB",
                              backend="estimate", workers=1, image_size="224x224", images_per_sample=count,
                              dtype="bfloat16")

    one, three = check(1), check(3)
    assert one.fits and one.images["tokens"] == 64  # 224 -> 256 (the 65536-pixel floor): 16 x 16 / 4
    assert three.peak_memory_bytes > one.peak_memory_bytes


# --- Llama 3.2 Vision (mllama) ---------------------------------------------------------------------

MLLAMA = "alpindale/Llama-3.2-11B-Vision-Instruct"


def test_llama_3_2_11b_vision_has_its_10_6b_parameters():
    from transformers import AutoModelForImageTextToText

    spec = resolve_model(MLLAMA)
    assert infer_task(spec.config)[0] == VLM
    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(spec.config)
    assert sum(p.numel() for p in model.parameters()) == pytest.approx(10.6e9, rel=0.01)


@pytest.mark.parametrize(("width", "height"), SIZES)
def test_mllama_tiles_are_its_processors(width, height):
    # transformers' own get_optimal_tiled_canvas (image_processing_mllama.py, run alone: its module needs
    # torchvision) against autotune's; the batch's shapes as MllamaProcessor makes them.
    from functools import lru_cache

    import numpy as np
    from processors import transformers_function

    from autotune.workload.mllama_images import supported_aspect_ratios, tiled_canvas

    ratios = transformers_function("mllama", "image_processing_mllama", "get_all_supported_aspect_ratios",
                                   {"lru_cache": lru_cache})
    assert ratios(4) == supported_aspect_ratios(4)
    canvas = transformers_function("mllama", "image_processing_mllama", "get_optimal_tiled_canvas",
                                   {"np": np, "lru_cache": lru_cache,
                                    "get_all_supported_aspect_ratios": ratios})
    theirs = tuple(int(v) for v in canvas(height, width, 4, 560))
    assert tiled_canvas(height, width, 4, 560) == theirs
    config = resolve_model(MLLAMA).config
    layout = image_layout(config, Images(2, (width, height)))
    assert layout.processed == (theirs[1], theirs[0]) and layout.tiles == theirs[0] * theirs[1] // 560**2
    assert (layout.tokens, layout.markers, layout.patches) == (1, 0, 4 * 1608)  # 1601 padded to 8s
    batch = make_batch(config, VLM, 2, 64, device="meta", images=Images(2, (width, height)))
    assert tuple(batch["pixel_values"].shape) == (2, 2, 4, 3, 560, 560)
    assert tuple(batch["aspect_ratio_ids"].shape) == tuple(batch["aspect_ratio_mask"].shape)[:2] == (2, 2)
    assert tuple(batch["cross_attention_mask"].shape) == (2, 64, 2, 4)


def test_the_mllama_masks_are_the_processors():
    # Two consecutive <|image|> tokens both see every token after them (get_cross_attention_token_mask),
    # on their tiles only; the aspect ratio id of a 1 x 2 grid is 2 (convert_aspect_ratios_to_ids).
    config = resolve_model("tiny-mllama").config
    batch = make_batch(config, VLM, 1, 10, images=Images(2, (84, 56)))
    assert batch["input_ids"][0, 1:3].tolist() == [127, 127]
    cross = batch["cross_attention_mask"][0]
    assert cross[:1].sum() == 0 and cross[1, 0].tolist() == [1, 1, 0, 0] and cross[2:].sum() == 8 * 2 * 2
    assert batch["aspect_ratio_ids"].tolist() == [[2, 2]]
    assert batch["aspect_ratio_mask"].tolist() == [[[1, 1, 0, 0], [1, 1, 0, 0]]]


@pytest.mark.parametrize("count", [0, 1, 3])
def test_the_mllama_batch_is_what_the_real_model_takes(count):
    real_model_takes("tiny-mllama", count, 300)


def test_a_tiny_mllama_check_answers_and_more_images_raise_the_peak():
    def check(count):
        return autotune.check("tiny-mllama", seq_len=512, batch_size=2, gpu_memory="1GiB",
                              backend="estimate", workers=1, image_size="224x224", images_per_sample=count)

    one, three = check(1), check(3)
    assert one.fits and one.images["tokens"] == 1
    assert three.peak_memory_bytes > one.peak_memory_bytes


@pytest.mark.parametrize("reentrant", [True, False])
def test_reentrant_checkpointing_of_mllama_fails_as_the_real_step_does(reentrant):
    # The vision features reach every checkpointed decoder layer as the keyword cross_attention_states,
    # outside a reentrant checkpoint's inputs: the real model's backward runs through the projector's
    # graph once per cross-attention layer (tiny-mllama has two), and PyTorch fails the second;
    # gradient_checkpointing says so by name. use_reentrant=False takes the same step.
    from autotune.errors import InvalidInput
    from autotune.workload.step import gradient_checkpointing

    torch.manual_seed(0)
    model, _ = build_model(resolve_model("tiny-mllama"), VLM, None)
    model.train()
    batch = make_batch(model.config, VLM, 2, 64, images=Images(1, (84, 56)))
    if not reentrant:
        with gradient_checkpointing(model, True, {"use_reentrant": False}):
            model(**batch).loss.backward()
        return
    with pytest.raises(InvalidInput, match="cross_attention_states is passed to 3 checkpointed") as raised:
        with gradient_checkpointing(model, True, {"use_reentrant": True}):
            model(**batch).loss.backward()
    assert isinstance(raised.value.__cause__, RuntimeError)
    assert "backward through the graph a second time" in str(raised.value.__cause__)



# examples/llama-3-vision/lora-11b.yaml's keys (Axolotl), on tiny-mllama at 512 tokens, its LoRA kernels off.
MLLAMA_LORA = {"base_model": "tiny-mllama", "processor_type": "AutoProcessor", "skip_prepare_dataset": True,
               "remove_unused_columns": False, "sample_packing": False, "chat_template": "llama3_2_vision",
               "datasets": [{"path": "HuggingFaceH4/llava-instruct-mix-vsft", "type": "chat_template"}],
               "sequence_len": 512, "adapter": "lora", "lora_r": 32, "lora_alpha": 16, "lora_dropout": 0.05,
               "lora_target_modules": r"model.language_model.layers.[\d]+.(mlp|cross_attn|self_attn)."
                                      r"(up|down|gate|q|k|v|o)_proj",
               "gradient_accumulation_steps": 4, "micro_batch_size": 1, "optimizer": "adamw_bnb_8bit",
               "bf16": True, "tf32": True, "gradient_checkpointing": True, "attn_implementation": "sdpa",
               "lora_qkv_kernel": False, "lora_o_kernel": False}


@pytest.mark.parametrize("kwargs", [None, {"use_reentrant": False}])
def test_axolotls_mllama_config_with_reentrant_checkpointing_is_refused_by_its_cause(tmp_path, capsys,
                                                                                    kwargs):
    # No gradient_checkpointing_kwargs is use_reentrant=True under Axolotl (normalize_config), which
    # fails on mllama as above: exit 2 naming the cause, not an internal error. use_reentrant: false fits.
    import yaml

    from autotune.cli import main

    path = tmp_path / "lora-11b.yaml"
    extra = {"gradient_checkpointing_kwargs": kwargs} if kwargs else {}
    path.write_text(yaml.safe_dump({**MLLAMA_LORA, **extra}))
    code = main(["check", "--from-config", str(path), "--gpu-memory", "4GiB", "--no-cache", "--workers", "1"])
    out = capsys.readouterr()
    if kwargs is None:
        assert code == 2
        assert "use_reentrant=True fails on MllamaForConditionalGeneration: cross_attention_states" in out.err
    else:
        assert code == 0 and out.out.startswith("fits: tiny-mllama seq 512 bf16+ckpt")


def test_only_the_second_backward_of_a_shared_keyword_is_said_as_reentrant_checkpointings():
    # Another error of the step, or none shared, stands as it is.
    from autotune.workload.reentrant import SECOND_BACKWARD, KeywordGraphs

    graphs = KeywordGraphs()
    features = torch.ones(2, requires_grad=True) * 2
    graphs.record("cross_attention_states", "MllamaCrossAttentionDecoderLayer", features)
    assert graphs.failure(RuntimeError(SECOND_BACKWARD), "M") is None  # one layer took it
    graphs.record("cross_attention_states", "MllamaCrossAttentionDecoderLayer", features)
    assert graphs.failure(RuntimeError("shape mismatch"), "M") is None
    assert graphs.failure(ValueError(SECOND_BACKWARD), "M") is None
    assert "cross_attention_states is passed to 2" in str(graphs.failure(RuntimeError(SECOND_BACKWARD), "M"))
