"""DeepSpeed ZeRO's rank, traced through DeepSpeed's own engine on a fake process group
(backends/deepspeed.py): the rank's parameter, gradient and optimizer bytes are the partitions the
parameter list gives, and the zero_optimization keys are read, resolved and refused by name."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
import ranktrace
from ranktrace import Phases

from autotune.errors import InvalidInput, UnknownSetting, UnmodelledSetting
from autotune.workload.adapters import Adapter, make_adapter
from autotune.workload.parallel import Parallel, check_sharded, make_parallel
from autotune.workload.zero import read_settings, resolved

deepspeed = pytest.importorskip("deepspeed")

# DeepSpeed pads each flat group to a multiple of 2 x ranks elements (stage_1_and_2.py
# ``nccl_start_alignment_factor`` 2, times the world size: ``flatten_dense_tensors_aligned``).
ALIGNMENT = 2
FLOAT32 = 4


# Each rank's trace, made once for the module: the tests compare the same few ranks' traces
# (issue #39), and read them only.
_TRACES: dict[tuple[Any, ...], tuple[Phases, Any]] = {}


@pytest.fixture(scope="module", autouse=True)
def _forget_traces():
    yield
    _TRACES.clear()


def traced(parallel: Parallel | None, mode: str = "bf16", *, optimizer: str | None = None,
           adapter: Adapter | None = None) -> tuple[Phases, Any]:
    """ranktrace.traced in bf16: the mixed-precision step ZeRO's engine runs (traced once a module)."""
    key = (parallel, mode, optimizer, adapter)
    if key not in _TRACES:
        _TRACES[key] = ranktrace.traced(parallel, mode, optimizer=optimizer, adapter=adapter)
    return _TRACES[key]


def partition(model: Any, ranks: int) -> int:
    """A rank's elements of the flat parameter group: all of them padded to 2 x ranks, over ranks."""
    total = sum(p.numel() for p in model.parameters())
    return math.ceil(total / (ALIGNMENT * ranks)) * ALIGNMENT


def before(phases: Phases) -> int:
    return phases.live["before steps"][0]



@pytest.mark.parametrize("kind", ["zero1", "zero2"])
@pytest.mark.parametrize("ranks", [4, 8])
def test_a_zero1_or_zero2_rank_holds_its_partition_of_master_weights_and_adam_state(kind, ranks):
    two, model = traced(make_parallel(2, kind))
    many, _ = traced(make_parallel(ranks, kind))
    fewer = partition(model, 2) - partition(model, ranks)  # elements rank 0 holds less of
    # the float32 master partition (stage_1_and_2.py single_partition_of_fp32_groups), made at init
    assert before(two) - before(many) == fewer * FLOAT32
    # AdamW's exp_avg and exp_avg_sq over it, made at the first step
    first_step = [p.live["optimizer done"][0] - before(p) for p in (two, many)]
    assert first_step[0] - first_step[1] == fewer * 2 * FLOAT32


@pytest.mark.parametrize("ranks", [2, 8])
def test_a_zero1_rank_holds_the_whole_16_bit_model_once_as_its_flat_buffer(ranks):
    alone, model = traced(None)
    phases, _ = traced(make_parallel(ranks, "zero1"))
    flat = ALIGNMENT * ranks * partition(model, ranks) - sum(p.numel() for p in model.parameters())
    # the bf16 weights (moved into one flat buffer, padded) and the float32 master partition
    assert before(phases) - before(alone) == flat * 2 + partition(model, ranks) * FLOAT32


def test_zero1_and_zero2_hold_the_same_without_gradient_accumulation():
    # DeepSpeed 0.19 reduces and partitions the gradients during backward at an accumulation boundary
    # under stage 1 too (stage_1_and_2.py reduce_gradients: partition_gradients or
    # is_gradient_accumulation_boundary()); with one micro-batch per step every step is one
    one, _ = traced(make_parallel(4, "zero1"))
    two, _ = traced(make_parallel(4, "zero2"))
    assert one.live == two.live


@pytest.mark.parametrize("ranks", [4, 8])
def test_a_zero3_rank_holds_its_partition_of_parameters_gradients_master_weights_and_adam(ranks):
    two, model = traced(make_parallel(2, "zero3"))
    many, _ = traced(make_parallel(ranks, "zero3"))

    def own(n: int) -> int:  # stage 3 partitions each parameter on its own (partition_parameters.py)
        return sum(math.ceil(p.numel() / n) for p in model.parameters())

    fewer = own(2) - own(ranks)
    # bf16 parameter partitions (ds_tensor), the bf16 gradient partitions' flat buffer and the
    # float32 master partition: 2 + 2 + 4 bytes per element the rank owns
    assert before(two) - before(many) == fewer * (2 + 2 + FLOAT32)
    first_step = [p.live["optimizer done"][0] - before(p) for p in (two, many)]
    assert first_step[0] - first_step[1] == fewer * 2 * FLOAT32


def test_a_zero3_trace_leaves_torch_s_linear_as_it_found_it():
    import torch

    linear = torch.nn.functional.linear
    # A trace of its own (not the module's): zero.Init's mem_efficient_linear replaces it for the job
    ranktrace.traced(make_parallel(2, "zero3"), "bf16")
    assert torch.nn.functional.linear is linear


def test_a_zero3_rank_holds_less_than_a_zero2_rank_by_the_parameters_it_does_not_own():
    two, model = traced(make_parallel(8, "zero2"))
    three, _ = traced(make_parallel(8, "zero3"))
    full = sum(p.numel() for p in model.parameters())
    assert before(two) - before(three) >= (full - 2 * partition(model, 8)) * 2 - (1 << 12)


def test_auto_values_resolve_from_the_hidden_size_as_the_integration_does():
    settings = read_settings({"stage": 3, "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
                              "stage3_param_persistence_threshold": "auto", "overlap_comm": True}, "ds.json")
    assert resolved(settings, 4096) == {"stage": 3, "overlap_comm": True, "reduce_bucket_size": 4096 * 4096,
                                        "stage3_prefetch_bucket_size": int(0.9 * 4096 * 4096),
                                        "stage3_param_persistence_threshold": 40960}
    two = read_settings({"stage": 2, "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto"},
                        "x")
    assert resolved(two, 64) == {"stage": 2, "reduce_bucket_size": 4096}


@pytest.mark.parametrize("key, value", [
    ("offload_optimizer", {"device": "nvme"}), ("offload_param", {"device": "nvme"}), ("cpu_offload", True),
    ("offload_optimizer", {"device": "cpu", "ratio": 0.3}), ("cpu_offload_param", True),
    ("zero_hpz_partition_size", 8), ("zero_quantized_weights", True), ("zero_quantized_gradients", True),
    ("mics_shard_size", 8), ("zenflow", {"topk_ratio": 0.1}), ("legacy_stage1", True),
])
def test_a_zero_key_that_changes_memory_unmodelled_is_refused_by_name(key, value):
    with pytest.raises(UnmodelledSetting, match=f"zero_optimization.{key}"):
        read_settings({"stage": 2, key: value}, "ds.json")
    with pytest.raises(UnmodelledSetting, match=f"zero_optimization.{key}"):
        make_parallel(4, "zero2", zero_config=json.dumps({key: value}))


def test_an_offload_to_none_and_keys_with_no_effect_are_not_refused():
    notes: list[str] = []
    settings = read_settings({"stage": 2, "offload_optimizer": {"device": "none"},
                              "gather_16bit_weights_on_model_save": True}, "ds.json", notes)
    assert dict(settings) == {"stage": 2}
    assert notes and "how the model is saved" in notes[0]


def test_an_unknown_zero_key_is_refused_with_the_closest_names():
    with pytest.raises(UnknownSetting, match="reduce_bucket_size"):
        read_settings({"stage": 2, "reduce_bucket_sise": 10}, "ds.json")


@pytest.mark.parametrize("given, text", [
    ({"kind": "zero2", "zero_config": json.dumps({"stage": 3})}, "has stage 3, parallel is zero2"),
    ({"kind": "fsdp", "zero_config": "{}"}, "zero_config is a DeepSpeed setting"),
    ({"kind": "zero2", "zero_config": "{"}, "not JSON"),
])
def test_a_zero_config_that_does_not_match_the_stage_is_refused(given, text):
    with pytest.raises(InvalidInput, match=text):
        make_parallel(4, given.pop("kind"), **given)


def test_zero_defaults_are_the_stage_and_the_auto_keys():
    parallel = make_parallel(8, "zero3")
    assert parallel is not None and parallel.is_zero
    assert dict(parallel.zero) == {"stage": 3, "reduce_bucket_size": "auto",
                                   "stage3_prefetch_bucket_size": "auto",
                                   "stage3_param_persistence_threshold": "auto"}
    assert "ZeRO-3, 8 GPUs" in parallel.label and parallel.modelled.startswith("traced: DeepSpeed")


def test_a_trainer_config_s_deepspeed_json_with_auto_values_is_read_into_zero_config(tmp_path):
    from autotune.configs import read_training_config

    (tmp_path / "ds.json").write_text(json.dumps({
        "zero_optimization": {"stage": 3, "overlap_comm": True, "reduce_bucket_size": "auto",
                              "stage3_prefetch_bucket_size": "auto", "stage3_max_live_parameters": 1e8,
                              "gather_16bit_weights_on_model_save": True},
        "bf16": {"enabled": "auto"}, "train_micro_batch_size_per_gpu": "auto"}))
    (tmp_path / "train.json").write_text(json.dumps({"model_name_or_path": "tiny-llama", "bf16": True,
                                                      "deepspeed": "ds.json"}))
    config = read_training_config(tmp_path / "train.json")
    step = config.request.step
    assert step.parallel == "zero3"
    assert json.loads(step.zero_config) == {"stage": 3, "overlap_comm": True, "reduce_bucket_size": "auto",
                                            "stage3_prefetch_bucket_size": "auto",
                                            "stage3_max_live_parameters": 1e8}
    assert any("how the model is saved" in note for note in config.notes)
    parallel = make_parallel(4, step.parallel, zero_config=step.zero_config)
    assert parallel is not None and resolved(parallel.zero, 64)["reduce_bucket_size"] == 64 * 64


def test_a_trainer_config_s_deepspeed_nvme_offload_is_refused_by_name(tmp_path):
    from autotune.configs import read_training_config

    (tmp_path / "train.json").write_text(json.dumps({"model_name_or_path": "tiny-llama", "deepspeed": {
        "zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": "/nvme"}}}}))
    with pytest.raises(UnmodelledSetting, match="zero_optimization.offload_param.device"):
        read_training_config(tmp_path / "train.json")


def test_a_trainer_config_s_deepspeed_cpu_offload_is_read(tmp_path):
    from autotune.configs import read_training_config

    (tmp_path / "train.json").write_text(json.dumps({"model_name_or_path": "tiny-llama", "deepspeed": {
        "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": True,
                                                                  "buffer_count": 4}}}}))
    config = read_training_config(tmp_path / "train.json")
    assert json.loads(config.request.step.zero_config)["offload_optimizer"] == {"device": "cpu",
                                                                                  "pin_memory": True}
    parallel = make_parallel(4, "zero2", zero_config=config.request.step.zero_config)
    assert parallel is not None and "offloaded to the CPU" in parallel.label
    again = Parallel(**{**parallel.__dict__, "zero": json.loads(json.dumps(parallel.zero))})
    assert again == parallel and hash(again) == hash(parallel)
    assert any("read by NVMe offload only" in note for note in config.notes)


def test_offload_param_below_stage_3_is_refused():
    with pytest.raises(InvalidInput, match="offload_param is ZeRO-3's"):
        read_settings({"stage": 2, "offload_param": {"device": "cpu"}}, "ds.json")


def offloaded(kind: str, **offload: Any) -> tuple[Phases, Phases]:
    """The rank's trace at 4 ranks without offload and with ``offload`` (zero_optimization keys)."""
    settings = {"stage": int(kind[-1]), "reduce_bucket_size": "auto"}
    plain, _ = traced(make_parallel(4, kind, zero_config=json.dumps(settings)))
    moved, _ = traced(make_parallel(4, kind, zero_config=json.dumps({**settings, **offload})))
    return plain, moved


def test_zero2_offload_moves_master_weights_their_gradients_and_adam_to_the_host():
    plain, moved = offloaded("zero2", offload_optimizer={"device": "cpu"})
    _, model = traced(None)
    own = partition(model, 4)
    largest = max(p.numel() for p in model.parameters())
    # the GPU: no float32 master partition; DeepSpeed's own staging buffer of the largest parameter
    # in 16 bits (stage_1_and_2.py temp_grad_buffer_for_gpu_offload)
    assert before(plain) - before(moved) == own * FLOAT32 - largest * 2
    assert plain.tracker.host_peak_bytes == 0
    # the host: the master partition, its 16-bit copy (param_buffer_of_bit16_for_cpu_offload_groups),
    # the largest parameter's gradient in 16 bits (temp_grad_buffer_for_cpu_offload), the float32
    # gradient partition and CPU Adam's exp_avg and exp_avg_sq (cpu_adam.py step)
    assert moved.tracker.host_peak_bytes == own * (FLOAT32 + 2 + FLOAT32 + 2 * FLOAT32) + largest * 2
    # Adam's state never reaches the GPU
    assert moved.live["optimizer done"][0] - before(moved) < plain.live["optimizer done"][0] - before(plain)


def test_zero3_offload_moves_master_weights_gradient_partitions_and_adam_then_parameters_to_the_host():
    plain, moved = offloaded("zero3", offload_optimizer={"device": "cpu"})
    _, model = traced(None)
    own = sum(math.ceil(p.numel() / 4) for p in model.parameters())
    # the float32 master partition and the 16-bit gradient partitions' flat buffer
    # (stage3.py _create_fp32_partitions, grad_partitions_flat_buffer pinned)
    assert before(plain) - before(moved) == own * (FLOAT32 + 2)
    # ... and on the host: those, the float32 gradient of each sub-group, CPU Adam's two states
    assert moved.tracker.host_peak_bytes == own * (FLOAT32 + 2 + FLOAT32 + 2 * FLOAT32)
    _, both = offloaded("zero3", offload_optimizer={"device": "cpu"}, offload_param={"device": "cpu"})
    # offload_param: the 16-bit partitions (ds_tensor) leave the GPU too
    assert before(moved) - before(both) == own * 2


def test_a_checkpointed_zero3_step_checkpoints_the_engine_s_copy_of_the_model():
    # Each trace's engine wraps a copy of the built model (deepspeed.fresh_model); the cell has set
    # the checkpoint function on its layers, which the copy shares (it was a deep copy of the
    # estimator with it, and failed): checkpointing then holds less, as on one GPU
    import autotune

    table = autotune.table("tiny-llama", gpus=4, parallel="zero3", modes=["bf16", "bf16+ckpt"],
                           seq_lens=[128], gpu_memory="1664MiB", workers=1)
    plain, checkpointed = (cell.max_batch_size for cell in table.cells)
    assert 0 < plain < checkpointed


def test_a_deepspeed_json_given_as_the_second_config_is_the_training_config_s_deepspeed(tmp_path):
    # deepspeed --num_gpus 8 train.py --deepspeed ds.json: the step from the one, ZeRO from the other
    from autotune.configs import read_training_configs

    (tmp_path / "ds.json").write_text(json.dumps({"zero_optimization": {
        "stage": 3, "offload_optimizer": {"device": "cpu"}, "reduce_bucket_size": "auto"},
        "bf16": {"enabled": "auto"}}))
    (tmp_path / "train.json").write_text(json.dumps({"model_name_or_path": "tiny-llama", "bf16": True}))
    train, ds = tmp_path / "train.json", tmp_path / "ds.json"
    for paths in ([train, ds], [ds, train]):
        step = read_training_configs(paths).request.step
        assert step.parallel == "zero3"
        assert json.loads(step.zero_config) == {"stage": 3, "reduce_bucket_size": "auto",
                                                "offload_optimizer": {"device": "cpu", "pin_memory": False}}
    (tmp_path / "both.json").write_text(json.dumps({"model_name_or_path": "tiny-llama",
                                                    "deepspeed": "ds.json"}))
    with pytest.raises(InvalidInput, match="give one of them"):
        read_training_configs([tmp_path / "both.json", tmp_path / "ds.json"])


def test_a_check_of_an_offloaded_zero_rank_says_the_host_memory_it_holds():
    # The table prints the rank's pinned host memory; a check of the same step says it too, from the
    # same host ledger (tracker.host_peak_bytes), in its message and its JSON
    import autotune

    zero = json.dumps({"stage": 2, "offload_optimizer": {"device": "cpu"}, "reduce_bucket_size": "auto"})
    result = autotune.check("tiny-llama", seq_len=128, batch_size=2, mode="bf16", gpus=4, parallel="zero2",
                            zero_config=zero, gpu_memory="1664MiB", workers=1)
    moved, _ = traced(make_parallel(4, "zero2", zero_config=zero))
    assert result.host_memory_bytes == moved.tracker.host_peak_bytes > 0
    assert "host memory per GPU's rank" in result.message
    plain = autotune.check("tiny-llama", seq_len=128, batch_size=2, mode="bf16", gpus=4, parallel="zero2",
                           gpu_memory="1664MiB", workers=1)
    assert plain.host_memory_bytes == 0 and "host memory" not in plain.message


# bitsandbytes' AdamW and a quantized base under ZeRO (issue #35: Axolotl's mixtral, mixtral_22 and
# bigstral examples)
AUTO_BUCKET = json.dumps({"stage": 2, "reduce_bucket_size": "auto"})


def first_step(phases: Phases) -> int:
    """What the first optimizer step left allocated: the optimizer's state."""
    return phases.live["optimizer done"][0] - before(phases)


def test_bitsandbytes_adamw_under_zero2_keeps_8_bit_moments_per_float32_partition():
    # DeepSpeed hands the client optimizer its float32 partition as the group's one parameter
    # (stage_1_and_2.py _optimizer_step): bitsandbytes' state is the partition's, 8-bit from
    # MIN_8BIT_SIZE elements (optimizer.py init_state), float32 below; the Trainer's 32-bit override
    # of the embedding (its id) matches no partition (check_overrides)
    from autotune.workload.optimizers import MIN_8BIT_SIZE

    _, model = traced(None)
    four, eight = partition(model, 4), partition(model, 8)
    assert four >= MIN_8BIT_SIZE > eight  # tiny-llama's partitions on either side of the threshold
    states = [first_step(traced(make_parallel(ranks, "zero2", zero_config=AUTO_BUCKET),
                                optimizer="adamw_bnb_8bit")[0]) for ranks in (4, 8)]
    assert states[0] - states[1] == eight_bit_state(four) - 2 * eight * FLOAT32
    torch_adam = first_step(traced(make_parallel(4, "zero2", zero_config=AUTO_BUCKET),
                                   optimizer="adamw_torch")[0])
    # torch's two float32 moments and its step, a float32 scalar
    assert torch_adam - states[0] == 2 * four * FLOAT32 + FLOAT32 - eight_bit_state(four)


def eight_bit_state(n: int) -> int:
    """bitsandbytes' 8-bit AdamW state of a parameter of ``n`` elements: two uint8 moments, their
    float32 block scales and the two quantization maps (optimizer.py init_state)."""
    from autotune.workload.optimizers import BLOCK_SIZE, QMAP_SIZE

    return 2 * n + 2 * math.ceil(n / BLOCK_SIZE) * FLOAT32 + 2 * QMAP_SIZE * FLOAT32


def test_bitsandbytes_adamw_under_zero3_steps_each_rank_s_partitions():
    # stage 3's one sub-group (sub_group_size 1e9): its float32 flat partition, each parameter's
    # ceil(numel / ranks) elements (stage3.py _optimizer_step)
    _, model = traced(None)
    own = sum(math.ceil(p.numel() / 4) for p in model.parameters())
    bnb, _ = traced(make_parallel(4, "zero3"), optimizer="adamw_bnb_8bit")
    torch_adam, _ = traced(make_parallel(4, "zero3"), optimizer="adamw_torch")
    assert first_step(torch_adam) - first_step(bnb) == 2 * own * FLOAT32 + FLOAT32 - eight_bit_state(own)


def test_an_offloaded_optimizer_is_deepspeed_cpu_adam_whichever_the_trainer_made():
    # accelerate maps the Trainer's optimizer, bitsandbytes' too, to DeepSpeedCPUAdam under
    # offload_optimizer (utils/deepspeed.py map_pytorch_optim_to_deepspeed)
    zero = json.dumps({"stage": 2, "reduce_bucket_size": "auto", "offload_optimizer": {"device": "cpu"}})
    bnb, _ = traced(make_parallel(4, "zero2", zero_config=zero), optimizer="adamw_bnb_8bit")
    torch_adam, _ = traced(make_parallel(4, "zero2", zero_config=zero), optimizer="adamw_torch")
    assert bnb.tracker.host_peak_bytes == torch_adam.tracker.host_peak_bytes > 0
    assert first_step(bnb) == first_step(torch_adam)


QLORA = make_adapter("qlora", r=4, targets="all-linear")


def trainable(adapter: Adapter) -> int:
    from autotune.backends.estimate.backend import EstimateBackend
    from autotune.gpus import resolve_gpu
    from autotune.workload import Workload
    from autotune.workload.models import resolve_model

    workload = Workload(resolve_model("tiny-llama"), "causal-lm", None, weights_dtype="bfloat16",
                        adapter=adapter, parallel=make_parallel(2, "zero2"))
    model = EstimateBackend(resolve_gpu("A100-80GB"))._model(workload, "bf16").model
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


@pytest.mark.parametrize("method", ["qlora", "lora_8bit"])
def test_a_quantized_base_under_zero2_stays_whole_and_only_the_adapters_are_partitioned(method):
    adapter = QLORA if method == "qlora" else make_adapter(method, r=4, targets="all-linear")
    two, four = (traced(make_parallel(ranks, "zero2", zero_config=AUTO_BUCKET), adapter=adapter)[0]
                 for ranks in (2, 4))
    n = trainable(adapter)
    own = {ranks: math.ceil(n / (ALIGNMENT * ranks)) * ALIGNMENT for ranks in (2, 4)}
    # the float32 master partition of the adapters alone; the packed base is loaded whole by both
    assert before(two) - before(four) == (own[2] - own[4]) * FLOAT32
    assert first_step(two) - first_step(four) == (own[2] - own[4]) * 2 * FLOAT32


def test_a_quantized_base_under_zero3_is_refused_by_name_and_zero2_is_checked():
    import autotune

    with pytest.raises(InvalidInput, match="a 4-bit base under DeepSpeed ZeRO-3 is not modelled yet"):
        check_sharded(make_parallel(4, "zero3"), 4, "adamw_bnb_8bit")
    result = autotune.check("tiny-llama", seq_len=64, batch_size=2, mode="bf16", gpus=4, parallel="zero2",
                            zero_config=AUTO_BUCKET, peft="qlora", optimizer="adamw_bnb_8bit",
                            gpu_memory="1664MiB", workers=1)
    assert result.fits and "QLoRA" in result.message and "ZeRO-2" in result.message


def test_zero_force_ds_cpu_optimizer_false_under_offload_is_noted(tmp_path):
    from autotune.configs import read_training_configs

    (tmp_path / "ds.json").write_text(json.dumps({
        "zero_force_ds_cpu_optimizer": False,
        "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}}}))
    (tmp_path / "train.json").write_text(json.dumps({"model_name_or_path": "tiny-llama", "bf16": True,
                                                    "deepspeed": str(tmp_path / "ds.json")}))
    notes = read_training_configs([tmp_path / "train.json"]).notes
    assert any("zero_force_ds_cpu_optimizer: false: DeepSpeed steps the Trainer's own optimizer" in note
               for note in notes)


def test_the_floor_of_a_zero3_rank_leaves_out_the_parameters_deepspeed_partitions():
    # The search's lower bound (EstimateBackend.floor_bytes) held the whole model for ZeRO-3, where a
    # rank holds 1/N of it, or none under offload_param: Mixtral-8x22B's 282 GB "did not fit" 8 H100s
    # untraced (Axolotl's mixtral_22 example)
    from autotune.backends.estimate.backend import EstimateBackend
    from autotune.gpus import resolve_gpu
    from autotune.workload import Workload
    from autotune.workload.models import resolve_model

    backend = EstimateBackend(resolve_gpu("A100-80GB"))

    def floor(kind: str) -> tuple[int, Any]:
        workload = Workload(resolve_model("tiny-llama"), "causal-lm", None, weights_dtype="bfloat16",
                            parallel=make_parallel(4, kind))
        fake = backend._model(workload, "bf16")
        return backend.floor_bytes(fake), fake.model

    (two, model), (three, _) = floor("zero2"), floor("zero3")
    assert two - three == sum(p.untyped_storage().nbytes() for p in model.parameters()) > 0


def test_a_zero3_rank_s_setup_never_holds_the_whole_model():
    # The engine's copy of the model is partitioned by the engine, not loaded under zero.Init: the
    # broadcast it skips for a zero.Init model had the tracker count every whole parameter on the GPU
    # (Mixtral-8x22B's 262 GiB at setup, on 8 GPUs with the parameters offloaded). What setup holds
    # above its end is one gathered trainable parameter at a time (stage3.py
    # create_reduce_and_remove_grad_hooks: param.all_gather())
    zero = json.dumps({"stage": 3, "reduce_bucket_size": "auto", "offload_param": {"device": "cpu"}})
    phases, model = traced(make_parallel(8, "zero3", zero_config=zero))
    live, peak, sizes = 0, 0, {}
    for key, nbytes in phases.tracker.events[:phases.steps_start]:
        if nbytes >= 0:
            sizes[key] = nbytes
        live += nbytes if nbytes >= 0 else -sizes.pop(key)
        peak = max(peak, live)
    assert peak - before(phases) <= max(p.numel() * 2 for p in model.parameters())


def test_a_json_check_of_a_zero_job_with_bitsandbytes_adamw_is_json_alone(tmp_path):
    # DeepSpeed's logger writes to stdout; its "untested optimizer" warning for the client
    # bitsandbytes optimizer went into the check's JSON (the corpus benchmark read mixtral_22 as a crash)
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        [sys.executable, "-m", "autotune", "check", "tiny-llama", "--seq-len", "64", "--batch-size", "2",
         "--mode", "bf16", "--gpus", "4", "--parallel", "zero2", "--zero-config", AUTO_BUCKET,
         "--optimizer", "adamw_bnb_8bit", "--gpu-memory", "1664MiB", "--workers", "1", "--no-cache",
         "--json"],
        cwd=root, env={**os.environ, "PYTHONPATH": str(root)}, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["fits"] is True
    assert "untested optimizer" in done.stderr


def test_zero3_refuses_by_name_a_trainable_parameter_its_backward_gives_no_gradient():
    # vllm-flash-attn3's backward returns no gradient for gpt-oss' attention sinks; ZeRO-3's gradient hook
    # then reads param.grad.numel() (stage3.py __add_grad_to_ipg_bucket) and the job dies: refused by name,
    # not an internal error. Under eager attention the sinks get their gradient and the same job is checked.
    import autotune

    job = dict(seq_len=64, batch_size=1, mode="bf16", dtype="bfloat16", gpus=4, parallel="zero3",
               gpu="H100-80GB", workers=1)
    refused = (r"ZeRO-3 cannot train model\.layers\.\d+\.self_attn\.sinks: it gets no gradient"
               r".*stage3\.py __add_grad_to_ipg_bucket")
    with pytest.raises(InvalidInput, match=refused):
        autotune.check("tiny-gpt_oss", attn="kernels-community/vllm-flash-attn3", **job)
    assert autotune.check("tiny-gpt_oss", attn="eager", **job).fits


@pytest.mark.parametrize("stage", ["zero2", "zero3"])
def test_an_amp_job_is_traced_whatever_the_host_cpu_s_fp16(capsys, stage):
    # DeepSpeed's engine refuses fp16 where its accelerator says no (engine.py "Type fp16 is not
    # supported on your device"): the estimator's is the CPU one, which answers for the host's CPU
    # (mkldnn); the job runs on a CUDA card, whose accelerator says yes from compute capability 7.0
    from autotune.cli import main

    code = main(["check", "tiny-llama", "--gpus", "2", "--parallel", stage, "--mode", "amp",
                 "--seq-len", "64", "--batch-size", "1", "--gpu", "A100-40GB", "--workers", "1", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0 and doc["fits"], doc


def test_an_amp_job_under_zero_on_a_pascal_card_is_refused_as_deepspeed_refuses_it(monkeypatch):
    # cuda_accelerator.py is_fp16_supported: compute capability 7.0 or newer, 6.x only with
    # DS_ALLOW_DEPRECATED_FP16=1; DDP's amp is not DeepSpeed's to refuse
    import autotune

    job = {"gpus": 2, "seq_len": 64, "batch_size": 1, "gpu": "P100-16GB"}
    monkeypatch.delenv("DS_ALLOW_DEPRECATED_FP16", raising=False)
    with pytest.raises(InvalidInput, match=r"DeepSpeed refuses fp16 \(mode amp\) on P100-16GB, compute "
                                           r"capability 6\.0.*unless DS_ALLOW_DEPRECATED_FP16=1"):
        autotune.check("tiny-llama", parallel="zero2", mode="amp", **job)
    assert autotune.check("tiny-llama", parallel="ddp", mode="amp", **job).fits
    monkeypatch.setenv("DS_ALLOW_DEPRECATED_FP16", "1")
    assert autotune.check("tiny-llama", parallel="zero2", mode="amp", **job).fits
