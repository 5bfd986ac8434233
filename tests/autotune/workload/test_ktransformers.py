"""LLaMA-Factory's use_kt (workload/ktransformers.py): the MoE blocks as kt-kernel's KTMoELayerWrapper
leaves them on the GPU (routed experts gone, the router behind an nn.Linear proxy that PEFT targets),
its routing KT's, and KTMoEFunction's GPU allocations those of kt-kernel's sft/base.py buffers."""

from __future__ import annotations

import pytest
import torch
from allocations import Allocations
from peft import LoraConfig, get_peft_model
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

from autotune.backends.estimate.backend import EstimateBackend
from autotune.errors import JobFails, UnmodelledSetting
from autotune.gpus import resolve_gpu
from autotune.units import format_bytes
from autotune.workload import Workload, ktransformers
from autotune.workload.adapters import make_adapter
from autotune.workload.models import resolve_model
from autotune.workload.presets import PRESETS

H, E, K = 32, 4, 2  # hidden, routed experts, experts per token


def qwen3_moe() -> Qwen3MoeForCausalLM:
    torch.manual_seed(0)
    config = Qwen3MoeConfig(hidden_size=H, intermediate_size=64, moe_intermediate_size=16, num_experts=E,
                            num_experts_per_tok=K, num_hidden_layers=2, num_attention_heads=2,
                            num_key_value_heads=1, head_dim=16, vocab_size=128)
    return Qwen3MoeForCausalLM(config).to(torch.bfloat16)


def deepseek_v3() -> DeepseekV3ForCausalLM:
    torch.manual_seed(0)
    config = DeepseekV3Config(hidden_size=H, intermediate_size=64, moe_intermediate_size=16,
                              n_routed_experts=8, num_experts_per_tok=K, n_group=2, topk_group=1,
                              n_shared_experts=1,
                              first_k_dense_replace=1, num_hidden_layers=2, num_attention_heads=2,
                              num_key_value_heads=2, q_lora_rank=16, kv_lora_rank=16, qk_nope_head_dim=8,
                              qk_rope_head_dim=8, v_head_dim=16, vocab_size=128)
    return DeepseekV3ForCausalLM(config).to(torch.bfloat16)


def test_the_routed_experts_leave_the_gpu_model_and_the_router_is_a_linear_peft_targets() -> None:
    model = qwen3_moe()
    before = {name for name, _ in model.named_parameters()}
    assert ktransformers.apply(model, "qwen3_moe") == 2
    after = {name for name, _ in model.named_parameters()}
    assert {n for n in before - after} == {f"model.layers.{i}.mlp.experts.{w}" for i in range(2)
                                           for w in ("gate_up_proj", "down_proj")}
    block = model.model.layers[0].mlp
    assert isinstance(block.gate, torch.nn.Linear) and block.gate.weight is block.kt_router.weight
    wrapped = get_peft_model(model, LoraConfig(target_modules="all-linear", r=8))
    lora = {n for n, p in wrapped.named_parameters() if p.requires_grad}
    assert "base_model.model.model.layers.0.mlp.gate.lora_A.default.weight" in lora
    assert not any("experts" in n for n in lora)


def test_qwen_routing_is_the_routers_own() -> None:
    model = qwen3_moe()
    router = model.model.layers[0].mlp.gate
    x = torch.randn(1, 6, H, dtype=torch.bfloat16)
    _, want_weights, want_ids = router(x.view(-1, H))
    ktransformers.apply(model, "qwen3_moe")
    ids, weights = ktransformers._route(model.model.layers[0].mlp, x)
    assert torch.equal(ids, want_ids)
    torch.testing.assert_close(weights, want_weights.to(torch.bfloat16))


def test_deepseek_routing_is_the_routers_own() -> None:
    model = deepseek_v3()
    block = model.model.layers[1].mlp
    torch.nn.init.normal_(block.gate.weight)
    x = torch.randn(1, 6, H, dtype=torch.bfloat16)
    _, want_weights, want_ids = block.gate(x.view(-1, H))
    ktransformers.apply(model, "deepseek_v3")
    ids, weights = ktransformers._route(block, x)
    order, want_order = ids.sort(-1), want_ids.sort(-1)
    assert torch.equal(order.values, want_order.values)
    torch.testing.assert_close(weights.gather(1, order.indices).float(),
                               want_weights.gather(1, want_order.indices).float(), rtol=1e-2, atol=1e-2)


# What kt-kernel's copies allocate: the ops whose outputs Allocations records.
ALLOCATING = ("empty", "new_empty", "_to_copy")


def test_the_gpu_side_of_the_cpu_experts_is_base_pys_buffers() -> None:
    B, S, T = 2, 3, 6
    x = torch.randn(B, S, H, dtype=torch.bfloat16, requires_grad=True)
    ids = torch.randint(0, E, (T, K))
    weights = torch.rand(T, K, dtype=torch.bfloat16, requires_grad=True)
    mode = Allocations(ALLOCATING)
    with mode:
        out = ktransformers.function().apply(x, ids, weights)
        forward = list(mode.made)
        mode.made.clear()
        out.backward(torch.ones_like(out))
    assert forward == [
        ((T, K), torch.float32),  # _copy_inputs_to_buffer: weights.to(float32)
        ((T, H), torch.bfloat16),  # _return_output: output_cpu[:qlen].to(device)
        ((), torch.bfloat16),  # save_for_backward's sentinel, hidden_states.new_empty(())
    ]
    assert mode.made[-3:] == [
        ((T, H), torch.bfloat16),  # _return_grads: grad_input_cpu[:qlen].to(device)
        ((T, K), torch.float32),  # grad_weights[:qlen].to(device)
        ((T, K), torch.bfloat16),  # KTMoEFunction.backward: grad_weights.to(bfloat16)
    ]
    assert x.grad is not None and x.grad.shape == x.shape
    assert weights.grad is not None and weights.grad.shape == weights.shape


def test_what_kt_refuses_fails_and_mixtral_is_not_modelled() -> None:
    with pytest.raises(JobFails, match="correction bias"):
        ktransformers.check_model("deepseek_v2")
    with pytest.raises(JobFails, match="not supported for KT AMX"):
        ktransformers.check_model("llama")
    with pytest.raises(UnmodelledSetting, match="Mixtral"):
        ktransformers.check_model("mixtral")
    ktransformers.check_model("qwen3_5_moe")


def test_the_host_note_sizes_every_moe_layers_experts() -> None:
    # Qwen3-235B-A22B: 94 layers, all sparse, 128 experts of 3 x 4096 x 1536
    experts = 94 * 128 * 3 * 4096 * 1536
    assert format_bytes(2 * experts) in ktransformers.host_note(PRESETS["Qwen/Qwen3-235B-A22B"], "bf16")
    assert format_bytes(experts) in ktransformers.host_note(PRESETS["Qwen/Qwen3-235B-A22B"], "int8")
    # DeepSeek-V3: 61 layers, the first 3 dense, 256 experts of 3 x 7168 x 2048
    assert format_bytes(2 * 58 * 256 * 3 * 7168 * 2048) in ktransformers.host_note(
        PRESETS["deepseek-ai/DeepSeek-V3"], "bf16")


def test_the_estimators_model_holds_no_routed_expert_and_lora_on_the_routers() -> None:
    adapter = make_adapter("lora", targets="all-linear", dropout=0.0)
    workload = Workload(resolve_model("tiny-qwen3_moe"), "causal-lm", None, weights_dtype="bfloat16",
                        adapter=adapter, experts_kernel=ktransformers.KTRANSFORMERS)
    backend = EstimateBackend(resolve_gpu("H100-80GB"))
    names = [name for name, _ in backend._model(workload).model.named_parameters()]
    assert not any(".experts." in name for name in names)
    assert any(name.endswith("mlp.gate.lora_A.default.weight") for name in names)
    plain_workload = Workload(workload.model, "causal-lm", None, weights_dtype="bfloat16", adapter=adapter)
    plain = [name for name, _ in backend._model(plain_workload).model.named_parameters()]
    assert any(".experts." in name for name in plain)  # transformers' own experts, on the GPU
