"""Preference training: the step of TRL's DPO, ORPO, SimPO, KTO and reward trainers, as TRL runs it.

A supervised step (``sft``) is one forward and backward over ``batch`` rows with the model's own
loss (step.run_steps). A preference trainer's batch is ``batch`` pairs (a prompt with a chosen
and a rejected completion: TRL's ``per_device_train_batch_size`` counts pairs), run as ``2 x
batch`` rows in one forward, chosen rows first, and its loss is computed outside the model from
the logits. Read from TRL's source (huggingface/trl, main of 2026: trl/trainer/dpo_trainer.py,
reward_trainer.py, kto_trainer.py, utils.py; trl/experimental/orpo/orpo_trainer.py,
cpo/cpo_trainer.py):

- ``dpo``: ``DPOTrainer._compute_loss``. The policy's forward on the 2 x batch rows
  (``DataCollatorForPreference`` pads chosen and rejected completions to one length and
  concatenates them after the prompts), per-token log-probs of the completion by
  ``selective_log_softmax`` of the shifted logits, then the reference's forward on the same rows
  under ``torch.no_grad()``: a frozen copy of the model for a full fine-tune (``__init__``:
  ``create_model_from_path``, in the weights' dtype), the same model with its adapter disabled
  under PEFT (``ref_model`` None, ``use_adapter(model, None)`` = ``model.disable_adapter()``), none
  with ``precompute_ref_log_probs`` (the batch carries them). Then the sigmoid loss on [batch]
  vectors, and the logged metrics, of which three allocate logits-sized tensors:
  ``entropy_from_logits`` (a contiguous copy of the shifted logits), and the chosen and rejected
  logits selected by their completion masks (boolean indexing copies the rows).
- ``orpo``: ``ORPOTrainer.concatenated_forward``: the same 2 x batch rows, no reference, the NLL of
  the chosen rows over ``logits[..., :-1, :].contiguous()`` (a copy) and ``get_batch_logps``.
- ``simpo``: ``CPOTrainer`` with ``loss_type="simpo"`` (TRL's SimPO): ORPO's forward with the
  NLL on the chosen rows weighted by ``cpo_alpha`` (default 1.0; 0 leaves it out).
- ``kto``: ``KTOTrainer._compute_loss`` (kto_loss below). Its batch is ``batch`` *examples*, not
  pairs: a row is a prompt and one completion labelled desirable or undesirable
  (``DataCollatorForUnpairedPreference``: ``input_ids``, ``attention_mask``, ``completion_mask``,
  ``label``). With the KTO loss (``calculate_KL``: every ``loss_type`` but ``apo_zero_unpaired``)
  the collator adds the KL batch: the same prompts with the completions rotated by one row within
  the batch (``_prepare_dataset`` ``add_kl_completion_ids``), ``batch`` more rows padded alike
  (``KL_input_ids``, ``KL_attention_mask``, ``KL_completion_mask``). The step: the KL rows through
  the policy under ``torch.no_grad()`` (``_compute_kl_logps``), the policy's forward with grad,
  then under no_grad the reference's forward over the KL rows and over the batch (a frozen copy for
  a full fine-tune, ``create_model_from_path`` in ``__init__``; the adapter disabled under PEFT,
  ``use_adapter(model, None)``; neither with ``precompute_ref_log_probs``: the batch carries
  ``ref_logps`` and ``ref_KL_logps``), each row's log-probs by ``selective_log_softmax``, the
  losses on [batch] vectors, and the metrics: the entropy and the chosen and rejected rows' logits
  copied by ``index_select``, their completion positions selected by boolean indexing. The
  reference's logits (``ref_outputs``) are held to the end of ``_compute_loss``. The labels decide
  the split: a paired dataset unpaired by TRL (data_utils.py ``unpair_preference_dataset``: each
  mapped batch of 1000 pairs gives its chosen rows, then its rejected rows) under KTOConfig's
  sequential sampler gives batches of one label, the most the metrics copy at once: modelled so
  (every row desirable).
- ``reward``: ``RewardTrainer.compute_loss``: ``AutoModelForSequenceClassification`` with
  ``num_labels=1`` on chosen then rejected rows (``DataCollatorForPreference`` of
  reward_trainer.py), ``-logsigmoid(chosen - rejected).mean()``.

Every trainer disables dropout (``disable_dropout=True``: ``disable_dropout_in_model`` sets each
``nn.Dropout``'s ``p`` to 0) in the policy and the reference.

Under mixed precision the Trainer's accelerate wraps each prepared model's forward in autocast and
converts its 16-bit outputs to float32 (accelerate 1.15 accelerator.py ``prepare_model``:
``convert_outputs_to_fp32``), so the logits the loss sees are a float32 copy and
``selective_log_softmax`` takes its float32 path (a per-row ``logsumexp``).

Metrics read back with ``.item()`` and gathered across ranks are scalars: left out (a fake tensor
has no value to read). Boolean indexing (``x[mask]``) has a shape that depends on the mask's
values, which a fake tensor does not have: it is run as the same indexing by the mask's
``nonzero()`` indices, whose count the batch fixes (``completion_tokens``).
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from autotune.workload import Workload
from autotune.workload.trainers import (
    DPO,
    GENERATIVE,
    KTO,
    KTO_KL_BATCH,
    KTO_POLICY,
    ORPO,
    REWARD,
    SIMPO,
    Trainer,
)

ENTROPY_CHUNK_ROWS = 128  # trl/trainer/utils.py entropy_from_logits(chunk_size=128)

if TYPE_CHECKING:
    import torch

def completion_tokens(seq_len: int, attn: str | None) -> int:
    """The completion tokens of one row of the batch, shifted as the loss reads them: every
    position after a one-token prompt (the most a row of ``seq_len`` holds), less the padded last
    position the batch keeps unless flash attention packs the row (step.make_batch)."""
    from autotune.workload.step import FLASH_ATTENTIONS

    padded = 1 if seq_len > 1 and attn not in FLASH_ATTENTIONS else 0
    return max(seq_len - 1 - padded, 0)


def make_preference_batch(config: Any, trainer: Trainer, batch_size: int, seq_len: int, device: Any = None,
                          *, attn: str | None = None) -> dict[str, torch.Tensor]:
    """The batch a preference trainer's collator hands its loss: ``batch_size`` pairs as
    2 x batch_size rows (chosen, then rejected) of ``seq_len`` tokens, the prompt's then the
    completion's (DataCollatorForPreference: ``input_ids``, ``attention_mask`` and, but for the
    reward model, ``completion_mask``); DPO's precomputed reference log-probs (``ref_chosen_logps``,
    ``ref_rejected_logps``: float32 [batch]) when asked for."""
    import torch

    from autotune.workload.step import make_batch

    rows = trainer.rows_per_sample * batch_size
    batch = make_batch(config, "causal-lm", rows, seq_len, device, attn=attn)
    del batch["labels"]
    if trainer.name != REWARD:
        completion = batch["attention_mask"].clone()
        completion[:, 0] = 0  # the prompt: one token, the most completion a row holds
        batch["completion_mask"] = completion
    if trainer.reference(peft=False) == "precomputed":
        for key in ("ref_chosen_logps", "ref_rejected_logps"):
            batch[key] = torch.zeros(batch_size, dtype=torch.float32, device=device)
    return batch


def make_kto_batch(config: Any, trainer: Trainer, batch_size: int, seq_len: int, device: Any = None,
                   *, attn: str | None = None) -> dict[str, torch.Tensor]:
    """The batch DataCollatorForUnpairedPreference hands KTOTrainer (module docstring): ``batch_size``
    rows of prompt + completion, every ``label`` True; the KL rows beside them with the KL loss; the
    precomputed reference log-probs (float32 [batch]: ``torch.tensor`` of Python floats) when asked."""
    import torch

    from autotune.workload.step import make_batch

    batch = make_batch(config, "causal-lm", batch_size, seq_len, device, attn=attn)
    del batch["labels"]
    completion = batch["attention_mask"].clone()
    completion[:, 0] = 0  # the prompt: one token, the most completion a row holds
    batch["completion_mask"] = completion
    if trainer.kl_batch:  # a neighbour's completion after each prompt: rows of the same length
        for key in ("input_ids", "attention_mask", "completion_mask"):
            batch[f"KL_{key}"] = batch[key].clone()
    if trainer.precompute_ref_log_probs:
        batch["ref_logps"] = torch.zeros(batch_size, dtype=torch.float32, device=device)
        if trainer.kl_batch:
            batch["ref_KL_logps"] = torch.zeros(batch_size, dtype=torch.float32, device=device)
    batch["label"] = torch.ones(batch_size, dtype=torch.bool, device=device)
    return batch


def disable_dropout(model: Any) -> None:
    """trl/trainer/utils.py ``disable_dropout_in_model``: every ``nn.Dropout``'s p set to 0."""
    from torch import nn

    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0


def frozen_copy(build: Callable[[], Any]) -> Any:
    """A full fine-tune's DPO reference: the model built again (``build``: its weights in the
    weights' dtype, as DPOTrainer loads ``ref_model`` with the policy's ``model_init_kwargs``),
    frozen, dropout disabled. Accelerate prepares it with ``evaluation_mode=True`` and TRL runs it
    under no_grad only: it has no gradients nor optimizer state."""
    reference = build()
    reference.requires_grad_(False)
    disable_dropout(reference)
    return reference


def selective_log_softmax(logits: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """trl/trainer/utils.py ``selective_log_softmax``: log_softmax then gather, without the
    log-softmax of every row at once (float32: a ``logsumexp`` per row; 16-bit: a ``log_softmax``
    per row)."""
    import torch
    import torch.nn.functional as F

    index = index.unsqueeze(-1)
    if logits.dtype in (torch.float32, torch.float64):
        selected = torch.gather(logits, dim=-1, index=index)
        logsumexp_values = torch.stack([torch.logsumexp(row, dim=-1) for row in logits])
        per_token = selected - logsumexp_values.unsqueeze(-1)
    else:
        rows = [F.log_softmax(row_logits, dim=-1).gather(dim=-1, index=row_labels)
                for row_logits, row_labels in zip(logits, index, strict=True)]
        per_token = torch.stack(rows)
    return per_token.squeeze(-1)


def entropy_from_logits(logits: torch.Tensor, chunk_size: int = ENTROPY_CHUNK_ROWS) -> torch.Tensor:
    """trl/trainer/utils.py ``entropy_from_logits``: the logits flattened (a copy where they are a
    view with a stride, as the shifted logits are), then a log-softmax per chunk of rows."""
    import torch
    import torch.nn.functional as F

    shape = logits.shape[:-1]
    flat = logits.reshape(-1, logits.shape[-1])
    entropies = []
    for chunk in flat.split(chunk_size, dim=0):
        logps = F.log_softmax(chunk, dim=-1)
        entropies.append(-(torch.exp(logps) * logps).sum(-1))
    return torch.cat(entropies).reshape(shape)


@dataclass(frozen=True)
class LogProbs:
    """The row loops of TRL's log-prob helpers, as a backend runs them: TRL's own (``TRL_LOG_PROBS``,
    the cuda backend), or the estimator's emulation of their allocations, whose trace does not
    grow with the batch (backends/estimate/preference.py)."""

    selective_log_softmax: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    entropy_from_logits: Callable[[torch.Tensor], torch.Tensor]


TRL_LOG_PROBS = LogProbs(selective_log_softmax, entropy_from_logits)


def masked_rows(values: torch.Tensor, count: int) -> torch.Tensor:
    """``values[mask]`` for a [rows, seq] mask with ``count`` true entries, as CUDA allocates it:
    the mask's ``nonzero()`` indices [count, 2] (int64), then the selected rows [count, ...]."""
    import torch

    indices = torch.zeros((count, 2), dtype=torch.long, device=values.device)
    return values[indices[:, 0], indices[:, 1]]


def _upcast(logits: torch.Tensor, autocasts: bool) -> torch.Tensor:
    """accelerate's ``convert_outputs_to_fp32`` of a prepared model's 16-bit output under mixed
    precision; the logits as they are without it."""
    import torch

    return logits.float() if autocasts and logits.dtype in (torch.float16, torch.bfloat16) else logits


@contextlib.contextmanager
def _reference_forward(model: Any, reference: Any) -> Iterator[Any]:
    """TRL's reference forward: under no_grad, with gradient checkpointing off
    (``disable_gradient_checkpointing``: under no_grad it saves nothing either way), through the
    reference model, or through ``model`` with its adapter disabled (``use_adapter(model, None)``)."""
    import torch

    with torch.no_grad(), warnings.catch_warnings():
        # reentrant checkpointing warns of inputs without grad, which TRL turns checkpointing off for
        warnings.filterwarnings("ignore", message="None of the inputs have requires_grad")
        if reference is not None:
            yield reference
        else:
            with model.disable_adapter():
                yield model


def dpo_loss(model: Any, reference: Any, trainer: Trainer, autocasts: bool, count: int, log_probs: LogProbs,
             **batch: torch.Tensor) -> torch.Tensor:
    """DPOTrainer._compute_loss (module docstring): ``count`` completion tokens per row."""
    import torch.nn.functional as F

    input_ids, completion_mask = batch["input_ids"], batch["completion_mask"]
    model_kwargs = {"input_ids": input_ids, "attention_mask": batch["attention_mask"], "use_cache": False}
    logits = _upcast(model(**model_kwargs).logits, autocasts)
    shift_logits = logits[..., :-1, :]
    shift_labels = input_ids[..., 1:]
    shift_completion_mask = completion_mask[..., 1:]
    per_token_logps = log_probs.selective_log_softmax(shift_logits, shift_labels)
    per_token_logps.masked_fill_(shift_completion_mask == 0, 0.0)  # TRL: per_token_logps[mask == 0] = 0.0
    chosen_logps, rejected_logps = per_token_logps.sum(dim=1).chunk(2, dim=0)
    del per_token_logps
    if trainer.precompute_ref_log_probs:
        ref_chosen_logps, ref_rejected_logps = batch["ref_chosen_logps"], batch["ref_rejected_logps"]
    else:
        with _reference_forward(model, reference) as ref_model:
            ref_logits = _upcast(ref_model(**model_kwargs).logits, autocasts)
            ref_per_token_logps = log_probs.selective_log_softmax(ref_logits[..., :-1, :], shift_labels)
            del ref_logits
            ref_per_token_logps.masked_fill_(shift_completion_mask == 0, 0.0)
            ref_chosen_logps, ref_rejected_logps = ref_per_token_logps.sum(dim=1).chunk(2, dim=0)
            del ref_per_token_logps
    delta = (chosen_logps - ref_chosen_logps) - (rejected_logps - ref_rejected_logps)
    loss = (-F.logsigmoid(delta)).mean()  # loss_type sigmoid (beta scales a [batch] vector)
    _dpo_metrics(shift_logits, shift_labels, shift_completion_mask, count, log_probs)
    return loss


def _dpo_metrics(shift_logits: torch.Tensor, shift_labels: torch.Tensor, mask: torch.Tensor,
                 count: int, log_probs: LogProbs) -> None:
    """The logged metrics of DPOTrainer._compute_loss that allocate more than a [batch] vector:
    the entropy, the mean chosen and rejected logits over their completion tokens, the chosen
    rows' argmax (token accuracy)."""
    detached = shift_logits.detach()
    entropy = log_probs.entropy_from_logits(detached)
    (entropy * mask).sum()
    del entropy
    chosen_logits, rejected_logits = detached.chunk(2, dim=0)
    rows = mask.shape[0] // 2
    masked_rows(chosen_logits, rows * count).mean(-1).sum()
    masked_rows(rejected_logits, rows * count).mean(-1).sum()
    predictions = chosen_logits.argmax(dim=-1)
    (predictions == shift_labels[:rows]) & mask[:rows].bool()


def odds_ratio_loss(model: Any, trainer: Trainer, autocasts: bool, log_probs: LogProbs,
                    **batch: torch.Tensor) -> torch.Tensor:
    """ORPOTrainer.concatenated_forward and get_batch_loss_metrics (and CPOTrainer's, loss_type
    simpo): the chosen rows' NLL over a contiguous copy of their shifted logits, the average
    per-token log-probs of every row (get_batch_logps), a loss on [batch] vectors."""
    import torch
    import torch.nn.functional as F

    input_ids, attention_mask = batch["input_ids"], batch["attention_mask"]
    logits = _upcast(model(input_ids, attention_mask=attention_mask, use_cache=False).logits, autocasts)
    rows = input_ids.shape[0] // 2
    # concatenated_labels: the completion's tokens, -100 over the prompt and the padding
    concatenated_labels = torch.where(batch["completion_mask"] == 1, input_ids, -100)
    loss = logits.new_zeros(())
    if trainer.name == ORPO or trainer.chosen_nll:
        labels = torch.where(attention_mask == 1, input_ids.clone(), -100)
        chosen = logits[:rows, :-1, :].contiguous()
        nll = F.cross_entropy(chosen.view(-1, chosen.shape[-1]), labels[:rows, 1:].contiguous().view(-1))
        del chosen
        loss = loss + nll
    labels = concatenated_labels[:, 1:].clone()
    loss_mask = labels != -100
    labels = torch.where(labels == -100, 0, labels)
    per_token_logps = log_probs.selective_log_softmax(logits[:, :-1, :], labels)
    logps = (per_token_logps * loss_mask).sum(-1) / loss_mask.sum(-1)
    del per_token_logps
    chosen_logps, rejected_logps = logps[:rows], logps[rows:]
    # odds_ratio_loss (ORPO) / simpo's sigmoid of the margin: [batch] vectors
    log_odds = (chosen_logps - rejected_logps) - (
        torch.log1p(-torch.exp(chosen_logps)) - torch.log1p(-torch.exp(rejected_logps)))
    loss = loss - F.logsigmoid(log_odds).mean()
    logits[:rows, :-1, :].detach().mean()  # logits/chosen, logits/rejected: reductions of views
    logits[rows:, :-1, :].detach().mean()
    return loss


def _kl_logps(model: Any, log_probs: LogProbs, autocasts: bool,
              batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """KTOTrainer._compute_kl_logps: the KL rows' forward under no_grad, their completion log-probs
    (the logits held until it returns). Checkpointing is left on for the policy's (under no_grad it
    saves nothing either way)."""
    import torch

    with torch.no_grad(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="None of the inputs have requires_grad")
        kl_logits = _upcast(model(input_ids=batch["KL_input_ids"], attention_mask=batch["KL_attention_mask"],
                                  use_cache=False).logits, autocasts)
    per_token = log_probs.selective_log_softmax(kl_logits[:, :-1, :], batch["KL_input_ids"][:, 1:])
    per_token.masked_fill_(batch["KL_completion_mask"][:, 1:] == 0, 0.0)
    return per_token.sum(-1)




def kto_loss(model: Any, reference: Any, trainer: Trainer, autocasts: bool, count: int, log_probs: LogProbs,
             phase: Callable[[str], None], **batch: torch.Tensor) -> torch.Tensor:
    """KTOTrainer._compute_loss (module docstring): ``count`` completion tokens per row, every row
    desirable (``chosen_idx`` all rows, ``rejected_idx`` none: TRL's ``nonzero`` of the labels, whose
    count a fake tensor has no values to give). ``phase`` begins the policy's KL forward and its
    forward with grad: each model call is an autocast region of its own (accelerate wraps the prepared
    model's forward), so the weights the KL forward cast under no_grad are not the next one's."""
    import torch
    import torch.nn.functional as F

    input_ids, completion_mask = batch["input_ids"], batch["completion_mask"]
    rows = input_ids.shape[0]
    kl_logps = None
    if trainer.kl_batch:
        phase(KTO_KL_BATCH)
        kl_logps = _kl_logps(model, log_probs, autocasts, batch)
        phase(KTO_POLICY)
    model_kwargs = {"input_ids": input_ids, "attention_mask": batch["attention_mask"], "use_cache": False}
    shift_logits = _upcast(model(**model_kwargs).logits, autocasts)[:, :-1, :]
    shift_labels, shift_mask = input_ids[:, 1:], completion_mask[:, 1:]
    per_token_logps = log_probs.selective_log_softmax(shift_logits, shift_labels)
    per_token_logps.masked_fill_(shift_mask == 0, 0.0)  # TRL: per_token_logps[mask == 0] = 0.0
    completion_logps = per_token_logps.sum(-1)
    del per_token_logps
    chosen_idx = torch.arange(rows, device=input_ids.device)
    rejected_idx = torch.zeros(0, dtype=torch.long, device=input_ids.device)
    chosen_logps = completion_logps.index_select(0, chosen_idx)
    rejected_logps = completion_logps.index_select(0, rejected_idx)
    ref_logits = None
    if trainer.precompute_ref_log_probs:
        ref_completion_logps, ref_kl_logps = batch["ref_logps"], batch.get("ref_KL_logps")
    else:
        with _reference_forward(model, reference) as ref_model:
            ref_kl_logps = _kl_logps(ref_model, log_probs, autocasts, batch) if trainer.kl_batch else None
            ref_logits = _upcast(ref_model(**model_kwargs).logits, autocasts)  # ref_outputs: held to the end
        ref_per_token = log_probs.selective_log_softmax(ref_logits[:, :-1, :], shift_labels)
        ref_per_token.masked_fill_(shift_mask == 0, 0.0)
        ref_completion_logps = ref_per_token.sum(-1)
        del ref_per_token
    ref_chosen = ref_completion_logps.index_select(0, chosen_idx)
    ref_rejected = ref_completion_logps.index_select(0, rejected_idx)
    if kl_logps is not None and ref_kl_logps is not None:
        kl = (kl_logps - ref_kl_logps).mean().detach().clamp(min=0)
    else:
        kl = torch.zeros(1, device=input_ids.device)
    chosen_losses = 1 - F.sigmoid(chosen_logps - ref_chosen - kl)  # beta scales [batch] vectors
    rejected_losses = 1 - F.sigmoid(kl - (rejected_logps - ref_rejected))
    losses = torch.cat((chosen_losses, rejected_losses), 0)
    _kto_metrics(shift_logits, shift_mask, chosen_idx, rejected_idx, count, log_probs)
    loss = losses.nanmean()
    del ref_logits  # TRL's ref_outputs goes when _compute_loss returns, before the backward
    return loss


def _kto_metrics(shift_logits: torch.Tensor, mask: torch.Tensor, chosen_idx: torch.Tensor,
                 rejected_idx: torch.Tensor, count: int, log_probs: LogProbs) -> None:
    """The logged metrics of KTOTrainer._compute_loss that allocate more than a [batch] vector: the
    entropy, the chosen and rejected rows' logits (``index_select`` copies, held together) and their
    completion positions (boolean indexing: copies)."""
    detached = shift_logits.detach()
    entropy = log_probs.entropy_from_logits(detached)
    (entropy * mask).sum()
    del entropy
    chosen_logits = detached.index_select(0, chosen_idx)
    rejected_logits = detached.index_select(0, rejected_idx)
    masked_rows(chosen_logits, chosen_idx.shape[0] * count).mean(-1).sum()
    masked_rows(rejected_logits, rejected_idx.shape[0] * count).mean(-1).sum()
    del chosen_logits, rejected_logits


def reward_loss(model: Any, **batch: torch.Tensor) -> torch.Tensor:
    """RewardTrainer.compute_loss: one score per row, chosen rows first."""
    import torch
    import torch.nn.functional as F

    outputs = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False)
    chosen, rejected = torch.chunk(outputs.logits.squeeze(-1), chunks=2)
    return (-F.logsigmoid(chosen - rejected)).mean()


def _no_phase(name: str) -> None:
    pass


def preference_forward(model: Any, reference: Any, trainer: Trainer, *, autocasts: bool, seq_len: int,
                       attn: str | None, log_probs: LogProbs = TRL_LOG_PROBS,
                       phase: Callable[[str], None] = _no_phase) -> Callable[..., torch.Tensor]:
    """The step's ``forward(**batch)`` for run_steps: the trainer's loss of a preference batch.
    ``autocasts``: the step runs under autocast (accelerate's mixed precision, ``_upcast``).
    ``phase(name)``: called where GRPO's generation and training step begin (workload/grpo.py), and
    KTO's KL forward and policy forward (kto_loss): each begins an autocast region of its own."""
    if trainer.llamafactory:  # LLaMA-Factory's CustomDPOTrainer / CustomKTOTrainer
        from autotune.workload.llamafactory_preference import lf_preference_forward

        return lf_preference_forward(model, reference, trainer, autocasts=autocasts, phase=phase)
    if trainer.name in GENERATIVE:
        from autotune.workload.grpo import grpo_forward

        return grpo_forward(model, reference, trainer, autocasts=autocasts, log_probs=log_probs, phase=phase)
    if trainer.name == DPO:
        count = completion_tokens(seq_len, attn)
        return functools.partial(dpo_loss, model, reference, trainer, autocasts, count, log_probs)
    if trainer.name == KTO:
        count = completion_tokens(seq_len, attn)
        return functools.partial(kto_loss, model, reference, trainer, autocasts, count, log_probs, phase)
    if trainer.name in (ORPO, SIMPO):
        return functools.partial(odds_ratio_loss, model, trainer, autocasts, log_probs)
    if trainer.name == REWARD:
        return functools.partial(reward_loss, model)
    raise AssertionError(f"no step for trainer {trainer.name}")


def step_batch(config: Any, workload: Workload, batch_size: int, seq_len: int,
               device: Any = None) -> dict[str, torch.Tensor]:
    """The batch of the workload's step: step.make_batch's, or a preference trainer's."""
    from autotune.workload.step import make_batch

    if workload.trainer is None:
        return make_batch(config, workload.task, batch_size, seq_len, device, attn=workload.attn,
                          images=workload.images)
    if workload.trainer.llamafactory:
        from autotune.workload.llamafactory_preference import make_lf_batch

        return make_lf_batch(config, workload.trainer, batch_size, seq_len, device, attn=workload.attn)
    if workload.trainer.name in GENERATIVE:
        from autotune.workload.grpo import make_grpo_batch

        return make_grpo_batch(workload.trainer, batch_size, seq_len, device, attn=workload.attn)
    if workload.trainer.name == KTO:
        return make_kto_batch(config, workload.trainer, batch_size, seq_len, device, attn=workload.attn)
    return make_preference_batch(config, workload.trainer, batch_size, seq_len, device, attn=workload.attn)


def trained_model(model: Any, workload: Workload) -> Any:
    """The module the trainer trains, built from the model (its adapter added): LLaMA-Factory's
    reward model wraps it in TRL 0.24's value head (workload/value_head.py); else the model."""
    if workload.trainer is None or not workload.trainer.value_head:
        return model
    from autotune.workload.value_head import add_value_head

    return add_value_head(model)


def prepare_models(model: Any, workload: Workload, build: Callable[[str], Any]) -> Any:
    """A preference trainer's models, as its ``__init__`` leaves them: dropout disabled in the
    policy ``model`` (GRPOConfig's disable_dropout is False: GRPO's policy keeps it, and LLaMA-Factory's
    PairwiseTrainer disables none); the reference it
    returns (a frozen copy built by ``build(weights_dtype)`` for a full fine-tune's DPO or KTO, or
    GRPO's with beta != 0; else None): in the policy's weights' dtype (TRL's ``create_model_from_path``
    with the policy's ``model_init_kwargs``), or the checkpoint's for LLaMA-Factory's
    (trainer_utils.py ``create_ref_model``: ``load_model(is_trainable=False)`` loads ``torch_dtype="auto"``
    and casts nothing to float32)."""
    trainer = workload.trainer
    if trainer is None:
        return None
    # GRPO keeps dropout; so does LLaMA-Factory's PairwiseTrainer (transformers' Trainer) in the LM and
    # in its value head
    if trainer.name not in GENERATIVE and not trainer.value_head:
        disable_dropout(model)
    peft = workload.adapter is not None
    # EBFT's feature network, a deepcopy of the policy (workload/ebft.py), takes the reference's place:
    # trainers.check_trainer refuses EBFT with GRPO's reference (beta != 0)
    if "frozen copy" in (trainer.reference(peft=peft), trainer.feature_network(peft=peft)):
        dtype = workload.weights_dtype
        if trainer.llamafactory:
            from autotune.workload.models import resolve_dtype

            dtype = resolve_dtype(workload.model, "auto")
        return frozen_copy(functools.partial(build, dtype))
    return None
