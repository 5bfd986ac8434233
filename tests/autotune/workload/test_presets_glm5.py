"""The GLM-5 preset (glm_moe_dsa): its parameter count against the published total, the keys that shape
its memory, DeepSeek Sparse Attention's indexer in every layer, and the tiny config of its model type."""

from __future__ import annotations

from autotune.workload.models import resolve_model
from tests.autotune.workload.test_presets_llm import fake_causal_lm, parameter_count, published


def test_glm5_s_count_is_the_published_total() -> None:
    # GLM-5 technical report, "# Total Parameters 744B" (as glennklockwood.com/garden/GLM-5 copies its
    # table; the MTP layer, which transformers does not build, aside).
    params = parameter_count(fake_causal_lm("zai-org/GLM-5"))
    assert params == 743_911_199_232
    assert published(params, "744B")


def test_glm5_keeps_the_keys_that_shape_memory() -> None:
    config = resolve_model("zai-org/GLM-5").config
    fields = {"q_lora_rank": 2048, "kv_lora_rank": 512, "qk_nope_head_dim": 192, "qk_rope_head_dim": 64,
              "v_head_dim": 256, "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8,
              "first_k_dense_replace": 3, "index_n_heads": 32, "index_head_dim": 128, "index_topk": 2048,
              "vocab_size": 154880, "tie_word_embeddings": False}
    assert {key: getattr(config, key) for key in fields} == fields
    assert config.indexer_types == ["full"] * 78  # no index_topk_freq: every layer its own indexer


def test_glm5_s_layers_hold_an_indexer_and_experts_after_three_dense_ones() -> None:
    layers = fake_causal_lm("zai-org/GLM-5").model.layers
    assert len(layers) == 78 and not hasattr(layers[2].mlp, "experts")
    assert layers[3].mlp.experts.gate_up_proj.shape == (256, 2 * 2048, 6144)
    assert layers[0].self_attn.q_a_proj.out_features == 2048
    assert hasattr(layers[0].self_attn, "indexer")


def test_tiny_glm_moe_dsa_builds() -> None:
    model = fake_causal_lm("tiny-glm_moe_dsa")
    assert model.config.model_type == "glm_moe_dsa"
    assert parameter_count(model) < 100_000
