"""The peaks of a step's phases: GRPO's generation and its training step (workload/grpo.py).

A GRPO step generates (and scores) before it trains, and the job's peak is the larger of the two.
``phase_peaks`` traces the step once with every step run (StepHooks.every_step) and takes, for each
phase of the last step, the most bytes allocated at once (live storages, as the tracker saw them:
the allocator's rounding and fragmentation are the table's replay's, not counted here), and where
in it the generation's KV cache is.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from autotune.backends.estimate.traced_step import StepHooks

if TYPE_CHECKING:
    from autotune.backends.estimate.backend import EstimateBackend
    from autotune.backends.estimate.trace import ReplayEvent
    from autotune.workload import Workload
    from autotune.workload.modes import Mode


class PhaseMarks(StepHooks):
    """Notes where each phase begins in the tracker's events. Watches only."""

    every_step = True

    def __init__(self) -> None:
        self.marks: list[tuple[str, int]] = []

    def phase(self, name: str, event: int) -> None:
        self.marks.append((name, event))


@dataclass(frozen=True)
class PhasePeaks:
    """Peak allocated bytes of each phase of a step's last run (``peaks``: name -> bytes) and the
    live bytes as the first phase began (the weights, the optimizer's state, the batch)."""

    peaks: dict[str, int]
    start_bytes: int


def peaks_of(events: Sequence[ReplayEvent], marks: list[tuple[str, int]]) -> PhasePeaks:
    """Each phase's peak of live bytes, for the last step's phases (each name's last mark)."""
    last: dict[str, int] = {}
    for name, event in marks:
        last[name] = event
    bounds = sorted((event, name) for name, event in last.items())  # each ends where the next begins
    live, start = 0, 0
    sizes: dict[int, int] = {}
    peaks = dict.fromkeys(last, 0)
    current: str | None = None
    following = iter(bounds)
    upcoming = next(following, None)
    for index, (key, nbytes, *_stream) in enumerate(events):
        while upcoming is not None and index == upcoming[0]:
            if current is None:
                start = live
            current = upcoming[1]
            upcoming = next(following, None)
        if nbytes < 0:
            live -= sizes.pop(key, 0)
        else:
            live += nbytes - sizes.get(key, 0)
            sizes[key] = nbytes
        if current is not None:
            peaks[current] = max(peaks[current], live)
    return PhasePeaks(peaks, start)


def phase_peaks(backend: EstimateBackend, workload: Workload, mode: Mode, seq_len: int,
                batch_size: int) -> PhasePeaks:
    """The phases' peaks of ``workload``'s step at ``batch_size`` (module docstring)."""
    hooks = PhaseMarks()
    fake = backend._model(workload, mode.precision)
    with backend.cell(workload, mode, seq_len, backend.gpu.total_memory_bytes):
        trace = backend.trace_with(hooks, fake, workload, mode, seq_len, batch_size)
    events = trace.events()
    return peaks_of(events, hooks.marks)


def describe(peaks: PhasePeaks) -> dict[str, Any]:
    """The phases as results say them: name -> peak allocated bytes."""
    return {name.replace(" ", "_") + "_peak_allocated_bytes": value for name, value in peaks.peaks.items()}
