"""Axolotl's fused LoRA kernels, emulated (workload/lora_kernels.py, lora_kernel_functions.py): the
values and gradients of PEFT's LoRA layers they replace, the tensors Axolotl saves for backward,
which layers Axolotl's patch takes and what it refuses, the adapter option, Axolotl's configs and
the check through the CLI."""

from __future__ import annotations

import contextlib
import copy
import json

import pytest
import torch
from torch import nn
from transformers import AutoConfig

from autotune.cli import main
from autotune.configs import read_training_config
from autotune.errors import InvalidInput
from autotune.workload.adapters import Adapter, make_adapter, prepare
from autotune.workload.lora_kernel_functions import (
    KernelHooks,
    LoRA_Embedding,
    LoRA_MLP,
    LoRA_O,
    LoRA_QKV,
    MixedDtypes,
)
from autotune.workload.lora_kernels import (
    EMULATED,
    MLP_PASSED_BY,
    TAKES_NO_LAYER,
    apply_kernels,
    check_model,
    no_layer_notes,
    parse_kernels,
    repatch,
)
from autotune.workload.models import ModelSpec
from autotune.workload.step import build_model, gradient_checkpointing, make_batch

# Real CPU tensors: the base weight as it is, registers nowhere, no autocast.
PLAIN = KernelHooks(dequantize=lambda layer: layer.weight, registers=contextlib.nullcontext,
                    autocast=lambda: (None, contextlib.nullcontext))
SMALL = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
         "num_key_value_heads": 1, "head_dim": 16, "vocab_size": 128, "max_position_embeddings": 128,
         "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
EXTRA = {"gemma2": {"query_pre_attn_scalar": 16, "sliding_window": 64},
         "gemma3_text": {"query_pre_attn_scalar": 16, "sliding_window": 64},
         "qwen3_moe": {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                       "decoder_sparse_step": 2},
         # its 0.1 attention and residual dropouts off: the two runs compared draw different masks
         "seed_oss": {"attention_dropout": 0.0, "residual_dropout": 0.0},
         "cohere2": {"sliding_window": 64},
         "olmo3": {"sliding_window": 64},
         "lfm2": {"full_attn_idxs": [1]},
         # gpt-oss: a sliding and a full layer, 4 experts (2 routed); Gemma 4: no KV-shared layer, v_proj on
         # every layer (the k_eq_v and KV-shared layers: their own test)
         "gpt_oss": {"num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": 64,
                     "layer_types": ["sliding_attention", "full_attention"]},
         "gemma4_text": {"sliding_window": 64, "layer_types": ["sliding_attention", "full_attention"],
                         "num_kv_shared_layers": 0}}
EXTRA["gemma4_unified_text"] = EXTRA["gemma4_text"]  # Gemma 4 Unified's text model: the same layers
# Qwen 3.5 and Qwen3-Next: 4 layers, the second and fourth full attention, Gated DeltaNet in the others
# (2 key and 4 value heads of 16, as tiny-qwen3_5_text); mixtures of 4 experts, 2 routed.
HYBRID = {"num_hidden_layers": 4, "full_attention_interval": 2, "linear_num_key_heads": 2,
          "linear_num_value_heads": 4, "linear_key_head_dim": 16, "linear_value_head_dim": 16}
HYBRID_MOE = {**HYBRID, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
              "shared_expert_intermediate_size": 32}
EXTRA.update({"qwen3_5_text": HYBRID, "qwen3_5_moe_text": HYBRID_MOE, "qwen3_next": HYBRID_MOE})
# all-linear takes the linear attention's projections too, whose kernels are refused (their own test)
ATTENTION_AND_MLP = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"
TARGETS = {"qwen3_5_text": ATTENTION_AND_MLP, "qwen3_5_moe_text": ATTENTION_AND_MLP,
           "qwen3_next": ATTENTION_AND_MLP}
ALL = ("mlp", "qkv", "o")
T, HIDDEN, OUT, INNER, R = 16, 32, 48, 64, 4  # a [2, 8] batch's tokens; LoRA rank


def small_model(model_type: str, **overrides) -> tuple[nn.Module, object]:
    config = AutoConfig.for_model(model_type, **{**SMALL, **EXTRA.get(model_type, {}), **overrides})
    model, _ = build_model(ModelSpec(f"small-{model_type}", "local", config, 128), "causal-lm", "eager")
    return model, config


class FixedMask(nn.Module):
    """A dropout whose mask depends on the input's shape only: the same for every projection of one
    input, as Axolotl's one mask for gate and up (and for q, k, v), where PEFT draws one each."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        generator = torch.Generator().manual_seed(x.shape[-1])
        return x * (torch.rand(x.shape, generator=generator) > 0.3).to(x.dtype) / 0.7


def lora_model(model_type: str, targets: str = "all-linear", dropout: bool = False, erf: bool = True,
               **overrides):
    torch.manual_seed(0)
    model, config = small_model(model_type, **overrides)
    if erf:  # Gemma's GELU in its erf form: Axolotl's GeGLU kernel computes that one (for its tanh one too)
        for module in model.modules():
            if "gemma" in model_type and hasattr(module, "act_fn"):
                module.act_fn = nn.GELU()
    wrapped = prepare(model, make_adapter("lora", r=R, alpha=8, dropout=0.1 if dropout else 0.0,
                                          targets=targets), "causal-lm")
    for name, parameter in wrapped.named_parameters():
        if "lora_B" in name:
            nn.init.normal_(parameter, std=0.2)  # PEFT starts B at 0: make the LoRA path count
    if dropout:
        for name, module in wrapped.named_modules():
            if hasattr(module, "lora_dropout") and "default" in module.lora_dropout:
                # LoRA_MLP draws no dropout on down_proj's input ("no dropout on hidden - it's an
                # intermediate"), where PEFT's down_proj does
                down = name.endswith("down_proj")
                module.lora_dropout["default"] = nn.Identity() if down else FixedMask()
    return wrapped, config


def loss_and_grads(model: nn.Module, batch: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    with gradient_checkpointing(model, True):
        model.train()
        loss = model(**batch).loss
        loss.backward()
    return loss, {name: p.grad for name, p in model.named_parameters() if p.grad is not None}


def token_batch(config) -> dict:
    """Two rows of 16 random tokens (past the special ids), labelled with themselves."""
    batch = make_batch(config, "causal-lm", 2, 16)
    batch["input_ids"] = torch.randint(3, 128, (2, 16))
    batch["labels"] = batch["input_ids"].clone()
    return batch


def patched(model: nn.Module) -> list[str]:
    """The last part of the name of each module whose forward the patch replaced."""
    return sorted(name.rsplit(".", 1)[-1] for name, module in model.named_modules()
                  if "forward" in vars(module))


# --- the kernels give PEFT's values and gradients ---------------------------------------------------


# PEFT refuses dropout on Qwen3-MoE's all-linear, and on Qwen3-Next's down_proj, a name of its experts'
# parameters too ("lora.ParamWrapper does not work with lora_dropout"). Qwen3-VL's text model has no
# causal-LM head of its own: tests/autotune/workload/test_vlms.py patches the vision-language model.
# Mistral Small 4's is a mistral3 checkpoint's (test_mistral_small_4_s_layers_are_left_to_peft_...).
# MiniMax-M2's attention fails the qkv patch (the corpus attentions' test), its MLP kernel takes no layer
# (test_minimax_m2_s_mlp_kernel_takes_no_layer).
@pytest.mark.parametrize(("model_type", "dropout"), [
    (model_type, dropout) for model_type in EMULATED for dropout in (False, True)
    if not (dropout and model_type in ("qwen3_moe", "qwen3_next"))
    and model_type not in ("qwen3_vl_text", "mistral4", "minimax_m2")])
def test_a_patched_model_has_the_loss_and_gradients_of_peft_s(model_type, dropout):
    reference, config = lora_model(model_type, TARGETS.get(model_type, "all-linear"), dropout=dropout)
    model = copy.deepcopy(reference)
    apply_kernels(model, ALL, PLAIN)
    batch = token_batch(config)
    loss, grads = loss_and_grads(model, batch)
    expected, expected_grads = loss_and_grads(reference, batch)
    assert torch.allclose(loss, expected, rtol=1e-5)
    assert grads.keys() == expected_grads.keys() and any("lora_A" in name for name in grads)
    # Gemma 4's unscaled attention (scaling 1.0 over normed q, k and v) carries float32 rounding further;
    # Gemma 4 Unified's further still with dropout (its float64 run: within 2e-5 of PEFT's largest
    # gradient, Gemma 4's 1.2e-5, the GeGLU kernel computing in float32 in both)
    atol = {"gemma4_text": 1e-5, "gemma4_unified_text": 1e-4}.get(model_type, 1e-6)
    for name, grad in grads.items():
        assert torch.allclose(grad, expected_grads[name], rtol=1e-4, atol=atol), name
    # per layer q, k, v and o projections' calls and the MLP's (Qwen3-MoE: PEFT's all-linear puts no
    # LoRA on its MLPs, whose names are its experts' too, and a sparse MoE block is not Axolotl's MLP;
    # Apertus's, Nemotron's and Arcee's MLPs have no gate_proj: find_mlp_in_layer passes them by; Qwen 3.5's
    # and Qwen3-Next's shared experts carry LoRA, left to PEFT, and only their full attention layers
    # have a self_attn; GLM-4's MLP fuses gate and up into gate_up_proj, gpt-oss' is a router and experts)
    mlps = {"qwen3_moe": 0, "apertus": 0, "nemotron": 0, "arcee": 0, "qwen3_5_moe_text": 0, "qwen3_next": 0,
            "qwen3_5_text": 4, "glm4": 0, "gpt_oss": 0}.get(model_type, 2)
    assert patched(model) == sorted(["k_proj", "o_proj", "q_proj", "v_proj"] * 2 + ["mlp"] * mlps)


def test_a_copy_of_a_patched_model_is_patched_over_its_own_modules():
    # DeepSpeed's engine gets a deep copy of the built model (backends/deepspeed.py fresh_model): the
    # installed forwards must compute with the copy's LoRA parameters, not the original's
    reference, config = lora_model("llama")
    original = copy.deepcopy(reference)
    apply_kernels(original, ALL, PLAIN)
    model = copy.deepcopy(original)
    repatch(original, model)
    batch = token_batch(config)
    loss, grads = loss_and_grads(model, batch)
    expected, expected_grads = loss_and_grads(reference, batch)
    assert torch.allclose(loss, expected, rtol=1e-5)
    assert grads.keys() == expected_grads.keys() and any("lora_A" in name for name in grads)
    assert not [name for name, p in original.named_parameters() if p.grad is not None]
    assert patched(model) == patched(original)


def test_gemma_s_tanh_gelu_is_computed_in_its_erf_form_as_axolotl_s_kernel_does():
    reference, config = lora_model("gemma2", erf=False)
    model = copy.deepcopy(reference)
    apply_kernels(model, ALL, PLAIN)
    batch = make_batch(config, "causal-lm", 2, 16)
    batch["input_ids"] = torch.randint(3, 128, (2, 16))
    (_, grads), (_, expected) = loss_and_grads(model, batch), loss_and_grads(reference, batch)
    gate = "base_model.model.model.layers.0.mlp.gate_proj.lora_B.default.weight"
    assert not torch.equal(grads[gate], expected[gate])
    assert all(torch.allclose(grad, expected[name], rtol=1e-2, atol=1e-4) for name, grad in grads.items())


def test_layers_without_lora_on_all_their_projections_are_left_to_peft():
    # Axolotl warns "Cannot patch some attention QKV projections" and keeps original_apply_qkv: the
    # three plain projections, computed in turn before Qwen3's q_norm (its rewritten forward's order).
    reference, config = lora_model("qwen3", targets="q_proj,v_proj")
    model = copy.deepcopy(reference)
    apply_kernels(model, ALL, PLAIN)
    assert patched(model) == sorted(["k_proj", "q_proj", "v_proj"] * 2)  # no o_proj, no mlp: not LoRA
    batch = make_batch(config, "causal-lm", 2, 16)
    orders: list[list[str]] = [[], []]
    for order, each in zip(orders, (model, reference), strict=True):
        for name, module in each.named_modules():
            if name.endswith(("layers.0.self_attn.q_proj.base_layer", "layers.0.self_attn.v_proj.base_layer",
                              "layers.0.self_attn.q_norm")):
                module.register_forward_hook(lambda m, i, o, order=order, name=name: order.append(
                    name.removesuffix(".base_layer").rsplit(".", 1)[-1]))
    loss, grads = loss_and_grads(model, batch)
    expected, expected_grads = loss_and_grads(reference, batch)
    assert torch.allclose(loss, expected)
    assert all(torch.allclose(grad, expected_grads[name]) for name, grad in grads.items())
    assert orders[0][:3] == ["q_proj", "v_proj", "q_norm"]  # original_apply_qkv, then the norms
    assert orders[1][:3] == ["q_proj", "q_norm", "v_proj"]  # transformers' own forward


def test_gemma_4_s_k_eq_v_layers_take_lora_qk_and_its_kv_shared_layers_are_left_to_peft():
    # attention_k_eq_v: the full layer's v_proj is None, apply_lora_qk's LoRA_QK computes Q and K and the
    # forward takes K for V; the KV-shared last layer has no k_proj or v_proj: find_self_attn_in_layer
    # passes it by (its o_proj too). In float64, where the attention kernels are PEFT's to rounding (the
    # MLP's GeGLU computes in float32, as Axolotl's Triton kernel: the test above).
    overrides = {"num_hidden_layers": 3, "sliding_window": 64,
                 "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
                 "num_kv_shared_layers": 1, "attention_k_eq_v": True, "num_global_key_value_heads": 1}
    for dropout in (False, True):
        reference, config = lora_model("gemma4_text", dropout=dropout, **overrides)
        reference = reference.double()
        layers = reference.base_model.model.model.layers
        assert layers[1].self_attn.v_proj is None and not hasattr(layers[2].self_attn, "k_proj")
        model = copy.deepcopy(reference)
        apply_kernels(model, ("qkv", "o"), PLAIN)
        # layer 0: q, k, v, o; layer 1: q, k (no v_proj), o; layer 2: none
        assert patched(model) == sorted(["q_proj", "k_proj", "v_proj", "o_proj", "q_proj", "k_proj",
                                         "o_proj"])
        batch = token_batch(config)
        loss, grads = loss_and_grads(model, batch)
        expected, expected_grads = loss_and_grads(reference, batch)
        assert torch.allclose(loss, expected, rtol=1e-12)
        assert grads.keys() == expected_grads.keys()
        for name, grad in grads.items():
            assert torch.allclose(grad, expected_grads[name], rtol=1e-9, atol=1e-12), name
    attn = model.base_model.model.model.layers[1].self_attn
    hidden = torch.randn(2, 8, HIDDEN, dtype=torch.float64, requires_grad=True)
    Q = attn.q_proj(hidden)
    assert type(Q.grad_fn).__name__ == "LoRA_QKBackward" and attn.k_proj(hidden).grad_fn is Q.grad_fn


def test_under_axolotl_s_fused_gemma_4_forward_the_kernels_give_peft_s_gradients():
    # Axolotl's job: patch_gemma4_fused_attn's forward (workload/gemma4_fused_attn.py, on every gemma4 run)
    # calls the qkv kernel's projections, LoRA_QK on the k_eq_v layer; compared with that forward over
    # PEFT's layers
    from autotune.workload import gemma4_fused_attn

    overrides = {"layer_types": ["sliding_attention", "full_attention"], "sliding_window": 64,
                 "num_kv_shared_layers": 0, "attention_k_eq_v": True, "num_global_key_value_heads": 1}
    reference, config = lora_model("gemma4_text", erf=False, **overrides)
    assert gemma4_fused_attn.apply(reference, sm_count=2, registers=contextlib.nullcontext) == 2
    model = copy.deepcopy(reference)
    apply_kernels(model, ("qkv", "o"), PLAIN)
    batch = token_batch(config)
    loss, grads = loss_and_grads(model, batch)
    expected, expected_grads = loss_and_grads(reference, batch)
    assert torch.allclose(loss, expected, rtol=1e-5)
    assert grads.keys() == expected_grads.keys() and any("lora_A" in name for name in grads)
    for name, grad in grads.items():
        assert torch.allclose(grad, expected_grads[name], rtol=1e-4, atol=1e-5), name
    nodes = [type(node).__name__ for node in _nodes(model(**batch).loss)]
    assert nodes.count("LoRA_QKVBackward") == 1 and nodes.count("LoRA_QKBackward") == 1
    assert nodes.count("RmsNormRopeBackward") == 4  # the fused forward's q and k kernels ran


def _nodes(output: torch.Tensor) -> list:
    """Every autograd node behind ``output``."""
    seen, stack = {}, [output.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen[id(node)] = node
        stack.extend(next_node for next_node, _ in node.next_functions)
    return list(seen.values())


def test_the_embedding_kernel_gives_peft_s_gradients_and_is_refused_under_autocast():
    reference, config = lora_model("llama", targets="embed_tokens,q_proj,k_proj,v_proj")
    model = copy.deepcopy(reference)
    apply_kernels(model, ("qkv", "embedding"), PLAIN)
    assert "embed_tokens" in patched(model)
    batch = make_batch(config, "causal-lm", 2, 16)
    batch["input_ids"] = torch.randint(3, 128, (2, 16))
    loss, grads = loss_and_grads(model, batch)
    expected, expected_grads = loss_and_grads(reference, batch)
    assert torch.allclose(loss, expected, rtol=1e-5)
    assert any("lora_embedding_A" in name for name in grads)
    for name, grad in grads.items():
        assert torch.allclose(grad, expected_grads[name], rtol=1e-4, atol=1e-6), name
    # Under autocast its backward's index_add_ of a 16-bit gradient into a float32 one fails (as on
    # a CPU with torch.autocast("cpu"), where matmul also runs in bfloat16).
    bf16 = KernelHooks(PLAIN.dequantize, PLAIN.registers, lambda: (torch.bfloat16, contextlib.nullcontext))
    embed = nn.Embedding(128, HIDDEN)
    with pytest.raises(InvalidInput, match="LoRA_Embedding kernel fails in its backward under torch.bfloat16 "
                                           "autocast .* set lora_embedding_kernel: false"):
        LoRA_Embedding.apply(torch.zeros(2, 8, dtype=torch.long), embed.weight, torch.ones(R, 128),
                             torch.ones(HIDDEN, R), 2.0, embed, bf16)


# --- what each Function saves for backward -------------------------------------------------------------


def saved(output: torch.Tensor) -> list[tuple[tuple[int, ...], torch.dtype]]:
    """What the Function node that made ``output`` saved (ctx.save_for_backward), in order."""
    return [(tuple(t.shape), t.dtype) for t in output.grad_fn.saved_tensors]


def test_each_function_saves_what_axolotl_s_save_for_backward_saves():
    bf16, f32 = torch.bfloat16, torch.float32
    X = torch.randn(2, 8, HIDDEN, dtype=bf16, requires_grad=True) * 1
    linear = lambda i, o: nn.Linear(i, o, bias=False, dtype=bf16)  # noqa: E731
    lora = lambda i, o: (torch.randn(R, i, requires_grad=True), torch.randn(o, R, requires_grad=True))  # noqa: E731
    # LoRA_MLP (lora.py): X, X (no dropout), gate, up [batch, seq, inner] in X's dtype, then
    # gate_A, gate_B, up_A, up_B, down_A, down_B as X's dtype (not the float32 parameters)
    (gA, gB), (uA, uB), (dA, dB) = lora(HIDDEN, INNER), lora(HIDDEN, INNER), lora(INNER, HIDDEN)
    bases = (linear(HIDDEN, INNER), linear(HIDDEN, INNER), linear(INNER, HIDDEN))
    out = LoRA_MLP.apply(X, None, gA, gB, uA, uB, dA, dB, bases, (2.0,) * 3, "swiglu", PLAIN)
    assert saved(out) == [((2, 8, HIDDEN), bf16)] * 2 + [((2, 8, INNER), bf16)] * 2 + [
        ((R, HIDDEN), bf16), ((INNER, R), bf16)] * 2 + [((R, INNER), bf16), ((HIDDEN, R), bf16)]
    # LoRA_QKV: X, X_drop, q_A, q_B, k_A, k_B, v_A, v_B in X's dtype; not Q, K, V
    X_drop = X * 2
    (qA, qB), (kA, kB), (vA, vB) = lora(HIDDEN, OUT), lora(HIDDEN, 16), lora(HIDDEN, 16)
    bases = (linear(HIDDEN, OUT), linear(HIDDEN, 16), linear(HIDDEN, 16))
    Q, _, _ = LoRA_QKV.apply(X, X_drop, qA, qB, kA, kB, vA, vB, bases, (2.0,) * 3, PLAIN)
    assert saved(Q) == [((2, 8, HIDDEN), bf16)] * 2 + [((R, HIDDEN), bf16), ((OUT, R), bf16)] + [
        ((R, HIDDEN), bf16), ((16, R), bf16)] * 2
    # LoRA_O: A, B in X's dtype, X, X_drop
    A, B = lora(HIDDEN, OUT)
    out = LoRA_O.apply(X, None, A, B, linear(HIDDEN, OUT), 2.0, PLAIN)
    assert saved(out) == [((R, HIDDEN), bf16), ((OUT, R), bf16)] + [((2, 8, HIDDEN), bf16)] * 2
    # LoRA_Embedding: x, A and B in the base weight's dtype, after_A [batch, seq, r] in A's (float32)
    embed = nn.Embedding(128, HIDDEN, dtype=bf16)
    A, B = lora(128, HIDDEN)
    out = LoRA_Embedding.apply(torch.zeros(2, 8, dtype=torch.long), embed.weight, A, B, 2.0, embed, PLAIN)
    assert saved(out) == [((2, 8), torch.int64), ((R, 128), bf16), ((HIDDEN, R), bf16), ((2, 8, R), f32)]


def test_a_float32_run_saves_the_lora_parameters_themselves():
    # ``A.to(dtype)`` of a float32 A in a float32 step is A: nothing copied.
    X = torch.randn(2, 8, HIDDEN, requires_grad=True) * 1
    A, B = torch.randn(R, HIDDEN, requires_grad=True), torch.randn(OUT, R, requires_grad=True)
    out = LoRA_O.apply(X, None, A, B, nn.Linear(HIDDEN, OUT), 2.0, PLAIN)
    kept = out.grad_fn.saved_tensors
    assert kept[0].untyped_storage().data_ptr() == A.untyped_storage().data_ptr()


# --- which models, which kernels -------------------------------------------------------------------------


def test_the_kernels_are_read_in_axolotl_s_order():
    assert parse_kernels(" o, MLP,qkv ") == ("mlp", "qkv", "o") and parse_kernels(None) == ()
    with pytest.raises(InvalidInput, match="unknown Axolotl LoRA kernel 'swiglu': allowed are mlp, qkv, o, "):
        parse_kernels("mlp,swiglu")
    with pytest.raises(InvalidInput, match="embedding LoRA kernel is patched only with the mlp, qkv or o"):
        parse_kernels("embedding")


@pytest.mark.parametrize(("model_type", "overrides", "kernels", "message"), [
    # patch_self_attn_lora asserts on an attention forward it cannot rewrite (a fused qkv_proj)
    ("phi3", {}, ALL, "fail on Phi3Attention: patch_self_attn_lora asserts \"Original QKV code not found\""),
    ("gpt2", {"n_embd": 32, "n_layer": 2, "n_head": 2}, ("o",), "fail on GPT2Attention"),
    # OLMo 3 and LFM2 norm q and k before the view: "Original QKV code not found"
    ("olmo3", {}, ALL, "fail on Olmo3Attention: patch_self_attn_lora asserts \"Original QKV code"),
    ("lfm2", {}, ("qkv",), "fail on Lfm2Attention: patch_self_attn_lora asserts"),
    ("granite", {}, ALL, "emulated on llama, mistral, .*, not on model type granite"),
    ("phi3", {}, ("mlp",), "not on model type phi3"),
    ("llama", {"hidden_act": "relu"}, ALL, "lora_mlp_kernel refuses activation 'relu'"),
    # Qwen 3.5's Gated DeltaNet projections with LoRA: Axolotl's LoRA_FusedProj (qkv) and LoRA_O (o)
    ("qwen3_5_text", {}, ALL, r"linear-attention projections \(in_proj_qkv, in_proj_z, in_proj_b, "
     r"in_proj_a, out_proj: LoRA_FusedProj and LoRA_O, called by its sample-packing"),
    ("qwen3_5_moe_text", {}, ("o",), r"linear-attention projections \(out_proj: .* set lora_qkv_kernel: "
     "false and lora_o_kernel: false, or leave linear_attn's projections"),
])
def test_what_axolotl_s_patch_would_not_do_is_refused_by_name(model_type, overrides, kernels, message):
    model, _ = small_model(model_type, **overrides)
    wrapped = prepare(model, make_adapter("lora", targets="all-linear"), "causal-lm")
    with pytest.raises(InvalidInput, match=message):
        apply_kernels(wrapped, kernels, PLAIN)


# The attention classes of Axolotl's corpus configs (examples/) whose patch fails, the same in
# transformers 5.14.1 (Axolotl's pin, pyproject.toml) as in this one: patch_self_attn_lora's assertion
# on the forward get_attention_cls_from_config names for the checkpoint's model type (the second),
# quoting the line that decides it, or its ValueError where no <Prefix>Attention exists (llava, qwen2_vl,
# qwen2_5_vl, internvl: no special case, and get_causal_lm_model_cls_prefix's name is no class there).
@pytest.mark.parametrize(("model_type", "checkpoint", "message"), [
    ("falcon_h1", None, r"FalconH1Attention: .*\"Original QKV code not found\" in its forward, whose line "
     r"`key_states = self.k_proj\(hidden_states\).view\(hidden_shape\).transpose\(1, 2\) \* "
     r"self.key_multiplier` is not Axolotl's: the job fails before the model loads"),
    ("llama4_text", "llama4", r"Llama4TextAttention: .*QKV.*`query_states = self.q_proj\(hidden_states\)"
     r".view\(hidden_shape\)` is not"),
    ("olmo3", None, r"Olmo3Attention: .*`query_states = self.q_norm\(self.q_proj\(hidden_states\)\)`"),
    ("phi", None, r"PhiAttention: .*\"Original O code not found\" .*"
     r"`attn_output = self.dense\(attn_output\)`"),
    ("mllama_text_model", "mllama",
     r"MllamaTextSelfAttention: .*`query_states = self.q_proj\(hidden_states\)`"),
    ("mistral4", None, r"Mistral4Attention: .*QKV"),  # a mistral4 checkpoint of its own
    ("minimax_m2", None,
     r"MiniMaxM2Attention: .*`query_states = self.q_norm\(self.q_proj\(hidden_states\)\)`"),
    ("mistral", "llava", "could not import attention class for model_type: llava.*no LlavaAttention"),
    ("qwen2_vl_text", "qwen2_vl", "could not import attention class for model_type: qwen2_vl"),
    ("qwen2_5_vl_text", "qwen2_5_vl", "could not import attention class for model_type: qwen2_5_vl"),
    ("qwen2", "internvl", "could not import attention class for model_type: internvl"),
])
def test_the_corpus_attentions_axolotl_s_patch_fails_on_are_refused_with_the_line(model_type, checkpoint,
                                                                                   message):
    config = AutoConfig.for_model(model_type)
    with pytest.raises(InvalidInput, match=message):
        check_model(config, ("qkv",), checkpoint)
    check_model(config, ("mlp",), checkpoint) if model_type in EMULATED else None  # the attention's alone


# The corpus' model types Axolotl's patch takes (examples/glm4/qlora-32b.yaml, examples/gpt-oss/*-lora-*,
# examples/gemma4/*): get_attention_cls_from_config's class passes patch_self_attn_lora (Gemma 4's and
# gemma4_unified's it skips: Axolotl 067b021's special cases), the text model emulated (gemma4_unified's
# through its fused forward's apply_qkv / apply_o, workload/gemma4_fused_attn.py).
@pytest.mark.parametrize(("model_type", "checkpoint", "message"), [
    ("glm4", None, None), ("gpt_oss", None, None), ("gemma4_text", "gemma4", None),
    ("gemma4_text", "gemma4_text", None), ("gemma4_unified_text", "gemma4_unified", None),
])
def test_the_corpus_model_types_axolotl_s_patch_takes_are_emulated(model_type, checkpoint, message):
    config = AutoConfig.for_model(model_type)
    if message is None:
        check_model(config, ALL, checkpoint)
    else:  # not "could not import attention class": Axolotl imports Gemma4UnifiedTextAttention
        with pytest.raises(InvalidInput, match=message):
            check_model(config, ALL, checkpoint)


def test_mistral_small_4_s_layers_are_left_to_peft_by_axolotl_s_patch():
    # a mistral3 checkpoint: MistralAttention rewritten, which no layer of its mistral4 text model is;
    # MLA has no k_proj or v_proj, and its MoE blocks no gate_proj (first_k_dense_replace 0)
    from autotune.workload.models import resolve_model
    from autotune.workload.vision import IMAGE_TEXT_TO_TEXT

    torch.manual_seed(0)
    model, _ = build_model(resolve_model("tiny-mistral4"), IMAGE_TEXT_TO_TEXT, None)
    targets = r"model.language_model.layers.[\d]+.(mlp|cross_attn|self_attn).(up|down|gate|q|k|v|o)_proj"
    wrapped = prepare(model, make_adapter("lora", r=R, alpha=8, dropout=0.0, target_pattern=targets),
                      IMAGE_TEXT_TO_TEXT)
    assert any(name.endswith("self_attn.o_proj") and hasattr(module, "lora_A")
               for name, module in wrapped.named_modules())
    apply_kernels(wrapped, ALL, PLAIN)
    assert patched(wrapped) == []
    assert no_layer_notes("tiny-mistral4", ALL) == (TAKES_NO_LAYER["mistral4"],)
    assert no_layer_notes("tiny-mistral4", ()) == () and no_layer_notes("tiny-llama", ALL) == ()
    # the mlp kernel alone passes GLM-4's and gpt-oss' MLPs by (gate_up_proj; router and experts)
    assert no_layer_notes("tiny-glm4", ALL) == (MLP_PASSED_BY["glm4"],)
    assert no_layer_notes("tiny-gpt_oss", ("mlp",)) == (MLP_PASSED_BY["gpt_oss"],)
    assert no_layer_notes("tiny-gpt_oss", ("qkv", "o")) == ()


def test_minimax_m2_s_mlp_kernel_takes_no_layer():
    # every layer's mlp is MiniMaxM2SparseMoeBlock (the router, no gate_proj): find_mlp_in_layer yields
    # nothing; LoRA on the attention projections stays PEFT's (the mlp kernel alone patches no attention)
    reference, _ = lora_model("minimax_m2", "q_proj,k_proj,v_proj,o_proj")
    model = copy.deepcopy(reference)
    apply_kernels(model, ("mlp",), PLAIN)
    assert patched(model) == []
    assert no_layer_notes("tiny-minimax_m2", ("mlp",)) == (TAKES_NO_LAYER["minimax_m2"],)


@pytest.mark.parametrize(("model_type", "error", "message"), [
    ("llama", MixedDtypes, r"addmm_ of two dtypes\); Axolotl runs them with the weights in the autocast "
     "dtype$"),
    # the real job fails too (transformers' Python xIELU's float32 output), unless the XIELU wheel is in
    ("apertus", InvalidInput, r"addmm_ of two dtypes.*: Apertus's QLoRA: the float32 output of transformers' "
     "Python xIELU .* the real job fails there; with the XIELU CUDA wheel"),
])
def test_activations_off_the_autocast_dtype_are_refused_with_the_model_s_reason(model_type, error, message):
    # float32 activations under a bfloat16 autocast, as the estimator's (and the real) Apertus QLoRA
    # step hands them to the kernels (lora_kernel_functions.py MixedDtypes)
    bf16 = KernelHooks(dequantize=lambda layer: layer.weight, registers=contextlib.nullcontext,
                       autocast=lambda: (torch.bfloat16, contextlib.nullcontext))
    model, config = lora_model(model_type)
    apply_kernels(model, ALL, bf16)
    batch = make_batch(config, "causal-lm", 2, 16)
    with pytest.raises(error, match=message):
        model(**batch)


def test_qwen3_5_s_linear_attention_is_left_to_peft_by_the_mlp_kernel_and_by_qwen3_next():
    # find_linear_attn_in_layer is read for the qkv and o kernels alone, and Qwen3-Next fuses its
    # in-projections (in_proj_qkvz, in_proj_ba) under names it does not take
    for model_type, kernels in (("qwen3_5_text", ("mlp",)), ("qwen3_next", ALL)):
        model, _ = small_model(model_type)
        wrapped = prepare(model, make_adapter("lora", dropout=0.0, targets="all-linear"), "causal-lm")
        apply_kernels(wrapped, kernels, PLAIN)
        assert not [name for name in patched(wrapped) if name.startswith(("in_proj", "out_proj"))]
        assert any(name.endswith("linear_attn.in_proj_qkvz" if model_type == "qwen3_next" else
                                 "linear_attn.in_proj_qkv") and hasattr(module, "lora_A")
                   for name, module in wrapped.named_modules())


def test_only_a_causal_lm_is_patched():
    model, _ = build_model(ModelSpec("tiny", "local", AutoConfig.for_model("llama", **SMALL), 128),
                           "sequence-classification", "eager")
    wrapped = prepare(model, make_adapter("lora", targets="all-linear"), "sequence-classification")
    with pytest.raises(InvalidInput, match="patch causal language models only .* not a PeftModelForSequence"):
        apply_kernels(wrapped, ALL, PLAIN)
    apply_kernels(wrapped, (), PLAIN)  # nothing asked, nothing checked


def test_an_adapter_names_its_kernels_and_keeps_the_stored_keys_of_others():
    adapter = make_adapter("lora", targets="all-linear", kernels="qkv,mlp,o")
    assert adapter.kernels == ("mlp", "qkv", "o")
    assert adapter.label().endswith("on all-linear with Axolotl's fused LoRA kernels (emulated): mlp, qkv, o")
    assert Adapter.from_json(adapter.to_json()) == adapter
    assert "kernels" not in make_adapter("lora").to_json()  # stored keys of adapters without them
    with pytest.raises(InvalidInput, match="need a backend that can patch them in"):
        model, _ = small_model("llama")
        prepare(model, adapter, "causal-lm")


# --- Axolotl's configs --------------------------------------------------------------------------------------

AXOLOTL = {"base_model": "tiny-llama", "sequence_len": 128, "micro_batch_size": 4, "adapter": "lora",
           "lora_r": 8, "lora_alpha": 16, "lora_dropout": 0.05, "lora_target_linear": True, "bf16": True,
           "attn_implementation": "flash_attention_2", "gradient_checkpointing": True}


def read(tmp_path, **changes):
    path = tmp_path / "axolotl.yml"
    path.write_text(json.dumps({**AXOLOTL, **changes}))
    return read_training_config(path)


def test_axolotl_turns_its_kernels_on_where_none_is_set(tmp_path):
    config = read(tmp_path)
    assert config.request.step.adapter.kernels == ("mlp", "qkv", "o")
    assert any(note.startswith("lora_*_kernel: not set, Axolotl turns its fused LoRA kernels on "
                               "(check_auto_enable_lora_kernels): mlp, qkv, o, embedding — emulated")
               for note in config.notes)
    # the embedding kernel, on too, has nothing to patch: all-linear puts no LoRA on embed_tokens
    assert "lora_embedding_kernel: embed_tokens carries no LoRA here: nothing for it to patch" in config.notes
    named = read(tmp_path, lora_target_linear=None, lora_target_modules=["embed_tokens", "q_proj"])
    assert named.request.step.adapter.kernels == ("mlp", "qkv", "o", "embedding")
    qlora = read(tmp_path, adapter="qlora", load_in_4bit=True).request.step.adapter
    assert (qlora.method, qlora.kernels) == ("qlora", ("mlp", "qkv", "o"))


@pytest.mark.parametrize(("changes", "kernels", "note"), [
    ({"lora_mlp_kernel": True}, ("mlp",), "lora_mlp_kernel: true — emulated"),
    ({"lora_qkv_kernel": False}, (), None),  # one set: Axolotl turns none on, the others stay off
    ({"lora_o_kernel": True, "lora_qkv_kernel": True, "lora_mlp_kernel": False}, ("qkv", "o"), None),
    ({"trust_remote_code": True}, (), "with trust_remote_code Axolotl leaves its fused LoRA kernels off"),
    ({"lora_embedding_kernel": True}, (), "lora_embedding_kernel: true alone patches nothing"),
])
def test_axolotl_s_kernel_keys_are_read_as_axolotl_reads_them(tmp_path, changes, kernels, note):
    config = read(tmp_path, **changes)
    assert config.request.step.adapter.kernels == kernels
    assert note is None or any(note in n for n in config.notes), config.notes


def test_axolotl_refuses_its_kernels_with_trust_remote_code(tmp_path):
    with pytest.raises(InvalidInput, match="refuses them together .*check_lora_kernels_trust_remote_code"):
        read(tmp_path, trust_remote_code=True, lora_qkv_kernel=True)
    with pytest.raises(InvalidInput, match="lora_mlp_kernel in .* must be true or false, got 'yes'"):
        read(tmp_path, lora_mlp_kernel="yes")


# --- the check -------------------------------------------------------------------------------------------


def check(capsys, tmp_path, **changes) -> dict:
    path = tmp_path / "axolotl.yml"
    path.write_text(json.dumps({**AXOLOTL, **changes}))
    code = main(["check", "tiny-llama", "--from-config", str(path), "--gpu", "A100-40GB", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0, doc
    return doc


OFF = {"lora_mlp_kernel": False, "lora_qkv_kernel": False, "lora_o_kernel": False,
       "lora_embedding_kernel": False}


@pytest.mark.parametrize("method", ["lora", "qlora"])
def test_a_check_of_an_axolotl_config_says_the_kernels_and_peaks_otherwise(capsys, tmp_path, method):
    # tiny-llama's step peaks at the allocator's first segments at small batches; at 512 sequences
    # of 128 tokens the activations show, and the kernels keep less of them than PEFT's layers.
    extra = {"adapter": method, "micro_batch_size": 512,
             **({"load_in_4bit": True} if method == "qlora" else {})}
    on, off = check(capsys, tmp_path, **extra), check(capsys, tmp_path, **extra, **OFF)
    assert on["fits"] and off["fits"]
    assert on["adapter"]["kernels"] == ["mlp", "qkv", "o"] and "kernels" not in off["adapter"]
    assert "with Axolotl's fused LoRA kernels (emulated): mlp, qkv, o" in on["adapter"]["label"]
    assert "with Axolotl's fused LoRA kernels (emulated): mlp, qkv, o: " in on["message"]
    assert any("Axolotl turns its fused LoRA kernels on" in note for note in on["config_notes"])
    assert "Axolotl's fused LoRA kernels" not in off["message"]
    assert on["peak_memory_bytes"] < off["peak_memory_bytes"]


def test_the_cuda_backend_carries_the_kernels_and_needs_axolotl():
    import importlib.util

    from autotune.backends.cuda.lora_kernels import require_axolotl
    from autotune.backends.cuda.protocol import CellSpec, cell_spec, rebuild_workload
    from autotune.errors import BackendUnavailable
    from autotune.request import CheckRequest, request_from, resolve
    from autotune.workload.modes import parse_mode

    adapter = make_adapter("lora", targets="all-linear", kernels=ALL)
    request = request_from(CheckRequest, {"model": "tiny-llama", "seq_len": 64, "batch_size": 4,
                                          "adapter": adapter, "gpu_memory": "1GiB", "backend": "estimate"})
    workload = resolve(request).workload
    sent = json.dumps(cell_spec(workload, parse_mode("bf16"), 64, 2**30).to_json())  # what the worker reads
    assert rebuild_workload(CellSpec.from_json(json.loads(sent)))[0].adapter.kernels == ALL
    if importlib.util.find_spec("axolotl") is None:  # the worker refuses the cell, naming the package
        with pytest.raises(BackendUnavailable, match="need the axolotl package"):
            require_axolotl()


def test_axolotl_s_model_support_turns_the_kernels_off_where_it_declares_them_unsupported(tmp_path):
    # normalize_config: PaddleOCR-VL's descriptor declares lora_kernels Unsupported, every lora_*_kernel off,
    # once the model type is known: here a local checkpoint that no base_model names (request.py
    # resolve_workload; a preset's base_model is turned off as the config is read, test_axolotl_vlm.py)
    from autotune.cli import build_parser
    from autotune.cli.check import _plan
    from autotune.request import resolve

    local = tmp_path / "paddleocr"
    AutoConfig.for_model("paddleocr_vl").save_pretrained(local)
    path = tmp_path / "axolotl.yml"
    path.write_text(json.dumps(AXOLOTL))
    for model, kernels in ((str(local), ()), ("tiny-llama", ALL)):
        args = build_parser().parse_args(["check", model, "--from-config", str(path), "--gpu", "A100-40GB"])
        assert resolve(_plan(args).request).workload.adapter.kernels == kernels


def test_a_check_of_mistral_small_4_says_the_kernels_take_no_layer(capsys, tmp_path):
    # examples/mistral4/qlora-vision.yml's targets, on the tiny mistral3 checkpoint of a mistral4 text model
    path = tmp_path / "axolotl.yml"
    targets = r"model.language_model.layers.[\d]+.(mlp|cross_attn|self_attn).(up|down|gate|q|k|v|o)_proj"
    path.write_text(json.dumps({**AXOLOTL, "base_model": "tiny-mistral4", "lora_target_linear": None,
                                "lora_target_modules": targets, "attn_implementation": None}))
    code = main(["check", "tiny-mistral4", "--from-config", str(path), "--gpu", "A100-40GB", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0 and doc["fits"], doc
    assert doc["adapter"]["kernels"][:3] == ["mlp", "qkv", "o"]
    assert TAKES_NO_LAYER["mistral4"] in doc["config_notes"]


def test_the_kernels_under_zero3_are_refused_and_under_zero2_checked(capsys, tmp_path):
    # Axolotl turns the kernels on under DeepSpeed (check_auto_enable_lora_kernels); ZeRO-3 gathers a
    # module's weights only as it is called, which the patched forwards do not do for their projections
    path = tmp_path / "axolotl.yml"
    path.write_text(json.dumps({**AXOLOTL, "sequence_len": 64, "deepspeed": "deepspeed_configs/zero3.json"}))
    code = main(["check", "tiny-llama", "--from-config", str(path), "--gpu", "A100-40GB", "--gpus", "2"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "fused LoRA kernels (mlp, qkv, o) under DeepSpeed ZeRO-3 are not modelled" in err
    assert "fetch_sub_module" in err and "lora_qkv_kernel" in err
    path.write_text(json.dumps({**AXOLOTL, "sequence_len": 64, "deepspeed": "deepspeed_configs/zero2.json"}))
    capsys.readouterr()
    code = main(["check", "tiny-llama", "--from-config", str(path), "--gpu", "A100-40GB", "--gpus", "2",
                 "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0 and doc["fits"], doc
