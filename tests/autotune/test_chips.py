"""The chip a card's answer is for: a preset's, a budget on a known card, a count of
multiprocessors, or, for a size alone, the preset chip keeping the most threads resident."""

from __future__ import annotations

import pytest

import autotune
from autotune.backends import target_gpu
from autotune.errors import InvalidInput
from autotune.gpus import (
    GPU_PRESETS,
    MAX_THREADS_PER_MULTIPROCESSOR,
    PRESET_MULTIPROCESSORS,
    budget_on,
    chip_is_known,
    custom_gpu,
    describe_chip,
    multiprocessors,
    parse_multiprocessors,
    size_only_chip,
)
from autotune.units import GIB

TINY = dict(seq_lens=[64], modes="fp32", backend="estimate")


def test_a_size_alone_takes_the_preset_chip_keeping_the_most_threads_resident():
    name, (count, threads) = size_only_chip()
    resident = {p: PRESET_MULTIPROCESSORS[p] * MAX_THREADS_PER_MULTIPROCESSOR[s.compute_capability]
                for p, s in GPU_PRESETS.items() if s.compute_capability in MAX_THREADS_PER_MULTIPROCESSOR}
    assert count * threads == max(resident.values()) == resident[name]
    assert multiprocessors(custom_gpu(12 * GIB)) == (count, threads)
    assert describe_chip(custom_gpu(12 * GIB)).startswith(
        f"unknown (a size alone), taken to be the largest current one: CUDA's reduction buffers for the "
        f"{name}'s {count} multiprocessors x {threads}")
    assert not chip_is_known(custom_gpu(12 * GIB)) and chip_is_known(budget_on(GPU_PRESETS["T4"], 8 * GIB))
    # what a larger chip would save is not counted for an assumed one: the embedding backward's
    # two-pass kernel (its multiprocessors unknown to the tracker)
    from autotune.backends.estimate.backend import EstimateBackend

    assert EstimateBackend(custom_gpu(12 * GIB)).multiprocessors.known is False
    assert EstimateBackend(custom_gpu(12 * GIB, (46, 1536))).multiprocessors.known is True


def test_a_budget_on_a_known_card_keeps_its_chip_context_and_architecture():
    h200 = GPU_PRESETS["H200"]
    spec = target_gpu("h200", "12GiB", local=None)
    assert spec == budget_on(h200, 12 * GIB)
    assert (spec.name, spec.total_memory_bytes) == ("H200, 12 GiB of it", 12 * GIB)
    assert (spec.context_overhead_bytes, spec.compute_capability) == (h200.context_overhead_bytes, (9, 0))
    assert multiprocessors(spec) == (132, 2048)
    assert describe_chip(spec) == "132 multiprocessors x 2048 threads"


@pytest.mark.parametrize(("text", "chip"), [
    ("46", (46, 2048)), ("46x1536", (46, 1536)), (" 28 X 2048", (28, 2048)), (170, (170, 2048))])
def test_multiprocessors_are_a_count_or_count_x_threads(text, chip):
    assert parse_multiprocessors(text) == chip
    spec = target_gpu(None, "12GiB", local=None, chip=text)
    assert spec.multiprocessors == chip
    assert spec.name == f"custom 12 GiB ({chip[0]} multiprocessors x {chip[1]} threads)"


@pytest.mark.parametrize("text", ["0", "46x", "x1536", "46x1000", "46 SMs", "-4", "2000"])
def test_malformed_multiprocessors_are_refused_naming_the_forms(text):
    with pytest.raises(InvalidInput, match=r"give the chip's multiprocessor count, e.g. 46 .* e.g. 46x1536"):
        parse_multiprocessors(text)


def test_multiprocessors_go_with_a_size_only():
    with pytest.raises(InvalidInput, match="give gpu_memory too"):
        target_gpu(None, None, local=None, chip="46")
    with pytest.raises(InvalidInput, match=r"give either gpu \(T4 has its own multiprocessors\)"):
        target_gpu("T4", "8GiB", local=None, chip="46")


def test_a_budget_larger_than_the_card_or_its_context_is_refused():
    with pytest.raises(InvalidInput, match="GPU memory 16 GiB is more than the 14.56 GiB of T4"):
        target_gpu("T4", "16GiB", local=None)
    with pytest.raises(InvalidInput, match="the CUDA context of H200 alone takes about 768 MiB"):
        target_gpu("H200", "700MiB", local=None)


def test_a_table_says_which_chip_it_took_and_fewer_threads_take_less_memory():
    """A size alone is answered for the size-only chip; a smaller chip's reductions need no more."""
    alone = autotune.table("tiny-bert", gpu_memory="1GiB", **TINY)
    small = autotune.table("tiny-bert", gpu_memory="1GiB", multiprocessors="28x1536", **TINY)
    assert alone.environment["chip"].startswith("unknown (a size alone)")
    assert small.environment["chip"] == "28 multiprocessors x 1536 threads"
    assert alone.cells[0].max_batch_size <= small.cells[0].max_batch_size
    budget = autotune.table("tiny-bert", gpu="H100-80GB", gpu_memory="1GiB", **TINY)
    assert (budget.gpu_name, budget.gpu_memory_bytes) == ("H100-80GB, 1 GiB of it", GIB)


def test_the_allocator_settings_are_the_environments_unless_given(monkeypatch):
    """PYTORCH_ALLOC_CONF (else PYTORCH_CUDA_ALLOC_CONF) of this environment, or alloc_conf; expandable
    segments fit at least what the classic ones do, and the table says which allocator it modelled."""
    kwargs = dict(TINY, modes="fp32,ckpt", gpu_memory="1GiB", workers=1)
    classic = autotune.table("tiny-bert", **kwargs)
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    # in the modes' processes too
    expandable = autotune.table("tiny-bert", **{**kwargs, "workers": 2})
    assert (classic.environment["allocator"], classic.environment["alloc_conf"]) == ("classic segments", None)
    assert expandable.environment["allocator"] == "expandable segments"
    assert expandable.environment["alloc_conf"] == "expandable_segments:True"
    pairs = zip(expandable.cells, classic.cells, strict=True)
    assert all(e.max_batch_size >= c.max_batch_size for e, c in pairs)
    again = autotune.table("tiny-bert", **kwargs, alloc_conf="")  # given: the environment's is not read
    assert again.environment["alloc_conf"] is None
    assert [c.max_batch_size for c in again.cells] == [c.max_batch_size for c in classic.cells]


def test_an_allocator_setting_that_is_not_modelled_is_refused_naming_it():
    with pytest.raises(InvalidInput, match="allocator setting backend:cudaMallocAsync is not modelled"):
        autotune.table("tiny-bert", gpu_memory="1GiB", alloc_conf="backend:cudaMallocAsync", **TINY)
