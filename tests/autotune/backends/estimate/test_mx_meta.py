"""torchao's MX conversions on meta tensors (backends/estimate/mx_meta.py): the traced mxfp4 QAT step
allocates exactly what it does with the conversions on fake tensors, in less CPU."""

from __future__ import annotations

import contextlib
import importlib.util
from unittest import mock

import pytest

from autotune.backends.estimate import backend as backend_module
from autotune.backends.estimate.backend import EstimateBackend
from autotune.backends.estimate.mx_meta import meta_mx_conversions
from autotune.gpus import custom_gpu
from autotune.units import GIB
from autotune.workload import Workload
from autotune.workload.models import resolve_model
from autotune.workload.modes import parse_mode
from autotune.workload.qat import Qat

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torchao") is None,
                                reason="torchao (the qat extra) is not installed")
MXFP4 = Qat("mxfp4", "mxfp4", 32)  # Axolotl's examples/llama-3/3b-qat-mxfp4.yaml
SEQ = 128


def traces(meta: bool, mode_name: str, loss: str) -> dict[int, object]:
    workload = Workload(resolve_model("tiny-llama"), "causal-lm", "sdpa", weights_dtype="bfloat16",
                        qat=MXFP4, loss=loss)
    mode = parse_mode(mode_name)
    backend = EstimateBackend(custom_gpu(40 * GIB))
    fake = backend._model(workload, mode.precision)
    off = mock.patch.object(backend_module, "meta_mx_conversions", contextlib.nullcontext)
    with contextlib.nullcontext() if meta else off, backend.cell(workload, mode, SEQ, 40 * GIB):
        return {batch: backend.trace(fake, workload, mode, SEQ, batch) for batch in (1, 3)}


@pytest.mark.parametrize(("mode_name", "loss"), [("bf16+ckpt", "chunked"), ("bf16", "full")])
def test_the_meta_conversions_allocate_what_the_fake_ones_do(mode_name, loss):
    assert traces(True, mode_name, loss) == traces(False, mode_name, loss)


def test_the_conversions_run_torchao_s_functions_on_meta_and_hand_back_fake_tensors():
    import torch
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
    from torchao.prototype.mx_formats import mx_tensor

    seen: list[str] = []
    original = mx_tensor.to_mx

    def spy(data_hp, *args, **kwargs):
        seen.append(data_hp.device.type)
        return original(data_hp, *args, **kwargs)

    with FakeTensorMode(), mock.patch.object(mx_tensor, "to_mx", spy):
        data = torch.empty(4, 64, dtype=torch.bfloat16)
        with meta_mx_conversions():
            scale, packed = mx_tensor.to_mx(data, torch.float4_e2m1fn_x2, 32)
        assert mx_tensor.to_mx is spy  # put back
    assert seen == ["meta"]
    assert isinstance(scale, FakeTensor) and isinstance(packed, FakeTensor)
    assert packed.shape == (4, 32) and packed.device.type == "cpu"  # two float4 a byte
