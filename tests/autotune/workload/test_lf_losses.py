"""LLaMA-Factory's DFT and EAFT losses (workload/lf_losses.py): the copied functions against LLaMA-Factory's
boolean-mask indexing on real tensors, their step on the estimator, and the keys that set them."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from autotune.backends.estimate.backend import EstimateBackend
from autotune.gpus import custom_gpu
from autotune.workload import Workload
from autotune.workload.lf_losses import dft_loss_func, eaft_loss_func, lf_loss
from autotune.workload.loss import check_loss
from autotune.workload.models import ModelSpec, tiny_config
from autotune.workload.modes import parse_mode
from autotune.workload.step import build_model, make_batch

GIB = 1024**3
VOCAB, HIDDEN, BATCH, SEQ = 4096, 128, 4, 128
LOGITS_BYTES = BATCH * SEQ * VOCAB * 4  # [batch x seq, vocab] float32: 8 MiB


def _lf_reference(logits: torch.Tensor, labels: torch.Tensor, eaft: bool) -> torch.Tensor:
    """trainer_utils.py _dft_cross_entropy / _eaft_cross_entropy as LLaMA-Factory writes them: indexing
    by the boolean mask (which fake tensors cannot run)."""
    source = logits.float().view(-1, logits.size(-1))
    target = F.pad(labels, (0, 1), value=-100)[..., 1:].contiguous().view(-1)
    per_token_loss = F.cross_entropy(source, target, ignore_index=-100, reduction="none")
    valid_mask = target != -100
    valid_losses = per_token_loss[valid_mask]
    with torch.no_grad():
        if eaft:
            topk_val, _ = torch.topk(source[valid_mask].detach(), k=20, dim=-1)
            log_probs = topk_val - torch.logsumexp(topk_val, dim=-1, keepdim=True)
            weight = torch.pow(-(log_probs.exp() * log_probs).sum(dim=-1) / 3.0, 1.0)
        else:
            weight = torch.exp(-valid_losses)
    return (valid_losses * weight).mean()


@pytest.mark.parametrize("eaft", [False, True])
def test_the_copied_losses_and_gradients_are_llamafactorys(eaft):
    torch.manual_seed(0)
    spec = ModelSpec("tiny-llama", "local", tiny_config("llama"), 128)
    model, _ = build_model(spec, "causal-lm", "eager")
    model.eval()
    batch = make_batch(model.config, "causal-lm", 3, 16)  # every label set: the estimator's batch
    batch["input_ids"] = torch.randint(0, model.config.vocab_size, (3, 16))
    batch["labels"] = torch.randint(0, model.config.vocab_size, (3, 16))
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    expected = _lf_reference(model(**inputs).logits, batch["labels"], eaft)
    expected.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    got = lf_loss(model, batch, "eaft" if eaft else "dft")
    got.backward()
    assert torch.allclose(got, expected, rtol=1e-5, atol=1e-7)
    for name, p in model.named_parameters():
        assert torch.allclose(p.grad, grads[name], rtol=1e-4, atol=1e-7), name
    outputs = {"logits": model(**inputs).logits}
    func = eaft_loss_func if eaft else dft_loss_func
    assert torch.allclose(func(outputs, batch["labels"]), expected, rtol=1e-5, atol=1e-7)


def _vocab_heavy(loss: str) -> Workload:
    config = tiny_config("gpt2", vocab_size=VOCAB, n_embd=HIDDEN, n_layer=1, n_inner=2 * HIDDEN,
                         bos_token_id=0, eos_token_id=0)
    return Workload(ModelSpec("tiny-gpt2-vocab", "local", config, 128), "causal-lm", None, loss=loss)


def _peak(loss: str, mode: str) -> int:
    backend = EstimateBackend(custom_gpu(GIB))
    with backend.cell(_vocab_heavy(loss), parse_mode(mode), SEQ, GIB) as cell:
        return int(cell.fits(BATCH).details["peak_allocated_bytes"])


def test_dft_holds_the_full_losss_tensors_and_eaft_a_float32_copy_of_the_logits_more():
    # DFT: the logits upcast, their log-softmax saved and its gradient, as the model's own loss (the
    # per-token [rows] vectors are 16 KiB): the same peak, in the backward of the loss. EAFT also takes,
    # in the forward under no_grad, source[valid_mask]: a float32 copy of the labelled rows' logits. With
    # bf16 autocast the forward holds the bf16 logits, their float32 upcast, the log-softmax and that
    # copy, beyond the backward's peak; in fp32 the upcast is the logits themselves.
    assert _peak("dft", "fp32") == _peak("full", "fp32")
    assert _peak("dft", "amp") == _peak("full", "amp")
    extra = _peak("eaft", "amp") - _peak("dft", "amp")
    assert 0 < extra <= LOGITS_BYTES


def test_the_lf_losses_need_a_per_token_head():
    assert check_loss("dft", "causal-lm") == "dft"
    with pytest.raises(Exception, match="loss 'eaft' needs a per-token language-model head"):
        check_loss("eaft", "sequence-classification")

