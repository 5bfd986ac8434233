"""Axolotl's ScatterMoE experts, emulated: their outputs and gradients, their memory.

Axolotl's KernelsPlugin with ``use_scattermoe: true`` (integrations/kernels/plugin.py
``pre_model_load``) registers ``scattermoe_experts_forward`` in transformers' ExpertsInterface and
sets ``experts_implementation: scattermoe``, so every experts module of a mixture (Qwen3MoeExperts,
Qwen3_5MoeExperts, Qwen3NextExperts, Gemma4TextExperts: ``self.experts(hidden_states, top_k_index,
top_k_weights)``)
runs Axolotl's vendored ScatterMoE Triton kernels (integrations/kernels/libs/scattermoe_lora/)
instead of transformers' grouped_mm. Emulated here from that source as liger_kernels.py emulates
Liger: what the Python wrappers allocate with torch, and what ``ParallelLinear`` saves for backward,
made with the same calls, shapes and dtypes, in its order (each cited beside it); what the Triton
kernels compute in registers is done by torch temporaries inside ``registers()`` (the estimator's:
outside the caching allocator) and written into those buffers.

Emulated: experts in the model's weights (``_prepare_weights_and_lora``: the parameters transposed,
no copy) and bitsandbytes 4-bit experts (``quantize_moe_experts``) on the default ``moe_bnb_fast``
path (runtime.py: ``bnb_fast`` True unless set), whose ``selective_expert_weights`` dequantizes the
routed experts' blocks to a new tensor per projection (selective_dequant.py ``_selective_dequant_bnb4``:
the nested absmax in float32, then ``selective_dequant_nf4_triton``'s output). Which experts a batch
routes to is data: every expert is taken as routed (``get_active_experts``), the bound a batch of
more routings than experts reaches in practice. The chunked bitsandbytes path is not emulated.

LoRA on the experts (PEFT's target_parameters: a ParamWrapper chain around the experts module) runs
as Axolotl runs it (``register_scattermoe_experts`` patches ``ParamWrapper.forward``:
experts_lora_fastpath.py): PEFT's merge of the delta into the weight is bypassed, each wrapper's
LoRA A and B cast to the activations' dtype and B laid out expert-major (layers.py
``peft_lora_B_to_scattermoe``: a copy) are handed to the experts, whose projections then run
``parallel_linear_lora`` (parallel_linear_lora.py ``ScatterMoELoRA``, emulated by ``lora_function``:
its outputs, saved tensors and backward workspaces; the base weight frozen, no gradient for it).
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
NAME = "Axolotl's ScatterMoE experts (KernelsPlugin use_scattermoe, emulated)"
SCATTERMOE = "scattermoe"  # transformers' experts_implementation name Axolotl registers
EXPERTS_KERNELS = (SCATTERMOE, "ktransformers")  # the values of Workload.experts_kernel (ktransformers.py)
# The experts classes whose layout scattermoe_experts_forward takes (experts.py
# scattermoe_supports_layout: gate_up_proj [E, 2I, H], down_proj [E, H, I], no biases), and the
# model types whose experts they are (transformers' modeling_qwen3_moe, modeling_qwen3_5_moe,
# modeling_qwen3_next, modeling_minimax_m2: MiniMaxM2Experts is Qwen3MoeExperts' class line for line,
# decorated use_experts_implementation; Axolotl's kernels README lists minimax_m2 for ScatterMoE).
# Gemma 4's (modeling_gemma4.py Gemma4TextExperts, at 5.14.1, Axolotl's pin, as at the venv's: the same
# [E, 2I, H] and [E, H, I] parameters, no bias, act_fn gelu_pytorch_tanh; routed beside the dense MLP by
# Gemma4TextDecoderLayer, self.experts(hidden_states_2, top_k_index, top_k_weights)) takes the standard
# path of scattermoe_experts_forward: no ``limit`` (no clamp), h = self.act_fn(gates) * h; Axolotl's
# kernels/constants.py EXPERTS_ONLY_BLOCK names it for gemma4_text, its README lists gemma4_text.
EXPERTS = ("Qwen3MoeExperts", "Qwen3_5MoeExperts", "Qwen3NextExperts", "MiniMaxM2Experts",
           "Gemma4TextExperts")
MODEL_TYPES = ("qwen3_moe", "qwen3_5_moe", "qwen3_5_moe_text", "qwen3_next", "minimax_m2", "gemma4",
               "gemma4_text")
NOTE = ("ScatterMoE experts (Axolotl's KernelsPlugin), emulated; every expert assumed routed: every "
        "experts module runs Axolotl's scatter2scatter kernels (libs/scattermoe_lora/parallel_experts.py "
        "ParallelLinear), its buffers and saved tensors from that source, its arithmetic outside the "
        "allocator; which experts a batch routes to depends on the data, and with enough tokens every "
        "expert is (get_active_experts), the case taken")

LORA_NOTE = ("LoRA on the experts runs ScatterMoE's fused LoRA (Axolotl's fast path past PEFT's "
             "ParamWrapper merge, experts_lora_fastpath.py; parallel_linear_lora.py ScatterMoELoRA), "
             "emulated: its outputs, saved tensors and backward workspaces from that source")


def _expand(x: torch.Tensor, top_k: torch.Tensor) -> torch.Tensor:
    """[T, D] -> [T*k, D] (k = top_k.shape[1]), row t*k+j the token t for its j-th expert."""
    return x.repeat_interleave(top_k.shape[1], dim=0)


def _per_expert(rows: torch.Tensor, flat_index: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """rows [L, in] through each row's expert of ``weight`` [E, in, out] (what the kernel does)."""
    return (rows.unsqueeze(1) @ weight[flat_index]).squeeze(1)


@functools.cache
def function() -> type:
    """``ParallelLinear`` (parallel_experts.py): forward and backward buffers as its source makes them
    (kernels/ops.py ``scatter2scatter``, ``group``, ``group_bwd_W``), the products inside ``registers``.
    Rows are kept in token order here (the kernel's scattered order): same shapes, same bytes."""
    import torch

    class ParallelLinear(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, k: int, flat_index: torch.Tensor,
                    sorted_expert_idxs: torch.Tensor, sorted_scattered_idxs: torch.Tensor,
                    expert_offsets: torch.Tensor, gates: torch.Tensor | None, grouped_in: bool,
                    registers: Registers) -> torch.Tensor:
            if weight.dtype != x.dtype:
                weight = weight.to(x.dtype)
            rows = sorted_expert_idxs.shape[0]
            output = torch.empty((rows, weight.shape[-1]), device=x.device, dtype=x.dtype)  # scatter2scatter
            with registers():
                xs = x if grouped_in else _expand(x, flat_index.view(-1, k))
                output.copy_(_per_expert(xs.float(), flat_index, weight.float()))
            output_expanded = None
            if gates is not None:
                output_expanded = output.view(gates.shape[0], gates.shape[1], output.shape[-1])
                output = (gates.unsqueeze(1) @ output_expanded).squeeze(1)
            ctx.save_for_backward(x, weight, flat_index, sorted_expert_idxs, sorted_scattered_idxs,
                                  expert_offsets, gates, output_expanded)
            ctx.k, ctx.grouped_in, ctx.registers = k, grouped_in, registers
            return output

        @staticmethod
        def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
            x, weight, flat_index, sorted_expert_idxs, _, _, gates, output_expanded = ctx.saved_tensors
            k, grouped_in, registers = ctx.k, ctx.grouped_in, ctx.registers
            d_gates = None
            if gates is not None:
                if grad_out.dtype != output_expanded.dtype:
                    grad_out = grad_out.to(output_expanded.dtype)
                d_gates = (output_expanded @ grad_out.unsqueeze(-1)).squeeze(-1)
                grouped_grad_out = output_expanded.flatten(0, 1)  # group(..., out=): the buffer reused
                with registers():  # group(grad_out, fan_out=gates.size(1), coeff=gates.flatten())
                    grouped_grad_out.copy_(_expand(grad_out, gates) * gates.reshape(-1, 1))
            else:
                grouped_grad_out = grad_out  # grouped_out: the gate_up projection's
            if grouped_in:
                grouped_x = x
                out = None
            else:  # kernels.ops.group(x, ..., fan_out=k): torch.empty((N, K))
                grouped_x = torch.empty((sorted_expert_idxs.shape[0], x.shape[-1]), dtype=x.dtype,
                                        device=x.device)
                with registers():
                    grouped_x.copy_(_expand(x, flat_index.view(-1, k)))
                out = grouped_x
            # group_bwd_W: DWt = torch.zeros((E, DY.size(-1), X.size(-1))), returned permuted; made
            # whether or not the weight takes a gradient (no needs_input_grad check)
            d_weight_t = torch.zeros((weight.shape[0], grouped_grad_out.shape[-1], grouped_x.shape[-1]),
                                     device=grad_out.device, dtype=grouped_grad_out.dtype)
            with registers():
                for expert in range(weight.shape[0]):
                    mask = (flat_index == expert).unsqueeze(-1)
                    d_weight_t[expert].copy_((grouped_grad_out.float() * mask).T @ grouped_x.float())
            d_weight = d_weight_t.permute(0, 2, 1)
            # scatter2scatter(X=grouped_grad_out, W=weight.permute(0, 2, 1), k=1, out=d_expanded_input)
            if out is None:
                out = torch.empty((sorted_expert_idxs.shape[0], weight.shape[1]), device=grad_out.device,
                                  dtype=grouped_grad_out.dtype)
            with registers():
                out.copy_(_per_expert(grouped_grad_out.float(), flat_index, weight.float().transpose(1, 2)))
            d_input = out if k == 1 else out.view(x.shape[0], k, out.shape[-1]).sum(-2)
            return d_input, d_weight, None, None, None, None, None, d_gates, None, None

    return ParallelLinear


# kernels/lora_ops.py scatter2scatter_lora: the split forward (three scatter2scatter calls) for few
# large experts, else the fused kernel (_SPLIT_LORA_FWD_MAX_EXPERTS, _SPLIT_LORA_FWD_THRESHOLD)
SPLIT_MAX_EXPERTS, SPLIT_THRESHOLD = 32, 20_000_000  # experts; per-expert K*N


def _lora_product(rows: torch.Tensor, flat_index: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor,
                  experts: int) -> torch.Tensor:
    """(rows @ A_e^T) @ B_e^T per row's expert e, ScatterMoE's layout: A [r*E, K] expert e's rows
    [e*r, (e+1)*r), B [N, r*E] its columns (lora_ops.py scatter2scatter_lora's docstring)."""
    rank = lora_a.shape[0] // experts
    a_t = lora_a.float().view(experts, rank, -1).transpose(1, 2)  # [E, K, r]
    b_t = lora_b.float().view(lora_b.shape[0], experts, rank).permute(1, 2, 0)  # [E, r, N]
    return _per_expert(_per_expert(rows.float(), flat_index, a_t), flat_index, b_t)


@functools.cache
def lora_function() -> type:
    """``ScatterMoELoRA`` (parallel_linear_lora.py) as ``parallel_linear_lora`` calls it from the experts
    (use_fused_dX and use_fused_gather False): forward ``scatter2scatter_lora``'s output (kernels/
    lora_ops.py), the gates' product; saved x, lora_A, lora_B, the routing and output_expanded, the
    weight kept by reference (ctx.expert_weights) or, given a recipe (bitsandbytes' selective
    dequantization), dropped and rebuilt in backward. Backward: ``group`` of the gradient and of x
    (kernels/ops.py), the expert-major copies of B and A (``w_yb``, ``w_xa``) and their products
    ``yb``, ``xa`` (scatter2scatter), ``grouped_lora_weight_grads``' dA, dB (kernels/grouped_gram.py:
    torch.empty_like), the input gradient's base scatter2scatter and ``_compute_lora_input_grad``'s,
    added back (index copy and put) where x was not grouped. Rows in token order, as ``function``."""
    import torch

    class ScatterMoELoRA(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, k: int, flat_index: torch.Tensor,
                    sorted_expert_idxs: torch.Tensor, sorted_scattered_idxs: torch.Tensor,
                    expert_offsets: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor, scaling: float,
                    gates: torch.Tensor | None, grouped_in: bool, recipe: Callable[[], torch.Tensor] | None,
                    registers: Registers) -> torch.Tensor:
            if weight.dtype != x.dtype:  # "match input dtype (e.g. 8-bit LoRA)"
                weight = weight.to(x.dtype)
            experts, width, out_width = weight.shape
            rows = sorted_expert_idxs.shape[0]
            output = torch.empty((rows, out_width), device=x.device, dtype=x.dtype)
            with registers():
                xs = x if grouped_in else _expand(x, flat_index.view(-1, k))
                base = _per_expert(xs.float(), flat_index, weight.float())
            if experts <= SPLIT_MAX_EXPERTS and width * out_width >= SPLIT_THRESHOLD:
                # _scatter2scatter_lora_split: W_A, XA [rows, r], W_B, Y_lora; output.add_(Y_lora)
                rank = lora_a.shape[0] // experts
                w_a = lora_a.reshape(experts, rank, width).permute(0, 2, 1).contiguous()
                xa = torch.empty((rows, rank), device=x.device, dtype=x.dtype)
                w_b = lora_b.T.reshape(experts, rank, out_width).contiguous()
                y_lora = torch.empty((rows, out_width), device=x.device, dtype=x.dtype)
                del w_a, xa, w_b, y_lora
            with registers():
                output.copy_(base + scaling * _lora_product(xs, flat_index, lora_a, lora_b, experts))
            output_expanded = None
            if gates is not None:
                output_expanded = output.view(gates.shape[0], gates.shape[1], output.shape[-1])
                output = (gates.unsqueeze(1) @ output_expanded).squeeze(1)
            ctx.save_for_backward(x, lora_a, lora_b, flat_index, sorted_expert_idxs, sorted_scattered_idxs,
                                  expert_offsets, gates, output_expanded)
            ctx.weight = None if recipe is not None else weight
            ctx.recipe, ctx.k, ctx.scaling, ctx.grouped_in, ctx.registers = recipe, k, scaling, grouped_in, \
                registers
            return output

        @staticmethod
        def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
            x, lora_a, lora_b, flat_index, sorted_expert_idxs, _, _, gates, output_expanded = \
                ctx.saved_tensors
            weight = ctx.weight if ctx.weight is not None else ctx.recipe()
            k, scaling, grouped_in, registers = ctx.k, ctx.scaling, ctx.grouped_in, ctx.registers
            experts = weight.shape[0]
            rank = lora_a.shape[0] // experts
            rows = sorted_expert_idxs.shape[0]
            d_gates = None
            if gates is not None:
                if grad_out.dtype != output_expanded.dtype:
                    grad_out = grad_out.to(output_expanded.dtype)
                d_gates = (output_expanded @ grad_out.unsqueeze(-1)).squeeze(-1)
                grouped_grad_out = output_expanded.flatten(0, 1)  # group(..., out=): the buffer reused
                with registers():
                    grouped_grad_out.copy_(_expand(grad_out, gates) * gates.reshape(-1, 1))
            else:
                grouped_grad_out = grad_out  # grouped_out: the gate_up projection's
            if grouped_in:
                grouped_x, d_expanded = x, None
            else:  # base_ops.group(x, ..., fan_out=k), reused as d_expanded_input
                grouped_x = torch.empty((rows, x.shape[-1]), dtype=x.dtype, device=x.device)
                with registers():
                    grouped_x.copy_(_expand(x, flat_index.view(-1, k)))
                d_expanded = grouped_x
            n_dim, k_dim = lora_b.shape[0], lora_a.shape[1]
            w_yb = lora_b.reshape(n_dim, experts, rank).permute(1, 0, 2).contiguous()  # [E, N, r]
            yb = torch.empty((rows, rank), dtype=grouped_grad_out.dtype, device=grad_out.device)
            w_xa = lora_a.reshape(experts, rank, k_dim).permute(0, 2, 1).contiguous()  # [E, K, r]
            xa = torch.empty((rows, rank), dtype=grouped_x.dtype, device=grad_out.device)
            with registers():
                yb.copy_(_per_expert(grouped_grad_out.float(), flat_index, w_yb.float()))
                xa.copy_(_per_expert(grouped_x.float(), flat_index, w_xa.float()))
            d_lora_a, d_lora_b = torch.empty_like(lora_a), torch.empty_like(lora_b)
            with registers():  # _grouped_gram_kernel, per expert
                for expert in range(experts):
                    mask = (flat_index == expert).unsqueeze(-1)
                    cols = slice(expert * rank, (expert + 1) * rank)
                    d_lora_a[cols].copy_(scaling * (yb.float() * mask).T @ grouped_x.float())
                    d_lora_b[:, cols].copy_(scaling * (grouped_grad_out.float() * mask).T @ xa.float())
            # scatter2scatter(X=grouped_grad_out, W=weight.permute(0, 2, 1), k=1, out=d_expanded_input)
            if d_expanded is None:
                d_expanded = torch.empty((rows, weight.shape[1]), device=grad_out.device,
                                         dtype=grouped_grad_out.dtype)
            # _compute_lora_input_grad: scatter2scatter(yb, lora_A [E, r, K]) then mul_(scaling)
            dx_lora = torch.empty((rows, k_dim), device=grad_out.device, dtype=yb.dtype)
            with registers():
                d_expanded.copy_(_per_expert(grouped_grad_out.float(), flat_index,
                                             weight.float().transpose(1, 2)))
                dx_lora.copy_(scaling * _per_expert(yb.float(), flat_index,
                                                    lora_a.float().view(experts, rank, k_dim)))
            if not grouped_in:  # d_expanded_input[sorted_scattered_idxs] += ...: the index's copy, put back
                gathered = torch.empty_like(d_expanded)
                del gathered
            with registers():
                d_expanded.add_(dx_lora)
            d_input = d_expanded if k == 1 else d_expanded.view(x.shape[0], k, d_expanded.shape[-1]).sum(-2)
            d_weight = torch.zeros_like(weight) if weight.requires_grad else None
            return (d_input, d_weight, None, None, None, None, None, d_lora_a, d_lora_b, None, d_gates, None,
                    None, None)

    return ScatterMoELoRA


def _routing(top_k_index: torch.Tensor, num_experts: int, registers: Registers) -> tuple[torch.Tensor, ...]:
    """experts.py ``flatten_sort_count`` (parallel_experts.py, under no_grad): torch.sort of the
    flattened indices (values and positions, int64), the counts (its bincount's fake: torch.empty
    (num_experts, long)) and their cumsum."""
    import torch

    with torch.no_grad():
        flat = top_k_index.flatten()
        sorted_expert_idxs, sorted_scattered_idxs = torch.sort(flat)
        counts = torch.empty(num_experts, dtype=torch.long, device=flat.device)
        with registers():
            counts.copy_(torch.nn.functional.one_hot(flat, num_experts).sum(0))
        return flat, sorted_expert_idxs, sorted_scattered_idxs, counts.cumsum(-1)


def _bnb_experts(module: Any) -> bool:
    """experts.py's ``_bnb_experts``: both projections under a bitsandbytes parametrization."""
    names = getattr(module, "parametrizations", {})
    return "gate_up_proj" in names and "down_proj" in names


def _selective_bnb4(module: Any, name: str, registers: Registers) -> torch.Tensor:
    """selective_dequant.py ``selective_expert_weights`` of a 4-bit parametrization, every expert
    routed: ``_selective_dequant_bnb4``'s nested absmax (``dequantize_blockwise``, float32, the
    offset added in place) then ``selective_dequant_nf4_triton``'s output [E, d1, d2] in the
    weights' dtype. The values are the parametrization's own dequantization."""
    import torch

    parametrization = module.parametrizations[name][0]
    packed = module.parametrizations[name].original
    absmax = None
    if getattr(parametrization, "double_quant", False):
        absmax = torch.empty(parametrization.absmax.shape, dtype=torch.float32, device=packed.device)
        absmax += parametrization.offset
    out = torch.empty(parametrization.shape, dtype=parametrization.dtype, device=packed.device)
    with registers(), torch.no_grad():
        out.copy_(getattr(module, name))
    del absmax
    return out


def experts_forward(self: Any, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                    top_k_weights: torch.Tensor, registers: Registers = contextlib.nullcontext
                    ) -> torch.Tensor:
    """experts.py ``scattermoe_experts_forward``: the gate_up projection grouped out, the activation in
    torch, the down projection grouped in and weighted by the gates; each through ``parallel_linear``,
    or ``parallel_linear_lora`` where the fast path (``lora_forward``) handed it that projection's LoRA
    (``_parallel_linear_maybe_lora``)."""
    import torch

    k = top_k_index.shape[1]
    routing_weights = top_k_weights.to(hidden_states.dtype)
    loras = getattr(self, "_scattermoe_lora", None) or {}
    gup_lora, down_lora = loras.get("gate_up_proj"), loras.get("down_proj")
    flat, sorted_expert_idxs, sorted_scattered_idxs, expert_offsets = _routing(
        top_k_index, self.num_experts, registers)
    recipes: dict[str, Callable[[], torch.Tensor]] = {}
    if _bnb_experts(self):  # bnb_fast: get_active_experts, remap_expert_indices, selective dequant
        with torch.no_grad():
            sorted_expert_idxs, expert_offsets = torch.empty_like(sorted_expert_idxs), \
                torch.empty_like(expert_offsets)
        gate_up = _selective_bnb4(self, "gate_up_proj", registers).transpose(2, 1)
        down = _selective_bnb4(self, "down_proj", registers).transpose(2, 1)
        # the recompute-in-backward recipes ScatterMoELoRA takes instead of the dequantized copies
        recipes = {name: functools.partial(_recompute_bnb4, self, name, registers)
                   for name in ("gate_up_proj", "down_proj")}
        if gup_lora is not None and down_lora is not None:
            gup_lora, down_lora = _selective_lora(gup_lora, self.num_experts), \
                _selective_lora(down_lora, self.num_experts)
    else:  # _prepare_weights_and_lora: the parameters transposed, no copy
        gate_up, down = self.gate_up_proj.transpose(2, 1), self.down_proj.transpose(2, 1)
    gates_h = _linear(hidden_states, gate_up, k, flat, sorted_expert_idxs, sorted_scattered_idxs,
                      expert_offsets, None, False, registers, gup_lora, recipes.get("gate_up_proj"))
    gates, h = gates_h.chunk(2, dim=-1)
    h = self.act_fn(gates) * h
    return _linear(h, down, 1, flat, sorted_expert_idxs, sorted_scattered_idxs, expert_offsets,
                   routing_weights, True, registers, down_lora, recipes.get("down_proj"))


Lora = tuple[Any, Any, float]  # ScatterMoE's (lora_A [r*E, K], lora_B [N, r*E], scaling)


def _linear(x: torch.Tensor, weight: torch.Tensor, k: int, flat: torch.Tensor,
            sorted_expert_idxs: torch.Tensor, sorted_scattered_idxs: torch.Tensor,
            expert_offsets: torch.Tensor, gates: torch.Tensor | None,
            grouped_in: bool, registers: Registers, lora: Lora | None,
            recipe: Callable[[], torch.Tensor] | None) -> torch.Tensor:
    """experts.py ``_parallel_linear_maybe_lora``: ParallelLinear, or ScatterMoELoRA given a LoRA."""
    if lora is None:
        linear: Any = function()
        return linear.apply(x, weight, k, flat, sorted_expert_idxs, sorted_scattered_idxs, expert_offsets,
                            gates, grouped_in, registers)
    fused: Any = lora_function()
    return fused.apply(x, weight, k, flat, sorted_expert_idxs, sorted_scattered_idxs, expert_offsets,
                       lora[0], lora[1], lora[2], gates, grouped_in, recipe, registers)


def _recompute_bnb4(module: Any, name: str, registers: Registers) -> torch.Tensor:
    """experts.py's ``weight.recipe``: the selective dequantization again, in backward."""
    return _selective_bnb4(module, name, registers).transpose(2, 1)


def _selective_lora(lora: Lora, experts: int) -> Lora:
    """selective_dequant.py ``selective_lora_weights`` with every expert active: A's rows and B's
    columns of the active experts gathered (index copies, differentiable)."""
    import torch

    lora_a, lora_b, scaling = lora
    rank = lora_a.shape[0] // experts
    active = torch.arange(experts, device=lora_a.device)  # get_active_experts: every expert routed
    row_idx = (active.long()[:, None] * rank + torch.arange(rank, device=lora_a.device)[None, :]).reshape(-1)
    return lora_a[row_idx], lora_b[:, row_idx], scaling


def lora_forward(self: Any, x: torch.Tensor, *args: Any, registers: Registers = contextlib.nullcontext,
                 **kwargs: Any) -> torch.Tensor:
    """experts_lora_fastpath.py's ``ParamWrapper.forward`` on the outermost wrapper of ScatterMoE
    experts: each wrapper's LoRA (``get_lora_params_from_wrapper``: the first active adapter's A, B and
    scaling) cast to the activations' dtype, B made expert-major (layers.py ``_convert_smoe_lora``),
    handed to the experts as ``_scattermoe_lora``, and the experts called directly (PEFT's merge
    bypassed); PEFT's own forward where the fast path defers (mixed adapters, merged, disabled)."""
    wrappers, base = {}, self
    while hasattr(base, "base_layer") and hasattr(base, "lora_A"):
        wrappers[base.parameter_name] = base
        base = base.base_layer
    fusable = all(not w.disable_adapters and not w.merged and len(w.active_adapters) == 1
                  for w in wrappers.values())
    if kwargs.get("adapter_names") is not None or not fusable:
        return type(self).forward(self, x, *args, **kwargs)
    experts, loras = base.num_experts, {}
    for name, wrapper in wrappers.items():
        adapter = wrapper.active_adapters[0]
        if adapter not in wrapper.lora_A:
            continue
        lora_a, lora_b = wrapper.lora_A[adapter].weight, wrapper.lora_B[adapter].weight
        rank = lora_a.shape[0] // experts
        lora_a, lora_b = lora_a.to(x.dtype), lora_b.to(x.dtype)
        out = lora_b.shape[0]  # peft_lora_B_to_scattermoe: [out, r*E] rank-major to expert-major
        lora_b = lora_b.reshape(out, rank, experts).permute(0, 2, 1).contiguous().reshape(out, experts * rank)
        loras[name] = (lora_a, lora_b, wrapper.scaling[adapter])
    base._scattermoe_lora = loras
    try:
        return base(x, *args, **kwargs)
    finally:
        base._scattermoe_lora = None


def route_lora(model: Any, registers: Registers) -> int:
    """The fast path (``lora_forward``) on each outermost PEFT ParamWrapper around experts that run
    the emulation (``apply``), as Axolotl's patch of ParamWrapper.forward takes them; the number
    routed."""
    wrappers = [m for m in model.modules() if type(m).__name__ == "ParamWrapper"]
    inner = {id(m.base_layer) for m in wrappers}
    routed = 0
    for module in wrappers:
        if id(module) in inner:
            continue
        if getattr(module.get_base_layer(), "_scattermoe_emulated", False):
            module.forward = MethodType(functools.partial(lora_forward, registers=registers), module)
            routed += 1
    return routed


def check_model(model_type: str | None, *, experts_bits: int | None = None) -> None:
    """InvalidInput where the emulation does not cover the step: a model whose experts are not of
    EXPERTS' classes (another layout, or no experts at all: Axolotl then warns that the kernel is not
    applied, loaders/model.py _configure_experts_implementation), or 8-bit experts (quantize_moe_experts
    over an 8-bit base: selective_dequant.py's non-bnb4 path, not emulated). ``experts_bits``: the
    bits quantize_moe_experts stores the experts in, None where it is off."""
    from autotune.errors import InvalidInput

    if model_type not in MODEL_TYPES:
        raise InvalidInput(f"ScatterMoE experts (Axolotl's KernelsPlugin use_scattermoe) are emulated for "
                           f"the experts of {', '.join(MODEL_TYPES)} ({', '.join(EXPERTS)}), not for model "
                           f"type {model_type}'s")
    if experts_bits is not None and experts_bits != 4:
        raise InvalidInput(f"ScatterMoE over {experts_bits}-bit experts (quantize_moe_experts with "
                           f"load_in_{experts_bits}bit) is not emulated: its selective dequantization "
                           "is emulated for bitsandbytes 4-bit experts only (selective_dequant.py)")


def check_sharding(sharding: str | None, lora_parameters: tuple[str, ...]) -> None:
    """UnmodelledSetting for LoRA on the experts (PEFT's target_parameters) under sharded parameters
    (``sharding``: FSDP or a ZeRO stage, as the message names it; None on one GPU or under DDP).
    ``lora_forward`` reads each ParamWrapper's lora_A and lora_B weights itself, as Axolotl's fast path
    does (experts_lora_fastpath.py), outside those modules' forward: where they are sharded apart from
    their decoder layer (ZeRO-3, FSDP1, FSDP2 as accelerate or LLaMA-Factory prepares it; not Axolotl's
    FSDP2, backends/distributed.py shard_as_axolotl) the emulation meets them still sharded."""
    from autotune.errors import UnmodelledSetting

    if sharding is not None and lora_parameters:
        raise UnmodelledSetting(f"LoRA on the experts ({', '.join(lora_parameters)}) under ScatterMoE with "
                                f"{sharding} is not emulated yet: ScatterMoE's fused LoRA reads each "
                                "ParamWrapper's lora_A and lora_B weights outside their forward "
                                "(experts_lora_fastpath.py), which the emulation meets still sharded; it "
                                "is emulated on one GPU, under DDP and under Axolotl's FSDP2")


def _class_name(module: Any) -> str:
    """The module's class name, that of the class a parametrization derived from it
    (torch.nn.utils.parametrize makes ``Parametrized<Class>`` of a quantized experts module)."""
    cls = type(module)
    if getattr(cls, "__name__", "").startswith("Parametrized") and len(cls.__bases__) == 1:
        cls = cls.__bases__[0]
    return cls.__name__


def apply(model: Any, registers: Registers) -> int:
    """Every experts module of ``model`` of a class in EXPERTS runs the emulation (what Axolotl's
    registration makes transformers dispatch to); the number patched. The stand-in reads the
    experts' bitsandbytes parametrizations when called, so it takes 4-bit experts whether they are
    quantized before or after it is set. InvalidInput for an experts module transformers dispatches
    by experts_implementation (``use_experts_implementation`` sets ``is_concatenated``) of another
    class: its layout is not emulated."""
    from autotune.errors import InvalidInput

    stand_in = functools.partial(experts_forward, registers=registers)
    patched = 0
    for module in model.modules():
        name = _class_name(module)
        if name in EXPERTS:
            module.forward = MethodType(stand_in, module)
            module._scattermoe_emulated = True  # for route_lora, once PEFT wraps it
            patched += 1
        elif hasattr(module, "is_concatenated") and hasattr(module, "has_gate"):
            raise InvalidInput(f"ScatterMoE experts (Axolotl's KernelsPlugin) are emulated for "
                               f"{', '.join(EXPERTS)}, not for {name}")
    return patched
