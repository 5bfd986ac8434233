"""A base saved quantized with GPTQ or AWQ: what transformers loads it as, and the kernel that trains it.

A checkpoint saved quantized carries its ``quantization_config``; transformers 5.24 builds its linear
layers from it as gptqmodel's QuantLinear classes (quantizers/quantizer_gptq.py through optimum's
``GPTQQuantizer.convert_model``; quantizers/quantizer_awq.py ``replace_with_awq_linear``), each
picked by gptqmodel's ``hf_select_quant_linear_v2`` (utils/importer.py). The layers are frozen
buffers; PEFT wraps them with ``GPTQLoraLinear`` / ``AwqLoraLinear`` (peft/tuners/lora/gptq.py,
awq.py: the base's output plus the adapters') or OFT's ``Linear`` (its rotated input into the base).

The kernel (gptqmodel 7.3.4, ModelCloud/GPTQModel at f4c327a): with the ``backend`` a checkpoint's
config leaves unset, transformers asks for ``auto`` (GPTQConfig.post_init), and on a CUDA GPU
``select_quant_linear`` returns the highest-priority kernel that validates: Swordfish, Machete,
Marlin, ExllamaV2 for GPTQ (SUPPORTS_FORMATS 101, 100, 90, 80), the AWQ ones for GEMM. None of them
trains (``SUPPORTS_TRAINING = False``): ``BaseQuantLinear.train()`` raises NotImplementedError when
the trainer turns training on. The kernels gptqmodel picks for training (``backend:
auto_trainable``) are the ones modelled here, named in the output:

    gptq  TritonV2Linear (priority 40, the first trainable one on CUDA), whose training forward is
          TorchLinear's (nn_modules/qlinear/torch.py ``_forward_eager``): the whole weight
          dequantized in torch (``dequantize_weight``), then ``torch.matmul(x, weights)``: autograd
          saves the dequantized weight for the input's gradient
    awq   AwqGEMMLinear (priority 60; nn_modules/qlinear/gemm_awq.py ``AwqGemmFn``): saves the
          input; above 1024 rows a whole dequantized weight then ``torch.matmul``; its backward
          dequantizes again and multiplies by ``batch`` copies of the weight (``repeat``)

backends/estimate/gptq.py emulates both on fake tensors (the dequantize kernel's output for AWQ,
gptqmodel's own torch ops for GPTQ). AQLM is refused (``REFUSED``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from autotune.errors import InvalidInput

METHODS = ("gptq", "awq")
# gptqmodel's trainable kernels on CUDA (module docstring) and what their training step does.
KERNELS = {
    "gptq": "gptqmodel TritonV2Linear, trained through TorchLinear's torch dequantize then matmul",
    "awq": "gptqmodel AwqGEMMLinear (AwqGemmFn: dequantize kernel then matmul)",
}
PACK_BITS = 32  # the int32 pack_dtype both formats pack into (hf_select_quant_linear_v2's default)
# TorchLinear's bit widths with the shift-buffer unpack dequantize_weight emulates (3 bits unpacks
# across words, planar 5-7 bits another way: not emulated).
GPTQ_BITS = (2, 4, 8)
AWQ_BITS = (4,)  # AwqGEMMLinear.SUPPORTS_BITS
AWQ_FORMATS = ("gemm",)  # AWQ's "version": GEMV / GEMV_FAST pick other kernels, not modelled


@dataclass(frozen=True)
class SavedQuant:
    """A checkpoint's quantization_config, the fields that change memory."""

    method: str  # gptq or awq
    bits: int
    group_size: int  # -1: one group per column (the whole input)
    desc_act: bool = False  # GPTQ's act-order: g_idx permuted, same bytes
    sym: bool = True  # GPTQ's symmetric quantization (qzeros stored either way)
    zero_point: bool = True  # AWQ's asymmetric quantization (qzeros stored either way)
    version: str = "gemm"  # AWQ's format
    source: str = field(default="", compare=False)  # where the values come from

    def label(self) -> str:
        """``GPTQ 4-bit, group 128, act-order`` (+ the kernel)."""
        group = "per column" if self.group_size == -1 else f"group {self.group_size}"
        extra = ", act-order" if self.method == "gptq" and self.desc_act else ""
        if self.method == "awq":
            extra = f", {self.version.upper()}" + (", zero point" if self.zero_point else "")
        return f"{self.method.upper()} {self.bits}-bit, {group}{extra}; {KERNELS[self.method]}, emulated"

    def to_json(self) -> dict[str, Any]:
        return {"method": self.method, "bits": self.bits, "group_size": self.group_size,
                "desc_act": self.desc_act, "sym": self.sym, "zero_point": self.zero_point,
                "version": self.version}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SavedQuant:
        return check_saved_quant(cls(str(data["method"]), int(data["bits"]), int(data["group_size"]),
                                     bool(data.get("desc_act", False)), bool(data.get("sym", True)),
                                     bool(data.get("zero_point", True)), str(data.get("version", "gemm"))))


def check_saved_quant(quant: SavedQuant) -> SavedQuant:
    """``quant`` if its kernel is modelled; InvalidInput naming what is not."""
    if quant.method not in METHODS:
        raise InvalidInput(f"a saved quantization must be one of {', '.join(METHODS)}, got {quant.method!r}")
    allowed = GPTQ_BITS if quant.method == "gptq" else AWQ_BITS
    if quant.bits not in allowed:
        raise InvalidInput(f"{quant.method.upper()} {quant.bits}-bit is not modelled: "
                           f"{', '.join(map(str, allowed))} bits are")
    if quant.group_size != -1 and quant.group_size <= 0:
        raise InvalidInput(f"group_size must be positive or -1, got {quant.group_size}")
    if quant.method == "awq" and quant.version not in AWQ_FORMATS:
        raise InvalidInput(f"AWQ version {quant.version!r} is not modelled (gptqmodel picks another kernel "
                           f"for it): {', '.join(AWQ_FORMATS)} is")
    return quant


def groups(in_features: int, group_size: int) -> int:
    """Quantization groups along the input: ``ceil(in / group_size)``, one for group_size -1."""
    return 1 if group_size == -1 else math.ceil(in_features / group_size)


def storage_bytes(quant: SavedQuant, in_features: int, out_features: int, *,
                  bias: bool = False) -> dict[str, int]:
    """The bytes of one layer's buffers, by name, as gptqmodel registers them:
    GPTQ (nn_modules/qlinear/__init__.py ``_register_gptq_buffers``): qweight int32
    ``[ceil(in * bits / 32), out]``, qzeros int32 ``[groups, ceil(out * bits / 32)]``, scales
    float16 ``[groups, out]``, g_idx int32 ``[in]``; AWQ (``AWQuantLinear.__init__``): qweight int32
    ``[in, out / (32 / bits)]``, qzeros int32 ``[in / group, out / (32 / bits)]``, scales float16
    ``[in / group, out]``; a float16 bias ``[out]`` for either."""
    g = groups(in_features, quant.group_size)
    if quant.method == "gptq":
        parts = {"qweight": math.ceil(in_features * quant.bits / PACK_BITS) * out_features * 4,
                 "qzeros": g * math.ceil(out_features * quant.bits / PACK_BITS) * 4,
                 "scales": g * out_features * 2, "g_idx": in_features * 4}
    else:
        packed = out_features // (PACK_BITS // quant.bits)
        parts = {"qweight": in_features * packed * 4, "qzeros": g * packed * 4,
                 "scales": g * out_features * 2}
    if bias:
        parts["bias"] = out_features * 2
    return parts


# The checkpoints whose quantization_config autotune has read, by model id (lower case).
CHECKPOINTS: dict[str, SavedQuant] = {
    "techxgenus/meta-llama-3-8b-instruct-gptq": SavedQuant(
        "gptq", bits=4, group_size=128, desc_act=True, sym=True,
        # huggingface.co/TechxGenus/Meta-Llama-3-8B-Instruct-GPTQ/blob/main/quantize_config.json
        # (commit 94acc5c): bits 4, group_size 128, desc_act true, sym true, quant_method gptq
        # (AutoGPTQ's: lm_head left in 16 bits; model.safetensors 5.74 GB)
        source="the checkpoint's quantize_config.json (huggingface.co/TechxGenus/"
               "Meta-Llama-3-8B-Instruct-GPTQ, commit 94acc5c)"),
    "techxgenus/meta-llama-3-8b-instruct-awq": SavedQuant(
        "awq", bits=4, group_size=128, zero_point=True, version="gemm",
        # No public copy of its config.json was found. bits 4: the hub's "4-bit precision" and "awq"
        # tags; group 128, zero point, GEMM: AutoAWQ's defaults (q_group_size 128, zero_point true,
        # version GEMM), the only group size for which its shards' sizes on the hub's file tree add
        # up: 4.68 GB = the 16-bit embeddings (1.05 GB) + 6.98e9 packed weights at 4 bits (3.49 GB)
        # + their float16 scales and int32 zeros per 128 (0.14 GB), the second 1.05 GB the lm_head.
        source="derived: the hub's tags (4-bit, awq), AutoAWQ's defaults, checked against the "
               "checkpoint's shard sizes (huggingface.co/TechxGenus/Meta-Llama-3-8B-Instruct-AWQ/tree/main): "
               "no public copy of its config.json was found"),
}

# Checkpoints saved quantized that are refused, and why.
REFUSED: dict[str, str] = {
    "aqlm": "AQLM's additive codebooks (ISTA-DASLab's 1x16: one 16-bit codebook per group of 8 weights) "
            "run in aqlm's own CUDA kernels (aqlm/inference_kernels), whose allocations in training are "
            "not emulated",
}


# Presets whose checkpoint is published saved in a format not modelled here, by preset name: the preset
# holds the model's shapes in bfloat16; its hub checkpoint loads quantized.
# MiniMax-M2: "The checkpoint is pre-quantized (quant_method: fp8) ... train LoRA on the frozen FP8 base
# instead (ScatterMoE dequantizes the FP8 experts on the fly)" (Axolotl examples/minimax/m2-qlora.yaml);
# its quantization_config (https://huggingface.co/MiniMaxAI/MiniMax-M2.5/blob/main/config.json) as public
# copies give it (a Rust loader's MiniMaxM2Config check, which refuses any other value: quant_method
# fp8, fmt float8_e4m3fn, activation_scheme dynamic, weight_block_size [128, 128], modules_to_not_convert
# gate, e_score_correction_bias, lm_head; the Ascend msmodelslim guide (presets/minimax.py): "the
# official release is an FP8 mixed-precision model", which it converts to bfloat16 first).
PUBLISHED_QUANTIZED: dict[str, str] = {
    "MiniMaxAI/MiniMax-M2": "fp8 (float8_e4m3fn weights in 128 x 128 blocks with their scales; the router, "
                            "its bias and lm_head in bfloat16), loaded through transformers' "
                            "FineGrainedFP8 quantizer",
}


def check_published(spec: Any) -> None:
    """UnmodelledSetting for a preset whose hub checkpoint is saved quantized in a format not modelled
    (PUBLISHED_QUANTIZED): its weights are not the preset's bfloat16 ones."""
    from autotune.errors import UnmodelledSetting
    from autotune.workload.presets import preset_name

    name = preset_name(spec.name) if spec.source == "preset" else None
    if name in PUBLISHED_QUANTIZED:
        raise UnmodelledSetting(f"{spec.name} is published saved in {PUBLISHED_QUANTIZED[name]}: a base "
                                "saved in FP8 is not modelled (workload/prequantized.py models GPTQ and AWQ "
                                "bases); the preset holds its shapes in bfloat16, which a local config.json "
                                "of a bfloat16 copy (no quantization_config) is answered for")


def saved_checkpoint(model: str) -> SavedQuant | None:
    """The SavedQuant of a checkpoint autotune knows, None for any other."""
    return CHECKPOINTS.get(model.strip().lower())
