"""The decoder-LLM and ModernBERT presets: published parameter totals, dtypes and architectures,
checked on models built under FakeTensorMode (shapes only, no memory), as the estimator builds them."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from autotune.workload.models import PRESETS, TINY_CONFIGS, infer_task, preset_name, resolve_model

DECODERS = [
    "meta-llama/Llama-3.2-1B",
    "meta-llama/Llama-3.2-3B",
    "meta-llama/Llama-3.1-8B",
    "Qwen/Qwen2.5-0.5B",
    "Qwen/Qwen2.5-1.5B",
    "Qwen/Qwen2.5-7B",
    "mistralai/Mistral-7B-v0.3",
    "google/gemma-2-2b",
    "microsoft/Phi-3.5-mini-instruct",
]
MODERNBERTS = ["answerdotai/ModernBERT-base", "answerdotai/ModernBERT-large"]
TINY_DECODERS = ["llama", "qwen2", "mistral", "gemma2"]


def parameter_count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # tied weights count once


def fake_causal_lm(name: str) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    with FakeTensorMode():
        return AutoModelForCausalLM.from_config(resolve_model(name).config)


def fake_masked_lm(name: str) -> torch.nn.Module:
    """ModernBERT under FakeTensorMode, its weight init skipped.

    ModernBERT initialises with trunc_normal_, which in torch 2.13 resamples until no value lies
    outside the bounds (``if not mask.any()``): a data-dependent loop that fake tensors cannot run
    (DataDependentOutputException). Skipping init also skips the tie of the decoder to the token
    embeddings, which ``post_init`` would do, so it is tied here.
    """
    from transformers import AutoModelForMaskedLM
    from transformers.initialization import no_init_weights

    with FakeTensorMode(), no_init_weights():
        model = AutoModelForMaskedLM.from_config(resolve_model(name).config)
        model.tie_weights()
    return model


@pytest.mark.parametrize(
    ("name", "params"),
    [
        # Llama 3.2 model card: 1.23B and 3.21B (embeddings tied); Llama 3.1 model card: 8B,
        # 8.03B on the hub's safetensors summary.
        ("meta-llama/Llama-3.2-1B", 1_235_814_400),
        ("meta-llama/Llama-3.2-3B", 3_212_749_824),
        ("meta-llama/Llama-3.1-8B", 8_030_261_248),
        # Qwen2.5 model cards, "Number of Parameters": 0.49B, 1.54B, 7.61B.
        ("Qwen/Qwen2.5-0.5B", 494_032_768),
        ("Qwen/Qwen2.5-1.5B", 1_543_714_304),
        ("Qwen/Qwen2.5-7B", 7_615_616_512),
        # Mistral-7B-v0.3: 7.25B on the hub's safetensors summary (vocabulary 32768).
        ("mistralai/Mistral-7B-v0.3", 7_248_023_552),
        # Gemma 2 report: 2.6B (590M of them embedding); hub safetensors summary 2.61B.
        ("google/gemma-2-2b", 2_614_341_888),
        # Phi-3.5-mini model card: 3.8B parameters; hub safetensors summary 3.82B.
        ("microsoft/Phi-3.5-mini-instruct", 3_821_079_552),
    ],
)
def test_decoder_parameter_counts_match_the_published_totals(name: str, params: int) -> None:
    model = fake_causal_lm(name)
    assert parameter_count(model) == params
    assert next(model.parameters()).device.type == "cpu"  # fake: no storage was allocated


def test_qwen2_5_counts_round_to_the_model_cards_non_embedding_figures() -> None:
    # The Qwen2.5 cards also give non-embedding parameters: 0.36B, 1.31B, 6.53B.
    for name, non_embedding in [
        ("Qwen/Qwen2.5-0.5B", 0.36),
        ("Qwen/Qwen2.5-1.5B", 1.31),
        ("Qwen/Qwen2.5-7B", 6.53),
    ]:
        model = fake_causal_lm(name)
        embeddings = {id(model.get_input_embeddings().weight), id(model.get_output_embeddings().weight)}
        rest = sum(p.numel() for p in model.parameters() if id(p) not in embeddings)
        assert round(rest / 1e9, 2) == non_embedding, name


@pytest.mark.parametrize(
    ("name", "params", "published_millions"),
    [
        # ModernBERT model card: "ModernBERT-base - 22 layers, 149 million parameters",
        # "ModernBERT-large - 28 layers, 395 million parameters" (ModernBertForMaskedLM).
        ("answerdotai/ModernBERT-base", 149_655_232, 149),
        ("answerdotai/ModernBERT-large", 395_881_664, 395),
    ],
)
def test_modernbert_parameter_counts_match_the_model_card(
    name: str, params: int, published_millions: int
) -> None:
    model = fake_masked_lm(name)
    assert model.decoder.weight is model.model.embeddings.tok_embeddings.weight
    assert parameter_count(model) == params
    assert params // 10**6 == published_millions  # the card truncates: 149.66M is "149 million"


@pytest.mark.parametrize("name", DECODERS)
def test_decoder_presets_keep_their_architectures_and_dtype(name: str) -> None:
    preset = PRESETS[name]
    assert preset["architectures"] and preset["architectures"][0].endswith("ForCausalLM")
    assert preset["torch_dtype"] in {"bfloat16", "float32"}
    config = resolve_model(name).config
    assert config.architectures == preset["architectures"]
    assert config.dtype == getattr(torch, preset["torch_dtype"])  # transformers 5: torch_dtype -> dtype
    assert infer_task(config)[0] == "causal-lm"


@pytest.mark.parametrize(
    ("name", "dtype"),
    [
        ("meta-llama/Llama-3.2-1B", torch.bfloat16),
        ("Qwen/Qwen2.5-7B", torch.bfloat16),
        ("mistralai/Mistral-7B-v0.3", torch.bfloat16),
        ("microsoft/Phi-3.5-mini-instruct", torch.bfloat16),
        # google/gemma-2-2b is published in float32 (its config.json says so).
        ("google/gemma-2-2b", torch.float32),
        ("answerdotai/ModernBERT-base", torch.float32),
        ("answerdotai/ModernBERT-large", torch.float32),
    ],
)
def test_presets_carry_the_published_dtype(name: str, dtype: torch.dtype) -> None:
    assert resolve_model(name).config.dtype == dtype


@pytest.mark.parametrize("name", MODERNBERTS)
def test_modernbert_is_an_encoder_preset_without_architectures(name: str) -> None:
    assert "architectures" not in PRESETS[name]
    assert PRESETS[name]["torch_dtype"] == "float32"
    assert infer_task(resolve_model(name).config)[0] == "sequence-classification"


@pytest.mark.parametrize(
    ("name", "fields"),
    [
        (
            "meta-llama/Llama-3.2-1B",
            {"head_dim": 64, "num_key_value_heads": 8, "tie_word_embeddings": True},
        ),
        ("meta-llama/Llama-3.1-8B", {"num_key_value_heads": 8, "tie_word_embeddings": False}),
        ("Qwen/Qwen2.5-0.5B", {"num_key_value_heads": 2, "max_position_embeddings": 32768}),
        ("Qwen/Qwen2.5-7B", {"num_key_value_heads": 4, "vocab_size": 152064}),
        ("mistralai/Mistral-7B-v0.3", {"vocab_size": 32768, "sliding_window": None}),
        ("google/gemma-2-2b", {"head_dim": 256, "sliding_window": 4096, "num_key_value_heads": 4}),
        ("microsoft/Phi-3.5-mini-instruct", {"original_max_position_embeddings": 4096}),
        ("answerdotai/ModernBERT-large", {"local_attention": 128, "global_attn_every_n_layers": 3}),
    ],
)
def test_presets_keep_the_keys_that_shape_memory(name: str, fields: dict[str, Any]) -> None:
    config = resolve_model(name).config
    assert {key: getattr(config, key) for key in fields} == fields


@pytest.mark.parametrize(
    ("name", "rope"),
    [
        ("meta-llama/Llama-3.2-3B", {"rope_type": "llama3", "factor": 32.0, "rope_theta": 500000.0}),
        ("meta-llama/Llama-3.1-8B", {"rope_type": "llama3", "factor": 8.0, "rope_theta": 500000.0}),
        ("Qwen/Qwen2.5-1.5B", {"rope_type": "default", "rope_theta": 1000000.0}),
        ("microsoft/Phi-3.5-mini-instruct", {"rope_type": "longrope", "rope_theta": 10000.0}),
    ],
)
def test_rope_scaling_reaches_transformers_rope_parameters(name: str, rope: dict[str, Any]) -> None:
    parameters = resolve_model(name).config.rope_parameters
    assert {key: parameters[key] for key in rope} == rope


@pytest.mark.parametrize(
    ("typed", "preset"),
    [
        ("llama-3.2-1b", "meta-llama/Llama-3.2-1B"),
        ("QWEN2.5-7B", "Qwen/Qwen2.5-7B"),
        ("gemma-2-2b", "google/gemma-2-2b"),
        ("phi-3.5-mini-instruct", "microsoft/Phi-3.5-mini-instruct"),
        ("modernbert-base", "answerdotai/ModernBERT-base"),
        ("meta-llama/Meta-Llama-3.1-8B", "meta-llama/Llama-3.1-8B"),
    ],
)
def test_llm_presets_resolve_without_their_org_and_under_old_names(typed: str, preset: str) -> None:
    assert preset_name(typed) == preset


@pytest.mark.parametrize("model_type", TINY_DECODERS)
def test_tiny_decoders_are_float32_causal_lms_with_grouped_query_attention(model_type: str) -> None:
    config = resolve_model(f"tiny-{model_type}").config
    assert config.architectures[0].endswith("ForCausalLM")
    assert config.dtype is None  # no torch_dtype: built in torch's default, float32
    assert config.num_key_value_heads == 1
    assert infer_task(config)[0] == "causal-lm"
    model = fake_causal_lm(f"tiny-{model_type}")
    assert next(model.parameters()).dtype == torch.float32
    assert parameter_count(model) < 100_000


def test_tiny_modernbert_builds_a_small_float32_encoder() -> None:
    model = fake_masked_lm("tiny-modernbert")
    assert next(model.parameters()).dtype == torch.float32
    assert parameter_count(model) < 100_000
    assert resolve_model("tiny-modernbert").max_seq_len == 128


@pytest.mark.parametrize("model_type", sorted(TINY_CONFIGS))
def test_every_tiny_config_still_builds(model_type: str) -> None:
    from transformers import AutoModel

    with torch.device("meta"):
        model = AutoModel.from_config(resolve_model(f"tiny-{model_type}").config)
    assert parameter_count(model) < 100_000
