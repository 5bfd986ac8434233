"""The cuda backend's parts of the training step (workload/parts.py): bitsandbytes' and torchao's own.

QLoRA's base is bitsandbytes' ``Linear4bit`` and an 8-bit base its ``Linear8bitLt``, which PEFT
dispatches to its own LoRA layers (peft/tuners/lora/bnb.py ``dispatch_bnb_4bit``,
``dispatch_bnb_8bit``) and counts as bitsandbytes stores them (a ``Params4bit`` of two weights a
byte: peft_model.py ``get_nb_trainable_parameters``); the bitsandbytes optimizers are the Trainer's
setup (bnb.py), as are torchao's (torchao.py). bitsandbytes and torchao are imported when a part is
first used, in the worker.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from autotune.backends.cuda.bnb import (
    make_linear4bit_quantizer,
    make_linear8bit_quantizer,
    make_trainer_bnb_optimizer,
)
from autotune.backends.cuda.torchao import make_trainer_torchao_optimizer
from autotune.errors import BackendUnavailable

if TYPE_CHECKING:
    import torch

    from autotune.workload.parts import Quantize
    from autotune.workload.prequantized import SavedQuant


@dataclass(frozen=True)
class CudaParts:
    """workload.parts.StepParts on a CUDA GPU."""

    @property
    def foreach(self) -> None:
        return None  # PyTorch chooses, as the Trainer lets it

    def quantizer(self, *, quant_type: str, double_quant: bool, compute_dtype: str,
                  quant_storage: str = "uint8") -> Quantize:
        return make_linear4bit_quantizer(quant_type=quant_type, double_quant=double_quant,
                                         compute_dtype=compute_dtype, quant_storage=quant_storage)

    def int8_quantizer(self) -> Quantize:
        return make_linear8bit_quantizer()

    def saved_quantizer(self, quant: SavedQuant) -> Quantize:
        # gptqmodel loads the checkpoint's packed tensors itself (from_pretrained): this backend
        # builds the model from its config with random weights
        raise BackendUnavailable(f"a base saved quantized ({quant.label()}) is emulated by the estimate "
                                 "backend only, not run on the cuda backend")

    def expert_quantizer(self, *, bits: int, quant_type: str,
                         double_quant: bool) -> Callable[[torch.nn.Module], int]:
        # Axolotl quantizes the experts inside transformers' loading, on tensors already on the GPU;
        # this backend builds the model on the host and moves it (bnb.py), which would leave
        # bitsandbytes' QuantState behind.
        raise BackendUnavailable("quantizing the experts on load (Axolotl's quantize_moe_experts) is "
                                 "emulated by the estimate backend only, not run on the cuda backend")

    def lora_modules(self) -> Mapping[type, type]:
        return {}  # PEFT dispatches bitsandbytes' Linear4bit and Linear8bitLt itself

    def uncounted_4bit_parameters(self, model: torch.nn.Module) -> int:
        return 0  # PEFT counts a Params4bit's two weights a byte

    def lora_kernels(self, model: torch.nn.Module, kernels: tuple[str, ...]) -> None:
        from autotune.backends.cuda.lora_kernels import patch

        patch(model, kernels)  # Axolotl's own patch; BackendUnavailable without axolotl

    def bnb_optimizer(self, model: torch.nn.Module, *, optim_bits: int, is_paged: bool) -> Any:
        return make_trainer_bnb_optimizer(model, optim_bits=optim_bits, is_paged=is_paged)

    def torchao_optimizer(self, model: torch.nn.Module, *, bits: int) -> Any:
        return make_trainer_torchao_optimizer(model, bits=bits)


CUDA_PARTS = CudaParts()
