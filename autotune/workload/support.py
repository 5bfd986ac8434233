"""What a target card and a training step support: steps refused outright, and warnings.

A step the real stack refuses is refused here too, with the reason (never a table for a step
that would crash):

- ``amp`` over float16 weights: ``GradScaler`` refuses to unscale float16 gradients
  (torch/amp/grad_scaler.py, ``_unscale_grads_``: "Attempting to unscale FP16 gradients."),
  unless only adapters train: PEFT's ``get_peft_model`` makes LoRA weights float32
  (``autocast_adapter_dtype``), a QLoRA recipe float32 or bfloat16 (adapters.prepare); a module
  LoRA trains whole (modules_to_save, a classification head) is still a float16 copy;
- ``flash_attention_2`` needs an sm80+ card (flash-attn 2 supports Ampere and newer) and 16-bit
  inputs: float32 weights without autocast are refused by flash-attn ("FlashAttention only
  supports fp16 and bf16 data type");
- fp16 under DeepSpeed ZeRO (an ``amp`` step) on a card below compute capability 7.0: DeepSpeed's
  engine refuses it ("Type fp16 is not supported on your device") unless, on 6.x (P100),
  DS_ALLOW_DEPRECATED_FP16=1;
- ``kernels-community/vllm-flash-attn3`` likewise (flash_api.cpp mha_fwd: sm80+, 16-bit inputs), and
  for a model with attention sinks (gpt-oss) a Hopper card and bfloat16 ("S aux is currently only
  supported for Hopper GPUs", "We only support bf16 dtype for S aux").

A step that runs but not as the user may think gets a warning: a sequence past the positions a
RoPE model was trained for (workload/positions.py); bfloat16 (autocast or weights) on
a card without native bfloat16 (compute capability below 8.0: P100, V100, T4, TITAN-X), where the
Hugging Face Trainer refuses ``bf16=True`` ("Your setup doesn't support bf16/gpu",
training_args.py) and PyTorch runs bfloat16 matmuls without tensor cores, if at all.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from autotune.errors import JobFails
from autotune.gpus import GpuSpec
from autotune.workload import Workload
from autotune.workload.models import seq_len_warnings
from autotune.workload.modes import Mode
from autotune.workload.optimizers import outside_allocator_bytes
from autotune.workload.step import FLASH_ATTENTION_2, VLLM_FLASH_ATTN3, build_model

# DeepSpeed's switch for fp16 on compute capability 6.x (accelerator/cuda_accelerator.py is_fp16_supported).
DEPRECATED_FP16 = "DS_ALLOW_DEPRECATED_FP16"


def refusal(workload: Workload, mode: Mode, gpu: GpuSpec) -> str | None:
    """Why this step cannot run on ``gpu``, or None."""
    if mode.uses_grad_scaler and workload.weights_dtype == "float16" and _float16_trainable(workload):
        trained = ("" if workload.adapter is None else
                   " (LoRA trains the head or modules_to_save whole, as float16 copies)")
        return (f"mode {mode.name} (autocast float16 + GradScaler) cannot train float16 weights{trained}: "
                "GradScaler refuses to unscale float16 gradients; use mode fp32 with float16 "
                "weights, bf16, or float32/bfloat16 weights")
    zero_fp16 = _zero_fp16_refusal(workload, mode, gpu)
    if zero_fp16 is not None:
        return zero_fp16
    if workload.attn == FLASH_ATTENTION_2:
        cc = gpu.compute_capability
        if cc is not None and cc < (8, 0):
            return (f"flash_attention_2 needs compute capability 8.0 or newer; {gpu.name} has "
                    f"{cc[0]}.{cc[1]}: use sdpa or eager")
        if mode.autocast_dtype_name is None and workload.weights_dtype == "float32":
            return (f"flash_attention_2 runs on float16/bfloat16 inputs only; mode {mode.name} over "
                    "float32 weights has none: use a bf16 or amp mode, 16-bit weights, or sdpa")
    if workload.attn == VLLM_FLASH_ATTN3:
        return _flash_attn3_refusal(workload, mode, gpu)
    return None


def _zero_fp16_refusal(workload: Workload, mode: Mode, gpu: GpuSpec) -> str | None:
    """DeepSpeed's fp16 (its ``fp16.enabled``: an amp step, backends/deepspeed.py) on a card below
    compute capability 7.0: the engine raises "Type fp16 is not supported on your device"
    (engine.py ``_do_sanity_check``) where ``cuda_accelerator.py is_fp16_supported`` is false, as it is
    on 6.x unless DS_ALLOW_DEPRECATED_FP16=1 is set, read here from autotune's own environment."""
    cc = gpu.compute_capability
    if workload.parallel is None or not workload.parallel.is_zero or mode.precision != "amp" \
            or cc is None or cc >= (7, 0):
        return None
    if cc[0] == 6 and os.environ.get(DEPRECATED_FP16) == "1":
        return None
    allowed = f" unless {DEPRECATED_FP16}=1 is set (set it for autotune too)" if cc[0] == 6 else ""
    return (f"DeepSpeed refuses fp16 (mode {mode.name}) on {gpu.name}, compute capability {cc[0]}.{cc[1]}: "
            f"\"Type fp16 is not supported on your device\" (runtime/engine.py _do_sanity_check, "
            f"accelerator/cuda_accelerator.py is_fp16_supported: 7.0 or newer{allowed}); use fp32")


def _flash_attn3_refusal(workload: Workload, mode: Mode, gpu: GpuSpec) -> str | None:
    from autotune.workload import flash_attn3

    name, cc = flash_attn3.NAME, gpu.compute_capability
    if cc is not None and cc < (8, 0):
        return f"{name} needs compute capability 8.0 or newer; {gpu.name} has {cc[0]}.{cc[1]}"
    if mode.autocast_dtype_name is None and workload.weights_dtype == "float32":
        return (f"{name} runs on float16/bfloat16 inputs only; mode {mode.name} over float32 weights has "
                "none: use a bf16 mode or bfloat16 weights")
    model_type = getattr(workload.model.config, "model_type", None)
    if model_type not in flash_attn3.SINK_MODEL_TYPES:
        return None
    if cc is not None and cc != flash_attn3.SINK_ARCH:
        return (f"{name} takes {model_type}'s attention sinks on Hopper (compute capability 9.0) only "
                f"(flash_api.cpp mha_fwd); {gpu.name} has {cc[0]}.{cc[1]}: use eager")
    half = mode.autocast_dtype_name or workload.weights_dtype
    if half == "float16":
        return (f"{name} takes {model_type}'s attention sinks in bfloat16 only (flash_api.cpp mha_fwd; "
                f"transformers casts them to the query's dtype), not float16: use a bf16 mode")
    return None


def _float16_trainable(workload: Workload) -> bool:
    """Whether some trainable parameter stays float16 over float16 weights (see the docstring)."""
    adapter = workload.adapter
    if adapter is None:
        return True
    if adapter.quantized:  # every recipe casts what trains to float32 or bfloat16
        return False
    from autotune.workload.adapters import PEFT_TRAINED_HEADS

    return bool(adapter.modules_to_save) or workload.task in PEFT_TRAINED_HEADS


def check_supported(workload: Workload, mode: Mode, gpu: GpuSpec) -> None:
    """JobFails where the real stack refuses the step on ``gpu`` (module docstring)."""
    reason = refusal(workload, mode, gpu)
    if reason is not None:
        raise JobFails(reason)


def step_warnings(workload: Workload, modes: Iterable[Mode], gpu: GpuSpec,
                  seq_lens: Iterable[int] = ()) -> list[str]:
    """What the output should say about these steps on ``gpu`` (bfloat16 without support) and of
    ``seq_lens`` (the longest past a RoPE model's positions, models.seq_len_warnings)."""
    from autotune.workload.compile import compile_warnings

    longest = max(seq_lens, default=0)
    return [*dtype_warnings(workload.weights_dtype, modes, gpu), *seq_len_warnings(workload.model, longest),
            *compile_warnings(workload)]


def dtype_warnings(weights_dtype: str, modes: Iterable[Mode], gpu: GpuSpec) -> list[str]:
    """step_warnings from the weights' dtype alone (a stored spec, without rebuilding its model)."""
    cc = gpu.compute_capability
    if cc is None or gpu.supports_bf16:  # a card given by its size is taken to be a current one
        return []
    uses = []
    if weights_dtype == "bfloat16":
        uses.append("bfloat16 weights")
    bf16_modes = [m.name for m in modes if m.autocast_dtype_name == "bfloat16"]
    if bf16_modes:
        uses.append("bf16 autocast (" + ", ".join(bf16_modes) + ")")
    if not uses:
        return []
    return [f"{gpu.name} (compute capability {cc[0]}.{cc[1]}) has no native bfloat16 support, "
            f"asked for by {' and '.join(uses)}: the Hugging Face Trainer refuses bf16 on it; "
            "use amp (float16 autocast) and float32 weights"]


def weights_label(weights_dtype: str) -> str:
    """How outputs name the weights: "fp32 weights", "bf16 weights", "fp16 weights"."""
    return {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}[weights_dtype] + " weights"


def paged_state_bytes(workload: Workload) -> int:
    """``outside_allocator_bytes`` of a workload's optimizer over its model (0 unless paged); the
    model is built on fake tensors, which hold no memory."""
    if not workload.optimizer.startswith("paged_"):  # optimizers.OPTIMIZERS: paged_adamw_*
        return 0
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():  # the attention does not change the parameters: transformers' default
        model, _ = build_model(workload.model, workload.task, None, workload.weights_dtype)
        return outside_allocator_bytes(model, workload.optimizer)
