"""LLaMA-Factory v1's training YAML (src/llamafactory/v1): read as its SFT trainer runs it, its
defaults noted, what autotune does not model refused by name, and its FSDP2 step (the
``llamafactory`` recipe: v1's wrapping and its loss) traced.

The configs below follow LLaMA-Factory's examples/v1 (commit ff6d4d1, 2026-08); "v1" below is
LLaMA-Factory's src/llamafactory/v1/."""

from __future__ import annotations

import json
from pathlib import Path

import configread
import pytest
import yaml
from configread import Read

from autotune.cli import main
from autotune.configs import read_training_config
from autotune.errors import InvalidInput, UnknownSetting, UnmodelledSetting
from autotune.workload.adapters import Adapter

EXAMPLES = Path(__file__).parents[3] / "examples"

# examples/v1/train_full/train_full_fsdp2.yaml
FULL = {"model": "Qwen/Qwen3-0.6B", "model_class": "llm", "kernel_config": {"name": "auto"},
        "quant_config": None, "dist_config": {"name": "fsdp2", "dcp_path": None},
        "train_dataset": "data/v1_sft_demo.yaml", "output_dir": "outputs/test_fsdp2", "micro_batch_size": 1,
        "cutoff_len": 2048, "learning_rate": 1.0e-4, "max_steps": 10, "sample_backend": "hf",
        "max_new_tokens": 128}
# examples/v1/train_lora/train_lora_sft.yaml
LORA = {**FULL, "model": "Qwen/Qwen3-4B",
        "peft_config": {"name": "lora", "r": 16, "lora_alpha": 32, "lora_dropout": 0.05,
                        "target_modules": "all"}}
# examples/v1/train_qlora/quantization.yaml
QLORA = {**LORA, "model": "Qwen/Qwen3-0.6B", "quant_config": {"name": "bnb", "quantization_bit": 4}}


def read(tmp_path: Path, data: dict, name: str = "v1.yaml") -> Read:
    return configread.read(tmp_path, data, name)


def noted(plan: Read, start: str) -> str:
    return next(note for note in plan.notes if note.startswith(start))


# ---------------------------------------------------------------------------------------------
# What v1 runs, read


def test_a_full_fsdp2_config_is_read_as_v1_runs_it(tmp_path):
    plan = read(tmp_path, FULL)
    assert plan.format == "llamafactory" and plan.notes[0].startswith("LLaMA-Factory v1 config")
    assert (plan.model, plan.seq_len, plan.batch_size, plan.mode.name, plan.dtype, plan.optimizer, plan.attn,
            plan.task, plan.adapter, plan.ckpt_reentrant) == (
        "Qwen/Qwen3-0.6B", 2048, 1, "bf16+ckpt", "float32", "adamw_torch", "sdpa", "causal-lm", None, None)
    # FSDP2 by v1's own recipe; the GPU count is the launcher's
    assert (plan.parallel, plan.fsdp_recipe, plan.reshard_after_forward, plan.gpus, plan.parallel_key) == (
        "fsdp", "llamafactory", True, None, "dist_config")
    assert plan.ignored == ()
    assert "model.to(torch.float32)" in noted(plan, "peft_config: not set: full fine-tuning")
    assert "use_reentrant=False" in noted(plan, "enable_activation_checkpointing: not set, v1's default true")
    assert "get_mp_policy" in noted(plan, "bf16: not set, v1's default true")
    assert "_init_optimizer" in noted(plan, "optim_config: not set: torch.optim.AdamW")
    assert "no kernel on a CUDA GPU" in noted(plan, "kernel_config: auto")
    assert "text rows" in noted(plan, "train_dataset: 'data/v1_sft_demo.yaml'")


def test_v1_defaults_are_its_dataclasses(tmp_path):
    plan = read(tmp_path, {"train_dataset": "d.yaml", "dist_config": {"name": "fsdp2"}})
    assert (plan.model, plan.seq_len, plan.batch_size, plan.mode.name, plan.attn) == (
        "Qwen/Qwen3-4B-Instruct-2507", 2048, 1, "bf16+ckpt", "sdpa")
    for start in ("model: not set, v1's default", "micro_batch_size: not set, v1's default 1",
                  "cutoff_len: not set, v1's default 2048", "flash_attn: not set, v1's default sdpa",
                  "batching_strategy: not set, v1's default normal"):
        noted(plan, start)


@pytest.mark.parametrize(("changes", "mode"), [
    ({"bf16": False}, "ckpt"),
    ({"enable_activation_checkpointing": False}, "bf16"),
    ({"bf16": False, "enable_activation_checkpointing": False}, "fp32"),
])
def test_precision_and_checkpointing(tmp_path, changes, mode):
    plan = read(tmp_path, {**FULL, **changes})
    assert plan.mode.name == mode and plan.ckpt_reentrant is None  # v1 checkpoints use_reentrant=False


def test_lora_is_read_from_peft_config(tmp_path):
    plan = read(tmp_path, LORA)
    assert plan.adapter == Adapter("lora", r=16, alpha=32, dropout=0.05, targets=("all-linear",))
    assert plan.dtype == "auto"  # from_pretrained(dtype="auto"); PEFT's adapters float32
    assert "_find_all_linear_modules" in noted(plan, "peft_config.target_modules: all")
    # LoraParams' defaults: r 8, lora_alpha 16, lora_dropout 0.05, target_modules all
    plan = read(tmp_path, {**FULL, "peft_config": {"name": "lora"}})
    assert plan.adapter == Adapter("lora", r=8, alpha=16, dropout=0.05, targets=("all-linear",))
    noted(plan, "peft_config: r, lora_alpha, lora_dropout not set, v1's LoraParams defaults 8, 16, 0.05")
    # a string other than all is one module's name, a list names several
    plan = read(tmp_path, {**FULL, "peft_config": {"name": "lora", "target_modules": "q_proj"}})
    assert plan.adapter.targets == ("q_proj",)
    plan = read(tmp_path, {**FULL, "peft_config": {"name": "lora", "target_modules": ["q_proj", "v_proj"],
                                                   "modules_to_save": ["lm_head"], "export_dir": "out"}})
    assert (plan.adapter.targets, plan.adapter.modules_to_save) == (("q_proj", "v_proj"), ("lm_head",))
    assert "no effect on training" in noted(plan, "peft_config: export_dir: read only by")


def test_a_json_string_plugin_config_is_read_as_v1_reads_it(tmp_path):
    plan = read(tmp_path, {**FULL, "peft_config": '{"name": "lora", "r": "4", "lora_alpha": "8"}'})
    assert (plan.adapter.r, plan.adapter.alpha) == (4, 8)


def test_a_saved_adapter_is_trained_on(tmp_path):
    folder = tmp_path / "adapter"
    folder.mkdir()
    (folder / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "r": 4, "lora_alpha": 8, "lora_dropout": 0.0, "target_modules": ["q_proj"],
        "base_model_name_or_path": "Qwen/Qwen3-4B"}))
    plan = read(tmp_path, {**FULL, "peft_config": {"name": "lora", "adapter_name_or_path": "adapter"}})
    assert (plan.adapter.r, plan.adapter.alpha, plan.adapter.targets) == (4, 8, ("q_proj",))
    with pytest.raises(InvalidInput, match="has no adapter_config.json here"):
        read(tmp_path, {**FULL, "peft_config": {"name": "lora", "adapter_name_or_path": "missing"}})
    with pytest.raises(InvalidInput, match="names 2 adapters: v1 trains on from a single one"):
        read(tmp_path, {**FULL, "peft_config": {"name": "lora", "adapter_name_or_path": ["a", "b"]}})


def test_qlora_is_read_from_quant_config(tmp_path):
    plan = read(tmp_path, QLORA)
    # quantization.py BnbParams: float16 compute, nf4, double quantization; no prepare_model_for_kbit_training
    assert plan.adapter == Adapter("qlora", r=16, alpha=32, dropout=0.05, targets=("all-linear",),
                                   quant_type="nf4", double_quant=True, compute_dtype="float16",
                                   recipe="axolotl")
    noted(plan, "quant_config: compute_dtype, quantization_type, double_quantization not set")
    plan = read(tmp_path, {**QLORA, "quant_config": {"name": "bnb", "quantization_bit": 4, "compute_dtype":
                                                     "bfloat16", "quantization_type": "fp4"}})
    assert (plan.adapter.compute_dtype, plan.adapter.quant_type) == ("bfloat16", "fp4")
    plan = read(tmp_path, {**QLORA, "quant_config": {"name": "bnb"}})  # bnb: 4 bits unless told 8
    assert plan.adapter.method == "qlora"
    plan = read(tmp_path, {**QLORA, "quant_config": {"name": "bnb", "quantization_bit": 8}})
    assert (plan.adapter.method, plan.adapter.recipe) == ("lora_8bit", "axolotl")
    plan = read(tmp_path, {**QLORA, "quant_config": {"name": "auto"}})  # auto: nothing without a bit count
    assert plan.adapter.method == "lora"


@pytest.mark.parametrize(("changes", "error", "match"), [
    ({"quant_config": {"name": "bnb", "quantization_bit": 3}}, InvalidInput, "4 or 8"),
    ({"quant_config": {"name": "gptq"}}, InvalidInput, "bnb or auto"),
    ({"quant_config": {"name": "bnb", "quantisation_bit": 4}}, UnknownSetting,
     "unknown key quant_config.quantisation_bit.*did you mean quantization_bit"),
    ({"peft_config": None}, InvalidInput, "quant_config .* without peft_config"),
])
def test_quantization_that_v1_refuses_is_refused(tmp_path, changes, error, match):
    with pytest.raises(error, match=match):
        read(tmp_path, {**QLORA, **changes})


# ---------------------------------------------------------------------------------------------
# The sequence: batching strategies


def test_batching_strategies(tmp_path):
    packed = read(tmp_path, {**FULL, "batching_strategy": "padding_free", "flash_attn": "flash_attention_2",
                             "micro_batch_size": 4})
    assert (packed.seq_len, packed.batch_size, packed.attn) == (2048, 4, "flash_attention_2")
    assert "the same memory as micro_batch_size full rows" in noted(packed, "batching_strategy: padding_free")
    dynamic = read(tmp_path, {**FULL, "batching_strategy": "dynamic_batching", "micro_batch_size": 2})
    assert (dynamic.seq_len, dynamic.batch_size) == (2048, 2)
    noted(dynamic, "batching_strategy: dynamic_batching")
    with pytest.raises(InvalidInput, match="padding_free .* needs flash_attn: flash_attention_2"):
        read(tmp_path, {**FULL, "batching_strategy": "padding_free"})
    with pytest.raises(UnmodelledSetting, match="^batching_strategy: 'dynamic_padding_free' .* "
                                                "block-diagonally"):
        read(tmp_path, {**FULL, "batching_strategy": "dynamic_padding_free", "flash_attn": "eager"})
    with pytest.raises(InvalidInput, match="dynamic_batching .* needs max_steps"):
        read(tmp_path, {**FULL, "batching_strategy": "dynamic_batching", "max_steps": None})
    with pytest.raises(InvalidInput, match="batching_strategy .* must be one of normal, padding_free"):
        read(tmp_path, {**FULL, "batching_strategy": "packed"})
    with pytest.raises(InvalidInput, match="flash_attn .* must be one of eager, sdpa, flash_attention_2"):
        read(tmp_path, {**FULL, "flash_attn": "fa2"})


# ---------------------------------------------------------------------------------------------
# The GPUs: dist_config and the mesh


def test_dist_config(tmp_path):
    kept = read(tmp_path, {**FULL, "dist_config": {"name": "fsdp2", "reshard_after_forward": False,
                                                   "pin_memory": True}})
    assert (kept.parallel, kept.reshard_after_forward, kept.fsdp_recipe) == ("fsdp", False, "llamafactory")
    noted(kept, "dist_config.pin_memory: True: no effect on GPU memory: read only with offload_params")
    # FSDP2Engine.prepare_model: CPUOffloadPolicy(pin_memory) on every group it shards
    offloaded = read_training_config(configread.write(tmp_path, {
        **FULL, "dist_config": {"name": "fsdp2", "offload_params": True, "pin_memory": True}}, "off.yaml"))
    step = offloaded.request.step
    assert (step.parallel, step.fsdp_recipe, step.offload_params) == ("fsdp", "llamafactory", True)
    assert any(note.startswith("dist_config.offload_params: True: FSDP2's CPU offload")
               for note in offloaded.notes)
    assert any(note.startswith("dist_config.pin_memory: True: no effect on GPU memory: pinned or pageable")
               for note in offloaded.notes)
    # DeepSpeed: the ZeRO stage read (LLaMA-Factory's shipped file, or a local one), refused by the request
    zero3 = read(tmp_path, {**FULL, "dist_config": {"name": "deepspeed",
                                                    "config_file": "examples/deepspeed/ds_z3_config.json"}})
    assert (zero3.parallel, zero3.parallel_key) == ("zero3", "dist_config")
    (tmp_path / "ds.json").write_text(json.dumps({"zero_optimization": {"stage": 2}}))
    zero2 = read(tmp_path, {**FULL, "dist_config": {"name": "deepspeed", "config_file": "ds.json"}})
    assert zero2.parallel == "zero2"


@pytest.mark.parametrize(("changes", "error", "match"), [
    ({"dist_config": None}, UnmodelledSetting,
     "^dist_config: None .* set dist_config: {name: fsdp2} and give --gpus 1"),
    ({"dist_config": {"name": "fsdp2", "offload_params": "yes"}}, InvalidInput,
     "dist_config.offload_params in .* must be true or false, got 'yes'"),
    ({"dist_config": {"name": "fsdp2", "reshard_after_foward": False}}, UnknownSetting,
     "unknown key dist_config.reshard_after_foward.*did you mean reshard_after_forward"),
    ({"dist_config": {"name": "fsdpturbo", "ep_size": 16}}, UnmodelledSetting,
     "^dist_config.name: 'fsdpturbo'"),
    ({"dist_config": {"name": "deepspeed"}}, InvalidInput, "needs a config_file"),
    ({"dist_config": {"name": "ddp"}}, InvalidInput, "fsdp2, deepspeed or fsdpturbo"),
    ({"dist_config": {"dcp_path": None}}, InvalidInput, "dist_config .* has no name"),
    ({"cp_size": 2, "cp_mode": "ulysses"}, UnmodelledSetting, "^cp_size: 2 .* context parallelism"),
    ({"mp_replicate_size": 2}, UnmodelledSetting, "^mp_replicate_size: 2 .* hybrid sharding"),
])
def test_what_spreads_the_job_unmodelled_is_refused(tmp_path, changes, error, match):
    with pytest.raises(error, match=match):
        read(tmp_path, {**FULL, **changes})


# ---------------------------------------------------------------------------------------------
# Preference training, and the rest refused by name


def test_preference_training_is_refused_by_name(tmp_path):
    preference = "v1's preference trainers .* are not modelled: autotune models v1's sft"
    # examples/v1/train_lora/train_lora_dpo.yaml: LLaMA-Factory's shipped pair data
    with pytest.raises(UnmodelledSetting, match=f"^train_dataset: 'data/v1_dpo_demo.yaml' .* {preference}"):
        read(tmp_path, {**LORA, "train_dataset": "data/v1_dpo_demo.yaml"})
    (tmp_path / "pairs.yaml").write_text(yaml.safe_dump({"mine": {"path": "p.jsonl", "converter": "pair"}}))
    with pytest.raises(UnmodelledSetting, match=f"^train_dataset: 'pairs.yaml' .* {preference}"):
        read(tmp_path, {**LORA, "train_dataset": "pairs.yaml"})
    with pytest.raises(UnmodelledSetting, match=f"^pref_beta: 0.1 .* {preference}.* DPOTrainer"):
        read(tmp_path, {**LORA, "pref_beta": 0.1})
    with pytest.raises(UnmodelledSetting, match=f"^model_class: 'cls' .* {preference}.* run_rm"):
        read(tmp_path, {**LORA, "model_class": "cls"})


@pytest.mark.parametrize(("changes", "error", "match"), [
    ({"peft_config": {"name": "freeze", "freeze_trainable_layers": 2}}, UnmodelledSetting,
     "^peft_config.name: 'freeze' .* training only some layers"),
    ({"peft_config": {"name": "lora", "use_dora": True}}, UnmodelledSetting,
     "^peft_config.use_dora: True .* DoRA"),
    ({"peft_config": {"name": "lora", "rank": 8}}, UnknownSetting, "unknown key peft_config.rank"),
    ({"kernel_config": {"name": "liger_kernel"}}, UnmodelledSetting,
     "^kernel_config.name: 'liger_kernel' .* Liger's cross_entropy"),
    ({"kernel_config": {"name": "auto, flash-linear-attention"}}, UnmodelledSetting,
     "flash-linear-attention: a swapped-in kernel"),
    ({"kernel_config": {"name": "npu_fused_rmsnorm"}}, InvalidInput, "an Ascend NPU kernel"),
    ({"kernel_config": {"name": "auto", "chunksize": 64}}, UnknownSetting,
     "unknown key kernel_config.chunksize.*did you mean chunk_size"),
    ({"optim_config": {"name": "muon", "wd": 0.1}}, UnmodelledSetting, "^optim_config.name: 'muon' .* Muon"),
    ({"model_class": "other"}, UnmodelledSetting, "without a language-model head"),
    ({"train_dataset": "data/v1_multimodal_demo.yaml"}, UnmodelledSetting, "rows with images"),
    ({"init_config": {"name": "init_on_meta"}, "peft_config": {"name": "lora"}}, InvalidInput,
     "init_on_meta with a LoRA"),
    ({"micro_batch_sise": 2}, UnknownSetting, "unknown key micro_batch_sise.*did you mean micro_batch_size"),
    ({"stage": "sft"}, InvalidInput, "mixes LLaMA-Factory's classic keys \\(stage\\) with v1's"),
])
def test_what_v1_runs_unmodelled_is_refused_by_name(tmp_path, changes, error, match):
    with pytest.raises(error, match=match):
        read(tmp_path, {**FULL, **changes})


def test_keys_with_no_effect_are_read_without_a_word(tmp_path):
    plan = read(tmp_path, {**FULL, "init_config": {"name": "init_on_rank0"}, "global_batch_size": 16,
                           "lr_scheduler_config": {"name": "cosine"}, "save_ckpt_as_hf": True, "seed": 1,
                           "eval_dataset": "e.yaml", "trust_remote_code": True, "dp_size": 8})
    assert plan.ignored == () and plan.accumulation_steps == 1
    for start in ("init_config: init_on_rank0", "global_batch_size: 16", "save_ckpt_as_hf", "dp_size: 8"):
        assert "no effect" in noted(plan, start)


def test_v1_is_told_apart_by_its_own_keys(tmp_path):
    # v1's model and micro_batch_size alone are autotune's and Axolotl's keys too
    assert read(tmp_path, {"model": "tiny-llama", "micro_batch_size": 2, "train_dataset": "d.yaml",
                           "dist_config": {"name": "fsdp2"}}).notes[0].startswith("LLaMA-Factory v1 config")
    assert read(tmp_path, {"model": "tiny-llama", "peft_config": {"name": "lora"},
                           "dist_config": {"name": "fsdp2"}}).adapter.method == "lora"


def test_the_examples_are_read_whole():
    lora = read_training_config(EXAMPLES / "llamafactory_v1_lora_fsdp2.yaml")
    step = lora.request.step
    assert (lora.format, step.model, lora.request.seq_len, lora.request.batch_size, step.fsdp_recipe,
            lora.ignored) == ("llamafactory", "Qwen/Qwen3-4B", 4096, 2, "llamafactory", ())
    assert step.adapter == Adapter("lora", r=32, alpha=64, dropout=0.0, targets=("all-linear",))
    full = read_training_config(EXAMPLES / "llamafactory_v1_full_padding_free.yaml")
    assert (full.request.step.attn, full.request.step.dtype, full.request.batch_size, full.ignored) == (
        "flash_attention_2", "float32", 8, ())


# ---------------------------------------------------------------------------------------------
# v1's step: its FSDP2 wrapping and its loss (backends/distributed.py shard_as_llamafactory)


def v1_rank(gpus: int, adapter=None):
    from autotune.backends.estimate.backend import EstimateBackend
    from autotune.gpus import resolve_gpu
    from autotune.workload import Workload
    from autotune.workload.models import resolve_model
    from autotune.workload.parallel import Parallel

    workload = Workload(resolve_model("tiny-llama"), "causal-lm", None, weights_dtype="bfloat16",
                        adapter=adapter, parallel=Parallel("fsdp", gpus, recipe="llamafactory"))
    return EstimateBackend(resolve_gpu("A100-80GB"))._model(workload, "bf16")


def test_v1_wraps_the_model_as_its_fsdp2_engine_does():
    from torch.distributed.fsdp import FSDPModule, fully_shard
    from torch.distributed.tensor import DTensor

    from autotune.workload.adapters import make_adapter

    fake = v1_rank(4, make_adapter("lora", r=4, targets=["q_proj"]))
    model, loss = fake.model, fake.distributed.forward(fake.model)
    sharded = {name for name, module in model.named_modules() if isinstance(module, FSDPModule)}
    base = "base_model.model.model"
    # the root, each decoder layer, tiny-llama's untied embedding, each LoRA layer's trainable leaves
    lora = f"{base}.layers.0.self_attn.q_proj"
    assert {"", f"{base}.embed_tokens", f"{base}.layers.0", f"{lora}.lora_A.default",
            f"{lora}.lora_B.default"} <= sharded
    assert not any(name.endswith("lm_head") or name.endswith("norm") for name in sharded)  # no tail group
    policy = fully_shard.state(model)._mp_policy  # fsdp2.py get_mp_policy
    assert (str(policy.param_dtype), str(policy.reduce_dtype), policy.output_dtype) == (
        "torch.bfloat16", "torch.float32", None)
    # no float32 upcast: the frozen base stays in the weights' dtype; the loss is computed outside the root
    weight = model.base_model.model.model.layers[0].mlp.down_proj.weight
    assert isinstance(weight, DTensor) and str(weight.dtype) == "torch.bfloat16"
    assert type(loss).__name__ == "LlamaFactorySFTLoss" and not isinstance(loss, FSDPModule)
    # on one GPU v1 has no process group: nothing is wrapped
    single = v1_rank(1)
    assert not any(isinstance(module, FSDPModule) for module in single.model.modules())


def test_v1s_loss_is_the_sft_trainers():
    import torch
    import torch.nn.functional as F
    from transformers import AutoModelForCausalLM

    from autotune.backends.distributed import _llamafactory_loss
    from autotune.workload.models import resolve_model

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(resolve_model("tiny-llama").config)
    calls = []
    model.register_forward_hook(lambda module, args, kwargs, output: calls.append(set(kwargs)),
                                with_kwargs=True)
    ids = torch.randint(0, 128, (2, 16))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}
    loss = _llamafactory_loss()(model)(**batch)
    assert "labels" in calls[0]  # v1 passes every tensor of the batch: transformers' own loss runs too
    logits = model(input_ids=ids).logits.float()
    expected = F.cross_entropy(logits[:, :-1].reshape(-1, 128), ids[:, 1:].reshape(-1))
    assert torch.allclose(loss, expected, atol=1e-5)
    loss.backward()


# ---------------------------------------------------------------------------------------------
# Through the CLI


def write(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / "v1.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


TINY = {"model": "tiny-llama", "peft_config": {"name": "lora", "r": 8, "lora_alpha": 16},
        "dist_config": {"name": "fsdp2"}, "train_dataset": "data/v1_sft_demo.yaml", "micro_batch_size": 2,
        "cutoff_len": 64}


@pytest.mark.parametrize("gpus", [1, 2])
def test_check_answers_a_v1_lora_config(tmp_path, capsys, gpus):
    path = write(tmp_path, TINY)
    code = main(["check", "tiny-llama", "--from-config", str(path), "--gpu-memory", "4GiB",
                 "--gpus", str(gpus), "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0 and doc["fits"] is True
    assert (doc["seq_len"], doc["batch_size"], doc["mode"], doc["optimizer"], doc["parallel"]["recipe"],
            doc["parallel"]["gpus"]) == (64, 2, "bf16+ckpt", "adamw_torch", "llamafactory", gpus)
    assert (doc["adapter"]["method"], doc["adapter"]["r"], doc["adapter"]["alpha"]) == ("lora", 8, 16)
    assert doc["config_notes"][:2] == [f"read {path} as llamafactory", doc["config_notes"][1]]
    assert doc["config_notes"][1].startswith("LLaMA-Factory v1 config")
    assert doc["ignored_keys"] == []


def test_check_asks_for_the_gpus_of_a_sharded_v1_config(tmp_path, capsys):
    path = write(tmp_path, TINY)
    code = main(["check", "tiny-llama", "--from-config", str(path), "--gpu-memory", "4GiB", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 2 and "fsdp (dist_config)" in doc["error"] and "--gpus" in doc["error"]
