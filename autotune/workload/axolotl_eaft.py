"""Axolotl's EAFT loss (``use_eaft: true``): the loss ``axolotl_eaft``.

Axolotl's causal trainer builder (src/axolotl/core/builders/causal.py, Axolotl 067b021c) sets the
Trainer's ``compute_loss_func`` to ``eaft_loss`` (src/axolotl/monkeypatch/loss/eaft.py) with alpha
``eaft_alpha`` (default 1.0) and k ``eaft_k`` (default 20). transformers' ``Trainer.compute_loss`` then
pops the labels, the model's forward returns its logits [batch, seq, vocab] in the autocast dtype, and
the function computes the loss from them, unlike LLaMA-Factory's EAFT (lf_losses.py):

    logits[..., :-1, :].contiguous()         a copy of the logits but the last position's
    shift_logits_view[mask].float()          under no_grad: the labelled rows' logits gathered, upcast,
                                             their top k, softmax and entropy: the weights
    shift_logits_view[mask]                  gathered again, [rows, vocab] in the logits' dtype
    CrossEntropyLoss(reduction="none")       its log-softmax (float32 under autocast) saved for backward

The function is copied here statement by statement and traced on the estimator's fake tensors. As in
lf_losses.py, indexing by the boolean mask takes ``torch.nonzero_static`` of the labelled rows' count
(every position of step.make_batch's batch but each row's last, which the shift drops).
``num_items_in_batch`` turns the mean into a sum over that count: the same tensors either way.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from autotune.workload.lf_losses import _valid_rows

if TYPE_CHECKING:
    import torch

AXOLOTL_EAFT = "axolotl_eaft"
EAFT_ALPHA = 1.0  # causal.py: eaft_alpha if not None else 1.0 (a scalar power: no memory of its own)
EAFT_K = 20  # causal.py: eaft_k if not None else 20
DESCRIPTION = ("Axolotl's EAFT loss (use_eaft: monkeypatch/loss/eaft.py eaft_loss, copied and traced): a "
               "contiguous copy of the shifted logits, the labelled rows gathered twice (upcast under "
               "no_grad for the top-k entropy weights, then for a per-token cross-entropy)")


def axolotl_eaft_loss(model: Any, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The step's loss as Axolotl's trainer computes it with ``use_eaft``: the model's forward without
    labels (Trainer.compute_loss pops them for a compute_loss_func), then ``eaft_loss``."""
    inputs = {name: value for name, value in batch.items() if name != "labels"}
    return eaft_loss(model(**inputs), batch["labels"])


def eaft_loss(outputs: Any, labels: torch.Tensor, alpha: float = EAFT_ALPHA, k: int = EAFT_K) -> torch.Tensor:
    """monkeypatch/loss/eaft.py ``eaft_loss`` (num_items_in_batch None: the mean)."""
    import torch
    import torch.nn.functional as F

    logits = outputs.logits
    shift_logits = logits[..., :-1, :].contiguous()
    shift_labels = labels[..., 1:].contiguous()
    vocab_size = shift_logits.size(-1)
    shift_logits_view = shift_logits.view(-1, vocab_size)
    shift_labels_view = shift_labels.view(-1)
    mask = _valid_rows(shift_labels_view, labels)  # shift_labels_view != -100's rows (module docstring)
    with torch.no_grad():
        top_k_logits, _ = torch.topk(shift_logits_view[mask].float(), k=min(k, vocab_size), dim=-1)
        top_k_probs = F.softmax(top_k_logits, dim=-1)
        entropy = -(top_k_probs * torch.log(top_k_probs + 1e-10)).sum(dim=-1)
        weights = torch.pow(entropy, alpha)
    loss_fct = torch.nn.CrossEntropyLoss(reduction="none")
    per_token_loss = loss_fct(shift_logits_view[mask], shift_labels_view[mask])
    weighted_loss = per_token_loss * weights
    return weighted_loss.mean()
