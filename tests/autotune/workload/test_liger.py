"""Liger Kernel's kernels, emulated (workload/liger.py, liger_kernels.py): the values and gradients of
the modules they replace, the tensors Liger saves for backward, the allocations the estimator sees,
which modules each model type's patch swaps, and the step option through the CLI and the configs."""

from __future__ import annotations

import contextlib
import copy
import json

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from transformers import AutoConfig
from transformers.loss.loss_utils import ForCausalLMLoss
from transformers.models.gemma2.modeling_gemma2 import Gemma2RMSNorm
from transformers.models.llama import modeling_llama

from autotune.backends.estimate.tracker import StorageTracker, outside_allocator
from autotune.cli import main
from autotune.configs import read_training_config
from autotune.errors import InvalidInput
from autotune.workload.liger import PATCHES, apply_kernels, check_kernels, parse_kernels
from autotune.workload.liger_kernels import functions
from autotune.workload.models import ModelSpec
from autotune.workload.modes import parse_mode
from autotune.workload.step import build_model, gradient_checkpointing, make_batch
from autotune.workload.vision import make_images

NONE = contextlib.nullcontext  # registers on a CPU: the values are what is checked
SMALL = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
         "num_key_value_heads": 1, "head_dim": 16, "vocab_size": 128, "max_position_embeddings": 128,
         "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
EXTRA = {"gemma2": {"query_pre_attn_scalar": 16, "sliding_window": 64},
         "gemma3_text": {"query_pre_attn_scalar": 16, "sliding_window": 64},
         "llama4_text": {"intermediate_size_mlp": 64, "num_local_experts": 4, "no_rope_layers": [1, 0]}}
# Llama 4's rope is Liger's own kernel (refused); the others' every kernel
LLAMA4 = ("llama4", "llama4_text")
ROWS, HIDDEN, INNER, VOCAB = 16, 64, 128, 128  # a [2, 8] batch's tokens


def small_config(model_type: str):
    if model_type == "gemma3":  # Gemma 3's vision-language model: a SigLIP tower beside the text model
        vision = {"model_type": "siglip_vision_model", "hidden_size": 32, "intermediate_size": 64,
                  "num_hidden_layers": 2, "num_attention_heads": 2, "image_size": 32, "patch_size": 8}
        return AutoConfig.for_model("gemma3", text_config={"model_type": "gemma3_text", **SMALL,
                                                           **EXTRA["gemma3_text"]},
                                    vision_config=vision, mm_tokens_per_image=4, image_token_index=100,
                                    boi_token_index=101, eoi_token_index=102)
    if model_type == "llama4":  # Llama 4's vision-language model: a tower beside the text model
        vision = {"model_type": "llama4_vision_model", "hidden_size": 32, "intermediate_size": 64,
                  "num_hidden_layers": 2, "num_attention_heads": 2, "image_size": 56, "patch_size": 14,
                  "vision_output_dim": 32, "projector_input_dim": 32, "projector_output_dim": 32}
        return AutoConfig.for_model("llama4", text_config={"model_type": "llama4_text", **SMALL,
                                                           **EXTRA["llama4_text"]},
                                    vision_config=vision, image_token_index=100, boi_token_index=101,
                                    eoi_token_index=102)
    return AutoConfig.for_model(model_type, **SMALL, **EXTRA.get(model_type, {}))


def patched_count(model: torch.nn.Module) -> int:
    return sum("forward" in vars(module) for module in model.modules())


# --- the kernels give the values and gradients of what they replace ---------------------------------


@pytest.mark.parametrize("model_type", sorted(PATCHES))
def test_a_patched_model_has_the_loss_and_gradients_of_its_own(model_type):
    torch.manual_seed(0)
    config = small_config(model_type)
    task = "image-text-to-text" if model_type == "llama4" else "causal-lm"
    model, _ = build_model(ModelSpec(f"small-{model_type}", "local", config, 128), task, "eager")
    model.eval()  # no dropout: both see the same forward
    for parameter in model.parameters():
        parameter.data.normal_(0, 0.5)  # Gemma's norm weights start at 0: make every path count
    reference = copy.deepcopy(model)
    asked = "rms_norm,swiglu,cross_entropy" if model_type in LLAMA4 else \
        "rms_norm,rope,swiglu,geglu,cross_entropy"
    kernels = check_kernels(asked, config, "causal-lm", "full")
    apply_kernels(model, kernels, sm_count=3, registers=NONE)
    batch = make_batch(config, task, 2, 16, images=make_images(0, None) if model_type == "llama4" else None)
    batch["input_ids"] = torch.randint(3, 100 if model_type in ("gemma3", "llama4") else 128, (2, 16))
    batch["labels"] = batch["input_ids"].clone()
    batch["labels"][0, :4] = -100
    with gradient_checkpointing(model, True), gradient_checkpointing(reference, True):
        model.train(), reference.train()  # checkpointing runs in training only; no dropout in these
        loss, expected = model(**batch).loss, reference(**batch).loss
        loss.backward()
        expected.backward()
    assert torch.allclose(loss, expected, rtol=1e-5)
    for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
        if q.grad is None:  # Gemma 3's vision tower and projector, unrun without images
            towers = ("model.vision_tower.", "model.multi_modal", "vision_model.", "multi_modal_projector.")
            assert p.grad is None and name.startswith(towers), name
            continue
        assert torch.allclose(p.grad, q.grad, rtol=1e-4, atol=1e-5), name
    # every norm (Qwen3's and Gemma 3's q_norm and k_norm too), MLP and attention of the 2 layers;
    # Gemma 3's vision-language model: its projector's mm_soft_emb_norm too (a Gemma3RMSNorm)
    norms = {"qwen3": 9, "gemma2": 9, "gemma3_text": 13, "gemma3": 14}.get(model_type, 5)
    # Llama 4: every layer's shared expert, no rope (its own kernel, refused)
    assert patched_count(model) == norms + 2 + (0 if model_type in LLAMA4 else 2)


def test_the_kernels_in_bfloat16_match_transformers_modules():
    torch.manual_seed(0)
    config = small_config("llama")
    x = torch.randn(2, 8, HIDDEN, dtype=torch.bfloat16, requires_grad=True)
    norm = modeling_llama.LlamaRMSNorm(HIDDEN).to(torch.bfloat16)
    norm.weight.data.normal_()
    mlp = modeling_llama.LlamaMLP(AutoConfig.for_model("llama", **{**SMALL, "hidden_size": HIDDEN})).to(
        torch.bfloat16)
    ours = functions()
    got = mlp.down_proj(ours.SiLUMul.apply(mlp.gate_proj(x), mlp.up_proj(x), NONE))
    got = ours.RMSNorm.apply(got, norm.weight, 1e-6, 0.0, "llama", True, 4, NONE)
    got.float().pow(2).sum().backward()
    grad, x.grad = x.grad, None
    expected = norm(mlp(x))
    expected.float().pow(2).sum().backward()
    assert config.hidden_act == "silu"
    assert torch.allclose(got.float(), expected.float(), rtol=2e-2, atol=2e-2)
    assert torch.allclose(grad.float(), x.grad.float(), rtol=5e-2, atol=5e-2)


def test_rope_and_the_gemma_norm_give_transformers_values():
    torch.manual_seed(0)
    # q and k [batch, heads, seq, head_dim] as the attention has them: transposed views
    q = torch.randn(2, 8, 4, 16).transpose(1, 2).requires_grad_()
    k = torch.randn(2, 8, 1, 16).transpose(1, 2).requires_grad_()
    freqs = torch.randn(2, 8, 8), torch.randn(2, 8, 8)
    cos, sin = (torch.cat([f, f], -1) for f in freqs)  # as transformers' rotary embedding makes them
    q_ref, k_ref = modeling_llama.apply_rotary_pos_emb(q, k, cos, sin)
    (q_ref.sum() * 2 + k_ref.pow(2).sum()).backward()
    q2, k2 = q.detach().clone().requires_grad_(), k.detach().clone().requires_grad_()
    q_out, k_out = functions().Rope.apply(q2 * 1, k2 * 1, cos, sin, NONE)  # non-leaf, as q_proj's output
    (q_out.sum() * 2 + k_out.pow(2).sum()).backward()
    assert torch.allclose(q_out, q_ref, atol=1e-6) and torch.allclose(k_out, k_ref, atol=1e-6)
    assert torch.allclose(q2.grad, q.grad, atol=1e-5) and torch.allclose(k2.grad, k.grad, atol=1e-5)

    norm = Gemma2RMSNorm(HIDDEN)
    norm.weight.data.normal_()
    x = torch.randn(ROWS, HIDDEN, requires_grad=True)
    y = functions().RMSNorm.apply(x * 1, norm.weight, norm.eps, 1.0, "gemma", False, 5, NONE)
    (y * torch.arange(HIDDEN)).sum().backward()
    grads = x.grad.clone(), norm.weight.grad.clone()
    x.grad = norm.weight.grad = None
    expected_y = norm(x)
    (expected_y * torch.arange(HIDDEN)).sum().backward()
    assert torch.allclose(y, expected_y, atol=1e-5)
    assert torch.allclose(grads[0], x.grad, atol=1e-4)
    assert torch.allclose(grads[1], norm.weight.grad, atol=1e-4)


def test_the_cross_entropy_is_transformers_causal_lm_loss():
    from autotune.workload.liger import _causal_lm_loss

    torch.manual_seed(0)
    logits = torch.randn(2, 8, VOCAB, dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, VOCAB, (2, 8))
    labels[1, 2:5] = -100
    for items in (None, torch.tensor(11)):
        loss = _causal_lm_loss(NONE)(logits * 1, labels, VOCAB, num_items_in_batch=items)
        (loss * 3).backward()
        grad, logits.grad = logits.grad, None
        expected = ForCausalLMLoss(logits, labels, VOCAB, num_items_in_batch=items)
        (expected * 3).backward()
        assert torch.allclose(loss, expected, rtol=1e-5)
        assert torch.allclose(grad.float(), logits.grad.float(), rtol=1e-2, atol=1e-4)
        logits.grad = None


# --- what Liger saves for backward, and what the estimator sees allocated ---------------------------------


def saved(run) -> list[tuple[tuple[int, ...], torch.dtype]]:
    """The tensors ``run()`` saves for backward: (shape, dtype) each."""
    found: list[torch.Tensor] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: found.append(t) or t, lambda t: t):
        run()
    return [(tuple(t.shape), t.dtype) for t in found]


def nbytes(tensors) -> int:
    return sum(torch.Size(shape).numel() * dtype.itemsize for shape, dtype in tensors)


def test_each_kernel_saves_what_liger_saves():
    bf16, f32 = torch.bfloat16, torch.float32
    x = torch.randn(2, 8, HIDDEN, dtype=bf16, requires_grad=True)
    w = torch.ones(HIDDEN, dtype=bf16, requires_grad=True)
    a, b = (torch.randn(2, 8, INNER, dtype=bf16, requires_grad=True) for _ in range(2))
    q, k = torch.randn(2, 4, 8, 16, requires_grad=True), torch.randn(2, 1, 8, 16, requires_grad=True)
    cos, sin = torch.randn(1, 8, 16), torch.randn(1, 8, 16)
    ours = functions()
    # LigerRMSNormFunction: ctx.save_for_backward(X, W, RSTD), RSTD float32 [rows]
    rms = saved(lambda: ours.RMSNorm.apply(x * 1, w, 1e-6, 0.0, "llama", True, 4, NONE))
    assert rms == [((ROWS, HIDDEN), bf16), ((HIDDEN,), bf16), ((ROWS,), f32)]
    assert nbytes(rms) == ROWS * HIDDEN * 2 + HIDDEN * 2 + ROWS * 4
    # transformers' LlamaRMSNorm saves float32 copies of X besides: more than twice as much
    norm = modeling_llama.LlamaRMSNorm(HIDDEN).to(bf16)
    assert nbytes(saved(lambda: norm(x * 1))) > 2 * nbytes(rms)
    # LigerSiLUMulFunction and LigerGELUMulFunction: ctx.save_for_backward(a, b)
    for function in (ours.SiLUMul, ours.GELUMul):
        assert saved(lambda: function.apply(a * 1, b * 1, NONE)) == [((ROWS, INNER), bf16)] * 2  # noqa: B023
    # LigerRopeFunction: ctx.save_for_backward(cos, sin)
    assert saved(lambda: ours.Rope.apply(q * 1, k * 1, cos, sin, NONE)) == [((1, 8, 16), f32)] * 2
    # LigerCrossEntropyFunction: ctx.save_for_backward(_input.detach()), the logits holding their gradient
    logits = torch.randn(ROWS, VOCAB, requires_grad=True)
    target = torch.randint(0, VOCAB, (ROWS,))
    assert saved(lambda: ours.CrossEntropy.apply(logits * 1, target, "mean", NONE)) == [((ROWS, VOCAB), f32)]


def allocations(make, forward, backward) -> tuple[list[int], list[int]]:
    """The bytes of each allocation the estimator records (fake CUDA tensors, the tracker of a
    traced step, the kernels' arithmetic in outside_allocator) in ``forward(*make())`` and in
    ``backward(output, *inputs)``; what ``make`` creates is allocated before either."""
    with FakeTensorMode(), StorageTracker(reductions=True) as tracker:
        inputs = make()
        start = len(tracker.events)
        output = forward(*inputs)
        middle = len(tracker.events)
        backward(output, *inputs)
        events = tracker.events
    grown = [[size for key, size in events[i:j] if key >= 0 and size > 0]
             for i, j in ((start, middle), (middle, len(events)))]
    return grown[0], grown[1]


def test_the_estimator_sees_liger_s_allocations_and_none_of_the_kernels_arithmetic():
    ours, bf16 = functions(), torch.bfloat16
    sm_count = 8

    def norm_inputs():
        x, w = (torch.empty(*shape, dtype=bf16, requires_grad=True) for shape in ((ROWS, HIDDEN), (HIDDEN,)))
        return x * 1, w, torch.empty(ROWS, HIDDEN, dtype=bf16)

    for in_place in (True, False):
        def norm(x, w, dy, in_place=in_place):
            return ours.RMSNorm.apply(x, w, 1e-6, 0.0, "llama", in_place, sm_count, outside_allocator)

        fwd, bwd = allocations(norm_inputs, norm, lambda y, x, w, dy: torch.autograd.grad(y, (x, w), dy))
        assert fwd == [ROWS * HIDDEN * 2, ROWS * 4]  # Y, RSTD
        # _dW [sm_count, hidden] float32, dX where not over dY, _dW.sum(0), .to(W.dtype)
        dx = [] if in_place else [ROWS * HIDDEN * 2]
        assert bwd == [sm_count * HIDDEN * 4, *dx, HIDDEN * 4, HIDDEN * 2]

    def glu_inputs():
        a, b = (torch.empty(ROWS, INNER, dtype=bf16, requires_grad=True) for _ in range(2))
        return a * 1, b * 1, torch.empty(ROWS, INNER, dtype=bf16)

    for function in (ours.SiLUMul, ours.GELUMul):
        fwd, bwd = allocations(glu_inputs, lambda a, b, dc: function.apply(a, b, outside_allocator),  # noqa: B023
                               lambda c, a, b, dc: torch.autograd.grad(c, (a, b), dc))
        assert (fwd, bwd) == ([ROWS * INNER * 2], [])  # c; da and db over a and b

    def rope_inputs():
        q = (torch.empty(2, 8, 4, 16, requires_grad=True) * 1).transpose(1, 2)
        k = (torch.empty(2, 8, 1, 16, requires_grad=True) * 1).transpose(1, 2)
        grads = torch.empty(2, 8, 4, 16).transpose(1, 2), torch.empty(2, 8, 1, 16).transpose(1, 2)
        return q, k, torch.empty(1, 8, 16), torch.empty(1, 8, 16), grads

    fwd, bwd = allocations(rope_inputs,
                           lambda q, k, cos, sin, g: ours.Rope.apply(q, k, cos, sin, outside_allocator),
                           lambda out, q, k, cos, sin, g: torch.autograd.grad(out, (q, k), g))
    assert (fwd, bwd) == ([], [])  # q, k and their gradients rotated in place

    def ce_inputs():
        logits = torch.empty(ROWS, VOCAB, requires_grad=True) * 1
        return logits, torch.zeros(ROWS, dtype=torch.long), torch.ones(())

    fwd, bwd = allocations(ce_inputs,
                           lambda x, t, g: ours.CrossEntropy.apply(x, t, "mean", outside_allocator),
                           lambda loss, x, t, g: torch.autograd.grad(loss, x, g))
    assert fwd[0] == ROWS * 4 and max(fwd) < ROWS * VOCAB  # loss_1d, then [rows]-sized at most
    assert bwd == []  # the gradient is the logits', scaled in place


# --- which model types, which kernels ----------------------------------------------------------------------


def test_the_kernels_asked_are_read_in_liger_s_order():
    assert parse_kernels(" swiglu, RMS_norm,rope ") == ("rms_norm", "rope", "swiglu")
    assert parse_kernels(("rope",)) == ("rope",) and parse_kernels(None) == ()
    with pytest.raises(InvalidInput, match="unknown Liger kernel 'relu': allowed are rms_norm, rope, swiglu"):
        parse_kernels("rope,relu")
    with pytest.raises(InvalidInput, match="fused_linear_cross_entropy is loss chunked") as error:
        parse_kernels("fused_linear_cross_entropy")
    assert error.value.worded({"loss": "--loss"}).endswith("give --loss chunked")


@pytest.mark.parametrize(("model_type", "asked", "kept"), [
    ("llama", "rms_norm,rope,swiglu,geglu,layer_norm", ("rms_norm", "rope", "swiglu")),
    ("gemma2", "rms_norm,swiglu,geglu", ("rms_norm", "geglu")),
    ("mistral", "rope,cross_entropy", ("rope",)),  # its patch's CrossEntropyLoss is unused in transformers 5
    ("phi3", "swiglu,cross_entropy", ("swiglu", "cross_entropy")),
    # apply_liger_kernel_to_gemma3: the text patch, and layer_norm on SigLIP's nn.LayerNorm; its
    # CrossEntropyLoss is unused (Gemma3ForConditionalGeneration calls self.loss_function)
    ("gemma3", "rms_norm,rope,swiglu,geglu,layer_norm,cross_entropy", ("rms_norm", "rope", "geglu",
                                                                      "layer_norm")),
])
def test_a_model_type_keeps_the_kernels_its_patch_takes(model_type, asked, kept):
    assert check_kernels(asked, small_config(model_type), "causal-lm", "full") == kept


@pytest.mark.parametrize(("model_type", "overrides", "asked", "loss", "message"), [
    ("bert", {}, "rms_norm", "full", "^Liger Kernel has no patch for model type bert: autotune emulates"),
    ("granite", {}, "rms_norm", "full", r"granite \(apply_liger_kernel_to_granite\) is not emulated"),
    ("llama", {}, "cross_entropy", "chunked", "cannot both be on"),
    ("llama", {"hidden_act": "gelu"}, "swiglu", "full", "LigerSwiGLUMLP refuses hidden_act 'gelu'"),
    ("llama", {"mlp_bias": True}, "swiglu", "full", "mlp_bias true is not emulated"),
    ("phi3", {"partial_rotary_factor": 0.5}, "rope", "full", "partial_rotary_factor 0.5 of phi3"),
])
def test_what_liger_would_do_otherwise_is_refused_by_name(model_type, overrides, asked, loss, message):
    config = AutoConfig.for_model(model_type, **overrides)
    with pytest.raises(InvalidInput, match=message):
        check_kernels(asked, config, "causal-lm", loss)


def test_gemma3_s_vision_layer_norm_is_liger_s_where_the_tower_does_not_run():
    config = small_config("gemma3")
    model, _ = build_model(ModelSpec("small-gemma3", "local", config, 128), "causal-lm", "eager")
    apply_kernels(model, ("layer_norm",), sm_count=3, registers=NONE)
    swapped = [name for name, module in model.named_modules() if "forward" in vars(module)]
    assert swapped and all(name.startswith("model.vision_tower.") for name in swapped)  # SigLIP's alone
    with pytest.raises(InvalidInput, match="LigerLayerNorm ran .* not emulated"):
        model.model.vision_tower.post_layernorm(torch.zeros(1, 32))
    with pytest.raises(InvalidInput, match="layer_norm on gemma3 swaps the vision tower's nn.LayerNorm .* a "
                                           "step with images is refused"):
        check_kernels("rms_norm,layer_norm", config, "image-text-to-text", "full", images=True)
    assert check_kernels("rms_norm", config, "image-text-to-text", "full", images=True) == ("rms_norm",)


# --- the step option, end to end ------------------------------------------------------------------------


def check_json(capsys, *flags: str) -> dict:
    main(["check", "tiny-llama", "--seq-len", "128", "--mode", "bf16+ckpt", "--gpu-memory", "1GiB",
          "--backend", "estimate", "--json", *flags])
    return json.loads(capsys.readouterr().out)


def test_a_check_with_liger_kernels_says_them_and_peaks_lower(capsys):
    doc = check_json(capsys, "--batch-size", "4", "--liger", "rms_norm,rope,swiglu")
    assert doc["fits"] is True and doc["liger"] == ["rms_norm", "rope", "swiglu"]
    assert "attention sdpa, Liger kernels (emulated): rms_norm, rope, swiglu) on 1 GiB" in doc["message"]
    # tiny-llama's step at batch 4 peaks at the allocator's first segments either way; at 1024 the
    # activations show: the emulated kernels keep less of them.
    with_liger = check_json(capsys, "--batch-size", "1024", "--liger", "rms_norm,rope,swiglu")
    without = check_json(capsys, "--batch-size", "1024")
    assert without["liger"] == [] and "Liger" not in without["message"]
    assert with_liger["peak_memory_bytes"] < without["peak_memory_bytes"]
    assert with_liger["max_batch_size"] > without["max_batch_size"]


def test_an_axolotl_config_with_liger_keys_is_read(tmp_path):
    path = tmp_path / "axolotl.yaml"
    path.write_text("base_model: tiny-llama\nsequence_len: 128\nmicro_batch_size: 4\nbf16: false\n"
                    "plugins:\n  - axolotl.integrations.liger.LigerPlugin\nliger_rope: true\n"
                    "liger_rms_norm: true\nliger_glu_activation: true\nliger_layer_norm: true\n"
                    "liger_fused_linear_cross_entropy: true\n")
    config = read_training_config(path)
    step = config.request.step
    assert (step.liger, step.loss) == (("rms_norm", "rope", "swiglu", "geglu", "layer_norm"), "chunked")
    assert any(note.startswith("liger_glu_activation, liger_layer_norm, liger_rms_norm, liger_rope: Liger's "
                               "kernels, emulated") for note in config.notes)
    kept = check_kernels(step.liger, small_config("llama"), "causal-lm", step.loss)
    assert kept == ("rms_norm", "rope", "swiglu")  # no LayerNorm nor GeGLU in Llama's patch


def test_trainer_use_liger_kernel_is_liger_s_defaults_under_its_config(tmp_path):
    path = tmp_path / "sft.json"
    path.write_text(json.dumps({"model_name_or_path": "tiny-llama", "max_length": 128, "bf16": True,
                                "dataset_text_field": "text", "loss_type": "nll", "use_liger_kernel": True,
                                "liger_kernel_config": {"rope": False}}))
    step = read_training_config(path).request.step
    assert (step.liger, step.loss) == (("rms_norm", "swiglu", "geglu"), "chunked")
    path.write_text(json.dumps({"output_dir": "out", "use_liger_kernel": True, "liger_kernel_config": {
        "cross_entropy": True, "fused_linear_cross_entropy": False}}))
    step = read_training_config(path).request.step
    assert (step.liger, step.loss) == (("rms_norm", "rope", "swiglu", "geglu", "cross_entropy"), "full")


def test_the_cuda_backend_carries_the_kernels_and_needs_liger_kernel():
    import importlib.util

    from autotune.backends.cuda.liger import require_liger
    from autotune.backends.cuda.protocol import CellSpec, cell_spec, rebuild_workload
    from autotune.errors import BackendUnavailable
    from autotune.request import CheckRequest, request_from, resolve

    request = request_from(CheckRequest, {"model": "tiny-llama", "seq_len": 64, "batch_size": 4,
                                          "liger": "swiglu,rope", "gpu_memory": "1GiB",
                                          "backend": "estimate"})
    workload = resolve(request).workload
    assert workload.liger == ("rope", "swiglu")
    sent = json.dumps(cell_spec(workload, parse_mode("bf16"), 64, 2**30).to_json())  # what the worker reads
    spec = CellSpec.from_json(json.loads(sent))
    assert rebuild_workload(spec)[0].liger == ("rope", "swiglu")
    if importlib.util.find_spec("liger_kernel") is None:  # the worker refuses the cell, naming the package
        with pytest.raises(BackendUnavailable, match="need the liger_kernel package"):
            require_liger()


def test_a_text_only_gemma3_vlm_step_takes_liger_s_vision_layer_norm_and_one_with_images_does_not():
    import autotune

    def check(images: int):
        return autotune.check("tiny-gemma3", seq_len=128, batch_size=2, gpu_memory="1GiB", backend="estimate",
                              workers=1, mode="bf16+ckpt", images_per_sample=images,
                              liger="rms_norm,rope,geglu,layer_norm")

    text = check(0)  # the qat_nvfp4 Gemma 3 configs: no processor_type, the text collators
    assert text.fits and text.liger == ["rms_norm", "rope", "geglu", "layer_norm"]
    with pytest.raises(InvalidInput, match="a step with images is refused"):
        check(1)


def test_llama4_rope_and_swiglu_beside_dense_layers_are_refused():
    # Liger's Llama 4 rope is its own kernel; LigerSwiGLUMLP cannot build Maverick's dense MLPs.
    with pytest.raises(InvalidInput, match="apply_liger_llama4_rope_full"):
        check_kernels("rope", small_config("llama4_text"), "causal-lm", "full")
    interleaved = AutoConfig.for_model("llama4_text", **SMALL, **{**EXTRA["llama4_text"],
                                                                  "interleave_moe_layer_step": 2})
    with pytest.raises(InvalidInput, match="takes no intermediate_size"):
        check_kernels("swiglu", interleaved, "causal-lm", "full")
    assert check_kernels("rms_norm", interleaved, "causal-lm", "full") == ("rms_norm",)


# --- Axolotl's LigerPlugin: its own branches, and the model types it patches nothing of ---------------


def small_gemma4(**text):
    return AutoConfig.for_model("gemma4", text_config={
        "model_type": "gemma4_text", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16, "global_head_dim": 16,
        "vocab_size": 128, "max_position_embeddings": 128, "sliding_window": 64,
        "layer_types": ["sliding_attention", "full_attention"], "hidden_size_per_layer_input": 0,
        "num_kv_shared_layers": 0, **text}, vision_config=None, audio_config=None)


def test_axolotl_s_gemma4_branch_swaps_norms_with_a_weight_and_the_mlp_and_skips_rope():
    config = small_gemma4()
    asked = "rms_norm,rope,swiglu,geglu,layer_norm,cross_entropy,rms_norm_gated"
    with pytest.raises(InvalidInput, match="model type gemma4 .* is not emulated"):
        check_kernels(asked, config, "causal-lm", "full")  # Liger 0.8.0's own: no gemma4 patch
    kernels = check_kernels(asked, config, "causal-lm", "full", axolotl=True)
    assert kernels == ("rms_norm", "geglu")  # rope skipped; no audio tower, so no nn.LayerNorm to swap
    torch.manual_seed(0)
    model, _ = build_model(ModelSpec("small-gemma4", "local", config, 128), "causal-lm", "eager")
    model.eval()
    reference = copy.deepcopy(model)
    apply_kernels(model, kernels, sm_count=3, registers=NONE)
    swapped = {type(module).__name__ for module in model.modules() if "forward" in vars(module)}
    assert swapped == {"Gemma4RMSNorm", "Gemma4TextMLP"}
    weightless = [m for m in model.modules() if type(m).__name__ == "Gemma4RMSNorm" and not m.with_scale]
    assert weightless and all("forward" not in vars(m) for m in weightless)  # v_norm: the model's own
    batch = make_batch(config, "causal-lm", 2, 16)
    batch["labels"] = batch["input_ids"].clone()
    loss, expected = model(**batch).loss, reference(**batch).loss
    loss.backward()
    expected.backward()
    assert torch.allclose(loss, expected, rtol=1e-4)  # Liger's GEGLU is the tanh GELU Gemma 4 runs
    for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
        assert (p.grad is None) == (q.grad is None), name
        if q.grad is not None:
            assert torch.allclose(p.grad, q.grad, rtol=1e-3, atol=1e-5), name


def test_axolotl_s_gemma4_unified_branch_mirrors_gemma4_s():
    # plugin.py's gemma4_unified / gemma4_unified_text branch: Gemma4UnifiedRMSNorm (with a weight) and
    # Gemma4UnifiedTextMLP swapped, rope skipped, its layer_norm the vision embedder's (not built here)
    config = AutoConfig.for_model(
        "gemma4_unified_text", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=16, global_head_dim=16, vocab_size=128,
        max_position_embeddings=128, sliding_window=64, layer_types=["sliding_attention", "full_attention"],
        num_kv_shared_layers=0)
    asked = "rms_norm,rope,geglu,layer_norm,cross_entropy"
    kernels = check_kernels(asked, config, "causal-lm", "full", axolotl=True)
    assert kernels == ("rms_norm", "geglu")
    torch.manual_seed(0)
    model, _ = build_model(ModelSpec("small-gemma4-unified", "local", config, 128), "causal-lm", "eager")
    model.eval()
    reference = copy.deepcopy(model)
    apply_kernels(model, kernels, sm_count=3, registers=NONE)
    swapped = {type(module).__name__ for module in model.modules() if "forward" in vars(module)}
    assert swapped == {"Gemma4UnifiedRMSNorm", "Gemma4UnifiedTextMLP"}
    batch = make_batch(config, "causal-lm", 2, 16)
    batch["labels"] = batch["input_ids"].clone()
    loss, expected = model(**batch).loss, reference(**batch).loss
    loss.backward()
    expected.backward()
    assert torch.allclose(loss, expected, rtol=1e-4)
    for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
        if q.grad is not None:
            assert torch.allclose(p.grad, q.grad, rtol=1e-3, atol=1e-5), name


def test_axolotl_s_gemma4_mlp_cannot_build_double_wide_layers():
    config = small_gemma4(use_double_wide_mlp=True, num_kv_shared_layers=1)
    with pytest.raises(InvalidInput, match="use_double_wide_mlp fails as the checkpoint loads"):
        check_kernels("geglu", config, "causal-lm", "full", axolotl=True)
    assert check_kernels("rms_norm", config, "causal-lm", "full", axolotl=True) == ("rms_norm",)


def test_axolotl_patches_nothing_of_a_model_type_neither_it_nor_liger_has_a_branch_for():
    # plugin.py's last else: "Unsupported model config type: nemotron_h. Liger not applied."
    config = AutoConfig.for_model("nemotron_h")
    assert check_kernels("rms_norm,rope,swiglu,layer_norm,rms_norm_gated", config, "causal-lm", "full",
                         axolotl=True) == ()
    with pytest.raises(InvalidInput, match="^Liger Kernel has no patch for model type nemotron_h"):
        check_kernels("rms_norm", config, "causal-lm", "full")  # Liger's own function: none to call


def test_liger_rms_norm_gated_is_read_and_taken_by_axolotl_s_qwen3_5_branches_alone(tmp_path):
    path = tmp_path / "axolotl.yaml"
    path.write_text("base_model: tiny-llama\nsequence_len: 128\nmicro_batch_size: 4\nbf16: false\n"
                    "plugins:\n  - axolotl.integrations.liger.LigerPlugin\nliger_rms_norm: true\n"
                    "liger_rms_norm_gated: true\n")
    step = read_training_config(path).request.step
    assert step.liger == ("rms_norm", "rms_norm_gated")
    kept = check_kernels(step.liger, small_config("llama"), "causal-lm", "full", axolotl=True)
    assert kept == ("rms_norm",)
    qwen = AutoConfig.for_model("qwen3_5_moe")
    assert check_kernels(step.liger, qwen, "causal-lm", "full", axolotl=True) == step.liger
    with pytest.raises(InvalidInput, match=r"model type qwen3_5_moe \(apply_liger_kernel_to_qwen3_5_moe\) is "
                                           "not emulated"):
        check_kernels(step.liger, qwen, "causal-lm", "full")  # Liger's own function: not Axolotl's branch


@pytest.mark.parametrize("model_type", ["qwen3_5", "qwen3_5_moe"])
def test_axolotl_s_qwen3_5_branches_give_the_loss_and_gradients_of_the_model_s_own(model_type):
    from autotune.workload.models import resolve_model

    config = resolve_model(f"tiny-{model_type}").config
    asked = "rms_norm,rope,swiglu,geglu,layer_norm,cross_entropy,rms_norm_gated"
    # causal-lm: transformers' Qwen3_5(Moe)ForCausalLM, the text model alone, has no nn.LayerNorm
    kept = check_kernels(asked, config, "causal-lm", "full", axolotl=True)
    assert kept == ("rms_norm", "swiglu", "cross_entropy", "rms_norm_gated")  # no rope
    with pytest.raises(InvalidInput, match="a step with images is refused"):
        check_kernels("layer_norm", config, "image-text-to-text", "full", images=True, axolotl=True)
    task = "image-text-to-text"  # the vision-language model's step, without images
    kernels = check_kernels(asked.replace(",cross_entropy", ""), config, task, "full", axolotl=True)
    assert kernels == ("rms_norm", "swiglu", "layer_norm", "rms_norm_gated")  # the tower's LayerNorm too
    torch.manual_seed(0)
    model, _ = build_model(ModelSpec(f"tiny-{model_type}", "local", config, 128), task, "eager")
    model.eval()
    for parameter in model.parameters():
        parameter.data.normal_(0, 0.5)  # the norms' weights start at 0 and 1: make every path count
    reference = copy.deepcopy(model)
    apply_kernels(model, kernels, sm_count=3, registers=NONE)
    swapped = {type(module).__name__.removeprefix("Qwen3_5").removeprefix("Moe")
               for module in model.modules() if "forward" in vars(module)}
    assert {"RMSNorm", "RMSNormGated", "MLP"} <= swapped
    assert "forward" in vars(model.model.visual.blocks[0].norm1)  # the tower's nn.LayerNorm: Liger's
    batch = make_batch(config, task, 2, 16, images=make_images(0, None))
    batch["input_ids"] = torch.randint(3, 100, (2, 16))
    batch["labels"] = batch["input_ids"].clone()
    batch["labels"][0, :4] = -100
    loss, expected = model(**batch).loss, reference(**batch).loss
    loss.backward()
    expected.backward()
    assert torch.allclose(loss, expected, rtol=1e-4)
    for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
        assert (p.grad is None) == (q.grad is None), name
        if q.grad is not None:
            assert torch.allclose(p.grad, q.grad, rtol=1e-3, atol=1e-4), name
    gated = [p for n, p in model.named_parameters() if n.endswith("linear_attn.norm.weight")]
    assert gated and all(p.grad is not None for p in gated)  # the gated norms ran, Axolotl's kernel


def test_axolotl_s_gated_norm_saves_x_g_w_and_a_float32_rstd():
    apply = functions().RMSNormGated.apply
    x = torch.randn(2, 8, 16, dtype=torch.bfloat16, requires_grad=True)
    g = torch.randn(2, 8, 16, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(16, dtype=torch.bfloat16, requires_grad=True)
    y = apply(x, g, w, 1e-6, 0.0, 3, NONE)
    saved = [tuple(t.shape) + (t.dtype,) for t in y.grad_fn.saved_tensors]
    assert saved == [(16, 16, torch.bfloat16), (16, 16, torch.bfloat16), (16, torch.bfloat16),
                     (16, torch.float32)]
    y.sum().backward()
    assert x.grad.shape == x.shape and g.grad.shape == g.shape and w.grad.dtype == torch.bfloat16


def test_a_vision_language_checkpoint_s_text_model_takes_its_checkpoint_s_patch():
    # Axolotl keys the branch on cfg.model_config_type (qwen3_5_moe); the text model built alone
    # (Qwen3_5MoeForCausalLM, model_type qwen3_5_moe_text) lives in the same modeling module.
    from autotune.workload.models import resolve_model

    config = resolve_model("tiny-qwen3_5_moe").config
    kernels = check_kernels("rms_norm,swiglu,rms_norm_gated", config, "causal-lm", "full", axolotl=True)
    model, _ = build_model(ModelSpec("tiny-qwen3_5_moe", "local", config, 128), "causal-lm", "eager")
    assert model.config.model_type == "qwen3_5_moe_text"
    apply_kernels(model, kernels, sm_count=3, registers=NONE, model_type=config.model_type)
    swapped = {type(module).__name__ for module in model.modules() if "forward" in vars(module)}
    assert {"Qwen3_5MoeRMSNorm", "Qwen3_5MoeRMSNormGated", "Qwen3_5MoeMLP"} <= swapped
