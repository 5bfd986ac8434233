"""GRPO: the generation and the training step of TRL's GRPOTrainer, as TRL runs them.

Read from huggingface/trl main of 2026 (trl/trainer/grpo_trainer.py, grpo_config.py).

The batch. ``per_device_train_batch_size`` counts **completions**: one row is a prompt and one of its
sampled completions (GRPOConfig.__post_init__: ``generation_batch_size = per_device_train_batch_size
x num_processes x steps_per_generation``, which must be a multiple of ``num_generations``;
``RepeatSampler(mini_repeat_count=num_generations, batch_size=generation_batch_size //
num_generations)`` in ``_get_train_sampler``: each prompt appears ``num_generations`` times in a
generation batch). A row is ``seq_len`` tokens: the prompt (``seq_len - max_completion_length``; TRL
no longer truncates prompts) then ``max_completion_length`` completion tokens, the longest a row holds.

Each step (``training_step`` -> ``_prepare_inputs``):

1. Generation, every ``steps_per_generation`` steps, for the whole generation batch (G = batch x
   steps_per_generation rows), ``_generate_and_score_completions``:
   - without vLLM, ``_generate_single_turn``: ``unwrapped_model.generate(input_ids, attention_mask)``
     under ``torch.no_grad()`` (``unwrap_model_for_generation`` turns gradient checkpointing off:
     the KV cache is used), prompts left-padded, ``max_new_tokens = max_completion_length``,
     sampling. transformers' ``_sample``: a prefill with ``logits_to_keep=1``, then one forward a
     token with a ``DynamicCache`` grown by ``torch.cat`` per layer, each step's last logits copied
     to float32, their softmax, ``torch.multinomial``, ``input_ids`` and the attention mask grown by
     a column. Sampling and stopping depend on values a fake tensor does not have, so the decode
     loop is **emulated** at a fixed length (``emulated_generate``): the prefill traced through the
     real model, every cache layer grown at once to ``seq_len - 1`` tokens (each new block
     allocated before the old one is freed, as ``torch.cat`` does), then the last decode step
     traced through the model's forward with the cache: the cache's peak (all G rows at full
     length), one layer's concatenation beside it and the per-step logits. The earlier, shorter
     steps are not replayed one by one.
   - with vLLM (``use_vllm``), the completions come back as token lists: from an engine colocated
     in this process (``vllm_mode="colocate"``), which holds ``vllm_gpu_memory_utilization`` of the
     GPU outside the training step's allocator (taken off the budget: Trainer.vllm_bytes), or from
     a server on other GPUs (``vllm_mode="server"``: nothing on this GPU).
   - the completions are re-padded into tensors and scored under ``torch.no_grad()``, in chunks of
     ``per_device_train_batch_size`` rows (``_get_per_token_logps_and_entropies(..., batch_size)``):
     the policy's ``old_per_token_logps`` where vLLM's importance-sampling correction is on
     (GRPOConfig ``vllm_importance_sampling_correction``, default True), and, where ``beta != 0``,
     the reference's: a frozen copy for a full fine-tune, the adapter disabled under PEFT
     (``use_adapter(model, None)``).
   - the scored generation batch is shuffled (``shuffle_sequence_dict``: copies) and kept for the
     steps of this generation (``self._buffered_inputs``), until the next generation replaces it.
2. The training step, ``_compute_loss`` on this step's slice: the policy's forward on
   ``batch`` rows of prompt + completion with ``logits_to_keep = max_completion_length + 1``
   (``logits[:, :-1, :]``, then the last ``max_completion_length`` positions; ``logits.div_(
   temperature)``), ``selective_log_softmax`` of the completion tokens, the entropies under
   ``no_grad`` (``entropy_from_logits``), ``torch.cat`` of the one chunk, then the loss (``loss_type``
   dapo, the default: the clipped ratio, ``beta``'s per-token KL) on [batch, completion] tensors.

The job's peak is the larger of the generation phase's and the training step's; both run in the
traced step, in TRL's order (``phase`` marks where each begins).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from autotune.errors import InvalidInput
from autotune.workload.trainers import EBFT, Trainer

if TYPE_CHECKING:
    import torch

LogProbs = Any  # workload.preference.LogProbs (which imports this module): TRL's log-prob helpers

GENERATION, TRAINING = "generation", "training step"


def generation_rows(trainer: Trainer, batch_size: int) -> int:
    """The rows one generation samples: generation_batch_size = batch x steps_per_generation (one GPU)."""
    return batch_size * trainer.steps_per_generation


def prompt_tokens(trainer: Trainer, seq_len: int) -> int:
    """A row's prompt: what ``seq_len`` holds beside the completion."""
    return seq_len - trainer.max_completion_length


def cache_bytes(config: Any, rows: int, tokens: int, dtype_bytes: int) -> int:
    """The KV cache of ``rows`` x ``tokens`` (DynamicCache: keys and values [rows, kv_heads, tokens,
    head_dim] per layer), every layer full-length: what explain names as the generation cache."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    return 2 * text.num_hidden_layers * rows * heads * tokens * head_dim * dtype_bytes


def make_grpo_batch(trainer: Trainer, batch_size: int, seq_len: int, device: Any = None, *,
                    attn: str | None = None) -> dict[str, torch.Tensor]:
    """The generation batch's prompts as ``_generate_single_turn`` pads them: G rows of the prompt's
    tokens, left-padded (the first position padding, so that the model keeps its attention mask as
    for a padded batch; none under flash_attention_2, whose rows are filled)."""
    import torch

    from autotune.workload.step import FLASH_ATTENTIONS

    shape = (generation_rows(trainer, batch_size), prompt_tokens(trainer, seq_len))
    mask = torch.ones(shape, dtype=torch.long, device=device)
    if shape[1] > 1 and attn not in FLASH_ATTENTIONS:
        mask[:, 0] = 0
    return {"prompt_ids": torch.zeros(shape, dtype=torch.long, device=device), "prompt_mask": mask}


class _Buffer:
    """GRPOTrainer's ``_buffered_inputs``: the scored generation batch, kept across steps."""

    inputs: dict[str, torch.Tensor] | None = None


def grpo_forward(model: Any, reference: Any, trainer: Trainer, *, autocasts: bool, log_probs: LogProbs,
                 phase: Callable[[str], None]) -> Callable[..., torch.Tensor]:
    """The step's ``forward(**batch)`` for run_steps: generation and scoring, then the loss."""
    buffer = _Buffer()

    def forward(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> torch.Tensor:
        rows = prompt_ids.shape[0] // trainer.steps_per_generation
        phase(GENERATION)
        generated = _generate_and_score(model, reference, trainer, autocasts, log_probs, rows,
                                        prompt_ids, prompt_mask)
        buffer.inputs = None  # TRL: self._buffered_inputs replaced once the new batch is made
        buffer.inputs = generated
        phase(TRAINING)
        step_inputs = {key: value[:rows] for key, value in generated.items()}  # split_tensor_dict: views
        return _compute_loss(model, trainer, autocasts, log_probs, **step_inputs)

    return forward


def _forward_parameters(model: Any) -> Any:
    import inspect

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return inspect.signature(base.forward).parameters


def _supports_logits_to_keep(model: Any) -> bool:
    return "logits_to_keep" in _forward_parameters(model)


def emulated_generate(model: Any, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                      completion: int) -> torch.Tensor:
    """transformers' ``generate`` (``_sample``) of ``completion`` tokens after the prompts, under
    no_grad, at a fixed length (module docstring): the prompt + completion ids [rows, seq_len]."""
    import torch
    from transformers import DynamicCache

    rows, prompt = prompt_ids.shape
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    cache = DynamicCache(config=base.config)
    # transformers 5.24 names the cache argument ``cache`` (``past_key_values`` before)
    name = "cache" if "cache" in _forward_parameters(model) else "past_key_values"
    keep: dict[str, Any] = {"use_cache": True, name: cache}
    if _supports_logits_to_keep(model):
        keep["logits_to_keep"] = 1
    outputs = model(input_ids=prompt_ids, attention_mask=prompt_mask, **keep)  # the prefill: the prompt
    input_ids = _sample(outputs, prompt_ids)  # the first completion token
    mask = prompt_mask
    if completion > 1:
        if completion > 2:  # the decode steps before the last: the cache grown at once
            _grow(cache, prompt + completion - 2, base.config)
            # filled, not empty: on a real device the last step reads them (an id out of the
            # vocabulary or a NaN key fails the step), at the same sizes as generate's
            grown = input_ids.new_zeros((rows, prompt + completion - 1))
            grown[:, :prompt + 1] = input_ids
            input_ids = grown
            grown = mask.new_ones((rows, prompt + completion - 2))
            grown[:, :prompt] = mask
            mask = grown
            del grown
        mask = torch.cat([mask, mask.new_ones((rows, 1))], dim=-1)  # _update_model_kwargs_for_generation
        # the last decode step: the cache grows to prompt + completion - 1 tokens
        outputs = model(input_ids=input_ids[:, -1:], attention_mask=mask, **keep)
        input_ids = _sample(outputs, input_ids)
    del cache, outputs, mask, keep
    return input_ids


def _sample(outputs: Any, input_ids: torch.Tensor) -> torch.Tensor:
    """One token of ``_sample``: the last logits copied to float32, their softmax, multinomial
    sampling, ``input_ids`` grown by a column (temperature, top_p, top_k at GRPOConfig's defaults add
    no logits processor)."""
    import torch

    logits = outputs.logits[:, -1].to(copy=True, dtype=torch.float32)
    probs = torch.softmax(logits, dim=-1)
    next_tokens = torch.multinomial(probs, num_samples=1).squeeze(1)
    del logits, probs
    return torch.cat([input_ids, next_tokens[:, None]], dim=-1)


def _grow(cache: Any, tokens: int, config: Any) -> None:
    """Every layer's keys and values grown to ``tokens`` as the decode steps' ``torch.cat`` leave them
    (a sliding-window layer keeps a view of its last window - 1 tokens on a window-long block)."""
    from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

    for layer in cache.layers:
        if type(layer) not in (DynamicLayer, DynamicSlidingWindowLayer):
            raise InvalidInput(f"GRPO's generation with {type(layer).__name__} cache layers "
                               f"({getattr(config, 'model_type', '?')}) is not modelled")
        window = getattr(layer, "sliding_window", None)
        length = tokens if window is None else min(tokens, window)
        for name in ("keys", "values"):
            old = getattr(layer, name)
            grown = old.new_zeros((*old.shape[:2], length, old.shape[-1]))  # finite: read on a GPU
            setattr(layer, name, grown if window is None or tokens < window else grown[:, :, 1 - window:, :])
            del old
        if window is not None:
            layer.cumulative_length = tokens


def _generate_and_score(model: Any, reference: Any, trainer: Trainer, autocasts: bool, log_probs: LogProbs,
                        rows: int, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor
                        ) -> dict[str, torch.Tensor]:
    """``_generate_and_score_completions`` (module docstring): the scored generation batch."""
    import torch

    generation_rows_, prompt = prompt_ids.shape
    completion = trainer.max_completion_length
    with torch.no_grad():
        if trainer.vllm_mode is None:
            sequences = emulated_generate(model, prompt_ids, prompt_mask, completion)
            completion_ids = sequences[:, prompt:]
            is_eos = completion_ids == 0  # the end-of-sequence mask, then the ids go to Python lists
            del sequences, completion_ids, is_eos
        # the lists padded into tensors again (pad(...).to(device)), then the prompt + completion
        found: dict[str, torch.Tensor] = {
            "prompt_ids": prompt_ids.clone(), "prompt_mask": prompt_mask.clone(),
            "completion_ids": prompt_ids.new_zeros((generation_rows_, completion)),
            "completion_mask": prompt_ids.new_ones((generation_rows_, completion)),
            "advantages": torch.zeros(generation_rows_, dtype=torch.float32, device=prompt_ids.device)}
        input_ids = torch.cat([found["prompt_ids"], found["completion_ids"]], dim=1)
        attention_mask = torch.cat([found["prompt_mask"], found["completion_mask"]], dim=1)
        if trainer.vllm_mode is not None:  # vllm_importance_sampling_correction: the policy's old log-probs
            found["old_per_token_logps"] = _per_token_logps(model, autocasts, log_probs, input_ids,
                                                            attention_mask, completion, rows)[0]
            found["importance_sampling_ratio"] = torch.exp(found["old_per_token_logps"])
        if trainer.beta != 0.0:  # trainers.check_trainer: never with EBFT, whose ``reference`` is its network
            with _reference_forward(model, reference) as ref_model:  # already under no_grad
                found["ref_per_token_logps"] = _per_token_logps(ref_model, autocasts, log_probs, input_ids,
                                                                attention_mask, completion, rows)[0]
        if trainer.name == EBFT:  # _calculate_rewards: EBFT's feature network (workload/ebft.py)
            from autotune.workload.ebft import feature_rewards

            feature_rewards(model, reference, trainer, input_ids, attention_mask)
        del input_ids, attention_mask
        # shuffle_sequence_dict: each tensor indexed by a permutation (a copy), the originals let go
        permutation = torch.zeros(generation_rows_, dtype=torch.long, device=prompt_ids.device)
        return {key: value[permutation] for key, value in found.items()}


def _per_token_logps(model: Any, autocasts: bool, log_probs: LogProbs, input_ids: torch.Tensor,
                     attention_mask: torch.Tensor, logits_to_keep: int, batch_size: int, *,
                     compute_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``_get_per_token_logps_and_entropies``: chunks of ``batch_size`` rows, each forward keeping the
    last ``logits_to_keep + 1`` logits, the completion's log-probs and (no_grad) entropies, then
    ``torch.cat`` of the chunks. Temperature 1.0 (GRPOConfig's default) divides in place."""
    import torch

    keep = {"logits_to_keep": logits_to_keep + 1} if _supports_logits_to_keep(model) else {}
    all_logps, all_entropies = [], []
    for start in range(0, input_ids.shape[0], batch_size):
        ids = input_ids[start:start + batch_size]
        outputs = model(input_ids=ids, attention_mask=attention_mask[start:start + batch_size],
                        use_cache=False, **keep)
        logits = _upcast(outputs.logits, autocasts)
        del outputs
        logits = logits[:, :-1, :][:, -logits_to_keep:, :]
        logits.div_(1.0)
        all_logps.append(log_probs.selective_log_softmax(logits, ids[:, -logits_to_keep:]))
        if compute_entropy:
            with torch.no_grad():
                all_entropies.append(log_probs.entropy_from_logits(logits))
        del logits
    logps = torch.cat(all_logps, dim=0)
    del all_logps
    entropies = torch.cat(all_entropies, dim=0) if compute_entropy else None
    return logps, entropies


def _compute_loss(model: Any, trainer: Trainer, autocasts: bool, log_probs: LogProbs,
                  **inputs: torch.Tensor) -> torch.Tensor:
    """``GRPOTrainer._compute_loss``, loss_type dapo (the default; grpo, bnpo, dr_grpo allocate the
    same [batch, completion] tensors)."""
    import torch

    completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
    input_ids = torch.cat([inputs["prompt_ids"], completion_ids], dim=1)
    attention_mask = torch.cat([inputs["prompt_mask"], completion_mask], dim=1)
    per_token_logps, entropies = _per_token_logps(model, autocasts, log_probs, input_ids, attention_mask,
                                                  completion_ids.shape[1], input_ids.shape[0],
                                                  compute_entropy=True)
    del input_ids, attention_mask, entropies
    advantages = inputs["advantages"].unsqueeze(1)
    old = inputs.get("old_per_token_logps")
    old = per_token_logps.detach() if old is None else old
    coef_1 = torch.exp(per_token_logps - old)
    coef_2 = torch.clamp(coef_1, 1 - 0.2, 1 + 0.2)  # GRPOConfig epsilon 0.2
    per_token_loss = -torch.min(coef_1 * advantages, coef_2 * advantages)
    if "importance_sampling_ratio" in inputs:
        per_token_loss = per_token_loss * inputs["importance_sampling_ratio"]
    if trainer.beta != 0.0:
        ref = inputs["ref_per_token_logps"]
        per_token_kl = torch.exp(ref - per_token_logps) - (ref - per_token_logps) - 1
        per_token_loss = per_token_loss + trainer.beta * per_token_kl
    return (per_token_loss * completion_mask).sum() / completion_mask.sum().clamp(min=1.0)


def _upcast(logits: torch.Tensor, autocasts: bool) -> torch.Tensor:
    """accelerate's ``convert_outputs_to_fp32`` of a 16-bit output under mixed precision."""
    import torch

    return logits.float() if autocasts and logits.dtype in (torch.float16, torch.bfloat16) else logits


@contextlib.contextmanager
def _reference_forward(model: Any, reference: Any) -> Iterator[Any]:
    """The reference's log-probs: a frozen copy, or ``use_adapter(model, None)`` (the adapter disabled)."""
    if reference is not None:
        yield reference
    else:
        with model.disable_adapter():
            yield model
