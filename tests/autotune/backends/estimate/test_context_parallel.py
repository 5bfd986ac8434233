"""Context parallelism under FSDP2 (workload/ring_attention.py): each rank traces its 1/cp of the
sequence, its attention ring-flash-attn's llama3 varlen ring, emulated: the all-gathered K/V buffers of
the whole sequence per heads_k_stride head, a third for dK/dV in backward."""

from __future__ import annotations

import json
from typing import Any

import pytest
from ranktrace import Phases

from autotune.backends.estimate.backend import EstimateBackend
from autotune.backends.estimate.steps import SteadySteps
from autotune.errors import InvalidInput, JobFails
from autotune.gpus import resolve_gpu
from autotune.tuner import search_cell
from autotune.workload import Workload
from autotune.workload.models import resolve_model
from autotune.workload.modes import parse_mode
from autotune.workload.parallel import Parallel, make_parallel
from autotune.workload.presets.tiny import TINY_CONFIGS
from autotune.workload.ring_attention import local_seq_len

# tiny-llama: 4 query heads over 2 key heads of 8 dims (grouped), a vocabulary of 128 (float32 logits
# of L x 128 x 4 bytes, the largest activation)
CONFIG = {**TINY_CONFIGS["llama"], "model_type": "llama", "num_attention_heads": 4, "num_key_value_heads": 2,
          "head_dim": 8, "intermediate_size": 192, "tie_word_embeddings": False}
SEQ, BF16 = 512, 2
# for the buffers' count: 2 key heads of 40 dims, whose gathered [2, S, 1, 40] no other tensor's size is
GATHER_CONFIG = {**CONFIG, "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 40}
HEAD_DIM = GATHER_CONFIG["head_dim"]


def _spec(folder: Any, config: dict[str, Any]) -> Any:
    (folder / "config.json").write_text(json.dumps(config))
    return resolve_model(str(folder))


@pytest.fixture(scope="module")
def spec(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return _spec(tmp_path_factory.mktemp("cp-llama"), CONFIG)


@pytest.fixture(scope="module")
def gather_spec(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return _spec(tmp_path_factory.mktemp("cp-llama-40"), GATHER_CONFIG)


def workload_of(spec: Any, cp: int, stride: int = 1) -> Workload:
    return Workload(spec, "causal-lm", "flash_attention_2", weights_dtype="bfloat16",
                    parallel=Parallel("fsdp", 4, cp=cp, heads_k_stride=stride))


def traced(spec: Any, cp: int, batch: int = 1, stride: int = 1) -> tuple[Phases, EstimateBackend]:
    workload = workload_of(spec, cp, stride)
    backend = EstimateBackend(resolve_gpu("A100-80GB"))
    backend._steady[(workload, "bf16")] = SteadySteps(verified=False)
    phases = Phases()
    backend.trace_with(phases, backend._model(workload, "bf16"), workload, parse_mode("bf16"), SEQ, batch)
    return phases, backend


def sizes(phases: Phases) -> list[int]:
    return [nbytes for _, nbytes in phases.tracker.events if nbytes > 0]


@pytest.mark.parametrize("cp", [2, 4])
def test_a_cp_rank_traces_its_slice_of_the_sequence(spec, cp):
    whole, _ = traced(spec, 1)
    ranked, _ = traced(spec, cp)
    logits = SEQ * CONFIG["vocab_size"] * 4  # float32 logits of the whole sequence
    assert logits in sizes(whole)
    assert logits // cp in sizes(ranked) and logits not in sizes(ranked)


@pytest.mark.parametrize("cp", [2, 4])
def test_the_gathered_kv_buffers_span_the_whole_sequence(gather_spec, cp):
    phases, backend = traced(gather_spec, cp)
    # llama3_flash_attn_varlen.py: kv_buffer [2, total_k x world, heads_k_stride, D] in k's dtype
    gathered = 2 * SEQ * 1 * HEAD_DIM * BF16
    layers, heads_k, steps = CONFIG["num_hidden_layers"], CONFIG["num_key_value_heads"], 2
    # forward: kv_buffer and its copy; backward: those and dkv_buffer; per layer, per step
    assert sizes(phases).count(gathered) == steps * layers * (2 + 3)
    assert heads_k > 1  # backward's kv_contiguous_buffer [2, L, 1, D] as well (stride 1 < 2 key heads)
    assert 2 * (SEQ // cp) * HEAD_DIM * BF16 in sizes(phases)
    assert {"ring-flash-attn"} == set().union(*backend._attention.values())


def test_a_larger_heads_k_stride_gathers_more_key_heads_at_once(gather_spec):
    phases, _ = traced(gather_spec, 2, stride=2)
    one, both = (2 * SEQ * stride * HEAD_DIM * BF16 for stride in (1, 2))
    layers, steps = CONFIG["num_hidden_layers"], 2
    assert sizes(phases).count(both) == steps * layers * (2 + 3)
    assert one not in sizes(phases)


def test_a_heads_k_stride_that_does_not_divide_the_key_heads_fails_as_ring_flash_attn_asserts(gather_spec):
    with pytest.raises(JobFails, match="nheads_k % heads_k_stride == 0"):
        traced(gather_spec, 2, stride=3)


def test_heads_k_stride_is_context_parallel_s():
    with pytest.raises(InvalidInput, match="heads_k_stride.*context_parallel") as raised:
        make_parallel(4, "fsdp", heads_k_stride=2)
    assert raised.value.field == "heads_k_stride"


def test_a_micro_batch_above_1_fails_as_the_ring_forward_asserts(spec):
    with pytest.raises(JobFails, match="varlen data should be processed in advance"):
        traced(spec, 2, batch=2)


def test_the_search_stops_at_the_one_row_the_ring_runs(spec):
    backend = EstimateBackend(resolve_gpu("A100-80GB"))
    result = search_cell(backend, workload_of(spec, 2), parse_mode("bf16"), SEQ, 40 * 2**30)
    assert (result.max_batch_size, result.capped, [p.batch_size for p in result.probes]) == (1, False, [1])


def test_the_local_sequence_is_padded_to_a_multiple_of_min_cp_64():
    # sequence_parallel.py apply_sequence_parallelism: divisor min(world, 64), then chunk over world
    assert (local_seq_len(8192, 2), local_seq_len(1001, 4), local_seq_len(1000, 128)) == (4096, 251, 8)


def test_context_parallel_says_ring_flash_attn_emulated():
    parallel = make_parallel(8, "fsdp", context_parallel=2, tensor_parallel=2)
    assert parallel is not None and (parallel.cp, parallel.shard_size) == (2, 4)
    assert "context parallel 2: ring-flash-attn emulated" in parallel.modelled


@pytest.mark.parametrize(("kind", "extra"), [("ddp", {}), ("zero3", {}), ("fsdp", {"fsdp_version": 1})])
def test_context_parallel_outside_fsdp2_is_refused_by_name(kind, extra):
    with pytest.raises(InvalidInput, match="context_parallel.* is not modelled") as raised:
        make_parallel(4, kind, context_parallel=2, **extra)
    assert raised.value.field == "context_parallel"


def test_context_parallel_must_divide_the_gpus():
    with pytest.raises(InvalidInput, match="must divide"):
        make_parallel(6, "fsdp", context_parallel=4)


@pytest.mark.parametrize(("tp", "cp"), [(1, 2), (2, 1), (2, 2)])
def test_replicas_of_tp_x_cp_alone_fail_as_accelerate_says(tp, cp):
    # nodes replicate, each node's GPUs all tensor/context parallel: dp_shard_size 1
    with pytest.raises(JobFails, match="cannot be used with pure data parallelism") as raised:
        make_parallel(2 * tp * cp, "fsdp", nodes=2, tensor_parallel=tp, context_parallel=cp)
    assert raised.value.field == "nodes"
