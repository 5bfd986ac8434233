"""The Arcee (AFM-4.5B, Trinity-Nano-Preview) and Hunyuan dense presets: their parameter counts against
the published totals, the keys that shape their memory, and Trinity's own code named in its auto_map."""

from __future__ import annotations

from typing import Any

import pytest

from autotune.workload.models import resolve_model
from autotune.workload.remote_code import auto_map, remote_module
from tests.autotune.workload.test_presets_llm import fake_causal_lm, parameter_count, published


@pytest.mark.parametrize(
    ("name", "params", "figure"),
    [
        # A model-candidates survey's record of arcee-ai/AFM-4.5B-Base (find_string id 59107064231):
        # "4.62B text-only causal LM"; the model card's name says 4.5B.
        ("arcee-ai/AFM-4.5B", 4_619_184_640, "4.62B"),
        # Arcee's Trinity Nano: 6B parameters in total (1B active), the release's figure.
        ("arcee-ai/Trinity-Nano-Preview", 6_120_003_328, "6B"),
        # A small-model survey's table (find_string id 68300799120): tencent/Hunyuan-0.5B-Pretrain,
        # "539M" parameters (the Instruct shares its shapes).
        ("tencent/Hunyuan-0.5B-Instruct", 539_010_048, "539M"),
    ],
)
def test_counts_are_the_published_totals(name: str, params: int, figure: str) -> None:
    model = fake_causal_lm(name)
    assert parameter_count(model) == params
    assert published(params, figure)


@pytest.mark.parametrize(
    ("name", "fields"),
    [
        # Squared ReLU without a gate: up_proj and down_proj only (ArceeMLP, as NemotronMLP).
        ("arcee-ai/AFM-4.5B", {"hidden_act": "relu2", "intermediate_size": 18432, "num_key_value_heads": 4,
                               "head_dim": 128, "tie_word_embeddings": False, "vocab_size": 128004}),
        ("arcee-ai/Trinity-Nano-Preview", {"num_experts": 128, "num_experts_per_tok": 8,
                                           "num_dense_layers": 2, "moe_intermediate_size": 256,
                                           "num_shared_experts": 1, "sliding_window": 2048,
                                           "num_key_value_heads": 2}),
        ("tencent/Hunyuan-0.5B-Instruct", {"head_dim": 128, "num_key_value_heads": 8, "use_qk_norm": True,
                                           "tie_word_embeddings": True, "vocab_size": 120818}),
    ],
)
def test_presets_keep_the_keys_that_shape_memory(name: str, fields: dict[str, Any]) -> None:
    config = resolve_model(name).config
    assert {key: getattr(config, key) for key in fields} == fields


def test_afm_s_mlp_has_no_gate() -> None:
    mlp = fake_causal_lm("arcee-ai/AFM-4.5B").model.layers[0].mlp
    assert not hasattr(mlp, "gate_proj") and mlp.up_proj.out_features == 18432


def test_trinity_attends_globally_every_fourth_layer_after_two_dense_ones() -> None:
    model = fake_causal_lm("arcee-ai/Trinity-Nano-Preview")
    kinds = model.config.layer_types
    assert [i for i, kind in enumerate(kinds) if kind == "full_attention"] == list(range(3, 56, 4))
    assert hasattr(model.model.layers[1].mlp, "down_proj") and hasattr(model.model.layers[2].mlp, "experts")


def test_trinity_s_config_names_its_own_code() -> None:
    spec = resolve_model("arcee-ai/Trinity-Nano-Preview")
    assert auto_map(spec)["AutoConfig"] == "configuration_afmoe.AfmoeConfig"
    assert remote_module(spec, "AutoModelForCausalLM") == "modeling_afmoe.py"
    assert remote_module(resolve_model("arcee-ai/AFM-4.5B"), "AutoModelForCausalLM") is None
