"""The GLM mixture-of-experts presets (presets/glm.py): published totals, the shapes that size the
experts Axolotl quantizes on load, and the tiny configs of their two model types."""

from __future__ import annotations

import math

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from autotune.workload.models import PRESETS, infer_task, preset_name, resolve_model

GLM = ["zai-org/GLM-4.5-Air", "zai-org/GLM-4.7-Flash"]


def fake_causal_lm(name: str) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    with FakeTensorMode():
        return AutoModelForCausalLM.from_config(resolve_model(name).config)


@pytest.mark.parametrize(
    ("name", "params", "figure"),
    [
        # GLM-4.5 model card and transformers' docs (model_doc/glm4_moe.md): GLM-4.5-Air "106 billion
        # total parameters"; the multi-token-prediction layer transformers does not build is left out.
        ("zai-org/GLM-4.5-Air", 106_852_245_504, 106),
        # Axolotl's examples/glm47-flash/README.md: "a 30B-A3B MoE model".
        ("zai-org/GLM-4.7-Flash", 29_943_390_976, 30),
    ],
)
def test_glm_parameter_counts_match_the_published_totals(name: str, params: int, figure: int) -> None:
    count = sum(p.numel() for p in fake_causal_lm(name).parameters())
    assert count == params
    assert round(count / 1e9) == figure or math.floor(count / 1e9) == figure


@pytest.mark.parametrize(
    ("name", "model_class", "gate_up", "down"),
    [
        # 128 experts of width 1408 over hidden 4096; 64 of width 1536 over 2048 (slime's definitions)
        ("zai-org/GLM-4.5-Air", "Glm4MoeForCausalLM", (128, 2816, 4096), (128, 4096, 1408)),
        ("zai-org/GLM-4.7-Flash", "Glm4MoeLiteForCausalLM", (64, 3072, 2048), (64, 2048, 1536)),
    ],
)
def test_glm_experts_are_3d_parameters_past_the_dense_first_layer(
    name: str, model_class: str, gate_up: tuple[int, ...], down: tuple[int, ...]
) -> None:
    model = fake_causal_lm(name)
    assert type(model).__name__ == model_class
    layers = model.model.layers
    assert not hasattr(layers[0].mlp, "experts")  # first_k_dense_replace 1
    experts = layers[1].mlp.experts
    assert tuple(experts.gate_up_proj.shape) == gate_up and tuple(experts.down_proj.shape) == down
    config = resolve_model(name).config
    assert config.dtype == torch.bfloat16 and infer_task(config)[0] == "causal-lm"
    assert config._experts_implementation in (None, "grouped_mm")


def test_glm_4_5_air_attends_with_biased_grouped_queries_on_half_rotary_heads() -> None:
    attention = fake_causal_lm("zai-org/GLM-4.5-Air").model.layers[0].self_attn
    assert tuple(attention.q_proj.weight.shape) == (96 * 128, 4096) and attention.q_proj.bias is not None
    assert tuple(attention.k_proj.weight.shape) == (8 * 128, 4096) and attention.o_proj.bias is None
    assert PRESETS["zai-org/GLM-4.5-Air"]["partial_rotary_factor"] == 0.5


def test_glm_4_7_flash_compresses_queries_and_keys_values() -> None:
    attention = fake_causal_lm("zai-org/GLM-4.7-Flash").model.layers[0].self_attn
    assert tuple(attention.q_a_proj.weight.shape) == (768, 2048)
    assert tuple(attention.kv_a_proj_with_mqa.weight.shape) == (512 + 64, 2048)
    assert tuple(attention.o_proj.weight.shape) == (2048, 20 * 256)


@pytest.mark.parametrize(("typed", "preset"), [("GLM-4.5-Air", GLM[0]), ("glm-4.7-flash", GLM[1])])
def test_glm_presets_resolve_without_their_org(typed: str, preset: str) -> None:
    assert preset_name(typed) == preset


@pytest.mark.parametrize("model_type", ["glm4_moe", "glm4_moe_lite"])
def test_tiny_glm_configs_build_small_mixtures(model_type: str) -> None:
    model = fake_causal_lm(f"tiny-{model_type}")
    assert len(model.model.layers) == 2 and model.model.layers[1].mlp.experts.gate_up_proj.ndim == 3


def test_glm_4_32b_0414_counts_the_32_billion_of_its_release() -> None:
    # THUDM/GLM-4 README (the 0414 release): "GLM-4-32B-0414 series models, featuring 32 billion
    # parameters" (32.57B, truncated).
    count = sum(p.numel() for p in fake_causal_lm("zai-org/GLM-4-32B-0414").parameters())
    assert count == 32_566_081_536
    assert math.floor(count / 1e9) == 32


def test_glm_4_32b_0414_has_unbiased_grouped_queries_on_half_rotary_heads_and_four_norms() -> None:
    model = fake_causal_lm("zai-org/GLM-4-32B-0414")
    assert type(model).__name__ == "Glm4ForCausalLM"
    layer = model.model.layers[0]
    attention = layer.self_attn
    assert tuple(attention.q_proj.weight.shape) == (48 * 128, 6144) and attention.q_proj.bias is None
    assert tuple(attention.k_proj.weight.shape) == (2 * 128, 6144)
    assert tuple(layer.mlp.gate_up_proj.weight.shape) == (2 * 23040, 6144)  # gate and up fused
    assert {name for name, _ in layer.named_children()} >= {"post_self_attn_layernorm", "post_mlp_layernorm"}
    spec = resolve_model("zai-org/GLM-4-32B-0414")
    assert spec.config.rope_parameters["partial_rotary_factor"] == 0.5 and spec.config.dtype == torch.bfloat16
    assert infer_task(spec.config)[0] == "causal-lm" and spec.max_seq_len == 32768


def test_glm_4_32b_0414_resolves_under_its_thudm_name() -> None:
    assert preset_name("THUDM/GLM-4-32B-0414") == "zai-org/GLM-4-32B-0414"
    assert preset_name("glm-4-32b-0414") == "zai-org/GLM-4-32B-0414"
