"""Falcon-H1's Mamba-2 mixers (workload/mamba_mixer.py): traced through transformers' torch path here,
and `autotune check` says so, naming the fused kernel a GPU user runs instead."""

from __future__ import annotations

import json

import pytest
import torch

from autotune.cli import main
from autotune.workload import gated_delta_rule, mamba_mixer
from autotune.workload.models import PRESETS, resolve_model


def test_the_traced_training_step_takes_the_torch_path() -> None:
    """FalconH1Mixer.forward returns the fused call's output where it is not None: here its torch
    stand-in answers None, so the chunked torch scan (mamba2_chunk_scan) computes the mixer."""
    from transformers import AutoModelForCausalLM
    from transformers.models.falcon_h1 import modeling_falcon_h1

    config = resolve_model("tiny-falcon_h1").config
    model = AutoModelForCausalLM.from_config(config).train()
    mixer = model.model.layers[0].mamba
    zxbcdt = torch.randn(1, 20, mixer.in_proj.out_features)
    fused = modeling_falcon_h1.mamba2_split_conv1d_scan_combined(
        zxbcdt, mixer.conv1d.weight.squeeze(1), mixer.conv1d.bias, mixer.dt_bias, -torch.exp(mixer.A_log),
        D=mixer.D, chunk_size=mixer.chunk_size, outproj_weight=mixer.out_proj.weight, headdim=mixer.head_dim)
    assert fused is None
    scans = []
    original = modeling_falcon_h1.mamba2_chunk_scan

    def counting(*args: object, **kwargs: object) -> object:
        scans.append(1)
        return original(*args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(modeling_falcon_h1, "mamba2_chunk_scan", counting)
        ids = torch.randint(0, config.vocab_size, (1, 20))
        model(input_ids=ids, labels=ids).loss.backward()
    assert len(scans) == config.num_hidden_layers


def test_only_falcon_h1_is_noted_as_traced_through_the_torch_path() -> None:
    assert mamba_mixer.torch_path(PRESETS["tiny-falcon_h1"]["model_type"])
    assert mamba_mixer.torch_path(PRESETS["tiiuae/Falcon-H1-34B-Base"]["model_type"])
    assert not mamba_mixer.torch_path(PRESETS["tiny-qwen3_5_text"]["model_type"])
    assert not mamba_mixer.torch_path(PRESETS["tiny-llama"]["model_type"])


@pytest.mark.parametrize(("model", "notes"), [
    ("tiny-falcon_h1", [mamba_mixer.NOTE]),
    ("tiny-qwen3_5_text", [gated_delta_rule.NOTE]),
    ("tiny-llama", []),
])
def test_check_names_the_mixer_path_it_modelled(model: str, notes: list[str],
                                                capsys: pytest.CaptureFixture[str]) -> None:
    args = ["check", model, "--seq-len", "32", "--batch-size", "1", "--gpu-memory", "2GiB",
            "--backend", "estimate", "--no-cache", "--json"]
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out)["config_notes"] == notes
    assert all("torch_forward" in note and "mamba_split_conv1d_scan_combined" in note
               for note in notes if note is mamba_mixer.NOTE)
