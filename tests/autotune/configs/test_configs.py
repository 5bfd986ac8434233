"""read_training_config: each format read whole, every unmodelled key refused by name."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import configread
import pytest
import yaml
from configread import Read, view

from autotune.configs import missing_fields, read_training_config
from autotune.configs.axolotl import UPCAST_NOTE
from autotune.configs.trainer import LEGACY_TRAINER_FIELDS, TRAINER_FIELDS
from autotune.errors import InvalidInput, UnknownSetting, UnmodelledSetting
from autotune.gpus import resolve_gpu
from autotune.request import CheckRequest, request_from
from autotune.workload.adapters import Adapter
from autotune.workload.modes import Mode

EXAMPLES = Path(__file__).parents[3] / "examples"

TRAINER = {"model_name_or_path": "tiny-bert", "max_seq_length": 64, "per_device_train_batch_size": 8,
           "gradient_accumulation_steps": 4, "fp16": True, "gradient_checkpointing": True,
           "optim": "adamw_torch", "torch_dtype": "float32", "output_dir": "out", "learning_rate": 5e-5}
SFT = {"model_name_or_path": "Qwen/Qwen2.5-0.5B", "max_length": 2048, "per_device_train_batch_size": 2,
       "packing": True, "bf16": True, "dataset_text_field": "text",
       "model_init_kwargs": {"dtype": "bfloat16", "attn_implementation": "flash_attention_2"}}
# A TRL DPOConfig: precompute_ref_log_probs is DPOConfig's (and KTOConfig's) alone.
DPO_CONFIG = {"model_name_or_path": "meta-llama/Llama-3.2-1B", "per_device_train_batch_size": 4,
              "max_length": 1024, "beta": 0.1, "precompute_ref_log_probs": False}
AXOLOTL = {"base_model": "meta-llama/Llama-3.2-1B", "sequence_len": 4096, "micro_batch_size": 2,
           "gradient_accumulation_steps": 8, "bf16": True, "attn_implementation": "flash_attention_2",
           "gradient_checkpointing": True, "gradient_checkpointing_kwargs": {"use_reentrant": False},
           "optimizer": "paged_adamw_8bit", "sample_packing": True, "wandb_project": None,
           "learning_rate": 2e-5, "datasets": [{"path": "tatsu-lab/alpaca", "type": "alpaca"}]}


def write(tmp_path: Path, data: dict, name: str = "config.json") -> Path:
    return configread.write(tmp_path, data, name)


def read(tmp_path: Path, data: dict, name: str = "config.json") -> Read:
    return configread.read(tmp_path, data, name)


def request(**values) -> CheckRequest:
    return request_from(CheckRequest, values)


def test_training_arguments_are_read_whole(tmp_path):
    plan = read(tmp_path, TRAINER)
    assert (plan.format, plan.notes, plan.ignored) == ("trainer", (), ())
    assert plan.request == request(model="tiny-bert", seq_len=64, batch_size=8, mode="amp+ckpt",
                                   accumulation_steps=4, dtype="float32", optimizer="adamw_torch")


def test_training_arguments_defaults_and_script_model_arguments(tmp_path):
    plan = read(tmp_path, {"output_dir": "out", "bf16": True, "activation_checkpointing": True,
                           "torch_dtype": "torch.bfloat16", "attn_implementation": "sdpa"})
    assert (plan.batch_size, plan.mode, plan.dtype, plan.attn) == (8, Mode("bf16", True), "bfloat16", "sdpa")
    assert "per_device_train_batch_size: not set, the Trainer's default 8" in plan.notes
    assert plan.ignored == ()


@pytest.mark.parametrize(("base", "typo", "meant"), [
    # issue 40: a typo listed as "ignored" answered a job without checkpointing
    (SFT, "gradient_checkpoint", "gradient_checkpointing"),
    (AXOLOTL, "micro_batch_sise", "micro_batch_size"),
    (TRAINER, "per_device_train_batch_sizes", "per_device_train_batch_size"),
    ({"model": "tiny-bert", "seq_len": 64, "batch_size": 8}, "seq_lens", "seq_len"),
])
def test_a_key_the_format_does_not_have_is_refused_with_the_closest(tmp_path, base, typo, meant):
    name = "a.yml" if base is AXOLOTL else "plan.yaml" if "model" in base else "config.json"
    with pytest.raises(UnknownSetting, match=rf"^unknown key {typo} in .*did you mean {meant}\b"):
        read(tmp_path, {**base, typo: True}, name)
    # with an adapter, a lora_* key the tool does not know is refused too
    with pytest.raises(UnknownSetting, match="^unknown key lora_unknown in "):
        read(tmp_path, {**AXOLOTL_QLORA, "lora_unknown": 1}, "b.yml")


def test_model_init_kwargs_are_read(tmp_path):
    plan = read(tmp_path, {**SFT, "model_init_kwargs": {
        "torch_dtype": "float16", "revision": "main", "attn_implementation": "kernels-community/flash-attn2",
        "custom": 1}})
    assert (plan.dtype, plan.attn) == ("float16", "flash_attention_2")
    assert plan.ignored == ("model_init_kwargs.custom",)


def test_trl_sft_config_is_read_whole(tmp_path):
    plan = read(tmp_path, SFT)
    assert (plan.format, plan.model, plan.seq_len, plan.batch_size, plan.mode, plan.task) == (
        "trl-sft", "Qwen/Qwen2.5-0.5B", 2048, 2, Mode("bf16", True), "causal-lm")
    assert (plan.dtype, plan.attn, plan.loss, plan.optimizer) == (
        "bfloat16", "flash_attention_2", "chunked_nll", "adamw_torch_fused")
    assert "packing: every row filled to seq_len (the padded worst case autotune models)" in plan.notes


def test_trl_s_loss_type_is_chunked_nll_unless_liger_runs(tmp_path):
    # sft_config.py __post_init__: unset, "nll" with use_liger_kernel, else "chunked_nll"
    default = "loss_type: not set, TRL's default chunked_nll"
    assert any(n.startswith(default) for n in read(tmp_path, SFT).notes)
    liger = read(tmp_path, {**SFT, "use_liger_kernel": True}, "b.json")
    assert liger.loss == "chunked"  # Liger's fused linear cross-entropy, its default kernel
    assert "loss_type: not set, TRL's default nll with use_liger_kernel (sft_config.py)" in liger.notes
    # sft_trainer.py: chunked_nll with use_liger_kernel raises
    with pytest.raises(InvalidInput, match="not compatible with `use_liger_kernel=True`"):
        read(tmp_path, {**SFT, "use_liger_kernel": True, "loss_type": "chunked_nll"}, "c.json")


def test_trl_sft_defaults_are_trls(tmp_path):
    plan = read(tmp_path, {"dataset_text_field": "text", "loss_type": "nll", "pad_to_multiple_of": 100})
    # TRL: bf16 and checkpointing on, max_length 1024, weights in float32 (create_model_from_path).
    assert (plan.mode, plan.seq_len, plan.dtype, plan.loss) == (Mode("bf16", True), 1100, "float32", "full")
    assert "max_length: not set, TRL's default 1024" in plan.notes
    assert "pad_to_multiple_of: 100: rows padded to 1100 tokens" in plan.notes
    assert read(tmp_path, {"packing": False, "fp16": True, "max_seq_length": 512}).mode == Mode("amp", True)


def test_axolotl_config_is_read_whole(tmp_path):
    plan = read(tmp_path, {**AXOLOTL}, "axolotl.yml")
    assert plan.request == request(
        model="meta-llama/Llama-3.2-1B", seq_len=4096, batch_size=2, mode="bf16+ckpt", accumulation_steps=8,
        task="causal-lm", dtype="bfloat16", optimizer="paged_adamw_8bit", attn="flash_attention_2",
        axolotl=True)  # Axolotl's own patches apply (gemma4_fused_attn.py)
    assert (plan.format, plan.ignored) == ("axolotl", ())
    assert plan.notes == (
        "bf16: true: Axolotl loads the weights in bfloat16 and trains under bf16 autocast",
        "sample_packing: every row filled to seq_len (the padded worst case autotune models)")


def test_axolotl_s_pinned_model_revision_is_read_as_the_same_model(tmp_path):
    # revision_of_model (loaders/model.py: from_pretrained's revision) pins a commit of the checkpoint
    plan = read(tmp_path, {**AXOLOTL, "revision_of_model": "a1b2c3d"}, "axolotl.yml")
    assert plan.request == read(tmp_path, {**AXOLOTL}, "axolotl.yml").request


def test_axolotl_s_eta_min_is_a_key_axolotl_drops(tmp_path):
    # qat_nvfp4/Math-*: eta_min is no field of AxolotlInputConfig, whose model_dump drops it
    plan = read(tmp_path, {**AXOLOTL, "lr_scheduler": "cosine", "eta_min": 7e-7}, "axolotl.yml")
    assert plan.request == read(tmp_path, {**AXOLOTL}, "axolotl.yml").request


def test_axolotl_defaults_and_global_batch(tmp_path):
    plan = read(tmp_path, {"base_model": "m", "micro_batch_size": 4, "batch_size": 32, "bf16": False},
                "a.yaml")
    assert (plan.accumulation_steps, plan.optimizer, plan.mode, plan.dtype) == (
        8, "adamw_torch_fused", Mode("fp32", False), "float32")
    assert "optimizer: not set, Axolotl's default adamw_torch_fused" in plan.notes
    # bf16 unset is the schema's "auto" (utils/schemas/config.py): true on a card with bfloat16, which a
    # file read without --gpu does not name
    with pytest.raises(InvalidInput, match="bf16: 'auto' .*name the card"):
        read(tmp_path, {"base_model": "m", "micro_batch_size": 4}, "a.yaml")
    found = view(read_training_config(configread.write(tmp_path, {
        "base_model": "m", "micro_batch_size": 4, "flash_attention": True}, "a.yaml"),
        card=resolve_gpu("H100-80GB")))
    assert found.mode == Mode("bf16", False) and found.dtype == "bfloat16"
    assert "bf16: not set: Axolotl's default auto (utils/schemas/config.py)" in found.notes
    assert read(tmp_path, {"base_model": "m", "sdp_attention": True, "bf16": False}, "a.yaml").attn == "sdpa"
    assert read(tmp_path, {"base_model": "m", "cut_cross_entropy": True, "bf16": True},
                "a.yaml").loss == "cce"


def test_autotune_format_is_read_whole(tmp_path):
    plan = read(tmp_path, {"model": "tiny-bert", "seq_len": 64, "batch_size": 8, "mode": "amp+ckpt",
                           "task": "masked-lm", "optimizer": "adamw", "dtype": "bf16", "attn": "eager",
                           "loss": "chunked"}, "plan.yaml")
    assert plan.request == request(model="tiny-bert", seq_len=64, batch_size=8, mode="amp+ckpt",
                                   task="masked-lm", dtype="bfloat16", optimizer="adamw", attn="eager",
                                   loss="chunked")
    assert (plan.format, plan.ignored) == ("autotune", ())
    assert missing_fields(read(tmp_path, {"model": "m"}, "p.yaml")) == ["seq_len", "batch_size"]


def test_the_examples_are_read():
    trainer = view(read_training_config(EXAMPLES / "trainer_args.json"))
    assert (trainer.format, trainer.model, trainer.seq_len, trainer.batch_size, trainer.mode.name,
            trainer.task) == ("trainer", "bert-base-uncased", 128, 32, "amp", "sequence-classification")
    sft = view(read_training_config(EXAMPLES / "sft_config.json"))
    assert (sft.format, sft.model, sft.seq_len, sft.mode.name, sft.attn) == (
        "trl-sft", "Qwen/Qwen2.5-0.5B", 2048, "bf16+ckpt", "flash_attention_2")
    full = view(read_training_config(EXAMPLES / "axolotl_full.yml"))
    assert (full.format, full.model, full.mode.name, full.dtype, full.attn, full.ignored) == (
        "axolotl", "meta-llama/Llama-3.2-1B", "bf16+ckpt", "bfloat16", "flash_attention_2", ())
    qlora = view(read_training_config(EXAMPLES / "axolotl_qlora.yml"))
    assert (qlora.format, qlora.model, qlora.seq_len, qlora.batch_size, qlora.mode.name, qlora.dtype,
            qlora.ignored) == ("axolotl", "mistralai/Mistral-7B-v0.3", 8192, 2, "bf16+ckpt", "bfloat16", ())
    assert qlora.adapter == Adapter("qlora", r=32, alpha=16, dropout=0.05, targets=("all-linear",),
                                    quant_type="nf4", double_quant=True, compute_dtype="bfloat16",
                                    recipe="axolotl", experts_undropped=True)
    sft_qlora = view(read_training_config(EXAMPLES / "sft_qlora.yaml"))
    assert (sft_qlora.format, sft_qlora.model, sft_qlora.dtype, sft_qlora.ignored) == (
        "trl-sft", "Qwen/Qwen2.5-0.5B", "bfloat16", ())
    assert sft_qlora.adapter == Adapter("qlora", r=32, alpha=16, dropout=0.05, targets=("all-linear",),
                                        quant_type="nf4", double_quant=True, compute_dtype="bfloat16",
                                        recipe="trl")
    saved = view(read_training_config(EXAMPLES / "lora_adapter"))
    assert (saved.format, saved.model, saved.task, saved.adapter.method, saved.adapter.r) == (
        "peft", "Qwen/Qwen2.5-0.5B", "causal-lm", "lora", 16)


REFUSED = [
    # (format base, key, value)
    (AXOLOTL, "adapter", "llama-adapter"),  # relora: test_axolotl_callbacks.py
    (AXOLOTL, "fsdp", ["full_shard"]),  # without fsdp_version: 2, not Axolotl's FSDP2 (test_sharding.py)
    # fsdp_config.offload_params is read (test_sharding.py); torch_compile is modelled (test_compile.py)
    ({**AXOLOTL, "torch_compile": True}, "torch_compile_mode", "max-autotune"),
    (AXOLOTL, "torch_compile_options", {"shape_padding": True}),
    ({**AXOLOTL, "adapter": "lora"}, "activation_offloading", "legacy"),
    (AXOLOTL, "liger_use_token_scaling", True),  # every rl is read (rl gdpo as grpo: test_ebft.py)
    ({**AXOLOTL, "rl": "dpo"}, "dpo_use_weighting", True), ({**AXOLOTL, "rl": "dpo"}, "rpo_alpha", 0.5),
    (AXOLOTL, "precompute_ref_log_probs", True),  # an rl key without rl
    ({**AXOLOTL, "rl": "simpo"}, "rl", "simpo"),  # a full fine-tune: Axolotl's unused reference model
    ({**AXOLOTL, "reward_model": True}, "num_labels", 2),
    (AXOLOTL, "unsloth_cross_entropy_loss", True),
    (AXOLOTL, "tensor_parallel_size", 2), (AXOLOTL, "gradient_checkpointing", "offload_disk"),
    (AXOLOTL, "bf16", "auto"), (AXOLOTL, "attn_implementation", "xformers"),
    (AXOLOTL, "optimizer", "optimi_adamw"), (AXOLOTL, "chunked_cross_entropy", True),
    (AXOLOTL, "fp32_norms", True), (AXOLOTL, "expert_parallel_size", 4), (AXOLOTL, "dp_replicate_size", 2),
    (AXOLOTL, "experts_implementation", "scattermoe"), (AXOLOTL, "processor_type", "VoxtralProcessor"),
    (AXOLOTL, "optimizer", "muon"),
    # LLaMA-Factory's own optimizers are its use_* keys', no tool's optim name (reading.py read_optimizer)
    (AXOLOTL, "optimizer", "adam_mini"), (TRAINER, "optim", "llamafactory_muon"),
    (TRAINER, "torch_compile_mode", "reduce-overhead"), (TRAINER, "torch_compile_backend", "aot_eager"),
    ({**TRAINER, "use_liger_kernel": True}, "liger_kernel_config.rms_norm_gated", True),
    (TRAINER, "label_smoothing_factor", 0.1), (TRAINER, "optim", "galore_adamw"),
    (TRAINER, "parallelism_config", {"tp_size": 2}), (TRAINER, "use_cpu", True),
    (TRAINER, "attn_implementation", "flash_attention_3"), (TRAINER, "config_overrides", "n_layer=2"),
    (SFT, "lora_r", 16), (SFT, "use_dora", True),
    (SFT, "loss_type", "dft"),
    (SFT, "model_init_kwargs.quantization_config", {"quant_method": "gptq", "bits": 4}),
    (SFT, "model_init_kwargs.load_in_8bit", True),
    (SFT, "gradient_checkpointing_kwargs.every_n_layers", 2),
    # TRL's preference configs (configs/preference.py)
    (DPO_CONFIG, "use_weighting", True), (DPO_CONFIG, "ld_alpha", 0.5), (DPO_CONFIG, "rpo_alpha", 1.0),
    (DPO_CONFIG, "sync_ref_model", True), (DPO_CONFIG, "disable_dropout", False),
    (DPO_CONFIG, "use_logits_to_keep", True), (DPO_CONFIG, "loss_type", "sft"),
    ({**DPO_CONFIG, "cpo_alpha": 1.0}, "loss_type", "sigmoid"),  # CPO's own loss, not SimPO
]


@pytest.mark.parametrize(("base", "key", "value"), REFUSED, ids=[f"{k}={v}" for _, k, v in REFUSED])
def test_an_unmodelled_setting_is_refused_by_name(tmp_path, base, key, value):
    data = json.loads(json.dumps(base))
    if "." in key:
        outer, inner = key.split(".")
        data[outer] = {**data.get(outer, {}), inner: value}
    else:
        data[key] = value
    path = write(tmp_path, data)
    with pytest.raises(UnmodelledSetting, match=rf"^{key}: .* in '{path}' is not modelled: ") as error:
        read_training_config(path)
    assert repr(value) in str(error.value)


def test_padding_free_needs_flash_attention(tmp_path):
    with pytest.raises(UnmodelledSetting, match="^padding_free: True .* only flash_attention_2 is modelled"):
        read(tmp_path, {**SFT, "packing": False, "padding_free": True, "model_init_kwargs": {
            "attn_implementation": "eager"}})
    with pytest.raises(UnmodelledSetting, match=r"^packing: True .* attention sdpa \(default\)"):
        read(tmp_path, {**SFT, "model_init_kwargs": {}})
    wrapped = read(tmp_path, {**SFT, "packing_strategy": "wrapped", "model_init_kwargs": {}})
    assert wrapped.attn is None and wrapped.seq_len == 2048


def test_axolotl_keeps_float32_embeddings_and_norms_beside_16bit_weights_with_sdpa(tmp_path):
    # bf16 weights with sdpa: Axolotl keeps embeddings, lm_head and norms in float32 (workload/upcast.py).
    sdpa = read(tmp_path, {**AXOLOTL, "attn_implementation": "sdpa"}, "a.yml")
    assert sdpa.float32_embeddings is True
    assert "attention sdpa with bfloat16 weights: " + UPCAST_NOTE in sdpa.notes
    # attn_implementation unset (ebft/llama-8b-ebft-strided-fft, qwen3/reward-model): no cast back either
    unset = read(tmp_path, {k: v for k, v in AXOLOTL.items() if k != "attn_implementation"}, "b.yml")
    assert unset.float32_embeddings is True
    assert "attention sdpa (default) with bfloat16 weights: " + UPCAST_NOTE in unset.notes
    # flash attention, an adapter, cut_cross_entropy: cast back
    assert read(tmp_path, AXOLOTL, "c.yml").float32_embeddings is None
    lora = {**AXOLOTL, "attn_implementation": "sdpa", "adapter": "lora", "lora_r": 8, "lora_alpha": 16,
            "lora_target_linear": True}
    assert read(tmp_path, lora, "d.yml").float32_embeddings is None
    # FSDP: the loader skips the upcast
    fsdp = read(tmp_path, {**AXOLOTL, "attn_implementation": "sdpa", "fsdp_version": 2, "fsdp_config": {
        "auto_wrap_policy": "TRANSFORMER_BASED_WRAP", "transformer_layer_cls_to_wrap": "LlamaDecoderLayer",
        "reshard_after_forward": True, "state_dict_type": "FULL_STATE_DICT"}}, "e.yml")
    assert fsdp.float32_embeddings is None
    assert any(note.startswith("attention sdpa under FSDP: Axolotl's loader skips the float32 upcast")
               for note in fsdp.notes)
    # DeepSpeed ZeRO-1/2: the engine casts every parameter back (examples/qwen3/reward-model.yaml)
    zero1 = read(tmp_path, {**AXOLOTL, "attn_implementation": "sdpa",
                            "deepspeed": "deepspeed_configs/zero1.json"}, "f.yml")
    assert zero1.float32_embeddings is None and zero1.parallel == "zero1"


def test_axolotl_refuses_what_it_does_not_say_plainly(tmp_path):
    # DeepSpeed ZeRO-3 after the upcast: zero.Init's parameters are not cast back
    with pytest.raises(UnmodelledSetting, match=r"^bf16: True .*with attention sdpa under DeepSpeed ZeRO-3"):
        read(tmp_path, {**AXOLOTL, "attn_implementation": "sdpa",
                        "deepspeed": "deepspeed_configs/zero3_bf16.json"}, "a.yml")
    with pytest.raises(UnmodelledSetting, match="^fp16: True .*GradScaler"):
        read(tmp_path, {**AXOLOTL, "bf16": False, "fp16": True}, "a.yml")


def test_default_values_of_refused_keys_are_accepted(tmp_path):
    defaults = {"deepspeed": None, "fsdp": "", "fsdp_config": {"min_num_params": 0, "xla": False},
                "torch_compile": False, "use_liger_kernel": False, "label_smoothing_factor": 0.0,
                "optim_args": None, "use_cpu": False, "parallelism_config": None, "use_cache": False,
                "neftune_noise_alpha": None, "gradient_checkpointing_kwargs": {"use_reentrant": False}}
    assert read(tmp_path, {**TRAINER, **defaults}).ignored == ()
    sft = {"use_peft": False, "lora_r": 16, "activation_offloading": False, "peft_config": None}
    assert read(tmp_path, {**SFT, **sft}).format == "trl-sft"
    axolotl = {"adapter": None, "load_in_4bit": False, "load_in_8bit": False, "deepspeed": None,
               "fsdp": [], "fsdp_config": {}, "tensor_parallel_size": 1, "lora_model_dir": None}
    assert read(tmp_path, {**AXOLOTL, **axolotl}, "a.yml").ignored == ()


def test_memory_neutral_settings_are_noted(tmp_path):
    notes = read(tmp_path, {**TRAINER, "neftune_noise_alpha": 5.0, "auto_find_batch_size": True}).notes
    assert any(n.startswith("neftune_noise_alpha: noise added") for n in notes)
    assert any(n.startswith("auto_find_batch_size: the Trainer halves the batch") for n in notes)


@pytest.mark.parametrize(("data", "message"), [
    ({**TRAINER, "per_device_train_batch_size": 0},
     "per_device_train_batch_size: batch size in '{path}' must be a positive integer, got 0"),
    ({**TRAINER, "bf16": "yes"}, "bf16 in '{path}' must be true or false, got 'yes'"),
    ({**TRAINER, "max_seq_length": 1.5},
     "max_seq_length: sequence length in '{path}' must be a positive integer, got 1.5"),
    ({**TRAINER, "torch_dtype": "int8"},
     "torch_dtype in '{path}' must be one of auto, float32, bfloat16, float16, got 'int8'"),
    ({**TRAINER, "bf16": True}, "fp16 and bf16 in '{path}' are both true: choose one"),
    ({**AXOLOTL, "bf16": "yes"}, "bf16 in '{path}' must be true, false, 'auto' or 'full', got 'yes'"),
    ({**AXOLOTL, "micro_batch_size": -1},
     "micro_batch_size: batch size in '{path}' must be a positive integer, got -1"),
    ({"model": "m", "task": "vision"}, "task in '{path}' must be one of"),
    ({"model": "m", "seq_len": 8, "output_dir": "x"},
     "mixes autotune keys (model, seq_len) with trainer keys"),
])
def test_bad_values_are_named(tmp_path, data, message):
    path = write(tmp_path, data)
    with pytest.raises(InvalidInput) as error:
        read_training_config(path)
    assert message.format(path=path) in str(error.value)


@pytest.mark.parametrize(("text", "name", "message"), [
    ("{not json", "c.json", "is not valid JSON"),
    ("a: [b", "c.yaml", "is not valid YAML or JSON"),
    ("- a\n- b\n", "c.yaml", "must be a mapping of keys to values"),
])
def test_an_unreadable_file_is_refused(tmp_path, text, name, message):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(InvalidInput, match=message):
        read_training_config(path)
    with pytest.raises(InvalidInput, match="cannot read training config"):
        read_training_config(tmp_path / "absent.json")


def test_every_training_arguments_field_is_classified():
    from transformers import TrainingArguments

    fields = {f.name for f in dataclasses.fields(TrainingArguments)}
    assert fields - (TRAINER_FIELDS | LEGACY_TRAINER_FIELDS) == set()


# ---------------------------------------------------------------------------------------------
# Adapters: LoRA / QLoRA read as each tool builds them

NO_KERNELS = {"lora_mlp_kernel": False, "lora_qkv_kernel": False, "lora_o_kernel": False,
              "lora_embedding_kernel": False}
AXOLOTL_QLORA = {**AXOLOTL, **NO_KERNELS, "adapter": "qlora", "load_in_4bit": True, "lora_r": 16,
                 "lora_alpha": 32, "lora_dropout": 0.1, "lora_target_linear": True}
SFT_PEFT = {**SFT, "use_peft": True}


def test_axolotl_s_cut_cross_entropy_plugin_turns_it_on_by_default(tmp_path):
    # integrations/cut_cross_entropy/args.py: cut_cross_entropy: Optional[bool] = True
    cce = {**AXOLOTL, "plugins": ["axolotl.integrations.cut_cross_entropy.CutCrossEntropyPlugin"]}
    plan = read(tmp_path, cce, "a.yml")
    assert plan.loss == "cce"
    default = "cut_cross_entropy: not set, and with CutCrossEntropyPlugin listed"
    assert any(n.startswith(default) for n in plan.notes)
    assert read(tmp_path, {**cce, "cut_cross_entropy": False}, "b.yml").loss != "cce"
    assert read(tmp_path, {**AXOLOTL}, "c.yml").loss != "cce"  # no plugin, no key: off
    with pytest.raises(InvalidInput, match="Cut Cross Entropy requires fp16/bf16"):
        read(tmp_path, {**cce, "bf16": False}, "d.yml")
    swanlab = "axolotl.integrations.swanlab.SwanLabPlugin"
    assert read(tmp_path, {**cce, "plugins": [*cce["plugins"], swanlab]}, "e.yml").loss == "cce"
    # schemas/validation.py check_cross_entropy_conflicts: one of them, as written
    with pytest.raises(InvalidInput, match="Only one cross entropy optimization"):
        read(tmp_path, {**cce, "cut_cross_entropy": True, "liger_fused_linear_cross_entropy": True}, "g.yml")
    grouped = read(tmp_path, {**AXOLOTL, "experts_implementation": "grouped_mm"}, "f.yml")
    assert any(n.startswith("experts_implementation: grouped_mm: transformers'") for n in grouped.notes)


@pytest.mark.parametrize("plugin", ["axolotl.integrations.expert_parallel.ExpertParallelPlugin",
                                    "my.own.Plugin"])
def test_a_plugin_not_read_is_refused_by_name(tmp_path, plugin):
    with pytest.raises(UnmodelledSetting, match=rf"^plugins: '{plugin}' in .* is not modelled: the plugin "):
        read(tmp_path, {**AXOLOTL, "plugins": [plugin]}, "a.yml")


@pytest.mark.parametrize(("keys", "why"), [
    ({"use_sonicmoe": True}, "SonicMoE experts .*CuTe kernels"),
    ({"expert_backend": "sonicmoe"}, "SonicMoE experts"),
    ({"use_scattermoe": True, "use_sonicmoe": True}, "SonicMoE experts"),
    ({}, "pins experts_implementation: eager"),
])
def test_the_kernels_plugin_is_refused_naming_its_expert_backend(tmp_path, keys, why):
    plugin = "axolotl.integrations.kernels.KernelsPlugin"
    start = "KernelsPlugin's" if keys else "KernelsPlugin without"
    with pytest.raises(UnmodelledSetting, match=rf"^plugins: '{plugin}' in .* is not modelled: {start}"):
        read(tmp_path, {**AXOLOTL, "plugins": [plugin], **keys}, "a.yml")
    with pytest.raises(UnmodelledSetting, match=why):
        read(tmp_path, {**AXOLOTL, "plugins": [plugin], **keys}, "b.yml")


def test_axolotl_lora_over_an_8bit_base_is_read(tmp_path):
    data = {**AXOLOTL, "adapter": "lora", "load_in_8bit": True, "lora_r": 16, "lora_alpha": 32,
            "lora_dropout": 0.05, "lora_target_linear": True}
    plan = read(tmp_path, data, "a.yml")
    # loaders/model.py _set_quantization_config: BitsAndBytesConfig(load_in_8bit=True), then the
    # kbit preparation of qlora; check_auto_enable_lora_kernels skips an 8-bit LoRA base.
    assert plan.adapter == Adapter("lora_8bit", r=16, alpha=32, dropout=0.05, targets=("all-linear",),
                                   recipe="axolotl", experts_undropped=True)
    label = "adapter: lora_8bit: LoRA over an LLM.int8 base (bitsandbytes Linear8bitLt, Axolotl recipe) r=16"
    assert any(n.startswith(label) and "8-bit layers computing in int8" in n for n in plan.notes)
    assert any(n.startswith("lora_*_kernel: not set, and with load_in_8bit Axolotl") for n in plan.notes)
    with pytest.raises(InvalidInput, match="lora_mlp_kernel: true with an 8-bit .*check_lora_kernels_8bit"):
        read(tmp_path, {**data, "lora_mlp_kernel": True}, "b.yml")
    with pytest.raises(InvalidInput, match="Can't load qlora in 8bit"):
        read(tmp_path, {**data, "adapter": "qlora"}, "c.yml")
    with pytest.raises(InvalidInput, match="load_in_8bit: true in .* without an adapter"):
        read(tmp_path, {**data, "adapter": None}, "d.yml")


def test_trl_load_in_8bit_is_an_8bit_base_under_the_sft_trainer_s_recipe(tmp_path):
    plan = read(tmp_path, {**SFT_PEFT, "load_in_8bit": True})
    assert (plan.adapter.method, plan.adapter.recipe) == ("lora_8bit", "trl")
    init = read(tmp_path, {**SFT_PEFT, "model_init_kwargs": {
        "dtype": "bfloat16", "attn_implementation": "flash_attention_2",
        "quantization_config": {"load_in_8bit": True, "llm_int8_threshold": 4.0}}})
    assert init.adapter.method == "lora_8bit"
    threshold = "model_init_kwargs.quantization_config.llm_int8_threshold: 4.0"
    assert any(n.startswith(threshold) for n in init.notes)
    with pytest.raises(InvalidInput, match="load_in_4bit and load_in_8bit .* both set"):
        read(tmp_path, {**SFT_PEFT, "load_in_8bit": True, "load_in_4bit": True})


def test_axolotl_qlora_is_read(tmp_path):
    plan = read(tmp_path, {**AXOLOTL_QLORA, "lora_target_modules": ["q_proj", "v_proj"],
                           "peft_use_rslora": True, "loraplus_lr_ratio": 16}, "a.yml")
    # loaders/model.py _set_quantization_config: nf4, double quantization, compute in the weights' dtype.
    assert plan.adapter == Adapter("qlora", r=16, alpha=32, dropout=0.1, targets=("all-linear",),
                                   quant_type="nf4", double_quant=True, compute_dtype="bfloat16",
                                   recipe="axolotl", experts_undropped=True)
    assert (plan.mode, plan.dtype, plan.attn) == (Mode("bf16", True), "bfloat16", "flash_attention_2")
    assert ("adapter: qlora: QLoRA (nf4, double quant, Axolotl recipe) r=16 alpha=32 dropout 0.1 on "
            "all-linear, 4-bit layers "
            "computing in bfloat16; the base weights frozen, only the adapters trained") in plan.notes
    assert any(n.startswith("lora_target_linear: true: LoRA on every linear layer") for n in plan.notes)
    assert any(n.startswith("peft_use_rslora:") for n in plan.notes)
    assert any(n.startswith("loraplus_lr_ratio:") for n in plan.notes)
    assert plan.ignored == ()
    # bnb_config_kwargs update Axolotl's bitsandbytes settings; adapter: qlora alone implies the 4-bit base.
    plan = read(tmp_path, {**AXOLOTL_QLORA, "load_in_4bit": None, "bnb_config_kwargs": {
        "bnb_4bit_quant_type": "fp4", "bnb_4bit_use_double_quant": False, "bnb_4bit_compute_dtype": "float16",
        "bnb_4bit_quant_storage": "bfloat16"}}, "a.yml")
    assert (plan.adapter.method, plan.adapter.quant_type, plan.adapter.double_quant,
            plan.adapter.compute_dtype) == ("qlora", "fp4", False, "float16")
    assert any(n.startswith("adapter: qlora without load_in_4bit: read as a 4-bit base") for n in plan.notes)


def test_axolotl_lora_takes_axolotls_defaults(tmp_path):
    plan = read(tmp_path, {**AXOLOTL, **NO_KERNELS, "adapter": "lora", "lora_r": 8, "lora_alpha": 16,
                           "lora_target_modules": ["q_proj", "v_proj"], "lora_modules_to_save": ["lm_head"],
                           "attn_implementation": "sdpa"}, "a.yml")
    # schemas/peft.py: lora_dropout 0.0 with an adapter; bias none (loaders/adapter.py).
    assert plan.adapter == Adapter("lora", r=8, alpha=16, dropout=0.0, targets=("q_proj", "v_proj"),
                                   modules_to_save=("lm_head",))
    assert "lora_dropout: not set, Axolotl's default 0.0" in plan.notes
    assert any("lm_head trained whole (modules_to_save)" in n for n in plan.notes)
    # With an adapter Axolotl casts the norms and embeddings back to bfloat16 whatever the attention.
    assert (plan.dtype, plan.attn) == ("bfloat16", "sdpa")
    # fp16 trains float32 LoRA weights over float16 ones: amp, as Axolotl's trainer runs it.
    fp16 = read(tmp_path, {**AXOLOTL, **NO_KERNELS, "adapter": "lora", "lora_r": 8, "lora_alpha": 16,
                           "lora_target_modules": ["q_proj"], "bf16": False, "fp16": True}, "a.yml")
    assert (fp16.mode, fp16.dtype) == (Mode("amp", True), "float16")
    # trust_remote_code: Axolotl does not turn its fused kernels on.
    remote = read(tmp_path, {**AXOLOTL, "adapter": "lora", "lora_r": 8, "lora_alpha": 16,
                             "lora_target_modules": "all-linear", "trust_remote_code": True}, "a.yml")
    assert (remote.adapter.targets, remote.adapter.kernels) == (("all-linear",), ())
    assert read(tmp_path, {**AXOLOTL, "lora_r": 8, "lora_target_linear": True}, "a.yml").adapter is None


@pytest.mark.parametrize(("changes", "kernels"), [
    # none set: check_auto_enable_lora_kernels turns mlp, qkv, o (and embedding: no LoRA on it here) on
    ({lora_kernel: None for lora_kernel in NO_KERNELS}, ("mlp", "qkv", "o")),
    ({"lora_mlp_kernel": True}, ("mlp",)),  # the others set false in AXOLOTL_QLORA stay off
])
def test_axolotl_s_fused_lora_kernels_are_read_into_the_adapter(tmp_path, changes, kernels):
    plan = read(tmp_path, {**AXOLOTL_QLORA, **changes}, "a.yml")
    assert plan.adapter.kernels == kernels
    said = f"with Axolotl's fused LoRA kernels (emulated): {', '.join(kernels)}, 4-bit layers computing"
    assert any(note.startswith("adapter: qlora: ") and said in note for note in plan.notes), plan.notes
    assert any(note.startswith("lora_") and "emulated: Axolotl's LoRA_MLP, LoRA_QKV, LoRA_O" in note
               for note in plan.notes)


def test_axolotl_lora_model_dir_reads_the_saved_adapter(tmp_path):
    from peft import LoraConfig

    LoraConfig(r=4, lora_alpha=8, target_modules=["k_proj"]).save_pretrained(tmp_path / "adapter")
    plan = read(tmp_path, {**AXOLOTL_QLORA, "lora_model_dir": str(tmp_path / "adapter")}, "a.yml")
    assert (plan.adapter.method, plan.adapter.r, plan.adapter.alpha, plan.adapter.targets) == (
        "qlora", 4, 8.0, ("k_proj",))
    with pytest.raises(InvalidInput, match="lora_model_dir: 'absent' in .* has no adapter_config.json here"):
        read(tmp_path, {**AXOLOTL_QLORA, "lora_model_dir": "absent"}, "a.yml")


def test_axolotl_s_lora_target_parameters_are_peft_s_target_parameters(tmp_path):
    experts = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]
    plan = read(tmp_path, {**AXOLOTL_QLORA, "lora_target_parameters": experts, "lora_dropout": 0.0}, "a.yml")
    assert plan.adapter.parameters == tuple(experts) and plan.adapter.targets == ("all-linear",)
    assert any(n.startswith("lora_target_parameters: LoRA on the parameters mlp.experts.gate_up_proj")
               for n in plan.notes)
    # _build_peft_lora_config: target_modules=[] beside them when no module is named
    plan = read(tmp_path, {**AXOLOTL_QLORA, "lora_target_linear": None, "lora_target_parameters": experts,
                           "lora_dropout": 0.0}, "b.yml")
    assert plan.adapter.targets == () and "on the parameters mlp.experts" in plan.adapter.label()
    from autotune.workload.adapters import lora_config

    config = lora_config(plan.adapter, "causal-lm")
    assert (config.target_modules, config.target_parameters) == (set(), experts)
    with pytest.raises(InvalidInput, match="validate_lora_target_parameters_dropout"):
        read(tmp_path, {**AXOLOTL_QLORA, "lora_target_parameters": experts}, "c.yml")
    with pytest.raises(InvalidInput, match="must be a list of parameter names"):
        read(tmp_path, {**AXOLOTL_QLORA, "lora_target_parameters": "mlp.experts.down_proj",
                        "lora_dropout": 0.0}, "d.yml")


AXOLOTL_ADAPTER_REFUSED = [
    # (changes to AXOLOTL_QLORA, key named, words of the reason)
    ({"adapter": "lora"}, "load_in_4bit", "quantizes for qlora only"),
    ({"peft_use_dora": True}, "peft_use_dora", "DoRA"),
    ({"lora_target_linear": None, "lora_target_modules": ["q_proj", "model.*v_proj"]}, "lora_target_modules",
     "regular expression"),
    ({"lora_target_modules": ["q_proj", "embed_tokens"]}, "lora_target_modules", "embed_tokens beside"),
    ({"lora_rank_pattern": {"q_proj": 8}}, "lora_rank_pattern", "per-module ranks"),
    ({"peft_layers_to_transform": [0, 1]}, "peft_layers_to_transform", "some layers only"),
    ({"peft_trainable_token_indices": [5]}, "peft_trainable_token_indices", "token embeddings"),
    ({"peft_autocast_adapter_dtype": False}, "peft_autocast_adapter_dtype", "float32"),
    ({"lora_on_cpu": True}, "lora_on_cpu", "CPU"),
    ({"bnb_config_kwargs": {"llm_int8_skip_modules": ["mlp"]}}, "bnb_config_kwargs.llm_int8_skip_modules",
     "bitsandbytes setting"),
]


@pytest.mark.parametrize(("changes", "key", "why"), AXOLOTL_ADAPTER_REFUSED,
                         ids=[k for _, k, _ in AXOLOTL_ADAPTER_REFUSED])
def test_axolotl_adapter_settings_not_modelled_are_refused(tmp_path, changes, key, why):
    path = write(tmp_path, {**AXOLOTL_QLORA, **changes}, "a.yml")
    with pytest.raises(UnmodelledSetting, match=rf"^{key}: .* in '{path}' is not modelled: .*{why}"):
        read_training_config(path)


@pytest.mark.parametrize(("changes", "message"), [
    ({"adapter": None}, "load_in_4bit: true in '{path}' without an adapter: Axolotl refuses 4-bit loading"),
    ({"load_in_4bit": False}, "adapter: qlora with load_in_4bit: false in '{path}': Axolotl requires"),
    ({"lora_r": None}, "adapter: qlora in '{path}' needs lora_r"),
    ({"lora_alpha": None}, "adapter: qlora in '{path}' needs lora_alpha"),
    ({"lora_target_linear": None}, "adapter: qlora in '{path}' names no LoRA target"),
    ({"lora_r": 0}, "lora_r in '{path}' must be a positive integer, got 0"),
    ({"lora_dropout": 1.5}, "lora_dropout in '{path}' must be a number from 0 up to (not including) 1"),
    ({"lora_target_linear": None, "lora_target_modules": ["all-linear"]},
     "write lora_target_modules: all-linear"),
    ({"bnb_config_kwargs": {"bnb_4bit_quant_type": "int4"}}, "bnb_config_kwargs.bnb_4bit_quant_type in"),
])
def test_axolotl_adapter_errors_are_named(tmp_path, changes, message):
    path = write(tmp_path, {**AXOLOTL_QLORA, **changes}, "a.yml")
    with pytest.raises(InvalidInput) as error:
        read_training_config(path)
    assert message.format(path=path) in str(error.value)


def test_trl_use_peft_takes_trls_defaults(tmp_path):
    plan = read(tmp_path, SFT_PEFT)
    # trl/trainer/model_config.py: lora_r 16, lora_alpha 32, lora_dropout 0.05, PEFT's default targets.
    assert plan.adapter == Adapter("lora", r=16, alpha=32, dropout=0.05, targets=None)
    assert "lora_r, lora_alpha, lora_dropout: not set, TRL's defaults 16, 32, 0.05" in plan.notes
    assert ("use_peft: true: LoRA r=16 alpha=32 dropout 0.05 on PEFT's default modules; the base weights "
            "frozen, only the adapters trained") in plan.notes
    plan = read(tmp_path, {**SFT_PEFT, "lora_r": 64, "lora_alpha": 128, "lora_dropout": 0.0,
                           "use_rslora": True, "lora_target_modules": ["q_proj", "k_proj", "v_proj"],
                           "lora_modules_to_save": ["lm_head"]})
    assert plan.adapter == Adapter("lora", r=64, alpha=128, dropout=0.0,
                                   targets=("q_proj", "k_proj", "v_proj"), modules_to_save=("lm_head",))
    assert any(n.startswith("use_rslora:") for n in plan.notes)
    assert plan.ignored == ()
    one = read(tmp_path, {**SFT_PEFT, "lora_target_modules": ["all-linear"]})  # one entry: its string
    assert one.adapter.targets == ("all-linear",)


def test_trl_qlora_is_read(tmp_path):
    # get_quantization_config: nf4 unless said, use_bnb_nested_quant false, compute in ModelConfig's dtype.
    plan = read(tmp_path, {**SFT_PEFT, "load_in_4bit": True, "model_init_kwargs": {"dtype": "bfloat16",
                "attn_implementation": "flash_attention_2"}})
    assert (plan.adapter.method, plan.adapter.quant_type, plan.adapter.double_quant,
            plan.adapter.compute_dtype) == ("qlora", "nf4", False, "bfloat16")
    plan = read(tmp_path, {**SFT_PEFT, "load_in_4bit": True, "bnb_4bit_quant_type": "fp4",
                           "use_bnb_nested_quant": True, "bnb_4bit_quant_storage": "uint8"})
    assert (plan.adapter.quant_type, plan.adapter.double_quant) == ("fp4", True)
    # A BitsAndBytesConfig in model_init_kwargs, with transformers' defaults: fp4, float32 compute.
    plan = read(tmp_path, {**SFT_PEFT, "model_init_kwargs": {
        "attn_implementation": "flash_attention_2", "quantization_config": {"load_in_4bit": True}}})
    assert (plan.adapter.method, plan.adapter.quant_type, plan.adapter.double_quant,
            plan.adapter.compute_dtype) == ("qlora", "fp4", False, "float32")


def test_trl_peft_config_is_a_lora_config(tmp_path):
    # A LoraConfig written out: PEFT's own defaults (r 8, lora_alpha 8, lora_dropout 0).
    plan = read(tmp_path, {**SFT, "peft_config": {"r": 32, "target_modules": "all-linear",
                                                  "task_type": "CAUSAL_LM"}})
    assert plan.adapter == Adapter("lora", r=32, alpha=8, dropout=0.0, targets=("all-linear",))
    assert any(n.startswith("peft_config: LoRA r=32 alpha=8") for n in plan.notes)
    with pytest.raises(InvalidInput, match="use_dora=True .* is not modelled"):
        read(tmp_path, {**SFT, "peft_config": {"r": 8, "use_dora": True}})


TRL_ADAPTER_REFUSED = [
    ({"use_dora": True}, "use_dora", "DoRA"),
    ({"lora_target_parameters": ["mlp.experts.down_proj"]}, "lora_target_parameters", "target_parameters"),
    ({"lora_task_type": "SEQ_CLS"}, "lora_task_type", "CAUSAL_LM"),
    ({"chat_template_path": "Qwen/Qwen3-0.6B"}, "chat_template_path", "lm_head"),
    ({"model_init_kwargs": {"quantization_config": {"load_in_8bit": True, "llm_int8_skip_modules": ["q"]}}},
     "model_init_kwargs.quantization_config.llm_int8_skip_modules", "transformers does by default"),
    ({"model_init_kwargs": {"quantization_config": {"load_in_8bit": True, "llm_int8_has_fp16_weight": True}}},
     "model_init_kwargs.quantization_config.llm_int8_has_fp16_weight", "16-bit weights"),
]


@pytest.mark.parametrize(("changes", "key", "why"), TRL_ADAPTER_REFUSED,
                         ids=[k for _, k, _ in TRL_ADAPTER_REFUSED])
def test_trl_adapter_settings_not_modelled_are_refused(tmp_path, changes, key, why):
    path = write(tmp_path, {**SFT_PEFT, **changes})
    with pytest.raises(UnmodelledSetting, match=rf"^{key}: .* in '{path}' is not modelled: .*{why}"):
        read_training_config(path)


@pytest.mark.parametrize(("data", "message"), [
    ({**SFT, "load_in_4bit": True}, "load_in_4bit in '{path}' loads a 4-bit base without adapters"),
    ({**SFT, "use_peft": False, "model_init_kwargs": {"quantization_config": {"load_in_4bit": True}}},
     "model_init_kwargs.quantization_config in '{path}' loads a 4-bit base without adapters"),
    ({**SFT_PEFT, "peft_config": {"r": 8}}, "peft_config and use_peft in '{path}' both describe the adapter"),
    ({**SFT, "use_peft": False, "peft_config": {"r": 8}},
     "use_peft: false and peft_config in '{path}' contradict"),
    ({**SFT_PEFT, "load_in_4bit": True, "dtype": "auto", "model_init_kwargs": {}},
     "dtype auto with load_in_4bit"),
    ({**SFT_PEFT, "lora_target_modules": ["q_proj", "all-linear"]}, "write lora_target_modules: all-linear"),
])
def test_trl_adapter_errors_are_named(tmp_path, data, message):
    path = write(tmp_path, data)
    with pytest.raises(InvalidInput) as error:
        read_training_config(path)
    assert message.format(path=path) in str(error.value)


def test_a_peft_adapter_directory_is_read(tmp_path):
    from peft import LoraConfig

    LoraConfig(r=8, lora_alpha=16, lora_dropout=0.1, target_modules=["query", "value"],
               task_type="SEQ_CLS", base_model_name_or_path="bert-base-uncased").save_pretrained(tmp_path)
    for path in (tmp_path, tmp_path / "adapter_config.json"):
        config = read_training_config(path)
        plan = view(config)
        assert (plan.format, plan.model, plan.task, plan.seq_len, plan.batch_size) == (
            "peft", "bert-base-uncased", "sequence-classification", None, None)
        # The step's precision and weights are the flags' (the request's defaults here).
        assert (plan.mode, plan.dtype) == (request().mode, "auto")  # none: the weights' default
        # PEFT saves target_modules from a set: in any order.
        assert plan.adapter == Adapter("lora", r=8, alpha=16, dropout=0.1, targets=plan.adapter.targets)
        assert sorted(plan.adapter.targets or ()) == ["query", "value"]
        assert missing_fields(config) == ["seq_len", "batch_size"]
        assert any(n.startswith("adapter_config.json: LoRA r=8 alpha=16 dropout 0.1 on ") for n in plan.notes)
    with pytest.raises(InvalidInput, match="is a directory without adapter_config.json"):
        read_training_config(tmp_path / "..")
    with pytest.raises(UnmodelledSetting, match="^task_type: 'SEQ_2_SEQ_LM' in .* is not modelled"):
        read(tmp_path, {"peft_type": "LORA", "r": 8, "task_type": "SEQ_2_SEQ_LM"})
    with pytest.raises(InvalidInput, match="peft_type PREFIX_TUNING is not modelled"):
        read(tmp_path, {"peft_type": "PREFIX_TUNING"})


@pytest.mark.parametrize(("card", "extra", "mode", "dtype", "note"), [
    ("H100-80GB", {}, "bf16+ckpt", "bfloat16", "bf16: auto: true on H100-80GB, which has bfloat16"),
    # A T4 has no bfloat16: fp16 in its place, which with an adapter Axolotl trains under fp16 autocast.
    ("T4", {}, "amp+ckpt", "float16",
     "bf16: auto: false on T4, which has no bfloat16 (Axolotl's resolve_dtype); fp16: true in its place"),
    ("T4", {"fp16": False}, "ckpt", "float32", "bf16: auto: false on T4"),
    ("H100-80GB", {"fp16": True}, "amp+ckpt", "float16", "bf16: auto with fp16: true: bf16 off"),
])
def test_axolotl_bf16_auto_is_resolved_on_the_card(tmp_path, card, extra, mode, dtype, note):
    from autotune.gpus import resolve_gpu

    data = {**AXOLOTL, "bf16": "auto", **extra, "adapter": "lora", "lora_r": 8, "lora_alpha": 16,
            "lora_target_linear": True, "lora_mlp_kernel": False, "lora_qkv_kernel": False,
            "lora_o_kernel": False}
    config = read_training_config(write(tmp_path, data, "a.yml"), resolve_gpu(card))
    assert (config.request.mode, config.request.step.dtype) == (mode, dtype)
    assert any(n.startswith(note) for n in config.notes), config.notes


def test_axolotl_bf16_auto_without_a_card_asks_for_one(tmp_path):
    with pytest.raises(UnmodelledSetting, match=r"^bf16: 'auto' .* name the card \(--gpu\)"):
        read_training_config(write(tmp_path, {**AXOLOTL, "bf16": "auto"}, "a.yml"))


@pytest.mark.parametrize(("base", "name", "changes", "reentrant"), [
    # Axolotl: without gradient_checkpointing_kwargs, normalize_config passes use_reentrant=True.
    (AXOLOTL, "a.yml", {"gradient_checkpointing_kwargs": None}, True),
    (AXOLOTL, "a.yml", {"gradient_checkpointing_kwargs": {"use_reentrant": True}}, True),
    (AXOLOTL, "a.yml", {}, False),  # AXOLOTL says use_reentrant: false
    (AXOLOTL, "a.yml", {"gradient_checkpointing": False, "gradient_checkpointing_kwargs": None}, False),
    # The Trainer: no arguments is transformers' use_reentrant=False; others go to torch as they are.
    (SFT, "c.json", {}, False),
    (SFT, "c.json", {"gradient_checkpointing_kwargs": {"use_reentrant": True}}, True),
    (SFT, "c.json", {"gradient_checkpointing_kwargs": {"preserve_rng_state": False}}, True),
    (SFT, "c.json", {"gradient_checkpointing_use_reentrant": True}, True),  # TRL < 0.12's scripts
])
def test_reentrant_checkpointing_is_read(tmp_path, base, name, changes, reentrant):
    plan = read(tmp_path, {**base, **changes}, name)
    assert plan.ckpt_reentrant is (True if reentrant else None)
    assert any("use_reentrant" in note for note in plan.notes) is reentrant


def test_a_string_of_target_modules_is_a_pattern_peft_matches(tmp_path):
    # PEFT matches a string as a regular expression against whole module names (re.fullmatch).
    pattern = r"model.layers.[\d]+.(mlp|self_attn).(up|down|gate|q|k|v|o)_proj"
    axolotl = read(tmp_path, {**AXOLOTL_QLORA, "lora_target_linear": None, "lora_target_modules": pattern},
                   "a.yml")
    assert (axolotl.adapter.targets, axolotl.adapter.target_pattern) == (None, pattern)
    assert f"on the modules matching {pattern}" in axolotl.adapter.label()
    trl = read(tmp_path, {**SFT_PEFT, "lora_target_modules": ["q_proj|v_proj"]})  # one entry: its string
    assert trl.adapter.target_pattern == "q_proj|v_proj"
    with pytest.raises(InvalidInput, match="into the string 'q_proj'.* plain name matches none"):
        read(tmp_path, {**SFT_PEFT, "lora_target_modules": ["q_proj"]})


@pytest.mark.parametrize("patterns", [["^model.language_model.*", "^lm_head.*"], "lm_head"])
def test_axolotl_s_unfrozen_parameters_that_match_no_peft_name_freeze_everything_and_are_refused(
        tmp_path, patterns):
    # train.py calls freeze_layers_except on the PEFT model, whose names begin base_model.model.
    data = {**AXOLOTL, "adapter": "lora", "lora_r": 8, "lora_alpha": 16, "lora_target_linear": True,
            "unfrozen_parameters": patterns}
    with pytest.raises(InvalidInput, match=r"match no parameter: .* the adapters too, and the job trains "
                                           "nothing") as error:
        read(tmp_path, data)
    assert not isinstance(error.value, UnmodelledSetting)
    # Axolotl only warns and runs on: utils/freeze.py freeze_layers_except
    assert 'utils/freeze.py: "All parameters are frozen. Model will not be trained."' in str(error.value)


@pytest.mark.parametrize("patterns", [["^base_model.model.lm_head.*"], [".+lm_head"], [".*lm_head"]])
def test_axolotl_s_unfrozen_parameters_that_may_match_stay_unmodelled(tmp_path, patterns):
    data = {**AXOLOTL, "adapter": "lora", "lora_r": 8, "lora_alpha": 16, "lora_target_linear": True,
            "unfrozen_parameters": patterns}
    with pytest.raises(UnmodelledSetting, match="^unfrozen_parameters: .* not modelled: with an adapter"):
        read(tmp_path, data)


def test_axolotl_s_unfrozen_parameters_of_a_full_fine_tune_are_read_with_transformers_checkpointing(
        tmp_path):
    # normalize_config leaves gradient_checkpointing_kwargs unset with unfrozen_parameters: use_reentrant
    # False (transformers'), not Axolotl's usual True
    patterns = ["^lm_head.weight$", "model.layers.4[4-9]+.block_sparse_moe.gate"]
    data = {**AXOLOTL, "gradient_checkpointing_kwargs": None, "unfrozen_parameters": patterns}
    full = read(tmp_path, data, "a.yml")
    assert (full.unfrozen_parameters, full.ckpt_reentrant) == (tuple(patterns), None)
    assert any(note.startswith("unfrozen_parameters: only the parameters these patterns match from the "
                               "name's start train") and "enable_input_require_grads" in note
               for note in full.notes)
    assert read(tmp_path, {**AXOLOTL}, "b.yml").unfrozen_parameters is None
    with pytest.raises(InvalidInput, match="use_reentrant: true with unfrozen_parameters .* Axolotl refuses"):
        read(tmp_path, {**data, "gradient_checkpointing_kwargs": {"use_reentrant": True}}, "c.yml")
    with pytest.raises(InvalidInput, match="pattern '\\(' is not a regular expression"):
        read(tmp_path, {**data, "unfrozen_parameters": ["("]}, "d.yml")


@pytest.mark.parametrize("key", ["model_config", "overrides_of_model_config"])
def test_axolotl_s_model_config_is_read_as_config_overrides(tmp_path, key):
    read_config = read(tmp_path, {**AXOLOTL, key: {"output_router_logits": True}}, "a.yml")
    assert json.loads(read_config.config_overrides) == {"output_router_logits": True}
    assert f"{key}: output_router_logits=true set on the model's config before it is built" in \
        " ".join(read_config.notes)
    with pytest.raises(InvalidInput, match="must be a mapping of config attributes"):
        read(tmp_path, {**AXOLOTL, key: ["output_router_logits"]}, "b.yml")


KERNELS = {**AXOLOTL, "base_model": "tiny-qwen3_moe",
           "plugins": ["axolotl.integrations.kernels.KernelsPlugin"], "use_kernels": True,
           "use_scattermoe": True, "optimizer": "adamw_torch"}


@pytest.mark.parametrize("keys", [{}, {"use_scattermoe": None, "expert_backend": "scattermoe"},
                                  {"experts_implementation": "scattermoe"}])
def test_the_kernels_plugin_with_scattermoe_runs_the_emulated_experts(tmp_path, keys):
    config = read(tmp_path, {**KERNELS, **keys}, "a.yml")
    assert config.request.step.experts_kernel == "scattermoe"
    assert any(n.startswith("use_scattermoe: ScatterMoE experts (Axolotl's KernelsPlugin), emulated; every "
                            "expert assumed routed") for n in config.notes)
    assert any(n.startswith("use_kernels: True: KernelsPlugin sets it true") for n in config.notes)


def test_scattermoe_with_lora_on_the_experts_runs_its_emulated_lora(tmp_path):
    config = read(tmp_path, {**KERNELS, "adapter": "lora", "lora_target_modules": ["q_proj"], "lora_r": 8,
                             "lora_target_parameters": ["mlp.experts.gate_up_proj"], "lora_alpha": 16},
                  "a.yml")
    assert config.request.step.experts_kernel == "scattermoe"
    assert config.adapter.parameters == ("mlp.experts.gate_up_proj",)
    assert any(n.startswith("use_scattermoe with LoRA on the experts' parameters: LoRA on the experts runs "
                            "ScatterMoE's fused LoRA") and "emulated" in n for n in config.notes)


@pytest.mark.parametrize(("keys", "key"), [
    ({"moe_bnb_fast": False}, "moe_bnb_fast"),
    ({"use_dsv4_kernels": True}, "use_dsv4_kernels"),
    ({"dsv4_fp4_grouped_mode": "nvfp4"}, "dsv4_fp4_grouped_mode"),
])
def test_scattermoe_beside_what_it_does_not_emulate_is_refused_by_name(tmp_path, keys, key):
    with pytest.raises(UnmodelledSetting, match=rf"^{key}: .* is not modelled"):
        read(tmp_path, {**KERNELS, **keys}, "a.yml")


def test_use_kernels_hub_kernels_not_emulated_are_refused_by_name(tmp_path):
    from autotune.configs import read_training_config
    from autotune.configs.axolotl import check_patched_model

    for model in ("tiny-qwen3_moe", "tiny-qwen3_next"):
        (tmp_path / f"{model}.yml").write_text(yaml.safe_dump({**KERNELS, "base_model": model}))
    config = read_training_config(tmp_path / "tiny-qwen3_moe.yml")
    check_patched_model(config, config.request)  # the hub LigerRMSNorm, emulated (workload/hub_kernels.py)
    config = read_training_config(tmp_path / "tiny-qwen3_next.yml")
    with pytest.raises(UnmodelledSetting, match=r"^use_kernels: true in .* \(KernelsPlugin sets it: "
                       r"args.py check_use_kernels\) is not modelled for model type qwen3_next: "
                       r"transformers' kernelize .*: Qwen3NextRMSNormGated \(RMSNormGated\) "
                       r"-> kernels-community/fla FusedRMSNormGated; causal_conv1d_fn .*; "
                       r"torch_chunk_gated_delta_rule \(chunk_gated_delta_rule\) -> "
                       r"kernels-community/fla chunk_gated_delta_rule$"):
        check_patched_model(config, config.request)


def test_axolotl_s_legacy_activation_offloading_with_an_adapter_is_refused_for_what_it_runs(tmp_path):
    # patch_manager.py swaps transformers' checkpoint for hf_grad_checkpoint_offload_wrapper
    path = write(tmp_path, {**AXOLOTL, "adapter": "lora", "lora_r": 8, "lora_alpha": 16,
                            "lora_target_linear": True, "activation_offloading": "legacy"})
    with pytest.raises(UnmodelledSetting, match="^activation_offloading: .*is not modelled: with an adapter, "
                       "each checkpointed layer's input offloaded by Axolotl's CPU_Offloaded_Gradient"):
        read_training_config(path)


def test_axolotl_s_min_sample_len_is_read_as_without_effect(tmp_path):
    # utils/data/utils.py _drop_outside_range drops shorter samples; a packed row stays sequence_len
    found = read(tmp_path, {**AXOLOTL, "min_sample_len": 200_000})
    assert "min_sample_len" not in found.ignored
