"""One rank of a multi-GPU job, traced through torch's own DDP and FSDP2 on a fake process group
(backends/distributed.py, estimate/rank.py): the rank's parameter, gradient and optimizer bytes
are the shards the parameter list gives, and FSDP2's gathered layers appear where it gathers them."""

from __future__ import annotations

import collections
import math
from typing import Any

import pytest
from ranktrace import traced

from autotune.backends.estimate.backend import EstimateBackend
from autotune.backends.estimate.traced_step import StepHooks
from autotune.errors import InvalidInput, UnmodelledSetting
from autotune.gpus import resolve_gpu
from autotune.workload import Workload
from autotune.workload.models import resolve_model
from autotune.workload.modes import parse_mode
from autotune.workload.parallel import Parallel, make_parallel

# torch.optim.AdamW(fused=True) keeps each parameter's step count as a float32 tensor on its device.
STEP_BYTES = 4


def shard_bytes(parameters: Any, ranks: int) -> int:
    """Rank 0's bytes of ``parameters`` split over ``ranks`` on dim 0: torch.chunk's first chunk,
    ceil(rows / ranks) rows, which is also FSDP2's padded shard (_fsdp_param.py ``_init_sharded_param``)."""
    return sum(math.ceil(p.shape[0] / ranks) * (p.numel() // p.shape[0]) * p.element_size()
               for p in parameters)


@pytest.mark.parametrize("ranks", [2, 4, 8])
def test_an_fsdp_rank_holds_its_shard_of_parameters_gradients_and_optimizer_state(ranks):
    phases, model = traced(Parallel("fsdp", ranks))
    shard = shard_bytes(model.parameters(), ranks)
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())  # not sharded (rotary inv_freq)
    assert phases.loaded_bytes == shard + buffers
    before = phases.live["before steps"][0]
    assert phases.live["backward done"][0] - before == shard  # the reduce-scattered gradients
    count = len(list(model.parameters()))
    # AdamW's exp_avg and exp_avg_sq over the shard, and the step counts; the gradients still live
    assert phases.live["optimizer done"][0] - before == shard + 2 * shard + count * STEP_BYTES


@pytest.mark.parametrize("ranks", [2, 8])
def test_a_ddp_rank_holds_everything_and_a_bucket_copy_of_the_gradients(ranks):
    phases, model = traced(Parallel("ddp", ranks))
    alone, _ = traced(None)
    full = sum(p.numel() * p.element_size() for p in model.parameters())
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    assert phases.loaded_bytes == full + buffers
    # the Reducer's buckets, allocated as DDP is built, hold every gradient once more
    assert phases.live["before steps"][0] - alone.live["before steps"][0] == full
    assert phases.live["backward done"][0] - phases.live["before steps"][0] == full
    count = len(list(model.parameters()))
    assert phases.live["optimizer done"][0] - phases.live["before steps"][0] == 3 * full + count * STEP_BYTES


def gathered_layer_bytes(model: Any, ranks: int) -> int:
    """One decoder layer's parameters gathered whole: every rank's padded shard."""
    return ranks * shard_bytes(model.model.layers[0].parameters(), ranks)


def test_fsdp_gathers_each_layer_in_forward_and_again_in_backward():
    ranks = 4
    phases, model = traced(Parallel("fsdp", ranks))
    layers, steps = model.config.num_hidden_layers, 2
    gathered = gathered_layer_bytes(model, ranks)
    # per step and layer: its all-gather in forward, again in backward (resharded after forward),
    # and the reduce-scatter input of its gradients: all of the layer's size
    assert phases.allocated_after_start()[gathered] == 3 * layers * steps


def test_fsdp_without_reshard_after_forward_keeps_layers_gathered_for_backward():
    ranks = 4
    kept, model = traced(Parallel("fsdp", ranks, reshard_after_forward=False))
    resharded, _ = traced(Parallel("fsdp", ranks))
    layers, steps = model.config.num_hidden_layers, 2
    gathered = gathered_layer_bytes(model, ranks)
    assert kept.allocated_after_start()[gathered] == 2 * layers * steps  # no all-gather in backward
    assert max(kept.live["backward done"]) == max(resharded.live["backward done"])  # freed by then


def test_a_rank_of_more_gpus_holds_less():
    peaks = []
    for ranks in (2, 4, 8):
        phases, _ = traced(Parallel("fsdp", ranks))
        peaks.append(phases.live["optimizer done"][0])
    assert peaks[0] > peaks[1] > peaks[2]


def test_hybrid_sharding_shards_within_a_node():
    hybrid, model = traced(Parallel("fsdp", 8, nodes=2))
    within, _ = traced(Parallel("fsdp", 4))
    assert hybrid.loaded_bytes == within.loaded_bytes  # 4 GPUs per node: a quarter each
    assert hybrid.live["optimizer done"] == within.live["optimizer done"]


def test_a_16_bit_mode_under_fsdp_keeps_float32_shards_and_gathers_in_16_bits():
    """accelerate's fsdp2_prepare_model: trainable parameters upcast to float32 before sharding, and
    MixedPrecisionPolicy(param_dtype=bfloat16) gathers them in bfloat16 (no autocast)."""
    ranks = 4
    phases, model = traced(Parallel("fsdp", ranks), mode="bf16")
    shard = shard_bytes(model.parameters(), ranks)  # of the bf16 weights
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    assert phases.loaded_bytes == 2 * shard + buffers  # float32 masters
    before = phases.live["before steps"][0]
    assert phases.live["backward done"][0] - before == 2 * shard  # gradients in the shards' float32
    count = len(list(model.parameters()))
    assert phases.live["optimizer done"][0] - before == 2 * shard + 4 * shard + count * STEP_BYTES
    gathered = gathered_layer_bytes(model, ranks)  # bfloat16: the policy's param_dtype
    assert phases.allocated_after_start()[gathered] >= 2 * model.config.num_hidden_layers


def test_gradient_checkpointing_runs_under_fsdp():
    phases, _ = traced(Parallel("fsdp", 4), mode="bf16+ckpt")
    assert phases.live["optimizer done"]


@pytest.mark.parametrize(("given", "error", "text"), [
    ({"gpus": 8, "kind": "zero2", "zero_config": '{"offload_optimizer": {"device": "nvme"}}'},
     UnmodelledSetting, "zero_optimization.offload_optimizer.device: 'nvme'"),
    ({"gpus": 8, "kind": "fsdp3"}, InvalidInput, "allowed are ddp, fsdp, zero1, zero2, zero3"),
    ({"gpus": 0, "kind": None}, InvalidInput, "gpus must be a whole number from 1"),
    ({"gpus": None, "kind": "fsdp"}, InvalidInput, "parallel fsdp needs gpus"),
    ({"gpus": 8, "kind": "fsdp", "nodes": 3}, InvalidInput, "nodes must divide gpus (8)"),
    ({"gpus": 8, "kind": "ddp", "nodes": 2}, InvalidInput, "is for parallel fsdp's hybrid sharding"),
    ({"gpus": 8, "kind": "ddp", "reshard_after_forward": False}, InvalidInput, "an fsdp setting"),
])
def test_a_parallelism_that_is_not_modelled_or_not_valid_is_refused(given, error, text):
    with pytest.raises(error, match=text.replace("(", r"\(").replace(")", r"\)")):
        make_parallel(given.pop("gpus"), given.pop("kind"), **given)


def test_one_gpu_is_the_one_gpu_step_and_more_default_to_ddp():
    assert make_parallel(None, None) is None
    assert make_parallel(1, None) is None
    assert make_parallel(4, None) == Parallel("ddp", 4)
    assert make_parallel(1, "fsdp") == Parallel("fsdp", 1)


class EveryStep(StepHooks):
    every_step = True


@pytest.mark.parametrize("parallel", [Parallel("fsdp", 4), Parallel("ddp", 4)], ids=["fsdp", "ddp"])
def test_a_ranks_steps_written_from_its_first_are_the_steps_run(parallel):
    """The table's traces write the steps after the first from it where the step is steady
    (steps.py); a rank's step under DDP or FSDP2 must come out as running every step does."""
    workload = Workload(resolve_model("tiny-llama"), "causal-lm", None, weights_dtype="bfloat16",
                        parallel=parallel)
    mode = parse_mode("bf16+ckpt")
    backend = EstimateBackend(resolve_gpu("A100-80GB"))
    fake = backend._model(workload, mode.precision)
    traces = []
    with backend.cell(workload, mode, 64, 10**12):
        for hooks in (StepHooks(), StepHooks(), EveryStep()):  # learn, then write; then run every step
            traces.append(backend.trace_with(hooks, fake, workload, mode, 64, 3))
    assert backend._steady[(workload, mode.name)].verified  # the second trace wrote its later steps
    written, run = traces[1].events(), traces[2].events()
    assert [event[1:] for event in written] == [event[1:] for event in run]  # sizes and streams


# -- what explain's recorder sees of a rank (instrument.py, rank.py's regions) ---------------------


def recorded(parallel: Parallel, mode: str = "bf16") -> Any:
    """instrument.Recorder's recording of tiny-llama's rank at batch 2 x 32, every step run."""
    from autotune.backends.estimate.instrument import Recorder, Variant

    workload = Workload(resolve_model("tiny-llama"), "causal-lm", None, weights_dtype="bfloat16",
                        parallel=parallel)
    backend = EstimateBackend(resolve_gpu("A100-80GB"))
    fake = backend._model(workload, parse_mode(mode).precision)
    recorder = Recorder(fake.model, parse_mode(mode), Variant(), 2, 32)
    backend.trace_with(recorder, fake, workload, parse_mode(mode), 32, 2)
    return recorder.recording


@pytest.mark.parametrize("mode", ["fp32", "bf16"])
@pytest.mark.parametrize("parallel", [Parallel("fsdp", 4), Parallel("ddp", 4),
                                      Parallel("fsdp", 4, reshard_after_forward=False)],
                         ids=["fsdp", "ddp", "fsdp-no-reshard"])
def test_the_recording_of_a_rank_has_one_allocation_per_allocation_event(parallel, mode):
    recording = recorded(parallel, mode)
    assert sum(1 for _, nbytes in recording.events if nbytes >= 0) == len(recording.allocations)
    if parallel.kind == "fsdp":
        # In step 2 FSDP2 gathers every parameter into the storage it resized back from 0 bytes
        # (rank.resizes_tracked): each an allocation event, and an allocation, of its own; once
        # in forward, and again in backward but for the tail's (norm, head) kept gathered.
        _, model = traced(None)
        count = len(list(model.parameters()))
        again = count - 2 if parallel.reshard_after_forward else 0
        gathered = [a for a in recording.allocations if a.kind == "gathered_parameters" and a.step == 2]
        assert len(gathered) == count + again


def test_a_ranks_sharded_states_are_marked_by_their_local_shards():
    """mark() of a DTensor marks its local shard's storage: the rank's parameters, gradients and
    optimizer state are the shard sizes, nothing of them left as temporaries."""
    ranks = 4
    recording = recorded(Parallel("fsdp", ranks), mode="fp32")
    _, model = traced(None)
    shard = shard_bytes(model.parameters(), ranks)
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())

    def total(kind: str, step: int | None = None) -> int:
        return sum(a.nbytes for a in recording.allocations if a.kind == kind and step in (None, a.step))

    assert total("parameters") == shard + buffers
    assert total("gradients", 1) == total("gradients", 2) == shard
    count = len(list(model.parameters()))
    assert total("optimizer_state") == 2 * shard + count * STEP_BYTES


def test_fsdp_regions_name_gathered_layers_and_their_buffers():
    """Per layer and step: the flat all-gather output (communication buffers) and the parameters'
    unsharded storages (gathered parameters) in forward and again in backward, and the
    reduce-scatter input (communication buffers): each of the layer's size."""
    ranks = 4
    recording = recorded(Parallel("fsdp", ranks), mode="fp32")
    _, model = traced(None)
    layer = gathered_layer_bytes(model, ranks)
    step_1 = [a for a in recording.allocations if a.step == 1]
    buffers = collections.Counter((a.phase, a.nbytes) for a in step_1 if a.kind == "communication_buffers")
    layers = model.config.num_hidden_layers
    assert buffers[("forward", layer)] == layers  # the all-gather output
    assert buffers[("backward", layer)] == 2 * layers  # the all-gather output, the reduce-scatter input
    gathered: dict[str, int] = collections.defaultdict(int)
    for a in step_1:
        if a.kind == "gathered_parameters":
            gathered[a.phase] += a.nbytes
    full = sum(p.numel() * p.element_size() for p in model.parameters())  # none padded over 4 ranks
    tail = sum(p.numel() * p.element_size() for p in (*model.model.norm.parameters(), model.lm_head.weight))
    assert gathered["forward"] == full  # every parameter, once
    assert gathered["backward"] == full - tail  # again, but for the tail's, kept gathered
    assert not any(a.kind == "activations" and a.region is not None for a in recording.allocations)


def test_fsdp_makes_its_all_gather_and_reduce_scatter_buffers_on_streams_of_its_own():
    """FSDP2's collectives' buffers are allocated on its side streams (rank.py, tracker.py
    ``side_streams``): the all-gather copy-in and output on all_gather_copy_in_stream (1, the first
    seen), the reduce-scatter output and the sharded gradients cast from it on reduce_scatter_stream
    (2); the reduce-scatter input and the gathered parameters on the default stream (0)."""
    from autotune.backends.estimate.trace import OnStream, Trace

    recording = recorded(Parallel("fsdp", 2), mode="bf16")
    trace = Trace.from_events(recording.batch_size, recording.events, recording.workspaces)
    streams = {index: workspace.stream for index, workspace in trace.workspaces
               if isinstance(workspace, OnStream)}
    found = collections.Counter((a.kind, a.region, streams.get(index, 0))
                                for index, a in enumerate(recording.allocations) if a.step == 2)
    on_side_streams = {key: count for key, count in found.items() if key[2]}
    groups = collections.Counter(a.kind for a in recording.allocations
                                 if a.step == 2 and a.region == "fsdp reduce-scatter")
    reduced = groups["communication_buffers"] // 2  # per group reduced: an input and an output
    unshards = found[("communication_buffers", "fsdp all-gather", 1)] // 2  # a copy-in and an output
    assert unshards > reduced > 0
    assert on_side_streams == {("communication_buffers", "fsdp all-gather", 1): 2 * unshards,
                               ("communication_buffers", "fsdp reduce-scatter", 2): reduced,
                               ("gradients", None, 2): found[("gradients", None, 2)]}
    assert found[("communication_buffers", "fsdp reduce-scatter", 0)] == reduced
    assert found[("gradients", None, 2)] >= reduced  # float32 shards: a cast of each group's output
    # DDP's tracker notes no stream (only FSDP2's is told to): every allocation is the default stream's.
    assert not any(isinstance(w, OnStream) for w in recorded(Parallel("ddp", 2)).workspaces.values())


def test_ddp_s_buckets_are_communication_buffers_of_the_gradients_size():
    recording = recorded(Parallel("ddp", 4))
    _, model = traced(None)
    full = sum(p.numel() * p.element_size() for p in model.parameters())
    buckets = [a for a in recording.allocations if a.kind == "communication_buffers"]
    assert [(a.phase, a.nbytes) for a in buckets] == [("setup", full)]


# FSDP2's CPU offload (CPUOffloadPolicy, backends/distributed.py ``offload_policy``; estimate/rank.py
# ``host_offload``): the rank's shards, their gradients and the Adam state on the host ledger.
@pytest.mark.parametrize("mode", ["fp32", "bf16"])
def test_offloaded_shards_gradients_and_adam_state_are_host_memory(mode):
    ranks = 4
    on_gpu, model = traced(Parallel("fsdp", ranks), mode)
    offloaded, _ = traced(Parallel("fsdp", ranks, offload_params=True), mode)
    # a 16-bit mode upcasts the trainable parameters to float32 before sharding (distributed.shard)
    scale = 2 if mode == "bf16" else 1
    shard = scale * shard_bytes(model.parameters(), ranks)
    count = len(list(model.parameters()))
    before = offloaded.live["before steps"][0]
    assert on_gpu.live["before steps"][0] - before == shard  # the shards went to the host
    assert offloaded.live["backward done"] == [before, before]  # their gradients too
    assert offloaded.live["optimizer done"] == [before, before]  # and the Adam state
    # the host's peak: shards, gradients, exp_avg and exp_avg_sq, AdamW's step counts
    assert offloaded.tracker.host_peak_bytes == 4 * shard + count * STEP_BYTES


def test_each_offloaded_shard_is_copied_to_the_gpu_for_each_all_gather():
    ranks = 4
    offloaded, model = traced(Parallel("fsdp", ranks, offload_params=True))
    on_gpu, _ = traced(Parallel("fsdp", ranks))
    copies = offloaded.allocated_in_first_forward_and_backward()
    copies.subtract(on_gpu.allocated_in_first_forward_and_backward())
    # gathered in forward and again in backward, but the tail (final norm, head) kept from one to the other
    tail = {id(model.model.norm.weight), id(model.lm_head.weight)}
    expected = collections.Counter()
    for parameter in model.parameters():
        expected[shard_bytes([parameter], ranks)] += 1 if id(parameter) in tail else 2
    assert +copies == expected
