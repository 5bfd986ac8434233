"""The decoder-LLM and ModernBERT presets: published parameter totals, dtypes and architectures,
checked on models built under FakeTensorMode (shapes only, no memory), as the estimator builds them."""

from __future__ import annotations

import math
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
    "Qwen/Qwen3-0.6B",
    "Qwen/Qwen3-1.7B",
    "Qwen/Qwen3-4B",
    "Qwen/Qwen3-8B",
    "Qwen/Qwen3-14B",
    "Qwen/Qwen3-32B",
    "Qwen/Qwen3-30B-A3B",
    "Qwen/Qwen2.5-3B",
    "Qwen/Qwen2.5-14B",
    "google/gemma-2-9b",
    "google/gemma-3-270m",
    "google/gemma-3-1b-pt",
    "HuggingFaceTB/SmolLM2-135M",
    "HuggingFaceTB/SmolLM2-360M",
    "HuggingFaceTB/SmolLM2-1.7B",
    "microsoft/phi-1_5",
    "microsoft/phi-2",
    "Qwen/Qwen3-235B-A22B",
    "mistralai/Devstral-Small-2507",
    "openai/gpt-oss-20b",
    "deepseek-ai/DeepSeek-V2-Lite",
    "Qwen/Qwen2.5-72B",
    "meta-llama/Meta-Llama-3-70B",
    "mistralai/Mixtral-8x7B-v0.1",
    "mistralai/Mixtral-8x22B-v0.1",
    "swiss-ai/Apertus-8B-Instruct-2509",
    "ByteDance-Seed/Seed-OSS-36B-Instruct",
    "allenai/Olmo-3-7B-Instruct-SFT",
    "CohereForAI/c4ai-command-r7b-12-2024",
    "nvidia/Nemotron-Mini-4B-Instruct",
    "LiquidAI/LFM2-350M",
    "LiquidAI/LFM2-8B-A1B",
    "meta-llama/Llama-3.1-405B",
    "openai/gpt-oss-120b",
    "deepseek-ai/DeepSeek-V2.5",
    "arcee-ai/AFM-4.5B",
    "arcee-ai/Trinity-Nano-Preview",
    "tencent/Hunyuan-0.5B-Instruct",
    "deepseek-ai/DeepSeek-V3",
    "MiniMaxAI/MiniMax-M2",
    "ibm-granite/granite-4.0-h-tiny",
    "zai-org/GLM-5",
]
MODERNBERTS = ["answerdotai/ModernBERT-base", "answerdotai/ModernBERT-large"]
TINY_DECODERS = ["llama", "qwen2", "mistral", "gemma2", "mixtral"]


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
        # Qwen3 model cards, "Number of Parameters": 0.6B, 1.7B, 4.0B, 8.2B, 14.8B, 32.8B
        # (embeddings tied up to the 4B; test_model_cards_figures_are_the_counts_at_their_precision).
        ("Qwen/Qwen3-0.6B", 596_049_920),
        ("Qwen/Qwen3-1.7B", 1_720_574_976),
        ("Qwen/Qwen3-4B", 4_022_468_096),
        ("Qwen/Qwen3-8B", 8_190_735_360),
        ("Qwen/Qwen3-14B", 14_768_307_200),
        ("Qwen/Qwen3-32B", 32_762_123_264),
        # Qwen3-30B-A3B model card: 30.5B in total, 3.3B activated.
        ("Qwen/Qwen3-30B-A3B", 30_532_122_624),
        # Qwen2.5 model cards: 3.09B (tied) and 14.7B.
        ("Qwen/Qwen2.5-3B", 3_085_938_688),
        ("Qwen/Qwen2.5-14B", 14_770_033_664),
        # Gemma 2 report: 9B = 917,504,000 embedding + 8,324,201,984 non-embedding parameters.
        ("google/gemma-2-9b", 9_241_705_984),
        # Gemma 3: 270M (170M of them embedding, 100M in the blocks: Google's announcement); the 1B
        # is 999,885,952 in keras-team/keras-hub keras_hub/src/models/gemma3/gemma3_presets.py.
        ("google/gemma-3-270m", 268_098_176),
        ("google/gemma-3-1b-pt", 999_885_952),
        # SmolLM2 model cards: 135M, 360M, 1.7B (the names' sizes; embeddings tied).
        ("HuggingFaceTB/SmolLM2-135M", 134_515_008),
        ("HuggingFaceTB/SmolLM2-360M", 361_821_120),
        ("HuggingFaceTB/SmolLM2-1.7B", 1_711_376_384),
        # Phi model cards: 1.3B (phi-1.5, without one of its two 105M vocabulary matrices:
        # 1.313B) and 2.7B (phi-2, 2.78B truncated); output layer untied, with a bias.
        ("microsoft/phi-1_5", 1_418_270_720),
        ("microsoft/phi-2", 2_779_683_840),
        # Qwen3-235B-A22B model card: 235B in total, 22B activated.
        ("Qwen/Qwen3-235B-A22B", 235_093_634_560),
        # Devstral-Small-2507's model.safetensors.index.json: "total_parameters": 23572403200.
        ("mistralai/Devstral-Small-2507", 23_572_403_200),
        # gpt-oss model card: 20.91B in total (3.61B active); the hub says 21B.
        ("openai/gpt-oss-20b", 20_914_757_184),
        # DeepSeek-V2 paper and model card: DeepSeek-V2-Lite, 15.7B in total, 2.4B activated.
        ("deepseek-ai/DeepSeek-V2-Lite", 15_706_484_224),
        # Qwen2.5-72B model card: 72.7B.
        ("Qwen/Qwen2.5-72B", 72_706_203_648),
        # Meta-Llama-3-70B: 70.6B on the hub's safetensors summary (the model card's "70B").
        ("meta-llama/Meta-Llama-3-70B", 70_553_706_496),
        # Mistral AI's announcements: Mixtral 8x7B "46.7B total parameters" (12.9B per token),
        # Mixtral 8x22B "141B parameters" (39B active).
        ("mistralai/Mixtral-8x7B-v0.1", 46_702_792_704),
        ("mistralai/Mixtral-8x22B-v0.1", 140_620_634_112),
        # Apertus model card: 8B.
        ("swiss-ai/Apertus-8B-Instruct-2509", 8_053_338_176),
        # Seed-OSS model card ("Parameters: 36B").
        ("ByteDance-Seed/Seed-OSS-36B-Instruct", 36_151_104_512),
        # LFM2 model card's table: LFM2-350M, 354,483,968 parameters (exact).
        ("LiquidAI/LFM2-350M", 354_483_968),
        # Meta-Llama-3.1-405B: 405,853,388,800 on the hub's safetensors summary (the card's "405B").
        ("meta-llama/Llama-3.1-405B", 405_853_388_800),
        # gpt-oss model card: gpt-oss-120b, 116.83B in total (5.13B active); the README's "117B".
        ("openai/gpt-oss-120b", 116_829_156_672),
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


def published(count: int, figure: str) -> bool:
    """Whether a model card's figure ("14.7B", "0.44B", "135M") is ``count`` at the figure's
    precision, rounded or, as some cards do, truncated."""
    unit = {"B": 1e9, "M": 1e6}[figure[-1]]
    decimals = len(figure[:-1].partition(".")[2])
    value = count / unit
    return float(figure[:-1]) in {round(value, decimals), math.floor(value * 10**decimals) / 10**decimals}


@pytest.mark.parametrize(
    ("name", "total", "non_embedding"),
    [
        # Qwen3 model cards, "Number of Parameters" and "(Non-Embedding)".
        ("Qwen/Qwen3-0.6B", "0.6B", "0.44B"),
        ("Qwen/Qwen3-1.7B", "1.7B", "1.4B"),
        ("Qwen/Qwen3-4B", "4.0B", "3.6B"),
        ("Qwen/Qwen3-8B", "8.2B", "6.95B"),
        ("Qwen/Qwen3-14B", "14.8B", "13.2B"),
        ("Qwen/Qwen3-32B", "32.8B", "31.2B"),
        ("Qwen/Qwen3-30B-A3B", "30.5B", "29.9B"),
        ("Qwen/Qwen2.5-3B", "3.09B", "2.77B"),
        # The 14B card's non-embedding 13.1B is not its config's: 48 layers of 275.3M are 13.21B.
        ("Qwen/Qwen2.5-14B", "14.7B", None),
        ("HuggingFaceTB/SmolLM2-135M", "135M", None),
        ("HuggingFaceTB/SmolLM2-1.7B", "1.7B", None),
        ("google/gemma-3-1b-pt", "1B", None),
        ("Qwen/Qwen3-235B-A22B", "235B", "234B"),
        ("mistralai/Devstral-Small-2507", "24B", None),
        ("openai/gpt-oss-20b", "21B", None),
        ("deepseek-ai/DeepSeek-V2-Lite", "15.7B", None),
        # The 72B card's non-embedding 70.0B is not its config's either: 80 layers of 877.7M are 70.2B.
        ("Qwen/Qwen2.5-72B", "72.7B", None),
        ("meta-llama/Meta-Llama-3-70B", "70.6B", None),
        ("mistralai/Mixtral-8x7B-v0.1", "46.7B", None),
        ("mistralai/Mixtral-8x22B-v0.1", "141B", None),
        ("swiss-ai/Apertus-8B-Instruct-2509", "8B", None),
        ("ByteDance-Seed/Seed-OSS-36B-Instruct", "36B", None),
        # The hub's safetensors summaries: Olmo-3-7B 7.3B, Command R7B 8.03B (the card's "7B" leaves out
        # its 1.05B tied vocabulary matrix), Nemotron-Mini-4B 4.19B; LFM2-8B-A1B model card: "8.3B total".
        ("allenai/Olmo-3-7B-Instruct-SFT", "7.3B", None),
        ("CohereForAI/c4ai-command-r7b-12-2024", "8.03B", "6.98B"),
        ("nvidia/Nemotron-Mini-4B-Instruct", "4.19B", None),
        ("LiquidAI/LFM2-8B-A1B", "8.3B", None),
        ("meta-llama/Llama-3.1-405B", "405B", None),
        ("openai/gpt-oss-120b", "117B", None),
        # DeepSeek-V2.5 model card and DeepSeek-V2 paper (the same 236B shapes): 236B in total, 21B active.
        ("deepseek-ai/DeepSeek-V2.5", "236B", None),
    ],
)
def test_model_cards_figures_are_the_counts_at_their_precision(
    name: str, total: str, non_embedding: str | None
) -> None:
    model = fake_causal_lm(name)
    assert published(parameter_count(model), total)
    if non_embedding is not None:
        embeddings = {id(model.get_input_embeddings().weight), id(model.get_output_embeddings().weight)}
        assert published(sum(p.numel() for p in model.parameters() if id(p) not in embeddings), non_embedding)


@pytest.mark.parametrize(
    ("name", "embedding", "rest"),
    [
        # Gemma 2 report, table of parameter counts: exact.
        ("google/gemma-2-9b", 917_504_000, 8_324_201_984),
        # Gemma 3 270M announcement: "170 million embedding parameters" and "100 million for our
        # transformer blocks" (to the 10M).
        ("google/gemma-3-270m", 170_000_000, 100_000_000),
    ],
)
def test_gemma_counts_split_as_google_publishes_them(name: str, embedding: int, rest: int) -> None:
    model = fake_causal_lm(name)
    table = model.get_input_embeddings().weight
    assert model.get_output_embeddings().weight is table  # tied
    others = parameter_count(model) - table.numel()
    precision = 1 if embedding % 10**7 else 10**7
    assert (round(table.numel() / precision), round(others / precision)) == (
        embedding // precision, rest // precision)


def test_published_reads_a_figure_at_its_precision() -> None:
    assert published(14_770_033_664, "14.7B") and published(14_770_033_664, "14.8B")
    assert published(134_515_008, "135M") and not published(361_821_120, "360M")
    assert not published(1_720_574_976, "1.8B")


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
    assert preset["torch_dtype"] in {"bfloat16", "float32", "float16"}
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
        ("Qwen/Qwen3-8B", torch.bfloat16),
        ("google/gemma-3-270m", torch.bfloat16),
        ("HuggingFaceTB/SmolLM2-135M", torch.bfloat16),
        # The base Gemma 2 checkpoints are float32; phi-1.5 and phi-2 are published in float16.
        ("google/gemma-2-9b", torch.float32),
        ("microsoft/phi-1_5", torch.float16),
        ("microsoft/phi-2", torch.float16),
        ("mistralai/Devstral-Small-2507", torch.bfloat16),
        # gpt-oss-20b's config.json names none: bfloat16, its unquantized weights' and the
        # dequantized experts' dtype.
        ("openai/gpt-oss-20b", torch.bfloat16),
        ("deepseek-ai/DeepSeek-V2-Lite", torch.bfloat16),
        ("mistralai/Mixtral-8x7B-v0.1", torch.bfloat16),
        ("meta-llama/Meta-Llama-3-70B", torch.bfloat16),
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
        # Qwen3: head_dim 128 at every size (0.6B: 16 heads of 128 on a 1024 width), no window.
        ("Qwen/Qwen3-0.6B", {"head_dim": 128, "num_key_value_heads": 8, "tie_word_embeddings": True,
                             "sliding_window": None, "max_position_embeddings": 40960}),
        ("Qwen/Qwen3-8B", {"head_dim": 128, "tie_word_embeddings": False, "vocab_size": 151936}),
        ("Qwen/Qwen3-30B-A3B", {"num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768,
                                "mlp_only_layers": [], "num_key_value_heads": 4, "head_dim": 128}),
        ("Qwen/Qwen2.5-3B", {"num_key_value_heads": 2, "tie_word_embeddings": True}),
        ("Qwen/Qwen2.5-14B", {"rms_norm_eps": 1e-05, "vocab_size": 152064, "num_key_value_heads": 8}),
        ("google/gemma-2-9b", {"head_dim": 256, "sliding_window": 4096, "num_key_value_heads": 8}),
        ("google/gemma-3-270m", {"head_dim": 256, "num_key_value_heads": 1, "sliding_window": 512,
                                 "vocab_size": 262144, "tie_word_embeddings": True}),
        ("HuggingFaceTB/SmolLM2-360M",
         {"num_key_value_heads": 5, "head_dim": 64, "tie_word_embeddings": True}),
        ("microsoft/phi-2", {"num_key_value_heads": 32, "tie_word_embeddings": False, "vocab_size": 51200}),
        ("Qwen/Qwen3-235B-A22B",
         {"num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 1536,
          "num_key_value_heads": 4, "head_dim": 128, "max_position_embeddings": 40960}),
        # Mistral Small 3: 32 heads of 128 on a 5120 width (head_dim is not hidden_size / heads).
        ("mistralai/Devstral-Small-2507", {"head_dim": 128, "num_key_value_heads": 8, "sliding_window": None,
                                           "vocab_size": 131072, "tie_word_embeddings": False}),
        ("openai/gpt-oss-20b", {"num_local_experts": 32, "num_experts_per_tok": 4, "head_dim": 64,
                                "sliding_window": 128, "attention_bias": True, "vocab_size": 201088}),
        # Multi-head latent attention: queries uncompressed (q_lora_rank null), keys and values
        # through a 512-wide projection.
        ("deepseek-ai/DeepSeek-V2-Lite", {"q_lora_rank": None, "kv_lora_rank": 512, "n_routed_experts": 64,
                                          "n_shared_experts": 2, "num_experts_per_tok": 6,
                                          "first_k_dense_replace": 1}),
        ("Qwen/Qwen2.5-72B", {"num_key_value_heads": 8, "vocab_size": 152064, "rms_norm_eps": 1e-05,
                              "tie_word_embeddings": False}),
        # Llama 3 (not 3.1): 8192 positions, no rope scaling.
        ("meta-llama/Meta-Llama-3-70B", {"num_key_value_heads": 8, "max_position_embeddings": 8192,
                                         "vocab_size": 128256, "tie_word_embeddings": False}),
        ("mistralai/Mixtral-8x7B-v0.1", {"num_local_experts": 8, "num_experts_per_tok": 2,
                                         "sliding_window": None, "vocab_size": 32000}),
        ("mistralai/Mixtral-8x22B-v0.1", {"num_local_experts": 8, "num_experts_per_tok": 2,
                                          "num_attention_heads": 48, "vocab_size": 32000}),
        ("swiss-ai/Apertus-8B-Instruct-2509", {"hidden_act": "xielu", "qk_norm": True,
                                               "num_key_value_heads": 8, "vocab_size": 131072}),
        # 80 query heads of 128 on a 5120 width; biases on q, k and v, not o; dropout in training.
        ("ByteDance-Seed/Seed-OSS-36B-Instruct", {"head_dim": 128, "num_attention_heads": 80,
                                                  "attention_bias": True, "attention_out_bias": False,
                                                  "attention_dropout": 0.1, "residual_dropout": 0.1}),
        # OLMo 3: 32 key/value heads (no grouping), a 4096-token window on three layers of four.
        ("allenai/Olmo-3-7B-Instruct-SFT", {"num_key_value_heads": 32, "sliding_window": 4096,
                                            "vocab_size": 100278, "tie_word_embeddings": False}),
        ("CohereForAI/c4ai-command-r7b-12-2024", {"head_dim": 128, "num_key_value_heads": 8,
                                                  "logit_scale": 0.25, "sliding_window": 4096,
                                                  "tie_word_embeddings": True}),
        # Nemotron: a squared-ReLU MLP without gate, half of each head rotated (transformers 5 moves
        # partial_rotary_factor into rope_parameters).
        ("nvidia/Nemotron-Mini-4B-Instruct", {
            "hidden_act": "relu2", "head_dim": 128, "num_key_value_heads": 8, "tie_word_embeddings": False,
            "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default",
                                "partial_rotary_factor": 0.5}}),
        # LFM2: block_ff_dim 6656 read as intermediate_size, adjusted to 4608 by the MLP.
        ("LiquidAI/LFM2-350M", {"intermediate_size": 6656, "block_auto_adjust_ff_dim": True,
                                "conv_L_cache": 3, "tie_word_embeddings": True}),
        ("LiquidAI/LFM2-8B-A1B", {"num_experts": 32, "num_experts_per_tok": 4, "moe_intermediate_size": 1792,
                                  "num_dense_layers": 2, "use_expert_bias": True}),
        ("meta-llama/Llama-3.1-405B", {"num_key_value_heads": 8, "num_hidden_layers": 126,
                                       "intermediate_size": 53248, "tie_word_embeddings": False}),
        ("openai/gpt-oss-120b", {"num_local_experts": 128, "num_experts_per_tok": 4, "num_hidden_layers": 36,
                                 "sliding_window": 128, "head_dim": 64, "vocab_size": 201088}),
        # DeepSeek-V2's 236B: queries compressed (1536), 160 routed experts in 8 groups, 3 groups a token.
        ("deepseek-ai/DeepSeek-V2.5", {"q_lora_rank": 1536, "kv_lora_rank": 512, "n_routed_experts": 160,
                                       "n_shared_experts": 2, "num_experts_per_tok": 6, "n_group": 8,
                                       "topk_group": 3, "topk_method": "group_limited_greedy"}),
    ],
)
def test_presets_keep_the_keys_that_shape_memory(name: str, fields: dict[str, Any]) -> None:
    config = resolve_model(name).config
    assert {key: getattr(config, key) for key in fields} == fields


@pytest.mark.parametrize(("name", "full_layers"), [
    ("google/gemma-3-270m", [5, 11, 17]),
    ("google/gemma-3-1b-pt", [5, 11, 17, 23]),
])
def test_gemma_3_attends_globally_every_sixth_layer_with_its_own_rotary_base(
    name: str, full_layers: list[int]
) -> None:
    config = resolve_model(name).config
    assert [i for i, kind in enumerate(config.layer_types) if kind == "full_attention"] == full_layers
    assert set(config.layer_types) == {"sliding_attention", "full_attention"}
    assert config.rope_parameters["full_attention"]["rope_theta"] == 1000000.0
    assert config.rope_parameters["sliding_attention"]["rope_theta"] == 10000.0


def test_gpt_oss_alternates_a_128_token_window_with_full_attention() -> None:
    config = resolve_model("openai/gpt-oss-20b").config
    assert config.layer_types == ["sliding_attention", "full_attention"] * 12
    assert config.rope_parameters["rope_type"] == "yarn" and config.rope_parameters["factor"] == 32.0


def test_gpt_oss_120b_alternates_its_window_over_36_layers_of_128_experts() -> None:
    model = fake_causal_lm("openai/gpt-oss-120b")
    assert model.config.layer_types == ["sliding_attention", "full_attention"] * 18
    assert tuple(model.model.layers[0].mlp.experts.gate_up_proj.shape) == (128, 2880, 2 * 2880)


def test_deepseek_v2_5_compresses_queries_and_routes_in_groups() -> None:
    model = fake_causal_lm("deepseek-ai/DeepSeek-V2.5")
    attention = model.model.layers[0].self_attn
    assert attention.q_a_proj.out_features == 1536 and attention.q_proj is None
    assert attention.q_b_proj.out_features == 128 * (128 + 64)  # heads x (qk_nope + qk_rope)
    assert not hasattr(model.model.layers[0].mlp, "experts")  # first_k_dense_replace 1
    gate = model.model.layers[1].mlp.gate
    assert (gate.topk_method, gate.num_group, gate.topk_group) == ("group_limited_greedy", 8, 3)


def test_deepseek_v2_lite_has_no_query_compression() -> None:
    attention = fake_causal_lm("deepseek-ai/DeepSeek-V2-Lite").model.layers[0].self_attn
    assert attention.q_proj is not None and attention.q_a_proj is None  # hidden -> heads directly
    assert attention.kv_a_proj_with_mqa.out_features == 512 + 64  # kv_lora_rank + qk_rope_head_dim


@pytest.mark.parametrize(
    ("name", "rope"),
    [
        ("meta-llama/Llama-3.2-3B", {"rope_type": "llama3", "factor": 32.0, "rope_theta": 500000.0}),
        ("meta-llama/Llama-3.1-8B", {"rope_type": "llama3", "factor": 8.0, "rope_theta": 500000.0}),
        ("Qwen/Qwen2.5-1.5B", {"rope_type": "default", "rope_theta": 1000000.0}),
        ("microsoft/Phi-3.5-mini-instruct", {"rope_type": "longrope", "rope_theta": 10000.0}),
        ("Qwen/Qwen3-8B", {"rope_type": "default", "rope_theta": 1000000}),
        ("HuggingFaceTB/SmolLM2-1.7B", {"rope_type": "default", "rope_theta": 130000}),
        # Rotary on part of each head: 32 of phi-2's 80 dimensions, 32 of phi-1.5's 64.
        ("microsoft/phi-2", {"rope_type": "default", "partial_rotary_factor": 0.4}),
        ("microsoft/phi-1_5", {"rope_type": "default", "partial_rotary_factor": 0.5}),
        ("meta-llama/Meta-Llama-3-70B", {"rope_type": "default", "rope_theta": 500000.0}),
        ("swiss-ai/Apertus-8B-Instruct-2509", {"rope_type": "llama3", "factor": 8.0, "rope_theta": 12000000}),
        ("meta-llama/Llama-3.1-405B", {"rope_type": "llama3", "factor": 8.0, "rope_theta": 500000.0}),
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
        ("qwen3-8b", "Qwen/Qwen3-8B"),
        ("gemma-3-1b-pt", "google/gemma-3-1b-pt"),
        ("smollm2-135m", "HuggingFaceTB/SmolLM2-135M"),
        ("PHI-2", "microsoft/phi-2"),
        ("gpt-oss-20b", "openai/gpt-oss-20b"),
        ("devstral-small-2507", "mistralai/Devstral-Small-2507"),
        ("DeepSeek-V2-Lite", "deepseek-ai/DeepSeek-V2-Lite"),
        ("qwen3-235b-a22b", "Qwen/Qwen3-235B-A22B"),
        ("mistral-community/Mixtral-8x22B-v0.1", "mistralai/Mixtral-8x22B-v0.1"),
        ("Meta-Llama-3-70B", "meta-llama/Meta-Llama-3-70B"),
        ("apertus-8b-instruct-2509", "swiss-ai/Apertus-8B-Instruct-2509"),
        ("meta-llama/Meta-Llama-3.1-405B", "meta-llama/Llama-3.1-405B"),
        ("gpt-oss-120b", "openai/gpt-oss-120b"),
        ("DeepSeek-V2.5", "deepseek-ai/DeepSeek-V2.5"),
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
    # Qwen3-VL's deepstack mergers (a patch merger per fed layer, 4 x 4 hidden wide) take it to 165k
    assert parameter_count(model) < 200_000


@pytest.mark.parametrize("name", ["mistralai/Mixtral-8x7B-v0.1", "tiny-mixtral"])
def test_mixtral_s_experts_run_grouped_mm_as_qwen3_moe_s(name: str) -> None:
    # The estimator traces transformers' default experts (grouped_mm, one call for the routed
    # tokens of every expert), as for Qwen3-30B-A3B: one fused gate/up and one down weight a layer.
    model = fake_causal_lm(name)
    config = resolve_model(name).config
    experts = model.model.layers[0].mlp.experts
    assert model.config._experts_implementation == "grouped_mm"
    assert experts.gate_up_proj.shape == (config.num_local_experts, 2 * config.intermediate_size,
                                          config.hidden_size)
    assert experts.down_proj.shape == (config.num_local_experts, config.hidden_size, config.intermediate_size)


def test_command_r7b_and_olmo_3_attend_globally_every_fourth_layer() -> None:
    for name in ("CohereForAI/c4ai-command-r7b-12-2024", "allenai/Olmo-3-7B-Instruct-SFT"):
        layer_types = resolve_model(name).config.layer_types
        assert [i for i, kind in enumerate(layer_types) if kind == "full_attention"] == list(range(3, 32, 4))
    # OLMo 3's YaRN stretches the full-attention layers only, 8192 positions to 65536.
    rope = resolve_model("allenai/Olmo-3-7B-Instruct-SFT").config.rope_parameters
    assert rope["full_attention"]["rope_type"] == "yarn" and rope["full_attention"]["factor"] == 8.0
    assert rope["sliding_attention"]["rope_type"] == "default"


@pytest.mark.parametrize(("name", "attention"), [
    ("LiquidAI/LFM2-350M", [2, 5, 8, 10, 12, 14]),
    ("LiquidAI/LFM2-8B-A1B", [2, 6, 10, 14, 18, 21]),
])
def test_lfm2_puts_attention_in_six_layers_and_short_convolutions_in_the_others(
    name: str, attention: list[int]
) -> None:
    model = fake_causal_lm(name)
    layers = model.model.layers
    assert [i for i, layer in enumerate(layers) if layer.is_attention_layer] == attention
    assert all(layers[i].conv.conv.kernel_size == (3,) for i in range(len(layers)) if i not in attention)
    if name == "LiquidAI/LFM2-350M":  # 2/3 of block_ff_dim 6656, rounded up to a multiple of 256
        assert layers[0].feed_forward.w1.out_features == 4608
