"""The step a table models: task from the config, the weights' dtype, default lengths, what a card
refuses or warns about."""

from __future__ import annotations

import json

import pytest

from autotune.errors import InvalidInput
from autotune.gpus import custom_gpu, resolve_gpu
from autotune.workload import Workload
from autotune.workload.adapters import make_adapter
from autotune.workload.models import (
    check_dtype,
    default_seq_lens,
    infer_task,
    resolve_dtype,
    resolve_model,
    task_for,
    tiny_config,
)
from autotune.workload.modes import parse_mode, parse_modes
from autotune.workload.presets import PRESETS
from autotune.workload.support import refusal, step_warnings


def _local(tmp_path, **config):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return resolve_model(str(tmp_path))


QWEN2 = {"model_type": "qwen2", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
         "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 128,
         "max_position_embeddings": 4096}


@pytest.mark.parametrize(("architecture", "task"), [
    ("Qwen2ForCausalLM", "causal-lm"),
    ("BertForMaskedLM", "masked-lm"),
    ("BertForQuestionAnswering", "question-answering"),
    ("RobertaForSequenceClassification", "sequence-classification"),
    ("BertForTokenClassification", "token-classification"),
])
def test_the_task_comes_from_the_configs_architectures(architecture, task):
    config = tiny_config("bert", architectures=[architecture])
    assert infer_task(config) == (task, f"from architectures {architecture}")


@pytest.mark.parametrize(("model_type", "task"), [
    ("gpt2", "causal-lm"),  # decoder-only: a causal-LM class, no masked-LM one
    ("bert", "sequence-classification"),  # an encoder (it has a causal-LM class too)
    ("roberta", "sequence-classification"),
    ("distilbert", "sequence-classification"),
    ("deberta-v2", "sequence-classification"),
])
def test_without_architectures_decoders_are_causal_lm_and_encoders_classify(model_type, task):
    config = tiny_config(model_type)
    assert getattr(config, "architectures", None) is None
    assert infer_task(config)[0] == task


def test_a_qwen_config_without_task_is_causal_lm_and_task_still_wins(tmp_path):
    spec = _local(tmp_path, **QWEN2, architectures=["Qwen2ForCausalLM"])
    assert task_for(spec, None) == "causal-lm"
    assert task_for(spec, "sequence-classification") == "sequence-classification"
    spec = _local(tmp_path, **QWEN2)  # no architectures: qwen2 is decoder-only
    assert task_for(spec, None) == "causal-lm"


def test_auto_dtype_is_the_configs_and_an_explicit_dtype_overrides_it(tmp_path):
    with_dtype = _local(tmp_path, **QWEN2, torch_dtype="bfloat16")
    assert resolve_dtype(with_dtype, "auto") == "bfloat16"
    assert resolve_dtype(with_dtype, "float32") == "float32"
    assert resolve_dtype(with_dtype, "fp16") == "float16"
    (tmp_path / "config.json").write_text(json.dumps(QWEN2))
    assert resolve_dtype(resolve_model(str(tmp_path)), "auto") == "float32"  # torch's default


def test_auto_dtype_reads_dtype_not_its_deprecated_alias(monkeypatch):
    """transformers 5's ``torch_dtype`` is an alias of ``dtype`` that logs a deprecation notice on
    every read (it reached the Python API's users): a config with ``dtype`` is read there only."""
    spec = resolve_model("bert-base-uncased")
    config_type = type(spec.config)

    def deprecated(self):
        raise AssertionError("torch_dtype read")

    monkeypatch.setattr(config_type, "torch_dtype", property(deprecated), raising=False)
    assert hasattr(spec.config, "dtype")
    assert resolve_dtype(spec, "auto") == "float32"
    assert resolve_dtype(resolve_model("meta-llama/Llama-3.2-1B"), "auto") == "bfloat16"


def test_an_unknown_dtype_names_the_allowed_ones():
    with pytest.raises(InvalidInput,
                       match="unknown dtype 'int4': allowed are auto, float32, bfloat16, float16"):
        check_dtype("int4")


def test_the_estimator_builds_the_weights_in_the_resolved_dtype(tmp_path):
    from torch._subclasses.fake_tensor import FakeTensorMode

    from autotune.workload.step import build_model

    spec = _local(tmp_path, **QWEN2, torch_dtype="bfloat16")
    with FakeTensorMode():
        model, _ = build_model(spec, "causal-lm", None, resolve_dtype(spec, "auto"))
        assert {p.dtype for p in model.parameters()} == {__import__("torch").bfloat16}
        model, _ = build_model(spec, "causal-lm", None, "float32")
        assert {str(p.dtype) for p in model.parameters()} == {"torch.float32"}


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_a_mixture_of_experts_outside_bfloat16_is_refused_naming_dtype(tmp_path, dtype):
    # transformers' grouped_mm experts take bfloat16 only on CUDA (as on fake tensors): an error of
    # the request, never a crash inside the trace.
    from torch._subclasses.fake_tensor import FakeTensorMode

    from autotune.workload.step import build_model

    moe = {**QWEN2, "model_type": "qwen3_moe", "num_experts": 4, "num_experts_per_tok": 2,
           "moe_intermediate_size": 16, "head_dim": 8}
    spec = _local(tmp_path, **moe)
    with FakeTensorMode():
        with pytest.raises(InvalidInput, match=rf"^dtype {dtype}: Qwen3MoeForCausalLM's experts run "
                           r"transformers' grouped_mm, .* use dtype bfloat16$") as raised:
            build_model(spec, "causal-lm", None, dtype)
        assert raised.value.field == "dtype"
        model, _ = build_model(spec, "causal-lm", None, "bfloat16")
        assert any(hasattr(module, "_is_expert_parallel") for module in model.modules())
    (tmp_path / "dense").mkdir()
    with FakeTensorMode():  # a dense model in float32 is built as before
        build_model(_local(tmp_path / "dense", **QWEN2), "causal-lm", None, "float32")


@pytest.mark.parametrize(("limit", "rows"), [
    (128, [64, 128]),  # the tiny presets
    (512, [64, 128, 256, 320, 384, 512]),  # BERT: the README's rows
    (1024, [512, 1024]),  # GPT-2
    (4096, [512, 1024, 2048, 4096]),
    (131072, [512, 1024, 2048, 4096, 8192]),
    (32, [32]),  # shorter than every row: its limit
])
def test_default_lengths_follow_the_models_limit(tmp_path, limit, rows):
    spec = _local(tmp_path, **{**QWEN2, "max_position_embeddings": limit})
    assert default_seq_lens(spec) == rows


def test_default_lengths_stay_within_a_servers_limit_too(tmp_path):
    spec = _local(tmp_path, **{**QWEN2, "max_position_embeddings": 131072})
    assert default_seq_lens(spec, limit=2048) == [512, 1024, 2048]
    assert default_seq_lens(spec, limit=300) == [300]


def _workload(**changes):
    spec = resolve_model("tiny-bert")
    return Workload(spec, "sequence-classification", changes.pop("attn", None), **changes)


def test_amp_over_float16_weights_is_refused_as_gradscaler_refuses_it():
    reason = refusal(_workload(weights_dtype="float16"), parse_mode("amp"), resolve_gpu("A100-80GB"))
    assert reason is not None and "GradScaler refuses to unscale float16 gradients" in reason
    assert refusal(_workload(weights_dtype="float16"), parse_mode("fp32"), resolve_gpu("A100-80GB")) is None


def test_amp_over_float16_weights_trains_adapters_that_are_not_float16():
    """PEFT makes LoRA weights float32 (autocast_adapter_dtype) and every QLoRA recipe casts what
    trains to float32 or bfloat16: GradScaler unscales them. A head LoRA trains whole stays float16."""
    a100, amp = resolve_gpu("A100-80GB"), parse_mode("amp")
    llama = resolve_model("tiny-llama")
    for adapter in (make_adapter("lora"), make_adapter("qlora"), make_adapter("qlora", recipe="peft")):
        assert refusal(Workload(llama, "causal-lm", None, weights_dtype="float16", adapter=adapter), amp,
                       a100) is None
    head = refusal(_workload(weights_dtype="float16", adapter=make_adapter("lora")), amp, a100)
    assert head is not None and "LoRA trains the head or modules_to_save whole" in head
    saved = Workload(llama, "causal-lm", None, weights_dtype="float16",
                     adapter=make_adapter("lora", modules_to_save=["lm_head"]))
    assert refusal(saved, amp, a100) is not None


def test_flash_attention_2_needs_an_sm80_card_and_16_bit_inputs():
    flash = _workload(attn="flash_attention_2")
    on_t4 = refusal(flash, parse_mode("amp"), resolve_gpu("T4"))
    assert on_t4 is not None and "compute capability 8.0 or newer; T4 has 7.5" in on_t4
    assert "float16/bfloat16 inputs only" in refusal(flash, parse_mode("fp32"), resolve_gpu("A100-80GB"))
    assert refusal(flash, parse_mode("bf16"), resolve_gpu("A100-80GB")) is None
    bf16_weights = _workload(attn="flash_attention_2", weights_dtype="bfloat16")
    assert refusal(bf16_weights, parse_mode("fp32"), resolve_gpu("A100-80GB")) is None


@pytest.mark.parametrize("gpu", ["T4", "P100-16GB", "V100-16GB", "TITAN-X-12GB"])
def test_bf16_on_a_card_without_bf16_warns_naming_the_card(gpu):
    warnings = step_warnings(_workload(), parse_modes("fp32,bf16,bf16+ckpt"), resolve_gpu(gpu))
    assert len(warnings) == 1
    assert warnings[0].startswith(f"{gpu} (compute capability ")
    assert "no native bfloat16 support, asked for by bf16 autocast (bf16, bf16+ckpt)" in warnings[0]
    weights = step_warnings(_workload(weights_dtype="bfloat16"), parse_modes("fp32"), resolve_gpu(gpu))
    assert "asked for by bfloat16 weights" in weights[0]


def test_no_bf16_warning_where_the_card_has_it_or_nothing_asks_for_it():
    assert step_warnings(_workload(), parse_modes("bf16"), resolve_gpu("A100-80GB")) == []
    assert step_warnings(_workload(), parse_modes("fp32,amp"), resolve_gpu("T4")) == []
    assert step_warnings(_workload(), parse_modes("bf16"), custom_gpu(12 << 30)) == []


# The default task of every preset: the decoders' (LLMs with architectures, GPT-2 and the tiny
# decoders by model type) is causal-lm; the encoders keep the stories' sequence-classification.
CAUSAL_LM_PRESETS = {
    "gpt2", "gpt2-medium", "tiny-gpt2", "tiny-llama", "tiny-qwen2", "tiny-mistral", "tiny-gemma2",
    "meta-llama/Llama-3.2-1B", "meta-llama/Llama-3.2-3B", "meta-llama/Llama-3.1-8B",
    "Qwen/Qwen2.5-0.5B", "Qwen/Qwen2.5-1.5B", "Qwen/Qwen2.5-7B", "mistralai/Mistral-7B-v0.3",
    "google/gemma-2-2b", "microsoft/Phi-3.5-mini-instruct",
    "HuggingFaceTB/SmolLM2-1.7B", "HuggingFaceTB/SmolLM2-135M", "HuggingFaceTB/SmolLM2-360M",
    "Qwen/Qwen2.5-14B", "Qwen/Qwen2.5-3B", "Qwen/Qwen3-0.6B", "Qwen/Qwen3-1.7B", "Qwen/Qwen3-14B",
    "Qwen/Qwen3-30B-A3B", "Qwen/Qwen3-32B", "Qwen/Qwen3-4B", "Qwen/Qwen3-8B", "google/gemma-2-9b",
    "google/gemma-3-1b-pt", "google/gemma-3-270m", "microsoft/phi-1_5", "microsoft/phi-2",
    "Qwen/Qwen3-235B-A22B", "deepseek-ai/DeepSeek-V2-Lite", "mistralai/Devstral-Small-2507",
    "openai/gpt-oss-20b", "tiny-mixtral", "tiny-gpt_oss", "tiny-qwen3",
    "Qwen/Qwen2.5-72B", "meta-llama/Meta-Llama-3-70B",
    "mistralai/Mixtral-8x7B-v0.1", "mistralai/Mixtral-8x22B-v0.1", "swiss-ai/Apertus-8B-Instruct-2509",
    "ByteDance-Seed/Seed-OSS-36B-Instruct", "allenai/Olmo-3-7B-Instruct-SFT",
    "CohereForAI/c4ai-command-r7b-12-2024", "nvidia/Nemotron-Mini-4B-Instruct", "LiquidAI/LFM2-350M",
    "LiquidAI/LFM2-8B-A1B", "Qwen/Qwen3.5-27B", "Qwen/Qwen3.5-35B-A3B", "Qwen/Qwen3-Next-80B-A3B-Instruct",
    "tiny-qwen3_5_text", "tiny-qwen3_5_moe_text", "tiny-qwen3_next", "tiny-qwen3_moe",
    "tiiuae/Falcon-H1-0.5B-Base", "tiiuae/Falcon-H1-34B-Base", "tiny-falcon_h1",
    "tiiuae/Falcon-H1-1.5B-Base", "tiiuae/Falcon-H1-3B-Base", "tiiuae/Falcon-H1-7B-Base",
    "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", "nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-BF16",
    "tiny-nemotron_h",
    "moonshotai/Kimi-Linear-48B-A3B-Instruct",
    "zai-org/GLM-4.5-Air", "zai-org/GLM-4.7-Flash", "tiny-glm4_moe", "tiny-glm4_moe_lite",
    "ai21labs/Jamba-v0.1", "ai21labs/AI21-Jamba-1.5-Large", "tiny-jamba",
    "meta-llama/Llama-3.1-405B", "openai/gpt-oss-120b", "deepseek-ai/DeepSeek-V2.5",
    "zai-org/GLM-4-32B-0414", "tiny-glm4",
    "arcee-ai/AFM-4.5B", "arcee-ai/Trinity-Nano-Preview", "tencent/Hunyuan-0.5B-Instruct",
    "deepseek-ai/DeepSeek-V3", "MiniMaxAI/MiniMax-M2", "tiny-deepseek_v3", "tiny-minimax_m2",
    "ibm-granite/granite-4.0-h-tiny", "tiny-granitemoehybrid", "zai-org/GLM-5", "tiny-glm_moe_dsa",
    "tiny-gemma4_text",
}


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_the_default_task_of_every_preset(name):
    expected = "causal-lm" if name in CAUSAL_LM_PRESETS else "sequence-classification"
    if "vision_config" in PRESETS[name]:  # a vision-language model's (workload/vision.py)
        expected = "image-text-to-text"
    assert infer_task(resolve_model(name).config)[0] == expected


@pytest.mark.parametrize(("name", "dtype"), [
    ("meta-llama/Llama-3.2-1B", "bfloat16"), ("Qwen/Qwen2.5-0.5B", "bfloat16"),
    ("mistralai/Mistral-7B-v0.3", "bfloat16"), ("bert-base-uncased", "float32"), ("tiny-llama", "float32"),
])
def test_auto_loads_a_presets_weights_in_its_published_dtype(name, dtype):
    assert resolve_dtype(resolve_model(name)) == dtype


def test_flash_attention_2_rows_are_full_and_the_estimator_runs_it():
    from autotune.analysis.check import check_step
    from autotune.backends.estimate.backend import EstimateBackend
    from autotune.workload.step import make_batch

    config = resolve_model("tiny-llama").config
    assert make_batch(config, "causal-lm", 2, 8)["attention_mask"][:, -1].tolist() == [0, 0]  # padded
    assert make_batch(config, "causal-lm", 2, 8, attn="flash_attention_2")["attention_mask"].all()
    gpu = resolve_gpu("A100-80GB")
    workload = Workload(resolve_model("tiny-llama"), "causal-lm", "flash_attention_2")
    result = check_step(workload, EstimateBackend(gpu), gpu, seq_len=64, batch_size=2,
                        mode=parse_mode("bf16"), margin=0.05)
    assert result.fits and result.attn == "flash_attention_2"


@pytest.mark.parametrize("reentrant", [False, True])
def test_checkpointing_recomputes_under_the_second_context_either_way(reentrant):
    # context_fn's second context wraps the recompute inside backward (the estimator's CUDA
    # emulation): torch takes it for use_reentrant=False, step.py wraps the function for True.
    import contextlib

    import torch

    from autotune.workload.step import build_model, gradient_checkpointing

    spec = resolve_model("tiny-llama")
    model, _ = build_model(spec, "causal-lm", "eager")
    model.train()
    entered = {"forward": 0, "backward": 0}

    @contextlib.contextmanager
    def recompute():
        entered["backward" if torch._C._current_graph_task_id() != -1 else "forward"] += 1
        yield

    kwargs = {"use_reentrant": reentrant, "context_fn": lambda: (contextlib.nullcontext(), recompute())}
    ids = torch.randint(0, spec.config.vocab_size, (2, 8))
    with gradient_checkpointing(model, True, kwargs):
        model(input_ids=ids, labels=ids).loss.backward()
    assert entered == {"forward": 0, "backward": spec.config.num_hidden_layers}
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
