"""TRL's chunked_nll loss as SFTTrainer runs it: 256 labelled tokens a chunk, each recomputed in backward.

SFTConfig's default loss_type since TRL 1.7 (trl/trainer/sft_config.py ``__post_init__``: "chunked_nll"
unless use_liger_kernel). SFTTrainer patches the model's forward (sft_trainer.py
``_patch_chunked_ce_lm_head``): the backbone (``self.base_model``) gives the last hidden states, and
``_chunked_cross_entropy_loss`` computes the loss from them and ``lm_head.weight`` (and bias). It is
plain torch, but TRL is not a dependency of autotune (it pulls datasets), so its two functions are
written here from their source (TRL f2cd577, July 2026), call for call: the estimator traces them on
fake tensors as it would trace TRL's own, torch.utils.checkpoint included.

What it allocates: the shifted hidden states [N, D] copied (``hidden_states[..., :-1, :].reshape``)
and again gathered in valid-first order (``hidden[order]``), the argsort's indices; then per chunk of
256 rows, under a non-reentrant checkpoint (nothing saved but its inputs), a float32 copy of the
weight (``w.float()``, [V, D], unless it is float32 already), the float32 logits [256, V] and their
log-softmax; in backward each chunk again, with the gradients of the logits and of the float32
weight copy.

Two reads of data a fake tensor cannot answer are taken from the batch's shape: the count of
labelled tokens (autotune's batches label every token, workload/step.py make_batch) and so the
chunk loop's length (chunks.FixedChunks records its layout for the estimator's affine forms).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from autotune.workload.chunks import FixedChunks, record
from autotune.workload.loss import IGNORE_INDEX, lm_hidden_states

if TYPE_CHECKING:
    import torch

NAME = "chunked_nll"  # the loss's name (workload/loss.py LOSSES), TRL's loss_type
CHUNK_ROWS = 256  # sft_trainer.py ``_CHUNKED_LM_HEAD_CHUNK_SIZE``
ContextFn = Callable[[], tuple[AbstractContextManager[Any], AbstractContextManager[Any]]]


def chunked_nll_loss(model: Any, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The loss of ``batch`` as ``_patch_chunked_ce_lm_head``'s ``_chunked_ce_forward`` computes it
    (no num_items_in_batch: the mean over the labelled tokens)."""
    hidden_states, head = lm_hidden_states(model, batch, NAME)
    # text_config = model.config.text_config if is_vlm else model.config: the text model's
    text_config = model.config.get_text_config()
    softcap = getattr(text_config, "final_logit_softcapping", None)
    logit_scale = getattr(text_config, "logit_scale", 1.0)
    return chunked_cross_entropy_loss(hidden_states, head.weight, CHUNK_ROWS, batch["labels"],
                                      logit_scale=logit_scale, final_logit_softcapping=softcap,
                                      lm_head_bias=head.bias)


def _chunk(h: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, lbl: torch.Tensor,
           logit_scale: float, final_logit_softcapping: float | None
           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """sft_trainer.py ``_chunk`` (``maybe_gather_lm_head_ctx``: nothing outside DeepSpeed ZeRO-3)."""
    import torch
    import torch.nn.functional as F

    logits = h.float() @ w.float().t()
    if b is not None:
        logits = logits + b.float()
    if logit_scale != 1.0:
        logits = logits * logit_scale
    if final_logit_softcapping is not None:
        logits = final_logit_softcapping * torch.tanh(logits / final_logit_softcapping)
    log_p = F.log_softmax(logits, dim=-1)
    chunk_loss = F.nll_loss(log_p, lbl, ignore_index=IGNORE_INDEX, reduction="sum")
    valid = lbl != IGNORE_INDEX
    chunk_correct = ((logits.argmax(dim=-1) == lbl) & valid).sum().float()
    chunk_entropy = (-(log_p.exp() * log_p).sum(dim=-1) * valid).sum()
    return chunk_loss, chunk_correct, chunk_entropy


def _valid_count(valid: torch.Tensor) -> int:
    """``n_valid_tensor`` read as a number (TRL's ``if n_valid_tensor == 0`` and ``range(0, n_padded,
    chunk_size)``). A fake tensor cannot answer: every token is labelled (module docstring)."""
    from torch._subclasses.fake_tensor import FakeTensor

    return valid.numel() if isinstance(valid, FakeTensor) else int(valid.sum())


def chunked_cross_entropy_loss(hidden_states: torch.Tensor, lm_head_weight: torch.Tensor, chunk_size: int,
                               labels: torch.Tensor, logit_scale: float = 1.0,
                               final_logit_softcapping: float | None = None,
                               lm_head_bias: torch.Tensor | None = None, *,
                               context_fn: ContextFn | None = None) -> torch.Tensor:
    """sft_trainer.py ``_chunked_cross_entropy_loss`` with ``labels`` (the internal shift) and no
    num_items_in_batch; the loss only (the token accuracy and entropy sums are computed all the same).

    A torch function until given ``context_fn``: the estimator's emulation sees the call and runs it
    under itself with ``context_fn``, the checkpoint's documented hook, so that each chunk's recompute
    in backward runs under its CUDA emulation as the forward did (as step.gradient_checkpointing
    gives transformers' checkpointing);
    on a GPU torch.utils.checkpoint restores the forward's autocast itself (TRL passes none: None,
    torch's ``noop_context_fn``)."""
    import torch
    from torch.overrides import handle_torch_function, has_torch_function
    from torch.utils.checkpoint import noop_context_fn

    if context_fn is None and has_torch_function((hidden_states, lm_head_weight, labels)):
        return handle_torch_function(  # type: ignore[no-any-return]
            chunked_cross_entropy_loss, (hidden_states, lm_head_weight, labels), hidden_states,
            lm_head_weight, chunk_size, labels, logit_scale=logit_scale,
            final_logit_softcapping=final_logit_softcapping, lm_head_bias=lm_head_bias,
            context_fn=context_fn)

    hidden = hidden_states[..., :-1, :].reshape(-1, hidden_states.size(-1))
    labels = labels[..., 1:].reshape(-1)
    valid = labels != IGNORE_INDEX
    n_valid_tensor = valid.sum()
    n_valid = _valid_count(valid)
    correct = hidden.new_zeros((), dtype=torch.float32)
    entropy_sum = hidden.new_zeros((), dtype=torch.float32)
    if n_valid == 0:  # the whole micro-batch masked: a zero loss connected to every parameter
        loss = (hidden_states.float().sum() + lm_head_weight.float().sum()) * 0.0
        return loss if lm_head_bias is None else loss + lm_head_bias.float().sum() * 0.0
    # valid tokens packed to the front (argsort on the mask, a static-shape op)
    order = valid.to(torch.int8).argsort(descending=True, stable=True)
    hidden = hidden[order]
    labels = labels[order]
    # the whole chunks covering the valid prefix: TRL's tensor, the loop bounded by its value
    n_padded_tensor = (n_valid_tensor / chunk_size).ceil().to(torch.int64) * chunk_size
    n_padded = -(-n_valid // chunk_size) * chunk_size
    del n_padded_tensor
    # the estimator's rows are all labelled (n_valid == rows): the chunks are FixedChunks' layout
    record(FixedChunks(chunk_size), hidden.shape[0])
    loss = hidden.new_zeros((), dtype=torch.float32)
    for start in range(0, n_padded, chunk_size):
        h_chunk = hidden[start: start + chunk_size]
        lbl_chunk = labels[start: start + chunk_size]
        chunk_loss, chunk_correct, chunk_entropy = torch.utils.checkpoint.checkpoint(
            _chunk, h_chunk, lm_head_weight, lm_head_bias, lbl_chunk, logit_scale, final_logit_softcapping,
            use_reentrant=False, context_fn=context_fn or noop_context_fn)
        loss = loss + chunk_loss
        correct = correct + chunk_correct
        entropy_sum = entropy_sum + chunk_entropy
    return loss / n_valid_tensor

