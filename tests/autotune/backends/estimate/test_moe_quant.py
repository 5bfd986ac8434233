"""Axolotl's quantize_moe_experts under the estimator (backends/estimate/moe_quant.py): the experts'
3D weights stored as bitsandbytes stores them, dequantized once per forward of the experts by
torch's parametrization cache, and held past it only by what autograd saves; grouped products off
bfloat16 as CUDA's fallback allocates them (grouped_mm.py)."""

from __future__ import annotations

import math
import warnings
import weakref

import pytest
import torch
import torch.nn.utils.parametrize as P

from autotune.backends.estimate.attention import AttentionKernels
from autotune.backends.estimate.backend import EstimateBackend
from autotune.backends.estimate.emulation import CudaEmulation
from autotune.backends.estimate.grouped_mm import fallback_grouped_mm
from autotune.backends.estimate.instrument import RecordingTracker
from autotune.backends.estimate.int8 import int8_storage_bytes
from autotune.backends.estimate.moe_quant import (
    DEQUANT_REGION,
    EmulatedBnb4bitParametrization,
)
from autotune.backends.estimate.nf4 import nf4_storage_bytes
from autotune.gpus import resolve_gpu
from autotune.workload import Workload
from autotune.workload.adapters import make_adapter
from autotune.workload.models import resolve_model

# tiny-mixtral: 2 layers of 4 experts, hidden 32, expert width 64 (tiny.py)
LAYERS, EXPERTS, HIDDEN, WIDTH = 2, 4, 32, 64
GATE_UP, DOWN = (EXPERTS, 2 * WIDTH, HIDDEN), (EXPERTS, HIDDEN, WIDTH)  # transformers' MixtralExperts
BF16 = 2


def fake_model(method: str, model: str = "tiny-mixtral", targets: str = "q_proj,v_proj"):
    adapter = make_adapter(method, r=8, alpha=16, dropout=0.0, targets=targets, recipe="axolotl",
                           quantize_experts=True)
    workload = Workload(resolve_model(model), "causal-lm", "sdpa", weights_dtype="bfloat16", adapter=adapter)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return EstimateBackend(resolve_gpu("A100-40GB"))._model(workload)


def experts_of(fake) -> list[torch.nn.Module]:
    return [m for name, m in fake.model.named_modules() if name.endswith("mlp.experts")]


def stored_bytes(module: torch.nn.Module, name: str) -> int:
    plist = module.parametrizations[name]
    tensors = [plist.original, *plist[0].buffers()]
    return sum(t.untyped_storage().nbytes() for t in tensors)


def test_4bit_experts_store_what_quantize_4bit_stores():
    fake = fake_model("qlora")
    experts = experts_of(fake)
    assert len(experts) == LAYERS
    for module in experts:
        for name, shape in (("gate_up_proj", GATE_UP), ("down_proj", DOWN)):
            assert P.is_parametrized(module, name)
            packed = module.parametrizations[name].original
            # functional.quantize_4bit: [(n + 1) // 2, 1] uint8, frozen
            assert (packed.dtype, tuple(packed.shape), packed.requires_grad) == (
                torch.uint8, ((math.prod(shape) + 1) // 2, 1), False)
            # the whole 3D tensor quantized as one: blocks of 64, double quantization
            assert stored_bytes(module, name) == sum(
                nf4_storage_bytes(math.prod(shape), 1, double_quant=True).values())
    # no 3D weight is left in 16 bits, and the optimizer sees none of the packed ones
    assert not [n for n, p in fake.model.named_parameters() if p.ndim >= 3]
    assert not [n for n, p in fake.model.named_parameters() if "experts" in n and p.requires_grad]


def test_8bit_experts_store_int8_and_a_float32_scale_per_row():
    fake = fake_model("lora_8bit")
    for module in experts_of(fake):
        for name, shape in (("gate_up_proj", GATE_UP), ("down_proj", DOWN)):
            quantized = module.parametrizations[name].original
            assert (quantized.dtype, tuple(quantized.shape)) == (torch.int8, shape)
            rows = math.prod(shape[:-1])  # int8_vectorwise_quant: numel / shape[-1] row scales
            assert stored_bytes(module, name) == sum(int8_storage_bytes(shape[-1], rows).values())


def _dequantized(monkeypatch, cls) -> list[weakref.ref]:
    """Weak references to each dequantized weight the parametrization makes from now on."""
    made: list[weakref.ref] = []
    forward = cls.forward

    def watched(self, packed):
        out = forward(self, packed)
        made.append(weakref.ref(out.untyped_storage()))
        return out

    monkeypatch.setattr(cls, "forward", watched)
    return made


def _run(fake, *, grad: bool) -> torch.Tensor:
    ids = torch.zeros((2, 8), dtype=torch.long)
    batch = {"input_ids": ids, "labels": ids}
    with torch.set_grad_enabled(grad):
        return fake.model(**batch).loss


def test_autograd_keeps_each_layer_s_dequantized_experts_until_its_backward(monkeypatch):
    fake = fake_model("qlora")
    made = _dequantized(monkeypatch, EmulatedBnb4bitParametrization)
    with fake.mode_ctx:
        loss = _run(fake, grad=True)
        # grouped_mm saves the whole dequantized weight for the tokens' gradient (LoRA upstream)
        assert len(made) == 2 * LAYERS and all(ref() is not None for ref in made)
        loss.backward()
    assert all(ref() is None for ref in made)


def test_without_grad_the_cache_frees_them_as_the_experts_return(monkeypatch):
    # reentrant checkpointing's forward (no_grad): each dequantized once, none outlives its module
    fake = fake_model("qlora")
    made = _dequantized(monkeypatch, EmulatedBnb4bitParametrization)
    live_after: list[int] = []
    for module in experts_of(fake):  # after bitsandbytes' hooks: the cache is emptied by then
        module.register_forward_hook(lambda *_: live_after.append(sum(r() is not None for r in made)))
    with fake.mode_ctx:
        _run(fake, grad=False)
    assert len(made) == 2 * LAYERS and live_after == [0, 0]
    assert P._cache_enabled == 0 and P._cache == {}


def test_the_cache_dequantizes_a_weight_once_per_forward(monkeypatch):
    fake = fake_model("qlora")
    made = _dequantized(monkeypatch, EmulatedBnb4bitParametrization)
    experts = experts_of(fake)[0]
    # a module that reads its weight twice in one forward (an eager experts loop does, per expert)
    def read_early(module: torch.nn.Module, args: object) -> None:
        module.gate_up_proj  # noqa: B018 - the parametrization runs on access

    experts.register_forward_pre_hook(read_early)
    with fake.mode_ctx:
        _run(fake, grad=False)
    assert len(made) == 2 * LAYERS  # not one more: the second read hit the cache


def test_4bit_dequantization_allocates_absmax_then_the_weight_in_its_dtype():
    fake = fake_model("qlora")
    module = experts_of(fake)[0]
    with fake.mode_ctx, RecordingTracker() as tracker:
        with P.cached():
            module.gate_up_proj  # noqa: B018 - the parametrization runs on access
    made = [(a.shape, a.dtype) for a in tracker.allocations if a.region == DEQUANT_REGION]
    # functional.dequantize_4bit: dequantize_blockwise's float32 absmax (one per block of 64, the
    # offset added in place), then the weight in quant_state.dtype
    assert made == [((math.ceil(math.prod(GATE_UP) / 64),), "float32"), (GATE_UP, "bfloat16")]


def test_8bit_dequantization_is_float32():
    fake = fake_model("lora_8bit")
    module = experts_of(fake)[0]
    made = []
    with fake.mode_ctx, RecordingTracker() as tracker:
        made.append(module.down_proj)
    allocated = [(a.shape, a.dtype) for a in tracker.allocations if a.region == DEQUANT_REGION]
    # _ops.py int8_vectorwise_dequant: A * stats.view(-1, 1) (float32 [rows, in]), * 1/127
    rows = (EXPERTS * HIDDEN, WIDTH)
    assert allocated == [(rows, "float32"), (rows, "float32")]
    assert (made[0].dtype, tuple(made[0].shape)) == (torch.float32, DOWN)


def test_an_8bit_step_runs_its_experts_in_float32_through_the_fallback():
    fake = fake_model("lora_8bit")
    emulation = CudaEmulation(torch.bfloat16, AttentionKernels(flash=True, bf16=True))
    with fake.mode_ctx, RecordingTracker() as tracker, emulation:
        with emulation.forward_region():
            loss = _run(fake, grad=True)
        loss.backward()
    tokens = 2 * 8 * 2  # batch x sequence x experts per token
    products = [a for a in tracker.allocations if a.shape == (tokens, 2 * WIDTH) and a.dtype == "float32"]
    assert products  # the up projection's [tokens, 2 x width] output, float32


def test_the_fallback_allocates_padded_rows_and_saves_the_weight_for_the_tokens_gradient():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        tokens = torch.empty((6, 8), requires_grad=True)
        weight = torch.empty((2, 8, 3))  # 3 float32 columns: rows padded to 16 bytes (4 values)
        offs = torch.tensor([2, 6], dtype=torch.int32)
        saved: list[torch.Tensor] = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
            out = fallback_grouped_mm(tokens, weight, offs)
        assert (tuple(out.shape), out.stride()) == ((6, 3), (4, 1))
        assert out.untyped_storage().nbytes() == (5 * 4 + 3) * 4  # the last row unpadded
        assert any(t is weight for t in saved) and not any(t is tokens for t in saved)
        out.sum().backward()
        assert tuple(tokens.grad.shape) == (6, 8)


def test_peft_skips_the_parametrization_lists_a_target_name_matches():
    # GLM's shared experts and dense layer have a down_proj; so does experts.parametrizations
    fake = fake_model("qlora", "tiny-glm4_moe", targets="q_proj,down_proj")
    adapted = {n.rsplit(".lora_A", 1)[0] for n, _ in fake.model.named_parameters() if ".lora_A." in n}
    assert adapted and not [n for n in adapted if "parametrizations" in n]
    assert fake.model.peft_config["default"].exclude_modules == r".*\.parametrizations\..*"
    assert P.is_parametrized(experts_of(fake)[0], "down_proj")


@pytest.mark.parametrize("model", ["tiny-glm4_moe", "tiny-glm4_moe_lite"])
def test_glm_experts_are_quantized_past_the_dense_first_layer(model):
    fake = fake_model("qlora", model, targets="o_proj")  # GLM-4.7-Flash's latent attention has no q_proj
    experts = experts_of(fake)
    assert len(experts) == 1  # first_k_dense_replace 1 of 2 layers
    assert all(P.is_parametrized(experts[0], name) for name in ("gate_up_proj", "down_proj"))
