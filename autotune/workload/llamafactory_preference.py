"""LLaMA-Factory's preference step: ``stage: dpo`` (pref_loss sigmoid, hinge, ipo; orpo, simpo) and
``stage: kto``, as its own trainers run it.

LLaMA-Factory subclasses TRL 0.24's DPOTrainer and KTOTrainer (hiyouga/LLaMA-Factory
src/llamafactory/train/dpo/trainer.py ``CustomDPOTrainer``, train/kto/trainer.py
``CustomKTOTrainer``) and overrides the forward and the log-probs, so its step differs from TRL's
(workload/preference.py) where memory is made:

- ``get_batch_logps`` (train/trainer_utils.py): the logits cast ``.to(torch.float32)``, then
  ``logits.log_softmax(-1)`` over every position at once and ``torch.gather``: the whole float32
  log-softmax is saved for the backward beside the float32 logits (TRL's ``selective_log_softmax``
  keeps a logsumexp per row), and under no_grad it is a transient of the logits' size.
- dpo (``CustomDPOTrainer.concatenated_forward``): ``PairwiseDataCollatorWithPadding`` (data/collator.py)
  concatenates the chosen rows then the rejected rows: 2 x batch rows of ``input_ids``,
  ``attention_mask``, ``labels`` (IGNORE_INDEX over the prompt). With a reference
  (``use_ref_model``: finetuning_args.py, stage dpo and pref_loss not orpo or simpo) the batch is
  cloned (``nested_detach(batch, clone=True)``) before each forward; the reference runs the same
  forward under no_grad (``compute_reference_log_probs``): the model with its adapter disabled under
  LoRA (``create_ref_model`` returns None), a frozen copy loaded again (``load_model(is_trainable=False)``:
  the checkpoint's dtype, not cast to float32) for a full fine-tune. The losses (sigmoid, hinge, ipo,
  orpo, simpo, bco, pref_ftx, label smoothing) are computed on [batch] vectors; the metrics are means
  of views (``logits/chosen``), no copies.
- kto (``CustomKTOTrainer.concatenated_forward``): ``KTODataCollatorWithPadding`` gives batch rows and
  a KL batch of as many rows (each prompt with another example's completion: ``kl_input_ids``,
  ``kl_attention_mask``, ``kl_labels``) and ``kto_tags``. Each forward clones the whole batch
  (``forward``: ``nested_detach(batch, clone=True)``); the policy's forward with grad, then its KL
  forward under no_grad; the chosen and rejected rows' logits are copied by boolean indexing
  (``target_logits[batch["kto_tags"]]``) and held to the end of ``get_batch_loss_metrics``: between
  them every row's logits once, whatever the split of the labels; then the reference (always one:
  kto/workflow.py ``create_ref_model``, adapter disabled or frozen copy) runs both forwards and its
  copies under no_grad. No batch-size limit (``Trainer.__init__`` only, not KTOTrainer's).

Every trainer disables dropout (``disable_dropout_in_model``) in the policy and the reference.
Stage rm (PairwiseTrainer over a value head) runs workload/value_head.py's step on the same batch.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from autotune.workload.trainers import KTO, KTO_KL_BATCH, KTO_POLICY, ORPO, SIMPO, Trainer

if TYPE_CHECKING:
    import torch

IGNORE_INDEX = -100  # src/llamafactory/extras/constants.py
# Reading this module's losses: the batch the collator hands the step, then the step.


def make_lf_batch(config: Any, trainer: Trainer, batch_size: int, seq_len: int, device: Any = None,
                  *, attn: str | None = None) -> dict[str, torch.Tensor]:
    """The batch of LLaMA-Factory's collator for ``trainer`` (module docstring): for dpo, orpo,
    simpo and reward (stage rm) 2 x batch_size rows (chosen, then rejected); for kto batch_size rows,
    the KL rows and ``kto_tags``. ``labels`` are the row's tokens but the one-token prompt (IGNORE_INDEX)."""
    import torch

    from autotune.workload.step import make_batch

    rows = batch_size if trainer.name == KTO else 2 * batch_size
    batch = make_batch(config, "causal-lm", rows, seq_len, device, attn=attn)
    batch["labels"][:, 0] = IGNORE_INDEX
    if trainer.name == KTO:
        for key in ("input_ids", "attention_mask", "labels"):
            batch[f"kl_{key}"] = batch[key].clone()
        batch["kto_tags"] = torch.ones(batch_size, dtype=torch.bool, device=device)
    return batch


def get_batch_logps(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """train/trainer_utils.py ``get_batch_logps`` without ``ld_alpha`` (the reader refuses it): the
    sum of each row's label log-probs, and each row's label count."""
    import torch

    labels = labels[:, 1:].clone()
    logits = logits[:, :-1, :]
    loss_mask = labels != IGNORE_INDEX
    labels[labels == IGNORE_INDEX] = 0  # dummy token
    per_token_logps = torch.gather(logits.log_softmax(-1), dim=2, index=labels.unsqueeze(2)).squeeze(2)
    valid_length = loss_mask.sum(-1)
    return (per_token_logps * loss_mask).sum(-1), valid_length


def _detached(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """trainer_utils.py ``nested_detach(batch, clone=True)``."""
    return {key: value.detach().clone() for key, value in batch.items()}


def _logits(model: Any, autocasts: bool, **inputs: torch.Tensor) -> torch.Tensor:
    """``model(**inputs, return_dict=True, use_cache=False).logits.to(torch.float32)``: under mixed
    precision accelerate already hands float32 logits (``convert_outputs_to_fp32``), else a copy."""
    import torch

    logits = model(**inputs, return_dict=True, use_cache=False).logits
    if autocasts and logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()  # accelerate's convert_outputs_to_fp32
    return logits.to(torch.float32)


@contextlib.contextmanager
def _reference(model: Any, reference: Any) -> Iterator[Any]:
    """``compute_reference_log_probs``' model: the frozen copy, or the model with its adapter
    disabled (``unwrap_model(model).disable_adapter()``)."""
    if reference is not None:
        yield reference
    else:
        with model.disable_adapter():
            yield model


def _dpo_forward(model: Any, trainer: Trainer, autocasts: bool,
                 batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``CustomDPOTrainer.concatenated_forward``."""
    if trainer.reference(peft=False) is not None:  # use_ref_model
        batch = _detached(batch)
    labels = batch.pop("labels")
    all_logits = _logits(model, autocasts, **batch)
    all_logps, valid_length = get_batch_logps(all_logits, labels)
    averaged = trainer.name in (ORPO, SIMPO)  # and ipo: ``all_logps / valid_length``, a [rows] vector
    if averaged:
        all_logps = all_logps / valid_length
    batch_size = batch["input_ids"].size(0) // 2
    chosen_logps, rejected_logps = all_logps.split(batch_size, dim=0)
    chosen_logits, rejected_logits = all_logits.split(batch_size, dim=0)
    chosen_length, _ = valid_length.split(batch_size, dim=0)
    chosen_logps_avg = chosen_logps if averaged else chosen_logps / chosen_length
    return {"chosen_logps": chosen_logps, "rejected_logps": rejected_logps, "chosen_logits": chosen_logits,
            "rejected_logits": rejected_logits, "chosen_logps_avg": chosen_logps_avg}


def lf_dpo_loss(model: Any, reference: Any, trainer: Trainer, autocasts: bool,
                **batch: torch.Tensor) -> torch.Tensor:
    """``CustomDPOTrainer.get_batch_loss_metrics``: the policy's forward, the reference's under
    no_grad, the loss on [batch] vectors (sigmoid's shape; beta, label smoothing, bco and pref_ftx
    scale and add [batch] vectors), the metrics' means."""
    import torch
    import torch.nn.functional as F

    output = _dpo_forward(model, trainer, autocasts, batch)
    chosen, rejected = output["chosen_logps"], output["rejected_logps"]
    if trainer.reference(peft=False) is not None:
        with torch.no_grad(), warnings.catch_warnings(), _reference(model, reference) as ref_model:
            warnings.filterwarnings("ignore", message="None of the inputs have requires_grad")
            ref_output = _dpo_forward(ref_model, trainer, autocasts, batch)
            ref_chosen, ref_rejected = ref_output["chosen_logps"], ref_output["rejected_logps"]
            del ref_output
        losses = -F.logsigmoid((chosen - ref_chosen) - (rejected - ref_rejected))
    else:  # odds_ratio_loss / simpo_loss
        log_odds = (chosen - rejected) - (torch.log1p(-torch.exp(chosen)) - torch.log1p(-torch.exp(rejected)))
        losses = -F.logsigmoid(log_odds)
    losses = losses + -output["chosen_logps_avg"]  # pref_ftx's sft_loss, a [batch] vector
    output["chosen_logits"].detach().mean()  # metrics logits/chosen, logits/rejected: means of views
    output["rejected_logits"].detach().mean()
    return losses.mean()


def _kto_forward(model: Any, autocasts: bool, batch: dict[str, torch.Tensor],
                 prefix: str = "") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``CustomKTOTrainer.forward``."""
    batch = _detached(batch)
    logits = _logits(model, autocasts, input_ids=batch[f"{prefix}input_ids"],
                     attention_mask=batch[f"{prefix}attention_mask"])
    logps, valid_length = get_batch_logps(logits, batch[f"{prefix}labels"])
    return logits, logps, logps / valid_length


def _tagged(values: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """``values[kto_tags]`` as CUDA runs it: the mask's ``nonzero()`` indices ([count, 1] int64), then
    the selected rows copied. ``rows``: the count of true tags, which a fake tensor has no values to
    give (every row chosen: the copies hold every row once whatever the split)."""
    import torch

    indices = torch.zeros((rows.shape[0], 1), dtype=torch.long, device=values.device)
    return values[indices[:, 0]]


def _kto_concatenated(model: Any, autocasts: bool, batch: dict[str, torch.Tensor],
                      phase: Callable[[str], None]) -> tuple[torch.Tensor, ...]:
    """``CustomKTOTrainer.concatenated_forward``: the target forward, the KL forward under no_grad,
    the chosen and rejected rows (every tag true: none rejected)."""
    import torch

    phase(KTO_POLICY)
    target_logits, target_logps, target_logps_avg = _kto_forward(model, autocasts, batch)
    phase(KTO_KL_BATCH)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="None of the inputs have requires_grad")
        _, kl_logps, _ = _kto_forward(model, autocasts, batch, prefix="kl_")
    tags = batch["kto_tags"]
    none = tags[:0]
    chosen_logits = _tagged(target_logits, tags)
    chosen_logps = _tagged(target_logps, tags)
    rejected_logits = _tagged(target_logits, none)
    rejected_logps = _tagged(target_logps, none)
    chosen_logps_avg = _tagged(target_logps_avg, tags)
    return chosen_logps, rejected_logps, chosen_logits, rejected_logits, kl_logps, chosen_logps_avg


def _no_phase(name: str) -> None:
    pass


def lf_kto_loss(model: Any, reference: Any, trainer: Trainer, autocasts: bool, phase: Callable[[str], None],
                **batch: torch.Tensor) -> torch.Tensor:
    """``CustomKTOTrainer.get_batch_loss_metrics``: the policy's forwards, the reference's under
    no_grad, TRL 0.24's ``kto_loss`` on [batch] vectors, the metrics' sums."""
    import torch
    import torch.nn.functional as F

    (chosen_logps, rejected_logps, chosen_logits, rejected_logits, kl_logps,
     chosen_logps_avg) = _kto_concatenated(model, autocasts, batch, phase)
    with torch.no_grad(), warnings.catch_warnings(), _reference(model, reference) as ref_model:
        warnings.filterwarnings("ignore", message="None of the inputs have requires_grad")
        ref_chosen, ref_rejected, _, _, ref_kl, _ = _kto_concatenated(ref_model, autocasts, batch,
                                                                       _no_phase)
    kl = (kl_logps - ref_kl).mean().clamp(min=0).detach()
    chosen_losses = 1 - F.sigmoid(chosen_logps - ref_chosen - kl)
    rejected_losses = 1 - F.sigmoid(kl - (rejected_logps - ref_rejected))
    losses = torch.cat((chosen_losses, rejected_losses), 0).nanmean()
    losses = losses + (-chosen_logps_avg).nanmean()  # pref_ftx's sft_loss
    chosen_logits.nansum()  # metrics logits/chosen_sum, logits/rejected_sum
    rejected_logits.nansum()
    return losses


def lf_preference_forward(model: Any, reference: Any, trainer: Trainer, *, autocasts: bool,
                          phase: Callable[[str], None] = _no_phase) -> Callable[..., torch.Tensor]:
    """The step's ``forward(**batch)``: LLaMA-Factory's loss of its collator's batch."""
    if trainer.value_head:  # PairwiseTrainer (stage rm): ``model`` is the value-head model
        from autotune.workload.value_head import pairwise_loss

        return functools.partial(pairwise_loss, model, autocasts)
    if trainer.name == KTO:
        return functools.partial(lf_kto_loss, model, reference, trainer, autocasts, phase)
    return functools.partial(lf_dpo_loss, model, reference, trainer, autocasts)
