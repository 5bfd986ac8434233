"""The estimator-seeded measured search (autotune/backends/seeded.py), on fake GPUs whose memory
differs from the estimator's (autotune/testing.py): the same answers as bisect, fewer GPU probes."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
import transformers

from autotune.backends.estimate.backend import EstimateBackend
from autotune.backends.estimate.reduce import Multiprocessors
from autotune.backends.seeded import EstimateSeeded, GpuLimit, Seed, SeededCell, first_claim
from autotune.errors import ProbeError
from autotune.gpus import custom_gpu, gpu_from_device_properties
from autotune.search import Probe, ProbeOnlyCell, search_max_batch
from autotune.testing import ScaledGpu
from autotune.tuner import TableResult, tune_table
from autotune.units import GIB, MIB
from autotune.workload import Workload
from autotune.workload.models import ModelSpec
from autotune.workload.modes import Mode, parse_modes

GPU = custom_gpu(1024 * MIB)
SEQ_LENS = [128, 256, 512]


def small_workload() -> Workload:
    # Wide enough that a sample's activations (megabytes) dwarf the allocator's 2 MiB rounding, as in
    # the models people train: in a 64-wide model the 20 MiB segments make the memory a staircase.
    config = transformers.BertConfig(vocab_size=1024, hidden_size=256, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=1024,
                                     max_position_embeddings=512)
    return Workload(model=ModelSpec("small-bert", "preset", config, 512), task="sequence-classification",
                    attn=None)


@pytest.fixture(scope="module")
def curve() -> EstimateBackend:
    return EstimateBackend(GPU)  # the fake GPUs' memory, shared: its fake model is built once


@pytest.fixture(scope="module")
def estimator() -> EstimateBackend:
    return EstimateBackend(GPU)


def tune(backend: Any, method: str = "guided", modes: str = "fp32,amp") -> TableResult:
    return tune_table(small_workload(), backend, GPU, seq_lens=SEQ_LENS, modes=parse_modes(modes),
                      method=method)


def answers(table: TableResult) -> list[int | None]:
    return [cell.max_batch_size for cell in table.cells]


def test_a_right_estimate_costs_two_gpu_probes_per_cell(
    curve: EstimateBackend, estimator: EstimateBackend,
) -> None:
    gpu = ScaledGpu(curve)  # exactly the estimator's memory, its allocator steps and all
    table = tune(EstimateSeeded(gpu, estimator), modes="fp32,amp")
    assert gpu.probes == 2 * len(table.cells)
    for cell in table.cells:
        assert cell.estimated_max_batch_size == cell.max_batch_size
        first, second = cell.probe_log
        assert (first["batch_size"], first["outcome"]) == (cell.max_batch_size, "fits")
        assert (second["batch_size"], second["outcome"]) == (cell.max_batch_size + 1, "oom")
        assert first["estimated_max_batch_size"] == cell.max_batch_size
    assert table.environment["seeded_by"] == "estimate"


@pytest.mark.slow
@pytest.mark.parametrize("scale", [0.9, 1.1])
def test_a_gpu_ten_percent_off_gets_the_answers_of_bisect_in_fewer_probes(
    curve: EstimateBackend, estimator: EstimateBackend, scale: float,
) -> None:
    probes = {}
    tables = {}
    for how in ("bisect", "guided", "seeded"):
        gpu = ScaledGpu(curve, scale=scale, smooth=True)
        backend = EstimateSeeded(gpu, estimator) if how == "seeded" else gpu
        tables[how] = tune(backend, "bisect" if how == "bisect" else "guided", modes="amp")
        probes[how] = gpu.probes
    assert answers(tables["seeded"]) == answers(tables["bisect"]) == answers(tables["guided"])
    seeded = tables["seeded"]
    # Each estimate is ~10 % off: the first cell of a mode corrects it from the GPU's peaks, the
    # later ones start from the estimate scaled by how far the one before was.
    firsts = [cell for cell in seeded.cells if cell.seq_len == SEQ_LENS[0]]
    assert all(cell.estimated_max_batch_size != cell.max_batch_size for cell in firsts)
    assert probes["seeded"] < probes["guided"] < probes["bisect"]
    assert probes["seeded"] <= 4 * len(seeded.cells)
    # The later cells claim from the GPU's limit the first cell bounded: the answer or one above it, two
    # probes; or the estimator's max where it is one above the limit's claim (seeded.first_claim: its
    # own allocator steps), two above the answer at most, four probes.
    later = [cell for cell in seeded.cells if cell.seq_len != SEQ_LENS[0]]
    for cell in later:
        claim = cell.probe_log[0]["seeded_claim"]
        above = claim - cell.max_batch_size
        assert above in (0, 1) or (above == 2 and claim == cell.estimated_max_batch_size)
        assert cell.probes <= (2 if above <= 1 else 4)
    assert any(cell.probe_log[0]["seeded_claim"] != cell.estimated_max_batch_size for cell in later)


def test_a_constant_offset_is_corrected_too(curve: EstimateBackend, estimator: EstimateBackend) -> None:
    # A CUDA context or workspace the estimator missed: every peak 24 MiB higher.
    bisect = tune(ScaledGpu(curve, offset_bytes=24 * MIB, smooth=True), "bisect", modes="fp32")
    gpu = ScaledGpu(curve, offset_bytes=24 * MIB, smooth=True)
    seeded = tune(EstimateSeeded(gpu, estimator), modes="fp32")
    assert answers(seeded) == answers(bisect)
    assert gpu.probes <= 4 * len(seeded.cells)
    later = seeded.cells[1:]
    assert sum(cell.probes for cell in later) <= 2 * len(later) + 1


class Unmodelled:
    """An estimator that cannot model the step (an operation it does not emulate)."""

    name = "estimate"
    gpu = GPU

    @contextlib.contextmanager
    def cell(self, workload: Workload, mode: Mode, seq_len: int, budget_bytes: int) -> Iterator[Any]:
        raise ProbeError("aten::frobnicate has no fake-tensor kernel")
        yield


def test_a_step_the_estimator_cannot_model_is_searched_unseeded_and_says_why(curve: EstimateBackend) -> None:
    plain = tune(ScaledGpu(curve, scale=1.1, smooth=True), modes="fp32")
    seeded = tune(EstimateSeeded(ScaledGpu(curve, scale=1.1, smooth=True), Unmodelled()), modes="fp32")  # type: ignore[arg-type]
    assert answers(seeded) == answers(plain)
    assert [c.probes for c in seeded.cells] == [c.probes for c in plain.cells]
    for cell in seeded.cells:
        assert cell.estimated_max_batch_size is None
        assert "frobnicate" in cell.probe_log[0]["estimate_error"]


def line_gpu(intercept: int, slope: int, budget: int) -> ProbeOnlyCell:
    def probe(batch: int) -> Probe:
        peak = intercept + slope * batch
        return Probe(batch, "fits", peak_bytes=peak) if peak <= budget else Probe(batch, "oom")

    return ProbeOnlyCell(probe)


@pytest.mark.parametrize(("seed", "slope", "expected"), [
    (100, 10 * MIB, [100, 101]),  # right: two probes
    (90, 10 * MIB, [90, 100, 101]),  # low: the estimator's slope through the measured peak
    (90, 11 * MIB, [90, 99, 100, 101]),  # low, and the slope 10 % off: then the two peaks' line
    (110, 10 * MIB, [110, 109]),  # high: real CUDA OOMs say no peak; then a sixteenth down
])
def test_the_claims_of_a_seeded_cell(seed: int, slope: int, expected: list[int]) -> None:
    budget = 2000 * MIB
    gpu = line_gpu(1000 * MIB, 10 * MIB, budget)  # max batch 100
    cell = SeededCell(gpu, Seed(seed, budget - slope // 2, float(slope), claim=seed), budget)
    result = search_max_batch(cell.fits, budget_bytes=budget, predict=cell.predict, settle=cell.settle)
    assert result.max_batch_size == 100 or expected[-1] != 101
    assert [p.batch_size for p in result.probes][:len(expected)] == expected
    assert result.probes[0].details["estimated_max_batch_size"] == seed


# --- the GPU's limit in the estimator's bytes ---------------------------------------------------------


def seed(max_batch: int, slope: int = 10 * MIB, peak: int = 1900 * MIB) -> Seed:
    return Seed(max_batch, peak, float(slope), claim=max_batch)


def test_a_measured_cell_bounds_the_limit_between_its_max_and_the_next_batch() -> None:
    limit = GpuLimit.of(seed(100), 90)  # the line at 90 and at 91
    assert limit == GpuLimit(1800 * MIB, 1810 * MIB)
    assert GpuLimit.of(seed(100), 0) == GpuLimit(-math.inf, 910 * MIB)  # batch 1 ran out
    assert GpuLimit.of(Seed(100, 1900 * MIB, None), 90) is None  # no line: nothing read
    assert limit.scale(1800 * MIB) == pytest.approx(1800 / 1805)
    assert GpuLimit.of(seed(100), 0).scale(1800 * MIB) is None  # type: ignore[union-attr]


def test_bounds_intersect_and_a_contradiction_keeps_the_newer_cell() -> None:
    old = GpuLimit(1800 * MIB, 1810 * MIB)
    assert old.narrowed(GpuLimit(1805 * MIB, 1820 * MIB)) == GpuLimit(1805 * MIB, 1810 * MIB)
    assert old.narrowed(GpuLimit(1790 * MIB, 1808 * MIB)) == GpuLimit(1800 * MIB, 1808 * MIB)
    newer = GpuLimit(1700 * MIB, 1710 * MIB)
    assert old.narrowed(newer) == newer


@pytest.mark.parametrize(("limit", "expected"), [
    (None, 100),  # a workload's first cell: the estimator's max
    (GpuLimit(1795 * MIB, 1805 * MIB), 90),  # the largest batch whose line is below 1805 MiB
    (GpuLimit(1795 * MIB, 1800 * MIB), 89),  # the line at 90 is 1800 MiB: not below
    (GpuLimit(1900 * MIB, 1905 * MIB), 100),  # the same as the estimator's
    (GpuLimit(1880 * MIB, 1895 * MIB), 100),  # 99 by the line, one off the estimator's: the larger
    (GpuLimit(1900 * MIB, 1915 * MIB), 101),  # 101 by the line, one off: the larger
    (GpuLimit(850 * MIB, 905 * MIB), 0),  # not even one sample: claim nothing (the search tries 1)
])
def test_the_first_claim_is_below_the_limits_upper_bound(limit: GpuLimit | None, expected: int) -> None:
    assert first_claim(seed(100), limit) == expected
    assert first_claim(Seed(None, error="unmodelled"), limit) is None


def test_after_out_of_memory_a_limited_cell_steps_one_down_then_to_where_it_surely_fits() -> None:
    budget = 2000 * MIB
    gpu = line_gpu(1200 * MIB, 10 * MIB, budget)  # max batch 80; the estimator's line says 110
    limit = GpuLimit(2000 * MIB, 2080 * MIB)  # a line below 2000 MiB surely fits: batch 109 and below
    cell = SeededCell(gpu, replace(seed(110, peak=2000 * MIB), claim=112), budget, limit)
    result = search_max_batch(cell.fits, budget_bytes=budget, predict=cell.predict, settle=cell.settle)
    assert result.max_batch_size == 80
    # 112 out of memory, 111 too, 109 (surely, by the limit) too: the limit is wrong here, and the
    # search falls back as without a seed (one down from its last claim, then a sixteenth of it).
    assert [p.batch_size for p in result.probes][:5] == [112, 111, 109, 108, 102]


def test_a_cell_claims_from_the_limit_the_cells_before_it_read(
    curve: EstimateBackend, estimator: EstimateBackend,
) -> None:
    gpu = ScaledGpu(curve, scale=0.9, smooth=True)
    seeded = EstimateSeeded(gpu, estimator)
    table = tune(seeded, modes="fp32")
    first, *later = table.cells
    limit = seeded._limit[(small_workload(), "fp32")]
    assert limit.low < limit.high
    for cell in later:  # each claim is the answer or one above it
        assert cell.probe_log[0]["seeded_claim"] in (cell.max_batch_size, cell.max_batch_size + 1)
        assert cell.probes == 2


def test_a_cell_claims_whichever_of_estimate_and_limit_missed_less_so_far(estimator: EstimateBackend) -> None:
    seeded = EstimateSeeded(ScaledGpu(estimator), estimator)
    workload = small_workload()
    assert seeded.first(workload, 100, None) == 100  # no limit read yet: the estimate
    assert seeded.first(workload, 100, 90) == 100  # neither missed yet: the estimate
    seeded._missed[workload] = (4, 1)
    assert seeded.first(workload, 100, 90) == 90
    seeded._missed[workload] = (1, 1)
    assert seeded.first(workload, 100, 90) == 100
    assert seeded.first(workload, None, 90) is None  # the estimator could not model the step


# --- the product path: cuda backends are seeded unless asked not to -------------------------------


def test_make_backend_seeds_the_cuda_backend_with_the_estimator(monkeypatch: pytest.MonkeyPatch) -> None:
    import autotune.backends
    import autotune.backends.cuda.device
    from autotune.backends import make_backend
    from autotune.backends.cuda.backend import CudaBackend

    monkeypatch.setattr(autotune.backends, "cuda_available", lambda: True)
    h100 = gpu_from_device_properties("NVIDIA H100 80GB HBM3", 85_017_493_504, 9, 0, (132, 2048))
    monkeypatch.setattr(autotune.backends.cuda.device, "local_gpu", lambda: h100)
    seeded, target = make_backend("cuda", gpu_memory="12GiB")
    assert isinstance(seeded, EstimateSeeded) and isinstance(seeded.measure, CudaBackend)
    assert isinstance(seeded.estimator, EstimateBackend) and target == seeded.gpu == custom_gpu(12 * GIB)
    # the seeds are for the step as the local card runs it: its reductions over its multiprocessors
    assert seeded.estimator.gpu == replace(target, multiprocessors=(132, 2048))
    assert seeded.estimator.multiprocessors == Multiprocessors(132, 2048)
    assert seeded.name == "cuda" and seeded.timeout_s == seeded.measure.timeout_s
    plain, _ = make_backend("cuda", gpu_memory="12GiB", seeded=False)
    assert isinstance(plain, CudaBackend)


@pytest.mark.parametrize(("kwargs", "seeded"), [
    ({}, True), ({"search": "bisect"}, False), ({"seed_with_estimate": False}, False),
])
def test_table_seeds_a_guided_search_unless_told_not_to(
    monkeypatch: pytest.MonkeyPatch, kwargs: dict[str, Any], seeded: bool,
) -> None:
    import autotune
    import autotune.backends

    asked = []

    def make_backend(name: str, gpu: Any, gpu_memory: Any, *, seeded: bool = True, **target: Any) -> Any:
        asked.append(seeded)
        return EstimateBackend(GPU), GPU

    monkeypatch.setattr(autotune.backends, "make_backend", make_backend)
    autotune.table("bert-base-uncased", seq_lens=[64], modes="fp32", gpu_memory="1GiB", max_batch=1, **kwargs)
    assert asked == [seeded]


def test_the_cli_flag_turns_the_seed_off(monkeypatch: pytest.MonkeyPatch) -> None:
    from autotune import public
    from autotune.cli import main

    seen: dict[str, Any] = {}

    def run_table(request: Any, **kwargs: Any) -> Any:
        seen["seed_with_estimate"] = request.seed_with_estimate
        raise SystemExit(0)

    monkeypatch.setattr(public, "run_table", run_table)
    for argv, expected in ((["table", "bert-base-uncased"], True),
                           (["table", "bert-base-uncased", "--no-seed-with-estimate"], False)):
        with pytest.raises(SystemExit):
            main(argv)
        assert seen["seed_with_estimate"] is expected
