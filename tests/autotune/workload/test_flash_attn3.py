"""attn_implementation kernels-community/vllm-flash-attn3, emulated (workload/flash_attn3.py): gpt-oss'
eager outputs and gradients on real tensors, the buffers flash_api.cpp allocates and saves, the
estimator's check, and the readers' and the support checks' refusals by name."""

from __future__ import annotations

import json

import configread
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from autotune.backends.estimate.trace import Trace
from autotune.backends.estimate.tracker import StorageTracker, outside_allocator
from autotune.errors import InvalidInput, UnmodelledSetting
from autotune.workload import flash_attn3
from autotune.workload.models import resolve_model
from autotune.workload.step import VLLM_FLASH_ATTN3, build_model


def _step(model, input_ids):
    model.zero_grad()
    out = model(input_ids=input_ids, labels=input_ids)
    out.loss.backward()
    return out.logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_the_emulated_kernel_gives_gpt_oss_eager_outputs_and_gradients_but_none_to_the_sinks(monkeypatch):
    # In float32, which the real kernel refuses (check_inputs, relaxed here), the arithmetic is exact:
    # softmax over the keys and the sink, the sliding window of the first layer (24 positions > 8).
    monkeypatch.setattr(flash_attn3, "check_inputs", lambda *args: None)
    torch.manual_seed(0)
    spec = resolve_model("tiny-gpt_oss")
    eager, _ = build_model(spec, "causal-lm", "eager")
    emulated, used = build_model(spec, "causal-lm", VLLM_FLASH_ATTN3, flash_as_sdpa=True)
    emulated.load_state_dict(eager.state_dict())
    for module in eager.modules():
        if hasattr(module, "sinks"):
            module.sinks.data.uniform_(-1.0, 1.0)  # away from their init, so that they count
    emulated.load_state_dict(eager.state_dict())
    input_ids = torch.randint(3, spec.config.vocab_size, (2, 24))
    logits, grads = _step(eager, input_ids)
    emulated_logits, emulated_grads = _step(emulated, input_ids)
    assert used == VLLM_FLASH_ATTN3
    torch.testing.assert_close(emulated_logits, logits, rtol=1e-4, atol=1e-5)
    # FlashAttnFunc.backward returns None for s_aux: the sinks get no gradient from the kernel
    assert set(grads) - set(emulated_grads) == {f"model.layers.{i}.self_attn.sinks" for i in (0, 1)}
    for name, grad in emulated_grads.items():
        torch.testing.assert_close(grad, grads[name], rtol=1e-4, atol=1e-5, msg=name)


def _events(q_shape, kv_shape, window=(-1, -1), arch=(9, 0)):
    with FakeTensorMode():
        q = torch.empty(q_shape, dtype=torch.bfloat16, requires_grad=True)
        k = torch.empty(kv_shape, dtype=torch.bfloat16, requires_grad=True)
        v = torch.empty(kv_shape, dtype=torch.bfloat16, requires_grad=True)
        sinks = torch.empty(q_shape[2], dtype=torch.bfloat16)
        with StorageTracker(reductions=True) as tracker:
            out, lse = flash_attn3.flash_attn_func(q, k, v, causal=True, window_size=window, s_aux=sinks,
                                                   arch=arch, registers=outside_allocator)
            saved = [(tuple(t.shape), t.dtype) for t in out.grad_fn.saved_tensors]
            forward = len(tracker.events)
            out.backward(torch.empty_like(out))  # a dense dout, as o_proj's backward gives it
    # (allocation index, bytes), a free as (index, -1)
    events = Trace.from_events(1, tracker.events, tracker.workspaces).events()
    return out, lse, saved, events[:forward], events[forward:]


def _sizes(events):
    return [n for _, n in events if n >= 0]


def _freed_at_once(events, start, count):
    """The ``count`` allocations from ``start`` on, all freed before any other allocation follows."""
    made = [i for i, n in events if n >= 0]
    indexes = set(made[start:start + count])
    after = events[[i for i, _ in events].index(made[start + count - 1]) + 1:]
    frees = [i for i, n in after[:count] if n < 0]
    return set(frees) == indexes


def test_the_kernel_allocates_and_saves_what_flash_api_cpp_does():
    # gpt-oss' shapes, small: 8 query heads over 2 key heads, head dim 64, 100 positions, on Hopper
    out, lse, saved, forward, backward = _events((2, 100, 8, 64), (2, 100, 2, 64))
    whole, grouped = 2 * 100 * 8 * 64 * 2, 2 * 100 * 2 * 64 * 2  # bf16 [B, S, H, D], [B, S, Hk, D]
    assert (tuple(out.shape), out.dtype, tuple(lse.shape), lse.dtype) == (
        (2, 100, 8, 64), torch.bfloat16, (2, 8, 100), torch.float32)
    # ctx.save_for_backward(q, k, v, out, softmax_lse)
    assert saved == [((2, 100, 8, 64), torch.bfloat16), ((2, 100, 2, 64), torch.bfloat16),
                     ((2, 100, 2, 64), torch.bfloat16), ((2, 100, 8, 64), torch.bfloat16),
                     ((2, 8, 100), torch.float32)]
    # mha_fwd: out, softmax_lse, the causal scheduler's int32 semaphore, freed as it returns
    assert _sizes(forward)[:3] == [whole, 2 * 8 * 100 * 4, 4] and _freed_at_once(forward, 2, 1)
    # dq, dk, dv (empty_like), then mha_bwd's: kBlockM = kBlockN = 128 at a head dim of 64 on sm90,
    # softmax_d and softmax_lse_log2 [B, H, 128], dq_accum [B, H, 128 * 64], dk_accum and dv_accum
    # [B, Hk, 128 * 64] (grouped keys), dq_semaphore int32 [1, B, H]; all freed before the kernel returns
    temporaries = [2 * 8 * 128 * 4, 2 * 8 * 128 * 4, 2 * 8 * 128 * 64 * 4, 2 * 2 * 128 * 64 * 4,
                   2 * 2 * 128 * 64 * 4, 1 * 2 * 8 * 4]
    sizes = _sizes(backward)
    start = next(i for i in range(len(sizes)) if sizes[i:i + 3] == [whole, grouped, grouped])
    assert sizes[start:start + 9] == [whole, grouped, grouped, *temporaries]
    assert _freed_at_once(backward, start + 3, 6)


def test_the_backward_blocks_follow_the_card_and_the_head_dim():
    assert flash_attn3.backward_blocks((9, 0), 64, causal=True, local=False) == (128, 128)
    assert flash_attn3.backward_blocks((9, 0), 128, causal=True, local=False) == (64, 128)
    assert flash_attn3.backward_blocks((9, 0), 128, causal=False, local=False) == (80, 128)
    assert flash_attn3.backward_blocks((8, 0), 128, causal=True, local=False) == (64, 128)
    assert flash_attn3.backward_blocks((8, 6), 256, causal=True, local=False) == (32, 64)
    backward = _sizes(_events((1, 200, 4, 128), (1, 200, 4, 128), arch=(8, 0))[4])
    # sm80, head dim 128: kBlockM 64, 200 rows rounded to 256; no dk/dv accumulators without grouped keys
    dq = 1 * 200 * 4 * 128 * 2
    start = backward.index(dq, backward.index(dq) + 1)  # after dout
    assert backward[start:start + 7] == [dq, dq, dq, 1 * 4 * 256 * 4, 1 * 4 * 256 * 4, 1 * 4 * 256 * 128 * 4,
                                         4 * 1 * 4 * 4]


def test_the_kernel_refuses_what_mha_fwd_refuses():
    q = torch.empty(1, 8, 4, 64, dtype=torch.bfloat16)
    with pytest.raises(InvalidInput, match="bfloat16 only"):
        flash_attn3.flash_attn_func(q, q, q, s_aux=torch.empty(4, dtype=torch.float16))
    with pytest.raises(InvalidInput, match="float16/bfloat16 inputs only"):
        flash_attn3.flash_attn_func(q.float(), q.float(), q.float())
    many = torch.empty(1, 8, 72, 64, dtype=torch.bfloat16)
    with pytest.raises(InvalidInput, match="up to 64 query heads"):
        flash_attn3.flash_attn_func(many, many, many, s_aux=torch.empty(72, dtype=torch.bfloat16))


def test_a_check_names_the_kernel_emulated_and_refuses_cards_without_its_sinks(capsys):
    from autotune.cli import main

    args = ["check", "tiny-gpt_oss", "--seq-len", "64", "--batch-size", "2", "--dtype", "bfloat16",
            "--attn", VLLM_FLASH_ATTN3, "--backend", "estimate", "--no-cache"]
    assert main([*args, "--mode", "bf16", "--gpu", "H100-80GB", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["attention_kernel"] == "kernels-community/vllm-flash-attn3 (emulated)"
    assert main([*args, "--mode", "bf16", "--gpu", "A100-80GB"]) == 2
    assert "attention sinks on Hopper (compute capability 9.0) only" in capsys.readouterr().err
    assert main([*args, "--mode", "amp", "--gpu", "H100-80GB"]) == 2
    assert "sinks in bfloat16 only" in capsys.readouterr().err


AXOLOTL = {"base_model": "openai/gpt-oss-20b", "sequence_len": 4096, "micro_batch_size": 1, "bf16": True,
           "adapter": "lora", "lora_r": 8, "lora_alpha": 16, "lora_target_linear": True,
           "datasets": [{"path": "tatsu-lab/alpaca", "type": "alpaca"}]}


def test_an_axolotl_config_reads_the_hub_kernel_and_refuses_others_by_name(tmp_path):
    plan = configread.read(tmp_path, {**AXOLOTL, "attn_implementation": VLLM_FLASH_ATTN3}, "config.yaml")
    assert plan.attn == VLLM_FLASH_ATTN3
    refused = "'kernels-community/sage-attention'.*a Hub attention kernel"
    with pytest.raises(UnmodelledSetting, match=refused):
        configread.read(tmp_path, {**AXOLOTL, "attn_implementation": "kernels-community/sage-attention"},
                        "config.yaml")


def test_gpt_oss_flash_attention_2_is_the_hub_kernel_transformers_falls_back_to_on_cuda(monkeypatch):
    # modeling_utils.py _check_and_adjust_attn_implementation: gpt-oss names its flash kernels
    # (_compatible_flash_implementations), and a flash attention it does not name becomes the first
    # with a CUDA build; a model naming none keeps flash_attention_2.
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssPreTrainedModel

    from autotune.workload.step import FLASH_ATTENTION_2, cuda_attention, cuda_attention_note

    gpt_oss, llama = resolve_model("tiny-gpt_oss").config, resolve_model("tiny-llama").config
    assert cuda_attention(gpt_oss, "causal-lm", FLASH_ATTENTION_2) == VLLM_FLASH_ATTN3
    assert cuda_attention(gpt_oss, "causal-lm", "eager") == "eager"
    assert cuda_attention(llama, "causal-lm", FLASH_ATTENTION_2) == FLASH_ATTENTION_2
    assert cuda_attention_note(llama, "causal-lm", FLASH_ATTENTION_2) is None
    assert "runs kernels-community/vllm-flash-attn3 in its place for gpt_oss" in str(
        cuda_attention_note(gpt_oss, "causal-lm", FLASH_ATTENTION_2))
    monkeypatch.setattr(GptOssPreTrainedModel, "_compatible_flash_implementations", ["flash_attention_4"])
    with pytest.raises(InvalidInput, match="transformers runs flash_attention_4 in its place for gpt_oss"):
        cuda_attention(gpt_oss, "causal-lm", FLASH_ATTENTION_2)


def test_a_gpt_oss_check_with_flash_attention_2_runs_and_names_the_kernel_emulated(capsys):
    from autotune.cli import main

    args = ["check", "tiny-gpt_oss", "--seq-len", "64", "--batch-size", "2", "--dtype", "bfloat16",
            "--attn", "flash_attention_2", "--backend", "estimate", "--no-cache", "--mode", "bf16"]
    assert main([*args, "--gpu", "H100-80GB", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["attn"] == VLLM_FLASH_ATTN3
    assert doc["attention_kernel"] == "kernels-community/vllm-flash-attn3 (emulated)"
    assert any("attn flash_attention_2: transformers runs kernels-community/vllm-flash-attn3" in note
               for note in doc["config_notes"])
    assert main([*args, "--gpu", "A100-80GB"]) == 2  # the sinks: Hopper only, as the kernel's own
    assert "attention sinks on Hopper (compute capability 9.0) only" in capsys.readouterr().err
