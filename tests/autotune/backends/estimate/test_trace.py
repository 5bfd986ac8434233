"""Trace extrapolation must equal running the model: checked against real fake-tensor runs."""

from __future__ import annotations

import warnings

import pytest

from autotune.backends.estimate.backend import EstimateBackend, workspace_from_json
from autotune.backends.estimate.replay import replay
from autotune.backends.estimate.trace import (
    Affine,
    PlusFixed,
    Trace,
    affine,
    aligned_pair,
    extrapolate,
    rescale,
    synthesize,
)
from autotune.gpus import resolve_gpu
from autotune.search import search_max_batch
from autotune.workload import Workload
from autotune.workload.chunks import LigerChunks
from autotune.workload.chunks import from_json as chunking_from_json
from autotune.workload.models import ModelSpec, resolve_model, tiny_config
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


# Liger's fused linear cross-entropy over 32 rows a sample, hidden 32, vocab 128 (inc_factor 4):
# batches 2 and 4 run 4 chunks of 16 and 32 rows; batch 8 too (64); batch 7 runs 64, 64, 64 and 32,
# batch 3 runs three chunks of 32 (workload/chunks.py).
LIGER = LigerChunks(hidden=32, vocab=128)


def _chunked(batch: int, chunk_bytes: int) -> Trace:
    """A step whose chunked loop allocates one chunk of ``chunk_bytes``, its layout recorded."""
    return Trace(batch, (100, chunk_bytes), (0, 1, ~1), chunks=((LIGER, 32 * batch),))


def test_a_form_covers_only_the_batches_whose_chunks_lie_on_its_line():
    assert [LIGER.layout(32 * b) for b in (2, 4, 7, 8, 3)] == [
        (4, 16, 16), (4, 32, 32), (4, 64, 32), (4, 64, 64), (3, 32, 32)]
    a, b = _chunked(2, 16 * 512), _chunked(4, 32 * 512)
    form = affine(a, b)
    assert form is not None and [form.covers(n) for n in (1, 2, 3, 4, 7, 8, 16)] == [
        True, True, False, True, False, True, True]
    assert extrapolate(a, b, 8) == _chunked(8, 64 * 512)
    # batch 7: the same sequence of allocations, another chunk size; batch 3: another sequence
    assert extrapolate(a, b, 7) is None and extrapolate(a, b, 3) is None
    with pytest.raises(ValueError, match="lays its chunks out otherwise"):
        form.at(7)
    # the layouts travel with a kept form (analysis/check.py CellMemo)
    back = Affine.from_json(form.to_json(), workspace_from_json, chunking_from_json)
    assert back == form and not back.covers(7)
    # traces of two layouts have no form
    assert affine(_chunked(2, 16 * 512), _chunked(3, 32 * 512)) is None


def test_a_rescaled_form_covers_the_batches_of_its_own_length_s_layouts():
    reference = (_chunked(2, 16 * 512), _chunked(4, 32 * 512))
    # 64 rows a sample: batch 4 runs 4 chunks of 64; batch 8 of 128, batch 6 three of 128
    single = Trace(4, (300, 64 * 512), (0, 1, ~1), chunks=((LIGER, 64 * 4),))
    assert rescale(reference, single, 8) == Trace(8, (300, 128 * 512), (0, 1, ~1), chunks=((LIGER, 64 * 8),))
    assert rescale(reference, single, 6) is None


def _cell_probes(backend, workload, mode, seq_len, batches):
    with backend.cell(workload, mode, seq_len, 10**12) as cell:
        return [cell.fits(b) for b in batches]


def test_a_chunked_loss_probe_across_a_chunk_boundary_is_the_direct_trace_s():
    backend = EstimateBackend(resolve_gpu("H100-80GB"))
    workload = Workload(resolve_model("tiny-llama"), "causal-lm", None, loss="chunked")
    mode = parse_mode("fp32")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        probes = _cell_probes(backend, workload, mode, 32, [2, 4, 7, 8])
        direct = {b: _traces(EstimateBackend(resolve_gpu("H100-80GB")), workload, mode, 32, [b])[0]
                  for b in (7, 8)}
    by_batch = {p.batch_size: p for p in probes}
    # 2 and 4 align (four chunks each); 7 has other chunk sizes: traced, not extrapolated
    assert by_batch[7].details["estimate"] == "traced"
    assert by_batch[8].details["estimate"] == "extrapolated from batches 2 and 4"
    for batch, trace in direct.items():
        found = replay(trace.events(), 10**12, backend.allocator)
        assert by_batch[batch].details["peak_allocated_bytes"] == found.peak_allocated_bytes, batch


# tiny-llama at 32 tokens: 31 labelled rows a sample. TRL's chunked_nll runs one chunk of 62 and 124
# rows at batches 2 and 4, and of 248 at 8 (on their line); at 9 two, of 256 and 23. Cut
# Cross-Entropy's locks: one per 128 rows, 1 at 2, 3 and 4 (a constant line), 2 at 5.
@pytest.mark.parametrize(("loss", "aligned", "across"), [("chunked_nll", 8, 9), ("cce", 3, 5)])
def test_the_new_chunked_losses_probes_across_a_boundary_are_the_direct_traces(loss, aligned, across):
    backend = EstimateBackend(resolve_gpu("H100-80GB"))
    workload = Workload(resolve_model("tiny-llama"), "causal-lm", None, weights_dtype="bfloat16", loss=loss)
    mode = parse_mode("bf16")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        probes = _cell_probes(backend, workload, mode, 32, [2, 4, aligned, across])
        direct = {b: _traces(EstimateBackend(resolve_gpu("H100-80GB")), workload, mode, 32, [b])[0]
                  for b in (aligned, across)}
    by_batch = {p.batch_size: p for p in probes}
    assert by_batch[across].details["estimate"] == "traced"
    assert by_batch[aligned].details["estimate"] == "extrapolated from batches 2 and 4"
    for batch, trace in direct.items():
        found = replay(trace.events(), 10**12, backend.allocator)
        assert by_batch[batch].details["peak_allocated_bytes"] == found.peak_allocated_bytes, batch


def test_a_chunked_loss_max_is_the_one_direct_traces_prove():
    # A vocabulary-heavy GPT-2 (vocab / hidden = 32: Liger runs 32 chunks of 4 x batch rows at the
    # powers of two, e.g. 2 and 64, and fewer, larger ones between: 256 rows from 33 to 64, 512 up to
    # 128). A cell that traced 2 and 64 (aligned) once answered 73 from that form alone: batch 73 runs
    # 37 chunks of 512 rows, not 32 of 292, and needs 10 MiB more than the form said.
    config = tiny_config("gpt2", vocab_size=4096, n_embd=128, n_layer=1, n_inner=256,
                         bos_token_id=0, eos_token_id=0)
    workload = Workload(ModelSpec("vocab-heavy", "local", config, 1024), "causal-lm", None, loss="chunked")
    backend, mode, budget = EstimateBackend(resolve_gpu("H100-80GB")), parse_mode("fp32"), 240_000_000
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        with backend.cell(workload, mode, 128, budget) as cell:
            assert [cell.fits(b).outcome for b in (2, 64)] == ["fits", "fits"]
            found = search_max_batch(cell.fits, budget_bytes=budget, predict=cell.predict,
                                     settle=cell.settle, above=cell.above).max_batch_size
        direct = EstimateBackend(resolve_gpu("H100-80GB"))
        fits, runs_out = _traces(direct, workload, mode, 128, [found, found + 1])
    assert replay(fits.events(), budget, direct.allocator).fits
    assert not replay(runs_out.events(), budget, direct.allocator).fits
