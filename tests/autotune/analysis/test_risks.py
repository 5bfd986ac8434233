"""explain's risks: what could make a step that fits run out of memory on some runs (issue 40.4).

Each risk's max batch is the search of the step it describes, done independently here: the eager
model's cell, the longer cell, the cell at the budget an earlier copy of the model leaves, and the
cell on a backend of expandable segments built from nothing.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from autotune.analysis.explain import HELD_CATEGORIES, _risks, explain
from autotune.analysis.risks import EAGER, EARLIER_MODEL, EVALUATION, FRAGMENTATION, LONGER
from autotune.backends.estimate.alloc_conf import AllocatorConfig
from autotune.backends.estimate.backend import EstimateBackend
from autotune.cli.explain import render
from autotune.defaults import DEFAULT_MAX_BATCH
from autotune.gpus import custom_gpu
from autotune.tuner import budget_bytes, search_cell
from autotune.units import MIB
from autotune.workload import Workload
from autotune.workload.models import resolve_model
from autotune.workload.modes import parse_mode

FP32 = parse_mode("fp32")
SEQ = 64  # tiny-bert has 128 positions: a longer batch is 128 tokens
GPU = custom_gpu(640 * MIB)
BUDGET = budget_bytes(GPU, 0.05)


def qa() -> Workload:
    return Workload(resolve_model("tiny-bert"), "question-answering", None)


@pytest.fixture(scope="module")
def explained():
    """The explanation at the max with its risks, as explain adds them after the levers (whose
    searches these tests leave out: test_explain.py has them)."""
    backend = EstimateBackend(GPU)
    e = explain(qa(), backend, GPU, seq_len=SEQ, mode=FP32, margin=0.05, with_levers=False)
    e.risks = _risks(qa(), backend, e, mode=FP32, budget=BUDGET, max_batch=DEFAULT_MAX_BATCH)
    return e, {risk.kind: risk for risk in e.risks}


def max_of(workload: Workload, seq_len: int = SEQ, budget: int = BUDGET, backend=None) -> int:
    return search_cell(backend or EstimateBackend(GPU), workload, FP32, seq_len, budget).max_batch_size


def test_eager_attention_is_the_eager_model_s_max(explained):
    e, risks = explained
    eager = max_of(replace(qa(), attn="eager"))
    assert risks[EAGER].max_batch_size == eager
    assert risks[EAGER].breaks == (eager < e.batch_size)


def test_a_longer_batch_is_the_max_at_the_model_s_positions(explained):
    e, risks = explained
    longer = max_of(qa(), seq_len=128)
    assert "128 tokens" in risks[LONGER].label
    assert risks[LONGER].max_batch_size == longer < e.max_batch_size
    assert risks[LONGER].breaks


def test_an_earlier_model_takes_its_weights_and_optimizer_state_off_the_budget(explained):
    e, risks = explained
    held = sum(e.breakdown.categories.get(key, 0) for key in HELD_CATEGORIES)
    assert held == risks[EARLIER_MODEL].bytes > e.breakdown.categories["optimizer_state"] > 0
    assert risks[EARLIER_MODEL].max_batch_size == max_of(qa(), budget=BUDGET - held)


def test_fragmentation_s_max_is_the_expandable_allocator_s_on_the_same_traces(explained):
    e, risks = explained
    fresh = EstimateBackend(GPU, AllocatorConfig(expandable_segments=True))
    assert risks[FRAGMENTATION].max_batch_size == max_of(qa(), backend=fresh)
    assert risks[FRAGMENTATION].bytes == e.breakdown.cached_bytes
    assert not risks[FRAGMENTATION].breaks  # a cure's max, never a cause


def test_evaluation_outputs_count_the_samples_the_memory_left_holds(explained):
    e, risks = explained
    per_sample = 2 * SEQ * 4  # start and end logits, float32
    held = risks[EARLIER_MODEL].bytes
    assert risks[EVALUATION].bytes == per_sample
    assert risks[EVALUATION].samples == (BUDGET - held) // (2 * per_sample)  # the old and grown copies
    assert risks[EVALUATION].max_batch_size is None


def test_the_report_marks_the_risks_that_break_the_batch(explained):
    e, risks = explained
    text = render(e)
    assert f"why batch {e.batch_size} could run out of memory on some runs and not others" in text
    assert f"  ! {risks[LONGER].label}: max {risks[LONGER].max_batch_size}" in text
    assert f"    {risks[FRAGMENTATION].label}" in text
    assert f"{sum(r.breaks for r in e.risks)} of these would break it" in text


def test_risks_come_with_the_levers(monkeypatch):
    from autotune.analysis import explain as module

    monkeypatch.setattr(module, "_what_if", lambda *args, **kwargs: [])  # the levers' searches
    backend = EstimateBackend(GPU)
    assert explain(qa(), backend, GPU, seq_len=SEQ, mode=FP32, margin=0.05, with_levers=False).risks == []
    e = explain(qa(), backend, GPU, seq_len=SEQ, mode=FP32, margin=0.05)
    assert [risk.kind for risk in e.risks] == [EAGER, LONGER, EARLIER_MODEL, FRAGMENTATION, EVALUATION]
