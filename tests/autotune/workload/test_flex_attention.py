"""attn_implementation flex_attention, emulated (workload/flex_attention.py): eager's outputs and gradients
on real tensors, the buffers inductor's Triton lowering allocates and saves, the BlockMask's tensors, the
estimator's check, and the Axolotl reader."""

from __future__ import annotations

import json

import configread
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from autotune.backends.estimate.trace import Trace
from autotune.backends.estimate.tracker import StorageTracker, outside_allocator
from autotune.errors import InvalidInput
from autotune.workload import flex_attention
from autotune.workload.models import resolve_model
from autotune.workload.step import FLEX_ATTENTION, build_model


def _step(model, input_ids, attention_mask):
    model.zero_grad()
    out = model(input_ids=input_ids, attention_mask=attention_mask, labels=input_ids)
    out.loss.backward()
    return out.logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_the_emulated_kernel_gives_eager_outputs_and_gradients_over_a_padded_batch():
    torch.manual_seed(0)
    spec = resolve_model("tiny-llama")  # 2 query heads over 1 key head: grouped, enable_gqa
    eager, _ = build_model(spec, "causal-lm", "eager")
    emulated, used = build_model(spec, "causal-lm", FLEX_ATTENTION, flash_as_sdpa=True)
    emulated.load_state_dict(eager.state_dict())
    input_ids = torch.randint(3, spec.config.vocab_size, (2, 128))
    attention_mask = torch.ones(2, 128, dtype=torch.long)
    attention_mask[1, -5:] = 0  # padded keys: the BlockMask's padding mask_mod
    logits, grads = _step(eager, input_ids, attention_mask)
    emulated_logits, emulated_grads = _step(emulated, input_ids, attention_mask)
    assert used == FLEX_ATTENTION
    torch.testing.assert_close(emulated_logits, logits, rtol=1e-4, atol=1e-5)
    assert set(emulated_grads) == set(grads)
    for name, grad in emulated_grads.items():
        torch.testing.assert_close(grad, grads[name], rtol=1e-4, atol=1e-5, msg=name)


def _events(q_shape, kv_heads):
    """(saved tensors' shapes and dtypes, forward events, backward events) of one call on fake bf16
    q [B, H, S, D] laid out [B, S, H, D] (a projection's view, as transformers' layers make it)."""
    batch, heads, seq, dim = q_shape
    with FakeTensorMode():
        q = torch.empty(batch, seq, heads, dim, dtype=torch.bfloat16, requires_grad=True).transpose(1, 2)
        k = torch.empty(batch, seq, kv_heads, dim, dtype=torch.bfloat16, requires_grad=True).transpose(1, 2)
        v = torch.empty(batch, seq, kv_heads, dim, dtype=torch.bfloat16, requires_grad=True).transpose(1, 2)
        with StorageTracker(reductions=True) as tracker:
            mask = flex_attention.create_block_mask(lambda b, h, i, j: i >= j, batch, seq, seq, q.device)
            made = len(tracker.events)
            out, lse = flex_attention.flex_attention(q, k, v, mask, registers=outside_allocator)
            saved = [(tuple(t.shape), t.dtype) for t in out.grad_fn.saved_tensors]
            forward = len(tracker.events)
            out.backward(torch.empty_like(out))  # lse unused, as the decoder layers drop it
    events = Trace.from_events(1, tracker.events, tracker.workspaces).events()
    return out, lse, saved, events[:made], events[made:forward], events[forward:]


def _sizes(events):
    return [n for _, n in events if n >= 0]


def test_the_kernels_allocate_and_save_what_inductors_flex_lowering_does():
    # 8 query heads over 2 key heads, head dim 64, 256 positions: 2 x 2 blocks of 128
    out, lse, saved, mask, forward, backward = _events((2, 8, 256, 64), kv_heads=2)
    whole, grouped, rows = 2 * 8 * 256 * 64 * 2, 2 * 2 * 256 * 64 * 2, 2 * 8 * 256 * 4
    # create_block_mask: kv_num_blocks int32 [B, 1, 2], kv_indices [B, 1, 2, 2], the full_* pair, and
    # the q_* transposes (4 bytes x 2 x 2 = 16, 4 x 2 x 2 x 2 = 32)
    assert _sizes(mask) == [16, 32] * 4
    assert (tuple(out.shape), out.dtype, tuple(lse.shape), lse.dtype) == (
        (2, 8, 256, 64), torch.bfloat16, (2, 8, 256), torch.float32)
    assert out.transpose(1, 2).is_contiguous()  # the query's stride order: transformers' contiguous() is free
    # q, k, v, out, logsumexp, and the BlockMask's eight tensors
    assert saved[:5] == [((2, 8, 256, 64), torch.bfloat16), ((2, 2, 256, 64), torch.bfloat16),
                         ((2, 2, 256, 64), torch.bfloat16), ((2, 8, 256, 64), torch.bfloat16),
                         ((2, 8, 256), torch.float32)]
    assert len(saved) == 13
    # out, logsumexp, max_scores (freed at once), lse * ln2
    assert _sizes(forward) == [whole, rows, rows, rows]
    assert [n for _, n in forward].index(-1) == 3
    # the zero gradient of the unused lse, grad_lse_exp2, delta, dq, dv, dk (grouped: Hkv heads)
    sizes = _sizes(backward)
    start = sizes.index(rows)
    assert sizes[start:start + 6] == [rows, rows, rows, whole, grouped, grouped]


def test_the_kernel_refuses_what_it_does_not_emulate():
    q = torch.empty(1, 2, 256, 8)
    mask = flex_attention.create_block_mask(lambda b, h, i, j: i >= j, 1, 256, 256, "cpu")
    with pytest.raises(InvalidInput, match="head dims of at least 16"):
        flex_attention.flex_attention(q, q, q, mask)
    short = torch.empty(1, 2, 64, 16)
    with pytest.raises(InvalidInput, match="decoding kernel for fewer than 128 queries"):
        flex_attention.flex_attention(short, short, short, mask)


def test_a_check_names_the_kernel_emulated_and_refuses_short_sequences(capsys):
    from autotune.cli import main

    args = ["check", "tiny-llama", "--batch-size", "2", "--attn", FLEX_ATTENTION, "--backend", "estimate",
            "--no-cache", "--mode", "bf16", "--gpu", "H100-80GB"]
    assert main([*args, "--seq-len", "128", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["attention_kernel"] == "flex_attention (Triton, emulated)"
    recomputed = [*args[:-4], "--mode", "bf16+ckpt", "--gpu", "H100-80GB", "--seq-len", "128"]
    assert main(recomputed) == 0  # checkpointing unpacks the saved tensors once
    capsys.readouterr()
    assert main([*args, "--seq-len", "64"]) == 2
    assert "decoding kernel" in capsys.readouterr().err


def test_a_model_without_flex_support_is_refused_by_name():
    with pytest.raises(InvalidInput, match="does not support flex_attention|cannot be modelled"):
        build_model(resolve_model("tiny-gpt2"), "causal-lm", FLEX_ATTENTION, flash_as_sdpa=True)


AXOLOTL = {"base_model": "meta-llama/Llama-3.2-1B", "sequence_len": 2048, "micro_batch_size": 1, "bf16": True,
           "datasets": [{"path": "tatsu-lab/alpaca", "type": "alpaca"}]}


def test_an_axolotl_config_reads_flex_attention_and_its_16_bit_embeddings(tmp_path):
    # a full fine-tune in bf16: with flex_attention Axolotl casts the embeddings and norms back to
    # bfloat16 (attn_needs_dtype_cast), as with flash; with sdpa it keeps them float32 (workload/upcast.py)
    plan = configread.read(tmp_path, {**AXOLOTL, "attn_implementation": "flex_attention",
                                      "flex_attn_compile_kwargs": {"dynamic": False}}, "config.yaml")
    assert plan.attn == FLEX_ATTENTION
    legacy = configread.read(tmp_path, {**AXOLOTL, "flex_attention": True}, "config.yaml")
    assert legacy.attn == FLEX_ATTENTION
    assert plan.float32_embeddings is None
    assert configread.read(tmp_path, {**AXOLOTL, "attn_implementation": "sdpa"},
                           "config.yaml").float32_embeddings is True
