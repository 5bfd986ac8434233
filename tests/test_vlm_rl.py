"""Preference and RL trainers over a vision-language model with rows of text (issues 34, 36): the
ConditionalGeneration model's forward on input_ids alone; GRPOConfig's generation_kwargs and
chat_template_kwargs read; Axolotl's async GRPO refused with its reason."""

from __future__ import annotations

import pytest
from configread import write

import autotune
from autotune.configs import read_training_config
from autotune.errors import InvalidInput
from autotune.request import CheckRequest, Step, resolve
from autotune.workload.vision import IMAGE_TEXT_TO_TEXT

VLM = "tiny-qwen3_5"  # a tiny dense Qwen3.5: Qwen3_5ForConditionalGeneration, its vision tower
SERVER = {"num_generations": 4, "max_completion_length": 16, "use_vllm": True, "vllm_mode": "server"}


def check(**step):
    return autotune.check(VLM, seq_len=64, batch_size=4, gpu_memory="2GiB", backend="estimate", workers=1,
                          **step)


@pytest.mark.parametrize("trainer", ["dpo", "orpo"])
def test_a_preference_trainer_over_a_vlm_s_text_rows_is_answered(trainer):
    result = check(trainer=trainer, images_per_sample=0)
    assert result.fits and result.task == IMAGE_TEXT_TO_TEXT and result.images["per_sample"] == 0
    assert "text-only" in result.message
    # DPO's pairs (and the reference of a full fine-tune) above SFT's rows over the same model
    assert result.peak_memory_bytes > check(images_per_sample=0).peak_memory_bytes


@pytest.mark.parametrize(("trainer", "settings"), [("grpo", SERVER), ("ebft", SERVER), ("kto", {})])
def test_rl_trainers_over_a_vlm_s_text_rows_resolve_to_the_vlm_s_step(trainer, settings):
    resolved = resolve(CheckRequest(Step(model=VLM, trainer=trainer, images_per_sample=0, **settings),
                                    seq_len=64, batch_size=4), make_target=False)
    workload = resolved.workload
    assert workload.task == IMAGE_TEXT_TO_TEXT and workload.trainer.name == trainer
    assert workload.images.per_sample == 0


def test_a_preference_trainer_over_rows_with_images_is_refused_naming_images_per_sample():
    with pytest.raises(InvalidInput, match="images in its rows") as caught:
        resolve(CheckRequest(Step(model=VLM, trainer="dpo"), seq_len=512, batch_size=1), make_target=False)
    assert caught.value.field == "images_per_sample"


EBFT = {"base_model": VLM, "sequence_len": 64, "micro_batch_size": 4, "rl": "ebft", "bf16": False,
        "ebft": {"feature_layers": [0.25, 0.5, 0.75], "embed_method": "last_token"},
        "trl": {"num_generations": 4, "max_completion_length": 32, "use_vllm": True,
                "vllm_mode": "server", "generation_kwargs": {"stop_token_ids": [248044, 248046]},
                "chat_template_kwargs": {"enable_thinking": False}}}


def read_axolotl(tmp_path, config):
    return read_training_config(write(tmp_path, config, "axolotl.yml"))


def test_axolotl_ebft_over_a_vlm_reads_its_stop_tokens_and_chat_template_kwargs(tmp_path):
    # examples/ebft/qwen35-4b-ebft-structured.yaml, on the tiny Qwen3.5
    found = read_axolotl(tmp_path, EBFT)
    step = found.request.step
    assert (step.trainer, step.task, step.images_per_sample) == ("ebft", IMAGE_TEXT_TO_TEXT, 0)
    assert any(note.startswith("trl.generation_kwargs: stop_token_ids") and "max_completion_length 32"
               in note for note in found.notes)
    assert any(note.startswith("trl.chat_template_kwargs: enable_thinking") for note in found.notes)
    assert any(note.startswith("rl: ebft over the vision-language model") for note in found.notes)


@pytest.mark.parametrize(("kwargs", "key"), [
    ({"n": 2}, "trl.generation_kwargs.n"),
    ({"logprobs": 5}, "trl.generation_kwargs.logprobs"),
    ({"num_beams": 4}, "trl.generation_kwargs.num_beams"),
    ({"max_tokens": 64}, "trl.generation_kwargs.max_tokens"),  # beyond max_completion_length 32
])
def test_axolotl_generation_kwargs_that_change_memory_are_refused_by_name(tmp_path, kwargs, key):
    with pytest.raises(InvalidInput, match=key):
        read_axolotl(tmp_path, {**EBFT, "trl": {**EBFT["trl"], "generation_kwargs": kwargs}})


def test_a_shorter_max_tokens_keeps_the_bound(tmp_path):
    found = read_axolotl(tmp_path, {**EBFT, "trl": {**EBFT["trl"], "generation_kwargs": {"max_tokens": 16}}})
    assert found.request.step.max_completion_length == 32


def test_axolotl_async_prefetch_is_refused_as_generation_beside_the_step(tmp_path):
    with pytest.raises(InvalidInput, match="trl.async_prefetch.*background thread"):
        read_axolotl(tmp_path, {**EBFT, "trl": {**EBFT["trl"], "async_prefetch": True}})


def test_axolotl_rl_over_rows_with_images_is_refused_naming_processor_type(tmp_path):
    with pytest.raises(InvalidInput, match="processor_type"):
        read_axolotl(tmp_path, {**EBFT, "processor_type": "AutoProcessor"})


def test_axolotl_grpo_does_not_pass_generation_kwargs(tmp_path):
    config = {key: value for key, value in EBFT.items() if key != "ebft"} | {"rl": "grpo"}
    found = read_axolotl(tmp_path, {**config, "trl": {**EBFT["trl"], "generation_kwargs": {"n": 8}}})
    assert found.request.step.trainer == "grpo"
    assert any(note.startswith("trl.chat_template_kwargs, trl.generation_kwargs: Axolotl's rl grpo does "
                               "not pass") for note in found.notes)


def test_a_trl_grpo_config_s_generation_kwargs(tmp_path):
    base = {"model_name_or_path": "tiny-llama", "num_generations": 4, "max_completion_length": 32}
    found = read_training_config(write(tmp_path, {**base, "generation_kwargs": {"stop": ["</answer>"]},
                                                  "chat_template_kwargs": {"enable_thinking": False}},
                                       "grpo.yaml"))
    assert found.request.step.trainer == "grpo"
    assert any(note.startswith("generation_kwargs: stop") for note in found.notes)
    assert any(note.startswith("chat_template_kwargs: enable_thinking") for note in found.notes)
    with pytest.raises(InvalidInput, match="generation_kwargs.best_of"):
        read_training_config(write(tmp_path, {**base, "generation_kwargs": {"best_of": 4}}, "best.yaml"))
