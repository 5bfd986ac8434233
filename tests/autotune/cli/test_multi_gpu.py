"""A multi-GPU job asked for by flag and by keyword: every answer is one GPU's and says the job it
modelled; what is not modelled is refused by name, exit 2."""

from __future__ import annotations

import json

import pytest

import autotune
from autotune.cli import main

TINY = ("tiny-llama", "--dtype", "bfloat16", "--gpu-memory", "4GiB", "--backend", "estimate")


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_a_table_says_the_job_and_that_each_cell_is_one_gpus(capsys):
    code, out, _ = run(capsys, "table", *TINY, "--seq-lens", "64", "--modes", "fp32,bf16", "--max-batch", "8",
                       "--gpus", "4", "--parallel", "fsdp")
    assert code == 0, out
    assert ("GPUs: FSDP2 full shard, 4 GPUs; each cell is one GPU's micro-batch (global batch = it x 4 "
            "GPUs") in out
    assert "traced: FSDP2 fully_shard on a fake process group" in out
    assert ("weights in bfloat16: fp32 trains them as they are, with no mixed-precision policy; bf16 runs "
            "FSDP2's MixedPrecisionPolicy of the mode's dtype (no autocast)") in out


def test_a_check_answers_per_gpu_with_the_job_in_its_json(capsys):
    code, out, _ = run(capsys, "check", *TINY, "--seq-len", "64", "--batch-size", "2", "--mode", "bf16",
                       "--gpus", "8", "--parallel", "fsdp", "--no-reshard-after-forward", "--json")
    assert code == 0, out
    doc = json.loads(out)
    assert doc["fits"] is True
    parallel = doc["parallel"]
    assert (parallel["kind"], parallel["gpus"], parallel["reshard_after_forward"],
            parallel["shard_size"]) == ("fsdp", 8, False, 8)
    assert "per GPU of FSDP2 shard grad op (no reshard after forward), 8 GPUs" in doc["message"]


# a small llama whose float32 shards (5.6M parameters, 1/4 a rank) outgrow the allocator's 2 MiB blocks
OFFLOADED_LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 256,
                   "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4,
                   "num_key_value_heads": 4, "vocab_size": 8192, "max_position_embeddings": 512,
                   "tie_word_embeddings": False, "torch_dtype": "bfloat16"}


def test_offloading_the_parameters_lowers_each_ranks_peak_and_takes_host_memory(capsys, tmp_path):
    """FSDP2's CPU offload (--offload-params, CPUOffloadPolicy): the shards, their gradients and the
    Adam state leave the GPU for the host, which check reports."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    (tmp_path / "config.json").write_text(json.dumps(OFFLOADED_LLAMA))
    with torch.device("meta"):
        parameters = sum(p.numel() for p in LlamaForCausalLM(LlamaConfig(**OFFLOADED_LLAMA)).parameters())
    shard = parameters * 4 // 4  # upcast to float32 (accelerate's recipe), 1/4 on each rank
    argv = ("check", str(tmp_path / "config.json"), "--gpu-memory", "4GiB", "--backend", "estimate",
            "--seq-len", "64", "--batch-size", "2", "--mode", "bf16", "--gpus", "4", "--parallel", "fsdp",
            "--no-cache", "--json")
    docs = []
    for extra in ((), ("--offload-params",)):
        code, out, _ = run(capsys, *argv, *extra)
        assert code == 0, out
        docs.append(json.loads(out))
    on_gpu, offloaded = docs
    assert offloaded["parallel"]["offload_params"] is True and on_gpu["parallel"]["offload_params"] is False
    assert "parameters, gradients and optimizer state offloaded to the CPU, 4 GPUs" in offloaded["message"]
    assert "CPUOffloadPolicy" in offloaded["parallel"]["modelled"]
    # the host holds the shards, their gradients and AdamW's two moments; the GPU at least the shards
    # and the moments fewer at its peak (the gradients are partly freed there)
    assert offloaded["host_memory_bytes"] >= 4 * shard and on_gpu["host_memory_bytes"] == 0
    assert on_gpu["peak_memory_bytes"] - offloaded["peak_memory_bytes"] >= 3 * shard - 2 * 2**20
    code, out, _ = run(capsys, *argv[:-1], "--offload-params")
    assert code == 0 and "note: host memory per GPU's rank (FSDP2's CPU offload: its shards" in out


@pytest.mark.parametrize(("extra", "message"), [
    (("--parallel", "ddp"), "Error: --offload-params is FSDP's CPU offload, not ddp's: use --parallel fsdp"),
    (("--parallel", "zero3"), "Error: --offload-params is FSDP's CPU offload, not zero3's: DeepSpeed's is "
                              "--zero-config's offload_optimizer"),
])
def test_offload_params_outside_fsdp_is_refused_by_name(capsys, extra, message):
    code, _, err = run(capsys, "check", *TINY, "--seq-len", "64", "--batch-size", "2", "--gpus", "4",
                       "--offload-params", *extra)
    assert code == 2 and err.startswith(message), err


# DeepSeek-V2 keeps its router's weight in float32 (transformers' _keep_in_fp32_modules_strict) beside
# bfloat16 weights: a small one, as Axolotl's examples/deepseek-v2/fft-fsdp-16b.yaml runs it under FSDP1
MIXED_DTYPE_MOE = {"model_type": "deepseek_v2", "architectures": ["DeepseekV2ForCausalLM"], "hidden_size": 64,
                   "intermediate_size": 128, "moe_intermediate_size": 32, "num_hidden_layers": 2,
                   "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 256,
                   "n_routed_experts": 4, "num_experts_per_tok": 2, "n_shared_experts": 1,
                   "first_k_dense_replace": 1,
                   "kv_lora_rank": 16, "q_lora_rank": None, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8,
                   "v_head_dim": 16, "max_position_embeddings": 512, "torch_dtype": "bfloat16"}


def test_fsdp1_over_parameters_of_two_dtypes_is_refused_as_torch_refuses_it(capsys, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(MIXED_DTYPE_MOE))
    argv = ("check", str(tmp_path / "config.json"), "--gpu-memory", "4GiB", "--seq-len", "64", "--batch-size",
            "2", "--mode", "bf16", "--gpus", "4", "--parallel", "fsdp", "--no-cache")
    code, _, err = run(capsys, *argv, "--fsdp-version", "1", "--offload-params")
    refusal = ("Error: FSDP1 cannot wrap DeepseekV2ForCausalLM: Must flatten tensors with uniform dtype "
               "but got "
               "torch.bfloat16 and torch.float32")
    assert code == 2 and err.startswith(refusal), err
    assert run(capsys, *argv)[0] == 0  # FSDP2 shards each parameter apart


def test_nccl_buffers_come_off_the_card_before_the_budget():
    """NCCL's own memory (workload.parallel.nccl_bytes, from its source): channel metadata and 24
    ring channels of 12 MiB, NVLS on an sm90 node of 4 or more, network buffers over nodes."""
    from autotune.gpus import resolve_gpu
    from autotune.tuner import budget_bytes
    from autotune.workload.parallel import MIB, Parallel, nccl_bytes

    assert nccl_bytes(None, (9, 0)) == 0
    assert nccl_bytes(Parallel("ddp", 2), (9, 0)) == 192 * MIB + 288 * MIB  # no NVLS for two
    assert nccl_bytes(Parallel("fsdp", 8), (9, 0)) == 192 * MIB + 288 * MIB + 256 * MIB
    assert nccl_bytes(Parallel("fsdp", 8), (8, 0)) == 480 * MIB  # an A100: no NVLS
    assert nccl_bytes(Parallel("fsdp", 16, nodes=2), (9, 0)) == 736 * MIB + 160 * MIB
    h100 = resolve_gpu("H100-80GB")
    alone, job = budget_bytes(h100, 0.05), budget_bytes(h100, 0.05, Parallel("fsdp", 8))
    assert alone - job == int(736 * MIB * 0.95) or alone - job == int(736 * MIB * 0.95) + 1


def test_a_card_that_nccl_and_the_context_fill_is_refused(capsys):
    code, _, err = run(capsys, "check", "tiny-llama", "--gpu-memory", "1GiB", "--seq-len", "64",
                       "--batch-size", "1", "--gpus", "8", "--parallel", "fsdp")
    assert code == 2 and "leaves PyTorch nothing after the CUDA context (512 MiB) and NCCL's buffers" in err


def test_gpus_alone_is_ddp():
    result = autotune.check("tiny-llama", seq_len=64, batch_size=2, gpu_memory="4GiB", dtype="bfloat16",
                            mode="bf16", gpus=2)
    assert result.parallel is not None and result.parallel["kind"] == "ddp"
    assert result.parallel["label"] == "DDP over 2 GPUs (each holds the whole model)"


@pytest.mark.parametrize(("argv", "message"), [
    (("check", *TINY, "--seq-len", "64", "--batch-size", "2", "--gpus", "8", "--parallel", "zero3",
      "--peft", "qlora"), "Error: a 4-bit base under DeepSpeed ZeRO-3 is not modelled yet"),
    (("check", *TINY, "--seq-len", "64", "--batch-size", "2", "--parallel", "fsdp"),
     "Error: --parallel fsdp needs --gpus"),
    (("check", *TINY, "--seq-len", "64", "--batch-size", "2", "--gpus", "4", "--nodes", "2"),
     "Error: --nodes 2 is for --parallel fsdp's hybrid sharding"),
    (("check", *TINY, "--seq-len", "64", "--batch-size", "2", "--gpus", "4", "--parallel", "fsdp",
      "--peft", "qlora"), "Error: a 4-bit base under --parallel fsdp is modelled as Axolotl shards it"),
])
def test_what_is_not_modelled_is_refused_by_name(capsys, argv, message):
    code, out, err = run(capsys, *argv)
    assert code == 2 and err.startswith(message), err


def test_explain_breaks_down_one_rank_of_the_job(capsys):
    code, out, err = run(capsys, "explain", *TINY, "--seq-len", "64", "--gpus", "4", "--parallel", "fsdp")
    assert code == 0, err
    assert "job: FSDP2 full shard, 4 GPUs; every figure below is one GPU's (rank 0)" in out
    assert "CUDA context - 608 MiB NCCL buffers) x (1 - margin 0.05)" in out
    for line in ("parameters (1/4 shard) and buffers", "gradients (1/4 shard)",
                 "optimizer state (1/4 shard)", "gathered parameters (FSDP2 all-gathers)",
                 "communication buffers (all-gather, reduce-scatter)",
                 "whole modules: FSDP2 keeps 1/4 of each on a GPU"):
        assert line in out
    assert "8-bit AdamW" not in out and "QLoRA" not in out  # refused under fsdp: not offered


def test_the_cuda_backend_takes_a_job_of_more_gpus(monkeypatch):
    """As on a machine with a GPU: the cuda backend measures one rank of it (backends/cuda)."""
    import autotune.backends as backends
    from autotune.backends.cuda import device
    from autotune.gpus import resolve_gpu
    from autotune.request import CheckRequest, Step, Target, resolve

    monkeypatch.setattr(backends, "cuda_available", lambda: True)
    monkeypatch.setattr(device, "local_gpu", lambda: resolve_gpu("H100-80GB"))
    request = CheckRequest(Step(model="tiny-llama", gpus=2, parallel="fsdp"),
                           Target(gpu="T4", backend="cuda"), seq_len=64, batch_size=2)
    resolved = resolve(request)
    assert resolved.backend.name == "cuda" and resolved.workload.parallel.gpus == 2
