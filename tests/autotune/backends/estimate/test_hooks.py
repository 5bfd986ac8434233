"""The estimator's search hooks: claims from allocator replays in few replays, settled boundaries."""

from __future__ import annotations

import warnings

import pytest

from autotune.backends.estimate.backend import (
    _SETTLE_HOPS,
    EstimateBackend,
    _known_above,
    _largest_fitting,
    _settle,
)
from autotune.gpus import custom_gpu
from autotune.search import search_max_batch
from autotune.workload import Workload
from autotune.workload.models import resolve_model
from autotune.workload.modes import parse_mode


def counted(limit: int, holes: frozenset[int] = frozenset()):
    """fits(b) for b <= limit except the holes (the allocator's non-monotone spots), and the
    batches it was asked about."""
    asked: list[int] = []

    def fits(batch: int) -> bool:
        asked.append(batch)
        return batch <= limit and batch not in holes

    return fits, asked


@pytest.mark.parametrize(("lo", "hi", "start", "limit"), [
    (0, None, None, 1), (0, None, None, 777), (3, None, None, 320), (0, 50, None, 49), (0, 50, None, 0),
    (0, None, 100, 100), (0, None, 100, 99), (0, None, 100, 230), (0, None, 100, 7), (40, 90, None, 63),
])
def test_largest_fitting_finds_the_limit(lo, hi, start, limit):
    fits, _ = counted(limit)
    assert _largest_fitting(fits, lo, hi, start) == limit


def test_a_claim_one_batch_off_costs_two_replays():
    fits, asked = counted(320)
    assert _largest_fitting(fits, 320, None) == 320
    assert asked == [321]  # the known fitting batch is not asked again; one above ends it
    fits, asked = counted(319)
    assert _largest_fitting(fits, 0, None, start=320) == 319
    assert asked == [320, 319]
    fits, asked = counted(321)
    assert _largest_fitting(fits, 0, 323) == 321
    assert asked == [322, 320, 321]  # down by 1, then 2; then bisected


def test_largest_fitting_says_none_when_the_replays_cannot_tell():
    assert _largest_fitting(lambda batch: None, 0, None) is None
    assert _largest_fitting(lambda batch: None if batch > 4 else True, 0, None) is None


def test_settle_agrees_from_any_boundary_near_a_band():
    # Fits up to 400 except in a ragged band from 378: a search can stop at 377, 379, 381 or 400.
    holes = frozenset({378, 380, *range(382, 390)})
    for boundary in (377, 379, 381, 400):
        fits, asked = counted(400, holes)
        settled = _settle(fits, boundary)
        assert (boundary if settled is None else settled) == 377, boundary
        assert boundary not in asked and boundary + 1 not in asked  # known: not replayed
    fits, _ = counted(400)
    assert _settle(fits, 400) is None  # no hole: the boundary stays


def test_settle_stays_below_the_first_failure_and_names_the_batch_above_the_hole():
    # Llama-3.2-1B bf16 on an H100 80GB. At 1024: 17 fits, 18 runs out, 19 and 20 fit. At 512: 35
    # fits, 36 and 37 run out, 38 to 40 fit. At 2048: 8 fits, 9 runs out, 10 fits. Llama-3.2-1B FSDP2
    # bf16+ckpt at 1024 on an H200 capped at 21.88 GiB: 7 fits, 8 runs out (so the H200 measured),
    # 9 fits. The max is below the first failure, from wherever a search stopped; the batch above
    # the hole is the cell's note.
    for limit, holes, below in ((20, {18}, 17), (40, {36, 37}, 35), (10, {9}, 8), (9, {8}, 7)):
        fits, _ = counted(limit, frozenset(holes))
        assert _settle(fits, below) is None, limit
        assert _settle(fits, limit) == below, limit
        # the search stopped at ``limit`` (it fits, the next runs out): the note names it
        assert _known_above({limit: True, limit + 1: False, below + 1: False}, below) == limit, limit
    assert _known_above({20: True, 21: False}, 20) is None  # nothing known past the boundary


def test_settle_follows_a_chain_of_holes_down_window_after_window():
    # A tiny model on a large card: every fourth batch fits and the three after it run out of
    # memory, far up (tiny-llama under FSDP1 QLoRA on an A100-80GB: 575 holes from 268,800). The
    # max is below the chain's first hole, found window after window, _SETTLE_HOPS at most.
    top = 1_000 + 4 * 20_000
    fits, asked = counted(top, frozenset(b for b in range(1_001, top) if b % 4))
    assert _settle(fits, 2_000) == 1_000
    fits, asked = counted(top, frozenset(b for b in range(1_001, top) if b % 4))
    stopped = _settle(fits, top)
    assert stopped is not None and 1_000 < stopped < top - _SETTLE_HOPS  # the hops ran out on the way
    assert len(asked) <= 4 * _SETTLE_HOPS  # each window scanned up to its first failure only


def test_the_note_names_only_a_batch_that_fits_by_its_demand():
    # A small BERT in amp at 512 on 1 GiB: 20 fits, 21-23 run out, 24 runs at the budget though its
    # demand (570 MiB) is over it (486 MiB): a card with more memory than the budget would not run it.
    fits, _ = counted(24, frozenset({21, 22, 23}))
    assert _settle(fits, 24) == 20
    known = {24: True, 25: False, 21: False, 20: True}
    assert _known_above(known, 20) == 24
    assert _known_above(known, 20, robust=lambda batch: batch != 24) is None
    assert _known_above(known, 20, robust=lambda batch: None) is None  # cannot tell: no note
    assert _known_above({**known, 30: True}, 20, robust=lambda batch: batch != 30) == 24


def test_settle_ignores_fits_past_the_window():
    def fits(batch):  # fits again 50 above the boundary: past the window (10 % of 100)
        return batch <= 100 or 150 <= batch <= 160

    assert _settle(fits, 100) is None
    assert _settle(lambda batch: None, 100) is None  # the replays cannot tell


def test_second_length_is_claimed_exactly_from_the_first_cells_structure():
    """A cell proven with one trace leaves an exact pair for the next length's guess, so from the
    third length on the first probe is the max and the cell takes two probes."""
    backend = EstimateBackend(custom_gpu(2 << 30))
    workload = Workload(resolve_model("tiny-bert"), "sequence-classification", None)
    mode = parse_mode("fp32")
    budget = 1 << 30
    answers = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        for seq_len in (16, 32, 64, 128):
            with backend.cell(workload, mode, seq_len, budget) as cell:
                result = search_max_batch(cell.fits, budget_bytes=budget, guess=2, predict=cell.predict,
                                          settle=cell.settle)
            answers[seq_len] = result
    structures = backend._structures[(workload, "fp32")]
    assert sorted(structures) == [16, 32, 64, 128]
    for seq_len in (64, 128):
        probes = answers[seq_len].probes
        assert [p.batch_size for p in probes] == [answers[seq_len].max_batch_size,
                                                 answers[seq_len].max_batch_size + 1]
        assert probes[0].details["estimate"] == "traced"
    # The answers are the same as the baseline search's over the same backend.
    for seq_len, result in answers.items():
        with backend.cell(workload, mode, seq_len, budget) as cell:
            bisect = search_max_batch(cell.fits, budget_bytes=budget, method="bisect", settle=cell.settle)
        assert bisect.max_batch_size == result.max_batch_size


def test_a_cell_takes_the_guess_verdicts_only_where_its_trace_is_the_guessed_one():
    from autotune.backends.estimate.backend import _EstimateCell
    from autotune.backends.estimate.trace import Trace, synthesize

    def pair(length):  # a fixed 1000 B tensor and 4 * length bytes per sample
        return tuple(Trace(b, (1000, 4 * length * b), (0, 1)) for b in (2, 3))

    known = {32: pair(32), 64: pair(64)}
    for own, taken in ((Trace(5, (1000, 4 * 128 * 5), (0, 1)), {10: True, 11: False}),
                       (Trace(5, (1000, 4 * 100 * 5), (0, 1)), {})):  # not what the guess synthesized
        cell = _EstimateCell(None, None, None, None, 128, 1 << 30, known, {})
        cell.guessed.update({batch: (fits, synthesize(known, 128, batch))
                             for batch, fits in ((10, True), (11, False))})
        cell.traces.append(own)
        cell._take_guessed()
        assert cell.verdicts == taken and cell.guessed == {}


def test_settle_scans_a_bounded_window_near_a_large_boundary():
    fits, asked = counted(100_000, frozenset({99_950, 99_900, 95_000}))
    assert _settle(fits, 100_000) == 99_899  # the hole 50 below is in the window, and 50 below it
    assert len(asked) <= 3 * 64 and min(asked) >= 100_000 - 3 * 64  # three windows; 95,000 is not looked at
    fits, asked = counted(100_000, frozenset({99_901}))
    assert _settle(fits, 99_900) is None  # a search stopped under a hole stays
    assert len(asked) <= 3 * 64 and max(asked) <= 99_900
