"""Axolotl's context_parallel_size read as the request's context_parallel (configs/axolotl_context.py):
the cp dim of its mesh under FSDP2, what Axolotl refuses as the job's failure in its words, and what is
not modelled refused by name. Small configs in the shapes of Axolotl's examples (distributed-parallel,
alst, nemotron-h), written here."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from configread import write

from autotune.cli import main
from autotune.configs import read_training_config
from autotune.errors import JobFails, UnmodelledSetting

AXOLOTL = {"base_model": "tiny-llama", "sequence_len": 64, "micro_batch_size": 1, "bf16": True,
           "sample_packing": True, "attn_implementation": "flash_attention_2",
           "datasets": [{"path": "x", "type": "alpaca"}]}
FSDP2 = {**AXOLOTL, "fsdp_version": 2, "fsdp_config": {
    "auto_wrap_policy": "TRANSFORMER_BASED_WRAP", "transformer_layer_cls_to_wrap": "LlamaDecoderLayer",
    "reshard_after_forward": True, "state_dict_type": "FULL_STATE_DICT"}}


def read(tmp_path: Path, data: dict) -> tuple:
    config = read_training_config(write(tmp_path, data, "a.yml"))
    return config.request.step, config.notes


def test_the_mesh_s_gpus_are_replicate_x_shard_x_cp_x_tp(tmp_path):
    step, notes = read(tmp_path, {**FSDP2, "dp_shard_size": 2, "context_parallel_size": 2,
                                  "tensor_parallel_size": 2})
    assert (step.parallel, step.gpus, step.context_parallel, step.tensor_parallel) == ("fsdp", 8, 2, 2)
    assert any("context parallel 2: ring-flash-attn emulated" in note for note in notes)


def test_heads_k_stride_is_read(tmp_path):
    step, notes = read(tmp_path, {**FSDP2, "context_parallel_size": 2, "heads_k_stride": 2})
    assert step.heads_k_stride == 2
    assert any("heads_k_stride 2" in note for note in notes)


def test_the_deprecated_sequence_parallel_degree_is_context_parallel(tmp_path):
    step, _ = read(tmp_path, {**FSDP2, "sequence_parallel_degree": 4})
    assert step.context_parallel == 4


def test_a_micro_batch_above_1_with_sample_packing_fails_as_axolotl_says(tmp_path):
    with pytest.raises(JobFails, match="micro_batch_size must be set to 1 when sample_packing is enabled"):
        read(tmp_path, {**FSDP2, "context_parallel_size": 2, "micro_batch_size": 2})


def test_an_attention_outside_flash_attn_fails_as_axolotl_says(tmp_path):
    with pytest.raises(JobFails, match="context_parallel_size > 1 requires flash attention"):
        read(tmp_path, {**FSDP2, "context_parallel_size": 2, "attn_implementation": "sdpa"})


@pytest.mark.parametrize(("changes", "key"), [
    ({"sample_packing": False}, "ring_attn_func"),  # batch_ring, the default without packing
    ({"ring_attn_func": "batch_zigzag"}, "ring_attn_func"),
])
def test_what_is_not_modelled_is_refused_by_name(tmp_path, changes, key):
    with pytest.raises(UnmodelledSetting, match=rf"^{key}: .* is not modelled"):
        read(tmp_path, {**FSDP2, "context_parallel_size": 2, **changes})


def test_context_parallel_without_fsdp2_is_refused_by_name(tmp_path):
    # the shape of nemotron-h's qlora-cp example: no FSDP, no DeepSpeed
    with pytest.raises(UnmodelledSetting, match=r"^context_parallel_size: .*without FSDP2"):
        read(tmp_path, {**AXOLOTL, "context_parallel_size": 2})


@pytest.mark.slow  # the whole check of tiny-llama's FSDP2 rank: about 12 s
def test_a_check_of_such_a_config_says_the_ring_is_emulated(tmp_path, capsys):
    # the shape of distributed-parallel's fsdp-cp example: dp_shard x cp, the GPUs their product
    path = tmp_path / "cp.yml"
    path.write_text(yaml.safe_dump({**FSDP2, "dp_shard_size": 2, "context_parallel_size": 2}))
    argv = ["check", "--from-config", str(path), "--gpu", "H100-80GB", "--workers", "1", "--no-cache"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "context parallel 2 (each rank holds 1/2 of every sequence" in out and "4 GPUs" in out
    assert "context parallel 2: ring-flash-attn emulated" in out


def test_context_parallel_under_deepspeed_is_refused_as_the_ring_beside_zero(tmp_path):
    # the shape of the alst DeepSpeed example: Axolotl builds the cp mesh and runs ring-flash-attn under
    # ZeRO too (loaders/model.py _apply_pre_model_load_setup); it has no Ulysses attention
    with pytest.raises(UnmodelledSetting, match=r"^context_parallel_size: .*under DeepSpeed ZeRO \(the same "
                       r"ring beside ZeRO's partitioning .*not Ulysses\)"):
        read(tmp_path, {**AXOLOTL, "context_parallel_size": 2,
                        "deepspeed": {"zero_optimization": {"stage": 3}}})
