"""torch.compile around the model, as TrainingArguments' ``torch_compile`` runs it (the Workload's
``compiled``): its modes, and the steps it is modelled in.

transformers' TrainingArguments turns ``torch_compile`` on when any of ``torch_compile``,
``torch_compile_backend``, ``torch_compile_mode`` is set, with the backend "inductor" unless named
(training_args.py ``__post_init__``), and passes backend and mode to accelerate's TorchDynamoPlugin
(trainer.py ``create_accelerator_and_postprocess``); ``Accelerator.prepare_model`` then wraps the whole
model in ``torch.compile(model, backend=..., mode=...)``. The estimator models inductor's AOTAutograd
partition of the forward and backward (backends/estimate/compiled.py). Its modes:

- "default" and "max-autotune-no-cudagraphs": the same graphs and partition; the latter tunes the
  kernels' configurations (torch/_inductor/config.py ``max_autotune``), which the estimator does not
  emulate (nor inductor's kernels at all: an upper bound on their transient buffers).
- "reduce-overhead" and "max-autotune" run the graphs as CUDA graphs (``triton.cudagraphs``), whose
  memory pools are kept apart and their outputs held static: refused.

Only the plain step is modelled compiled: one GPU, the model's own loss, transformers' attention and
layers. Where the step holds an emulated kernel (Liger, Cut Cross-Entropy, flex attention, a 4-bit or
8-bit base...), checkpointing (its recompute is the partitioner's under compile) or a sharded job,
the compiled step is refused by name (``check_compiled``): those are traced eagerly only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from autotune.errors import InvalidInput, UnmodelledSetting

if TYPE_CHECKING:
    from autotune.workload import Workload
    from autotune.workload.modes import Mode

DEFAULT_MODE = "default"
COMPILE_MODES = (DEFAULT_MODE, "max-autotune-no-cudagraphs")
# torch.compile's modes that run CUDA graphs (torch/_inductor/config.py ``triton.cudagraphs`` on).
CUDAGRAPH_MODES = ("reduce-overhead", "max-autotune")
BACKEND = "inductor"  # TrainingArguments' default backend on a CUDA card


def compile_warnings(workload: Workload) -> list[str]:
    """What the output says of a compiled step: how it was modelled, and what is an upper bound."""
    if workload.compiled is None:
        return []
    return [f"compiled step (torch.compile, {BACKEND}, mode {workload.compiled}): the activations saved for "
            "the backward are AOTAutograd's min-cut partitioner's, traced on Dynamo's graphs of this "
            "model; inductor's kernel fusion is not emulated (each op's output allocated): an upper bound "
            "on the transient buffers"]


def check_mode(mode: str | None) -> str | None:
    """``mode`` as a Workload's ``compiled`` (None: not compiled); a CUDA-graph mode refused."""
    if mode is None or mode in COMPILE_MODES:
        return mode
    if mode in CUDAGRAPH_MODES:
        raise UnmodelledSetting.naming(f"{{torch_compile}} {mode}: CUDA graphs (inductor's "
                                       "triton.cudagraphs) keep memory pools of their own, which autotune "
                                       f"does not model; modelled: {', '.join(COMPILE_MODES)}")
    raise InvalidInput.naming(f"{{torch_compile}} {mode!r}: torch.compile's modes are "
                              f"{', '.join((*COMPILE_MODES, *CUDAGRAPH_MODES))}; modelled: "
                              f"{', '.join(COMPILE_MODES)}")


def check_compiled(workload: Workload, modes: Sequence[Mode]) -> None:
    """Refuse, naming it, what the compiled step is not modelled beside (module docstring)."""
    from autotune.workload.step import FLEX_ATTENTION, VLLM_FLASH_ATTN3

    if workload.compiled is None:
        return
    from autotune.workload import gated_delta_rule, mamba_mixer

    model_type = getattr(workload.model.config, "model_type", None)
    # layers whose kernels the estimator emulates in every step (fla's gated delta rule, mamba-ssm's
    # Mamba-2 kernels): their Triton kernels are opaque to the partitioner, their emulation is not
    emulated_layers = gated_delta_rule.hybrid(model_type) or model_type in mamba_mixer.MODEL_TYPES
    checkpointed = [mode.name for mode in modes if mode.checkpointing]
    beside = [
        (f"model type {model_type} (its linear-attention or Mamba layers' kernels, emulated)",
         emulated_layers),
        ("{parallel}", workload.parallel is not None),
        (f"checkpointed modes ({', '.join(checkpointed)})", bool(checkpointed)),
        (f"{{loss}} {workload.loss}", workload.loss != "full"),
        ("{liger}", bool(workload.liger)),
        ("a quantized base ({peft})", workload.adapter is not None and workload.adapter.method != "lora"),
        # emulated in torch, whose pointwise ops the partitioner could recompute where the job's Triton
        # kernels are opaque to it: set Axolotl's lora_mlp_kernel, lora_qkv_kernel, lora_o_kernel false
        ("Axolotl's fused LoRA kernels (lora_*_kernel)",
         workload.adapter is not None and bool(workload.adapter.kernels)),
        (f"{{attn}} {workload.attn}", workload.attn in (FLEX_ATTENTION, VLLM_FLASH_ATTN3)),
        ("{offload_activations}", workload.offload_activations),
        ("a preference trainer ({trainer})", workload.trainer is not None),
        ("images (a vision-language model's step)", workload.images is not None),
        ("{experts_kernel}", workload.experts_kernel is not None),
        ("{use_kernels}", workload.hub_kernels),
        ("Axolotl's fused attention kernel", workload.fused_attention),
        ("{qat}", workload.qat is not None),
        ("{fp8}", workload.fp8 is not None),
    ]
    for what, present in beside:
        if present:
            raise UnmodelledSetting.naming(
                f"{{torch_compile}} beside {what}: the compiled step is modelled for one GPU, the model's "
                "own loss and transformers' layers (sdpa, eager or flash_attention_2 attention, LoRA or a "
                "full fine-tune), without checkpointing; emulated kernels and checkpointing are traced "
                "eagerly only")
