"""Liger Kernel on the GPU: its own Triton kernels, swapped in as Axolotl's LigerPlugin swaps them.

The cuda backend measures the real thing: a workload with Liger kernels (workload.liger) has
Liger's patch for its model type applied in the worker before the model is built
(``MODEL_TYPE_TO_APPLY_LIGER_FN[model_type](**kwargs)`` with the keyword arguments the function
has, as axolotl/integrations/liger/plugin.py ``pre_model_load`` calls it). The fused linear
cross-entropy stays off: it is the workload's loss "chunked" (workload/loss.py), which runs in the
training step itself. One worker serves one cell (probe_worker.py), so the patch, which assigns
names in transformers' modules, lasts as long as the cell.
"""

from __future__ import annotations

import importlib.util

from autotune.errors import BackendUnavailable
from autotune.workload import Workload
from autotune.workload.liger import KERNELS


def require_liger() -> None:
    """BackendUnavailable where liger_kernel is not installed; nothing is imported."""
    if importlib.util.find_spec("liger_kernel") is None:
        raise BackendUnavailable("Liger kernels on the cuda backend need the liger_kernel package "
                                 "(pip install liger-kernel); the estimate backend emulates them")


def patch_before_build(workload: Workload) -> None:
    """Liger's patch of the workload's model type, with its kernels on and the others off."""
    if not workload.liger:
        return
    import inspect

    # An optional package of a CUDA machine, without type information.
    from liger_kernel.transformers.monkey_patch import (
        MODEL_TYPE_TO_APPLY_LIGER_FN,
    )

    model_type = workload.model.config.model_type
    if model_type not in MODEL_TYPE_TO_APPLY_LIGER_FN:  # an Axolotl branch (workload.liger.AXOLOTL_PATCHES)
        raise BackendUnavailable(f"Axolotl's own Liger branch for model type {model_type} (integrations/"
                                 "liger/plugin.py) is not run by the cuda backend; the estimate backend "
                                 "emulates it")
    apply = MODEL_TYPE_TO_APPLY_LIGER_FN[model_type]
    wanted = {name: name in workload.liger for name in KERNELS} | {"fused_linear_cross_entropy": False}
    taken = inspect.signature(apply).parameters
    apply(**{name: on for name, on in wanted.items() if name in taken})
