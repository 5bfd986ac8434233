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
    MAX_THREADS_PER_MULTIPROCESSOR,
    PRESET_MULTIPROCESSORS,
    GpuSpec,
    context_overhead_override,
    custom_gpu,
    gpu_from_device_properties,
    multiprocessors,
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
    "RTX-3060-12GB",
    "RTX-4060-Ti-16GB",
    "RTX-4070",
    "RTX-4070-Ti-Super",
    "RTX-4080",
    "RTX-4080-Super",
    "RTX-5080",
    "RTX-5070-Ti",
    "RTX-5060-Ti-16GB",
    "A10",
    "A40",
    "L40",
    "H100-PCIe",
    "H100-NVL",
    "GH200-96GB",
    "RTX-PRO-6000",
    "RTX-A4000",
    "RTX-A5000",
    "B300",
    "GB200",
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


@pytest.mark.parametrize("name", ["gtx-1080", "K80", "T5", ""])
def test_unknown_gpu_lists_the_presets(name: str) -> None:
    # Nothing close enough to suggest: GTX-1080 is another card than RTX-4080 or RTX-3090.
    with pytest.raises(UnknownGpu) as info:
        resolve_gpu(name)
    assert str(info.value) == f"unknown GPU '{name}': use one of {', '.join(PRESET_NAMES)}"


@pytest.mark.parametrize(
    ("name", "suggestion"),
    [
        # A typo of a preset.
        ("H10", "H100-80GB, H100-PCIe or H100-NVL"),
        ("T-4", "T4"),
        ("t 4", "T4"),
        ("L40-S", "L40S"),
        ("B30", "B300"),
        ("titan x", "TITAN-X-12GB"),
        ("RTX-409", "RTX-4090"),
        # A family sold in several sizes is not a preset (module docstring): each size is suggested.
        ("A100", "A100-40GB or A100-80GB"),
        ("V100", "V100-16GB or V100-32GB"),
        ("h100", "H100-80GB, H100-PCIe or H100-NVL"),
        ("P100", "P100-16GB"),
        ("GH200", "GH200-96GB"),  # the 144 GB GH200 is no preset
        ("3060", "RTX-3060-12GB"),  # nor is the 8 GB 3060
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
        ("RTX-3060-12GB", True, True),
        ("A10", True, True),
        ("RTX-4070", True, True),
        ("H100-PCIe", True, True),
        ("RTX-5080", True, True),
        ("B300", True, True),  # sm103: inside PyTorch's sm80-sm121 range
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
        ("NVIDIA A30", (8, 0), 512),  # the A100's architecture
        ("NVIDIA RTX A2000 12GB", (8, 6), 384),  # Ampere GA10x default
        ("NVIDIA GeForce RTX 4070 SUPER", (8, 9), 512),  # Ada default; not the 4070 or 4070 Ti Super
        ("NVIDIA GeForce RTX 3060 Laptop GPU", (8, 6), 384),  # a laptop 3060 is another chip
        ("NVIDIA GeForce RTX 5060", (12, 0), 768),  # Blackwell default
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
        # Cards rented and owned in 2026 (the figures' sources are in autotune/gpus.py).
        ("RTX-3060-12GB", "11.75", (8, 6), 384),
        ("RTX-4060-Ti-16GB", "15.56", (8, 9), 512),  # derived from nvidia-smi's 16380 MiB
        ("RTX-4070", "11.59", (8, 9), 512),  # a device query's 11874 MiB, rounded down
        ("RTX-4070-Ti-Super", "15.56", (8, 9), 512),  # get_device_properties: 15934 MiB
        ("RTX-4080", "15.67", (8, 9), 512),  # get_device_properties: 16049 MiB
        ("RTX-4080-Super", "15.60", (8, 9), 512),
        ("RTX-5080", "15.47", (12, 0), 768),
        ("RTX-5070-Ti", "15.44", (12, 0), 768),  # derived: the 5060 Ti's, same nvidia-smi total
        ("RTX-5060-Ti-16GB", "15.44", (12, 0), 768),
        ("A10", "21.99", (8, 6), 384),
        ("A40", "44.35", (8, 6), 384),
        ("L40", "44.40", (8, 9), 512),
        ("H100-PCIe", "79.11", (9, 0), 768),
        ("H100-NVL", "93.00", (9, 0), 768),
        ("GH200-96GB", "94.50", (9, 0), 768),
        ("RTX-PRO-6000", "94.97", (12, 0), 768),
        ("RTX-A4000", "15.61", (8, 6), 384),
        ("RTX-A5000", "23.55", (8, 6), 384),
        ("B300", "267.69", (10, 3), 768),
        ("GB200", "184.31", (10, 0), 768),
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
    [
        ("H200", 143771),
        ("B200", 183359),
        ("L40S", 46068),
        ("RTX-6000-Ada", 46068),
        ("RTX-4060-Ti-16GB", 16380),
        ("RTX-4070", 12282),
        ("RTX-4070-Ti-Super", 16376),
        ("RTX-5080", 16303),
        ("RTX-5070-Ti", 16302),
        ("RTX-5060-Ti-16GB", 16303),
        ("A10", 23028),
        ("RTX-PRO-6000", 97887),
        ("RTX-A5000", 24564),
    ],
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
        ("B300", 33 * MIB),  # Blackwell Ultra (sm103)
        ("GB200", 33 * MIB),
        ("RTX-PRO-6000", 33 * MIB),
        ("RTX-5080", 33 * MIB),
        ("H100-PCIe", 33 * MIB),
        ("GH200-96GB", 33 * MIB),
        ("RTX-4080", 8_519_680 + MIB),
        ("A10", 8_519_680 + MIB),
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
        ("3060-12GB", "RTX-3060-12GB"),
        ("rtx 4060 ti 16gb", "RTX-4060-Ti-16GB"),
        ("5060 Ti 16GB", "RTX-5060-Ti-16GB"),
        ("4070", "RTX-4070"),
        ("GeForce RTX 4070 Ti Super", "RTX-4070-Ti-Super"),
        ("rtx4080", "RTX-4080"),
        ("4080 super", "RTX-4080-Super"),
        ("5080", "RTX-5080"),
        ("5070 Ti", "RTX-5070-Ti"),
        ("NVIDIA A10", "A10"),
        ("nvidia a40", "A40"),
        ("NVIDIA L40", "L40"),
        ("NVIDIA H100 PCIe", "H100-PCIe"),
        ("NVIDIA H100 NVL", "H100-NVL"),
        ("NVIDIA GH200 480GB", "GH200-96GB"),
        ("RTX PRO 6000 Blackwell", "RTX-PRO-6000"),
        ("A4000", "RTX-A4000"),
        ("RTX A5000", "RTX-A5000"),
        ("NVIDIA B300", "B300"),
        ("nvidia gb200", "GB200"),
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
        ("NVIDIA GeForce RTX 3060", 11.75, (8, 6), "RTX-3060-12GB"),
        ("NVIDIA GeForce RTX 3060", 7.75, (8, 6), "RTX-3060-12GB"),  # the 8 GB 3060: the same chip
        ("NVIDIA GeForce RTX 4060 Ti", 15.56, (8, 9), "RTX-4060-Ti-16GB"),
        ("NVIDIA GeForce RTX 4070", 11.59, (8, 9), "RTX-4070"),
        ("NVIDIA GeForce RTX 4070 Ti SUPER", 15.56, (8, 9), "RTX-4070-Ti-Super"),
        ("NVIDIA GeForce RTX 4080", 15.67, (8, 9), "RTX-4080"),
        ("NVIDIA GeForce RTX 4080 SUPER", 15.60, (8, 9), "RTX-4080-Super"),
        ("NVIDIA GeForce RTX 5080", 15.47, (12, 0), "RTX-5080"),
        ("NVIDIA GeForce RTX 5070 Ti", 15.44, (12, 0), "RTX-5070-Ti"),
        ("NVIDIA GeForce RTX 5060 Ti", 15.44, (12, 0), "RTX-5060-Ti-16GB"),
        ("NVIDIA A10", 21.99, (8, 6), "A10"),
        ("NVIDIA A40", 44.35, (8, 6), "A40"),
        ("NVIDIA L40", 44.40, (8, 9), "L40"),
        ("NVIDIA H100 PCIe", 79.11, (9, 0), "H100-PCIe"),
        ("NVIDIA H100 NVL", 93.00, (9, 0), "H100-NVL"),
        ("NVIDIA GH200 480GB", 94.50, (9, 0), "GH200-96GB"),
        ("NVIDIA RTX PRO 6000 Blackwell Server Edition", 94.97, (12, 0), "RTX-PRO-6000"),
        ("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", 94.97, (12, 0), "RTX-PRO-6000"),
        ("NVIDIA RTX A4000", 15.61, (8, 6), "RTX-A4000"),
        ("NVIDIA RTX A5000", 23.55, (8, 6), "RTX-A5000"),
        ("NVIDIA B300 SXM6 AC", 267.69, (10, 3), "B300"),
        ("NVIDIA GB200", 184.31, (10, 0), "GB200"),
    ],
)
def test_current_local_devices_match_their_presets(
    device_name: str, total_gib: float, cc: tuple[int, int], preset: str
) -> None:
    spec = gpu_from_device_properties(device_name, int(total_gib * GIB), *cc)
    assert spec.context_overhead_bytes == GPU_PRESETS[preset].context_overhead_bytes
    assert spec.compute_capability == cc
    assert multiprocessors(spec) == multiprocessors(GPU_PRESETS[preset])  # the preset's chip


@pytest.mark.parametrize(
    ("name", "chip"),
    [
        # NVIDIA data sheets and whitepapers (CUDA cores / 128); B300 and GB200 as measured.
        ("RTX-3060-12GB", (28, 1536)),
        ("RTX-4060-Ti-16GB", (34, 1536)),
        ("RTX-4070", (46, 1536)),
        ("RTX-4070-Ti-Super", (66, 1536)),
        ("RTX-4080", (76, 1536)),
        ("RTX-4080-Super", (80, 1536)),
        ("RTX-5080", (84, 1536)),
        ("RTX-5070-Ti", (70, 1536)),
        ("RTX-5060-Ti-16GB", (36, 1536)),
        ("A10", (72, 1536)),
        ("A40", (84, 1536)),
        ("L40", (142, 1536)),
        ("H100-PCIe", (114, 2048)),
        ("H100-NVL", (132, 2048)),
        ("GH200-96GB", (132, 2048)),
        ("RTX-PRO-6000", (188, 1536)),
        ("RTX-A4000", (48, 1536)),
        ("RTX-A5000", (64, 1536)),
        ("B300", (148, 2048)),
        ("GB200", (152, 2048)),
    ],
)
def test_current_cards_know_their_multiprocessors(name: str, chip: tuple[int, int]) -> None:
    assert multiprocessors(GPU_PRESETS[name]) == chip


@pytest.mark.parametrize("name", PRESET_NAMES)
def test_every_preset_has_a_multiprocessor_count_and_threads_for_its_architecture(name: str) -> None:
    spec = GPU_PRESETS[name]
    assert PRESET_MULTIPROCESSORS[name] > 0
    assert spec.compute_capability in MAX_THREADS_PER_MULTIPROCESSOR
