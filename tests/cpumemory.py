"""The cuda worker's device calls on a CPU, for tests of the worker's probe loop without a GPU
(``Worker(CpuMemory())`` in process, or ``cuda_worker.main(cpumemory.CpuMemory)`` in a worker
process)."""

from __future__ import annotations

import contextlib
from typing import Any

from autotune.units import GIB, MIB
from autotune.workload.step import NoScaler


class CpuMemory:
    """A stand-in for the worker's torch.cuda calls: the model on the CPU, scripted figures."""

    device = "cpu"

    def __init__(self, free_bytes: int = 79 * GIB, total_bytes: int = 80 * GIB) -> None:
        self.figures = {
            "free_bytes": free_bytes,
            "total_bytes": total_bytes,
            "device_name": "CPU stand-in",
            "compute_capability": [9, 0],
        }
        self.allocated = 4 * MIB  # what allocated_bytes reports
        self.raise_on_sync: BaseException | None = None
        self.load_error: BaseException | None = None
        self.opened = False  # whether the worker took the device

    def open(self, device_index: int, budget_bytes: int) -> dict[str, Any]:
        # Libraries print to stdout; in a worker process that must not reach the protocol.
        print("CpuMemory: opening the device")
        self.opened = True
        return dict(self.figures)

    def to_device(self, model: Any) -> Any:
        if self.load_error is not None:
            raise self.load_error
        return model

    def autocast(self, dtype_name: str | None) -> Any:
        return contextlib.nullcontext

    def grad_scaler(self) -> Any:
        return NoScaler()

    def warm_up(self, dtype_name: str | None) -> None:
        pass

    def synchronize(self) -> None:
        if self.raise_on_sync is not None:
            raise self.raise_on_sync

    def release(self) -> None:
        pass

    def allocated_bytes(self) -> int:
        return self.allocated

    def peak_bytes(self) -> tuple[int, int]:
        return 3 * self.allocated, 4 * self.allocated
