"""Measured tables and allocator traces on a real GPU (issue "Measured truth on a real GPU").

Run from the repository root on a CUDA machine; everything lands in OUT:

    python benchmarks/gpu_measure.py plan first --out OUT --deadline EPOCH_S
    python benchmarks/gpu_measure.py plan second --out OUT --deadline EPOCH_S
    benchmarks/gpu_session.sh next 420 --tests     # the next lease: what is still unmeasured

A plan is a list of phases run one after another; a phase is lanes run side by side (one process
each, on the same card: each job's budget caps its own caching allocator, so lanes whose budgets add
up to less than the card do not disturb each other's memory, only each other's step times); a lane
runs its jobs in order. A job is either a measured table (``autotune.table(backend="cuda")``: NAME.json
at the end, NAME.cells.jsonl as each cell finishes, so a job stopped at the deadline keeps its cells)
or a recorded step (``record-NAME.json``: one real training step under
``torch.cuda.memory._record_memory_history``, its allocator events, the real peaks, and the device
memory outside the allocator: the CUDA context, kernels and library handles). At the deadline every
lane still running is killed with its probe workers.

``benchmarks/accuracy.py`` reads these files (docs/measurements/) and compares them with the estimator.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

BERT = dict(modes="fp32,amp,ckpt,amp+ckpt")  # the default modes, the default seq lens (64..512)
LLAMA = dict(model="meta-llama/Llama-3.2-1B", modes="bf16,bf16+ckpt", seq_lens="512,1024,2048,4096")

# Measured tables: the keyword arguments of autotune.table (backend "cuda" added).
JOBS: dict[str, dict[str, Any]] = {
    "bert-base-uncased-12GiB": dict(model="bert-base-uncased", gpu_memory="12GiB", **BERT),
    "bert-base-uncased-16GiB": dict(model="bert-base-uncased", gpu_memory="16GiB", **BERT),
    "bert-large-uncased-12GiB": dict(model="bert-large-uncased", gpu_memory="12GiB", **BERT),
    "bert-large-uncased-16GiB": dict(model="bert-large-uncased", gpu_memory="16GiB", **BERT),
    "roberta-base-16GiB": dict(model="roberta-base", gpu_memory="16GiB", **BERT),
    "gpt2-causal-lm-16GiB": dict(model="gpt2", task="causal-lm", gpu_memory="16GiB", **BERT),
    "llama-3.2-1b-24GiB": dict(gpu_memory="24GiB", **LLAMA),
    "llama-3.2-1b-lora-24GiB": dict(gpu_memory="24GiB", peft="lora", **LLAMA),
    "llama-3.2-1b-qlora-trl-24GiB": dict(gpu_memory="24GiB", peft="qlora", qlora_recipe="trl", **LLAMA),
    "llama-3.2-1b-qlora-axolotl-24GiB": dict(
        gpu_memory="24GiB", peft="qlora", qlora_recipe="axolotl",
        model=LLAMA["model"], modes="bf16+ckpt", seq_lens="2048"),
    "llama-3.2-1b-qlora-peft-24GiB": dict(
        gpu_memory="24GiB", peft="qlora", qlora_recipe="peft",
        model=LLAMA["model"], modes="bf16+ckpt", seq_lens="2048"),
    "llama-3.2-1b-card": dict(**LLAMA),  # the whole card: run alone
    # One rank of a multi-GPU job on a fake process group (issue "More than one GPU"): the cuda
    # backend runs the same DDP and FSDP2 wrapping as the estimator, on the GPU.
    "llama-3.2-1b-fsdp8-24GiB": dict(gpu_memory="24GiB", gpus=8, parallel="fsdp", **LLAMA),
    "llama-3.2-1b-lora-fsdp8-24GiB": dict(gpu_memory="24GiB", gpus=8, parallel="fsdp", peft="lora",
                                           model=LLAMA["model"], modes="bf16+ckpt", seq_lens="1024,4096"),
    "llama-3.1-8b-fsdp8-40GiB": dict(model="meta-llama/Llama-3.1-8B", gpu_memory="40GiB", gpus=8,
                                      parallel="fsdp", modes="bf16+ckpt", seq_lens="2048,4096"),
    "bert-base-uncased-ddp8-12GiB": dict(model="bert-base-uncased", gpu_memory="12GiB", gpus=8,
                                          parallel="ddp", modes="amp,amp+ckpt", seq_lens="128,512"),
}
# PyTorch's expandable segments (CUDACachingAllocator.cpp, ExpandableSegment), which Unsloth and SkyRL
# switch on by default: a job's or a record's ``env`` is set before torch starts in its process. A
# job's ``table`` names the measured table its cells belong to (run_assemble).
EXPANDABLE = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}


def _variant(of: str, **changes: Any) -> dict[str, Any]:
    """The job ``of`` with ``changes``: another table of it, or, with ``table=of``, a part of its own."""
    return {**JOBS[of], **changes}


JOBS.update({
    "llama-3.2-1b-lora-12GiB": _variant("llama-3.2-1b-lora-24GiB", gpu_memory="12GiB", modes="bf16+ckpt"),
    "bert-base-uncased-12GiB-expandable": _variant("bert-base-uncased-12GiB", modes="ckpt,amp+ckpt",
                                                   env=EXPANDABLE),
    "bert-base-uncased-16GiB-expandable": _variant("bert-base-uncased-16GiB", modes="ckpt,amp+ckpt",
                                                   env=EXPANDABLE),
    "roberta-base-16GiB-expandable": _variant("roberta-base-16GiB", modes="ckpt,amp+ckpt", env=EXPANDABLE),
    "llama-3.2-1b-24GiB-expandable": _variant("llama-3.2-1b-24GiB", modes="bf16+ckpt",
                                              seq_lens="1024,2048,4096", env=EXPANDABLE),
    "llama-3.2-1b-lora-24GiB-expandable": _variant("llama-3.2-1b-lora-24GiB", modes="bf16+ckpt",
                                                   env=EXPANDABLE),
    "llama-3.2-1b-qlora-trl-24GiB-expandable": _variant("llama-3.2-1b-qlora-trl-24GiB", modes="bf16+ckpt",
                                                        seq_lens="2048", env=EXPANDABLE),
})
JOBS["llama-3.2-1b-lora-12GiB-expandable"] = _variant("llama-3.2-1b-lora-12GiB", env=EXPANDABLE)
JOBS["llama-3.2-1b-fsdp2-24GiB"] = _variant("llama-3.2-1b-fsdp8-24GiB", gpus=2, modes="bf16+ckpt",
                                            seq_lens="1024,4096")
JOBS["llama-3.2-1b-fsdp4-24GiB"] = _variant("llama-3.2-1b-fsdp8-24GiB", gpus=4, modes="bf16+ckpt",
                                            seq_lens="1024,4096")
# Preference training (issue "Preference and RL training"): TRL's DPO step, chosen and rejected rows
# together (the batch in pairs); a full fine-tune keeps a frozen reference model beside the policy, a
# LoRA job's reference is its base with the adapter off (TRL: ``ref_model`` None with PEFT).
JOBS["llama-3.2-1b-dpo-24GiB"] = _variant("llama-3.2-1b-24GiB", trainer="dpo", modes="bf16+ckpt",
                                          seq_lens="1024,2048")
JOBS["llama-3.2-1b-lora-dpo-24GiB"] = _variant("llama-3.2-1b-lora-24GiB", trainer="dpo", modes="bf16+ckpt",
                                               seq_lens="1024,2048,4096")
# GRPO (TRL's GRPOTrainer as the cuda backend runs it: model.generate with a KV cache, then the
# loss step): rows of 256 prompt + 768 completion tokens, 8 generations a prompt, beta 0.04 (the
# adapter disabled for the reference).
JOBS["llama-3.2-1b-lora-grpo-24GiB"] = _variant("llama-3.2-1b-lora-24GiB", trainer="grpo", modes="bf16+ckpt",
                                                seq_lens="1024", num_generations=8, max_completion_length=768,
                                                beta=0.04)
# Parts of a table (``table``): the size-only answers' distance to the chip's (issue "Measured truth,
# second card"), the cells earlier leases did not reach, mixed precision and checkpointing first.
_PARTS = (
    ("bert-base-uncased-12GiB", "rest", dict(modes="amp+ckpt,ckpt")),  # ckpt at 64, 128 measured first
    ("bert-base-uncased-12GiB", "amp", dict(modes="amp,fp32")),
    ("bert-base-uncased-16GiB", "amp", dict(modes="amp+ckpt,amp")),
    ("bert-base-uncased-16GiB", "rest", dict(modes="ckpt,fp32")),
    ("bert-base-uncased-16GiB", "fp32", dict(modes="fp32")),
    ("bert-large-uncased-12GiB", "amp", dict(modes="amp,fp32")),
    ("bert-large-uncased-12GiB", "rest", dict(modes="amp+ckpt,ckpt")),
    ("bert-large-uncased-16GiB", "rest", dict(modes="amp+ckpt,amp,ckpt")),
    ("roberta-base-16GiB", "rest", dict(modes="amp+ckpt,ckpt")),
    ("roberta-base-16GiB", "amp", dict(modes="amp,fp32")),
    # the classic 512 cells the H100 ran at 24 GiB and the H200 did not (its 512 x 24 record ran out)
    ("llama-3.2-1b-24GiB", "512", dict(modes="bf16+ckpt", seq_lens="512")),
    ("llama-3.2-1b-lora-24GiB", "512", dict(modes="bf16+ckpt", seq_lens="512")),
    ("llama-3.2-1b-qlora-trl-24GiB", "rest", dict(modes="bf16+ckpt", seq_lens="512,1024,4096")),
    # expandable segments in the other modes
    ("bert-base-uncased-12GiB-expandable", "amp", dict(modes="amp,fp32")),
    ("roberta-base-16GiB-expandable", "amp", dict(modes="amp+ckpt,amp")),
)
for _table, _part, _changes in _PARTS:
    JOBS[f"{_table}-{_part}"] = _variant(_table, **_changes, table=_table)
# What a lease's deadline left of the Llama tables, seeded from the whole tables' estimates.
for _name, _seq_lens in (("llama-3.2-1b-24GiB", "1024,2048,4096"),
                         ("llama-3.2-1b-lora-24GiB", "1024,2048,4096"),
                         ("llama-3.2-1b-qlora-trl-24GiB", "2048")):
    JOBS[f"{_name}-ckpt"] = {**JOBS[_name], "modes": "bf16+ckpt", "seq_lens": _seq_lens, "seeds_from": _name}
# The checkpointing modes of the BERT tables, as jobs of their own (a lease's first run measured fp32
# and amp before its deadline).
for _name in ("bert-base-uncased-12GiB", "bert-base-uncased-16GiB", "bert-large-uncased-12GiB",
              "bert-large-uncased-16GiB", "roberta-base-16GiB"):
    JOBS[f"{_name}-ckpt"] = {**JOBS[_name], "modes": "ckpt,amp+ckpt"}

# Recorded steps: (model, task, mode, seq_len, batch, table keyword arguments for the adapter).
RECORDS: dict[str, dict[str, Any]] = {
    "bert-base-fp32-128x64": dict(model="bert-base-uncased", mode="fp32", seq_len=128, batch=64),
    "bert-base-amp-512x32": dict(model="bert-base-uncased", mode="amp", seq_len=512, batch=32),
    "llama-1b-bf16ckpt-2048x4": dict(model=LLAMA["model"], mode="bf16+ckpt", seq_len=2048, batch=4),
    "llama-1b-lora-bf16ckpt-2048x4": dict(model=LLAMA["model"], mode="bf16+ckpt", seq_len=2048, batch=4,
                                          peft="lora"),
    "llama-1b-qlora-bf16ckpt-2048x6": dict(model=LLAMA["model"], mode="bf16+ckpt", seq_len=2048, batch=6,
                                           peft="qlora", qlora_recipe="trl"),
    # Under the 24 GiB tables' budget (``gpu_memory``): the LoRA bf16+ckpt cell at 512 the estimator
    # answers 21 for the H100's 24 (its trace puts a 96 MiB tensor into a segment the float32 logits
    # freed, and the next step's logits find no segment whole: docs/accuracy.md), at the measured max
    # and at the batch that ran out of memory on the GPU, where the GPU's free memory was split too.
    "llama-1b-lora-bf16ckpt-512x24-24GiB": dict(model=LLAMA["model"], mode="bf16+ckpt", seq_len=512, batch=24,
                                                peft="lora", gpu_memory="24GiB"),
    # A fresh process's step below the max the table's worker found (the next lease: where a fresh
    # job's first step stops fitting)
    "llama-1b-lora-bf16ckpt-512x23-24GiB": dict(model=LLAMA["model"], mode="bf16+ckpt", seq_len=512, batch=23,
                                                peft="lora", gpu_memory="24GiB"),
    "llama-1b-lora-bf16ckpt-512x22-24GiB": dict(model=LLAMA["model"], mode="bf16+ckpt", seq_len=512, batch=22,
                                                peft="lora", gpu_memory="24GiB"),
    "llama-1b-lora-bf16ckpt-512x25-24GiB": dict(model=LLAMA["model"], mode="bf16+ckpt", seq_len=512, batch=25,
                                                peft="lora", gpu_memory="24GiB"),
    # A BERT step the simulator runs where the GPU refused it (docs/accuracy.md, "Refused steps": the
    # same memory allocated at the refused request, 0.47 GiB cached free on the GPU against 0.28).
    "bert-base-amp-320x105-16GiB": dict(model="bert-base-uncased", mode="amp", seq_len=320, batch=105,
                                        gpu_memory="16GiB"),
    # The memory-efficient kernel in 16-bit, which A100, L40S and RTX cards run where Hopper runs cuDNN
    # (estimate/attention.py): with cuDNN deprioritized (``env``, set before torch starts), its workspace
    # at a head dim of 64 (Llama-3.2-1B) and of 128 (Llama-3.1-8B, whose kernels may also accumulate dK
    # and dV there: not counted yet).
    "llama-1b-bf16ckpt-2048x4-memeff": dict(model=LLAMA["model"], mode="bf16+ckpt", seq_len=2048, batch=4,
                                            env={"TORCH_CUDNN_SDPA_DEPRIORITIZED": "1"}),
    "llama-8b-lora-bf16ckpt-2048x1-memeff": dict(model="meta-llama/Llama-3.1-8B", mode="bf16+ckpt",
                                                 seq_len=2048, batch=1, peft="lora",
                                                 env={"TORCH_CUDNN_SDPA_DEPRIORITIZED": "1"}),
    # Under expandable segments: the allocator's map and unmap events (segment_map, segment_unmap)
    # for the simulator's expandable mode; the LoRA step the H200 refused with classic segments.
    "bert-base-ckpt-128x703-12GiB-expandable": dict(model="bert-base-uncased", mode="ckpt", seq_len=128,
                                                    batch=703, gpu_memory="12GiB", env=EXPANDABLE),
    "llama-1b-lora-bf16ckpt-512x24-24GiB-expandable": dict(
        model=LLAMA["model"], mode="bf16+ckpt", seq_len=512, batch=24, peft="lora", gpu_memory="24GiB",
        env=EXPANDABLE),
    # The checkpointed mixed-precision BERT cells the simulator refuses at the H200's max: the same
    # memory allocated (within 0.02 %), but 1 GiB left free in its segments where the GPU found room
    # (docs/accuracy.md, h200/bert-base-uncased-16GiB amp+ckpt 128: 1280 measured, 1251 estimated).
    "bert-base-ampckpt-128x1280-16GiB": dict(model="bert-base-uncased", mode="amp+ckpt", seq_len=128,
                                             batch=1280, gpu_memory="16GiB"),
}

PLANS: dict[str, list[list[list[str]]]] = {
    # Budgets side by side: 12 + 12 + 16 + 16 + 16 GiB, about 75 GiB with five CUDA contexts.
    "first": [
        [["record:bert-base-fp32-128x64", "record:bert-base-amp-512x32"]],
        [
            ["bert-base-uncased-12GiB"],
            ["bert-large-uncased-12GiB"],
            ["bert-base-uncased-16GiB"],
            ["bert-large-uncased-16GiB"],
            ["roberta-base-16GiB", "gpt2-causal-lm-16GiB"],
        ],
    ],
    # Budgets side by side: 3 x 24 GiB; then the recorded steps and the whole card, alone.
    "second": [
        [
            ["llama-3.2-1b-24GiB"],
            ["llama-3.2-1b-lora-24GiB", "llama-3.2-1b-qlora-axolotl-24GiB"],
            ["llama-3.2-1b-qlora-trl-24GiB", "llama-3.2-1b-qlora-peft-24GiB"],
        ],
        [["record:llama-1b-bf16ckpt-2048x4", "record:llama-1b-qlora-bf16ckpt-2048x6",
          "record:llama-1b-lora-bf16ckpt-2048x4"]],
        [["llama-3.2-1b-card"]],
    ],
    # The last lease: what the deadlines left, most wanted first.
    "last": [
        [
            ["llama-3.2-1b-24GiB-ckpt"],
            ["llama-3.2-1b-lora-24GiB-ckpt"],
            ["llama-3.2-1b-qlora-trl-24GiB-ckpt", "record:llama-1b-qlora-bf16ckpt-2048x6"],
            ["record:llama-1b-lora-bf16ckpt-512x24-24GiB", "record:llama-1b-lora-bf16ckpt-512x25-24GiB"],
        ],
        [["llama-3.2-1b-card"]],
        [
            ["bert-base-uncased-12GiB-ckpt"],
            ["bert-large-uncased-12GiB-ckpt"],
            ["bert-base-uncased-16GiB-ckpt"],
            ["bert-large-uncased-16GiB-ckpt"],
            ["roberta-base-16GiB-ckpt", "gpt2-causal-lm-16GiB", "record:bert-base-amp-320x105-16GiB"],
        ],
        [["record:llama-1b-bf16ckpt-2048x4-memeff", "record:llama-8b-lora-bf16ckpt-2048x1-memeff"]],
    ],
    # The H200's second lease: expandable segments beside the classic allocator on the same card,
    # and the size-only cells (about 115 GiB of budgets side by side with eight CUDA contexts).
    "h200-second": [
        [
            ["bert-base-uncased-12GiB-expandable"],
            ["llama-3.2-1b-lora-24GiB-expandable", "llama-3.2-1b-lora-24GiB-512",
             "record:llama-1b-lora-bf16ckpt-512x24-24GiB-expandable"],
            ["llama-3.2-1b-lora-12GiB-expandable", "record:bert-base-ckpt-128x703-12GiB-expandable"],
            ["llama-3.2-1b-lora-12GiB"],
            ["bert-base-uncased-12GiB-rest"],
            ["bert-base-uncased-16GiB-amp"],
            ["roberta-base-16GiB-rest"],
            ["bert-base-uncased-12GiB-amp"],
        ],
    ],
    # What the second plan left, in the same lease (about 125 GiB of budgets side by side).
    "h200-third": [
        [
            ["bert-base-uncased-12GiB-expandable-amp"],
            ["roberta-base-16GiB-expandable"],
            ["llama-3.2-1b-24GiB-expandable", "llama-3.2-1b-qlora-trl-24GiB-expandable"],
            ["bert-base-uncased-16GiB-rest"],
            ["bert-large-uncased-12GiB-ckpt"],
            ["bert-large-uncased-16GiB-ckpt"],
            ["bert-large-uncased-12GiB-amp"],
            ["gpt2-causal-lm-16GiB"],
        ],
    ],
    # The next lease (one call of at most 8 minutes, about 120 GiB of budgets side by side): what the
    # H200's three left unmeasured, and a fresh process's first step beside a probed worker's max (the
    # 512 x 24 LoRA step ran out of memory fresh where the table's worker fitted 25: h200/README.md).
    "next": [
        [
            ["bert-large-uncased-16GiB-rest", "bert-large-uncased-12GiB-rest"],
            ["roberta-base-16GiB-amp", "bert-base-uncased-16GiB-fp32"],
            ["roberta-base-16GiB-expandable-amp", "bert-base-uncased-16GiB-expandable"],
            ["record:llama-1b-lora-bf16ckpt-512x24-24GiB", "record:llama-1b-lora-bf16ckpt-512x23-24GiB",
             "record:llama-1b-lora-bf16ckpt-512x22-24GiB"],
            ["llama-3.2-1b-24GiB-512", "llama-3.2-1b-qlora-trl-24GiB-rest"],
        ],
    ],
    # A rank of a multi-GPU job (issue "More than one GPU"): world sizes 2, 4 and 8 of FSDP2 for
    # Llama-3.2-1B (full and LoRA) and Llama-3.1-8B, DDP for BERT-base (about 110 GiB of budgets side by
    # side: an H200, or an H100 with the 8B lane alone after the rest).
    "multi-gpu": [
        [
            ["llama-3.2-1b-fsdp8-24GiB"],
            ["llama-3.2-1b-fsdp2-24GiB", "llama-3.2-1b-fsdp4-24GiB"],
            ["llama-3.2-1b-lora-fsdp8-24GiB", "bert-base-uncased-ddp8-12GiB"],
            ["llama-3.1-8b-fsdp8-40GiB"],
        ],
    ],
    # The H200's fourth lease (one call of at most 8 minutes, about 130 GiB of budgets side by side):
    # a rank of FSDP2 and DDP jobs, DPO full and LoRA, then what "next" left.
    "h200-fourth": [
        [
            ["llama-3.2-1b-fsdp8-24GiB", "llama-3.2-1b-fsdp2-24GiB", "llama-3.2-1b-fsdp4-24GiB"],
            ["llama-3.2-1b-lora-fsdp8-24GiB", "bert-base-uncased-ddp8-12GiB"],
            ["llama-3.1-8b-fsdp8-40GiB"],
            ["llama-3.2-1b-lora-dpo-24GiB", "llama-3.2-1b-dpo-24GiB"],
            ["record:llama-1b-lora-bf16ckpt-512x24-24GiB", "record:llama-1b-lora-bf16ckpt-512x23-24GiB",
             "record:llama-1b-lora-bf16ckpt-512x22-24GiB", "llama-3.2-1b-24GiB-512"],
        ],
    ],
    # The next lease: the Llama-3.2-1B FSDP2 ranks again with the head tied (the fourth lease's
    # worker untied it: h200/README.md), GRPO, and the 8B rank's neighbours (about 130 GiB).
    "sixth": [
        [
            ["llama-3.2-1b-fsdp8-24GiB"],
            ["llama-3.2-1b-fsdp2-24GiB", "llama-3.2-1b-fsdp4-24GiB"],
            ["llama-3.2-1b-lora-fsdp8-24GiB", "llama-3.2-1b-lora-grpo-24GiB"],
            ["bert-large-uncased-16GiB-rest", "bert-large-uncased-12GiB-rest"],
            ["bert-base-uncased-16GiB-fp32", "bert-base-uncased-16GiB-expandable",
             "record:bert-base-ampckpt-128x1280-16GiB"],
        ],
    ],
    "third": [
        [
            ["bert-base-uncased-12GiB-ckpt"],
            ["bert-large-uncased-12GiB-ckpt"],
            ["bert-base-uncased-16GiB-ckpt"],
            ["bert-large-uncased-16GiB-ckpt"],
            ["roberta-base-16GiB-ckpt", "gpt2-causal-lm-16GiB"],
        ],
    ],
}


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def run_plan(name: str, out: Path, deadline: float, only: set[str] | None, backend: str) -> int:
    out.mkdir(parents=True, exist_ok=True)
    failed = 0
    for phase in PLANS[name]:
        lanes = [[job for job in lane if only is None or job in only] for lane in phase]
        lanes = [lane for lane in lanes if lane]
        procs = []
        for lane in lanes:
            argv = [sys.executable, __file__, "lane", "--out", str(out), "--backend", backend, *lane]
            log(f"lane {' '.join(lane)}")
            procs.append(subprocess.Popen(argv, start_new_session=True))
        for proc in procs:
            left = deadline - time.time()
            try:
                proc.wait(timeout=max(1.0, left))
            except subprocess.TimeoutExpired:
                log(f"deadline: killing lane {proc.args[6:]}")
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            failed += proc.returncode != 0
        if time.time() >= deadline:
            log("deadline reached: later phases skipped")
            break
    return 1 if failed else 0


def run_lane(jobs: list[str], out: Path, backend: str) -> int:
    failed = 0
    for job in jobs:
        started = time.time()
        argv = [sys.executable, __file__, "job", job, "--out", str(out), "--backend", backend]
        spec = RECORDS[job.removeprefix("record:")] if job.startswith("record:") else JOBS[job]
        code = subprocess.call(argv, env={**os.environ, **spec.get("env", {})})
        log(f"{job}: exit {code} in {time.time() - started:.0f} s")
        failed += code != 0
    return 1 if failed else 0


SEEDS = Path(os.environ.get("GPU_SEEDS", ROOT / "benchmarks" / "gpu_seeds.json"))  # the estimator's answers


def run_seeds(jobs: list[str]) -> int:
    """The estimator's max batch of each cell of ``jobs``, for the measured search to start from."""
    import autotune

    for name in jobs:
        seeds = json.loads(SEEDS.read_text()) if SEEDS.exists() else {}
        started = time.time()
        job = JOBS[name]
        if "gpu" not in job and "gpu_memory" not in job:  # the whole card: the lent H100's preset
            job = {**job, "gpu": "H100-80GB"}
        result = autotune.table(**job, backend="estimate")
        seeds[name] = {f"{c.mode}:{c.seq_len}": c.max_batch_size for c in result.cells}
        SEEDS.write_text(json.dumps(seeds, indent=1, sort_keys=True) + "\n")
        log(f"seeds {name}: {seeds[name]} in {time.time() - started:.0f} s")
    return 0


def run_table(name: str, out: Path, backend: str) -> int:
    """The job's table; where the estimator's answers are known (SEEDS), each cell's search starts
    at its estimated max (tuner._guess), one mode at a time, and the modes are merged."""
    import autotune
    from autotune import tuner

    cells = (out / f"{name}.cells.jsonl").open("w")

    def on_cell(cell: Any, done: int, total: int) -> None:
        cells.write(json.dumps(cell.to_dict()) + "\n")
        cells.flush()
        log(f"{name} {done}/{total} {cell.mode} seq {cell.seq_len}: {cell.max_batch_size} "
            f"({cell.probes} probes){' ' + cell.error if cell.error else ''}")

    job = dict(JOBS[name])
    job.pop("env", None)  # set in this process's environment by its lane
    job.pop("table", None)
    seeds = json.loads(SEEDS.read_text()).get(job.pop("seeds_from", name)) if SEEDS.exists() else None
    if not seeds:
        result = autotune.table(**job, backend=backend, on_cell=on_cell)
        (out / f"{name}.json").write_text(json.dumps(result.to_dict(), indent=1))
        return 0
    merged: dict[str, Any] | None = None
    for mode in job["modes"].split(","):
        def seeded(history: Any, seq_len: int, budget: int, mode: str = mode) -> int | None:
            return seeds.get(f"{mode}:{seq_len}") or None

        tuner._guess = seeded  # type: ignore[assignment]
        part = autotune.table(**{**job, "modes": mode}, backend=backend, on_cell=on_cell).to_dict()
        if merged is None:
            merged = {**part, "modes": [], "cells": [], "elapsed_s": 0.0, "seeded_by": "estimate"}
        merged["modes"] += part["modes"]
        merged["cells"] += part["cells"]
        merged["elapsed_s"] += part["elapsed_s"]
    assert merged is not None
    total = sum(c["probes"] for c in merged["cells"])
    merged.update(probes_total=total, probes_per_cell=round(total / max(1, len(merged["cells"])), 2))
    (out / f"{name}.json").write_text(json.dumps(merged, indent=1))
    return 0


def device_used() -> dict[str, int]:
    """Device memory in use by this process, as the driver and as the allocator see it."""
    import torch

    free, total = torch.cuda.mem_get_info()
    return {"device_used_bytes": total - free, "reserved_bytes": torch.cuda.memory_reserved(),
            "allocated_bytes": torch.cuda.memory_allocated()}


def run_record(name: str, out: Path) -> int:
    """One real probe under the allocator's history; the events, the peaks, the memory outside it."""
    import torch

    from autotune.backends.cuda.probe_worker import CudaMemory, Worker, is_out_of_memory
    from autotune.backends.cuda.protocol import PROTOCOL, cell_spec
    from autotune.defaults import DEFAULT_MARGIN
    from autotune.gpus import custom_gpu
    from autotune.request import ModelAccess, PeftOptions, Step, TableRequest, resolve
    from autotune.tuner import budget_bytes
    from autotune.units import parse_bytes
    from autotune.workload.modes import parse_modes

    spec = RECORDS[name]
    found: dict[str, Any] = {"name": name, **spec}

    class Recorded(CudaMemory):
        def open(self, device_index: int, budget_bytes: int) -> dict[str, Any]:
            info = super().open(device_index, budget_bytes)
            found["context"] = device_used()  # the CUDA context alone: nothing allocated yet
            torch.cuda.memory._record_memory_history(max_entries=5_000_000, context=None, stacks="python")
            return info

    peft = PeftOptions(peft=spec.get("peft"), qlora_recipe=spec.get("qlora_recipe"))
    request = TableRequest(Step(spec["model"], spec.get("task"), peft_options=peft),
                           seq_lens=[spec["seq_len"]])
    workload = resolve(request, make_target=False, access=ModelAccess(allow_hub=False)).workload
    mode = parse_modes(spec["mode"])[0]
    budget = torch.cuda.get_device_properties(0).total_memory
    if "gpu_memory" in spec:  # the budget of the tables measured for that size (the allocator capped)
        budget = budget_bytes(custom_gpu(parse_bytes(spec["gpu_memory"])), DEFAULT_MARGIN)
        found["budget_bytes"] = budget
    memory = Recorded()
    worker = Worker(memory)
    ready = worker.init({"op": "init", "protocol": PROTOCOL,
                         "cell": cell_spec(workload, mode, spec["seq_len"], budget).to_json()})
    if ready.get("op") != "ready":
        raise RuntimeError(f"the worker could not set up the cell: {ready}")
    found["ready"] = ready
    found["after_load"] = device_used()
    began = time.time()
    try:
        found["run"] = worker._run(spec["batch"])
        found["outcome"] = "fits"
    except Exception as exc:  # a step that runs out of memory is recorded up to its failure
        if not is_out_of_memory(exc):
            raise
        found["outcome"], found["oom_message"] = "oom", str(exc).splitlines()[0]
    torch.cuda.synchronize()
    found["step_wall_s"] = time.time() - began
    found["peak_allocated_bytes"] = torch.cuda.max_memory_allocated()
    found["peak_reserved_bytes"] = torch.cuda.max_memory_reserved()
    found["after_step"] = device_used()
    stats = torch.cuda.memory_stats()
    found["memory_stats"] = {k: v for k, v in stats.items() if "all" in k or "." not in k}
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    trace = snapshot["device_traces"][0]
    # an ``oom`` event carries no address (the H200's first lease: KeyError 'addr')
    found["events"] = [[e["action"], e.get("addr", 0), e.get("size", 0), e.get("stream", 0)] for e in trace]
    found["versions"] = {"torch": torch.__version__, "cuda": torch.version.cuda,
                         "device": torch.cuda.get_device_name(0)}
    (out / f"record-{name}.json").write_text(json.dumps(found))
    log(f"record {name}: {len(trace)} events, peak allocated {found['peak_allocated_bytes']}, "
        f"reserved {found['peak_reserved_bytes']}, outside the allocator after the step "
        f"{found['after_step']['device_used_bytes'] - found['after_step']['reserved_bytes']}")
    return 0


def run_assemble(runs: list[Path], dest: Path) -> int:
    """The measured tables of several leases' runs, one per model and budget, into ``dest``.

    A table's cells come from every run of its job and of its follow-up jobs (NAME-ckpt): a later
    run's cell replaces an earlier one's. The header is a finished run's (the cuda backend's
    environment), else that of a one-cell estimate of the same job with the measured environment;
    cells no run reached are listed in ``cells_missing``. Allocator records go to dest/records.
    """
    import shutil
    from dataclasses import replace

    import autotune
    from autotune.gpus import gpu_from_device_properties
    from autotune.tuner import budget_bytes

    environment = None
    finished: dict[str, dict[str, Any]] = {}
    cells: dict[str, dict[tuple[str, int], dict[str, Any]]] = {}
    for run in runs:  # in lease order
        for path in sorted(run.glob("*.json")):
            if path.name.startswith("record-"):
                (dest / "records").mkdir(parents=True, exist_ok=True)
                shutil.copy(path, dest / "records" / path.name.removeprefix("record-"))
                continue
            table = json.loads(path.read_text())
            environment = table["environment"]
            finished[path.stem] = table
        for path in sorted(run.glob("*.cells.jsonl")):
            job = path.name.removesuffix(".cells.jsonl")
            base = JOBS[job].get("table") or JOBS[job].get("seeds_from") or job.removesuffix("-ckpt")
            seeded = SEED_RUNS.get(run.name, True)
            for line in path.read_text().splitlines():
                cell = {**json.loads(line), "seeded_by_estimate": seeded}
                cells.setdefault(base, {})[(cell["mode"], cell["seq_len"])] = cell
    assert environment is not None, "no run finished a table: no measured environment"
    dest.mkdir(parents=True, exist_ok=True)
    for base, found in sorted(cells.items()):
        job = JOBS[base]
        header = next((t for n, t in finished.items() if base in (n, JOBS[n].get("seeds_from"),
                                                                    JOBS[n].get("table"))
                       or n == f"{base}-ckpt"), None)
        if header is None:
            kwargs = {k: v for k, v in job.items() if k not in ("modes", "seq_lens", "env", "table")}
            first_mode, first_len = next(iter(found))
            header = autotune.table(**kwargs, modes=first_mode, seq_lens=[first_len],
                                    backend="estimate").to_dict()
            if "gpu_memory" not in job:  # the whole card: the target the cuda backend made of it
                card = replace(gpu_from_device_properties(environment["device_name"], LENT_CARD_BYTES, 9, 0),
                               context_overhead_bytes=LENT_CARD_OVERHEAD_BYTES)
                header.update(gpu_name=card.name, gpu_memory_bytes=card.total_memory_bytes,
                              context_overhead_bytes=card.context_overhead_bytes,
                              budget_bytes=budget_bytes(card, header["margin"]), warnings=[])
            alloc_conf = job.get("env", {}).get("PYTORCH_CUDA_ALLOC_CONF")  # not another job's
            header.update(backend="cuda", environment={**environment, "alloc_conf": alloc_conf,
                                                      "gpu_name": header["gpu_name"],
                                                      "gpu_total_memory_bytes": header["gpu_memory_bytes"]})
        modes = job["modes"].split(",")  # then those of the jobs filling the same table
        modes += sorted({mode for mode, _ in found} - set(modes), key=ALL_MODES.index)
        seq_lens = sorted({seq for _, seq in found} | set(header["seq_lens"]))
        if "seq_lens" in job:
            seq_lens = [int(n) for n in job["seq_lens"].split(",")]
        ordered = [found[(m, n)] for m in modes for n in seq_lens if (m, n) in found]
        missing = [f"{m}:{n}" for m in modes for n in seq_lens if (m, n) not in found]
        total = sum(c["probes"] for c in ordered)
        table = {**header, "modes": modes, "seq_lens": seq_lens, "cells": ordered, "cells_missing": missing,
                 "elapsed_s": None, "probes_total": total,
                 "probes_per_cell": round(total / len(ordered), 2), "seeded_by": None}
        table["search_note"] = "cells with seeded_by_estimate: the search started at the estimator's max"
        (dest / f"{base}.json").write_text(json.dumps(table, indent=1) + "\n")
        log(f"{base}: {len(ordered)} cells, missing {missing}")
    return 0


# torch.cuda.get_device_properties(0).total_memory of the lent H100 80GB HBM3 (the probe workers'
# "total_bytes"; nvidia-smi: 81559 MiB).
LENT_CARD_BYTES = 85_017_493_504
# The H100 preset's context overhead when the card was measured (640 MiB, before gpus.py took the
# 767 MiB measured then): the budget that run's cells were searched against.
LENT_CARD_OVERHEAD_BYTES = 640 * 1024**2
ALL_MODES = ["fp32", "amp", "ckpt", "amp+ckpt", "bf16", "bf16+ckpt"]  # a table's modes in this order
# The runs whose searches did not start from the estimator's answers (seeds came after them).
SEED_RUNS = {"gpu-first": False}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    plan = sub.add_parser("plan")
    plan.add_argument("name", choices=sorted(PLANS))
    plan.add_argument("--deadline", type=float, required=True, help="epoch seconds: lanes are killed then")
    plan.add_argument("--only", help="comma-separated jobs of the plan to run (default: all)")
    lane = sub.add_parser("lane")
    lane.add_argument("jobs", nargs="+")
    seeds = sub.add_parser("seeds", help="the estimator's answers for the jobs, into gpu_seeds.json")
    seeds.add_argument("jobs", nargs="+")
    job = sub.add_parser("job")
    job.add_argument("name")
    assemble = sub.add_parser("assemble", help="the runs' measured tables into docs/measurements/...")
    assemble.add_argument("runs", nargs="+", type=Path)
    assemble.add_argument("--dest", type=Path, default=ROOT / "docs" / "measurements" / "h100-80gb")
    for p in (plan, lane, job):
        p.add_argument("--out", type=Path, required=True)
        p.add_argument("--backend", default="cuda", help="estimate: a dry run of the plan on a CPU")
    args = parser.parse_args(argv)
    if args.command == "plan":
        only = set(args.only.split(",")) if args.only else None
        return run_plan(args.name, args.out, args.deadline, only, args.backend)
    if args.command == "assemble":
        return run_assemble(args.runs, args.dest)
    if args.command == "seeds":
        return run_seeds(args.jobs)
    if args.command == "lane":
        return run_lane(args.jobs, args.out, args.backend)
    try:
        if args.name.startswith("record:"):
            return run_record(args.name.removeprefix("record:"), args.out)
        return run_table(args.name, args.out, args.backend)
    except Exception:
        traceback.print_exc()
        (args.out / f"{args.name.replace(':', '-')}.error.txt").write_text(traceback.format_exc())
        return 1


if __name__ == "__main__":
    sys.exit(main())
