"""The estimator's parts of the training step (workload/parts.py): what runs on fake tensors.

bitsandbytes cannot run here (no CPU kernels, no fake tensors): its 4-bit and 8-bit layers are
nf4.py's and int8.py's emulations, each with PEFT's LoRA layer over it, and its AdamW is
workload.optimizers.BnbAdamWState, whose paged moments are made in tracker.outside_allocator() (CUDA
unified memory, not the caching allocator's). Nor can torchao's low-bit AdamW (compiled per
parameter for the device): its state is workload.optimizers.TorchaoAdamWState. torch, PEFT and the
tracker are imported when a part is first used: the CLI and the tuner name these parts without
running a step.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from autotune.workload.optimizers import emulated_bnb_optimizer, emulated_torchao_optimizer

if TYPE_CHECKING:
    import torch

    from autotune.workload.parts import Quantize
    from autotune.workload.prequantized import SavedQuant


@dataclass(frozen=True)
class EstimateParts:
    """workload.parts.StepParts for fake tensors that stand for CUDA ones."""

    @property
    def foreach(self) -> bool:
        return True  # PyTorch's choice for CUDA tensors, which it cannot see on fake CPU ones

    def quantizer(self, *, quant_type: str, double_quant: bool, compute_dtype: str,
                  quant_storage: str = "uint8") -> Quantize:
        from autotune.backends.estimate.nf4 import make_quantizer

        return make_quantizer(quant_type=quant_type, double_quant=double_quant, compute_dtype=compute_dtype,
                              quant_storage=quant_storage)

    def int8_quantizer(self) -> Quantize:
        from autotune.backends.estimate.int8 import make_quantizer

        return make_quantizer()

    def saved_quantizer(self, quant: SavedQuant) -> Quantize:
        from autotune.backends.estimate.gptq import make_saved_quantizer

        return make_saved_quantizer(quant)

    def expert_quantizer(self, *, bits: int, quant_type: str,
                         double_quant: bool) -> Callable[[torch.nn.Module], int]:
        from autotune.backends.estimate.moe_quant import make_expert_quantizer

        return make_expert_quantizer(bits=bits, quant_type=quant_type, double_quant=double_quant)

    def lora_modules(self) -> Mapping[type, type]:
        from peft.tuners.lora.awq import AwqLoraLinear
        from peft.tuners.lora.gptq import GPTQLoraLinear

        from autotune.backends.estimate.gptq import EmulatedAwqLinear, EmulatedGPTQLinear
        from autotune.backends.estimate.int8 import EmulatedLinear8bitLt, LoraLinear8bitLt
        from autotune.backends.estimate.nf4 import EmulatedLinear4bit, LoraLinear4bit

        # PEFT's own LoRA layers over gptqmodel's (peft/tuners/lora/gptq.py, awq.py), which it
        # dispatches by gptqmodel's classes: here by the emulations'
        return {EmulatedLinear4bit: LoraLinear4bit, EmulatedLinear8bitLt: LoraLinear8bitLt,
                EmulatedGPTQLinear: GPTQLoraLinear, EmulatedAwqLinear: AwqLoraLinear}

    def uncounted_4bit_parameters(self, model: torch.nn.Module) -> int:
        """The emulated 4-bit weight is a plain parameter of its quant_storage dtype, which PEFT
        counts once an element; a Params4bit it counts ``2 * element_size`` times (peft_model.py
        ``get_nb_trainable_parameters``): two weights a byte."""
        from autotune.backends.estimate.nf4 import EmulatedLinear4bit

        return sum(m.weight.numel() * (2 * m.weight.element_size() - 1)
                   for m in model.modules() if isinstance(m, EmulatedLinear4bit))

    def lora_kernels(self, model: torch.nn.Module, kernels: tuple[str, ...]) -> None:
        from autotune.backends.estimate.lora_kernels import patch

        patch(model, kernels)  # Axolotl's Functions in plain torch, on the estimator's hooks

    def bnb_optimizer(self, model: torch.nn.Module, *, optim_bits: int, is_paged: bool) -> Any:
        from autotune.backends.estimate.tracker import outside_allocator

        return emulated_bnb_optimizer(model, optim_bits=optim_bits, is_paged=is_paged,
                                      outside_allocator=outside_allocator)

    def torchao_optimizer(self, model: torch.nn.Module, *, bits: int) -> Any:
        return emulated_torchao_optimizer(model, bits=bits)  # torch.compile has no fake CUDA here


ESTIMATE_PARTS = EstimateParts()
