"""Answer rate of ``autotune check --from-config`` over public training configs (issue #34): how
many of the example configs Axolotl and LLaMA-Factory publish get a verdict on an H100-80GB, why
the others are refused (reasons ranked by count, an example file each), and every crash.

- Corpus: Axolotl's ``examples/**/*.y(a)ml`` less ``examples/archived/``; LLaMA-Factory's
  ``examples/train_lora``, ``train_qlora`` and ``train_full`` (source ``llamafactory``) and, apart
  (``llamafactory-extra``), its other training YAMLs under ``examples/`` (``stage:`` with
  ``do_train: true``, or v1's ``train_dataset:``). They are never committed here: give a clone, a
  bare mirror or a plain copy of each repository; the configs are copied to a scratch folder.
- Model: the config's ``base_model`` / ``model_name_or_path`` (v1: ``model``) runs as the offline
  preset of its family nearest in size, within a factor MAX_SIZE_RATIO (the mapping is printed).
  A model with none counts as "no preset"; its config is still read against a stand-in preset
  (``--stand-in``) for its refusal reasons, never for an answer.
- Groups: preference/reward (Axolotl ``rl``, ``trl``, ``reward_model``; LLaMA-Factory ``stage``
  dpo/kto/rm/ppo) and multi-GPU (DeepSpeed, FSDP, a parallel size above 1; LLaMA-Factory's FSDP,
  Megatron and Ray launches) apart; the rest, one-GPU supervised, is the headline.
- Each config, one at a time in a fresh process: ``autotune check PRESET --from-config FILE --gpu
  H100-80GB --json --no-cache --backend estimate --workers 1`` under a timeout; a multi-GPU
  config with ``--gpus 8`` (MULTI_GPU_GPUS), or its Axolotl mesh's product where it fixes one.
  Answered: exit 0/1 with a verdict; refused: exit 2 with ``{"error": ..., "kind": ...}``; crash:
  anything else (a traceback, another exit status, a timeout, output that is not that JSON). A
  refusal of kind "job fails" (autotune/errors.py JobFails) is a job that fails in its own libraries
  too: the rates are printed without and with them (autotune's gaps are the rest).
- ``--peel``: autotune names only the first key it cannot model. Peel fixes that key as the
  refusal says (``bf16: true``, the ``lora_*_kernel`` keys false, ``use_reentrant: false``,
  ``attn_implementation: flash_attention_2``, the Liger kernels dropped) or drops it, and reads the
  config again (with a tiny preset of its family: seconds, not the 40 of an 8B estimate) until it is
  read whole or nothing is left to fix: the ranking then counts every blocking key (a lower bound:
  a dropped key hides what is read under it).

The goal (issue #34): most one-GPU supervised configs answered, every refusal a named reason.

    git clone --depth 1 https://github.com/axolotl-ai-cloud/axolotl /tmp/axolotl
    git clone --depth 1 https://github.com/hiyouga/LLaMA-Factory /tmp/LLaMA-Factory
    .venv/bin/python benchmarks/bench_configs.py --axolotl /tmp/axolotl --llamafactory /tmp/LLaMA-Factory \\
        [--peel] [--json rows.json] [--only qlora] [--limit 20] [--timeout 300] [--autotune-root DIR]

``--autotune-root`` runs another checkout's autotune (``git worktree add /tmp/head HEAD``: the
committed code while the work tree changes); by default this one's. ``--report rows.json`` prints
a saved run's report again.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml  # autotune's own dependency: it reads YAML configs

ROOT = Path(__file__).resolve().parents[1]
GPU = "H100-80GB"
HEADLINE = "one-GPU SFT"
GROUPS = (HEADLINE, "preference/reward", "multi-GPU")
# The GPUs a multi-GPU config is checked on (``--gpus``: no training config says how many): one node
# of eight, what these examples are written for.
MULTI_GPU_GPUS = 8
# The offline presets of decoder LLMs by family, with their nominal size in billions of parameters
# (as their names or model cards say): a config's model runs as the one of its family nearest in size.
FAMILIES: dict[str, dict[str, float]] = {
    "llama": {"meta-llama/Llama-3.2-1B": 1, "meta-llama/Llama-3.2-3B": 3, "meta-llama/Llama-3.1-8B": 8,
              "meta-llama/Meta-Llama-3-70B": 70, "meta-llama/Llama-3.1-405B": 405},
    "smollm2": {"HuggingFaceTB/SmolLM2-135M": 0.135, "HuggingFaceTB/SmolLM2-360M": 0.36,
                "HuggingFaceTB/SmolLM2-1.7B": 1.7},
    "mistral": {"mistralai/Mistral-7B-v0.3": 7},
    "qwen": {"Qwen/Qwen2.5-0.5B": 0.5, "Qwen/Qwen2.5-1.5B": 1.5, "Qwen/Qwen2.5-3B": 3, "Qwen/Qwen2.5-7B": 7,
             "Qwen/Qwen2.5-14B": 14, "Qwen/Qwen2.5-72B": 72},
    "qwen3": {"Qwen/Qwen3-0.6B": 0.6, "Qwen/Qwen3-1.7B": 1.7, "Qwen/Qwen3-4B": 4, "Qwen/Qwen3-8B": 8,
              "Qwen/Qwen3-14B": 14, "Qwen/Qwen3-32B": 32},
    "qwen3_moe": {"Qwen/Qwen3-30B-A3B": 30, "Qwen/Qwen3-235B-A22B": 235},
    # Gated DeltaNet hybrids (presets/qwen_hybrid.py): Qwen3.5 (the 27B as its text model, the others
    # as their VLMs), Qwen3-Next.
    "qwen3_5": {"Qwen/Qwen3.5-0.8B": 0.8, "Qwen/Qwen3.5-4B": 4, "Qwen/Qwen3.5-9B": 9, "Qwen/Qwen3.5-27B": 27},
    "qwen3_5_moe": {"Qwen/Qwen3.5-35B-A3B": 35, "Qwen/Qwen3.5-122B-A10B": 122, "Qwen/Qwen3.5-397B-A17B": 397},
    "qwen3_next": {"Qwen/Qwen3-Next-80B-A3B-Instruct": 80},
    "mistral_small": {"mistralai/Devstral-Small-2507": 24},
    "mixtral": {"mistralai/Mixtral-8x7B-v0.1": 46.7, "mistralai/Mixtral-8x22B-v0.1": 141},
    "apertus": {"swiss-ai/Apertus-8B-Instruct-2509": 8},
    "seed_oss": {"ByteDance-Seed/Seed-OSS-36B-Instruct": 36},
    "gpt_oss": {"openai/gpt-oss-20b": 21, "openai/gpt-oss-120b": 117},
    "deepseek_v2": {"deepseek-ai/DeepSeek-V2-Lite": 16, "deepseek-ai/DeepSeek-V2.5": 236},
    "glm4_moe": {"zai-org/GLM-4.5-Air": 106},
    "glm4_moe_lite": {"zai-org/GLM-4.7-Flash": 30},
    "glm4": {"zai-org/GLM-4-32B-0414": 32},  # the dense GLM-4-0414 (its Base shares the shapes)
    "gemma2": {"google/gemma-2-2b": 2, "google/gemma-2-9b": 9},
    "gemma3": {"google/gemma-3-270m": 0.27, "google/gemma-3-1b-pt": 1},
    "phi": {"microsoft/phi-1_5": 1.3, "microsoft/phi-2": 2.7},
    "phi3": {"microsoft/Phi-3.5-mini-instruct": 3.8},
    "gpt2": {"gpt2": 0.124, "gpt2-medium": 0.355},
    # Falcon-H1 (Mamba-2 beside attention in each layer): the Base and Instruct share a config.
    "falcon_h1": {"tiiuae/Falcon-H1-0.5B-Base": 0.5, "tiiuae/Falcon-H1-1.5B-Base": 1.5,
                  "tiiuae/Falcon-H1-3B-Base": 3, "tiiuae/Falcon-H1-7B-Base": 7,
                  "tiiuae/Falcon-H1-34B-Base": 34},
    # Jamba (Mamba-1 mixers, attention in one layer of eight, 16 experts in every other): by total.
    "jamba": {"ai21labs/Jamba-v0.1": 52, "ai21labs/AI21-Jamba-1.5-Large": 398},
    # Nemotron 3 (nemotron_h: Mamba-2, experts, attention, a layer each): the BF16 checkpoints, by name.
    "nemotron_h": {"nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16": 30,
                   "nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-BF16": 120},
    # Kimi Linear (Kimi Delta Attention, MLA, 256 experts): by its total; the estimator refuses it.
    "kimi_linear": {"moonshotai/Kimi-Linear-48B-A3B-Instruct": 48},
    # Vision-language models (image-text-to-text), each its own family: a tower and a processor of
    # its own, never another's stand-in.
    "qwen2_vl": {"Qwen/Qwen2-VL-7B-Instruct": 7},
    "qwen2_5_vl": {"Qwen/Qwen2.5-VL-7B-Instruct": 7},
    "llava": {"llava-hf/llava-1.5-7b-hf": 7},
    "gemma3_vl": {"google/gemma-3-4b-it": 4, "google/gemma-3-12b-it": 12, "google/gemma-3-27b-it": 27},
    "olmo3": {"allenai/Olmo-3-7B-Instruct-SFT": 7.3},
    "cohere2": {"CohereForAI/c4ai-command-r7b-12-2024": 8},
    "nemotron": {"nvidia/Nemotron-Mini-4B-Instruct": 4.2},
    "lfm2": {"LiquidAI/LFM2-350M": 0.35},
    "lfm2_moe": {"LiquidAI/LFM2-8B-A1B": 8.3},
    # Gemma 4 (Gemma4ForConditionalGeneration): E2B by its effective size, the MoE by its total.
    "gemma4": {"google/gemma-4-E2B-it": 2, "google/gemma-4-26B-A4B": 26, "google/gemma-4-31B": 31},
    "gemma4_unified": {"google/gemma-4-12B-it": 12},  # Gemma 4 Unified (presets/gemma4.py)
    # Mistral 3 (Pixtral tower, 2x2 merge) by text model: Ministral 3's, Mistral Small 3.1's.
    "ministral3": {"mistralai/Ministral-3-3B-Reasoning-2512": 3},
    "mistral3": {"mistralai/Mistral-Small-3.1-24B-Instruct-2503": 24, "mistralai/Magistral-Small-2509": 24},
    "pixtral": {"mistral-community/pixtral-12b": 12},
    # Mistral Small 4: Mistral 3's layout over a mistral4 MoE text model, by its total.
    "mistral4": {"mistralai/Mistral-Small-4-119B-2603": 119},
    # Mistral Medium 3.5: Mistral 3's layout (a 48-layer Pixtral tower) over Devstral 2 123B's text model.
    "mistral_medium": {"mistralai/Mistral-Medium-3.5-128B": 128},
    # PaddleOCR-VL (presets/paddleocr.py): 1.0, 1.5 and 1.6 are one 0.9B model.
    "paddleocr_vl": {"PaddlePaddle/PaddleOCR-VL-1.6": 0.9},
    "qwen3_vl": {"Qwen/Qwen3-VL-4B-Instruct": 4},
    "qwen3_vl_moe": {"Qwen/Qwen3-VL-30B-A3B-Instruct": 30},
    "internvl": {"OpenGVLab/InternVL3_5-8B-HF": 8.5},
    "lfm2_vl": {"LiquidAI/LFM2-VL-450M": 0.45},
    "mllama": {"alpindale/Llama-3.2-11B-Vision-Instruct": 11},
    # Llama 4 (Llama4ForConditionalGeneration, presets/llama4.py), a family per checkpoint (their names
    # give both 17B, the active size): Scout's 16 experts, Maverick's 128; axolotl-quants'
    # Linearized-bnb-nf4 copies are these checkpoints.
    "llama4_scout": {"meta-llama/Llama-4-Scout-17B-16E": 17},
    "llama4_maverick": {"meta-llama/Llama-4-Maverick-17B-128E": 17},
    # GLM-4.6V-Flash (Glm4vForConditionalGeneration, presets/glm4v.py) by its model card's 9B.
    "glm46v_flash": {"zai-org/GLM-4.6V-Flash": 9},
    # Arcee AI (presets/arcee.py): AFM-4.5B (its Base shares the shapes); Trinity Nano (AFMoE) by its 6B
    # total. Hunyuan dense V1 (presets/hunyuan.py): the 0.5B (its Pretrain shares the shapes).
    "arcee": {"arcee-ai/AFM-4.5B": 4.5},
    "afmoe": {"arcee-ai/Trinity-Nano-Preview": 6},
    "hunyuan_v1_dense": {"tencent/Hunyuan-0.5B-Instruct": 0.5},
    # DeepSeek-V3 (presets/deepseek_v3.py): V3, V3-0324, V3.1 and R1 share its shapes; by its 671B.
    "deepseek_v3": {"deepseek-ai/DeepSeek-V3": 671},
    # MiniMax-M2 (presets/minimax.py): M2, M2.1 and M2.5 share its shapes; by its 229B.
    "minimax_m2": {"MiniMaxAI/MiniMax-M2": 229},
    # Granite 4.0 H-Tiny (presets/granite.py) by its 7B; granite-4.0-tiny-preview (62 experts, a 49160
    # vocabulary: no public config.json) reads as the release it previewed.
    "granite4_tiny": {"ibm-granite/granite-4.0-h-tiny": 7},
    # GLM-5 (glm_moe_dsa, presets/glm5.py): GLM-5, 5.1 (and 5.2, no public config.json) by its 744B.
    "glm5": {"zai-org/GLM-5": 744},
}
# Within a factor 1.5 in size, a model's widths and depth are of the preset's order (Llama-2-7B as
# Llama-3.1-8B, SmolLM-360M as SmolLM2-360M); beyond it (a 70B, Gemma-2-27B) the verdict is another job's.
MAX_SIZE_RATIO = 1.5
# A model id's family (lower case, first match wins); None: blocks no preset has (mixture of
# experts, a vision or audio tower, hybrid or linear attention, another family), never forced.
FAMILY_PATTERNS: list[tuple[str, str | None]] = [
    # The mixtures of experts with a preset (the Qwen3 ones' -2507 too), before the rule that drops
    # the others; gpt-oss-safeguard-20b is a gpt-oss-20b fine-tune.
    (r"qwen3-vl-30b-a3b", "qwen3_vl_moe"),
    (r"qwen3-(30b-a3b|235b-a22b)", "qwen3_moe"),
    (r"qwen3[.-]?5-(35b-a3b|122b-a10b|397b-a17b)", "qwen3_5_moe"),
    (r"qwen3-next-80b-a3b", "qwen3_next"),
    (r"gpt-oss-(safeguard-)?(20|120)b", "gpt_oss"),
    (r"deepseek-v2-lite|deepseek-v2\.5", "deepseek_v2"),
    (r"mixtral-8x(7|22)b", "mixtral"),
    (r"lfm2-8b-a1b", "lfm2_moe"),
    # Gemma 4 with a preset (the 26B-A4B, a mixture of experts, too); the 12B is gemma4_unified.
    (r"gemma-4-(e2b|26b-a4b|31b)", "gemma4"),
    (r"gemma-4-12b", "gemma4_unified"),
    (r"glm-4\.5-air", "glm4_moe"),
    (r"glm-4\.7-flash", "glm4_moe_lite"),
    (r"llama-4-scout-17b-16e", "llama4_scout"),
    (r"llama-4-maverick-17b-128e", "llama4_maverick"),
    (r"kimi-linear-48b-a3b", "kimi_linear"),
    (r"nemotron-3-(nano-30b-a3b|super-120b-a12b)", "nemotron_h"),
    (r"trinity-nano", "afmoe"),
    # DeepSeek-V3's shapes: V3 (-0324, -Base), V3.1, R1 (not V3.2's sparse attention, nor R1's distills).
    (r"deepseek-(v3(\.1)?(?![.\d])|r1(?!-distill))", "deepseek_v3"),
    (r"minimax-m2(\.[15])?(?![.\d])", "minimax_m2"),
    (r"granite-4\.0-(h-)?tiny", "granite4_tiny"),
    (r"glm-5(\.\d)?(?![\dv])", "glm5"),  # Trinity Nano (Preview, Base): 128 experts, 6B in total
    (r"-a\d+(\.\d+)?b\b|\d+x\d+b|-\d+e-|moe|mixtral", None),
    # The vision-language models with a preset, before the rule that drops the others.
    (r"qwen2-vl-", "qwen2_vl"),
    (r"qwen2\.5-vl-", "qwen2_5_vl"),
    (r"llava-1\.5-", "llava"),
    (r"gemma-3-(4|12|27)b", "gemma3_vl"),
    (r"ministral-3-3b-", "ministral3"),
    (r"mistral-small-3\.[12]-24b|magistral-small-2509", "mistral3"),
    (r"(^|/)pixtral-12b", "pixtral"),
    (r"mistral-small-4-119b-2603", "mistral4"),
    (r"mistral-medium-3\.5-128b", "mistral_medium"),
    (r"paddleocr-vl", "paddleocr_vl"),
    (r"qwen3-vl-\d+b", "qwen3_vl"),
    (r"internvl3_5-8b-hf", "internvl"),
    (r"lfm2-vl-450m", "lfm2_vl"),
    (r"llama-3\.2-11b-vision", "mllama"),
    (r"glm-4\.6v-flash", "glm46v_flash"),
    # No preset: Voxtral (an audio tower; transformers builds it as a sequence-to-sequence model, no
    # causal-LM or image-text-to-text class), SmolVLM2 (Idefics3's tiles; its tower drops padding
    # images and patches by boolean masks of pixel values, a shape the fake trace does not know).
    (r"vl\b|vl-|vision|llava|pixtral|voxtral|internvl|smolvlm", None),
    # Gemma 3 from 4B up is a vision model (Gemma3ForConditionalGeneration, above), 3n another architecture.
    (r"qwen3[.-]?5-\d+(\.\d+)?b\b", "qwen3_5"),  # the dense Qwen3.5 (the MoE ones are dropped above)
    # Falcon-H1-1.5B-Deep (66 layers of width 1280) is not the 1.5B's shape: no preset (falcon_h1.py).
    (r"falcon-h1-1\.5b-deep", "falcon_h1_deep"),
    (r"falcon-h1-", "falcon_h1"),
    (r"jamba-v0\.1|jamba-1\.5-large", "jamba"),
    # Gemma 3n's vision tower is timm's MobileNetV5 (transformers' TimmWrapperModel: timm.create_model),
    # which autotune's environment has not: no preset.
    (r"qwen3[.-]?5|qwen3-next|llama-4|gemma-3n|gemma-4|mamba|jamba", None),
    (r"apertus-8b", "apertus"),
    (r"seed-oss-36b", "seed_oss"),
    (r"olmo-3-7b", "olmo3"),  # OLMo 3 7B (Instruct, Think, their SFT/DPO stages: one shape)
    (r"command-r7b", "cohere2"),
    (r"glm-4-32b-(base-)?0414", "glm4"),
    (r"nemotron-mini-4b", "nemotron"),
    (r"(^|/)afm-4\.5b", "arcee"),
    (r"hunyuan-\d+(\.\d+)?b-(instruct|pretrain)", "hunyuan_v1_dense"),  # dense V1 (A13B is a MoE)
    (r"lfm2-350m", "lfm2"),
    (r"llama|orpheus", "llama"),  # orpheus-3b is a Llama-3.2-3B
    (r"smollm2?-", "smollm2"),  # Llama blocks; SmolLM (v1) has SmolLM2's shapes at each size
    (r"mistral-7b|ministral-8b", "mistral"),
    # Mistral Small 3's 24B text model; Magistral-Small-2509 and Mistral-Small-3.1 carry a vision tower.
    (r"devstral-small-2507|magistral-small-250[67]", "mistral_small"),
    (r"qwen3-", "qwen3"),  # Qwen3 dense: Qwen2's blocks with a norm on q and k
    # Plano-Orchestrator-4B: Axolotl's example trains it with the qwen3 chat template (a Qwen3-4B).
    (r"plano-orchestrator-4b", "qwen3"),
    (r"qwen2(\.5)?-", "qwen"),
    (r"cogito-v1-preview-qwen-", "qwen"),  # Deep Cogito's fine-tunes of Qwen2.5 (14B, 32B)
    (r"gemma-2-", "gemma2"),
    (r"gemma-3-", "gemma3"),  # the text-only 270M and 1B
    (r"phi-(1_5|1\.5|2)\b", "phi"),
    (r"phi-3(\.5)?-mini", "phi3"),
    (r"(^|/)gpt2", "gpt2"),
]
# --peel rereads a config with a tiny preset of its family (seconds, where an 8B estimate takes 40):
# the config's keys are read whole, and the tiny preset's own refusal of a longer sequence than its
# 128 positions (POSITIONS) says so; the step is not the config's. Qwen3 and Gemma 3 name their
# projections as Qwen2 and Gemma 2 do, SmolLM2 is a Llama.
PEEL_READERS: dict[str | None, str] = {
    "llama": "tiny-llama", "smollm2": "tiny-llama", "mistral": "tiny-mistral", "qwen": "tiny-qwen2",
    "qwen3": "tiny-qwen2", "gemma2": "tiny-gemma2", "gemma3": "tiny-gemma2", "gpt2": "tiny-gpt2",
    "qwen2_vl": "tiny-qwen2_vl", "qwen2_5_vl": "tiny-qwen2_5_vl", "llava": "tiny-llava",
    "gemma3_vl": "tiny-gemma3", "mixtral": "tiny-mixtral", "gemma4": "tiny-gemma4",
    "qwen3_5": "tiny-qwen3_5", "gpt_oss": "tiny-gpt_oss",
    "qwen3_5_moe": "tiny-qwen3_5_moe", "qwen3_next": "tiny-qwen3_next",
    "falcon_h1": "tiny-falcon_h1", "falcon_h1_deep": "tiny-falcon_h1", "ministral3": "tiny-mistral3",
    "mistral3": "tiny-mistral3",
    "mistral4": "tiny-mistral4",
    "mistral_medium": "tiny-mistral3",
    "paddleocr_vl": "tiny-paddleocr_vl",
    "pixtral": "tiny-pixtral", "qwen3_vl": "tiny-qwen3_vl", "qwen3_vl_moe": "tiny-qwen3_vl_moe",
    "glm4_moe": "tiny-glm4_moe", "glm4_moe_lite": "tiny-glm4_moe_lite", "internvl": "tiny-internvl",
    "lfm2_vl": "tiny-lfm2_vl", "mllama": "tiny-mllama", "jamba": "tiny-jamba", "llama4_scout": "tiny-llama4",
    "llama4_maverick": "tiny-llama4", "glm4": "tiny-glm4", "glm46v_flash": "tiny-glm4v",
    "nemotron_h": "tiny-nemotron_h", "deepseek_v3": "tiny-deepseek_v3", "minimax_m2": "tiny-minimax_m2",
    "granite4_tiny": "tiny-granitemoehybrid", "glm5": "tiny-glm_moe_dsa",
    None: "tiny-llama",  # None: no near preset; phi, phi3 and qwen3_moe have no tiny one: their own
}
POSITIONS = "exceeds max_position_embeddings"
# reinit_weights checked against the tiny preset's dtype (none: float32): the tiny reader's, not the config's
TINY_DTYPE = "from_config builds its weights in the checkpoint config's dtype"  # configs/axolotl_loading.py
KERNELS_NOT_EMULATED = "Axolotl's fused LoRA kernels (emulated) are emulated on"  # workload/lora_kernels.py
KERNELS_MIXED_DTYPES = "Axolotl's fused LoRA kernels fail on"  # workload/lora_kernel_functions.py MixedDtypes
ATTENTION_NOT_PATCHED = "Axolotl's lora_qkv_kernel / lora_o_kernel fail on"  # lora_kernels.check_model
# Ids without a "7B" in them (the phi sizes their model cards'), most specific first.
NAMED_SIZES = {"phi-3": 3.8, "phi-2": 2.7, "phi-1_5": 1.3, "phi-1.5": 1.3, "gpt2-medium": 0.355,
               "gpt2": 0.124, "devstral-small": 24, "magistral-small": 24, "deepseek-v2-lite": 16,
               "mixtral-8x7b": 46.7, "mixtral-8x22b": 141, "command-r7b": 8, "gemma-4-e2b": 2,
               "glm-4.5-air": 106, "glm-4.7-flash": 30, "glm-4.6v-flash": 9, "jamba-v0.1": 52,
               "jamba-1.5-large": 398, "deepseek-v2.5": 236, "trinity-nano": 6, "paddleocr-vl": 0.9,
               "deepseek-v3": 671, "deepseek-r1": 671, "minimax-m2": 229,
               "granite-4.0-h-tiny": 7, "granite-4.0-tiny": 7, "glm-5": 744}
LLAMAFACTORY_CORE = ("examples/train_lora/", "examples/train_qlora/", "examples/train_full/")
AXOLOTL_PREFERENCE = {"rl", "trl", "reward_model", "process_reward_model"}
AXOLOTL_SHARDING = {"deepspeed", "fsdp", "fsdp_config", "fsdp_version"}
PARALLEL_SIZES = ("context_parallel_size", "tensor_parallel_size", "dp_shard_size", "expert_parallel_size",
                  "dp_replicate_size", "sequence_parallel_degree", "ray_num_workers")
PREFERENCE_STAGES = {"dpo", "kto", "rm", "ppo", "orpo", "simpo"}
# Refusals whose key's value is the reason (bf16: auto); other keys are named alone (rl, deepspeed).
VALUE_KEYS = {"bf16", "fp16", "adapter", "optimizer", "optim", "attn_implementation", "loss_type"}
PEEL_ROUNDS = 16
TAIL_LINES = 8  # of a crash's stderr


@dataclass
class Config:
    file: str  # path inside its repository
    source: str  # axolotl, llamafactory, llamafactory-extra
    text: str
    model: str | None = None
    family: str | None = None
    preset: str | None = None  # None: no near preset
    group: str = HEADLINE


@dataclass
class Row:
    file: str
    source: str
    group: str
    model: str | None
    preset: str | None  # None: no near preset (its config read against the stand-in)
    status: str = "no preset"  # answered, refused, crash, no preset
    exit: int | None = None
    seconds: float = 0.0
    verdict: str | None = None  # fits, does not fit
    reason: str | None = None  # the refusal's reason
    error: str | None = None  # the refusal's message, the file path left out
    # The refusal's kind (autotune/errors.py): "not modelled", "unknown key", "invalid", or "job
    # fails" (the real job fails too: a faithful answer, no verdict to give)
    kind: str | None = None
    stand_in: str | None = None  # no preset: the stand-in's outcome (answered: the config reads whole)
    reasons: list[str] = field(default_factory=list)  # --peel: every blocking key, in order
    peeled: str | None = None  # --peel, once they are fixed or dropped: read whole, refused, crash
    peel_seconds: float = 0.0
    ignored_keys: list[str] = field(default_factory=list)  # an answer's keys taken to change nothing
    crashes: list[str] = field(default_factory=list)  # "when: stderr's last lines"
    carried: bool = False  # --again: an answered row of the earlier run, not checked again


# ---------------------------------------------------------------------------------------------
# The corpus


def repo_files(path: Path) -> tuple[list[str], Callable[[str], str]]:
    """The file paths under examples/ of a clone, a copy or a bare git directory, and their reader."""
    if (path / "examples").is_dir():
        names = [str(p.relative_to(path)) for p in sorted((path / "examples").rglob("*")) if p.is_file()]
        return names, lambda name: (path / name).read_text()
    git = ["git", f"--git-dir={path}"]
    listing = subprocess.run([*git, "ls-tree", "-r", "HEAD", "--name-only", "examples"],
                             capture_output=True, text=True, check=True).stdout.splitlines()
    return listing, lambda name: subprocess.run([*git, "show", f"HEAD:{name}"], capture_output=True,
                                                text=True, check=True).stdout


def load_corpus(path: Path, repo: str) -> list[Config]:
    names, read = repo_files(path)
    configs = []
    for name in names:
        if not name.endswith((".yml", ".yaml")) or name.startswith("examples/archived/"):
            continue
        if repo == "axolotl":
            configs.append(Config(name, repo, read(name)))
            continue
        config = Config(name, "llamafactory" if name.startswith(LLAMAFACTORY_CORE) else "llamafactory-extra",
                        read(name))
        data = parse(config.text)
        if config.source == "llamafactory" or data.get("stage") and data.get("do_train") \
                or data.get("train_dataset"):
            configs.append(config)
    return configs


def parse(text: str) -> dict[str, Any]:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError:
        return {}  # autotune refuses it with the reason
    return data if isinstance(data, dict) else {}


def classify(config: Config, presets: set[str]) -> None:
    """The config's model, its preset and its group."""
    data = parse(config.text)
    model = data.get("base_model" if config.source == "axolotl" else "model_name_or_path", data.get("model"))
    config.model = str(model).strip() if model else None
    config.family = family(config.model) if config.model else None
    config.preset = nearest_preset(config.model, presets) if config.model else None
    config.group = group(config.source, config.file, data)


def family(model: str) -> str | None:
    return next((fam for pattern, fam in FAMILY_PATTERNS if re.search(pattern, model.lower())), None)


def nearest_preset(model: str, presets: set[str]) -> str | None:
    size = model_size(model.lower())
    candidates = {p: s for p, s in FAMILIES.get(family(model) or "", {}).items() if p in presets}
    if size is None or not candidates:
        return None
    preset, preset_size = min(candidates.items(), key=lambda item: abs(item[1] / size - 1))
    return preset if max(size, preset_size) / min(size, preset_size) <= MAX_SIZE_RATIO else None


def model_size(name: str) -> float | None:
    """Billions of parameters a model id names: "-7b", "_0.5B", "-135m"."""
    found = re.search(r"[-_/](\d+(?:\.\d+)?)([bm])(?![a-z0-9])", name)
    if found:
        return float(found.group(1)) / (1000 if found.group(2) == "m" else 1)
    return next((size for prefix, size in NAMED_SIZES.items() if prefix in name), None)


def group(source: str, file: str, data: dict[str, Any]) -> str:
    set_keys = {key for key, value in data.items() if value not in (None, False, "", [], {}, 0)}
    parallel = any(_above_one(value) for key, value in data.items()
                   if key in PARALLEL_SIZES or key.endswith("_parallel_size"))
    if source == "axolotl":
        if set_keys & AXOLOTL_PREFERENCE:
            return "preference/reward"
        return "multi-GPU" if set_keys & AXOLOTL_SHARDING or parallel else HEADLINE
    if str(data.get("stage", "")).lower() in PREFERENCE_STAGES or "dpo" in Path(file).name:
        return "preference/reward"
    # LLaMA-Factory launches FSDP from an accelerate config named on the command line: only the
    # file's name says so. v1's dist_config, Megatron and Ray run on several GPUs.
    if set_keys & {"deepspeed", "dist_config"} or parallel or re.search(r"fsdp|megatron|_ray\b", file):
        return "multi-GPU"
    return HEADLINE


def _above_one(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 1


# ---------------------------------------------------------------------------------------------
# One check


# Axolotl's device mesh (utils/distributed.py build_parallelism_config): with dp_shard_size given, the
# product of the sizes is the job's world size (accelerate's ParallelismConfig refuses another).
MESH_KEYS = ("dp_shard_size", "dp_replicate_size", "tensor_parallel_size", "context_parallel_size")


def job_gpus(text: str) -> int:
    """The GPUs a multi-GPU config runs on: its mesh's product where it fixes one, Ray's workers (one GPU
    each: Axolotl's cli/train.py ScalingConfig) under use_ray, else one node's."""
    data = yaml.safe_load(text)
    if isinstance(data, dict) and data.get("use_ray") is True:
        workers = data.get("ray_num_workers", 1)
        return workers if isinstance(workers, int) and workers > 0 else MULTI_GPU_GPUS
    if not isinstance(data, dict) or not isinstance(data.get("dp_shard_size"), int):
        return MULTI_GPU_GPUS
    return math.prod(size for key in MESH_KEYS if isinstance(size := data.get(key), int) and size > 0)


def run_check(root: Path, preset: str, file: Path, timeout_s: float,
              gpus: int | None = None) -> tuple[int | None, str, str, float]:
    """(exit status, None on a timeout; stdout; stderr; wall seconds) of one ``autotune check``;
    ``gpus``: the job's GPU count, which no training config carries."""
    argv = [sys.executable, "-m", "autotune", "check", preset, "--from-config", str(file), "--gpu", GPU,
            "--json", "--no-cache", "--backend", "estimate", "--workers", "1",
            *(["--gpus", str(gpus)] if gpus is not None else [])]
    env = {**os.environ, "PYTHONPATH": str(root), "HF_HUB_OFFLINE": "1", "AUTOTUNE_OFFLINE": "1"}
    started = time.perf_counter()
    try:
        done = subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        return None, _text(exc.stdout), _text(exc.stderr), time.perf_counter() - started
    return done.returncode, done.stdout, done.stderr, time.perf_counter() - started


def children_cpu() -> float:
    """User and system CPU seconds of every child process waited for so far (the checks)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _text(output: bytes | str | None) -> str:
    return output.decode(errors="replace") if isinstance(output, bytes) else output or ""


def outcome(code: int | None, stdout: str, stderr: str) -> tuple[str, dict[str, Any]]:
    """answered, refused or crash, and the JSON document printed."""
    try:
        document = json.loads(stdout)
    except json.JSONDecodeError:
        document = None
    if code is None or "Traceback (most recent call last)" in stderr or not isinstance(document, dict):
        return "crash", {}
    if code in (0, 1) and isinstance(document.get("fits"), bool):
        return "answered", document
    if code == 2 and isinstance(document.get("error"), str):
        return "refused", document
    return "crash", document


def check_config(config: Config, scratch: Path, args: argparse.Namespace) -> Row:
    row = Row(config.file, config.source, config.group, config.model, config.preset)
    preset = config.preset or args.stand_in
    if preset is None:
        return row
    file = scratch / config.source / config.file
    text: str | None = config.text
    for round_ in range(PEEL_ROUNDS if args.peel else 1):
        file.write_text(text)
        if round_:
            preset = PEEL_READERS.get(config.family if config.preset else None, config.preset)
        gpus = job_gpus(text) if config.group == "multi-GPU" else None
        code, stdout, stderr, seconds = run_check(args.autotune_root, preset, file, args.timeout, gpus)
        status, document = outcome(code, stdout, stderr)
        if status == "crash":
            when = "peeled" if round_ else "stand-in" if config.preset is None else "check"
            tail = (stderr or stdout).strip().splitlines()[-TAIL_LINES:]
            timeout = [f"(timed out after {args.timeout:.0f} s)"] if code is None else []
            row.crashes.append(f"{when} with {preset}, exit {code}:\n" + "\n".join(tail + timeout))
        message = strip_path(document["error"], file) if status == "refused" else None
        if round_ and message and (POSITIONS in message or TINY_DTYPE in message):
            status, message = "answered", None  # the tiny reader's positions: the config was read whole
        if round_ == 0:
            row.exit, row.seconds = code, seconds
            if config.preset is None:
                row.stand_in = status
            else:
                row.status = status
            if status == "answered" and config.preset:
                row.verdict = "fits" if document["fits"] else "does not fit"
                row.ignored_keys = list(document.get("ignored_keys", []))
            if message:
                row.reason, row.error, row.kind = reason(message), message, document.get("kind")
        else:
            row.peel_seconds += seconds
        if message is None:
            row.peeled = {"answered": "read whole"}.get(status, status) if round_ else None
            break
        row.reasons.append(reason(message))
        text = peeled(text, message) if args.peel else None
        if text is None:
            break
    else:
        text = None
    if text is None and args.peel:
        row.peeled = "refused"
    return row


# ---------------------------------------------------------------------------------------------
# Reasons


def strip_path(message: str, file: Path) -> str:
    path = str(file)
    return message.replace(f" in {path!r}", "").replace(repr(path), "FILE").replace(path, "FILE")


def reason(message: str) -> str:
    """A refusal's reason: the key it names, with its value where the value is the reason; no paths
    or numbers."""
    if message.startswith("missing "):
        return message.split(":")[0]
    if message.startswith(KERNELS_NOT_EMULATED):
        return "Axolotl's fused LoRA kernels on a model type they are not emulated on"
    if message.startswith(ATTENTION_NOT_PATCHED):
        return "Axolotl's fused LoRA attention kernels on an attention patch_self_attn_lora cannot rewrite"
    if message.startswith(KERNELS_MIXED_DTYPES):
        return "Axolotl's fused LoRA kernels on activations off the autocast dtype"
    if message.startswith("training config FILE mixes"):
        return re.sub(r" \([^)]*\)", "", message.split(":")[0]).replace("training config FILE ", "")
    verbs = "is not modelled|must be|lists|is empty|needs|names"
    head = re.match(rf"([A-Za-z_][\w.]*)(?::\s*(.*?))?\s+({verbs})\b", message)
    if head is None:
        # quoted values (paths, names) collapsed; an apostrophe inside a word (Axolotl's) is not a quote
        return re.sub(r"\d+", "N", re.sub(r"(?<!\w)'[^']*'(?!\w)", "'...'", message))[:90]
    key, value, verb = head.group(1), (head.group(2) or "").strip("'\""), head.group(3)
    if key == "adapter" and "_kernel" in message:
        return "lora_*_kernel unset (Axolotl turns its fused LoRA kernels on)"
    if re.fullmatch(r"lora_\w+_kernel", key):
        return "lora_*_kernel: true"
    if key.startswith(("liger_", "unsloth_")):
        return key.split("_")[0] + "_*"
    if key == "gradient_checkpointing" and "gradient_checkpointing_kwargs" in message:
        return "gradient_checkpointing without gradient_checkpointing_kwargs (use_reentrant=True)"
    if "DeepSpeed/FSDP sharding" in message or "tensor/context parallelism" in message:
        return "DeepSpeed/FSDP sharding" if "sharding" in message else "tensor/context parallelism"
    if key == "lora_target_modules" and "regular expression" in message:
        return "lora_target_modules: a regular expression"
    if key == "adapter" and "names no LoRA target" in message:
        return "adapter without LoRA targets"
    if key.endswith(".use_reentrant"):
        return "gradient_checkpointing_kwargs.use_reentrant: true"
    if key in ("bf16", "fp16", "bfloat16", "float16") and "under DeepSpeed ZeRO-3" in message:
        return f"{key} without flash attention under ZeRO-3 (Axolotl's float32 embeddings and norms)"
    if verb != "is not modelled":
        return f"{key}: invalid ({verb} ...)"
    if key in VALUE_KEYS and re.fullmatch(r"[A-Za-z][\w.-]*", value):
        return f"{key}: {value}"
    return key


# A refusal that says how to write the job autotune models, as lines to write instead.
KERNELS_OFF = "".join(f"lora_{name}_kernel: false\n" for name in ("mlp", "qkv", "o", "embedding"))
FIXES = {
    "lora_*_kernel unset (Axolotl turns its fused LoRA kernels on)": KERNELS_OFF,
    "Axolotl's fused LoRA kernels on a model type they are not emulated on": KERNELS_OFF,
    # Set, one lora_*_kernel turns off Axolotl's auto-enabling of the others (check_auto_enable_lora_kernels).
    "Axolotl's fused LoRA attention kernels on an attention patch_self_attn_lora cannot rewrite": KERNELS_OFF,
    "Axolotl's fused LoRA kernels on activations off the autocast dtype": KERNELS_OFF,
    "gradient_checkpointing without gradient_checkpointing_kwargs (use_reentrant=True)":
        "gradient_checkpointing_kwargs:\n  use_reentrant: false\n",
    "adapter without LoRA targets": "lora_target_linear: true\n",
}


def peeled(text: str, message: str) -> str | None:
    """The config with the refused key fixed as the refusal asks, else dropped; None: nothing to do."""
    why = reason(message)
    if why in FIXES:
        fixed = text.rstrip("\n") + "\n" + FIXES[why]
    elif why == "bf16: auto":
        fixed = re.sub(r"(?m)^bf16:.*$", "bf16: true", text)
    elif why == "liger_*":  # every Liger kernel but the modelled fused linear cross-entropy, at once
        fixed = re.sub(r"(?m)^liger_(?!fused_linear_cross_entropy:)\w+:.*\n?", "", text)
    elif why == "lora_*_kernel: true":
        fixed = re.sub(r"(?m)^(lora_\w+_kernel):.*$", r"\1: false", text)
    elif why == "gradient_checkpointing_kwargs.use_reentrant: true":
        fixed = re.sub(r"(?m)^(\s+use_reentrant:\s*)[Tt]rue\b", r"\1false", text)
    elif why == "lora_target_modules: a regular expression":
        fixed = _drop(text, "lora_target_modules").rstrip("\n") + "\n" + FIXES["adapter without LoRA targets"]
    elif "without flash attention" in why:
        fixed = re.sub(r"(?m)^(attn_implementation|sdp_attention|flash_attention):.*\n?", "", text)
        fixed = fixed.rstrip("\n") + "\nattn_implementation: flash_attention_2\n"
    else:
        nested = re.match(r"([A-Za-z_]\w*)\.([A-Za-z_]\w*)\b", message)
        key = re.match(r"[A-Za-z_]\w*", message)
        fixed = text if key is None else _drop(text, key.group())
        if nested is not None:  # trl.async_prefetch: that key of the mapping, not the whole trl block
            fixed = _drop_nested(text, *nested.groups()) or fixed
    return None if fixed == text else fixed


def _drop_nested(text: str, key: str, inner: str) -> str | None:
    """The YAML text without ``inner`` (and its block) of the top-level mapping ``key``; None where the
    mapping has no such line."""
    block = re.search(rf"(?m)^{key}:[ \t]*(?:#.*)?\n((?:(?:[ \t#].*)?\n)*)", text)
    if block is None:
        return None
    body = block.group(1)
    line = re.search(rf"(?m)^([ \t]+){inner}:.*\n?", body)
    if line is None:
        return None
    indent = len(line.group(1))
    rest = body[line.end():]
    deeper = re.match(rf"(?:(?:[ \t]{{{indent + 1},}}.*|[ \t]*-.*)?\n)*", rest)
    end = line.end() + (deeper.end() if deeper else 0)
    return text[:block.start(1)] + body[:line.start()] + body[end:] + text[block.end(1):]


def _drop(text: str, key: str) -> str:
    """The YAML text without the top-level key: its line and its block (indented, list, comment and
    blank lines below it)."""
    return re.sub(rf"(?m)^{key}:.*\n?(?:(?:[ \t#-].*)?\n)*", "", text, count=1)


# ---------------------------------------------------------------------------------------------
# The report


def report(rows: list[Row]) -> None:
    mapping = Counter((r.model, r.preset) for r in rows if r.preset)
    print(f"\nModel -> preset ({sum(mapping.values())} configs):")
    for (model, preset), count in sorted(mapping.items(), key=lambda item: (item[0][1], item[0][0])):
        print(f"  {count:3d}  {model} -> {preset}")
    unmapped = Counter(r.model or "(none named)" for r in rows if not r.preset)
    print(f"No near preset ({sum(unmapped.values())} configs, {len(unmapped)} models): "
          + ", ".join(f"{m} x{n}" if n > 1 else m for m, n in sorted(unmapped.items())))

    carried = sum(r.carried for r in rows)
    if carried:
        print(f"\n{carried} answered configs carried from an earlier run (--again), not checked again")
    print("\nPer source and group (answer rate: of the configs with a preset):")
    for source in dict.fromkeys(r.source for r in rows):
        for name in GROUPS:
            part = [r for r in rows if r.source == source and r.group == name]
            if part:
                print("  " + counts(f"{source} / {name}", part))
    core = [r for r in rows if r.source != "llamafactory-extra"]
    core_sft = [r for r in core if r.group == HEADLINE]
    print("  " + counts(f"headline: axolotl + llamafactory / {HEADLINE}", core_sft))
    print("  " + counts("axolotl + llamafactory, all groups", core))
    print("  " + counts("every config", rows))

    picks: list[tuple[str, Callable[[Row], list[str]]]] = [("First refusal reasons", lambda r: r.reasons[:1])]
    peel = any(r.peeled for r in rows)
    if peel:
        picks.append(("Every blocking key (--peel)", lambda r: list(dict.fromkeys(r.reasons))))
    failing = {r.reason for r in rows if r.kind == JOB_FAILS}
    for title, pick in picks:
        ranked, example, headline = Counter(), {}, Counter()
        for r in rows:
            for why in pick(r):
                ranked[why] += 1
                example.setdefault(why, f"{r.source}:{r.file}")
                headline[why] += r.group == HEADLINE and r.source != "llamafactory-extra"
        print(f"\n{title}, ranked: configs (no preset ones read against the stand-in included), "
              f"of them axolotl + llamafactory {HEADLINE}, an example:")
        for why, count in ranked.most_common():
            fails = " [the job fails]" if why in failing else ""
            print(f"  {count:4d} {headline[why]:4d}  {why}{fails}   e.g. {example[why]}")
    if peel:
        after = Counter(r.peeled for r in rows if r.peeled)
        print(f"\nOnce every blocking key is fixed or dropped (--peel): {dict(after)}; peel checks took "
              f"{sum(r.peel_seconds for r in rows):.0f} s")
        stuck = Counter(r.reasons[-1] for r in rows if r.peeled == "refused")
        if stuck:
            print("  left refused by: " + "; ".join(f"{why} ({n})" for why, n in stuck.most_common()))

    read_whole = [r for r in rows if r.stand_in == "answered"]
    print(f"\nNo preset, but the config is read whole (the stand-in answered): {len(read_whole)}")
    for r in read_whole:
        print(f"  {r.source}:{r.file} ({r.model})")
    answered = [r for r in rows if r.status == "answered"]
    print(f"\nAnswered: {len(answered)}")
    for r in answered:
        ignored = f"; ignored keys: {', '.join(r.ignored_keys)}" if r.ignored_keys else ""
        print(f"  {r.source}:{r.file} -> {r.preset}: {r.verdict} ({r.seconds:.1f} s){ignored}")
    crashed = [r for r in rows if r.crashes]
    print(f"\nCrashes: {sum(len(r.crashes) for r in rows)} ({sum(r.status == 'crash' for r in rows)} "
          "of the configs with a preset at their first check)")
    for r in crashed:
        for crash in r.crashes:
            print(f"  {r.source}:{r.file}: {crash}".replace("\n", "\n    "))
    lf = [r for r in rows if r.source == "llamafactory" and r.status != "answered"]
    print(f"\nLLaMA-Factory configs (train_lora, train_qlora, train_full) not answered: {len(lf)}")
    for r in lf:
        print(f"  {r.file} [{r.group}] {r.model} -> {r.preset or 'no preset'}: {r.status}: "
              f"{r.error or r.stand_in}")
    extra = Counter(r.reason or r.stand_in for r in rows
                    if r.source == "llamafactory-extra" and r.status != "answered")
    if extra:
        print(f"  the {sum(extra.values())} other LLaMA-Factory training configs: "
              + "; ".join(f"{why} ({n})" for why, n in extra.most_common()))


JOB_FAILS = "job fails"  # autotune/errors.py JobFails.kind


def counts(label: str, rows: list[Row]) -> str:
    status = Counter(r.status for r in rows)
    verdicts = Counter(r.verdict for r in rows if r.status == "answered")
    run = len(rows) - status["no preset"]
    fails = sum(r.status == "refused" and r.kind == JOB_FAILS for r in rows)
    rate = f"{status['answered'] / run:.0%}" if run else "-"
    faithful = f"{(status['answered'] + fails) / run:.0%}" if run else "-"
    return (f"{label:<50} {len(rows):4d} configs, {status['no preset']:3d} no preset, {run:3d} checked: "
            f"{status['answered']:3d} answered ({verdicts['fits']} fit, {verdicts['does not fit']} do not), "
            f"{status['refused']:3d} refused ({fails} as jobs that fail), {status['crash']:2d} crash: "
            f"{rate} answered, {faithful} with the failing jobs")


def list_presets(root: Path) -> set[str]:
    env = {**os.environ, "PYTHONPATH": str(root)}
    listing = subprocess.run([sys.executable, "-m", "autotune", "models"], cwd=root, env=env,
                             capture_output=True, text=True, check=True).stdout
    return {line.split()[0] for line in listing.splitlines() if line.strip()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--axolotl", type=Path, help="a clone (or bare mirror) of axolotl-ai-cloud/axolotl")
    parser.add_argument("--llamafactory", type=Path, help="a clone (or bare mirror) of hiyouga/LLaMA-Factory")
    parser.add_argument("--autotune-root", type=Path, default=ROOT, help="the checkout whose autotune runs")
    parser.add_argument("--scratch", type=Path, help="where the configs are copied (default: a temp dir)")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per check (default 300)")
    parser.add_argument("--jobs", type=int, default=1, help="checks at once (default 1)")
    parser.add_argument("--stand-in", default="meta-llama/Llama-3.2-1B",
                        help="preset the config of a model with no near preset is read against, for its "
                             "refusal only ('none': not checked)")
    parser.add_argument("--peel", action="store_true", help="find every blocking key of a refused config")
    parser.add_argument("--only", help="only the configs whose source:path contains this")
    parser.add_argument("--limit", type=int, help="only the first N configs")
    parser.add_argument("--json", type=Path, dest="json_out", help="write every config's row here")
    parser.add_argument("--report", type=Path, help="print the report of a --json file again, run nothing")
    parser.add_argument("--again", type=Path,
                        help="a --json file of an earlier run: check only the configs it did not answer, and "
                             "report its answered ones with them (carried, not checked again)")
    args = parser.parse_args()
    if args.report:
        report([Row(**row) for row in json.loads(args.report.read_text())])
        return
    if not (args.axolotl or args.llamafactory):
        parser.error("give --axolotl PATH, --llamafactory PATH or both")
    args.stand_in = None if args.stand_in == "none" else args.stand_in
    args.autotune_root = args.autotune_root.resolve()

    presets = list_presets(args.autotune_root)
    configs = [config for repo, path in (("axolotl", args.axolotl), ("llamafactory", args.llamafactory))
               if path for config in load_corpus(path, repo)]
    configs = [c for c in configs if not args.only or args.only in f"{c.source}:{c.file}"][:args.limit]
    carried: list[Row] = []
    if args.again:
        earlier = {(row["source"], row["file"]): Row(**row) for row in json.loads(args.again.read_text())}
        carried = [replace(earlier[key], carried=True) for c in configs
                   if (key := (c.source, c.file)) in earlier and earlier[key].status == "answered"]
        answered = {(r.source, r.file) for r in carried}
        configs = [c for c in configs if (c.source, c.file) not in answered]
    scratch = args.scratch or Path(tempfile.mkdtemp(prefix="bench-configs-"))
    for config in configs:
        classify(config, presets)
        (scratch / config.source / config.file).parent.mkdir(parents=True, exist_ok=True)
    sources = ", ".join(f"{source} {n}" for source, n in Counter(c.source for c in configs).items())
    print(f"{len(configs)} configs ({sources}) in {scratch}; autotune from {args.autotune_root}; {GPU}",
          flush=True)

    started, cpu_before, load_before = time.perf_counter(), children_cpu(), os.getloadavg()[0]
    rows: list[Row] = []
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for row in pool.map(lambda config: check_config(config, scratch, args), configs):
            rows.append(row)
            said = row.verdict or row.reason or (row.crashes[-1].splitlines()[-1] if row.crashes else "")
            status = row.status if row.preset else f"no preset ({row.stand_in})"
            print(f"[{len(rows)}/{len(configs)}] {status:<9} {row.seconds:6.1f} s  {row.source}:{row.file}  "
                  f"{said}", flush=True)
    wall_s, cpu_s = time.perf_counter() - started, children_cpu() - cpu_before
    checked, rows = rows, carried + rows
    report(rows)
    print(f"\nTotal wall time: {wall_s:.0f} s for {len(checked)} configs checked (first checks "
          f"{sum(r.seconds for r in checked):.0f} s, "
          f"slowest {max((r.seconds for r in checked), default=0):.1f} s)")
    # The load-independent figure (#39: the corpus in under 30 minutes on an idle 2-core machine): the
    # checks' own CPU, every autotune process and what it waited for, over the cores they could use.
    print(f"CPU of the checks: {cpu_s:.0f} s ({cpu_s / max(1, len(checked)):.1f} s a config; "
          f"{cpu_s / 60 / max(1, args.jobs):.1f} min of wall on {args.jobs} idle cores at best); "
          f"load average {load_before:.1f} at the start, {os.getloadavg()[0]:.1f} at the end")
    if args.json_out:
        args.json_out.write_text(json.dumps([asdict(r) for r in rows], indent=1) + "\n")
    if not args.scratch:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
