"""The DeepSeek-V3 and MiniMax-M2 presets: their parameter counts against the published totals, the
keys that shape their memory, the checkpoints' own code named in their auto_map, and the tiny configs
of their model types."""

from __future__ import annotations

from typing import Any

import pytest

from autotune.workload.models import resolve_model
from autotune.workload.remote_code import remote_module
from tests.autotune.workload.test_presets_llm import fake_causal_lm, parameter_count, published


@pytest.mark.parametrize(
    ("name", "params", "figure"),
    [
        # DeepSeek-V3 README_WEIGHTS.md: the main model's "Total parameters: 671B" (the MTP module's
        # 11.5B beside it, which transformers does not build).
        ("deepseek-ai/DeepSeek-V3", 671_026_404_352, "671B"),
        # MiniMax-M2: "a total parameter count of 229 billion" (apxml.com/models/minimax-m2); the
        # technical report's 229.9B counts the three MTP modules too, which transformers does not build.
        ("MiniMaxAI/MiniMax-M2", 228_689_748_992, "229B"),
    ],
)
def test_counts_are_the_published_totals(name: str, params: int, figure: str) -> None:
    assert parameter_count(fake_causal_lm(name)) == params
    assert published(params, figure)


@pytest.mark.parametrize(
    ("name", "fields"),
    [
        ("deepseek-ai/DeepSeek-V3", {
            "q_lora_rank": 1536, "kv_lora_rank": 512, "n_routed_experts": 256, "n_shared_experts": 1,
            "num_experts_per_tok": 8, "first_k_dense_replace": 3, "moe_intermediate_size": 2048, "n_group": 8,
            "topk_group": 4, "max_position_embeddings": 163840, "tie_word_embeddings": False}),
        ("MiniMaxAI/MiniMax-M2", {
            "num_local_experts": 256, "num_experts_per_tok": 8, "intermediate_size": 1536,
            "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 200064,
            "max_position_embeddings": 196608, "tie_word_embeddings": False}),
    ],
)
def test_presets_keep_the_keys_that_shape_memory(name: str, fields: dict[str, Any]) -> None:
    config = resolve_model(name).config
    assert {key: getattr(config, key) for key in fields} == fields


def test_deepseek_v3_s_first_three_layers_are_dense_then_experts_and_a_shared_one() -> None:
    layers = fake_causal_lm("deepseek-ai/DeepSeek-V3").model.layers
    assert len(layers) == 61 and not hasattr(layers[2].mlp, "experts")
    assert layers[3].mlp.experts.gate_up_proj.shape == (256, 2 * 2048, 7168)
    assert layers[3].mlp.shared_experts.gate_proj.out_features == 2048
    assert layers[0].self_attn.q_a_proj.out_features == 1536


def test_minimax_m2_norms_queries_and_keys_over_all_heads_and_rotates_half_of_each() -> None:
    model = fake_causal_lm("MiniMaxAI/MiniMax-M2")
    attention = model.model.layers[0].self_attn
    assert attention.q_norm.weight.shape == (48 * 128,) and attention.k_norm.weight.shape == (8 * 128,)
    assert model.config.rope_parameters["partial_rotary_factor"] == 0.5
    assert not hasattr(model.model.layers[0].mlp, "shared_experts")


@pytest.mark.parametrize(
    ("name", "module"),
    [("deepseek-ai/DeepSeek-V3", "modeling_deepseek.py"), ("MiniMaxAI/MiniMax-M2", "modeling_minimax_m2.py")],
)
def test_their_config_json_names_their_own_code(name: str, module: str) -> None:
    assert remote_module(resolve_model(name), "AutoModelForCausalLM") == module


@pytest.mark.parametrize("model_type", ["deepseek_v3", "minimax_m2"])
def test_tiny_configs_build_their_model_type(model_type: str) -> None:
    model = fake_causal_lm(f"tiny-{model_type}")
    assert model.config.model_type == model_type
    assert parameter_count(model) < 100_000


def test_minimax_m2_s_fp8_checkpoint_is_refused_by_name() -> None:
    # its hub checkpoint is saved in FP8 (workload/prequantized.py PUBLISHED_QUANTIZED): not the preset's
    # bfloat16 weights; its tiny config is answered
    import autotune
    from autotune.errors import UnmodelledSetting

    with pytest.raises(UnmodelledSetting, match=r"^MiniMaxAI/MiniMax-M2 is published saved in fp8 .*"
                       r"FineGrainedFP8 quantizer: a base saved in FP8 is not modelled"):
        autotune.check("MiniMaxAI/MiniMax-M2", seq_len=128, batch_size=1, gpu="H100-80GB", backend="estimate")
    assert autotune.check("tiny-minimax_m2", seq_len=64, batch_size=1, dtype="bfloat16", gpu="H100-80GB",
                          backend="estimate", workers=1).peak_memory_bytes
