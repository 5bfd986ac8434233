"""Probe backends: choosing one with the target GPU for it (what a backend is: base.Backend).

Two backends run the same training step (workload/step.py) at a batch size and say whether it
fits: ``estimate`` (estimate/: fake tensors on the CPU, CUDA's allocations emulated and replayed
through a caching-allocator simulator) and ``cuda`` (cuda/: a real step on the local GPU, one
probe worker process per cell), whose every cell's search starts from the estimator's answer
(seeded.py) unless ``seeded=False``.

``auto`` is ``cuda`` on a machine with a CUDA GPU, else ``estimate``. The target GPU is ``gpu``
(a preset name), ``gpu_memory`` (a size: with ``gpu``, a budget on that card; with
``multiprocessors``, on that chip) when given, else the local GPU (cuda), else a 16 GB-class card
(defaults.DEFAULT_GPU_NAME).
"""

from __future__ import annotations

from dataclasses import replace

from autotune.backends.base import Backend
from autotune.backends.cuda.device import cuda_available
from autotune.defaults import BACKENDS, DEFAULT_GPU_NAME
from autotune.errors import BackendUnavailable, InvalidInput
from autotune.gpus import (
    GpuSpec,
    budget_on,
    context_overhead_override,
    custom_gpu,
    multiprocessors,
    parse_multiprocessors,
    resolve_gpu,
    with_context_overhead,
)
from autotune.units import parse_bytes

__all__ = ["Backend", "make_backend", "target_gpu"]


def target_gpu(gpu: str | None, gpu_memory: str | int | None, *, local: GpuSpec | None,
               chip: str | int | None = None) -> GpuSpec:
    """The card the table is for; the CUDA context overhead honours AUTOTUNE_CONTEXT_OVERHEAD.

    ``gpu`` and ``gpu_memory`` together: a budget on that card (gpus.budget_on); ``chip``, the
    multiprocessors of a card given by its size (gpus.parse_multiprocessors).
    """
    if chip is not None and gpu_memory is None:
        raise InvalidInput("multiprocessors name the chip of a card given by its size: give gpu_memory too"
                           + (f" ({gpu} has its own)" if gpu is not None else ""))
    if chip is not None and gpu is not None:
        raise InvalidInput(f"give either gpu ({gpu} has its own multiprocessors) or multiprocessors, "
                           "not both")
    if gpu is not None and gpu_memory is not None:
        spec = budget_on(resolve_gpu(gpu), parse_bytes(gpu_memory))
    elif gpu is not None:
        spec = resolve_gpu(gpu)
    elif gpu_memory is not None:
        spec = custom_gpu(parse_bytes(gpu_memory), None if chip is None else parse_multiprocessors(chip))
    else:
        spec = local if local is not None else resolve_gpu(DEFAULT_GPU_NAME)
    override = context_overhead_override()
    return with_context_overhead(spec, override) if override is not None else spec


def make_backend(
    name: str, gpu: str | None = None, gpu_memory: str | int | None = None, *, seeded: bool = True,
    chip: str | int | None = None, alloc_conf: str | None = None,
) -> tuple[Backend, GpuSpec]:
    """The backend called ``name`` and the target GPU it estimates or measures for.

    ``seeded``: a cuda backend's searches start from the estimator's answer of each cell
    (seeded.py); False probes from the earlier cells' hints alone. ``alloc_conf``: PyTorch's
    caching-allocator settings (PYTORCH_ALLOC_CONF's text; None: PyTorch's default), which the
    estimator simulates and the cuda backend's workers run under.
    """
    from autotune.backends.estimate.alloc_conf import parse_alloc_conf

    allocator = parse_alloc_conf(alloc_conf)
    if name not in BACKENDS:
        raise InvalidInput(f"unknown backend {name!r}: allowed are {', '.join(BACKENDS)}")
    use_cuda = name == "cuda" or (name == "auto" and cuda_available())
    if use_cuda and chip is not None:
        raise InvalidInput("multiprocessors are the estimator's: the cuda backend measures the local "
                           "GPU's chip")
    if use_cuda:
        if not cuda_available():
            raise BackendUnavailable(
                "backend 'cuda' needs a CUDA GPU and a CUDA build of torch; this machine has "
                "none: use backend 'estimate' (or auto)"
            )
        from autotune.backends.cuda.backend import CudaBackend
        from autotune.backends.cuda.device import local_gpu

        local = local_gpu()
        target = target_gpu(gpu, gpu_memory, local=local, chip=chip)
        if target.total_memory_bytes > local.total_memory_bytes:
            raise InvalidInput(
                f"target {target.name} has more memory than the local {local.name}: "
                "the cuda backend can only simulate a smaller card; use backend 'estimate'"
            )
        from autotune.backends.estimate.backend import EstimateBackend
        from autotune.backends.seeded import EstimateSeeded

        measure = CudaBackend(target, alloc_conf=None if alloc_conf is None else allocator.conf_text())
        if not seeded:
            return measure, target
        # The seeds are for the step as this card runs it: its reductions split over its own
        # multiprocessors, whatever the budget (estimate/reduce.py).
        runs_on = replace(target, multiprocessors=multiprocessors(local))
        return EstimateSeeded(measure, EstimateBackend(runs_on, allocator)), target
    from autotune.backends.estimate.backend import EstimateBackend

    target = target_gpu(gpu, gpu_memory, local=None, chip=chip)
    return EstimateBackend(target, allocator), target
