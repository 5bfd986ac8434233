"""GRPOConfig's ``generation_kwargs`` and ``chat_template_kwargs`` (TRL 1.8.0, Axolotl's pin).

``generation_kwargs`` updates the keyword arguments of every generation, overriding GRPOConfig's own
(trl/trainer/grpo_config.py): vLLM's ``SamplingParams(**generation_kwargs)`` after ``n``,
``max_tokens`` = max_completion_length, ``logprobs`` 0 ... (trl/generation/vllm_generation.py, colocate;
a server gets them through vllm_client.py ``generate(generation_kwargs=...)``, Axolotl's
scripts/vllm_serve_lora.py ``generation_kwargs.update(request.generation_kwargs)``), or transformers'
``GenerationConfig(**generation_kwargs)`` after ``max_new_tokens`` = max_completion_length
(grpo_trainer.py ``__init__``). autotune models every completion max_completion_length tokens long,
the rows padded to the longest (grpo_trainer.py ``_generate_and_score_completions``): keys that can
only end a completion earlier, or pick which tokens are sampled, leave that worst case the bound.
Any other key can change what comes back (``n``, ``best_of``, ``logprobs`` counts, a longer
``max_tokens``) or how transformers generates (``num_beams``, ``output_scores``, a cache): refused by
name.

``chat_template_kwargs`` goes to ``apply_chat_template`` of the prompts (grpo_trainer.py
``_tokenize_prompts``): the prompt's text, within the rows' length either way.
"""

from __future__ import annotations

from typing import Any

from autotune.configs.reading import Config, words

# SamplingParams (vllm/sampling_params.py) and GenerationConfig keys that can only end a completion
# before max_tokens / max_new_tokens: a stop string or token, or which tokens count as its end.
_STOPS = words("stop stop_token_ids stop_strings eos_token_id include_stop_str_in_output")
# Keys that pick which tokens are sampled, never how many: GRPOConfig's own sampling keys, which
# generation_kwargs overrides, and vLLM's penalties and seed.
_SAMPLING = words("temperature top_p top_k min_p repetition_penalty presence_penalty frequency_penalty seed "
                  "do_sample")
# Lengths: at most max_completion_length keeps the bound; ignore_eos makes every completion that long.
_LENGTHS = words("max_tokens max_new_tokens min_tokens min_new_tokens")


def read_generation_kwargs(cfg: Config, key: str, value: Any, completion: int) -> None:
    """``value`` of ``key`` (GRPOConfig's generation_kwargs) accepted with a note where it keeps every
    completion at most ``completion`` (max_completion_length) tokens; otherwise refused by name."""
    if value is None or value == {}:
        return
    if not isinstance(value, dict):
        raise cfg.bad(key, value, "a mapping of SamplingParams / GenerationConfig keys")
    for name, given in value.items():
        if name in _LENGTHS and not (isinstance(given, int) and not isinstance(given, bool)
                                     and 0 <= given <= completion):
            raise cfg.unmodelled(f"{key}.{name}", given, f"a completion length other than at most "
                                 f"max_completion_length {completion} (the modelled completion length)")
        if name == "ignore_eos" and not isinstance(given, bool):
            raise cfg.bad(f"{key}.{name}", given, "true or false")
        if name not in _STOPS | _SAMPLING | _LENGTHS | {"ignore_eos"}:
            raise cfg.unmodelled(f"{key}.{name}", given, "a generation setting that can change what a "
                                 "generation returns or holds (autotune models completions of "
                                 "max_completion_length tokens, one per row: keys that stop them "
                                 "earlier or pick their tokens are read)")
    cfg.notes.append(f"{key}: {', '.join(sorted(value))}: at most stops completions earlier or picks their "
                     f"tokens (SamplingParams / GenerationConfig, updated over GRPOConfig's): every "
                     f"completion max_completion_length {completion} tokens long, TRL padding to the "
                     "longest, stays the modelled bound")


def read_chat_template_kwargs(cfg: Config, key: str, value: Any) -> None:
    """GRPOConfig's chat_template_kwargs: noted (module docstring)."""
    if value is None or value == {}:
        return
    if not isinstance(value, dict):
        raise cfg.bad(key, value, "a mapping of apply_chat_template keyword arguments")
    cfg.notes.append(f"{key}: {', '.join(sorted(value))}: apply_chat_template's arguments for the prompts "
                     "(grpo_trainer.py _tokenize_prompts): the prompt's text, each row still sequence_len "
                     "tokens at most: no effect on memory")
