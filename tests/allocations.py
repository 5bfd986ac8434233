"""What an emulated kernel allocates and what ran: ``Allocations(ops)``, a dispatch mode that records
the (shape, dtype) of what the listed ops create outside the emulation's ``registers`` context (the
kernel's register-only arithmetic) and counts the ops inside it; ``backward_nodes``, the autograd
Functions a tensor's backward runs; ``peak``, the most a trace's (key, bytes) events hold at once."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode


class Allocations(TorchDispatchMode):
    """The (shape, dtype) of every tensor the calls inside create with one of ``ops``, outside the
    ``registers`` context; ``computed``: the ops dispatched inside it."""

    def __init__(self, ops: Iterable[str]) -> None:
        super().__init__()
        self.ops = frozenset(ops)
        self.made: list[tuple[tuple[int, ...], torch.dtype]] = []
        self.inside = 0
        self.computed = 0

    @contextlib.contextmanager
    def registers(self) -> Iterator[None]:
        self.inside += 1
        try:
            yield
        finally:
            self.inside -= 1

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        self.computed += bool(self.inside)
        if not self.inside and func.overloadpacket.__name__ in self.ops:
            for tensor in out if isinstance(out, tuple | list) else (out,):
                if isinstance(tensor, torch.Tensor):
                    self.made.append((tuple(tensor.shape), tensor.dtype))
        return out


def backward_nodes(tensor: torch.Tensor) -> list[str]:
    """The class names of the autograd nodes ``tensor``'s backward reaches, each node once."""
    nodes, seen, todo = [], set(), [tensor.grad_fn]
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        nodes.append(type(node).__name__)
        todo.extend(next_node for next_node, _ in node.next_functions)
    return nodes


def peak(events: list[tuple[int, int]]) -> int:
    """The most bytes a trace's events (key, bytes allocated; negative: that key freed) hold at once."""
    sizes: dict[int, int] = {}
    top = 0
    for key, nbytes in events:
        if nbytes >= 0:
            sizes[key] = nbytes
        else:
            del sizes[key]
        top = max(top, sum(sizes.values()))
    return top
