"""GRPO (issue 36): TRL's GRPOTrainer's generation and training step, traced on tiny models."""

from __future__ import annotations

import json

import pytest

from autotune.backends.estimate.backend import EstimateBackend
from autotune.backends.estimate.phases import phase_peaks
from autotune.cli import main
from autotune.errors import InvalidInput
from autotune.gpus import custom_gpu
from autotune.public import check
from autotune.tuner import budget_bytes
from autotune.units import GIB
from autotune.workload import Workload
from autotune.workload.grpo import GENERATION, TRAINING, cache_bytes
from autotune.workload.models import ModelSpec, tiny_config
from autotune.workload.modes import parse_mode
from autotune.workload.trainers import check_trainer

PROMPT = 4  # tokens of each prompt
PROMPTS = 2  # prompts in a generation batch: batch = PROMPTS x num_generations completions

# Keys and values dominate: a small MLP and vocabulary, every head its own keys and values.
KV_HEAVY = tiny_config("llama", vocab_size=64, hidden_size=128, intermediate_size=32, num_hidden_layers=4,
                       num_attention_heads=8, num_key_value_heads=8)


def grpo(**settings: object) -> Workload:
    trainer = check_trainer("grpo", grpo=settings)
    return Workload(ModelSpec("tiny-llama-kv", "local", KV_HEAVY, 512), "causal-lm", None, trainer=trainer)


def generation_growth(num_generations: int, completion: int) -> int:
    """Bytes the generation phase adds to what the step holds as it begins."""
    workload = grpo(num_generations=num_generations, max_completion_length=completion)
    peaks = phase_peaks(EstimateBackend(custom_gpu(4 * GIB)), workload, parse_mode("fp32"),
                        PROMPT + completion, PROMPTS * num_generations)
    return peaks.peaks[GENERATION] - peaks.start_bytes


def test_the_generation_cache_grows_with_num_generations_times_the_completion_length():
    # TRL's batch counts completions: a generation of PROMPTS prompts samples PROMPTS x num_generations
    # rows, each with a KV cache of prompt + completion - 1 tokens at the last decode step.
    base = generation_growth(2, 32)
    cache = cache_bytes(KV_HEAVY, PROMPTS * 2, PROMPT + 32 - 1, 4)
    assert cache <= base < 1.25 * cache  # the cache, one layer's concatenation and the step's logits
    assert generation_growth(4, 32) == pytest.approx(2 * base, rel=0.02)  # twice the generations
    longer = generation_growth(2, 64)
    assert longer - base == pytest.approx(cache_bytes(KV_HEAVY, PROMPTS * 2, 32, 4), rel=0.15)


def test_both_phases_are_reported_and_the_step_peaks_where_the_larger_is():
    workload = grpo(num_generations=2, max_completion_length=32)
    backend = EstimateBackend(custom_gpu(4 * GIB))
    peaks = phase_peaks(backend, workload, parse_mode("fp32"), PROMPT + 32, 4)
    assert set(peaks.peaks) == {GENERATION, TRAINING} and all(peaks.peaks.values())
    with backend.cell(workload, parse_mode("fp32"), PROMPT + 32, 4 * GIB) as cell:
        job = cell.fits(4).details["peak_allocated_bytes"]
    # the replay rounds every block as the caching allocator does (512 B); the phases count bytes asked
    assert max(peaks.peaks.values()) <= job < 1.05 * max(peaks.peaks.values())
    assert peaks.peaks[TRAINING] > peaks.peaks[GENERATION]  # here the training step's logits lead


def test_beta_keeps_a_frozen_reference_for_a_full_fine_tune_and_none_at_zero():
    backend = EstimateBackend(custom_gpu(4 * GIB))
    without, with_ref = grpo(beta=0.0), grpo(beta=0.04)
    weights = sum(p.nbytes for p in backend._model(without).model.parameters())
    assert backend.floor_bytes(backend._model(with_ref)) - backend.floor_bytes(backend._model(without)) \
        >= weights
    assert backend._model(without).reference is None


def test_a_colocated_vllm_engine_comes_off_the_budget():
    gpu = custom_gpu(8 * GIB)
    plain = budget_bytes(gpu, 0.0)
    colocated = check_trainer("grpo", grpo={"use_vllm": True, "vllm_gpu_memory_utilization": 0.25})
    server = check_trainer("grpo", grpo={"use_vllm": True, "vllm_mode": "server"})
    assert plain - budget_bytes(gpu, 0.0, trainer=colocated) == 2 * GIB
    assert budget_bytes(gpu, 0.0, trainer=server) == plain


def test_check_says_the_vllm_share_and_that_a_row_is_a_completion(capsys):
    args = ["check", "tiny-llama", "--trainer", "grpo", "--max-prompt-length", "16",
            "--max-completion-length", "32", "--num-generations", "4", "--batch-size", "4",
            "--gpu-memory", "2GiB", "--use-vllm",
            "--vllm-gpu-memory-utilization", "0.25", "--backend", "estimate", "--no-cache", "--json"]
    assert main(args) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["seq_len"] == 48 and doc["trainer"]["name"] == "grpo"
    assert doc["trainer"]["grpo"]["vllm_bytes"] == GIB // 2
    assert "batch = completions" in doc["trainer"]["label"]


@pytest.mark.parametrize(("settings", "field", "words"), [
    ({"trainer": "grpo", "num_generations": 1}, "num_generations", "at least 2 generations"),
    ({"trainer": "grpo", "max_completion_length": 64}, "max_completion_length", "leaves no prompt"),
    ({"trainer": "grpo", "vllm_mode": "colocate", "use_vllm": False}, "vllm_mode", "use_vllm is off"),
    ({"trainer": "grpo", "vllm_gpu_memory_utilization": 0.5}, "vllm_gpu_memory_utilization",
     "colocated vLLM engine"),
    ({"trainer": "dpo", "num_generations": 4}, "num_generations", "is GRPO's"),
    ({"trainer": "kto", "beta": 0.1}, "beta", "is GRPO's"),
])
def test_each_refusal_names_its_field(settings, field, words):
    with pytest.raises(InvalidInput, match=words) as caught:
        check("tiny-llama", seq_len=64, batch_size=2, gpu_memory="1GiB", backend="estimate", **settings)
    assert caught.value.field == field


def test_the_example_trl_grpo_config_is_read_as_grpo():
    from autotune.configs import read_training_config

    read = read_training_config("examples/trl_grpo_lora.yaml")
    step = read.request.step
    assert read.format == "trl-grpo" and step.trainer == "grpo"
    assert (step.num_generations, step.max_completion_length, step.max_prompt_length, step.beta) == (
        8, 768, 256, 0.04)
    assert step.steps_per_generation == 2  # gradient_accumulation_steps, GRPOConfig's default
    assert read.request.seq_len is None and step.use_vllm is None


def test_a_trl_grpo_config_s_unmodelled_keys_are_refused_by_name(tmp_path):
    from configread import write

    from autotune.configs import read_training_config

    for key, value in (("num_iterations", 2), ("vllm_enable_sleep_mode", True), ("entropy_coef", 0.1)):
        path = write(tmp_path, {"model_name_or_path": "tiny-llama", "num_generations": 4, key: value},
                     f"{key}.yaml")
        with pytest.raises(InvalidInput, match=key):
            read_training_config(path)


def test_the_example_axolotl_grpo_config_reads_trl_and_vllm_keys():
    from autotune.configs import read_training_config

    read = read_training_config("examples/axolotl_grpo_vllm.yml")
    step = read.request.step
    assert (read.format, step.trainer, read.request.batch_size, read.request.seq_len) == (
        "axolotl", "grpo", 4, 768)
    assert (step.num_generations, step.max_completion_length, step.use_vllm, step.vllm_mode) == (
        4, 512, True, "colocate")
    assert step.vllm_gpu_memory_utilization == 0.35 and step.steps_per_generation == 2


def test_axolotl_grpo_without_vllm_mode_is_a_vllm_server_as_axolotl_s_schema_sets_it(tmp_path):
    # Axolotl's schema sets trl.vllm_mode to server when use_vllm leaves it unset (utils/schemas/
    # validation.py GRPOVllmValidationMixin.check_vllm_mode_set): not GRPOConfig's colocate at 0.3.
    import yaml

    from autotune.configs import read_training_config

    example = yaml.safe_load(open("examples/axolotl_grpo_vllm.yml"))
    del example["trl"]["vllm_mode"]
    path = tmp_path / "grpo.yml"
    path.write_text(yaml.safe_dump(example))
    read = read_training_config(path)
    step = read.request.step
    assert (step.vllm_mode, step.vllm_gpu_memory_utilization) == ("server", None)
    assert any(note.startswith("trl.vllm_mode: not set") and "check_vllm_mode_set" in note
               for note in read.notes)


def test_axolotl_async_grpo_is_refused_by_name(tmp_path):
    from configread import write

    from autotune.configs import read_training_config

    path = write(tmp_path, {"base_model": "tiny-llama", "sequence_len": 64, "micro_batch_size": 2,
                            "bf16": False, "rl": "grpo", "trl": {"use_data_producer": True}}, "axolotl.yml")
    with pytest.raises(InvalidInput, match="trl.use_data_producer"):
        read_training_config(path)


@pytest.mark.parametrize(("settings", "fits", "answer"), [
    ({"num_generations": 8}, 46, 40),  # a generation batch of 46 completions splits no prompt group of 8
    ({"num_generations": 8}, 7, 0),
    ({"num_generations": 8, "steps_per_generation": 4}, 46, 46),  # 46 x 4 = 23 groups of 8
    ({"num_generations": 8, "steps_per_generation": 4}, 45, 44),
    ({"num_generations": 4}, 46, 44),
])
def test_a_table_s_answer_holds_whole_prompt_groups(settings, fits, answer):
    from limitbackend import LimitBackend

    from autotune.tuner import tune_table

    backend = LimitBackend(lambda *_: fits)
    table = tune_table(grpo(**settings), backend, backend.gpu, seq_lens=[64], modes=[parse_mode("bf16")])
    assert [cell.max_batch_size for cell in table.cells] == [answer]


def test_check_refuses_a_batch_that_splits_a_prompt_group():
    with pytest.raises(InvalidInput, match="must hold whole groups of num_generations 8") as caught:
        check("tiny-llama", seq_len=64, batch_size=3, gpu_memory="1GiB", backend="estimate", trainer="grpo",
              max_completion_length=32)
    assert caught.value.field == "batch_size"


def test_the_emulated_generation_runs_on_real_tensors_with_uninitialized_memory_poisoned():
    # The cuda backend runs the same decode loop on a GPU, where the grown ids, mask and cache are
    # read: deterministic mode fills empty memory with NaN and the largest id, so an unfilled one
    # fails here as it did on the H200 (a device-side assert in the last decode step).
    import torch
    from transformers import AutoModelForCausalLM

    from autotune.workload.grpo import emulated_generate, make_grpo_batch

    trainer = check_trainer("grpo", grpo={"num_generations": 2, "max_completion_length": 6})
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(KV_HEAVY, attn_implementation="sdpa").eval()
    batch = make_grpo_batch(trainer, 2, PROMPT + 6, attn="sdpa")
    deterministic = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        with torch.no_grad():
            ids = emulated_generate(model, batch["prompt_ids"], batch["prompt_mask"], 6)
    finally:
        torch.use_deterministic_algorithms(deterministic)
    assert ids.shape == (2, PROMPT + 6)
    assert 0 <= int(ids.min()) and int(ids.max()) < KV_HEAVY.vocab_size
