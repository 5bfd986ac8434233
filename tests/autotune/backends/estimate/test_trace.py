"""Trace extrapolation must equal running the model: checked against real fake-tensor runs."""

from __future__ import annotations

import warnings

import pytest

from autotune.backends.estimate.backend import EstimateBackend, workspace_from_json
from autotune.backends.estimate.trace import PlusFixed, Trace, aligned_pair, extrapolate, rescale, synthesize
from autotune.gpus import resolve_gpu
from autotune.workload import Workload
from autotune.workload.models import resolve_model
from autotune.workload.modes import parse_mode


def test_events_round_trip_through_the_numbered_form():
    events = [(70, 512), (71, 1024), (70, -1), (70, 2048), (71, -1), (70, -1)]
    trace = Trace.from_events(3, events)
    assert trace.sizes == (512, 1024, 2048)
    assert trace.order == (0, 1, ~0, 2, ~1, ~2)
    assert trace.events() == [(0, 512), (1, 1024), (0, -1), (2, 2048), (1, -1), (2, -1)]


def test_extrapolate_is_affine_and_refuses_what_is_not():
    a = Trace(2, (100, 4 * 2 * 8), (0, 1))
    b = Trace(3, (100, 4 * 3 * 8), (0, 1))
    assert extrapolate(a, b, 10).sizes == (100, 4 * 10 * 8)
    assert extrapolate(a, Trace(3, (100, 4 * 3 * 8), (1, 0)), 10) is None  # other order
    assert extrapolate(a, Trace(4, (100, 4 * 3 * 8 + 1), (0, 1)), 10) is None  # not a whole step
    assert extrapolate(a, b, 0) is None


def test_rescale_reads_the_batch_structure_off_another_cell():
    # Reference at one length: a fixed 100 B tensor, a per-sample tensor of 32 B a sample.
    reference = (Trace(2, (100, 64), (0, 1)), Trace(3, (100, 96), (0, 1)))
    # At another length: the fixed tensor is 300 B, the per-sample one 48 B a sample.
    single = Trace(5, (300, 240), (0, 1))
    assert rescale(reference, single, 7).sizes == (300, 336)
    mixed = (Trace(2, (100, 164), (0, 1)), Trace(3, (100, 196), (0, 1)))  # 100 + 32 b
    assert rescale(mixed, single, 7) is None


def test_a_kernel_buffer_s_fixed_part_is_added_in_bytes_and_leaves_the_form_per_sample():
    # cuDNN's backward workspace (attention.py): 32 B a sample recorded, 256 B more in bytes.
    buffer = ((1, PlusFixed(256)),)
    reference = (Trace(2, (100, 64), (0, 1, ~1), buffer), Trace(3, (100, 96), (0, 1, ~1), buffer))
    single = Trace(5, (300, 240), (0, 1, ~1), buffer)
    found = rescale(reference, single, 7)
    assert found is not None and found.sizes == (300, 336)
    assert found.events() == [(0, 300), (1, 336 + 256), (1, -1)]
    assert workspace_from_json(PlusFixed(256).to_json()) == PlusFixed(256)


def _traces(backend, workload, mode, seq_len, batches):
    fake = backend._model(workload)
    with backend.cell(workload, mode, seq_len, 10**12):
        return [backend.trace(fake, workload, mode, seq_len, b) for b in batches]


@pytest.mark.parametrize(("model", "task", "mode", "gpu"), [
    ("tiny-bert", "sequence-classification", "fp32", "A100-80GB"),
    ("tiny-gpt2", "causal-lm", "amp+ckpt", "A100-80GB"),
    # cuDNN's attention backward: a workspace of per-sample accumulators plus 256 fixed bytes
    ("tiny-llama", "causal-lm", "bf16", "H100-80GB"),
])
def test_extrapolated_traces_equal_real_runs(model, task, mode, gpu):
    backend = EstimateBackend(resolve_gpu(gpu))
    workload = Workload(resolve_model(model), task, None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        short = _traces(backend, workload, parse_mode(mode), 32, [3, 4, 5])
        long = _traces(backend, workload, parse_mode(mode), 64, [6, 37])
    pair = aligned_pair(short)
    assert pair is not None
    within = extrapolate(pair[0], pair[1], 29)
    real_29 = _traces(backend, workload, parse_mode(mode), 32, [29])[0]
    assert within == real_29
    # One trace at the longer length plus the shorter length's structure gives the real run.
    assert rescale(pair, long[0], 37) == long[1]


def test_synthesize_interpolates_sizes_in_the_sequence_length():
    # One tensor per sample of 4*s bytes (activations), one of 4*s*s (an attention mask), and a
    # fixed 1000 B one (a parameter): known at lengths 32, 64, 128, wanted at 256.
    def pair(s):
        return tuple(Trace(b, (1000, 4 * s * b, 4 * s * s * b), (0, 1, 2)) for b in (2, 3))

    pairs = {s: pair(s) for s in (32, 64, 128)}
    assert synthesize(pairs, 256, 5).sizes == (1000, 4 * 256 * 5, 4 * 256 * 256 * 5)
    # From one length only, per-sample sizes scale linearly with the length.
    assert synthesize({32: pair(32)}, 64, 5).sizes == (1000, 4 * 64 * 5, 4 * 32 * 64 * 5)
    assert synthesize({}, 64, 5) is None
    # From two lengths, each size that is c * L**k (k = 0, 1, 2) at both is read off exactly.
    two = {s: pair(s) for s in (64, 128)}
    assert synthesize(two, 320, 5).sizes == (1000, 4 * 320 * 5, 4 * 320 * 320 * 5)


def test_synthesize_interpolates_a_size_with_two_powers_of_the_length():
    # 4*s + s*s bytes per sample: no single power; a polynomial through three lengths is exact.
    def pair(s):
        return tuple(Trace(b, ((4 * s + s * s) * b,), (0,)) for b in (2, 3))

    assert synthesize({s: pair(s) for s in (32, 64, 128)}, 256, 5).sizes == ((4 * 256 + 256 * 256) * 5,)
