"""The estimator's own trace of a training step against the same step recorded on an H100.

docs/measurements/h100-80gb/records holds real steps under torch.cuda.memory._record_memory_history
(benchmarks/gpu_measure.py). test_allocator.py replays their events through the simulator; here the
estimator traces each step itself, on fake tensors, and must allocate and free every block of the
large pool (over 1 MiB) the GPU did, in the GPU's order: which attention kernel ran and what it
allocated (cuDNN for 16-bit inputs on Hopper, the memory-efficient kernel for float32), the order
its saved tensors die in, autograd's in-place accumulation of gradients, the embedding backward's
buffers (embedding.py), dropout's mask before its output, autocast's casts last argument first:
all show in that order.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autotune.backends.estimate.allocator import round_size
from autotune.backends.estimate.backend import EstimateBackend
from autotune.gpus import resolve_gpu
from autotune.request import ModelAccess, Step, TableRequest, resolve
from autotune.workload.adapters import Adapter
from autotune.workload.modes import parse_mode

MEASUREMENTS = Path(__file__).resolve().parents[4] / "docs" / "measurements" / "h100-80gb"
SMALL_SIZE = 1 << 20  # the small pool's largest block (allocator.py): the large pool is above
# Known and left out: the cuBLAS workspaces (the H100 made one of 32 MiB and one of 1 MiB per
# handle; the estimator counts 33 MiB, gpus.py).
CUBLAS = {32 << 20, 33 << 20}


def large_blocks(events: list[tuple[str, int]], skip: set[int]) -> list[tuple[str, int]]:
    return [(op, size) for op, size in events if size > SMALL_SIZE and size not in skip]


def recorded(record: dict) -> list[tuple[str, int]]:
    sizes: dict[int, int] = {}
    events = []
    for action, address, size, _stream in record["events"]:
        if action == "alloc":
            sizes[address] = round_size(size)
            events.append(("+", sizes[address]))
        elif action == "free_completed" and address in sizes:
            events.append(("-", sizes.pop(address)))
    return events


def estimated(record: dict, table: dict) -> list[tuple[str, int]]:
    backend = EstimateBackend(resolve_gpu("H100-80GB"))
    adapter = table.get("adapter")
    step = Step(table["model"], table["task"], table["weights_dtype"], table["optimizer"], None,
                table["loss"], adapter=None if adapter is None else Adapter.from_json(adapter))
    request = TableRequest(step, seq_lens=[record["seq_len"]])
    workload = resolve(request, make_target=False, access=ModelAccess(allow_hub=False)).workload
    mode = parse_mode(record["mode"])
    with backend.cell(workload, mode, record["seq_len"], table["budget_bytes"]) as cell:
        cell.fits(record["batch"])
        trace = cell.traces[-1]
    sizes: dict[int, int] = {}
    events = []
    for key, nbytes in trace.events():
        if nbytes >= 0:
            sizes[key] = round_size(nbytes)
            events.append(("+", sizes[key]))
        else:
            events.append(("-", sizes.pop(key)))
    return events


@pytest.mark.slow
@pytest.mark.parametrize(("name", "table_name"), [
    ("bert-base-amp-512x32", "bert-base-uncased-16GiB"),
    ("bert-base-fp32-128x64", "bert-base-uncased-16GiB"),
    ("llama-1b-qlora-bf16ckpt-2048x6", "llama-3.2-1b-qlora-trl-24GiB"),
])
def test_the_estimated_step_allocates_the_large_blocks_an_h100_did_in_its_order(
        name: str, table_name: str) -> None:
    record = json.loads((MEASUREMENTS / "records" / f"{name}.json").read_text())
    table = json.loads((MEASUREMENTS / f"{table_name}.json").read_text())
    real = large_blocks(recorded(record), CUBLAS)
    ours = large_blocks(estimated(record, table), CUBLAS)
    assert len(real) > 2500
    # The record ends with the step; the estimator's trace also frees what the step left allocated.
    assert ours[:len(real)] == real
    assert all(op == "-" for op, _ in ours[len(real):])
