"""Axolotl's diffusion LM step (``plugins: axolotl.integrations.diffusion.DiffusionPlugin``): the loss
``diffusion``.

The plugin's ``get_trainer_cls`` gives Axolotl's trainer builder its DiffusionTrainer, whose
``compute_loss`` (src/axolotl/integrations/diffusion/trainer.py ``_compute_diffusion_loss``, Axolotl
067b021c) runs LLaDA's masked-token objective instead of the model's own loss:

    _forward_process          a timestep per row, p_mask [batch, seq] float32, tokens masked at random
                              (not padding, special tokens, nor unlabelled ones), the masked ids set to
                              mask_token_id: noisy_batch [batch, seq]
    create_bidirectional_attention_mask   utils.py: [batch, 1, seq, seq] bool, a token attends to every
                              token of its row (its packed sample) whatever the order
    model(input_ids=noisy_batch, attention_mask=that 4D mask)      no labels: the model's logits
                              [batch, seq, vocab] in the autocast dtype; transformers passes a 4D mask to
                              the attention as is (masking_utils.py _preprocess_mask_arguments)
    shift_logits_to_input_positions       utils.py: torch.cat of the logits' first position and all but
                              their last: a second [batch, seq, vocab] copy
    logits[batch_indices, seq_indices]    the masked positions' logits [masked, vocab], then .float(),
                              F.cross_entropy(reduction="none"), divided by p_mask (importance_weighting),
                              then per row (labels given, as Axolotl's collators give them) summed over
                              the row's masked tokens and divided by its answer length, averaged

Axolotl is not a dependency of autotune, so those functions are copied here statement by statement and
traced on the estimator's fake tensors like the model. What fake tensors cannot run is emulated:
``torch.where(masked_indices)`` and the per-row boolean index take ``torch.nonzero_static`` of the count
(the [count, 2] int64 indices CUDA's ``nonzero`` makes, then the same gathers); the data-dependent
``if masked_indices.sum() > 0`` and per-row ``if sample_mask.sum() > 0`` are taken as true; the metrics'
``.item()`` calls (scalars read to the host) are left out. The count is the worst step's: a timestep
t near 1 masks every maskable token (p_mask = (1 - eps) * t + eps), here every position of
step.make_batch's batch but the padded one each row keeps (``count``): every label set, as an SFT row
that is all answer, or a pretraining row.

The plugin's sample generation (``diffusion.generate_samples``, callbacks.py on_step_end every
generation_interval steps) runs between steps, after the optimizer step and zero_grad: under
``torch.no_grad``, one row at a time (generation.py ``generate``) of at most sequence_len tokens:
less than the training step it follows, so it adds no peak of its own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

DIFFUSION = "diffusion"
DESCRIPTION = ("Axolotl's DiffusionPlugin step (integrations/diffusion/trainer.py _compute_diffusion_loss, "
               "copied and traced): the masked tokens' logits gathered from the model's logits and their "
               "shifted copy under a bidirectional [batch, 1, seq, seq] mask, upcast to float32, a per-token "
               "cross-entropy weighted by 1/p_mask; every token but padding masked (the worst step)")
IGNORE_INDEX = -100  # trainer.py: ``labels != -100`` marks the answer tokens
DEFAULT_EPS = 1e-3  # args.py DiffusionConfig.eps's default
# The attentions a 4D mask reaches as is (the plugin's README: "Any models that support 4D attention
# masks should work"): sdpa takes it as attn_mask, eager adds it to the scores.
ATTENTIONS = ("sdpa", "eager")


def check_attention(attn: str | None) -> None:
    """The plugin's 4D bidirectional mask is modelled with the attentions that take a 4D mask as is."""
    from autotune.errors import UnmodelledSetting

    if attn is not None and attn not in ATTENTIONS:
        raise UnmodelledSetting.naming(
            f"{{loss}} {DIFFUSION} with {{attn}} {attn}: Axolotl's diffusion step passes a 4D "
            "bidirectional mask [batch, 1, seq, seq] (integrations/diffusion/utils.py "
            "create_bidirectional_attention_mask), "
            f"modelled with {' or '.join(ATTENTIONS)} attention, which take it as is")


def diffusion_loss(model: Any, batch: dict[str, torch.Tensor], *, eps: float = DEFAULT_EPS,
                   importance_weighting: bool = True) -> torch.Tensor:
    """DiffusionTrainer.compute_loss of ``batch`` (module docstring)."""
    input_ids, attention_mask = batch["input_ids"], batch["attention_mask"]
    labels = batch.get("labels")
    noisy_batch, masked_indices, p_mask = _forward_process(model.config, input_ids, attention_mask, labels,
                                                           eps)
    bidirectional_mask = create_bidirectional_attention_mask(input_ids, attention_mask)
    outputs = model(input_ids=noisy_batch.long(), attention_mask=bidirectional_mask)
    logits = shift_logits_to_input_positions(outputs.logits)
    return _masked_loss(logits, input_ids, masked_indices, p_mask, labels, importance_weighting)


def count(input_ids: torch.Tensor) -> int:
    """The masked tokens of the worst step: every position of each row but its last, which
    step.make_batch pads (its attention mask 0), so never masked (module docstring)."""
    rows, seq = input_ids.shape
    return rows * max(seq - 1, 1)


def _special_token_ids(config: Any) -> set[int]:
    """trainer.py _cache_special_token_ids: the tokenizer's bos, eos and pad ids (the model config's
    here: the preset has no tokenizer; each costs one [batch, seq] comparison)."""
    found = set()
    for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
        value = getattr(config, name, None)
        if isinstance(value, int):
            found.add(value)
    return found


def _forward_process(config: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                     labels: torch.Tensor | None, eps: float) -> tuple[torch.Tensor, ...]:
    """trainer.py ``_forward_process``; the mask token's id does not change memory (the vocabulary's
    first id stands in for it)."""
    import torch

    batch_size, seq_len = input_ids.shape
    device = input_ids.device
    t = torch.rand(batch_size, device=device)
    p_mask = (1 - eps) * t + eps
    p_mask = p_mask[:, None].repeat(1, seq_len)
    if attention_mask is not None:
        valid_mask = attention_mask.bool()
        p_mask = p_mask * valid_mask.float()
    special_token_mask = torch.zeros_like(input_ids, dtype=torch.bool)
    for token_id in _special_token_ids(config):
        special_token_mask |= input_ids == token_id
    masked_indices = torch.rand((batch_size, seq_len), device=device) < p_mask
    masked_indices = masked_indices & ~special_token_mask
    if attention_mask is not None:
        masked_indices = masked_indices & attention_mask.bool()
    if labels is not None:
        answer_mask = labels != IGNORE_INDEX
        masked_indices = masked_indices & answer_mask
    mask_value = torch.full_like(input_ids, 0)
    noisy_batch = torch.where(masked_indices, mask_value, input_ids)
    return noisy_batch, masked_indices, p_mask


def create_bidirectional_attention_mask(input_ids: torch.Tensor,
                                        attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """utils.py ``create_bidirectional_attention_mask`` (its sample_packing argument is unused)."""
    import torch

    batch_size, seq_len = input_ids.shape
    if attention_mask is None:
        return torch.ones(batch_size, 1, seq_len, seq_len, dtype=torch.bool, device=input_ids.device)
    mask_i = attention_mask.unsqueeze(2)
    mask_j = attention_mask.unsqueeze(1)
    bidirectional_mask = (mask_i == mask_j) & (mask_i > 0)
    return bidirectional_mask.unsqueeze(1)


def shift_logits_to_input_positions(logits: torch.Tensor) -> torch.Tensor:
    """utils.py ``shift_logits_to_input_positions``."""
    import torch

    if logits.size(1) <= 1:
        return logits
    return torch.cat([logits[:, :1], logits[:, :-1]], dim=1)


def _masked_loss(logits: torch.Tensor, input_ids: torch.Tensor, masked_indices: torch.Tensor,
                 p_mask: torch.Tensor, labels: torch.Tensor | None,
                 importance_weighting: bool) -> torch.Tensor:
    """``_compute_diffusion_loss`` from the shifted logits on, ``masked_indices.sum() > 0`` taken."""
    import torch
    import torch.nn.functional as F

    total = count(input_ids)
    batch_indices, seq_indices = torch.nonzero_static(masked_indices, size=total).unbind(1)
    masked_logits = logits[batch_indices, seq_indices]
    masked_targets = input_ids[batch_indices, seq_indices]
    masked_p_mask = p_mask[batch_indices, seq_indices]
    token_loss = F.cross_entropy(masked_logits.float(), masked_targets, reduction="none")
    if importance_weighting:
        masked_p_mask = masked_p_mask.float()
        weighted_loss = token_loss / masked_p_mask
    else:
        weighted_loss = token_loss
    if labels is not None:
        answer_mask = labels != IGNORE_INDEX
        answer_lengths = answer_mask.sum(dim=1).float()
        batch_size = input_ids.shape[0]
        loss_per_sample = torch.zeros(batch_size, device=input_ids.device)
        for i in range(batch_size):
            sample_mask = batch_indices == i
            # weighted_loss[sample_mask]: the row's share of the count (nonzero_static, as above)
            rows = torch.nonzero_static(sample_mask, size=total // batch_size).squeeze(1)
            sample_loss = weighted_loss[rows].sum()
            denom = answer_lengths[i].clamp(min=1.0)
            loss_per_sample[i] = sample_loss / denom
        loss = loss_per_sample.mean()
    elif importance_weighting:
        loss = weighted_loss.sum() / (input_ids.shape[0] * input_ids.shape[1])
    else:
        loss = weighted_loss.mean()
    # the metrics (their .item() reads left out): ce_loss, the accuracy under no_grad, the mask's mean
    token_loss.mean()
    with torch.no_grad():
        (masked_logits.argmax(dim=-1) == masked_targets).float().mean()
    if importance_weighting:
        (1.0 / masked_p_mask).mean()
    return loss
