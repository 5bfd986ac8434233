"""kernels-community/megablocks ``MegaBlocksMoeMLP``, emulated: gpt-oss' mixture of experts as
transformers' ``kernelize`` runs it under ``use_kernels`` (workload/hub_kernels.py), its memory.

transformers decorates ``GptOssMLP`` ``@use_kernel_forward_from_hub("MegaBlocksMoeMLP")``
(models/gpt_oss/modeling_gpt_oss.py) and maps that name, for CUDA in ``Mode.TRAINING``, to
kernels-community/megablocks ``MegaBlocksMoeMLP`` version 1 (integrations/hub_kernels.py
``_build_kernel_mapping``). Its forward (megablocks torch-ext/megablocks/layers.py, read at
kernels-community 40d4194f) reads the module's own router and experts and, on one GPU
(``forward_once``: no expert-parallel group), runs:

- ``route_tokens``: ``F.linear`` of the tokens by the router, top-k, softmax of the k values; then
  ``moe_forward``'s ``router_scores`` (``zeros_like(logits).scatter_``), returned and dropped;
- ``indices_and_bins`` under ``no_grad``: ``top_expert.int()``, megablocks' CUB radix sort
  (ops/sort.py: ``empty_like`` twice; csrc/sort.cu ``cub_radix_sort``: an ``arange`` of the values
  and CUB's scratchpad), ``ops.histogram`` (csrc/histogram.cu: [1, E] int32) and
  ``ops.inclusive_cumsum`` (ops/cumsum.py: ``empty_like``);
- ``expert_capacity_fn``: ``int(capacity_factor * top_k * tokens / num_experts)``, the factor 1.0
  (GptOssExperts has no ``capacity_factor``): every expert gets a bin of that many rows, and the
  routings past it are dropped (the kernel's, not an estimate's);
- ``permute_and_compute``: ``ops.binned_gather`` (BinnedGatherOp, backend/kernels.py
  ``binned_gather``: ``torch.zeros((E, capacity, H))``), ``mlp_forward`` in torch (``torch.bmm`` with
  the [E, H, 2I] and [E, I, H] experts, clamp, sigmoid: traced as it is), ``ops.binned_scatter``
  (BinnedScatterOp: ``torch.zeros((tokens, top_k, H))`` summed over k; it saves its [E, capacity, H]
  input for the gates' gradient).

Backward: BinnedScatterOp's ``binned_gather`` of the gradient ([E, capacity, H] zeros) and
``binned_scatter_wgrad`` ([tokens * top_k] zeros), BinnedGatherOp's ``binned_scatter`` ([tokens,
top_k, H] zeros summed over k). The Python wrappers' allocations are made here with the same calls,
shapes and dtypes, in their order; the Triton copies (``_binned_copy``, ``_binned_copy_wgrad``)
compute inside ``registers()`` (the estimator's: outside the caching allocator) and write into those
buffers. Both ops are ``custom_fwd``/``custom_bwd`` (ops/stk_autocast.py), whose casts act under
autocast only, where moe_forward has raised before them (SCATTER_DTYPES): they run with autocast
off (the sums here name their dtype). Left out: CUB's histogram and scan scratchpads (of the order
of the E bins' bytes).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from contextlib import AbstractContextManager
from types import MethodType
from typing import TYPE_CHECKING, Any

from autotune.errors import InvalidInput

if TYPE_CHECKING:
    import torch

Registers = Callable[[], AbstractContextManager[Any]]
KERNEL = "kernels-community/megablocks MegaBlocksMoeMLP"
CAPACITY_FACTOR = 1.0  # MegaBlocksMoeMLP.forward: getattr(self.experts, "capacity_factor", 1.0)
# Under autocast the router's F.linear gives bfloat16 or float16 logits and softmax float32 weights
# (CUDA autocast's float32 ops, torch.amp docs: softmax), so moe_forward's router_scores,
# zeros_like(logits).scatter_(1, expert_indices, expert_weights), raises as PyTorch's scatter does on
# every device (ATen ScatterGatherChecks.h): the step does not run.
SCATTER_DTYPES = (f"use_kernels: {KERNEL} does not run this step: its moe_forward (layers.py) scatters "
                  "the router's {weights} softmax weights into zeros_like of its {logits} logits "
                  "(router_scores: autocast runs softmax in float32), and torch's scatter_ raises "
                  "\"scatter(): Expected self.dtype to be equal to src.dtype\"; without autocast "
                  "(bf16: full, or use_kernels: false) it runs")


def capacity(tokens: int, top_k: int, num_experts: int) -> int:
    """``expert_capacity_fn`` (layers.py) on one GPU: the rows of each expert's bin. Where it is 0 (fewer
    routings than experts) the kernel takes ``torch.max(tokens_per_expert).item()``, data; ``tokens``
    bounds it (an expert gets a token once at most), the bound taken."""
    rows = int(CAPACITY_FACTOR * top_k * tokens / num_experts)
    return rows if rows > 0 else tokens


def _slots(indices: torch.Tensor, bins: torch.Tensor, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """For each [expert, row] slot of the bins: the flattened routing (token * top_k + j) it holds, and
    whether it holds one (``_binned_copy``: ``entry_idx < end - start``; later routings are dropped)."""
    import torch

    start = torch.cat([bins.new_zeros(1), bins[:-1]]).long()
    count = bins.long() - start
    entry = torch.arange(rows, device=bins.device)
    valid = entry.unsqueeze(0) < count.unsqueeze(1)
    position = (start.unsqueeze(1) + entry.unsqueeze(0)).clamp(max=indices.shape[0] - 1)
    return indices.long()[position], valid


def _gather_into(out: torch.Tensor, x: torch.Tensor, indices: torch.Tensor, weights: torch.Tensor | None,
                 bins: torch.Tensor, top_k: int) -> None:
    """``_binned_copy`` A_TO_B: each slot's token row of ``x`` [tokens, H] (times its weight) into
    ``out`` [E, capacity, H]; empty slots stay zero."""
    routing, valid = _slots(indices, bins, out.shape[1])
    rows = x[routing // top_k]
    scale = valid.to(x.dtype) if weights is None else weights[routing] * valid
    out.copy_(rows * scale.unsqueeze(-1))


def _scatter_into(out: torch.Tensor, x: torch.Tensor, indices: torch.Tensor, weights: torch.Tensor | None,
                  bins: torch.Tensor) -> None:
    """``_binned_copy`` B_TO_A: each slot of ``x`` [E, capacity, H] (times its weight) into its
    routing's row of ``out`` [tokens, top_k, H]."""
    routing, valid = _slots(indices, bins, x.shape[1])
    scale = valid.to(x.dtype) if weights is None else weights[routing] * valid
    flat = out.view(-1, out.shape[-1])
    flat.index_add_(0, routing.flatten(), (x * scale.unsqueeze(-1)).flatten(0, 1))


def binned_gather(x: torch.Tensor, indices: torch.Tensor, weights: torch.Tensor | None, bins: torch.Tensor,
                  rows: int, top_k: int, registers: Registers) -> torch.Tensor:
    """backend/kernels.py ``binned_gather``: ``torch.zeros((num_experts, expert_capacity, H))``."""
    import torch

    out = torch.zeros((bins.shape[0], rows, x.shape[1]), dtype=x.dtype, device=x.device)
    with registers():
        _gather_into(out, x, indices, weights, bins, top_k)
    return out


def binned_scatter(x: torch.Tensor, indices: torch.Tensor, weights: torch.Tensor | None, bins: torch.Tensor,
                   top_k: int, registers: Registers) -> torch.Tensor:
    """backend/kernels.py ``binned_scatter``: ``torch.zeros((tokens, top_k, H))``, then ``out.sum(dim=1)``
    where top_k > 1 (autocast off in the op: the sum in x's dtype)."""
    import torch

    tokens = indices.shape[0] // top_k
    out = torch.zeros((tokens, top_k, x.shape[2]), dtype=x.dtype, device=x.device)
    with registers():
        _scatter_into(out, x, indices, weights, bins)
    return out.sum(dim=1, dtype=x.dtype) if top_k > 1 else out.view(tokens, x.shape[2])


def binned_scatter_wgrad(x: torch.Tensor, grad: torch.Tensor, indices: torch.Tensor, bins: torch.Tensor,
                         top_k: int, registers: Registers) -> torch.Tensor:
    """backend/kernels.py ``binned_scatter_wgrad``: ``torch.zeros((tokens * top_k))``, each routing's
    dot product of its slot of ``x`` with its token's gradient (``_binned_copy_wgrad``)."""
    import torch

    tokens = indices.shape[0] // top_k
    out = torch.zeros((tokens * top_k), dtype=x.dtype, device=x.device)
    with registers():
        routing, valid = _slots(indices, bins, x.shape[1])
        rows = grad[routing // top_k].float()
        dots = torch.bmm(x.float().flatten(0, 1).unsqueeze(1), rows.flatten(0, 1).unsqueeze(2))
        out.index_add_(0, routing.flatten(), (dots.view(-1) * valid.flatten()).to(x.dtype))
    return out


@functools.cache
def functions() -> tuple[Any, Any]:
    """ops/binned_gather.py ``BinnedGatherOp`` and ops/binned_scatter.py ``BinnedScatterOp``, with
    what they save and what their backward allocates."""
    import torch

    class BinnedGatherOp(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor, indices: torch.Tensor, bins: torch.Tensor, rows: int,
                    top_k: int, registers: Registers) -> torch.Tensor:
            ctx.save_for_backward(indices, bins)
            ctx.top_k, ctx.registers = top_k, registers
            return binned_gather(x, indices, None, bins, rows, top_k, registers)

        @staticmethod
        def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
            grad = grad.contiguous()
            indices, bins = ctx.saved_tensors
            out = binned_scatter(grad, indices, None, bins, ctx.top_k, ctx.registers)
            return out, None, None, None, None, None

    class BinnedScatterOp(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor, indices: torch.Tensor, weights: torch.Tensor,
                    bins: torch.Tensor, top_k: int, registers: Registers) -> torch.Tensor:
            ctx.bin_size, ctx.top_k, ctx.registers = x.size(1), top_k, registers
            ctx.save_for_backward(x, indices, weights, bins)  # x whether or not weights take a gradient
            return binned_scatter(x, indices, weights, bins, top_k, registers)

        @staticmethod
        def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
            grad = grad.contiguous()
            x, indices, weights, bins = ctx.saved_tensors
            out = binned_gather(grad, indices, weights, bins, ctx.bin_size, ctx.top_k, ctx.registers)
            wgrad = None
            if ctx.needs_input_grad[2]:
                wgrad = binned_scatter_wgrad(x, grad, indices, bins, ctx.top_k, ctx.registers)
            return out, None, wgrad, None, None, None

    return BinnedGatherOp, BinnedScatterOp


def _indices_and_bins(top_experts: torch.Tensor, num_experts: int,
                      registers: Registers) -> tuple[torch.Tensor, torch.Tensor]:
    """layers.py ``indices_and_bins`` (under no_grad): the routings sorted by expert (``indices``, int32)
    and each expert's cumulated count (``bins``, int32 [E])."""
    import torch

    top_expert = top_experts.int().contiguous()
    bin_ids = torch.empty_like(top_expert)  # ops/sort.py SortOp: x_out, iota_out
    indices = torch.empty_like(top_expert)
    iota = torch.arange(0, top_expert.numel(), dtype=top_expert.dtype, device=top_expert.device)
    # csrc/sort.cu: CUB's SortPairs scratchpad, the alternate key and value buffers it needs when the
    # inputs may not be overwritten (cub DispatchRadixSort, is_overwrite_okay false); its small
    # per-digit histograms left out
    scratchpad = torch.empty(2 * top_expert.numel() * top_expert.element_size(), dtype=torch.int8,
                             device=top_expert.device)
    with registers():
        order = torch.sort(top_expert, stable=True)
        bin_ids.copy_(order.values)
        indices.copy_(order.indices)
    del iota, scratchpad
    tokens_per_expert = torch.empty((1, num_experts), dtype=torch.int32, device=top_expert.device).flatten()
    with registers():  # csrc/histogram.cu cub_histogram: [1, num_bins] int32, flattened
        counts = torch.nn.functional.one_hot(top_expert.long(), num_experts).sum(0, dtype=torch.int32)
        tokens_per_expert.copy_(counts)
    bins = torch.empty_like(tokens_per_expert.view(1, -1))  # ops/cumsum.py InclusiveCumsumOp
    with registers():
        bins.copy_(tokens_per_expert.cumsum(0, dtype=torch.int32).view(1, -1))
    return indices, bins.squeeze()


def forward(self: Any, x: torch.Tensor, registers: Registers) -> tuple[torch.Tensor, torch.Tensor]:
    """``MegaBlocksMoeMLP.forward`` on one GPU (module docstring), on the module's router and experts."""
    import torch

    top_k, num_experts = self.router.top_k, self.experts.num_experts
    alpha, limit = getattr(self.experts, "alpha", 1.0), 7.0  # mlp_forward's default limit
    # route_tokens (no jitter: GptOssExperts has no jitter_eps)
    x_flat = x.view(-1, x.shape[-1])
    logits = torch.nn.functional.linear(x_flat, self.router.weight, self.router.bias)
    expert_weights, expert_indices = (logits.max(dim=-1, keepdim=True) if top_k == 1
                                      else torch.topk(logits, top_k, dim=-1))
    expert_weights = expert_weights.softmax(dim=-1)
    if expert_weights.dtype != logits.dtype:
        raise InvalidInput(SCATTER_DTYPES.format(logits=str(logits.dtype).removeprefix("torch."),
                                                 weights=str(expert_weights.dtype).removeprefix("torch.")))
    router_scores = torch.zeros_like(logits).scatter_(1, expert_indices, expert_weights).transpose(0, 1)
    # forward_once
    with torch.no_grad():
        indices, bins = _indices_and_bins(expert_indices.flatten(), num_experts, registers)
        rows = capacity(x.shape[0] * x.shape[1], top_k, num_experts)
    gather, scatter = functions()  # no autocast here (SCATTER_DTYPES): custom_fwd casts nothing
    hidden = gather.apply(x.view(-1, x.shape[-1]), indices, bins, rows, top_k, registers)
    hidden = _mlp_forward(hidden, self.experts, alpha, limit)
    out = scatter.apply(hidden, indices, expert_weights.flatten(), bins, top_k, registers)
    del router_scores  # moe_forward's third output, which MegaBlocksMoeMLP.forward drops
    return out.view(x.size()), expert_weights


def _mlp_forward(x: torch.Tensor, experts: Any, alpha: float, limit: float) -> torch.Tensor:
    """layers.py ``mlp_forward`` (no gradient scale, plain tensors), as it is."""
    import torch

    gate_up = torch.bmm(x, experts.gate_up_proj) + experts.gate_up_proj_bias[..., None, :]
    gate, up = gate_up[..., ::2], gate_up[..., 1::2]
    gate = gate.clamp(min=None, max=limit)
    up = up.clamp(min=-limit, max=limit)
    glu = gate * torch.sigmoid(gate * alpha)
    next_states = torch.bmm(((up + 1) * glu), experts.down_proj)
    next_states += experts.down_proj_bias[..., None, :]
    return next_states


def apply(module: Any, registers: Registers) -> None:
    """``module`` (a GptOssMLP) runs MegaBlocksMoeMLP's forward: kernelize keeps the module and
    swaps its forward."""
    stand_in = functools.partial(forward, registers=registers)
    module.forward = MethodType(stand_in, module)
