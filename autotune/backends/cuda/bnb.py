"""bitsandbytes' 8-bit AdamW in the real training step: what the cuda backend runs for the 8-bit levers.

Two setups, one per lever (levers.py):

- ``adamw-8bit``: ``bnb.optim.AdamW8bit`` over every trainable parameter, as a script that swaps
  ``torch.optim.AdamW`` for it does;
- ``adamw-8bit-trainer``: as transformers' Trainer sets up ``optim="adamw_bnb_8bit"``
  (transformers 5.x, trainer_optimizer.py ``_get_bitsandbytes_optimizer``: ``bnb.optim.AdamW``
  with ``optim_bits=8, is_paged=False``; trainer.py ``create_optimizer``: after building the
  optimizer, ``GlobalOptimManager.get_instance().register_module_override(module, "weight",
  {"optim_bits": 32})`` for every ``nn.Embedding``, so embeddings keep 32-bit moments).

``make_trainer_bnb_optimizer`` is that Trainer setup for any of its bitsandbytes AdamW names
(``adamw_bnb_8bit``, ``paged_adamw_8bit``, ``paged_adamw_32bit``): what the cuda backend runs for
a workload whose optimizer is one of them (workload/optimizers.py, through parts.py).

Registering after the optimizer is built works because bitsandbytes reads the overrides at the
first ``step`` (bitsandbytes/optim/optimizer.py, ``Optimizer8bit.step`` calls ``check_overrides``
once). The manager is a process-wide singleton; the cuda backend runs one worker process per
cell, so one cell's overrides never reach another's optimizer; within a cell each probe builds
a new optimizer and registers the same overrides again, which only repeats identical entries.

bitsandbytes is imported only when an optimizer is built (in the worker): ``bitsandbytes_available``
asks importlib whether it is installed without importing it (its import loads CUDA libraries).
The emulation the estimator uses instead is workload.optimizers.BnbAdamWState.

QLoRA's base (``make_linear4bit_quantizer``) is bitsandbytes' own ``Linear4bit``, an 8-bit base
(``make_linear8bit_quantizer``) its own ``Linear8bitLt``; the estimator's emulations of them are
backends/estimate/nf4.py and int8.py.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from autotune.errors import BackendUnavailable, InvalidInput

# The setups, and the bitsandbytes optimizer each one builds, as a report names it.
BNB_OPTIMIZERS = {"adamw-8bit": "AdamW8bit", "adamw-8bit-trainer": "AdamW(optim_bits=8)"}
LEARNING_RATE = 5e-5  # step.make_optimizer's AdamW; memory does not depend on it
INSTALL = "pip install bitsandbytes (it needs a CUDA GPU), or let explain emulate its state sizes"


def bitsandbytes_available() -> bool:
    """Whether bitsandbytes is installed; it is not imported."""
    return importlib.util.find_spec("bitsandbytes") is not None


def check_bnb_optimizer(name: str) -> str:
    if name not in BNB_OPTIMIZERS:
        raise InvalidInput(f"unknown bitsandbytes optimizer {name!r}: "
                           f"allowed are {', '.join(BNB_OPTIMIZERS)}")
    return name


def require_bitsandbytes() -> None:
    """BackendUnavailable where bitsandbytes is not installed; nothing is imported."""
    if not bitsandbytes_available():
        raise BackendUnavailable(
            f"the 8-bit AdamW probe needs bitsandbytes, which is not installed: {INSTALL}")


def import_bitsandbytes() -> Any:
    """The bitsandbytes module; BackendUnavailable where it is missing or does not load."""
    try:
        import bitsandbytes
    # Releases before 0.43 raise RuntimeError ("CUDA Setup failed despite GPU being available")
    # when their CUDA library does not load.
    except (ImportError, RuntimeError) as exc:
        raise BackendUnavailable(
            f"the 8-bit AdamW probe needs bitsandbytes, which cannot be imported here ({exc}): {INSTALL}"
        ) from exc
    return bitsandbytes


def make_bnb_optimizer(model: Any, name: str) -> Any:
    """The bitsandbytes optimizer of setup ``name`` (BNB_OPTIMIZERS) over ``model``'s trainable parameters."""
    check_bnb_optimizer(name)
    bnb = import_bitsandbytes()
    params = [p for p in model.parameters() if p.requires_grad]
    if name == "adamw-8bit":
        return bnb.optim.AdamW8bit(params, lr=LEARNING_RATE)
    return make_trainer_bnb_optimizer(model, optim_bits=8, is_paged=False)


def make_trainer_bnb_optimizer(model: Any, *, optim_bits: int, is_paged: bool) -> Any:
    """``bnb.optim.AdamW`` over ``model``'s trainable parameters as transformers' Trainer builds it
    (module docstring): with ``optim_bits=8``, every nn.Embedding weight overridden to 32 bits."""
    from torch import nn

    bnb = import_bitsandbytes()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = bnb.optim.AdamW(params, lr=LEARNING_RATE, optim_bits=optim_bits, is_paged=is_paged)
    if optim_bits == 8:  # trainer.py create_optimizer: only for 8-bit bitsandbytes optimizers
        manager = bnb.optim.GlobalOptimManager.get_instance()
        for module in model.modules():
            if isinstance(module, nn.Embedding):
                manager.register_module_override(module, "weight", {"optim_bits": 32})
    return optimizer


def make_linear4bit_quantizer(*, quant_type: str, double_quant: bool, compute_dtype: str,
                              quant_storage: str = "uint8") -> Any:
    """``quantize(linear, name)`` for adapters.prepare (parts.py): bitsandbytes' ``Linear4bit`` as
    transformers' bitsandbytes integration builds it (integrations/bitsandbytes.py
    ``replace_with_bnb_linear``: ``bnb.nn.Linear4bit(in, out, bias, bnb_4bit_compute_dtype,
    compress_statistics=bnb_4bit_use_double_quant, quant_type=bnb_4bit_quant_type,
    quant_storage=bnb_4bit_quant_storage)``, frozen), holding the layer's weight as a ``Params4bit``:
    moving the model to the GPU quantizes it, as loading a checkpoint does. ``compute_dtype`` is
    adapters.compute_dtype's for the card."""
    import torch
    from transformers.pytorch_utils import Conv1D

    bnb = import_bitsandbytes()
    dtype = getattr(torch, compute_dtype)
    storage = getattr(torch, quant_storage)

    def quantize(linear: Any, name: str) -> Any:
        weight = linear.weight.data
        if isinstance(linear, Conv1D):  # GPT-2's [in, out] weight; transformers transposes it
            weight = weight.t().contiguous()
        out_features, in_features = weight.shape
        layer = bnb.nn.Linear4bit(in_features, out_features, linear.bias is not None, dtype,
                                  compress_statistics=double_quant, quant_type=quant_type,
                                  quant_storage=storage)
        layer.weight = bnb.nn.Params4bit(weight, requires_grad=False, compress_statistics=double_quant,
                                         quant_type=quant_type, quant_storage=storage, module=layer)
        if linear.bias is not None:
            layer.bias = linear.bias
        layer.requires_grad_(False)
        return layer

    return quantize


# transformers BitsAndBytesConfig's llm_int8_threshold default (utils/quantization_config.py).
INT8_THRESHOLD = 6.0


def make_linear8bit_quantizer() -> Any:
    """``quantize(linear, name)`` for adapters.prepare (parts.py): bitsandbytes' ``Linear8bitLt`` as
    transformers' bitsandbytes integration builds it for ``load_in_8bit`` (integrations/bitsandbytes.py
    ``replace_with_bnb_linear``: ``bnb.nn.Linear8bitLt(in, out, bias, has_fp16_weights=
    llm_int8_has_fp16_weight (False), threshold=llm_int8_threshold (6.0))``, frozen), holding the
    layer's weight as an ``Int8Params``: moving the model to the GPU quantizes it
    (``Int8Params._quantize``), as loading a checkpoint does."""
    from transformers.pytorch_utils import Conv1D

    bnb = import_bitsandbytes()

    def quantize(linear: Any, name: str) -> Any:
        weight = linear.weight.data
        if isinstance(linear, Conv1D):  # GPT-2's [in, out] weight; transformers transposes it
            weight = weight.t().contiguous()
        out_features, in_features = weight.shape
        layer = bnb.nn.Linear8bitLt(in_features, out_features, linear.bias is not None,
                                    has_fp16_weights=False, threshold=INT8_THRESHOLD)
        layer.weight = bnb.nn.Int8Params(weight, requires_grad=False, has_fp16_weights=False)
        if linear.bias is not None:
            layer.bias = linear.bias
        layer.requires_grad_(False)
        return layer

    return quantize
