"""LLaMA-Factory's ``use_kt: true``: KTransformers runs the routed experts on the CPU, emulated.

What the GPU holds, read from kvcache-ai/ktransformers at 95009ea (kt-kernel/python/sft/) and
LLaMA-Factory's hparams/model_args.py ``KTransformersArguments``:

- wrapper.py ``wrap_moe_layers_with_kt_wrapper`` swaps each MoE block for layer.py
  ``KTMoELayerWrapper``, which keeps the block's router, experts and shared experts as submodules; its
  ``_apply`` leaves the experts out of ``.to(device)`` (the routed experts and PEFT's LoRA on them stay
  in host memory, in the C++ backend's buffers: the LoRA's AdamW state with them), and arch.py
  ``move_non_experts_to_gpu`` puts the rest on the GPU: attention, dense layers, shared experts,
  routers, embeddings and head, with LoRA on them and their optimizer state as usual;
- a router that is no ``nn.Linear`` (transformers v5's TopKRouter) is wrapped in an ``nn.Linear``
  sharing its weight (``_DeepseekRouterLinear``, float32, for DeepSeek) "so PEFT can discover and inject
  LoRA": LLaMA-Factory's ``lora_target: all`` (find_all_linear_modules) then puts LoRA on the routers;
- ``KTMoELayerWrapper.forward``: ``_compute_routing`` on the GPU (softmax or DeepSeek's grouped
  sigmoid top-k, the weights cast to bfloat16 by ``finish``), ``_submit_and_compute_gpu`` (base.py
  ``_copy_inputs_to_buffer``: ``hidden_states.to(bfloat16)``, ``expert_ids.to(int64)``,
  ``weights.to(float32)`` copied to the host; then the shared experts on the GPU), autograd.py
  ``KTMoEFunction``: ``sync_forward`` copies the routed output back (``output_cpu[:qlen].to(device)``:
  [tokens, hidden] bfloat16) and saves only an empty sentinel; its backward copies the gradient out
  (``grad_output.to(bfloat16)``) and back (base.py ``_return_grads``: grad_input [tokens, hidden]
  bfloat16, grad_weights [tokens, top_k] float32, then ``.to(bfloat16)``).

Those allocations are made here with the same shapes and dtypes, in that order; the experts' compute
is not on the GPU. Emulated, not traced: kt_kernel's C++ backend does not run here.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from types import MethodType
from typing import TYPE_CHECKING, Any

from autotune.errors import JobFails, UnmodelledSetting
from autotune.units import format_bytes

if TYPE_CHECKING:
    import torch

KTRANSFORMERS = "ktransformers"  # the value of Workload.experts_kernel
NOTE = "use_kt: experts on the CPU (KTransformers), emulated"
# arch.py get_moe_arch_config: the architectures KT wraps, by model type, and their router_type
ROUTERS = {"deepseek_v2": "deepseek_gate", "deepseek_v3": "deepseek_gate", "qwen2_moe": "linear",
           "qwen3_moe": "linear", "qwen3_vl_moe": "linear", "qwen3_5_moe": "linear",
           "glm4_moe": "glm4_moe_gate"}
_SUPPORTED = "DeepseekV2, DeepseekV3, Qwen2Moe, Qwen3Moe, Qwen3VLMoe, Qwen3_5Moe, Glm4Moe, Mixtral"


def check_model(model_type: str | None) -> None:
    """What KT refuses for this model type, in its words; Mixtral (``block_sparse_moe``) not modelled."""
    if model_type == "mixtral":
        raise UnmodelledSetting("use_kt: true on Mixtral (KT's block_sparse_moe layout) is not modelled")
    if model_type not in ROUTERS:
        raise JobFails(f"use_kt: true on {model_type}: kt-kernel's sft/arch.py get_moe_arch_config raises "
                       f"\"Model architecture ... not supported for KT AMX. Supported architectures: "
                       f"{_SUPPORTED}\"")
    if model_type == "deepseek_v2":
        # layer.py KTMoELayerWrapper.__init__: a deepseek_gate router wrapped in _DeepseekRouterLinear must
        # carry e_score_correction_bias of shape (n_routed_experts,); DeepSeek-V2's router has none
        # (transformers models/deepseek_v2 DeepseekV2TopkRouter; the Hub's modeling_deepseek.py MoEGate)
        raise JobFails("use_kt: true on DeepSeek-V2: kt-kernel's sft/layer.py KTMoELayerWrapper raises "
                       "\"Layer 1: DeepSeek correction bias must have shape (64,), got None\" (its "
                       "DeepseekV2 router_type is deepseek_gate, which reads e_score_correction_bias; "
                       "DeepSeek-V2's router has no such buffer)")


def _moe_layers(text: Mapping[str, Any]) -> int:
    """How many decoder layers have routed experts (the models' own rules: first_k_dense_replace for
    DeepSeek and GLM-4-MoE, mlp_only_layers and decoder_sparse_step for the Qwen mixtures)."""
    layers = int(text["num_hidden_layers"])
    if "first_k_dense_replace" in text:
        return layers - int(text.get("first_k_dense_replace") or 0)
    step = int(text.get("decoder_sparse_step") or 1)
    dense = set(text.get("mlp_only_layers") or ())
    return sum(1 for i in range(layers) if i not in dense and (i + 1) % step == 0)


def host_note(config: Mapping[str, Any], weight_format: str | None) -> str:
    """The host memory the routed experts' weights take at least (``kt_expert_weight_format``, bf16
    where not set), from a preset's config."""
    weight_format = weight_format or "bf16"
    text = config.get("text_config") or config
    experts = int(text.get("n_routed_experts") or text.get("num_experts") or 0)
    per_layer = experts * 3 * int(text["hidden_size"]) * int(text["moe_intermediate_size"])
    width = 1 if weight_format == "int8" else 2
    total = _moe_layers(text) * per_layer * width
    return (f"host memory: the routed experts' {weight_format} weights, {format_bytes(total)} at least "
            "(kt-kernel holds them in RAM; its transposed copies for backward, the experts' LoRA with "
            "its AdamW state and its activation caches come on top, not counted); not in the GPU's figures")


@functools.cache
def function() -> Any:
    """autograd.py ``KTMoEFunction`` on one GPU: what it and base.py's buffers allocate on the GPU."""
    import torch

    class KTMoEFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, hidden: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
            batch, seq, size = hidden.shape
            # base.py _copy_inputs_to_buffer: the casts made on the GPU, copied to host, dropped
            for staged in (hidden.to(torch.bfloat16), ids.to(torch.int64), weights.to(torch.float32)):
                del staged
            # sync_forward -> _return_output: output_cpu[:qlen].to(device), then to the input's dtype
            out = torch.empty(batch * seq, size, dtype=torch.bfloat16, device=hidden.device)
            out = out.view(batch, seq, size).to(dtype=hidden.dtype)
            ctx.save_for_backward(hidden.new_empty(()))  # the sentinel for checkpoint's hooks
            ctx.shape, ctx.dtype = (batch, seq, size), hidden.dtype
            ctx.weights = (weights.shape, weights.device)
            return out

        @staticmethod
        def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
            batch, seq, size = ctx.shape
            staged = grad.reshape(batch * seq, size).to(torch.bfloat16)  # _copy_grad_output_to_cpu
            del staged
            shape, device = ctx.weights
            # _return_grads: grad_input_cpu[:qlen] and grad_weights[:qlen] (float32) to the GPU
            grad_input = torch.empty(batch * seq, size, dtype=torch.bfloat16, device=grad.device)
            grad_weights = torch.empty(batch * seq, shape[-1], dtype=torch.float32, device=device)
            grad_input = grad_input.view(batch, seq, size).to(dtype=ctx.dtype)
            return grad_input, None, grad_weights.to(dtype=torch.bfloat16).view(shape)

    return KTMoEFunction


def _spec(self: Any, *names: str) -> Any:
    """layer.py ``DeepSeekRoutingSpec.from_modules``: a routing setting from the router, else the
    block's config (the first of ``names`` found)."""
    for source in (self.kt_router, getattr(self, "config", None)):
        for name in names:
            if source is not None and getattr(source, name, None) is not None:
                return getattr(source, name)
    raise UnmodelledSetting(f"use_kt: true: the router carries no {names[0]} (KT's DeepSeekRoutingSpec)")


def _route(self: Any, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """layer.py ``_compute_routing`` through the router proxy (LoRA'd by PEFT where targeted), under
    no_grad where nothing of the router trains; ``finish`` casts the weights to bfloat16."""
    import contextlib

    import torch

    router, original = self.gate, self.kt_router
    trains = torch.is_grad_enabled() and any(p.requires_grad for p in router.parameters())
    with contextlib.nullcontext() if trains else torch.no_grad():
        logits = router(hidden.view(-1, hidden.shape[-1]))
        if self.kt_router_type == "linear":
            probs = torch.nn.functional.softmax(logits, dtype=torch.float, dim=-1)
            weights, ids = torch.topk(probs, original.top_k, dim=-1)
            if getattr(original, "norm_topk_prob", True):
                weights = weights / weights.sum(dim=-1, keepdim=True)
            weights = weights.to(logits.dtype)
        else:  # deepseek_gate, glm4_moe_gate: grouped sigmoid top-k with the correction bias
            probs = torch.sigmoid(logits.float())
            bias = original.e_score_correction_bias
            choice = probs + bias.to(device=probs.device, dtype=probs.dtype)
            experts, groups = probs.shape[-1], _spec(self, "n_group", "num_group")
            group_scores = choice.view(-1, groups, experts // groups).topk(2, dim=-1)[0].sum(dim=-1)
            group_idx = torch.topk(group_scores, k=_spec(self, "topk_group"), dim=-1, sorted=False)[1]
            mask = torch.zeros_like(group_scores, dtype=torch.bool)
            mask.scatter_(1, group_idx, True)
            score_mask = mask.unsqueeze(-1).expand(-1, groups, experts // groups).reshape(-1, experts)
            choice = choice.masked_fill(~score_mask, 0.0)
            ids = torch.topk(choice, k=original.top_k, dim=-1, sorted=False)[1]
            weights = probs.gather(1, ids)
            if _spec(self, "norm_topk_prob"):
                weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
            weights = weights * _spec(self, "routed_scaling_factor")
        return ids, weights.to(torch.bfloat16)


def _shared(self: Any, hidden: torch.Tensor) -> torch.Tensor | None:
    """layer.py ``_compute_shared_expert``: DeepSeek's ``shared_experts``, Qwen's gated ``shared_expert``."""
    import torch

    for name in ("shared_experts", "shared_expert"):
        module = getattr(self, name, None)
        if module is not None:
            out = module(hidden)
            gate = getattr(self, "shared_expert_gate", None)
            return out if gate is None else torch.sigmoid(gate(hidden)) * out
    return None


def _forward(self: Any, hidden: torch.Tensor) -> torch.Tensor:
    """``KTMoELayerWrapper.forward`` on one GPU: route, submit (the casts), shared experts, the routed
    output back from the host, summed."""
    ids, weights = _route(self, hidden)
    shared = _shared(self, hidden)
    out = function().apply(hidden, ids, weights)
    return out if shared is None else out + shared


class _RouterLinear:
    """The router proxies: an ``nn.Linear`` over the router's own weight (layer.py
    ``_DeepseekRouterLinear`` runs it in float32)."""

    @staticmethod
    def make(weight: torch.nn.Parameter, float32: bool) -> torch.nn.Module:
        import torch

        class _DeepseekRouterLinear(torch.nn.Linear):
            def forward(self, input: torch.Tensor) -> torch.Tensor:
                return torch.nn.functional.linear(input.float(), self.weight.float())

        cls = _DeepseekRouterLinear if float32 else torch.nn.Linear
        with torch.device("meta"):
            proxy = cls(weight.shape[1], weight.shape[0], bias=False)
        proxy.weight = weight
        return proxy


def apply(model: torch.nn.Module, model_type: str) -> int:
    """Every MoE block of ``model`` (before PEFT) as KT wraps it: the routed experts taken off the
    model (host memory: neither loaded on the GPU nor trained there), the router behind its
    ``nn.Linear`` proxy, the forward KT's. Returns the blocks wrapped."""
    router_type = ROUTERS[model_type]
    wrapped = 0
    for module in list(model.modules()):
        experts, router = getattr(module, "experts", None), getattr(module, "gate", None)
        if experts is None or router is None or getattr(module, "kt_router_type", None):
            continue
        del module._modules["experts"]
        if not hasattr(router, "top_k") or not hasattr(router, "weight"):
            raise UnmodelledSetting(f"use_kt: true: {type(router).__name__} is not a router KT's layer.py "
                                    "reads (top_k and a weight): not modelled")
        module.gate = _RouterLinear.make(router.weight, float32=router_type == "deepseek_gate")
        module.kt_router = router  # registered, as KTMoELayerWrapper's _original_router
        module.__dict__["kt_router_type"] = router_type
        module.forward = MethodType(_forward, module)
        wrapped += 1
    if not wrapped:
        raise UnmodelledSetting(f"use_kt: true: no MoE block with a gate and experts in {model_type}")
    return wrapped
