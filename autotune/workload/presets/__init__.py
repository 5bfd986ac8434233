"""The offline model presets: the published hyperparameters of common checkpoints, as data.

Hyperparameters from each checkpoint's config.json on the Hugging Face hub. Keys that do not
change the model's size or memory (id2label, use_cache, dropout defaults equal to transformers'
own) are left out; everything that shapes a tensor is copied exactly, and so is ``torch_dtype``,
the dtype ``from_pretrained`` loads the weights in. ``architectures`` is kept for the decoder
presets because it decides the default task (a ``*ForCausalLM`` -> causal-lm); the encoder
presets (BERT-era and ModernBERT) stay without it, so that their default task is
sequence-classification, the fine-tuning task of the stories. The decoder LLMs and ModernBERT
are as their config.json is published (transformers 5 maps torch_dtype to dtype and
rope_scaling/rope_theta to rope_parameters). The tests check the parameter counts against
published totals. Resolution (a name to a config) is ``workload/models.py``.

One module per family, each checkpoint's source cited beside it:

    encoders.py   the BERT-era encoders and ModernBERT
    llama.py      Llama 3 (to 3.1 405B), Apertus, SmolLM2
    qwen.py       Qwen2.5, Qwen3 (dense)
    gemma.py      Gemma 2, Gemma 3's text-only checkpoints
    phi.py        Phi-3.5-mini, Phi-1.5, Phi-2
    decoders.py   GPT-2, Mistral 7B and Devstral, Seed-OSS
    qwen_hybrid.py Qwen3.5 (dense and MoE) and Qwen3-Next: Gated DeltaNet linear attention
    moe.py        the mixtures of experts: Qwen3-MoE, Mixtral, gpt-oss (20b, 120b), DeepSeek-V2-Lite and V2.5
    more_decoders.py  OLMo 3, Command R7B, Nemotron-Mini-4B, LFM2 (dense and MoE)
    falcon_h1.py  Falcon-H1 (Mamba-2 and attention in parallel): 0.5B, 1.5B, 3B, 7B, 34B
    ssm_hybrids.py  Jamba (Mamba-1 mixers, attention, experts): v0.1, 1.5 Large
    kimi_linear.py  Kimi Linear 48B-A3B (Kimi Delta Attention, MLA, experts): refused by the estimator
    glm.py        Z.ai's GLM: GLM-4.5-Air, GLM-4.7-Flash (mixtures of experts), GLM-4-32B-0414
    vision.py     the vision-language models (Qwen2-VL, Qwen2.5-VL, LLaVA-1.5, Gemma 3)
    gemma4.py     Gemma 4 (vision-language: E2B, 26B-A4B, 31B; Gemma 4 Unified 12B)
    mistral3.py   Mistral's vision-language models (Mistral Small 3.1, Magistral Small, Ministral 3,
                  Mistral Medium 3.5, Pixtral-12B)
    vlms.py       more vision-language models (Qwen3-VL)
    vlms2.py      the vision-language models of Axolotl's later examples (InternVL 3.5)
    llama4.py     Llama 4 Scout and Maverick (vision-language mixtures of experts)
    glm4v.py      GLM-4.6V-Flash (vision-language, GLM-4V)
    nemotron_h.py NVIDIA Nemotron 3 Nano 30B-A3B and Super 120B-A12B (Mamba-2, experts, attention)
    arcee.py      Arcee AI: AFM-4.5B, Trinity-Nano-Preview (AFMoE, a mixture of experts)
    hunyuan.py    Tencent's Hunyuan dense: Hunyuan-0.5B-Instruct
    paddleocr.py  PaddleOCR-VL (vision-language: a NaViT SigLIP tower over ERNIE-4.5-0.3B)
    deepseek_v3.py  DeepSeek-V3 (V3-0324, V3.1, R1: one shape): MLA, 256 experts
    minimax.py    MiniMax-M2 (230B, 256 experts)
    granite.py    IBM Granite 4.0-H-Tiny (Mamba-2, NoPE attention, experts)
    glm5.py       Z.ai's GLM-5 (glm_moe_dsa: MLA, DeepSeek Sparse Attention's indexer, 256 experts)
    tiny.py       tiny configs for tests and demos (the ``tiny-*`` presets)

Here: PRESETS, in the order ``autotune models`` lists them, the hub aliases and the name index.
"""

from __future__ import annotations

from typing import Any

from autotune.workload.presets import (
    arcee,
    decoders,
    deepseek_v3,
    encoders,
    falcon_h1,
    gemma,
    gemma4,
    glm,
    glm4v,
    glm5,
    granite,
    hunyuan,
    kimi_linear,
    llama,
    llama4,
    minimax,
    mistral3,
    moe,
    more_decoders,
    nemotron_h,
    paddleocr,
    phi,
    qwen,
    qwen_hybrid,
    ssm_hybrids,
    vision,
    vlms,
    vlms2,
)
from autotune.workload.presets.tiny import TINY_CONFIGS

__all__ = ["HUB_ALIASES", "PRESETS", "PRESET_INDEX", "TINY_CONFIGS", "preset_name"]

# The order in which the presets were added, which listings keep.
_FULL_PRESETS: dict[str, dict[str, Any]] = {
    **encoders.BERT_ERA_PRESETS,
    **decoders.GPT2_PRESETS,
    **llama.LLAMA_3_PRESETS,
    **qwen.QWEN_2_5_PRESETS,
    **qwen.QWEN_3_PRESETS,
    **moe.QWEN_3_MOE_PRESETS,
    **decoders.MISTRAL_PRESETS,
    **moe.MIXTRAL_PRESETS,
    **llama.APERTUS_PRESETS,
    **decoders.SEED_OSS_PRESETS,
    **gemma.GEMMA_PRESETS,
    **phi.PHI_3_5_PRESETS,
    **llama.SMOLLM2_PRESETS,
    **phi.PHI_PRESETS,
    **moe.GPT_OSS_DEEPSEEK_PRESETS,
    **encoders.MODERNBERT_PRESETS,
    **vision.VLM_PRESETS,
    **more_decoders.OLMO_3_PRESETS,
    **more_decoders.COHERE_2_PRESETS,
    **more_decoders.NEMOTRON_PRESETS,
    **more_decoders.LFM2_PRESETS,
    **gemma4.GEMMA_4_PRESETS,
    **qwen_hybrid.QWEN_3_5_PRESETS,
    **qwen_hybrid.QWEN_3_NEXT_PRESETS,
    **falcon_h1.FALCON_H1_PRESETS,
    **mistral3.MISTRAL3_PRESETS,
    **vlms.VLMS_PRESETS,
    **glm.GLM_PRESETS,
    **vlms2.VLMS2_PRESETS,
    **ssm_hybrids.JAMBA_PRESETS,
    **llama4.LLAMA4_PRESETS,
    **glm.GLM_4_PRESETS,
    **kimi_linear.KIMI_LINEAR_PRESETS,
    **glm4v.GLM4V_PRESETS,
    **nemotron_h.NEMOTRON_H_PRESETS,
    **arcee.ARCEE_PRESETS,
    **hunyuan.HUNYUAN_PRESETS,
    **paddleocr.PADDLEOCR_PRESETS,
    **deepseek_v3.DEEPSEEK_V3_PRESETS,
    **minimax.MINIMAX_PRESETS,
    **granite.GRANITE_PRESETS,
    **glm5.GLM5_PRESETS,
}

PRESETS: dict[str, dict[str, Any]] = _FULL_PRESETS | {
    f"tiny-{model_type}": {"model_type": model_type, **kwargs} for model_type, kwargs in TINY_CONFIGS.items()
}

# Hub ids under which the same checkpoints are published (the hub moved the legacy
# un-namespaced models into organisations in 2024).
HUB_ALIASES: dict[str, str] = {
    "google-bert/bert-base-uncased": "bert-base-uncased",
    "google-bert/bert-base-cased": "bert-base-cased",
    "google-bert/bert-large-uncased": "bert-large-uncased",
    "google-bert/bert-large-cased": "bert-large-cased",
    "google-bert/bert-base-chinese": "bert-base-chinese",
    "google-bert/bert-base-multilingual-cased": "bert-base-multilingual-cased",
    "tohoku-nlp/bert-base-japanese": "cl-tohoku/bert-base-japanese",
    "distilbert/distilbert-base-uncased": "distilbert-base-uncased",
    "FacebookAI/roberta-base": "roberta-base",
    "FacebookAI/roberta-large": "roberta-large",
    "FacebookAI/xlm-roberta-base": "xlm-roberta-base",
    "FacebookAI/xlm-roberta-large": "xlm-roberta-large",
    "albert/albert-base-v2": "albert-base-v2",
    "openai-community/gpt2": "gpt2",
    "openai-community/gpt2-medium": "gpt2-medium",
    "meta-llama/Meta-Llama-3.1-8B": "meta-llama/Llama-3.1-8B",  # its name until late 2024
    "meta-llama/Meta-Llama-3.1-405B": "meta-llama/Llama-3.1-405B",  # likewise
    # The 8x22B base was first published (from Mistral's torrent) under mistral-community.
    "mistral-community/Mixtral-8x22B-v0.1": "mistralai/Mixtral-8x22B-v0.1",
    # CohereForAI became CohereLabs on the hub in 2025.
    "CohereLabs/c4ai-command-r7b-12-2024": "CohereForAI/c4ai-command-r7b-12-2024",
    # THUDM became zai-org on the hub in 2025.
    "THUDM/GLM-4-32B-0414": "zai-org/GLM-4-32B-0414",
    # Axolotl's BF16 copy of the FP8 checkpoint (examples/mistral-medium-3_5): the same config.json.
    "axolotl-ai-co/Mistral-Medium-3.5-128B-BF16": "mistralai/Mistral-Medium-3.5-128B",
}


def _preset_index() -> dict[str, str]:
    """Lower-case name -> preset: the name, the name without its org, the hub aliases."""
    index: dict[str, str] = {}
    for name in PRESETS:
        index[name.lower()] = name
        index.setdefault(name.rsplit("/", 1)[-1].lower(), name)
    index.update({alias.lower(): name for alias, name in HUB_ALIASES.items()})
    return index


PRESET_INDEX = _preset_index()


def preset_name(name: str) -> str | None:
    """The preset `name` stands for (case-insensitive, org optional), or None. Here, not in
    models.py, so that a name can be told a preset without importing transformers (cli/answers.py)."""
    return PRESET_INDEX.get(name.strip().lower())
