"""The table tuner on the estimator with tiny models, and budget arithmetic."""

from __future__ import annotations

import pytest

from autotune.backends.estimate.backend import EstimateBackend
from autotune.errors import InvalidInput, SequenceTooLong
from autotune.gpus import custom_gpu, resolve_gpu, with_context_overhead
from autotune.tuner import budget_bytes, tune_table
from autotune.workload import Workload
from autotune.workload.models import resolve_model
from autotune.workload.modes import parse_modes

MIB = 1024**2


def test_budget_is_card_minus_context_times_one_minus_margin():
    gpu = custom_gpu(12 * 1024 * MIB)
    expected = int((12 * 1024 * MIB - gpu.context_overhead_bytes) * 0.95)
    assert budget_bytes(gpu, 0.05) == expected
    with pytest.raises(InvalidInput, match=r"margin 1.5 is out of range"):
        budget_bytes(gpu, 1.5)


def _small_gpu(usable_mib: int):
    """A 1 GiB card of which only ``usable_mib`` is left to PyTorch."""
    return with_context_overhead(custom_gpu(1024 * MIB), (1024 - usable_mib) * MIB)


def _small_table(method: str, modes: str = "fp32,amp+ckpt"):
    # Two cuBLAS workspaces take 66 MiB; the rest holds a few dozen samples of tiny-bert at these lengths.
    gpu = _small_gpu(160)
    workload = Workload(resolve_model("tiny-bert"), "masked-lm", None)
    return tune_table(workload, EstimateBackend(gpu), gpu, seq_lens=(32, 64, 128),
                      modes=parse_modes(modes), method=method, max_batch=4096)


def test_tiny_table_is_proved_cell_by_cell_and_monotone_in_sequence_length():
    table = _small_table("guided")
    assert table.backend == "estimate" and len(table.cells) == 6
    for mode in ("fp32", "amp+ckpt"):
        maxes = [table.cell(mode, s).max_batch_size for s in (32, 64, 128)]
        assert maxes == sorted(maxes, reverse=True) and maxes[-1] > 0
    for cell in table.cells:
        outcomes = {p["batch_size"]: p["outcome"] for p in cell.probe_log}
        assert outcomes[cell.max_batch_size] == "fits"
        assert cell.peak_memory_bytes <= table.budget_bytes
        # b + 1 was probed here, or was proved out of memory at a shorter sequence.
        if cell.max_batch_size + 1 in outcomes:
            assert outcomes[cell.max_batch_size + 1] == "oom"
        else:
            shorter = [c for c in table.cells if c.mode == cell.mode and c.seq_len < cell.seq_len]
            assert shorter and shorter[-1].max_batch_size == cell.max_batch_size
    # amp+ckpt fits more than fp32 at the longest sequence.
    assert table.cell("amp+ckpt", 128).max_batch_size > table.cell("fp32", 128).max_batch_size


def test_guided_and_bisect_agree_and_guided_probes_less():
    guided, bisect = _small_table("guided", "fp32"), _small_table("bisect", "fp32")
    assert [c.max_batch_size for c in guided.cells] == [c.max_batch_size for c in bisect.cells]
    assert guided.total_probes < bisect.total_probes


def test_sequence_beyond_the_model_limit_is_refused_before_probing():
    gpu = resolve_gpu("T4")
    workload = Workload(resolve_model("bert-base-uncased"), "sequence-classification", None)
    with pytest.raises(SequenceTooLong, match="sequence length 1024 exceeds max_position_embeddings=512"):
        tune_table(workload, EstimateBackend(gpu), gpu, seq_lens=(128, 1024), modes=parse_modes("fp32"))


def test_a_mode_the_model_cannot_run_fails_only_its_cells():
    gpu = _small_gpu(160)
    workload = Workload(resolve_model("tiny-albert"), "masked-lm", None)
    table = tune_table(workload, EstimateBackend(gpu), gpu, seq_lens=(32,), modes=parse_modes("fp32,ckpt"))
    assert table.cell("fp32", 32).max_batch_size > 0
    assert "does not support gradient checkpointing" in table.cell("ckpt", 32).error


def test_a_resumed_run_keeps_finished_cells_and_probes_only_the_rest():
    first = _small_table("guided", "fp32")
    kept = {("fp32", 32): first.cell("fp32", 32)}
    gpu = _small_gpu(160)
    workload = Workload(resolve_model("tiny-bert"), "masked-lm", None)
    seen = []
    resumed = tune_table(workload, EstimateBackend(gpu), gpu, seq_lens=(32, 64, 128),
                         modes=parse_modes("fp32"), completed=kept,
                         on_cell=lambda cell, done, total: seen.append(cell.seq_len))
    assert resumed.cell("fp32", 32) is kept[("fp32", 32)]
    assert [c.max_batch_size for c in resumed.cells] == [c.max_batch_size for c in first.cells]
    assert seen == [32, 64, 128]


def test_a_stopped_run_returns_the_cells_finished_so_far():
    gpu = _small_gpu(160)
    workload = Workload(resolve_model("tiny-bert"), "masked-lm", None)
    stops = iter([False, True])
    table = tune_table(workload, EstimateBackend(gpu), gpu, seq_lens=(32, 64),
                       modes=parse_modes("fp32"), should_stop=lambda: next(stops))
    assert [c.seq_len for c in table.cells] == [32]
