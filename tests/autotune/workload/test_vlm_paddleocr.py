"""PaddleOCR-VL: its image processor (workload/vision.py, Qwen2-VL's layout), its preset
(presets/paddleocr.py) and its projector's loop on fake tensors (backends/estimate/paddleocr.py)."""

from __future__ import annotations

import pytest
import torch
from processors import SIZES, given_positions_are_the_models_own, real_model_takes, transformers_function

import autotune
from autotune.workload.models import infer_task, resolve_model
from autotune.workload.step import build_model, make_batch
from autotune.workload.vision import (
    IMAGE_TEXT_TO_TEXT,
    PADDLEOCR_MAX_PIXELS,
    PADDLEOCR_MIN_PIXELS,
    Images,
    image_layout,
)

VLM = IMAGE_TEXT_TO_TEXT
PADDLEOCR = "PaddlePaddle/PaddleOCR-VL-1.6"
TINY = "tiny-paddleocr_vl"


@pytest.mark.parametrize(("width", "height"), SIZES)
def test_image_tokens_and_patches_are_the_processors(width, height):
    # transformers' own smart_resize (image_processing_paddleocr_vl.py, run alone: its module needs
    # torchvision) with the checkpoint's pixel bounds; PaddleOCRVLProcessor.replace_image_token: grid
    # patches / merge**2 tokens; pixel_values [patches, 3, 14, 14] (patchify keeps each patch an image).
    theirs = transformers_function("paddleocr_vl", "image_processing_paddleocr_vl", "smart_resize")
    config = resolve_model(PADDLEOCR).config
    layout = image_layout(config, Images(1, (width, height)))
    resized_h, resized_w = theirs(height, width, factor=28, min_pixels=PADDLEOCR_MIN_PIXELS,
                                  max_pixels=PADDLEOCR_MAX_PIXELS)
    assert layout.processed == (resized_w, resized_h)
    assert layout.grid == (1, resized_h // 14, resized_w // 14)
    assert layout.tokens == layout.patches // 4 and layout.markers == 2
    batch = make_batch(config, VLM, 2, layout.row_tokens + 16, device="meta",
                       images=Images(1, (width, height)))
    assert tuple(batch["pixel_values"].shape) == (2 * layout.patches, 3, 14, 14)
    assert tuple(batch["image_interp_indices"].shape) == (2 * layout.patches, 4)


@pytest.mark.parametrize("count", [0, 1, 2])
def test_the_batch_is_what_the_real_model_takes(count):
    # Real tensors, transformers' checks on (the image tokens must match the projector's features).
    real_model_takes(TINY, count, 480)


def test_the_given_positions_and_tower_indices_are_the_models_own():
    # position_ids (get_rope_index), the tower's positions and its position table's resampling, given,
    # make the model's own logits.
    given_positions_are_the_models_own(TINY, 480)


def test_the_batched_projector_gives_the_models_own_features():
    from autotune.backends.estimate.paddleocr import route_paddleocr

    torch.manual_seed(0)
    model, _ = build_model(resolve_model(TINY), VLM, None)
    model.eval()
    projector = model.model.projector
    features = torch.randn(3 * 8 * 10, model.config.vision_config.hidden_size)
    for grids in ([[1, 8, 6]] * 3, [[1, 8, 6], [1, 4, 6], [1, 8, 10]]):
        rows = sum(t * h * w for t, h, w in grids)
        with torch.no_grad():
            theirs = projector(features[:rows], torch.tensor(grids))
            route_paddleocr(model)
            ours = projector(features[:rows], torch.tensor(grids))
            del projector.forward  # the model's own again
        assert ours.shape == theirs.shape and torch.allclose(ours, theirs, atol=1e-5)


def test_a_tiny_check_answers_and_more_images_raise_the_peak():
    # An 84 x 56 image is scaled up to the checkpoint's 147384-pixel floor: 476 x 336, 204 tokens.
    def check(count):
        return autotune.check(TINY, seq_len=960, batch_size=2, gpu_memory="1GiB", backend="estimate",
                              workers=1, image_size="84x56", images_per_sample=count, dtype="bfloat16")

    one, three = check(1), check(3)
    assert one.fits and one.images["tokens"] == 204
    assert three.peak_memory_bytes > one.peak_memory_bytes


def test_paddleocr_vl_builds_its_0_9b():
    # PaddleOCRVLConfig.__post_init__ (transformers 5.24) ties the embeddings of a checkpoint whose
    # top-level tie_word_embeddings is false (its text config's default, True, forwarded): 799,695,472
    # parameters built; the checkpoint's lm_head beside them makes the "0.9B" of PaddleOCR-VL-0.9B.
    from transformers import AutoModelForImageTextToText

    spec = resolve_model(PADDLEOCR)
    assert infer_task(spec.config)[0] == VLM
    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(spec.config)
    total = sum(p.numel() for p in model.parameters())
    assert total == 799_695_472
    assert round((total + 103424 * 1024) / 1e9, 1) == 0.9


@pytest.mark.parametrize("attn", ["flash_attention_2", "sdpa"])
def test_a_step_with_images_is_extrapolated(attn):
    # The projector's and the vision attention's per-image loops batched: two traced runs give the
    # cell's other batch sizes.
    from autotune.request import Step, TableRequest, Target, resolve
    from autotune.tuner import budget_bytes

    step = Step(model=TINY, image_size="84x56", images_per_sample=1, attn=attn, dtype="bfloat16")
    resolved = resolve(TableRequest(step, Target(gpu_memory="1GiB", backend="estimate"), seq_lens=[512],
                                    modes="bf16"))
    budget = budget_bytes(resolved.gpu, resolved.margin)
    with resolved.backend.cell(resolved.workload, resolved.modes[0], 512, budget) as cell:
        probes = [cell.fits(batch) for batch in (2, 3, 4, 5)]
    assert [p.details["estimate"] for p in probes][:2] == ["traced", "traced"]
    assert {p.details["estimate"] for p in probes[2:]} != {"traced"}
    assert probes[-1].peak_bytes > probes[0].peak_bytes
