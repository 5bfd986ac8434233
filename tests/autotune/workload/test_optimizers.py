"""The Trainer's optimizers: names, builders, and the memory of each against hand-computed figures.

The figures are for ``Small``, whose parameters, in the order ``model.parameters()`` yields them
(the module's own first, then its children's), are:

    mix           [64, 130]    8,320 elements   (>= 4,096: 8-bit, in 33 blocks of 256; never paged;
                                                 32.5 blocks: torchao keeps it unquantized)
    embed.weight  [1024, 128]  131,072          (an nn.Embedding: 32-bit under the Trainer; paged)
    fc.weight     [64, 4096]   262,144          (8-bit; paged)
    fc.bias       [64]         64               (< 4,096: float32 moments in bitsandbytes)

N = 401,600 parameters, 1,606,400 bytes in float32. Memory is measured as the estimator measures
it: the step under FakeTensorMode with a StorageTracker, the parameters tracked first.
"""

from __future__ import annotations

import gc
import importlib.machinery
import math
import subprocess
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from transformers.optimization import Adafactor

from autotune.backends.cuda.parts import CUDA_PARTS
from autotune.backends.estimate.backend import EstimateBackend
from autotune.backends.estimate.parts import ESTIMATE_PARTS
from autotune.backends.estimate.tracker import StorageTracker, outside_allocator
from autotune.defaults import DEFAULT_OPTIMIZER
from autotune.errors import InvalidInput
from autotune.gpus import resolve_gpu
from autotune.workload import Workload
from autotune.workload.models import resolve_model
from autotune.workload.modes import parse_mode
from autotune.workload.optimizers import (
    OPTIMIZER_NAMES,
    OPTIMIZERS,
    BnbAdamWState,
    check_optimizer,
    describe_optimizer,
    make_optimizer,
    optimizer_label,
    outside_allocator_bytes,
)
from autotune.workload.step import run_steps

MIX, EMBED, FC, BIAS = 64 * 130, 1024 * 128, 64 * 4096, 64
N = MIX + EMBED + FC + BIAS  # 401,600
F32, BF16 = 4, 2  # bytes per element
# torch AdamW's float32 ``step`` scalar of each of the 4 parameters: on the GPU with fused (and
# counted), on the CPU with foreach (the estimator's fake tensors cannot tell: counted too).
STEP_TENSORS = 4 * 4
QMAPS = 2 * 256 * 4  # bitsandbytes' two 256-value float32 quantization maps, shared


def absmax(n: int) -> int:
    """bitsandbytes' two float32 block scales of an 8-bit parameter of n elements."""
    return 2 * 4 * math.ceil(n / 256)


def torchao(n: int, bits: int) -> int:
    """torchao's two quantized moments of n elements (whole blocks of 256): codes of ``bits`` bits,
    float32 block scales and a float32 quantization map each (256 values at 8 bits, 16 at 4)."""
    return 2 * (n * bits // 8 + 4 * (n // 256) + 4 * 2**bits)


class Small(nn.Module):
    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.embed = nn.Embedding(1024, 128, dtype=dtype)
        self.fc = nn.Linear(4096, 64, dtype=dtype)
        self.mix = nn.Parameter(torch.zeros(64, 130, dtype=dtype))
        # what Adam-mini reads (LLaMA-Factory's _create_adam_mini_optimizer: dim, n_heads, n_kv_heads)
        self.config = SimpleNamespace(hidden_size=128, num_attention_heads=4, num_key_value_heads=4)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> SimpleNamespace:
        hidden = self.embed(input_ids).reshape(input_ids.shape[0], 4096)  # 32 tokens x 128
        return SimpleNamespace(loss=(self.fc(hidden) @ self.mix).sum())


@dataclass
class Measured:
    state_bytes: int  # allocated by the first optimizer step and still alive after it
    temporary_bytes: int  # the second step's peak above what was alive when it began
    optimizer: Any
    model: Small


class MarkingScaler:
    """run_steps' scaler, noting where each optimizer step begins and ends in the trace."""

    def __init__(self, tracker: StorageTracker) -> None:
        self.tracker, self.marks = tracker, []

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return loss

    def step(self, optimizer: Any) -> None:
        start = len(self.tracker.events)
        optimizer.step()
        self.marks.append((start, len(self.tracker.events)))

    def update(self) -> None:
        pass


def live_bytes(events: list[tuple[int, int]], start: int, end: int) -> tuple[int, int, int]:
    """Bytes alive before ``events[start]``, after ``events[end - 1]``, and the most in between."""
    live: dict[int, int] = {}
    for key, nbytes in events[:start]:
        if nbytes < 0:
            live.pop(key)
        else:
            live[key] = nbytes
    before = current = peak = sum(live.values())
    for key, nbytes in events[start:end]:
        if nbytes < 0:
            current -= live.pop(key)
        else:
            live[key] = nbytes
            current += nbytes
        peak = max(peak, current)
    return before, current, peak


def measure(name: str, dtype: torch.dtype = torch.float32) -> Measured:
    gc.disable()  # as the estimator: frees happen where refcounting puts them
    try:
        with FakeTensorMode():
            model = Small(dtype)
            batch = {"input_ids": torch.zeros(2, 32, dtype=torch.long), "labels": torch.zeros(2)}
            with StorageTracker() as tracker:
                for p in model.parameters():
                    tracker.track(p)
                optimizer = make_optimizer(model, name, ESTIMATE_PARTS)
                scaler = MarkingScaler(tracker)
                run_steps(model, batch, optimizer, steps=2, scaler=scaler)
    finally:
        gc.enable()
    (start1, end1), (start2, end2) = scaler.marks
    before1, after1, _ = live_bytes(tracker.events, start1, end1)
    before2, _, peak2 = live_bytes(tracker.events, start2, end2)
    return Measured(after1 - before1, peak2 - before2, optimizer, model)


# -- names ----------------------------------------------------------------------------------------


def test_names_are_the_trainers_with_the_default_first():
    assert OPTIMIZERS[0] == DEFAULT_OPTIMIZER == "adamw_torch_fused"
    assert set(OPTIMIZERS) == {"adamw_torch_fused", "adamw_torch", "adafactor", "adamw_bnb_8bit",
                               "paged_adamw_8bit", "paged_adamw_32bit", "sgd", "adamw_torch_8bit",
                               "adamw_torch_4bit", "llamafactory_muon", "adam_mini"}
    assert OPTIMIZER_NAMES == (*OPTIMIZERS, "adamw", "adamw_8bit")


@pytest.mark.parametrize(("name", "canonical"), [
    ("adamw", "adamw_torch"), ("adamw_8bit", "adamw_bnb_8bit"), ("paged_adamw_32bit", "paged_adamw_32bit"),
])
def test_aliases_resolve_to_their_canonical_name(name, canonical):
    assert check_optimizer(name) == canonical


def test_an_unknown_optimizer_is_refused_with_the_allowed_names():
    with pytest.raises(InvalidInput) as raised:
        check_optimizer("adam")
    assert str(raised.value) == (
        "unknown optimizer 'adam': allowed are adamw_torch_fused, adamw_torch, adafactor, adamw_bnb_8bit, "
        "paged_adamw_8bit, paged_adamw_32bit, sgd, adamw_torch_8bit, adamw_torch_4bit, llamafactory_muon, "
        "adam_mini, or the aliases "
        "adamw (= adamw_torch), "
        "adamw_8bit (= adamw_bnb_8bit)"
    )


def test_descriptions_say_when_bitsandbytes_is_emulated():
    assert describe_optimizer("adamw_8bit", emulate=True).endswith("(bitsandbytes' state sizes, emulated)")
    assert "emulated" not in describe_optimizer("adamw_bnb_8bit")
    assert describe_optimizer("adamw_torch_fused", emulate=True) == describe_optimizer("adamw_torch_fused")
    assert len({describe_optimizer(name) for name in OPTIMIZERS}) == len(OPTIMIZERS)


def test_labels_name_the_optimizer_in_a_sentence():
    assert [optimizer_label(name) for name in ("adamw", "adamw_torch_fused", "adamw_8bit", "sgd")] == [
        "AdamW", "AdamW", "8-bit AdamW", "SGD"]


def test_importing_the_names_imports_neither_torch_nor_transformers():
    code = ("import sys, autotune.workload.optimizers, autotune.workload.step; "
            "assert 'torch' not in sys.modules and 'transformers' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[3])


# -- what is built --------------------------------------------------------------------------------


def test_the_estimator_runs_the_real_torch_and_transformers_classes():
    model = Small(torch.float32)
    fused = make_optimizer(model, "adamw_torch_fused", ESTIMATE_PARTS)
    foreach = make_optimizer(model, "adamw", ESTIMATE_PARTS)
    adafactor = make_optimizer(model, "adafactor", ESTIMATE_PARTS)
    sgd = make_optimizer(model, "sgd", ESTIMATE_PARTS)
    assert type(fused) is type(foreach) is torch.optim.AdamW
    assert (fused.defaults["fused"], fused.defaults["lr"]) == (True, 5e-5)
    assert (foreach.defaults["foreach"], foreach.defaults["fused"]) == (True, None)
    assert type(adafactor) is Adafactor  # as trainer_optimizer._get_adafactor sets it up
    assert {k: adafactor.defaults[k] for k in ("lr", "scale_parameter", "relative_step", "beta1")} == {
        "lr": 5e-5, "scale_parameter": False, "relative_step": False, "beta1": None}
    assert type(sgd) is torch.optim.SGD and (sgd.defaults["lr"], sgd.defaults["momentum"]) == (1e-3, 0)


def test_only_trainable_parameters_are_optimized():
    model = Small(torch.float32)
    model.embed.weight.requires_grad_(False)
    for name in OPTIMIZERS:
        optimizer = make_optimizer(model, name, ESTIMATE_PARTS)
        params = [p for group in optimizer.param_groups for p in group["params"]]
        assert [id(p) for p in params] == [id(model.mix), id(model.fc.weight), id(model.fc.bias)], name


def test_on_the_gpu_torch_chooses_foreach_itself():
    model = Small(torch.float32)
    assert make_optimizer(model, "adamw_torch", CUDA_PARTS).defaults["foreach"] is None
    assert make_optimizer(model, "adamw_torch_fused", CUDA_PARTS).defaults["fused"] is True


def fake_bitsandbytes() -> types.ModuleType:
    """A ``bitsandbytes`` recording how its AdamW was built and which overrides were registered."""
    module = types.ModuleType("bitsandbytes")
    module.__spec__ = importlib.machinery.ModuleSpec("bitsandbytes", None)
    module.built, module.overrides = [], []  # type: ignore[attr-defined]

    class AdamW(torch.optim.Optimizer):
        def __init__(self, params: Any, lr: float = 1e-3, **kwargs: Any) -> None:
            super().__init__(params, {"lr": lr})
            self.kwargs = kwargs
            module.built.append(self)  # type: ignore[attr-defined]

    class GlobalOptimManager:
        @classmethod
        def get_instance(cls) -> GlobalOptimManager:
            return cls()

        def register_module_override(self, module_: Any, param_name: str, config: dict[str, Any]) -> None:
            module.overrides.append((module_, param_name, config))  # type: ignore[attr-defined]

    module.optim = SimpleNamespace(AdamW=AdamW, GlobalOptimManager=GlobalOptimManager)  # type: ignore[attr-defined]
    return module


@pytest.mark.parametrize(("name", "kwargs", "overridden"), [
    ("adamw_8bit", {"optim_bits": 8, "is_paged": False}, True),
    ("paged_adamw_8bit", {"optim_bits": 8, "is_paged": True}, True),
    ("paged_adamw_32bit", {"optim_bits": 32, "is_paged": True}, False),  # the Trainer overrides 8-bit only
])
def test_on_the_gpu_bitsandbytes_is_built_as_the_trainer_builds_it(monkeypatch, name, kwargs, overridden):
    bnb = fake_bitsandbytes()
    monkeypatch.setitem(sys.modules, "bitsandbytes", bnb)
    model = Small(torch.float32)
    optimizer = make_optimizer(model, name, CUDA_PARTS)
    assert bnb.built == [optimizer] and optimizer.kwargs == kwargs  # type: ignore[attr-defined]
    assert optimizer.defaults["lr"] == 5e-5
    expected = [(model.embed, "weight", {"optim_bits": 32})] if overridden else []
    assert bnb.overrides == expected  # type: ignore[attr-defined]


def test_the_estimator_never_imports_bitsandbytes(monkeypatch):
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)  # any import of it raises ImportError
    for name in ("adamw_bnb_8bit", "paged_adamw_8bit", "paged_adamw_32bit"):
        assert isinstance(measure(name).optimizer, BnbAdamWState)


# -- memory, float32 weights ----------------------------------------------------------------------

# Adafactor (beta1=None: no first moment) keeps, per matrix [r, c], float32 row and column means
# of the squared gradient (r + c values), per vector a full second moment, and an RMS scalar each:
ADAFACTOR_STATE = 4 * ((64 + 130) + (1024 + 128) + (64 + 4096) + 64) + 4 * 4  # 22,296
# bitsandbytes 8-bit AdamW as the Trainer sets it up: uint8 moments for mix and fc.weight, with
# their block scales; float32 moments for the embedding (the Trainer's override) and fc.bias.
BNB_8BIT_STATE = (2 * MIX + absmax(MIX)) + 8 * EMBED + (2 * FC + absmax(FC)) + 8 * BIAS + QMAPS
PAGED_8BIT = 8 * EMBED + 2 * FC  # the moments of parameters from 100,000 elements
PAGED_32BIT = 8 * EMBED + 8 * FC


@pytest.mark.parametrize(("name", "state", "temporaries", "outside"), [
    # Fused: two float32 moments (8 B a parameter) and the step scalars; the update is one
    # in-place kernel, so the step allocates nothing more.
    ("adamw_torch_fused", 8 * N + STEP_TENSORS, 0, 0),
    # Foreach: the same state; the step holds sqrt(exp_avg_sq) of every parameter at once.
    ("adamw_torch", 8 * N + STEP_TENSORS, 4 * N, 0),
    # Adafactor works one parameter at a time: the largest, fc.weight (1 MiB), needs grad**2 and
    # grad**2 + eps at once, while the previous parameter's update (the embedding's, 512 KiB) is
    # still referenced by the loop's variable.
    ("adafactor", ADAFACTOR_STATE, 2 * 4 * FC + 4 * EMBED, 0),
    ("sgd", 0, 0, 0),  # no momentum: no state; foreach add_ in place
    ("adamw_bnb_8bit", BNB_8BIT_STATE, 0, 0),  # 1,600,520 B: about 4 B a parameter, not 8
    ("paged_adamw_8bit", BNB_8BIT_STATE - PAGED_8BIT, 0, PAGED_8BIT),  # 27,656 B in the allocator
    ("paged_adamw_32bit", 8 * MIX + 8 * BIAS, 0, PAGED_32BIT),  # no maps, no block scales
    # torchao: mix (not whole blocks) and fc.bias (< 4,096) keep zeros_like moments; the embedding
    # is quantized too (the Trainer overrides bitsandbytes only); the compiled update is modelled
    # as allocating nothing.
    ("adamw_torch_8bit", 8 * (MIX + BIAS) + torchao(EMBED, 8) + torchao(FC, 8), 0, 0),
    ("adamw_torch_4bit", 8 * (MIX + BIAS) + torchao(EMBED, 4) + torchao(FC, 4), 0, 0),
])
def test_state_and_step_temporaries_of_every_optimizer(name, state, temporaries, outside):
    measured = measure(name)
    assert (measured.state_bytes, measured.temporary_bytes) == (state, temporaries)
    assert outside_allocator_bytes(measured.model, name) == outside
    if isinstance(measured.optimizer, BnbAdamWState):
        assert measured.optimizer.paged_bytes == outside  # the emulation made what it reports


def test_fused_adamw_has_no_parameter_sized_temporary_and_foreach_does():
    # The claim: at the optimizer step's peak, foreach holds 4 B a parameter more.
    fused, foreach = measure("adamw_torch_fused"), measure("adamw_torch")
    assert fused.state_bytes == foreach.state_bytes
    assert foreach.temporary_bytes - fused.temporary_bytes == 4 * N == 1_606_400


def test_the_trainer_keeps_embeddings_at_32_bits_and_plain_8bit_adamw_does_not():
    with FakeTensorMode():
        model = Small(torch.float32)
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
        trainer = make_optimizer(model, "adamw_bnb_8bit", ESTIMATE_PARTS)
        plain = BnbAdamWState(list(model.parameters()), optim_bits=8)
        trainer.step()
        plain.step()
    assert trainer.state[model.embed.weight]["state1"].dtype == torch.float32
    assert plain.state[model.embed.weight]["state1"].dtype == torch.uint8
    assert plain.state[model.embed.weight]["absmax1"].shape == (EMBED // 256,)
    assert plain.state[model.fc.bias]["state1"].dtype == torch.float32  # under min_8bit_size


def test_a_paged_emulation_needs_to_know_where_unified_memory_is_made():
    with pytest.raises(TypeError, match="outside_allocator"):
        BnbAdamWState([nn.Parameter(torch.zeros(4))], optim_bits=8, is_paged=True)


def test_outside_allocator_bytes_of_bare_parameters_knows_no_embeddings():
    model = Small(torch.float32)
    params = list(model.parameters())
    assert outside_allocator_bytes(params, "paged_adamw_8bit") == 2 * EMBED + 2 * FC  # both 8-bit
    assert outside_allocator_bytes(params, "paged_adamw_32bit") == PAGED_32BIT
    assert outside_allocator_bytes(model, "adamw_bnb_8bit") == outside_allocator_bytes(model, "sgd") == 0


# -- memory, bfloat16 weights ---------------------------------------------------------------------


@pytest.mark.parametrize(("name", "state", "temporaries"), [
    # torch AdamW's moments take the parameters' dtype: 2 x 2 B a parameter.
    ("adamw_torch_fused", 2 * BF16 * N + STEP_TENSORS, 0),
    ("adamw_torch", 2 * BF16 * N + STEP_TENSORS, BF16 * N),
    # Adafactor keeps float32 state and works on float32 copies of the gradient and the weight:
    # at fc.weight, those two, grad**2 and grad**2 + eps, and the embedding's last update.
    ("adafactor", ADAFACTOR_STATE, 4 * 4 * FC + 4 * EMBED),
    # bitsandbytes' state dtypes are its own (uint8 or float32), whatever the weights'.
    ("adamw_bnb_8bit", BNB_8BIT_STATE, 0),
    ("paged_adamw_32bit", 8 * MIX + 8 * BIAS, 0),
    # torchao's unquantized moments are zeros_like(p): the weights' dtype.
    ("adamw_torch_8bit", 2 * BF16 * (MIX + BIAS) + torchao(EMBED, 8) + torchao(FC, 8), 0),
])
def test_state_with_bfloat16_weights(name, state, temporaries):
    measured = measure(name, torch.bfloat16)
    assert (measured.state_bytes, measured.temporary_bytes) == (state, temporaries)


# -- the tracker's outside_allocator --------------------------------------------------------------


def test_storages_made_outside_the_allocator_are_never_tracked():
    with FakeTensorMode(), StorageTracker() as tracker:
        with outside_allocator():
            paged = torch.zeros(1000)  # 4,000 B of managed memory
        paged.add_(1)  # seen again outside the context: still not the allocator's
        copy = paged + 1  # a new storage is
        del paged, copy
    assert [n for _, n in tracker.events] == [4000, -1]


# -- in the estimator -----------------------------------------------------------------------------


@pytest.mark.slow
def test_every_optimizer_runs_in_the_estimators_probe():
    backend = EstimateBackend(resolve_gpu("A100-80GB"))
    peaks = {}
    for name in OPTIMIZERS:
        workload = Workload(resolve_model("tiny-bert"), "sequence-classification", None, optimizer=name)
        if name == "adam_mini":  # as Adam-mini itself, it fails on BERT's embeddings.LayerNorm.weight
            with pytest.raises(InvalidInput, match="Adam-mini 1.1.1 fails on bert.embeddings.layernorm"):
                with backend.cell(workload, parse_mode("fp32"), 16, 10**12) as cell:
                    cell.fits(1)
            continue
        with backend.cell(workload, parse_mode("fp32"), 16, 10**12) as cell:
            probe = cell.fits(1)
        assert probe.outcome == "fits", name
        peaks[name] = probe.details["peak_allocated_bytes"]
    # At batch 1 the step's peak is the optimizer's: foreach's temporary is gone with fused, and
    # paging moves the large moments out of the allocator.
    assert peaks["adamw_torch_fused"] < peaks["adamw_torch"]
    assert peaks["paged_adamw_32bit"] < peaks["adamw_torch_fused"]
    assert peaks["sgd"] < peaks["adamw_bnb_8bit"] < peaks["adamw_torch_fused"]
