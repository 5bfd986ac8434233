"""Axolotl's EAFT loss (workload/axolotl_eaft.py): the copied function against Axolotl's boolean-mask
indexing on real tensors, its step on the estimator, and the keys that set it
(examples/eaft/eaft-example.yml)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from configread import read

from autotune.backends.estimate.backend import EstimateBackend
from autotune.errors import UnmodelledSetting
from autotune.gpus import custom_gpu
from autotune.workload import Workload
from autotune.workload.axolotl_eaft import axolotl_eaft_loss
from autotune.workload.models import ModelSpec, tiny_config
from autotune.workload.modes import parse_mode
from autotune.workload.step import build_model, make_batch

GIB = 1024**3
VOCAB, HIDDEN, BATCH, SEQ = 4096, 128, 4, 128


def _axolotl_reference(logits, labels, alpha=1.0, k=20):
    """monkeypatch/loss/eaft.py eaft_loss as Axolotl 067b021c writes it (boolean-mask indexing)."""
    shift_logits = logits[..., :-1, :].contiguous()
    shift_labels = labels[..., 1:].contiguous()
    vocab_size = shift_logits.size(-1)
    shift_logits_view = shift_logits.view(-1, vocab_size)
    shift_labels_view = shift_labels.view(-1)
    mask = shift_labels_view != -100
    with torch.no_grad():
        top_k_logits, _ = torch.topk(shift_logits_view[mask].float(), k=min(k, vocab_size), dim=-1)
        top_k_probs = F.softmax(top_k_logits, dim=-1)
        entropy = -(top_k_probs * torch.log(top_k_probs + 1e-10)).sum(dim=-1)
        weights = torch.pow(entropy, alpha)
    per_token_loss = torch.nn.CrossEntropyLoss(reduction="none")(shift_logits_view[mask],
                                                                 shift_labels_view[mask])
    return (per_token_loss * weights).mean()


def test_the_copied_loss_and_gradients_are_axolotls():
    torch.manual_seed(0)
    spec = ModelSpec("tiny-llama", "local", tiny_config("llama"), 128)
    model, _ = build_model(spec, "causal-lm", "eager")
    model.eval()
    batch = make_batch(model.config, "causal-lm", 3, 16)  # every label set: the estimator's batch
    batch["input_ids"] = torch.randint(0, model.config.vocab_size, (3, 16))
    batch["labels"] = torch.randint(0, model.config.vocab_size, (3, 16))
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    expected = _axolotl_reference(model(**inputs).logits, batch["labels"])
    expected.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    got = axolotl_eaft_loss(model, batch)
    got.backward()
    assert torch.allclose(got, expected, rtol=1e-5, atol=1e-7)
    for name, p in model.named_parameters():
        assert torch.allclose(p.grad, grads[name], rtol=1e-4, atol=1e-7), name


def _peak(loss: str) -> int:
    config = tiny_config("gpt2", vocab_size=VOCAB, n_embd=HIDDEN, n_layer=1, n_inner=2 * HIDDEN,
                         bos_token_id=0, eos_token_id=0)
    workload = Workload(ModelSpec("tiny-gpt2-vocab", "local", config, 128), "causal-lm", None, loss=loss)
    backend = EstimateBackend(custom_gpu(GIB))
    with backend.cell(workload, parse_mode("amp"), SEQ, GIB) as cell:
        return int(cell.fits(BATCH).details["peak_allocated_bytes"])


def test_axolotls_eaft_holds_a_copy_of_the_logits_and_their_gathers_beyond_the_models_loss():
    # the contiguous shifted copy and the labelled rows gathered ([rows, vocab], the logits' dtype, each
    # about the logits' size) beside the model's own loss's float32 log-softmax
    logits = BATCH * SEQ * VOCAB * 4  # float32 under amp: 8 MiB
    extra = _peak("axolotl_eaft") - _peak("full")
    assert 0 < extra <= 3 * logits


EAFT = {"base_model": "google/gemma-3-1b-pt", "sequence_len": 1024, "micro_batch_size": 1, "bf16": True,
        "attn_implementation": "flash_attention_2", "use_eaft": True, "eaft_alpha": 1.0, "eaft_k": 20}


def test_use_eaft_is_axolotls_eaft_loss(tmp_path):
    plan = read(tmp_path, EAFT, "axolotl.yml")
    assert plan.loss == "axolotl_eaft" and plan.ignored == ()
    assert any(note.startswith("use_eaft: true: Axolotl's EAFT loss") for note in plan.notes)
    assert read(tmp_path, {**EAFT, "use_eaft": False}, "b.yml").loss == "full"


@pytest.mark.parametrize(("extra", "key"), [
    ({"eaft_k": 64}, "eaft_k"),
    ({"plugins": ["axolotl.integrations.cut_cross_entropy.CutCrossEntropyPlugin"]}, "use_eaft"),
])
def test_what_eaft_is_not_modelled_with_is_refused_by_name(tmp_path, extra, key):
    with pytest.raises(UnmodelledSetting, match=rf"^{key}: "):
        read(tmp_path, {**EAFT, **extra}, "axolotl.yml")
