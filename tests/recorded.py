"""What an instrumented estimate (backends/estimate/instrument.py) recorded, as the tests of saved
activations read it."""

from __future__ import annotations

from typing import Any

from autotune.backends.estimate.instrument import Recording


def alive_as_backward_starts(recording: Recording) -> list[Any]:
    """The allocations the last step's forward made that are still alive as its backward starts:
    what autograd saved of it."""
    live, index = {}, 0
    for key, nbytes in recording.events:
        if nbytes < 0:
            live.pop(key, None)
            continue
        allocation = recording.allocations[index]
        index += 1
        if allocation.step == recording.steps and allocation.phase == "backward":
            break
        live[key] = allocation
    return [a for a in live.values() if a.step == recording.steps and a.phase == "forward"]
