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
