"""torchao's AdamW8bit and AdamW4bit (``adamw_torch_8bit``, ``adamw_torch_4bit``): names, the
estimator's emulation of their state against hand computation from torchao's rules, the cuda
backend's real ones, and a config that names them.

torchao/optim/adam.py ``_AdamBase._new_buffer``: a moment is quantized where the parameter has
n >= 4,096 elements and n % block_size == 0 (the Trainer's block_size: 256 for both), else it is
``zeros_like(p)``. A quantized moment is codes (uint8: n bytes at 8 bits, n / 2 at 4), a float32
scale per block and its own float32 quantization map (256 values at 8 bits, 16 at 4). ``Shapes``'s
parameters, in the order ``model.parameters()`` yields them:

    odd           [64, 130]    8,320 elements  (>= 4,096, but 32.5 blocks: not quantized)
    small         [32, 64]     2,048           (8 whole blocks, but < 4,096: not quantized)
    edge          [16, 256]    4,096           (16 blocks: quantized)
    embed.weight  [1024, 128]  131,072         (512 blocks, quantized: no embedding override)
    fc.weight     [64, 4096]   262,144         (1,024 blocks: quantized)
    fc.bias       [64]         64              (not quantized)
"""

from __future__ import annotations

import gc
import importlib.util
import json
import sys
import types
from typing import Any

import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from autotune.backends.cuda import torchao as cuda_torchao
from autotune.backends.cuda.parts import CUDA_PARTS
from autotune.backends.estimate.parts import ESTIMATE_PARTS
from autotune.backends.estimate.tracker import StorageTracker
from autotune.cli import main
from autotune.configs import read_training_config
from autotune.errors import BackendUnavailable
from autotune.request import values_of
from autotune.workload.models import resolve_model
from autotune.workload.optimizers import (
    OPTIMIZER_NAMES,
    OPTIMIZERS,
    TorchaoAdamWState,
    describe_optimizer,
    make_optimizer,
    optimizer_label,
    outside_allocator_bytes,
    uses_bitsandbytes,
    uses_torchao,
)

ODD, SMALL, EDGE, EMBED, FC, BIAS = 64 * 130, 32 * 64, 16 * 256, 1024 * 128, 64 * 4096, 64
QUANTIZED = (EDGE, EMBED, FC)
PLAIN = (ODD, SMALL, BIAS)


def plain(n: int, itemsize: int) -> int:
    """Two ``zeros_like(p)`` moments, in the weights' dtype."""
    return 2 * n * itemsize


def eight_bit(n: int) -> int:
    """Two OptimState8bit: uint8 codes of p's shape, n / 256 float32 scales, a 256-value map each."""
    return 2 * (n + 4 * (n // 256) + 4 * 256)  # 2n + n/32 + 2,048


def four_bit(n: int) -> int:
    """Two OptimState4bit: n / 2 packed codes, n / 256 float32 scales, a 16-value map each."""
    return 2 * (n // 2 + 4 * (n // 256) + 4 * 16)  # n + n/32 + 128


class Shapes(nn.Module):
    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.odd = nn.Parameter(torch.zeros(64, 130, dtype=dtype))
        self.small = nn.Parameter(torch.zeros(32, 64, dtype=dtype))
        self.edge = nn.Parameter(torch.zeros(16, 256, dtype=dtype))
        self.embed = nn.Embedding(1024, 128, dtype=dtype)
        self.fc = nn.Linear(4096, 64, dtype=dtype)


def step_twice(name: str, dtype: torch.dtype = torch.float32) -> tuple[list[int], list[int], Any, Shapes]:
    """The estimator's view of two optimizer steps: the sizes allocated (+) and freed (-1) by the
    first and by the second, the optimizer and its model (fake tensors, gradients already there)."""
    gc.disable()  # as the estimator: frees happen where refcounting puts them
    try:
        with FakeTensorMode():
            model = Shapes(dtype)
            for p in model.parameters():
                p.grad = torch.zeros_like(p)
            with StorageTracker() as tracker:
                for p in model.parameters():
                    tracker.track(p)
                    tracker.track(p.grad)
                optimizer = make_optimizer(model, name, ESTIMATE_PARTS)
                start = len(tracker.events)
                optimizer.step()
                middle = len(tracker.events)
                optimizer.step()
                end = len(tracker.events)
    finally:
        gc.enable()
    sizes = [nbytes for _, nbytes in tracker.events]
    return sizes[start:middle], sizes[middle:end], optimizer, model


# -- names ----------------------------------------------------------------------------------------


def test_the_trainer_s_torchao_names_are_accepted():
    assert OPTIMIZERS[-4:-2] == ("adamw_torch_8bit", "adamw_torch_4bit")  # then LLaMA-Factory's two
    assert {"adamw_torch_8bit", "adamw_torch_4bit"} <= set(OPTIMIZER_NAMES)
    assert uses_torchao("adamw_torch_8bit") and uses_torchao("adamw_torch_4bit")
    assert not uses_torchao("adamw_bnb_8bit") and not uses_bitsandbytes("adamw_torch_8bit")
    assert outside_allocator_bytes(Shapes(torch.float32), "adamw_torch_8bit") == 0  # nothing is paged


def test_descriptions_and_labels_say_torchao():
    assert describe_optimizer("adamw_torch_8bit", emulate=True).endswith("(torchao's state sizes, emulated)")
    assert describe_optimizer("adamw_torch_4bit", emulate=True).endswith("(torchao's state sizes, emulated)")
    assert "emulated" not in describe_optimizer("adamw_torch_4bit")
    assert describe_optimizer("adamw_torch_4bit").startswith("torchao AdamW4bit as the Trainer sets it up")
    assert [optimizer_label(name) for name in ("adamw_torch_8bit", "adamw_torch_4bit")] == [
        "torchao 8-bit AdamW", "torchao 4-bit AdamW"]


# -- the estimator's emulation --------------------------------------------------------------------


@pytest.mark.parametrize(("name", "quantized"), [("adamw_torch_8bit", eight_bit),
                                                  ("adamw_torch_4bit", four_bit)])
@pytest.mark.parametrize(("dtype", "itemsize"), [(torch.float32, 4), (torch.bfloat16, 2)])
def test_state_bytes_follow_torchao_s_rules(name, quantized, dtype, itemsize):
    first, second, optimizer, _ = step_twice(name, dtype)
    assert isinstance(optimizer, TorchaoAdamWState)
    assert all(nbytes > 0 for nbytes in first)  # state only: the update allocates nothing
    expected = sum(quantized(n) for n in QUANTIZED) + sum(plain(n, itemsize) for n in PLAIN)
    assert sum(first) == expected
    assert second == []  # the state exists: the second step allocates and frees nothing


def test_the_figures_by_hand():
    # 407,744 float32 parameters: torch AdamW keeps 3,261,952 B (8 B a parameter); torchao's 8-bit
    # state is 896,640 B (83,456 of it the unquantized moments), its 4-bit state 493,568 B.
    assert sum(plain(n, 4) for n in PLAIN) == 8 * (8_320 + 2_048 + 64) == 83_456
    assert eight_bit(EMBED) == 262_144 + 4_096 + 2_048  # codes, scales and maps of the two moments
    assert four_bit(EMBED) == 131_072 + 4_096 + 128
    assert four_bit(EDGE) == 4_096 + 128 + 128  # the maps cost as much as the scales here
    assert sum(map(eight_bit, QUANTIZED)) + 83_456 == 896_640
    assert sum(map(four_bit, QUANTIZED)) + 83_456 == 493_568


def test_each_moment_is_laid_out_as_torchao_makes_it():
    _, _, eight, model = step_twice("adamw_torch_8bit")
    _, _, four, _ = step_twice("adamw_torch_4bit")
    state8 = eight.state[model.fc.weight]
    assert [(key, tuple(value.shape), value.dtype) for key, value in state8.items() if key != "step"] == [
        ("exp_avg_codes", (64, 4096), torch.uint8), ("exp_avg_scale", (1024,), torch.float32),
        ("exp_avg_qmap", (256,), torch.float32), ("exp_avg_sq_codes", (64, 4096), torch.uint8),
        ("exp_avg_sq_scale", (1024,), torch.float32), ("exp_avg_sq_qmap", (256,), torch.float32)]
    state4 = four.state[four.param_groups[0]["params"][3]]  # the embedding's weight
    assert {key: (tuple(value.shape), value.dtype) for key, value in state4.items() if key != "step"} == {
        "exp_avg_codes": ((EMBED // 2,), torch.uint8), "exp_avg_scale": ((512,), torch.float32),
        "exp_avg_qmap": ((16,), torch.float32), "exp_avg_sq_codes": ((EMBED // 2,), torch.uint8),
        "exp_avg_sq_scale": ((512,), torch.float32), "exp_avg_sq_qmap": ((16,), torch.float32)}
    # not quantized: zeros_like(p), whatever the reason
    assert {key: tuple(value.shape) for key, value in eight.state[model.odd].items() if key != "step"} == {
        "exp_avg": (64, 130), "exp_avg_sq": (64, 130)}
    assert eight.state[model.small]["exp_avg"].dtype == torch.float32
    assert eight.state[model.fc.weight]["step"] == 2  # a Python number: torchao's is on the CPU


def test_every_quantized_moment_has_its_own_map():
    _, _, optimizer, model = step_twice("adamw_torch_8bit")
    maps = [optimizer.state[p][f"{moment}_qmap"] for p in (model.edge, model.fc.weight)
            for moment in ("exp_avg", "exp_avg_sq")]
    assert len({id(m.untyped_storage()) for m in maps}) == 4


def test_the_trainer_s_block_size_is_used_by_the_4bit_optimizer_too():
    _, _, optimizer, _ = step_twice("adamw_torch_4bit")
    assert (optimizer.bits, optimizer.block_size, optimizer.param_groups[0]["lr"]) == (4, 256, 5e-5)


def test_the_estimator_never_imports_torchao(monkeypatch):
    monkeypatch.setitem(sys.modules, "torchao", None)  # any import of it raises ImportError
    monkeypatch.setitem(sys.modules, "torchao.optim", None)
    for name in ("adamw_torch_8bit", "adamw_torch_4bit"):
        assert isinstance(step_twice(name)[2], TorchaoAdamWState)


# -- the cuda backend's real optimizers -----------------------------------------------------------


def fake_torchao() -> tuple[types.ModuleType, types.ModuleType]:
    """``torchao`` and ``torchao.optim``, whose AdamW8bit and AdamW4bit record how they were built."""
    package, optim = types.ModuleType("torchao"), types.ModuleType("torchao.optim")
    package.optim = optim  # type: ignore[attr-defined]
    optim.built = []  # type: ignore[attr-defined]

    def recording(name: str) -> type:
        class LowBit(torch.optim.Optimizer):
            def __init__(self, params: Any, lr: float = 1e-3, **kwargs: Any) -> None:
                super().__init__(params, {"lr": lr})
                self.kwargs = kwargs
                optim.built.append((name, self))  # type: ignore[attr-defined]

        return LowBit

    optim.AdamW8bit, optim.AdamW4bit = recording("AdamW8bit"), recording("AdamW4bit")  # type: ignore[attr-defined]
    return package, optim


@pytest.mark.parametrize(("name", "cls"), [("adamw_torch_8bit", "AdamW8bit"),
                                            ("adamw_torch_4bit", "AdamW4bit")])
def test_on_the_gpu_torchao_is_built_as_the_trainer_builds_it(monkeypatch, name, cls):
    package, optim = fake_torchao()
    monkeypatch.setitem(sys.modules, "torchao", package)
    monkeypatch.setitem(sys.modules, "torchao.optim", optim)
    model = Shapes(torch.float32)
    model.odd.requires_grad_(False)
    optimizer = make_optimizer(model, name, CUDA_PARTS)
    assert optim.built == [(cls, optimizer)]  # type: ignore[attr-defined]
    # trainer_optimizer._get_torchao_optimizer: block_size 256 for both, no stochastic rounding
    assert optimizer.kwargs == {"block_size": 256, "bf16_stochastic_round": False}
    assert optimizer.defaults["lr"] == 5e-5
    assert [id(p) for p in optimizer.param_groups[0]["params"]] == [
        id(p) for p in model.parameters() if p is not model.odd]


def test_on_the_gpu_without_torchao_the_backend_is_unavailable(monkeypatch):
    monkeypatch.setitem(sys.modules, "torchao", None)
    monkeypatch.setitem(sys.modules, "torchao.optim", None)
    with pytest.raises(BackendUnavailable) as raised:
        make_optimizer(Shapes(torch.float32), "adamw_torch_8bit", CUDA_PARTS)
    assert str(raised.value).startswith(
        "the optimizers adamw_torch_8bit and adamw_torch_4bit need torchao, which cannot be imported here (")
    assert str(raised.value).endswith(
        "): pip install torchao (0.15 or later, as transformers 5 asks), or use the estimate backend, which "
        "emulates its state sizes")


def test_require_torchao_imports_nothing(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(BackendUnavailable, match="^the optimizers adamw_torch_8bit and adamw_torch_4bit "
                                                 "need torchao, which is not installed: pip install torchao"):
        cuda_torchao.require_torchao()


# -- the CLI and the configs ----------------------------------------------------------------------


def check(capsys, model: str, optimizer: str) -> dict[str, Any]:
    code = main(["check", model, "--seq-len", "64", "--batch-size", "2", "--optimizer", optimizer,
                 "--gpu-memory", "2GiB", "--backend", "estimate", "--json"])
    out, _ = capsys.readouterr()
    assert code == 0, out
    return json.loads(out)


def test_check_answers_the_torchao_optimizers(capsys):
    doc = check(capsys, "tiny-llama", "adamw_torch_8bit")
    assert doc["fits"] is True and doc["optimizer"] == "adamw_torch_8bit"
    assert doc["message"].startswith(
        "fits: tiny-llama seq 64 fp32 (causal-lm, fp32 weights, adamw_torch_8bit, attention sdpa) on 2 GiB")
    assert doc["outside_allocator_bytes"] == 0
    # tiny-llama's state is a few KiB: its peak is the allocator's first segments either way.
    assert doc["peak_memory_bytes"] <= check(capsys, "tiny-llama", "adamw_torch_fused")["peak_memory_bytes"]


@pytest.mark.slow
def test_low_bit_state_lowers_the_peak_of_a_wide_vocabulary(tmp_path, capsys):
    # tiny-llama with a 32,768-token vocabulary and a 256 hidden size: the embedding and the head
    # (8.4 M parameters each, float32) make the state large enough to move the peak.
    config = resolve_model("tiny-llama").config
    config.vocab_size, config.hidden_size, config.intermediate_size = 32_768, 256, 512
    config.head_dim = 128
    config.save_pretrained(tmp_path)
    peaks = {name: check(capsys, str(tmp_path), name)["peak_memory_bytes"]
             for name in ("adamw_torch_fused", "adamw_torch_8bit", "adamw_torch_4bit")}
    assert peaks["adamw_torch_fused"] > peaks["adamw_torch_8bit"] > peaks["adamw_torch_4bit"]


@pytest.mark.parametrize("name", ["adamw_torch_8bit", "adamw_torch_4bit"])
def test_an_axolotl_config_with_a_torchao_optimizer_is_read_and_checked(tmp_path, capsys, name):
    # 38 of Axolotl's example configs say one of these (issue #34); they were refused before.
    path = tmp_path / "axolotl.yml"
    path.write_text(f"base_model: tiny-llama\nsequence_len: 32\nmicro_batch_size: 2\nbf16: false\n"
                    f"optimizer: {name}\n")
    config = read_training_config(path)
    assert config.format == "axolotl" and values_of(config.request)["optimizer"] == name
    code = main(["check", "--from-config", str(path), "--gpu-memory", "2GiB", "--backend", "estimate",
                 "--json"])
    out, _ = capsys.readouterr()
    assert code == 0, out
    doc = json.loads(out)
    assert (doc["fits"], doc["optimizer"], doc["batch_size"]) == (True, name, 2)
