"""Quantization-aware training (workload/qat.py): torchao's own fake-quantized linears in the traced step,
as Axolotl's prepare_model_for_qat swaps them in, the bytes they add, Axolotl's and torchao's refusals,
and Axolotl's ``qat:`` key read."""

from __future__ import annotations

import importlib.util

import pytest
from configread import read
from recorded import alive_as_backward_starts

from autotune.backends.estimate.backend import EstimateBackend
from autotune.backends.estimate.instrument import InstrumentedBackend, Recording
from autotune.errors import InvalidInput
from autotune.gpus import custom_gpu
from autotune.request import CheckRequest, Step, resolve
from autotune.units import GIB
from autotune.workload import Workload
from autotune.workload import qat as qat_module
from autotune.workload.models import resolve_model
from autotune.workload.modes import parse_mode
from autotune.workload.qat import Qat, check_accepted, parse_qat

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torchao") is None,
                                reason="torchao (the qat extra) is not installed")
INT8_INT4 = Qat("int4", "int8", 32)  # examples/llama-3/3b-qat-fsdp2.yaml
MXFP4 = Qat("mxfp4", "mxfp4", 32)  # examples/llama-3/3b-qat-mxfp4.yaml
FP8 = Qat("float8_e4m3fn", "float8_e4m3fn")
BATCH, SEQ = 8, 128


def workload(qat: Qat | None) -> Workload:
    return Workload(resolve_model("tiny-llama"), "causal-lm", "sdpa", weights_dtype="bfloat16", qat=qat)


def recorded(qat: Qat | None) -> tuple[int, Recording]:
    backend = InstrumentedBackend(EstimateBackend(custom_gpu(4 * GIB)))
    with backend.cell(workload(qat), parse_mode("fp32"), SEQ, 4 * GIB) as cell:
        peak = cell.fits(BATCH).details["peak_allocated_bytes"]
    assert backend.last is not None
    return peak, backend.last


def saved_for_backward(recording: Recording, made_in: str) -> int:
    """Bytes made in the last step's forward by modules whose name contains ``made_in`` and still
    alive as its backward starts: what autograd saved of them."""
    return sum(a.nbytes for a in alive_as_backward_starts(recording)
               if a.module is not None and made_in in a.module)


def test_the_int8_int4_step_runs_torchao_s_fake_quantizers_on_every_linear():
    model = EstimateBackend(custom_gpu(4 * GIB))._model(workload(INT8_INT4)).model
    linears = [m for m in model.modules() if type(m).__name__.endswith("Linear")]
    assert linears and all(type(m).__name__ == "FakeQuantizedLinear" for m in linears)  # lm_head too
    for module in linears:
        assert type(module.activation_fake_quantizer).__name__ == "IntxFakeQuantizer"
        assert type(module.weight_fake_quantizer).__name__ == "Int4WeightFakeQuantizer"
        assert module.weight_fake_quantizer.config.group_size == 32
    assert type(model.model.embed_tokens).__name__ == "Embedding"  # quantize_embedding false


def test_the_mxfp4_step_runs_torchao_s_mx_linears():
    model = EstimateBackend(custom_gpu(4 * GIB))._model(workload(MXFP4)).model
    linears = [m for m in model.modules() if type(m).__name__.endswith("Linear")]
    assert linears and all(type(m).__name__ == "MXFakeQuantizedLinear" for m in linears)
    assert all(m.weight_config.block_size == 32 for m in linears)


@pytest.mark.parametrize("qat", [INT8_INT4, FP8], ids=["int8-int4", "fp8"])
def test_the_qat_step_peaks_above_the_plain_one_by_what_its_quantizers_saved(qat):
    plain, _ = recorded(None)
    peak, recording = recorded(qat)
    saved = saved_for_backward(recording, "fake_quantizer")
    # float32 copies of each group of weights, the quantized activations and their masks, saved
    # for the backward of every linear: the peak (at the start of the backward) carries them
    assert saved > 1_000_000
    assert 0.8 * saved <= peak - plain <= 1.01 * saved, (peak - plain, saved)


def test_the_mxfp4_step_saves_torchao_s_mx_tensors():
    plain, _ = recorded(None)
    peak, recording = recorded(MXFP4)
    # _MXQuantizedForwardFakeQuantizedBackward saves the input and weight as MXTensors: packed
    # float4 (half a byte an element) and their e8m0 scales
    packed = [a for a in recording.allocations if a.step == recording.steps and a.phase == "forward"
              and a.module == "model.layers.0.mlp.down_proj" and a.dtype == "uint8"]
    assert any(a.shape == (BATCH * SEQ, 64 // 2) for a in packed)
    assert peak > plain


@pytest.mark.parametrize("given, words", [
    ({"weight_dtype": "nvfp4", "activation_dtype": "nvfp4", "group_size": 16},
     r"torchao [0-9.]+ refuses the QATConfig Axolotl's prepare_model_for_qat builds \("
     r"Unexpected base config: NVFP4WeightOnlyConfig\(use_dynamic_per_tensor_scale=True\): "
     r"torchao/quantization/qat/fake_quantize_config.py _infer_fake_quantize_configs, a check of the "
     r"config, not of the device\), so the job stops as the model loads on the GPU too"),
    ({"weight_dtype": "nvfp4", "activation_dtype": "nvfp4"}, r"qat nvfp4 needs group_size 16"),
    ({"weight_dtype": "int8"}, r"Int8WeightOnlyConfig is not supported by torchao QAT"),
    ({"weight_dtype": "int4", "activation_dtype": "int4"}, r"Int4DynamicActivationInt4WeightConfig"),
    ({"weight_dtype": "mxfp4", "group_size": 16}, r"qat mxfp4 needs group_size 32"),
    ({"weight_dtype": "int2"}, r"qat weight_dtype 'int2': allowed are int4, int8, float8_e4m3fn"),
    ({"weight_dtype": "float8_e4m3fn"}, r"Invalid activation/weight dtype combination"),
])
def test_what_axolotl_or_torchao_refuses_is_refused_by_name(given, words):
    with pytest.raises(InvalidInput, match=words):
        check_accepted(parse_qat(given))  # type: ignore[arg-type]


def test_rows_that_are_not_whole_groups_are_refused():
    with pytest.raises(InvalidInput, match=r"qat int4 in groups of 256: model.layers.0.self_attn.q_proj's "
                                           r"rows of 32 are not whole groups"):
        EstimateBackend(custom_gpu(4 * GIB))._model(workload(Qat("int4", "int8", 256)))


def test_without_torchao_qat_is_refused_with_the_extra_to_install(monkeypatch):
    monkeypatch.setattr(qat_module, "torchao_available", lambda: False)
    request = CheckRequest(Step("tiny-llama", qat='{"weight_dtype": "int4", "activation_dtype": "int8"}'),
                           seq_len=SEQ, batch_size=1)
    with pytest.raises(InvalidInput, match=r"torchao is not installed: pip install 'autotune-batch\[qat\]'"):
        resolve(request)


AXOLOTL = {"base_model": "tiny-llama", "sequence_len": SEQ, "micro_batch_size": 2, "bf16": True,
           "attn_implementation": "flash_attention_2",
           "qat": {"activation_dtype": "int8", "weight_dtype": "int4", "group_size": 256,
                   "fake_quant_after_n_steps": 1000}}


def test_axolotl_s_qat_is_read_with_the_step_it_models(tmp_path):
    config = read(tmp_path, AXOLOTL, "qat.yml")
    assert parse_qat(config.qat) == Qat("int4", "int8", 256)
    assert any(note.startswith("qat.fake_quant_after_n_steps: 1000: fake quantization off before step "
                               "1000") and "the one with it on, the larger" in note for note in config.notes)


@pytest.mark.parametrize("changes, words", [
    ({"adapter": "lora", "lora_r": 8, "lora_alpha": 16, "lora_target_linear": True},
     "QAT and PEFT cannot be used together"),
])
def test_axolotl_s_qat_beside_what_it_refuses_is_refused(tmp_path, changes, words):
    with pytest.raises(InvalidInput, match=words):
        read(tmp_path, {**AXOLOTL, **changes}, "qat.yml")
