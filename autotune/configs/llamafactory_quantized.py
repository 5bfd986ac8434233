"""LLaMA-Factory over a checkpoint saved quantized (GPTQ, AWQ; AQLM refused): model_utils/quantization.py
``configure_quantization``'s "PTQ-quantized" branch, which loads the model as its config's
quantization_config says (transformers' GptqHfQuantizer / AwqQuantizer: workload/prequantized.py)."""

from __future__ import annotations

import re

from autotune.configs.reading import QUANT, Config, unset
from autotune.errors import InvalidInput
from autotune.workload.parallel import DDP
from autotune.workload.prequantized import CHECKPOINTS, KERNELS, REFUSED, SavedQuant, saved_checkpoint

# A checkpoint saved quantized, as its name says.
SAVED_QUANTIZED = re.compile(r"(?<![a-z0-9])(gptq|awq|aqlm|exl2|bnb-4bit|bnb-8bit)(?![a-z])")


def read_lf_saved_quant(cfg: Config, model: str | None, *, full: bool) -> SavedQuant | None:
    """The saved quantization of ``model`` (None for a checkpoint its name does not say is one), with
    LLaMA-Factory's own refusals; a name autotune has no quantization_config for is refused."""
    found = SAVED_QUANTIZED.search(model.lower()) if model else None
    if model is None or found is None:
        return None
    method = found.group(1)
    why = (f"a checkpoint saved quantized ({method}, as its name says), which LLaMA-Factory loads as its "
           "quantization_config says (model_utils/quantization.py configure_quantization)")
    if method in REFUSED:
        raise cfg.unmodelled("model_name_or_path", model, f"{why}: {REFUSED[method]}")
    quant = saved_checkpoint(model)
    if quant is None:
        known = ", ".join(sorted(CHECKPOINTS))
        detail = f"autotune has read the quantization_config of {known} only" if method in KERNELS else QUANT
        raise cfg.unmodelled("model_name_or_path", model, f"{why}: {detail}")
    if full:  # model/adapter.py init_adapter
        raise InvalidInput(f"finetuning_type: full over {model} in {cfg.file!r}: LLaMA-Factory trains a "
                           "quantized model with LoRA or OFT only (\"Quantized models can only be used for "
                           "the LoRA or OFT tuning\", model/adapter.py init_adapter)")
    sharded = [(key, cfg.data[key]) for key in ("deepspeed", "fsdp") if not unset(cfg.data.get(key))]
    if cfg.launch.get("parallel") not in (None, DDP):  # FSDP or ZeRO from an accelerate config given beside
        sharded.append(("parallel", cfg.launch["parallel"]))
    if sharded:
        key, value = sharded[0]
        raise cfg.unmodelled(key, value, f"{key} over {model}, {why}: LLaMA-Factory refuses ZeRO-3 and "
                             "FSDP there (\"DeepSpeed ZeRO-3 or FSDP is incompatible with PTQ-quantized "
                             "models\"); the other ZeRO stages over it are not modelled")
    if not unset(cfg.get("quantization_bit")):
        cfg.notes.append(f"quantization_bit: {cfg.get('quantization_bit')}: no effect on {model}, saved "
                         "quantized (configure_quantization: \"quantization_bit will not affect on the "
                         "PTQ-quantized models\")")
    cfg.notes.append(
        f"model_name_or_path: {model}: saved quantized, {quant.label()} ({quant.source}). transformers "
        "builds its linear layers, all but lm_head, as gptqmodel's; with the backend its config leaves "
        "unset (auto) gptqmodel picks a CUDA kernel that does not train (Machete, Marlin, ExllamaV2: "
        "BaseQuantLinear.train raises NotImplementedError), so autotune assumes the kernel its "
        "auto_trainable backend picks, as named")
    if quant.method == "awq":
        cfg.notes.append("AWQ: transformers loads the model in float16 on a CUDA GPU (quantizers/"
                         "quantizer_awq.py update_dtype: \"torch.bfloat16 is not supported for AWQ CUDA/XPU "
                         "kernels yet\")")
    return quant
