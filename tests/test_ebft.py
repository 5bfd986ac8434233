"""EBFT's structured mode (issue 36): Axolotl's AxolotlEBFTTrainer, GRPO's step with a feature network's
forward as its reward, traced on tiny models; rl: gdpo read as GRPO."""

from __future__ import annotations

import pytest

from autotune.backends.estimate.backend import EstimateBackend
from autotune.backends.estimate.phases import phase_peaks
from autotune.errors import InvalidInput
from autotune.gpus import custom_gpu
from autotune.units import GIB
from autotune.workload import Workload
from autotune.workload.grpo import GENERATION
from autotune.workload.models import ModelSpec, tiny_config
from autotune.workload.modes import parse_mode
from autotune.workload.trainers import check_trainer

# Hidden states dominate: a wide residual stream, a small MLP, vocabulary and cache.
WIDE = tiny_config("llama", vocab_size=64, hidden_size=256, intermediate_size=64, num_hidden_layers=4,
                   num_attention_heads=4, num_key_value_heads=1)
ROWS, SEQ = 8, 36  # completions of a generation batch (2 prompts x 4), each prompt + completion tokens
# vLLM as a server: the generation phase is the scoring alone, no KV cache beside it
SETTINGS = {"num_generations": 4, "max_completion_length": 16, "use_vllm": True, "vllm_mode": "server"}


def workload(trainer: str) -> Workload:
    return Workload(ModelSpec("tiny-wide", "local", WIDE, 512), "causal-lm", None,
                    trainer=check_trainer(trainer, grpo=SETTINGS))


def generation_growth(trainer: str) -> int:
    backend = EstimateBackend(custom_gpu(4 * GIB))
    peaks = phase_peaks(backend, workload(trainer), parse_mode("fp32"), SEQ, ROWS)
    return peaks.peaks[GENERATION] - peaks.start_bytes


def test_the_feature_forward_holds_every_hidden_state_and_two_copies_of_the_chosen_layers():
    # extract_hidden_states: output_hidden_states keeps the embeddings' and each layer's output
    # [rows, seq, hidden] (fp32 here) until it returns, beside torch.cat of the 3 chosen layers, twice
    row = ROWS * SEQ * 256 * 4
    features = (WIDE.num_hidden_layers + 1) * row + 2 * 3 * row
    ebft, grpo = generation_growth("ebft"), generation_growth("grpo")
    assert grpo < features <= ebft < features + 2 * row


def test_a_full_fine_tune_holds_a_frozen_feature_network_and_lora_none():
    backend = EstimateBackend(custom_gpu(4 * GIB))
    ebft, grpo = backend._model(workload("ebft")), backend._model(workload("grpo"))
    weights = sum(p.nbytes for p in grpo.model.parameters())
    assert ebft.reference is not None and grpo.reference is None
    assert backend.floor_bytes(ebft) - backend.floor_bytes(grpo) >= weights
    trainer = check_trainer("ebft", grpo=SETTINGS)
    assert trainer.feature_network(peft=True) == "adapter disabled"
    assert trainer.to_json(peft=False)["ebft"]["feature_network"] == "frozen copy"


def test_ebft_with_grpo_s_reference_is_refused_by_name():
    with pytest.raises(InvalidInput, match="feature network") as caught:
        check_trainer("ebft", grpo={"beta": 0.04})
    assert caught.value.field == "beta"


BASE = {"base_model": "tiny-llama", "sequence_len": 64, "micro_batch_size": 4, "bf16": False,
        "trl": {"num_generations": 4, "max_completion_length": 32, "use_vllm": False}}


def read(tmp_path, **keys):
    from configread import write

    from autotune.configs import read_training_config

    return read_training_config(write(tmp_path, {**BASE, **keys}, "axolotl.yml"))


def test_axolotl_rl_ebft_is_read_as_ebft_with_grpo_s_settings(tmp_path):
    found = read(tmp_path, rl="ebft", ebft={"feature_layers": [0.25, 0.5, 0.75], "embed_method": "last_token",
                                            "use_whitening": False, "ce_coef": 0.0})
    step = found.request.step
    assert (step.trainer, step.num_generations, step.max_completion_length) == ("ebft", 4, 32)
    assert any("AxolotlEBFTTrainer" in note and "a frozen deepcopy" in note for note in found.notes)


@pytest.mark.parametrize(("ebft", "key"), [
    ({"mode": "strided"}, "ebft.mode"),
    ({"use_whitening": True}, "ebft.use_whitening"),
    ({"embed_method": "mean_pooling"}, "ebft.embed_method"),
    ({"feature_layers": [0.5]}, "ebft.feature_layers"),
])
def test_axolotl_ebft_keys_that_change_memory_are_refused_by_name(tmp_path, ebft, key):
    with pytest.raises(InvalidInput, match=key):
        read(tmp_path, rl="ebft", ebft=ebft)


def test_axolotl_ebft_strided_mode_is_refused_with_what_its_step_holds(tmp_path):
    # ebft/strided.py compute_loss: the flex_attention forward's Triton kernels and the per-row graphs
    with pytest.raises(InvalidInput, match="ebft.mode") as refused:
        read(tmp_path, rl="ebft", ebft={"mode": "strided", "stride": 8, "generate_max_len": 8})
    for part in ("AxolotlStridedEBFTTrainer", "flex_attention", "not emulated", "every row's graph held"):
        assert part in str(refused.value)


def test_axolotl_ebft_with_a_kl_term_is_refused_by_name(tmp_path):
    with pytest.raises(InvalidInput, match="trl.beta"):
        read(tmp_path, rl="ebft", trl={**BASE["trl"], "beta": 0.04})


def test_axolotl_rl_gdpo_is_grpo_with_its_reward_aggregation(tmp_path):
    trl = {**BASE["trl"], "multi_objective_aggregation": "normalize_then_sum", "reward_weights": [1.0, 2.0]}
    found = read(tmp_path, rl="gdpo", trl=trl)
    assert found.request.step.trainer == "grpo"
    assert any("rl: gdpo" in note and "normalize_then_sum" in note for note in found.notes)
    with pytest.raises(InvalidInput, match="check_gdpo"):
        read(tmp_path, rl="gdpo", trl={**BASE["trl"], "multi_objective_aggregation": "sum_then_normalize"})


def test_axolotl_ebft_without_max_completion_length_takes_trl_1_8_s_default(tmp_path):
    # ebft/__init__.py passes trl.max_completion_length only where set: GRPOConfig's default in TRL
    # 1.8.0 (Axolotl's pin), 256, not TRL main's 512.
    found = read(tmp_path, rl="ebft", trl={"num_generations": 4, "use_vllm": False})
    assert found.request.step.max_completion_length == 256
    assert any(note.startswith("trl.max_completion_length: not set") and "TRL 1.8.0" in note
               for note in found.notes)


@pytest.mark.parametrize("rl", ["grpo", "gdpo"])
def test_axolotl_grpo_without_max_completion_length_is_refused_by_name(tmp_path, rl):
    # grpo/__init__.py passes trl.max_completion_length, None where unset, to GRPOConfig: the
    # completions run to the generation's own limit, which autotune does not guess.
    with pytest.raises(InvalidInput, match="trl.max_completion_length.*set_training_args_kwargs"):
        read(tmp_path, rl=rl, trl={"num_generations": 4, "use_vllm": False})


@pytest.mark.parametrize("rl", ["grpo", None])
def test_an_ebft_section_outside_rl_ebft_is_read_as_no_effect(tmp_path, rl):
    # Axolotl reads cfg.ebft in rl: ebft's strategy and its dataset strategy alone (core/builders/rl.py).
    keys = {"ebft": {"feature_layers": [0.5]}} | ({"rl": rl} if rl else {"trl": None})
    found = read(tmp_path, **keys)
    assert found.request.step.trainer == rl
    assert any(note.startswith("ebft: read by rl: ebft alone") for note in found.notes)
