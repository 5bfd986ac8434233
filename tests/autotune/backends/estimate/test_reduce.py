"""CUDA reductions' cross-block buffers (backends/estimate/reduce.py), against the H100 trace."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from autotune.backends.estimate.reduce import Multiprocessors, Workspace, reduce_input, workspace_bytes
from autotune.backends.estimate.trace import Trace, extrapolate
from autotune.gpus import GPU_PRESETS, custom_gpu, gpu_from_device_properties, multiprocessors, size_only_chip
from autotune.units import GIB

H100 = Multiprocessors(132, 2048)
RECORD = Path(__file__).parents[4] / "docs/measurements/h100-80gb/records/bert-base-fp32-128x64.json"


def test_a_bias_gradient_over_8192_tokens_takes_the_buffer_the_h100_allocated():
    # BERT-base fp32, batch 64 x seq 128: the FFN output layer's bias gradient, a sum of the
    # [64, 128, 768] gradient over its first two dims.
    reduction = reduce_input(torch.empty(64, 128, 768), [0, 1])
    assert workspace_bytes(reduction, 64 * 128 * 768, H100) == (50_331_648, 24)
    # The recorded step: each such sum's 768-float output, then these two, as on the GPU.
    events = json.loads(RECORD.read_text())["events"]
    sizes = [size for action, _, size, _ in events if action == "alloc"]
    runs = [i for i in range(len(sizes) - 2) if sizes[i:i + 3] == [3072, 50_331_648, 24]]
    assert len(runs) >= 12  # one per layer, and more: every bias gradient of 768 floats


def test_the_same_sum_as_the_gpu_splits_it_on_other_cards_and_sizes():
    reduction = reduce_input(torch.empty(8192, 768), [0])
    assert reduction == reduce_input(torch.empty(64, 128, 768), [0, 1])  # coalesced alike
    t4 = Multiprocessors(40, 1024)  # fewer blocks in flight: fewer blocks per output
    assert workspace_bytes(reduction, 8192 * 768, t4)[0] < workspace_bytes(reduction, 8192 * 768, H100)[0]
    # Unknown card: the most blocks per output any card would use, never fewer than the H100's.
    assert workspace_bytes(reduction, 8192 * 768, None)[0] >= workspace_bytes(reduction, 8192 * 768, H100)[0]
    # Few tokens: each thread sums them alone, no buffer.
    assert workspace_bytes(reduction, 256 * 768, H100) == (0, 0)


@pytest.mark.parametrize(("shape", "dims"), [((4, 512, 50_000), [2]), ((4, 512), None), ((7,), [0])])
def test_sums_along_the_fastest_dim_or_of_few_elements_need_no_large_buffer(shape, dims):
    reduction = reduce_input(torch.empty(*shape), dims)
    buffer, _ = workspace_bytes(reduction, torch.Size(shape).numel(), H100)
    assert buffer <= 64 * 1024


def test_a_copy_is_no_reduction():
    assert reduce_input(torch.empty(1, 8), [0]) is None
    assert reduce_input(torch.empty(()), None) is None


def test_a_trace_replays_a_reduction_count_as_its_bytes_and_extrapolates_the_count():
    workspace = Workspace(reduce_input(torch.empty(2, 128, 768), [0, 1]), H100, semaphores=False)
    a = Trace(2, (100, 2 * 128 * 768), (0, 1, ~1, ~0), ((1, workspace),))
    b = Trace(3, (100, 3 * 128 * 768), (0, 1, ~1, ~0), ((1, workspace),))
    at_64 = extrapolate(a, b, 64)
    assert at_64 is not None and at_64.sizes[1] == 64 * 128 * 768  # the count is affine
    assert at_64.events() == [(0, 100), (1, 50_331_648), (1, -1), (0, -1)]  # the bytes are not


def test_presets_and_local_cards_know_their_multiprocessors():
    assert multiprocessors(GPU_PRESETS["H100-80GB"]) == (132, 2048)
    assert multiprocessors(GPU_PRESETS["T4"]) == (40, 1024)
    assert multiprocessors(gpu_from_device_properties("NVIDIA H100 80GB HBM3", 85_017_493_504, 9, 0)) == (
        132, 2048)
    assert multiprocessors(custom_gpu(12 * GIB)) == size_only_chip()[1]  # a size alone: a current chip's
    # a budget simulated on a card: that card's chip, whatever the size says
    assert multiprocessors(replace(custom_gpu(12 * GIB), multiprocessors=(132, 2048))) == (132, 2048)
