"""normalize reads every field the table body takes: a field added to the request (autotune/request.py)
is a property of the body at once (api/schemas.py), so this is what says when the service would
take it and do nothing with it."""

from __future__ import annotations

import pytest

from api.runs.spec import normalize
from api.settings import Settings
from autotune.errors import AutotuneError
from autotune.request import TableRequest, fields_of

BASE = {"model": "tiny-llama", "seq_lens": [32], "modes": ["fp32"], "gpu_memory": "1GiB",
        "backend": "estimate"}
LORA, QLORA = {"peft": "lora"}, {"peft": "qlora"}
GRPO = {"trainer": "grpo", "max_completion_length": 16}  # a row of 32 tokens: 16 of prompt
# For each field: (what it needs besides, a value other than its default). Refused: the field's
# own error names it.
SAMPLES = {
    "task": ({}, {"task": "sequence-classification"}),
    "dtype": ({}, {"dtype": "bfloat16"}),
    "optimizer": ({}, {"optimizer": "sgd"}),
    "attn": ({}, {"attn": "eager"}),
    "loss": ({}, {"loss": "chunked"}),
    "ckpt_reentrant": ({}, {"ckpt_reentrant": True}),
    "liger": ({}, {"liger": "rms_norm,rope,swiglu"}),
    "peft": ({}, LORA),
    "lora_r": (LORA, {"lora_r": 4}),
    "lora_alpha": (LORA, {"lora_alpha": 8.0}),
    "lora_dropout": (LORA, {"lora_dropout": 0.0}),
    "lora_targets": (LORA, {"lora_targets": ["q_proj"]}),
    "load_in_4bit": (LORA, {"load_in_4bit": True}),
    "load_in_8bit": ({}, {"load_in_8bit": True}),  # refused
    "bnb_4bit_quant_type": (QLORA, {"bnb_4bit_quant_type": "fp4"}),
    "bnb_4bit_use_double_quant": (QLORA, {"bnb_4bit_use_double_quant": False}),
    "bnb_4bit_compute_dtype": (QLORA, {"bnb_4bit_compute_dtype": "float16"}),
    "qlora_recipe": (QLORA, {"qlora_recipe": "axolotl"}),
    "gpu": ({"gpu_memory": None}, {"gpu": "A100-80GB"}),
    "gpu_memory": ({}, {"gpu_memory": "2GiB"}),
    "multiprocessors": ({}, {"multiprocessors": "46x1536"}),
    "alloc_conf": ({}, {"alloc_conf": "expandable_segments:True"}),
    "backend": ({}, {"backend": "auto"}),
    "margin": ({}, {"margin": 0.2}),
    "seq_lens": ({}, {"seq_lens": [64]}),
    "modes": ({}, {"modes": ["amp"]}),
    "search": ({}, {"search": "bisect"}),
    "max_batch": ({}, {"max_batch": 32}),
    "gpus": ({"gpu_memory": "4GiB"}, {"gpus": 8}),
    "parallel": ({"gpu_memory": "4GiB", "gpus": 8}, {"parallel": "fsdp"}),
    "nodes": ({"gpu_memory": "4GiB", "gpus": 8, "parallel": "fsdp"}, {"nodes": 2}),
    "tensor_parallel": ({"gpu_memory": "4GiB", "gpus": 8, "parallel": "fsdp"}, {"tensor_parallel": 2}),
    "context_parallel": ({"gpu_memory": "4GiB", "gpus": 8, "parallel": "fsdp", "attn": "flash_attention_2"},
                         {"context_parallel": 2}),
    "heads_k_stride": ({"gpu_memory": "4GiB", "gpus": 8, "parallel": "fsdp", "attn": "flash_attention_2",
                        "context_parallel": 2}, {"heads_k_stride": 2}),
    "reshard_after_forward": ({"gpu_memory": "4GiB", "gpus": 8, "parallel": "fsdp"},
                              {"reshard_after_forward": False}),
    "fsdp_recipe": ({"gpu_memory": "4GiB", "gpus": 8, "parallel": "fsdp"}, {"fsdp_recipe": "axolotl"}),
    "fsdp_activation_checkpointing": ({"gpu_memory": "4GiB", "gpus": 8, "parallel": "fsdp", "modes": ["amp"]},
                                      {"fsdp_activation_checkpointing": True}),
    "fsdp_version": ({"gpu_memory": "4GiB", "gpus": 8, "parallel": "fsdp"}, {"fsdp_version": 1}),
    "fsdp1_config": ({"gpu_memory": "4GiB", "gpus": 8, "parallel": "fsdp", "fsdp_version": 1},
                     {"fsdp1_config": '{"use_orig_params": false}'}),
    "offload_params": ({"gpu_memory": "4GiB", "gpus": 8, "parallel": "fsdp"}, {"offload_params": True}),
    "fsdp_wrap": ({"gpu_memory": "4GiB", "gpus": 8, "parallel": "fsdp"}, {"fsdp_wrap": "LlamaMLP"}),
    "zero_config": ({"gpu_memory": "4GiB", "gpus": 8, "parallel": "zero2"},
                    {"zero_config": '{"stage": 2, "reduce_bucket_size": 100000000}'}),
    "trainer": ({}, {"trainer": "dpo"}),
    "precompute_ref_log_probs": ({"trainer": "dpo"}, {"precompute_ref_log_probs": True}),
    "chosen_nll": ({"trainer": "simpo"}, {"chosen_nll": False}),
    "kto_loss_type": ({"trainer": "kto"}, {"kto_loss_type": "apo_zero_unpaired"}),
    "num_generations": (GRPO, {"num_generations": 4}),
    "max_completion_length": (GRPO, {"max_completion_length": 8}),
    "beta": (GRPO, {"beta": 0.04}),
    "steps_per_generation": (GRPO, {"steps_per_generation": 2}),
    "use_vllm": (GRPO, {"use_vllm": True}),
    "vllm_mode": ({**GRPO, "use_vllm": True}, {"vllm_mode": "server"}),
    "vllm_gpu_memory_utilization": ({**GRPO, "use_vllm": True}, {"vllm_gpu_memory_utilization": 0.5}),
}


def key(body):
    """The key of the run ``body`` asks for, or the field its first error names."""
    # Where a run goes, by the backend asked for (auto, estimate): the estimator's either way.
    environment = lambda backend, gpu: {"backend": "estimate", "asked": backend}  # noqa: E731
    try:
        return normalize({k: v for k, v in body.items() if v is not None}, Settings(), environment).key()
    except AutotuneError as exc:
        return exc.field


def test_every_field_of_the_body_has_a_sample():
    assert set(SAMPLES) == {f.name for f in fields_of(TableRequest) if f.about.http} - {"model"}


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_each_field_of_the_body_changes_the_run_or_is_refused_by_name(name):
    needs, change = SAMPLES[name]
    before, after = key(BASE | needs), key(BASE | needs | change)
    assert isinstance(before, str) and len(before) == 64, before  # the run without it is valid
    assert after == name or (len(after) == 64 and after != before), after
