"""One rank of FSDP1 (FullyShardedDataParallel, backends/fsdp1.py) traced on a fake process group: the
rank holds its shard of each unit's FlatParameter, computed here from the parameter list as FSDP1
flattens and pads it, and each decoder layer's gathered FlatParameter appears where FSDP1 gathers it."""

from __future__ import annotations

import collections
import math
from typing import Any

import pytest
import torch
from ranktrace import traced

from autotune.backends.estimate.backend import EstimateBackend
from autotune.errors import InvalidInput
from autotune.gpus import resolve_gpu
from autotune.workload import Workload
from autotune.workload.adapters import make_adapter
from autotune.workload.models import resolve_model
from autotune.workload.parallel import Parallel, make_parallel
from autotune.workload.step import build_model

STEP_BYTES = 4  # AdamW(fused=True)'s float32 step count per parameter


def unit_numel(parameters: Any) -> int:
    """A unit's FlatParameter: its parameters flattened in order, each starting 16-byte aligned
    with use_orig_params (_flat_param.py ``_init_flat_param_and_metadata``: ``aligned_numel``)."""
    numel = 0
    for parameter in parameters:
        numel += -numel % (16 // parameter.element_size())
        numel += parameter.numel()
    return numel


def shards(model: Any, ranks: int) -> list[int]:
    """Rank 0's shard of each unit, in elements: the FlatParameter padded to a multiple of the ranks
    and split evenly (``FlatParamHandle._get_shard``): each decoder layer's, then the root's rest."""
    layers = list(model.model.layers)
    inside = {id(p) for layer in layers for p in layer.parameters()}
    rest = [p for p in model.parameters() if id(p) not in inside]
    return [math.ceil(unit_numel(unit) / ranks) for unit in [*(layer.parameters() for layer in layers), rest]]


def fsdp1(ranks: int, **settings: Any) -> Parallel:
    return Parallel("fsdp", ranks, fsdp_version=1, **settings)


@pytest.mark.parametrize("ranks", [2, 4, 8])
def test_an_fsdp1_rank_holds_its_flat_parameter_shards_gradients_and_optimizer_state(ranks):
    phases, model = traced(fsdp1(ranks))
    shard = 2 * sum(shards(model, ranks))  # bfloat16 weights, no upcast without mixed precision
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    assert phases.loaded_bytes == shard + buffers
    before = phases.live["before steps"][0]
    assert phases.live["backward done"][0] - before == shard  # the reduce-scattered flat gradients
    units = len(shards(model, ranks))  # AdamW over the FlatParameters' original-parameter views
    after = phases.live["optimizer done"][0] - before
    assert after >= shard + 2 * shard + units * STEP_BYTES


def test_a_16_bit_mode_under_fsdp1_upcasts_the_flat_parameters_as_accelerate_does():
    ranks = 4
    phases, model = traced(fsdp1(ranks), mode="bf16")
    shard = sum(shards(model, ranks))
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    assert phases.loaded_bytes == 4 * shard + buffers  # float32 shards
    layer = shards(model, ranks)[0]
    # each gather casts the shard to bfloat16 first (_mp_shard), then gathers it whole in bfloat16
    assert phases.allocated_after_start()[2 * layer] >= 2 * model.config.num_hidden_layers
    assert phases.allocated_after_start()[2 * ranks * layer] >= 2 * model.config.num_hidden_layers


def test_fsdp1_gathers_each_layer_in_forward_and_again_in_backward():
    ranks = 4
    phases, model = traced(fsdp1(ranks))
    layers, steps = model.config.num_hidden_layers, 2
    gathered = 2 * ranks * shards(model, ranks)[0]  # a layer's padded FlatParameter in bfloat16
    # per step and layer: its all-gather in forward, again in backward (FULL_SHARD) and its unsharded
    # gradient; plus, once, the _full_param_padded its lazy init allocates and frees
    # (FlatParamHandle.init_flat_param_attributes)
    assert phases.allocated_after_start()[gathered] == 3 * layers * steps + layers


def test_fsdp1_shard_grad_op_keeps_layers_gathered_for_backward():
    ranks = 4
    kept, model = traced(fsdp1(ranks, reshard_after_forward=False))
    layers, steps = model.config.num_hidden_layers, 2
    gathered = 2 * ranks * shards(model, ranks)[0]
    assert kept.allocated_after_start()[gathered] == 2 * layers * steps + layers  # no gather in backward


def test_fsdp1_gathered_unit_is_live_while_its_layer_runs():
    """The gathered layer is live between its all-gather and its free: the peak of the step holds
    at least one whole layer beside the shards."""
    ranks = 4
    phases, model = traced(fsdp1(ranks))
    gathered = 2 * ranks * shards(model, ranks)[0]
    live, peak = 0, 0
    sizes: dict[int, int] = {}
    for key, nbytes in phases.tracker.events[phases.steps_start:]:
        if nbytes >= 0:
            sizes[key] = nbytes
        else:
            sizes.pop(key, None)
        live = sum(1 for n in sizes.values() if n == gathered)
        peak = max(peak, live)
    assert peak >= 1
    assert live == 0  # every gathered layer freed by the step's end


def test_fsdp1_backward_prefetch_gathers_the_next_layer_early():
    ranks = 4
    prefetched, model = traced(fsdp1(ranks, backward_prefetch="BACKWARD_PRE"))
    plain, _ = traced(fsdp1(ranks))
    assert max(prefetched.live["backward done"]) >= max(plain.live["backward done"])


def test_make_parallel_reads_fsdp1_settings_with_the_trainers_defaults():
    parallel = make_parallel(4, "fsdp", fsdp_version=1)
    assert parallel == Parallel("fsdp", 4, fsdp_version=1, use_orig_params=True, forward_prefetch=False,
                                backward_prefetch=None)
    given = make_parallel(4, "fsdp", fsdp_version=1,
                          fsdp1_config='{"use_orig_params": false, "backward_prefetch": "BACKWARD_PRE"}')
    assert (given.use_orig_params, given.backward_prefetch) == (False, "BACKWARD_PRE")
    assert make_parallel(4, "fsdp").fsdp_version == 2


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"fsdp_version": 3}, "fsdp_version"),
    ({"fsdp1_config": "{}"}, "fsdp1_config"),
    ({"fsdp_version": 1, "fsdp1_config": '{"limit_all_gathers": false}'}, "fsdp1_config"),
    ({"fsdp_version": 1, "fsdp1_config": '{"backward_prefetch": "BACKWARD_SOON"}'}, "fsdp1_config"),
    ({"fsdp_version": 1, "recipe": "axolotl"}, "fsdp_recipe"),
])
def test_make_parallel_refuses_what_fsdp1_does_not_model(kwargs, field):
    with pytest.raises(InvalidInput) as raised:
        make_parallel(4, "fsdp", **kwargs)
    assert raised.value.field == field


def test_use_orig_params_false_holds_the_same_shards():
    ranks = 4
    flat, model = traced(fsdp1(ranks, use_orig_params=False))
    # no 16-byte alignment between parameters without use_orig_params
    layers = list(model.model.layers)
    inside = {id(p) for layer in layers for p in layer.parameters()}
    rest = [p for p in model.parameters() if id(p) not in inside]
    units = [[*layer.parameters()] for layer in layers] + [rest]
    shard = 2 * sum(math.ceil(sum(p.numel() for p in unit) / ranks) for unit in units)
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    assert flat.loaded_bytes == shard + buffers
    assert flat.live["backward done"][0] - flat.live["before steps"][0] == shard


def in_first_shard(model: Any, ranks: int) -> int:
    """How many original parameters start within rank 0's shard of their unit (shards): those the
    optimizer keeps state for (use_orig_params: a parameter outside the shard is an empty view)."""
    count = 0
    for unit in unit_parameters(model):
        shard, numel = math.ceil(unit_numel(unit) / ranks), 0
        for parameter in unit:
            numel += -numel % (16 // parameter.element_size())
            count += numel < shard
            numel += parameter.numel()
    return count


def unit_parameters(model: Any) -> list[list[Any]]:
    layers = list(model.model.layers)
    inside = {id(p) for layer in layers for p in layer.parameters()}
    rest = [p for p in model.parameters() if id(p) not in inside]
    return [*([*layer.parameters()] for layer in layers), rest]


def peak(phases: Any) -> int:
    """The most bytes live at once in the rank's trace."""
    sizes: dict[int, int] = {}
    live = most = 0
    for key, nbytes in phases.tracker.events:
        if nbytes >= 0:
            sizes[key] = nbytes
            live += nbytes
        else:
            live -= sizes.pop(key)
        most = max(most, live)
    return most


# FSDP1's CPUOffload(offload_params=True) (backends/fsdp1.py host_offload): each FlatParameter's shard,
# its gradient (_cpu_grad) and the Adam state on the host ledger, the optimizer step run there.
@pytest.mark.parametrize("mode", ["fp32", "bf16"])
@pytest.mark.parametrize("ranks", [2, 4])
def test_fsdp1_cpu_offload_moves_the_shards_gradients_and_adam_state_to_the_host(ranks, mode):
    on_gpu, model = traced(fsdp1(ranks), mode)
    offloaded, _ = traced(fsdp1(ranks, offload_params=True), mode)
    scale = 4 if mode == "bf16" else 2  # accelerate's float32 upcast under mixed precision, else bf16
    shard = scale * sum(shards(model, ranks))
    adam = 2 * shard + STEP_BYTES * in_first_shard(model, ranks)  # exp_avg, exp_avg_sq, the step counts
    # the GPU holds less by the shards, then by their gradients too, then by the Adam state too
    assert on_gpu.live["before steps"][0] - offloaded.live["before steps"][0] == shard
    assert on_gpu.live["backward done"][0] - offloaded.live["backward done"][0] == 2 * shard
    assert on_gpu.live["optimizer done"][1] - offloaded.live["optimizer done"][1] == 2 * shard + adam
    # the host: the shards, _cpu_grad, the Adam state, and one unit's gradient writeback buffer at a time
    # (_writeback_orig_params' zeros_like(flat_param) in each pre-backward, dropped by
    # prepare_gradient_for_backward)
    assert offloaded.tracker.host_peak_bytes == 2 * shard + adam + scale * max(shards(model, ranks))
    if mode == "bf16":  # each copy to the GPU is cast into _mp_shard at once: none is live at the peak
        assert peak(on_gpu) - peak(offloaded) == shard + adam


@pytest.mark.parametrize("mode", ["fp32", "bf16"])
def test_fsdp1_cpu_offload_copies_each_shard_to_the_gpu_before_each_gather(mode):
    ranks = 4
    offloaded, model = traced(fsdp1(ranks, offload_params=True), mode)
    on_gpu, _ = traced(fsdp1(ranks), mode)
    copies = offloaded.allocated_in_first_forward_and_backward()
    copies.subtract(on_gpu.allocated_in_first_forward_and_backward())
    # each unit's shard copied to the GPU in its pre-forward and pre-backward unshard (pre_unshard), the
    # root's too: its gathered parameter is kept to the backward, but its reshard pointed the flat
    # parameter at the host shard; under mixed precision as a float32 temporary cast into _mp_shard
    # (_use_low_precision_shard), which the root's backward also allocates (not skipped under offload)
    units = shards(model, ranks)
    expected: collections.Counter[int] = collections.Counter()
    for numel in units:
        expected[(4 if mode == "bf16" else 2) * numel] += 2
    if mode == "bf16":
        expected[2 * units[-1]] += 1
    assert +copies == expected


def test_make_parallel_accepts_fsdp1_cpu_offload():
    parallel = make_parallel(4, "fsdp", fsdp_version=1, offload_params=True)
    assert parallel is not None and parallel.offload_params and parallel.fsdp_version == 1
    assert parallel.label == "FSDP1 full shard, parameters, gradients and optimizer state offloaded to the " \
                             "CPU, 4 GPUs"
    assert "FSDP1's CPUOffload(offload_params=True)" in parallel.modelled


# A PEFT model under FSDP1: the Trainer replaces the plugin's policy by PEFT's fsdp_auto_wrap_policy
# (transformers distributed/fsdp.py update_fsdp_plugin_peft), so each lora_A and lora_B is a unit of its
# own and a decoder layer's unit holds its frozen weights alone (backends/fsdp1.py _auto_wrap_policy).
LORA = make_adapter("lora", r=4, targets="all-linear")


def adapter_shards(model: Any, ranks: int) -> list[int]:
    """Rank 0's shard of each adapter's unit, in elements: one weight each, lora_A (r x in) and
    lora_B (out x r) of every linear layer in the decoder layers, padded to a multiple of the ranks."""
    r = LORA.r
    linears = [m for layer in model.model.layers for m in layer.modules() if isinstance(m, torch.nn.Linear)]
    return [math.ceil(n / ranks) for m in linears for n in (r * m.in_features, m.out_features * r)]


@pytest.mark.parametrize("ranks", [2, 4])
def test_fsdp1_wraps_each_lora_adapter_apart_from_the_frozen_bfloat16_layer(ranks):
    """Without PEFT's policy a layer's unit would hold its bfloat16 base weights and its float32
    adapters in one FlatParameter, which FSDP1 cannot flatten (the job would not start), or, over a
    float32 base, a trainable layer whole: its gradient and Adam state the size of the layer's."""
    workload = Workload(resolve_model("tiny-llama"), "causal-lm", None, weights_dtype="bfloat16",
                        adapter=LORA, parallel=fsdp1(ranks))
    fake = EstimateBackend(resolve_gpu("A100-80GB"))._model(workload, "bf16")
    flats = fake.distributed.flat_parameters()
    trainable = [f for f in flats if f.requires_grad]
    frozen = [f for f in flats if not f.requires_grad]
    with torch.device("meta"):
        model, _ = build_model(resolve_model("tiny-llama"), "causal-lm", None, "bfloat16")
    assert sorted(f.numel() for f in trainable) == sorted(adapter_shards(model, ranks))
    assert {f.dtype for f in trainable} == {torch.float32}  # PEFT's adapters: no upcast needed
    assert all(f._fqns == ["weight"] for f in trainable)  # a Linear each
    # each decoder layer's base weights and norms, and the root's rest, in the weights' bfloat16: frozen,
    # so accelerate's upcast leaves them
    assert sorted(f.numel() for f in frozen) == sorted(shards(model, ranks))
    assert {f.dtype for f in frozen} == {torch.bfloat16}


def test_fsdp1_lora_reduces_gradients_of_the_adapters_alone():
    ranks = 4
    phases, model = traced(fsdp1(ranks), adapter=LORA)
    grown = phases.live["backward done"][0] - phases.live["before steps"][0]
    assert grown == 4 * sum(adapter_shards(model, ranks))  # float32 sharded gradients, none for the base


def test_lora_on_parameters_under_fsdp1_is_refused_by_name(tmp_path, capsys):
    # Axolotl's lora_target_linear over a Mixtral puts PEFT's ParamWrapper on the router's and experts'
    # parameters: under FSDP1 its delta weight is built outside its lora_A/lora_B units' forward, which
    # the trace cannot stand for (it crashed): refused by name
    from autotune.cli import main

    config = ("base_model: mistralai/Mixtral-8x7B-v0.1\nload_in_4bit: true\nadapter: qlora\nlora_r: 8\n"
              "lora_alpha: 16\nsequence_len: 64\nmicro_batch_size: 1\nlora_target_linear: true\nbf16: true\n"
              "attn_implementation: flash_attention_2\n"
              "fsdp:\n  - full_shard\n  - auto_wrap\nfsdp_config:\n"
              "  fsdp_transformer_layer_cls_to_wrap: MixtralSparseMoeBlock\n")
    file = tmp_path / "mixtral.yaml"
    file.write_text(config)
    args = ["check", "tiny-mixtral", "--from-config", str(file), "--gpu", "H100-80GB", "--gpus", "2",
            "--workers", "1"]
    assert main(args) == 2
    assert "LoRA on parameters (PEFT's ParamWrapper: model.layers.0.mlp.gate and" in capsys.readouterr().err
