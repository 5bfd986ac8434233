"""Axolotl's fused LoRA kernels under the estimator (backends/estimate/lora_kernels.py): on fake CUDA
tensors each Function saves the bytes Axolotl's ``save_for_backward`` saves, a 4-bit base is
dequantized with the allocations of Axolotl's ``dequantize``, the Triton activations allocate only
their output, and the backward runs under the forward's autocast again (``custom_bwd``)."""

from __future__ import annotations

import json
import math
import warnings

import pytest
import torch

from autotune.backends.estimate.attention import AttentionKernels
from autotune.backends.estimate.backend import EstimateBackend
from autotune.backends.estimate.emulation import CudaEmulation
from autotune.backends.estimate.lora_kernels import HOOKS, forward_autocast
from autotune.backends.estimate.nf4 import EmulatedLinear4bit
from autotune.backends.estimate.tracker import StorageTracker
from autotune.gpus import resolve_gpu
from autotune.workload import Workload
from autotune.workload.adapters import make_adapter
from autotune.workload.lora_kernel_functions import glu_backward, glu_forward
from autotune.workload.models import resolve_model

SM80 = AttentionKernels(flash=True, bf16=True)
# tiny-llama: hidden 32, intermediate 64, 2 heads of 16 (q 32 wide), 1 key/value head (k, v 16 wide)
BATCH, SEQ, HIDDEN, INNER, KV, R = 2, 8, 32, 64, 16, 8
T, BF16 = BATCH * SEQ, 2  # tokens; bytes a bfloat16


def fake_layer(method: str, dropout: float = 0.0, kernels: tuple[str, ...] = ("mlp", "qkv", "o")):
    """The estimator's fake bf16 tiny-llama with the adapter, and its first decoder layer."""
    adapter = make_adapter(method, r=R, alpha=16, dropout=dropout, targets="all-linear", kernels=kernels,
                           recipe="axolotl" if method == "qlora" else None)
    workload = Workload(resolve_model("tiny-llama"), "causal-lm", "sdpa", weights_dtype="bfloat16",
                        adapter=adapter)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fake = EstimateBackend(resolve_gpu("A100-40GB"))._model(workload)
    return fake, fake.model.base_model.model.model.layers[0]


def saved_bytes(run) -> int:
    """The bytes of the distinct storages ``run()`` saves for backward (every node's)."""
    found: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        found[tensor.untyped_storage()._cdata] = tensor.untyped_storage().nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        run()
    return sum(found.values())


def under_estimator(fake, run):
    """``run(x)`` on a fake bf16 [2, 8, 32] input that requires grad, under bf16 autocast emulated."""
    emulation = CudaEmulation(torch.bfloat16, SM80)
    with fake.mode_ctx, emulation, emulation.forward_region():
        x = torch.empty(BATCH, SEQ, HIDDEN, dtype=torch.bfloat16, requires_grad=True)
        return run(x)


# Axolotl's save_for_backward (lora.py), non-DoRA branches, in bytes; LoRA weights copied to bf16.
MLP_SAVED = (T * HIDDEN * BF16  # X (and X again for X_drop without dropout)
             + 2 * T * INNER * BF16  # gate, up
             + 2 * (R * HIDDEN + INNER * R) * BF16  # gate_A, gate_B, up_A, up_B
             + (R * INNER + HIDDEN * R) * BF16)  # down_A, down_B
QKV_SAVED = T * HIDDEN * BF16 + (R * HIDDEN + HIDDEN * R + 2 * (R * HIDDEN + KV * R)) * BF16
O_SAVED = (R * HIDDEN + HIDDEN * R) * BF16 + T * HIDDEN * BF16  # A, B, X


@pytest.mark.parametrize("method", ["lora", "qlora"])
def test_each_kernel_saves_axolotl_s_tensors_and_less_than_peft_s_layers(method):
    fake, layer = fake_layer(method)
    attn = layer.self_attn

    def qkv(x):
        q = attn.q_proj(x)
        attn.k_proj(x), attn.v_proj(x)  # K and V were made with Q
        return q

    assert under_estimator(fake, lambda x: saved_bytes(lambda: layer.mlp(x))) == MLP_SAVED == 9728
    assert under_estimator(fake, lambda x: saved_bytes(lambda: qkv(x))) == QKV_SAVED
    assert under_estimator(fake, lambda x: saved_bytes(lambda: attn.o_proj(x))) == O_SAVED
    # The same layer through PEFT's LoRA layers and transformers' MLP keeps more.
    plain, plain_layer = fake_layer(method, kernels=())
    peft = under_estimator(plain, lambda x: saved_bytes(lambda: plain_layer.mlp(x)))
    assert peft > MLP_SAVED


def test_with_dropout_the_lora_path_s_input_is_saved_besides():
    # One mask for gate and up (lora.py _apply_dropout), X_drop saved beside X; CUDA's dropout
    # keeps its 1-byte mask (emulation.py).
    fake, layer = fake_layer("lora", dropout=0.1)
    found = under_estimator(fake, lambda x: saved_bytes(lambda: layer.mlp(x)))
    assert found == MLP_SAVED + T * HIDDEN * BF16 + T * HIDDEN


def events(tracker: StorageTracker, start: int) -> list[int]:
    """Sizes allocated (positive) and freed (negative, by the size allocated) since ``start``."""
    sizes: dict[int, int] = {}
    found = []
    for key, size in tracker.events[start:]:
        if size > 0:
            sizes[key] = size
            found.append(size)
        elif key in sizes:
            found.append(-sizes[key])
    return found


def test_a_4bit_base_is_dequantized_for_each_use_and_freed_after_it():
    # LoRA_O over the emulated 4-bit o_proj (32 x 32, double quantization): matmul_lora's
    # dequantize(W.t(), quant_state) makes the bf16 weight, then a float32 absmax of ceil(n / 64)
    # values freed at once (_ctypes_nf4_dequant), the base matmul's output, the weight freed
    # (``del W``), A and B cast to bf16, X @ A freed after addmm_, the casts freed, then the saved
    # bf16 copies of A and B.
    fake, layer = fake_layer("qlora")
    assert isinstance(layer.self_attn.o_proj.base_layer, EmulatedLinear4bit)
    weight, absmax = HIDDEN * HIDDEN * BF16, math.ceil(HIDDEN * HIDDEN / 64) * 4
    A, B, out, XA = R * HIDDEN * BF16, HIDDEN * R * BF16, T * HIDDEN * BF16, T * R * BF16

    def run(x):
        with StorageTracker() as tracker:
            for tensor in (x, *fake.model.parameters(), *fake.model.buffers()):
                tracker.track(tensor)  # there before: not the kernel's
            start = len(tracker.events)
            y = layer.self_attn.o_proj(x)
            forward = events(tracker, start)
            dY = torch.empty_like(y)
            start = len(tracker.events)
            (dX,) = torch.autograd.grad(y, x, dY)
            return forward, events(tracker, start)

    forward, backward = under_estimator(fake, run)
    assert forward == [weight, absmax, -absmax, out, -weight, A, B, XA, -XA, -A, -B, A, B]
    # LoRA_O.backward: grad_B = dY @ B, d_A and d_B (bf16), A @ X.t() freed after addmm_, the weight
    # dequantized again for dX = dY @ W and freed, grad_B freed as it returns; autograd then casts
    # d_A and d_B to the float32 parameters' dtype (and drops them: only dX was asked for).
    AX = R * T * BF16
    assert backward == [XA, A, B, AX, -AX, weight, absmax, -absmax, out, -weight, -XA,
                        2 * A, -A, 2 * B, -B, -2 * A, -2 * B]


def test_the_activation_kernels_allocate_their_output_alone_and_write_gradients_in_place():
    fake, _ = fake_layer("lora")
    with fake.mode_ctx:
        gate, up = (torch.empty(BATCH, SEQ, INNER, dtype=torch.bfloat16) for _ in range(2))
        for glu in ("swiglu", "geglu"):
            with StorageTracker() as tracker:
                out = glu_forward(glu, gate, up, HOOKS.registers)
                grad = torch.empty_like(out)
                start = len(tracker.events)
                h, grad_gate, grad_up = glu_backward(glu, grad, gate, up, HOOKS.registers)
            assert events(tracker, 0)[:1] == [T * INNER * BF16]  # torch.empty((batch, seq, hidden))
            assert events(tracker, start) == []  # the kernel's arithmetic is in registers
            assert (h is grad, grad_gate is gate, grad_up is up) == (True, True, True)


def test_nemotron_s_layernorm1p_hands_the_qkv_kernel_the_autocast_dtype():
    # modeling_nemotron.py NemotronLayerNorm1P casts its input, weight + 1 and bias to the autocast
    # dtype and runs layer_norm with autocast disabled: bfloat16 out on CUDA, which LoRA_QKV takes
    # (a float32 X would fail matmul_lora's addmm_, lora_kernel_functions.py MixedDtypes).
    from transformers import AutoConfig

    from autotune.workload.models import ModelSpec

    config = AutoConfig.for_model("nemotron", hidden_size=HIDDEN, intermediate_size=INNER,
                                  num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                  head_dim=16, vocab_size=128, max_position_embeddings=128)
    adapter = make_adapter("qlora", r=R, alpha=16, dropout=0.0, targets="all-linear", kernels=("qkv", "o"),
                           recipe="axolotl")
    workload = Workload(ModelSpec("tiny-nemotron", "local", config, 128), "causal-lm", "sdpa",
                        weights_dtype="bfloat16", adapter=adapter)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fake = EstimateBackend(resolve_gpu("A100-40GB"))._model(workload)
    layer = fake.model.base_model.model.model.layers[0]
    attn = layer.self_attn

    def qkv(x):
        h = layer.input_layernorm(x)
        q = attn.q_proj(h)
        attn.k_proj(h), attn.v_proj(h)
        return h.dtype, q.dtype

    assert under_estimator(fake, qkv) == (torch.bfloat16, torch.bfloat16)


def test_the_backward_runs_under_the_forward_s_autocast_again():
    assert forward_autocast()[0] is None  # no emulation: no autocast
    emulation = CudaEmulation(torch.bfloat16, SM80)
    with emulation, emulation.forward_region():
        dtype, again = forward_autocast()
        with torch.autocast("cpu", enabled=False):  # a region the model runs without autocast
            assert forward_autocast()[0] is None
    assert dtype == torch.bfloat16
    with again():  # entered anew outside it (Tensor.backward runs outside the function mode)
        assert forward_autocast()[0] == torch.bfloat16
        with again():  # and not twice
            from torch.overrides import _get_current_function_mode_stack

            assert sum(mode is emulation for mode in _get_current_function_mode_stack()) == 1


# Axolotl's Qwen 3.5 QLoRA example's adapter (examples/qwen3.5/27b-qlora.yaml) on the tiny model: the
# full attention's q/k/v/o and the MLPs; all-linear would take the Gated DeltaNet projections as well.
# Without checkpointing every layer's saved activations are held at the peak: the kernels' show (with
# it the peak is a linear-attention layer's recomputed backward, the same either way).
QWEN_3_5 = {"base_model": "tiny-qwen3_5_text", "sequence_len": 128, "adapter": "qlora", "load_in_4bit": True,
            "lora_r": 8, "lora_alpha": 16, "lora_target_modules": ["q_proj", "k_proj", "v_proj", "o_proj",
                                                                   "gate_proj", "up_proj", "down_proj"],
            "bf16": True, "gradient_checkpointing": False, "sample_packing": True,
            "attn_implementation": "flash_attention_2"}
OFF = {"lora_mlp_kernel": False, "lora_qkv_kernel": False, "lora_o_kernel": False}


def test_qwen3_5_s_attention_and_mlps_take_the_kernels_under_the_estimator(capsys, tmp_path):
    from autotune.cli import main

    def check(**changes) -> tuple[int, dict]:
        path = tmp_path / "axolotl.yml"
        path.write_text(json.dumps({**QWEN_3_5, **changes}))
        code = main(["check", "tiny-qwen3_5_text", "--from-config", str(path), "--gpu", "A100-40GB", "--json",
                     "--no-cache"])
        return code, json.loads(capsys.readouterr().out)

    (code, on), (_, off) = check(micro_batch_size=256), check(micro_batch_size=256, **OFF)
    assert code == 0 and on["fits"] and off["fits"]
    assert "with Axolotl's fused LoRA kernels (emulated): mlp, qkv, o" in on["adapter"]["label"]
    assert on["peak_memory_bytes"] < off["peak_memory_bytes"]
    code, refused = check(micro_batch_size=4, lora_target_modules=None, lora_target_linear=True)
    assert code == 2 and "linear-attention projections (in_proj_qkv" in refused["error"]


def test_gemma_4_s_k_eq_v_layer_saves_lora_qk_s_tensors(tmp_path):
    # attention_k_eq_v: the full layer's v_proj is None, apply_lora_qk's LoRA_QK saves X and q's and k's
    # LoRA weights in bf16 (lora.py LoRA_QK.forward, non-DoRA) and hands K back for V
    from transformers import AutoConfig

    AutoConfig.for_model("gemma4_text", hidden_size=HIDDEN, intermediate_size=INNER, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, num_global_key_value_heads=1,
                         head_dim=16, global_head_dim=16, vocab_size=128, max_position_embeddings=128,
                         layer_types=["sliding_attention", "full_attention"], sliding_window=64,
                         num_kv_shared_layers=0, attention_k_eq_v=True, hidden_size_per_layer_input=0
                         ).save_pretrained(tmp_path)
    adapter = make_adapter("lora", r=R, alpha=16, dropout=0.0, targets="q_proj,k_proj,v_proj,o_proj",
                           kernels=("qkv", "o"))
    workload = Workload(resolve_model(str(tmp_path)), "causal-lm", "sdpa", weights_dtype="bfloat16",
                        adapter=adapter)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fake = EstimateBackend(resolve_gpu("A100-40GB"))._model(workload)
    attn = fake.model.base_model.model.model.layers[1].self_attn
    assert attn.v_proj is None

    def qk(x):
        q = attn.q_proj(x)
        assert attn.k_proj(x).grad_fn is q.grad_fn  # K was made with Q, by LoRA_QK
        return q

    assert under_estimator(fake, lambda x: saved_bytes(lambda: qk(x))) == (
        T * HIDDEN * BF16 + (R * HIDDEN + HIDDEN * R + R * HIDDEN + KV * R) * BF16)
