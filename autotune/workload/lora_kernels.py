"""Axolotl's fused LoRA kernels, patched into a PEFT model as Axolotl patches them, emulated.

Axolotl turns on ``lora_mlp_kernel``, ``lora_qkv_kernel``, ``lora_o_kernel`` and
``lora_embedding_kernel`` for a LoRA or QLoRA run where none is set (utils/schemas/config.py
``check_auto_enable_lora_kernels``; configs/axolotl.py reads that rule). With one of the first
three on, loaders/patch_manager.py ``_apply_lora_kernel_patch`` calls monkeypatch/lora_kernels.py
``apply_lora_kernel_patches`` on the PEFT model (the embedding kernel alone patches nothing); for
the attention, ``patch_self_attn_lora`` first rewrites the attention class's forward source so that
its q/k/v lines call ``self.apply_qkv(hidden_states)`` and its o line ``self.apply_o(attn_output)``.
Per decoder layer (``get_layers``: ``model.model.model.layers``):

    qkv        ``layer.self_attn`` with q_proj, k_proj, v_proj and o_proj: ``apply_qkv`` is
               ``apply_lora_qkv`` (the ``LoRA_QKV`` Function) where all three carry LoRA, else the
               three plain projections in turn (``original_apply_qkv``, "Cannot patch some attention
               QKV projections" warned)
    o          ``apply_o`` is ``apply_lora_o`` (``LoRA_O``) where o_proj carries LoRA
    mlp        ``layer.mlp`` with gate_proj, up_proj and down_proj, all three LoRA layers: its
               forward is ``apply_lora_mlp_swiglu`` (hidden_act silu) or ``apply_lora_mlp_geglu``
               (a gelu: Axolotl's GeGLU kernel computes GELU's erf form, also for Gemma's tanh one);
               another activation raises
    embedding  ``model.model.model.embed_tokens`` with LoRA (``lora_embedding_A``): its forward is
               ``apply_lora_embedding`` (``LoRA_Embedding``); lm_head is left to PEFT

Dropout is drawn once for q, k, v (and once for gate and up) on the LoRA path (``_apply_dropout``),
and not at all on down_proj's (LoRA_MLP: "no dropout on hidden - it's an intermediate"), where PEFT
draws one per projection.

Here the same happens to the instances, nothing of transformers or PEFT changed: the attention's
forward is left as it is and its projections' calls are what the rewritten one makes them: the
first, q_proj's, computes Q, K and V (fused, or the three plain projections in turn) and k_proj's
and v_proj's hand back K and V; o_proj's computes ``LoRA_O``. The attention class's source is
checked as ``patch_self_attn_lora`` checks it, so a model whose forward Axolotl cannot rewrite
is refused with Axolotl's own assertion. The Functions are lora_kernel_functions.py's; the
backend's ``KernelHooks`` dequantize a 4-bit base and hold the Triton kernels' registers.

Emulated for the model types of ``EMULATED`` (autotune's presets among them); others are refused
by name, as are tasks other than causal-lm (``apply_lora_kernel_patches`` takes a
``PeftModelForCausalLM`` only). Where v_proj is None (Gemma 4's attention_k_eq_v layers) the qkv
kernel is ``apply_lora_qk`` (``LoRA_QK`` over q and k, K handed back as V). Not emulated: Llama 4's
experts, DoRA, and Qwen 3.5's linear-attention projections: ``find_linear_attn_in_layer`` takes
a ``linear_attn`` with in_proj_qkv, in_proj_z, in_proj_b, in_proj_a and out_proj, and where one
in-projection carries LoRA (qkv kernel) its ``apply_in_proj_fused`` is ``LoRA_FusedProj`` over the
four, where out_proj does (o kernel) its ``apply_out_proj`` is ``LoRA_O``; the GatedDeltaNet
forward that calls them is Axolotl's packing patch's (monkeypatch/models/qwen3_5/modeling.py
``_la_in_proj_fwd``, ``_la_proj_fwd``), so such an adapter is refused by name (also without
sample_packing, where transformers' forward leaves them uncalled). Where Axolotl's run would fail,
so does this one, naming why: a model whose attention forward patch_self_attn_lora cannot rewrite,
an activation other than silu or gelu, activations not in the autocast dtype (matmul_lora's addmm_
of two dtypes; _MIXED_DTYPES says why for Apertus's QLoRA), the embedding kernel under autocast (its
backward's index_add_ of a 16-bit gradient into a float32 one). The attention classes were read in
transformers 5.14.1, Axolotl's pin (pyproject.toml), as in the version installed: the same forwards for the
classes of Axolotl's examples (FalconH1, Llama4Text, Olmo3, Phi, MllamaTextSelf, Mistral4 attention;
no <Prefix>Attention for llava, qwen2_vl, qwen2_5_vl, internvl).
"""

from __future__ import annotations

import inspect
import re
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from autotune.errors import InvalidInput, JobFails, UnmodelledSetting

if TYPE_CHECKING:
    import torch
    from torch import nn

    from autotune.workload.lora_kernel_functions import KernelHooks

KERNELS = ("mlp", "qkv", "o", "embedding")
CONFIG_KEYS = {name: f"lora_{name}_kernel" for name in KERNELS}  # Axolotl's keys
PATCHING = ("mlp", "qkv", "o")  # patch_manager.py _apply_lora_kernel_patch: one of them on
NAME = "Axolotl's fused LoRA kernels (emulated)"
# The model types whose decoder layers were checked against Axolotl's patch (self_attn with
# q/k/v/o_proj and a source patch_self_attn_lora rewrites, mlp with gate/up/down_proj, or a sparse
# MoE block it leaves alone; Apertus's xIELU MLP has no gate_proj, so find_mlp_in_layer yields
# nothing and it is left to PEFT, its activation never checked; Qwen 3.5's and Qwen3-Next's full
# attention layers (one in four) gate their queries, the third of QKV_PATCHES, and their Gated
# DeltaNet layers have no self_attn; their sparse MoE blocks have no gate_proj and their shared
# experts are not find_mlp_in_layer's (it reads layer.mlp and Llama 4's feedforward only); Seed-OSS's
# q/k/v carry biases, as Qwen2's, which the base layers add; Cohere2's layer runs attention and MLP
# side by side from one norm, both read as Llama's; Nemotron's squared-ReLU MLP has no gate_proj
# either, passed by as Apertus's. OLMo 3 and LFM2 norm q and k before the view, which
# patch_self_attn_lora cannot find).
# Ministral 3 (ministral3, the text model of a mistral3 checkpoint): get_attention_cls_from_config
# gives MistralAttention for mistral3, so patch_self_attn_lora rewrites that class's forward, not
# Ministral3Attention's (a class of its own): its layers get apply_qkv / apply_o, which its forward
# never calls; the qkv and o kernels change nothing there, the mlp kernel patches its MLP.
# Qwen3-VL's text model, whose Qwen3VLTextAttention get_attention_cls_from_config names for qwen3_vl,
# has Qwen3's q/k norms and a SwiGLU MLP.
# Arcee (AFM): Llama's attention (ArceeAttention's forward has Llama's q/k/v and o lines) and
# Nemotron's squared-ReLU MLP without gate_proj, passed by. Hunyuan dense V1: Llama's q/k/v lines, its
# query_layernorm / key_layernorm applied after the rotary embedding, below them; a SwiGLU MLP.
# Mistral Small 4 (mistral4, the text model of a mistral3 checkpoint): MistralAttention is rewritten as
# for Ministral 3, and the patch then takes no layer of it: Mistral4Attention is MLA (q_a_proj/q_b_proj,
# kv_a_proj_with_mqa, kv_b_proj; q_proj only without q_lora_rank, never k_proj or v_proj), which
# find_self_attn_in_layer passes by, and its layer.mlp is Mistral4MoE (no gate_proj; its shared_experts
# are not find_mlp_in_layer's) from layer first_k_dense_replace on (0 in Mistral-Small-4-119B-2603),
# Mistral4MLP below it (transformers 5.14.1, Axolotl's pin, as this one: modeling_mistral4.py
# Mistral4DecoderLayer). The job runs PEFT's layers (TAKES_NO_LAYER's note).
# GLM-4-0414 (glm4): Llama's q/k/v and o lines (Glm4Attention, its q/k/v biases the base layers'); its
# Glm4MLP fuses gate and up into one gate_up_proj, which find_mlp_in_layer passes by (no gate_proj): the
# MLP is PEFT's, and its silu never checked. gpt-oss (gpt_oss): Llama's q/k/v and o lines
# (GptOssAttention; its sinks are the attention function's, after both); its layer.mlp is GptOssMLP, a
# router and experts with no gate_proj, passed by (the experts' LoRA is PEFT's ParamWrapper).
# Gemma 4 (gemma4_text, the text model of a gemma4 checkpoint): get_attention_cls_from_config gives
# Gemma4TextAttention for gemma4, which patch_self_attn_lora leaves unrewritten (_NOT_REWRITTEN): Axolotl's
# fused Gemma 4 forward, swapped in on every run (workload/gemma4_fused_attn.py), calls apply_qkv /
# apply_o itself. Its KV-shared layers have no k_proj or v_proj (transformers: "Layers sharing kv states
# don't need any weight matrices"), passed by; attention_k_eq_v's global layers have v_proj None:
# apply_lora_qk (LoRA_QK), returning K as V. Gemma4TextMLP has gate/up/down_proj and a gelu (GeGLU);
# the 26B-A4B's routed experts sit beside it (layer.experts), not find_mlp_in_layer's. These three were
# read in the installed transformers (5.24), not in Axolotl's pin.
# Gemma 4 Unified (gemma4_unified_text, the text model of a gemma4_unified checkpoint) as Gemma 4:
# get_attention_cls_from_config gives Gemma4UnifiedTextAttention, which patch_self_attn_lora leaves
# unrewritten (_NOT_REWRITTEN; with fused_attn_kernel unset it only warns that the QKV/O kernels "cannot
# attach"), while apply_lora_kernel_patches still sets apply_qkv / apply_o on every attention it finds
# and the unified fused forward, swapped in on every GPU run (patch_manager.py: not gated on
# fused_attn_kernel), calls them (workload/gemma4_fused_attn.py); Gemma4UnifiedTextMLP has gate/up/down
# and a gelu. Read in transformers 5.24 and 5.14.1 (modeling_gemma4_unified.py) and Axolotl's HEAD.
# MiniMax-M2 (minimax_m2): every layer.mlp is MiniMaxM2SparseMoeBlock, the router with no gate_proj, so
# find_mlp_in_layer yields nothing (its routed experts are ScatterMoE's); its attention norms q and k
# over all heads before the view (modeling_minimax_m2.py MiniMaxM2Attention.forward), which
# patch_self_attn_lora cannot find: lora_qkv_kernel / lora_o_kernel fail by the source check above.
EMULATED = ("llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "gemma", "gemma2", "gemma3_text", "apertus",
            "seed_oss", "cohere2", "nemotron", "ministral3", "qwen3_vl_text", "qwen3_5_text",
            "qwen3_5_moe_text", "qwen3_next", "mistral4", "arcee", "hunyuan_v1_dense", "glm4", "gpt_oss",
            "gemma4_text", "gemma4_unified_text", "minimax_m2")
# The text model types whose layers Axolotl's patch leaves to PEFT (EMULATED's notes): what a check says.
TAKES_NO_LAYER = {
    "mistral4": "Axolotl's fused LoRA kernels take no layer of Mistral Small 4 (mistral4): its MLA attention "
                "has no k_proj/v_proj (find_self_attn_in_layer) and its MoE blocks (every layer from "
                "first_k_dense_replace on, 0 in the preset) no gate_proj (find_mlp_in_layer); those layers "
                "run PEFT's LoRA layers, as traced",
    "minimax_m2": "Axolotl's fused LoRA MLP kernel takes no layer of MiniMax-M2 (minimax_m2): every layer's "
                  "mlp is a sparse MoE block with no gate_proj (find_mlp_in_layer); those layers run PEFT's "
                  "LoRA layers, as traced",
}
# The text model types whose MLPs the mlp kernel passes by (find_mlp_in_layer: no gate_proj on layer.mlp;
# EMULATED's notes): what a check with the mlp kernel says.
MLP_PASSED_BY = {
    "glm4": "lora_mlp_kernel takes no MLP of GLM-4 (glm4): Glm4MLP fuses gate and up into gate_up_proj, and "
            "find_mlp_in_layer looks for gate_proj; its MLPs run PEFT's LoRA layers, as traced",
    "gpt_oss": "lora_mlp_kernel takes no MLP of gpt-oss (gpt_oss): its layer.mlp is a router and experts "
               "(GptOssMLP), no gate_proj for find_mlp_in_layer; the experts run as traced",
}
# Why a model's activations reach the kernels outside the autocast dtype (lora_kernel_functions.py
# MixedDtypes), with the real job's outcome: the refusal's second half.
# Apertus under QLoRA: transformers' Python xIELU (activations.py XIELUActivation._xielu_python, taken
# without the xielu wheel) multiplies by softplus(alpha_p) and softplus(alpha_n), float32 under CUDA
# autocast (autocast_mode.cpp KERNEL_CUDA(softplus, fp32)) and float32 parameters besides
# (prepare_model_for_kbit_training casts every 16-bit parameter to float32; Axolotl's
# loaders/model.py _convert_embedding_modules_dtype casts the norms and embeddings back, not the
# activation's): the MLP's output is float32. bitsandbytes'
# Linear4bit.forward returns its input's dtype (``.to(inp_dtype)``), so down_proj hands float32 to
# the residual stream and the next layer's q_proj gets it (ApertusRMSNorm returns
# ``weight * hidden_states.to(input_dtype)``). No autocast-disabled region is involved (that of the
# rotary embeddings gives cos and sin back in the hidden states' dtype): the real job fails there.
# With the XIELU CUDA wheel, which examples/apertus/README.md recommends (optional), Axolotl's
# patch_apertus_xielu_activation (monkeypatch/models/apertus/activation.py) passes alpha_p and
# alpha_n in the input's dtype to the CUDA kernel and the job runs: that kernel is not emulated.
# Nemotron is not here: NemotronLayerNorm1P (modeling_nemotron.py) casts its input, weight and bias
# to the autocast dtype (_cast_if_autocast_enabled) and runs layer_norm with autocast disabled
# (maybe_autocast(enabled=False)): bfloat16 out on CUDA, and so under the emulated autocast, which
# follows torch's autocast state (backends/estimate/emulation.py): the kernels run, as traced.
_MIXED_DTYPES = {
    "apertus": "Apertus's QLoRA: the float32 output of transformers' Python xIELU (softplus of alpha_p and "
               "alpha_n, float32 under CUDA autocast) reaches the residual stream through bitsandbytes' "
               "Linear4bit (it returns its input's dtype), and the next layer's q_proj gets it: the real "
               "job fails there; with the XIELU CUDA wheel (examples/apertus/README.md) Axolotl's "
               "patch_apertus_xielu_activation casts them and the job runs, which is not emulated; set "
               "lora_qkv_kernel: false and lora_o_kernel: false",
}
# The model type of the checkpoint whose text model a text config is, as AutoConfig reads it for
# get_attention_cls_from_config: transformers' Qwen3_5TextConfig and Qwen3_5MoeTextConfig are the
# ``text_config`` of the qwen3_5 and qwen3_5_moe checkpoints (configuration_qwen3_5.py sub_configs),
# whose text models autotune builds (presets/qwen_hybrid.py).
_CHECKPOINT = {"qwen3_5_text": "qwen3_5", "qwen3_5_moe_text": "qwen3_5_moe"}
# The model types whose Axolotl ModelSupport descriptor declares the fused LoRA kernels unsupported, with its
# reason (src/axolotl/model_support/paddleocr_vl/__init__.py PaddleOCRVLSupport.capabilities["lora_kernels"]):
# normalize_config (utils/config/__init__.py) turns every lora_*_kernel off for them, set or auto-enabled
# ("Disabling fused LoRA kernels: unsupported for model_type=..."), before the model loads.
AXOLOTL_UNSUPPORTED = {
    "paddleocr_vl": "The fused QKV/O source rewrite does not match PaddleOCRAttention's forward.",
}


def axolotl_turns_off(model_type: str | None) -> str | None:
    """The note where Axolotl turns its fused LoRA kernels off for ``model_type`` (AXOLOTL_UNSUPPORTED),
    else None."""
    reason = AXOLOTL_UNSUPPORTED.get(model_type or "")
    if reason is None:
        return None
    return (f"lora_*_kernel: Axolotl turns its fused LoRA kernels off for model_type {model_type} "
            f"(utils/config/__init__.py normalize_config: its model_support declares them Unsupported, "
            f"\"{reason}\")")
# find_linear_attn_in_layer's projections (LINEAR_ATTN_IN_PROJS, LINEAR_ATTN_OUT_PROJ)
_LINEAR_IN = ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a")
_LINEAR_OUT = "out_proj"
# get_attention_cls_from_config's special cases (transformers module, class), each of its ``if
# model_type ...`` in turn (monkeypatch/lora_kernels.py, Axolotl 067b021); others are
# ``transformers.models.<type>.modeling_<type>.<prefix>Attention``.
_ATTENTION = {"qwen2": ("qwen2", "Qwen2Attention"), "qwen3_vl": ("qwen3_vl", "Qwen3VLTextAttention"),
              "mllama": ("mllama", "MllamaTextSelfAttention"), "llama4": ("llama4", "Llama4TextAttention"),
              "mistral3": ("mistral", "MistralAttention"), "gemma3_text": ("gemma3", "Gemma3Attention"),
              "gemma4": ("gemma4", "Gemma4TextAttention"), "gemma4_text": ("gemma4", "Gemma4TextAttention"),
              "gemma4_unified": ("gemma4_unified", "Gemma4UnifiedTextAttention"),
              "gemma4_unified_text": ("gemma4_unified", "Gemma4UnifiedTextAttention")}
# The classes patch_self_attn_lora returns on before its source checks, their forward left as it is:
# Gemma4TextAttention ("patch_manager applies patch_gemma4_fused_attn unconditionally for gemma4 ...
# that fused forward already calls apply_qkv/apply_o") and Gemma4UnifiedTextAttention ("can't be
# source-rewritten (KV sharing); skip").
_NOT_REWRITTEN = {("gemma4", "Gemma4TextAttention"), ("gemma4_unified", "Gemma4UnifiedTextAttention")}
# monkeypatch/lora_kernels.py QKV_PATCHES' originals and ORIGINAL_O_CODE, as patch_self_attn_lora
# looks for them in the detabbed source (the method's body indented by four spaces).
_QKV_CODE = (
    "    query_states = self.q_proj(hidden_states).view(hidden_shape).transpose(1, 2)\n"
    "    key_states = self.k_proj(hidden_states).view(hidden_shape).transpose(1, 2)\n"
    "    value_states = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)\n",
    "    query_states = self.q_norm(self.q_proj(hidden_states).view(hidden_shape)).transpose(1, 2)\n"
    "    key_states = self.k_norm(self.k_proj(hidden_states).view(hidden_shape)).transpose(1, 2)\n"
    "    value_states = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)\n",
    "    query_states, gate = torch.chunk(\n"
    "        self.q_proj(hidden_states).view(*input_shape, -1, self.head_dim * 2), 2, dim=-1\n"
    "    )\n"
    "    gate = gate.reshape(*input_shape, -1)\n\n"
    "    query_states = self.q_norm(query_states.view(hidden_shape)).transpose(1, 2)\n"
    "    key_states = self.k_norm(self.k_proj(hidden_states).view(hidden_shape)).transpose(1, 2)\n"
    "    value_states = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)\n",
)
_O_CODE = "    attn_output = self.o_proj(attn_output)\n"


def parse_kernels(value: str | Sequence[str] | None) -> tuple[str, ...]:
    """The kernels named (comma-separated text or names), in KERNELS' order; InvalidInput naming the
    allowed ones, and refusing the embedding kernel alone (it patches nothing without another)."""
    if value is None:
        return ()
    names = value.split(",") if isinstance(value, str) else list(value)
    asked = {str(name).strip().lower() for name in names} - {""}
    unknown = sorted(asked - set(KERNELS))
    if unknown:
        raise InvalidInput(f"unknown Axolotl LoRA kernel {unknown[0]!r}: allowed are {', '.join(KERNELS)}")
    if asked and not asked & set(PATCHING):
        raise InvalidInput("Axolotl's embedding LoRA kernel is patched only with the mlp, qkv or o kernel "
                           "(loaders/patch_manager.py _apply_lora_kernel_patch)")
    return tuple(name for name in KERNELS if name in asked)


def no_layer_notes(model: str | None, kernels: Sequence[str]) -> tuple[str, ...]:
    """TAKES_NO_LAYER's note where ``model`` is a preset whose text model type is one and the kernels
    patch; MLP_PASSED_BY's where it is one of those and the mlp kernel is on."""
    from autotune.workload.presets import PRESETS, preset_name

    name = preset_name(model or "")
    if name is None or not set(kernels) & set(PATCHING):
        return ()
    preset = PRESETS[name]
    text_type = str((preset.get("text_config") or {}).get("model_type") or preset.get("model_type"))
    note = TAKES_NO_LAYER.get(text_type) or ("mlp" in kernels and MLP_PASSED_BY.get(text_type))
    return (note,) if note else ()


def describe(kernels: Sequence[str]) -> str:
    """What an output says of them: "Axolotl's fused LoRA kernels (emulated): mlp, qkv, o"."""
    return f"{NAME}: {', '.join(kernels)}"


# --- what Axolotl's patch takes ------------------------------------------------------------------


def attention_class(model_type: str) -> Any:
    """get_attention_cls_from_config's attention class of ``model_type``; None where it has none
    (Axolotl raises "could not import attention class")."""
    import importlib

    module = _ATTENTION.get(model_type, (model_type, ""))[0]
    name = _attention_name(model_type)
    try:
        found = getattr(importlib.import_module(f"transformers.models.{module}.modeling_{module}"), name)
    except (ImportError, AttributeError):
        return None
    return found if isinstance(found, type) else None  # a class, or None


def _attention_name(model_type: str) -> str:
    """``<prefix>Attention``, the class get_attention_cls_from_config imports from
    ``transformers.models.<type>.modeling_<type>`` where it has no special case."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    if model_type in _ATTENTION:
        return _ATTENTION[model_type][1]
    prefix = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(
        model_type, "".join(part.capitalize() for part in model_type.split("_")))
    for suffix in ("ForCausalLM", "ForConditionalGeneration", "LMHeadModel", "GenerationDecoder"):
        prefix = prefix.replace(suffix, "")  # utils/callbacks/models.py get_causal_lm_model_cls_prefix
    return f"{prefix}Attention"


def _detabbed_source(function: Any) -> str:
    """inspect.getsource with the first line's indentation removed from every line (utils.py
    detab_code)."""
    source = inspect.getsource(function)
    indent = re.match(r"[\s\t]+", source)
    return re.sub(r"^" + indent.group(0), "", source, flags=re.MULTILINE) if indent else source


def check_model(config: Any, kernels: Sequence[str], checkpoint_type: str | None = None) -> None:
    """JobFails where Axolotl's patch of ``config``'s model type fails, UnmodelledSetting where it
    is not emulated.
    ``checkpoint_type``: the model type of the checkpoint's config where ``config`` is its text
    config (a vision-language model's), which get_attention_cls_from_config reads (AutoConfig of
    base_model)."""
    model_type = config.model_type
    if set(kernels) & {"qkv", "o"}:
        cls = attention_class(checkpoint_type or model_type)
        if cls is None:
            raise JobFails(f"Axolotl's lora_qkv_kernel / lora_o_kernel fail on model type "
                           f"{checkpoint_type or model_type}: "
                           "get_attention_cls_from_config raises \"Axolotl could not import attention "
                           f"class for model_type: {checkpoint_type or model_type}\" (monkeypatch/"
                           f"lora_kernels.py: no {_attention_name(checkpoint_type or model_type)} in "
                           "transformers) as patch_manager.py _apply_self_attention_lora_patch runs, "
                           "before the model loads; check_auto_enable_lora_kernels turns them on "
                           "where no lora_*_kernel is set, vision-language models too; set them to "
                           "false")
        if (cls.__module__.split(".")[-2], cls.__name__) not in _NOT_REWRITTEN:
            _check_source(cls)
    if model_type not in EMULATED:
        raise UnmodelledSetting(f"{NAME} are emulated on {', '.join(EMULATED)}, not on model type "
                                f"{model_type}")


def _check_source(cls: Any) -> None:
    """patch_self_attn_lora's assertions on ``cls.forward``'s detabbed source: JobFails naming the
    line it does not find."""
    source = _detabbed_source(cls.forward)
    missing = [what for what, found in (("QKV", any(code in source for code in _QKV_CODE)),
                                        ("O", _O_CODE in source)) if not found]
    if missing:
        raise JobFails(f"Axolotl's lora_qkv_kernel / lora_o_kernel fail on {cls.__name__}: "
                       f"patch_self_attn_lora asserts \"Original {missing[0]} code not found\" in "
                       f"its forward{_deciding_line(source, missing[0])}: the job fails before the "
                       "model loads (patch_manager.py _apply_self_attention_lora_patch calls it, "
                       "uncaught); set lora_qkv_kernel: false and lora_o_kernel: false")


def _deciding_line(source: str, missing: str) -> str:
    """The forward's line patch_self_attn_lora does not find in QKV_PATCHES' originals (``missing``
    "QKV": the first q/k/v projection line none of them holds) or in place of ORIGINAL_O_CODE ("O":
    the line projecting attn_output), quoted: ", whose line `...`"; "" where none is found."""
    lines = source.splitlines()
    if missing == "QKV":
        found = [line for line in lines if re.search(r"self\.[qkv]_proj\(", line)
                 and not any(f"{line}\n" in code for code in _QKV_CODE)]
    else:
        found = [line for line in lines if re.search(r"attn_output = self\.\w+\(attn_output\)", line)]
    return f", whose line `{found[0].strip()}` is not Axolotl's" if found else ""


def check_checkpoint(config: Any, kernels: Sequence[str]) -> None:
    """check_model of a checkpoint's ``config`` (a vision-language model's text config, read with its
    model type), where the kernels patch: what Axolotl checks as it loads the model, before any
    batch is made (loaders/patch_manager.py ``_apply_lora_kernel_patch``)."""
    if set(kernels) & set(PATCHING):
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        check_model(text, kernels, _CHECKPOINT.get(config.model_type, config.model_type))


def check_sharding(parallel_kind: str | None, kernels: Sequence[str]) -> None:
    """Axolotl's kernels under DeepSpeed ZeRO-3: each patched forward (the attention's, the MLP's)
    reads its projections' weights itself, without calling those modules (monkeypatch/lora_kernels.py
    apply_lora_qkv / apply_lora_o / apply_lora_mlp_*), while ZeRO-3 gathers a module's own parameters
    only as that module is called (deepspeed runtime/zero/partitioned_param_coordinator.py
    fetch_sub_module: ``iter_params(current_submodule, recurse=is_leaf)``) and Axolotl marks only
    mixture-of-experts blocks as leaves (loaders/model.py _set_z3_leaf_modules). The kernels would
    read the projections' partitions, not their gathered weights: refused (not run on a GPU)."""
    if parallel_kind == "zero3" and kernels:
        raise UnmodelledSetting(
            f"Axolotl's fused LoRA kernels ({', '.join(kernels)}) under DeepSpeed ZeRO-3 are not modelled: "
            "the patched attention and MLP forwards read q/k/v/o and gate/up/down's weights without "
            "calling those modules, and ZeRO-3 gathers a module's parameters only as it is called "
            "(partitioned_param_coordinator.py fetch_sub_module, recurse only for leaf modules; Axolotl "
            "makes leaves of MoE blocks alone): set lora_mlp_kernel, lora_qkv_kernel and lora_o_kernel "
            "to false")


def glu_of(config: Any) -> str:
    """The MLP kernel's activation: apply_lora_kernel_patches reads hidden_act, else
    hidden_activation, else mlp_hidden_act; a gelu is GeGLU, silu SwiGLU, another raises."""
    activation = None
    for name in ("hidden_act", "hidden_activation", "mlp_hidden_act"):
        if hasattr(config, name):
            activation = getattr(config, name)
            break
    if activation and "gelu" in activation:
        return "geglu"
    if activation == "silu":
        return "swiglu"
    raise JobFails(f"Axolotl's lora_mlp_kernel refuses activation {activation!r} "
                   "(apply_lora_kernel_patches supports silu and gelu): set lora_mlp_kernel: false")


# --- the patch ------------------------------------------------------------------------------------


# apply_kernels' models: the kernels and hooks each was patched with, and the modules it gave a
# forward of their own (closures over the model's modules), for a copy of it to be patched alike
_PATCHED: weakref.WeakKeyDictionary[nn.Module, tuple[tuple[str, ...], KernelHooks, tuple[str, ...]]] = \
    weakref.WeakKeyDictionary()


def apply_kernels(model: nn.Module, kernels: Sequence[str], hooks: KernelHooks) -> None:
    """Axolotl's ``apply_lora_kernel_patches`` on the PEFT-wrapped ``model`` (module docstring), the
    Functions computing with the backend's ``hooks``."""
    if not set(kernels) & set(PATCHING):
        return
    before = {name for name, module in model.named_modules() if "forward" in vars(module)}
    _apply_kernels(model, kernels, hooks)
    patched = tuple(name for name, module in model.named_modules()
                    if "forward" in vars(module) and name not in before)
    _PATCHED[model] = (tuple(kernels), hooks, patched)


def repatch(original: nn.Module, copy: nn.Module) -> None:
    """``copy`` (``copy.deepcopy(original)``: DeepSpeed's engine gets a copy of the built model,
    backends/deepspeed.py fresh_model) patched as ``original`` was: the forwards apply_kernels
    installed are closures over the original's modules, which a deep copy keeps as they are (their
    LoRA parameters, their pending K and V), so they are dropped from the copy and installed anew."""
    found = _PATCHED.get(original)
    if found is None:
        return
    kernels, hooks, patched = found
    modules = dict(copy.named_modules())
    for name in patched:
        modules[name].__dict__.pop("forward", None)
    apply_kernels(copy, kernels, hooks)


def _apply_kernels(model: nn.Module, kernels: Sequence[str], hooks: KernelHooks) -> None:
    from peft import PeftModelForCausalLM

    if not isinstance(model, PeftModelForCausalLM):
        raise InvalidInput(f"{NAME} patch causal language models only (apply_lora_kernel_patches takes a "
                           f"PeftModelForCausalLM), not a {type(model).__name__}")
    config: Any = model.config
    checkpoint_type = _CHECKPOINT.get(config.model_type, config.model_type)
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    check_model(config, kernels, checkpoint_type)
    layers = _layers(model)
    _check_linear_attention(layers, kernels)
    rewritten = attention_class(checkpoint_type) if set(kernels) & {"qkv", "o"} else None
    explain = _MIXED_DTYPES.get(config.model_type)
    for layer in layers:
        attn = getattr(layer, "self_attn", None)
        # Only the class patch_self_attn_lora rewrote calls apply_qkv / apply_o (EMULATED's note).
        called = rewritten is None or isinstance(attn, rewritten)
        if attn is not None and called and all(
                hasattr(attn, p) for p in ("q_proj", "k_proj", "v_proj", "o_proj")):
            if "qkv" in kernels:
                _QKV(attn, hooks, explain).install()
            if "o" in kernels and hasattr(attn.o_proj, "lora_A"):
                attn.o_proj.forward = _explained(_o_forward(attn, hooks), explain)
        mlp = getattr(layer, "mlp", None)
        if "mlp" in kernels and mlp is not None and all(
                hasattr(mlp, p) for p in ("gate_proj", "up_proj", "down_proj")):
            glu = glu_of(config)  # raised only where a MLP is found, as Axolotl raises it
            if all(hasattr(getattr(mlp, p), "lora_A") for p in ("gate_proj", "up_proj", "down_proj")):
                mlp.forward = _explained(_mlp_forward(mlp, glu, hooks), explain)
    if "embedding" in kernels:
        _patch_embedding(model, hooks)


def _check_linear_attention(layers: Any, kernels: Sequence[str]) -> None:
    """InvalidInput where Axolotl's patch would route a Gated DeltaNet layer's LoRA projections
    through its fused kernels (module docstring), which are not emulated."""
    for layer in layers:
        linear = getattr(layer, "linear_attn", None)
        if linear is None or not all(hasattr(linear, p) for p in (*_LINEAR_IN, _LINEAR_OUT)):
            continue
        fused = [p for p in _LINEAR_IN if "qkv" in kernels and hasattr(getattr(linear, p), "lora_A")]
        fused += [_LINEAR_OUT] if "o" in kernels and hasattr(linear.out_proj, "lora_A") else []
        if fused:
            raise UnmodelledSetting(
                f"Axolotl's fused LoRA kernels of the linear-attention projections ({', '.join(fused)}: "
                "LoRA_FusedProj and LoRA_O, called by its sample-packing patch of Qwen 3.5's "
                "GatedDeltaNet forward) are not emulated: set lora_qkv_kernel: false and "
                "lora_o_kernel: false, or leave linear_attn's projections out of lora_target_modules")


def _layers(model: Any) -> Any:
    """get_layers: the decoder layers of a PEFT causal LM (multimodal ones' language model's)."""
    pretrained = model.model  # the transformers model PEFT wraps
    if hasattr(pretrained, "language_model"):
        return pretrained.language_model.layers
    if hasattr(pretrained.model, "language_model"):
        return pretrained.model.language_model.layers
    return pretrained.model.layers


def _explained(forward: Callable[..., Any], explain: str | None) -> Callable[..., Any]:
    """``forward``, its MixedDtypes refusal followed by _MIXED_DTYPES' reason for the model type."""
    if explain is None:
        return forward
    from autotune.workload.lora_kernel_functions import MixedDtypes

    def explained(*args: Any, **kwargs: Any) -> Any:
        try:
            return forward(*args, **kwargs)
        except MixedDtypes as exc:
            raise JobFails(f"{exc}: {explain}") from exc

    return explained


class _Lora:
    """get_lora_parameters(proj): the base layer, A [r, in], B [out, r], scaling, dropout."""

    def __init__(self, proj: Any) -> None:
        from torch.distributed.tensor import DTensor

        active = proj.active_adapters[0]
        self.base = proj.base_layer
        lora_A, lora_B = proj.lora_A[active], proj.lora_B[active]
        if isinstance(lora_A.weight, DTensor):
            # Axolotl's FSDP2 shards each adapter on its own (backends/distributed.py shard_as_axolotl),
            # and the kernels bypass its forward: get_lora_parameters gathers them by hand
            # (``linear_A.unshard()``), "we don't apply resharding later"
            lora_A.unshard()
            lora_B.unshard()
        self.A = lora_A.weight
        self.B = lora_B.weight
        self.s = proj.scaling[active]
        self.dropout = proj.lora_dropout[active] if active in proj.lora_dropout else None


def _apply_dropout(dropout: Any, X: torch.Tensor, training: bool) -> torch.Tensor | None:
    """lora.py _apply_dropout: X_drop, or None where there is no (active) dropout."""
    from torch import nn

    if dropout is None or isinstance(dropout, nn.Identity) or not training:
        return None
    out: torch.Tensor = dropout(X)
    return out


def _mlp_forward(mlp: Any, glu: str, hooks: KernelHooks) -> Callable[..., Any]:
    """apply_lora_mlp_swiglu / apply_lora_mlp_geglu: ``LoRA_MLP.apply``, dropout drawn once from
    gate_proj's module for gate and up."""
    from autotune.workload.lora_kernel_functions import LoRA_MLP

    def forward(X: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        gate, up, down = _Lora(mlp.gate_proj), _Lora(mlp.up_proj), _Lora(mlp.down_proj)
        X_drop = _apply_dropout(gate.dropout, X, mlp.training)
        bases, scales = (gate.base, up.base, down.base), (gate.s, up.s, down.s)
        out: torch.Tensor = LoRA_MLP.apply(X, X_drop, gate.A, gate.B, up.A, up.B, down.A, down.B, bases,
                                           scales, glu, hooks)
        return out

    return forward


def _o_forward(attn: Any, hooks: KernelHooks) -> Callable[..., Any]:
    """apply_lora_o as o_proj's call: ``LoRA_O.apply``, o_proj's dropout on the LoRA path."""
    from autotune.workload.lora_kernel_functions import LoRA_O

    def forward(X: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        o = _Lora(attn.o_proj)
        X_drop = _apply_dropout(o.dropout, X, attn.training)
        out: torch.Tensor = LoRA_O.apply(X, X_drop, o.A, o.B, o.base, o.s, hooks)
        return out

    return forward


class _QKV:
    """``self.apply_qkv(hidden_states)`` of the rewritten attention, as its projections' calls: the
    first (q_proj's) computes Q, K and V, k_proj's and v_proj's take K and V. Fused (apply_lora_qkv)
    where q, k and v all carry LoRA, else original_apply_qkv's three projections in turn. Where v_proj
    is None (Gemma 4's attention_k_eq_v), of q and k alone: apply_lora_qk (``LoRA_QK``) where both carry
    LoRA, else original_apply_qkv_optional_v; the attention's forward takes K for V itself."""

    def __init__(self, attn: Any, hooks: KernelHooks, explain: str | None = None) -> None:
        self.attn, self.hooks, self.explain = attn, hooks, explain
        self.projs = tuple(proj for proj in (attn.q_proj, attn.k_proj, attn.v_proj) if proj is not None)
        self.fused = all(hasattr(proj, "lora_A") for proj in self.projs)
        self.own_q = attn.q_proj.forward  # q_proj's own forward, before install()
        self.pending: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def install(self) -> None:
        self.projs[0].forward = _explained(self.q, self.explain)
        for name, proj in zip("kv", self.projs[1:], strict=False):
            proj.forward = lambda hidden, *args, name=name, **kwargs: self.take(name, hidden)

    def q(self, hidden: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if self.fused:
            from autotune.workload.lora_kernel_functions import LoRA_QK, LoRA_QKV

            loras = [_Lora(proj) for proj in self.projs]
            X_drop = _apply_dropout(loras[0].dropout, hidden, self.attn.training)
            weights = [tensor for lora in loras for tensor in (lora.A, lora.B)]
            bases, scales = tuple(lora.base for lora in loras), tuple(lora.s for lora in loras)
            function = LoRA_QKV if len(loras) == 3 else LoRA_QK
            Q, *KV = function.apply(hidden, X_drop, *weights, bases, scales, self.hooks)
        else:  # q_proj's own forward (its call is this one), then k_proj's and v_proj's calls
            Q, KV = self.own_q(hidden), [_called(proj, hidden) for proj in self.projs[1:]]
        self.pending = {name: (hidden, out) for name, out in zip("kv", KV, strict=False)}
        return Q  # type: ignore[no-any-return]

    def take(self, name: str, hidden: torch.Tensor) -> torch.Tensor:
        found = self.pending.pop(name, None)
        if found is None or found[0] is not hidden:
            raise RuntimeError(f"{name}_proj called other than after q_proj on the same input: not the "
                               "attention forward Axolotl's patch_self_attn_lora rewrites")
        return found[1]


def _called(proj: Any, hidden: torch.Tensor) -> torch.Tensor:
    """``proj(hidden)`` through its module call (its hooks) with its own forward, not the one
    ``_QKV.install`` gave it."""
    installed = vars(proj).pop("forward")
    try:
        out: torch.Tensor = proj(hidden)
        return out
    finally:
        proj.forward = installed


def _patch_embedding(model: Any, hooks: KernelHooks) -> None:
    """_patch_embedding_layers: ``model.embed_tokens`` (or the language model's) with LoRA gets
    apply_lora_embedding's forward: ``LoRA_Embedding.apply``, cast to the base weight's dtype."""
    from autotune.workload.lora_kernel_functions import LoRA_Embedding

    for path in (("model", "embed_tokens"), ("model", "language_model", "embed_tokens")):
        embed = model.model
        for name in path:
            embed = getattr(embed, name, None)
        if embed is None or not hasattr(embed, "lora_embedding_A"):
            continue

        def forward(x: torch.Tensor, *args: Any, embed: Any = embed, **kwargs: Any) -> torch.Tensor:
            active = embed.active_adapters[0]
            W = embed.base_layer.weight
            out: torch.Tensor = LoRA_Embedding.apply(x, W, embed.lora_embedding_A[active],
                                                     embed.lora_embedding_B[active], embed.scaling[active],
                                                     embed.base_layer, hooks)
            return out.to(W.dtype)

        embed.forward = forward
