"""PEFT's LoRA layer over an emulated bitsandbytes base (nf4.py's 4-bit, int8.py's 8-bit layer).

PEFT's own bitsandbytes LoRA layers (peft/tuners/lora/bnb.py ``Linear4bit.forward`` and
``Linear8bitLt.forward``) differ in one line: the 4-bit one clones the base output first ("As per Tim
Dettmers, for 4bit, we need to defensively clone here"). Otherwise both cast the input to the
adapter's dtype only outside autocast and cast the adapter's output back. Plain LoRA only: this tool
refuses LoRA variants. PEFT dispatches to them through ``LoraConfig._register_custom_module``
(adapters.prepare, with the estimator's parts: parts.py).
"""

from __future__ import annotations

from typing import Any, cast

import torch
from peft.tuners.lora.layer import Linear as LoraLinear

from autotune.backends.estimate.emulation import autocast_enabled


class BnbLoraLinear(LoraLinear):
    """``lora.Linear`` with the forward of PEFT's bitsandbytes LoRA layers (module docstring)."""

    clone_base_output = False  # the 4-bit layer's defensive clone

    def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        self._check_forward_args(x, *args, **kwargs)
        result = self.base_layer(x, *args, **kwargs)
        if self.clone_base_output:
            result = result.clone()
        for active_adapter in self.active_adapters:
            if active_adapter not in self.lora_A.keys():
                continue
            lora_A = self.lora_A[active_adapter]
            lora_B = self.lora_B[active_adapter]
            dropout = self.lora_dropout[active_adapter]
            scaling = self.scaling[active_adapter]
            requires_conversion = not autocast_enabled()  # the emulated CUDA autocast
            if requires_conversion:
                expected_dtype = result.dtype
                x = self._cast_input_dtype(x, cast(torch.dtype, lora_A.weight.dtype))
            output = lora_B(lora_A(dropout(x))) * scaling
            if requires_conversion:
                output = output.to(expected_dtype)
            result = result + output
        return result
