"""FSDP's own activation checkpointing (fsdp_config.activation_checkpointing) in a traced FSDP2 rank
(backends/distributed.py ``checkpoint_layers``, ``checkpoint_as_axolotl``): torch's checkpoint_wrapper
around the layers the recipe picks, before sharding, run on fake tensors; and in an FSDP1 rank
(backends/fsdp1.py ``_checkpoint``), after wrapping, as accelerate's prepare_model applies it."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from allocations import peak
from ranktrace import traced

from autotune.backends import distributed
from autotune.backends.estimate.backend import EstimateBackend
from autotune.errors import InvalidInput
from autotune.gpus import resolve_gpu
from autotune.workload import Workload
from autotune.workload.models import resolve_model
from autotune.workload.modes import parse_mode
from autotune.workload.parallel import Parallel, make_parallel


def rank_model(parallel: Parallel) -> Any:
    workload = Workload(resolve_model("tiny-llama"), "causal-lm", None, weights_dtype="bfloat16",
                        parallel=parallel)
    return EstimateBackend(resolve_gpu("A100-80GB"))._model(workload, "bf16").model


def test_accelerates_checkpointing_is_the_rank_fsdp2_apply_ac_makes(monkeypatch):
    """The traced rank's allocations, event for event, are those of the same rank wrapped by
    accelerate's own fsdp2_apply_ac (its FullyShardedDataParallelPlugin's transformer-based policy)."""
    from accelerate.utils import FullyShardedDataParallelPlugin
    from accelerate.utils.fsdp_utils import fsdp2_apply_ac

    parallel = Parallel("fsdp", 4, activation_checkpointing=True)
    ours, _ = traced(parallel, mode="bf16")

    def accelerates(model: Any, _parallel: Any = None) -> None:
        distributed._without_cache(model)
        plugin = FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy="transformer_based_wrap",
                                                activation_checkpointing=True)
        plugin.set_auto_wrap_policy(model)
        fsdp2_apply_ac(SimpleNamespace(state=SimpleNamespace(fsdp_plugin=plugin)), model)

    monkeypatch.setattr(distributed, "checkpoint_layers", accelerates)
    library, _ = traced(parallel, mode="bf16")
    plain, _ = traced(Parallel("fsdp", 4), mode="bf16")
    # the tracker's keys are storages of each run; the bytes allocated and freed, in order, the same
    assert [n for _, n in ours.tracker.events] == [n for _, n in library.tracker.events]
    # checkpointed: each layer's forward runs again in backward, and less is held at the peak
    assert len(ours.tracker.events) > len(plain.tracker.events)
    assert peak(ours.tracker.events) < peak(plain.tracker.events)


def test_accelerate_shards_each_wrapped_layer_in_a_group_of_its_own():
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper
    from torch.distributed.fsdp import FSDPModule

    model = rank_model(Parallel("fsdp", 4, activation_checkpointing=True))
    for layer in model.model.layers:
        assert isinstance(layer, CheckpointWrapper) and not layer.checkpoint_fn.keywords["preserve_rng_state"]
        # accelerate 1.15's policy looks through the wrapper: both are FSDP modules
        assert isinstance(layer._checkpoint_wrapped_module, FSDPModule) and isinstance(layer, FSDPModule)
    assert model.config.use_cache is False  # as the Trainer trains: no cache refilled by a recompute


def test_axolotl_nests_accelerate_1_13s_wrapped_children_in_its_own_wrapped_layers():
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, CheckpointWrapper
    from torch.distributed.fsdp import FSDPModule
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    model = rank_model(Parallel("fsdp", 4, recipe="axolotl", activation_checkpointing=True))
    for outer in model.model.layers:
        assert isinstance(outer, CheckpointWrapper) and outer.checkpoint_impl is CheckpointImpl.NO_REENTRANT
        layer = outer._checkpoint_wrapped_module
        assert isinstance(layer, LlamaDecoderLayer) and isinstance(layer, FSDPModule)
        assert not isinstance(outer, FSDPModule)  # accelerate 1.13's policy does not look through
        children = dict(layer.named_children())
        assert set(children) == {"self_attn", "mlp", "input_layernorm", "post_attention_layernorm"}
        assert all(isinstance(child, CheckpointWrapper) for child in children.values())


def test_axolotls_nested_checkpoints_run_and_hold_less_at_the_peak():
    nested, _ = traced(Parallel("fsdp", 4, recipe="axolotl", activation_checkpointing=True), mode="bf16")
    plain, _ = traced(Parallel("fsdp", 4, recipe="axolotl"), mode="bf16")
    assert nested.live["optimizer done"] == plain.live["optimizer done"]  # the same shards and state
    assert peak(nested.tracker.events) < peak(plain.tracker.events)


def test_fsdp_checkpointing_is_refused_beside_a_ckpt_mode_and_outside_fsdp():
    workload = Workload(resolve_model("tiny-llama"), "causal-lm", None, weights_dtype="bfloat16",
                        parallel=Parallel("fsdp", 4, activation_checkpointing=True))
    backend = EstimateBackend(resolve_gpu("A100-80GB"))
    with pytest.raises(InvalidInput, match="Trainer refuses gradient checkpointing beside it"):
        with backend.cell(workload, parse_mode("bf16+ckpt"), 64, 10**12):
            pass
    with pytest.raises(InvalidInput, match="fsdp_activation_checkpointing is an fsdp setting, not ddp's"):
        make_parallel(4, "ddp", activation_checkpointing=True)
    assert make_parallel(4, "fsdp", activation_checkpointing=True).activation_checkpointing
    assert "FSDP activation checkpointing" in Parallel("fsdp", 4, activation_checkpointing=True).label


def test_fsdp1_checkpoints_each_layer_inside_its_unit_as_accelerate_does():
    """accelerate's prepare_model (FSDP1): apply_activation_checkpointing over the wrapped model with
    the plugin's policy, so each FSDP unit holds a non-reentrant CheckpointWrapper around its layer."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, CheckpointWrapper
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    model = rank_model(Parallel("fsdp", 4, fsdp_version=1, activation_checkpointing=True))
    for unit in model.model.layers:
        assert isinstance(unit, FSDP)
        wrapper = unit._fsdp_wrapped_module
        assert isinstance(wrapper, CheckpointWrapper)
        assert wrapper.checkpoint_impl is CheckpointImpl.NO_REENTRANT
        assert isinstance(wrapper._checkpoint_wrapped_module, LlamaDecoderLayer)
    assert model.config.use_cache is False
    plain = rank_model(Parallel("fsdp", 4, fsdp_version=1))
    assert not any(isinstance(module, CheckpointWrapper) for module in plain.modules())


def test_fsdp1_checkpointing_holds_the_same_shards_and_less_at_the_peak():
    checkpointed, _ = traced(Parallel("fsdp", 4, fsdp_version=1, activation_checkpointing=True), mode="bf16")
    plain, _ = traced(Parallel("fsdp", 4, fsdp_version=1), mode="bf16")
    assert checkpointed.live["optimizer done"] == plain.live["optimizer done"]
    assert len(checkpointed.tracker.events) > len(plain.tracker.events)  # each layer's forward again
    assert peak(checkpointed.tracker.events) < peak(plain.tracker.events)
    label = Parallel("fsdp", 4, fsdp_version=1, activation_checkpointing=True).label
    assert label == "FSDP1 full shard, FSDP activation checkpointing, 4 GPUs"


def test_fsdp1_checkpoints_each_lora_adapter_under_pefts_policy():
    """The Trainer hands FSDP1 PEFT's fsdp_auto_wrap_policy (update_fsdp_plugin_peft), and accelerate
    checkpoints by the same policy: each trainable leaf (lora_A, lora_B) is wrapped too, nested inside
    its layer's wrapper."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

    from autotune.workload.adapters import make_adapter

    workload = Workload(resolve_model("tiny-llama"), "causal-lm", None, weights_dtype="bfloat16",
                        adapter=make_adapter("lora", r=4, targets="all-linear"),
                        parallel=Parallel("fsdp", 4, fsdp_version=1, activation_checkpointing=True))
    model = EstimateBackend(resolve_gpu("A100-80GB"))._model(workload, "bf16").model
    wrapped = [name for name, module in model.named_modules() if isinstance(module, CheckpointWrapper)]
    layers = [name for name in wrapped if name.endswith("_fsdp_wrapped_module")
              and name.count("lora_") == 0]
    adapters = [name for name in wrapped if ".lora_A." in name or ".lora_B." in name]
    assert len(layers) == model.config.num_hidden_layers
    assert len(adapters) == 2 * 7 * model.config.num_hidden_layers  # q, k, v, o, gate, up, down


@pytest.mark.parametrize("recipe", ["accelerate", "axolotl", "fsdp1"])
def test_a_recompute_runs_under_the_cuda_emulation_as_the_forward_did(recipe):
    """Issue #39: LoRA's dropout saves native_dropout's bool mask in the forward (the emulation's fused
    dropout); the recompute, inside backward where the emulation's mode is not active, saved a mask of
    the input's dtype, and torch.utils.checkpoint refused the step (CheckpointError). The wrappers
    recompute under the emulation (distributed.recompute_under), as transformers' checkpointing does."""
    from autotune.workload.adapters import make_adapter

    workload = Workload(resolve_model("tiny-llama"), "causal-lm", None, weights_dtype="bfloat16",
                        adapter=make_adapter("lora", r=4, dropout=0.05),
                        parallel=Parallel("fsdp", 4, activation_checkpointing=True, **(
                            {"fsdp_version": 1} if recipe == "fsdp1" else {"recipe": recipe})))
    with EstimateBackend(resolve_gpu("A100-80GB")).cell(workload, parse_mode("bf16"), 32, 10**12) as cell:
        probe = cell.fits(2)
    assert probe.outcome == "fits", probe.error
