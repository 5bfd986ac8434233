"""A dynamic rope on fake tensors (backends/estimate/rope.py): transformers' own update, its length known."""

from __future__ import annotations

import copy

import pytest
import torch
from torch._subclasses.fake_tensor import DataDependentOutputException, FakeTensorMode
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

from autotune.backends.estimate.rope import route_dynamic_rope

DYNAMIC = LlamaConfig(hidden_size=32, num_attention_heads=2, max_position_embeddings=128,
                      rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0})


def _positions(seq_len: int) -> torch.Tensor:
    return torch.arange(seq_len)[None, :]


@pytest.mark.parametrize("lengths", [[256], [64], [256, 64], [200, 300, 100]])
def test_the_routed_update_matches_transformers_on_real_tensors(lengths):
    """The same tensors (shape, dtype, values up to rounding) and the same cached length."""
    own = LlamaRotaryEmbedding(DYNAMIC)
    routed = copy.deepcopy(own)
    route_dynamic_rope(routed)
    assert "forward" in vars(routed) and "forward" not in vars(own)
    x = torch.randn(1, 4, 32)
    for seq_len in lengths:
        expected, got = own(x, _positions(seq_len)), routed(x, _positions(seq_len))
        # transformers' length is a tensor, whose float32 arithmetic rounds the NTK base a little otherwise
        for a, b in zip(expected, got, strict=True):
            torch.testing.assert_close(a, b)
        torch.testing.assert_close(own.inv_freq, routed.inv_freq)
        assert own.max_seq_len_cached == routed.max_seq_len_cached
        assert own.attention_scaling == routed.attention_scaling


def test_the_routed_update_runs_on_fake_tensors_where_transformers_cannot():
    with FakeTensorMode():
        own, routed = LlamaRotaryEmbedding(DYNAMIC), LlamaRotaryEmbedding(DYNAMIC)
        route_dynamic_rope(routed)
        x = torch.empty(1, 256, 32)
        with pytest.raises(DataDependentOutputException):
            own(x, _positions(256))
        cos, sin = routed(x, _positions(256))
    assert cos.shape == sin.shape == (1, 256, 16)
    assert routed.max_seq_len_cached == 256


def test_other_rope_types_are_left_as_they_are():
    default = LlamaRotaryEmbedding(LlamaConfig(hidden_size=32, num_attention_heads=2))
    route_dynamic_rope(default)
    assert "forward" not in vars(default)


@pytest.mark.parametrize("seq_len", ["64", "256"])  # within max_position_embeddings=128, and past it
def test_a_dynamic_rope_model_is_checked(capsys, seq_len):
    from autotune.cli import main

    overrides = '{"rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}}'
    code = main(["check", "tiny-llama", "--seq-len", seq_len, "--batch-size", "2", "--gpu-memory", "1GiB",
                 "--backend", "estimate", "--workers", "1", "--no-cache", "--config-overrides", overrides])
    out, _ = capsys.readouterr()
    assert code == 0 and out.startswith(f"fits: tiny-llama seq {seq_len} fp32 ")
