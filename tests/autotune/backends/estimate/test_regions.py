"""Allocation regions (tracker.allocation_region): the recording tracker notes where each allocation
was made, the result handed out excepted; nf4.py's 4-bit matmul names its own work so."""

from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from autotune.backends.estimate.instrument import RecordingTracker
from autotune.backends.estimate.nf4 import MATMUL_REGION, EmulatedLinear4bit
from autotune.backends.estimate.tracker import StorageTracker, allocation_region, current_region


def test_a_region_labels_what_is_made_inside_but_its_result():
    with FakeTensorMode(), RecordingTracker() as tracker:
        before = torch.empty(4)
        with allocation_region("work") as region:
            assert current_region() is region
            scratch = torch.empty(8)
            result = region.hand_out(scratch + 1)
            del scratch
        after = result * 2
    assert current_region() is None
    assert [(a.nbytes, a.region) for a in tracker.allocations] == [(16, None), (32, "work"), (32, None),
                                                                   (32, None)]
    del after, before


def test_a_plain_tracker_records_the_same_events_in_a_region_or_not():
    def events(region: bool) -> list[int]:
        with FakeTensorMode(), StorageTracker() as tracker:
            with allocation_region("work") if region else allocation_region("other") as named:
                scratch = torch.empty(8)
                result = named.hand_out(scratch * 2)
                del scratch, result
        return [nbytes for _, nbytes in tracker.events]

    assert events(True) == events(False) == [32, 32, -1, -1]


def test_the_4bit_matmul_names_its_dequantization_but_not_its_output_or_input_gradient():
    with FakeTensorMode():
        base = torch.nn.Linear(64, 32, bias=False, dtype=torch.bfloat16)
        layer = EmulatedLinear4bit(base, quant_type="nf4", double_quant=True, compute_dtype="bfloat16")
        x = torch.empty(2, 64, dtype=torch.bfloat16, requires_grad=True)
        with RecordingTracker() as tracker:
            layer(x).sum().backward()
    made = {(a.shape, a.dtype) for a in tracker.allocations if a.region == MATMUL_REGION}
    # forward: the float32 absmax (32 blocks of 64), absmax + offset, the weight in bf16; backward
    # the same in the weight's dtype (bf16: no cast).
    assert made == {((32,), "float32"), ((32, 64), "bfloat16")}
    outside = [(a.shape, a.dtype) for a in tracker.allocations if a.region is None]
    assert ((2, 32), "bfloat16") in outside  # the output
    assert ((2, 64), "bfloat16") in outside  # the input's gradient
