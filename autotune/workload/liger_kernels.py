"""Liger Kernel's Triton kernels, emulated in plain torch: Liger's outputs and gradients, Liger's memory.

Liger's kernels (linkedin/Liger-Kernel, src/liger_kernel/ops/) are Triton: they run on a GPU only.
Each is an autograd Function whose memory is in two places, emulated apart:

- what its Python wrapper allocates with torch (outputs, per-row statistics, per-SM partial sums,
  ``ensure_contiguous``'s copies) and what it saves for backward (``ctx.save_for_backward``):
  made here with the same torch calls, in Liger's order, of the same shapes and dtypes;
- what the kernel computes in registers, which the caching allocator never sees. Its arithmetic is
  done here with torch temporaries inside ``registers()``, a context the caller gives (the
  estimator: storages first made inside are not the allocator's, tracker.outside_allocator; on a
  CPU none: there the values are what is checked), and written into the buffers Liger's kernel
  writes, in place (``copy_``). Where Liger writes a gradient over a saved input or over the
  incoming gradient (RMSNorm's in_place dX = dY, SwiGLU's and GeGLU's da, db over a, b, RoPE's
  rotation of q and k, the cross-entropy's gradient over its logits), so does this: nothing new.

A kernel's sums over a row (Triton's ``tl.sum``) are batched matmuls here, not ``torch.sum``: the
estimator records a CUDA reduction's workspace for every torch sum (backends/estimate/reduce.py),
which a Triton kernel does not have.

Each Function takes ``registers`` as its last argument. Torch is imported on first use
(``functions()``): the request and the CLI name these kernels without torch.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

Registers = Callable[[], AbstractContextManager[Any]]
SQRT_2_OVER_PI = 0.7978845608028654  # the tanh form of GELU (ops/geglu.py _geglu_tanh_forward_kernel)


def _row_dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Each row's dot product of two [rows, n] tensors, as [rows, 1]: a batched matmul, not a sum
    (module docstring)."""
    import torch

    return torch.bmm(a.unsqueeze(1), b.unsqueeze(2)).view(-1, 1)


# --- RMSNorm: ops/rms_norm.py ---------------------------------------------------------------------


def rms_norm_forward(X: torch.Tensor, W: torch.Tensor, eps: float, offset: float, casting_mode: str,
                     registers: Registers) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``rms_norm_forward``: Y [rows, n] in X's dtype and RSTD [rows] (float32 in the llama and
    gemma casting modes) allocated with torch.empty, then ``_rms_norm_forward_kernel`` (one row a
    program; the ``_block_`` kernel for narrow rows allocates the same). Returns Y, X [rows, n]
    (a view of the input), RSTD."""
    import torch

    X = X.view(-1, X.shape[-1])
    Y = torch.empty((X.shape[0], X.shape[1]), dtype=X.dtype, device=X.device)
    RSTD = torch.empty(X.shape[0], dtype=torch.float32, device=X.device)
    with registers():
        x = X.float()
        rstd = torch.rsqrt(_row_dot(x, x) / X.shape[1] + eps)
        RSTD.copy_(rstd.view(-1))
        normed = x * rstd
        if casting_mode == "llama":  # only rstd in float32; the weight multiplies X's dtype
            Y.copy_(normed.to(X.dtype) * (W + offset))
        else:  # gemma: everything in float32, cast back to X's dtype
            Y.copy_(normed * (W.float() + offset))
    return Y, X, RSTD


def rms_norm_backward(dY: torch.Tensor, X: torch.Tensor, W: torch.Tensor, RSTD: torch.Tensor,
                      offset: float, casting_mode: str, in_place: bool, sm_count: int,
                      registers: Registers) -> tuple[torch.Tensor, torch.Tensor]:
    """``rms_norm_backward``: the per-program weight gradients ``_dW`` [sm_count, n] float32 (one
    program a multiprocessor, ``rows_per_program`` rows each), dX written over dY (``in_place``)
    or into ``torch.zeros_like(dY)``, then ``_dW.sum(dim=0).to(W.dtype)``, in torch."""
    import torch

    shape = dY.shape
    dY = dY.view(-1, shape[-1])
    n_rows, n_cols = dY.shape
    _dW = torch.empty((sm_count, n_cols), dtype=torch.float32, device=W.device)
    dX = dY if in_place else torch.zeros_like(dY)
    rows_per_program = -(-n_rows // sm_count)
    with registers():  # _rms_norm_backward_kernel
        x, rstd, w = X.float(), RSTD.view(-1, 1), W.float() + offset
        m = (dY * w).float() if casting_mode == "llama" else dY.float() * w
        dx = rstd * m - rstd * (rstd * rstd / n_cols) * _row_dot(m, x) * x
        normed = (x * rstd).to(X.dtype) if casting_mode == "llama" else x * rstd
        program = torch.arange(n_rows, device=dY.device) // rows_per_program
        _dW.zero_().index_add_(0, program, (dY * normed).float() if casting_mode == "llama"
                               else dY.float() * normed)
        dX.copy_(dx)  # after the weight gradient: dX may be dY
    dW = _dW.sum(dim=0).to(W.dtype)
    return dX.view(*shape), dW


# --- Axolotl's gated RMSNorm: axolotl/kernels/rms_norm_gated.py ------------------------------------------


def rms_norm_gated_forward(X: torch.Tensor, G: torch.Tensor, W: torch.Tensor, eps: float, offset: float,
                           registers: Registers) -> tuple[torch.Tensor, ...]:
    """``rms_norm_gated_forward`` (Axolotl's FusedRMSNormGated, built on Liger's utilities): X and G
    viewed [rows, n], then ``_rms_norm_gated_fwd_op``'s Y [rows, n] in X's dtype and RSTD [rows]
    float32 (torch.empty), which ``_rms_norm_gated_forward_kernel`` fills: Y = (W + offset) * X * rstd *
    silu(G), all in float32, cast to X's dtype. Returns Y, X, G (views of the inputs), RSTD."""
    import torch

    X, G = X.view(-1, X.shape[-1]), G.view(-1, G.shape[-1])
    Y = torch.empty((X.shape[0], X.shape[1]), dtype=X.dtype, device=X.device)
    RSTD = torch.empty(X.shape[0], dtype=torch.float32, device=X.device)
    with registers():
        x, g = X.float(), G.float()
        rstd = torch.rsqrt(_row_dot(x, x) / X.shape[1] + eps)
        RSTD.copy_(rstd.view(-1))
        Y.copy_((W.float() + offset) * (x * rstd) * (g * torch.sigmoid(g)))
    return Y, X, G, RSTD


def rms_norm_gated_backward(dY: torch.Tensor, X: torch.Tensor, G: torch.Tensor, W: torch.Tensor,
                            RSTD: torch.Tensor, offset: float, sm_count: int, registers: Registers
                            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``_rms_norm_gated_bwd_op``: ``_dW`` [sm_count, n] float32 (one program a multiprocessor), dX and
    dG ``torch.empty_like(dY)``, which ``_rms_norm_gated_backward_kernel`` fills, then
    ``_dW.sum(dim=0).to(W.dtype)`` in torch."""
    import torch

    shape = dY.shape
    dY = dY.view(-1, shape[-1])
    n_rows, n_cols = dY.shape
    _dW = torch.empty((sm_count, n_cols), dtype=torch.float32, device=W.device)
    dX = torch.empty_like(dY)
    dG = torch.empty_like(dY)
    rows_per_program = -(-n_rows // sm_count)
    with registers():
        dy, x, g, rstd, w = dY.float(), X.float(), G.float(), RSTD.view(-1, 1), W.float() + offset
        normed, sig = x * rstd, torch.sigmoid(g)
        silu = g * sig
        program = torch.arange(n_rows, device=dY.device) // rows_per_program
        _dW.zero_().index_add_(0, program, dy * normed * silu)
        dG.copy_(dy * w * normed * (sig * (1.0 + g * (1.0 - sig))))
        m = dy * w * silu
        dX.copy_(rstd * m - rstd * (rstd * rstd / n_cols) * _row_dot(m, x) * x)
    dW = _dW.sum(dim=0).to(W.dtype)
    return dX.view(*shape), dG.view(*shape), dW


# --- RoPE: ops/rope.py ------------------------------------------------------------------------------


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, backward: bool) -> None:
    """``_triton_rope`` on x [batch, seq, heads, head_dim] in place: the first half of cos and sin
    (as the kernel loads them) rotates the two halves of each head; backward turns the other way."""
    half = x.shape[-1] // 2
    c, s = cos[..., :half].unsqueeze(2), sin[..., :half].unsqueeze(2)
    if backward:
        s = -s
    left, right = x[..., :half], x[..., half:]
    new_left, new_right = left * c - right * s, right * c + left * s
    left.copy_(new_left)
    right.copy_(new_right)


def rope_forward(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                 registers: Registers) -> tuple[torch.Tensor, ...]:
    """``rope_forward``: q and k [batch, heads, seq, head_dim] transposed back to their storage's
    layout, ``.contiguous()`` (a copy only where they are not), rotated in place. Written through
    ``.data``, as Triton's stores are, past autograd's version counter: q and k are views of the
    projections' outputs, whose other views autograd would otherwise rebuild."""
    q, k = q.transpose(1, 2).contiguous(), k.transpose(1, 2).contiguous()
    cos, sin = cos.contiguous(), sin.contiguous()
    with registers():
        _rotate(q.data, cos, sin, backward=False)
        _rotate(k.data, cos, sin, backward=False)
    return q.transpose(1, 2), k.transpose(1, 2), cos, sin


def rope_backward(dq: torch.Tensor, dk: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                  registers: Registers) -> tuple[torch.Tensor, torch.Tensor]:
    """``rope_backward``: the gradients rotated back in place, as the forward."""
    dq, dk = dq.transpose(1, 2).contiguous(), dk.transpose(1, 2).contiguous()
    with registers():
        _rotate(dq, cos, sin, backward=True)
        _rotate(dk, cos, sin, backward=True)
    return dq.transpose(1, 2), dk.transpose(1, 2)


# --- SwiGLU and GeGLU: ops/swiglu.py, ops/geglu.py ------------------------------------------------------


def _gelu_tanh(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """GELU's tanh form of a float32 ``a``, and its tanh (both kernels recompute them)."""
    import torch

    tanh = torch.tanh(SQRT_2_OVER_PI * (a + 0.044715 * a * a * a))
    return 0.5 * a * (1 + tanh), tanh


def glu_forward(a: torch.Tensor, b: torch.Tensor, gelu: bool, registers: Registers
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``swiglu_forward`` / ``geglu_forward``: c = act(a) * b into ``torch.empty_like(a)``, the
    activation in float32 cast to b's dtype (one row a program; Blackwell's column tiles of wide
    rows allocate the same). Returns a, b [rows, n] (views of the inputs) and c."""
    import torch

    shape = a.shape
    a, b = a.view(-1, shape[-1]), b.view(-1, shape[-1])
    c = torch.empty_like(a)
    with registers():
        x = a.float()
        act = _gelu_tanh(x)[0] if gelu else x * torch.sigmoid(x)
        c.copy_(act.to(b.dtype) * b)
    return a, b, c.view(*shape)


def glu_backward(a: torch.Tensor, b: torch.Tensor, dc: torch.Tensor, gelu: bool,
                 registers: Registers) -> tuple[torch.Tensor, torch.Tensor]:
    """``swiglu_backward`` / ``geglu_backward``: the activation recomputed from the saved a, and
    da, db written over a and b."""
    import torch

    shape = dc.shape
    dc = dc.view(-1, shape[-1])
    with registers():
        x = a.float()
        if gelu:  # _geglu_tanh_backward_kernel
            act, tanh = _gelu_tanh(x)
            db = dc.float() * act.to(dc.dtype).float()
            slope = 0.5 * (1 + tanh) + 0.5 * x * (1 - tanh * tanh) * (
                SQRT_2_OVER_PI * (1 + 3 * 0.044715 * x * x))
        else:  # _swiglu_backward_kernel
            sig = torch.sigmoid(x)
            db = dc * (x * sig)
            slope = x * sig * (1 - sig) + sig
        da = dc * b * slope
        a.copy_(da)
        b.copy_(db)
    return a.view(*shape), b.view(*shape)


# --- the autograd Functions ---------------------------------------------------------------------------


@functools.cache
def functions() -> Any:
    """The emulated Functions, made on first use (torch imported then): a namespace with
    RMSNorm, Rope, SiLUMul, GELUMul and CrossEntropy (``Function.apply``), as Liger's
    LigerRMSNormFunction, LigerRopeFunction, LigerSiLUMulFunction, LigerGELUMulFunction and
    LigerCrossEntropyFunction, and RMSNormGated, as Axolotl's FusedRMSNormGatedFunction."""
    from types import SimpleNamespace

    saves = "saves a and b; backward writes da, db over them"
    return SimpleNamespace(
        RMSNorm=_rms_norm_function(), Rope=_rope_function(), CrossEntropy=_cross_entropy_function(),
        RMSNormGated=_rms_norm_gated_function(),
        SiLUMul=_glu_function(False, f"LigerSiLUMulFunction (ops/swiglu.py): {saves}."),
        GELUMul=_glu_function(True, f"LigerGELUMulFunction (ops/geglu.py): {saves}."),
    )


def _rms_norm_function() -> type:
    import torch

    class RMSNorm(torch.autograd.Function):
        """LigerRMSNormFunction (ops/rms_norm.py): saves X, W and the float32 RSTD [rows]."""

        @staticmethod
        def forward(ctx: Any, X: torch.Tensor, W: torch.Tensor, eps: float, offset: float,
                    casting_mode: str, in_place: bool, sm_count: int, registers: Registers) -> torch.Tensor:
            shape = X.shape
            X, W = X.contiguous(), W.contiguous()  # @ensure_contiguous
            Y, X, RSTD = rms_norm_forward(X, W, eps, offset, casting_mode, registers)
            ctx.args = (offset, casting_mode, in_place, sm_count, registers)
            ctx.save_for_backward(X, W, RSTD)
            return Y.view(*shape)

        @staticmethod
        def backward(ctx: Any, dY: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
            X, W, RSTD = ctx.saved_tensors
            dX, dW = rms_norm_backward(dY.contiguous(), X, W, RSTD, *ctx.args)
            return dX, dW, None, None, None, None, None, None

    return RMSNorm


def _rms_norm_gated_function() -> type:
    import torch

    class RMSNormGated(torch.autograd.Function):
        """FusedRMSNormGatedFunction (axolotl/kernels/rms_norm_gated.py): X and G made contiguous
        (Liger's @ensure_contiguous); saves X, G, W and the float32 RSTD [rows]."""

        @staticmethod
        def forward(ctx: Any, X: torch.Tensor, G: torch.Tensor, W: torch.Tensor, eps: float, offset: float,
                    sm_count: int, registers: Registers) -> torch.Tensor:
            shape = X.shape
            X, G, W = X.contiguous(), G.contiguous(), W.contiguous()
            Y, X, G, RSTD = rms_norm_gated_forward(X, G, W, eps, offset, registers)
            ctx.args = (offset, sm_count, registers)
            ctx.save_for_backward(X, G, W, RSTD)
            return Y.view(*shape)

        @staticmethod
        def backward(ctx: Any, dY: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
            X, G, W, RSTD = ctx.saved_tensors
            dX, dG, dW = rms_norm_gated_backward(dY.contiguous(), X, G, W, RSTD, *ctx.args)
            return dX, dG, dW, None, None, None, None

    return RMSNormGated


def _rope_function() -> type:
    import torch

    class Rope(torch.autograd.Function):
        """LigerRopeFunction (ops/rope.py): q and k rotated in place; saves cos and sin."""

        @staticmethod
        def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                    registers: Registers) -> tuple[torch.Tensor, torch.Tensor]:
            q, k, cos, sin = rope_forward(q, k, cos, sin, registers)
            ctx.registers = registers
            ctx.save_for_backward(cos, sin)
            return q, k

        @staticmethod
        def backward(ctx: Any, dq: torch.Tensor, dk: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
            cos, sin = ctx.saved_tensors
            dq, dk = rope_backward(dq, dk, cos, sin, ctx.registers)
            return dq, dk, None, None, None

    return Rope


def _glu_function(gelu: bool, doc: str) -> type:
    import torch

    class GLU(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, a: torch.Tensor, b: torch.Tensor, registers: Registers) -> torch.Tensor:
            a, b, c = glu_forward(a.contiguous(), b.contiguous(), gelu, registers)  # @ensure_contiguous
            ctx.registers = registers
            ctx.save_for_backward(a, b)
            return c

        @staticmethod
        def backward(ctx: Any, dc: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
            a, b = ctx.saved_tensors
            da, db = glu_backward(a, b, dc.contiguous(), gelu, ctx.registers)
            return da, db, None

    GLU.__name__ = GLU.__qualname__ = "GELUMul" if gelu else "SiLUMul"
    GLU.__doc__ = doc
    return GLU


def _cross_entropy_function() -> type:
    """LigerCrossEntropyFunction (ops/cross_entropy.py, ``cross_entropy_forward``), reduction mean
    or sum, no weight, label smoothing, z-loss or softcap (as ``nn.functional.cross_entropy``
    patched to ``liger_cross_entropy`` is called by transformers' loss): loss_1d [rows] in the
    logits' dtype, the non-ignored count (``target != ignore_index``, summed), the targets' range
    checks, then the kernel writes each row's gradient over the logits, which are saved; backward
    scales them in place by the incoming gradient (``element_mul_kernel``)."""
    import torch

    from autotune.workload.loss import IGNORE_INDEX, _cross_entropy_in_place

    class CrossEntropy(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, _input: torch.Tensor, target: torch.Tensor, reduction: str,
                    registers: Registers) -> torch.Tensor:
            loss_1d = torch.zeros(_input.shape[0], dtype=_input.dtype, device=_input.device)
            target_mask = target != IGNORE_INDEX
            # Liger takes .item() of the count, which a fake tensor cannot answer: it stays a
            # tensor (clamped: a batch without labels has loss 0, not 0 / 0).
            n_non_ignore = target_mask.sum()
            (target * target_mask).max(), (target * target_mask).min()  # its asserts' tensors
            if _input.stride(-1) != 1:
                _input = _input.contiguous()
            scale = n_non_ignore.clamp(min=1).float() if reduction == "mean" else torch.ones(
                (), device=_input.device)
            with registers():  # liger_cross_entropy_kernel: the gradient over the logits
                _cross_entropy_in_place(_input, target, loss_1d, scale)
            ctx.registers = registers
            ctx.save_for_backward(_input.detach())
            return torch.sum(loss_1d)

        @staticmethod
        def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
            # Liger skips the scaling when grad_output is 1.0 (torch.equal: data-dependent, which
            # fake tensors cannot answer); scaling in place by 1.0 allocates nothing either.
            (_input,) = ctx.saved_tensors
            with ctx.registers():
                _input.mul_(grad_output)
            return _input, None, None, None

    return CrossEntropy
