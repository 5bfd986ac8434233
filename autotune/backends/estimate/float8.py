"""torchao's ``Float8Linear`` under the estimator's emulated autocast.

``Float8Linear.forward`` (torchao float8/float8_linear.py) starts with CUDA autocast's cast of its
input, which ``F.linear`` would have had::

    if torch.is_autocast_enabled():
        autocast_dtype = torch.get_autocast_gpu_dtype()
        input = input.to(autocast_dtype)

The estimator emulates autocast at the level of torch functions (emulation.py), so
``torch.is_autocast_enabled()`` is False on its CPU run and a float32 input (a float32 model's
residual stream under bf16 autocast) would go on in float32: saved for the backward at twice the
bytes CUDA saves. ``route_float8`` adds that cast back, as a forward pre-hook of each ``Float8Linear``
that casts the input to the emulated autocast dtype wherever ``emulation.autocast_enabled()`` says
autocast is on. Everything after it is torchao's own code, traced on the fake tensors.
"""

from __future__ import annotations

from typing import Any

import torch

from autotune.backends.estimate.emulation import CudaEmulation, autocast_enabled


def _emulated_autocast_dtype() -> torch.dtype | None:
    from torch.overrides import _get_current_function_mode_stack

    for mode in reversed(_get_current_function_mode_stack()):
        if isinstance(mode, CudaEmulation) and mode.autocast_dtype is not None:
            return mode.autocast_dtype
    return None


def _cast_input(module: torch.nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
    if not args or torch.is_autocast_enabled() or not autocast_enabled():
        return None  # real autocast: Float8Linear.forward casts itself
    dtype = _emulated_autocast_dtype()
    first = args[0]
    if dtype is None or not isinstance(first, torch.Tensor) or first.dtype == dtype:
        return None
    return (first.to(dtype), *args[1:])


def route_float8(model: torch.nn.Module) -> int:
    """A pre-hook on each of ``model``'s torchao ``Float8Linear``s for autocast's input cast; the count."""
    count = 0
    for module in model.modules():
        if type(module).__name__ == "Float8Linear":
            module.register_forward_pre_hook(_cast_input)
            count += 1
    return count
