"""LLaMA-Factory's preference stages (``stage: dpo``, ``stage: kto``) and its reward model (``stage: rm``)
as the trainer autotune models, run as LLaMA-Factory's own trainers run it
(workload/llamafactory_preference.py, workload/value_head.py); ``ppo`` refused by name.

Paths are LLaMA-Factory's (src/llamafactory/): hparams/finetuning_args.py ``RLHFArguments`` and
``FinetuningArguments.__post_init__`` (``use_ref_model``), train/dpo/workflow.py ``run_dpo``,
train/kto/workflow.py ``run_kto``, train/rm/workflow.py ``run_rm``, train/trainer_utils.py
``create_ref_model``.
"""

from __future__ import annotations

from typing import Any

from autotune.configs.reading import Config, note_set_keys, unset, words
from autotune.errors import InvalidInput, JobFails
from autotune.workload.trainers import DPO, KTO, ORPO, REWARD, SIMPO

PREFERENCE_STAGES = ("dpo", "kto", "rm")
# finetuning_args.py RLHFArguments.pref_loss; CustomDPOTrainer calls TRL 0.24's dpo_loss without its
# loss_type argument (dpo_trainer.py: default "sigmoid"), so sigmoid, hinge, ipo and kto_pair all
# compute the sigmoid loss (ipo averaging the log-probs first): [batch] vectors either way.
_PREF_LOSSES = {"sigmoid": DPO, "hinge": DPO, "ipo": DPO, "kto_pair": DPO, "orpo": ORPO, "simpo": SIMPO}
REFUSED_STAGES = {
    "ppo": "PPO (train/ppo: generation, a value head, a reward model) is not modelled",
}
# Keys of the loss on [batch] vectors: no effect on memory.
_VECTOR_KEYS = words("pref_beta pref_ftx pref_bco_weight dpo_label_smoothing simpo_gamma kto_chosen_weight "
                     "kto_rejected_weight")
_LIGER = ("Liger's kernels under a preference stage (apply_liger_kernel with require_logits: no fused loss) "
          "are not modelled: autotune models the preference step without them")


def read_lf_preference(cfg: Config, stage: str, full: bool) -> dict[str, Any]:
    """The request's trainer fields of ``stage`` (dpo, kto or rm), its keys that change memory and are
    not modelled refused by name, the others noted."""
    cfg.read.update(_VECTOR_KEYS | {"pref_loss", "ref_model", "ld_alpha"})
    for key in ("enable_liger_kernel", "use_liger_kernel"):
        if cfg.flag(key):
            raise cfg.unmodelled(key, True, _LIGER)
    if stage == "rm":
        return _reward(cfg)
    trainer = KTO if stage == KTO else _dpo_trainer(cfg)
    reference = trainer in (DPO, KTO)  # use_ref_model for dpo; run_kto always creates one
    ref_model = cfg.get("ref_model")
    if reference and not unset(ref_model):
        raise cfg.unmodelled("ref_model", ref_model, "a reference loaded from another checkpoint "
                             "(create_ref_model) is not modelled: autotune models the model's own")
    if cfg.flag("pissa_init") and (reference or stage == KTO):  # finetuning_args.py __post_init__
        raise JobFails(f"pissa_init in {cfg.file!r} with stage {stage}: LLaMA-Factory refuses PiSSA "
                       "beside a reference model ('Cannot use PiSSA for current training stage.')")
    if cfg.get("packing"):
        cfg.notes.append(f"packing: true: stage {stage}'s rows are not packed (data/loader.py "
                         "_get_preprocessor packs for pt and sft): no effect")
    which = ("LLaMA-Factory's CustomKTOTrainer (train/kto/trainer.py)" if trainer == KTO else
             f"LLaMA-Factory's CustomDPOTrainer (train/dpo/trainer.py){_LOSS_WORDS.get(trainer, '')}")
    if trainer == KTO:
        batch = ("the batch is examples (a prompt + completion, desirable or undesirable: kto_tags), 1 row "
                 "each, with a KL batch of as many rows (each prompt with another example's completion, "
                 "KTODataCollatorWithPadding) under no_grad")
    else:
        batch = ("the batch is pairs: chosen then rejected rows, 2 x batch rows in one forward "
                 "(PairwiseDataCollatorWithPadding)")
    ref = ("none (use_ref_model false for pref_loss orpo and simpo)" if not reference else
           "a frozen copy loaded again in the checkpoint's dtype (create_ref_model), forward under no_grad"
           if full else "the model with its LoRA adapter disabled (create_ref_model returns None), forward "
           "under no_grad")
    cfg.notes.append(f"stage: {stage}: {which}, cutoff_len its longest row; {batch}; float32 logits and "
                     "their whole log_softmax (trainer_utils.py get_batch_logps) held for the backward; "
                     f"reference: {ref}")
    note_set_keys(cfg, _VECTOR_KEYS, "the preference loss's")
    return {"trainer": trainer, "llamafactory": True}


def _reward(cfg: Config) -> dict[str, Any]:
    """stage rm: train/rm/workflow.py ``run_rm`` (workload/value_head.py); the preference keys are
    DPO's and KTO's, which run_rm does not read."""
    if cfg.get("packing"):
        cfg.notes.append("packing: true: stage rm's rows are not packed (data/loader.py _get_preprocessor "
                         "packs for pt and sft): no effect")
    cfg.notes.append("stage: rm: LLaMA-Factory's PairwiseTrainer (train/rm/trainer.py) over TRL 0.24's "
                     "AutoModelForCausalLMWithValueHead (loader.py load_model(add_valuehead=True), after the "
                     "adapter), cutoff_len its longest row; the batch is pairs: chosen then rejected rows, "
                     "2 x batch rows in one forward (PairwiseDataCollatorWithPadding), their labels reaching "
                     "the LM: the logits over every position, their float32 copy and the LM's loss computed "
                     "and dropped; a float32 value head (dropout 0.1, Linear(hidden, 1)) on the last hidden "
                     "state, trained; the pairwise loss on each row's last token's value; dropout kept "
                     "(transformers' Trainer); no reference model")
    note_set_keys(cfg, _VECTOR_KEYS | {"pref_loss", "ref_model", "ld_alpha"},
                  "DPO's and KTO's, which run_rm does not read")
    return {"trainer": REWARD, "llamafactory": True}


_LOSS_WORDS = {ORPO: ", pref_loss orpo: ORPO's odds ratio on the averaged log-probs",
               SIMPO: ", pref_loss simpo: SimPO on the averaged log-probs"}


def _dpo_trainer(cfg: Config) -> str:
    """pref_loss as CustomDPOTrainer computes it: orpo and simpo without a reference, the others DPO's
    sigmoid with the reference (module constants)."""
    loss = cfg.get("pref_loss")
    if loss is None:
        loss = "sigmoid"  # RLHFArguments.pref_loss
        cfg.notes.append("pref_loss: not set, LLaMA-Factory's default sigmoid")
    if loss not in _PREF_LOSSES:
        raise cfg.bad("pref_loss", loss, f"one of {', '.join(_PREF_LOSSES)}")
    smoothing = cfg.get("dpo_label_smoothing")
    if loss != "sigmoid" and isinstance(smoothing, int | float) and smoothing > 1e-6:  # __post_init__
        raise InvalidInput(f"dpo_label_smoothing in {cfg.file!r} with pref_loss {loss}: LLaMA-Factory takes "
                           "it for the sigmoid loss only")
    if not unset(cfg.get("ld_alpha")):
        raise cfg.unmodelled("ld_alpha", cfg.data["ld_alpha"], "LD-DPO's masks over the policy's log-probs "
                             "(trainer_utils.py get_batch_logps) are not modelled")
    if loss in ("hinge", "ipo", "kto_pair"):
        cfg.notes.append(f"pref_loss: {loss}: CustomDPOTrainer calls TRL 0.24's dpo_loss without loss_type, "
                         "its default sigmoid: a loss on [batch] vectors")
    return _PREF_LOSSES[loss]
