"""FP8 training (workload/fp8.py): torchao's own Float8Linear in the traced step, swapped in by accelerate's
own convert_model_to_fp8_ao and filter, what the trace allocates and saves of it, and Axolotl's and
LLaMA-Factory's fp8 keys read."""

from __future__ import annotations

import importlib.util

import pytest
from configread import read
from recorded import alive_as_backward_starts

from autotune.backends.estimate.backend import EstimateBackend
from autotune.backends.estimate.instrument import InstrumentedBackend, Recording
from autotune.errors import InvalidInput, UnmodelledSetting
from autotune.gpus import custom_gpu
from autotune.request import CheckRequest, PeftOptions, Step, resolve
from autotune.units import GIB
from autotune.workload import Workload
from autotune.workload.fp8 import Fp8, parse_fp8
from autotune.workload.models import resolve_model
from autotune.workload.modes import parse_mode
from autotune.workload.parallel import Parallel

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torchao") is None
                                or importlib.util.find_spec("accelerate") is None,
                                reason="torchao and accelerate (the fp8 extra) are not installed")
BATCH, SEQ = 8, 128
TENSORWISE = Fp8()
DOWN = "model.layers.1.mlp.down_proj"  # converted: neither the first linear nor the last


def workload(fp8: Fp8 | None, dtype: str = "float32", model: str = "tiny-llama") -> Workload:
    return Workload(resolve_model(model), "causal-lm", "sdpa", weights_dtype=dtype, fp8=fp8)


def recorded(fp8: Fp8 | None, dtype: str = "float32") -> tuple[int, Recording]:
    backend = InstrumentedBackend(EstimateBackend(custom_gpu(4 * GIB)))
    with backend.cell(workload(fp8, dtype), parse_mode("bf16"), SEQ, 4 * GIB) as cell:
        peak = cell.fits(BATCH).details["peak_allocated_bytes"]
    assert backend.last is not None
    return peak, backend.last


def saved_for_backward(recording: Recording, module: str) -> list[tuple[str, tuple[int, ...]]]:
    """(dtype, shape) of what ``module`` and the modules in it made in the last step's forward and is
    still alive as its backward starts: what autograd saved of it."""
    return sorted((a.dtype, tuple(a.shape)) for a in alive_as_backward_starts(recording)
                  if a.module is not None and (a.module == module or a.module.startswith(module + ".")))


def step_allocations(recording: Recording, phase: str, module: str | None = None) -> list[tuple[str, tuple]]:
    return [(a.dtype, tuple(a.shape)) for a in recording.allocations
            if a.step == recording.steps and a.phase == phase and (module is None or a.module == module)]


def test_accelerate_s_filter_keeps_the_first_and_last_linears_in_high_precision():
    model = EstimateBackend(custom_gpu(4 * GIB))._model(workload(TENSORWISE)).model
    kinds = {name: type(m).__name__ for name, m in model.named_modules() if "Linear" in type(m).__name__}
    # accelerate utils/ao.py find_first_last_linear_layers: layer 0's q_proj and lm_head
    assert kinds.pop("model.layers.0.self_attn.q_proj") == "Linear"
    assert kinds.pop("lm_head") == "Linear"
    assert kinds and set(kinds.values()) == {"Float8Linear"}
    assert model.get_submodule(DOWN).config.cast_config_input.scaling_granularity.value == "tensorwise"


def test_axolotl_s_router_filter_keeps_a_mixture_s_router_in_high_precision():
    import torch

    from autotune.workload.fp8 import prepare_fp8

    def mixture() -> torch.nn.Module:
        block = torch.nn.Module()
        block.gate = torch.nn.Linear(32, 16)  # a router as an nn.Linear (Mixtral's block_sparse_moe.gate)
        block.gate_proj = torch.nn.Linear(32, 64)
        block.down_proj = torch.nn.Linear(64, 32)
        model = torch.nn.Module()
        model.embed = torch.nn.Linear(32, 32)
        model.mlp = block
        model.head = torch.nn.Linear(32, 32)
        return model

    with torch.device("meta"):
        accelerate = prepare_fp8(mixture(), Fp8())
        axolotl = prepare_fp8(mixture(), Fp8(skip_routers=True))
    # filter_linear_layers keeps the first (embed) and last (head) linears; Axolotl's also the router
    assert accelerate == ["mlp.gate", "mlp.gate_proj", "mlp.down_proj"]
    assert axolotl == ["mlp.gate_proj", "mlp.down_proj"]


def test_accelerate_s_filter_keeps_dims_not_divisible_by_16():
    import torch

    from autotune.workload.fp8 import prepare_fp8

    with torch.device("meta"):
        model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.Linear(32, 24), torch.nn.Linear(24, 32),
                                    torch.nn.Linear(32, 32), torch.nn.Linear(32, 32))
        assert prepare_fp8(model, Fp8()) == ["3"]


def test_the_fp8_step_casts_a_converted_linear_s_input_and_weight_to_float8():
    _, plain = recorded(None)
    _, fp8 = recorded(TENSORWISE)
    assert not [a for a in step_allocations(plain, "forward") if a[0].startswith("float8")]
    forward = step_allocations(fp8, "forward", DOWN)
    # tensorwise: the input (batch, seq, 64) and the weight (out 32, in 64, cast from its transpose)
    assert ("float8_e4m3fn", (BATCH, SEQ, 64)) in forward
    assert ("float8_e4m3fn", (64, 32)) in forward
    backward = step_allocations(fp8, "backward")
    # per converted linear (13) in the backward: the gradient cast to float8_e5m2 twice (grad input, grad
    # weight) and its transpose made contiguous for torch._scaled_mm (float8_ops.py preprocess_addmm); the
    # weight and the input cast again to float8_e4m3fn and each made contiguous the other way round
    assert sum(1 for dtype, _ in backward if dtype == "float8_e5m2") == 3 * 13
    assert sum(1 for dtype, _ in backward if dtype == "float8_e4m3fn") == 4 * 13


def test_a_converted_linear_saves_its_bf16_input_as_eager_torchao_does_not_float8():
    """matmul_with_hp_or_float8_args saves the high-precision input and weight (the float32 parameter,
    no copy); under bf16 autocast a float32 model's input is cast to bfloat16 first (Float8Linear.forward's
    autocast branch, on the autocast state the emulated forward sets): the MLP's gate_proj and up_proj
    each save a bfloat16 copy of its float32 input, and nothing float8 or float32 of that size is kept."""
    hidden = (BATCH, SEQ, 32)
    _, fp8 = recorded(TENSORWISE)
    saved = saved_for_backward(fp8, "model.layers.1.mlp")
    assert saved.count(("bfloat16", hidden)) == 2
    assert not [s for s in saved if s[0].startswith("float8") or s[0] == "float32"]
    _, plain = recorded(None)
    # without fp8 F.linear under autocast saves the same bfloat16 inputs, and the weights' bfloat16
    # copies, cached by autocast for the whole forward
    plain_saved = saved_for_backward(plain, "model.layers.1.mlp")
    assert plain_saved.count(("bfloat16", hidden)) == 2
    assert ("bfloat16", (64, 32)) in plain_saved and ("bfloat16", (64, 32)) not in saved


def test_the_float8_wrappers_views_are_not_counted_as_allocations():
    _, fp8 = recorded(TENSORWISE)
    # torch.mm's operands are reshapes of Float8TrainingTensors: no bfloat16 (1024, 64) view allocated
    forward = step_allocations(fp8, "forward", DOWN)
    assert ("bfloat16", (BATCH * SEQ, 64)) not in forward
    assert ("bfloat16", (BATCH * SEQ, 32)) in forward  # the matmul's output


def test_fsdp_float8_all_gather_gathers_float8_shards_under_axolotl_s_fsdp2():
    fp8 = Fp8(enable_fsdp_float8_all_gather=True)
    work = Workload(resolve_model("tiny-llama"), "causal-lm", "sdpa", weights_dtype="bfloat16", fp8=fp8,
                    parallel=Parallel("fsdp", 4, recipe="axolotl"))
    backend = InstrumentedBackend(EstimateBackend(custom_gpu(4 * GIB)))
    with backend.cell(work, parse_mode("bf16"), SEQ, 4 * GIB) as cell:
        cell.fits(BATCH)
    recording = backend.last
    assert recording is not None
    # torchao fsdp_utils.py fsdp_pre_all_gather: each rank casts its shard (32 / 4 rows of 64) to float8
    shards = [a for a in recording.allocations if a.step == recording.steps and a.dtype == "float8_e4m3fn"
              and tuple(a.shape) == (8, 64)]
    assert shards


@pytest.mark.parametrize("parallel, words", [
    (Parallel("fsdp", 4), r"enable_fsdp_float8_all_gather under FSDP2 as accelerate prepares it"),
    (Parallel("fsdp", 4, fsdp_version=1), r"under FSDP1"),
])
def test_float8_all_gather_is_refused_where_it_is_not_traced(parallel, words):
    from autotune.request import check_float8_all_gather

    with pytest.raises(UnmodelledSetting, match=words):
        check_float8_all_gather(Fp8(enable_fsdp_float8_all_gather=True), parallel)


@pytest.mark.parametrize("given, words", [
    ('{"recipe": "delayed"}', r"fp8 recipe 'delayed': allowed are tensorwise, rowwise"),
    ('{"recipe": "rowwise", "enable_fsdp_float8_all_gather": true}', r"needs the tensorwise recipe"),
    ('{"scaling": "tensorwise"}', r"fp8 key 'scaling' is not one of"),
])
def test_what_torchao_refuses_is_refused_by_name(given, words):
    with pytest.raises(InvalidInput, match=words):
        parse_fp8(given)


def test_fp8_beside_an_adapter_is_refused_by_name():
    step = Step("tiny-llama", fp8="tensorwise", peft_options=PeftOptions(peft="lora"))
    request = CheckRequest(step, seq_len=SEQ, batch_size=1)
    with pytest.raises(InvalidInput, match=r"fp8 beside peft"):
        resolve(request)


AXOLOTL = {"base_model": "tiny-llama", "sequence_len": SEQ, "micro_batch_size": 2, "bf16": True,
           "attn_implementation": "flash_attention_2",
           "fp8": True, "fp8_enable_fsdp_float8_all_gather": True}


def test_axolotl_s_fp8_is_read_with_its_all_gather_and_router_filter(tmp_path):
    config = read(tmp_path, AXOLOTL, "fp8.yml")
    assert parse_fp8(config.fp8) == Fp8(enable_fsdp_float8_all_gather=True, skip_routers=True)
    assert any(note.startswith("fp8: true: fp8 training (torchao Float8Linear, tensorwise scaling")
               for note in config.notes)


def test_axolotl_s_fp8_all_gather_alone_does_nothing(tmp_path):
    config = read(tmp_path, {**AXOLOTL, "fp8": False}, "fp8.yml")
    assert config.fp8 is None


LLAMAFACTORY = {"model_name_or_path": "tiny-llama", "stage": "sft", "do_train": True,
                "finetuning_type": "full",
                "cutoff_len": SEQ, "per_device_train_batch_size": 1, "bf16": True, "fp8": True,
                "fp8_backend": "torchao", "fp8_enable_fsdp_float8_all_gather": True}


def test_llamafactory_s_fp8_is_accelerate_s_default_recipe_without_the_all_gather(tmp_path):
    config = read(tmp_path, LLAMAFACTORY, "fp8.yaml")
    # create_fp8_kwargs' rowwise config never reaches the Accelerator: AORecipeKwargs() runs
    assert parse_fp8(config.fp8) == Fp8()
    assert any("FP8_ENABLE_FSDP_FLOAT8_ALL_GATHER, which neither accelerate nor transformers reads"
               in note for note in config.notes)


@pytest.mark.parametrize("changes, words", [
    ({"fp8_backend": "te"}, r"fp8_backend: 'te' .* is not modelled: Transformer Engine"),
    ({"fp8_backend": "msamp"}, r"MS-AMP"),
    ({"bf16": False}, r"fp8: True .* is not modelled: accelerate's fp8 runs the forward under bfloat16"),
    ({"finetuning_type": "lora", "quantization_bit": 4},
     r"FP8 training is not compatible with quantization"),
])
def test_llamafactory_s_fp8_beside_what_is_not_modelled_is_refused(tmp_path, changes, words):
    with pytest.raises(InvalidInput, match=words):
        read(tmp_path, {**LLAMAFACTORY, **changes}, "fp8.yaml")


def test_fp8_under_deepspeed_zero3_traces_the_float8_casts_of_the_gathered_weights():
    """accelerate converts the model before DeepSpeed wraps it (Accelerator.prepare: _prepare_ao, then
    _prepare_deepspeed); ZeRO-3 gathers each Float8Linear's weight, which torchao then casts."""
    from autotune.workload.parallel import make_parallel

    work = Workload(resolve_model("tiny-llama"), "causal-lm", "sdpa", weights_dtype="bfloat16",
                    fp8=TENSORWISE, parallel=make_parallel(2, "zero3"))
    backend = InstrumentedBackend(EstimateBackend(custom_gpu(4 * GIB)))
    with backend.cell(work, parse_mode("bf16"), SEQ, 4 * GIB) as cell:
        cell.fits(BATCH)
    recording = backend.last
    assert recording is not None
    forward = step_allocations(recording, "forward")
    assert ("float8_e4m3fn", (BATCH, SEQ, 64)) in forward  # down_proj's input
    assert ("float8_e4m3fn", (64, 32)) in forward  # down_proj's whole (gathered) weight
