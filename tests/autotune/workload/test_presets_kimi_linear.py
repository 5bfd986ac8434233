"""The Kimi Linear preset: its parameter count against the published total, its layer map, and the
estimator's refusal of its Kimi Delta Attention kernels."""

from __future__ import annotations

import pytest

from autotune.errors import InvalidInput
from autotune.workload import kimi_delta_attention
from autotune.workload.models import resolve_model
from tests.autotune.workload.test_presets_llm import fake_causal_lm, parameter_count, published

NAME = "moonshotai/Kimi-Linear-48B-A3B-Instruct"


def test_kimi_linear_count_is_the_published_total() -> None:
    # A parameter-counter's ground truth, ("moonshotai_Kimi-Linear-48B-A3B-Instruct", 49.123, ...)
    # (find_string id 71352361367; its Falcon-H1-34B figure, 33.643, is that preset's count too).
    assert published(parameter_count(fake_causal_lm(NAME)), "49.123B")


def test_kimi_linear_puts_mla_in_seven_layers_and_kda_in_the_others() -> None:
    config = resolve_model(NAME).config
    full = [i for i, kind in enumerate(config.layer_types) if kind == "full_attention"]
    assert full == [3, 7, 11, 15, 19, 23, 26]  # the checkpoint's 1-based full_attn_layers
    assert config.layer_types.count("linear_attention") == 20
    assert config.mlp_layer_types == ["dense"] + ["sparse"] * 26
    assert (config.num_local_experts, config.num_experts_per_tok, config.linear_num_heads,
            config.linear_head_dim) == (256, 8, 32, 128)


def test_the_estimator_refuses_kimi_delta_attention_by_name() -> None:
    with pytest.raises(InvalidInput, match="chunk_kda"):
        kimi_delta_attention.check_kernels(resolve_model(NAME).config.model_type)
    kimi_delta_attention.check_kernels("qwen3_next")  # fla's gated delta rule: emulated elsewhere
