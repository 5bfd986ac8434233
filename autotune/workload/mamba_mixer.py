"""Which path a Falcon-H1 Mamba-2 mixer is traced through, and what a GPU user's step runs instead.

transformers 5.24 (modeling_falcon_h1.py ``FalconH1Mixer.forward``), in training without a cache,
first calls ``mamba2_split_conv1d_scan_combined``, decorated with
``use_kernel_func_from_hub_with_fallback("mamba_split_conv1d_scan_combined", "mamba_ssm")``
(integrations/hub_kernels.py): where ``mamba_ssm.ops.triton.ssd_combined`` imports, mamba-ssm's fused
Triton kernel runs and its output is returned; otherwise the torch stand-in returns None and the
forward goes on through its torch path (``causal_conv1d_fn``'s ``F.conv1d`` and ``mamba2_chunk_scan``'s
chunked scan, transformers 5.14's ``FalconH1Mixer.torch_forward``). This venv has no mamba_ssm (a CUDA
and Triton package), so the traced step runs that torch path.

A GPU user of Axolotl runs the fused kernel: Axolotl pins transformers==5.14.1 and kernels==0.15.2
(pyproject.toml), and 5.14.1's ``FalconH1Mixer.__init__`` loads ``lazy_load_kernel("causal-conv1d")``
and ``lazy_load_kernel("mamba-ssm")`` from the Hub (kernels-community/causal-conv1d,
kernels-community/mamba-ssm: hub_kernels.py ``_HUB_KERNEL_MAPPING``), so ``is_fast_path_available``
holds on a GPU and ``cuda_kernels_forward`` calls ``mamba_split_conv1d_scan_combined`` in training.
(Under transformers 5.24 with mamba-ssm installed and causal-conv1d not, as Axolotl's docker/Dockerfile-uv
leaves it, the fused kernel is chosen and fails: state-spaces/mamba ssd_combined.py's
``causal_conv1d_fwd_function`` is None there.) Axolotl has no Falcon-H1 README saying what to install.

The fused kernel is not yet emulated. The torch path keeps more for backward than it (mamba_ssm
``MambaSplitConv1dScanCombinedFn.forward`` saves zxbcdt, the scan's out_x and the norm's rstd; the torch
path's einsums keep B and C repeated to every head in float32 and the per-chunk scores), so an answer
for Falcon-H1 errs toward "does not fit"; the note says so.
"""

from __future__ import annotations

MODEL_TYPES = frozenset({"falcon_h1"})
NOTE = ("Falcon-H1's Mamba-2 mixers traced through transformers' torch path (FalconH1Mixer.forward's "
        "chunked scan, 5.14's torch_forward): mamba-ssm is not installed here. A GPU user of Axolotl "
        "(transformers 5.14.1, kernels 0.15.2) runs mamba-ssm's fused mamba_split_conv1d_scan_combined, "
        "not emulated; the torch path keeps more activations, so the answer errs toward does not fit")


def torch_path(model_type: str | None) -> bool:
    """Whether a model type's Mamba-2 mixers are traced through transformers' torch path."""
    return model_type in MODEL_TYPES

