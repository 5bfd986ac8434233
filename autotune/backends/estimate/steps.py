"""The second training step of a trace written from the first, where a step is steady.

A probe runs two full steps (workload.step.MIN_STEPS): the optimizer creates its state in the
first and the second sees it together with new activations. The second step's forward, loss and
backward run the same ops on the same shapes as the first's, and its ``zero_grad`` frees what the
first's freed; only the optimizer step differs (the state exists), and it does not depend on the
batch or the length. So, once one trace of a (workload, mode) has shown it, the allocations of
step 2 onwards are step 1's forward-backward and ``zero_grad`` again, around the optimizer step
recorded then: the model runs one step instead of two (about half the CPU of a trace).

Checked, not assumed, as trace extrapolation is (trace.py):

- a (workload, mode)'s first trace runs every step, and the steps written from its first are
  compared with the real ones allocation for allocation (sizes, order, frees, reductions);
  if they differ, that (workload, mode) always runs every step;
- in every later trace, the first step must leave nothing behind but the optimizer's state:
  every allocation of its forward-backward and ``zero_grad`` is freed within them, and they free
  nothing made before the step (a lazily built cache, say, would not be built again in step 2).
  Otherwise that trace runs its second step for real.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from autotune.backends.estimate.trace import Event, Workspace

# Keys of the allocations written here: far above any storage address (a 48-bit pointer) that
# the tracker uses as a key, and positive, unlike reductions' workspaces (tracker.py).
_FIRST_KEY = 1 << 62


@dataclass
class StepMarks:
    """Where each step's phases begin in a tracker's event list (indices into ``events``)."""

    starts: list[int] = field(default_factory=list)  # the forward of step i begins
    optimizer_starts: list[int] = field(default_factory=list)  # scaler.step(optimizer) begins
    optimizer_ends: list[int] = field(default_factory=list)  # ... and has returned
    ends: list[int] = field(default_factory=list)  # zero_grad has run: step i is over

    def windows(self, events: Sequence[Event], step: int) -> tuple[list[Event], list[Event], list[Event]]:
        """Step ``step``'s forward-backward, optimizer step and zero_grad events."""
        return (list(events[self.starts[step]:self.optimizer_starts[step]]),
                list(events[self.optimizer_starts[step]:self.optimizer_ends[step]]),
                list(events[self.optimizer_ends[step]:self.ends[step]]))


Canonical = tuple[tuple[int, int, Workspace | None], ...]


def canonical(events: Sequence[Event], workspaces: dict[int, Workspace]) -> Canonical | None:
    """A window of events with its keys replaced by the order they were allocated in
    (``(i, nbytes, workspace)`` to allocate, ``(~i, -1, None)`` to free), so that windows of two
    steps compare equal when they allocate and free alike; None if the window frees an
    allocation made before it."""
    found = _numbered(events, workspaces)
    return None if found is None else found[0]


def _numbered(events: Sequence[Event], workspaces: dict[int, Workspace]
              ) -> tuple[Canonical, dict[int, int]] | None:
    """``canonical``, and the key -> number of the window's allocations still alive after it."""
    local: dict[int, int] = {}  # key of a live allocation -> its number (a key can come back)
    out: list[tuple[int, int, Workspace | None]] = []
    numbered = 0
    for key, nbytes in events:
        if nbytes >= 0:
            local[key] = numbered
            out.append((numbered, nbytes, workspaces.get(key)))
            numbered += 1
        elif key in local:
            out.append((~local.pop(key), -1, None))
        else:
            return None
    return tuple(out), local


def _left(window: Canonical) -> tuple[int, ...]:
    """The sizes of a canonical window's allocations it does not free, in order."""
    freed = {~index for index, _, _ in window if index < 0}
    return tuple(nbytes for index, nbytes, _ in window if index >= 0 and index not in freed)


class StepWriter:
    """Writes canonical windows into a tracker's events under fresh keys (one per trace)."""

    def __init__(self, tracker: Any) -> None:
        self.tracker = tracker
        self.next_key = _FIRST_KEY

    def write(self, window: Canonical, keys: dict[int, int] | None = None) -> dict[int, int]:
        """Append ``window``; ``keys`` maps its local numbers to keys already written (a window
        that frees what an earlier one allocated shares its numbering). Returns the mapping."""
        keys = {} if keys is None else keys
        events = self.tracker.events
        for index, nbytes, workspace in window:
            if nbytes < 0:
                events.append((keys.pop(~index), -1))
                continue
            if workspace is not None:  # a reduction's buffer: its count turns into bytes later
                key = -1 - len(self.tracker.workspaces)
                self.tracker.workspaces[key] = workspace
            else:
                key, self.next_key = self.next_key, self.next_key + 1
            keys[index] = key
            events.append((key, nbytes))
        return keys


def _step_parts(events: Sequence[Event], marks: StepMarks, step: int,
                workspaces: dict[int, Workspace]) -> tuple[Canonical, Canonical] | None:
    """A step's forward-backward followed by its zero_grad, as one canonical window (zero_grad
    frees the gradients backward made), cut where the optimizer step was; None if it frees
    anything made before it or leaves anything allocated."""
    forward, _, zero_grad = marks.windows(events, step)
    whole = canonical(forward + zero_grad, workspaces)
    if whole is None:
        return None
    allocated = sum(1 for index, _, _ in whole if index >= 0)
    freed = sum(1 for index, _, _ in whole if index < 0)
    if allocated != freed:  # something of this step outlives it: not a steady step
        return None
    return whole[:len(forward)], whole[len(forward):]


@dataclass
class SteadySteps:
    """For one (workload, mode): whether its steps after the first can be written from the first,
    and the optimizer steps to write between them. ``verified`` is None until a trace has run
    every step and been compared."""

    verified: bool | None = None
    optimizer_steps: list[Canonical] = field(default_factory=list)  # steps 2, 3, ...
    # The first optimizer step (it makes the state), when it can be written too: the sizes of what
    # the first forward-backward leaves for it (the gradients), and the order in which the trace's
    # end frees the state (``del optimizer``), by the numbers of the state's allocations.
    first_optimizer: Canonical | None = None
    gradients: tuple[int, ...] = ()
    state_frees: tuple[int, ...] = ()

    def can_write_first_optimizer(self, events: Sequence[Event], marks: StepMarks,
                                  workspaces: dict[int, Workspace]) -> bool:
        """At the first optimizer step: whether it can be written instead of run."""
        if not self.verified or self.first_optimizer is None:
            return False
        forward = canonical(events[marks.starts[0]:marks.optimizer_starts[0]], workspaces)
        return forward is not None and _left(forward) == self.gradients

    def write_first_optimizer(self, writer: StepWriter) -> dict[int, int]:
        """Write the first optimizer step; the keys of the state it leaves, by number."""
        assert self.first_optimizer is not None
        return writer.write(self.first_optimizer)

    def free_state(self, writer: StepWriter, keys: dict[int, int]) -> None:
        """Free the written state, as ``del optimizer`` frees the real one."""
        for number in self.state_frees:
            writer.tracker.events.append((keys.pop(number), -1))

    def first_step(self, events: Sequence[Event], marks: StepMarks, workspaces: dict[int, Workspace]
                   ) -> tuple[Canonical, Canonical] | None:
        """The first step of the trace in progress, as ``write`` takes it (its forward-backward
        and its zero_grad), where the steps after it can be written from it; else None."""
        return _step_parts(events, marks, 0, workspaces) if self.verified else None

    def write(self, writer: StepWriter, first: tuple[Canonical, Canonical], steps: int) -> None:
        """Append steps 2..``steps`` to the tracker's events, from its ``first_step``."""
        assert self.verified and len(self.optimizer_steps) == steps - 1
        forward, zero_grad = first
        for optimizer in self.optimizer_steps:
            keys = writer.write(forward)
            writer.write(optimizer)
            writer.write(zero_grad, keys)

    def learn(self, events: Sequence[Event], marks: StepMarks, steps: int,
              workspaces: dict[int, Workspace]) -> None:
        """From a whole trace that ran every step: keep its optimizer steps, and whether steps
        written from its first step equal its real ones (the optimizer steps after the first
        must leave nothing behind: the state is the first's)."""
        self.verified = False
        first = _step_parts(events, marks, 0, workspaces)
        if first is None or len(marks.ends) != steps:
            return
        optimizer_steps = []
        for step in range(1, steps):
            forward, optimizer, zero_grad = marks.windows(events, step)
            written = canonical(optimizer, workspaces)
            real = canonical(forward + optimizer + zero_grad, workspaces)
            if written is None or real is None or _left(written) \
                    or real != _concatenated(first[0], written, first[1]):
                return
            optimizer_steps.append(written)
        self.optimizer_steps = optimizer_steps
        self.verified = True
        self._learn_first_optimizer(events, marks, workspaces)

    def _learn_first_optimizer(self, events: Sequence[Event], marks: StepMarks,
                               workspaces: dict[int, Workspace]) -> None:
        forward, optimizer, _ = marks.windows(events, 0)
        numbered_forward = canonical(forward, workspaces)
        numbered = _numbered(optimizer, workspaces)
        if numbered_forward is None or numbered is None:
            return
        window, state = numbered
        end = events[marks.ends[-1]:marks.ends[-1] + len(state)]
        freed = {key for key, nbytes in end if nbytes < 0 and key in state}
        if len(freed) != len(state) or len(end) != len(state):
            return  # the trace's end does not free the state first, each once
        self.first_optimizer = window
        self.gradients = _left(numbered_forward)
        self.state_frees = tuple(state[key] for key, _ in end)


def _concatenated(forward: Canonical, optimizer: Canonical, zero_grad: Canonical) -> Canonical:
    """The canonical form of forward + optimizer + zero_grad written in a row, as ``write`` does.
    ``zero_grad`` is numbered on from ``forward`` (it frees the gradients backward made); in the
    joint numbering its own allocations, if any, come after the optimizer's."""
    allocated = sum(1 for index, _, _ in forward if index >= 0)
    by = sum(1 for index, _, _ in optimizer if index >= 0)

    def renumbered(entry: tuple[int, int, Workspace | None]) -> tuple[int, int, Workspace | None]:
        number = entry[0] if entry[0] >= 0 else ~entry[0]
        return entry if number < allocated else _shift(entry, by)

    return (forward + tuple(_shift(entry, allocated) for entry in optimizer)
            + tuple(renumbered(entry) for entry in zero_grad))


def _shift(entry: tuple[int, int, Workspace | None], by: int) -> tuple[int, int, Workspace | None]:
    index, nbytes, workspace = entry
    return (index + by, nbytes, workspace) if index >= 0 else (~(~index + by), nbytes, workspace)
