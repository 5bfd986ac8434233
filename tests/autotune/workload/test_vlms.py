"""The vision-language families of presets/vlms.py (workload/vision.py, backends/estimate/vision.py):
each processor's layout against the processor's own source or its cited sizes, the batch the real
model takes, the estimator's trace of it, and the presets' parameter counts."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from processors import SIZES, given_positions_are_the_models_own, real_model_takes, transformers_smart_resize

import autotune
from autotune.workload.models import infer_task, resolve_model
from autotune.workload.step import build_model, make_batch
from autotune.workload.vision import IMAGE_TEXT_TO_TEXT, Images, image_layout

VLM = IMAGE_TEXT_TO_TEXT
TINY = ("tiny-qwen3_vl", "tiny-qwen3_vl_moe")
# The tiny MoE's experts run transformers' grouped_mm, whose CUDA kernel takes bfloat16 only.
DTYPES = {"tiny-qwen3_vl_moe": "bfloat16"}


@pytest.mark.parametrize(("name", "params"), [
    # the totals the hub shows for the checkpoints' safetensors: 4.44B, 31.1B
    ("Qwen/Qwen3-VL-4B-Instruct", 4.44e9), ("Qwen/Qwen3-VL-30B-A3B-Instruct", 31.1e9),
])
def test_parameter_counts_match_the_published_totals(name, params):
    from transformers import AutoModelForImageTextToText

    spec = resolve_model(name)
    assert infer_task(spec.config)[0] == VLM
    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(spec.config)
    assert sum(p.numel() for p in model.parameters()) == pytest.approx(params, rel=0.002)


# Qwen3.5's processor is Qwen3-VL's (transformers' auto maps: test_vlms3.py), with the same
# preprocessor_config.json values.
@pytest.mark.parametrize("model", ["Qwen/Qwen3-VL-4B-Instruct", "Qwen/Qwen3.5-35B-A3B"])
@pytest.mark.parametrize(("width", "height"), SIZES)
def test_qwen3_vl_images_are_qwen2_vl_s_processor_at_patch_16(model, width, height):
    # Qwen2VLImageProcessor with Qwen3-VL's preprocessor_config.json: smart_resize to multiples of
    # 16 x 2 within [65536, 16777216] pixels, grid (1, h/16, w/16), pixel_values [t*h*w, 3*2*16*16];
    # Qwen3VLProcessor.replace_image_token: grid.prod() // merge**2 <|image_pad|> tokens.
    config = resolve_model(model).config
    layout = image_layout(config, Images(1, (width, height)))
    resized_h, resized_w = transformers_smart_resize()(height, width, 32, 65536, 16777216)
    grid = (1, resized_h // 16, resized_w // 16)
    assert layout.grid == grid and layout.processed == (resized_w, resized_h)
    assert layout.patches == math.prod(grid) and layout.tokens == math.prod(grid) // 4
    batch = make_batch(config, VLM, 2, layout.row_tokens + 16, device="meta",
                       images=Images(1, (width, height)))
    assert tuple(batch["pixel_values"].shape) == (2 * math.prod(grid), 3 * 2 * 16 * 16)
    assert tuple(batch["image_interp_indices"].shape) == (2 * math.prod(grid), 4)


def test_qwen3_vl_s_default_image_is_640x480_in_300_tokens():
    layout = image_layout(resolve_model("Qwen/Qwen3-VL-30B-A3B-Instruct").config, Images())
    assert (layout.processed, layout.patches, layout.tokens) == ((640, 480), 1200, 300)
    assert layout.row_tokens == 302  # with <|vision_start|> and <|vision_end|>


@pytest.mark.parametrize("name", TINY)
@pytest.mark.parametrize("count", [0, 1, 3])
def test_the_batch_is_what_the_real_model_takes(name, count):
    # Real tensors, transformers' checks on (the image tokens must match the features).
    real_model_takes(name, count, 300)


def test_the_given_positions_and_indices_are_the_models_own():
    # position_ids (get_rope_index) and the tower's position and interpolation indices, given, make
    # the logits the model makes computing them itself.
    given_positions_are_the_models_own("tiny-qwen3_vl", 300)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_the_estimators_routes_compute_the_models_own(attn):
    # The per-image attention and DeepStack's selections of a known count give the model's results.
    from autotune.backends.estimate.vision import route_deepstack, route_vision_attention

    torch.manual_seed(0)
    model, _ = build_model(resolve_model("tiny-qwen3_vl"), VLM, attn)
    model.eval()
    routed = copy.deepcopy(model)
    route_vision_attention(routed, attn)
    route_deepstack(routed)
    batch = make_batch(model.config, VLM, 2, 300, images=Images(2, (140, 112)))
    with torch.no_grad():
        assert torch.allclose(routed(**batch).logits, model(**batch).logits, atol=1e-5)


@pytest.mark.parametrize("name", TINY)
def test_a_tiny_check_answers_and_more_images_raise_the_peak(name):
    def check(count):
        return autotune.check(name, seq_len=512, batch_size=2, gpu_memory="1GiB", backend="estimate",
                              workers=1, image_size="224x224", images_per_sample=count,
                              dtype=DTYPES.get(name, "auto"))

    one, three = check(1), check(3)
    assert one.fits and one.images["tokens"] == 64  # 224 -> 256 (the 65536-pixel floor): 16 x 16 / 4
    assert three.peak_memory_bytes > one.peak_memory_bytes


def test_axolotl_s_lora_kernels_on_qwen3_vl_give_peft_s_loss_and_gradients():
    # get_attention_cls_from_config names Qwen3VLTextAttention for qwen3_vl, whose forward
    # patch_self_attn_lora rewrites; get_layers takes the language model's layers.
    import contextlib

    from autotune.workload.adapters import make_adapter, prepare
    from autotune.workload.lora_kernel_functions import KernelHooks
    from autotune.workload.lora_kernels import apply_kernels
    from autotune.workload.step import gradient_checkpointing

    plain = KernelHooks(dequantize=lambda layer: layer.weight, registers=contextlib.nullcontext,
                        autocast=lambda: (None, contextlib.nullcontext))
    torch.manual_seed(0)
    model, _ = build_model(resolve_model("tiny-qwen3_vl"), VLM, None)
    targets = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"  # the tower's are named otherwise
    reference = prepare(model, make_adapter("lora", r=4, alpha=8, dropout=0.0, targets=targets), VLM)
    for name, parameter in reference.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(parameter, std=0.2)  # PEFT starts B at 0: make the LoRA path count
    patched = copy.deepcopy(reference)
    apply_kernels(patched, ("mlp", "qkv", "o"), plain)
    batch = make_batch(model.config, VLM, 2, 120, images=Images(1, (64, 64)))

    def loss_and_grads(m):
        with gradient_checkpointing(m, True):
            m.train()
            loss = m(**batch).loss
            loss.backward()
        return loss, {n: p.grad for n, p in m.named_parameters() if p.grad is not None}

    (loss, grads), (expected, expected_grads) = loss_and_grads(patched), loss_and_grads(reference)
    assert torch.allclose(loss, expected, rtol=1e-5) and grads.keys() == expected_grads.keys()
    for name, grad in grads.items():
        assert torch.allclose(grad, expected_grads[name], rtol=1e-4, atol=1e-6), name
    replaced = sorted(n.rsplit(".", 1)[-1] for n, m in patched.named_modules() if "forward" in vars(m))
    assert replaced == sorted(["k_proj", "o_proj", "q_proj", "v_proj", "mlp"] * 2)
