"""flash-linear-attention's chunk_gated_delta_rule, emulated (workload/gated_delta_rule.py): on a CPU
the emulation gives transformers' torch fallback's outputs and gradients, allocates fla v0.4.1's
buffers (sizes cited from its source), and is what every Gated DeltaNet layer of a preset calls."""

from __future__ import annotations

import contextlib

import pytest
import torch
from allocations import Allocations
from torch._subclasses.fake_tensor import FakeTensorMode

from autotune.workload import gated_delta_rule
from autotune.workload.gated_delta_rule import chunk_gated_delta_rule
from autotune.workload.models import PRESETS, resolve_model

B, T, HK, HV, K, V = 2, 100, 2, 4, 16, 8  # T past one 64-token chunk, two value heads a key head


def inputs(dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    torch.manual_seed(0)
    made = [torch.randn(B, T, HK, K, dtype=dtype), torch.randn(B, T, HK, K, dtype=dtype),
            torch.randn(B, T, HV, V, dtype=dtype), -torch.rand(B, T, HV, dtype=dtype),
            torch.rand(B, T, HV, dtype=dtype)]
    return [x.requires_grad_() for x in made]


@pytest.mark.parametrize("modeling", ["qwen3_5", "qwen3_5_moe", "qwen3_next"])
def test_outputs_and_gradients_are_the_torch_fallbacks(modeling: str) -> None:
    import importlib

    fallback = importlib.import_module(f"transformers.models.{modeling}.modeling_{modeling}") \
        .torch_chunk_gated_delta_rule
    xs, ys = inputs(), [x.detach().clone().requires_grad_() for x in inputs()]
    expected, _ = fallback(*xs[:3], g=xs[3], beta=xs[4], use_qk_l2norm_in_kernel=True)
    got, state = chunk_gated_delta_rule(*ys[:3], g=ys[3], beta=ys[4], use_qk_l2norm_in_kernel=True)
    assert state is None and got.shape == expected.shape == (B, T, HV, V)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)
    grad = torch.randn_like(expected)
    for want, have in zip(torch.autograd.grad(expected, xs, grad), torch.autograd.grad(got, ys, grad),
                          strict=True):
        assert have.shape == want.shape and have.dtype == want.dtype
        torch.testing.assert_close(have, want, atol=1e-5, rtol=1e-4)


# What the kernel's source allocates with: the ops whose outputs Allocations records.
ALLOCATING = ("empty", "empty_like", "zeros_like", "new_empty", "empty_strided", "sum",
              "repeat_interleave", "clone")


@pytest.mark.parametrize("fake", [False, True])
def test_allocations_are_fla_0_4_1s_buffers(fake: bool) -> None:
    """The same buffers on real and on fake tensors (the estimator's), where the kernels' arithmetic
    is skipped: it has no numbers to compute and allocates nothing the caching allocator holds."""
    bf16, f32 = torch.bfloat16, torch.float32
    values = FakeTensorMode() if fake else contextlib.nullcontext()
    with values:
        xs = inputs(bf16)
        xs[3] = xs[3].detach().float().requires_grad_()  # g in float32, as transformers computes it
    mode = Allocations(ALLOCATING)
    with values, mode:
        o, _ = chunk_gated_delta_rule(*xs[:3], g=xs[3], beta=xs[4], use_qk_l2norm_in_kernel=True,
                                      registers=mode.registers)
        forward = list(mode.made)
        mode.made.clear()
        o.backward(torch.ones_like(o))
    nt, qk, v, bth, rows = 2, (B, T, HV, K), (B, T, HV, V), (B, T, HV), B * T * HV
    chunk, state = (B, T, HV, gated_delta_rule.CHUNK), (B, nt, HV, K, V)
    repeated = (B, T, HK, HV // HK, K)  # q and k repeated to the value heads (repeat_interleave)
    assert forward == [
        (repeated, bf16), (repeated, bf16),
        ((rows, K), bf16), ((rows,), f32),  # l2norm_fwd(q): y = torch.empty_like(x), rstd [T] float32
        ((rows, K), bf16), ((rows,), f32),  # l2norm_fwd(k)
        (bth, f32),  # chunk_local_cumsum: torch.empty_like(g, dtype=torch.float)
        (chunk, f32),  # chunk_scaled_dot_kkt_fwd: A = torch.empty(B, T, H, BT, dtype=float32)
        (chunk, bf16),  # solve_tril: torch.zeros_like(A, dtype=k.dtype)
        (qk, bf16), (v, bf16),  # recompute_w_u_fwd: w, u = torch.empty_like(k), torch.empty_like(v)
        (state, bf16), (v, bf16),  # chunk_gated_delta_rule_fwd_h: h = k.new_empty(B, NT, H, K, V), v_new
        (v, bf16),  # chunk_fwd_o: o = torch.empty_like(v)
    ]
    nk = 1  # chunk_bwd_dqkwg: NK = cdiv(K, BK), BK = min(max(next_power_of_2(16), 16), 64) = 16
    assert mode.made == [
        (qk, bf16), (v, bf16),  # recompute_w_u_fwd: w, u
        (state, bf16), (v, bf16),  # chunk_gated_delta_rule_fwd_h: h, v_new
        (v, bf16),  # chunk_bwd_dv_local: dv = torch.empty_like(do)
        (state, bf16), (v, bf16),  # chunk_gated_delta_rule_bwd_dhu: dh = q.new_empty(B, NT, H, K, V), dv2
        (qk, bf16), (qk, bf16), ((nk, *bth), f32), (qk, bf16),  # chunk_bwd_dqkwg: dq, dk, dg [NK, ...], dw
        (bth, f32),  # dg.sum(0)
        (qk, bf16), (v, bf16), (bth, f32), (bth, bf16),  # prepare_wy_repr_bwd: dk, dv, dg, db
        (bth, f32),  # chunk_local_cumsum(dg, reverse=True)
        ((rows, K), bf16), ((rows, K), bf16),  # l2norm_bwd: dx = torch.empty_like(y), for q and k
        ((B, T, HK, 1, K), bf16), ((B, T, HK, 1, K), bf16),  # repeat_interleave's backward: a sum
    ]


def test_on_fake_tensors_the_arithmetic_does_not_grow_with_the_chunks() -> None:
    """The chunked form's ops, one per chunk and step, run on numbers only (issue #34: 18,000 fake
    dispatches a layer at 2048 tokens); on fake tensors the L2 norms' and cumsums' few ops remain."""
    def computed(length: int) -> int:
        mode = Allocations(ALLOCATING)
        with FakeTensorMode():
            xs = [torch.randn(B, length, *x.shape[2:]).requires_grad_() for x in inputs()]
            with mode:
                o, _ = chunk_gated_delta_rule(*xs[:3], g=xs[3], beta=xs[4], use_qk_l2norm_in_kernel=True,
                                              registers=mode.registers)
                o.backward(torch.ones_like(o))
        return mode.computed

    assert computed(32 * gated_delta_rule.CHUNK) == computed(T) > 0


def test_every_gated_deltanet_layer_of_a_preset_calls_the_emulation() -> None:
    from transformers import AutoModelForCausalLM

    for name in ("tiny-qwen3_5_text", "tiny-qwen3_5_moe_text", "tiny-qwen3_next"):
        config = resolve_model(name).config
        with FakeTensorMode():
            model = AutoModelForCausalLM.from_config(config)
        linear = sum(kind == "linear_attention" for kind in config.layer_types)
        assert linear == 3
        assert gated_delta_rule.apply(model, contextlib.nullcontext) == linear
        assert gated_delta_rule.hybrid(PRESETS[name]["model_type"])


def test_the_patched_model_gives_the_fallbacks_loss_and_gradients() -> None:
    from transformers import AutoModelForCausalLM

    config = resolve_model("tiny-qwen3_5_text").config
    torch.manual_seed(0)
    reference = AutoModelForCausalLM.from_config(config)
    patched = AutoModelForCausalLM.from_config(config)
    patched.load_state_dict(reference.state_dict())
    gated_delta_rule.apply(patched, contextlib.nullcontext)
    ids = torch.randint(0, 128, (2, 70))
    losses = [model(input_ids=ids, labels=ids).loss for model in (reference, patched)]
    torch.testing.assert_close(losses[1], losses[0])
    for loss in losses:
        loss.backward()
    for (name, want), have in zip(reference.named_parameters(), patched.parameters(), strict=True):
        torch.testing.assert_close(have.grad, want.grad, atol=1e-5, rtol=1e-4,
                                   msg=lambda text, name=name: f"{name}: {text}")
