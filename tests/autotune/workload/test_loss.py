"""The chunked losses: Liger's fused linear cross-entropy, Cut Cross-Entropy and TRL's chunked_nll,
against the model's own loss (values and gradients on real tensors) and against the full step's
and each other's memory (on the estimator)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from autotune.backends.estimate.backend import EstimateBackend
from autotune.backends.estimate.instrument import InstrumentedBackend
from autotune.backends.estimate.trace import Trace
from autotune.errors import InvalidInput
from autotune.gpus import custom_gpu
from autotune.units import MIB
from autotune.workload import Workload
from autotune.workload.cce import cce_lm_loss
from autotune.workload.chunked_nll import chunked_nll_loss
from autotune.workload.chunks import FixedChunks, LigerChunks, LockRows, from_json
from autotune.workload.loss import check_loss, chunked_lm_loss, liger_chunk_size
from autotune.workload.models import ModelSpec, resolve_model, tiny_config
from autotune.workload.modes import parse_mode
from autotune.workload.step import build_model, make_batch

GIB = 1024**3
# A vocabulary-heavy tiny GPT-2: vocab / hidden = 32 (Liger: 32 chunks), one layer, so that the
# logits dominate the activations as they do for Qwen2.5 (151,936 / 896).
VOCAB, HIDDEN, BATCH, SEQ = 4096, 128, 4, 128
LOGITS_BYTES = BATCH * SEQ * VOCAB * 4  # [batch x seq, vocab] float32: 8 MiB


def vocab_heavy(loss: str) -> Workload:
    config = tiny_config("gpt2", vocab_size=VOCAB, n_embd=HIDDEN, n_layer=1, n_inner=2 * HIDDEN,
                         bos_token_id=0, eos_token_id=0)
    return Workload(ModelSpec("tiny-gpt2-vocab", "local", config, 128), "causal-lm", None, loss=loss)


def test_liger_chunk_sizes():
    # Liger's own example: 16,384 rows, vocab 32,000, hidden 4096 -> inc_factor 8, chunks of 2048.
    assert liger_chunk_size(16_384, 4096, 32_000) == 2048
    # Qwen2.5-0.5B at batch 8 x 2048: inc_factor ceil(151,936 / 896) = 170, ceil(16,384 / 170) = 97.
    assert liger_chunk_size(8 * 2048, 896, 151_936) == 128
    assert liger_chunk_size(3, 32, 128) == 1


@pytest.mark.parametrize("model_type", ["gpt2", "llama"])
def test_the_chunked_loss_and_its_gradients_are_the_models_own(model_type):
    torch.manual_seed(0)
    spec = ModelSpec(f"tiny-{model_type}", "local", tiny_config(model_type), 128)
    model, _ = build_model(spec, "causal-lm", "eager")
    model.eval()  # no dropout: both losses see the same forward
    batch = make_batch(model.config, "causal-lm", 3, 16)
    batch["input_ids"] = torch.randint(0, model.config.vocab_size, (3, 16))
    batch["labels"] = torch.randint(0, model.config.vocab_size, (3, 16))
    batch["labels"][0, 3] = batch["labels"][2, :5] = -100  # skipped by both
    # 48 rows, hidden 32, vocab 128: chunks of next_power_of_2(ceil(48 / 4)) = 16, three of them.
    assert liger_chunk_size(48, 32, 128) == 16

    full = model(**batch).loss
    full.backward()
    expected = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    chunked = chunked_lm_loss(model, batch)
    chunked.backward()

    assert torch.allclose(chunked, full, rtol=1e-5, atol=1e-6)
    for name, p in model.named_parameters():
        assert torch.allclose(p.grad, expected[name], rtol=1e-4, atol=1e-6), name


def _peak_bytes(backend: EstimateBackend, workload: Workload, mode: str) -> int:
    with backend.cell(workload, parse_mode(mode), SEQ, GIB) as cell:
        return cell.fits(BATCH).details["peak_allocated_bytes"]


@pytest.mark.parametrize("mode", ["fp32", "amp"])
def test_the_chunked_step_peaks_lower_by_the_logits_and_their_gradients(mode):
    # The full step peaks at the start of the loss's backward with three [batch x seq, vocab]
    # float32 tensors alive (8 MiB each): the log-softmax of the upcast logits saved for backward,
    # its gradient and the logits' gradient. The chunked step peaks in its loss's forward,
    # holding instead Liger's accumulators ([vocab, hidden] float32 2 MiB, [batch x seq, hidden]
    # 0.25 MiB) and one [vocab, hidden] float32 temporary (grad_weight += mm(...).float()).
    # So the difference is more than the logits and their gradient (2 x 8 MiB) and at most
    # the three of them (24 MiB); measured: 19.5 MiB in fp32.
    backend = EstimateBackend(custom_gpu(GIB))
    full, chunked = (_peak_bytes(backend, vocab_heavy(loss), mode) for loss in ("full", "chunked"))
    assert 2 * LOGITS_BYTES < full - chunked <= 3 * LOGITS_BYTES, (full / MIB, chunked / MIB)


def test_the_instrumented_chunked_step_allocates_what_the_table_step_does():
    backend, workload, fp32 = EstimateBackend(custom_gpu(GIB)), vocab_heavy("chunked"), parse_mode("fp32")
    with backend.cell(workload, fp32, SEQ, GIB):
        expected = backend.trace(backend._model(workload), workload, fp32, SEQ, BATCH)
    instrumented = InstrumentedBackend(backend)
    with instrumented.cell(workload, fp32, SEQ, GIB) as cell:
        cell.fits(BATCH)
    assert instrumented.last is not None
    recorded = Trace.from_events(BATCH, instrumented.last.events, instrumented.last.workspaces)
    assert expected.chunks == ((LigerChunks(HIDDEN, VOCAB), BATCH * SEQ),)  # the loss's layout, kept
    assert recorded == dataclasses.replace(expected, chunks=())


def test_check_loss_names_the_allowed_values():
    assert check_loss("full", "sequence-classification") == "full"
    assert check_loss("chunked", "causal-lm") == "chunked"
    allowed = "full, chunked, cce, chunked_nll, dft, eaft, diffusion, axolotl_eaft"
    with pytest.raises(InvalidInput, match=rf"^unknown loss 'fused': allowed are {allowed}$"):
        check_loss("fused", "causal-lm")
    with pytest.raises(InvalidInput, match=r"^loss 'chunked' needs a per-token language-model head: "
                                           r"task causal-lm or image-text-to-text, not 'masked-lm'$"):
        check_loss("chunked", "masked-lm")


def test_a_model_that_transforms_its_logits_is_refused():
    spec = resolve_model("tiny-gpt2")
    model, _ = build_model(spec, "causal-lm", "eager")
    model.config.final_logit_softcapping = 30.0
    batch = make_batch(model.config, "causal-lm", 1, 8)
    with pytest.raises(InvalidInput, match="does not model final_logit_softcapping=30.0"):
        chunked_lm_loss(model, batch)


# --- Cut Cross-Entropy (workload/cce.py) and TRL's chunked_nll (workload/chunked_nll.py) ----------


def _own_and_other(model, batch, loss_fn):
    """The model's own loss and gradients, then ``loss_fn``'s."""
    full = model(**batch).loss
    full.backward()
    expected = {name: p.grad.float().clone() for name, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    other = loss_fn(model, batch)
    other.backward()
    return full, expected, other


def _labelled_llama(dtype):
    torch.manual_seed(0)
    model, _ = build_model(ModelSpec("tiny-llama", "local", tiny_config("llama"), 128), "causal-lm", "eager")
    model.eval().to(dtype)
    # 3 x 200 tokens: 597 labelled rows after the shift, less the ignored: 3 of TRL's 256-row chunks
    batch = make_batch(model.config, "causal-lm", 3, 200)
    batch["input_ids"] = torch.randint(0, model.config.vocab_size, (3, 200))
    batch["labels"] = torch.randint(0, model.config.vocab_size, (3, 200))
    batch["labels"][0, 3] = batch["labels"][2, :5] = -100  # skipped by both
    return model, batch


def test_trl_s_chunked_nll_and_its_gradients_are_the_models_own():
    model, batch = _labelled_llama(torch.float32)
    full, expected, chunked = _own_and_other(model, batch, chunked_nll_loss)
    assert torch.allclose(chunked, full, rtol=1e-5, atol=1e-6)
    for name, p in model.named_parameters():
        assert torch.allclose(p.grad, expected[name], rtol=1e-4, atol=1e-6), name


def test_cut_cross_entropy_and_its_gradients_are_the_models_own_in_bf16():
    # CCE takes 16-bit embeddings and classifier only (cce_backward_kernel's asserts); its float32
    # arithmetic against the model's bf16 logits: equal to bf16's rounding.
    model, batch = _labelled_llama(torch.bfloat16)
    full, expected, cce = _own_and_other(model, batch, cce_lm_loss)
    assert torch.allclose(cce.float(), full.float(), rtol=1e-3)
    for name, p in model.named_parameters():
        scale = expected[name].abs().max()
        assert (p.grad.float() - expected[name]).abs().max() <= 0.03 * scale, name


def test_cut_cross_entropy_refuses_float32_weights():
    model, batch = _labelled_llama(torch.float32)
    with pytest.raises(InvalidInput, match=r"loss 'cce' with lm_head weights in float32: .*cce_backward"):
        cce_lm_loss(model, batch)


def _bf16(loss: str) -> Workload:
    return dataclasses.replace(vocab_heavy(loss), weights_dtype="bfloat16")


def test_cut_cross_entropy_peaks_below_liger_s_fused_loss_by_its_weight_gradient_temporaries():
    # bf16 weights: Liger holds in its forward a chunk of logits ([16, vocab] bf16, 128 KiB) and, on
    # the estimator's mm path, a [vocab, hidden] product in bf16 (1 MiB) cast to float32 (2 MiB) to
    # add into grad_weight; CCE writes its gradients in place from its kernels, and holds [rows] and
    # [vocab] float32 vectors (lse, logit_avg) and int32 locks: none of those.
    backend = EstimateBackend(custom_gpu(GIB))
    liger, cce = (_peak_bytes(backend, _bf16(loss), "bf16") for loss in ("chunked", "cce"))
    weight_f32 = VOCAB * HIDDEN * 4
    assert weight_f32 <= liger - cce <= weight_f32 * 3 // 2 + 16 * VOCAB * 2, (liger / MIB, cce / MIB)


def test_trl_s_chunked_nll_peaks_below_the_full_loss_with_many_chunks():
    # batch 16 x 127 labelled rows: 8 chunks of 256. The full loss holds three [rows, vocab] float32
    # tensors (32 MiB each); chunked_nll a chunk's float32 logits, log-softmax and their gradients
    # ([256, vocab] float32: 4 MiB each) and the float32 copy of the weight and its gradient (2 MiB).
    backend = EstimateBackend(custom_gpu(GIB))
    with backend.cell(_bf16("full"), parse_mode("bf16"), SEQ, GIB) as cell:
        full = cell.fits(16).details["peak_allocated_bytes"]
    with backend.cell(_bf16("chunked_nll"), parse_mode("bf16"), SEQ, GIB) as cell:
        chunked = cell.fits(16).details["peak_allocated_bytes"]
    rows_logits = 16 * SEQ * VOCAB * 4
    assert 2 * rows_logits < full - chunked < 3 * rows_logits, (full / MIB, chunked / MIB)


@pytest.mark.parametrize(("loss", "rule"), [("cce", LockRows(128)), ("chunked_nll", FixedChunks(256))])
def test_the_new_losses_record_their_layouts_in_the_trace(loss, rule):
    backend, workload, bf16 = EstimateBackend(custom_gpu(GIB)), _bf16(loss), parse_mode("bf16")
    with backend.cell(workload, bf16, SEQ, GIB):
        trace = backend.trace(backend._model(workload), workload, bf16, SEQ, BATCH)
    # the labels shifted: SEQ - 1 rows a sample (cce.py _build_flat_valids, TRL's labels[..., 1:])
    assert trace.chunks == ((rule, BATCH * (SEQ - 1)),)
    assert from_json(rule.to_json()) == rule


def test_the_new_losses_layouts():
    assert FixedChunks(256).layout(200) == (1, 200, 200)
    assert FixedChunks(256).layout(8 * 2047) == (64, 256, 8 * 2047 - 63 * 256)
    assert LockRows(128).layout(2047) == (16,) and LockRows(128).layout(2049) == (17,)
