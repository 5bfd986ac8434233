"""torchao's low-bit AdamW in the real training step: what the cuda backend runs for a workload whose
optimizer is ``adamw_torch_8bit`` or ``adamw_torch_4bit`` (workload/optimizers.py, through parts.py).

transformers 5.x, trainer_optimizer.py ``_get_torchao_optimizer``: ``torchao.optim.AdamW8bit`` or
``AdamW4bit`` (torchao >= 0.11; transformers 5 asks for >= 0.15, utils/import_utils.py
``TORCHAO_MIN_VERSION``) with the Trainer's learning rate, betas and eps, ``block_size`` from
``optim_args``, 256 by default for both, and ``bf16_stochastic_round=False``. Unlike the
bitsandbytes setup, the Trainer registers no 32-bit override for embeddings (trainer.py
``create_optimizer`` does that for bitsandbytes only).

torchao is imported only when an optimizer is built (in the worker); ``torchao_available`` asks
importlib whether it is installed without importing it. The emulation the estimator uses instead
is workload.optimizers.TorchaoAdamWState.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

from autotune.errors import BackendUnavailable, InvalidInput
from autotune.workload.optimizers import ADAMW_LR, TORCHAO_BLOCK_SIZE

# The optimizer class per bits of state, as _get_torchao_optimizer picks it.
TORCHAO_CLASSES = {8: "AdamW8bit", 4: "AdamW4bit"}
INSTALL = ("pip install torchao (0.15 or later, as transformers 5 asks), or use the estimate backend, "
           "which emulates its state sizes")


def torchao_available() -> bool:
    """Whether torchao is installed; it is not imported."""
    return importlib.util.find_spec("torchao") is not None


def require_torchao() -> None:
    """BackendUnavailable where torchao is not installed; nothing is imported."""
    if not torchao_available():
        raise BackendUnavailable(f"the optimizers adamw_torch_8bit and adamw_torch_4bit need torchao, "
                                 f"which is not installed: {INSTALL}")


def import_torchao_optim() -> Any:
    """The ``torchao.optim`` module; BackendUnavailable where torchao is missing or does not load."""
    try:
        return importlib.import_module("torchao.optim")
    # torchao checks the torch it runs with at import (an incompatible one raises, or its C++
    # extensions fail to load).
    except (ImportError, RuntimeError) as exc:
        raise BackendUnavailable(f"the optimizers adamw_torch_8bit and adamw_torch_4bit need torchao, "
                                 f"which cannot be imported here ({exc}): {INSTALL}") from exc


def make_trainer_torchao_optimizer(model: Any, *, bits: int) -> Any:
    """torchao's AdamW8bit (``bits=8``) or AdamW4bit (4) over ``model``'s trainable parameters as
    transformers' Trainer builds it (module docstring)."""
    if bits not in TORCHAO_CLASSES:
        raise InvalidInput(f"torchao's low-bit AdamW has 8 or 4 bits of state, not {bits}")
    optim = import_torchao_optim()
    params = [p for p in model.parameters() if p.requires_grad]
    return getattr(optim, TORCHAO_CLASSES[bits])(params, lr=ADAMW_LR, block_size=TORCHAO_BLOCK_SIZE,
                                                 bf16_stochastic_round=False)
