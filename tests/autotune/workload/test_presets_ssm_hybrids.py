"""The Jamba presets (presets/ssm_hybrids.py): their parameter counts against the published sizes, their
layer pattern, and the estimator's refusal of their Mamba-1 mixers by name."""

from __future__ import annotations

import json

import pytest

from autotune.cli import main
from autotune.workload.models import infer_task, preset_name, resolve_model
from tests.autotune.workload.test_presets_llm import fake_causal_lm, parameter_count, published


@pytest.mark.parametrize(
    ("name", "params", "figure"),
    [
        # Jamba's model card and paper (arXiv 2403.19887): "52B total available parameters".
        ("ai21labs/Jamba-v0.1", 51_570_323_328, "52B"),
        # AI21-Jamba-1.5-Large's model card: "94B active and 398B total parameters".
        ("ai21labs/AI21-Jamba-1.5-Large", 398_555_145_696, "398B"),
    ],
)
def test_jamba_counts_are_the_published_sizes(name: str, params: int, figure: str) -> None:
    assert parameter_count(fake_causal_lm(name)) == params
    assert published(params, figure)


@pytest.mark.parametrize(("name", "layers"), [("ai21labs/Jamba-v0.1", 32),
                                             ("ai21labs/AI21-Jamba-1.5-Large", 72)])
def test_jamba_attends_in_one_layer_of_eight_and_experts_in_every_other(name: str, layers: int) -> None:
    config = resolve_model(name).config
    assert config.layers_block_type == (["mamba"] * 4 + ["attention"] + ["mamba"] * 3) * (layers // 8)
    assert config.layers_num_experts == [1, 16] * (layers // 2)
    assert infer_task(config)[0] == "causal-lm"


def test_jamba_resolves_by_its_name_without_the_org() -> None:
    assert preset_name("Jamba-v0.1") == "ai21labs/Jamba-v0.1"
    assert preset_name("AI21-Jamba-1.5-Large") == "ai21labs/AI21-Jamba-1.5-Large"


def test_tiny_jamba_is_a_small_float32_causal_lm_with_both_layer_kinds() -> None:
    config = resolve_model("tiny-jamba").config
    assert config.dtype is None and infer_task(config)[0] == "causal-lm"
    assert config.layers_block_type == ["mamba", "attention"]
    assert parameter_count(fake_causal_lm("tiny-jamba")) < 100_000


@pytest.mark.parametrize("model", ["tiny-jamba", "ai21labs/Jamba-v0.1"])
def test_the_estimator_refuses_mamba_1_mixers_by_name(model: str, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["check", model, "--seq-len", "32", "--batch-size", "1", "--gpu-memory", "80GiB",
            "--backend", "estimate", "--no-cache", "--json"]
    assert main(args) == 2
    error = json.loads(capsys.readouterr().out)["error"]
    assert "Mamba-1" in error and "selective_scan_fn" in error and "model_type jamba" in error


@pytest.mark.parametrize(("model_type", "refused"), [("MambaLMHeadModel", True),
                                                     ("AutoModelForCausalLM", False)])
def test_axolotl_s_mamba_ssm_model_class_is_refused_by_name(tmp_path, model_type: str, refused: bool) -> None:
    # examples/mamba/config.yml: Axolotl builds mamba-ssm's MambaLMHeadModel, not a transformers model
    from configread import write

    from autotune.configs import read_training_config
    from autotune.errors import UnmodelledSetting

    data = {"base_model": "state-spaces/mamba-2.8b", "model_type": model_type, "sequence_len": 64,
            "micro_batch_size": 1, "bf16": False}
    path = write(tmp_path, data, "mamba.yml")
    if not refused:
        read_training_config(path)
        return
    with pytest.raises(UnmodelledSetting, match="model_type: 'MambaLMHeadModel'.*mamba-ssm"):
        read_training_config(path)
