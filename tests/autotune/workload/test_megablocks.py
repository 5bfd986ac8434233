"""kernels-community/megablocks MegaBlocksMoeMLP, emulated (workload/megablocks.py): transformers' own
GptOssMLP where no routing passes an expert's capacity, MegaBlocks' drops where one does, the buffers
its Python wrappers allocate, and its scatter's dtype error under autocast."""

from __future__ import annotations

import contextlib

import pytest
import torch
from allocations import Allocations

import autotune
from autotune.errors import InvalidInput
from autotune.workload import megablocks
from autotune.workload.models import resolve_model


def _gpt_oss_mlp() -> tuple[torch.nn.Module, object]:
    """tiny-gpt_oss' first GptOssMLP, its weights drawn (the router's are zeros at init)."""
    from transformers import AutoModelForCausalLM

    config = resolve_model("tiny-gpt_oss").config
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(std=0.05)
    return model.model.layers[0].mlp, config


def _grads(out: torch.Tensor, mlp: torch.nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    weights = (x, mlp.router.weight, mlp.router.bias, mlp.experts.gate_up_proj, mlp.experts.down_proj_bias)
    return torch.autograd.grad((out * torch.linspace(-1, 1, out.shape[-1])).sum(), weights)


def test_where_no_routing_passes_a_bin_it_is_gpt_oss_mlp(monkeypatch: pytest.MonkeyPatch) -> None:
    mlp, config = _gpt_oss_mlp()
    x = torch.randn(2, 16, config.hidden_size, requires_grad=True)
    want, _ = mlp(x)
    want_grads = _grads(want, mlp, x)
    # a bin of every token: num_experts / top_k times the kernel's factor 1.0
    monkeypatch.setattr(megablocks, "CAPACITY_FACTOR", config.num_local_experts / config.num_experts_per_tok)
    megablocks.apply(mlp, contextlib.nullcontext)
    got, weights = mlp(x)
    assert weights.shape == (32, config.num_experts_per_tok)
    torch.testing.assert_close(got, want)
    for got_grad, want_grad in zip(_grads(got, mlp, x), want_grads, strict=True):
        torch.testing.assert_close(got_grad, want_grad, rtol=1e-4, atol=1e-6)


def _dropping_reference(mlp: torch.nn.Module, x: torch.Tensor, rows: int) -> torch.Tensor:
    """MegaBlocks' arithmetic written out: each expert keeps its first ``rows`` routings in the order
    of token * top_k + j (its stable radix sort), the others add nothing."""
    experts = mlp.experts
    flat = x.view(-1, x.shape[-1])
    logits = torch.nn.functional.linear(flat, mlp.router.weight, mlp.router.bias)
    values, index = torch.topk(logits, mlp.router.top_k, dim=-1)
    weights = values.softmax(dim=-1)
    taken = [0] * experts.num_experts
    out = torch.zeros_like(flat)
    for token in range(flat.shape[0]):
        for j in range(mlp.router.top_k):
            expert = int(index[token, j])
            taken[expert] += 1
            if taken[expert] > rows:
                continue
            gate_up = flat[token] @ experts.gate_up_proj[expert] + experts.gate_up_proj_bias[expert]
            gate, up = gate_up[::2].clamp(max=7.0), gate_up[1::2].clamp(-7.0, 7.0)
            hidden = (up + 1) * gate * torch.sigmoid(gate * experts.alpha)
            down = hidden @ experts.down_proj[expert] + experts.down_proj_bias[expert]
            out[token] += weights[token, j] * down
    return out.view(x.shape)


def test_routings_past_an_expert_s_bin_are_dropped_as_megablocks_drops_them() -> None:
    mlp, config = _gpt_oss_mlp()
    x = torch.randn(2, 16, config.hidden_size)
    rows = megablocks.capacity(32, config.num_experts_per_tok, config.num_local_experts)
    assert rows == 2 * 32 // 4  # int(1.0 * top_k * tokens / num_experts)
    want = _dropping_reference(mlp, x, rows)
    assert not torch.allclose(want, mlp(x)[0])  # some routing is dropped at this seed
    megablocks.apply(mlp, contextlib.nullcontext)
    torch.testing.assert_close(mlp(x)[0], want, rtol=1e-5, atol=1e-6)


def test_the_buffers_are_megablocks_wrappers() -> None:
    mlp, config = _gpt_oss_mlp()
    mode = Allocations(("zeros", "zeros_like", "empty", "empty_like", "arange", "sum"))
    megablocks.apply(mlp, mode.registers)
    x = torch.randn(2, 16, config.hidden_size, requires_grad=True)
    with mode:
        out, _ = mlp(x)
        forward = list(mode.made)
        mode.made.clear()
        out.backward(torch.ones_like(out))
    tokens, k, experts, hidden = 32, config.num_experts_per_tok, config.num_local_experts, config.hidden_size
    n, rows = tokens * k, megablocks.capacity(tokens, k, experts)
    assert forward == [
        ((tokens, experts), torch.float32),  # moe_forward's zeros_like(logits), router_scores
        ((n,), torch.int32), ((n,), torch.int32),  # ops/sort.py: x_out, iota_out
        ((n,), torch.int32), ((2 * n * 4,), torch.int8),  # csrc/sort.cu: iota, CUB's scratchpad
        ((1, experts), torch.int32), ((1, experts), torch.int32),  # histogram, inclusive_cumsum
        ((experts, rows, hidden), torch.float32),  # binned_gather
        ((tokens, k, hidden), torch.float32), ((tokens, hidden), torch.float32),  # binned_scatter, its sum
    ]
    # BinnedScatterOp: binned_gather of the gradient, binned_scatter_wgrad; the experts' bias gradients
    # (torch's sums over the bins); BinnedGatherOp: binned_scatter of its gradient and the sum over top_k;
    # the router bias' gradient
    assert mode.made == [
        ((experts, rows, hidden), torch.float32), ((n,), torch.float32),
        ((experts, 1, hidden), torch.float32), ((experts, 1, 2 * config.intermediate_size), torch.float32),
        ((tokens, k, hidden), torch.float32), ((tokens, hidden), torch.float32),
        ((1, experts), torch.float32),
    ]


def test_under_autocast_its_scatter_of_float32_weights_is_refused() -> None:
    with pytest.raises(InvalidInput, match=r"^use_kernels: kernels-community/megablocks MegaBlocksMoeMLP "
                       r"does not run this step: .* float32 softmax weights into zeros_like of its bfloat16 "
                       r"logits .* \"scatter\(\): Expected self.dtype to be equal to src.dtype\""):
        autotune.check("tiny-gpt_oss", seq_len=64, batch_size=8, mode="bf16", dtype="bfloat16",
                       gpu="H100-80GB", backend="estimate", workers=1, use_kernels=True)


def test_a_gpt_oss_check_with_use_kernels_traces_the_hub_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    forward = megablocks.forward

    def counted(*args: object, **kwargs: object) -> object:
        calls.append(1)
        return forward(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(megablocks, "forward", counted)

    def peak(use_kernels: bool) -> int | None:
        return autotune.check("tiny-gpt_oss", seq_len=128, batch_size=64, mode="ckpt", dtype="bfloat16",
                              gpu="H100-80GB", backend="estimate", workers=1,
                              use_kernels=use_kernels).peak_memory_bytes

    without = peak(False)
    assert not calls
    with_hub = peak(True)
    assert calls and with_hub is not None and without is not None
    assert with_hub != without  # MegaBlocks' bins and LigerRMSNorm's buffers, not grouped_mm's
