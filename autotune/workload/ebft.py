"""EBFT's structured mode: Axolotl's AxolotlEBFTTrainer, GRPO's step with a feature network as reward.

Read from axolotl-ai-cloud/axolotl main of 2026 (src/axolotl/core/trainers/ebft/trainer.py,
rewards.py, args.py; core/builders/rl.py ``_get_trainer_cls``: ``rl: ebft`` without ``ebft.mode:
strided``). ``AxolotlEBFTTrainer(EBFTMixin, AxolotlGRPOTrainer)`` is TRL's GRPOTrainer given one reward
function, ``_feature_matching_reward``; the generation, the scoring and the training step are GRPO's
(workload/grpo.py). What EBFT adds:

- the feature network (``EBFTMixin.__init__``): under PEFT the policy itself with its adapter disabled
  (``disable_adapter()``: no second copy); else ``copy.deepcopy`` of the unwrapped policy, frozen, in
  the policy's dtype, held for the whole job (Trainer.feature_network).
- its forward in ``_calculate_rewards``, after the generation and the log-probs of
  ``_generate_and_score_completions``, under ``torch.no_grad``: the prompt + completion texts
  re-tokenized, padded to the longest (all G rows of the generation batch, up to ``seq_len`` tokens),
  and one prompt + ground-truth row per prompt (G / num_generations rows: modelled ``seq_len`` long,
  as long as a generated row; a longer ground truth makes them longer, up to 2048 tokens:
  ``max_length`` is blocklisted for EBFT, so ``or 2048``). ``extract_hidden_states`` runs
  ``getattr(model, "model")``: the base transformer of a frozen copy (no lm_head), but under PEFT
  ``PeftModel.model`` is LoraModel's ``model``, the whole causal LM, whose logits over every position
  are computed and dropped. ``output_hidden_states=True`` keeps every layer's output until the
  function returns; the layers at ``int(frac * num_hidden_layers)`` are concatenated (``torch.cat``),
  then concatenated again over the one chunk (a copy). The generated rows' features are held while the
  ground truth's are extracted. No KV cache: Axolotl's ``load_model_config`` sets ``use_cache = False``
  (loaders/utils.py), which ``deepcopy`` keeps.
- the pooling (``embed_method`` last_token: one position per row), L2 normalization, the alignment and
  diversity rewards and the CFM loss on [rows, features] tensors, then ``rewards.cpu()``.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

from autotune.workload.trainers import EBFT_FEATURE_LAYERS, Trainer

if TYPE_CHECKING:
    import torch


def feature_layer_indices(config: Any) -> list[int]:
    """``EBFTMixin.__init__``: ``int(frac * num_hidden_layers)`` of the text config's depth."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return [int(frac * text.num_hidden_layers) for frac in EBFT_FEATURE_LAYERS]


def feature_rewards(model: Any, feature_network: Any, trainer: Trainer, input_ids: torch.Tensor,
                    attention_mask: torch.Tensor) -> None:
    """``_feature_matching_reward`` over the generation batch's prompt + completion rows (module
    docstring); ``feature_network`` None: the policy with its adapter disabled."""
    import torch
    import torch.nn.functional as F

    rows, length = input_ids.shape
    # one ground truth a prompt; a probe between whole groups (trainers.largest_batch rounds the answer
    # down to them) counts its last, partial group as one
    count = trainer.num_generations
    groups, whole = -(-rows // count), rows // count
    # processing_class(text=..., return_tensors="pt", padding=True).to(device): new tensors
    gen_ids, gen_mask = input_ids.clone(), attention_mask.clone()
    gt_ids = input_ids.new_zeros((groups, length))
    gt_mask = attention_mask.new_ones((groups, length))
    network = model if feature_network is None else feature_network
    indices = feature_layer_indices(network.config)
    context = model.disable_adapter() if feature_network is None else contextlib.nullcontext()
    with context:
        was_training = network.training
        network.eval()  # EBFTMixin: dropout off for the features, training mode restored after
        gen_hidden = _extract_hidden_states(network, gen_ids, gen_mask, indices)
        gt_hidden = _extract_hidden_states(network, gt_ids, gt_mask, indices)
        if was_training:
            network.train()
    gen_emb = F.normalize(_last_token(gen_hidden, gen_mask), p=2, dim=-1)
    gt_emb = F.normalize(_last_token(gt_hidden, gt_mask), p=2, dim=-1)
    del gen_hidden, gt_hidden
    gt_expanded = gt_emb.repeat_interleave(count, dim=0)[:rows]
    alignment = F.cosine_similarity(gen_emb, gt_expanded, dim=-1) * 2  # get_alignment_rewards
    grouped = gen_emb[:whole * count].view(whole, count, -1)
    sims = torch.bmm(grouped, grouped.transpose(1, 2))  # get_diversity_rewards
    eye = torch.eye(count, device=sims.device, dtype=torch.bool)
    sims = sims.masked_fill(eye.unsqueeze(0), 0.0)
    diversity = sims.sum(dim=-1).view(-1) * 2
    rewards = alignment[:whole * count] - diversity
    cfm_loss = ((grouped.mean(dim=1) - gt_emb[:whole]) ** 2).sum(dim=-1).mean()
    del cfm_loss, rewards  # rewards.cpu().tolist(): back to the host


def _extract_hidden_states(network: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                           indices: list[int]) -> torch.Tensor:
    """rewards.py ``extract_hidden_states``: one chunk (batch_size None), ``getattr(model, "model")``'s
    forward with every hidden state, the chosen layers concatenated, then the chunks."""
    import torch

    body = getattr(network, "model", None)
    forward_model = body if body is not None and hasattr(body, "forward") else network
    all_features = []
    outputs = forward_model(input_ids, attention_mask=attention_mask, output_hidden_states=True,
                            return_dict=True, use_cache=False)
    all_features.append(torch.cat([outputs.hidden_states[idx] for idx in indices], dim=-1))
    found = torch.cat(all_features, dim=0)  # the loop's ``outputs`` is still held here
    del outputs, all_features
    return found


def _last_token(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``apply_embed_method(..., "last_token", mask)``: each row's last unmasked position."""
    import torch

    last = mask.sum(dim=1).long() - 1
    return hidden[torch.arange(hidden.shape[0], device=hidden.device), last]
