"""torchao's MX conversions run on meta tensors inside the fake step: the same ops, a tenth of the CPU.

Axolotl's mxfp4 QAT (workload/qat.py) runs torchao's ``MXFakeQuantizedLinear`` on every linear: each
forward converts the input and the weight with ``to_mx`` (prototype/mx_formats/mx_tensor.py: an amax
per block of 32, then ``_to_mx_rceil`` and ``f32_to_f4_unpacked``'s bit manipulation, custom_fp_utils.py
``_f32_to_floatx_unpacked``: some 40 elementwise ops), and each backward converts both back with
``to_dtype`` (``f4_unpacked_to_f32``, as many). On fake tensors every one of those ops goes through
FakeTensorMode's Python dispatch; for a 3B model that was three quarters of a check's CPU (Axolotl's
examples/llama-3/3b-qat-mxfp4.yaml: 200 CPU s, issue #39).

Within ``meta_mx_conversions()``, the two functions are torchao's own, called on meta aliases of the
fake tensors (the same storage, shape, strides and dtype) with the fake mode set aside, and their
results are wrapped back as fake tensors of the same storages. Meta tensors are what FakeTensorMode
runs every op on anyway (its kernels are the meta ones), so the ops, their order, their outputs'
shapes, dtypes and strides, and so every allocation and free the step's tracker records, are the
same; only FakeTensorMode's Python bookkeeping per op is skipped. The storage tracker and the CUDA
emulation (user modes, above the fake mode) still see every op. The traces are compared with the
fake ones allocation for allocation in tests/autotune/backends/estimate/test_mx_meta.py.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

# The functions of torchao.prototype.mx_formats.mx_tensor run on meta: MXTensor.to_mx calls to_mx,
# MXTensor.dequantize calls to_dtype, both by their module-level names.
CONVERSIONS = ("to_mx", "to_dtype")


def _meta_alias(tensor: Any) -> Any:
    """A meta tensor over ``tensor``'s storage (a fake tensor's storage is a meta one): no op any
    mode sees, no new storage."""
    import torch

    if not isinstance(tensor, torch.Tensor):
        return tensor
    with torch._C.DisableTorchFunction(), torch._C._DisableTorchDispatch():
        alias = torch.empty(0, dtype=tensor.dtype, device="meta")
        alias.set_(tensor.untyped_storage(), tensor.storage_offset(), tensor.size(), tensor.stride())
    alias.requires_grad_(False)
    return alias


def _on_meta(function: Callable[..., Any]) -> Callable[..., Any]:
    """``function`` run on meta aliases of its fake tensor arguments, its tensor results made fake
    again (the same storages); called with no fake tensor, ``function`` itself."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily
    from torch.utils._pytree import tree_map

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        fakes = [a for a in (*args, *kwargs.values()) if isinstance(a, FakeTensor)]
        # Autograd records nothing on a meta alias: with grad on (never, inside torchao's autograd
        # Function), torchao's own function on the fake tensors.
        if not fakes or (torch.is_grad_enabled() and any(a.requires_grad for a in fakes)):
            return function(*args, **kwargs)
        mode, device = fakes[0].fake_mode, fakes[0].device
        with unset_fake_temporarily():
            result = function(*tree_map(_meta_alias, args), **tree_map(_meta_alias, kwargs))

        def fake(value: Any) -> Any:
            if isinstance(value, torch.Tensor) and value.device.type == "meta":
                return mode.fake_tensor_converter.from_meta_and_device(mode, value, device)
            return value

        return tree_map(fake, result)

    return wrapper


@contextlib.contextmanager
def meta_mx_conversions() -> Iterator[None]:
    """torchao's ``to_mx`` and ``to_dtype`` on meta tensors inside (see the module docstring)."""
    from torchao.prototype.mx_formats import mx_tensor

    originals = {name: getattr(mx_tensor, name) for name in CONVERSIONS}
    for name, function in originals.items():
        setattr(mx_tensor, name, _on_meta(function))
    try:
        yield
    finally:
        for name, function in originals.items():
            setattr(mx_tensor, name, function)
