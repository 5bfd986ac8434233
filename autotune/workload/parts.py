"""What a backend hands the training step: the parts that depend on where the step runs.

The workload defines the step (step.py, adapters.py, optimizers.py) and sits below the backends:
it imports none of them (tests/test_architecture.py). Where the step needs something only a
backend can make, the backend passes its ``StepParts``:

    estimate  backends/estimate/parts.py  fake tensors that stand for CUDA ones: bitsandbytes'
                                          4- and 8-bit layers and AdamW emulated with their CUDA
                                          sizes (nf4.py, int8.py; optimizers.BnbAdamWState), torchao's AdamW
                                          too (optimizers.TorchaoAdamWState), gptqmodel's GPTQ
                                          and AWQ layers (gptq.py), Axolotl's fused
                                          LoRA kernels emulated (lora_kernels.py)
    cuda      backends/cuda/parts.py      bitsandbytes' own Linear4bit, Linear8bitLt and AdamW (bnb.py),
                                          torchao's own AdamW (torchao.py),
                                          Axolotl's own LoRA kernels (lora_kernels.py)

The model PEFT builds, the optimizer the Trainer builds, the loop (step.run_steps) are the same
for both: only these parts differ.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch

    from autotune.workload.prequantized import SavedQuant

# ``quantize(linear, module_name)``: the layer that stores ``linear`` in 4 or 8 bits (adapters.prepare).
Quantize = Callable[["torch.nn.Module", str], "torch.nn.Module"]


class StepParts(Protocol):
    """The backend-specific parts of a training step (module docstring)."""

    @property
    def foreach(self) -> bool | None:
        """``foreach`` of torch's AdamW and SGD: True where the parameters are fake CPU tensors
        that stand for CUDA ones (PyTorch's own choice for CUDA tensors, torch/optim/optimizer.py
        ``_default_to_fused_or_foreach``); None lets PyTorch choose, as the Trainer does."""
        ...

    def quantizer(self, *, quant_type: str, double_quant: bool, compute_dtype: str,
                  quant_storage: str = "uint8") -> Quantize:
        """``quantize(linear, module_name)``: a linear layer stored in 4 bits as transformers'
        bitsandbytes integration stores it (``bnb_4bit_quant_type``, ``bnb_4bit_use_double_quant``,
        the packed bytes in ``bnb_4bit_quant_storage``), computing in ``compute_dtype``
        (adapters.compute_dtype)."""
        ...

    def int8_quantizer(self) -> Quantize:
        """``quantize(linear, module_name)``: a linear layer stored in 8 bits as transformers'
        bitsandbytes integration stores it for ``load_in_8bit`` (LLM.int8: ``Linear8bitLt``,
        frozen, outlier threshold 6.0)."""
        ...

    def saved_quantizer(self, quant: SavedQuant) -> Quantize:
        """``quantize(linear, module_name)``: a linear layer of a checkpoint saved quantized with GPTQ or
        AWQ as transformers loads it (gptqmodel's trainable QuantLinear: workload/prequantized.py)."""
        ...

    def expert_quantizer(self, *, bits: int, quant_type: str,
                         double_quant: bool) -> Callable[[torch.nn.Module], int]:
        """``quantize_experts(model) -> count``: the experts' 3D weights of ``model`` stored in
        ``bits`` (4 or 8) and dequantized on access, as Axolotl's ``quantize_moe_experts`` quantizes
        them on load (backends/estimate/moe_quant.py); the count of weights quantized."""
        ...

    def lora_modules(self) -> Mapping[type, type]:
        """PEFT's LoRA layer class per 4- or 8-bit layer class that PEFT does not dispatch itself
        (``LoraConfig._register_custom_module``); empty where PEFT knows the layer."""
        ...

    def uncounted_4bit_parameters(self, model: torch.nn.Module) -> int:
        """Elements of ``model``'s 4-bit weights that PEFT's ``get_nb_trainable_parameters`` does
        not count: 0 where PEFT counts the layer's weight as bitsandbytes' (two elements a byte)."""
        ...

    def lora_kernels(self, model: torch.nn.Module, kernels: tuple[str, ...]) -> None:
        """Axolotl's fused LoRA kernels (workload/lora_kernels.py KERNELS) patched into the
        PEFT-wrapped ``model`` as Axolotl's ``apply_lora_kernel_patches`` patches them: the
        estimator's emulation, Axolotl's own on the GPU (adapters.prepare)."""
        ...

    def bnb_optimizer(self, model: torch.nn.Module, *, optim_bits: int, is_paged: bool) -> Any:
        """bitsandbytes' AdamW over ``model``'s trainable parameters as transformers' Trainer
        sets it up (optimizers.py), with the optimizer interface the step uses."""
        ...

    def torchao_optimizer(self, model: torch.nn.Module, *, bits: int) -> Any:
        """torchao's AdamW8bit (``bits=8``) or AdamW4bit (4) over ``model``'s trainable parameters
        as transformers' Trainer sets it up (optimizers.py), with the optimizer interface the step
        uses."""
        ...
