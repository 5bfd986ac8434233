"""Axolotl's tiled_mlp read as the request's tiled_mlp (configs/axolotl_tiled.py): its shards (0: its
default, ceil(seq / 32768) of a rank's tokens), the note that says how many, and the other
implementations Axolotl would run refused by name."""

from __future__ import annotations

from pathlib import Path

import pytest
from configread import write

from autotune.configs import read_training_config
from autotune.errors import InvalidInput, UnmodelledSetting

AXOLOTL = {"base_model": "tiny-llama", "sequence_len": 500_000, "micro_batch_size": 1, "bf16": True,
           "sample_packing": True, "attn_implementation": "flash_attention_2", "gradient_checkpointing": True,
           "datasets": [{"path": "x", "type": "completion"}], "tiled_mlp": True}
FSDP2 = {**AXOLOTL, "fsdp_version": 2, "fsdp_config": {
    "auto_wrap_policy": "TRANSFORMER_BASED_WRAP", "transformer_layer_cls_to_wrap": "LlamaDecoderLayer",
    "reshard_after_forward": True, "state_dict_type": "SHARDED_STATE_DICT"}}


def read(tmp_path: Path, data: dict) -> tuple:
    config = read_training_config(write(tmp_path, data, "a.yml"))
    return config.request.step, config.notes


def test_the_default_shards_are_the_rank_s_tokens_over_32768(tmp_path):
    step, notes = read(tmp_path, AXOLOTL)
    assert step.tiled_mlp == 0
    assert "tiled_mlp: 16 shards (tiled_mlp_num_shards unset: patch.py's ceil(500000 tokens a rank" in \
        "\n".join(notes)


def test_under_context_parallel_a_rank_shards_its_own_part_of_the_sequence(tmp_path):
    # the ALST example's shape: context_parallel_size 8 under FSDP2, 62500 tokens a rank
    step, notes = read(tmp_path, {**FSDP2, "context_parallel_size": 8})
    assert (step.tiled_mlp, step.context_parallel) == (0, 8)
    assert "tiled_mlp: 2 shards" in "\n".join(notes)


def test_tiled_mlp_num_shards_is_read(tmp_path):
    step, notes = read(tmp_path, {**AXOLOTL, "tiled_mlp_num_shards": 4})
    assert step.tiled_mlp == 4 and "tiled_mlp: 4 shards (tiled_mlp_num_shards)" in "\n".join(notes)
    with pytest.raises(InvalidInput, match="tiled_mlp_num_shards in .* must be a whole number of shards"):
        read(tmp_path, {**AXOLOTL, "tiled_mlp_num_shards": 0})


def test_tiled_mlp_off_leaves_the_mlp_as_it_is(tmp_path):
    step, _ = read(tmp_path, {**AXOLOTL, "tiled_mlp": False, "tiled_mlp_num_shards": 4})
    assert step.tiled_mlp is None


@pytest.mark.parametrize(("changes", "key", "why"), [
    ({"tiled_mlp_use_original_mlp": False}, "tiled_mlp_use_original_mlp", "generic_mlp_forward"),
    ({"deepspeed": {"zero_optimization": {"stage": 3}}}, "tiled_mlp", "DeepSpeed's TiledMLP"),
])
def test_another_implementation_is_refused_by_name(tmp_path, changes, key, why):
    with pytest.raises(UnmodelledSetting, match=f"^{key}: .* is not modelled: .*{why}"):
        read(tmp_path, {**AXOLOTL, **changes})
