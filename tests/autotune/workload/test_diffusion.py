"""Axolotl's diffusion step (workload/diffusion.py): the copied loss against the plugin's own code on real
tensors (torch.where and boolean indexing, which fake tensors cannot run), its step on the estimator,
and what it is refused with."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from autotune.backends.estimate.backend import EstimateBackend
from autotune.errors import InvalidInput
from autotune.gpus import custom_gpu
from autotune.workload import Workload
from autotune.workload.diffusion import check_attention, count, diffusion_loss
from autotune.workload.loss import check_loss
from autotune.workload.models import ModelSpec, tiny_config
from autotune.workload.modes import parse_mode
from autotune.workload.step import build_model, make_batch

GIB = 1024**3
VOCAB, HIDDEN, BATCH, SEQ = 4096, 128, 4, 128


def _axolotl_reference(model, input_ids, attention_mask, labels, eps):
    """integrations/diffusion/trainer.py _forward_process and _compute_diffusion_loss (labels given,
    importance_weighting true), utils.py's two helpers, as Axolotl 067b021c writes them."""
    batch_size, seq_len = input_ids.shape
    t = torch.rand(batch_size)
    p_mask = (1 - eps) * t + eps
    p_mask = p_mask[:, None].repeat(1, seq_len)
    p_mask = p_mask * attention_mask.bool().float()
    masked_indices = torch.rand((batch_size, seq_len)) < p_mask
    masked_indices = masked_indices & attention_mask.bool() & (labels != -100)
    noisy_batch = torch.where(masked_indices, torch.full_like(input_ids, 0), input_ids)
    mask_i, mask_j = attention_mask.unsqueeze(2), attention_mask.unsqueeze(1)
    bidirectional_mask = ((mask_i == mask_j) & (mask_i > 0)).unsqueeze(1)
    logits = model(input_ids=noisy_batch.long(), attention_mask=bidirectional_mask).logits
    logits = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)
    batch_indices, seq_indices = torch.where(masked_indices)
    token_loss = F.cross_entropy(logits[batch_indices, seq_indices].float(),
                                 input_ids[batch_indices, seq_indices], reduction="none")
    weighted_loss = token_loss / p_mask[batch_indices, seq_indices].float()
    answer_lengths = (labels != -100).sum(dim=1).float()
    loss_per_sample = torch.zeros(batch_size)
    for i in range(batch_size):
        sample_mask = batch_indices == i
        loss_per_sample[i] = weighted_loss[sample_mask].sum() / answer_lengths[i].clamp(min=1.0)
    return loss_per_sample.mean()


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_the_copied_loss_and_gradients_are_axolotls(attn):
    spec = ModelSpec("tiny-llama", "local", tiny_config("llama"), 128)
    model, _ = build_model(spec, "causal-lm", attn)
    model.eval()
    batch = make_batch(model.config, "causal-lm", 3, 16)  # the last position of each row padded
    # token ids off the config's bos, eos and pad ids: every labelled position maskable
    batch["input_ids"] = torch.randint(3, model.config.vocab_size, (3, 16))
    batch["labels"] = batch["input_ids"].clone()
    # eps 1: p_mask 1, every maskable position masked (the worst step the estimator counts)
    torch.manual_seed(0)
    expected = _axolotl_reference(model, batch["input_ids"], batch["attention_mask"], batch["labels"], 1.0)
    expected.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    torch.manual_seed(0)
    got = diffusion_loss(model, batch, eps=1.0)
    got.backward()
    assert count(batch["input_ids"]) == 3 * 15
    assert torch.allclose(got, expected, rtol=1e-5, atol=1e-7)
    for name, p in model.named_parameters():
        assert torch.allclose(p.grad, grads[name], rtol=1e-4, atol=1e-7), name


def _vocab_heavy(loss: str) -> Workload:
    config = tiny_config("llama", vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=1,
                         intermediate_size=2 * HIDDEN, num_attention_heads=4, num_key_value_heads=4)
    return Workload(ModelSpec("tiny-llama-vocab", "local", config, SEQ), "causal-lm", "sdpa", loss=loss)


def _peak(loss: str, mode: str) -> int:
    backend = EstimateBackend(custom_gpu(GIB))
    with backend.cell(_vocab_heavy(loss), parse_mode(mode), SEQ, GIB) as cell:
        return int(cell.fits(BATCH).details["peak_allocated_bytes"])


def test_the_diffusion_step_holds_a_shifted_copy_and_a_gather_of_the_logits_beyond_the_models_loss():
    # Beyond the model's own loss over the same logits: their shifted copy (torch.cat) and the masked
    # positions' gather, [batch x (seq - 1), vocab] each in bf16, then its float32 upcast where the model's
    # loss upcasts the logits themselves; the 4D bool mask [batch, 1, seq, seq] is 64 KiB.
    logits_bf16 = BATCH * SEQ * VOCAB * 2  # 4 MiB
    extra = _peak("diffusion", "bf16") - _peak("full", "bf16")
    assert logits_bf16 <= extra <= 4 * logits_bf16


def test_the_diffusion_loss_is_a_causal_lms_with_sdpa_or_eager():
    assert check_loss("diffusion", "causal-lm") == "diffusion"
    with pytest.raises(InvalidInput, match="loss 'diffusion' is modelled for a causal-lm"):
        check_loss("diffusion", "image-text-to-text")
    check_attention("sdpa")
    check_attention(None)
    with pytest.raises(InvalidInput, match="with attn flash_attention_2: Axolotl's diffusion step passes"):
        check_attention("flash_attention_2")
