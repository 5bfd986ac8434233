"""The image layouts and presets of presets/vlms2.py: InternVL 3.5 (its processor's tiles,
workload/vision.py ``tiled_canvas``), and Axolotl's LoRA kernels refused on it as Axolotl fails;
LFM2-VL (``lfm2_vl_resize``)."""

from __future__ import annotations

import ast
from functools import lru_cache
from pathlib import Path

import pytest
import torch
from processors import real_model_takes

from autotune.errors import InvalidInput
from autotune.workload.lora_kernels import check_checkpoint
from autotune.workload.models import infer_task, resolve_model
from autotune.workload.step import build_model, make_batch
from autotune.workload.vision import IMAGE_TEXT_TO_TEXT, Images, image_layout, tiled_canvas

VLM = IMAGE_TEXT_TO_TEXT
SIZES = [(640, 480), (448, 448), (1280, 720), (224, 224), (100, 57), (3000, 2000), (28, 28), (5000, 400),
         (400, 5000), (896, 448), (1344, 448)]


def transformers_canvas():
    """transformers' own ``get_optimal_tiled_canvas`` and ``get_all_supported_aspect_ratios``
    (models/got_ocr2/image_processing_got_ocr2.py), their source run as it is (the module imports
    torchvision, which this environment has not)."""
    import transformers

    path = Path(transformers.__file__).parent / "models" / "got_ocr2" / "image_processing_got_ocr2.py"
    tree = ast.parse(path.read_text())
    found = [node for node in tree.body if isinstance(node, ast.FunctionDef)
             and node.name in ("get_all_supported_aspect_ratios", "get_optimal_tiled_canvas")]
    assert len(found) == 2
    namespace: dict = {"lru_cache": lru_cache}
    exec(compile(ast.Module(body=found, type_ignores=[]), str(path), "exec"), namespace)  # noqa: S102
    return namespace["get_optimal_tiled_canvas"]


@pytest.mark.parametrize(("width", "height"), SIZES)
@pytest.mark.parametrize("max_tiles", [12, 6])
def test_tiled_canvas_is_transformers_own(width, height, max_tiles):
    theirs = transformers_canvas()((height, width), (448, 448), 1, max_tiles)
    assert tiled_canvas(height, width, 448, 1, max_tiles) == tuple(theirs)


@pytest.mark.parametrize(("width", "height"), SIZES)
def test_image_tokens_and_tiles_are_the_processors(width, height):
    # GotOcr2ImageProcessor.get_number_of_image_patches: the grid's tiles, and a thumbnail where there
    # are more than one; InternVLProcessor._get_num_multimodal_tokens: 2 + 256 x tiles tokens.
    config = resolve_model("OpenGVLab/InternVL3_5-8B-HF").config
    layout = image_layout(config, Images(1, (width, height)))
    columns, rows = transformers_canvas()((height, width), (448, 448), 1, 12)
    tiles = 1 + (columns * rows if columns * rows > 1 else 0)
    assert layout.tiles == tiles
    assert layout.tokens + layout.markers == 2 + 256 * tiles
    assert layout.patches == 1024 * tiles
    batch = make_batch(config, VLM, 2, layout.row_tokens + 16, device="meta",
                       images=Images(1, (width, height)))
    assert tuple(batch["pixel_values"].shape) == (2 * tiles, 3, 448, 448)


def test_cocos_640x480_is_13_tiles():
    # 4:3 is a 4 x 3 grid of 12 tiles, and the thumbnail: 3328 image tokens, more than the 2048 of
    # Axolotl's example (examples/internvl3_5/internvl3_5-8b-qlora.yml); 448 x 448 is one tile.
    config = resolve_model("OpenGVLab/InternVL3_5-8B-HF").config
    coco = image_layout(config, Images())
    assert (coco.tiles, coco.processed, coco.tokens, coco.markers) == (13, (1792, 1344), 3328, 2)
    assert "cut into 13 tiles" in coco.label
    one = image_layout(config, Images(1, (448, 448)))
    assert (one.tiles, one.tokens, one.patches) == (1, 256, 1024)


@pytest.mark.parametrize("count", [0, 1, 3])
def test_the_batch_is_what_the_real_model_takes(count):
    # Real tensors, transformers' checks on (the image tokens must match the features: 4 a tile).
    layout = real_model_takes("tiny-internvl", count, 200)
    assert layout.tiles == 7  # 3:2, a 3 x 2 grid and the thumbnail


def test_axolotls_lora_kernels_fail_on_internvl():
    # get_attention_cls_from_config has no case for internvl, and the module it guesses
    # (modeling_internvl.InternvlAttention) has no such class: Axolotl raises as it loads the model.
    config = resolve_model("OpenGVLab/InternVL3_5-8B-HF").config
    with pytest.raises(InvalidInput, match="could not import attention class for model_type: internvl"):
        check_checkpoint(config, ("mlp", "qkv", "o", "embedding"))
    check_checkpoint(config, ("embedding",))  # patches nothing alone


def test_preset_parameter_count_matches_the_published_total():
    # InternVL3.5's model card: InternVL3.5-8B, 0.3B vision (InternViT-300M) + 8.2B language
    # (Qwen3-8B, 8,190,735,360) = 8.5B.
    from transformers import AutoModelForImageTextToText

    spec = resolve_model("OpenGVLab/InternVL3_5-8B-HF")
    assert infer_task(spec.config)[0] == VLM
    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(spec.config)
    total = sum(p.numel() for p in model.parameters())
    language = sum(p.numel() for n, p in model.named_parameters() if "language_model" in n or "lm_head" in n)
    assert language == 8_190_735_360
    assert round(total / 1e9, 1) == 8.5 and round((total - language) / 1e9, 1) == 0.3


# --- LFM2-VL ----------------------------------------------------------------------------------------

LFM2_VL = "LiquidAI/LFM2-VL-450M"
_PROCESSOR_CONFIG = {"min_tiles": 2, "max_tiles": 10, "tile_size": 512, "use_thumbnail": False,
                     "min_image_tokens": 64, "max_image_tokens": 256, "encoder_patch_size": 16,
                     "downsample_factor": 2, "max_pixels_tolerance": 2.0}


def _methods(module: str, file: str, class_name: str, names: set[str], namespace: dict) -> type:
    """A class of the named methods of transformers' ``class_name`` (models/<module>/<file>), their
    source run as it is, undecorated (the module imports torchvision, which this environment has not)."""
    import transformers

    path = Path(transformers.__file__).parent / "models" / module / file
    tree = ast.parse(path.read_text())
    found = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name in names]
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name in names:
                    item.decorator_list = []
                    found.append(item)
    exec(compile(ast.Module(body=found, type_ignores=[]), str(path), "exec"), namespace)  # noqa: S102
    return type(class_name, (), {name: namespace[name] for name in names if name in namespace})


def transformers_lfm2_vl(height: int, width: int) -> tuple[int, int, int, int]:
    """(rows, columns, tokens, markers) of an image as transformers' Lfm2VlImageProcessor
    (``_is_image_too_large``, ``smart_resize``, ``_get_grid_layout``) and Lfm2VlProcessor
    (``_get_image_num_tokens``, ``_build_image_tokens``) make them, with LFM2-VL-450M's settings."""
    import math

    image = _methods("lfm2_vl", "image_processing_lfm2_vl.py", "Lfm2VlImageProcessor",
                     {"round_by_factor", "find_closest_aspect_ratio", "smart_resize", "_is_image_too_large",
                      "_get_grid_layout", "_target_ratios"}, {"math": math})()
    c = _PROCESSOR_CONFIG
    new_width, new_height = image.smart_resize(height, width, c["downsample_factor"], c["min_image_tokens"],
                                               c["max_image_tokens"], c["encoder_patch_size"])
    rows = columns = 1
    if image._is_image_too_large(height, width, c["max_image_tokens"], c["encoder_patch_size"],
                                 c["downsample_factor"], c["max_pixels_tolerance"]):
        columns, rows, *_ = image._get_grid_layout(height, width, c["min_tiles"], c["max_tiles"],
                                                   c["tile_size"])
    processor = _methods("lfm2_vl", "processing_lfm2_vl.py", "Lfm2VlProcessor",
                         {"_compute_tokens_per_tile", "_compute_tokens_for_image", "_build_image_tokens"},
                         {"math": math})()
    processor.image_start_token, processor.image_end_token = "<|image_start|>", "<|image_end|>"
    processor.image_thumbnail_token, processor.image_token = "<|img_thumbnail|>", "<image>"
    per_tile = processor._compute_tokens_per_tile(c["tile_size"], c["encoder_patch_size"],
                                                  c["downsample_factor"])
    for_image = processor._compute_tokens_for_image([new_height, new_width], c["encoder_patch_size"],
                                                    c["downsample_factor"])
    text = processor._build_image_tokens(rows, columns, per_tile, for_image, c["use_thumbnail"], True)
    return rows, columns, text.count("<image>"), text.count("<|")


@pytest.mark.parametrize(("width", "height"), SIZES + [(1024, 1024), (725, 725), (2000, 300)])
def test_lfm2_vl_tiles_and_tokens_are_the_processors(width, height):
    config = resolve_model(LFM2_VL).config
    layout = image_layout(config, Images(1, (width, height)))
    rows, columns, tokens, markers = transformers_lfm2_vl(height, width)
    assert layout.tiles == rows * columns
    assert (layout.tokens, layout.markers) == (tokens, markers)
    batch = make_batch(config, VLM, 2, layout.row_tokens + 16, device="meta",
                       images=Images(1, (width, height)))
    assert tuple(batch["pixel_values"].shape) == (2 * layout.tiles, 1024, 768)
    assert tuple(batch["pixel_attention_mask"].shape) == (2 * layout.tiles, 1024)
    assert tuple(batch["spatial_shapes"].shape) == (2 * layout.tiles, 2)


def test_cocos_640x480_in_lfm2_vl_is_one_tile():
    # 640 x 480 is under 256 x 2.0 tokens: smart_resize to 576 x 416 (36 x 26 patches, 18 x 13 tokens);
    # 1280 x 960 is over: a 3 x 2 grid of 512-pixel tiles (4:3 has no 12 tiles of at most 10), 6 x 256.
    config = resolve_model(LFM2_VL).config
    coco = image_layout(config, Images())
    assert (coco.tiles, coco.processed, coco.tokens, coco.markers, coco.patches) == (
        1, (576, 416), 234, 2, 936)
    large = image_layout(config, Images(1, (1280, 960)))
    assert (large.tiles, large.processed, large.tokens, large.markers) == (6, (1536, 1024), 1536, 8)
    assert "cut into 6 tiles (a 1536x1024 grid)" in large.label


@pytest.mark.parametrize("size", [(84, 56), (1280, 960)])
def test_the_lfm2_vl_batch_is_what_the_real_model_takes(size):
    torch.manual_seed(0)
    model, _ = build_model(resolve_model("tiny-lfm2_vl"), VLM, None)
    layout = image_layout(model.config, Images(1, size))
    for count in (0, 1):
        batch = make_batch(model.config, VLM, 1, count * layout.row_tokens + 32, images=Images(count, size))
        loss = model(**batch).loss
        loss.backward()
        assert torch.isfinite(loss)
        tokens = (batch["input_ids"] == model.config.image_token_id).sum(dim=1)
        assert tokens.tolist() == [count * layout.tokens]


def test_lfm2_vl_preset_parameter_count_matches_the_published_total():
    # LFM2-VL's model card: LFM2-VL-450M, 450M parameters: LFM2-350M (354,483,968) and a SigLIP2 NaFlex
    # base tower (86M) with its projector.
    from transformers import AutoModelForImageTextToText

    spec = resolve_model(LFM2_VL)
    assert infer_task(spec.config)[0] == VLM
    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(spec.config)
    total = sum(p.numel() for p in model.parameters())
    language = sum(p.numel() for n, p in model.named_parameters() if "language_model" in n or "lm_head" in n)
    tower = sum(p.numel() for n, p in model.named_parameters() if "vision_tower" in n)
    assert language == 354_483_968 and round(tower / 1e6) == 86
    assert round(total / 1e6, -1) == 450
