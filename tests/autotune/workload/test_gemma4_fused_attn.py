"""Axolotl's fused Gemma 4 attention, emulated (workload/gemma4_fused_attn.py): transformers' own outputs
and gradients on real tensors, and the buffers kernels/gemma4_fused_rope.py allocates and saves."""

from __future__ import annotations

import contextlib
import copy
import math

import pytest
import torch
from allocations import backward_nodes

from autotune.workload import gemma4_fused_attn
from autotune.workload.models import resolve_model
from autotune.workload.step import build_model
from autotune.workload.vision import IMAGE_TEXT_TO_TEXT, make_images

REGISTERS = contextlib.nullcontext


def _models():
    torch.manual_seed(0)
    model, _ = build_model(resolve_model("tiny-gemma4"), IMAGE_TEXT_TO_TEXT, "sdpa")
    for name, param in model.named_parameters():  # norms' weights away from their initial ones
        if name.endswith("norm.weight"):
            param.data.uniform_(0.5, 1.5)
    patched = copy.deepcopy(model)
    assert gemma4_fused_attn.apply(patched, sm_count=2, registers=REGISTERS) == 2
    return model, patched


def _step(model, input_ids):
    model.zero_grad()
    out = model(input_ids=input_ids, labels=input_ids)
    out.loss.backward()
    return out.logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_the_fused_forward_gives_transformers_outputs_and_gradients():
    model, patched = _models()
    input_ids = torch.randint(3, model.config.text_config.vocab_size, (2, 24))
    logits, grads = _step(model, input_ids)
    fused_logits, fused_grads = _step(patched, input_ids)
    torch.testing.assert_close(fused_logits, logits, rtol=1e-4, atol=1e-5)
    assert fused_grads.keys() == grads.keys()
    assert any("q_norm" in name for name in grads) and any("k_norm" in name for name in grads)
    for name, grad in grads.items():
        torch.testing.assert_close(fused_grads[name], grad, rtol=1e-4, atol=1e-5, msg=name)
    # the emulated kernels are what ran: q and k of both layers, v of both
    nodes = backward_nodes(patched(input_ids=input_ids).logits)
    assert nodes.count("RmsNormRopeBackward") == 4 and nodes.count("RmsNormNoScaleBackward") == 2


@pytest.mark.parametrize("cos_batch", [1, 2])
def test_the_buffers_are_the_kernels(cos_batch):
    # _fused_rms_norm_rope_fwd: Y empty_like(X), RSTD [rows] float32; saves X, W, cos, sin [B*S, n_rot]
    # (dense copies of a batch-broadcast cos/sin), RSTD. _bwd: dX, _dW [min(8 * SMs, rows), D] float32.
    B, S, H, D, n_rot = 2, 5, 3, 8, 4
    x = torch.randn(B, S, H, D, dtype=torch.bfloat16, requires_grad=True)
    w = torch.rand(D, dtype=torch.bfloat16, requires_grad=True)
    cos, sin = torch.randn(cos_batch, S, n_rot), torch.randn(cos_batch, S, n_rot)
    y = gemma4_fused_attn.fused_rms_norm_rope(x, w, cos, sin, 1e-6, sm_count=1, registers=REGISTERS)
    assert y.shape == x.shape and y.dtype == torch.bfloat16
    node = y.grad_fn.next_functions[0][0]  # the view's input: the Function
    X, W, c, s, rstd = node.saved_tensors
    assert X.shape == (B * S * H, D) and X.dtype == torch.bfloat16
    assert W is not None and W.shape == (D,)
    assert c.shape == s.shape == (B * S, n_rot) and c.is_contiguous()
    assert rstd.shape == (B * S * H,) and rstd.dtype == torch.float32
    dY = torch.randn(B * S * H, D, dtype=torch.bfloat16)
    for sm_count, programs in ((1, 8), (2, 15), (100, 30)):
        rows_per_program = max(1, math.ceil(30 / min(8 * sm_count, 30)))
        assert math.ceil(30 / rows_per_program) == programs
        dX, dW = gemma4_fused_attn.rms_norm_rope_backward(dY, X, W, c, s, rstd, H, sm_count, REGISTERS)
        assert dX.shape == X.shape and dX.dtype == torch.bfloat16 and dW.dtype == torch.bfloat16


def test_the_weight_gradient_partials_are_per_program():
    allocated = []

    class Record(torch.utils._python_dispatch.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func is torch.ops.aten.empty.memory_format:
                allocated.append((tuple(out.shape), out.dtype))
            return out

    X = torch.randn(30, 8)
    W, cos, sin = torch.rand(8), torch.randn(10, 4), torch.randn(10, 4)
    Y, rstd = gemma4_fused_attn.rms_norm_rope_forward(X, W, cos, sin, 1e-6, 3, REGISTERS)
    with Record():
        gemma4_fused_attn.rms_norm_rope_backward(torch.randn(30, 8), X, W, cos, sin, rstd, 3, 2, REGISTERS)
    assert ((15, 8), torch.float32) in allocated  # 8 * 2 SMs over 30 rows: 2 rows a program, 15 programs
    allocated.clear()
    with Record():
        gemma4_fused_attn.rms_norm_noscale_forward(X, 1e-6, REGISTERS)
    assert ((30,), torch.float32) in allocated  # RSTD


def test_v_norm_is_transformers_no_scale_norm():
    from transformers.models.gemma4.modeling_gemma4 import Gemma4RMSNorm

    x = torch.randn(2, 5, 3, 8, requires_grad=True)
    own = Gemma4RMSNorm(8, eps=1e-6, with_scale=False)(x)
    (g,) = torch.autograd.grad(own.square().sum(), x)
    y = gemma4_fused_attn.fused_rms_norm_noscale(x, 1e-6, REGISTERS)
    (fg,) = torch.autograd.grad(y.square().sum(), x)
    torch.testing.assert_close(y, own)
    torch.testing.assert_close(fg, g)


def test_partial_rotary_passes_the_rest_through():
    # n_rot < D: the kernel rotates [0, n_rot) and leaves the normed rest (cos 1, sin 0 past n_rot).
    from transformers.models.gemma4.modeling_gemma4 import Gemma4RMSNorm, apply_rotary_pos_emb

    x = torch.randn(2, 5, 3, 8, requires_grad=True)
    norm = Gemma4RMSNorm(8, eps=1e-6)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    cos, sin = torch.randn(1, 5, 4), torch.randn(1, 5, 4)
    normed = norm(x)
    own = torch.cat([apply_rotary_pos_emb(normed[..., :4], cos, sin, unsqueeze_dim=2), normed[..., 4:]], -1)
    (g, gw) = torch.autograd.grad(own.square().sum(), (x, norm.weight))
    y = gemma4_fused_attn.fused_rms_norm_rope(x, norm.weight, cos, sin, 1e-6, sm_count=1, registers=REGISTERS)
    (fg, fgw) = torch.autograd.grad(y.square().sum(), (x, norm.weight))
    torch.testing.assert_close(y, own)
    torch.testing.assert_close(fg, g)
    torch.testing.assert_close(fgw, gw)


def test_the_estimator_traces_the_fused_forward_for_an_axolotl_job():
    # The workload's fused_attention swaps the emulation into the fake model (backends/estimate/liger.py),
    # which changes what the step holds: the kernels' own saved rows in place of transformers'.
    from autotune.backends.estimate.backend import EstimateBackend
    from autotune.gpus import custom_gpu
    from autotune.units import GIB
    from autotune.workload import Workload
    from autotune.workload.modes import parse_mode

    spec = resolve_model("tiny-gemma4")
    backend = EstimateBackend(custom_gpu(4 * GIB))
    text = make_images(0, None)  # text rows: Gemma 4's image merge is refused by the estimator
    plain = Workload(spec, IMAGE_TEXT_TO_TEXT, "sdpa", images=text)
    fused = Workload(spec, IMAGE_TEXT_TO_TEXT, "sdpa", images=text, fused_attention=True)
    forwards = [getattr(m.forward, "__name__", "") for m in backend._model(fused).model.modules()
                if type(m).__name__ == "Gemma4TextAttention"]
    assert forwards == ["fused_forward", "fused_forward"]
    assert not any(getattr(m.forward, "__name__", "") == "fused_forward"
                   for m in backend._model(plain).model.modules())

    def peak(workload):
        with backend.cell(workload, parse_mode("fp32"), 256, 4 * GIB) as cell:
            return int(cell.fits(8).details["peak_allocated_bytes"])

    assert peak(fused) != peak(plain)


def test_the_shared_kv_side_channel_keeps_the_last_forwards_keys_and_values_past_the_step():
    # fused_attn.py _patch_decoder_layer_call, under gradient checkpointing: the same outputs and
    # gradients, and the store holds the step's dict (its stored keys and values) after backward.
    model, patched = _models()
    model.gradient_checkpointing_enable({"use_reentrant": False})
    patched.gradient_checkpointing_enable({"use_reentrant": False})
    model.train(), patched.train()
    input_ids = torch.randint(3, model.config.text_config.vocab_size, (2, 24))
    logits, grads = _step(model, input_ids)
    with gemma4_fused_attn.side_channel(patched, True):
        fused_logits, fused_grads = _step(patched, input_ids)
        store = patched.model.language_model.layers[0]._axolotl_shared_kv
        kept = store["store"]
        assert kept is not None and set(kept) == {"sliding_attention", "full_attention"}
        key, value = kept["full_attention"]
        assert tuple(key.shape) == (2, 1, 24, 32)  # [batch, kv heads, seq, the full layers' head_dim]
    assert store["store"] is None  # emptied after the block
    torch.testing.assert_close(fused_logits, logits, rtol=1e-4, atol=1e-5)
    for name, grad in grads.items():
        torch.testing.assert_close(fused_grads[name], grad, rtol=1e-4, atol=1e-5, msg=name)
    _step(patched, input_ids)  # off: nothing kept
    assert store["store"] is None


def _unified_models(checkpointing: bool):
    """A tiny Gemma4UnifiedForCausalLM (gemma4_unified_text) and its copy under the emulation."""
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    config = AutoConfig.for_model(
        "gemma4_unified_text", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=16, global_head_dim=32, sliding_window=64,
        vocab_size=128, layer_types=["sliding_attention", "full_attention"], attention_k_eq_v=True,
        num_global_key_value_heads=1, num_kv_shared_layers=0, attn_implementation="sdpa")
    model = AutoModelForCausalLM.from_config(config)
    for name, param in model.named_parameters():
        if name.endswith("norm.weight"):
            param.data.uniform_(0.5, 1.5)
    patched = copy.deepcopy(model)
    assert gemma4_fused_attn.apply(patched, sm_count=2, registers=REGISTERS) == 2
    for m in (model, patched):
        if checkpointing:
            m.gradient_checkpointing_enable({"use_reentrant": False})
        m.train()
    return model, patched


@pytest.mark.parametrize("checkpointing", [False, True])
def test_gemma4_unified_s_attention_runs_the_same_fused_forward(checkpointing):
    # monkeypatch/models/gemma4_unified/fused_attn.py: gemma4's fused forward on Gemma4UnifiedTextAttention
    # (the same kernels), its side channel on Gemma4UnifiedTextDecoderLayer under checkpointing
    model, patched = _unified_models(checkpointing)
    input_ids = torch.randint(3, 128, (2, 24))
    logits, grads = _step(model, input_ids)
    with gemma4_fused_attn.side_channel(patched, checkpointing):
        fused_logits, fused_grads = _step(patched, input_ids)
        kept = patched.model.layers[0]._axolotl_shared_kv["store"]
        assert (kept is not None) == checkpointing
    torch.testing.assert_close(fused_logits, logits, rtol=1e-4, atol=1e-5)
    assert fused_grads.keys() == grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(fused_grads[name], grad, rtol=1e-4, atol=1e-5, msg=name)
    nodes = backward_nodes(patched(input_ids=input_ids).logits)
    assert nodes.count("RmsNormRopeBackward") == 4 and nodes.count("RmsNormNoScaleBackward") == 2
    assert gemma4_fused_attn.patched("gemma4_unified") and gemma4_fused_attn.patched("gemma4_unified_text")
