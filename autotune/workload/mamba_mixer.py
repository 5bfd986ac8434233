"""Which path a Falcon-H1 or Nemotron-H Mamba-2 mixer is traced through, and what a GPU user's step runs
instead.

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

Nemotron-H's mixer (transformers 5.24 modeling_nemotron_h.py ``NemotronHMamba2Mixer.forward``) is the
same: in training without a cache it calls the same hub-kernel-or-fallback
``mamba2_split_conv1d_scan_combined`` and, on its None, the torch path (``mamba2_chunk_scan``). So is
Granite 4.0's (modeling_granitemoehybrid.py ``GraniteMoeHybridMambaLayer.forward``: ``self.training and
cache is None`` -> ``mamba2_split_conv1d_scan_combined``, its torch path on the fallback's None).

The fused kernel is not yet emulated. The torch path keeps more for backward than it (mamba_ssm
``MambaSplitConv1dScanCombinedFn.forward`` saves zxbcdt, the scan's out_x and the norm's rstd; the torch
path's einsums keep B and C repeated to every head in float32 and the per-chunk scores), so an answer
for Falcon-H1 errs toward "does not fit"; the note says so.

Mamba-1 mixers (Jamba's, ``JambaMambaMixer.forward``; Mamba's, ``MambaMixer.forward``) are refused by the
estimator (``check_kernels``). On a GPU with mamba-ssm they run its fused kernels (``selective_scan_fn``
with ``causal_conv1d_fn`` for Jamba, ``mamba_inner_fn`` for Mamba, both
``use_kernel_func_from_hub_with_fallback(..., "mamba_ssm")`` in transformers 5.24), which keep the scan's
state only per chunk (state-spaces/mamba csrc/selective_scan: ``x`` of [batch, dim, n_chunks, 2 * dstate]).
Without them the torch path (``mamba_selective_scan``) materialises ``discrete_A`` and ``deltaB_u`` of
[batch, intermediate, seq_len, state] in float32 and, by default, loops over every position
(``use_associative_scan`` only under torch.compile), so tracing it would neither finish in time for a
long sequence nor size what the kernel allocates. Emulating the kernels is the way to answer them.
"""

from __future__ import annotations

from autotune.errors import InvalidInput

MODEL_TYPES = frozenset({"falcon_h1", "nemotron_h", "granitemoehybrid"})
# Model types whose mixers are Mamba-1's selective scan (transformers' modeling_jamba.py, modeling_mamba.py).
MAMBA1_MODEL_TYPES = frozenset({"jamba", "mamba", "falcon_mamba"})
NOTE = ("Falcon-H1's, Nemotron-H's and Granite 4.0's Mamba-2 mixers traced through transformers' torch path "
        "(FalconH1Mixer.forward's, NemotronHMamba2Mixer.forward's and GraniteMoeHybridMambaLayer.forward's "
        "chunked scan, 5.14's torch_forward): "
        "mamba-ssm is not installed here. A GPU user of Axolotl (transformers 5.14.1, kernels 0.15.2) runs "
        "mamba-ssm's fused mamba_split_conv1d_scan_combined, not emulated; the torch path keeps more "
        "activations, so the answer errs toward does not fit")


def torch_path(model_type: str | None) -> bool:
    """Whether a model type's Mamba-2 mixers are traced through transformers' torch path."""
    return model_type in MODEL_TYPES



def check_kernels(model_type: str | None) -> None:
    """Refuse a model whose mixers are Mamba-1's: mamba-ssm's selective-scan kernels are not emulated."""
    if model_type in MAMBA1_MODEL_TYPES:
        raise InvalidInput(
            f"model_type {model_type}: its Mamba-1 mixers run mamba-ssm's selective_scan_fn / mamba_inner_fn "
            "CUDA kernels on a GPU, which autotune does not emulate yet; transformers' torch fallback "
            "(mamba_selective_scan) keeps [batch, intermediate, seq_len, state] float32 tensors the kernels "
            "never make, so it cannot stand in for them")
