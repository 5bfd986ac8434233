"""Falcon-H1's and Nemotron-H's Mamba-2 mixers (workload/mamba_mixer.py): traced through transformers'
torch path here,
and `autotune check` says so, naming the fused kernel a GPU user runs instead."""

from __future__ import annotations

import json

import pytest
import torch

from autotune.cli import main
from autotune.workload import gated_delta_rule, mamba_mixer
from autotune.workload.models import PRESETS, resolve_model


@pytest.mark.parametrize("model_type", ["falcon_h1", "nemotron_h"])
def test_the_traced_training_step_takes_the_torch_path(model_type: str) -> None:
    """FalconH1Mixer.forward and NemotronHMamba2Mixer.forward return the fused call's output where it
    is not None: here its torch stand-in answers None, so the chunked torch scan (mamba2_chunk_scan)
    computes the mixer."""
    import importlib

    from transformers import AutoModelForCausalLM

    modeling = importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")
    config = resolve_model(f"tiny-{model_type}").config
    model = AutoModelForCausalLM.from_config(config).train()
    mixers = [m for m in model.modules() if type(m).__name__ in ("FalconH1Mixer", "NemotronHMamba2Mixer")]
    mixer = mixers[0]
    zxbcdt = torch.randn(1, 20, mixer.in_proj.out_features)
    fused = modeling.mamba2_split_conv1d_scan_combined(
        zxbcdt, mixer.conv1d.weight.squeeze(1), mixer.conv1d.bias, mixer.dt_bias, -torch.exp(mixer.A_log),
        D=mixer.D, chunk_size=mixer.chunk_size, outproj_weight=mixer.out_proj.weight, headdim=mixer.head_dim)
    assert fused is None
    scans = []
    original = modeling.mamba2_chunk_scan

    def counting(*args: object, **kwargs: object) -> object:
        scans.append(1)
        return original(*args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(modeling, "mamba2_chunk_scan", counting)
        ids = torch.randint(0, config.vocab_size, (1, 20))
        model(input_ids=ids, labels=ids).loss.backward()
    assert len(scans) == len(mixers)


def test_only_falcon_h1_and_nemotron_h_are_noted_as_traced_through_the_torch_path() -> None:
    assert mamba_mixer.torch_path(PRESETS["tiny-falcon_h1"]["model_type"])
    assert mamba_mixer.torch_path(PRESETS["tiiuae/Falcon-H1-34B-Base"]["model_type"])
    assert mamba_mixer.torch_path(PRESETS["nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16"]["model_type"])
    assert not mamba_mixer.torch_path(PRESETS["tiny-qwen3_5_text"]["model_type"])
    assert not mamba_mixer.torch_path(PRESETS["tiny-llama"]["model_type"])


@pytest.mark.parametrize(("model", "notes"), [
    ("tiny-falcon_h1", [mamba_mixer.NOTE]),
    ("tiny-nemotron_h", [mamba_mixer.NOTE]),  # its experts' grouped_mm: bfloat16 weights
    ("tiny-qwen3_5_text", [gated_delta_rule.NOTE]),
    ("tiny-llama", []),
])
def test_check_names_the_mixer_path_it_modelled(model: str, notes: list[str],
                                                capsys: pytest.CaptureFixture[str]) -> None:
    args = ["check", model, "--seq-len", "32", "--batch-size", "1", "--gpu-memory", "2GiB",
            "--backend", "estimate", "--no-cache", "--json"]
    if model == "tiny-nemotron_h":
        args += ["--dtype", "bfloat16"]
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out)["config_notes"] == notes
    assert all("torch_forward" in note and "mamba_split_conv1d_scan_combined" in note
               for note in notes if note is mamba_mixer.NOTE)
