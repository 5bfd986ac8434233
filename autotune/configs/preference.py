"""TRL's preference configs (DPOConfig, ORPOConfig, CPOConfig for SimPO, KTOConfig, RewardConfig,
GRPOConfig), and which trainer a file is for.

Each is a TrainingArguments superset (trl/trainer/base_config.py ``_BaseConfig``: bf16 and gradient
checkpointing on by default), read by configs/trainer.py as TRL's SFTConfig is; this module adds
the keys of the preference trainers (trl/trainer/dpo_config.py, reward_config.py, kto_config.py,
grpo_config.py; trl/experimental/orpo/orpo_config.py, cpo/cpo_config.py; and keys of TRL 0.x
DPOConfig that published configs still carry: max_prompt_length, rpo_alpha, ...).

Which trainer reads a file is told by the keys only one trainer has (``precompute_ref_log_probs``
is DPO's and KTO's; ``desirable_weight`` KTO's; ``cpo_alpha`` CPO's; ``center_rewards_coefficient``
the reward trainer's). A
file with only keys several trainers share (``beta``, ``max_prompt_length``: DPO, ORPO, CPO and
KTO all have them) is refused unless ``--trainer`` says which: never answered as SFT.
"""

from __future__ import annotations

from typing import Any

from autotune.configs.generation import read_chat_template_kwargs, read_generation_kwargs
from autotune.configs.reading import Config, note_set_keys, words
from autotune.errors import InvalidInput
from autotune.workload.trainers import (
    DPO,
    DPO_LOSS_TYPES,
    GRPO,
    GRPO_MAX_COMPLETION_LENGTH,
    KTO,
    KTO_LOSS_TYPES,
    NOT_YET,
    REWARD,
    SFT,
    SIMPO,
)

_DPO_ONLY = words(
    "ld_alpha f_divergence_type f_alpha_divergence_coef use_weighting discopop_tau loss_weights rpo_alpha "
    "reference_free force_use_ref_model ref_model_init_kwargs model_adapter_name ref_adapter_name "
    "use_logits_to_keep")
_DPO_KTO = words("precompute_ref_log_probs precompute_ref_batch_size sync_ref_model ref_model_mixup_alpha "
                 "ref_model_sync_steps")
_CPO_ONLY = words("cpo_alpha simpo_gamma")
_KTO_ONLY = words("desirable_weight undesirable_weight")
_REWARD_ONLY = words("center_rewards_coefficient")
_GRPO_ONLY = words(
    "num_generations use_vllm vllm_mode vllm_gpu_memory_utilization vllm_server_host vllm_server_port "
    "reward_funcs reward_weights num_iterations scale_rewards generation_batch_size steps_per_generation "
    "top_k top_p temperature repetition_penalty mask_truncated_completions")
# GRPOConfig's keys that change memory and are not modelled (grpo_config.py), when set to that.
_GRPO_REFUSED = {
    "num_iterations": (lambda v: v not in (None, 1), "several iterations per generation: the old "
                       "log-probs of every completion computed beside the reference's"),
    "cache_implementation": (lambda v: v is not None, "a generation cache other than DynamicCache"),
    "use_transformers_continuous_batching": (lambda v: v is True, "transformers' paged generation"),
    "use_transformers_paged": (lambda v: v is True, "transformers' paged generation"),
    "vllm_enable_sleep_mode": (lambda v: v is True, "vLLM's weights and cache moved off the GPU between "
                               "generations"),
    "vllm_importance_sampling_correction": (lambda v: v is False, "vLLM's completions without the old "
                                            "log-probs (TRL's default true is modelled)"),
    "entropy_coef": (lambda v: v not in (None, 0, 0.0), "an entropy bonus (entropies kept with their graph)"),
    "use_adaptive_entropy": (lambda v: v is True, "an entropy bonus (entropies kept with their graph)"),
    "cast_lm_head_to_fp32": (lambda v: v is True, "a float32 output head"),
    "vllm_tensor_parallel_size": (lambda v: v not in (None, 1), "a vLLM engine sharded over GPUs"),
}
_GRPO_NO_EFFECT = words(
    "reward_funcs reward_weights scale_rewards top_k top_p min_p temperature repetition_penalty "
    "mask_truncated_completions vllm_server_host vllm_server_port vllm_server_base_url vllm_server_timeout "
    "vllm_group_port vllm_model_impl epsilon epsilon_high delta importance_sampling_level "
    "multi_objective_aggregation loss_type top_entropy_quantile log_completions num_completions_to_print "
    "use_bias_correction_kl off_policy_mask_threshold vllm_importance_sampling_mode "
    "vllm_importance_sampling_clip_min vllm_importance_sampling_clip_max num_generations_eval "
    "vllm_max_model_length ds3_gather_for_generation shuffle_dataset")
GRPO_KEYS = _GRPO_NO_EFFECT | frozenset(_GRPO_REFUSED) | words(
    "num_generations max_completion_length max_prompt_length beta use_vllm vllm_mode "
    "vllm_gpu_memory_utilization steps_per_generation generation_batch_size disable_dropout "
    "generation_kwargs chat_template_kwargs")
# Keys several preference trainers share, none of SFTConfig's.
_SHARED = words("beta label_smoothing max_prompt_length max_completion_length disable_dropout padding_value "
                "label_pad_token_id generate_during_eval is_encoder_decoder")
PREFERENCE_MARKERS = _DPO_ONLY | _DPO_KTO | _CPO_ONLY | _KTO_ONLY | _REWARD_ONLY | _GRPO_ONLY | _SHARED
PREFERENCE_FIELDS = PREFERENCE_MARKERS | words("loss_type alpha") | GRPO_KEYS
# Keys of these configs with no effect on a training step's memory: scalars of the loss on [batch]
# vectors, evaluation, and the prompt's own limits (the row is at most max_length tokens either way).
_NO_EFFECT = words("beta label_smoothing f_divergence_type f_alpha_divergence_coef discopop_tau loss_weights "
                   "padding_value label_pad_token_id generate_during_eval is_encoder_decoder "
                   "center_rewards_coefficient simpo_gamma alpha ref_model_mixup_alpha ref_model_sync_steps "
                   "max_prompt_length max_completion_length model_adapter_name ref_adapter_name "
                   "precompute_ref_batch_size desirable_weight undesirable_weight")
# Keys that change the step in ways not modelled, when set to what changes it.
_REFUSED = {
    "use_weighting": (True, "WPO's weights (logsumexp over the logits and twice the logits, per token)"),
    "ld_alpha": (None, "LD-DPO's masks and split log-probs"),
    "rpo_alpha": (None, "RPO's NLL over the chosen logits beside the DPO loss"),
    "use_logits_to_keep": (True, "logits for the completion only"),
    "sync_ref_model": (True, "TR-DPO's reference synchronized with the policy between steps"),
    "reference_free": (True, "a reference-free loss of TRL 0.x"),
    "force_use_ref_model": (True, "a separate reference model beside an adapter"),
    "ref_model_init_kwargs": (None, "a reference model loaded otherwise than the policy"),
    "disable_dropout": (False, "dropout left on (TRL's default disable_dropout: true is modelled)"),
}


def trainer_of(cfg: Config, hint: str | None) -> str:
    """The trainer a TRL preference config is for (module docstring); ``hint`` is --trainer."""
    keys = {key for key in cfg.data if cfg.data[key] is not None}
    found: list[tuple[str, set[str]]] = [
        (GRPO, keys & _GRPO_ONLY), (KTO, keys & _KTO_ONLY), (SIMPO, keys & _CPO_ONLY),
        (REWARD, keys & _REWARD_ONLY), (DPO, keys & (_DPO_ONLY | _DPO_KTO))]
    told = next(((name, sorted(which)) for name, which in found if which), None)
    if told is None:
        shared = sorted(keys & PREFERENCE_MARKERS)
        if hint in (None, SFT):
            raise InvalidInput(
                f"{cfg.file!r} has keys of a TRL preference trainer ({', '.join(shared)}), which "
                "DPOConfig, ORPOConfig, CPOConfig and KTOConfig all have: which trainer reads it cannot be "
                "told from its keys, and its step is not SFT's; give --trainer dpo, orpo or simpo")
        return hint
    name, which = told
    if name in NOT_YET:
        raise cfg.unmodelled(which[0], cfg.data[which[0]], f"a {name} config: {NOT_YET[name]}")
    if name == DPO and hint == KTO and not keys & _DPO_ONLY:  # precompute_ref_log_probs: KTOConfig's too
        return KTO
    if hint is not None and hint != name:
        raise InvalidInput(f"{cfg.file!r} is a {name} config ({', '.join(which[:3])}), and trainer {hint} "
                           "was asked for: give the trainer of the file, or leave --trainer out")
    return name


# SFTConfig's own keys (trl/trainer/sft_config.py), none of a preference config's: TRL refuses them.
_SFT_ONLY = words("dataset_text_field dataset_kwargs shuffle_dataset packing packing_strategy eval_packing "
                  "completion_only_loss assistant_only_loss dataset_batch_size num_of_sequences "
                  "chars_per_token max_seq_length")


def read_preference(cfg: Config, trainer: str) -> dict[str, Any]:
    """The request fields of a preference config for ``trainer`` (trainer, precompute_ref_log_probs,
    chosen_nll); its keys that change memory but are not modelled refused by name, the others
    noted."""
    sft_keys = sorted(key for key in _SFT_ONLY if cfg.data.get(key) is not None)
    if sft_keys:
        raise InvalidInput(f"{', '.join(sft_keys)} in {cfg.file!r}: SFTConfig's, and the file is a {trainer} "
                           "config (its trainer's keys): write one trainer's config")
    for key, (value, why) in _REFUSED.items():
        if trainer == GRPO and key == "disable_dropout":  # GRPOConfig's default false: dropout kept
            continue
        given = cfg.data.get(key)
        if given is not None and (value is None or given == value):
            raise cfg.unmodelled(key, given, why)
    cfg.read.update(PREFERENCE_FIELDS)
    fields: dict[str, Any] = {"trainer": trainer}
    if trainer == GRPO:
        return {**fields, **read_grpo(cfg)}
    if trainer == DPO:
        _dpo_loss_type(cfg)
        if cfg.flag("precompute_ref_log_probs"):
            fields["precompute_ref_log_probs"] = True
        if cfg.flag("padding_free"):
            cfg.notes.append("padding_free: DPOTrainer falls back to padding (dpo_trainer.py __init__: "
                             "'padding_free=True is temporarily unavailable'): rows padded to max_length")
    elif trainer == SIMPO:
        loss_type = cfg.text("loss_type")
        if loss_type not in (None, "simpo", "alphapo"):  # CPOConfig: alphapo is simpo with cpo_alpha 0
            raise cfg.unmodelled("loss_type", loss_type, "CPOTrainer's SimPO (loss_type simpo) is modelled")
        alpha = cfg.get("cpo_alpha")
        if loss_type == "alphapo" or (isinstance(alpha, int | float) and alpha == 0):
            fields["chosen_nll"] = False
        nll = "chosen_nll" not in fields
        cfg.notes.append("cpo_alpha: " + ("CPOConfig's default 1.0 or as set: the NLL of the chosen rows"
                                          if nll else "0: no NLL on the chosen rows (pure SimPO)"))
    elif trainer == KTO:
        fields.update(_kto(cfg))
    elif cfg.get("loss_type") is not None:
        raise cfg.unmodelled("loss_type", cfg.data["loss_type"], f"trainer {trainer} has no loss_type")
    if cfg.data.get("max_prompt_length") is not None or cfg.data.get("max_completion_length") is not None:
        cfg.notes.append("max_prompt_length, max_completion_length: a row is prompt + completion, at most "
                         "max_length tokens: the longest row is modelled")
    note_set_keys(cfg, _NO_EFFECT, "the trainer's")
    return fields


def _kto(cfg: Config) -> dict[str, Any]:
    """KTOConfig's memory keys (trl/trainer/kto_config.py): loss_type (the KL batch but for
    apo_zero_unpaired: kto_trainer.py ``calculate_KL``) and precompute_ref_log_probs; TRL's refusals
    of a KL step's sampler and batch noted where the file sets them."""
    fields: dict[str, Any] = {}
    loss_type = cfg.text("loss_type")
    if loss_type is not None:
        if loss_type not in KTO_LOSS_TYPES:
            raise cfg.bad("loss_type", loss_type, f"one of KTOConfig's: {', '.join(KTO_LOSS_TYPES)}")
        fields["kto_loss_type"] = loss_type
    kl = loss_type != "apo_zero_unpaired"
    if cfg.flag("precompute_ref_log_probs"):
        fields["precompute_ref_log_probs"] = True
    cfg.read.add("train_sampling_strategy")
    sampling = cfg.get("train_sampling_strategy")
    if kl and sampling not in (None, "sequential"):  # KTOTrainer __init__ raises ValueError
        raise cfg.bad("train_sampling_strategy", sampling, "sequential (KTOTrainer's KL term needs it)")
    cfg.notes.append("KTO: the batch is examples (a prompt + completion, desirable or undesirable), 1 row "
                     "each" + ("; its KL batch of mismatched completions, batch rows more, runs under "
                               "no_grad through the policy and the reference" if kl else "; no KL batch"))
    return fields


def _dpo_loss_type(cfg: Config) -> None:
    value = cfg.get("loss_type")
    names = [value] if isinstance(value, str) else value if isinstance(value, list) else None
    if value is None:
        return
    if names is None or not all(isinstance(name, str) for name in names):
        raise cfg.bad("loss_type", value, "a loss name or a list of them")
    for name in names:
        if name not in DPO_LOSS_TYPES:
            raise cfg.unmodelled("loss_type", name, "DPOTrainer's losses on [batch] vectors are modelled ("
                                 f"{', '.join(DPO_LOSS_TYPES)}); sft adds a cross-entropy over the logits")
    cfg.notes.append(f"loss_type: {', '.join(names)}: computed on [batch] vectors, the memory of sigmoid's")


def read_grpo(cfg: Config) -> dict[str, Any]:
    """GRPOConfig's memory keys as the request's fields (trl/trainer/grpo_config.py; its
    __post_init__ for generation_batch_size), those not modelled refused by name, the rest noted."""
    for key, (changes, why) in _GRPO_REFUSED.items():
        if changes(cfg.data.get(key)):
            raise cfg.unmodelled(key, cfg.data[key], why)
    fields: dict[str, Any] = {}
    for key in ("num_generations", "max_completion_length", "max_prompt_length", "steps_per_generation"):
        if cfg.data.get(key) is not None:
            fields[key] = cfg.positive(key)
    for key in ("beta", "vllm_gpu_memory_utilization"):
        value = cfg.get(key)
        if value is not None:
            if not isinstance(value, int | float) or isinstance(value, bool):
                raise cfg.bad(key, value, "a number")
            fields[key] = float(value)
    if cfg.flag("use_vllm"):
        fields["use_vllm"] = True
        fields["vllm_mode"] = cfg.text("vllm_mode") or "colocate"  # GRPOConfig's default
        if fields["vllm_mode"] != "colocate":
            fields.pop("vllm_gpu_memory_utilization", None)
            cfg.notes.append(f"vllm_mode: {fields['vllm_mode']}: the vLLM engine on other GPUs, nothing here")
    else:
        fields.pop("vllm_gpu_memory_utilization", None)
    generation = cfg.get("generation_batch_size")
    if generation is not None:
        if cfg.get("steps_per_generation") is not None:
            raise InvalidInput(f"generation_batch_size and steps_per_generation in {cfg.file!r}: GRPOConfig "
                               "takes one of them")
        batch = cfg.positive("per_device_train_batch_size") or 8
        if not isinstance(generation, int) or generation % batch:
            raise cfg.bad("generation_batch_size", generation, f"a multiple of per_device_train_batch_size "
                          f"{batch} (GRPOConfig)")
        fields["steps_per_generation"] = generation // batch
    elif cfg.get("steps_per_generation") is None and (cfg.positive("gradient_accumulation_steps") or 1) > 1:
        fields["steps_per_generation"] = cfg.positive("gradient_accumulation_steps")
        cfg.notes.append("steps_per_generation: not set, gradient_accumulation_steps (GRPOConfig): one "
                         "generation samples the completions of every accumulated step")
    if cfg.data.get("max_prompt_length") is not None:
        cfg.notes.append("max_prompt_length: GRPOConfig no longer has it (prompts are not truncated): read "
                         "as the longest prompt, a row is max_prompt_length + max_completion_length tokens")
    completion = fields.get("max_completion_length", GRPO_MAX_COMPLETION_LENGTH)
    read_generation_kwargs(cfg, "generation_kwargs", cfg.data.get("generation_kwargs"), completion)
    read_chat_template_kwargs(cfg, "chat_template_kwargs", cfg.data.get("chat_template_kwargs"))
    note_set_keys(cfg, _GRPO_NO_EFFECT, "GRPO's")
    return fields
