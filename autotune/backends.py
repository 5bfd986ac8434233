"""Choosing a probe backend and the target GPU for it.

``auto`` is ``cuda`` on a machine with a CUDA GPU, else ``estimate``. The target GPU is
``--gpu NAME`` or ``--gpu-memory SIZE`` when given, else the local GPU (cuda), else a
16 GB-class card (gpus.DEFAULT_GPU_NAME).
"""

from __future__ import annotations

from autotune.errors import BackendUnavailable, InvalidInput
from autotune.gpus import (
    DEFAULT_GPU_NAME,
    GpuSpec,
    context_overhead_override,
    custom_gpu,
    resolve_gpu,
    with_context_overhead,
)
from autotune.tuner import Backend
from autotune.units import parse_bytes

BACKENDS = ("auto", "cuda", "estimate")


def cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def target_gpu(gpu: str | None, gpu_memory: str | int | None, *, local: GpuSpec | None) -> GpuSpec:
    """The card the table is for; the CUDA context overhead honours AUTOTUNE_CONTEXT_OVERHEAD."""
    if gpu is not None and gpu_memory is not None:
        raise InvalidInput("give either --gpu or --gpu-memory, not both")
    if gpu is not None:
        spec = resolve_gpu(gpu)
    elif gpu_memory is not None:
        spec = custom_gpu(parse_bytes(gpu_memory))
    else:
        spec = local if local is not None else resolve_gpu(DEFAULT_GPU_NAME)
    override = context_overhead_override()
    return with_context_overhead(spec, override) if override is not None else spec


def make_backend(
    name: str, gpu: str | None = None, gpu_memory: str | int | None = None
) -> tuple[Backend, GpuSpec]:
    """The backend called ``name`` and the target GPU it estimates or measures for."""
    if name not in BACKENDS:
        raise InvalidInput(f"unknown backend {name!r}: allowed are {', '.join(BACKENDS)}")
    use_cuda = name == "cuda" or (name == "auto" and cuda_available())
    if use_cuda:
        if not cuda_available():
            raise BackendUnavailable(
                "backend 'cuda' needs a CUDA GPU and a CUDA build of torch; this machine has "
                "none: use --backend estimate (or auto)"
            )
        from autotune.cuda import CudaBackend, local_gpu

        local = local_gpu()
        target = target_gpu(gpu, gpu_memory, local=local)
        if target.total_memory_bytes > local.total_memory_bytes:
            raise InvalidInput(
                f"target {target.name} has more memory than the local {local.name}: "
                "the cuda backend can only simulate a smaller card; use --backend estimate"
            )
        return CudaBackend(target), target
    from autotune.estimate import EstimateBackend

    target = target_gpu(gpu, gpu_memory, local=None)
    return EstimateBackend(target), target
