"""LLaMA-Factory's training YAML: its examples read as its source builds the run, its defaults
noted, what autotune does not model refused by name.

The example configs are LLaMA-Factory's examples/train_lora, train_qlora and train_full (commit
ff6d4d1, 2026-08), copied here as dicts; "LF" below is LLaMA-Factory's src/llamafactory/."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import configread
import pytest
import yaml
from configread import Read

from autotune.cli import main
from autotune.configs.trainer import _TRAINER_REFUSED, LEGACY_TRAINER_FIELDS, TRAINER_FIELDS
from autotune.errors import InvalidInput, UnknownSetting, UnmodelledSetting
from autotune.request import CheckRequest, request_from
from autotune.workload.adapters import Adapter
from autotune.workload.modes import Mode
from autotune.workload.optimizers import describe_optimizer
from autotune.workload.prequantized import SavedQuant

# examples/train_lora/qwen3_lora_sft.yaml
QWEN3_LORA_SFT = {
    "model_name_or_path": "Qwen/Qwen3-4B-Instruct-2507", "trust_remote_code": True,
    "stage": "sft", "do_train": True, "finetuning_type": "lora", "lora_rank": 8, "lora_target": "all",
    "dataset": "identity,alpaca_en_demo", "template": "qwen3_nothink", "cutoff_len": 2048,
    "max_samples": 1000, "preprocessing_num_workers": 16, "dataloader_num_workers": 4,
    "output_dir": "saves/qwen3-4b/lora/sft", "logging_steps": 10, "save_steps": 500, "plot_loss": True,
    "overwrite_output_dir": True, "save_only_model": False, "report_to": "none",
    "per_device_train_batch_size": 1, "gradient_accumulation_steps": 8, "learning_rate": 1.0e-4,
    "num_train_epochs": 3.0, "lr_scheduler_type": "cosine", "warmup_ratio": 0.1, "bf16": True,
    "ddp_timeout": 180000000, "resume_from_checkpoint": None,
}
# examples/train_full/qwen3_full_sft.yaml
QWEN3_FULL_SFT = {
    **{k: v for k, v in QWEN3_LORA_SFT.items() if k not in ("lora_rank", "lora_target")},
    "finetuning_type": "full", "deepspeed": "examples/deepspeed/ds_z3_config.json",
    "output_dir": "saves/qwen3-4b/full/sft", "gradient_accumulation_steps": 2, "learning_rate": 1.0e-5,
}
# examples/train_qlora/qwen3_lora_sft_otfq.yaml
QWEN3_QLORA = {**QWEN3_LORA_SFT, "quantization_bit": 4, "quantization_method": "bnb"}
# examples/train_full/mossvl_full_sft.yaml, the keys beyond qwen3_full_sft's
MOSSVL = {"model_name_or_path": "OpenMOSS-Team/MOSS-VL-Instruct-0708", "image_max_pixels": 262144,
          "video_max_pixels": 16384, "video_fps": 1.0, "video_maxlen": 256, "use_reentrant_gc": False,
          "freeze_vision_tower": True, "freeze_multi_modal_projector": True, "freeze_language_model": False,
          "template": "moss_vl", "cutoff_len": 4096, "packing": False, "gradient_accumulation_steps": 1,
          "gradient_checkpointing": True, "gradient_checkpointing_kwargs": {"use_reentrant": False}}
PREFERENCE = {"pref_beta": 0.1, "pref_loss": "sigmoid", "learning_rate": 5.0e-6}


def read(tmp_path: Path, data: dict, name: str = "llamafactory.yaml") -> Read:
    return configread.read(tmp_path, data, name)


def request(**values) -> CheckRequest:
    return request_from(CheckRequest, values)


LORA_NOTES = (
    "disable_gradient_checkpointing: not set: LLaMA-Factory checkpoints every layer "
    "(model_utils/checkpointing.py prepare_model_for_training)",
    "use_reentrant_gc: not set, LLaMA-Factory's default true: torch.utils.checkpoint's reentrant path, "
    "traced: each layer's forward run again inside backward, under torch.autograd.backward of its own",
    "finetuning_type: lora: LLaMA-Factory loads the weights in the checkpoint's dtype (model/loader.py "
    "load_model: torch_dtype auto); the adapters in float32 (model/adapter.py init_adapter)",
    "flash_attn: not set, LLaMA-Factory's default auto: the attention transformers picks "
    "(model_utils/attention.py)",
    "finetuning_type: lora: LoRA r=8 alpha=16 dropout 0 on all-linear; the base weights frozen, only the "
    "adapters trained",
    "lora_alpha, lora_dropout: not set, LLaMA-Factory's defaults 16, 0 (lora_alpha: twice lora_rank)",
    "lora_target: all: LoRA on every linear layer but the output head (model_utils/misc.py "
    "find_all_linear_modules): PEFT's all-linear",
    "optim: not set, the Trainer's default adamw_torch_fused",
)
# finetuning_args.py LoraArguments: alpha lora_rank * 2, dropout 0.0; "all" is every linear layer.
LORA_R8 = Adapter("lora", r=8, alpha=16, dropout=0.0, targets=("all-linear",))


def test_quantization_bit_8_is_an_8bit_base(tmp_path):
    plan = read(tmp_path, {**QWEN3_LORA_SFT, "quantization_bit": 8})
    # configure_quantization: BitsAndBytesConfig(load_in_8bit=True); init_adapter casts what trains
    # to float32 and leaves the rest in the checkpoint's dtype, as for quantization_bit 4.
    assert (plan.adapter.method, plan.adapter.recipe) == ("lora_8bit", "axolotl")
    assert any(n.startswith("quantization_bit: 8: LLaMA-Factory keeps the weights not quantized") for n in
               plan.notes)


def test_the_lora_sft_example_is_read_whole(tmp_path):
    plan = read(tmp_path, QWEN3_LORA_SFT)
    # LF: cutoff_len rows (padded to a multiple of 8), the checkpoint's dtype (torch_dtype auto),
    # reentrant checkpointing on by default, bf16 autocast from the Trainer.
    assert plan.request == request(
        model="Qwen/Qwen3-4B-Instruct-2507", seq_len=2048, batch_size=1, mode="bf16+ckpt",
        accumulation_steps=8, task="causal-lm", dtype="auto", optimizer="adamw_torch_fused", adapter=LORA_R8,
        ckpt_reentrant=True)
    assert (plan.format, plan.notes, plan.ignored) == ("llamafactory", LORA_NOTES, ())


@pytest.mark.parametrize(("example", "changes", "seq_len", "batch", "note"), [
    # examples/train_lora/qwen3_lora_pretrain.yaml: stage pt packs texts into blocks of cutoff_len.
    ("qwen3_lora_pretrain", {"stage": "pt", "dataset": "c4_demo", "template": None}, 2048, 1,
     "packing: not set, on for stage pt: texts concatenated into blocks of cutoff_len tokens "
     "(data/processor/pretrain.py): every row filled to seq_len (the padded worst case autotune models)"),
    # examples/train_lora/qwen3_lora_sft_ray.yaml: 4 data-parallel workers, one GPU each.
    ("qwen3_lora_sft_ray", {"ray_num_workers": 4, "dataset_dir": "REMOTE:llamafactory/demo_data"}, 2048, 1,
     "ray_num_workers: 4 data-parallel workers, each GPU holding the whole model: autotune checks one of "
     "them"),
    # examples/train_lora/qwen3_lora_preprocess.yaml: no batch, no precision given.
    ("qwen3_preprocess", {"tokenized_path": "saves/qwen3-4b/dataset/sft", "per_device_train_batch_size": None,
                          "bf16": None}, 2048, 8,
     "per_device_train_batch_size: not set, the Trainer's default 8"),
    # examples/train_lora/mossvl_lora_sft.yaml
    ("mossvl_lora_sft", {**{k: MOSSVL[k] for k in ("model_name_or_path", "image_max_pixels", "video_fps",
                                                   "video_maxlen", "template", "cutoff_len", "packing")},
                         "per_device_train_batch_size": 2, "gradient_accumulation_steps": 1,
                         "freeze_vision_tower": True, "freeze_language_model": False}, 4096, 2, None),
])
def test_the_lora_examples_are_read(tmp_path, example, changes, seq_len, batch, note):
    plan = read(tmp_path, {**QWEN3_LORA_SFT, **changes})
    assert (plan.format, plan.seq_len, plan.batch_size, plan.adapter, plan.ignored) == (
        "llamafactory", seq_len, batch, LORA_R8, ())
    assert plan.mode == Mode("fp32" if changes.get("bf16", True) is None else "bf16", True)
    assert note is None or note in plan.notes


@pytest.mark.parametrize(("changes", "double_quant"), [
    ({}, True),  # examples/train_qlora/qwen3_lora_sft_otfq.yaml
    ({"double_quantization": False}, False),  # examples/train_qlora/qwen3_lora_sft_bnb_npu.yaml
])
def test_the_qlora_examples_are_read(tmp_path, changes, double_quant):
    plan = read(tmp_path, {**QWEN3_QLORA, **changes})
    # model_utils/quantization.py: nf4, double_quantization, compute in compute_dtype (bf16: bfloat16);
    # the weights not quantized in the checkpoint's dtype, the adapters float32: Axolotl's recipe.
    assert plan.adapter == Adapter("qlora", r=8, alpha=16, dropout=0.0, targets=("all-linear",),
                                   quant_type="nf4", double_quant=double_quant, compute_dtype="bfloat16",
                                   recipe="axolotl")
    assert (plan.dtype, plan.mode, plan.ckpt_reentrant) == ("auto", Mode("bf16", True), True)
    assert any(n.startswith("quantization_bit: 4: LLaMA-Factory keeps the weights not quantized") for n in
               plan.notes)


@pytest.mark.parametrize(("example", "changes", "key"), [
    ("qwen3vl_lora_dpo", {"stage": "dpo", "model_name_or_path": "Qwen/Qwen3-VL-4B-Instruct", **PREFERENCE},
     "stage: 'dpo'"),
    ("qwen3_lora_sft_ds3", {"deepspeed": "examples/deepspeed/ds_z0_config.json"}, "deepspeed: "),
    ("llama3_lora_sft_aqlm", {"model_name_or_path": "ISTA-DASLab/Meta-Llama-3-8B-Instruct-AQLM-2Bit-1x16"},
     "model_name_or_path: .* saved quantized \\(aqlm.* aqlm's own CUDA kernels"),
    ("an unknown GPTQ checkpoint", {"model_name_or_path": "someone/Llama-3-8B-GPTQ"},
     "model_name_or_path: .* has read the quantization_config of techxgenus"),
])
def test_the_examples_autotune_does_not_model_are_refused_by_name(tmp_path, example, changes, key):
    with pytest.raises(UnmodelledSetting, match=f"^{key}"):
        read(tmp_path, {**QWEN3_LORA_SFT, **changes})


# examples/train_qlora/llama3_lora_sft_{gptq,awq}.yaml: qwen3_lora_sft's keys over a saved checkpoint
LLAMA3_SAVED = {**QWEN3_LORA_SFT, "template": "llama3"}
GPTQ_8B = SavedQuant("gptq", bits=4, group_size=128, desc_act=True, sym=True)
AWQ_8B = SavedQuant("awq", bits=4, group_size=128, zero_point=True, version="gemm")


@pytest.mark.parametrize(("model", "quant", "dtype"), [
    ("TechxGenus/Meta-Llama-3-8B-Instruct-GPTQ", GPTQ_8B, "auto"),
    # quantizer_awq.py update_dtype: bfloat16 becomes float16 on a CUDA GPU
    ("TechxGenus/Meta-Llama-3-8B-Instruct-AWQ", AWQ_8B, "float16"),
])
def test_lora_and_oft_over_a_checkpoint_saved_quantized_are_read(tmp_path, model, quant, dtype):
    plan = read(tmp_path, {**LLAMA3_SAVED, "model_name_or_path": model})
    assert plan.adapter == replace(LORA_R8, saved_quant=quant)
    assert (plan.dtype, plan.mode) == (dtype, Mode("bf16", True))
    label = plan.adapter.label()
    assert label.startswith(f"LoRA over a base saved quantized ({quant.method.upper()} 4-bit, group 128")
    assert "emulated" in label and "gptqmodel" in label
    assert any(n.startswith(f"model_name_or_path: {model}: saved quantized") and "auto_trainable" in n
               for n in plan.notes)
    oft = read(tmp_path, {**LLAMA3_OFT, "model_name_or_path": model})  # examples/extras/qoft/*_{awq,gptq}
    assert (oft.adapter.tuner, oft.adapter.block_size, oft.adapter.saved_quant) == ("oft", 32, quant)
    assert oft.adapter.label().startswith("OFT over a base saved quantized")


def test_llamafactory_s_own_refusals_over_a_checkpoint_saved_quantized(tmp_path):
    gptq = {**LLAMA3_SAVED, "model_name_or_path": "TechxGenus/Meta-Llama-3-8B-Instruct-GPTQ"}
    with pytest.raises(InvalidInput, match="LoRA or OFT only"):  # model/adapter.py init_adapter
        read(tmp_path, {**gptq, "finetuning_type": "full"})
    with pytest.raises(UnmodelledSetting, match="^deepspeed: .*incompatible with PTQ-quantized"):
        read(tmp_path, {**gptq, "deepspeed": "examples/deepspeed/ds_z3_config.json"})
    with pytest.raises(UnmodelledSetting, match="^fsdp: .*incompatible with PTQ-quantized"):
        read(tmp_path, {**gptq, "fsdp": "full_shard"})
    plan = read(tmp_path, {**gptq, "quantization_bit": 4})  # configure_quantization ignores it, warning
    assert plan.adapter is not None and plan.adapter.method == "lora"
    assert any(n.startswith("quantization_bit: 4: no effect on") for n in plan.notes)


@pytest.mark.parametrize("example", ["qwen3_full_sft", "qwen3vl_full_sft", "mossvl_full_sft"])
def test_the_full_examples_read_deepspeed_s_stage(tmp_path, example):
    # examples/deepspeed/ds_z3_config.json, LLaMA-Factory's shipped file: ZeRO-3, which the request
    # refuses by name (parallel zero3) until it is modelled
    data = {**QWEN3_FULL_SFT, **(MOSSVL if example == "mossvl_full_sft" else {})}
    plan = read(tmp_path, data)
    assert (plan.parallel, plan.gpus) == ("zero3", None)
    assert "deepspeed: DeepSpeed ZeRO stage 3 (zero_optimization.stage in " \
        "examples/deepspeed/ds_z3_config.json, the tool's shipped file)" in plan.notes


def test_a_full_fine_tune_trains_float32_weights(tmp_path):
    # LF model/adapter.py init_adapter: every trained parameter cast to float32 (unless pure_bf16).
    plan = read(tmp_path, {**QWEN3_FULL_SFT, "deepspeed": None})
    assert plan.request == request(
        model="Qwen/Qwen3-4B-Instruct-2507", seq_len=2048, batch_size=1, mode="bf16+ckpt",
        accumulation_steps=2, task="causal-lm", dtype="float32", optimizer="adamw_torch_fused",
        ckpt_reentrant=True)
    assert ("finetuning_type: full: LLaMA-Factory loads the weights in the checkpoint's dtype "
            "(model/loader.py load_model: torch_dtype auto) and casts every trained parameter to float32 "
            "(model/adapter.py init_adapter): float32 weights") in plan.notes
    pure = read(tmp_path, {**QWEN3_FULL_SFT, "deepspeed": None, "pure_bf16": True, "bf16": False})
    assert (pure.dtype, pure.mode) == ("auto", Mode("fp32", True))
    # mossvl_full_sft's Trainer checkpointing with use_reentrant: false replaces LF's reentrant one.
    moss = read(tmp_path, {**QWEN3_FULL_SFT, **MOSSVL, "deepspeed": None})
    assert (moss.mode, moss.ckpt_reentrant, moss.seq_len, moss.ignored) == (
        Mode("bf16", True), None, 4096, ())


def test_defaults_are_applied_and_noted(tmp_path):
    plan = read(tmp_path, {"model_name_or_path": "m", "template": "llama3"})
    assert plan.request == request(model="m", seq_len=2048, batch_size=8, mode="ckpt", task="causal-lm",
                                   dtype="auto", optimizer="adamw_torch_fused", adapter=LORA_R8,
                                   ckpt_reentrant=True)
    for note in ("stage: not set, LLaMA-Factory's default sft", "finetuning_type: not set, LLaMA-Factory's "
                 "default lora", "cutoff_len: not set, LLaMA-Factory's default 2048",
                 "lora_rank, lora_alpha, lora_dropout: not set, LLaMA-Factory's defaults 8, 16, 0 "
                 "(lora_alpha: twice lora_rank)", "lora_target: not set, LLaMA-Factory's default all",
                 "bf16, fp16: not set, the Trainer's default false: no autocast",
                 "do_train: not set: read as a training run (LLaMA-Factory trains only with do_train: true)"):
        assert note in plan.notes


@pytest.mark.parametrize(("changes", "mode", "reentrant"), [
    ({"disable_gradient_checkpointing": True}, Mode("bf16", False), None),
    ({"use_reentrant_gc": False}, Mode("bf16", True), None),
    ({"use_reentrant_gc": True}, Mode("bf16", True), True),
    # The Trainer's own checkpointing goes through LF's gradient_checkpointing_enable: none is reentrant.
    ({"gradient_checkpointing": True}, Mode("bf16", True), True),
    ({"gradient_checkpointing": True, "gradient_checkpointing_kwargs": {"use_reentrant": False}},
     Mode("bf16", True), None),
    # LF's off: transformers' own, use_reentrant=False without arguments.
    ({"gradient_checkpointing": True, "disable_gradient_checkpointing": True}, Mode("bf16", True), None),
    ({"fp16": True, "bf16": False}, Mode("amp", True), True),
])
def test_checkpointing_and_precision_as_llamafactory_sets_them(tmp_path, changes, mode, reentrant):
    plan = read(tmp_path, {**QWEN3_LORA_SFT, **changes})
    assert (plan.mode, plan.ckpt_reentrant) == (mode, reentrant)


@pytest.mark.parametrize(("changes", "seq_len", "note"), [
    ({"cutoff_len": 1001}, 1008, "cutoff_len: 1001: rows padded to a multiple of 8 (train/sft/workflow.py "
     "pad_to_multiple_of=8): 1008 tokens"),
    ({"packing": True}, 2048, "packing: true: rows packed to cutoff_len tokens "
     "(data/processor/supervised.py): every row filled to seq_len (the padded worst case autotune models)"),
    # data_args.py __post_init__ shortens cutoff_len by one when packing is set; pretrain.py blocks.
    ({"stage": "pt", "packing": True}, 2047, "packing: true: blocks of cutoff_len - 1 = 2047 tokens "
     "(data/processor/pretrain.py): every row filled to seq_len (the padded worst case autotune models)"),
    ({"stage": "pt", "packing": False, "cutoff_len": 1001}, 1001, None),
    ({"neat_packing": True, "flash_attn": "fa2"}, 2048, "neat_packing: packed sequences attend within "
     "themselves through flash_attention_2's varlen path: the same memory as full rows"),
])
def test_the_sequence_is_the_longest_row_llamafactory_builds(tmp_path, changes, seq_len, note):
    plan = read(tmp_path, {**QWEN3_LORA_SFT, **changes})
    assert plan.seq_len == seq_len
    assert note is None or note in plan.notes


@pytest.mark.parametrize(("value", "attn"), [("auto", None), ("disabled", "eager"), ("sdpa", "sdpa"),
                                             ("fa2", "flash_attention_2")])
def test_flash_attn_is_read(tmp_path, value, attn):
    assert read(tmp_path, {**QWEN3_LORA_SFT, "flash_attn": value}).attn == attn


def test_lora_settings_are_read(tmp_path):
    plan = read(tmp_path, {**QWEN3_LORA_SFT, "lora_rank": 16, "lora_alpha": 64, "lora_dropout": 0.05,
                           "lora_target": "q_proj, v_proj", "use_rslora": True, "loraplus_lr_ratio": 16,
                           "pissa_init": True})
    assert plan.adapter == Adapter("lora", r=16, alpha=64, dropout=0.05, targets=("q_proj", "v_proj"))
    for key in ("use_rslora", "loraplus_lr_ratio", "pissa_init"):
        assert any(n.startswith(f"{key}: ") and "no effect" in n for n in plan.notes)
    assert plan.ignored == ()
    with pytest.raises(UnknownSetting, match="^unknown key lora_unknown in "):
        read(tmp_path, {**QWEN3_LORA_SFT, "lora_unknown": 1})
    # additional_target: cast to float32 by LF, unless pure_bf16, where they stay as autotune models them.
    pure = read(tmp_path, {**QWEN3_LORA_SFT, "additional_target": "embed_tokens,lm_head", "pure_bf16": True})
    assert pure.adapter.modules_to_save == ("embed_tokens", "lm_head")
    # A full fine-tune reads no lora_* key.
    assert read(tmp_path, {**QWEN3_FULL_SFT, "deepspeed": None, "lora_rank": 8}).ignored == ()


@pytest.mark.parametrize("key", ["enable_liger_kernel", "use_liger_kernel"])
def test_liger_kernels_are_read(tmp_path, key):
    # LF model_utils/liger_kernel.py: apply_liger_kernel_to_<model_type>() with its defaults for sft/pt.
    plan = read(tmp_path, {**QWEN3_LORA_SFT, key: True})
    assert (plan.liger, plan.loss) == (("rms_norm", "rope", "swiglu", "geglu"), "chunked")
    assert any(n.startswith(f"{key}: rms_norm, rope, swiglu, geglu and fused_linear_cross_entropy") for n in
               plan.notes)
    with pytest.raises(UnmodelledSetting, match="^liger_kernel_config: "):
        read(tmp_path, {**QWEN3_LORA_SFT, "use_liger_kernel": True, "liger_kernel_config": {"rope": False}})


@pytest.mark.parametrize(("key", "loss"), [("use_dft_loss", "dft"), ("use_eaft_loss", "eaft")])
def test_llamafactorys_dft_and_eaft_losses_are_read(tmp_path, key, loss):
    # examples/extras/dft/qwen2_full_sft.yaml, examples/extras/eaft/qwen25_05b_eaft_full.yaml: sft/trainer.py
    # sets compute_loss_func (trainer_utils.py dft_loss_func, eaft_loss_func)
    plan = read(tmp_path, {**QWEN3_FULL_SFT, "deepspeed": None, key: True})
    assert plan.loss == loss
    assert any(n.startswith(f"{key}: LLaMA-Factory's {loss.upper()} loss") for n in plan.notes)
    # both set: sft/trainer.py's if use_dft_loss ... elif use_eaft_loss
    both = read(tmp_path, {**QWEN3_FULL_SFT, "deepspeed": None, "use_dft_loss": True, "use_eaft_loss": True})
    assert both.loss == "dft"
    # another stage's trainer never reads them
    pt = read(tmp_path, {**QWEN3_FULL_SFT, "deepspeed": None, "stage": "pt", key: True})
    assert pt.loss == "full" and f"{key}: read by stage sft's trainer only, no effect at stage pt" in pt.notes
    with pytest.raises(UnmodelledSetting, match=f"^{key}: True .* with enable_liger_kernel"):
        read(tmp_path, {**QWEN3_FULL_SFT, "deepspeed": None, key: True, "enable_liger_kernel": True})


@pytest.mark.parametrize(("key", "optimizer"), [("use_adam_mini", "adam_mini"),
                                               ("use_muon", "llamafactory_muon")])
def test_llamafactorys_adam_mini_and_muon_are_read(tmp_path, key, optimizer):
    # examples/extras/adam_mini/qwen2_full_sft.yaml, examples/extras/muon/qwen2_full_sft.yaml:
    # trainer_utils.py create_custom_optimizer builds them in place of the Trainer's optim
    plan = read(tmp_path, {**QWEN3_FULL_SFT, "deepspeed": None, key: True, "optim": "adamw_torch"})
    assert plan.optimizer == optimizer
    assert f"{key}: {describe_optimizer(optimizer)}; optim adamw_torch not used" in plan.notes
    # create_custom_optimizer's order: Adam-mini before Muon; LoRA+'s optimizer before both
    both = read(tmp_path, {**QWEN3_FULL_SFT, "deepspeed": None, "use_adam_mini": True, "use_muon": True})
    assert both.optimizer == "adam_mini"
    lora_plus = read(tmp_path, {**QWEN3_LORA_SFT, key: True, "loraplus_lr_ratio": 16.0})
    assert lora_plus.optimizer == "adamw_torch_fused"
    assert f"{key}: no effect beside loraplus_lr_ratio (create_custom_optimizer builds LoRA+'s optimizer " \
           "first)" in lora_plus.notes


@pytest.mark.parametrize("key", ["use_galore", "use_apollo", "use_badam"])
def test_galore_apollo_and_badam_are_refused_with_what_they_do(tmp_path, key):
    why = "trains one block" if key == "use_badam" else "low rank .* post-accumulate-grad hook"
    with pytest.raises(UnmodelledSetting, match=f"^{key}: True .* is not modelled: .*{why}"):
        read(tmp_path, {**QWEN3_FULL_SFT, "deepspeed": None, key: True})


def test_a_saved_adapter_trains_on(tmp_path):
    from peft import LoraConfig

    LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"]).save_pretrained(tmp_path / "adapter")
    plan = read(tmp_path, {**QWEN3_LORA_SFT, "adapter_name_or_path": "merged,adapter"})
    assert (plan.adapter.r, plan.adapter.alpha, plan.adapter.targets) == (4, 8, ("q_proj",))
    assert any("1 before it merged into the base weights" in n for n in plan.notes)
    new = read(tmp_path, {**QWEN3_LORA_SFT, "adapter_name_or_path": "adapter", "create_new_adapter": True})
    assert new.adapter == LORA_R8
    with pytest.raises(InvalidInput, match="'missing' .* has no adapter_config.json here"):
        read(tmp_path, {**QWEN3_LORA_SFT, "adapter_name_or_path": "missing"})


# examples/extras/oft/llama3_oft_sft.yaml (and qoft/llama3_oft_sft_bnb_npu.yaml: the same over a 4-bit base)
LLAMA3_OFT = {**{k: v for k, v in QWEN3_LORA_SFT.items() if k not in ("lora_rank", "lora_target")},
              "model_name_or_path": "meta-llama/Meta-Llama-3-8B-Instruct", "finetuning_type": "oft",
              "oft_block_size": 32, "oft_target": "all", "template": "llama3"}


def test_an_oft_config_is_peft_s_oft_config_as_llamafactory_builds_it(tmp_path):
    plan = read(tmp_path, LLAMA3_OFT)
    # LF model/adapter.py _setup_lora_tuning: OFTConfig(r=oft_rank (0), oft_block_size, target_modules from
    # lora_target (all: every linear layer but lm_head), module_dropout (0.0)); adapters upcast to float32
    assert plan.adapter == Adapter("lora", r=0, alpha=32, dropout=0.0, targets=("all-linear",), tuner="oft",
                                   block_size=32)
    assert plan.ignored == () and plan.mode == Mode("bf16", True)
    assert any(n.startswith("oft_target: all: parsed by LLaMA-Factory but never read") for n in plan.notes)
    assert any(n.startswith("finetuning_type: oft: OFT block size 32 (Cayley-Neumann") for n in plan.notes)
    assert any(n.startswith("lora_target: all: OFT on every linear layer") for n in plan.notes)
    qoft = read(tmp_path, {**LLAMA3_OFT, "quantization_bit": 4, "quantization_method": "bnb",
                           "double_quantization": False})
    assert qoft.adapter == Adapter("qlora", r=0, alpha=32, dropout=0.0, targets=("all-linear",),
                                   double_quant=False, compute_dtype="bfloat16", recipe="axolotl",
                                   tuner="oft", block_size=32)
    assert qoft.adapter.label().startswith("QOFT (nf4, Axolotl recipe) block size 32")
    ranked = read(tmp_path, {**LLAMA3_OFT, "oft_rank": 16, "oft_block_size": 0,
                             "lora_target": "q_proj,v_proj", "module_dropout": 0.1})
    adapter = ranked.adapter
    assert (adapter.r, adapter.block_size, adapter.targets) == (16, 0, ("q_proj", "v_proj"))
    assert any(n.startswith("module_dropout: 0.1: PEFT builds OFT's multiplicative dropout and no forward")
               for n in ranked.notes)


@pytest.mark.parametrize(("extra", "message"), [
    ({"oft_rank": 8}, "exactly one of them non-zero"),  # beside oft_block_size 32: OFTConfig refuses both
    ({"adapter_name_or_path": "saved"}, "loads adapters only for LoRA"),  # LF parser.py _verify_model_args
    ({"pissa_init": True}, "OFTConfig, which has no such field"),
])
def test_an_oft_config_llamafactory_would_refuse_is_refused(tmp_path, extra, message):
    with pytest.raises(InvalidInput, match=message):
        read(tmp_path, {**LLAMA3_OFT, **extra})


REFUSED = [
    ({"finetuning_type": "freeze"}, "finetuning_type", "training only some layers"),
    ({"stage": "ppo", "reward_model": "r"}, "stage", "PPO .* is not modelled"),
    ({"quantization_bit": 4, "quantization_method": "hqq"}, "quantization_method", "quantized weights"),
    ({"use_dora": True}, "use_dora", "DoRA"),
    ({"use_unsloth": True}, "use_unsloth", "Unsloth"),
    ({"use_unsloth_gc": True}, "use_unsloth_gc", "offloaded"),
    ({"upcast_layernorm": True}, "upcast_layernorm", "norm weights in float32 beside 16-bit weights"),
    ({"upcast_lmhead_output": True}, "upcast_lmhead_output", "lm_head's output to float32"),
    ({"additional_target": "lm_head"}, "additional_target", "casts the modules it trains whole to float32"),
    ({"resize_vocab": True}, "resize_vocab", "a resized vocabulary"),
    ({"add_special_tokens": "<x>"}, "add_special_tokens", "a resized vocabulary"),
    ({"flash_attn": "fa3"}, "flash_attn", "FlashAttention-3"),
    ({"neat_packing": True}, "neat_packing", "block-diagonal attention mask"),
    ({"use_galore": True}, "use_galore", "optimizer"),
    ({"use_badam": True}, "use_badam", "optimizer"),
    ({"use_asft_loss": True}, "use_asft_loss", "a reference model in a supervised step"),
    ({"mixture_of_depths": "convert"}, "mixture_of_depths", "mixture-of-depths"),
    ({"shift_attn": True}, "shift_attn", "S\\^2-Attn"),
    ({"fp8": True, "fp8_backend": "te"}, "fp8_backend", "Transformer Engine"),
    ({"torch_compile_mode": "max-autotune"}, "torch_compile_mode", "CUDA graphs"),
    ({"torchdynamo": "inductor"}, "torchdynamo", "torch.compile"),
    ({"do_train": False}, "do_train", "trains only with do_train: true"),
    ({"train_from_scratch": True}, "train_from_scratch", "from_config"),
    ({"optim": "lomo"}, "optim", "autotune models the optimizers"),
    ({"model_name_or_path": "unsloth/llama-3-8b-bnb-4bit"}, "model_name_or_path",
     "a checkpoint saved quantized"),
    # a vision-language model: what LLaMA-Factory's multimodal path does that autotune does not model
    ({"model_name_or_path": "google/gemma-3-4b-it", "image_do_pan_and_scan": True}, "image_do_pan_and_scan",
     "pan-and-scan"),
    ({"model_name_or_path": "Qwen/Qwen3-VL-4B-Instruct", "quantization_bit": 4}, "quantization_bit",
     "a vision-language model quantized"),
    ({"model_name_or_path": "Qwen/Qwen3-VL-4B-Instruct", "freeze_multi_modal_projector": False},
     "freeze_multi_modal_projector", "patch_target_modules"),
    ({"model_name_or_path": "Qwen/Qwen3-VL-4B-Instruct", "dataset": "mllm_video_demo"}, "dataset",
     "videos or audio"),
]


@pytest.mark.parametrize(("changes", "key", "why"), REFUSED, ids=[f"{k}" for _, k, _ in REFUSED])
def test_an_unmodelled_setting_is_refused_by_name(tmp_path, changes, key, why):
    with pytest.raises(UnmodelledSetting, match=f"^{key}: .* is not modelled: .*{why}"):
        read(tmp_path, {**QWEN3_LORA_SFT, **changes})


def test_the_trainers_refusals_are_llamafactorys_too(tmp_path):
    # A LLaMA-Factory YAML holds TrainingArguments' keys: what configs/trainer.py refuses is refused here.
    for key in _TRAINER_REFUSED:
        with pytest.raises(UnmodelledSetting, match=f"^{key}: "):
            read(tmp_path, {**QWEN3_LORA_SFT, key: "x"})


@pytest.mark.parametrize(("changes", "message"), [
    ({"quantization_bit": 4, "finetuning_type": "full"}, "LLaMA-Factory quantizes only for LoRA"),
    ({"quantization_bit": 3}, "quantization_bit in .* must be 4 or 8"),
    ({"neat_packing": True, "flash_attn": "fa2", "per_device_train_batch_size": 2},
     "needs per_device_train_batch_size: 1"),
    ({"neat_packing": True, "flash_attn": "fa2", "stage": "pt"}, "packs neatly only for sft"),
    ({"fp16": True}, "fp16 and bf16 .* are both true"),
    ({"stage": "grpo"}, "stage in .* must be one of sft, pt, rm, ppo, dpo, kto"),
    ({"infer_backend": "vllm"}, "trains only with the huggingface backend"),
])
def test_what_llamafactory_itself_refuses_is_refused(tmp_path, changes, message):
    with pytest.raises(InvalidInput, match=message):
        read(tmp_path, {**QWEN3_LORA_SFT, **changes})


# Every field of LF's argument dataclasses (hparams/*.py at ff6d4d1) but GeneratingArguments'.
LLAMAFACTORY_FIELDS = (
    "model_name_or_path adapter_name_or_path adapter_folder cache_dir use_fast_tokenizer resize_vocab "
    "split_special_tokens add_tokens add_special_tokens new_special_tokens_config init_special_tokens "
    "model_revision low_cpu_mem_usage rope_scaling flash_attn shift_attn mixture_of_depths use_unsloth "
    "use_unsloth_gc enable_liger_kernel moe_aux_loss_coef disable_gradient_checkpointing use_reentrant_gc "
    "upcast_layernorm upcast_lmhead_output train_from_scratch infer_backend offload_folder use_kv_cache "
    "use_v1_kernels infer_dtype hf_hub_token ms_hub_token om_hub_token print_param_status trust_remote_code "
    "quantization_method quantization_bit quantization_type double_quantization quantization_device_map "
    "image_max_pixels image_min_pixels image_do_pan_and_scan crop_to_patches video_max_pixels "
    "video_min_pixels video_fps video_maxlen use_audio_in_video audio_sampling_rate export_dir export_size "
    "export_device export_quantization_bit export_quantization_dataset export_quantization_nsamples "
    "export_quantization_maxlen export_legacy_format export_hub_model_id vllm_maxlen vllm_gpu_util "
    "vllm_enforce_eager vllm_max_lora_rank vllm_config sglang_maxlen sglang_mem_fraction sglang_tp_size "
    "sglang_config sglang_lora_backend use_kt kt_cpu_activation kt_weight_path kt_non_expert_weight_path "
    "kt_expert_checkpoint_path kt_use_lora_experts kt_lora_expert_num kt_lora_expert_intermediate_size "
    "template dataset eval_dataset dataset_dir media_dir cutoff_len train_on_prompt mask_history streaming "
    "buffer_size mix_strategy interleave_probs overwrite_cache preprocessing_batch_size "
    "preprocessing_num_workers max_samples eval_num_beams ignore_pad_token_for_loss val_size "
    "eval_on_each_dataset packing neat_packing tool_format default_system enable_thinking preserve_thinking "
    "tokenized_path data_shared_file_system freeze_trainable_layers freeze_trainable_modules "
    "freeze_extra_modules additional_target lora_alpha lora_dropout lora_rank lora_target loraplus_lr_ratio "
    "loraplus_lr_embedding use_rslora use_dora pissa_init pissa_iter pissa_convert create_new_adapter "
    "module_dropout oft_rank oft_block_size oft_target pref_beta pref_ftx pref_bco_weight pref_loss "
    "dpo_label_smoothing kto_chosen_weight kto_rejected_weight simpo_gamma ppo_buffer_size ppo_epochs "
    "ppo_score_norm ppo_target ppo_whiten_rewards ref_model ref_model_adapters ref_model_quantization_bit "
    "reward_model reward_model_adapters reward_model_quantization_bit reward_model_type ld_alpha use_galore "
    "galore_target galore_rank galore_update_interval galore_scale galore_proj_type galore_layerwise "
    "use_apollo apollo_target apollo_rank apollo_update_interval apollo_scale apollo_proj apollo_proj_type "
    "apollo_scale_type apollo_layerwise apollo_scale_front use_badam badam_mode badam_start_block "
    "badam_switch_mode badam_switch_interval badam_update_ratio badam_mask_mode badam_verbose use_swanlab "
    "swanlab_project swanlab_workspace swanlab_run_name swanlab_mode swanlab_api_key swanlab_logdir "
    "swanlab_lark_webhook_url swanlab_lark_secret pure_bf16 stage finetuning_type use_llama_pro "
    "use_adam_mini use_mca use_megatron_bridge use_hyper_parallel hyper_parallel_args hyper_parallel_cp_size "
    "use_muon use_dft_loss use_asft_loss asft_alpha use_eaft_loss eaft_alpha freeze_vision_tower "
    "freeze_multi_modal_projector freeze_language_model compute_accuracy disable_shuffling "
    "early_stopping_steps plot_loss include_effective_tokens_per_second ray_num_workers ray_init_kwargs "
    "master_addr master_port enable_torch_profiler profiler_output_dir profiler_wait_steps "
    "profiler_warmup_steps profiler_active_steps profiler_repeat profiler_record_shapes "
    "profiler_profile_memory profiler_with_stack profile_modules fp8 fp8_backend "
    "fp8_enable_fsdp_float8_all_gather overwrite_output_dir do_sample temperature top_p top_k num_beams "
    "max_length max_new_tokens repetition_penalty length_penalty skip_special_tokens kt_config").split()


def test_every_llamafactory_argument_is_classified(tmp_path):
    # Each key read, refused or known to have no effect: none comes back as ignored (unknown).
    keys = {key: None for key in (*LLAMAFACTORY_FIELDS, *TRAINER_FIELDS, *LEGACY_TRAINER_FIELDS)}
    plan = read(tmp_path, {**keys, **QWEN3_LORA_SFT})
    assert plan.ignored == ()


# examples/v1/train_batching_strategy/train_full_fsdp2_batching_normal.yaml: LLaMA-Factory v1.
V1 = {"model": "Qwen/Qwen3-0.6B", "model_class": "llm", "kernel_config": {"name": "auto"},
      "quant_config": None, "dist_config": {"name": "fsdp2", "dcp_path": None},
      "train_dataset": "data/v1_sft_demo.yaml", "output_dir": "outputs/test_fsdp2", "micro_batch_size": 2,
      "batching_strategy": "normal", "cutoff_len": 2048, "learning_rate": 1.0e-4, "max_steps": 10,
      "sample_backend": "hf", "max_new_tokens": 128}
# examples/megatron_bridge/llama3_sft.yaml, its Megatron keys (run with USE_MEGATRON_BRIDGE=1).
MEGATRON = {"tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 1, "context_parallel_size": 1,
            "sequence_parallel": False, "use_distributed_optimizer": True, "mixed_precision": "bf16_mixed"}


def test_v1_is_read_as_v1_and_megatron_runs_are_refused_by_name(tmp_path):
    # v1's model and micro_batch_size once read it as a mix of autotune's and Axolotl's keys.
    assert read(tmp_path, V1).notes[0].startswith("LLaMA-Factory v1 config")
    with pytest.raises(UnmodelledSetting, match="^tensor_model_parallel_size: 1 .* a Megatron-Core run"):
        read(tmp_path, {**QWEN3_LORA_SFT, **MEGATRON})


@pytest.mark.parametrize(("data", "fmt"), [
    (QWEN3_LORA_SFT, "llamafactory"),
    ({**QWEN3_FULL_SFT, "deepspeed": None}, "llamafactory"),  # once read as the Trainer's: sequence 1024
    ({**MOSSVL, "stage": "sft"}, "llamafactory"),  # packing: false made it TRL's
    ({"model_name_or_path": "m", "dataset_text_field": "text", "max_length": 512}, "trl-sft"),
    ({"model_name_or_path": "m", "per_device_train_batch_size": 4, "bf16": True}, "trainer"),
    ({"model_name_or_path": "m", "use_peft": True, "lora_r": 8}, "trl-sft"),
])
def test_llamafactory_is_told_apart_from_trl_and_the_trainer(tmp_path, data, fmt):
    assert read(tmp_path, data).format == fmt


def test_check_answers_a_llamafactory_qlora_config(tmp_path, capsys):
    path = tmp_path / "qwen3_lora_sft_otfq.yaml"
    path.write_text(yaml.safe_dump({**QWEN3_QLORA, "model_name_or_path": "tiny-llama", "cutoff_len": 64,
                                    "per_device_train_batch_size": 2}))
    code = main(["check", "tiny-llama", "--from-config", str(path), "--gpu-memory", "4GiB", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0 and doc["fits"] is True
    assert (doc["seq_len"], doc["batch_size"], doc["mode"], doc["ckpt_reentrant"]) == (
        64, 2, "bf16+ckpt", True)
    adapter = doc["adapter"]
    assert (adapter["method"], adapter["r"], adapter["alpha"], adapter["recipe"]) == (
        "qlora", 8, 16, "axolotl")
    assert doc["config_notes"][0] == f"read {path} as llamafactory"
    assert doc["ignored_keys"] == []


# examples/train_lora/qwen3vl_lora_sft.yaml, the keys beyond qwen3_lora_sft's
QWEN3VL_LORA_SFT = {**QWEN3_LORA_SFT, "model_name_or_path": "Qwen/Qwen3-VL-4B-Instruct",
                    "image_max_pixels": 262144, "video_max_pixels": 16384, "template": "qwen3_vl_nothink",
                    "dataset": "mllm_demo,identity,alpaca_en_demo"}
# LF model_utils/visual.py: qwen3_vl's vision_model_keys, projector_keys, lora_conflict_keys
QWEN3VL_TOWER = ("visual.pos_embed", "visual.patch_embed", "visual.blocks", "visual.deepstack_merger_list")


def test_a_vision_model_s_lora_leaves_its_tower_and_projector_without_adapters(tmp_path):
    plan = read(tmp_path, QWEN3VL_LORA_SFT)
    assert (plan.task, plan.images_per_sample, plan.image_size) == ("image-text-to-text", 2, "591x443")
    # patch_target_modules: freeze_vision_tower and freeze_multi_modal_projector default true
    assert plan.adapter.exclude == (*QWEN3VL_TOWER, "visual.merger", "patch_embed")
    assert plan.adapter.targets == ("all-linear",) and plan.frozen_modules is None
    # mm_plugin.py _preprocess_image: 640x480 scaled by sqrt(262144 / 307200), each side int()
    assert any("resized to 591x443 before the processor" in note for note in plan.notes)
    trained_tower = read(tmp_path, {**QWEN3VL_LORA_SFT, "freeze_vision_tower": False})
    assert trained_tower.adapter.exclude == ("visual.merger", "patch_embed")
    # image_max_pixels at its default 768 x 768 keeps a 640x480 image; one image a row without mllm_demo
    plain = read(tmp_path, {**QWEN3VL_LORA_SFT, "image_max_pixels": None, "dataset": "my_images"})
    assert (plain.image_size, plain.images_per_sample) == (None, None)


def test_a_vision_model_s_full_fine_tune_freezes_its_tower(tmp_path):
    # examples/train_full/qwen3vl_full_sft.yaml (its deepspeed left out)
    data = {**QWEN3VL_LORA_SFT, "finetuning_type": "full", "freeze_vision_tower": True,
            "freeze_multi_modal_projector": True, "freeze_language_model": False, "lora_rank": None,
            "lora_target": None}
    plan = read(tmp_path, data)
    assert plan.frozen_modules == (*QWEN3VL_TOWER, "visual.merger") and plan.adapter is None
    assert plan.task == "image-text-to-text" and plan.dtype == "float32"
    projector = read(tmp_path, {**data, "freeze_multi_modal_projector": False})
    assert projector.frozen_modules == QWEN3VL_TOWER
    assert read(tmp_path, {**data, "freeze_vision_tower": False,
                           "freeze_multi_modal_projector": False}).frozen_modules is None
    # a text model: the vision keys have no effect
    text = read(tmp_path, {**QWEN3_FULL_SFT, "deepspeed": None, "image_max_pixels": 1024,
                           "freeze_vision_tower": False})
    assert (text.task, text.frozen_modules, text.ignored) == ("causal-lm", None, ())


def test_the_frozen_tower_has_no_gradient_nor_optimizer_state():
    from autotune.backends.estimate.parts import ESTIMATE_PARTS
    from autotune.workload.frozen import freeze
    from autotune.workload.models import resolve_model
    from autotune.workload.optimizers import make_optimizer
    from autotune.workload.step import build_model

    model, _ = build_model(resolve_model("tiny-qwen3_vl"), "image-text-to-text", "eager", "float32")
    frozen = freeze(model, (*QWEN3VL_TOWER, "visual.merger"))
    tower = {name for name, _ in model.named_parameters() if ".visual." in name}
    assert frozen == len(tower) > 0
    sum(param.sum() for param in model.parameters()).backward()  # a loss over every parameter
    optimizer = make_optimizer(model, "adamw_torch", ESTIMATE_PARTS)
    optimizer.step()
    for name, param in model.named_parameters():
        assert (param.grad is None) == (name in tower), name
        assert (param in optimizer.state) == (name not in tower), name
    with pytest.raises(InvalidInput, match="match no parameter"):
        freeze(model, ("vision_tower",))


# --- the preference stages: LLaMA-Factory's own trainers (configs/llamafactory_preference.py) -----
# examples/train_lora/qwen3_lora_dpo.yaml, qwen3_lora_kto.yaml: the keys beyond qwen3_lora_sft's
QWEN3_LORA_DPO = {**QWEN3_LORA_SFT, "stage": "dpo", **PREFERENCE, "dataset": "dpo_en_demo"}
QWEN3_LORA_KTO = {**QWEN3_LORA_SFT, "stage": "kto", "pref_beta": 0.1, "dataset": "kto_en_demo"}
# examples/train_lora/qwen3_lora_reward.yaml
QWEN3_LORA_REWARD = {**QWEN3_LORA_SFT, "stage": "rm", "dataset": "dpo_en_demo", "learning_rate": 1.0e-4}


@pytest.mark.parametrize(("data", "trainer", "reference"), [
    (QWEN3_LORA_DPO, "dpo", "the model with its LoRA adapter disabled"),
    ({**QWEN3_LORA_DPO, "pref_loss": "orpo"}, "orpo", "none (use_ref_model false"),
    ({**QWEN3_LORA_DPO, "pref_loss": "simpo", "simpo_gamma": 0.5}, "simpo", "none (use_ref_model false"),
    ({**QWEN3_LORA_DPO, "pref_loss": "ipo"}, "dpo", "the model with its LoRA adapter disabled"),
    ({**QWEN3_LORA_DPO, "finetuning_type": "full"}, "dpo", "a frozen copy loaded again in the checkpoint's"),
    (QWEN3_LORA_KTO, "kto", "the model with its LoRA adapter disabled"),
    ({**QWEN3_LORA_KTO, "finetuning_type": "full"}, "kto", "a frozen copy loaded again"),
])
def test_the_preference_stages_are_llamafactory_s_trainers(tmp_path, data, trainer, reference):
    plan = read(tmp_path, data)
    assert (plan.request.step.trainer, plan.request.step.llamafactory) == (trainer, True)
    assert (plan.seq_len, plan.batch_size, plan.ignored) == (2048, 1, ())
    stage = next(n for n in plan.notes if n.startswith("stage: "))
    assert ("CustomKTOTrainer" if trainer == "kto" else "CustomDPOTrainer") in stage
    assert ("KL batch" in stage) == (trainer == "kto") and ("2 x batch rows" in stage) == (trainer != "kto")
    assert f"reference: {reference}" in stage


@pytest.mark.parametrize("changes", [{}, {"finetuning_type": "full"}])
def test_the_rm_stage_is_llamafactory_s_pairwise_trainer_over_a_value_head(tmp_path, changes):
    # train/rm/workflow.py run_rm: load_model(add_valuehead=True), PairwiseTrainer; DPO's keys unread
    plan = read(tmp_path, {**QWEN3_LORA_REWARD, **changes, "pref_beta": 0.1, "ref_model": "x"})
    assert (plan.request.step.trainer, plan.request.step.llamafactory, plan.request.step.task) == (
        "reward", True, "causal-lm")
    assert (plan.seq_len, plan.batch_size, plan.ignored) == (2048, 1, ())
    stage = next(n for n in plan.notes if n.startswith("stage: rm"))
    assert "PairwiseTrainer" in stage and "AutoModelForCausalLMWithValueHead" in stage
    assert "2 x batch rows" in stage and "no reference model" in stage
    unread = "pref_beta, ref_model: DPO's and KTO's, which run_rm does not read, no effect on memory"
    assert unread in plan.notes
    with pytest.raises(UnmodelledSetting, match="^enable_liger_kernel: "):
        read(tmp_path, {**QWEN3_LORA_REWARD, "enable_liger_kernel": True})
    with pytest.raises(UnmodelledSetting, match="^stage: .* over a vision-language model"):
        read(tmp_path, {**QWEN3_LORA_REWARD, "model_name_or_path": "Qwen/Qwen3-VL-4B-Instruct"})


@pytest.mark.parametrize(("changes", "key", "why"), [
    ({"ref_model": "other/model"}, "ref_model", "a reference loaded from another checkpoint"),
    ({"ld_alpha": 0.5}, "ld_alpha", "LD-DPO"),
    ({"enable_liger_kernel": True}, "enable_liger_kernel", "preference stage"),
    ({"model_name_or_path": "Qwen/Qwen3-VL-4B-Instruct"}, "stage", "over a vision-language model"),
])
def test_what_a_preference_stage_does_not_model_is_refused_by_name(tmp_path, changes, key, why):
    with pytest.raises(UnmodelledSetting, match=f"^{key}: .* {why}"):
        read(tmp_path, {**QWEN3_LORA_DPO, **changes})


def test_a_kto_reference_from_another_checkpoint_is_refused_and_orpo_has_none_to_refuse(tmp_path):
    with pytest.raises(UnmodelledSetting, match="^ref_model: "):
        read(tmp_path, {**QWEN3_LORA_KTO, "ref_model": "other/model"})
    # use_ref_model false: run_dpo builds no reference, ref_model is not read
    orpo = read(tmp_path, {**QWEN3_LORA_DPO, "pref_loss": "orpo", "ref_model": "x"})
    assert orpo.request.step.trainer == "orpo"


@pytest.mark.parametrize(("changes", "message"), [
    ({"pref_loss": "orpo", "dpo_label_smoothing": 0.1}, "for the sigmoid loss only"),
    ({"pissa_init": True}, "refuses PiSSA beside a reference model"),
    ({"pref_loss": "cpo"}, "pref_loss"),
])
def test_what_llamafactory_refuses_in_a_preference_stage_is_refused(tmp_path, changes, message):
    with pytest.raises(InvalidInput, match=message):
        read(tmp_path, {**QWEN3_LORA_DPO, **changes})


def test_check_answers_a_llamafactory_dpo_config_with_its_trainer(tmp_path, capsys):
    path = tmp_path / "qwen3_lora_dpo.yaml"
    path.write_text(yaml.safe_dump({**QWEN3_LORA_DPO, "model_name_or_path": "tiny-llama", "cutoff_len": 64}))
    code = main(["check", "tiny-llama", "--from-config", str(path), "--gpu-memory", "4GiB", "--json",
                 "--no-cache"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0 and doc["fits"] is True
    trainer = doc["trainer"]
    assert (trainer["name"], trainer["recipe"], trainer["rows_per_sample"], trainer["reference"]) == (
        "dpo", "llamafactory", 2, "adapter disabled")
    assert trainer["label"].startswith("dpo (LLaMA-Factory's CustomDPOTrainer)")
