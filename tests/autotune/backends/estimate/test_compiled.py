"""A torch.compile'd step (estimate/compiled.py): Dynamo's graphs through AOTAutograd's min-cut
partitioner, run under the step's tracker, keep what the partitioner saves, not what eager keeps."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest

from autotune.backends.estimate import compiled as compiled_module
from autotune.backends.estimate.backend import EstimateBackend
from autotune.backends.estimate.traced_step import StepHooks
from autotune.gpus import resolve_gpu
from autotune.workload import Workload
from autotune.workload.models import resolve_model
from autotune.workload.modes import parse_mode

SEQ_LEN, BATCH = 64, 4


class ForwardLive(StepHooks):
    """The bytes each forward (and its loss) leaves allocated: what autograd keeps for the backward."""

    every_step = True

    def __init__(self) -> None:
        self.tracker: Any = None
        self.kept: list[int] = []

    def make_tracker(self, device: Any) -> Any:
        self.tracker = super().make_tracker(device)
        return self.tracker

    def _live(self) -> int:
        live: dict[int, int] = {}
        for key, nbytes in self.tracker.events:
            if nbytes == -1:
                live.pop(key, None)
            else:
                live[key] = nbytes
        return sum(live.values())

    @contextlib.contextmanager
    def forward_region(self, emulation: Any) -> Iterator[None]:
        before = self._live()
        with emulation.forward_region():
            yield
        self.kept.append(self._live() - before)


def _kept(workload: Workload, mode_name: str) -> tuple[list[int], Any]:
    backend = EstimateBackend(resolve_gpu("H100-80GB"))
    mode = parse_mode(mode_name)
    made: list[Any] = []
    hooks = ForwardLive()
    original = compiled_module.CompiledForward

    class Watched(original):  # type: ignore[misc,valid-type]
        def __init__(self, model: Any) -> None:
            super().__init__(model)
            made.append(self)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(compiled_module, "CompiledForward", Watched)
        with backend.cell(workload, mode, SEQ_LEN, 10**12):
            backend.trace_with(hooks, backend._model(workload), workload, mode, SEQ_LEN, BATCH)
    return hooks.kept, made[-1] if made else None


@pytest.mark.parametrize("mode_name", ["fp32", "bf16"])
def test_compiled_forward_keeps_the_partitioners_saved_activations(mode_name):
    eager = Workload(resolve_model("tiny-llama"), "causal-lm", "sdpa")
    eager_kept, _ = _kept(eager, mode_name)
    kept, compiled = _kept(dataclasses.replace(eager, compiled="default"), mode_name)
    assert compiled.graphs == 1  # the whole forward in one graph: no graph break
    [saved] = compiled.saved_bytes
    loss_bytes = 4  # the float32 loss, the forward's one output still held
    assert kept == [saved + loss_bytes] * 2  # each step, as the partitioner decided
    # eager keeps more for this model: the min-cut recomputes the pointwise ops (RMSNorm, SiLU,
    # rotary) in the backward instead of saving their outputs
    assert all(e > k for e, k in zip(eager_kept, kept, strict=True))
