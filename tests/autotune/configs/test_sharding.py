"""A job on more than one GPU, read from its configs: FSDP2, DeepSpeed's stage and the DDP keys of
each format (configs/sharding.py), the accelerate config it is launched with (configs/accelerate.py),
and what is refused by name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from autotune.cli import main
from autotune.configs import read_training_config, read_training_configs
from autotune.errors import InvalidInput, UnknownSetting, UnmodelledSetting

EXAMPLES = Path(__file__).parents[3] / "examples"

TRAINER = {"model_name_or_path": "tiny-llama", "max_seq_length": 64, "per_device_train_batch_size": 2,
           "output_dir": "out"}
AXOLOTL = {"base_model": "tiny-llama", "sequence_len": 64, "micro_batch_size": 2, "bf16": True,
           "attn_implementation": "flash_attention_2", "datasets": [{"path": "x", "type": "alpaca"}]}
AXOLOTL_FSDP2 = {**AXOLOTL, "fsdp_version": 2, "fsdp_config": {
    "auto_wrap_policy": "TRANSFORMER_BASED_WRAP", "transformer_layer_cls_to_wrap": "LlamaDecoderLayer",
    "reshard_after_forward": True, "state_dict_type": "FULL_STATE_DICT"}}
LLAMAFACTORY = {"model_name_or_path": "tiny-llama", "stage": "sft", "do_train": True,
                "finetuning_type": "lora", "lora_target": "all", "dataset": "alpaca_en_demo",
                "template": "llama3", "cutoff_len": 64, "per_device_train_batch_size": 2, "bf16": True,
                "output_dir": "out"}
ACCELERATE = {"compute_environment": "LOCAL_MACHINE", "distributed_type": "FSDP", "mixed_precision": "bf16",
              "num_machines": 1, "num_processes": 4, "machine_rank": 0, "main_training_function": "main",
              "rdzv_backend": "static", "same_network": True, "use_cpu": False, "tpu_env": [],
              "fsdp_config": {"fsdp_version": 2, "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
                              "fsdp_reshard_after_forward": True, "fsdp_offload_params": False,
                              "fsdp_cpu_ram_efficient_loading": True,
                              "fsdp_state_dict_type": "FULL_STATE_DICT"}}


def write(tmp_path: Path, data: dict, name: str) -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data) if name.endswith(".json") else yaml.safe_dump(data))
    return path


def launch(tmp_path: Path, data: dict, name: str = "config.json"):
    """The request's multi-GPU fields of a config: (parallel, reshard_after_forward, gpus, nodes)."""
    step = read_training_config(write(tmp_path, data, name)).request.step
    return step.parallel, step.reshard_after_forward, step.gpus, step.nodes


# ---------------------------------------------------------------------------------------------
# TrainingArguments / TRL: fsdp and fsdp_config as transformers' _process_fsdp_args reads them


@pytest.mark.parametrize(("fsdp", "fsdp_config", "reshard"), [
    ("full_shard auto_wrap", None, True),
    (["shard_grad_op", "auto_wrap"], None, False),
    (True, None, True),  # version 2 and reshard_after_forward true: transformers' defaults
    (True, {"fsdp_version": 2, "fsdp_reshard_after_forward": "false"}, False),  # fsdp_ prefixes dropped
    ("shard_grad_op", {"reshard_after_forward": True}, True),  # fsdp_config's value first (setdefault)
])
def test_training_arguments_fsdp_is_fsdp2(tmp_path, fsdp, fsdp_config, reshard):
    data = {**TRAINER, "fsdp": fsdp, "fsdp_config": fsdp_config}
    assert launch(tmp_path, data) == ("fsdp", reshard, None, None)
    sft = {**data, "dataset_text_field": "text", "model_init_kwargs": {"dtype": "bfloat16"}}
    assert launch(tmp_path, sft, "sft.json")[:2] == ("fsdp", reshard)


def test_fsdp_config_is_read_from_its_json_file(tmp_path):
    write(tmp_path, {"reshard_after_forward": False, "cpu_ram_efficient_loading": True}, "fsdp.json")
    config = read_training_config(write(tmp_path, {**TRAINER, "fsdp": True, "fsdp_config": "fsdp.json"},
                                        "train.json"))
    assert (config.request.step.parallel, config.request.step.reshard_after_forward) == ("fsdp", False)
    assert any(note.startswith("fsdp_config.cpu_ram_efficient_loading: True: no effect on GPU memory")
               for note in config.notes)
    with pytest.raises(InvalidInput, match="fsdp_config: 'absent.json' in .*no such file"):
        launch(tmp_path, {**TRAINER, "fsdp": True, "fsdp_config": "absent.json"})


def test_fsdp_config_without_fsdp_is_not_read(tmp_path):
    # a TrainingArguments dump fills fsdp_config; transformers reads it only with fsdp
    dump = {**TRAINER, "fsdp": [], "fsdp_config": {"min_num_params": 0, "xla": False, "cpu_offload": True}}
    assert launch(tmp_path, dump) == (None, None, None, None)


@pytest.mark.parametrize(("changes", "key", "why"), [
    ({"fsdp": True, "fsdp_config": {"version": 1, "limit_all_gathers": False}},
     "fsdp_config.limit_all_gathers", "rate limiter"),
    ({"fsdp": True, "fsdp_config": {"auto_wrap_policy": "SIZE_BASED_WRAP", "min_num_params": 1000}},
     "fsdp_config.auto_wrap_policy", "one per decoder layer"),
    ({"fsdp": True, "fsdp_config": {"xla": True}}, "fsdp_config.xla", "XLA"),
    ({"fsdp": True, "fsdp_config": {"ignored_modules": ["lm_head"]}}, "fsdp_config.ignored_modules",
     "unsharded"),
])
def test_training_arguments_sharding_not_modelled_is_refused_by_name(tmp_path, changes, key, why):
    with pytest.raises(UnmodelledSetting, match=rf"^{key}: .* is not modelled: .*{why}"):
        launch(tmp_path, {**TRAINER, **changes})


@pytest.mark.parametrize(("changes", "error", "message"), [
    # transformers' _apply_legacy_fsdp_to_config: a ValueError with FSDP2, the default
    ({"fsdp": "hybrid_shard"}, InvalidInput, "fsdp: 'hybrid_shard' in .* only available with FSDP1"),
    ({"fsdp": "FULL_SHARD"}, InvalidInput, "fsdp: 'FULL_SHARD' in .* only available with FSDP1"),
    ({"fsdp": "full_shard sharded"}, InvalidInput, "unknown option 'sharded'"),
    ({"fsdp": True, "fsdp_config": {"reshard_after_froward": False}}, UnknownSetting,
     "unknown key fsdp_config.reshard_after_froward .*did you mean reshard_after_forward"),
    ({"fsdp": "full_shard", "deepspeed": {"zero_optimization": {"stage": 2}}}, InvalidInput,
     "fsdp and deepspeed in .* are both set"),
])
def test_training_arguments_sharding_errors_are_named(tmp_path, changes, error, message):
    with pytest.raises(error, match=message):
        launch(tmp_path, {**TRAINER, **changes})


def test_fsdp_keys_without_effect_and_ddp_keys_are_noted(tmp_path):
    config = read_training_config(write(tmp_path, {
        **TRAINER, "fsdp": True, "ddp_find_unused_parameters": True, "ddp_bucket_cap_mb": 25,
        "fsdp_config": {"use_orig_params": True, "sync_module_states": True, "forward_prefetch": True,
                        "backward_prefetch": "BACKWARD_PRE", "limit_all_gathers": True,
                        "state_dict_type": "SHARDED_STATE_DICT"}}, "train.json"))
    noted = {note.split(":")[0] for note in config.notes}
    assert {"fsdp_config.use_orig_params", "fsdp_config.sync_module_states", "fsdp_config.forward_prefetch",
            "fsdp_config.backward_prefetch", "fsdp_config.limit_all_gathers", "fsdp_config.state_dict_type",
            "ddp_find_unused_parameters", "ddp_bucket_cap_mb", "fsdp"} <= noted
    assert config.ignored == ()


# ---------------------------------------------------------------------------------------------
# DeepSpeed: the ZeRO stage into parallel, its zero_optimization into zero_config


def test_deepspeed_stage_is_read_from_a_mapping_a_file_or_a_shipped_name(tmp_path):
    assert launch(tmp_path, {**TRAINER, "deepspeed": {"zero_optimization": {"stage": 3}}})[0] == "zero3"
    write(tmp_path, {"zero_optimization": {"stage": 1}, "bf16": {"enabled": "auto"}}, "ds.json")
    assert launch(tmp_path, {**TRAINER, "deepspeed": "ds.json"})[0] == "zero1"
    axolotl = {**AXOLOTL, "deepspeed": "deepspeed_configs/zero1.json"}  # Axolotl's shipped file
    assert launch(tmp_path, axolotl, "axolotl.yml")[0] == "zero1"
    # Axolotl's shipped zero2.json offloads the optimizer to the CPU, which DeepSpeed's own offload
    # code runs (workload/zero.py); an NVMe offload is refused by name
    shipped = read_training_config(write(tmp_path, {**AXOLOTL, "deepspeed": "deepspeed_configs/zero2.json"},
                                         "axolotl.yml")).request.step
    assert shipped.parallel == "zero2" and "offload_optimizer" in str(shipped.zero_config)
    nvme = {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "nvme", "nvme_path": "/nvme"}}}
    with pytest.raises(UnmodelledSetting, match="zero_optimization.offload_optimizer.device: 'nvme'"):
        launch(tmp_path, {**TRAINER, "deepspeed": nvme})
    lf = {**LLAMAFACTORY, "deepspeed": "examples/deepspeed/ds_z2_config.json"}  # LLaMA-Factory's
    assert launch(tmp_path, lf, "lf.yaml")[0] == "zero2"


@pytest.mark.parametrize("name, offloaded", [
    ("zero3_bf16.json", set()),
    ("zero3_bf16_cpuoffload_params.json", {"offload_param"}),
    ("zero3_bf16_cpuoffload_all.json", {"offload_optimizer", "offload_param"}),
])
def test_axolotl_s_shipped_zero3_files_offload_what_they_say(tmp_path, name, offloaded):
    # Axolotl's mixtral_22 and bigstral examples (deepspeed_configs/, Axolotl 067b021): each offload
    # pinned to the host, read into zero_config where it was dropped before
    config = read_training_config(write(tmp_path, {**AXOLOTL, "deepspeed": f"deepspeed_configs/{name}"},
                                        "axolotl.yml"))
    zero = json.loads(config.request.step.zero_config)
    assert config.request.step.parallel == "zero3" and zero["sub_group_size"] == 0
    assert {key for key in zero if key.startswith("offload_")} == offloaded
    assert all(zero[key] == {"device": "cpu", "pin_memory": True} for key in offloaded)
    # zero_force_ds_cpu_optimizer false: the Trainer's optimizer steps the host partitions (noted)
    forced = [note for note in config.notes if "zero_force_ds_cpu_optimizer: false" in note]
    assert len(forced) == ("offload_optimizer" in offloaded)


def test_deepspeed_errors_are_named(tmp_path):
    with pytest.raises(InvalidInput, match="^deepspeed: 'missing.json' in .* no such file"):
        launch(tmp_path, {**TRAINER, "deepspeed": "missing.json"})
    with pytest.raises(UnmodelledSetting, match="^deepspeed: .* is not modelled: .*stage 0.* not torch DDP"):
        launch(tmp_path, {**TRAINER, "deepspeed": {"zero_optimization": {"stage": 0}}})
    with pytest.raises(UnmodelledSetting, match="^deepspeed: .*stage 0"):  # LLaMA-Factory's ds_z0
        launch(tmp_path, {**LLAMAFACTORY, "deepspeed": "examples/deepspeed/ds_z0_config.json"}, "lf.yaml")
    with pytest.raises(InvalidInput, match="zero_optimization.stage in .* must be 0, 1, 2 or 3"):
        launch(tmp_path, {**TRAINER, "deepspeed": {"zero_optimization": {"stage": 4}}})


# ---------------------------------------------------------------------------------------------
# Axolotl


def test_axolotl_fsdp2_is_read(tmp_path):
    config = read_training_config(write(tmp_path, AXOLOTL_FSDP2, "a.yml"))
    step = config.request.step
    assert (step.parallel, step.reshard_after_forward, config.parallel_key) == ("fsdp", True, "fsdp_config")
    assert step.fsdp_recipe == "axolotl"  # Axolotl's own FSDP2 preparation, not accelerate's
    assert (config.wrap_classes, config.ignored) == (("LlamaDecoderLayer",), ())
    assert any("Axolotl prepares FSDP2 itself" in note for note in config.notes)
    unsharded = {**AXOLOTL_FSDP2, "fsdp_config": {"fsdp_version": 2, "fsdp_reshard_after_forward": False}}
    assert launch(tmp_path, unsharded, "b.yml")[:2] == ("fsdp", False)
    listed = {**AXOLOTL, "fsdp_version": 2, "fsdp": ["shard_grad_op", "auto_wrap"]}  # the deprecated list
    assert launch(tmp_path, listed, "c.yml")[:2] == ("fsdp", False)


def test_an_unversioned_axolotl_fsdp_config_is_fsdp1_as_the_trainer_hands_it_to_accelerate(tmp_path):
    fsdp1 = {**AXOLOTL, "fsdp_config": {
        "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "fsdp_transformer_layer_cls_to_wrap": "LlamaDecoderLayer",
        "fsdp_use_orig_params": False, "fsdp_limit_all_gathers": True, "fsdp_sync_module_states": True,
        "fsdp_sharding_strategy": "FULL_SHARD", "fsdp_backward_prefetch": "BACKWARD_PRE",
        "fsdp_state_dict_type": "FULL_STATE_DICT"}}
    config = read_training_config(write(tmp_path, fsdp1, "a.yml"))
    step = config.request.step
    assert (step.parallel, step.fsdp_version, step.fsdp_recipe) == ("fsdp", 1, None)
    assert json.loads(step.fsdp1_config) == {"use_orig_params": False, "forward_prefetch": False,
                                             "backward_prefetch": "BACKWARD_PRE"}
    assert any("check_fsdp_version_in_fsdp_config" in note for note in config.notes)
    versioned = {**fsdp1, "fsdp_version": 1}
    assert read_training_config(write(tmp_path, versioned, "b.yml")).request.step.fsdp_version == 1
    assert main(["check", "--from-config", str(tmp_path / "a.yml"), "--gpus", "4", "--gpu", "H100-80GB",
                 "--workers", "1", "--no-cache"]) == 0


def test_training_arguments_fsdp_config_version_1_is_fsdp1_full_shard(tmp_path):
    data = {**TRAINER, "fsdp": "shard_grad_op auto_wrap", "fsdp_config": {"version": 1}}
    config = read_training_config(write(tmp_path, data, "t.json"))
    step = config.request.step
    assert (step.parallel, step.reshard_after_forward, step.fsdp_version) == ("fsdp", True, 1)
    # the Trainer's defaults (_process_fsdp_args): use_orig_params true, no prefetch
    assert json.loads(step.fsdp1_config) == {"use_orig_params": True, "forward_prefetch": False,
                                             "backward_prefetch": None}
    # accelerate's plugin sets sharding_strategy FULL_SHARD, which prepare_model passes first
    assert any("reshard_after_forward: 'shard_grad_op': no effect" in note for note in config.notes)
    with pytest.raises(InvalidInput, match="reshard_after_forward"):
        launch(tmp_path, {**TRAINER, "fsdp": True,
                          "fsdp_config": {"version": 1, "reshard_after_forward": True}})


@pytest.mark.parametrize(("changes", "key", "why"), [
    ({"fsdp_version": 1, "fsdp_config": {"fsdp_sharding_strategy": "SHARD_GRAD_OP"}},
     "fsdp_config.sharding_strategy", "only FULL_SHARD"),
    ({"fsdp_config": {"auto_wrap_policy": "SIZE_BASED_WRAP", "min_num_params": 10}},
     "fsdp_config.auto_wrap_policy", "one per decoder layer"),
    ({"expert_parallel_size": 2}, "expert_parallel_size", "ExpertParallelPlugin"),
])
def test_axolotl_sharding_not_modelled_is_refused_by_name(tmp_path, changes, key, why):
    with pytest.raises(UnmodelledSetting, match=rf"^{key}: .* is not modelled: .*{why}"):
        launch(tmp_path, {**AXOLOTL_FSDP2, **changes}, "a.yml")


def test_axolotl_fsdp_activation_checkpointing_is_read_and_refused_beside_gradient_checkpointing(tmp_path):
    ac = {**AXOLOTL_FSDP2,
          "fsdp_config": {**AXOLOTL_FSDP2["fsdp_config"], "fsdp_activation_checkpointing": True}}
    config = read_training_config(write(tmp_path, ac, "a.yml"))
    step = config.request.step
    assert (step.parallel, step.fsdp_recipe, step.fsdp_activation_checkpointing) == ("fsdp", "axolotl", True)
    assert "ckpt" not in config.request.mode
    assert any("accelerate 1.13's fsdp2_apply_ac" in note for note in config.notes)
    assert read_training_config(write(tmp_path, AXOLOTL_FSDP2, "b.yml")).request.step \
        .fsdp_activation_checkpointing is None
    with pytest.raises(InvalidInput, match="gradient_checkpointing: true in .*transformers 5.14.1, "
                       "Axolotl's pin.* can't be set to True simultaneously"):
        read_training_config(write(tmp_path, {**ac, "gradient_checkpointing": True}, "c.yml"))


def test_training_arguments_fsdp_activation_checkpointing_is_read(tmp_path):
    ac = {**TRAINER, "fsdp": "full_shard auto_wrap", "fsdp_config": {"activation_checkpointing": True}}
    config = read_training_config(write(tmp_path, ac, "t.json"))
    assert config.request.step.fsdp_activation_checkpointing is True
    assert any("accelerate 1.15 applies it" in note for note in config.notes)
    for both in ({"gradient_checkpointing": True}, {"activation_checkpointing": True}):
        with pytest.raises(InvalidInput, match="Trainer refuses the two together"):
            read_training_config(write(tmp_path, {**ac, **both}, "u.json"))


def test_fsdp1_activation_checkpointing_is_read_as_accelerate_applies_it(tmp_path):
    """FSDP1's own checkpointing (accelerate's prepare_model: apply_activation_checkpointing after
    wrapping), from a TrainingArguments fsdp_config of version 1 and from Axolotl's unversioned one;
    refused beside gradient checkpointing, as the Trainer refuses it."""
    trainer = {**TRAINER, "fsdp": "full_shard auto_wrap",
               "fsdp_config": {"version": 1, "activation_checkpointing": True}}
    axolotl = {**AXOLOTL, "fsdp": ["full_shard", "auto_wrap"], "fsdp_config": {
        "fsdp_transformer_layer_cls_to_wrap": "LlamaDecoderLayer", "fsdp_activation_checkpointing": True}}
    for data, name in ((trainer, "t.json"), (axolotl, "a.yml")):
        config = read_training_config(write(tmp_path, data, name))
        step = config.request.step
        assert (step.parallel, step.fsdp_version, step.fsdp_activation_checkpointing) == ("fsdp", 1, True)
        assert "ckpt" not in config.request.mode
        assert any("FSDP's own activation checkpointing under FSDP1" in note for note in config.notes)
    for both in ({"gradient_checkpointing": True}, {"activation_checkpointing": True}):
        with pytest.raises(InvalidInput, match="Trainer refuses the two together"):
            read_training_config(write(tmp_path, {**trainer, **both}, "u.json"))
    with pytest.raises(InvalidInput, match="gradient_checkpointing: true in .*can't be set to True"):
        read_training_config(write(tmp_path, {**axolotl, "gradient_checkpointing": True}, "b.yml"))
    with pytest.raises(UnmodelledSetting, match="activation_offloading is not modelled"):
        read_training_config(write(tmp_path, {**axolotl, "activation_offloading": True}, "c.yml"))


def test_axolotl_refuses_deepspeed_beside_fsdp(tmp_path):
    with pytest.raises(InvalidInput, match="deepspeed and fsdp_config in .* Axolotl runs one of them"):
        launch(tmp_path, {**AXOLOTL_FSDP2, "deepspeed": "deepspeed_configs/zero2.json"}, "a.yml")


# ---------------------------------------------------------------------------------------------
# accelerate config: the launch, alone or beside a training config


def test_an_accelerate_config_is_read_alone(tmp_path):
    config = read_training_config(write(tmp_path, ACCELERATE, "acc.yaml"))
    step = config.request.step
    assert (config.format, step.parallel, step.reshard_after_forward, step.gpus, step.nodes) == (
        "accelerate", "fsdp", True, 4, None)
    assert (config.request.mode, config.mixed_precision, config.ignored) == ("bf16", "bf16", ())
    multi = {**ACCELERATE, "distributed_type": "MULTI_GPU", "fsdp_config": {}, "mixed_precision": "no"}
    assert launch(tmp_path, multi, "multi.yaml") == ("ddp", None, 4, None)
    deepspeed = {**ACCELERATE, "distributed_type": "DEEPSPEED", "fsdp_config": {},
                 "deepspeed_config": {"zero_stage": 3, "offload_optimizer_device": "none"}}
    assert launch(tmp_path, deepspeed, "ds.yaml")[0] == "zero3"
    one = {**ACCELERATE, "distributed_type": "NO", "num_processes": 1, "fsdp_config": {}}
    assert launch(tmp_path, one, "one.yaml") == (None, None, None, None)


def test_accelerate_machines_and_hybrid_sharding(tmp_path):
    # num_processes is the total over machines; FSDP2 shards over all of them without a
    # parallelism_config (accelerate builds a hybrid mesh only from its dp_replicate_size)
    nodes = read_training_config(write(tmp_path, {**ACCELERATE, "num_machines": 2, "num_processes": 16},
                                       "nodes.yaml"))
    assert (nodes.request.step.gpus, nodes.request.step.nodes) == (16, None)
    assert any(note.startswith("num_machines: 2: FSDP2 shards over every GPU") for note in nodes.notes)
    hybrid = {**ACCELERATE, "num_machines": 2, "num_processes": 16, "parallelism_config": {
        "parallelism_config_dp_replicate_size": 2, "parallelism_config_dp_shard_size": 8}}
    assert launch(tmp_path, hybrid, "hybrid.yaml") == ("fsdp", True, 16, 2)
    with pytest.raises(InvalidInput, match="dp_replicate_size x dp_shard_size = 8, not num_processes 16"):
        launch(tmp_path, {**hybrid, "parallelism_config": {
            "parallelism_config_dp_replicate_size": 2, "parallelism_config_dp_shard_size": 4}}, "bad.yaml")


@pytest.mark.parametrize(("fsdp_config", "key", "why"), [
    ({"fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP"}, "fsdp_config.fsdp_version", "FSDP1"),
    ({"fsdp_version": 1, "fsdp_sharding_strategy": "FULL_SHARD"}, "fsdp_config.fsdp_version", "FSDP1"),
    ({"fsdp_version": 2}, "fsdp_config.fsdp_auto_wrap_policy", "one per decoder layer"),
    ({"fsdp_version": 1, "fsdp_offload_params": True}, "fsdp_config.fsdp_version", "FSDP1"),
    ({"fsdp_version": 2, "fsdp_activation_checkpointing": True}, "fsdp_config.fsdp_activation_checkpointing",
     "set it in the training config's fsdp_config"),
])
def test_accelerate_fsdp_not_modelled_is_refused_by_name(tmp_path, fsdp_config, key, why):
    with pytest.raises(UnmodelledSetting, match=rf"^{key}: .* is not modelled: .*{why}"):
        launch(tmp_path, {**ACCELERATE, "fsdp_config": fsdp_config}, "acc.yaml")


def test_a_training_config_and_its_accelerate_config_are_read_together(tmp_path):
    train, acc = write(tmp_path, TRAINER, "train.json"), write(tmp_path, ACCELERATE, "acc.yaml")
    config = read_training_configs([str(acc), str(train)])
    step = config.request.step
    assert (config.format, config.files) == ("trainer", ((str(train), "trainer"), (str(acc), "accelerate")))
    assert (step.model, step.parallel, step.gpus, config.request.mode) == ("tiny-llama", "fsdp", 4, "bf16")
    assert any(note.startswith("mixed_precision: bf16 in") for note in config.notes)
    # the Trainer's own FSDP plugin over the launcher's MULTI_GPU, and its reshard_after_forward
    sharded = write(tmp_path, {**TRAINER, "fsdp": "shard_grad_op", "bf16": True}, "sharded.json")
    multi = write(tmp_path, {**ACCELERATE, "distributed_type": "MULTI_GPU"}, "multi.yaml")
    step = read_training_configs([sharded, multi]).request.step
    assert (step.parallel, step.reshard_after_forward, step.gpus) == ("fsdp", False, 4)
    # FSDP1 in the accelerate config: the Trainer's plugin says version 2
    fsdp1 = write(tmp_path, {**ACCELERATE, "fsdp_config": {"fsdp_sharding_strategy": "FULL_SHARD"}},
                  "v1.yaml")
    assert read_training_configs([sharded, fsdp1]).request.step.parallel == "fsdp"


def test_a_training_config_and_its_accelerate_config_that_disagree_are_refused(tmp_path):
    acc = write(tmp_path, ACCELERATE, "acc.yaml")
    fp16 = write(tmp_path, {**TRAINER, "fp16": True}, "fp16.json")
    with pytest.raises(InvalidInput, match="trains in amp and mixed_precision: bf16 in .* they disagree"):
        read_training_configs([fp16, acc])
    zero = write(tmp_path, {**TRAINER, "deepspeed": {"zero_optimization": {"stage": 2}}}, "zero.json")
    with pytest.raises(InvalidInput, match="deepspeed in .* runs zero2 and distributed_type in .* runs fsdp"):
        read_training_configs([zero, acc])
    with pytest.raises(InvalidInput, match="give one training config, and at most one launcher's config"):
        read_training_configs([zero, fp16])


# ---------------------------------------------------------------------------------------------
# Through the CLI: the GPU count, the refusals by name, an answer


def check(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["check", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_config_that_spreads_the_job_needs_the_gpu_count(tmp_path, capsys):
    path = write(tmp_path, {**TRAINER, "fsdp": "full_shard"}, "train.json")
    code, _, err = check(capsys, "--from-config", str(path), "--gpu", "A100-80GB")
    assert code == 2
    assert f"Error: '{path}' spreads the job over GPUs with fsdp (fsdp): give --gpus N, the GPUs it " \
        "launches on, every node's together" in err
    zero = write(tmp_path, {**TRAINER, "deepspeed": {"zero_optimization": {"stage": 2}}}, "zero.json")
    code, _, err = check(capsys, "--from-config", str(zero), "--gpu", "A100-80GB")
    assert code == 2 and "give --gpus N" in err
    code, out, err = check(capsys, "--from-config", str(zero), "--gpus", "8", "--gpu", "A100-80GB")
    assert code == 0 and "DeepSpeed ZeRO-2, 8 GPUs" in out, err


def test_a_wrapped_class_the_model_lacks_is_refused_with_its_classes(tmp_path, capsys):
    path = write(tmp_path, {**AXOLOTL_FSDP2, "fsdp_config": {
        "fsdp_version": 2, "transformer_layer_cls_to_wrap": "MistralDecoderLayer"}}, "a.yml")
    code, _, err = check(capsys, "--from-config", str(path), "--gpus", "4", "--gpu", "A100-80GB")
    assert code == 2
    assert "Error: fsdp_config.transformer_layer_cls_to_wrap: MistralDecoderLayer: no module of tiny-llama " \
        "is of that class (accelerate's set_auto_wrap_policy raises \"Could not find the transformer layer " \
        "class ... in the model\"); its layer classes (_no_split_modules): LlamaDecoderLayer; all its " \
        "classes: Embedding, Linear, LlamaAttention, LlamaDecoderLayer," in err
    spaced = write(tmp_path, {**AXOLOTL_FSDP2, "fsdp_config": {
        "fsdp_version": 2, "transformer_layer_cls_to_wrap": "LlamaDecoderLayer, Embedding"}}, "b.yml")
    code, _, err = check(capsys, "--from-config", str(spaced), "--gpus", "4", "--gpu", "A100-80GB")
    assert code == 2 and "accelerate's plugin splits the string on commas" in err


@pytest.mark.parametrize(("configs", "flags"), [
    ({**AXOLOTL_FSDP2, "fsdp_config": {"fsdp_version": 2, "transformer_layer_cls_to_wrap": "LlamaMLP"}}, ()),
    ({**TRAINER, "fsdp": "full_shard auto_wrap", "bf16": True,
      "fsdp_config": {"transformer_layer_cls_to_wrap": ["LlamaMLP"]}}, ()),
    ({**TRAINER, "fsdp": "full_shard auto_wrap", "bf16": True,
      "fsdp_config": {"version": 1, "transformer_layer_cls_to_wrap": ["LlamaMLP"]}}, ()),
    (({**LLAMAFACTORY, "finetuning_type": "full"}, {**ACCELERATE, "fsdp_config": {
        **ACCELERATE["fsdp_config"], "fsdp_transformer_layer_cls_to_wrap": "LlamaMLP"}}), ()),
    (AXOLOTL_FSDP2, ("--fsdp-wrap", "LlamaMLP")),  # the flag over the config's LlamaDecoderLayer
], ids=["axolotl", "trainer", "trainer-fsdp1", "llamafactory+accelerate", "flag"])
def test_the_classes_a_config_names_are_wrapped(tmp_path, capsys, configs, flags):
    training, accelerate = configs if isinstance(configs, tuple) else (configs, None)
    name = "train.json" if "output_dir" in training and "stage" not in training else "train.yaml"
    argv = ["--from-config", str(write(tmp_path, training, name))]
    argv += ["--from-config", str(write(tmp_path, accelerate, "acc.yaml"))] if accelerate else ["--gpus", "4"]
    code, out, err = check(capsys, *argv, *flags, "--gpu", "A100-80GB", "--no-cache", "--json")
    doc = json.loads(out)
    assert code == 0 and doc["fits"] is True, err
    assert "wrapping each LlamaMLP" in doc["message"]
    assert doc["parallel"]["wrap_classes"] == ["LlamaMLP"]
    assert "module of class LlamaMLP (transformer_layer_cls_to_wrap" in doc["parallel"]["modelled"]


def test_the_model_s_own_layer_classes_are_the_default(tmp_path, capsys):
    path = write(tmp_path, AXOLOTL_FSDP2, "a.yml")  # transformer_layer_cls_to_wrap: LlamaDecoderLayer
    code, out, _ = check(capsys, "--from-config", str(path), "--gpus", "4", "--gpu", "A100-80GB", "--json",
                         "--no-cache")
    doc = json.loads(out)
    assert code == 0 and doc["parallel"]["wrap_classes"] == [] and "wrapping" not in doc["message"]


@pytest.mark.parametrize("configs", [
    ({**TRAINER, "fsdp": "full_shard auto_wrap", "bf16": True}, None),
    (AXOLOTL_FSDP2, None),
    ({**AXOLOTL_FSDP2, "fsdp_config": {"fsdp_version": 2, "activation_checkpointing": True}}, None),
    ({**LLAMAFACTORY, "finetuning_type": "full"}, ACCELERATE),
    ({**AXOLOTL_FSDP2, "adapter": "qlora", "load_in_4bit": True, "lora_r": 8, "lora_alpha": 16,
      "lora_target_linear": True}, None),  # FSDP-QLoRA (backends/distributed.py, adapters.quant_storage)
], ids=["trainer", "axolotl", "axolotl-fsdp-checkpointing", "llamafactory+accelerate", "axolotl-qlora"])
def test_check_answers_an_fsdp_config_on_a_tiny_model(tmp_path, capsys, configs):
    training, accelerate = configs
    name = "train.json" if "output_dir" in training and "stage" not in training else "train.yaml"
    argv = ["--from-config", str(write(tmp_path, training, name))]
    if accelerate is not None:
        argv += ["--from-config", str(write(tmp_path, accelerate, "acc.yaml"))]
    else:
        argv += ["--gpus", "4"]
    code, out, _ = check(capsys, *argv, "--gpu", "A100-80GB", "--no-cache", "--json")
    doc = json.loads(out)
    assert code == 0 and doc["fits"] is True
    assert "4 GPUs" in doc["message"] and "FSDP2 full shard" in doc["message"]
    checkpointed = training.get("fsdp_config", {}).get("activation_checkpointing", False)
    assert ("FSDP activation checkpointing" in doc["message"]) == checkpointed
    assert ("QLoRA" in doc["message"]) == ("adapter" in training)
    fmt = "llamafactory" if accelerate else "axolotl" if "base_model" in training else "trainer"
    assert [note for note in doc["config_notes"] if note.startswith("read ")] == [
        f"read {argv[1]} as {fmt}", *([f"read {argv[3]} as accelerate"] if accelerate else [])]


AXOLOTL_FSDP1_QLORA = {**AXOLOTL, "adapter": "qlora", "load_in_4bit": True, "lora_r": 8, "lora_alpha": 16,
                       "lora_target_linear": True, "fsdp": ["full_shard", "auto_wrap"], "fsdp_config": {
                           "fsdp_use_orig_params": False, "fsdp_offload_params": True,
                           "fsdp_cpu_ram_efficient_loading": True,
                           "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
                           "fsdp_transformer_layer_cls_to_wrap": "LlamaDecoderLayer"}}


def test_axolotl_fsdp1_qlora_is_answered_without_its_lora_kernels(tmp_path, capsys):
    """Axolotl's llama-2/qlora-fsdp.yml in small: FSDP1 (no fsdp_version) over Axolotl's 4-bit base;
    check_auto_enable_lora_kernels leaves the fused kernels off under FSDP1 on more than one GPU."""
    path = write(tmp_path, AXOLOTL_FSDP1_QLORA, "a.yml")
    config = read_training_config(path)
    assert config.request.step.fsdp_version == 1 and config.request.step.adapter.kernels == ()
    assert any("Axolotl leaves its fused LoRA kernels off" in note for note in config.notes)
    assert any("that load peak is not modelled" in note for note in config.notes)
    code, out, _ = check(capsys, "--from-config", str(path), "--gpus", "4", "--gpu", "A100-80GB",
                         "--no-cache", "--json")
    doc = json.loads(out)
    assert code == 0 and doc["fits"] is True
    assert "QLoRA" in doc["message"] and "FSDP1 full shard" in doc["message"]



def test_axolotl_lora_kernels_under_fsdp1_fail_on_several_gpus_and_are_not_modelled_on_one(tmp_path, capsys):
    """Set explicitly under FSDP1, the kernels meet check_multigpu_lora_kernels (schemas/config.py), a
    ValueError on more than one GPU: the job fails. The count is the flags', so the check decides."""
    kernels = write(tmp_path, {**AXOLOTL_FSDP1_QLORA, "lora_mlp_kernel": True}, "b.yml")
    assert read_training_config(kernels).by_gpu_count is not None
    code, out, _ = check(capsys, "--from-config", str(kernels), "--gpus", "4", "--gpu", "A100-80GB", "--json")
    assert code == 2 and json.loads(out)["kind"] == "job fails", out
    assert "check_multigpu_lora_kernels" in json.loads(out)["error"]
    code, out, _ = check(capsys, "--from-config", str(kernels), "--gpus", "1", "--gpu", "A100-80GB", "--json")
    assert code == 2 and json.loads(out)["kind"] == "not modelled", out
    assert "lora_mlp_kernel: True" in json.loads(out)["error"] and "under FSDP1" in json.loads(out)["error"]
    embedding = write(tmp_path, {**AXOLOTL_FSDP1_QLORA, "lora_embedding_kernel": True}, "c.yml")
    code, out, _ = check(capsys, "--from-config", str(embedding), "--gpus", "2", "--gpu", "A100-80GB",
                         "--json")
    assert code == 2 and json.loads(out)["kind"] == "job fails", out  # Axolotl's check names it too


def test_axolotl_fsdp1_qlora_with_fsdp_activation_checkpointing_is_answered(tmp_path, capsys):
    """Axolotl's magistral-small-fsdp-qlora.yaml and llama-4's scout-qlora-fsdp1.yaml in small: FSDP1
    QLoRA with fsdp_activation_checkpointing, gradient_checkpointing left unset."""
    ac = {**AXOLOTL_FSDP1_QLORA, "fsdp_config": {**AXOLOTL_FSDP1_QLORA["fsdp_config"],
                                                   "fsdp_activation_checkpointing": True}}
    code, out, _ = check(capsys, "--from-config", str(write(tmp_path, ac, "a.yml")), "--gpus", "4", "--gpu",
                         "A100-80GB", "--no-cache", "--json")
    doc = json.loads(out)
    assert code == 0 and doc["fits"] is True
    assert "FSDP1 full shard" in doc["message"] and "FSDP activation checkpointing" in doc["message"]
    assert "apply_activation_checkpointing" in doc["parallel"]["modelled"]


def test_the_sharding_examples_are_read():
    fsdp = read_training_config(EXAMPLES / "trainer_args_fsdp.json")
    assert (fsdp.request.step.parallel, fsdp.request.step.reshard_after_forward, fsdp.ignored) == (
        "fsdp", False, ())
    axolotl = read_training_config(EXAMPLES / "axolotl_fsdp2_lora.yml")
    assert (axolotl.request.step.parallel, axolotl.wrap_classes, axolotl.ignored) == (
        "fsdp", ("LlamaDecoderLayer",), ())
    acc = read_training_config(EXAMPLES / "accelerate_fsdp2.yaml")
    assert (acc.request.step.parallel, acc.request.step.gpus, acc.request.step.nodes, acc.ignored) == (
        "fsdp", 16, None, ())
    assert read_training_config(EXAMPLES / "trainer_args_zero2.json").request.step.parallel == "zero2"


def test_the_readme_s_zero3_offload_example_reads_both_configs():
    # the README shows its answer (an 8B check, 47 s: not rerun there); its reading is checked here
    root = Path(__file__).resolve().parents[3] / "examples"
    config = read_training_configs([str(root / "trainer_args_plain.json"),
                                    str(root / "deepspeed_zero3_offload.json")])
    step = config.request.step
    assert (step.model, step.parallel) == ("meta-llama/Llama-3.1-8B", "zero3")
    zero = json.loads(step.zero_config)
    assert zero["offload_optimizer"]["device"] == "cpu" and zero["offload_param"]["device"] == "cpu"


# ---------------------------------------------------------------------------------------------
# FSDP2's CPU offload (CPUOffloadPolicy) from each format's key, into the request's offload_params


def offloaded(config) -> tuple:
    step = config.request.step
    return step.parallel, step.fsdp_version, step.offload_params


@pytest.mark.parametrize(("data", "name", "key"), [
    ({**AXOLOTL_FSDP2, "fsdp_config": {**AXOLOTL_FSDP2["fsdp_config"], "offload_params": True,
                                       "cpu_offload_pin_memory": False}}, "a.yml",
     "fsdp_config.offload_params"),
    ({**AXOLOTL_FSDP2, "fsdp": ["full_shard", "offload"]}, "b.yml", "fsdp"),  # TrainingArguments' reads it
    ({**TRAINER, "fsdp": "full_shard offload"}, "t.json", "fsdp"),
    ({**TRAINER, "fsdp": True, "fsdp_config": {"fsdp_cpu_offload": True}}, "u.json",
     "fsdp_config.cpu_offload"),
    ({**ACCELERATE, "fsdp_config": {**ACCELERATE["fsdp_config"], "fsdp_offload_params": True}}, "acc.yaml",
     "fsdp_config.fsdp_offload_params"),
])
def test_fsdp2_cpu_offload_is_read_from_each_format(tmp_path, data, name, key):
    config = read_training_config(write(tmp_path, data, name))
    assert offloaded(config) == ("fsdp", None, True)
    assert any(note.startswith(f"{key}: ") and "CPUOffloadPolicy" in note for note in config.notes)
    if "cpu_offload_pin_memory" in str(data):
        assert any("cpu_offload_pin_memory: False: no effect on GPU memory: pinned or pageable" in note
                   for note in config.notes)
    base = {"a.yml": AXOLOTL_FSDP2, "b.yml": AXOLOTL_FSDP2, "t.json": {**TRAINER, "fsdp": "full_shard"},
            "u.json": {**TRAINER, "fsdp": True}, "acc.yaml": ACCELERATE}[name]
    assert offloaded(read_training_config(write(tmp_path, base, "off-" + name))) == ("fsdp", None, None)


def test_training_arguments_offload_params_is_not_read_by_transformers(tmp_path):
    # _process_fsdp_args reads cpu_offload; offload_params reaches accelerate only from the launcher
    config = read_training_config(write(tmp_path, {**TRAINER, "fsdp": True,
                                                   "fsdp_config": {"offload_params": True}}, "t.json"))
    assert offloaded(config) == ("fsdp", None, None)
    assert any(note.startswith("fsdp_config.offload_params: True: not read by transformers")
               for note in config.notes)


def test_the_launchers_offload_reaches_the_trainers_fsdp_plugin(tmp_path):
    """accelerate launch exports FSDP_OFFLOAD_PARAMS, which the Trainer's plugin reads for the cpu_offload
    it leaves None: FSDP2 offloaded, or the training config's FSDP1 (CPUOffload)."""
    acc = write(tmp_path, {**ACCELERATE, "fsdp_config": {**ACCELERATE["fsdp_config"],
                                                         "fsdp_offload_params": True}}, "acc.yaml")
    train = write(tmp_path, {**TRAINER, "fsdp": "full_shard", "bf16": True}, "train.json")
    assert offloaded(read_training_configs([str(train), str(acc)])) == ("fsdp", None, True)
    fsdp1 = write(tmp_path, {**TRAINER, "fsdp": "full_shard", "fsdp_config": {"version": 1}, "bf16": True},
                  "fsdp1.json")
    config = read_training_configs([str(fsdp1), str(acc)])
    assert offloaded(config) == ("fsdp", 1, True)
    assert any(note.startswith("fsdp_config.fsdp_offload_params: true in ") and "FSDP1's CPU offload" in note
               for note in config.notes)



# FSDP1's CPU offload (CPUOffload(offload_params=True), backends/fsdp1.py host_offload) from the keys
# that reach accelerate's FSDP1 plugin: Axolotl's offload_params (setup_fsdp_envs: FSDP_OFFLOAD_PARAMS)
# and the Trainer's cpu_offload (_process_fsdp_args, either version)
AXOLOTL_FSDP1 = {**AXOLOTL, "fsdp": ["full_shard", "auto_wrap"], "fsdp_config": {
    # examples/llama-3/fft-8b-liger-fsdp.yaml's, on tiny-llama's layers
    "fsdp_limit_all_gathers": True, "fsdp_sync_module_states": True, "fsdp_offload_params": True,
    "fsdp_use_orig_params": False, "fsdp_cpu_ram_efficient_loading": True,
    "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
    "fsdp_transformer_layer_cls_to_wrap": "LlamaDecoderLayer",
    "fsdp_state_dict_type": "FULL_STATE_DICT", "fsdp_sharding_strategy": "FULL_SHARD",
    "fsdp_backward_prefetch": "BACKWARD_PRE"}}


@pytest.mark.parametrize(("data", "name", "key"), [
    (AXOLOTL_FSDP1, "a.yml", "fsdp_config.offload_params"),
    ({**AXOLOTL_FSDP1, "fsdp": ["full_shard", "auto_wrap", "offload"],
      "fsdp_config": {**AXOLOTL_FSDP1["fsdp_config"], "fsdp_offload_params": False}}, "b.yml", "fsdp"),
    ({**TRAINER, "fsdp": True, "fsdp_config": {"version": 1, "cpu_offload": True}}, "t.json",
     "fsdp_config.cpu_offload"),
    ({**TRAINER, "fsdp": "full_shard offload", "fsdp_config": {"version": 1}}, "u.json", "fsdp"),
])
def test_fsdp1_cpu_offload_is_read_from_each_format(tmp_path, data, name, key):
    config = read_training_config(write(tmp_path, data, name))
    assert offloaded(config) == ("fsdp", 1, True)
    assert any(note.startswith(f"{key}: ") and "CPUOffload(offload_params=True)" in note
               for note in config.notes)
    off = {**data, "fsdp": [item for item in data["fsdp"] if item != "offload"]} \
        if isinstance(data["fsdp"], list) else {**data, "fsdp": "full_shard"}
    if name == "a.yml":
        off["fsdp_config"] = {**data["fsdp_config"], "fsdp_offload_params": False}
    if name == "t.json":
        off["fsdp_config"] = {"version": 1}
    assert offloaded(read_training_config(write(tmp_path, off, "off-" + name))) == ("fsdp", 1, None)


def test_training_arguments_fsdp1_offload_params_is_not_read_by_transformers(tmp_path):
    config = read_training_config(write(tmp_path, {**TRAINER, "fsdp": True, "fsdp_config": {
        "version": 1, "offload_params": True, "cpu_offload_pin_memory": True}}, "t.json"))
    assert offloaded(config) == ("fsdp", 1, None)
    assert any(note.startswith("fsdp_config.offload_params: True: not read by transformers")
               for note in config.notes)


def test_an_axolotl_fsdp1_config_with_offload_params_is_answered_with_its_host_memory(tmp_path, capsys):
    path = write(tmp_path, AXOLOTL_FSDP1, "a.yml")
    assert main(["check", "--from-config", str(path), "--gpus", "4", "--gpu", "H100-80GB", "--workers", "1",
                 "--no-cache"]) == 0
    out = capsys.readouterr().out
    assert "FSDP1 full shard, parameters, gradients and optimizer state offloaded to the CPU, 4 GPUs" in out
    assert "note: host memory per GPU's rank (FSDP1's CPU offload: its shards" in out
