"""gptqmodel's trainable GPTQ and AWQ layers (gptq.py) against gptqmodel 7.3.4's source, cited beside
each: gptqmodel cannot run here, so each buffer and allocation is compared with what its source makes."""

from __future__ import annotations

import warnings

import pytest
import torch
from peft.tuners.lora.awq import AwqLoraLinear
from peft.tuners.lora.gptq import GPTQLoraLinear
from peft.tuners.oft.layer import Linear as OftLinear
from torch._subclasses.fake_tensor import FakeTensorMode

from autotune.backends.estimate.backend import EstimateBackend
from autotune.backends.estimate.gptq import EmulatedAwqLinear, EmulatedGPTQLinear
from autotune.backends.estimate.instrument import RecordingTracker
from autotune.gpus import resolve_gpu
from autotune.workload import Workload
from autotune.workload.adapters import make_adapter
from autotune.workload.models import resolve_model
from autotune.workload.modes import parse_mode
from autotune.workload.prequantized import CHECKPOINTS, SavedQuant, storage_bytes

B, S, K, N = 2, 6, 256, 128  # batch, sequence, in and out features
GPTQ = SavedQuant("gptq", bits=4, group_size=128, desc_act=True)
AWQ = SavedQuant("awq", bits=4, group_size=128)


def _layer(quant: SavedQuant, dtype: torch.dtype = torch.bfloat16) -> torch.nn.Module:
    cls = EmulatedGPTQLinear if quant.method == "gptq" else EmulatedAwqLinear
    return cls(torch.nn.Linear(K, N, bias=False, dtype=dtype), quant)


def _bytes(layer: torch.nn.Module) -> dict[str, int]:
    return {name: b.numel() * b.element_size() for name, b in layer.named_buffers()
            if not name.startswith("wf_")}  # TorchLinear's shift amounts: bytes


def test_a_gptq_layer_holds_gptqmodel_s_packed_buffers():
    with FakeTensorMode():
        layer = _layer(GPTQ)
    # _register_gptq_buffers, 4 bits in int32 (8 a word), 2 groups of 128 inputs: qweight [256 * 4 / 32,
    # 128] int32, qzeros [2, 128 * 4 / 32] int32, scales [2, 128] float16, g_idx [256] int32
    hand = {"qweight": 32 * 128 * 4, "qzeros": 2 * 16 * 4, "scales": 2 * 128 * 2, "g_idx": 256 * 4}
    assert _bytes(layer) == storage_bytes(GPTQ, K, N) == hand
    assert not list(layer.parameters())  # buffers: nothing to train, nothing PEFT counts


def test_an_awq_layer_holds_gptqmodel_s_packed_buffers():
    with FakeTensorMode():
        layer = _layer(AWQ)
    # AWQuantLinear.__init__: qweight [256, 128 / 8] int32, qzeros [256 / 128, 128 / 8] int32, scales
    # [2, 128] float16
    hand = {"qweight": 256 * 16 * 4, "qzeros": 2 * 16 * 4, "scales": 2 * 128 * 2}
    assert _bytes(layer) == storage_bytes(AWQ, K, N) == hand


def test_the_8b_checkpoints_packed_buffers_add_up_to_their_files_on_the_hub():
    # Llama-3-8B's decoder: 32 layers of q, k, v, o (4096 to 4096, 1024, 1024, 4096) and gate, up, down
    # (4096 to 14336 and back): 6.98e9 weights; the 16-bit embeddings (128256 x 4096) and norms beside
    shapes = [(4096, 4096), (4096, 1024), (4096, 1024), (4096, 4096), (4096, 14336), (4096, 14336),
              (14336, 4096)]
    embeddings, norms = 128256 * 4096 * 2, (32 * 2 + 1) * 4096 * 2

    def packed(quant: SavedQuant) -> int:
        return 32 * sum(sum(storage_bytes(quant, i, o).values()) for i, o in shapes)

    # huggingface.co/TechxGenus/Meta-Llama-3-8B-Instruct-AWQ/tree/main: model-00001-of-00002.safetensors
    # 4.68 GB (the decoder and the embeddings), model-00002 1.05 GB (lm_head, 16-bit)
    assert round((packed(CHECKPOINTS["techxgenus/meta-llama-3-8b-instruct-awq"]) + embeddings + norms) / 1e9,
                 2) == 4.68
    # .../Meta-Llama-3-8B-Instruct-GPTQ/tree/main: model.safetensors 5.74 GB, lm_head in it
    gptq = packed(CHECKPOINTS["techxgenus/meta-llama-3-8b-instruct-gptq"]) + 2 * embeddings + norms
    assert abs(gptq / 1e9 - 5.74) < 0.01


def test_the_gptq_forward_dequantizes_the_whole_weight_and_saves_it_for_backward():
    with FakeTensorMode():
        layer = _layer(GPTQ)
        x = torch.empty(B, S, K, dtype=torch.bfloat16, requires_grad=True)
        with RecordingTracker() as tracker:
            out = layer(x)
    made = [(a.shape, a.dtype) for a in tracker.allocations]
    # dequantize_weight: the int32 shifted codes [K / 8, 8, N] and their int8 cast and mask; the int64
    # g_idx; scales[g_idx] float16 [K, N], zeros[g_idx] and weight - zeros int8 [K, N], their product
    # float16 [K, N]; _forward_eager's .to(x.dtype) bfloat16 [K, N]; the matmul's output
    for shape_dtype in [((32, 8, 128), "int32"), ((32, 8, 128), "int8"), ((256,), "int64"),
                        ((256, 128), "float16"), ((256, 128), "int8"), ((256, 128), "bfloat16"),
                        ((12, 128), "bfloat16")]:
        assert shape_dtype in made
    assert (tuple(out.shape), out.dtype) == ((B, S, N), torch.bfloat16)
    # torch.matmul(x, weights) keeps the dequantized weight for the input's gradient
    mm = out.grad_fn.next_functions[0][0]
    assert tuple(mm._saved_mat2.shape) == (K, N) and mm._saved_mat2.dtype == torch.bfloat16


@pytest.mark.parametrize(("seq", "made"), [
    # at most 1024 rows: gemm_forward_cuda's split_k_iters (8) partial sums, summed
    (S, ((8, B * S, N), "float16")),
    # above: dequantize_weights' [K, N] in the scales' dtype, then the matmul
    (600, ((K, N), "float16")),
])
def test_the_awq_forward_takes_the_gemm_kernel_or_dequantizes_by_rows(seq, made):
    with FakeTensorMode():
        layer = _layer(AWQ, torch.float16)
        x = torch.empty(B, seq, K, dtype=torch.float16, requires_grad=True)
        with RecordingTracker() as tracker:
            out = layer(x)
    assert made in [(a.shape, a.dtype) for a in tracker.allocations]
    assert (tuple(out.shape), out.dtype) == ((B, seq, N), torch.float16)


def test_the_awq_backward_multiplies_by_one_copy_of_the_weight_per_sequence():
    with FakeTensorMode():
        layer = _layer(AWQ, torch.float16)
        x = torch.empty(B, S, K, dtype=torch.float16, requires_grad=True)
        out = layer(x)
        with RecordingTracker() as tracker:
            out.sum().backward()
    made = [(a.shape, a.dtype) for a in tracker.allocations]
    # AwqGemmFn.backward: dequantize_weights [K, N], then weights.T repeated batch times [B, N, K] for bmm
    assert ((K, N), "float16") in made and ((B, N, K), "float16") in made
    assert x.grad is not None and tuple(x.grad.shape) == (B, S, K)


@pytest.mark.parametrize("quant", [GPTQ, AWQ], ids=["gptq", "awq"])
@pytest.mark.parametrize("tuner", ["lora", "oft"])
def test_a_peft_step_over_a_saved_quantized_base_is_traced(quant, tuner):
    # tiny-llama: hidden 32, MLP 64; PEFT's own GPTQLoraLinear / AwqLoraLinear (or OFT's Linear) over
    # the emulated layers, every linear layer but lm_head quantized, a step traced and answered.
    adapter = make_adapter("lora", r=8 if tuner == "lora" else 0, alpha=16, dropout=0.0,
                           targets="all-linear", tuner=tuner, block_size=0 if tuner == "lora" else 16,
                           saved_quant=quant)
    backend = EstimateBackend(resolve_gpu("H100-80GB"))
    workload = Workload(resolve_model("tiny-llama"), "causal-lm", None, adapter=adapter)
    model = backend._model(workload).model
    wrapper = {"lora": GPTQLoraLinear if quant.method == "gptq" else AwqLoraLinear, "oft": OftLinear}[tuner]
    base = EmulatedGPTQLinear if quant.method == "gptq" else EmulatedAwqLinear
    wrapped = [m for m in model.modules() if isinstance(m, wrapper)]
    assert len(wrapped) == 2 * 7 and all(isinstance(m.get_base_layer(), base) for m in wrapped)
    assert type(model.get_output_embeddings()) is torch.nn.Linear  # lm_head left in 16 bits
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        with backend.cell(workload, parse_mode("bf16+ckpt"), 64, 10**12) as cell:
            probe = cell.fits(4)
    assert probe.outcome == "fits" and probe.details["peak_allocated_bytes"] > 0
