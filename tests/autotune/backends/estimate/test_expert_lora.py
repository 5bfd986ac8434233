"""LoRA on a mixture's fused expert weights (PEFT's ParamWrapper) under the estimator. PEFT 0.21
puts it there for ``all-linear`` on transformers 5's fused experts
(utils/transformers_weight_conversion.py ``_convert_peft_config_moe``: the experts' gate_up_proj and
down_proj, and the router's gate.weight, become target_parameters)."""

from __future__ import annotations

import warnings

import torch

from autotune.backends.estimate.attention import AttentionKernels
from autotune.backends.estimate.backend import EstimateBackend
from autotune.backends.estimate.emulation import CudaEmulation
from autotune.gpus import resolve_gpu
from autotune.workload import Workload
from autotune.workload.adapters import make_adapter
from autotune.workload.models import resolve_model


def fake_model(method: str, model: str = "tiny-qwen3_moe"):
    adapter = make_adapter(method, r=8, alpha=16, dropout=0.0, targets="all-linear", recipe="axolotl")
    workload = Workload(resolve_model(model), "causal-lm", "sdpa", weights_dtype="bfloat16", adapter=adapter)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return EstimateBackend(resolve_gpu("H100-80GB"))._model(workload)


# The estimator crashed here until emulation.py followed torch's autocast state, so that regions a
# model runs with autocast disabled (PEFT's _LoraFactorsProxy.forward) run uncast, as on CUDA.
def test_qlora_on_fused_experts_traces_their_float32_weights_under_bf16_autocast():
    # prepare_model_for_kbit_training casts every 16-bit parameter that bitsandbytes did not
    # quantize (the fused experts: it replaces nn.Linear only) to float32, and Axolotl casts back
    # only norms and embeddings (loaders/model.py _convert_embedding_modules_dtype). PEFT's
    # _LoraFactorsProxy.forward folds the LoRA into them with torch.autocast(W.device.type,
    # enabled=False) around its baddbmm, so on CUDA the parametrized weight stays float32 and
    # register_parametrization's dtype check passes; an emulated autocast that kept casting
    # there raised "Registering a parametrization may not change the dtype".
    fake = fake_model("qlora")
    experts = [m for m in fake.model.modules() if type(m).__name__ == "Qwen3MoeExperts"]
    assert experts and all(m.gate_up_proj.dtype == torch.float32 for m in experts)
    wrapped = [m for m in fake.model.modules() if type(m).__name__ == "ParamWrapper"]
    assert {m.parameter_name for m in wrapped} == {"gate_up_proj", "down_proj", "weight"}
    folded: list[torch.dtype] = []  # the weights the experts multiply with, LoRA folded in
    for module in experts:
        module.register_forward_hook(
            lambda m, *_: folded.extend((m.gate_up_proj.dtype, m.down_proj.dtype)))
    emulation = CudaEmulation(torch.bfloat16, AttentionKernels(flash=True, bf16=True))
    with fake.mode_ctx, emulation:
        ids = torch.zeros((2, 8), dtype=torch.long)
        with emulation.forward_region():
            loss = fake.model(input_ids=ids, labels=ids).loss
        loss.backward()
    assert folded and set(folded) == {torch.float32}
    grads = [p.grad for m in wrapped for p in m.lora_A.parameters()]
    assert grads and all(g is not None and g.dtype == torch.float32 for g in grads)


EXPERTS = ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")


def test_lora_on_quantized_experts_merges_a_delta_as_axolotl_s_pinned_peft_and_runs_twice():
    # quantize_moe_experts + lora_target_parameters: Axolotl's suffix matching reaches the
    # parametrized experts (patch_peft_target_parameters_matching); each forward registers
    # peft 0.19.1's _LoraParameterProxy over the 4-bit parametrization and removes it after.
    adapter = make_adapter("qlora", r=8, alpha=16, dropout=0.0, targets=(), parameters=EXPERTS,
                           recipe="axolotl", quantize_experts=True)
    workload = Workload(resolve_model("tiny-qwen3_moe"), "causal-lm", "sdpa", weights_dtype="bfloat16",
                        adapter=adapter)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fake = EstimateBackend(resolve_gpu("H100-80GB"))._model(workload)
    wrapped = [m for m in fake.model.modules() if type(m).__name__ == "ParamWrapper"]
    assert sorted(m.parameter_name for m in wrapped) == ["down_proj"] * 2 + ["gate_up_proj"] * 2
    experts = [m.get_base_layer() for m in wrapped]
    proxies: list[str] = []
    for module in set(experts):
        module.register_forward_hook(lambda m, *_: proxies.extend(
            type(p).__name__ for name in ("gate_up_proj", "down_proj") for p in m.parametrizations[name]))
    with fake.mode_ctx, warnings.catch_warnings():
        warnings.simplefilter("error")  # PEFT's "Could not find any LoRA parametrization"
        ids = torch.zeros((2, 8), dtype=torch.long)
        for _ in range(2):  # the second forward failed on the proxy the first left behind
            fake.model(input_ids=ids, labels=ids).loss.backward()
    assert proxies.count("_LoraParameterProxy") == 2 * len(wrapped)
    assert all(len(m.parametrizations[n]) == 1 for m in experts for n in ("gate_up_proj", "down_proj"))
    # the outer wrapper's LoRA trains; the inner one's parameter was read (get_param) under the outer
    # one's parametrize.cached() before its proxy was registered, so the experts read that cached
    # weight without it: PEFT's own order, traced as it is
    outer = [m for m in wrapped if type(m.base_layer).__name__ == "ParamWrapper"]
    assert outer and all(p.grad is not None for m in outer for p in m.lora_B.parameters())
