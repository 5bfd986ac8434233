"""Qwen3.5 and Qwen3-Next presets (presets/qwen_hybrid.py): parameter totals against the published
names' sizes, their hybrid layer pattern, built under FakeTensorMode as the estimator builds them."""

from __future__ import annotations

import pytest
from torch._subclasses.fake_tensor import FakeTensorMode

from autotune.workload.models import infer_task, resolve_model


@pytest.mark.parametrize(
    ("name", "params", "published"),
    [
        # Qwen3.5 model cards: 27B and 35B in total (3B activated); the text model that
        # AutoModelForCausalLM builds, without the 27-block vision tower (depth 27, hidden 1152, about
        # 0.45B) that the checkpoints also hold (the 35B-A3B's preset is its VLM: test_vlms3.py), and
        # without the multi-token-prediction layer.
        ("Qwen/Qwen3.5-27B", 26_895_998_464, 27),
        ("Qwen/Qwen3.5-35B-A3B", 34_660_610_688, 35),
        # Qwen3-Next model card: 80B in total, 3B activated (the MTP layer not built by transformers).
        ("Qwen/Qwen3-Next-80B-A3B-Instruct", 79_674_391_296, 80),
    ],
)
def test_parameter_counts_round_to_the_published_totals(name: str, params: int, published: int) -> None:
    from transformers import AutoModelForCausalLM

    spec = resolve_model(name)
    with FakeTensorMode():
        model = AutoModelForCausalLM.from_config(spec.config)
    count = sum(p.numel() for p in model.parameters())
    assert count == params
    assert round(count / 1e9) == published
    vlm = name == "Qwen/Qwen3.5-35B-A3B"
    assert infer_task(spec.config)[0] == ("image-text-to-text" if vlm else "causal-lm")
    assert spec.config.get_text_config().layer_types[:4] == ["linear_attention"] * 3 + ["full_attention"]


@pytest.mark.parametrize(
    ("name", "text", "vlm", "published", "unit"),
    [
        # The release's other sizes, each a vision-language model (presets/qwen_hybrid.py): its text
        # model (AutoModelForCausalLM) and the whole VLM; the name's size is one of the two at the name's
        # precision (the 397B counts its tower, the 122B does not), neither counting the multi-token
        # prediction layer. Embeddings tied on the 0.8B and the 4B (untied, 0.25B and 0.64B more).
        # The 9B's VLM and its MTP layer (one full-attention layer, about 0.24B) are the 9.65B the hub
        # lists for its safetensors.
        ("Qwen/Qwen3.5-0.8B", 752_393_024, 852_985_920, 8, 1e8),
        ("Qwen/Qwen3.5-4B", 4_205_751_296, 4_539_265_536, 4, 1e9),
        ("Qwen/Qwen3.5-9B", 8_953_803_264, 9_409_813_744, 9, 1e9),
        ("Qwen/Qwen3.5-122B-A10B", 122_111_526_912, 122_562_817_776, 122, 1e9),
        ("Qwen/Qwen3.5-397B-A17B", 396_346_350_336, 396_802_360_816, 397, 1e9),
    ],
)
def test_the_other_qwen3_5_sizes_are_their_vlms_of_the_published_totals(
    name: str, text: int, vlm: int, published: int, unit: float
) -> None:
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    spec = resolve_model(name)
    with FakeTensorMode():
        text_model = AutoModelForCausalLM.from_config(spec.config)
        model = AutoModelForImageTextToText.from_config(spec.config)
    assert type(model).__name__ in ("Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration")
    assert sum(p.numel() for p in text_model.parameters()) == text
    assert sum(p.numel() for p in model.parameters()) == vlm
    assert published in (round(text / unit), round(vlm / unit))
    assert infer_task(spec.config)[0] == "image-text-to-text"
    config = spec.config.get_text_config()
    assert config.layer_types[:4] == ["linear_attention"] * 3 + ["full_attention"]
    assert spec.config.vision_config.out_hidden_size == config.hidden_size
    tied = name in ("Qwen/Qwen3.5-0.8B", "Qwen/Qwen3.5-4B")
    assert spec.config.tie_word_embeddings is tied
    assert (model.lm_head.weight is model.model.language_model.embed_tokens.weight) is tied
