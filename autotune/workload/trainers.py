"""The trainers whose step autotune models, and their settings: part of a Workload's identity.

``sft`` is supervised fine-tuning (workload/step.py: the model's own loss); the preference trainers
(``dpo``, ``orpo``, ``simpo``, ``kto``, ``reward``) are TRL's, their step in workload/preference.py;
``grpo`` is TRL's GRPOTrainer, its generation and training step in workload/grpo.py; ``ebft`` is
Axolotl's AxolotlEBFTTrainer (EBFT's structured mode), GRPO's step with a feature network's forward
as its reward (workload/ebft.py).
LLaMA-Factory's own trainers (``recipe`` LLAMAFACTORY: CustomDPOTrainer for dpo, orpo and simpo,
CustomKTOTrainer for kto) run their step otherwise: workload/llamafactory_preference.py; its reward
model (PairwiseTrainer, stage rm) is the causal LM with a value head: workload/value_head.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from autotune.errors import InvalidInput
from autotune.workload.vision import IMAGE_TEXT_TO_TEXT

SFT, DPO, ORPO, SIMPO, KTO, REWARD, GRPO = "sft", "dpo", "orpo", "simpo", "kto", "reward", "grpo"
EBFT = "ebft"
TRAINERS = (SFT, DPO, ORPO, SIMPO, KTO, REWARD, GRPO, EBFT)
# The trainers that run GRPO's generation and training step, with GRPOConfig's settings (EBFT's
# structured mode subclasses AxolotlGRPOTrainer: axolotl src/axolotl/core/trainers/ebft/trainer.py).
GENERATIVE = (GRPO, EBFT)
MODELLED = TRAINERS
PAIRED = (DPO, ORPO, SIMPO, REWARD)  # a sample is a pair: chosen and rejected rows in one forward
# TRL's trainer class of each (what the output names).
TRL_CLASSES = {SFT: "SFTTrainer", DPO: "DPOTrainer", ORPO: "ORPOTrainer",
               SIMPO: "CPOTrainer (loss_type simpo)", KTO: "KTOTrainer", REWARD: "RewardTrainer",
               GRPO: "GRPOTrainer", EBFT: "Axolotl's AxolotlEBFTTrainer (over TRL's GRPOTrainer)"}
REWARD_TASK = "sequence-classification"
# KTO's autocast regions, the ``phase`` its step calls (preference.py kto_loss, llamafactory_preference.py)
KTO_KL_BATCH, KTO_POLICY = "KL batch", "policy forward"
# Whose trainer runs the step: TRL's (workload/preference.py), or LLaMA-Factory's subclasses of TRL
# 0.24's DPOTrainer and KTOTrainer (src/llamafactory/train/dpo/trainer.py CustomDPOTrainer,
# train/kto/trainer.py CustomKTOTrainer: workload/llamafactory_preference.py), and its reward model:
# transformers' Trainer subclassed (train/rm/trainer.py PairwiseTrainer) over TRL 0.24's
# AutoModelForCausalLMWithValueHead (workload/value_head.py).
TRL, LLAMAFACTORY = "trl", "llamafactory"
LF_CLASSES = {DPO: "CustomDPOTrainer", ORPO: "CustomDPOTrainer (pref_loss orpo)",
              SIMPO: "CustomDPOTrainer (pref_loss simpo)", KTO: "CustomKTOTrainer",
              REWARD: "PairwiseTrainer, value head"}
LF_VALUE_HEAD_CLASS = "AutoModelForCausalLMWithValueHead (TRL 0.24)"
# Trainers known by name whose step is not modelled yet, and why (none today: KTO was the last).
NOT_YET: dict[str, str] = {}
# TRL's KTOConfig loss_type values (kto_config.py). kto_trainer.py __init__: ``calculate_KL =
# args.loss_type not in ["apo_zero_unpaired"]``: the KTO loss runs a KL batch, APO-zero does not.
KTO_LOSS_TYPES = ("kto", "apo_zero_unpaired")
# The trainers with a reference model whose log-probs may be precomputed (DPOConfig, KTOConfig
# precompute_ref_log_probs).
REFERENCED = (DPO, KTO)
# GRPO's generation: transformers' model.generate on the training GPU (None), or TRL's vLLM engine
# (GRPOConfig use_vllm, vllm_mode): "colocate" in the training process on the same GPU, holding
# vllm_gpu_memory_utilization of it; "server" on other GPUs (trl vllm-serve).
VLLM_MODES = ("colocate", "server")
# trl/trainer/grpo_config.py GRPOConfig defaults (TRL main of 2026).
GRPO_NUM_GENERATIONS = 8
GRPO_MAX_COMPLETION_LENGTH = 512  # tokens
GRPO_VLLM_GPU_MEMORY_UTILIZATION = 0.3  # of the GPU's total memory
# GRPOConfig's max_completion_length in TRL 1.8.0 (trl/trainer/grpo_config.py; 512 from TRL #6264),
# the TRL Axolotl pins (pyproject.toml trl==1.8.0): its rl: ebft passes the key only where set.
EBFT_MAX_COMPLETION_LENGTH = 256  # tokens
# EBFT's feature network (axolotl core/trainers/ebft/args.py EBFTFieldsMixin ebft_feature_layers
# default): the hidden states at these fractions of the depth, concatenated.
EBFT_FEATURE_LAYERS = (0.25, 0.5, 0.75)
# TRL's DPOConfig loss_type values whose loss is computed on [batch] vectors only
# (DPOTrainer._compute_loss): the same memory as sigmoid. "sft" adds a cross-entropy over the chosen
# logits and is not modelled.
DPO_LOSS_TYPES = ("sigmoid", "hinge", "ipo", "exo_pair", "nca_pair", "robust", "bco_pair", "sppo_hard",
                  "aot", "aot_unpaired", "apo_zero", "apo_down", "discopop", "sigmoid_norm")


@dataclass(frozen=True)
class Trainer:
    """The trainer whose step is modelled (``name``, one of MODELLED), and its memory settings."""

    name: str = SFT
    # DPO, KTO: the reference's log-probs computed before training (DPOConfig, KTOConfig
    # precompute_ref_log_probs): no reference forward, nor model, in the step.
    precompute_ref_log_probs: bool = False
    # SimPO (CPOTrainer): the NLL on the chosen rows is computed where cpo_alpha != 0 (CPOConfig's
    # default 1.0); ORPO always computes it.
    chosen_nll: bool = True
    # GRPO (GRPOConfig): completions sampled per prompt; each row's completion tokens (the row is the
    # prompt, seq_len - max_completion_length tokens, then the completion); the KL coefficient (0: no
    # reference model); the vLLM engine (VLLM_MODES, None: model.generate) and its share of the GPU;
    # steps_per_generation (generation_batch_size = batch x steps_per_generation completions).
    num_generations: int = GRPO_NUM_GENERATIONS
    max_completion_length: int = GRPO_MAX_COMPLETION_LENGTH
    beta: float = 0.0
    vllm_mode: str | None = None
    vllm_gpu_memory_utilization: float = GRPO_VLLM_GPU_MEMORY_UTILIZATION
    steps_per_generation: int = 1
    # KTO (KTOConfig loss_type, KTO_LOSS_TYPES): "kto" runs the KL batch, "apo_zero_unpaired" not.
    kto_loss_type: str = "kto"
    # TRL or LLAMAFACTORY (LF_CLASSES): whose trainer runs the step.
    recipe: str = TRL

    @property
    def llamafactory(self) -> bool:
        return self.recipe == LLAMAFACTORY

    @property
    def value_head(self) -> bool:
        """LLaMA-Factory's reward model: the causal LM with TRL 0.24's value head (value_head.py)."""
        return self.llamafactory and self.name == REWARD

    @property
    def paired(self) -> bool:
        return self.name in PAIRED

    @property
    def rows_per_sample(self) -> int:
        return 2 if self.paired else 1

    @property
    def kl_batch(self) -> bool:
        """KTO's KL batch: the batch's prompts with mismatched completions, run under no_grad through
        the policy and the reference (kto_trainer.py ``calculate_KL``, ``_compute_kl_logps``)."""
        return self.name == KTO and self.kto_loss_type != "apo_zero_unpaired"

    @property
    def min_batch(self) -> int:
        """The smallest batch the trainer runs: KTOTrainer refuses ``per_device_train_batch_size <= 1``
        with the KL term (kto_trainer.py __init__: "Actual (not effective) batch size must be > 1");
        LLaMA-Factory's CustomKTOTrainer skips KTOTrainer.__init__ (Trainer.__init__ only) and runs any."""
        return 2 if self.kl_batch and not self.llamafactory else 1

    @property
    def batch_multiple(self) -> int:
        """What every batch the trainer runs is a multiple of: GRPO's generation batch (batch x
        steps_per_generation) holds whole groups of num_generations completions (grpo_config.py
        ``__post_init__``: "generation_batch_size ... must be divisible by num_generations"); 1 else."""
        if self.name not in GENERATIVE:
            return 1
        return self.num_generations // math.gcd(self.num_generations, self.steps_per_generation)

    def largest_batch(self, fits: int) -> int:
        """The largest batch up to ``fits`` that the trainer runs (min_batch, batch_multiple); 0: none."""
        largest = fits - fits % self.batch_multiple
        return largest if largest >= self.min_batch else 0

    def why_not_run(self) -> str | None:
        """Why a batch that fits may not be one the trainer runs (largest_batch), in words; None
        where the trainer runs every batch."""
        if self.name in GENERATIVE and self.batch_multiple > 1:
            return (f"GRPO runs whole groups of num_generations {self.num_generations} completions: a batch "
                    f"that is a multiple of {self.batch_multiple} (grpo_config.py __post_init__)")
        if self.min_batch > 1:
            return ("KTOTrainer refuses a per-device batch of 1 with its KL term (kto_trainer.py __init__)")
        return None

    def reference(self, peft: bool) -> str | None:
        """What gives the reference log-probs: "frozen copy", "adapter disabled", "precomputed"; None
        where the trainer has no reference."""
        if self.name in GENERATIVE:  # grpo_trainer.py __init__: ref_model None where beta == 0.0
            return None if self.beta == 0.0 else "adapter disabled" if peft else "frozen copy"
        if self.name not in REFERENCED:
            return None
        if self.precompute_ref_log_probs:
            return "precomputed"
        return "adapter disabled" if peft else "frozen copy"

    def can_precompute_reference(self, peft: bool) -> bool:
        """Whether precompute_ref_log_probs would take a reference out of the step: DPO's and KTO's
        (DPOConfig, KTOConfig); GRPOConfig has no such key, its reference runs in the step."""
        return self.name in REFERENCED and self.reference(peft) not in (None, "precomputed")

    def feature_network(self, peft: bool) -> str | None:
        """EBFT's frozen feature network (axolotl ebft/trainer.py EBFTMixin.__init__): the policy's base
        with its adapter disabled under PEFT ("adapter disabled"), else ``copy.deepcopy`` of the
        unwrapped policy, frozen ("frozen copy"); None for the other trainers."""
        if self.name != EBFT:
            return None
        return "adapter disabled" if peft else "frozen copy"

    @property
    def class_name(self) -> str:
        """The trainer class that runs the step, as the output names it."""
        if self.llamafactory:
            return f"LLaMA-Factory's {LF_CLASSES[self.name]}"
        return TRL_CLASSES[self.name]

    @property
    def colocated_vllm(self) -> bool:
        return self.name in GENERATIVE and self.vllm_mode == "colocate"

    def vllm_bytes(self, total_memory_bytes: int) -> int:
        """A colocated vLLM engine's share of the GPU (GRPOConfig vllm_gpu_memory_utilization: vLLM sizes
        its weights, activations and KV-cache blocks to that fraction of the card's total memory), held
        outside the training step's caching allocator for the whole job; 0 otherwise."""
        return int(total_memory_bytes * self.vllm_gpu_memory_utilization) if self.colocated_vllm else 0

    def to_json(self, peft: bool) -> dict[str, Any]:
        trl_class = LF_VALUE_HEAD_CLASS if self.value_head else TRL_CLASSES[self.name]
        found = {"name": self.name, "trl_class": trl_class, "recipe": self.recipe,
                 "rows_per_sample": self.rows_per_sample,
                 "precompute_ref_log_probs": self.precompute_ref_log_probs,
                 "reference": self.reference(peft), "chosen_nll": False if self.llamafactory else
                 self.chosen_nll if self.name == SIMPO else self.name == ORPO, "label": self.label(peft)}
        if self.name == EBFT:
            found["ebft"] = {"feature_network": self.feature_network(peft),
                             "feature_layers": list(EBFT_FEATURE_LAYERS)}
        if self.name in GENERATIVE:
            found["grpo"] = {"num_generations": self.num_generations,
                             "max_completion_length": self.max_completion_length, "beta": self.beta,
                             "vllm_mode": self.vllm_mode, "steps_per_generation": self.steps_per_generation,
                             "vllm_gpu_memory_utilization":
                                 self.vllm_gpu_memory_utilization if self.colocated_vllm else None}
        if self.name == KTO:
            found["kto"] = {"loss_type": self.kto_loss_type, "kl_batch": self.kl_batch,
                            "min_batch": self.min_batch}
        return found

    def settings(self) -> dict[str, Any]:
        """The trainer's name and the settings that apply to it, as asked (what a stored run keeps:
        api/runs/spec.py); ``Trainer(**settings)`` is the trainer again."""
        found: dict[str, Any] = {"name": self.name}
        if self.name in REFERENCED:
            found["precompute_ref_log_probs"] = self.precompute_ref_log_probs
        if self.name == SIMPO:
            found["chosen_nll"] = self.chosen_nll
        if self.name == KTO:
            found["kto_loss_type"] = self.kto_loss_type
        if self.llamafactory:
            found["recipe"] = self.recipe
        if self.name in GENERATIVE:
            found.update(num_generations=self.num_generations,
                         max_completion_length=self.max_completion_length, beta=self.beta,
                         vllm_mode=self.vllm_mode, steps_per_generation=self.steps_per_generation,
                         vllm_gpu_memory_utilization=self.vllm_gpu_memory_utilization)
        return found

    def label(self, peft: bool) -> str:
        """One line: the trainer, what a sample is, and the reference."""
        words = f"{self.name} ({self.class_name})"
        if self.name in GENERATIVE:
            return words + "; " + self._grpo_words(peft)
        if self.llamafactory:
            return words + "; " + self._llamafactory_words(peft)
        if self.name == KTO:
            words += ("; batch = examples: a prompt + completion labelled desirable or undesirable, 1 row "
                      "each (modelled all of one label, as a paired dataset unpaired runs)")
            words += ("; KL batch: the prompts with mismatched completions, batch rows under no_grad "
                      "through the policy and the reference (batch > 1)" if self.kl_batch else
                      f"; no KL batch (loss_type {self.kto_loss_type})")
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

    def _llamafactory_words(self, peft: bool) -> str:
        """What LLaMA-Factory's step holds (workload/llamafactory_preference.py)."""
        if self.value_head:
            return ("batch = pairs: chosen+rejected, 2 rows each (PairwiseDataCollatorWithPadding); the LM's "
                    "logits over every position, their float32 copy and the LM loss of the rows' labels "
                    "computed and dropped; a float32 value head (dropout 0.1, Linear(hidden, 1)) on the last "
                    "hidden state, trained; the loss on each row's last token's value; no reference model")
        logps = ("float32 logits and their whole log_softmax (get_batch_logps) held for the backward")
        if self.name == KTO:
            words = ("batch = examples: a prompt + completion labelled desirable or undesirable, 1 row each "
                     "(KTODataCollatorWithPadding), and its KL batch of mismatched completions, batch rows "
                     f"more under no_grad; {logps}, the chosen and rejected rows' logits copied (kto_tags)")
        else:
            words = f"batch = pairs: chosen+rejected, 2 rows each (PairwiseDataCollatorWithPadding); {logps}"
        reference = self.reference(peft)
        if reference == "frozen copy":
            return words + ("; reference: a frozen copy of the model in the checkpoint's dtype "
                            "(create_ref_model), forward under no_grad")
        if reference == "adapter disabled":
            return words + "; reference: the same model with its adapter disabled, forward under no_grad"
        return words + "; no reference model (use_ref_model false)"

    def _grpo_words(self, peft: bool) -> str:
        generation = {None: "model.generate with a KV cache (emulated decode loop)",
                      "colocate": f"vLLM colocated ({self.vllm_gpu_memory_utilization:g} of the GPU, "
                                  "outside the allocator)",
                      "server": "vLLM server on other GPUs (nothing here)"}[self.vllm_mode]
        reference = self.reference(peft)
        ref = ("no reference model (beta 0)" if reference is None else
               f"reference (beta {self.beta:g}): " + ("a frozen copy, forward under no_grad"
                                                      if reference == "frozen copy"
                                                      else "the adapter disabled, forward under no_grad"))
        words = (f"batch = completions (rows of prompt + {self.max_completion_length} completion tokens), "
                 f"{self.num_generations} per prompt; generation batch = batch x {self.steps_per_generation} "
                 f"step(s) per generation, a multiple of num_generations; generation: {generation}; {ref}")
        if self.name != EBFT:
            return words
        network = ("the policy with its adapter disabled" if self.feature_network(peft) == "adapter disabled"
                   else "a frozen copy of the policy")
        return (words + f"; reward: EBFT's feature network ({network}) forward under no_grad over the "
                "generation batch's rows and one ground-truth row per prompt, its hidden states at depths "
                f"{', '.join(f'{d:g}' for d in EBFT_FEATURE_LAYERS)} concatenated")


# GRPO's settings as check_trainer takes them (the request's fields of the same names, GRPOConfig's).
GRPO_FIELDS = ("num_generations", "max_completion_length", "beta", "use_vllm", "vllm_mode",
               "vllm_gpu_memory_utilization", "steps_per_generation")


def check_trainer(name: str | None, *, precompute_ref_log_probs: bool | None = None,
                  chosen_nll: bool | None = None, grpo: dict[str, Any] | None = None,
                  kto_loss_type: str | None = None, llamafactory: bool = False) -> Trainer | None:
    """The Trainer asked for; None for sft (the supervised step). InvalidInput naming the field.
    ``grpo``: GRPO_FIELDS given (None values left out); ``llamafactory``: LLaMA-Factory's trainer
    (LF_CLASSES) runs the step."""
    trainer = (name or SFT).strip().lower()
    if trainer not in TRAINERS:
        raise InvalidInput(f"unknown trainer {name!r}: allowed are {', '.join(TRAINERS)}")
    if trainer in NOT_YET:
        raise InvalidInput(NOT_YET[trainer])
    if precompute_ref_log_probs and trainer not in REFERENCED:
        error = InvalidInput.naming(f"{{precompute_ref_log_probs}} is DPO's and KTO's (a reference model's "
                                    f"log-probs); trainer {trainer} has none")
        error.field = "precompute_ref_log_probs"
        raise error
    if chosen_nll is not None and trainer != SIMPO:
        error = InvalidInput.naming(f"{{chosen_nll}} is SimPO's (CPOConfig cpo_alpha); trainer {trainer} "
                                    + ("always adds it" if trainer == ORPO else "has none"))
        error.field = "chosen_nll"
        raise error
    given = {key: value for key, value in (grpo or {}).items() if value is not None}
    if given and trainer not in GENERATIVE:
        key = next(iter(given))
        raise _field(key, f"{{{key}}} is GRPO's (GRPOConfig); trainer {trainer} has none")
    if kto_loss_type is not None:
        if trainer != KTO:
            raise _field("kto_loss_type", "{kto_loss_type} is KTO's (KTOConfig loss_type); trainer "
                         f"{trainer} has none")
        if kto_loss_type not in KTO_LOSS_TYPES:
            raise _field("kto_loss_type", f"unknown {{kto_loss_type}} {kto_loss_type!r}: allowed are "
                         f"{', '.join(KTO_LOSS_TYPES)}")
    if trainer == SFT:
        return None
    if llamafactory and (trainer not in LF_CLASSES or precompute_ref_log_probs or kto_loss_type
                         or chosen_nll is False):
        raise _field("trainer", f"LLaMA-Factory's trainers run {', '.join(LF_CLASSES)} with their own "
                     f"settings (finetuning_args.py), not {trainer} with TRL's settings")
    found = Trainer(trainer, bool(precompute_ref_log_probs), True if chosen_nll is None else chosen_nll,
                    kto_loss_type=kto_loss_type or "kto", recipe=LLAMAFACTORY if llamafactory else TRL)
    if trainer == EBFT and given.get("beta"):
        raise _field("beta", f"{{beta}} {given['beta']:g} with trainer ebft: GRPO's reference model beside "
                     "EBFT's feature network is not modelled (EBFT's examples keep TRL's default 0)")
    return _grpo(found, given) if trainer in GENERATIVE else found


def _grpo(trainer: Trainer, given: dict[str, Any]) -> Trainer:
    """GRPO's settings checked as GRPOConfig.__post_init__ and GRPOTrainer check them."""
    from dataclasses import replace

    num_generations = int(given.get("num_generations", GRPO_NUM_GENERATIONS))
    if num_generations < 2:  # GRPOConfig: "GRPO requires at least 2 generations per prompt"
        raise _field("num_generations", f"{{num_generations}} {num_generations}: GRPO needs at least 2 "
                     "generations per prompt to compute the advantages (GRPOConfig)")
    completion = int(given.get("max_completion_length", GRPO_MAX_COMPLETION_LENGTH))
    if completion < 1:
        raise _field("max_completion_length", f"{{max_completion_length}} {completion}: at least 1 token")
    beta = float(given.get("beta", 0.0))
    if beta < 0:
        raise _field("beta", f"{{beta}} {beta:g}: the KL coefficient is 0 (no reference model) or more")
    steps = int(given.get("steps_per_generation", 1))
    if steps < 1:
        raise _field("steps_per_generation", f"{{steps_per_generation}} {steps}: at least 1")
    use_vllm, mode = given.get("use_vllm"), given.get("vllm_mode")
    if mode is not None and mode not in VLLM_MODES:
        raise _field("vllm_mode", f"unknown {{vllm_mode}} {mode!r}: allowed are {', '.join(VLLM_MODES)}")
    if mode is not None and use_vllm is False:
        raise _field("vllm_mode", "{vllm_mode} is vLLM's, and {use_vllm} is off: give use_vllm, or leave "
                     "vllm_mode out (model.generate)")
    vllm_mode = (mode or "colocate") if (use_vllm or mode is not None) else None
    share = float(given.get("vllm_gpu_memory_utilization", GRPO_VLLM_GPU_MEMORY_UTILIZATION))
    if "vllm_gpu_memory_utilization" in given and vllm_mode != "colocate":
        raise _field("vllm_gpu_memory_utilization", "{vllm_gpu_memory_utilization} is a colocated vLLM "
                     "engine's share of the GPU (use_vllm with vllm_mode colocate); a vLLM server's is set "
                     "where it is launched (trl vllm-serve)")
    if not 0.0 < share < 1.0:
        raise _field("vllm_gpu_memory_utilization", f"{{vllm_gpu_memory_utilization}} {share:g}: a fraction "
                     "of the GPU's memory, in (0, 1)")
    return replace(trainer, num_generations=num_generations, max_completion_length=completion, beta=beta,
                   vllm_mode=vllm_mode, vllm_gpu_memory_utilization=share, steps_per_generation=steps)


def check_grpo_rows(trainer: Trainer, seq_len: int) -> None:
    """A GRPO row is the prompt then the completion: ``seq_len`` must hold a prompt token beside the
    max_completion_length tokens."""
    if trainer.name in GENERATIVE and seq_len <= trainer.max_completion_length:
        raise _field("max_completion_length", f"sequence length {seq_len} leaves no prompt beside "
                     f"{{max_completion_length}} {trainer.max_completion_length}: a GRPO row is prompt + "
                     "completion tokens; give a longer seq_len or a shorter completion")


def check_step(trainer: Trainer, task: str, *, loss: str, liger: tuple[str, ...], parallel: Any,
               images: Any) -> None:
    """Refuse, naming the field, what a preference step is not modelled with. A vision-language model
    (task image-text-to-text) is taken with rows of text alone (``images`` of 0 per row): TRL's
    trainers then call the ConditionalGeneration model's forward on ``input_ids`` and
    ``attention_mask`` only (TRL 1.8 dpo_trainer.py: the text collator where the dataset has no image
    column, ``_is_vision_dataset``; grpo_trainer.py ``_get_per_token_logps_and_entropies``: pixel_values
    only where the batch has them), its language model and head; the vision tower's weights are
    loaded and never run."""
    # TRL's RewardTrainer: a sequence classifier; LLaMA-Factory's: the causal LM with a value head
    needed = REWARD_TASK if trainer.name == REWARD and not trainer.value_head else "causal-lm"
    text_rows = needed == "causal-lm" and task == IMAGE_TEXT_TO_TEXT and not trainer.llamafactory
    if task != needed and not text_rows:
        raise _field("task", f"trainer {trainer.name} trains a {needed} model, not {task}")
    if text_rows and (images is None or images.per_sample):
        raise _field("images_per_sample", f"trainer {trainer.name} over a vision-language model with images "
                     "in its rows (the vision tower run on each row's images, the chosen and rejected or "
                     "generated rows each with theirs) is not modelled: give {images_per_sample} 0, rows of "
                     "text alone")
    if loss != "full" or liger:
        raise _field("loss" if loss != "full" else "liger",
                     f"trainer {trainer.name} with Liger's kernels (TRL's use_liger_kernel: its fused "
                     "DPO/ORPO losses) is not modelled: leave {loss} and {liger} out")
    if parallel is not None:
        raise _field("gpus", f"trainer {trainer.name} on more than one GPU is not modelled yet: the answer "
                     "would be one GPU's, without its reference model sharded")


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


