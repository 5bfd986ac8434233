"""The Nemotron 3 presets (presets/nemotron_h.py): their parameter counts against the published totals,
their layer patterns, and the tiny config's build."""

from __future__ import annotations

import pytest

from autotune.workload.models import infer_task, preset_name, resolve_model
from tests.autotune.workload.test_presets_llm import fake_causal_lm, parameter_count, published

NANO = "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16"
SUPER = "nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-BF16"


@pytest.mark.parametrize(("name", "params", "figure"), [
    (NANO, 31_577_937_344, "31.6B"),  # the model card: "31.6B total parameters"
    # Super's BF16 safetensors (123,611,012,096) less its multi-token-prediction layer (2,942,324,736),
    # which transformers' NemotronHForCausalLM does not build: to the parameter.
    (SUPER, 123_611_012_096 - 2_942_324_736, "120.668687360B"),
])
def test_nemotron_3_counts_are_the_published_totals(name: str, params: int, figure: str) -> None:
    assert parameter_count(fake_causal_lm(name)) == params
    assert published(params, figure)


@pytest.mark.parametrize(("name", "layers"), [
    (NANO, {"linear_attention": 23, "moe": 23, "full_attention": 6}),
    (SUPER, {"linear_attention": 40, "moe": 40, "full_attention": 8}),
])
def test_nemotron_3_patterns_give_each_layer_its_kind(name: str, layers: dict[str, int]) -> None:
    config = resolve_model(name).config
    kinds = config.layers_block_type
    assert {kind: kinds.count(kind) for kind in set(kinds)} == layers
    assert config.num_hidden_layers == len(kinds) and infer_task(config)[0] == "causal-lm"


def test_the_tiny_nemotron_h_builds_each_kind_of_layer_once() -> None:
    model = fake_causal_lm("tiny-nemotron_h")
    mixers = [type(layer.mixer).__name__ for layer in model.model.layers]
    assert mixers == ["NemotronHMamba2Mixer", "NemotronHMoE", "NemotronHAttention"]
    assert preset_name("NVIDIA-Nemotron-3-Nano-30B-A3B-BF16") == NANO
