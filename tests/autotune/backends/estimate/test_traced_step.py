"""The traced step's hooks (estimate/traced_step.py): called at the step's seams, in order, and a
hook that only watches changes no allocation."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any

from autotune.backends.estimate.backend import EstimateBackend
from autotune.backends.estimate.steps import SteadySteps
from autotune.backends.estimate.traced_step import StepHooks
from autotune.gpus import resolve_gpu
from autotune.workload import Workload
from autotune.workload.models import resolve_model
from autotune.workload.modes import parse_mode


class Watcher(StepHooks):
    """Notes each hook's call; changes nothing."""

    every_step = True

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.loaded_count = 0

    def around(self, model: Any) -> contextlib.AbstractContextManager[Any]:
        self.calls.append("around")
        return contextlib.nullcontext()

    def loaded(self, tensor: Any) -> None:
        self.loaded_count += 1

    def before_steps(self, workspaces: list[Any], batch: dict[str, Any], optimizer: Any) -> None:
        self.calls.append(f"before_steps {len(workspaces)} workspaces, {sorted(batch)}")

    @contextlib.contextmanager
    def forward_region(self, emulation: Any) -> Iterator[None]:
        self.calls.append("forward")
        with emulation.forward_region():
            yield

    def before_optimizer(self, optimizer: Any) -> None:
        self.calls.append("before_optimizer")

    def after_optimizer(self, optimizer: Any) -> None:
        self.calls.append("after_optimizer")

    def after_step(self, index: int) -> None:
        self.calls.append(f"after_step {index}")


def test_watching_hooks_see_every_step_and_change_no_allocation():
    workload = Workload(resolve_model("tiny-bert"), "sequence-classification", None)
    mode = parse_mode("fp32")
    backend = EstimateBackend(resolve_gpu("A100-80GB"))
    backend._steady[(workload, mode.name)] = SteadySteps(verified=False)  # runs every step, as hooks do
    fake = backend._model(workload)
    watcher = Watcher()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        with backend.cell(workload, mode, 32, 10**12):
            plain = backend.trace(fake, workload, mode, 32, 2)
            watched = backend.trace_with(watcher, fake, workload, mode, 32, 2)
    assert watched == plain
    per_step = ["forward", "before_optimizer", "after_optimizer"]
    assert watcher.calls == [
        "around", "before_steps 2 workspaces, ['attention_mask', 'input_ids', 'labels']",
        *per_step, "after_step 0", *per_step, "after_step 1",
    ]
    tensors = [*fake.model.parameters(), *fake.model.buffers()]
    assert watcher.loaded_count == len(tensors)
