"""What CUDA would do differently from the CPU, replayed at the level of torch functions.

The estimator runs the training step on fake CPU tensors (fake CUDA tensors cannot run backward
on a CPU-only torch). Where CUDA's choice of kernel or dtype changes what is allocated, this
TorchFunctionMode makes the CPU run take CUDA's choice. It sits above autograd, as CUDA's autocast
does, so the tensors autograd saves for backward are the ones CUDA would save.

1. Autocast (``amp``/``bf16``): CUDA's op lists from aten/src/ATen/autocast_mode.cpp
   (``KERNEL_CUDA(..., lower_precision_fp)``, ``fp32``, ``fp32_set_opt_dtype``, ``promote``),
   mapped to the torch functions transformers models call. CPU autocast has different lists,
   so torch.autocast("cpu") would not estimate CUDA. Casts of leaf parameters are cached for the
   whole forward, as autocast's ``cached_cast`` does, and dropped when the forward ends.
   The casts follow torch's own autocast state, as CUDA's do: the forward region sets it on (for
   "cpu", the device type the models read off the fake tensors, ``x.device.type``, and for "cuda",
   which ``torch.is_autocast_enabled()`` without a device reads), so the regions a model runs with
   autocast disabled (transformers' ``maybe_autocast(device_type, enabled=False)``,
   ``torch.autocast(..., enabled=False)``) run uncast, and nested enabled ones cast again
   (torch/amp/autocast_mode.py, ``autocast``'s docstring). CPU autocast's own casts, which that
   state would switch on, are kept off below this mode (``_CPU_AUTOCAST``). Not followed: a region
   enabled by naming "cuda" (``torch.autocast("cuda")`` turns itself off on a host without CUDA), and
   ``torch.amp.custom_fwd(cast_inputs=...)``'s cast of its inputs (``_cast`` takes tensors of the
   device named, "cuda", alone); its region runs uncast, as on CUDA. No model or kernel traced here
   does either.
2. Dropout: CUDA runs the fused ``native_dropout`` kernel (aten/src/ATen/native/Dropout.cpp,
   ``is_fused_kernel_acceptable``), which saves a 1-byte bool mask; the CPU path draws a float
   mask of the input's dtype (4 bytes an element in fp32).
3. Scaled dot-product attention: CUDA picks the flash or memory-efficient kernel
   (aten/src/ATen/native/transformers/cuda/sdp_utils.cpp); neither keeps a seq x seq matrix.
   The CPU falls back to the math path when dropout is on, which does. See ``attention.py``.
4. Grouped products (a mixture's experts) off bfloat16: CUDA's fallback loop, which torch's meta
   function refuses (grouped_mm.py).
5. Triton kernels autotune emulates (Cut Cross-Entropy, workload/cce.py; flash-attn 3; flex attention):
   given ``registers``, so that what they compute in registers stays outside the caching allocator.
"""

from __future__ import annotations

import contextlib
import dataclasses
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from autotune.backends.estimate.attention import AttentionKernels, emulated_sdpa
from autotune.backends.estimate.grouped_mm import fallback_grouped_mm, is_fallback
from autotune.backends.estimate.tracker import outside_allocator
from autotune.workload import cce, chunked_nll, flash_attn3, flex_attention, gemma4_hybrid, ring_attention

Policy = str  # "lower" | "fp32" | "fp32_opt_dtype" | "promote"


def _autocast_policies() -> dict[Callable[..., Any], Policy]:
    """CUDA autocast policy per torch function (autocast_mode.cpp, PyTorch 2.x)."""
    T = torch.Tensor
    lower = [
        F.linear, torch.matmul, T.matmul, T.__matmul__, T.__rmatmul__, torch.mm, T.mm,
        torch.bmm, T.bmm, torch.baddbmm, T.baddbmm, torch.addmm, T.addmm, torch.addbmm,
        torch.mv, T.mv, torch.addmv, torch.einsum, torch.chain_matmul, F.conv1d, F.conv2d,
        F.conv3d, F.conv_transpose1d, F.conv_transpose2d, F.prelu, F.bilinear,
        F.scaled_dot_product_attention,
    ]
    fp32 = [
        F.layer_norm, F.group_norm, torch.layer_norm, torch.exp, T.exp, torch.log, T.log,
        torch.pow, T.pow, T.__pow__, T.__rpow__, torch.rsqrt, T.rsqrt, torch.reciprocal,
        T.reciprocal, torch.expm1, torch.log1p, torch.erfinv, F.softplus, F.cross_entropy,
        F.nll_loss, F.mse_loss, F.l1_loss, F.smooth_l1_loss, F.huber_loss, F.kl_div,
        F.binary_cross_entropy_with_logits, F.cosine_similarity, torch.logsumexp, T.logsumexp,
        torch.cdist, torch.dist, torch.norm, T.norm, F.normalize,
    ]
    # fp32_set_opt_dtype: run in float32 by passing dtype=float32 when no dtype is given.
    fp32_opt_dtype = [
        F.softmax, F.log_softmax, torch.softmax, T.softmax, torch.log_softmax, T.log_softmax,
        torch.sum, T.sum, torch.cumsum, T.cumsum, torch.prod, T.prod,
    ]
    promote = [torch.addcdiv, torch.addcmul, torch.cat, torch.stack, torch.index_put]
    table: dict[Callable[..., Any], Policy] = {}
    groups: tuple[tuple[list[Any], Policy], ...] = (
        (lower, "lower"), (fp32, "fp32"), (fp32_opt_dtype, "fp32_opt_dtype"), (promote, "promote"))
    for functions, policy in groups:
        for function in functions:
            table[function] = policy
    return table


# The dispatch key of CPU autocast's casts (c10 DispatchKey::AutocastCPU): set_autocast_enabled("cpu")
# clears it from the thread's excluded keys (aten/src/ATen/autocast_mode.cpp set_autocast_enabled);
# each call this mode lets through runs with it excluded again, so CPU's lists cast nothing.
_CPU_AUTOCAST = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU)


@contextlib.contextmanager
def _autocast_state(enabled: dict[str, bool], dtype: torch.dtype) -> Iterator[None]:
    """torch's thread-local autocast state of ``enabled``'s device types, set as
    ``torch.autocast.__enter__`` sets it and restored as its ``__exit__`` restores it
    (torch/amp/autocast_mode.py). ``torch.autocast("cuda")`` itself turns off on a host without CUDA."""
    before = {device: (torch.is_autocast_enabled(device), torch.get_autocast_dtype(device))
              for device in enabled}
    for device, on in enabled.items():
        torch.set_autocast_enabled(device, on)
        torch.set_autocast_dtype(device, dtype)
    torch.autocast_increment_nesting()
    try:
        yield
    finally:
        if torch.autocast_decrement_nesting() == 0:
            torch.clear_autocast_cache()
        for device, (on, previous) in before.items():
            torch.set_autocast_enabled(device, on)
            torch.set_autocast_dtype(device, previous)


def _eligible(value: Any) -> bool:
    # autocast casts floating tensors other than float64 (autocast_mode.h, is_eligible).
    return isinstance(value, torch.Tensor) and value.is_floating_point() and value.dtype != torch.float64


class CudaEmulation(TorchFunctionMode):
    """Make a fake-CPU training step allocate what it would on CUDA (see the module docstring).

    ``autocast_dtype`` is None for fp32. Call ``forward_region()`` around the forward pass:
    autocast's cast cache lives only inside it.
    """

    def __init__(self, autocast_dtype: torch.dtype | None, kernels: AttentionKernels) -> None:
        super().__init__()
        self.autocast_dtype = autocast_dtype
        self.kernels = kernels
        self._policies = _autocast_policies() if autocast_dtype is not None else {}
        self._cache: dict[int, tuple[weakref.ref[torch.Tensor], torch.Tensor]] | None = None
        self.attention_kernels: set[str] = set()  # the SDPA kernels chosen (attention.choose_kernel)

    # -- the cast cache ---------------------------------------------------------------------
    def begin_forward(self) -> None:
        self._cache = {}

    def end_forward(self) -> None:
        # Leaving the outermost autocast clears the cache (torch/amp/autocast_mode.py __exit__).
        self._cache = None

    @contextlib.contextmanager
    def forward_region(self) -> Iterator[None]:
        """Stands where ``torch.autocast(...)`` stands in a training script."""
        self.begin_forward()
        try:
            with self._autocast({"cpu": True, "cuda": True}):
                yield
        finally:
            self.end_forward()

    @contextlib.contextmanager
    def recompute_region(self) -> Iterator[None]:
        """Around a checkpointed segment's recompute, inside backward: the mode, and CUDA's autocast
        state as the forward had it. torch.utils.checkpoint restores the state of the inputs' device
        type ("cpu" here, "cuda" on the real job) before entering this (``context_fn``'s second)."""
        with self._on_stack(), self._autocast({"cuda": torch.is_autocast_enabled("cpu")}):
            yield

    @contextlib.contextmanager
    def resumed(self) -> Iterator[None]:
        """The forward's autocast entered again in a backward, as ``torch.amp.custom_bwd`` enters
        ``autocast(enabled=ctx._fwd_used_autocast, dtype=ctx._dtype)`` (torch/amp/autocast_mode.py)."""
        with self._on_stack(), self._autocast({"cpu": True, "cuda": True}):
            yield

    def casting(self) -> bool:
        """Whether autocast casts here: an autocast dtype, and torch's autocast state on for the fake
        tensors' device type and for CUDA (off inside a region either is disabled)."""
        return (self.autocast_dtype is not None and torch.is_autocast_enabled("cpu")
                and torch.is_autocast_enabled("cuda"))

    def _autocast(self, enabled: dict[str, bool]) -> contextlib.AbstractContextManager[None]:
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return _autocast_state(enabled, self.autocast_dtype)

    def _on_stack(self) -> contextlib.AbstractContextManager[Any]:
        from torch.overrides import _get_current_function_mode_stack

        if any(mode is self for mode in _get_current_function_mode_stack()):
            return contextlib.nullcontext()
        return self

    def _cast(self, value: Any, dtype: torch.dtype) -> Any:
        if not _eligible(value) or value.dtype == dtype:
            return value
        cacheable = (
            self._cache is not None and dtype == self.autocast_dtype and value.dtype == torch.float32
            and value.is_leaf and value.requires_grad and not value._is_view()
        )
        if cacheable:
            assert self._cache is not None
            hit = self._cache.get(id(value))
            if hit is not None and hit[0]() is value:
                return hit[1]
        cast = value.to(dtype)
        if cacheable:
            assert self._cache is not None
            self._cache[id(value)] = (weakref.ref(value), cast)
        return cast

    # -- dispatch ---------------------------------------------------------------------------
    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        policy = self._policies.get(func)
        if policy is not None and self.casting():
            args, kwargs = self._apply_policy(func, policy, args, kwargs)
        with torch._C._ExcludeDispatchKeyGuard(_CPU_AUTOCAST):
            return self._dispatch(func, args, kwargs)

    def _dispatch(self, func: Any, args: Any, kwargs: Any) -> Any:
        if func is F.dropout:
            return _fused_dropout(*args, **kwargs)
        if func is F.scaled_dot_product_attention:
            kernels = self.kernels
            if kernels.flash_attn_package and gemma4_hybrid.sdpa_dispatch():
                # a Gemma 4 global layer under gemma4_hybrid_attn_impl: SDPA's own dispatch, not flash-attn's
                kernels = dataclasses.replace(kernels, flash_attn_package=False)
            return emulated_sdpa(kernels, *args, on_kernel=self.attention_kernels.add, **kwargs)
        if func is flash_attn3.flash_attn_func:  # the Hub kernel, emulated for the target card
            self.attention_kernels.add(flash_attn3.KIND)
            arch = self.kernels.compute_capability or flash_attn3.DEFAULT_ARCH
            return func(*args, **{**kwargs, "arch": arch, "registers": outside_allocator})
        if func is ring_attention.attention:  # ring-flash-attn's CUDA ring, emulated (context parallel)
            self.attention_kernels.add(ring_attention.KIND)
            return func(*args, **kwargs)
        if func is cce.linear_cross_entropy:  # Cut Cross-Entropy's Triton kernels, emulated
            return func(*args, **{**kwargs, "registers": outside_allocator})
        if func is chunked_nll.chunked_cross_entropy_loss:  # run under this emulation, and recomputed so
            with self:
                return func(*args, **{**kwargs, "context_fn": lambda: (contextlib.nullcontext(), self)})
        if func is flex_attention.flex_attention:  # torch.compile's Triton kernels, emulated
            self.attention_kernels.add(flex_attention.KIND)
            return func(*args, **{**kwargs, "registers": outside_allocator})
        if func is torch._grouped_mm and is_fallback(*args[:2]):
            return fallback_grouped_mm(*args, **kwargs)
        return func(*args, **kwargs)

    def _apply_policy(self, func: Any, policy: Policy, args: Any, kwargs: Any) -> tuple[Any, Any]:
        assert self.autocast_dtype is not None
        if policy == "lower":
            cast = lambda v: self._cast(v, self.autocast_dtype)  # noqa: E731
        elif policy == "fp32":
            cast = lambda v: self._cast(v, torch.float32)  # noqa: E731
        elif policy == "fp32_opt_dtype":
            first = args[0] if args else None
            if kwargs.get("dtype") is None and first is not None and _eligible(first) \
                    and first.dtype != torch.float32:
                kwargs = {**kwargs, "dtype": torch.float32}
            return args, kwargs
        else:  # promote: to the widest floating dtype among the arguments
            dtypes = [v.dtype for v in _tensors(args, kwargs) if _eligible(v)]
            if not dtypes:
                return args, kwargs
            widest = max(dtypes, key=lambda d: torch.finfo(d).bits)
            cast = lambda v: self._cast(v, widest)  # noqa: E731
        return _right_to_left(cast, args, kwargs)


def _right_to_left(cast: Callable[[Any], Any], args: Any, kwargs: Any) -> tuple[Any, Any]:
    """``cast`` applied to every argument, the last first.

    Autocast's wrappers cast with a parameter pack expansion, ``(*F)(cached_cast(to_type, args,
    device_type)...)`` (aten/src/ATen/autocast_mode.h), whose order C++ leaves to the compiler;
    GCC, which builds PyTorch's Linux wheels, evaluates a call's arguments right to left.
    Measured on an H100 (records/bert-base-amp-512x32.json): each ``nn.Linear`` under amp
    allocated its weight's float16 copy (1.12 MiB) before its input's (24 MiB), then its output.
    """
    leaves, spec = tree_flatten((args, kwargs))
    cast_leaves = [cast(leaf) for leaf in reversed(leaves)]
    cast_leaves.reverse()
    return tree_unflatten(cast_leaves, spec)


def autocast_enabled() -> bool:
    """``torch.is_autocast_enabled()`` as the emulated CUDA step answers it: True where a
    CudaEmulation casts (CudaEmulation.casting: its forward, a checkpointed segment's recompute,
    which torch.utils.checkpoint runs under the forward's autocast state; not inside a region the
    model runs with autocast disabled)."""
    return emulated_autocast() is not None


def emulated_autocast() -> CudaEmulation | None:
    """The CudaEmulation that casts here (autocast_enabled), None where none does."""
    from torch.overrides import _get_current_function_mode_stack

    for mode in reversed(_get_current_function_mode_stack()):
        if isinstance(mode, CudaEmulation) and mode.casting():
            return mode
    return None


def _tensors(args: Any, kwargs: Any) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []
    tree_map(lambda v: found.append(v) if isinstance(v, torch.Tensor) else None, (args, kwargs))
    return found


def _fused_dropout(
    input: torch.Tensor, p: float = 0.5, training: bool = True, inplace: bool = False
) -> torch.Tensor:
    """F.dropout as CUDA runs it: ``native_dropout``, saving a bool mask for backward."""
    if not training or inplace or p <= 0.0 or p >= 1.0 or input.numel() == 0:
        # In-place dropout is rare in transformers models; it keeps the CPU path.
        return F.dropout(input, p, training, inplace)
    output, _mask = torch.ops.aten.native_dropout(input, p, True)
    return output
