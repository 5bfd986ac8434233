"""Steps after the first written from it (estimate/steps.py) must equal running them."""

from __future__ import annotations

import warnings

import pytest

from autotune.backends.estimate.backend import EstimateBackend
from autotune.backends.estimate.steps import SteadySteps, StepMarks, canonical
from autotune.gpus import resolve_gpu
from autotune.request import PeftOptions
from autotune.workload import Workload
from autotune.workload.models import resolve_model
from autotune.workload.modes import parse_mode


def _trace(backend, workload, mode, seq_len, batch):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        with backend.cell(workload, mode, seq_len, 10**12):
            return backend.trace(backend._model(workload), workload, mode, seq_len, batch)


@pytest.mark.parametrize(("model", "task", "mode", "extra"), [
    ("tiny-bert", "sequence-classification", "fp32", {}),
    ("tiny-bert", "sequence-classification", "amp", {"optimizer": "adamw_torch"}),
    ("tiny-gpt2", "causal-lm", "amp+ckpt", {"optimizer": "adamw_bnb_8bit"}),
    ("tiny-llama", "causal-lm", "ckpt", {"weights_dtype": "bfloat16"}),
    ("tiny-llama", "causal-lm", "fp32", {"adapter": PeftOptions(peft="lora").adapter()}),
])
def test_written_steps_equal_real_ones(model, task, mode, extra):
    workload = Workload(resolve_model(model), task, None, **extra)
    step_mode = parse_mode(mode)
    writing = EstimateBackend(resolve_gpu("A100-80GB"))
    _trace(writing, workload, step_mode, 32, 3)  # every step runs, and is compared
    steady = writing._steady[(workload, mode)]
    assert steady.verified is True
    assert steady.first_optimizer is not None  # the first optimizer step is written too
    real = EstimateBackend(resolve_gpu("A100-80GB"))
    real._steady[(workload, mode)] = SteadySteps(verified=False)  # never writes
    calls = []
    original_write = steady.write

    def write(*args, **kwargs):
        calls.append(args)
        original_write(*args, **kwargs)

    steady.write = write
    for seq_len, batch in ((32, 5), (64, 2)):
        written = _trace(writing, workload, step_mode, seq_len, batch)
        assert len(calls) == 1, "the second step was run, not written"
        calls.clear()
        assert written == _trace(real, workload, step_mode, seq_len, batch)


def test_an_optimizer_whose_second_step_frees_its_first_steps_state_runs_every_step():
    # transformers' Adafactor replaces state tensors in its second step: not written, and the
    # trace is the real one.
    workload = Workload(resolve_model("tiny-bert"), "sequence-classification", None, optimizer="adafactor")
    mode = parse_mode("fp32")
    backend = EstimateBackend(resolve_gpu("A100-80GB"))
    first = _trace(backend, workload, mode, 32, 3)
    assert backend._steady[(workload, "fp32")].verified is False
    assert _trace(backend, workload, mode, 32, 3) == first


def _marks(*windows):
    """Marks and events of steps given as (forward, optimizer, zero_grad) event lists."""
    events, marks = [], StepMarks()
    for forward, optimizer, zero_grad in windows:
        marks.starts.append(len(events))
        events += forward
        marks.optimizer_starts.append(len(events))
        events += optimizer
        marks.optimizer_ends.append(len(events))
        events += zero_grad
        marks.ends.append(len(events))
    return events, marks


ACTIVATION, GRAD, STATE, TEMP = 10, 11, 20, 21
FORWARD = [(ACTIVATION, 512), (GRAD, 64), (ACTIVATION, -1)]
ZERO_GRAD = [(GRAD, -1)]


def test_a_steady_pair_of_steps_is_learned_and_written():
    events, marks = _marks((FORWARD, [(STATE, 128), (TEMP, 64), (TEMP, -1)], ZERO_GRAD),
                           (FORWARD, [(TEMP, 64), (TEMP, -1)], ZERO_GRAD))
    steady = SteadySteps()
    steady.learn(events, marks, 2, {})
    assert steady.verified is True
    assert steady.optimizer_steps == [((0, 64, None), (~0, -1, None))]


def test_a_second_step_unlike_the_first_is_never_written():
    cache = [(30, 256)]  # built in the first forward only, and kept: a lazily made cache
    events, marks = _marks((cache + FORWARD, [(STATE, 128)], ZERO_GRAD), (FORWARD, [], ZERO_GRAD))
    steady = SteadySteps()
    steady.learn(events, marks, 2, {})
    assert steady.verified is False
    # A first step that frees what was made before it is not steady either.
    events, marks = _marks((FORWARD + [(1, -1)], [], ZERO_GRAD), (FORWARD, [], ZERO_GRAD))
    events = [(1, 8), *events]
    marks = StepMarks([s + 1 for s in marks.starts], [s + 1 for s in marks.optimizer_starts],
                      [s + 1 for s in marks.optimizer_ends], [s + 1 for s in marks.ends])
    steady = SteadySteps()
    steady.learn(events, marks, 2, {})
    assert steady.verified is False


def test_canonical_numbers_a_key_that_comes_back_as_a_new_allocation():
    # The same storage address allocated again after a free is another allocation.
    assert canonical([(7, 100), (7, -1), (7, 200), (7, -1)], {}) == (
        (0, 100, None), (~0, -1, None), (1, 200, None), (~1, -1, None))
    assert canonical([(7, -1)], {}) is None


def test_a_first_step_found_unsteady_after_its_optimizer_step_was_written_runs_again():
    workload = Workload(resolve_model("tiny-bert"), "sequence-classification", None)
    mode = parse_mode("fp32")
    backend = EstimateBackend(resolve_gpu("A100-80GB"))
    _trace(backend, workload, mode, 32, 3)
    steady = backend._steady[(workload, "fp32")]
    writes = []
    original = steady.write_first_optimizer

    def write_first_optimizer(writer):
        writes.append(writer)
        return original(writer)

    steady.write_first_optimizer = write_first_optimizer
    steady.first_step = lambda *args: None  # as if the first step had left something behind
    real = EstimateBackend(resolve_gpu("A100-80GB"))
    real._steady[(workload, "fp32")] = SteadySteps(verified=False)
    assert _trace(backend, workload, mode, 64, 4) == _trace(real, workload, mode, 64, 4)
    assert len(writes) == 1  # written once, then the trace ran again with every step run
