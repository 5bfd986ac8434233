"""Tensor parallelism under FSDP2 (backends/distributed.py ``tensor_parallel``): transformers' own
apply_tensor_parallelism with the model's tp_plan on the mesh's tp dim, traced for rank 0 of a fake
process group; each planned linear and the embedding hold 1/tp on a rank, FSDP2 shards that again."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from ranktrace import Phases

from autotune.backends.estimate.backend import EstimateBackend
from autotune.backends.estimate.steps import SteadySteps
from autotune.configs import read_training_configs
from autotune.errors import InvalidInput, UnmodelledSetting
from autotune.gpus import resolve_gpu
from autotune.workload import Workload
from autotune.workload.models import resolve_model
from autotune.workload.modes import parse_mode
from autotune.workload.parallel import Parallel, make_parallel
from autotune.workload.presets.tiny import TINY_CONFIGS
from autotune.workload.step import build_model

# tiny-llama with heads a tp of 2 divides, an MLP width no other activation has, an untied head
CONFIG = {**TINY_CONFIGS["llama"], "model_type": "llama", "num_attention_heads": 4, "num_key_value_heads": 2,
          "head_dim": 8, "intermediate_size": 192, "tie_word_embeddings": False}
# the parameters Llama's plan splits (config base_model_tp_plan, the model's _tp_plan; the input
# embedding vocabulary-parallel, distributed/mixin.py init_parallel_plans); the norms stay whole
PLANNED = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "embed_tokens",
           "lm_head")
BATCH, SEQ = 2, 32


@pytest.fixture(scope="module")
def spec(tmp_path_factory: pytest.TempPathFactory) -> Any:
    folder = tmp_path_factory.mktemp("tp-llama")
    (folder / "config.json").write_text(json.dumps(CONFIG))
    return resolve_model(str(folder))


def traced(spec: Any, parallel: Parallel | None, loss: str = "full") -> tuple[Phases, Any]:
    import torch

    workload = Workload(spec, "causal-lm", None, weights_dtype="bfloat16", parallel=parallel, loss=loss)
    backend = EstimateBackend(resolve_gpu("A100-80GB"))
    backend._steady[(workload, "fp32")] = SteadySteps(verified=False)
    phases = Phases()
    backend.trace_with(phases, backend._model(workload, "fp32"), workload, parse_mode("fp32"), SEQ, BATCH)
    with torch.device("meta"):
        model, _ = build_model(spec, "causal-lm", None, "bfloat16")
    return phases, model


def tp_rank_bytes(model: Any, tp: int) -> int:
    """A TP rank's parameter bytes: 1/tp of each planned parameter, every other whole."""
    return sum(p.numel() * p.element_size() // (tp if any(part in name for part in PLANNED) else 1)
               for name, p in model.named_parameters())


def buffer_bytes(model: Any) -> int:
    return sum(b.numel() * b.element_size() for b in model.buffers())


@pytest.mark.parametrize(("gpus", "shard"), [(2, 1), (4, 2), (8, 4)])
def test_a_tp_rank_holds_1_over_tp_of_each_planned_linear_then_fsdp_s_shard_of_that(spec, gpus, shard):
    phases, model = traced(spec, Parallel("fsdp", gpus, tp=2))
    held = tp_rank_bytes(model, 2) // shard
    assert phases.loaded_bytes == held + buffer_bytes(model)
    before = phases.live["before steps"][0]
    assert phases.live["backward done"][0] - before == held  # the gradients of the rank's pieces


def test_hybrid_sharding_with_tp_replicates_across_nodes():
    parallel = Parallel("fsdp", 16, nodes=2, tp=2)
    assert parallel.shard_size == 4
    assert "mesh 2 x 4 FSDP x 2 TP" in parallel.label


def test_a_tp_rank_computes_its_share_of_the_mlp_width(spec):
    whole = BATCH * SEQ * CONFIG["intermediate_size"] * 2  # bf16 gate/up outputs of one GPU
    alone, _ = traced(spec, Parallel("fsdp", 2))
    split, _ = traced(spec, Parallel("fsdp", 2, tp=2))
    assert alone.allocated_in_first_forward_and_backward()[whole] > 0
    assert split.allocated_in_first_forward_and_backward()[whole] == 0
    halves = split.allocated_in_first_forward_and_backward()[whole // 2]
    assert halves >= alone.allocated_in_first_forward_and_backward()[whole]


def test_tp_that_splits_a_head_is_refused():
    with pytest.raises(InvalidInput, match="does not divide num_key_value_heads=1"):
        traced(resolve_model("tiny-llama"), Parallel("fsdp", 2, tp=2))


def test_tp_with_a_fused_loss_over_the_sharded_head_is_refused(spec):
    with pytest.raises(UnmodelledSetting, match="tensor parallel 2 with the chunked loss"):
        traced(spec, Parallel("fsdp", 2, tp=2), loss="chunked")


def test_cce_over_the_sharded_head_runs_vocabulary_parallel_on_the_rank_s_rows(spec):
    # the fork's apply_lce takes the DTensor lm_head to its local rows (workload/cce_vocab.py): the
    # rank keeps the gradients of its pieces only, the head's [vocab / 2, hidden] among them
    phases, model = traced(spec, Parallel("fsdp", 2, tp=2), loss="cce")
    held = tp_rank_bytes(model, 2)
    assert phases.live["backward done"][0] - phases.live["before steps"][0] == held


@pytest.mark.parametrize(("kind", "gpus", "nodes", "text"), [
    ("ddp", 4, None, "beside {parallel} ddp is not modelled"),
    ("fsdp", 6, 2, "must divide the GPUs of a node (3)"),
])
def test_tp_outside_fsdp2_or_across_nodes_is_refused(kind, gpus, nodes, text):
    with pytest.raises(InvalidInput) as raised:
        make_parallel(gpus, kind, nodes=nodes, tensor_parallel=2)
    assert raised.value.field == "tensor_parallel"
    assert text in (raised.value.template or "")


AXOLOTL = ("base_model: x\nsequence_len: 64\nmicro_batch_size: 1\nnum_epochs: 1\nbf16: true\n"
           "attn_implementation: flash_attention_2\nfsdp_version: 2\n"
           "fsdp_config:\n  reshard_after_forward: true\n")


def test_axolotl_s_mesh_is_read_as_gpus_nodes_and_tensor_parallel(tmp_path: Path):
    file = tmp_path / "c.yaml"
    file.write_text(AXOLOTL + "dp_shard_size: 4\ndp_replicate_size: 2\ntensor_parallel_size: 2\n")
    step = read_training_configs([str(file)], None).request.step
    assert (step.gpus, step.nodes, step.tensor_parallel, step.parallel) == (16, 2, 2, "fsdp")


@pytest.mark.parametrize(("extra", "key", "why"), [
    # without sample packing Axolotl's ring is batch_ring (modelled: varlen_llama3, test_axolotl_context.py)
    ("context_parallel_size: 2\n", "ring_attn_func", "batch_ring"),
    ("expert_parallel_size: 4\n", "expert_parallel_size", "ExpertParallelPlugin"),
])
def test_axolotl_s_context_and_expert_parallelism_are_refused_by_name(tmp_path: Path, extra, key, why):
    file = tmp_path / "c.yaml"
    file.write_text(AXOLOTL + extra)
    with pytest.raises(UnmodelledSetting, match=f"{key}.*{why}"):
        read_training_configs([str(file)], None)


def test_a_gpu_count_other_than_axolotl_s_mesh_product_is_refused(tmp_path: Path, capsys):
    # accelerate's ParallelismConfig refuses num_processes other than its total_size: --gpus cannot
    # override dp_replicate_size x dp_shard_size (x tensor_parallel_size)
    from autotune.cli import main

    file = tmp_path / "c.yaml"
    file.write_text(AXOLOTL + "dp_shard_size: 4\ndp_replicate_size: 2\n")
    args = ["check", "tiny-llama", "--from-config", str(file), "--gpu", "H100-80GB", "--workers", "1"]
    assert main([*args, "--gpus", "16"]) == 2
    assert ("--gpus 16, but dp_shard_size 4 x dp_replicate_size 2 in" in capsys.readouterr().err)
    assert main([*args, "--gpus", "8"]) == 0


@pytest.mark.slow  # the whole check: a batch-size search
def test_an_axolotl_tp_job_with_cce_says_the_loss_runs_vocabulary_parallel(spec, tmp_path: Path, capsys):
    from autotune.cli import main

    file = tmp_path / "c.yaml"
    file.write_text(AXOLOTL + "dp_shard_size: 2\ntensor_parallel_size: 2\nplugins:\n"
                    "  - axolotl.integrations.cut_cross_entropy.CutCrossEntropyPlugin\n")
    assert main(["check", spec.name, "--from-config", str(file), "--gpu", "H100-80GB", "--workers", "1"]) == 0
    assert "vocabulary-parallel over tensor parallel 2" in capsys.readouterr().out
