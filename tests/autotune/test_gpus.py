"""GPU presets, their lookup, custom sizes, overrides and local devices."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from autotune.defaults import DEFAULT_GPU_NAME
from autotune.errors import InvalidInput, UnknownGpu
from autotune.gpus import (
    CONTEXT_OVERHEAD_ENV,
    CUBLAS_WORKSPACE_DEFAULT_BYTES,
    CUBLAS_WORKSPACE_HOPPER_BYTES,
    CUBLASLT_WORKSPACE_BYTES,
    DEFAULT_CONTEXT_OVERHEAD_BYTES,
    GPU_PRESETS,
    GpuSpec,
    context_overhead_override,
    custom_gpu,
    gpu_from_device_properties,
    resolve_gpu,
    with_context_overhead,
)
from autotune.units import GIB, MIB, gib_to_bytes

PRESET_NAMES = [
    "T4",
    "V100-16GB",
    "V100-32GB",
    "P100-16GB",
    "A10G",
    "L4",
    "A100-40GB",
    "A100-80GB",
    "H100-80GB",
    "RTX-3090",
    "RTX-4090",
    "TITAN-X-12GB",
    "H200",
    "B200",
    "L40S",
    "RTX-A6000",
    "RTX-6000-Ada",
    "RTX-5090",
]


def test_the_presets_are_exactly_the_documented_cards() -> None:
    assert sorted(GPU_PRESETS) == sorted(PRESET_NAMES)


@pytest.mark.parametrize("name", PRESET_NAMES)
def test_every_preset_resolves_case_insensitively(name: str) -> None:
    spec = GPU_PRESETS[name]
    assert spec.name == name
    assert resolve_gpu(name) is spec
    assert resolve_gpu(name.lower()) is spec
    assert resolve_gpu(f"  {name.upper()} ") is spec
    assert resolve_gpu(name.replace("-", " ")) is spec
    assert resolve_gpu(name.replace("-", "_").lower()) is spec


@pytest.mark.parametrize(
    ("alias", "preset"),
    [
        ("Tesla T4", "T4"),
        ("rtx4090", "RTX-4090"),
        ("RTX 3090", "RTX-3090"),
        ("4090", "RTX-4090"),
    ],
)
def test_unambiguous_aliases(alias: str, preset: str) -> None:
    assert resolve_gpu(alias).name == preset


@pytest.mark.parametrize("name", ["rtx-2080", "K80", "T5", ""])
def test_unknown_gpu_lists_the_presets(name: str) -> None:
    # Nothing close enough to suggest: RTX-2080 is another card than RTX-3090 (ratio 0.71).
    with pytest.raises(UnknownGpu) as info:
        resolve_gpu(name)
    assert str(info.value) == f"unknown GPU '{name}': use one of {', '.join(PRESET_NAMES)}"


@pytest.mark.parametrize(
    ("name", "suggestion"),
    [
        # A typo of a preset.
        ("H10", "H100-80GB"),
        ("T-4", "T4"),
        ("t 4", "T4"),
        ("L40", "L40S"),
        ("titan x", "TITAN-X-12GB"),
        ("RTX-409", "RTX-4090"),
        # A family sold in several sizes is not a preset (module docstring): each size is suggested.
        ("A100", "A100-40GB or A100-80GB"),
        ("V100", "V100-16GB or V100-32GB"),
        ("h100", "H100-80GB"),
        ("P100", "P100-16GB"),
    ],
)
def test_a_mistyped_or_ambiguous_gpu_names_the_close_presets(name: str, suggestion: str) -> None:
    with pytest.raises(UnknownGpu) as info:
        resolve_gpu(name)
    assert str(info.value) == (
        f"unknown GPU '{name}': did you mean {suggestion}? Presets: {', '.join(PRESET_NAMES)}"
    )


def test_default_gpu_is_the_t4() -> None:
    assert resolve_gpu(DEFAULT_GPU_NAME).name == "T4"


@pytest.mark.parametrize(
    ("name", "capacity_gib", "compute_capability"),
    [
        ("T4", "14.56", (7, 5)),
        ("V100-16GB", "15.78", (7, 0)),
        ("V100-32GB", "31.75", (7, 0)),
        ("P100-16GB", "15.90", (6, 0)),
        ("A10G", "22.06", (8, 6)),
        ("L4", "22.05", (8, 9)),
        ("A100-40GB", "39.49", (8, 0)),
        ("A100-80GB", "79.15", (8, 0)),
        ("H100-80GB", "79.11", (9, 0)),
        ("RTX-3090", "23.69", (8, 6)),
        ("RTX-4090", "23.65", (8, 9)),
        ("TITAN-X-12GB", "11.90", (6, 1)),
    ],
)
def test_preset_capacity_is_the_oom_message_figure(
    name: str, capacity_gib: str, compute_capability: tuple[int, int]
) -> None:
    spec = GPU_PRESETS[name]
    assert spec.total_memory_bytes == gib_to_bytes(capacity_gib)
    assert spec.total_memory_bytes % MIB == 0
    assert f"{spec.total_memory_bytes / GIB:.2f}" == capacity_gib
    assert spec.compute_capability == compute_capability


def test_t4_capacity_in_bytes() -> None:
    assert GPU_PRESETS["T4"].total_memory_bytes == 14909 * MIB  # 14.56 GiB, to the MiB


@pytest.mark.parametrize("name", PRESET_NAMES)
def test_context_overhead_is_a_few_hundred_mib_and_leaves_the_rest(name: str) -> None:
    spec = GPU_PRESETS[name]
    assert 256 * MIB <= spec.context_overhead_bytes <= 768 * MIB
    assert spec.available_bytes == spec.total_memory_bytes - spec.context_overhead_bytes


@pytest.mark.parametrize(
    ("name", "bf16", "flash"),
    [
        ("T4", False, False),
        ("V100-16GB", False, False),
        ("P100-16GB", False, False),
        ("TITAN-X-12GB", False, False),
        ("A10G", True, True),
        ("L4", True, True),
        ("A100-40GB", True, True),
        ("H100-80GB", True, True),
        ("RTX-4090", True, True),
    ],
)
def test_bf16_and_flash_attention_need_sm80(name: str, bf16: bool, flash: bool) -> None:
    spec = GPU_PRESETS[name]
    assert spec.supports_bf16 is bf16
    assert spec.supports_flash_attention is flash


def test_cublas_workspace_follows_pytorch_defaults() -> None:
    assert CUBLAS_WORKSPACE_DEFAULT_BYTES == 8_519_680  # ":4096:2:16:8"
    assert CUBLAS_WORKSPACE_HOPPER_BYTES == 32 * MIB  # ":4096:8"
    assert CUBLASLT_WORKSPACE_BYTES == MIB
    assert GPU_PRESETS["T4"].cublas_workspace_bytes == 8_519_680 + MIB
    assert GPU_PRESETS["A100-80GB"].cublas_workspace_bytes == 8_519_680 + MIB
    assert GPU_PRESETS["H100-80GB"].cublas_workspace_bytes == 33 * MIB


def test_custom_gpu_has_the_default_overhead_and_no_architecture() -> None:
    spec = custom_gpu(12 * GIB)
    assert spec == GpuSpec("custom 12 GiB", 12 * GIB, 512 * MIB, None)
    assert spec.context_overhead_bytes == DEFAULT_CONTEXT_OVERHEAD_BYTES
    assert not spec.supports_bf16
    assert not spec.supports_flash_attention
    assert spec.cublas_workspace_bytes == 33 * MIB  # unknown architecture: the larger size


@pytest.mark.parametrize("size", [0, -1, 256 * MIB, 512 * MIB])
def test_custom_gpu_must_be_bigger_than_its_context(size: int) -> None:
    with pytest.raises(InvalidInput):
        custom_gpu(size)


def test_specs_are_frozen() -> None:
    with pytest.raises(AttributeError):
        GPU_PRESETS["T4"].total_memory_bytes = 1  # type: ignore[misc]


def test_with_context_overhead_replaces_only_the_overhead() -> None:
    t4 = GPU_PRESETS["T4"]
    measured = with_context_overhead(t4, 300 * MIB)
    assert measured.context_overhead_bytes == 300 * MIB
    assert measured.total_memory_bytes == t4.total_memory_bytes
    assert measured.name == t4.name
    assert t4.context_overhead_bytes == 256 * MIB  # the preset is untouched


@pytest.mark.parametrize("nbytes", [-1, 15 * GIB, True])
def test_with_context_overhead_rejects_impossible_sizes(nbytes: int) -> None:
    with pytest.raises(InvalidInput):
        with_context_overhead(GPU_PRESETS["T4"], nbytes)


def test_context_overhead_override_reads_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(CONTEXT_OVERHEAD_ENV, raising=False)
    assert context_overhead_override() is None
    monkeypatch.setenv(CONTEXT_OVERHEAD_ENV, "")
    assert context_overhead_override() is None
    monkeypatch.setenv(CONTEXT_OVERHEAD_ENV, "450MiB")
    assert context_overhead_override() == 450 * MIB


def test_a_bad_context_overhead_override_names_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(CONTEXT_OVERHEAD_ENV, "lots")
    with pytest.raises(InvalidInput, match=f"^{CONTEXT_OVERHEAD_ENV}: invalid memory size 'lots'"):
        context_overhead_override()


def test_a_context_overhead_override_needs_its_unit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CONTEXT_OVERHEAD_ENV, "600")  # once 600 bytes
    with pytest.raises(InvalidInput) as info:
        context_overhead_override()
    assert str(info.value).startswith(
        f"{CONTEXT_OVERHEAD_ENV}: invalid memory size '600': a size needs a unit, e.g. 600GiB or "
        "600MiB (600B for bytes); units: KiB, MiB, GiB, TiB,"
    )
    monkeypatch.setenv(CONTEXT_OVERHEAD_ENV, "629145600B")
    assert context_overhead_override() == 600 * MIB


@pytest.mark.parametrize(
    ("device_name", "total_gib", "cc", "preset"),
    [
        ("Tesla T4", 14.74, (7, 5), "T4"),
        ("NVIDIA A100-SXM4-40GB", 39.49, (8, 0), "A100-40GB"),
        ("NVIDIA A100 80GB PCIe", 79.15, (8, 0), "A100-80GB"),
        ("Tesla V100-SXM2-32GB", 31.75, (7, 0), "V100-32GB"),
        ("Tesla V100-PCIE-16GB", 15.77, (7, 0), "V100-16GB"),
        ("Tesla P100-PCIE-16GB", 15.90, (6, 0), "P100-16GB"),
        ("NVIDIA A10G", 22.06, (8, 6), "A10G"),
        ("NVIDIA L4", 22.05, (8, 9), "L4"),
        ("NVIDIA H100 80GB HBM3", 79.11, (9, 0), "H100-80GB"),
        ("NVIDIA GeForce RTX 3090", 23.69, (8, 6), "RTX-3090"),
        ("NVIDIA GeForce RTX 4090", 23.65, (8, 9), "RTX-4090"),
        ("NVIDIA TITAN X (Pascal)", 11.90, (6, 1), "TITAN-X-12GB"),
    ],
)
def test_local_device_takes_the_matching_presets_overhead(
    device_name: str, total_gib: float, cc: tuple[int, int], preset: str
) -> None:
    total = int(total_gib * GIB)
    spec = gpu_from_device_properties(device_name, total, *cc)
    assert spec.name == device_name
    assert spec.total_memory_bytes == total  # the device's own figure, not the preset's
    assert spec.compute_capability == cc
    assert spec.context_overhead_bytes == GPU_PRESETS[preset].context_overhead_bytes


@pytest.mark.parametrize(
    ("device_name", "cc", "overhead_mib"),
    [
        ("NVIDIA GeForce RTX 2080 Ti", (7, 5), 256),  # Turing default
        ("NVIDIA L40", (8, 9), 512),  # Ada default; the L40 is neither the L4 nor the L40S
        ("NVIDIA A10", (8, 6), 384),  # the A10 is not the A10G
        ("NVIDIA RTX PRO 6000 Blackwell Server Edition", (12, 0), 768),  # Blackwell default
        ("NVIDIA Jetson AGX Orin", (8, 7), 512),  # unlisted architecture
    ],
)
def test_local_device_without_preset_takes_its_architectures_overhead(
    device_name: str, cc: tuple[int, int], overhead_mib: int
) -> None:
    spec = gpu_from_device_properties(device_name, 20 * GIB, *cc)
    assert spec.context_overhead_bytes == overhead_mib * MIB


def test_units_and_gpus_do_not_import_torch() -> None:
    code = "import sys, autotune.gpus, autotune.units; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[2])


# --- presets of current cards -------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "capacity_gib", "compute_capability", "overhead_mib"),
    [
        ("H200", "139.80", (9, 0), 768),
        ("B200", "178.35", (10, 0), 768),
        ("L40S", "44.42", (8, 9), 512),
        ("RTX-A6000", "47.54", (8, 6), 384),
        ("RTX-6000-Ada", "44.43", (8, 9), 512),
        ("RTX-5090", "31.36", (12, 0), 768),
    ],
)
def test_current_cards_carry_their_oom_capacity_and_architecture(
    name: str, capacity_gib: str, compute_capability: tuple[int, int], overhead_mib: int
) -> None:
    spec = GPU_PRESETS[name]
    assert spec.total_memory_bytes == gib_to_bytes(capacity_gib)
    assert f"{spec.total_memory_bytes / GIB:.2f}" == capacity_gib
    assert spec.compute_capability == compute_capability
    assert spec.context_overhead_bytes == overhead_mib * MIB
    assert spec.supports_bf16
    assert spec.supports_flash_attention  # sm80 to sm121 in PyTorch's sdp_utils.cpp


@pytest.mark.parametrize(
    ("name", "nvidia_smi_mib"),
    [("H200", 143771), ("B200", 183359), ("L40S", 46068), ("RTX-6000-Ada", 46068)],
)
def test_capacity_is_below_the_nvidia_smi_total(name: str, nvidia_smi_mib: int) -> None:
    # PyTorch's total capacity is what the driver leaves of nvidia-smi's total: a few
    # hundred MiB less, never more.
    total = GPU_PRESETS[name].total_memory_bytes
    assert nvidia_smi_mib * MIB - 1 * GIB < total < nvidia_smi_mib * MIB


@pytest.mark.parametrize(
    ("name", "workspace_bytes"),
    [
        ("H200", 33 * MIB),  # Hopper: ":4096:8" plus cuBLASLt's 1 MiB
        ("B200", 33 * MIB),  # Blackwell (major 10): PyTorch gives it Hopper's 32 MiB
        ("RTX-5090", 33 * MIB),  # Blackwell (major 12)
        ("L40S", 8_519_680 + MIB),  # Ada is major 8: the ":4096:2:16:8" default
        ("RTX-6000-Ada", 8_519_680 + MIB),
        ("RTX-A6000", 8_519_680 + MIB),
    ],
)
def test_cublas_workspace_of_current_cards(name: str, workspace_bytes: int) -> None:
    assert GPU_PRESETS[name].cublas_workspace_bytes == workspace_bytes


@pytest.mark.parametrize(
    ("alias", "preset"),
    [
        ("nvidia h200", "H200"),
        ("B200", "B200"),
        ("l40s", "L40S"),
        ("A6000", "RTX-A6000"),
        ("RTX A6000", "RTX-A6000"),
        ("rtx 6000 ada", "RTX-6000-Ada"),
        ("5090", "RTX-5090"),
        ("GeForce RTX 5090", "RTX-5090"),
    ],
)
def test_current_cards_resolve_by_their_common_names(alias: str, preset: str) -> None:
    assert resolve_gpu(alias).name == preset


@pytest.mark.parametrize(
    ("device_name", "total_gib", "cc", "preset"),
    [
        ("NVIDIA H200", 139.80, (9, 0), "H200"),
        ("NVIDIA B200", 178.35, (10, 0), "B200"),
        ("NVIDIA L40S", 44.42, (8, 9), "L40S"),
        ("NVIDIA RTX A6000", 47.54, (8, 6), "RTX-A6000"),
        ("NVIDIA RTX 6000 Ada Generation", 47.50, (8, 9), "RTX-6000-Ada"),
        ("NVIDIA GeForce RTX 5090", 31.37, (12, 0), "RTX-5090"),
    ],
)
def test_current_local_devices_match_their_presets(
    device_name: str, total_gib: float, cc: tuple[int, int], preset: str
) -> None:
    spec = gpu_from_device_properties(device_name, int(total_gib * GIB), *cc)
    assert spec.context_overhead_bytes == GPU_PRESETS[preset].context_overhead_bytes
    assert spec.compute_capability == cc
