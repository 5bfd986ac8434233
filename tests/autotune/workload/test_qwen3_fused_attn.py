"""Axolotl's fused_attn_kernel for Qwen3, emulated (workload/qwen3_fused_attn.py): transformers' own outputs
and gradients on real tensors through the emulated fused RMSNorm + RoPE kernel, the estimator's check of an
Axolotl config with it, and its refusal for the model types whose fused forward is not emulated."""

from __future__ import annotations

import contextlib
import copy
import json

import configread
import torch
from allocations import backward_nodes

from autotune.workload import qwen3_fused_attn
from autotune.workload.models import resolve_model
from autotune.workload.step import build_model


def _step(model, input_ids):
    model.zero_grad()
    out = model(input_ids=input_ids, labels=input_ids)
    out.loss.backward()
    return out, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_the_fused_forward_gives_transformers_outputs_and_gradients():
    torch.manual_seed(0)
    model, _ = build_model(resolve_model("tiny-qwen3"), "causal-lm", "sdpa")
    for name, param in model.named_parameters():  # norms' weights away from their initial ones
        if name.endswith("norm.weight"):
            param.data.uniform_(0.5, 1.5)
    patched = copy.deepcopy(model)
    assert qwen3_fused_attn.apply(patched, sm_count=2, registers=contextlib.nullcontext) == 2
    input_ids = torch.randint(3, 128, (2, 24))
    out, grads = _step(model, input_ids)
    fused_out, fused_grads = _step(patched, input_ids)
    torch.testing.assert_close(fused_out.logits, out.logits, rtol=1e-4, atol=1e-5)
    assert fused_grads.keys() == grads.keys() and any("q_norm" in name for name in grads)
    for name, grad in grads.items():
        torch.testing.assert_close(fused_grads[name], grad, rtol=1e-4, atol=1e-5, msg=name)
    # the emulated kernel is what ran: q and k of both layers
    assert backward_nodes(fused_out.logits).count("RmsNormRopeBackward") == 4


AXOLOTL = {"base_model": "Qwen/Qwen3-8B", "sequence_len": 4096, "micro_batch_size": 1, "bf16": True,
           "adapter": "lora", "lora_r": 32, "lora_alpha": 64, "lora_target_linear": True,
           "flash_attention": True,
           "gradient_checkpointing": True, "fused_attn_kernel": True,
           "datasets": [{"path": "tatsu-lab/alpaca", "type": "alpaca"}]}


def test_an_axolotl_config_reads_the_key(tmp_path):
    plan = configread.read(tmp_path, AXOLOTL, "config.yaml")
    assert any(note.startswith("fused_attn_kernel: true") for note in plan.notes)


def _check(tmp_path, capsys, model, extra=()):
    from autotune.cli import main

    path = configread.write(tmp_path, {**AXOLOTL, "base_model": model}, "config.yaml")
    code = main(["check", model, "--from-config", str(path), "--gpu", "H100-80GB", "--seq-len", "64",
                 "--batch-size", "2", "--backend", "estimate", "--no-cache", *extra])
    return code, capsys.readouterr()


def test_a_qwen3_check_runs_the_fused_forward_and_other_patched_types_are_refused(tmp_path, capsys,
                                                                                   monkeypatch):
    applied = []
    apply = qwen3_fused_attn.apply
    monkeypatch.setattr(qwen3_fused_attn, "apply", lambda *args: applied.append(apply(*args)) or applied[-1])
    code, out = _check(tmp_path, capsys, "tiny-qwen3", ["--json"])
    assert code == 0 and applied == [2], out.err
    assert any(qwen3_fused_attn.NAME in note for note in json.loads(out.out)["config_notes"])
    # Llama: not a type Axolotl patches, "a silent no-op" (patch_manager.py _warn_if_fused_attn_unsupported)
    code, out = _check(tmp_path, capsys, "tiny-llama", ["--json"])
    assert code == 0 and applied == [2], out.err  # nothing swapped in
    assert not any(qwen3_fused_attn.NAME in note for note in json.loads(out.out)["config_notes"])
    code, out = _check(tmp_path, capsys, "tiny-qwen3_5_text")
    assert code == 2 and "fused_attn_kernel: true" in out.err and "qwen3_5_text" in out.err

