"""Vision-language models (workload/vision.py, backends/estimate/vision.py): the images of a step as
the processor makes them, the batch the real model takes, and the estimator's trace of it."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from processors import SIZES, image_cell_probes, real_model_takes, transformers_smart_resize

import autotune
from autotune.errors import InvalidInput
from autotune.request import CheckRequest, Step, TableRequest, resolve
from autotune.workload.models import infer_task, resolve_model
from autotune.workload.presets import PRESETS
from autotune.workload.step import build_model, make_batch
from autotune.workload.vision import (
    DEFAULT_IMAGE_SIZE,
    IMAGE_TEXT_TO_TEXT,
    Images,
    aspect_ratio_preserving_size,
    image_layout,
    make_images,
    parse_image_size,
    smart_resize,
)

VLM = IMAGE_TEXT_TO_TEXT
TINY_VLMS = ("tiny-qwen2_vl", "tiny-qwen2_5_vl", "tiny-llava", "tiny-gemma3", "tiny-gemma4")
# Gemma 4's images are refused by the estimator (backends/estimate/vision.py UNTRACED_FAMILIES).
ESTIMATED_VLMS = tuple(name for name in TINY_VLMS if name != "tiny-gemma4")
VLM_PRESETS = [name for name in PRESETS if "vision_config" in PRESETS[name]]


@pytest.mark.parametrize(("width", "height"), SIZES)
def test_smart_resize_is_transformers_own(width, height):
    theirs = transformers_smart_resize()
    for bounds in ({}, {"min_pixels": 3136, "max_pixels": 12845056}):
        assert smart_resize(height, width, 28, **bounds) == theirs(height, width, 28, **bounds)


@pytest.mark.parametrize(("width", "height"), SIZES)
def test_qwen_image_tokens_and_patches_are_the_processors(width, height):
    # Qwen2VLImageProcessor: smart_resize to multiples of 28 in [3136, 12845056] pixels (the
    # checkpoint's preprocessor_config.json), grid (1, h/14, w/14), pixel_values [t*h*w, 3*2*14*14];
    # Qwen2VLProcessor: grid.prod() // merge_size**2 <|image_pad|> tokens an image.
    config = resolve_model("Qwen/Qwen2-VL-7B-Instruct").config
    layout = image_layout(config, Images(1, (width, height)))
    resized_h, resized_w = transformers_smart_resize()(height, width, 28, 3136, 12845056)
    grid = (1, resized_h // 14, resized_w // 14)
    assert layout.grid == grid and layout.processed == (resized_w, resized_h)
    assert layout.patches == math.prod(grid) and layout.tokens == math.prod(grid) // 4
    batch = make_batch(config, VLM, 2, layout.row_tokens + 16, device="meta",
                       images=Images(1, (width, height)))
    assert tuple(batch["pixel_values"].shape) == (2 * math.prod(grid), 3 * 2 * 14 * 14)
    assert tuple(batch["image_grid_thw"].shape) == (2, 3)
    assert tuple(batch["position_ids"].shape) == (3, 2, layout.row_tokens + 16)


def test_the_default_image_is_cocos_640x480_in_391_tokens():
    layout = image_layout(resolve_model("Qwen/Qwen2-VL-7B-Instruct").config, Images())
    assert DEFAULT_IMAGE_SIZE == (640, 480)
    assert (layout.processed, layout.patches, layout.tokens) == ((644, 476), 1564, 391)
    assert layout.row_tokens == 393  # with <|vision_start|> and <|vision_end|>
    assert "640x480" in layout.label and "391 image tokens" in layout.label and "--image-size" in layout.label


def test_fixed_size_processors_take_any_image_to_one_size():
    llava = image_layout(resolve_model("llava-hf/llava-1.5-7b-hf").config, Images(2, (1280, 720)))
    assert (llava.processed, llava.tokens, llava.row_tokens) == ((336, 336), 576, 1152)  # (336/14)**2
    gemma = image_layout(resolve_model("google/gemma-3-4b-it").config, Images(1, (100, 100)))
    assert (gemma.processed, gemma.tokens, gemma.markers, gemma.patches) == ((896, 896), 256, 4, 4096)
    assert "any size gives the same inputs" in gemma.label


def transformers_aspect_ratio_preserving_size():
    """transformers' own ``get_aspect_ratio_preserving_size`` (models/gemma4/processing_gemma4.py, the
    same as image_processing_gemma4.py's, which imports torchvision), its source run as it is."""
    import transformers.models.gemma4.processing_gemma4 as processing

    return processing.get_aspect_ratio_preserving_size


@pytest.mark.parametrize(("width", "height"), SIZES + [(48, 4000), (4000, 48)])
def test_gemma4_image_tokens_and_patches_are_the_processors(width, height):
    # Gemma4ImageProcessor: resized within 280 x 3**2 patches of 16 to multiples of 48, patchified,
    # padded to 2520 rows of 16 x 16 x 3 (positions -1); Gemma4Processor: patches // 9 <|image|>
    # tokens between boi and eoi.
    config = resolve_model("google/gemma-4-E2B-it").config
    layout = image_layout(config, Images(1, (width, height)))
    resized_h, resized_w = transformers_aspect_ratio_preserving_size()(height, width, 16, 2520, 3)
    assert aspect_ratio_preserving_size(height, width, 16, 2520, 3) == (resized_h, resized_w)
    assert layout.processed == (resized_w, resized_h) and layout.markers == 2
    assert layout.patches == (resized_h // 16) * (resized_w // 16) and layout.tokens == layout.patches // 9
    assert layout.tokens <= 280
    batch = make_batch(config, VLM, 2, layout.row_tokens + 16, device="meta",
                       images=Images(1, (width, height)))
    assert tuple(batch["pixel_values"].shape) == (2, 2520, 768)
    assert tuple(batch["image_position_ids"].shape) == (2, 2520, 2)
    assert tuple(batch["mm_token_type_ids"].shape) == (2, layout.row_tokens + 16)


def test_gemma4_positions_are_the_processors_meshgrid():
    # image_processing_gemma4.py _preprocess: meshgrid(arange(w), arange(h), indexing="xy") stacked and
    # reshaped to (x, y) per patch, padded with -1.
    config = resolve_model("tiny-gemma4").config
    layout = image_layout(config, Images(1, (84, 56)))
    batch = make_batch(config, VLM, 1, 200, images=Images(1, (84, 56)))
    columns, rows = layout.processed[0] // 16, layout.processed[1] // 16
    grid = torch.meshgrid(torch.arange(columns), torch.arange(rows), indexing="xy")
    real = torch.stack(grid, dim=-1).reshape(layout.patches, 2)
    assert torch.equal(batch["image_position_ids"][0, :layout.patches], real)
    assert (batch["image_position_ids"][0, layout.patches:] == -1).all()


def test_gemma4_pooler_route_computes_the_vision_towers_own():
    # The padding stripped by nonzero_static of the known count: the tower's own features, on real
    # tensors, for images whose resized size leaves padding patches.
    from autotune.backends.estimate.vision import route_gemma4_pooler

    torch.manual_seed(0)
    model, _ = build_model(resolve_model("tiny-gemma4"), VLM, "sdpa")
    model.eval()
    routed = copy.deepcopy(model)
    route_gemma4_pooler(routed)
    images = Images(1, (84, 56))
    layout = image_layout(model.config, images)
    assert layout.padded_patches > layout.patches  # padding to strip
    batch = make_batch(model.config, VLM, 2, 200, images=images)
    with torch.no_grad():
        own = model.model.vision_tower(batch["pixel_values"], batch["image_position_ids"]).last_hidden_state
        out = routed.model.vision_tower(batch["pixel_values"], batch["image_position_ids"]).last_hidden_state
    assert own.shape[0] == 2 * layout.tokens
    assert torch.equal(out, own)


def test_gemma4_images_are_refused_by_name_by_the_estimator():
    with pytest.raises(InvalidInput, match="Gemma 4's merge of its image features"):
        autotune.check("tiny-gemma4", seq_len=512, batch_size=1, gpu_memory="1GiB", backend="estimate",
                       workers=1, images_per_sample=1)


@pytest.mark.parametrize("value", ["640x480", "640X480", (640, 480), [640, 480]])
def test_image_sizes_are_width_by_height(value):
    assert parse_image_size(value) == (640, 480)
    assert parse_image_size("448") == parse_image_size(448) == (448, 448)


@pytest.mark.parametrize("value", ["640x", "big", "0x10", (1, 0), True, "10000x10"])
def test_bad_image_sizes_are_refused(value):
    with pytest.raises(InvalidInput):
        parse_image_size(value)


def test_images_per_sample_counts_from_zero():
    assert make_images(None, None) == Images(1, None)
    assert make_images(0, "64x64") == Images(0, (64, 64))
    with pytest.raises(InvalidInput, match="images_per_sample"):
        make_images(-1, None)


@pytest.mark.parametrize("name", VLM_PRESETS)
def test_vlm_presets_train_image_text_to_text_with_their_text_models_positions(name):
    spec = resolve_model(name)
    assert infer_task(spec.config)[0] == VLM
    assert spec.max_seq_len == spec.config.get_text_config().max_position_embeddings


@pytest.mark.parametrize(("name", "params"), [
    # the totals the hub shows for the checkpoints' safetensors: 8.29B, 8.29B, 7.06B, 4.3B, 12.2B, 27.4B
    ("Qwen/Qwen2-VL-7B-Instruct", 8.29e9), ("Qwen/Qwen2.5-VL-7B-Instruct", 8.29e9),
    ("llava-hf/llava-1.5-7b-hf", 7.06e9), ("google/gemma-3-4b-it", 4.30e9),
    ("google/gemma-3-12b-it", 12.2e9), ("google/gemma-3-27b-it", 27.4e9),
])
def test_vlm_preset_parameter_counts_match_the_published_totals(name, params):
    from transformers import AutoModelForImageTextToText

    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(resolve_model(name).config)
    assert sum(p.numel() for p in model.parameters()) == pytest.approx(params, rel=0.002)


@pytest.mark.parametrize(("name", "total", "language_model"), [
    # The Gemma 4 model card: E2B 5.1B with its per-layer embeddings (2.3B effective); 26B A4B 25.2B
    # and 31B 30.7B, the language model's (the vision encoder apart).
    ("google/gemma-4-E2B-it", 5.1e9, None), ("google/gemma-4-26B-A4B", None, 25.2e9),
    ("google/gemma-4-31B", None, 30.7e9),
])
def test_gemma4_parameter_counts_match_the_published_totals(name, total, language_model):
    from transformers import AutoModelForImageTextToText

    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(resolve_model(name).config)
    if total is not None:
        assert sum(p.numel() for p in model.parameters()) == pytest.approx(total, rel=0.002)
    if language_model is not None:
        counted = sum(p.numel() for p in model.model.language_model.parameters())
        assert counted == pytest.approx(language_model, rel=0.002)


def test_gemma_4_12b_is_its_converter_s_unified_architecture():
    # convert_gemma4_unified_weights.py _VARIANTS["gemma-4-12b"]: 48 layers of 3840, 8 of them global
    # (head dim 512, one key/value head, keys as values), no towers; about 12B parameters in all.
    from transformers import AutoModelForImageTextToText

    config = resolve_model("google/gemma-4-12B-it").config
    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(config)
    layers = model.model.language_model.layers
    assert type(model).__name__ == "Gemma4UnifiedForConditionalGeneration" and len(layers) == 48
    assert config.text_config.layer_types.count("full_attention") == 8
    assert layers[5].self_attn.head_dim == 512 and layers[5].self_attn.v_proj is None
    assert tuple(layers[5].self_attn.k_proj.weight.shape) == (512, 3840)  # one key/value head
    assert tuple(layers[0].self_attn.k_proj.weight.shape) == (8 * 256, 3840)
    assert not hasattr(model.model, "vision_tower")
    assert round(sum(p.numel() for p in model.parameters()) / 1e9) == 12


# --- the batch, on the real model -------------------------------------------------------------


@pytest.mark.parametrize("name", TINY_VLMS)
@pytest.mark.parametrize("count", [0, 1, 3])
def test_the_batch_is_what_the_real_model_takes(name, count):
    # Real tensors, transformers' checks on: the layout is the processor's.
    real_model_takes(name, count, 200)


def test_mrope_positions_are_get_rope_index_s():
    spec = resolve_model("tiny-qwen2_vl")
    model, _ = build_model(spec, VLM, None)
    batch = make_batch(model.config, VLM, 2, 120, images=Images(2, (84, 56)))
    theirs, _ = model.model.get_rope_index(batch["input_ids"], batch["mm_token_type_ids"],
                                           image_grid_thw=batch["image_grid_thw"],
                                           attention_mask=batch["attention_mask"])
    kept = batch["attention_mask"].bool()
    assert torch.equal(batch["position_ids"][:, kept], theirs[:, kept])


@pytest.mark.parametrize("name", ["tiny-qwen2_vl", "tiny-qwen2_5_vl"])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_per_image_attention_computes_the_models_own_loop(name, attn):
    # The estimator's route (one call per window of an image over all images) gives the loop's
    # results: the same attention, grouped otherwise.
    from autotune.backends.estimate.vision import route_vision_attention

    torch.manual_seed(0)
    model, _ = build_model(resolve_model(name), VLM, attn)
    model.eval()
    routed = copy.deepcopy(model)
    route_vision_attention(routed, attn)
    assert any(getattr(m, "config", None) is not None and m.config._attn_implementation.startswith("flash_")
               for m in routed.modules() if type(m).__name__.endswith("VisionAttention"))
    batch = make_batch(model.config, VLM, 2, 300, images=Images(2, (140, 112)))
    with torch.no_grad():
        assert torch.allclose(routed(**batch).logits, model(**batch).logits, atol=1e-5)


# --- the estimator ----------------------------------------------------------------------------


def check(**step):
    return autotune.check("tiny-qwen2_vl", seq_len=step.pop("seq_len", 512), batch_size=2,
                          gpu_memory="1GiB", backend="estimate", workers=1, **step)


def test_a_tiny_vlm_check_answers_and_says_its_images():
    result = check(image_size="224x224", images_per_sample=2)
    assert result.fits and result.task == VLM and result.max_batch_size > 2
    assert result.images["tokens"] == 64 and result.images["per_sample"] == 2
    assert "images: 2 images per sample, 224x224" in result.message


def test_more_or_larger_images_raise_the_peak():
    one = check(image_size="224x224", images_per_sample=1)
    more = check(image_size="224x224", images_per_sample=3)
    larger = check(image_size="448x448", images_per_sample=1)
    assert more.peak_memory_bytes > one.peak_memory_bytes
    assert larger.peak_memory_bytes > one.peak_memory_bytes
    assert more.max_batch_size < one.max_batch_size and larger.max_batch_size < one.max_batch_size


def test_a_text_only_step_of_a_vlm():
    result = check(images_per_sample=0)
    assert result.fits and result.images["per_sample"] == 0
    assert "text-only" in result.message


@pytest.mark.parametrize("name", ESTIMATED_VLMS)
def test_every_tiny_vlm_is_estimated_and_extrapolated(name):
    # The vision tower's per-image loops are out of the trace (backends/estimate/vision.py): two
    # traced runs give the cell's other batch sizes.
    probes = image_cell_probes(name, "fp32")
    assert [p.details["estimate"] for p in probes][:2] == ["traced", "traced"]
    assert {p.details["estimate"] for p in probes[2:]} != {"traced"}
    assert probes[-1].peak_bytes > probes[0].peak_bytes


def test_the_image_fields_are_refused_on_a_text_step():
    with pytest.raises(InvalidInput) as info:
        resolve(CheckRequest(Step(model="tiny-llama", image_size="64x64"), seq_len=64, batch_size=1),
                make_target=False)
    assert info.value.field == "image_size" and "image-text-to-text" in str(info.value)


def test_a_row_too_short_for_its_images_is_refused_naming_seq_len():
    with pytest.raises(InvalidInput) as info:
        resolve(CheckRequest(Step(model="Qwen/Qwen2-VL-7B-Instruct"), seq_len=256, batch_size=1),
                make_target=False)
    assert info.value.field == "seq_len" and "391 image tokens" in str(info.value)


def test_a_tables_default_lengths_leave_out_those_too_short_for_the_images():
    resolved = resolve(TableRequest(Step(model="llava-hf/llava-1.5-7b-hf")), make_target=False)
    assert resolved.seq_lens == [1024, 2048, 4096]  # 512 cannot hold LLaVA's 576 image tokens


def test_a_vlm_without_a_modelled_processor_is_refused(tmp_path):
    import json

    config = {"model_type": "idefics3", "vision_config": {"model_type": "idefics3_vision"}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(InvalidInput, match="images of model_type 'idefics3' are not modelled"):
        resolve(CheckRequest(Step(model=str(tmp_path), task=VLM), seq_len=512, batch_size=1),
                make_target=False)
