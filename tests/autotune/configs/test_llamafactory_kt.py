"""LLaMA-Factory's use_kt (configs/llamafactory_kt.py): its KTransformers examples read as experts_kernel
ktransformers, and what LLaMA-Factory's model_args.py and adapter.py (and kt-kernel's wrapper.py) raise
for a use_kt job refused as the job failing, in their words.

The examples are LLaMA-Factory's examples/ktransformers/train_lora (HEAD of the mirror, 2026-11)."""

from __future__ import annotations

import pytest
from configread import read, write

from autotune.cli import main
from autotune.configs import read_training_config
from autotune.errors import JobFails, UnmodelledSetting

# examples/ktransformers/train_lora/qwen3moe_lora_sft_kt.yaml
QWEN3MOE_KT = {
    "model_name_or_path": "Qwen/Qwen3-235B-A22B-Instruct-2507", "trust_remote_code": True, "stage": "sft",
    "do_train": True, "finetuning_type": "lora", "lora_rank": 8, "lora_target": "all",
    "dataset": "identity, alpaca_en_demo", "template": "qwen3", "cutoff_len": 2048, "max_samples": 100000,
    "overwrite_cache": True, "preprocessing_num_workers": 16, "dataloader_num_workers": 4,
    "output_dir": "saves/KT_FT_qwen3Moe", "logging_steps": 10, "save_steps": 500, "plot_loss": True,
    "overwrite_output_dir": True, "save_only_model": False, "report_to": "none",
    "per_device_train_batch_size": 1, "gradient_accumulation_steps": 8, "learning_rate": 1.0e-4,
    "num_train_epochs": 3.0, "lr_scheduler_type": "cosine", "warmup_ratio": 0.1, "bf16": True,
    "ddp_timeout": 180000000, "resume_from_checkpoint": None, "use_kt": True,
}
# deepseek_v3_int8_lora_sft_kt.yaml's KT keys
INT8 = {
    "kt_cpu_activation": "retain", "kt_weight_path": "/path/to/routed-int8-experts",
    "kt_non_expert_weight_path": "/path/to/bf16-non-expert-cache",
    "kt_config": {"kt_expert_weight_format": "int8", "kt_backend": "auto",
                  "kt_weight_lifecycle": "persistent", "kt_num_threads": 96, "kt_tp_enabled": True,
                  "kt_threadpool_count": 2,
                  "kt_max_cache_depth": 2, "kt_share_backward_bb": True},
}


def test_the_example_reads_as_the_ktransformers_experts_kernel(tmp_path):
    got = read(tmp_path, QWEN3MOE_KT, "kt.yaml")
    assert got.experts_kernel == "ktransformers"
    assert got.ckpt_reentrant is None  # configure_kt_checkpointing: use_reentrant_gc = False
    assert any("use_reentrant=False under KT's context" in n for n in got.notes)
    assert read_training_config(write(tmp_path, QWEN3MOE_KT, "kt.yaml")).kt_weight_format == "bf16"


def test_the_int8_example_keeps_int8_experts_for_the_host_note(tmp_path):
    got = read(tmp_path, {**QWEN3MOE_KT, **INT8}, "kt.yaml")
    assert any("kt_cpu_activation: retain, kt_expert_weight_format: int8" in n for n in got.notes)
    config = read_training_config(write(tmp_path, {**QWEN3MOE_KT, **INT8}, "kt.yaml"))
    assert config.kt_weight_format == "int8"


@pytest.mark.parametrize(("changes", "words"), [
    ({"finetuning_type": "full"}, "KTransformers only supports LoRA finetuning."),
    ({"gradient_checkpointing": True}, "remove `gradient_checkpointing: true`"),
    ({"disable_gradient_checkpointing": True, "kt_cpu_activation": "recompute"},
     "`kt_cpu_activation: recompute` requires GPU gradient checkpointing"),
    ({"use_kt": False, "kt_cpu_activation": "retain"}, "only valid when `use_kt: true`"),
    ({"kt_config": {"kt_lora_rank": 4}}, "derived from LLaMA-Factory arguments: \\['kt_lora_rank'\\]"),
    ({"kt_config": {"kt_expert_weight_format": "int8"}}, "INT8 SFT requires kt_share_backward_bb=true"),
])
def test_what_llamafactory_and_kt_raise_fails_the_job(tmp_path, changes, words):
    with pytest.raises(JobFails, match=words):
        read(tmp_path, {**QWEN3MOE_KT, **changes}, "kt.yaml")


@pytest.mark.parametrize(("changes", "key"), [
    ({"kt_use_lora_experts": True}, "kt_use_lora_experts"),
    ({"kt_config": {"kt_num_gpu_experts": 2}}, "kt_config.kt_num_gpu_experts"),
])
def test_gpu_side_experts_are_not_modelled(tmp_path, changes, key):
    with pytest.raises(UnmodelledSetting, match=f"^{key}: .*GPU-side experts"):
        read(tmp_path, {**QWEN3MOE_KT, **changes}, "kt.yaml")


def test_a_kt_check_of_a_tiny_mixture_says_the_experts_are_on_the_cpu(tmp_path, capsys):
    path = tmp_path / "kt.yaml"
    path.write_text("model_name_or_path: tiny-qwen3_moe\nstage: sft\nfinetuning_type: lora\ncutoff_len: 64\n"
                    "per_device_train_batch_size: 1\nbf16: true\ndo_train: true\nuse_kt: true\n")
    assert main(["check", "tiny-qwen3_moe", "--from-config", str(path), "--gpu", "H100-80GB",
                 "--dtype", "bfloat16"]) == 0
    out = capsys.readouterr().out
    assert "note: use_kt: experts on the CPU (KTransformers), emulated" in out
    # 2 layers x 4 experts x 3 x 32 x 32 bfloat16 weights (tiny.py's qwen3_moe)
    assert "note: host memory: the routed experts' bf16 weights, 48 KiB at least" in out
    assert "use_kernels" not in out  # no hub kernels: KT is not ScatterMoE


def test_a_kt_check_of_a_dense_model_fails(tmp_path, capsys):
    path = tmp_path / "kt.yaml"
    path.write_text("model_name_or_path: tiny-llama\nstage: sft\nfinetuning_type: lora\ncutoff_len: 64\n"
                    "do_train: true\nuse_kt: true\n")
    assert main(["check", "tiny-llama", "--from-config", str(path), "--gpu", "H100-80GB"]) == 2
    assert "not supported for KT AMX" in capsys.readouterr().err


def test_the_qwen35_moe_example_reads_as_llamafactorys_composite_model(tmp_path):
    # model_utils/visual.py _register_composite_model(model_type="qwen3_5_moe", ...): LoRA leaves the tower
    # and the projector model.visual.merger out; before, qwen3_5_moe was refused as a model type not read
    qwen35 = {**QWEN3MOE_KT, "model_name_or_path": "Qwen/Qwen3.5-397B-A17B", "template": "qwen3_5"}
    got = read(tmp_path, qwen35, "kt.yaml")
    assert got.task == "image-text-to-text" and got.experts_kernel == "ktransformers"
    assert {"model.visual.merger", "visual.blocks"} <= set(got.adapter.exclude)
