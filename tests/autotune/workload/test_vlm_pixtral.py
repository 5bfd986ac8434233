"""Pixtral's image processor (workload/vision.py ``pixtral_resize``), as LLaVA's Pixtral-12B and Mistral 3
(Mistral Small 3.1, Magistral Small, Ministral 3) take their images, and the presets of
presets/mistral3.py."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import pytest
import torch
from processors import image_cell_probes, real_model_takes

from autotune.workload.models import infer_task, resolve_model
from autotune.workload.step import build_model, make_batch
from autotune.workload.vision import IMAGE_TEXT_TO_TEXT, Images, image_layout, pixtral_resize

VLM = IMAGE_TEXT_TO_TEXT
SIZES = [(640, 480), (448, 448), (1280, 720), (224, 224), (100, 57), (3000, 2000), (28, 28), (5000, 4000),
         (1540, 1541)]


def transformers_resize():
    """transformers' own ``get_resize_output_image_size`` and ``_num_image_tokens``
    (models/pixtral/image_processing_pixtral.py), their source run as it is (the module imports
    torchvision, which this environment has not); the image is given as its (height, width)."""
    import transformers

    path = Path(transformers.__file__).parent / "models" / "pixtral" / "image_processing_pixtral.py"
    tree = ast.parse(path.read_text())
    found = [node for node in tree.body if isinstance(node, ast.FunctionDef)
             and node.name in ("_num_image_tokens", "get_resize_output_image_size")]
    namespace: dict = {"math": math, "ImageInput": object, "ChannelDimension": object,
                       "get_image_size": lambda image, input_data_format=None: image}
    exec(compile(ast.Module(body=found, type_ignores=[]), str(path), "exec"), namespace)  # noqa: S102
    return namespace["get_resize_output_image_size"]


@pytest.mark.parametrize(("width", "height"), SIZES)
@pytest.mark.parametrize(("longest", "patch"), [(1024, 16), (1540, 28)])
def test_pixtral_resize_is_transformers_own(width, height, longest, patch):
    theirs = transformers_resize()((height, width), size=(longest, longest), patch_size=(patch, patch))
    assert pixtral_resize(height, width, longest, patch) == tuple(theirs)


@pytest.mark.parametrize(("width", "height"), SIZES)
@pytest.mark.parametrize(("name", "patch", "merge", "longest"), [
    ("mistralai/Ministral-3-3B-Reasoning-2512", 14, 2, 1540),
    ("mistralai/Mistral-Small-3.1-24B-Instruct-2503", 14, 2, 1540),
    ("mistral-community/pixtral-12b", 16, 1, 1024),
])
def test_image_tokens_and_patches_are_the_processors(width, height, name, patch, merge, longest):
    # PixtralProcessor._get_num_multimodal_tokens: (W/p + 1) * H/p tokens an image, [IMG] and the
    # [IMG_BREAK]/[IMG_END] of each row, p = patch_size x spatial_merge_size; the tower embeds
    # (H/patch)(W/patch) patches; pixel_values [images, 3, H, W], image_sizes [images, 2].
    config = resolve_model(name).config
    layout = image_layout(config, Images(1, (width, height)))
    p = patch * merge
    resized_h, resized_w = transformers_resize()((height, width), size=(longest, longest),
                                                 patch_size=(p, p))
    assert layout.processed == (resized_w, resized_h)
    assert layout.tokens + layout.markers == (resized_w // p + 1) * (resized_h // p)
    assert layout.tokens == (resized_w // p) * (resized_h // p) and layout.markers == resized_h // p
    assert layout.patches == (resized_w // patch) * (resized_h // patch)
    batch = make_batch(config, VLM, 2, layout.row_tokens + 16, device="meta",
                       images=Images(1, (width, height)))
    assert tuple(batch["pixel_values"].shape) == (2, 3, resized_h, resized_w)
    assert tuple(batch["image_sizes"].shape) == (2, 2)


def test_cocos_640x480_in_mistral3_and_pixtral_12b():
    # Mistral 3: sides up to multiples of 28 (644 x 504), 23 x 18 merged patches, 18 row markers;
    # Pixtral-12B: 40 x 30 patches of 16, 30 row markers.
    mistral3 = image_layout(resolve_model("mistralai/Ministral-3-3B-Reasoning-2512").config, Images())
    assert (mistral3.processed, mistral3.tokens, mistral3.markers, mistral3.patches) == (
        (644, 504), 414, 18, 1656)
    pixtral = image_layout(resolve_model("mistral-community/pixtral-12b").config, Images())
    assert (pixtral.processed, pixtral.tokens, pixtral.markers, pixtral.patches) == (
        (640, 480), 1200, 30, 1200)
    large = image_layout(resolve_model("mistral-community/pixtral-12b").config, Images(1, (3000, 2000)))
    assert large.processed == (1024, 688)  # scaled to the longest edge 1024, then up to 16s


@pytest.mark.parametrize("name", ["tiny-mistral3", "tiny-pixtral"])
@pytest.mark.parametrize("count", [0, 1, 3])
def test_the_batch_is_what_the_real_model_takes(name, count):
    # Real tensors, transformers' checks on (the [IMG] tokens must match the merged features).
    real_model_takes(name, count, 200)


@pytest.mark.parametrize(("name", "params", "language"), [
    # Public listings of the hub's counts: Mistral Small 3.1 (keras-hub's mistral3 presets) and 3.2
    # 24,011,361,280; Ministral-3-3B-Reasoning-2512 4,251,743,232; Pixtral-12B "12.7B" on the hub, its
    # text model Mistral NeMo 12B's 12,247,782,400.
    ("mistralai/Mistral-Small-3.1-24B-Instruct-2503", 24_011_361_280, None),
    ("mistralai/Magistral-Small-2509", 24_011_361_280, None),
    ("mistralai/Ministral-3-3B-Reasoning-2512", 4_251_743_232, None),
    ("mistral-community/pixtral-12b", None, 12_247_782_400),
])
def test_preset_parameter_counts_match_the_published_totals(name, params, language):
    from transformers import AutoModelForImageTextToText

    spec = resolve_model(name)
    assert infer_task(spec.config)[0] == VLM
    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(spec.config)
    total = sum(p.numel() for p in model.parameters())
    if params is not None:
        assert total == params
    else:
        assert round(total / 1e9, 1) == 12.7
        assert sum(p.numel() for n, p in model.named_parameters()
                   if "language_model" in n or "lm_head" in n) == language


# --- the estimator: the tower's and the merger's per-image loops batched (backends/estimate/pixtral.py) ---


@pytest.mark.parametrize("name", ["tiny-mistral3", "tiny-pixtral"])
@pytest.mark.parametrize("attn", ["sdpa", "eager", "flash_attention_2"])
def test_the_batched_tower_and_merger_give_the_models_own_features(name, attn):
    # Real tensors: the routed model's image features are the model's own (SDPA's block mask is
    # the reference of flash_attention_2's varlen call), images alike (batched) or not (the model's
    # own loop).
    from autotune.backends.estimate.pixtral import route_pixtral

    torch.manual_seed(0)
    model, _ = build_model(resolve_model(name), VLM, "sdpa")
    model.eval()
    routed, _ = build_model(resolve_model(name), VLM, attn, flash_as_sdpa=True)
    routed.load_state_dict(model.state_dict())
    routed.eval()
    route_pixtral(routed, attn)
    assert type(routed.model.vision_tower).forward is not routed.model.vision_tower.forward
    patch = model.config.vision_config.patch_size * getattr(model.config, "spatial_merge_size", 1)
    pixels = torch.randn(3, 3, 8 * patch, 8 * patch)
    layers = {"vision_feature_layer": model.config.vision_feature_layer}
    if hasattr(model.config, "vision_feature_select_strategy"):  # LLaVA's
        layers["vision_feature_select_strategy"] = model.config.vision_feature_select_strategy
    for sizes in ([[8 * patch, 8 * patch]] * 3, [[8 * patch, 4 * patch]] * 3,
                  [[8 * patch, 8 * patch], [2 * patch, 6 * patch], [8 * patch, 4 * patch]]):
        with torch.no_grad():
            ours, theirs = (m.model.get_image_features(pixel_values=pixels, image_sizes=torch.tensor(sizes),
                                                       **layers) for m in (routed, model))
        assert [t.shape for t in ours.pooler_output] == [t.shape for t in theirs.pooler_output]
        for a, b in zip(ours.pooler_output, theirs.pooler_output, strict=True):
            assert torch.allclose(a, b, atol=1e-5)
    if attn != "flash_attention_2":  # the text model's flash stand-in runs without the mask
        batch = make_batch(model.config, VLM, 2, 200, images=Images(2, (84, 56)))
        with torch.no_grad():
            assert torch.allclose(routed(**batch).logits, model(**batch).logits, atol=1e-5)


@pytest.mark.parametrize("name", ["tiny-mistral3", "tiny-pixtral"])
def test_a_flash_attention_step_with_images_is_extrapolated(name):
    # The per-image loops batched and the varlen attention without the [patches, patches] mask:
    # two traced runs give the cell's other batch sizes.
    probes = image_cell_probes(name, "bf16", attn="flash_attention_2", dtype="bfloat16")
    assert [p.details["estimate"] for p in probes][:2] == ["traced", "traced"]
    assert {p.details["estimate"] for p in probes[2:]} != {"traced"}
    assert probes[-1].peak_bytes > probes[0].peak_bytes


def test_mistral_medium_3_5_counts_its_128b():
    # The model card's dense 128B: Devstral 2 123B's text model (88 layers of 12288, lm_head apart)
    # and a 48-layer Pixtral tower of 1664 with Mistral 3's merger and projector.
    from transformers import AutoModelForImageTextToText

    spec = resolve_model("axolotl-ai-co/Mistral-Medium-3.5-128B-BF16")
    assert spec.config.text_config.num_hidden_layers == 88
    assert infer_task(spec.config)[0] == VLM
    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(spec.config)
    total = sum(p.numel() for p in model.parameters())
    language = sum(p.numel() for n, p in model.named_parameters() if "language_model" in n or "lm_head" in n)
    assert total == 127_704_210_176 and round(total / 1e9) == 128
    assert round(language / 1e9, 1) == 125.0


def test_mistral_small_4_counts_119b_and_6_5b_active():
    # The model card's 119B (Axolotl's examples/mistral4/README.md: "119B parameter (6.5B active)"):
    # 4 of the 128 routed experts a token, the embedding table not counted as active.
    from transformers import AutoModelForImageTextToText

    spec = resolve_model("mistralai/Mistral-Small-4-119B-2603")
    assert infer_task(spec.config)[0] == VLM
    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(spec.config)
    total = sum(p.numel() for p in model.parameters())
    text = spec.config.text_config
    experts = sum(p.numel() for n, p in model.named_parameters() if ".mlp.experts." in n)
    idle = experts * (text.n_routed_experts - text.num_experts_per_tok) // text.n_routed_experts
    embedding = model.get_input_embeddings().weight.numel()
    assert total == 119_401_298_944 and round(total / 1e9) == 119
    assert round((total - idle - embedding) / 1e9, 1) == 6.5
