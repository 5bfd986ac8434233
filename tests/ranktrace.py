"""One rank's traced step and the live bytes at its seams: what the multi-GPU tests (DDP, FSDP2 in
tests/autotune/backends/estimate/test_distributed.py, DeepSpeed ZeRO in tests/test_zero.py) compare."""

from __future__ import annotations

import collections
from typing import Any

from autotune.backends.estimate.backend import EstimateBackend
from autotune.backends.estimate.steps import SteadySteps
from autotune.backends.estimate.traced_step import StepHooks
from autotune.backends.estimate.tracker import StorageTracker, local_shard
from autotune.gpus import resolve_gpu
from autotune.workload import Workload
from autotune.workload.adapters import Adapter
from autotune.workload.models import resolve_model
from autotune.workload.modes import parse_mode
from autotune.workload.parallel import Parallel
from autotune.workload.step import build_model


class Phases(StepHooks):
    """The live bytes of the trace at the step's seams, and what the weights' loading allocated."""

    every_step = True

    def __init__(self) -> None:
        self.loaded_bytes = 0
        self._loaded: set[int] = set()  # storages counted (FSDP1's parameters are views of one)
        self.steps_start = 0  # events before the steps
        self.live: dict[str, list[int]] = collections.defaultdict(list)
        self.backward_ends: list[int] = []  # events before each step's optimizer

    def make_tracker(self, device: Any) -> StorageTracker:
        self.tracker = super().make_tracker(device)
        return self.tracker

    def loaded(self, tensor: Any) -> None:
        storage = local_shard(tensor).untyped_storage()
        if storage._cdata not in self._loaded:
            self._loaded.add(storage._cdata)
            self.loaded_bytes += storage.nbytes()

    def _note(self, seam: str) -> None:
        sizes: dict[int, int] = {}
        for key, nbytes in self.tracker.events:
            if nbytes >= 0:
                sizes[key] = nbytes
            else:
                del sizes[key]
        self.live[seam].append(sum(sizes.values()))

    def before_steps(self, workspaces: list[Any], batch: dict[str, Any], optimizer: Any) -> None:
        self.steps_start = len(self.tracker.events)
        self._note("before steps")

    def before_optimizer(self, optimizer: Any) -> None:
        self.backward_ends.append(len(self.tracker.events))
        self._note("backward done")

    def after_optimizer(self, optimizer: Any) -> None:
        self._note("optimizer done")

    def allocated_after_start(self) -> collections.Counter[int]:
        return collections.Counter(n for _, n in self.tracker.events[self.steps_start:] if n > 0)

    def allocated_in_first_forward_and_backward(self) -> collections.Counter[int]:
        return collections.Counter(n for _, n in self.tracker.events[self.steps_start:self.backward_ends[0]]
                                   if n > 0)


def traced(parallel: Parallel | None, mode: str = "fp32",
           adapter: Adapter | None = None, *, optimizer: str | None = None) -> tuple[Phases, Any]:
    """tiny-llama's step over bf16 weights (fp32: no autocast, no mixed-precision policy), with
    ``adapter`` if given, the default optimizer or ``optimizer``, batch 2 x 32, every step run; its
    phases and a meta copy of the model as built (without the adapter)."""
    import torch

    spec = resolve_model("tiny-llama")
    chosen = {} if optimizer is None else {"optimizer": optimizer}
    workload = Workload(spec, "causal-lm", None, weights_dtype="bfloat16", adapter=adapter, parallel=parallel,
                        **chosen)
    backend = EstimateBackend(resolve_gpu("A100-80GB"))
    backend._steady[(workload, mode)] = SteadySteps(verified=False)
    phases = Phases()
    backend.trace_with(phases, backend._model(workload, parse_mode(mode).precision), workload,
                       parse_mode(mode), 32, 2)
    with torch.device("meta"):
        model, _ = build_model(spec, "causal-lm", None, "bfloat16")
    return phases, model
