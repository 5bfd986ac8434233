"""The emulated LLM.int8 layer (int8.py) against bitsandbytes 0.50's CUDA sizes, cited beside each:
bitsandbytes cannot run here, so each allocation is compared with what its source allocates."""

from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from autotune.backends.estimate.instrument import RecordingTracker
from autotune.backends.estimate.int8 import MATMUL_REGION, EmulatedLinear8bitLt, int8_storage_bytes

M, K, N = 6, 64, 32  # rows (batch x sequence), in and out features


def _layer() -> EmulatedLinear8bitLt:
    return EmulatedLinear8bitLt(torch.nn.Linear(K, N, bias=False, dtype=torch.bfloat16))


def test_an_8bit_layer_stores_int8_weights_and_a_float32_scale_per_row():
    with FakeTensorMode():
        layer = _layer()
    weight = layer.weight
    assert (weight.dtype, tuple(weight.shape), weight.requires_grad) == (torch.int8, (N, K), False)
    assert (layer.SCB.dtype, tuple(layer.SCB.shape)) == (torch.float32, (N,))
    assert int8_storage_bytes(K, N) == {"weight": N * K, "SCB": N * 4}


def test_the_forward_quantizes_the_input_and_keeps_it_for_backward():
    with FakeTensorMode():
        layer = _layer()
        x = torch.empty(M, K, dtype=torch.bfloat16, requires_grad=True)
        with RecordingTracker() as tracker:
            out = layer(x)
    made = [(a.shape, a.dtype) for a in tracker.allocations if a.region == MATMUL_REGION]
    # MatMul8bitLt.forward: A.to(float16); int8_vectorwise_quant (backends/cuda/ops.py): row_stats
    # float32 [M], out_row int8 [M, K], A.abs() >= threshold (float16 and bool [M, K]), any(dim=0)
    # [K]; int8_linear_matmul int32 [M, N]; int8_mm_dequant float16 [M, N] (its .to(dtype) is the
    # output, handed out).
    assert made == [((M, K), "float16"), ((M,), "float32"), ((M, K), "int8"), ((M, K), "float16"),
                    ((M, K), "bool"), ((K,), "bool"), ((M, N), "int32"), ((M, N), "float16")]
    assert (tuple(out.shape), out.dtype) == ((M, N), torch.bfloat16)
    # ctx.tensors = (CAt, subA, A): the input lives on with the output's graph.
    assert out.grad_fn is not None


def test_the_backward_dequantizes_the_weight_in_the_input_dtype():
    with FakeTensorMode():
        layer = _layer()
        x = torch.empty(M, K, dtype=torch.bfloat16, requires_grad=True)
        out = layer(x)
        with RecordingTracker() as tracker:
            out.sum().backward()
    made = [(a.shape, a.dtype) for a in tracker.allocations if a.region == MATMUL_REGION]
    # MatMul8bitLt.backward: state.CB.to(dtype_A, copy=True) [N, K], SCB.unsqueeze(1).mul(1/127)
    # float32 [N, 1] (fake tensors add a float32 [N, 1] for mul_'s type promotion, which a CUDA
    # kernel casts in registers: 4 bytes a row); the input's gradient (handed out) is the matmul's.
    assert made[0] == ((N, K), "bfloat16") and set(made[1:]) == {((N, 1), "float32")}
    assert x.grad is not None and x.grad.shape == (M, K)


def test_a_frozen_input_is_not_kept_and_gets_no_gradient():
    with FakeTensorMode():
        layer = _layer()
        x = torch.empty(M, K, dtype=torch.bfloat16)
        assert layer(x).requires_grad is False  # nothing to keep: ctx.needs_input_grad[0] is False
