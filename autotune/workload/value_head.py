"""LLaMA-Factory's reward model (``stage: rm``): the causal LM wrapped in TRL 0.24's value head, and
PairwiseTrainer's loss, as LLaMA-Factory runs them.

LLaMA-Factory (hiyouga/LLaMA-Factory, src/llamafactory/) pins ``trl>=0.18.0,<=0.24.0`` (pyproject.toml);
its rm stage (train/rm/workflow.py ``run_rm``) builds the model with ``load_model(add_valuehead=True)``
(model/loader.py: the causal LM, its adapter by ``init_adapter``, then
``AutoModelForCausalLMWithValueHead.from_pretrained(model)`` and ``patch_valuehead_model``) and trains
it with ``PairwiseTrainer`` (train/rm/trainer.py), a transformers ``Trainer``. From TRL v0.24.0
trl/models/modeling_value_head.py (``ValueHead``, ``AutoModelForCausalLMWithValueHead``) and
trl/models/modeling_base.py (``PreTrainedModelWrapper``):

- the value head: ``dropout`` (``nn.Dropout(summary_dropout_prob)``: 0.1, ``from_pretrained``'s
  kwargs default, unless the model's config has ``summary_dropout_prob``), ``summary``
  (``nn.Linear(hidden_size, 1)``, with a bias: ``word_embed_proj_dim`` where the config has one),
  built after the model in torch's default dtype, float32, and trainable (LoRA was added before it);
  nothing disables its dropout (PairwiseTrainer is transformers' Trainer: no ``disable_dropout``);
- ``forward``: the wrapped model with ``output_hidden_states=True`` and the caller's keywords, so
  the LM head computes every position's logits, and the LM's own loss where the batch has
  ``labels``; the value head on the last hidden state (dropout, a float32 copy where it is 16-bit,
  ``summary``); the logits upcast by ``lm_logits.float()``; it returns ``(lm_logits, loss, value)``;
- ``PairwiseTrainer.compute_loss``: ``_, _, values = model(**inputs, output_hidden_states=True,
  return_dict=True, use_cache=False)`` over ``PairwiseDataCollatorWithPadding``'s batch, chosen
  rows then rejected rows, 2 x batch (``input_ids``, ``attention_mask`` and ``labels``: IGNORE_INDEX
  over the prompt, which reach the LM, whose loss is computed and dropped); each row's value at its
  last attended token (``gather`` at ``attention_mask.sum(-1) - 1``), ``-logsigmoid(chosen - rejected)
  .mean()`` on [batch] vectors. The logits, their float32 copy and the LM loss's graph are dropped
  with the tuple: they are the forward's transient peak, not saved for the backward.

Under mixed precision accelerate converts the prepared model's 16-bit outputs to float32
(``convert_outputs_to_fp32``): the value, which autocast's Linear returns in 16 bits.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import nn

# modeling_value_head.py ValueHead.__init__: kwargs.pop("summary_dropout_prob", 0.1)
SUMMARY_DROPOUT_PROB = 0.1


class ValueHead(nn.Module):
    """TRL 0.24's ``ValueHead``: a scalar for each position's hidden state."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        dropout = getattr(config, "summary_dropout_prob", SUMMARY_DROPOUT_PROB)
        self.dropout: nn.Module = nn.Dropout(dropout) if dropout else nn.Identity()
        # OPT-like models project the hidden state before the word embeddings (word_embed_proj_dim)
        hidden_size = getattr(config, "word_embed_proj_dim", None) or config.hidden_size
        self.summary = nn.Linear(hidden_size, 1)
        self.flatten = nn.Flatten()

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        output = self.dropout(hidden_states)
        if output.dtype != self.summary.weight.dtype:  # TRL: "force upcast in fp32 if needed"
            output = output.to(self.summary.weight.dtype)
        return self.summary(output)


class ValueHeadModel(nn.Module):
    """TRL 0.24's ``AutoModelForCausalLMWithValueHead`` around a built causal LM (or its PEFT
    wrapper), as ``from_pretrained(model)`` makes it. Attributes it does not have are looked up on
    the wrapped model, as PEFT's wrapper does, so autotune's step helpers (gradient checkpointing,
    parameter counts) reach the LM: TRL binds its ``gradient_checkpointing_enable``,
    ``gradient_checkpointing_disable`` and ``enable_input_require_grads`` the same way."""

    def __init__(self, pretrained_model: Any) -> None:
        super().__init__()
        self.pretrained_model = pretrained_model
        self.config = pretrained_model.config
        self.v_head = ValueHead(pretrained_model.config)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name == "pretrained_model":
                raise
            return getattr(self.pretrained_model, name)

    def forward(self, input_ids: torch.Tensor | None = None, past_key_values: Any = None,
                attention_mask: torch.Tensor | None = None,
                **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """``AutoModelForCausalLMWithValueHead.forward`` (return_past_key_values False)."""
        kwargs["output_hidden_states"] = True
        kwargs["past_key_values"] = past_key_values
        with warnings.catch_warnings():  # transformers 5 deprecates the name; TRL 0.24 passes it, None
            warnings.filterwarnings("ignore", message="`past_key_values` is deprecated",
                                    category=FutureWarning)
            base_model_output = self.pretrained_model(input_ids=input_ids, attention_mask=attention_mask,
                                                      **kwargs)
        last_hidden_state = base_model_output.hidden_states[-1]
        lm_logits = base_model_output.logits
        loss = base_model_output.loss
        value = self.v_head(last_hidden_state).squeeze(-1)
        if lm_logits.dtype != torch.float32:  # TRL: "force upcast in fp32 if logits are in half-precision"
            lm_logits = lm_logits.float()
        return (lm_logits, loss, value)

    def get_nb_trainable_parameters(self) -> tuple[int, int]:
        """PEFT's count of the wrapped model with the value head's parameters added."""
        head = sum(p.numel() for p in self.v_head.parameters())
        if hasattr(self.pretrained_model, "get_nb_trainable_parameters"):
            trainable, total = self.pretrained_model.get_nb_trainable_parameters()
            return trainable + head, total + head
        params = list(self.parameters())
        return sum(p.numel() for p in params if p.requires_grad), sum(p.numel() for p in params)


def add_value_head(model: Any) -> ValueHeadModel:
    """loader.py ``load_model(add_valuehead=True)``: the model (its adapter added) wrapped."""
    return ValueHeadModel(model)


def _fp32_outputs(outputs: tuple[Any, ...]) -> tuple[Any, ...]:
    """accelerate's ``convert_outputs_to_fp32`` of a tuple: each 16-bit tensor a float32 copy."""
    return tuple(value.float() if isinstance(value, torch.Tensor)
                 and value.dtype in (torch.float16, torch.bfloat16) else value for value in outputs)


def pairwise_loss(model: Any, autocasts: bool, **inputs: torch.Tensor) -> torch.Tensor:
    """train/rm/trainer.py ``PairwiseTrainer.compute_loss`` (module docstring); ``autocasts``: the
    step runs under accelerate's mixed precision."""
    outputs = model(**inputs, output_hidden_states=True, return_dict=True, use_cache=False)
    if autocasts:
        outputs = _fp32_outputs(outputs)
    _, _, values = outputs  # the logits go as ``_`` is bound again, the LM's loss when it returns
    del outputs
    batch_size = inputs["input_ids"].size(0) // 2
    chosen_masks, rejected_masks = torch.split(inputs["attention_mask"], batch_size, dim=0)
    chosen_rewards, rejected_rewards = torch.split(values, batch_size, dim=0)
    chosen_scores = chosen_rewards.gather(dim=-1, index=(chosen_masks.sum(dim=-1, keepdim=True) - 1))
    rejected_scores = rejected_rewards.gather(dim=-1, index=(rejected_masks.sum(dim=-1, keepdim=True) - 1))
    chosen_scores, rejected_scores = chosen_scores.squeeze(), rejected_scores.squeeze()
    return -torch.nn.functional.logsigmoid(chosen_scores.float() - rejected_scores.float()).mean()
