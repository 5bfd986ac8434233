"""Model resolution: presets with their published figures, local configs, the hub
(never reached: the tests run offline), sequence lengths and tasks."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autotune.defaults import DEFAULT_TASK
from autotune.errors import InvalidInput, SequenceTooLong, UnknownModel
from autotune.workload.models import (
    PRESETS,
    TASKS,
    TINY_CONFIGS,
    ModelSpec,
    check_seq_len,
    check_task,
    preset_name,
    resolve_model,
    tiny_config,
)

PRESET_LIST = ", ".join(sorted(PRESETS, key=str.lower))
NOT_FOUND = "not a built-in preset, a local config, or a reachable Hugging Face hub id"


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """No test may reach the network: hub lookups read the local HF cache only."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("AUTOTUNE_OFFLINE", "1")


def parameter_count(spec: ModelSpec) -> int:
    """Parameters of the bare model (AutoModel, with BERT's pooler), built on meta."""
    import torch
    from transformers import AutoModel

    with torch.device("meta"):
        model = AutoModel.from_config(spec.config)
    return sum(p.numel() for p in model.parameters())


# --- presets --------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_resolves_offline(name: str) -> None:
    spec = resolve_model(name)
    assert spec.name == name
    assert spec.source == "preset"
    assert spec.config.model_type == PRESETS[name]["model_type"]
    assert spec.max_seq_len == LIMITS.get(name, 128 if name.startswith("tiny-") else 512)


# Positions of the presets not limited to 512 (max_position_embeddings of their config.json).
LIMITS = {
    "gpt2": 1024, "gpt2-medium": 1024,
    "Qwen/Qwen3-235B-A22B": 40960, "mistralai/Devstral-Small-2507": 131072, "openai/gpt-oss-20b": 131072,
    "deepseek-ai/DeepSeek-V2-Lite": 163840,
    "meta-llama/Llama-3.2-1B": 131072, "meta-llama/Llama-3.2-3B": 131072,
    "meta-llama/Llama-3.1-8B": 131072, "Qwen/Qwen2.5-0.5B": 32768, "Qwen/Qwen2.5-1.5B": 131072,
    "Qwen/Qwen2.5-7B": 131072, "mistralai/Mistral-7B-v0.3": 32768, "google/gemma-2-2b": 8192,
    "microsoft/Phi-3.5-mini-instruct": 131072, "answerdotai/ModernBERT-base": 8192,
    "answerdotai/ModernBERT-large": 8192,
    "Qwen/Qwen3-0.6B": 40960, "Qwen/Qwen3-1.7B": 40960, "Qwen/Qwen3-4B": 40960, "Qwen/Qwen3-8B": 40960,
    "Qwen/Qwen3-14B": 40960, "Qwen/Qwen3-32B": 40960, "Qwen/Qwen3-30B-A3B": 40960,
    "Qwen/Qwen2.5-3B": 32768, "Qwen/Qwen2.5-14B": 131072,
    "google/gemma-2-9b": 8192, "google/gemma-3-270m": 32768, "google/gemma-3-1b-pt": 32768,
    "HuggingFaceTB/SmolLM2-135M": 8192, "HuggingFaceTB/SmolLM2-360M": 8192,
    "HuggingFaceTB/SmolLM2-1.7B": 8192, "microsoft/phi-1_5": 2048, "microsoft/phi-2": 2048,
    # vision-language models: their text model's positions
    "Qwen/Qwen2-VL-7B-Instruct": 32768, "Qwen/Qwen2.5-VL-7B-Instruct": 128000,
    "llava-hf/llava-1.5-7b-hf": 4096, "google/gemma-3-4b-it": 131072,
    "google/gemma-3-12b-it": 131072, "google/gemma-3-27b-it": 131072,
    "Qwen/Qwen2.5-72B": 131072, "meta-llama/Meta-Llama-3-70B": 8192,
    "mistralai/Mixtral-8x7B-v0.1": 32768, "mistralai/Mixtral-8x22B-v0.1": 65536,
    "swiss-ai/Apertus-8B-Instruct-2509": 65536, "ByteDance-Seed/Seed-OSS-36B-Instruct": 524288,
    "allenai/Olmo-3-7B-Instruct-SFT": 65536, "CohereForAI/c4ai-command-r7b-12-2024": 132096,
    "nvidia/Nemotron-Mini-4B-Instruct": 4096, "LiquidAI/LFM2-350M": 128000, "LiquidAI/LFM2-8B-A1B": 128000,
    "Qwen/Qwen3.5-27B": 262144, "Qwen/Qwen3.5-35B-A3B": 262144,
    **{f"Qwen/Qwen3.5-{size}": 262144 for size in ("0.8B", "4B", "9B", "122B-A10B", "397B-A17B")},
    "Qwen/Qwen3-Next-80B-A3B-Instruct": 262144,
    "tiiuae/Falcon-H1-0.5B-Base": 16384, "tiiuae/Falcon-H1-34B-Base": 262144,
    "tiiuae/Falcon-H1-1.5B-Base": 131072, "tiiuae/Falcon-H1-3B-Base": 131072,
    "tiiuae/Falcon-H1-7B-Base": 262144,
    "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16": 262144,
    "nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-BF16": 262144,
    "moonshotai/Kimi-Linear-48B-A3B-Instruct": 1048576,
    "ai21labs/Jamba-v0.1": 262144, "ai21labs/AI21-Jamba-1.5-Large": 262144,
    "google/gemma-4-E2B-it": 131072, "google/gemma-4-26B-A4B": 262144, "google/gemma-4-31B": 262144,
    "google/gemma-4-12B-it": 262144,
    "mistralai/Mistral-Small-3.1-24B-Instruct-2503": 131072, "mistralai/Magistral-Small-2509": 131072,
    "mistralai/Ministral-3-3B-Reasoning-2512": 262144, "mistral-community/pixtral-12b": 1024000,
    "mistralai/Mistral-Small-4-119B-2603": 1048576,
    "Qwen/Qwen3-VL-4B-Instruct": 262144, "Qwen/Qwen3-VL-30B-A3B-Instruct": 262144,
    **{f"tiny-{model_type}": 1024 for model_type in ("qwen2_vl", "qwen2_5_vl", "llava", "gemma3", "gemma4",
                                                      "mistral3", "mistral4", "pixtral", "qwen3_vl",
                                                      "qwen3_vl_moe")},
    "zai-org/GLM-4.5-Air": 131072, "zai-org/GLM-4.7-Flash": 202752,
    "OpenGVLab/InternVL3_5-8B-HF": 40960, "tiny-internvl": 1024,
    "LiquidAI/LFM2-VL-450M": 128000, "tiny-lfm2_vl": 1024,
    "tiny-qwen3_5_moe": 1024, "tiny-qwen3_5": 1024, "tiny-mllama": 1024,
    "alpindale/Llama-3.2-11B-Vision-Instruct": 131072,
    "meta-llama/Llama-4-Scout-17B-16E": 262144, "meta-llama/Llama-4-Maverick-17B-128E": 1048576,
    "tiny-llama4": 1024, "zai-org/GLM-4.6V-Flash": 131072, "tiny-glm4v": 1024,
    "meta-llama/Llama-3.1-405B": 131072, "openai/gpt-oss-120b": 131072, "deepseek-ai/DeepSeek-V2.5": 163840,
    "zai-org/GLM-4-32B-0414": 32768,
    "arcee-ai/AFM-4.5B": 65536, "arcee-ai/Trinity-Nano-Preview": 131072,
    "tencent/Hunyuan-0.5B-Instruct": 262144,
    "mistralai/Mistral-Medium-3.5-128B": 262144,
    "PaddlePaddle/PaddleOCR-VL-1.6": 131072, "tiny-paddleocr_vl": 1024,
    "deepseek-ai/DeepSeek-V3": 163840, "MiniMaxAI/MiniMax-M2": 196608,
    "ibm-granite/granite-4.0-h-tiny": 131072, "zai-org/GLM-5": 202752,
}


@pytest.mark.parametrize(
    ("name", "fields"),
    [
        (
            "bert-base-uncased",
            {
                "vocab_size": 30522,
                "hidden_size": 768,
                "num_hidden_layers": 12,
                "num_attention_heads": 12,
                "intermediate_size": 3072,
                "max_position_embeddings": 512,
                "type_vocab_size": 2,
            },
        ),
        ("bert-base-cased", {"vocab_size": 28996, "hidden_size": 768}),
        (
            "bert-large-uncased",
            {
                "hidden_size": 1024,
                "num_hidden_layers": 24,
                "num_attention_heads": 16,
                "intermediate_size": 4096,
            },
        ),
        (
            "bert-large-cased",
            {"vocab_size": 28996, "hidden_size": 1024, "num_hidden_layers": 24},
        ),
        ("bert-base-chinese", {"vocab_size": 21128}),
        ("bert-base-multilingual-cased", {"vocab_size": 119547}),
        ("cl-tohoku/bert-base-japanese", {"vocab_size": 32000}),
        (
            "distilbert-base-uncased",
            {"dim": 768, "n_layers": 6, "n_heads": 12, "hidden_dim": 3072},
        ),
        (
            "roberta-base",
            {"vocab_size": 50265, "max_position_embeddings": 514, "pad_token_id": 1},
        ),
        (
            "roberta-large",
            {
                "hidden_size": 1024,
                "num_hidden_layers": 24,
                "max_position_embeddings": 514,
            },
        ),
        ("xlm-roberta-base", {"vocab_size": 250002, "max_position_embeddings": 514}),
        ("xlm-roberta-large", {"vocab_size": 250002, "hidden_size": 1024}),
        (
            "albert-base-v2",
            {"vocab_size": 30000, "embedding_size": 128, "hidden_size": 768},
        ),
        (
            "microsoft/deberta-v3-base",
            {
                "vocab_size": 128100,
                "position_buckets": 256,
                "max_position_embeddings": 512,
                "type_vocab_size": 0,
            },
        ),
        ("microsoft/deberta-v3-large", {"hidden_size": 1024, "num_hidden_layers": 24}),
        (
            "google/electra-base-discriminator",
            {"embedding_size": 768, "hidden_size": 768, "vocab_size": 30522},
        ),
        (
            "gpt2",
            {
                "n_positions": 1024,
                "n_embd": 768,
                "n_layer": 12,
                "n_head": 12,
                "vocab_size": 50257,
            },
        ),
        (
            "gpt2-medium",
            {"n_positions": 1024, "n_embd": 1024, "n_layer": 24, "n_head": 16},
        ),
    ],
)
def test_presets_carry_the_published_hyperparameters(name: str, fields: dict[str, int]) -> None:
    config = resolve_model(name).config
    assert {key: getattr(config, key) for key in fields} == fields


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("bert-base-uncased", 109_482_240),  # BertModel with pooler
        ("bert-large-uncased", 335_141_888),
        ("roberta-base", 124_645_632),
        ("roberta-large", 355_359_744),
        ("xlm-roberta-base", 278_043_648),
        ("distilbert-base-uncased", 66_362_880),
        ("albert-base-v2", 11_683_584),
        ("gpt2", 124_439_808),
        ("gpt2-medium", 354_823_168),
    ],
)
def test_preset_parameter_counts_match_the_published_totals(name: str, params: int) -> None:
    assert parameter_count(resolve_model(name)) == params


def test_deberta_v3_base_has_the_model_cards_184m_parameters() -> None:
    # The DeBERTa-v3 model card: "only 86M backbone parameters with a vocabulary
    # containing 128K tokens which introduces 98M parameters in the Embedding layer".
    total = parameter_count(resolve_model("microsoft/deberta-v3-base"))
    embedding = 128100 * 768
    assert round(embedding / 1e6) == 98
    assert round(total / 1e6) == 86 + 98
    assert total == 183_831_552  # DebertaV2Model, no pooler: 85.45M besides the embedding


@pytest.mark.parametrize(
    ("alias", "preset"),
    [
        ("deberta-v3-base", "microsoft/deberta-v3-base"),
        ("DeBERTa-v3-Large", "microsoft/deberta-v3-large"),
        ("BERT-BASE-UNCASED", "bert-base-uncased"),
        ("electra-base-discriminator", "google/electra-base-discriminator"),
        ("google-bert/bert-base-uncased", "bert-base-uncased"),
        ("FacebookAI/roberta-base", "roberta-base"),
        ("openai-community/gpt2", "gpt2"),
        ("distilbert/distilbert-base-uncased", "distilbert-base-uncased"),
        ("tohoku-nlp/bert-base-japanese", "cl-tohoku/bert-base-japanese"),
    ],
)
def test_preset_aliases(alias: str, preset: str) -> None:
    assert preset_name(alias) == preset
    spec = resolve_model(alias)
    assert spec.name == alias
    assert spec.source == "preset"
    assert spec.config.to_dict() == resolve_model(preset).config.to_dict()


def test_a_fine_tune_under_another_org_is_not_taken_for_the_preset() -> None:
    assert preset_name("someone/bert-base-uncased") is None


# --- tiny models ----------------------------------------------------------------------


@pytest.mark.parametrize("model_type", sorted(TINY_CONFIGS))
def test_tiny_presets_build_small_models(model_type: str) -> None:
    spec = resolve_model(f"tiny-{model_type}")
    assert spec.config.model_type == TINY_CONFIGS[model_type].get("model_type", model_type)  # pixtral: llava
    assert tiny_config(model_type).model_type == spec.config.model_type
    assert spec.max_seq_len == LIMITS.get(f"tiny-{model_type}", 128)
    # Qwen3-VL's deepstack mergers (a patch merger per fed layer, 4 x 4 hidden wide) take it to 165k
    assert parameter_count(spec) < 200_000


def test_tiny_config_takes_overrides() -> None:
    config = tiny_config("bert", num_hidden_layers=3)
    assert config.num_hidden_layers == 3
    assert config.hidden_size == 32


def test_tiny_config_of_an_unknown_type_lists_the_types() -> None:
    with pytest.raises(InvalidInput, match="^no tiny config for model_type 't5': use one of bert, "):
        tiny_config("t5")


# --- local configs --------------------------------------------------------------------


def write_config(directory: Path, **fields: object) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    config = {
        "model_type": "bert",
        "hidden_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "intermediate_size": 128,
        "vocab_size": 100,
        "max_position_embeddings": 256,
        **fields,
    }
    path = directory / "config.json"
    path.write_text(json.dumps(config), encoding="utf-8")
    return path


def test_local_directory_with_config_json(tmp_path: Path) -> None:
    write_config(tmp_path / "my-model")
    spec = resolve_model(str(tmp_path / "my-model"))
    assert spec.source == "local"
    assert spec.config.hidden_size == 64
    assert spec.max_seq_len == 256


def test_local_config_json_file(tmp_path: Path) -> None:
    path = write_config(tmp_path, model_type="roberta", max_position_embeddings=130, pad_token_id=1)
    spec = resolve_model(str(path))
    assert spec.source == "local"
    assert spec.config.model_type == "roberta"
    assert spec.max_seq_len == 128


def test_local_path_inside_local_dirs(tmp_path: Path) -> None:
    write_config(tmp_path / "models" / "a")
    spec = resolve_model(str(tmp_path / "models" / "a"), local_dirs=[tmp_path / "models"])
    assert spec.source == "local"


def test_local_path_outside_local_dirs_is_refused(tmp_path: Path) -> None:
    write_config(tmp_path / "elsewhere")
    allowed = tmp_path / "models"
    allowed.mkdir()
    with pytest.raises(InvalidInput) as info:
        resolve_model(str(tmp_path / "elsewhere"), local_dirs=[allowed])
    assert not isinstance(info.value, UnknownModel)
    assert str(info.value) == (
        f"local model path '{tmp_path / 'elsewhere'}' is outside the allowed directories: {allowed.resolve()}"
    )


def test_a_symlink_out_of_local_dirs_is_refused(tmp_path: Path) -> None:
    write_config(tmp_path / "secret")
    allowed = tmp_path / "models"
    allowed.mkdir()
    (allowed / "link").symlink_to(tmp_path / "secret")
    with pytest.raises(InvalidInput, match="outside the allowed directories"):
        resolve_model(str(allowed / "link"), local_dirs=[allowed])


def test_local_paths_are_not_read_when_local_is_not_allowed(tmp_path: Path) -> None:
    write_config(tmp_path / "m")
    with pytest.raises(UnknownModel, match=f"^unknown model '{tmp_path / 'm'}': {NOT_FOUND}. Presets:"):
        resolve_model(str(tmp_path / "m"), allow_local=False)


def test_local_directory_without_config_json(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(UnknownModel, match="no config.json in"):
        resolve_model(str(tmp_path / "empty"))


def test_missing_local_file(tmp_path: Path) -> None:
    with pytest.raises(UnknownModel, match=r"\(no file .*missing\.json\)"):
        resolve_model(str(tmp_path / "missing.json"))


def test_a_config_json_symlinked_out_of_local_dirs_is_refused(tmp_path: Path) -> None:
    outside = write_config(tmp_path / "secret")
    (tmp_path / "models" / "m").mkdir(parents=True)
    (tmp_path / "models" / "m" / "config.json").symlink_to(outside)
    with pytest.raises(InvalidInput, match="outside the allowed directories"):
        resolve_model(str(tmp_path / "models" / "m"), local_dirs=[tmp_path / "models"])


def test_local_config_that_is_not_json(tmp_path: Path) -> None:
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(UnknownModel, match="cannot read"):
        resolve_model(str(tmp_path / "broken"))


def test_unknown_model_type_is_refused_without_remote_code(tmp_path: Path) -> None:
    write_config(
        tmp_path / "custom",
        model_type="my-secret-arch",
        auto_map={"AutoConfig": "x.MyConfig"},
    )
    with pytest.raises(UnknownModel) as info:
        resolve_model(str(tmp_path / "custom"))
    message = str(info.value)
    assert "model_type 'my-secret-arch' is not built into transformers" in message
    assert "autotune does not run remote code (trust_remote_code is off)" in message
    assert message.endswith(f"Presets: {PRESET_LIST}")


# --- names that resolve nowhere -------------------------------------------------------


def test_unknown_name_lists_the_presets() -> None:
    with pytest.raises(UnknownModel) as info:
        resolve_model("bert-huge", allow_hub=True)
    assert str(info.value) == (
        f"unknown model 'bert-huge': {NOT_FOUND} (offline: only the local Hugging Face "
        f"cache was searched). Presets: {PRESET_LIST}"
    )


def test_unknown_name_without_hub_lookups() -> None:
    with pytest.raises(UnknownModel) as info:
        resolve_model("bert-huge", allow_hub=False)
    assert str(info.value) == f"unknown model 'bert-huge': {NOT_FOUND}. Presets: {PRESET_LIST}"
    assert str(info.value).startswith(
        "unknown model 'bert-huge': not a built-in preset, a local config, or a reachable "
        "Hugging Face hub id. Presets: ai21labs/AI21-Jamba-1.5-Large, ai21labs/Jamba-v0.1, albert-base-v2, "
    )


def _no_hub(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if the hub would be asked (a config download or the reachability probe)."""
    from autotune.workload import models

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the hub was asked")

    monkeypatch.setattr(models, "_hub_config", refuse)
    monkeypatch.setattr(models, "hub_unreachable", refuse)


def test_the_hub_is_off_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    _no_hub(monkeypatch)
    with pytest.raises(UnknownModel, match="^unknown model 'someone/bert-huge': not a built-in"):
        resolve_model("someone/bert-huge")


HINT = "hub ids are looked up only when you ask: --hub"


def test_with_the_hub_off_a_hint_says_how_to_ask_for_it(monkeypatch: pytest.MonkeyPatch) -> None:
    _no_hub(monkeypatch)
    with pytest.raises(UnknownModel) as info:
        resolve_model("someone/bert-huge", hub_hint=HINT)
    assert str(info.value) == (
        f"unknown model 'someone/bert-huge': not a built-in preset or a local config ({HINT}). "
        f"Presets: {PRESET_LIST}"
    )
    # A name that cannot be a hub id (a space) gets no hint.
    with pytest.raises(UnknownModel) as info:
        resolve_model("bert huge", hub_hint=HINT)
    assert str(info.value) == (
        f"unknown model 'bert huge': not a built-in preset or a local config. Presets: {PRESET_LIST}"
    )


@pytest.mark.parametrize(
    ("name", "suggestion"),
    [
        ("bert-base-uncase", "bert-base-uncased"),
        ("tiny-bret", "tiny-bert"),
        ("TINY-BRET", "tiny-bert"),
        ("bert base uncased", "bert-base-uncased"),
        # The variant words (-Instruct, -it, -SFT, ...) set aside, the base model is named alone: letter
        # for letter Olmo-3-7B-Instruct-SFT (0.67) and Qwen2.5-72B are within 0.05 of the best.
        ("llama-3.2-1b-instruct", "meta-llama/Llama-3.2-1B"),
        ("Qwen2.5-7B-Instruct", "Qwen/Qwen2.5-7B"),
        ("meta-llama/Llama-3.2-1B-Instruct", "meta-llama/Llama-3.2-1B"),
        ("Qwen2.5-3B-it", "Qwen/Qwen2.5-3B"),
        ("bert-large", "bert-large-uncased or bert-large-cased"),  # a family: each of its presets
        ("robrta-base", "roberta-base"),
    ],
)
def test_a_mistyped_name_is_refused_naming_the_close_presets_without_the_hub(
    monkeypatch: pytest.MonkeyPatch, name: str, suggestion: str
) -> None:
    _no_hub(monkeypatch)
    with pytest.raises(UnknownModel) as info:
        resolve_model(name, hub_hint=HINT)
    message = str(info.value)
    assert message.startswith(f"unknown model '{name}': did you mean {suggestion}? It is not a "
                              "built-in preset or a local config")
    assert message.endswith(f"Presets: {PRESET_LIST}")


def test_a_failed_hub_lookup_names_the_close_presets_too() -> None:
    # conftest: HF_HUB_OFFLINE=1, so the lookup reads the (empty) local cache and fails.
    with pytest.raises(UnknownModel) as info:
        resolve_model("tiny-bret", allow_hub=True)
    assert str(info.value) == (
        f"unknown model 'tiny-bret': did you mean tiny-bert? It is not {NOT_FOUND.removeprefix('not ')} "
        f"(offline: only the local Hugging Face cache was searched). Presets: {PRESET_LIST}"
    )


def test_a_name_far_from_every_preset_gets_no_suggestion() -> None:
    with pytest.raises(UnknownModel) as info:
        resolve_model("some-org/bert-huge", hub_hint=HINT)
    assert "did you mean" not in str(info.value)


def test_unreachable_hub_fails_fast(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.delenv("AUTOTUNE_OFFLINE")
    for proxy in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(proxy, raising=False)
    with socket.socket() as probe:  # a local port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    start = time.monotonic()
    with pytest.raises(UnknownModel, match=f"cannot reach http://127.0.0.1:{port}"):
        resolve_model("some-org/bert-huge", allow_hub=True)
    assert time.monotonic() - start < 10


@pytest.mark.parametrize("name", ["", "   "])
def test_empty_name(name: str) -> None:
    with pytest.raises(InvalidInput, match="^empty model name"):
        resolve_model(name)


# --- sequence lengths -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "seq_len", "message", "limit"),
    [
        (
            "bert-base-uncased",
            1024,
            "sequence length 1024 exceeds max_position_embeddings=512 of bert-base-uncased",
            512,
        ),
        (
            "roberta-base",
            600,
            "sequence length 600 exceeds the 512 usable positions "
            "(max_position_embeddings=514) of roberta-base",
            512,
        ),
        (
            "xlm-roberta-base",
            513,
            "sequence length 513 exceeds the 512 usable positions "
            "(max_position_embeddings=514) of xlm-roberta-base",
            512,
        ),
        ("gpt2", 2048, "sequence length 2048 exceeds n_positions=1024 of gpt2", 1024),
        (
            "deberta-v3-base",
            513,
            "sequence length 513 exceeds max_position_embeddings=512 of deberta-v3-base",
            512,
        ),
        (
            "tiny-bert",
            129,
            "sequence length 129 exceeds max_position_embeddings=128 of tiny-bert",
            128,
        ),
    ],
)
def test_sequence_too_long(name: str, seq_len: int, message: str, limit: int) -> None:
    spec = resolve_model(name)
    with pytest.raises(SequenceTooLong) as info:
        check_seq_len(spec, seq_len)
    assert str(info.value) == message
    assert info.value.limit == limit
    assert isinstance(info.value, InvalidInput)


@pytest.mark.parametrize(
    ("name", "seq_len"),
    [("bert-base-uncased", 512), ("roberta-base", 512), ("gpt2", 1024)],
)
def test_sequence_at_the_limit_is_allowed(name: str, seq_len: int) -> None:
    check_seq_len(resolve_model(name), seq_len)
    check_seq_len(resolve_model(name), 1)


@pytest.mark.parametrize("seq_len", [0, -1, True, 1.5])
def test_sequence_length_must_be_a_positive_integer(seq_len: object) -> None:
    with pytest.raises(InvalidInput) as info:
        check_seq_len(resolve_model("tiny-bert"), seq_len)  # type: ignore[arg-type]
    assert not isinstance(info.value, SequenceTooLong)
    assert str(info.value) == f"sequence length must be an integer >= 1, got {seq_len!r}"


# --- tasks and the spec ---------------------------------------------------------------


@pytest.mark.parametrize("task", TASKS)
def test_known_tasks(task: str) -> None:
    assert check_task(task) == task
    assert check_task(task.upper().replace("-", "_")) == task


def test_default_task_is_a_task() -> None:
    assert check_task(DEFAULT_TASK) == "sequence-classification"


def test_unknown_task_lists_the_tasks() -> None:
    with pytest.raises(InvalidInput) as info:
        check_task("summarization")
    assert str(info.value) == (
        "unknown task 'summarization': use one of sequence-classification, "
        "question-answering, masked-lm, causal-lm, token-classification, image-text-to-text"
    )


def test_model_spec_is_frozen_and_hashable() -> None:
    spec = resolve_model("tiny-bert")
    assert spec == resolve_model("tiny-bert")
    assert hash(spec) == hash(resolve_model("tiny-bert"))
    with pytest.raises(AttributeError):
        spec.max_seq_len = 1  # type: ignore[misc]


def test_importing_models_imports_neither_torch_nor_transformers() -> None:
    code = (
        "import sys, autotune.workload.models; "
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[3])
