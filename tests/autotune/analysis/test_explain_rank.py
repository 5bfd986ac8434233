"""autotune explain of one rank of a multi-GPU job (workload.parallel): the rank's shards, the
parameters FSDP2 gathers, the communication buffers, NCCL's buffers off the budget, and only the
levers the estimator models for the job. tiny-llama over bfloat16 weights, 4 GPUs, batch 2 x 64."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from autotune.analysis.explain import category_labels, explain
from autotune.analysis.levers import explained_levers
from autotune.backends.estimate.backend import EstimateBackend
from autotune.backends.estimate.instrument import InstrumentedBackend
from autotune.backends.estimate.trace import Trace
from autotune.gpus import custom_gpu
from autotune.tuner import budget_bytes
from autotune.workload import Workload
from autotune.workload.models import resolve_model
from autotune.workload.modes import parse_mode
from autotune.workload.parallel import Parallel, nccl_bytes
from autotune.workload.step import build_model

GIB = 1024**3
RANKS = 4
FSDP, DDP = Parallel("fsdp", RANKS), Parallel("ddp", RANKS)
# The caching allocator rounds an allocation under 1 MiB up to a multiple of 512 bytes
# (CUDACachingAllocator.cpp kMinBlockSize; allocator.py): the breakdown counts blocks.
BLOCK = 512
STEP_BYTES = 4  # fused AdamW's float32 step count per parameter


def tiny_llama(parallel: Parallel | None) -> Workload:
    return Workload(resolve_model("tiny-llama"), "causal-lm", None, weights_dtype="bfloat16",
                    parallel=parallel)


@pytest.fixture(scope="module")
def four_gib():
    gpu = custom_gpu(4 * GIB)
    return gpu, EstimateBackend(gpu)


@pytest.fixture(scope="module")
def model() -> Any:
    """tiny-llama as built, on the meta device: its whole parameters, in bfloat16."""
    with torch.device("meta"):
        built, _ = build_model(resolve_model("tiny-llama"), "causal-lm", None, "bfloat16")
    return built


def blocks(sizes: list[int]) -> int:
    return sum(math.ceil(n / BLOCK) * BLOCK for n in sizes)


def shard(p: Any, ranks: int = RANKS) -> int:
    """Rank 0's bytes of ``p`` (rows split on dim 0: FSDP2's padded shard), in its built dtype."""
    return math.ceil(p.shape[0] / ranks) * (p.numel() // p.shape[0]) * p.element_size()


def whole(p: Any) -> int:
    return p.numel() * p.element_size()


@pytest.mark.parametrize("mode", ["fp32", "bf16"])
@pytest.mark.parametrize("parallel", [FSDP, DDP], ids=["fsdp", "ddp"])
def test_the_instrumented_step_of_a_rank_allocates_what_the_table_step_does(four_gib, parallel, mode):
    """rank.py's regions and the recorder change no event: the table's trace, allocation for allocation."""
    gpu, backend = four_gib
    workload, mode = tiny_llama(parallel), parse_mode(mode)
    with backend.cell(workload, mode, 64, GIB):
        expected = backend.trace(backend._model(workload, mode.precision), workload, mode, 64, 2)
    instrumented = InstrumentedBackend(backend)
    with instrumented.cell(workload, mode, 64, GIB) as cell:
        cell.fits(2)
    recording = instrumented.last
    assert Trace.from_events(2, recording.events, recording.workspaces) == expected
    assert sum(1 for _, nbytes in recording.events if nbytes >= 0) == len(recording.allocations)


def rank_explanation(backend_gpu: Any, parallel: Parallel, mode: str = "bf16") -> Any:
    gpu, backend = backend_gpu
    return explain(tiny_llama(parallel), backend, gpu, seq_len=64, mode=parse_mode(mode), margin=0.05,
                   batch_size=2, with_levers=False)


def test_an_fsdp_rank_holds_its_shards_and_the_tail_kept_gathered(four_gib, model):
    gpu, backend = four_gib
    e = rank_explanation(four_gib, FSDP)
    b = e.breakdown
    params = list(model.parameters())
    buffers = [whole(t) for t in model.buffers()]
    # bf16 under FSDP2: float32 master shards (twice the bfloat16 shard), AdamW's two states of them
    assert b.categories["parameters"] == blocks([2 * shard(p) for p in params] + buffers)
    assert b.categories["optimizer_state"] == blocks([2 * shard(p) for p in params for _ in range(2)]
                                                     + [STEP_BYTES] * len(params))
    # The peak is in the loss's backward: each layer and the embedding were resharded after their
    # forward, the tail (final norm and head) stays gathered to its backward, in bfloat16. The
    # gradients (the rank's shards: tests/.../test_distributed.py) come later.
    assert b.categories["gathered_parameters"] == blocks([whole(model.model.norm.weight),
                                                          whole(model.lm_head.weight)])
    assert b.peak_phase == "backward" and b.categories["gradients"] == 0
    assert list(b.categories)[:5] == ["parameters", "gradients", "optimizer_state", "gathered_parameters",
                                      "communication_buffers"]
    assert sum(b.categories.values()) == b.peak_allocated_bytes
    with backend.cell(tiny_llama(FSDP), parse_mode("bf16"), 64, e.budget_bytes) as cell:
        probe = cell.fits(2)
    assert b.peak_allocated_bytes == probe.details["peak_allocated_bytes"]
    # one GPU's budget, NCCL's buffers off its card
    assert e.budget_bytes == budget_bytes(gpu, 0.05, FSDP) < budget_bytes(gpu, 0.05)
    assert e.parallel is not None and e.parallel["shard_size"] == RANKS
    assert e.parallel["nccl_bytes"] == nccl_bytes(FSDP, gpu.compute_capability) > 0
    # the modules' table: whole modules (float32 masters), of which the rank holds a quarter
    head = next(row for row in e.top_parameters if row.name == "lm_head")
    assert head.param_bytes == 2 * whole(model.lm_head.weight)


def test_without_reshard_after_forward_every_layer_stays_gathered_at_the_peak(four_gib, model):
    e = rank_explanation(four_gib, Parallel("fsdp", RANKS, reshard_after_forward=False))
    b = e.breakdown
    assert b.categories["gathered_parameters"] == blocks([whole(p) for p in model.parameters()])
    assert sum(b.categories.values()) == b.peak_allocated_bytes


def test_a_ddp_rank_holds_everything_and_buckets_of_the_gradients_size(four_gib, model):
    e = rank_explanation(four_gib, DDP)
    b = e.breakdown
    params = list(model.parameters())
    buffers = [whole(t) for t in model.buffers()]
    assert b.categories["parameters"] == blocks([whole(p) for p in params] + buffers)
    assert b.categories["optimizer_state"] == blocks([whole(p) for p in params for _ in range(2)]
                                                     + [STEP_BYTES] * len(params))
    # one flat bucket of every gradient, built with DDP before the steps
    assert b.categories["communication_buffers"] == blocks([sum(whole(p) for p in params)])
    assert "gathered_parameters" not in b.categories
    assert sum(b.categories.values()) == b.peak_allocated_bytes


def test_a_rank_s_categories_are_labelled_with_its_shards():
    fsdp = category_labels(None, FSDP.to_json())
    assert fsdp["parameters"] == "parameters (1/4 shard) and buffers"
    assert fsdp["gradients"] == "gradients (1/4 shard)"
    assert fsdp["gathered_parameters"] == "gathered parameters (FSDP2 all-gathers)"
    assert fsdp["communication_buffers"] == "communication buffers (all-gather, reduce-scatter)"
    lora = category_labels({"method": "lora"}, FSDP.to_json())
    assert lora["frozen_base"] == "frozen base (weights and buffers; 1/4 shard)"
    ddp = category_labels(None, DDP.to_json())
    assert ddp["parameters"] == "parameters and buffers" and "gathered_parameters" not in ddp
    assert ddp["communication_buffers"] == "communication buffers (DDP gradient buckets)"
    assert "communication_buffers" not in category_labels(None)


def test_fsdp_is_offered_no_lever_the_estimator_refuses_under_it(four_gib):
    """bitsandbytes' 8-bit AdamW (its Variant levers too) and a 4-bit base are refused under fsdp
    (parallel.check_sharded); under ddp they are modelled."""
    _, backend = four_gib
    bf16 = parse_mode("bf16")
    fsdp = {lever.name for lever in explained_levers(tiny_llama(FSDP), backend, seq_len=64, mode=bf16)}
    ddp = {lever.name for lever in explained_levers(tiny_llama(DDP), backend, seq_len=64, mode=bf16)}
    refused = {"adamw-8bit", "adamw-8bit-trainer", "qlora"}
    assert refused <= ddp and not refused & fsdp
    assert {"sgd", "lora", "frozen-embeddings"} <= fsdp


@pytest.mark.parametrize("stage", ["zero2", "zero3"])
def test_a_zero_rank_is_explained_and_says_its_buffers_are_not_told_apart(stage, capsys):
    # (explain raised KeyError 'zero2': a rank's categories knew ddp and fsdp only)
    from autotune.cli import main

    pytest.importorskip("deepspeed")
    args = ["explain", "tiny-llama", "--gpus", str(RANKS), "--parallel", stage, "--seq-len", "64",
            "--batch-size", "2", "--gpu-memory", "4GiB", "--no-levers", "--backend", "estimate"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "job: DeepSpeed ZeRO-" in out and "ZeRO's own buffers" in out and "not told apart yet" in out
    assert "= peak allocated" in out
