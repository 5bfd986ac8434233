"""Axolotl's ``plugins: axolotl.integrations.diffusion.DiffusionPlugin`` and its ``diffusion:`` block, read
as Axolotl's source at the mirror's HEAD (067b021c) has them: src/axolotl/integrations/diffusion/ (plugin.py
``get_trainer_cls`` gives the trainer builder DiffusionTrainer; args.py DiffusionConfig, the block's keys
and defaults; trainer.py the step, modelled as the loss ``diffusion``: workload/diffusion.py).
"""

from __future__ import annotations

from typing import Any

from autotune.configs.reading import Config, unset
from autotune.errors import JobFails
from autotune.workload.diffusion import ATTENTIONS, DIFFUSION

DIFFUSION_PLUGIN = "axolotl.integrations.diffusion.DiffusionPlugin"
# args.py DiffusionConfig's fields, and what each does in training. The step reads eps (a scalar of the
# noise), importance_weighting and mask_token_id (trainer.py); the generation_* keys, generate_samples and
# num_generation_samples act between steps (callbacks.py); noise_schedule, min_mask_ratio, max_mask_ratio
# and num_diffusion_steps are read by nothing in training (num_diffusion_steps by `axolotl inference`).
_NO_EFFECT = {
    "noise_schedule": "read by nothing in training (args.py only)",
    "min_mask_ratio": "read by nothing in training (args.py only)",
    "max_mask_ratio": "read by nothing in training (args.py only)",
    "num_diffusion_steps": "read by `axolotl inference` alone (cli/utils/diffusion.py)",
    "eps": "the masking probability's floor, a scalar (trainer.py _forward_process)",
    "mask_token_str": "the mask token's string, read where mask_token_id is unset or not a token",
}
_GENERATION = ("generate_samples", "generation_interval", "num_generation_samples", "generation_steps",
               "generation_temperature", "generation_max_length")
_KEYS = (*_NO_EFFECT, "importance_weighting", "mask_token_id", *_GENERATION)
GENERATION_NOTE = (
    "diffusion.generate_samples: true (the default): every generation_interval steps, after the optimizer "
    "step and zero_grad, the plugin generates num_generation_samples samples under torch.no_grad, one row "
    "at a time of at most sequence_len tokens (callbacks.py on_step_end, generation.py generate): less than "
    "the training step, no peak of its own")
STEP_NOTE = (
    "plugins: DiffusionPlugin: Axolotl's DiffusionTrainer step (integrations/diffusion/trainer.py, copied "
    "and traced: workload/diffusion.py): the input's tokens masked at random, the model's forward on them "
    "under a bidirectional [batch, 1, seq, seq] bool mask, no labels; the logits and their shifted copy, "
    "the masked tokens' logits gathered and upcast to float32 for a cross-entropy weighted by 1/p_mask; "
    "modelled at the worst step, every token but padding masked (a timestep near 1)")


def read_diffusion(cfg: Config, plugins: list[str], attn: str | None, loss: str | None) -> str | None:
    """The loss of the step (``diffusion`` with the plugin listed, else None); the ``diffusion:``
    block's keys read, an unknown one refused by name. ``attn``: the config's attention (None: the
    default, sdpa); ``loss``: the loss another key sets (cut_cross_entropy, Liger's)."""
    block = cfg.get("diffusion")
    if DIFFUSION_PLUGIN not in plugins:
        if not unset(block):
            cfg.notes.append("diffusion: no effect without the DiffusionPlugin listed (its args join the "
                             "schema only with the plugin: args.py DiffusionArgs)")
        return None
    block = {} if block is None else block
    if not isinstance(block, dict):
        raise cfg.bad("diffusion", block, "a mapping of the plugin's keys (args.py DiffusionConfig)")
    unknown = sorted(set(block) - set(_KEYS))
    if unknown:
        raise cfg.unmodelled(f"diffusion.{unknown[0]}", block[unknown[0]], "not a key of the plugin's "
                             f"DiffusionConfig (args.py: {', '.join(_KEYS)})")
    _check_values(cfg, block)
    if attn is not None and attn not in ATTENTIONS:
        raise cfg.unmodelled("attn_implementation", attn, "with the DiffusionPlugin, whose step passes a 4D "
                             "bidirectional mask [batch, 1, seq, seq] to the model (utils.py "
                             "create_bidirectional_attention_mask; its README: \"Any models that support 4D "
                             f"attention masks\"), modelled with {' or '.join(ATTENTIONS)} attention, which "
                             "take it as is")
    if loss is not None:
        key = "cut_cross_entropy" if loss == "cce" else "liger_fused_linear_cross_entropy"
        raise cfg.unmodelled(key, True, "beside the DiffusionPlugin, whose trainer calls the model without "
                             "labels and computes its own loss over the logits (trainer.py "
                             "_compute_diffusion_loss): the two together are not modelled")
    for key in ("rl", "reward_model"):
        if not unset(cfg.data.get(key)):
            raise cfg.unmodelled(key, cfg.data[key], "beside the DiffusionPlugin, whose DiffusionTrainer "
                                 "(get_trainer_cls) is a supervised trainer: not modelled")
    cfg.notes.append(STEP_NOTE)
    _notes(cfg, block)
    return DIFFUSION


def _check_values(cfg: Config, block: dict[str, Any]) -> None:
    """args.py's validation of the values that matter here (DiffusionConfig's bounds and
    ``_validate_mask_ratios``), so that Axolotl's refusal of the file is autotune's too."""
    low, high = (_ratio(cfg, block, key, default) for key, default in (("min_mask_ratio", 0.1),
                                                                          ("max_mask_ratio", 0.9)))
    _ratio(cfg, block, "eps", 1e-3)
    if low > high:
        raise JobFails(f"diffusion.min_mask_ratio {low} above max_mask_ratio {high} in {cfg.file!r}: "
                       "Axolotl refuses it (args.py _validate_mask_ratios: \"min_mask_ratio must be ≤ "
                       "max_mask_ratio\")")
    for key in ("importance_weighting", "generate_samples"):
        if key in block and not isinstance(block[key], bool):
            raise cfg.bad(f"diffusion.{key}", block[key], "true or false")
    mask = block.get("mask_token_id")
    if mask is not None and (isinstance(mask, bool) or not isinstance(mask, int)):
        raise cfg.bad("diffusion.mask_token_id", mask, "a token id")


def _ratio(cfg: Config, block: dict[str, Any], key: str, default: float) -> float:
    """A float field of DiffusionConfig from 0 to 1, as pydantic takes it: a number, or a string of one
    (YAML 1.1 reads ``eps: 1e-3``, the examples' spelling, as a string; pydantic's lax mode converts it)."""
    value = block.get(key, default)
    try:
        number = float(value) if not isinstance(value, bool) else None
    except (TypeError, ValueError):
        number = None
    if number is None or not 0.0 <= number <= 1.0:
        raise cfg.bad(f"diffusion.{key}", value, "a number from 0 to 1 (args.py DiffusionConfig)")
    return number


def _notes(cfg: Config, block: dict[str, Any]) -> None:
    mask = block.get("mask_token_id")
    if mask is None or mask < 0:
        cfg.notes.append("diffusion.mask_token_id: not set: the plugin takes mask_token_str (default "
                         "'<|diffusion_mask|>') where the tokenizer has it as a special token, else adds it "
                         "and resizes the embeddings to the tokenizer's length (utils.py "
                         "resolve_mask_token_id): one row more at most, as tokens: adds them")
    else:
        cfg.notes.append(f"diffusion.mask_token_id: {mask}: a token of the tokenizer's (utils.py "
                         "resolve_mask_token_id: used as is below its vocab_size, else a token added as "
                         "where it is unset: one embedding row more at most)")
    if block.get("importance_weighting") is False:
        cfg.notes.append("diffusion.importance_weighting: false: traced as true, one float32 vector of the "
                         "masked tokens more (the division by p_mask: a few KiB)")
    if block.get("generate_samples", True):
        cfg.notes.append(GENERATION_NOTE)
    set_keys = [key for key in _NO_EFFECT if key in block]
    if set_keys:
        cfg.notes.append(f"diffusion.{', diffusion.'.join(set_keys)}: no effect on memory ("
                         + "; ".join(f"{key}: {_NO_EFFECT[key]}" for key in set_keys) + ")")
