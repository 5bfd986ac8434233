"""The emulated CUDA autocast follows torch's autocast state: regions a model runs with autocast
disabled run uncast, as on CUDA, and nested enabled regions cast again.

The rule (torch/amp/autocast_mode.py, ``autocast``'s docstring): "``autocast(enabled=False)``
subregions can be nested in autocast-enabled regions. Locally disabling autocast ... gives you
explicit control over the execution type"; its example runs ``torch.mm`` in float32 inside the
disabled region and in the autocast dtype again after it. The models switch it off with the device
type of their tensors (transformers' ``maybe_autocast(device_type=x.device.type, enabled=False)``),
which is "cpu" on the estimator's fake tensors and "cuda" on the real job.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils.checkpoint import checkpoint
from transformers.utils.generic import maybe_autocast

from autotune.backends.estimate.attention import AttentionKernels
from autotune.backends.estimate.emulation import CudaEmulation, autocast_enabled

SM80 = AttentionKernels(flash=True, bf16=True)


def _saved_bytes(run):
    """The bytes of the tensors autograd saves while ``run()`` runs."""
    saved: list[int] = []

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        saved.append(tensor.numel() * tensor.element_size())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        out = run()
    return out, sum(saved)


def test_torch_autocast_docstring_example_runs_as_on_cuda():
    with FakeTensorMode():
        a, b, c, d = (torch.empty(8, 8) for _ in range(4))
        emulation = CudaEmulation(torch.bfloat16, SM80)
        with emulation, emulation.forward_region():
            e = torch.mm(a, b)
            with torch.autocast(device_type=a.device.type, enabled=False):
                f = torch.mm(c, e.float())
            g = torch.mm(d, f)
    assert (e.dtype, f.dtype, g.dtype) == (torch.bfloat16, torch.float32, torch.bfloat16)


def test_a_region_maybe_autocast_disables_saves_float32_tensors():
    # The rotary embeddings' pattern (e.g. transformers' modeling_llama.py LlamaRotaryEmbedding.forward).
    def run(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        with maybe_autocast(device_type=x.device.type, enabled=False):
            return x @ w

    with FakeTensorMode():
        x = torch.empty(4, 64, requires_grad=True)  # float32: 1,024 B
        w = torch.empty(64, 32, requires_grad=True)  # float32: 8,192 B
        emulation = CudaEmulation(torch.bfloat16, SM80)
        with emulation, emulation.forward_region():
            out, saved = _saved_bytes(lambda: run(x, w))
            inside = autocast_enabled()
    # matmul saves both operands: float32 as they are, not bfloat16 copies (4,608 B)
    assert (out.dtype, saved, inside) == (torch.float32, 4 * 64 * 4 + 64 * 32 * 4, True)


def test_a_nested_enabled_region_casts_again_and_leaving_it_restores_the_disabled_one():
    with FakeTensorMode():
        x = torch.empty(4, 64)
        emulation = CudaEmulation(torch.bfloat16, SM80)
        with emulation, emulation.forward_region():
            with torch.autocast(device_type=x.device.type, enabled=False):
                off = x @ x.T
                with torch.autocast(device_type=x.device.type, dtype=torch.bfloat16):
                    on = x @ x.T
                    resumed = autocast_enabled()
                off_again = x @ x.T
                paused = autocast_enabled()
    assert (off.dtype, on.dtype, off_again.dtype) == (torch.float32, torch.bfloat16, torch.float32)
    assert (resumed, paused) == (True, False)


def test_a_cuda_region_disabled_by_name_pauses_the_casts_too():
    # torch.amp.custom_fwd(device_type="cuda", ...) and torch.cuda.amp.autocast(enabled=False) name CUDA.
    with FakeTensorMode():
        x = torch.empty(4, 64)
        emulation = CudaEmulation(torch.bfloat16, SM80)
        with emulation, emulation.forward_region():
            with torch.autocast(device_type="cuda", enabled=False):
                off = x @ x.T
            on = x @ x.T
    assert (off.dtype, on.dtype) == (torch.float32, torch.bfloat16)


def test_cpu_autocast_lists_do_not_apply_in_the_emulated_region():
    # CPU autocast runs avg_pool3d in float32 (autocast_mode.cpp KERNEL_CPU(avg_pool3d, fp32));
    # CUDA's lists leave it in its input's dtype.
    with FakeTensorMode():
        x = torch.empty(1, 2, 4, 4, 4, dtype=torch.bfloat16)
        emulation = CudaEmulation(torch.bfloat16, SM80)
        with emulation, emulation.forward_region():
            pooled = F.avg_pool3d(x, 2)
            region = torch.is_autocast_enabled(x.device.type), torch.is_autocast_enabled()
    assert pooled.dtype == torch.bfloat16
    assert region == (True, True)  # what the model reads, as on CUDA
    assert not torch.is_autocast_enabled("cpu") and not torch.is_autocast_enabled("cuda")


@pytest.mark.parametrize("reentrant", [False, True])
def test_a_checkpointed_segment_recomputes_its_disabled_region_as_it_ran(reentrant):
    # torch.utils.checkpoint restores the forward's autocast state of the inputs' device type around
    # the recompute; recompute_region enters the mode there (non-reentrant: context_fn's second
    # context; reentrant: inside the recomputed function, as workload/step.py _recompute_under does).
    runs: list[tuple[torch.dtype, torch.dtype]] = []

    def segment(x: torch.Tensor) -> torch.Tensor:
        y = x @ x.T
        with maybe_autocast(device_type=x.device.type, enabled=False):
            z = y.float() @ x
        runs.append((y.dtype, z.dtype))
        return z.sum()

    def recomputed(x: torch.Tensor) -> torch.Tensor:
        if torch._C._current_graph_task_id() == -1:  # the forward
            return segment(x)
        with emulation.recompute_region():
            return segment(x)

    with FakeTensorMode():
        x = torch.empty(4, 64, requires_grad=True)
        emulation = CudaEmulation(torch.bfloat16, SM80)
        with emulation:
            with emulation.forward_region():
                if reentrant:
                    loss = checkpoint(recomputed, x, use_reentrant=True)
                else:  # it compares the recomputed tensors' metadata with the forward's
                    loss = checkpoint(segment, x, use_reentrant=False, context_fn=lambda: (
                        contextlib.nullcontext(), emulation.recompute_region()))
            loss.backward()
        assert x.grad is not None and x.grad.dtype == torch.float32
    # the non-reentrant recompute stops once the saved tensors are back, before the append
    assert runs == [(torch.bfloat16, torch.float32)] * (2 if reentrant else 1)


def test_nemotron_layernorm1p_returns_the_autocast_dtype_as_on_cuda():
    # modeling_nemotron.py NemotronLayerNorm1P.forward: inputs cast by _cast_if_autocast_enabled,
    # layer_norm under maybe_autocast(enabled=False): the autocast dtype out on CUDA.
    from transformers.models.nemotron.modeling_nemotron import NemotronLayerNorm1P

    with FakeTensorMode():
        norm = NemotronLayerNorm1P(64)
        x = torch.empty(4, 64, requires_grad=True)
        emulation = CudaEmulation(torch.bfloat16, SM80)
        with emulation, emulation.forward_region():
            out = norm(x)
    assert out.dtype == torch.bfloat16

