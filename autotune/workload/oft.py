"""OFT (orthogonal fine-tuning) adapters, built by the real PEFT (peft/tuners/oft, peft 0.21).

An OFT adapter is an ``Adapter`` with ``tuner`` "oft" (workload/adapters.py): PEFT's ``OFTConfig``
in place of the ``LoraConfig``, over the same bases (16/32-bit, or 4/8-bit prepared by a recipe).
Each targeted linear layer becomes PEFT's ``oft.Linear`` (peft/tuners/oft/model.py
``_get_tuner_layer_class``: any ``nn.Linear``, bitsandbytes' ``Linear4bit`` and ``Linear8bitLt``
among them, and the estimator's emulations of them, which are ``nn.Linear`` too), holding one
trainable ``OFTRotationModule.weight`` of ``[r, block_size * (block_size - 1) / 2]``: the upper
triangles of ``r`` skew-symmetric blocks, ``r * block_size`` = the layer's ``in_features``
(``OFTLayer.update_layer``; a block size that does not divide it is moved to one that does:
``adjust_oft_parameters``).

What an OFT layer allocates in the step is traced, not emulated: its forward runs on the fake
tensors as PEFT wrote it (``oft.Linear.forward`` -> ``OFTRotationModule.forward``): the input cast
to the rotation's dtype (float32: PEFT's ``autocast_adapter_dtype`` and the trainers' upcast), the
rotation rebuilt from the weight at every forward (``_cayley_batch``: the skew-symmetric
``[r, b, b]`` matrices, and with the Cayley-Neumann series, OFTConfig's default, its powers by
``bmm``; else ``torch.linalg.solve``), the input rotated block by block (``einsum``, under autocast
in its lower precision), cast back, then the base layer. Autograd keeps what it keeps of these.

OFTConfig's defaults (peft/tuners/oft/config.py), which LLaMA-Factory leaves as they are:
``use_cayley_neumann`` True with ``num_cayley_neumann_terms`` 5, ``coft`` False, ``block_share``
False, ``bias`` "none". ``module_dropout``: ``update_layer`` builds a ``MultiplicativeDropoutLayer``,
which no forward of peft 0.21 applies (``oft.Linear.forward`` never reads ``oft_dropout``): no
effect on memory.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from autotune.errors import InvalidInput

DEFAULT_BLOCK_SIZE = 32  # OFTConfig.oft_block_size (peft/tuners/oft/config.py)
MAX_SIZE = 4096  # far above any rank or block size in use; a bound for what is accepted
NEUMANN_TERMS = 5  # OFTConfig.num_cayley_neumann_terms, with use_cayley_neumann True (its default)


def check_oft(r: Any, block_size: Any, *, bias: str, kernels: str | Iterable[str], quantize_experts: bool,
              experts_undropped: bool) -> None:
    """OFT's r and block size as OFTConfig.__post_init__ takes them: whole numbers, exactly one of
    them non-zero ("You can only specify either r ... or oft_block_size"); what only LoRA has, refused."""
    for name, value in (("OFT rank (r)", r), ("OFT block size", block_size)):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_SIZE:
            raise InvalidInput(f"{name} must be an integer from 0 to {MAX_SIZE}, got {value!r}")
    if (r != 0) == (block_size != 0):
        raise InvalidInput(f"OFT takes a rank or a block size, exactly one of them non-zero (r x block "
                           f"size = the layer's in_features: peft OFTConfig), got r={r} and block size "
                           f"{block_size}")
    if bias != "none":
        raise InvalidInput(f"OFT with bias {bias!r} (trainable biases) is not modelled: autotune models "
                           "OFTConfig's bias none")
    if kernels or quantize_experts or experts_undropped:
        raise InvalidInput("Axolotl's LoRA kernels and expert settings are LoRA's: OFT has none of them")


def oft_settings(r: int, block_size: int, dropout: float) -> str:
    """``block size 32 (Cayley-Neumann, 5 terms)`` or ``r=8 (...)``, for an adapter's label."""
    size = f"r={r}" if r else f"block size {block_size}"
    dropout_note = f", module_dropout {dropout:g} (never applied)" if dropout else ""
    return f"{size} (Cayley-Neumann parametrisation, {NEUMANN_TERMS} terms{dropout_note})"


def oft_config(*, r: int, block_size: int, dropout: float, **common: Any) -> Any:
    """PEFT's OFTConfig as LLaMA-Factory builds it (model/adapter.py _setup_lora_tuning: r,
    oft_block_size, target_modules, module_dropout, modules_to_save; the rest OFTConfig's defaults);
    ``common``: the fields it shares with LoraConfig (adapters.peft_config)."""
    from peft import OFTConfig

    return OFTConfig(r=r, oft_block_size=block_size, module_dropout=dropout, **common)
