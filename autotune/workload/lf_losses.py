"""LLaMA-Factory's per-token weighted losses: DFT (``use_dft_loss``) and EAFT (``use_eaft_loss``).

LLaMA-Factory's CustomSeq2SeqTrainer (src/llamafactory/train/sft/trainer.py ``__init__``) sets the
Trainer's ``compute_loss_func`` to ``dft_loss_func`` or ``eaft_loss_func``
(src/llamafactory/train/trainer_utils.py). transformers' ``Trainer.compute_loss`` then pops the
labels from the inputs, so the model's forward computes no loss and returns its logits
[batch, seq, vocab] in the model's dtype, and the function computes the loss from them:

    logits.float()                        a float32 copy of the logits, [batch x seq, vocab]
    F.cross_entropy(reduction="none")     log_softmax (float32 [rows, vocab], saved for backward)
    per_token_loss[valid_mask]            the labelled rows, weighted by exp(-loss) (DFT) or by the
                                          entropy of the top 20 logits (EAFT: ``source[valid_mask]``,
                                          a float32 copy of the labelled rows' logits, under no_grad)

LLaMA-Factory is not a dependency of autotune, so its two functions are copied here, statement by
statement (``dft_loss_func``, ``_dft_cross_entropy``, ``eaft_loss_func``, ``_eaft_cross_entropy``),
and traced on the estimator's fake tensors like the model. Two statements cannot run on fake tensors
and are emulated: ``valid_mask.any()`` (data-dependent: the step's labels are the batch's, every row
labelled) is not asked, and indexing by the boolean mask takes ``torch.nonzero_static`` of the
labelled rows' count, the [rows, 1] int64 indices CUDA's boolean indexing makes with ``nonzero``,
then the same gather (as backends/estimate/vision.py does for a vision model's masks). The count is
the batch's (step.make_batch: every label 0, none ignored): every position but each row's last,
which the shift pads with IGNORE_INDEX.

``num_items_in_batch``: the Trainer passes the batch's label count; with it the loss is a sum over
that count, without it a mean: the same tensors either way, so it is left out (the mean).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

DFT, EAFT = "dft", "eaft"
LF_LOSSES = (DFT, EAFT)
IGNORE_INDEX = -100  # LLaMA-Factory's extras/constants.py IGNORE_INDEX, the functions' ignore_index
EAFT_TOP_K = 20  # _eaft_cross_entropy: torch.topk(source_detached, k=20, dim=-1)
EAFT_ALPHA = 1.0  # finetuning_args.py eaft_alpha's default (a scalar power: no memory of its own)
DESCRIPTIONS = {
    DFT: "LLaMA-Factory's DFT loss (use_dft_loss: trainer_utils.py dft_loss_func, copied and traced): "
         "the model's logits upcast to float32, a per-token cross-entropy weighted by each token's "
         "probability",
    EAFT: "LLaMA-Factory's EAFT loss (use_eaft_loss: trainer_utils.py eaft_loss_func, copied and "
          "traced): the model's logits upcast to float32, a per-token cross-entropy weighted by the "
          "entropy of the top-20 logits of a float32 copy of the labelled rows",
}


def lf_loss(model: Any, batch: dict[str, torch.Tensor], loss: str) -> torch.Tensor:
    """The step's loss as LLaMA-Factory's trainer computes it with ``compute_loss_func`` set:
    the model's forward without labels (Trainer.compute_loss pops them), then the loss function."""
    inputs = {name: value for name, value in batch.items() if name != "labels"}
    outputs = model(**inputs)
    if loss == DFT:
        return dft_loss_func(outputs, batch["labels"])
    if loss == EAFT:
        return eaft_loss_func(outputs, batch["labels"], alpha=EAFT_ALPHA)
    raise ValueError(f"not one of LLaMA-Factory's losses {LF_LOSSES}: {loss!r}")


def _shifted(outputs: Any, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """dft_loss_func's and eaft_loss_func's common start: float32 logits [rows, vocab], shifted labels."""
    import torch

    logits = outputs.get("logits")
    logits = logits.float()
    vocab_size = logits.size(-1)
    labels = torch.nn.functional.pad(labels, (0, 1), value=IGNORE_INDEX)
    shift_labels = labels[..., 1:].contiguous()
    logits = logits.view(-1, vocab_size)
    shift_labels = shift_labels.view(-1)
    shift_labels = shift_labels.to(logits.device)
    return logits, shift_labels


def dft_loss_func(outputs: Any, labels: torch.Tensor) -> torch.Tensor:
    """trainer_utils.py ``dft_loss_func`` and ``_dft_cross_entropy`` (num_items_in_batch None)."""
    import torch

    source, target = _shifted(outputs, labels)
    per_token_loss = torch.nn.functional.cross_entropy(source, target, ignore_index=IGNORE_INDEX,
                                                       reduction="none")
    valid = _valid_rows(target, labels)
    valid_losses = per_token_loss[valid]
    with torch.no_grad():
        target_probs = torch.exp(-valid_losses)
    weighted_losses = valid_losses * target_probs
    return weighted_losses.mean()


def eaft_loss_func(outputs: Any, labels: torch.Tensor, alpha: float = EAFT_ALPHA) -> torch.Tensor:
    """trainer_utils.py ``eaft_loss_func`` and ``_eaft_cross_entropy`` (num_items_in_batch None)."""
    import torch

    source, target = _shifted(outputs, labels)
    per_token_loss = torch.nn.functional.cross_entropy(source, target, ignore_index=IGNORE_INDEX,
                                                       reduction="none")
    valid = _valid_rows(target, labels)
    valid_losses = per_token_loss[valid]
    with torch.no_grad():
        source_detached = source[valid].detach()
        topk_val, _ = torch.topk(source_detached, k=EAFT_TOP_K, dim=-1)
        logsumexp_topk = torch.logsumexp(topk_val, dim=-1, keepdim=True)
        log_probs_topk = topk_val - logsumexp_topk
        probs_topk = torch.exp(log_probs_topk)
        entropy_approx = -(probs_topk * log_probs_topk).sum(dim=-1)
        entropy_term = entropy_approx / 3.0
        adaptive_weight = torch.pow(entropy_term, alpha)
    weighted_losses = valid_losses * adaptive_weight
    return weighted_losses.mean()


def _valid_rows(target: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """What ``x[target != ignore_index]`` indexes with: the mask, then ``nonzero`` of it ([count, 1]
    int64 on CUDA), here ``nonzero_static`` of the batch's count (module docstring)."""
    import torch

    valid_mask = target != IGNORE_INDEX
    rows, seq = labels.shape[0], labels.shape[-1]
    count = rows * (seq - 1)  # step.make_batch's labels: all but each row's shifted-off last position
    return tuple(torch.nonzero_static(valid_mask, size=count).unbind(1))
