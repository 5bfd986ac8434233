"""Axolotl's ScatterMoE experts, emulated (workload/scattermoe.py): on a CPU the emulation gives
transformers' eager experts' outputs and gradients, allocates ParallelLinear's buffers (sizes cited
from Axolotl's libs/scattermoe_lora source), and is what every experts module of a mixture calls."""

from __future__ import annotations

import contextlib
import dataclasses

import pytest
import torch
from allocations import Allocations
from transformers import Qwen3MoeConfig
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts

from autotune.workload import scattermoe

T, H, M, E, K = 12, 16, 8, 4, 2  # tokens, hidden, expert intermediate, experts, experts per token


def experts(dtype: torch.dtype = torch.float32) -> Qwen3MoeExperts:
    torch.manual_seed(0)
    config = Qwen3MoeConfig(hidden_size=H, moe_intermediate_size=M, num_experts=E, num_experts_per_tok=K)
    module = Qwen3MoeExperts(config).to(dtype)
    with torch.no_grad():
        module.gate_up_proj.normal_()
        module.down_proj.normal_()
    return module


def routing(dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    torch.manual_seed(1)
    x = torch.randn(T, H, dtype=dtype, requires_grad=True)
    index = torch.stack([torch.randperm(E)[:K] for _ in range(T)])
    weights = torch.rand(T, K, dtype=dtype).requires_grad_()
    return x, index, weights


def test_outputs_and_gradients_are_the_eager_experts() -> None:
    module = experts()
    x, index, weights = routing()
    want = module(x, index, weights)  # Qwen3MoeExperts.forward: transformers' eager loop
    want_grads = torch.autograd.grad(want.square().sum(), [x, weights, module.gate_up_proj, module.down_proj])
    got = scattermoe.experts_forward(module, x, index, weights)
    grads = torch.autograd.grad(got.square().sum(), [x, weights, module.gate_up_proj, module.down_proj])
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    for mine, theirs in zip(grads, want_grads, strict=True):
        torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-3)


def test_gemma4s_experts_give_their_eager_outputs_and_gradients() -> None:
    """Gemma4TextExperts (modeling_gemma4.py): Qwen3MoeExperts' layout, GeGLU (gelu_pytorch_tanh)."""
    from transformers import Gemma4TextConfig
    from transformers.models.gemma4.modeling_gemma4 import Gemma4TextExperts

    torch.manual_seed(0)
    config = Gemma4TextConfig(hidden_size=H, moe_intermediate_size=M, num_experts=E, top_k_experts=K,
                              enable_moe_block=True)
    module = Gemma4TextExperts(config)
    with torch.no_grad():
        module.gate_up_proj.normal_()
        module.down_proj.normal_()
    x, index, weights = routing()
    params = [x, weights, module.gate_up_proj, module.down_proj]
    want = module(x, index, weights)  # Gemma4TextExperts.forward: the eager loop
    want_grads = torch.autograd.grad(want.square().sum(), params)
    assert scattermoe.apply(module, contextlib.nullcontext) == 1
    got = module(x, index, weights)
    grads = torch.autograd.grad(got.square().sum(), params)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    for mine, theirs in zip(grads, want_grads, strict=True):
        torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-3)


# What the kernel's source allocates with: the ops whose outputs Allocations records.
ALLOCATING = ("empty", "empty_like", "zeros", "bmm", "cumsum", "sort", "sum")


def test_allocations_are_parallel_linears_buffers() -> None:
    bf16, long = torch.bfloat16, torch.long
    module = experts(bf16)
    module.requires_grad_(False)  # the base frozen, as under an adapter on the attention
    x, index, weights = routing(bf16)
    mode = Allocations(ALLOCATING)
    with mode:
        out = scattermoe.experts_forward(module, x, index, weights, registers=mode.registers)
        forward = list(mode.made)
        mode.made.clear()
        out.backward(torch.ones_like(out))
    L = T * K
    assert forward == [
        ((L,), long), ((L,), long),  # flatten_sort_count: torch.sort's values and positions
        ((E,), long), ((E,), long),  # bincount's fake torch.empty(minlength, long), cumsum
        ((L, 2 * M), bf16),  # ParallelLinear(gate_up): scatter2scatter's torch.empty((L, y_dim))
        ((L, H), bf16),  # ParallelLinear(down): scatter2scatter's output, saved as output_expanded
        ((T, 1, H), bf16),  # (gates.unsqueeze(1) @ output_expanded)
    ]
    assert mode.made == [
        ((T, K, 1), bf16),  # down's backward: d_gates = output_expanded @ grad_out.unsqueeze(-1)
        ((E, H, M), bf16),  # group_bwd_W: DWt = torch.zeros((E, DY.size(-1), X.size(-1)))
        ((L, M), bf16),  # scatter2scatter(X=grouped_grad_out, W=W.permute(0, 2, 1), k=1)
        ((L, H), bf16),  # gate_up's backward: group(x, fan_out=k)'s torch.empty((N, K))
        ((E, 2 * M, H), bf16),  # group_bwd_W's DWt
        ((T, H), bf16),  # d_expanded_input.view(T, k, H).sum(-2)
    ]


@pytest.mark.parametrize("preset", ["tiny-qwen3_5_moe_text", "tiny-gemma4_text"])
def test_every_experts_module_of_a_mixture_calls_the_emulation(preset: str) -> None:
    from autotune.workload.models import resolve_model

    spec = resolve_model(preset)
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(spec.config)
    assert scattermoe.apply(model, contextlib.nullcontext) == spec.config.num_hidden_layers
    ids = torch.zeros(1, 8, dtype=torch.long)
    model(input_ids=ids, labels=ids).loss.backward()


@pytest.mark.parametrize("model", ["tiny-qwen3_moe", "tiny-minimax_m2",
                                   pytest.param("tiny-gemma4_text", marks=pytest.mark.slow)])
def test_a_check_of_a_qwen3_moe_with_it_differs_from_transformers_grouped_mm(model: str) -> None:
    import autotune

    peaks = {kernel: autotune.check(model, seq_len=128, batch_size=256, mode="bf16",
                                    dtype="bfloat16", gpu="H100-80GB", backend="estimate", workers=1,
                                    experts_kernel=kernel).peak_memory_bytes
             for kernel in (None, "scattermoe")}
    # ParallelLinear keeps other tensors than grouped_mm's experts (test_allocations_are_parallel_linears_
    # buffers): sort's indices, scatter2scatter's outputs, output_expanded
    assert peaks[None] is not None and peaks["scattermoe"] is not None
    assert peaks["scattermoe"] != peaks[None]


@pytest.mark.parametrize(("model", "why"), [
    ("tiny-mixtral", "not for model type mixtral's"),
    ("tiny-llama", "not for model type llama's"),
])
def test_a_model_whose_experts_it_does_not_emulate_is_refused_by_name(model: str, why: str) -> None:
    import autotune
    from autotune.errors import InvalidInput

    with pytest.raises(InvalidInput, match=rf"ScatterMoE experts .* are emulated for .*, {why}"):
        autotune.check(model, seq_len=64, batch_size=1, gpu="H100-80GB", backend="estimate",
                       experts_kernel="scattermoe")


def test_8bit_experts_and_the_cuda_backend_are_refused_by_name() -> None:
    from autotune.backends.cuda.backend import CudaBackend
    from autotune.errors import BackendUnavailable, InvalidInput
    from autotune.request import check_experts_kernel
    from autotune.workload import Workload
    from autotune.workload.adapters import make_adapter
    from autotune.workload.models import resolve_model

    spec = resolve_model("tiny-qwen3_moe")
    eight = dataclasses.replace(make_adapter("lora_8bit", targets=("q_proj",)), quantize_experts=True)
    with pytest.raises(InvalidInput, match="ScatterMoE over 8-bit experts .* is not emulated"):
        check_experts_kernel("scattermoe", spec, eight)
    with pytest.raises(InvalidInput, match="unknown experts_kernel 'sonicmoe': allowed are scattermoe"):
        check_experts_kernel("sonicmoe", spec, None)
    workload = Workload(spec, "causal-lm", None, experts_kernel="scattermoe")
    backend = CudaBackend.__new__(CudaBackend)  # no GPU here: the refusal comes before any worker
    with pytest.raises(BackendUnavailable, match="experts kernel scattermoe .* estimate backend only"):
        with backend.cell(workload, None, 64, 1 << 30):  # type: ignore[arg-type]
            pass


def wrapped_experts(dtype: torch.dtype = torch.float32, names: tuple[str, ...] = ("gate_up_proj", "down_proj")
                    ) -> torch.nn.Module:
    """Experts in a PEFT ParamWrapper chain (target_parameters), LoRA B random (not PEFT's zeros)."""
    from peft import LoraConfig, get_peft_model

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.experts = experts(dtype)

        def forward(self, *args):
            return self.experts(*args)

    torch.manual_seed(2)
    config = LoraConfig(r=2, lora_alpha=4, target_modules=[], init_lora_weights=False,
                        target_parameters=[f"experts.{n}" for n in names])
    return get_peft_model(Block(), config).base_model.model


def lora_weights(block) -> list[torch.Tensor]:
    return [p for n, p in block.named_parameters() if "lora_" in n]


@pytest.mark.parametrize("names", [("gate_up_proj", "down_proj"), ("down_proj",)])
def test_lora_on_the_experts_gives_peft_s_merged_outputs_and_gradients(names) -> None:
    block = wrapped_experts(names=names)
    x, index, weights = routing()
    want = block(x, index, weights)  # PEFT's ParamWrapper: the delta merged, transformers' eager loop
    want_grads = torch.autograd.grad(want.square().sum(), [x, weights, *lora_weights(block)])
    assert scattermoe.apply(block, contextlib.nullcontext) == 1
    assert scattermoe.route_lora(block, contextlib.nullcontext) == 1
    got = block(x, index, weights)  # the fast path: ScatterMoELoRA on each LoRA'd projection
    grads = torch.autograd.grad(got.square().sum(), [x, weights, *lora_weights(block)])
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    for mine, theirs in zip(grads, want_grads, strict=True):
        torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-3)


def test_lora_allocations_are_scattermoe_lora_s_buffers() -> None:
    bf16, f32, long = torch.bfloat16, torch.float32, torch.long
    block = wrapped_experts(bf16)  # PEFT's LoRA float32, the base frozen
    x, index, weights = routing(bf16)
    mode = Allocations((*ALLOCATING, "_to_copy", "clone", "index"))
    scattermoe.apply(block, mode.registers)
    scattermoe.route_lora(block, mode.registers)
    with mode:
        out = block(x, index, weights)
        forward = list(mode.made)
        mode.made.clear()
        out.backward(torch.ones_like(out))
    L, r = T * K, 2
    assert forward == [
        # experts_lora_fastpath.py, the outer wrapper (down_proj: A [r*E, M], B [H, r*E]) first: A and B
        # cast to the activations' dtype, B's expert-major copy (peft_lora_B_to_scattermoe: contiguous)
        ((r * E, M), bf16), ((H, r * E), bf16), ((H, E, r), bf16),
        ((r * E, H), bf16), ((2 * M, r * E), bf16), ((2 * M, E, r), bf16),  # then gate_up_proj's
        ((L,), long), ((L,), long), ((E,), long), ((E,), long),  # flatten_sort_count
        ((L, 2 * M), bf16),  # ScatterMoELoRA(gate_up): scatter2scatter_lora's torch.empty((L, N))
        ((L, H), bf16),  # ScatterMoELoRA(down): its output, saved as output_expanded
        ((T, 1, H), bf16),  # (gates.unsqueeze(1) @ output_expanded)
    ]
    assert mode.made == [
        ((T, K, 1), bf16),  # down's backward: d_gates; group(grad_out) into output_expanded
        ((E, H, r), bf16), ((L, r), bf16),  # w_yb = lora_B...permute(1, 0, 2).contiguous(), yb
        ((E, M, r), bf16), ((L, r), bf16),  # w_xa = lora_A...permute(0, 2, 1).contiguous(), xa
        ((r * E, M), bf16), ((H, r * E), bf16),  # grouped_lora_weight_grads: empty_like(A), empty_like(B)
        ((L, M), bf16),  # scatter2scatter(grouped_grad_out, W^T): d_expanded_input (x grouped)
        ((L, M), bf16),  # _compute_lora_input_grad's scatter2scatter(yb, A), added in place
        ((L, H), bf16),  # gate_up's backward: group(x, fan_out=k), reused as d_expanded_input
        ((E, 2 * M, r), bf16), ((L, r), bf16), ((E, H, r), bf16), ((L, r), bf16),  # w_yb, yb, w_xa, xa
        ((r * E, H), bf16), ((2 * M, r * E), bf16),  # dA, dB
        ((L, H), bf16),  # _compute_lora_input_grad's product
        ((L, H), bf16),  # d_expanded_input[sorted_scattered_idxs] += ...: the index's copy
        ((T, H), bf16),  # d_expanded_input.view(T, k, H).sum(-2)
        # autograd through the fast path: B's layout copy, then the casts' float32 gradients
        ((2 * M, r, E), bf16), ((2 * M, r * E), f32), ((r * E, H), f32),
        ((H, r, E), bf16), ((H, r * E), f32), ((r * E, M), f32),
    ]


def test_lora_on_the_experts_under_sharding_is_refused_by_name() -> None:
    # the emulation's fused LoRA reads lora_A and lora_B outside their forward: sharded (DTensors) there
    from autotune.errors import UnmodelledSetting

    with pytest.raises(UnmodelledSetting, match=r"^LoRA on the experts \(experts.gate_up_proj\) under "
                       r"ScatterMoE with FSDP2 is not emulated yet"):
        scattermoe.check_sharding("FSDP2", ("experts.gate_up_proj",))
    scattermoe.check_sharding(None, ("experts.gate_up_proj",))  # one GPU, DDP
    scattermoe.check_sharding("FSDP2", ())  # no LoRA on the experts
