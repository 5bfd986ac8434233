"""Axolotl's fused LoRA kernels re-written in plain torch: Axolotl's outputs and gradients, Axolotl's memory.

Axolotl (axolotl-ai-cloud/axolotl, src/axolotl/kernels/lora.py) replaces PEFT's LoRA layers in an
MLP, an attention's q/k/v projections and its o projection by custom autograd Functions:
``LoRA_MLP``, ``LoRA_QKV`` (``LoRA_QK`` where v_proj is None), ``LoRA_O`` (and ``LoRA_Embedding``
for a LoRA embedding). Each computes base and adapter in one node and saves its own tensors for the
backward, not those PEFT's layers and transformers' modules save. Here each is written again line by
line, with the same torch calls in the same order, so that it allocates, saves and frees what Axolotl's does:

- ``matmul_lora`` (lora.py): ``X @ W + s * X_drop @ A.T @ B.T + b`` into the base matmul's output
  (``addmm_``), the LoRA weights cast to the input's dtype for it (``A.t().to(dtype)``);
- ``ctx.save_for_backward``: the tensors named beside each Function below, the LoRA weights saved as
  copies in the input's dtype (``A.to(dtype)``, "Pre-convert LoRA matrices to compute dtype");
- the backward's buffers: ``torch.empty_like`` per LoRA gradient filled by ``addmm_(..., beta=0)``,
  ``grad @ B`` computed once per projection and kept for the input's gradient;
- a 4-bit base dequantized by Axolotl's ``kernels/quantize.py dequantize`` for each use and freed
  after it: ``hooks.dequantize`` (the backend's: the estimator's allocates what Axolotl's does for
  its emulated 4-bit layer, backends/estimate/lora_kernels.py; a 16/32-bit weight is used as it is);
- the SwiGLU / GeGLU activation, Triton kernels in Axolotl (kernels/swiglu.py, kernels/geglu.py):
  the forward allocates its output with ``torch.empty`` and the kernel writes it; the backward
  writes h over the incoming gradient and the gate's and up's gradients over the saved gate and
  up, in place. Here their arithmetic runs inside ``hooks.registers()`` (the estimator: storages made
  there are not the caching allocator's, as a Triton kernel's registers are not) and is copied
  into those buffers.

The Functions are decorated in Axolotl with ``torch.amp.custom_fwd`` / ``custom_bwd`` (kernels/
utils.py): the forward runs under the caller's autocast, the backward under the same autocast
again. ``hooks.autocast()`` tells the forward's autocast dtype and how to re-enter it in the
backward (the estimator's CUDA autocast emulation).

Not emulated, refused before they run (workload/lora_kernels.py): DoRA (autotune models no DoRA),
PEFT's ``lora_bias`` (no Adapter has one). A base layer's bias is added (``out += b``) and gets no
gradient, as in Axolotl.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from autotune.errors import JobFails

Registers = Callable[[], AbstractContextManager[Any]]
# The forward's autocast dtype (None: none) and a context that re-enters it (custom_bwd).
Autocast = Callable[[], tuple["torch.dtype | None", Callable[[], AbstractContextManager[Any]]]]
RSQRT_2 = 0.7071067811865476  # tl.math.rsqrt(2.0), geglu.py
INV_SQRT_2PI = 0.3989422804014327  # 1/sqrt(2*pi), geglu.py _geglu_bwd_kernel


@dataclass(frozen=True)
class KernelHooks:
    """What the Functions need of the backend: ``dequantize(base_layer)`` the base weight [out, in]
    as Axolotl's ``dequantize(W, quant_state)`` makes it (a 16/32-bit weight itself), where the
    Triton kernels' ``registers`` are, and the forward's ``autocast``."""

    dequantize: Callable[[nn.Module], torch.Tensor]
    registers: Registers
    autocast: Autocast


class MixedDtypes(JobFails):
    """``_check_dtype``'s refusal (workload/lora_kernels.py adds why a model's activations are so)."""


def _check_dtype(X: torch.Tensor, autocast: torch.dtype | None) -> None:
    """Axolotl's ``out.addmm_(X @ A, B)`` mixes the autocast dtype of ``X @ A`` with ``B`` cast to
    X's dtype: CUDA's addmm_ refuses two dtypes, so the kernels run only where X is in the autocast
    dtype (Axolotl's weights in bf16/fp16 under bf16/fp16 autocast)."""
    if autocast is not None and X.dtype != autocast:
        raise MixedDtypes(f"Axolotl's fused LoRA kernels fail on {X.dtype} activations under {autocast} "
                          "autocast (matmul_lora's addmm_ of two dtypes); Axolotl runs them with the "
                          "weights in the autocast dtype")


def matmul_lora(X: torch.Tensor, weight: Callable[[], torch.Tensor], b: torch.Tensor | None,
                A: torch.Tensor | None, B: torch.Tensor | None, s: float,
                X_drop: torch.Tensor | None = None) -> torch.Tensor:
    """lora.py ``matmul_lora``: ``weight()`` is ``dequantize(W.t(), W_quant)`` (the matrix the base
    matmul reads, [in, out]), made here and dropped after the matmul (``del W``); the LoRA weights
    cast to X's dtype for ``out.addmm_(X_lora @ A, B, alpha=s)``; ``out += b``."""
    dtype = X.dtype
    W = weight()
    shape = None
    if X.dim() == 3:
        shape = X.shape[:2]
        X = X.view(-1, X.shape[-1])
        if X_drop is not None:
            X_drop = X_drop.view(-1, X_drop.shape[-1])
    out = torch.matmul(X, W)
    del W
    if A is not None and B is not None:
        X_lora = X_drop if X_drop is not None else X
        At, Bt = A.t().to(dtype), B.t().to(dtype)
        out.addmm_(X_lora @ At, Bt, alpha=s)
    if b is not None:
        out += b
    return out.view(*shape, -1) if shape is not None else out


def _bias(base: nn.Module) -> torch.Tensor | None:
    """get_lora_parameters' ``b``: the base layer's bias."""
    bias: torch.Tensor | None = getattr(base, "bias", None)
    return bias


def _transposed(hooks: KernelHooks, base: nn.Module) -> Callable[[], torch.Tensor]:
    """``dequantize(W.t(), quant)``: the base weight as [in, out] (a view of the [out, in] one)."""
    return lambda: hooks.dequantize(base).t()


# --- the activations: kernels/swiglu.py and kernels/geglu.py -------------------------------------


def glu_forward(glu: str, gate: torch.Tensor, up: torch.Tensor, registers: Registers) -> torch.Tensor:
    """``swiglu_forward`` / ``geglu_forward``: ``out = torch.empty((batch, seq_len, hidden_dim),
    gate's dtype)``, written by ``_swiglu_fwd_kernel`` (SiLU of the gate in float32) or
    ``_geglu_fwd_kernel`` (GELU's erf form in float32), cast to up's dtype, times up."""
    batch, seq_len, hidden_dim = gate.shape
    out = torch.empty((batch, seq_len, hidden_dim), dtype=gate.dtype, device=gate.device)
    with registers():
        g = gate.float()
        act = g * torch.sigmoid(g) if glu == "swiglu" else 0.5 * g * (torch.erf(RSQRT_2 * g) + 1.0)
        out.copy_(act.to(up.dtype) * up)
    return out


def glu_backward(glu: str, grad_output: torch.Tensor, gate: torch.Tensor, up: torch.Tensor,
                 registers: Registers) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``swiglu_backward`` / ``geglu_backward`` (``_swiglu_bwd_kernel`` / ``_geglu_bwd_kernel``), in
    place: h over ``grad_output``, the gate's gradient over ``gate``, up's over ``up``; returns them."""
    with registers():
        g = gate.float()
        if glu == "swiglu":
            sigmoid = torch.sigmoid(g)
            act = (sigmoid * g).to(grad_output.dtype)
            slope = sigmoid * (1.0 + g * (1.0 - sigmoid))
        else:
            partial = 0.5 * (torch.erf(RSQRT_2 * g) + 1.0)
            act = (partial * g).to(grad_output.dtype)
            slope = partial + INV_SQRT_2PI * g * torch.exp(-0.5 * g * g)
        h = act * up
        grad_up = grad_output * act
        grad_gate = ((grad_output * up).float() * slope).to(grad_output.dtype)
        grad_output.copy_(h)
        gate.copy_(grad_gate)
        up.copy_(grad_up)
    return grad_output, gate, up


# --- the LoRA gradients ---------------------------------------------------------------------------


def _lora_grads(X_lora_t: torch.Tensor, grad: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                s: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One projection's LoRA gradients as LoRA_QKV / LoRA_O compute them (A [r, in] and B [out, r]
    in the compute dtype): ``grad_B = grad @ B`` (kept, reused for the input's gradient), ``d_A =
    torch.empty_like(A.t())``, ``d_B = torch.empty_like(B.t())`` filled by ``addmm_(beta=0)``.
    Returns grad_B, d_A [in, r], d_B [r, out]."""
    grad_B = grad @ B
    d_A = torch.empty_like(A.t())
    d_B = torch.empty_like(B.t())
    d_A.addmm_(X_lora_t, grad_B, alpha=s, beta=0)
    d_B.addmm_(A @ X_lora_t, grad, alpha=s, beta=0)
    return grad_B, d_A, d_B


def _mlp_lora_grads(X_t: torch.Tensor, grad: torch.Tensor, A_t: torch.Tensor, B_t: torch.Tensor,
                    s: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """LoRA_MLP.backward's form of the same (A_t [in, r] and B_t [r, out], transposed saved weights):
    ``grad_B = grad @ B_t.t()``, ``d_A = torch.empty_like(A_t)``, ``d_B = torch.empty_like(B_t)``,
    ``d_B.addmm_(A_t.t() @ X.t(), grad)``."""
    grad_B = grad @ B_t.t()
    d_A = torch.empty_like(A_t)
    d_B = torch.empty_like(B_t)
    d_A.addmm_(X_t, grad_B, alpha=s, beta=0)
    d_B.addmm_(A_t.t() @ X_t, grad, alpha=s, beta=0)
    return grad_B, d_A, d_B


class LoRA_MLP(torch.autograd.Function):
    """lora.py ``LoRA_MLP`` without DoRA: gate and up by ``matmul_lora`` (dropout's ``X_drop`` on the
    LoRA path), the activation, down by ``matmul_lora`` (no dropout on its LoRA path).

    Saved (``ctx.save_for_backward``, the non-DoRA branch of ``LoRA_MLP.forward``): X; X_drop (X
    itself without dropout); gate and up, the projections' outputs [batch, seq, intermediate] in X's
    dtype (not the activation's output: the backward recomputes it); gate_A, gate_B, up_A, up_B,
    down_A, down_B as copies in X's dtype (``.to(dtype)``); the LoRA biases (None here).
    """

    @staticmethod
    def forward(ctx: Any, X: torch.Tensor, X_drop: torch.Tensor | None, gate_A: torch.Tensor,
                gate_B: torch.Tensor, up_A: torch.Tensor, up_B: torch.Tensor, down_A: torch.Tensor,
                down_B: torch.Tensor, bases: tuple[nn.Module, ...], scales: tuple[float, ...], glu: str,
                hooks: KernelHooks) -> torch.Tensor:
        autocast, ctx.autocast = hooks.autocast()  # torch_amp_custom_fwd
        _check_dtype(X, autocast)
        gate_base, up_base, down_base = bases
        gate_s, up_s, down_s = scales
        gate = matmul_lora(X, _transposed(hooks, gate_base), _bias(gate_base), gate_A, gate_B, gate_s, X_drop)
        up = matmul_lora(X, _transposed(hooks, up_base), _bias(up_base), up_A, up_B, up_s, X_drop)
        hidden = glu_forward(glu, gate, up, hooks.registers)
        output = matmul_lora(hidden, _transposed(hooks, down_base), _bias(down_base), down_A, down_B, down_s)
        dtype = X.dtype  # lora.py LoRA_MLP.forward, "Save for backward", the non-DoRA branch:
        ctx.save_for_backward(X, X_drop if X_drop is not None else X, gate, up,
                              gate_A.to(dtype), gate_B.to(dtype), up_A.to(dtype), up_B.to(dtype),
                              down_A.to(dtype), down_B.to(dtype))
        ctx.bases, ctx.scales, ctx.glu, ctx.hooks = bases, scales, glu, hooks
        ctx.has_dropout = X_drop is not None
        return output

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        with ctx.autocast():  # torch_amp_custom_bwd
            return _mlp_backward(ctx, grad_output)


def _mlp_backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
    """LoRA_MLP.backward without DoRA: down's input gradient by ``matmul_lora`` over the transposed
    weights, the activation's backward in place, the LoRA gradients (down, up, gate), then the
    input's: ``grad_up @ W_up``, ``addmm_(grad_gate, W_gate)``, the LoRA terms into it (or into
    ``torch.zeros_like(X_drop)`` with dropout)."""
    X, X_lora, gate, up, gate_A, gate_B, up_A, up_B, down_A, down_B = ctx.saved_tensors
    gate_base, up_base, down_base = ctx.bases
    gate_s, up_s, down_s = ctx.scales
    hooks: KernelHooks = ctx.hooks
    gate_A_t, gate_B_t, up_A_t, up_B_t = gate_A.t(), gate_B.t(), up_A.t(), up_B.t()
    down_A_t, down_B_t = down_A.t(), down_B.t()
    batch, seq_len, hd = X.shape
    grad_output = grad_output.view(-1, grad_output.shape[-1])
    X_lora = X_lora.view(-1, X_lora.shape[-1])
    gate, up = gate.view(-1, gate.shape[-1]), up.view(-1, up.shape[-1])
    grad_down = matmul_lora(grad_output, lambda: hooks.dequantize(down_base), None, down_B_t, down_A_t,
                            down_s)
    h, grad_gate, grad_up = glu_backward(ctx.glu, grad_down, gate, up, hooks.registers)
    # grad_B_down is kept to the end, as Axolotl's local is
    grad_B_down, d_down_A, d_down_B = _mlp_lora_grads(h.t(), grad_output, down_A_t, down_B_t, down_s)
    grad_B_up, d_up_A, d_up_B = _mlp_lora_grads(X_lora.t(), grad_up, up_A_t, up_B_t, up_s)
    grad_B_gate, d_gate_A, d_gate_B = _mlp_lora_grads(X_lora.t(), grad_gate, gate_A_t, gate_B_t, gate_s)
    dX = dX_drop = None
    if ctx.needs_input_grad[0]:
        up_weight = hooks.dequantize(up_base).t()  # dequantize(up_weight.t(), up_quant)
        dX = torch.matmul(grad_up, up_weight.t())
        del up_weight
        gate_weight = hooks.dequantize(gate_base)
        dX.addmm_(grad_gate, gate_weight)
        del gate_weight
        into = dX
        if ctx.has_dropout:
            into = dX_drop = torch.zeros_like(X_lora)
        into.addmm_(grad_B_up, up_A_t.t(), alpha=up_s)
        into.addmm_(grad_B_gate, gate_A_t.t(), alpha=gate_s)
        dX_drop = None if dX_drop is None else dX_drop.view(batch, seq_len, hd)
        dX = dX.view(batch, seq_len, hd)
    return (dX, dX_drop, d_gate_A.t(), d_gate_B.t(), d_up_A.t(), d_up_B.t(), d_down_A.t(), d_down_B.t(),
            None, None, None, None)


class LoRA_QKV(torch.autograd.Function):
    """lora.py ``LoRA_QKV`` without DoRA: Q, K and V by ``matmul_lora`` from one input.

    Saved (the non-DoRA branch of ``LoRA_QKV.forward``): X; X_drop (X itself without dropout);
    q_A, q_B, k_A, k_B, v_A, v_B as copies in X's dtype; the LoRA biases (None here). Not Q, K, V.
    """

    @staticmethod
    def forward(ctx: Any, X: torch.Tensor, X_drop: torch.Tensor | None, q_A: torch.Tensor,
                q_B: torch.Tensor, k_A: torch.Tensor, k_B: torch.Tensor, v_A: torch.Tensor,
                v_B: torch.Tensor, bases: tuple[nn.Module, ...], scales: tuple[float, ...],
                hooks: KernelHooks) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        Q, K, V = _projections_forward(ctx, X, X_drop, ((q_A, q_B), (k_A, k_B), (v_A, v_B)), bases, scales,
                                       hooks)
        return Q, K, V

    @staticmethod
    def backward(ctx: Any, q_grad: torch.Tensor, k_grad: torch.Tensor,
                 v_grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        with ctx.autocast():
            # LoRA_QKV.backward: ``q_grad.view``, ``k_grad.reshape``, ``v_grad.view``
            grads = (q_grad.view(-1, q_grad.shape[-1]), k_grad.reshape(-1, k_grad.shape[-1]),
                     v_grad.view(-1, v_grad.shape[-1]))
            return _qkv_backward(ctx, grads)


class LoRA_QK(torch.autograd.Function):
    """lora.py ``LoRA_QK`` without DoRA, for an attention whose v_proj is None (Gemma 4's
    attention_k_eq_v layers): Q and K by ``matmul_lora`` from one input; ``apply_lora_qk`` returns
    (Q, K, K), so autograd sums the key's and the value's gradients into K's before its backward.

    Saved (the non-DoRA branch of ``LoRA_QK.forward``): X; X_drop (X itself without dropout);
    q_A, q_B, k_A, k_B as copies in X's dtype; the LoRA biases (None here). Its backward is
    LoRA_QKV's over two projections (``q_grad.view``, ``k_grad.reshape``).
    """

    @staticmethod
    def forward(ctx: Any, X: torch.Tensor, X_drop: torch.Tensor | None, q_A: torch.Tensor,
                q_B: torch.Tensor, k_A: torch.Tensor, k_B: torch.Tensor, bases: tuple[nn.Module, ...],
                scales: tuple[float, ...], hooks: KernelHooks) -> tuple[torch.Tensor, torch.Tensor]:
        Q, K = _projections_forward(ctx, X, X_drop, ((q_A, q_B), (k_A, k_B)), bases, scales, hooks)
        return Q, K

    @staticmethod
    def backward(ctx: Any, q_grad: torch.Tensor, k_grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        with ctx.autocast():
            # LoRA_QK.backward: ``q_grad.view``, ``k_grad.reshape``
            return _qkv_backward(ctx, (q_grad.view(-1, q_grad.shape[-1]),
                                       k_grad.reshape(-1, k_grad.shape[-1])))


def _projections_forward(ctx: Any, X: torch.Tensor, X_drop: torch.Tensor | None,
                         loras: tuple[tuple[torch.Tensor, torch.Tensor], ...], bases: tuple[nn.Module, ...],
                         scales: tuple[float, ...], hooks: KernelHooks) -> tuple[torch.Tensor, ...]:
    """LoRA_QKV.forward / LoRA_QK.forward without DoRA: each projection by ``matmul_lora`` in turn,
    then ``ctx.save_for_backward(X, X_drop or X, *(A.to(dtype), B.to(dtype)) each)``."""
    autocast, ctx.autocast = hooks.autocast()
    _check_dtype(X, autocast)
    outputs = tuple(matmul_lora(X, _transposed(hooks, base), _bias(base), A, B, s, X_drop)
                    for base, (A, B), s in zip(bases, loras, scales, strict=True))
    dtype = X.dtype  # lora.py LoRA_QKV.forward, "Pre-convert LoRA matrices to compute dtype":
    ctx.save_for_backward(X, X_drop if X_drop is not None else X,
                          *(tensor.to(dtype) for A, B in loras for tensor in (A, B)))
    ctx.bases, ctx.scales, ctx.hooks = bases, scales, hooks
    ctx.has_dropout = X_drop is not None
    return outputs


def _qkv_backward(ctx: Any, grads: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor | None, ...]:
    """LoRA_QKV.backward (LoRA_QK.backward) without DoRA, ``grads`` [tokens, out] each: the LoRA
    gradients of each projection (``grad @ B`` kept), then ``grad_X = torch.mm(q_grad, W_q)`` and
    ``addmm_`` of the others', each weight dequantized for it alone, then the LoRA terms into grad_X
    (or into ``torch.zeros_like(X_drop)`` with dropout)."""
    X, X_lora, *lora_weights = ctx.saved_tensors
    hooks: KernelHooks = ctx.hooks
    batch, seq_len = X.shape[:2]
    X_lora = X_lora.view(-1, X_lora.shape[-1])
    X_lora_t = X_lora.t()
    weights = tuple(zip(lora_weights[0::2], lora_weights[1::2], strict=True))
    found = [_lora_grads(X_lora_t, grad, A, B, s)
             for grad, (A, B), s in zip(grads, weights, ctx.scales, strict=True)]
    grad_X: torch.Tensor | None = None
    for grad, base in zip(grads, ctx.bases, strict=True):
        weight = hooks.dequantize(base)  # dequantize(q_weight, q_quant): [out, in]
        if grad_X is None:
            grad_X = torch.mm(grad, weight)
        else:
            grad_X.addmm_(grad, weight)
        del weight
    assert grad_X is not None
    grad_X_drop = torch.zeros_like(X_lora) if ctx.has_dropout else None
    into = grad_X if grad_X_drop is None else grad_X_drop
    for (grad_B, _, _), (A, _), s in zip(found, weights, ctx.scales, strict=True):
        into.addmm_(grad_B, A, alpha=s)
    lora = [tensor.t() for _, d_A, d_B in found for tensor in (d_A, d_B)]
    grad_X = grad_X.view(batch, seq_len, -1)
    if grad_X_drop is not None:
        grad_X_drop = grad_X_drop.view(batch, seq_len, -1)
    return (grad_X, grad_X_drop, *lora, None, None, None)


class LoRA_O(torch.autograd.Function):
    """lora.py ``LoRA_O`` without DoRA: one projection by ``matmul_lora``.

    Saved (the non-DoRA branch of ``LoRA_O.forward``): A and B as copies in X's dtype; X; X_drop
    (X itself without dropout); the LoRA bias (None here).
    """

    @staticmethod
    def forward(ctx: Any, X: torch.Tensor, X_drop: torch.Tensor | None, A: torch.Tensor, B: torch.Tensor,
                base: nn.Module, s: float, hooks: KernelHooks) -> torch.Tensor:
        autocast, ctx.autocast = hooks.autocast()
        _check_dtype(X, autocast)
        XW = matmul_lora(X, _transposed(hooks, base), _bias(base), A, B, s, X_drop)
        dtype = X.dtype  # lora.py LoRA_O.forward, the non-DoRA branch:
        ctx.save_for_backward(A.to(dtype), B.to(dtype), X, X_drop if X_drop is not None else X)
        ctx.base, ctx.s, ctx.hooks = base, s, hooks
        ctx.has_dropout = X_drop is not None
        return XW

    @staticmethod
    def backward(ctx: Any, dY: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        with ctx.autocast():
            return _o_backward(ctx, dY)


def _o_backward(ctx: Any, dY: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
    """LoRA_O.backward without DoRA: the LoRA gradients, ``dX = dY @ W`` (the weight dequantized
    for it), the LoRA term into dX, or ``(grad_B @ A * s)`` for X_drop with dropout."""
    A, B, X, X_lora = ctx.saved_tensors
    hooks: KernelHooks = ctx.hooks
    s = ctx.s
    batch, seq_len, hd = X.shape
    dY = dY.reshape(-1, dY.shape[-1])
    X_lora = X_lora.reshape(-1, X_lora.shape[-1])
    grad_B, d_A, d_B = _lora_grads(X_lora.t(), dY, A, B, s)
    W_deq = hooks.dequantize(ctx.base).t()  # dequantize(W.t(), W_quant)
    dX = dY @ W_deq.t()
    del W_deq
    dX_drop = None
    if ctx.has_dropout:
        dX_drop = (grad_B @ A * s).view(batch, seq_len, hd)
    else:
        dX.addmm_(grad_B, A, alpha=s)
    return dX.view(batch, seq_len, hd), dX_drop, d_A.t(), d_B.t(), None, None, None


class LoRA_Embedding(torch.autograd.Function):
    """lora.py ``LoRA_Embedding`` without DoRA: ``F.embedding(x, W) + s * F.embedding(x, A.T) @ B.T``.

    Saved (``ctx.save_for_backward(x, A.to(dtype), B.to(dtype), after_A)``, dtype the base weight's):
    the token ids; A and B in the base weight's dtype; ``after_A`` [batch, seq, r] in A's dtype.
    """

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, W: torch.Tensor, A: torch.Tensor, B: torch.Tensor, s: float,
                base: nn.Embedding, hooks: KernelHooks) -> torch.Tensor:
        autocast, ctx.autocast = hooks.autocast()
        if autocast is not None:
            # Its backward's ``s * grad @ B`` is a matmul autocast runs in 16 bits, and
            # ``index_add_`` of it into A's float32 gradient refuses two dtypes.
            raise JobFails(f"Axolotl's LoRA_Embedding kernel fails in its backward under {autocast} "
                           "autocast (index_add_ of the 16-bit gradient autocast's matmul makes into "
                           "lora_embedding_A's float32 one): set lora_embedding_kernel: false")
        options: dict[str, Any] = {
            "padding_idx": base.padding_idx, "max_norm": base.max_norm, "norm_type": base.norm_type,
            "scale_grad_by_freq": base.scale_grad_by_freq, "sparse": base.sparse}
        dtype = W.dtype
        result = F.embedding(x, W, **options)
        after_A = F.embedding(x, A.t(), **options)  # [batch, seq, rank]
        lora_result = after_A @ B.t()
        result = result + s * lora_result
        ctx.save_for_backward(x, A.to(dtype), B.to(dtype), after_A)  # lora.py LoRA_Embedding.forward
        ctx.s, ctx.padding_idx, ctx.scale_grad_by_freq = s, base.padding_idx, base.scale_grad_by_freq
        return result

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        with ctx.autocast():
            return _embedding_backward(ctx, grad_output)


def _embedding_backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
    """LoRA_Embedding.backward without DoRA, in float32 ("LoRA params are fp32"): B's gradient
    into ``torch.empty_like(B.t())``, A's by ``index_add_`` into ``torch.zeros_like(A.t())``."""
    x, A, B, after_A = ctx.saved_tensors
    s = ctx.s
    compute_dtype = torch.float32
    after_A_flat = after_A.view(-1, after_A.shape[-1]).to(compute_dtype)
    grad_flat = grad_output.view(-1, grad_output.shape[-1]).to(compute_dtype)
    B_f = B.to(compute_dtype)
    d_B_T = torch.empty_like(B_f.t())
    d_B_T.addmm_(after_A_flat.t(), grad_flat, alpha=s, beta=0)
    d_after_A = s * grad_flat @ B_f
    x_flat = x.view(-1)
    if ctx.padding_idx is not None:
        pad_mask = x_flat != ctx.padding_idx
        d_after_A = d_after_A * pad_mask.unsqueeze(1).to(d_after_A.dtype)
    if ctx.scale_grad_by_freq:
        counts = torch.bincount(x_flat, minlength=A.shape[1]).clamp(min=1)
        d_after_A = d_after_A * (1.0 / counts[x_flat].unsqueeze(1).to(d_after_A.dtype))
    A_f = A.to(compute_dtype)
    d_A_T = torch.zeros_like(A_f.t())
    d_A_T.index_add_(0, x_flat, d_after_A)
    return None, None, d_A_T.t(), d_B_T.t(), None, None, None
