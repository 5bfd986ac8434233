"""Llama 4's images (workload/llama4_images.py): its processor's tiles and tokens against the processor's
own source, the batch the real model takes, and the estimator's trace of it."""

from __future__ import annotations

import re
from collections import defaultdict, namedtuple
from functools import lru_cache

import pytest
import torch
from processors import SIZES, real_model_takes, transformers_function

import autotune
from autotune.workload.models import resolve_model
from autotune.workload.step import make_batch
from autotune.workload.vision import IMAGE_TEXT_TO_TEXT, Images, image_layout

VLM = IMAGE_TEXT_TO_TEXT
SCOUT = "meta-llama/Llama-4-Scout-17B-16E"


def _their_canvas(height: int, width: int) -> tuple[int, int]:
    """image_processing_llama4.py's own find_supported_resolutions and get_best_fit (its module needs
    torchvision: run alone), as _preprocess calls them for 336-pixel tiles and max_patches 16."""
    factors = transformers_function("llama4", "image_processing_llama4", "get_factors")
    resolutions = transformers_function("llama4", "image_processing_llama4", "find_supported_resolutions",
                                        {"lru_cache": lru_cache, "defaultdict": defaultdict,
                                         "get_factors": factors, "SizeDict": object, "torch": torch})
    best_fit = transformers_function("llama4", "image_processing_llama4", "get_best_fit", {"torch": torch})
    size = namedtuple("SizeDict", "height width")(336, 336)  # hashable, for its lru_cache
    possible = torch.tensor(resolutions(16, size))
    canvas = best_fit((height, width), possible)
    return int(canvas[0]), int(canvas[1])


@pytest.mark.parametrize(("width", "height"), SIZES)
def test_llama4_tiles_are_its_processors(width, height):
    from autotune.workload.llama4_images import best_fit, supported_resolutions

    theirs = _their_canvas(height, width)
    assert best_fit(height, width, supported_resolutions(16, 336)) == theirs
    layout = image_layout(resolve_model(SCOUT).config, Images(2, (width, height)))
    rows, columns = theirs[0] // 336, theirs[1] // 336
    tiles = rows * columns + (1 if rows * columns > 1 else 0)  # the global tile beside a grid
    assert layout.processed == (theirs[1], theirs[0]) and layout.tiles == tiles
    assert layout.tokens == 144 * tiles and layout.patches == 577 * tiles  # (336/14)**2 / 4; and the CLS


@pytest.mark.parametrize(("size", "grid", "tokens", "markers"),
                         [((640, 480), (2, 2), 5 * 144, 7), ((336, 336), (1, 1), 144, 3),
                          ((1280, 720), (3, 4), 13 * 144, 3 + 3 * 3 + 3), ((100, 57), (1, 1), 144, 3)])
def test_llama4_tokens_are_its_prompt_split_images(size, grid, tokens, markers):
    # Hand computation: 640x480's smallest upscale is the 2x2 canvas of 672 (x1.05): 4 tiles and the
    # global one, 144 <|patch|> each; processing_llama4.py's own string counts the rest.
    from transformers.models.llama4.processing_llama4 import Llama4Processor

    layout = image_layout(resolve_model(SCOUT).config, Images(1, size))
    assert (layout.processed[1] // 336, layout.processed[0] // 336) == grid
    text = Llama4Processor._prompt_split_image(None, grid, 144)
    pieces = re.findall(r"<\|[a-z_]+\|>", text)
    assert (layout.tokens, layout.markers) == (tokens, markers)
    assert (pieces.count("<|patch|>"), len(pieces) - pieces.count("<|patch|>")) == (tokens, markers)


def test_the_llama4_pixel_values_are_every_tile_of_every_image():
    config = resolve_model(SCOUT).config
    batch = make_batch(config, VLM, 2, 2048, device="meta", images=Images(2, (640, 480)))
    assert tuple(batch["pixel_values"].shape) == (2 * 2 * 5, 3, 336, 336)
    assert batch["pixel_values"].dtype == torch.float32


@pytest.mark.parametrize("count", [0, 1, 3])
def test_the_llama4_batch_is_what_the_real_model_takes(count):
    # 84 x 56 on tiny tiles of 56: a 1 x 2 grid and the global tile, 4 tokens a tile.
    layout = real_model_takes("tiny-llama4", count, 300)
    assert (layout.tiles, layout.tokens) == (3, 12)


def test_a_tiny_llama4_check_answers_and_more_images_raise_the_peak():
    def check(count):
        return autotune.check("tiny-llama4", seq_len=512, batch_size=2, gpu_memory="1GiB",
                              backend="estimate", workers=1, image_size="224x224", images_per_sample=count)

    one, three = check(1), check(3)
    assert one.fits and one.images["tokens"] == (4 * 4 + 1) * 4  # a 4 x 4 grid of 56, the global tile
    assert three.peak_memory_bytes > one.peak_memory_bytes


# --- GLM-4V (GLM-4.6V-Flash): Qwen2-VL's inputs with GLM-4V's own smart_resize ----------------------


@pytest.mark.parametrize(("width", "height"), SIZES)
def test_glm4v_resize_is_its_processors(width, height):
    from autotune.workload.vision import GLM_MAX_PIXELS, GLM_MIN_PIXELS, glm4v_resize

    theirs = transformers_function("glm4v", "image_processing_glm4v", "smart_resize")
    assert glm4v_resize(height, width) == theirs(2, height, width, temporal_factor=2, factor=28,
                                                  min_pixels=GLM_MIN_PIXELS, max_pixels=GLM_MAX_PIXELS)


def test_glm4v_layout_is_a_hand_computation():
    # 640x480: sides rounded to 28s (476 x 644), 2 frames x 476 x 644 within [12544, 9633792] pixels;
    # (476/14) x (644/14) = 34 x 46 patches, merged 2 x 2: 391 <|image|> tokens between begin and end.
    layout = image_layout(resolve_model("tiny-glm4v").config, Images(1, (640, 480)))
    assert (layout.processed, layout.grid, layout.patches) == ((644, 476), (1, 34, 46), 1564)
    assert (layout.tokens, layout.markers) == (391, 2)
    batch = make_batch(resolve_model("tiny-glm4v").config, VLM, 2, 1024, device="meta",
                       images=Images(1, (640, 480)))
    assert tuple(batch["pixel_values"].shape) == (2 * 1564, 3 * 2 * 14 * 14)
    assert tuple(batch["image_grid_thw"].shape) == (2, 3)
    assert tuple(batch["position_ids"].shape) == (3, 2, 1024)


@pytest.mark.parametrize("count", [0, 1, 3])
def test_the_glm4v_batch_is_what_the_real_model_takes(count):
    real_model_takes("tiny-glm4v", count, 300)


def test_a_tiny_glm4v_check_answers_and_more_images_raise_the_peak():
    def check(count):
        return autotune.check("tiny-glm4v", seq_len=512, batch_size=2, gpu_memory="1GiB",
                              backend="estimate", workers=1, image_size="224x224", images_per_sample=count)

    one, three = check(1), check(3)
    assert one.fits and one.images["tokens"] == (224 // 28) ** 2
    assert three.peak_memory_bytes > one.peak_memory_bytes


def test_glm_4_6v_flash_is_its_vlm_of_10_3b():
    # GLM-4-9B's 9.40B text model (the model card's "9B") and a 0.89B tower: 10.29B in all.
    from transformers import AutoModelForImageTextToText

    from autotune.workload.models import infer_task

    spec = resolve_model("zai-org/GLM-4.6V-Flash")
    assert infer_task(spec.config)[0] == VLM
    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(spec.config)
    assert type(model).__name__ == "Glm4vForConditionalGeneration"
    tower = sum(p.numel() for p in model.model.visual.parameters())
    total = sum(p.numel() for p in model.parameters())
    assert round((total - tower) / 1e9, 1) == 9.4 and round(tower / 1e9, 2) == 0.89
    assert round(total / 1e9, 2) == 10.29
