"""GPU presets: how much memory a training process can use on a card.

A `GpuSpec` carries the capacity PyTorch reports for a card
(`torch.cuda.get_device_properties(i).total_memory`, the "total capacity" of CUDA
out-of-memory messages) and the memory that a training process spends outside
PyTorch's caching allocator (the CUDA context and library handles). What the
caching allocator can hand out is the difference, `available_bytes`.

The context overhead is an estimate per card. To use a measured figure instead, set
``AUTOTUNE_CONTEXT_OVERHEAD`` (a size such as ``450MiB``, read by
`context_overhead_override`) and apply it with `with_context_overhead`, or build a
spec with ``dataclasses.replace(spec, context_overhead_bytes=...)``.

No torch here: the API server imports this module and must start fast.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from autotune.errors import InvalidInput, UnknownGpu
from autotune.spelling import close_matches, did_you_mean
from autotune.units import KIB, MIB, format_bytes, gib_to_bytes, parse_bytes

CONTEXT_OVERHEAD_ENV = "AUTOTUNE_CONTEXT_OVERHEAD"
# PyTorch's switch that stops SDPA preferring cuDNN on Hopper and Blackwell (sdp_utils.cpp,
# check_prefer_cudnn_attention); the estimate follows it (backends/estimate/attention.py).
CUDNN_DEPRIORITIZED_ENV = "TORCH_CUDNN_SDPA_DEPRIORITIZED"

# --- cuBLAS workspaces --------------------------------------------------------------
# PyTorch gives each (cuBLAS handle, stream) pair a workspace from its caching
# allocator; pytorch/pytorch aten/src/ATen/cuda/CublasHandlePool.cpp,
# parseChosenWorkspaceSize: "/* :4096:2:16:8 default, 32MiB for Hopper */", i.e. the
# default CUBLAS_WORKSPACE_CONFIG is 2 x 4096 KiB + 8 x 16 KiB = 8,519,680 bytes (the
# 8519680 bytes left allocated after one nn.Linear call in pytorch/pytorch#95668), and
# ":4096:8" = 32 MiB on sm90. Recent PyTorch uses 32 MiB on Hopper and Blackwell ("32MiB for
# Hopper and Blackwell": majors 9, 10, 11 and 12; pytorch/pytorch#175344), so we take 32 MiB
# for every major >= 9 (older releases give sm100/sm120 the default: 32 MiB errs safe). Ada
# (sm89, major 8: L4, L40S, RTX 4090, RTX 6000 Ada) gets the default.
CUBLAS_WORKSPACE_DEFAULT_BYTES = 2 * 4096 * KIB + 8 * 16 * KIB
CUBLAS_WORKSPACE_HOPPER_BYTES = 8 * 4096 * KIB
# cuBLASLt (addmm with a bias, i.e. nn.Linear) gets a workspace of its own unless the
# two are unified: same file, parseCUDABlasLtWorkspaceSize, CUBLASLT_WORKSPACE_SIZE
# "default size in KiB according to #73328" = 1024 KiB. Newer releases unify it with
# the cuBLAS one by default; counting it anyway errs by 1 MiB on the safe side. Measured on an
# H100 with torch 2.11 (docs/measurements/h100-80gb/records): a BERT step held two 32 MiB cuBLAS
# workspaces and one 1 MiB cuBLASLt workspace; the estimator counts two of each (66 MiB, 1 MiB over).
CUBLASLT_WORKSPACE_BYTES = 1024 * KIB

# --- CUDA context overhead ------------------------------------------------------------
# Memory a training process uses outside the caching allocator: the CUDA context
# (driver state, local memory reserved for every resident thread of every SM, kernel
# images, loaded lazily since CUDA 11.7 and PyTorch 1.13, pytorch/pytorch#86509) plus
# cuBLAS/cuDNN handles and kernels. Published measurements, PyTorch 1.13 to 2.10:
#   pytorch/pytorch#86509: 287,047,680 B in use after one small tensor with lazy
#     loading (666,632,192 B with eager loading);
#   pytorch/pytorch#109888 (ptrblck): "around 400MB if CUDA >= 11.7 is used and lazy
#     module loading enabled";
#   invoke-ai/InvokeAI#9413 (torch 2.7.1+cu128, RTX 3090): a bare context holds 256 MiB;
#   unslothai/unsloth-zoo#1053 (torch 2.10+cu130, RTX 6000 Ada): 426 MiB;
#   OOM messages of training runs (process memory minus PyTorch's allocated and
#     reserved): 130-165 MiB on Colab/Kaggle T4s, 180-250 MiB on L4s.
# Measured here (docs/measurements/h100-80gb/records, 2026-11-23: H100 80GB HBM3, driver
# 580.159.04, torch 2.11.0+cu130): 527 MiB for the bare context, 749 MiB with a model loaded,
# 751 MiB after a BERT-base fp32 step, 767 MiB after an amp step and after a Llama-3.2-1B QLoRA
# bf16 step (device memory in use minus torch.cuda.memory_reserved()): Hopper takes 768 MiB.
# The context grows with SMs x threads per SM, so larger chips get more. The figures
# below round those measurements up, leaving room for kernels loaded on first use;
# they are estimates, not measurements of each card (see the module docstring).
DEFAULT_CONTEXT_OVERHEAD_BYTES = 512 * MIB  # unknown architecture or custom size

# Per compute capability, for a local GPU that matches no preset.
ARCH_CONTEXT_OVERHEAD_BYTES: dict[tuple[int, int], int] = {
    (6, 0): 320 * MIB,  # Pascal P100, 56 SMs
    (6, 1): 320 * MIB,  # Pascal GP10x (TITAN X, GTX 1080 Ti), 28 SMs
    (7, 0): 384 * MIB,  # Volta V100, 80 SMs x 2048 threads
    (7, 5): 256 * MIB,  # Turing; T4 training runs show 130-165 MiB
    (8, 0): 512 * MIB,  # A100, 108 SMs x 2048 threads; ptrblck's ~400 MB plus handles
    (8, 6): 384 * MIB,  # Ampere GA10x; RTX 3090 bare context 256 MiB plus handles
    (8, 9): 512 * MIB,  # Ada; RTX 6000 Ada bare context 426 MiB
    (9, 0): 768 * MIB,  # Hopper, 132 SMs x 2048 threads: 767 MiB measured on an H100 (above)
}
_NEWER_ARCH_CONTEXT_OVERHEAD_BYTES = 768 * MIB  # Blackwell and later: at least Hopper's


@dataclass(frozen=True)
class GpuSpec:
    name: str  # preset name, e.g. "T4", a local device's name, or "custom 12 GiB"
    total_memory_bytes: int  # torch.cuda.get_device_properties(i).total_memory
    context_overhead_bytes: int  # CUDA context, kernel images and library handles
    compute_capability: tuple[int, int] | None  # None for a custom size
    # (multiprocessorCount, maxThreadsPerMultiProcessor) of the chip the step runs on, where the
    # name does not tell it (`multiprocessors`): a local device's own, or the card a smaller
    # budget is simulated on. CUDA's reductions size their buffers by it (estimate/reduce.py).
    multiprocessors: tuple[int, int] | None = None

    @property
    def available_bytes(self) -> int:
        """Bytes left for PyTorch's caching allocator once the context is up."""
        return self.total_memory_bytes - self.context_overhead_bytes

    @property
    def supports_bf16(self) -> bool:
        # bfloat16 tensor-core math arrived with Ampere (sm80).
        return self.compute_capability is not None and self.compute_capability >= (8, 0)

    @property
    def supports_flash_attention(self) -> bool:
        return self.compute_capability is not None and flash_attention_supported(self.compute_capability)

    @property
    def cublas_workspace_bytes(self) -> int:
        """cuBLAS plus cuBLASLt workspace of one handle and stream (see the constants).

        Handles are per thread and backward runs on the autograd engine's device
        thread, so a training step may hold this twice.
        """
        return cublas_workspace_bytes(self.compute_capability)


def flash_attention_supported(compute_capability: tuple[int, int]) -> bool:
    """Whether PyTorch's FlashAttention-2 kernel runs on this architecture: sm80 to sm121
    (aten/src/ATen/native/transformers/cuda/sdp_utils.cpp, check_flash_attention_hardware_support;
    sm90 in older releases)."""
    return (8, 0) <= compute_capability <= (12, 1)


def cublas_workspace_bytes(compute_capability: tuple[int, int] | None) -> int:
    """Default cuBLAS + cuBLASLt workspace for an architecture; the larger if unknown."""
    if compute_capability is None or compute_capability[0] >= 9:
        return CUBLAS_WORKSPACE_HOPPER_BYTES + CUBLASLT_WORKSPACE_BYTES
    return CUBLAS_WORKSPACE_DEFAULT_BYTES + CUBLASLT_WORKSPACE_BYTES


def _preset(name: str, capacity_gib: str, overhead_mib: int, cc: tuple[int, int]) -> GpuSpec:
    return GpuSpec(name, gib_to_bytes(capacity_gib), overhead_mib * MIB, cc)


# Capacities are the "total capacity" of public CUDA OOM messages for each card. The
# driver keeps part of the memory, and newer drivers keep more: where the figure
# changed over time, the recent, smaller one is used (a smaller capacity errs safe).
_PRESETS: tuple[GpuSpec, ...] = (
    # Colab and Kaggle T4s: "total capacity of 14.56 GiB" in 2026 reports (Colab:
    # facebookresearch/tribev2#28; Kaggle 2xT4 notebooks); older drivers reported
    # 14.74 GiB (zai-org/CogVideo#741, 2025), 14.75 GiB (googlecolab/colabtools#3439,
    # 2023) and 14.76 GiB (qunash/stable-diffusion-2-gui#6, 2022).
    _preset("T4", "14.56", 256, (7, 5)),
    # V100 16GB: "15.78 GiB total capacity", e.g. on Colab (googlecolab/colabtools#2001),
    # whose T4 and P100 report 14.76 and 15.90 GiB then.
    _preset("V100-16GB", "15.78", 384, (7, 0)),
    # "31.75 GiB total capacity" on V100-32GB clusters (Princeton Traverse notes).
    _preset("V100-32GB", "31.75", 384, (7, 0)),
    # Colab's and Kaggle's P100: "15.90 GiB total capacity" (googlecolab/colabtools#1761).
    _preset("P100-16GB", "15.90", 320, (6, 0)),
    # AWS g5 A10G: "22.06 GiB" in recent g5.2xlarge logs; 22.19 GiB in 2023
    # (ml.g5.12xlarge in a vLLM issue, MPT-30B).
    _preset("A10G", "22.06", 384, (8, 6)),
    # vLLM's CI L4s: "total capacity of 22.05 GiB" (spec_decode test failure, 2025-06).
    _preset("L4", "22.05", 384, (8, 9)),
    # A100 40GB: "total capacity of 39.49 GiB" in recent reports from 40 GB cards;
    # 39.59 GiB in 2021-23 ones (Colab's A100) and 39.38-39.39 GiB in a few others.
    _preset("A100-40GB", "39.49", 512, (8, 0)),
    # A100 80GB: "79.15 GiB total capacity" (79.25 GiB on some drivers).
    _preset("A100-80GB", "79.15", 512, (8, 0)),
    # H100 80GB HBM3: "total capacity of 79.11 GiB" (vLLM on 8x H100 80GB, 2025).
    _preset("H100-80GB", "79.11", 768, (9, 0)),  # 767 MiB measured outside the allocator
    # GeForce RTX 3090: "23.69 GiB total capacity" (nvidia-smi shows 24268 MiB).
    _preset("RTX-3090", "23.69", 384, (8, 6)),
    # GeForce RTX 4090: "total capacity of 23.65 GiB" (23.68 GiB in zai-org/CogVideo#36).
    _preset("RTX-4090", "23.65", 512, (8, 9)),
    # The google-research/bert README's 12 GB Titan X (Pascal): "11.90 GiB total
    # capacity", as reported for the same-sized TITAN Xp.
    _preset("TITAN-X-12GB", "11.90", 320, (6, 1)),
    # H200 141 GB HBM3e (nvidia-smi: 143771MiB): "total capacity of 139.80 GiB" in 8x H200
    # training runs (2025-26); 139.81 GiB in a few others.
    _preset("H200", "139.80", 768, (9, 0)),  # Hopper, 132 SMs: the H100's measured figure
    # B200 (nvidia-smi: 183359MiB): "total capacity of 178.35 GiB" (vLLM, NeMo-RL and
    # Megatron runs on 8x B200, 2025-26; 178.36 GiB in a few). 148 SMs: Hopper's overhead
    # at least, as for every newer architecture.
    _preset("B200", "178.35", 768, (10, 0)),
    # L40S 48 GB GDDR6, ECC on by default (nvidia-smi: 46068MiB): "total capacity of
    # 44.42 GiB" on 8x L40S (stepfun-ai/Step-Video-T2V#8, 2025).
    _preset("L40S", "44.42", 512, (8, 9)),
    # RTX A6000 48 GB: "total capacity of 47.54 GiB" on 2x A6000 (a 2025 fine-tuning
    # benchmark); with ECC turned on it would be about 3 GiB less, as on the RTX 6000 Ada.
    _preset("RTX-A6000", "47.54", 384, (8, 6)),
    # RTX 6000 Ada 48 GB with ECC on (nvidia-smi: 46068MiB): "total capacity of 44.43 GiB"
    # (DINGYANB/MTVCrafter#21, 2025). ECC off gives about 47.5 GiB; the smaller errs safe.
    _preset("RTX-6000-Ada", "44.43", 512, (8, 9)),
    # GeForce RTX 5090 32 GB GDDR7: "total capacity of 31.36 GiB"
    # (TrajectoryCrafter/TrajectoryCrafter#20, 2025-04); 31.37 GiB in later reports
    # (Wan-Video/Wan2.1#465).
    _preset("RTX-5090", "31.36", 768, (12, 0)),
    # --- cards rented and owned in 2026 ------------------------------------------------------
    # Where no OOM message names the card, the figure is a printout of the same quantity
    # (torch.cuda.get_device_properties: "total_memory=...MB", which is MiB) or is derived from
    # nvidia-smi's total, as each comment says; a derived figure takes the largest gap seen.
    # GeForce RTX 3060 12 GB: "11.75 GiB total capacity" (Kunhao-Liu/StyleGaussian#12, 2024-11;
    # smy20011/dreambooth-gui#78); 11.76 GiB in TencentARC/PhotoMaker#47. An 8 GB 3060 exists.
    _preset("RTX-3060-12GB", "11.75", 384, (8, 6)),
    # GeForce RTX 4060 Ti 16 GB: no OOM figure found. nvidia-smi shows 16380 MiB (public output,
    # drivers 555 to 595); the largest gap to PyTorch's total on a 16 GB Ada card, the 4070 Ti
    # Super's (16376 vs 15934 MiB), gives 15938 MiB: 15.56 GiB. An 8 GB 4060 Ti exists.
    _preset("RTX-4060-Ti-16GB", "15.56", 512, (8, 9)),
    # GeForce RTX 4070 12 GB (nvidia-smi: 12282MiB, meta-llama/llama#466): a CUDA device query
    # printed "totalmem=11874MiB" (sm_89, 46 SMs): 11.59 GiB, rounded down. The 4070 Ti, with the
    # same 12282 MiB, reports "11.70 GiB total capacity" (Kwai-Kolors/Kolors#11).
    _preset("RTX-4070", "11.59", 512, (8, 9)),
    # GeForce RTX 4070 Ti Super 16 GB (nvidia-smi: 16376MiB): get_device_properties printed
    # total_memory=15934MB (2026) and 15974MB (driver 560.35.03); no OOM figure found.
    _preset("RTX-4070-Ti-Super", "15.56", 512, (8, 9)),
    # GeForce RTX 4080 16 GB: get_device_properties printed total_memory=16049MB (15.67 GiB);
    # no OOM figure found.
    _preset("RTX-4080", "15.67", 512, (8, 9)),
    # GeForce RTX 4080 Super 16 GB: "15.60 GiB total capacity" (shanice-l/UNOPose#4, 2025-07).
    _preset("RTX-4080-Super", "15.60", 512, (8, 9)),
    # GeForce RTX 5080 16 GB GDDR7 (nvidia-smi: 16303MiB): "total capacity of 15.47 GiB" (a
    # vLLM speculative-decoding run on an RTX 5080, 2026).
    _preset("RTX-5080", "15.47", 768, (12, 0)),
    # GeForce RTX 5070 Ti 16 GB GDDR7: no OOM figure found. nvidia-smi shows 16302-16303 MiB, the
    # total of the RTX 5080 and RTX 5060 Ti too: it takes the smaller of theirs, 15.44 GiB.
    _preset("RTX-5070-Ti", "15.44", 768, (12, 0)),
    # GeForce RTX 5060 Ti 16 GB (nvidia-smi: 16303MiB): 15,816 MiB CUDA-visible with driver
    # 595.71.05 (Luce-Org/lucebox#407, 2026-06): 15.44 GiB; earlier drivers gave "total capacity
    # of 15.48 GiB" in OOMs and total_memory=15841MB (15.47 GiB). An 8 GB 5060 Ti exists.
    _preset("RTX-5060-Ti-16GB", "15.44", 768, (12, 0)),
    # A10 24 GB, the data-centre card (nvidia-smi: 23028MiB, modal-labs/modal-client#2797), not
    # AWS's A10G: "total capacty of 21.99 GiB" on a Lambda A10 (zai-org/CogVLM#236, 2023-12).
    _preset("A10", "21.99", 384, (8, 6)),
    # A40 48 GB, ECC on by default: get_device_properties printed total_memory=45416MB (44.35 GiB)
    # for an A40; no OOM figure naming the card found ("total capacity of 44.35 GiB" is common in
    # OOMs of unnamed 48 GB cards, 2025-26).
    _preset("A40", "44.35", 384, (8, 6)),
    # L40 48 GB (the L40S is its own preset): "total capacity of 44.40 GiB" on a single L40
    # (QwenLM/Qwen3-VL#2097 and NVlabs/Eagle#68, 2026-06).
    _preset("L40", "44.40", 512, (8, 9)),
    # H100 PCIe 80 GB HBM2e: get_device_properties printed total_memory=81008MB, 114 SMs: the
    # H100-80GB (SXM) figure, 79.11 GiB; no OOM figure naming the PCIe card found.
    _preset("H100-PCIe", "79.11", 768, (9, 0)),
    # H100 NVL 94 GB: "total capacity of 93.00 GiB" on an H100 NVL at RunPod (ali-vilab/VACE#56,
    # 2025-05); 93.09-93.10 GiB in other H100 NVL runs.
    _preset("H100-NVL", "93.00", 768, (9, 0)),
    # GH200 with 96 GB HBM3 ("NVIDIA GH200 480GB"): "total capacity of 94.50 GiB"
    # (vllm-project/vllm#9630, driver 550.107.02, 2024-10); 94.88 GiB with nvidia-smi showing
    # 97871MiB in Lightning-AI/litgpt#1892. The 144 GB HBM3e GH200 is no preset: no figure found.
    _preset("GH200-96GB", "94.50", 768, (9, 0)),
    # RTX PRO 6000 Blackwell 96 GB (Workstation, Max-Q and Server Edition; nvidia-smi: 97887MiB):
    # "total=94.97 GiB" (antirez/ds4#431, 2026-06), vram=97250MB from get_device_properties on a
    # Server Edition, and "total capacity of 94.97 GiB" in OOMs of sm_120 nodes.
    _preset("RTX-PRO-6000", "94.97", 768, (12, 0)),
    # RTX A4000 16 GB: "total capacity of 15.61 GiB" (DengKaiCQ/VGGT-Long#6, 2025-07).
    _preset("RTX-A4000", "15.61", 384, (8, 6)),
    # RTX A5000 24 GB (nvidia-smi: 24564MiB): get_device_properties printed total_memory=24114MB
    # (23.55 GiB) and 24138MB; OOMs gave 23.67 GiB (Magicboomliu/Accelerator-Simple-Template#7,
    # 2024-04) and 23.68 GiB (zai-org/GLM-4#730). The smaller errs safe.
    _preset("RTX-A5000", "23.55", 384, (8, 6)),
    # B300 ("NVIDIA B300 SXM6 AC", 288 GB HBM3e): "total capacity of 267.69 GiB" in a 2x8 B300
    # Megatron training run (2026-08) and other B300 logs.
    _preset("B300", "267.69", 768, (10, 3)),
    # A GB200 superchip's Blackwell GPU (186 GB HBM3e): "total capacity of 184.31 GiB" in vLLM
    # and FSDP2 runs on GB200 nodes (2026).
    _preset("GB200", "184.31", 768, (10, 0)),
)

GPU_PRESETS: dict[str, GpuSpec] = {spec.name: spec for spec in _PRESETS}

# Streaming multiprocessors of each preset (NVIDIA's data sheets; the H100 is the SXM/HBM3 card
# the H100-80GB capacity is from, as measured here: 132), and the threads one multiprocessor keeps
# resident per compute capability (CUDA C++ Programming Guide, "Technical Specifications per
# Compute Capability": maxThreadsPerMultiProcessor). CUDA's reduction kernels size the buffer
# they share between thread blocks by both (backends/estimate/reduce.py).
PRESET_MULTIPROCESSORS: dict[str, int] = {
    "T4": 40, "V100-16GB": 80, "V100-32GB": 80, "P100-16GB": 56, "A10G": 80, "L4": 58,
    "A100-40GB": 108, "A100-80GB": 108, "H100-80GB": 132, "RTX-3090": 82, "RTX-4090": 128,
    "TITAN-X-12GB": 28, "H200": 132, "B200": 148, "L40S": 142, "RTX-A6000": 84, "RTX-6000-Ada": 142,
    "RTX-5090": 170,
    # CUDA cores / 128 per SM in NVIDIA's GeForce and RTX data sheets and the Ampere (GA102), Ada
    # and Blackwell architecture whitepapers; TechPowerUp's GPU database agrees.
    "RTX-3060-12GB": 28, "RTX-4060-Ti-16GB": 34, "RTX-4070": 46, "RTX-4070-Ti-Super": 66,
    "RTX-4080": 76, "RTX-4080-Super": 80, "RTX-5080": 84, "RTX-5070-Ti": 70, "RTX-5060-Ti-16GB": 36,
    "A10": 72, "A40": 84, "L40": 142, "RTX-PRO-6000": 188, "RTX-A4000": 48, "RTX-A5000": 64,
    # H100 PCIe 114 and H100 NVL 132 (NVIDIA H100 data sheet); GH200's H100 is the full 132.
    "H100-PCIe": 114, "H100-NVL": 132, "GH200-96GB": 132,
    # NVIDIA publishes no count for these: multi_processor_count as measured on the cards in public
    # benchmarks, 148 on a B300 (as on a B200) and 152 on a GB200's GPU.
    "B300": 148, "GB200": 152,
}
MAX_THREADS_PER_MULTIPROCESSOR: dict[tuple[int, int], int] = {
    (6, 0): 2048, (6, 1): 2048, (7, 0): 2048, (7, 5): 1024, (8, 0): 2048, (8, 6): 1536,
    (8, 9): 1536, (9, 0): 2048, (10, 0): 2048, (10, 3): 2048, (12, 0): 1536,
}


def multiprocessors(gpu: GpuSpec) -> tuple[int, int]:
    """(multiprocessors, threads resident per multiprocessor): the spec's own, else those of the
    preset it is or matches, else, for a card known only by its size, `size_only_chip`'s."""
    if gpu.multiprocessors is not None:
        return gpu.multiprocessors
    preset = GPU_PRESETS.get(gpu.name) or _preset_for_device(gpu.name, gpu.total_memory_bytes)
    if preset is None or preset.compute_capability not in MAX_THREADS_PER_MULTIPROCESSOR:
        return size_only_chip()[1]
    return PRESET_MULTIPROCESSORS[preset.name], MAX_THREADS_PER_MULTIPROCESSOR[preset.compute_capability]


def size_only_chip() -> tuple[str, tuple[int, int]]:
    """The preset whose chip a card known only by its size is taken to be, and its multiprocessors:
    the one keeping the most threads resident (multiprocessors x threads per multiprocessor).

    CUDA's reduction kernels split their work over every resident thread, and their staging
    buffers grow with it (estimate/reduce.py): with that chip's, a size-only answer's reduction
    buffers are the largest of any preset's. (Before, a size alone took the largest buffers any chip
    could: 7 to 14 % below the H200's answer at the same budget in checkpointed BERT cells,
    docs/accuracy.md.) What a larger chip would save is not counted for it: the embedding backward
    takes its two-pass kernel (Multiprocessors.known False, estimate/embedding.py), Liger's RMSNorm
    the most multiprocessors of any preset (`most_multiprocessors`). The other parts CUDA sizes by
    the card are Hopper's and Blackwell's: cuDNN attention (backends/estimate/attention.py) and
    32 MiB cuBLAS workspaces.
    """
    def resident(preset: GpuSpec) -> tuple[int, int]:
        count = PRESET_MULTIPROCESSORS[preset.name]
        return count * MAX_THREADS_PER_MULTIPROCESSOR[preset.compute_capability], count  # type: ignore[index]

    known = [p for p in GPU_PRESETS.values() if p.compute_capability in MAX_THREADS_PER_MULTIPROCESSOR]
    chip = max(known, key=resident)
    return chip.name, (PRESET_MULTIPROCESSORS[chip.name],
                       MAX_THREADS_PER_MULTIPROCESSOR[chip.compute_capability])  # type: ignore[index]

# Lower-case alias -> preset name. Only names that mean one card: "A100", "V100" and
# "P100" (12 GB and 16 GB) come in several sizes and "H100" also as a 94 GB NVL; "A6000"
# is the Ampere RTX A6000 (the Ada card is the "RTX 6000 Ada").
_ALIASES: dict[str, str] = {
    "tesla-t4": "T4",
    "nvidia-t4": "T4",
    "nvidia-l4": "L4",
    "3090": "RTX-3090",
    "rtx3090": "RTX-3090",
    "geforce-rtx-3090": "RTX-3090",
    "4090": "RTX-4090",
    "rtx4090": "RTX-4090",
    "geforce-rtx-4090": "RTX-4090",
    "nvidia-h200": "H200",
    "nvidia-b200": "B200",
    "nvidia-l40s": "L40S",
    "a6000": "RTX-A6000",
    "5090": "RTX-5090",
    "rtx5090": "RTX-5090",
    "geforce-rtx-5090": "RTX-5090",
    # The 3060, 4060 Ti and 5060 Ti come with 8 GB too: only their 12 and 16 GB names are aliases.
    "3060-12gb": "RTX-3060-12GB",
    "4060-ti-16gb": "RTX-4060-Ti-16GB",
    "5060-ti-16gb": "RTX-5060-Ti-16GB",
    "4070": "RTX-4070",
    "rtx4070": "RTX-4070",
    "geforce-rtx-4070": "RTX-4070",
    "4070-ti-super": "RTX-4070-Ti-Super",
    "geforce-rtx-4070-ti-super": "RTX-4070-Ti-Super",
    "4080": "RTX-4080",
    "rtx4080": "RTX-4080",
    "geforce-rtx-4080": "RTX-4080",
    "4080-super": "RTX-4080-Super",
    "geforce-rtx-4080-super": "RTX-4080-Super",
    "5080": "RTX-5080",
    "rtx5080": "RTX-5080",
    "geforce-rtx-5080": "RTX-5080",
    "5070-ti": "RTX-5070-Ti",
    "geforce-rtx-5070-ti": "RTX-5070-Ti",
    "nvidia-a10": "A10",
    "nvidia-a40": "A40",
    "nvidia-l40": "L40",
    "nvidia-h100-pcie": "H100-PCIe",
    "nvidia-h100-nvl": "H100-NVL",
    "nvidia-gh200-480gb": "GH200-96GB",  # the device name of the 96 GB GH200
    "rtx-pro-6000-blackwell": "RTX-PRO-6000",
    "a4000": "RTX-A4000",
    "a5000": "RTX-A5000",
    "nvidia-b300": "B300",
    "nvidia-gb200": "GB200",
}


def _key(name: str) -> str:
    """Lower case, with runs of spaces and underscores as one hyphen."""
    return re.sub(r"[\s_]+", "-", name.strip()).lower()


_LOOKUP: dict[str, str] = {_key(name): name for name in GPU_PRESETS} | _ALIASES


# Spellings a preset is suggested for: its name, its aliases, and its family, the name's first
# part ("A100" for A100-40GB and A100-80GB: an ambiguous name gets every size as a suggestion).
_SPELLINGS: tuple[tuple[str, str], ...] = (
    *((name, name) for name in GPU_PRESETS),
    *_ALIASES.items(),
    *((name.split("-")[0], name) for name in GPU_PRESETS),
)
# Card names differ by a digit between different cards (RTX-2080 is no RTX-3090: ratio 0.71), so
# a GPU is suggested only when closer than spelling.DEFAULT_CUTOFF asks ("H10": H100 0.86).
GPU_SUGGESTION_CUTOFF = 0.75


def gpu_suggestions(name: str) -> list[str]:
    """The presets closest to a mistyped GPU name, best first ("T-4" -> ["T4"])."""
    return close_matches(name, _SPELLINGS, cutoff=GPU_SUGGESTION_CUTOFF)


def resolve_gpu(name: str) -> GpuSpec:
    """The preset called `name` (case-insensitive); UnknownGpu naming the close presets, if any,
    and listing them all."""
    preset = _LOOKUP.get(_key(name))
    if preset is None:
        presets = ", ".join(GPU_PRESETS)
        guess = did_you_mean(gpu_suggestions(name))
        if guess:
            raise UnknownGpu(f"unknown GPU '{name}': {guess} Presets: {presets}")
        raise UnknownGpu(f"unknown GPU '{name}': use one of {presets}")
    return GPU_PRESETS[preset]


def custom_gpu(total_memory_bytes: int, chip: tuple[int, int] | None = None) -> GpuSpec:
    """A GPU known by its size (and the multiprocessors of its chip, where given); the context
    overhead is the generic default."""
    total = parse_bytes(total_memory_bytes)
    if total <= DEFAULT_CONTEXT_OVERHEAD_BYTES:
        raise InvalidInput(
            f"GPU memory {format_bytes(total)} is too small: the CUDA context alone takes "
            f"about {format_bytes(DEFAULT_CONTEXT_OVERHEAD_BYTES)}"
        )
    name = f"custom {format_bytes(total)}"
    if chip is not None:
        name += f" ({chip[0]} multiprocessors x {chip[1]} threads)"
    return GpuSpec(name, total, DEFAULT_CONTEXT_OVERHEAD_BYTES, None, chip)


def budget_on(card: GpuSpec, total_memory_bytes: int) -> GpuSpec:
    """``card``'s chip with ``total_memory_bytes`` of memory: a budget on a known card (a share of a
    larger one, or the size a user has), its architecture, context and multiprocessors the card's."""
    total = parse_bytes(total_memory_bytes)
    if total > card.total_memory_bytes:
        raise InvalidInput(f"GPU memory {format_bytes(total)} is more than the "
                           f"{format_bytes(card.total_memory_bytes)} of {card.name}: give at most its size, "
                           "or another GPU")
    if total <= card.context_overhead_bytes:
        raise InvalidInput(f"GPU memory {format_bytes(total)} is too small: the CUDA context of {card.name} "
                           f"alone takes about {format_bytes(card.context_overhead_bytes)}")
    return replace(card, name=f"{card.name}, {format_bytes(total)} of it", total_memory_bytes=total,
                   multiprocessors=multiprocessors(card))


def chip_is_known(gpu: GpuSpec) -> bool:
    """Whether the spec's chip is known (its own, a preset's, a local device's), not taken to be one."""
    return gpu.multiprocessors is not None or bool(
        GPU_PRESETS.get(gpu.name) or _preset_for_device(gpu.name, gpu.total_memory_bytes))


def most_multiprocessors() -> int:
    """The most multiprocessors of any preset's chip: what grows with their count alone (LigerRMSNorm's
    per-program gradients) takes it for a chip known only by a card's size."""
    return max(PRESET_MULTIPROCESSORS.values())


def describe_chip(gpu: GpuSpec) -> str:
    """What the estimate took the card's chip to be, in words (the ``chip`` of a table's environment)."""
    count, threads = multiprocessors(gpu)
    found = f"{count} multiprocessors x {threads} threads"
    if chip_is_known(gpu):
        return found
    name, _ = size_only_chip()
    return (f"unknown (a size alone), taken to be the largest current one: CUDA's reduction buffers for the "
            f"{name}'s {found}, the most threads of any preset; the embedding backward's two-pass kernel; "
            f"Liger's per-program buffers for {most_multiprocessors()} multiprocessors; cuDNN attention and "
            "32 MiB cuBLAS workspaces as on Hopper and Blackwell; --gpu with --gpu-memory, or "
            "--multiprocessors, names it")


# Threads a multiprocessor keeps resident where a count is given alone: the most of any architecture
# (MAX_THREADS_PER_MULTIPROCESSOR), the larger reduction buffers.
DEFAULT_THREADS_PER_MULTIPROCESSOR = 2048


def parse_multiprocessors(value: str | int) -> tuple[int, int]:
    """``46`` or ``46x1536``: (multiprocessors, threads resident per multiprocessor)."""
    text = str(value).strip().lower()
    match = re.fullmatch(r"(\d+)(?:\s*x\s*(\d+))?", text)
    count = int(match.group(1)) if match else 0
    threads = int(match.group(2) or DEFAULT_THREADS_PER_MULTIPROCESSOR) if match else 0
    if not (match and 1 <= count <= 1024 and 32 <= threads <= 4096 and threads % 32 == 0):
        raise InvalidInput(f"multiprocessors {value!r}: give the chip's multiprocessor count, e.g. 46 (with "
                           f"{DEFAULT_THREADS_PER_MULTIPROCESSOR} threads each), or count x threads per "
                           "multiprocessor, e.g. 46x1536 (torch.cuda.get_device_properties: "
                           "multi_processor_count, max_threads_per_multi_processor)")
    return count, threads


def with_context_overhead(spec: GpuSpec, nbytes: int) -> GpuSpec:
    """`spec` with its context overhead replaced, e.g. by a measured figure."""
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
        raise InvalidInput(f"context overhead must be a byte count >= 0, got {nbytes!r}")
    if nbytes >= spec.total_memory_bytes:
        raise InvalidInput(
            f"context overhead {format_bytes(nbytes)} leaves nothing of the "
            f"{format_bytes(spec.total_memory_bytes)} of {spec.name}"
        )
    return replace(spec, context_overhead_bytes=nbytes)


def context_overhead_override() -> int | None:
    """The size in AUTOTUNE_CONTEXT_OVERHEAD, or None when it is unset or empty.

    Read through `autotune.settings.Settings`: InvalidInput names a malformed AUTOTUNE_* variable.
    """
    from autotune.settings import Settings  # pydantic-settings: imported when first needed

    return Settings.from_env().context_overhead


def gpu_from_device_properties(name: str, total_memory: int, major: int, minor: int,
                               multiprocessors: tuple[int, int] | None = None) -> GpuSpec:
    """A spec for a local CUDA device, from `torch.cuda.get_device_properties(i)`.

    The capacity is the device's own; the context overhead is that of the preset the
    device name matches (e.g. "Tesla T4", "NVIDIA A100-SXM4-80GB"), else the default
    of its architecture. ``multiprocessors``: the properties' (multi_processor_count,
    max_threads_per_multi_processor), where they were read.
    """
    preset = _preset_for_device(name, total_memory)
    if preset is not None:
        overhead = preset.context_overhead_bytes
    elif (major, minor) in ARCH_CONTEXT_OVERHEAD_BYTES:
        overhead = ARCH_CONTEXT_OVERHEAD_BYTES[(major, minor)]
    elif major >= 10:
        overhead = _NEWER_ARCH_CONTEXT_OVERHEAD_BYTES
    else:
        overhead = DEFAULT_CONTEXT_OVERHEAD_BYTES
    return GpuSpec(name, total_memory, overhead, (major, minor), multiprocessors)


# Device-name patterns (lower case) -> the preset whose chip the device has (its capacity is
# its own); V100, P100, A100 and H100 are told apart by capacity in _preset_for_device.
_DEVICE_PATTERNS: tuple[tuple[str, str], ...] = (
    (r"\bt4\b", "T4"),
    (r"\ba10g\b", "A10G"),
    (r"\bl4\b", "L4"),
    (r"\b3090\b", "RTX-3090"),
    (r"\b4090\b", "RTX-4090"),
    (r"\btitan x\b.*pascal|\btitan xp\b", "TITAN-X-12GB"),
    (r"\bh200\b", "H200"),
    (r"\bb200\b", "B200"),
    (r"\bl40s\b", "L40S"),
    (r"\brtx a6000\b", "RTX-A6000"),
    (r"\brtx 6000 ada\b", "RTX-6000-Ada"),
    (r"\b5090\b", "RTX-5090"),
    # The 8 GB 3060, 4060 Ti and 5060 Ti are the same chips as the presets; laptop parts are not,
    # nor are the Ti and Super cards beside a 4070 or 4080.
    (r"\brtx 3060(?! ti)\b(?!.*laptop)", "RTX-3060-12GB"),
    (r"\b4060 ti\b(?!.*laptop)", "RTX-4060-Ti-16GB"),
    (r"\brtx 4070\b(?! ti| super)(?!.*laptop)", "RTX-4070"),
    (r"\b4070 ti super\b", "RTX-4070-Ti-Super"),
    (r"\brtx 4080\b(?! super)(?!.*laptop)", "RTX-4080"),
    (r"\b4080 super\b", "RTX-4080-Super"),
    (r"\brtx 5080\b(?!.*laptop)", "RTX-5080"),
    (r"\b5070 ti\b(?!.*laptop)", "RTX-5070-Ti"),
    (r"\b5060 ti\b(?!.*laptop)", "RTX-5060-Ti-16GB"),
    (r"\ba10\b", "A10"),
    (r"\ba40\b", "A40"),
    (r"\bl40\b", "L40"),
    (r"\bh100 pcie\b", "H100-PCIe"),
    (r"\bh100 nvl\b", "H100-NVL"),
    (r"\bgh200\b", "GH200-96GB"),  # the 144 GB GH200 too: the same chip
    (r"\brtx pro 6000\b", "RTX-PRO-6000"),
    (r"\brtx a4000\b", "RTX-A4000"),
    (r"\brtx a5000\b", "RTX-A5000"),
    (r"\bb300\b", "B300"),
    (r"\bgb200\b", "GB200"),
)


def _preset_for_device(name: str, total_memory: int) -> GpuSpec | None:
    lowered = name.lower()
    gib = total_memory / 1024**3
    for pattern, preset in _DEVICE_PATTERNS:
        if re.search(pattern, lowered):
            return GPU_PRESETS[preset]
    if "v100" in lowered:
        return GPU_PRESETS["V100-32GB" if gib > 20 else "V100-16GB"]
    if "p100" in lowered and gib > 14:
        return GPU_PRESETS["P100-16GB"]
    if "a100" in lowered:
        return GPU_PRESETS["A100-80GB" if gib > 50 else "A100-40GB"]
    if "h100" in lowered and gib < 85:
        return GPU_PRESETS["H100-80GB"]
    return None
