"""The Granite 4.0 H-Tiny preset: its parameter count against the published total, the keys that shape
its memory, its layer order, and its Mamba-2 mixers traced through transformers' torch path."""

from __future__ import annotations

from autotune.workload import mamba_mixer
from autotune.workload.models import resolve_model
from tests.autotune.workload.test_presets_llm import fake_causal_lm, parameter_count, published


def test_h_tiny_s_count_is_the_published_total() -> None:
    # Granite-4.0-H-Tiny's model card, as a public copy of it gives it (DocDBrown/IBMGranite4Tiny
    # README.md): "a 7B parameter long-context instruct model".
    params = parameter_count(fake_causal_lm("ibm-granite/granite-4.0-h-tiny"))
    assert params == 6_939_037_248
    assert published(params, "7B")


def test_h_tiny_attends_in_four_layers_and_routes_experts_in_all() -> None:
    model = fake_causal_lm("ibm-granite/granite-4.0-h-tiny")
    kinds = model.config.layer_types
    assert [i for i, kind in enumerate(kinds) if kind == "full_attention"] == [5, 15, 25, 35]
    layers = model.model.layers
    assert layers[0].mamba.in_proj.in_features == 1536 and layers[5].self_attn.k_proj.out_features == 4 * 128
    assert layers[0].block_sparse_moe.experts.gate_up_proj.shape == (64, 2 * 512, 1536)
    assert layers[0].shared_mlp.input_linear.out_features == 2 * 1024
    assert model.model.rotary_emb is None  # NoPE: position_embedding_type is not "rope"
    assert model.lm_head.weight is model.model.embed_tokens.weight


def test_granite_s_mamba_mixers_run_transformers_torch_path() -> None:
    assert mamba_mixer.torch_path(resolve_model("ibm-granite/granite-4.0-h-tiny").config.model_type)
    assert mamba_mixer.torch_path(resolve_model("tiny-granitemoehybrid").config.model_type)


def test_tiny_granite_builds_a_mamba_and_an_attention_layer() -> None:
    model = fake_causal_lm("tiny-granitemoehybrid")
    assert model.config.layer_types == ["linear_attention", "full_attention"]  # transformers 5 renames them
    assert parameter_count(model) < 100_000
