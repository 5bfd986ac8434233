"""The local CUDA device, read without taking its memory: what it is, its driver, what is free.

Nothing here creates a CUDA context in this process (device properties and /proc only), so the
card stays whole for the probe workers.
"""

from __future__ import annotations

import re
from pathlib import Path

from autotune.errors import BackendUnavailable, InvalidInput
from autotune.gpus import GpuSpec, gpu_from_device_properties
from autotune.units import GIB, format_bytes

# More memory than a stray CUDA context (0.3-0.6 GiB, see gpus.py) held by other processes is
# someone's tensors: it may grow while we probe, the "intermittent" OOMs users report.
OTHER_PROCESSES_WARN_BYTES = 1 * GIB


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def local_gpu(device_index: int = 0) -> GpuSpec:
    """The local CUDA device as a GpuSpec; BackendUnavailable without one.

    get_device_properties needs no CUDA context, so this process still leaves the whole card
    to its workers.
    """
    import torch

    if not torch.cuda.is_available():
        raise BackendUnavailable(
            f"the cuda backend needs a CUDA GPU: torch {torch.__version__} sees none "
            f"(built for CUDA {torch.version.cuda}); use backend 'estimate'"
        )
    count = torch.cuda.device_count()
    if not 0 <= device_index < count:
        raise InvalidInput(f"CUDA device {device_index} does not exist: devices are 0 to {count - 1}")
    props = torch.cuda.get_device_properties(device_index)
    sms = getattr(props, "multi_processor_count", None)
    threads = getattr(props, "max_threads_per_multi_processor", None)  # absent from older torch
    return gpu_from_device_properties(props.name, props.total_memory, props.major, props.minor,
                                      (sms, threads) if sms and threads else None)


def check_free_memory(
    free_bytes: int, total_bytes: int, budget_bytes: int, *, own_context_bytes: int = 0
) -> str | None:
    """Refuse a budget that is not free on the GPU; a warning when other processes hold much.

    ``free_bytes`` is measured by the worker once its own CUDA context is up (about
    ``own_context_bytes``), before it loads the model. Raises BackendUnavailable naming the
    figures; returns the warning text, or None.
    """
    others = max(0, total_bytes - free_bytes - own_context_bytes)
    figures = (
        f"{format_bytes(free_bytes)} of {format_bytes(total_bytes)} free, "
        f"about {format_bytes(others)} held by other processes"
    )
    if budget_bytes > total_bytes:
        raise BackendUnavailable(
            f"the budget of {format_bytes(budget_bytes)} exceeds the GPU's "
            f"{format_bytes(total_bytes)}: the cuda backend can simulate a smaller card only"
        )
    if budget_bytes > free_bytes:
        raise BackendUnavailable(
            f"the budget of {format_bytes(budget_bytes)} does not fit in the GPU's free memory "
            f"({figures}): stop those processes (see nvidia-smi) or choose a smaller GPU"
        )
    if others > OTHER_PROCESSES_WARN_BYTES:
        return (
            f"other processes hold GPU memory ({figures}); the budget of "
            f"{format_bytes(budget_bytes)} fits now, but if they allocate more while autotune "
            "probes, a probe may run out of memory that the training step alone would not"
        )
    return None


def parse_driver_version(text: str) -> str | None:
    """The version in /proc/driver/nvidia/version ("... Kernel Module  550.54.15  ...")."""
    match = re.search(r"Kernel Module\b.*?\s(\d+\.\d+(?:\.\d+)?)\s", text)
    return match.group(1) if match else None


def driver_version() -> str | None:
    """The NVIDIA driver's version on Linux, read without NVML and without a CUDA context."""
    try:
        return parse_driver_version(Path("/proc/driver/nvidia/version").read_text())
    except OSError:
        return None
