"""FSDP-QLoRA as Axolotl runs it (backends/distributed.py ``shard_as_axolotl`` over adapters.prepare's
4-bit base): bitsandbytes' packed weights stored in a bfloat16 quant_storage, which FSDP2 shards as
any 16-bit parameter; the quantization state (absmax, code, ...) is no parameter and stays whole
on every rank; each layer's packed weight is gathered for its forward and dequantized there."""

from __future__ import annotations

import collections
import math

import pytest
import torch
from torch.distributed.tensor import DTensor

from autotune.backends.estimate.backend import EstimateBackend
from autotune.backends.estimate.instrument import Recorder, Variant
from autotune.backends.estimate.nf4 import BLOCKSIZE, EmulatedLinear4bit
from autotune.backends.estimate.tracker import local_shard
from autotune.errors import InvalidInput
from autotune.gpus import resolve_gpu
from autotune.workload import Workload
from autotune.workload.adapters import make_adapter
from autotune.workload.models import resolve_model
from autotune.workload.modes import parse_mode
from autotune.workload.parallel import Parallel, check_sharded

QLORA = make_adapter("qlora", r=4, targets="all-linear", recipe="axolotl")


def workload(ranks: int) -> Workload:
    return Workload(resolve_model("tiny-llama"), "causal-lm", None, weights_dtype="bfloat16",
                    adapter=QLORA, parallel=Parallel("fsdp", ranks, recipe="axolotl"))


def rank_model(ranks: int):
    return EstimateBackend(resolve_gpu("A100-80GB"))._model(workload(ranks), "bf16").model


def nbytes(tensor: torch.Tensor) -> int:
    return local_shard(tensor).untyped_storage().nbytes()


def four_bit_layers(model) -> list[EmulatedLinear4bit]:
    layers = [m for m in model.modules() if isinstance(m, EmulatedLinear4bit)]
    assert layers
    return layers


@pytest.mark.parametrize("ranks", [2, 4])
def test_a_rank_holds_its_share_of_the_packed_weights_and_the_whole_quant_state(ranks):
    for layer in four_bit_layers(rank_model(ranks)):
        n = layer.in_features * layer.out_features
        packed = (n + 1) // 2  # bytes: two 4-bit weights a byte, whatever quant_storage views them as
        weight = layer.weight
        assert isinstance(weight, DTensor) and weight.dtype == torch.bfloat16 and not weight.requires_grad
        rows = packed // 2  # bfloat16 elements, one column (the fake kernel's shape)
        assert tuple(weight.shape) == (rows, 1)
        assert nbytes(weight) == math.ceil(rows / ranks) * 2  # torch.chunk's padded first shard
        assert nbytes(weight) * ranks >= packed > nbytes(weight) * (ranks - 1)
        blocks = math.ceil(n / BLOCKSIZE)  # double quantization: a uint8 absmax per block, whole
        assert not isinstance(layer.absmax, DTensor) and nbytes(layer.absmax) == blocks
        for name in ("code", "offset", "state2_absmax", "state2_code"):
            assert not isinstance(getattr(layer, name), DTensor)


@pytest.mark.parametrize("ranks", [2, 4])
def test_the_adapters_are_sharded_and_the_base_keeps_the_models_dtype(ranks):
    """Axolotl shards each lora_A and lora_B on its own; it skips prepare_model_for_kbit_training
    under FSDP, so nothing of the base is upcast to float32 (PEFT's adapters are float32)."""
    model = rank_model(ranks)
    trainable = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in name for name, _ in trainable)
    for _, parameter in trainable:
        assert isinstance(parameter, DTensor) and parameter.dtype == torch.float32
        full = parameter.numel() * 4
        assert nbytes(parameter) == math.ceil(parameter.shape[0] / ranks) * full // parameter.shape[0]
    frozen = {p.dtype for _, p in model.named_parameters() if not p.requires_grad}
    assert frozen == {torch.bfloat16}


@pytest.mark.parametrize("ranks", [2, 4])
def test_the_traced_rank_holds_the_shards_and_gathers_each_packed_weight_in_forward(ranks):
    backend = EstimateBackend(resolve_gpu("A100-80GB"))
    fake = backend._model(workload(ranks), "bf16")
    recorder = Recorder(fake.model, parse_mode("bf16"), Variant(), 2, 32)
    backend.trace_with(recorder, fake, workload(ranks), parse_mode("bf16"), 32, 2)
    allocations = recorder.recording.allocations
    sharded = sum(nbytes(p) for p in fake.model.parameters())
    buffers = sum(nbytes(b) for b in fake.model.buffers())  # the quant state whole, rotary inv_freq
    # and each layer's float32 absmax, whole, that quantize_4bit makes and frees as it loads (nf4.py)
    absmax32 = sum(4 * layer.absmax.numel() for layer in four_bit_layers(fake.model))
    assert sum(a.nbytes for a in allocations if a.kind == "parameters") == sharded + buffers + absmax32
    gathered = collections.Counter()
    for a in allocations:
        if a.kind == "gathered_parameters" and a.step == 1:
            gathered[a.phase] += a.nbytes
    # every parameter gathered whole (its ranks' padded shards) in bfloat16, the policy's param_dtype
    # (the adapters cast from float32): each layer's packed 4-bit weight among them
    whole = sum(ranks * nbytes(p) * 2 // p.element_size() for p in fake.model.parameters())
    packed = sum(ranks * nbytes(layer.weight) for layer in four_bit_layers(fake.model))
    assert gathered["forward"] == whole
    assert gathered["backward"] >= packed  # gathered again for backward (resharded after forward)


@pytest.mark.parametrize(("parallel", "recipe", "field"), [
    (Parallel("fsdp", 4), "axolotl", "parallel"),  # accelerate's FSDP2
    (Parallel("fsdp", 4, recipe="axolotl"), "trl", "parallel"),  # a base loaded in uint8
    (Parallel("fsdp", 4, fsdp_version=1), "trl", "qlora_recipe"),  # uint8: FSDP1 cannot flatten it
])
def test_fsdp_qlora_other_than_axolotls_is_refused_by_name(parallel, recipe, field):
    with pytest.raises(InvalidInput) as error:
        check_sharded(parallel, 4, "adamw_torch", recipe)
    assert error.value.field == field
    check_sharded(Parallel("fsdp", 4, recipe="axolotl"), 4, "adamw_torch", "axolotl")
    check_sharded(Parallel("fsdp", 4, fsdp_version=1), 4, "adamw_torch", "axolotl")
    with pytest.raises(InvalidInput, match="8-bit base"):
        check_sharded(Parallel("fsdp", 4, recipe="axolotl"), 8, "adamw_torch", "axolotl")


# FSDP1 (the Trainer's, accelerate's FullyShardedDataParallel: backends/fsdp1.py) over Axolotl's 4-bit
# base: PEFT's auto wrap policy, and the bfloat16 MixedPrecision transformers' update_fsdp_plugin_peft
# sets for a float bnb_4bit_quant_storage, whatever the mode.
def fsdp1_workload(ranks: int) -> Workload:
    return Workload(resolve_model("tiny-llama"), "causal-lm", None, weights_dtype="bfloat16",
                    adapter=QLORA, parallel=Parallel("fsdp", ranks, fsdp_version=1))


@pytest.mark.parametrize("mode", ["bf16", "fp32"])
def test_fsdp1_flattens_the_packed_weights_with_the_layer_and_mixes_in_the_quant_storage_dtype(mode):
    ranks = 4
    fake = EstimateBackend(resolve_gpu("A100-80GB"))._model(fsdp1_workload(ranks), mode)
    root = fake.distributed._sharded
    # bfloat16 parameters and reductions in every mode (accelerate's set_mixed_precision(override=True))
    assert root.mixed_precision.param_dtype == torch.bfloat16
    assert root.mixed_precision.reduce_dtype == torch.bfloat16
    flats = fake.distributed.flat_parameters()
    frozen = [f for f in flats if not f.requires_grad]
    trainable = [f for f in flats if f.requires_grad]
    assert {f.dtype for f in frozen} == {torch.bfloat16} and {f.dtype for f in trainable} == {torch.float32}
    # each decoder layer's unit holds its packed 4-bit weights (bfloat16 quant_storage) and norms
    layer_units = [f for f in frozen if any(".base_layer.weight" in fqn for fqn in f._fqns)]
    assert len(layer_units) == fake.model.config.num_hidden_layers
    per_layer = len(four_bit_layers(fake.model)) // len(layer_units)
    assert all(sum(".base_layer.weight" in fqn for fqn in f._fqns) == per_layer for f in layer_units)


def test_fsdp1_leaves_the_quant_state_as_bitsandbytes_keeps_it_and_casts_the_other_buffers():
    ranks = 4
    backend = EstimateBackend(resolve_gpu("A100-80GB"))
    fake = backend._model(fsdp1_workload(ranks), "bf16")
    recorder = Recorder(fake.model, parse_mode("bf16"), Variant(), 2, 32)
    backend.trace_with(recorder, fake, fsdp1_workload(ranks), parse_mode("bf16"), 32, 2)
    for layer in four_bit_layers(fake.model):
        assert layer.code.dtype == torch.float32 and layer.absmax.dtype == torch.uint8
        assert layer.state2_absmax.dtype == torch.float32 and layer.offset.dtype == torch.float32
    # the rotary embedding's inv_freq, a buffer of the model: cast by FSDP1's buffer_dtype at lazy init
    rotary = [b for name, b in fake.model.named_buffers() if name.endswith("inv_freq")]
    assert rotary and {b.dtype for b in rotary} == {torch.bfloat16}
