"""flash-linear-attention's ``chunk_gated_delta_rule``, emulated: its outputs and gradients, its memory.

Qwen3.5 and Qwen3-Next run Gated DeltaNet linear attention in three of every four layers. transformers
(modeling_qwen3_5.py, modeling_qwen3_5_moe.py, modeling_qwen3_next.py) decorates its torch fallback
``torch_chunk_gated_delta_rule`` with ``use_kernel_func_from_hub_with_fallback("chunk_gated_delta_rule",
"fla")`` (integrations/hub_kernels.py): where ``fla.ops.gated_delta_rule.chunk_gated_delta_rule``
imports, that Triton kernel runs instead; without it packed rows raise ("can't keep packed sequences
apart"). Axolotl's Qwen3.5 and Qwen3-Next examples install it (examples/qwen3.5/README.md,
examples/qwen3-next/README.md: ``uv pip uninstall causal-conv1d && uv pip install
flash-linear-attention==0.4.1``, "FLA is required when sample_packing: true"), so a GPU user of them
runs fla's kernel, emulated here from fla v0.4.1's source (fla-org/flash-linear-attention,
fla/ops/gated_delta_rule/chunk.py ``ChunkGatedDeltaRuleFunction``) as liger_kernels.py emulates Liger:

- what fla's Python wrappers allocate with torch (``torch.empty``/``zeros_like``/``new_empty``, the
  ``input_guard`` decorator's ``.contiguous()`` copies, ``dg.sum(0)``) and what it saves for backward,
  made with the same calls, of the same shapes and dtypes, in fla's order (each cited beside it);
- what the Triton kernels compute in registers is done by torch temporaries inside ``registers()``
  (the estimator's: outside the caching allocator; on a CPU none) and written into fla's buffers:
  the chunked WY form of the delta rule (``_chunked``), and the gradients by autograd through it.

fla v0.4.1's kernels take one head count for q, k and v (chunk_scaled_dot_kkt_fwd: ``B, T, H, K =
k.shape`` indexes beta by H), so the queries and keys are repeated to the value heads first, as
Axolotl's packing patch does before it calls fla (monkeypatch/models/qwen3_5/modeling.py:
``query.repeat_interleave(self.num_v_heads // self.num_k_heads, dim=2)``). The short convolution
before it stays transformers' torch path (causal-conv1d uninstalled, as the READMEs say).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from contextlib import AbstractContextManager
from types import MethodType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

Registers = Callable[[], AbstractContextManager[Any]]
NAME = "flash-linear-attention 0.4.1's chunk_gated_delta_rule (emulated)"
CHUNK = 64  # BT: chunk_gated_delta_rule_fwd's chunk_local_cumsum(g, chunk_size=64); bwd's BT = 64
# chunk_bwd_dqkwg: BK = min(max(next_power_of_2(K), 16), CONST_TILING), CONST_TILING 64 where
# check_shared_mem() (Ampere and Hopper's shared memory), the per-key-block partial dg [NK, B, T, H].
CONST_TILING = 64
# The modeling modules whose GatedDeltaNet calls torch_chunk_gated_delta_rule, by model type.
MODELING = {
    "qwen3_5": "qwen3_5", "qwen3_5_text": "qwen3_5",
    "qwen3_5_moe": "qwen3_5_moe", "qwen3_5_moe_text": "qwen3_5_moe",
    "qwen3_next": "qwen3_next",
}
NOTE = (f"{NAME}: the linear-attention layers' kernel, as Axolotl's examples install it "
        "(examples/qwen3.5/README.md); its buffers from fla's source, its arithmetic outside the allocator")


def _chunks(x: torch.Tensor, nt: int) -> torch.Tensor:
    """[B, T, H, *D] -> [B, H, NT, BT, *D], float32, the sequence zero-padded to NT chunks."""
    import torch.nn.functional as F

    pad = nt * CHUNK - x.shape[1]
    x = x.float().movedim(1, -1)  # [B, H, *D, T]
    x = F.pad(x, (0, pad)).unflatten(-1, (nt, CHUNK)).movedim(-2, 2)  # [B, H, NT, *D, BT]
    return x.movedim(-1, 3)


def _unchunk(x: torch.Tensor, t: int) -> torch.Tensor:
    """[B, H, NT, BT, *D] -> [B, T, H, *D] (the padding dropped)."""
    return x.flatten(2, 3)[:, :, :t].movedim(2, 1)


def _chunked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g_cum: torch.Tensor, beta: torch.Tensor,
             scale: float) -> dict[str, torch.Tensor]:
    """The gated delta rule in fla's chunked WY form (q, k normalized; g_cum the chunk-local cumsum of
    the gates), float32: A (chunk_scaled_dot_kkt_fwd, strictly lower), Ai = (I + A)^-1 (solve_tril),
    w, u (recompute_w_u_fwd), h and v_new (chunk_gated_delta_rule_fwd_h), o (chunk_fwd_o)."""
    import torch

    t, nt = q.shape[1], -(-q.shape[1] // CHUNK)
    qc, kc, vc = _chunks(q, nt), _chunks(k, nt), _chunks(v, nt)
    gc, bc = _chunks(g_cum, nt), _chunks(beta, nt)  # [B, H, NT, BT]
    rows = torch.arange(CHUNK, device=q.device)
    lower = rows.unsqueeze(1) > rows.unsqueeze(0)
    # exp(g_i - g_j) for j <= i only, as the kernels compute it: above the diagonal the exponent is
    # positive and may overflow, and inf masked to 0 has a NaN gradient.
    diff = gc.unsqueeze(-1) - gc.unsqueeze(-2)
    decay = torch.where(rows.unsqueeze(1) >= rows.unsqueeze(0), diff, float("-inf")).exp()
    A = torch.where(lower, (kc @ kc.transpose(-1, -2)) * decay * bc.unsqueeze(-1), 0.0)
    eye = torch.eye(CHUNK, device=q.device).expand_as(A)
    Ai = torch.linalg.solve_triangular(eye + A, eye, upper=False, unitriangular=True)
    w = Ai @ (kc * (bc * gc.exp()).unsqueeze(-1))
    u = Ai @ (vc * bc.unsqueeze(-1))
    causal = torch.where(rows.unsqueeze(1) >= rows.unsqueeze(0), (qc @ kc.transpose(-1, -2)) * decay, 0.0)
    state = q.new_zeros(*qc.shape[:2], q.shape[-1], v.shape[-1], dtype=torch.float32)
    hs, news, outs = [], [], []
    for c in range(nt):  # chunk_gated_delta_rule_fwd_h's loop over chunks; chunk_fwd_o per chunk
        hs.append(state)
        v_new = u[:, :, c] - w[:, :, c] @ state
        news.append(v_new)
        decayed_q = qc[:, :, c] * gc[:, :, c].exp().unsqueeze(-1)
        outs.append(scale * (decayed_q @ state + causal[:, :, c] @ v_new))
        last = gc[:, :, c, -1:]
        state = state * last.exp().unsqueeze(-1) + \
            (kc[:, :, c] * (last - gc[:, :, c]).exp().unsqueeze(-1)).transpose(-1, -2) @ v_new
    return {"A": _unchunk(A, t), "Ai": _unchunk(Ai, t), "w": _unchunk(w, t), "u": _unchunk(u, t),
            "h": torch.stack(hs, 1), "v_new": _unchunk(torch.stack(news, 2), t),
            "o": _unchunk(torch.stack(outs, 2), t)}


def _local_cumsum(g: torch.Tensor, reverse: bool) -> torch.Tensor:
    """chunk_local_cumsum (fla/ops/utils/cumsum.py) of [B, T, H] within each chunk of CHUNK, float32."""
    nt = -(-g.shape[1] // CHUNK)
    gc = _chunks(g, nt)
    summed = gc.flip(-1).cumsum(-1).flip(-1) if reverse else gc.cumsum(-1)
    return _unchunk(summed, g.shape[1])


def _l2norm_fwd(x: torch.Tensor, registers: Registers) -> tuple[torch.Tensor, torch.Tensor]:
    """fla/modules/l2norm.py ``l2norm_fwd``: y = torch.empty_like(x) [T, D] in x's dtype and rstd
    [T] float32 (torch.empty), T the rows of x.view(-1, D)."""
    import torch

    x2 = x.view(-1, x.shape[-1])
    y = torch.empty_like(x2)
    rstd = torch.empty((x2.shape[0],), dtype=torch.float32, device=x.device)
    with registers():
        xf = x2.float()
        r = torch.rsqrt(torch.bmm(xf.unsqueeze(1), xf.unsqueeze(2)).view(-1) + 1e-6)
        rstd.copy_(r)
        y.copy_(xf * r.unsqueeze(1))
    return y.view(x.shape), rstd.view(x.shape[:-1])


def _l2norm_bwd(y: torch.Tensor, rstd: torch.Tensor, dy: torch.Tensor, registers: Registers) -> torch.Tensor:
    """``l2norm_bwd``: dx = torch.empty_like(y) [T, D]; dx = rstd * (dy - y * <dy, y>)."""
    import torch

    y2, dy2 = y.view(-1, y.shape[-1]), dy.reshape(-1, y.shape[-1])
    dx = torch.empty_like(y2)
    with registers():
        yf, dyf = y2.float(), dy2.float()
        dot = torch.bmm(dyf.unsqueeze(1), yf.unsqueeze(2)).view(-1, 1)
        dx.copy_(rstd.reshape(-1, 1) * (dyf - yf * dot))
    return dx.view(y.shape)


def holds_values(x: torch.Tensor) -> bool:
    """Whether ``x`` holds numbers for the kernels' arithmetic: not a fake tensor (the estimator's) or
    a meta one. On those the arithmetic computes nothing, and made inside ``registers`` (outside the
    caching allocator) it leaves no allocation either, so it is skipped: the chunked form is one op
    per chunk and step, thousands of fake dispatches a layer at 2048 tokens (issue #34), the same
    buffers allocated either way (tests/autotune/workload/test_gated_delta_rule.py)."""
    from torch._subclasses.fake_tensor import is_fake

    return not is_fake(x) and x.device.type != "meta"


@functools.cache
def function() -> type:
    """``ChunkGatedDeltaRuleFunction`` (fla v0.4.1 chunk.py) with use_qk_l2norm_in_kernel, no
    initial state: its forward's and backward's buffers, the arithmetic inside ``registers``."""
    import torch

    class ChunkGatedDeltaRule(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                    beta: torch.Tensor, scale: float, registers: Registers) -> torch.Tensor:
            q, k, v, g, beta = (x.contiguous() for x in (q, k, v, g, beta))  # @input_guard
            q, q_rstd = _l2norm_fwd(q, registers)  # use_qk_l2norm_in_kernel
            k, k_rstd = _l2norm_fwd(k, registers)
            B, T, H, K = (int(n) for n in k.shape)
            V, nt = int(v.shape[-1]), -(-T // CHUNK)
            # chunk_local_cumsum: torch.empty_like(g, dtype=torch.float) (output_dtype's default)
            g_cum = torch.empty_like(g, dtype=torch.float32)
            A = torch.empty(B, T, H, CHUNK, device=k.device, dtype=torch.float32)  # chunk_scaled_dot_kkt_fwd
            Ai = torch.zeros_like(A, dtype=k.dtype)  # solve_tril(output_dtype=k.dtype)
            w, u = torch.empty_like(k), torch.empty_like(v)  # recompute_w_u_fwd
            h = k.new_empty(B, nt, H, K, V)  # chunk_gated_delta_rule_fwd_h (final_state: not asked)
            v_new = torch.empty_like(u)
            o = torch.empty_like(v)  # chunk_fwd_o
            with registers():
                if holds_values(k):
                    g_cum.copy_(_local_cumsum(g, reverse=False))
                    parts = _chunked(q, k, v, g_cum, beta, scale)
                    for buffer, name in ((A, "A"), (Ai, "Ai"), (w, "w"), (u, "u"), (h, "h"),
                                         (v_new, "v_new"), (o, "o")):
                        buffer.copy_(parts[name])
            ctx.save_for_backward(q, q_rstd, k, k_rstd, v, g_cum, beta, Ai)
            ctx.scale, ctx.registers, ctx.g_dtype = scale, registers, g.dtype
            return o  # o.to(q.dtype): o is v's dtype, q's

        @staticmethod
        def backward(ctx: Any, do: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
            q, q_rstd, k, k_rstd, v, g_cum, beta, Ai = ctx.saved_tensors
            registers = ctx.registers
            do = do.contiguous()  # @input_guard
            B, T, H, K = (int(n) for n in k.shape)
            V, nt = int(v.shape[-1]), -(-T // CHUNK)
            nk = -(-K // min(max(1 << (K - 1).bit_length(), 16), CONST_TILING))
            w, u = torch.empty_like(k), torch.empty_like(v)  # recompute_w_u_fwd
            h, v_new = k.new_empty(B, nt, H, K, V), torch.empty_like(u)  # chunk_gated_delta_rule_fwd_h
            dv = torch.empty_like(do)  # chunk_bwd_dv_local
            # chunk_gated_delta_rule_bwd_dhu: dh, dv2, written by its kernel
            held: tuple[torch.Tensor, ...] = (q.new_empty(B, nt, H, K, V), torch.empty_like(dv))
            dq, dk = torch.empty_like(q), torch.empty_like(k)  # chunk_bwd_dqkwg
            dg = torch.empty(nk, *g_cum.shape, dtype=torch.float32, device=g_cum.device)
            held += (torch.empty_like(w),)  # dw
            values = holds_values(k)
            with registers(), torch.enable_grad():
                dg.zero_()
                if values:
                    leaves = [x.detach().float().requires_grad_() for x in (q, k, v, g_cum, beta)]
                    parts = _chunked(leaves[0], leaves[1], leaves[2], leaves[3], leaves[4], ctx.scale)
                    for buffer, name in ((w, "w"), (u, "u"), (h, "h"), (v_new, "v_new")):
                        buffer.copy_(parts[name])
                    grads = torch.autograd.grad(parts["o"], leaves, do.float())
                    dq.copy_(grads[0])
                    dk.copy_(grads[1])
                    dg[0].copy_(grads[3])
            dg = dg.sum(0)  # chunk_bwd_dqkwg, in torch
            dk2, dv3 = torch.empty_like(k), torch.empty_like(v)  # prepare_wy_repr_bwd
            dg2, db = torch.empty_like(g_cum), torch.empty_like(beta)
            with registers():  # the whole gradients are in dq, dk, dg; dk2 and dg2 add nothing
                dk2.zero_()
                dg2.zero_()
                if values:
                    dv3.copy_(grads[2])
                    db.copy_(grads[4])
            dk.add_(dk2)
            dg.add_(dg2)
            del held, dk2, dg2
            dg_out = torch.empty_like(dg)  # chunk_local_cumsum(dg, reverse=True)
            with registers():
                dg_out.copy_(_local_cumsum(dg, reverse=True))
            dq = _l2norm_bwd(q, q_rstd, dq, registers)
            dk = _l2norm_bwd(k, k_rstd, dk, registers)
            return dq, dk, dv3, dg_out.to(ctx.g_dtype), db, None, None

    return ChunkGatedDeltaRule


def chunk_gated_delta_rule(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, g: torch.Tensor,
                           beta: torch.Tensor, chunk_size: int = CHUNK, initial_state: Any = None,
                           output_final_state: bool = False, use_qk_l2norm_in_kernel: bool = False,
                           registers: Registers = contextlib.nullcontext, **kwargs: Any) -> tuple[Any, Any]:
    """What transformers' GatedDeltaNet calls in place of ``torch_chunk_gated_delta_rule`` where fla
    is installed (same arguments): fla's ``chunk_gated_delta_rule`` (scale k.shape[-1] ** -0.5), the
    queries and keys first repeated to the value heads (module docstring)."""
    if initial_state is not None or not use_qk_l2norm_in_kernel:
        raise NotImplementedError("emulated for training: no initial state, q/k L2-normalized in the kernel")
    if kwargs.get("cu_seqlens") is not None:
        raise NotImplementedError("packed rows (cu_seqlens) are not emulated")
    repeats = value.shape[2] // key.shape[2]
    if repeats > 1:
        query, key = query.repeat_interleave(repeats, dim=2), key.repeat_interleave(repeats, dim=2)
    fla: Any = function()
    o = fla.apply(query, key, value, g, beta, key.shape[-1] ** -0.5, registers)
    if not output_final_state:
        return o, None
    # chunk_gated_delta_rule_fwd_h: final_state = k.new_empty(N, H, K, V, dtype=torch.float32), written
    # by its kernel; asked for where a cache is kept (transformers: output_final_state=cache is not None).
    import torch

    B, _, H, K = key.shape
    final_state = key.new_empty(B, H, K, value.shape[-1], dtype=torch.float32)
    with registers():
        final_state.zero_()  # the state's values feed no gradient: a cache entry
    return o, final_state


def apply(model: Any, registers: Registers) -> int:
    """Every GatedDeltaNet of ``model`` calls the emulation instead of the torch fallback: its forward
    rebuilt reading ``torch_chunk_gated_delta_rule`` as the emulation (liger.py ``_reading``); the
    number of layers patched."""
    from autotune.workload.liger import _reading

    stand_in = functools.partial(chunk_gated_delta_rule, registers=registers)
    patched = 0
    for module in model.modules():
        cls = type(module)
        family = cls.__module__.rsplit(".", 2)[-2]
        if not cls.__name__.endswith("GatedDeltaNet") or family not in MODELING.values():
            continue
        forward = _reading(cls.forward, "torch_chunk_gated_delta_rule", stand_in)
        module.forward = MethodType(forward, module)
        patched += 1
    return patched


def hybrid(model_type: str | None) -> bool:
    """Whether a model type has Gated DeltaNet layers whose kernel this emulates."""
    return model_type in MODELING
