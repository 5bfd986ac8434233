"""The trainers whose step autotune models, and their settings: part of a Workload's identity.

``sft`` is supervised fine-tuning (workload/step.py: the model's own loss); the preference trainers
(``dpo``, ``orpo``, ``simpo``, ``reward``) are TRL's, their step in workload/preference.py. ``kto``
and ``grpo`` are known names, refused until their steps are modelled.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autotune.errors import InvalidInput

SFT, DPO, ORPO, SIMPO, KTO, REWARD, GRPO = "sft", "dpo", "orpo", "simpo", "kto", "reward", "grpo"
TRAINERS = (SFT, DPO, ORPO, SIMPO, KTO, REWARD, GRPO)
MODELLED = (SFT, DPO, ORPO, SIMPO, REWARD)
PAIRED = (DPO, ORPO, SIMPO, REWARD)  # a sample is a pair: chosen and rejected rows in one forward
# TRL's trainer class of each (what the output names).
TRL_CLASSES = {SFT: "SFTTrainer", DPO: "DPOTrainer", ORPO: "ORPOTrainer",
               SIMPO: "CPOTrainer (loss_type simpo)", KTO: "KTOTrainer", REWARD: "RewardTrainer",
               GRPO: "GRPOTrainer"}
REWARD_TASK = "sequence-classification"
NOT_YET = {
    KTO: "KTO is not modelled yet (its step adds a KL batch of mismatched completions and a reference "
         "forward over both)",
    GRPO: "GRPO is not modelled yet (its step generates num_generations completions per prompt, with a "
          "KV cache or a vLLM engine, before the training step)",
}
# TRL's DPOConfig loss_type values whose loss is computed on [batch] vectors only
# (DPOTrainer._compute_loss): the same memory as sigmoid. "sft" adds a cross-entropy over the chosen
# logits and is not modelled.
DPO_LOSS_TYPES = ("sigmoid", "hinge", "ipo", "exo_pair", "nca_pair", "robust", "bco_pair", "sppo_hard",
                  "aot", "aot_unpaired", "apo_zero", "apo_down", "discopop", "sigmoid_norm")


@dataclass(frozen=True)
class Trainer:
    """The trainer whose step is modelled (``name``, one of MODELLED), and its memory settings."""

    name: str = SFT
    # DPO: the reference's log-probs computed before training (DPOConfig.precompute_ref_log_probs):
    # no reference forward, nor model, in the step.
    precompute_ref_log_probs: bool = False
    # SimPO (CPOTrainer): the NLL on the chosen rows is computed where cpo_alpha != 0 (CPOConfig's
    # default 1.0); ORPO always computes it.
    chosen_nll: bool = True

    @property
    def paired(self) -> bool:
        return self.name in PAIRED

    @property
    def rows_per_sample(self) -> int:
        return 2 if self.paired else 1

    def reference(self, peft: bool) -> str | None:
        """What gives the reference log-probs: "frozen copy", "adapter disabled", "precomputed"; None
        where the trainer has no reference."""
        if self.name != DPO:
            return None
        if self.precompute_ref_log_probs:
            return "precomputed"
        return "adapter disabled" if peft else "frozen copy"

    def to_json(self, peft: bool) -> dict[str, Any]:
        return {"name": self.name, "trl_class": TRL_CLASSES[self.name],
                "rows_per_sample": self.rows_per_sample,
                "precompute_ref_log_probs": self.precompute_ref_log_probs,
                "reference": self.reference(peft), "chosen_nll": self.chosen_nll if self.name == SIMPO else
                self.name == ORPO, "label": self.label(peft)}

    def label(self, peft: bool) -> str:
        """One line: the trainer, what a sample is, and the reference."""
        words = f"{self.name} ({TRL_CLASSES[self.name]})"
        if self.paired:
            words += "; batch = pairs: chosen+rejected, 2 rows each"
        reference = self.reference(peft)
        if reference == "frozen copy":
            words += "; reference: a frozen copy of the model in the weights' dtype, forward under no_grad"
        elif reference == "adapter disabled":
            words += "; reference: the same model with its adapter disabled, forward under no_grad"
        elif reference == "precomputed":
            words += "; reference: log-probs precomputed (no reference forward)"
        elif self.name in (ORPO, SIMPO):
            nll = self.name == ORPO or self.chosen_nll
            words += "; no reference model" + ("; NLL on the chosen rows" if nll else "")
        return words


def check_trainer(name: str | None, *, precompute_ref_log_probs: bool | None = None,
                  chosen_nll: bool | None = None) -> Trainer | None:
    """The Trainer asked for; None for sft (the supervised step). InvalidInput naming the field."""
    trainer = (name or SFT).strip().lower()
    if trainer not in TRAINERS:
        raise InvalidInput(f"unknown trainer {name!r}: allowed are {', '.join(TRAINERS)}")
    if trainer in NOT_YET:
        raise InvalidInput(NOT_YET[trainer])
    if precompute_ref_log_probs and trainer != DPO:
        error = InvalidInput.naming(f"{{precompute_ref_log_probs}} is DPO's (a reference model's log-probs); "
                                    f"trainer {trainer} has none")
        error.field = "precompute_ref_log_probs"
        raise error
    if chosen_nll is not None and trainer != SIMPO:
        error = InvalidInput.naming(f"{{chosen_nll}} is SimPO's (CPOConfig cpo_alpha); trainer {trainer} "
                                    + ("always adds it" if trainer == ORPO else "has none"))
        error.field = "chosen_nll"
        raise error
    if trainer == SFT:
        return None
    return Trainer(trainer, bool(precompute_ref_log_probs), True if chosen_nll is None else chosen_nll)


def check_step(trainer: Trainer, task: str, *, loss: str, liger: tuple[str, ...], parallel: Any,
               images: Any) -> None:
    """Refuse, naming the field, what a preference step is not modelled with."""
    needed = REWARD_TASK if trainer.name == REWARD else "causal-lm"
    if task != needed:
        raise _field("task", f"trainer {trainer.name} trains a {needed} model, not {task}")
    if loss != "full" or liger:
        raise _field("loss" if loss != "full" else "liger",
                     f"trainer {trainer.name} with Liger's kernels (TRL's use_liger_kernel: its fused "
                     "DPO/ORPO losses) is not modelled: leave {loss} and {liger} out")
    if parallel is not None:
        raise _field("gpus", f"trainer {trainer.name} on more than one GPU is not modelled yet: the answer "
                     "would be one GPU's, without its reference model sharded")
    if images is not None:
        raise _field("task", f"trainer {trainer.name} over a vision-language model is not modelled yet")


def _field(name: str, template: str) -> InvalidInput:
    error = InvalidInput.naming(template)
    error.field = name
    return error


def reward_config(config: Any) -> Any:
    """The config RewardTrainer builds its model from: ``num_labels=1`` (reward_trainer.py
    ``model_init_kwargs["num_labels"] = 1``: one score per sequence)."""
    import copy

    config = copy.deepcopy(config)
    config.num_labels = 1
    return config


