"""The 8-bit AdamW levers measured with bitsandbytes: what can be tested on a CPU, and the GPU test.

On a CPU, with a fake ``bitsandbytes`` in sys.modules (an optimizer that records how it was built,
a GlobalOptimManager that records the overrides): the optimizers the worker builds for both setups
(bnb.py), the worker's probes with them, when explain measures instead of emulating (bnb.real_8bit)
and what a lever says when the measurement works, fails or cannot run (a fake backend stands in for
the cuda one), and the errors without bitsandbytes. With CUDA and bitsandbytes: real cells.
"""

from __future__ import annotations

import contextlib
import importlib.machinery
import os
import re
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import torch
from cpumemory import CpuMemory
from torch import nn

from autotune.analysis.explain import explain
from autotune.analysis.levers import EMULATED_8BIT, Real8bit, eight_bit_lever, real_8bit
from autotune.backends.cuda import backend as cuda_backend
from autotune.backends.cuda import bnb, device
from autotune.backends.cuda.backend import CudaBackend
from autotune.backends.cuda.bnb import BNB_OPTIMIZERS, bitsandbytes_available, make_bnb_optimizer
from autotune.backends.cuda.device import cuda_available, local_gpu
from autotune.backends.cuda.probe_worker import Worker
from autotune.backends.cuda.protocol import PROTOCOL, CellSpec, cell_spec, decode, encode
from autotune.backends.estimate.backend import EstimateBackend
from autotune.backends.estimate.instrument import Variant
from autotune.errors import BackendUnavailable, InvalidInput
from autotune.gpus import GpuSpec, custom_gpu, resolve_gpu
from autotune.search import Probe, ProbeOnlyCell
from autotune.units import GIB, MIB
from autotune.workload import Workload
from autotune.workload.models import resolve_model
from autotune.workload.modes import parse_mode
from autotune.workload.step import build_model

TESTS = Path(__file__).resolve().parents[3]  # tests/, where cpumemory.py is
FP32 = parse_mode("fp32")
LOCAL = GpuSpec("Fake H100", 80 * GIB, 640 * MIB, (9, 0))  # the local device of a measured run
TRAINER_NOTE = "the Trainer keeps 32-bit state for every nn.Embedding weight"
needs_cuda_and_bnb = pytest.mark.skipif(
    not (cuda_available() and bitsandbytes_available()), reason="needs a CUDA GPU and bitsandbytes"
)


def tiny_bert() -> Workload:
    return Workload(resolve_model("tiny-bert"), "sequence-classification", None)


def fake_bitsandbytes() -> types.ModuleType:
    """A ``bitsandbytes`` with the names bnb.py uses; ``built`` and ``overrides`` record the calls."""
    module = types.ModuleType("bitsandbytes")
    module.__spec__ = importlib.machinery.ModuleSpec("bitsandbytes", None)  # what find_spec returns
    built: list[Any] = []
    overrides: list[tuple[Any, str, dict[str, Any]]] = []

    class FakeOptimizer(torch.optim.Optimizer):
        def __init__(self, params: Any, lr: float = 1e-3, **kwargs: Any) -> None:
            super().__init__(params, {"lr": lr})
            self.lr, self.kwargs, self.steps = lr, kwargs, 0
            built.append(self)

        @torch.no_grad()
        def step(self, closure: Any = None) -> None:  # type: ignore[override]
            self.steps += 1

    class AdamW8bit(FakeOptimizer):
        pass

    class AdamW(FakeOptimizer):
        pass

    class GlobalOptimManager:
        _instance: GlobalOptimManager | None = None

        @classmethod
        def get_instance(cls) -> GlobalOptimManager:
            cls._instance = cls._instance or cls()
            return cls._instance

        def register_module_override(self, module: Any, param_name: str, config: dict[str, Any]) -> None:
            overrides.append((module, param_name, config))

    module.optim = types.SimpleNamespace(AdamW8bit=AdamW8bit, AdamW=AdamW,  # type: ignore[attr-defined]
                                         GlobalOptimManager=GlobalOptimManager)
    module.built, module.overrides = built, overrides  # type: ignore[attr-defined]
    return module


@pytest.fixture
def fake_bnb(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    module = fake_bitsandbytes()
    monkeypatch.setitem(sys.modules, "bitsandbytes", module)
    return module


@pytest.fixture
def no_bnb(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)  # import raises ImportError, find_spec None


# -- the optimizers the worker builds ----------------------------------------------------------------


def test_adamw_8bit_is_bitsandbytes_adamw8bit_over_every_trainable_parameter(fake_bnb):
    model, _ = build_model(tiny_bert().model, "sequence-classification", None)
    model.classifier.bias.requires_grad_(False)
    optimizer = make_bnb_optimizer(model, "adamw-8bit")
    assert type(optimizer).__name__ == "AdamW8bit" and fake_bnb.built == [optimizer]
    assert optimizer.param_groups[0]["params"] == [p for p in model.parameters() if p.requires_grad]
    assert all(p is not model.classifier.bias for p in optimizer.param_groups[0]["params"])
    assert (optimizer.lr, optimizer.kwargs) == (5e-5, {})
    assert fake_bnb.overrides == []  # every parameter at 8 bits (from min_8bit_size on)


def test_the_trainer_setup_is_8_bit_adamw_with_32_bit_embeddings(fake_bnb):
    # transformers' _get_bitsandbytes_optimizer and create_optimizer: bnb.optim.AdamW with
    # optim_bits=8, is_paged=False, then an override per nn.Embedding module.
    model, _ = build_model(tiny_bert().model, "sequence-classification", None)
    optimizer = make_bnb_optimizer(model, "adamw-8bit-trainer")
    assert type(optimizer).__name__ == "AdamW" and fake_bnb.built == [optimizer]
    assert optimizer.kwargs == {"optim_bits": 8, "is_paged": False} and optimizer.lr == 5e-5
    assert optimizer.param_groups[0]["params"] == list(model.parameters())
    embeddings = [m for m in model.modules() if isinstance(m, nn.Embedding)]
    assert [name for name, m in model.named_modules() if isinstance(m, nn.Embedding)] == [
        "bert.embeddings.word_embeddings", "bert.embeddings.position_embeddings",
        "bert.embeddings.token_type_embeddings",
    ]
    assert len(fake_bnb.overrides) == 3
    for (module, param_name, config), embedding in zip(fake_bnb.overrides, embeddings, strict=True):
        assert module is embedding and (param_name, config) == ("weight", {"optim_bits": 32})


def test_an_unknown_setup_is_refused_with_the_allowed_ones(fake_bnb):
    with pytest.raises(InvalidInput, match="unknown bitsandbytes optimizer 'adam-4bit': allowed are "
                                           "adamw-8bit, adamw-8bit-trainer"):
        CudaBackend(LOCAL, bnb_optimizer="adam-4bit")
    assert fake_bnb.built == []


# -- the worker runs its probes with it ---------------------------------------------------------------


def init_request(bnb_optimizer: str | None) -> dict[str, Any]:
    spec = cell_spec(tiny_bert(), FP32, 16, GIB, bnb_optimizer=bnb_optimizer)
    return {"op": "init", "protocol": PROTOCOL, "cell": spec.to_json()}


def test_the_cell_spec_carries_the_bnb_setup_through_the_protocol():
    line = encode(init_request("adamw-8bit-trainer"))
    assert CellSpec.from_json(decode(line)["cell"]).bnb_optimizer == "adamw-8bit-trainer"
    assert cell_spec(tiny_bert(), FP32, 16, GIB).bnb_optimizer is None  # the table's cells


def test_the_worker_runs_every_step_of_a_probe_with_a_new_bnb_optimizer(fake_bnb):
    worker = Worker(CpuMemory())
    assert worker.handle(init_request("adamw-8bit-trainer"))["op"] == "ready"
    first, second = (worker.handle({"op": "probe", "batch_size": 2}) for _ in range(2))
    assert first["outcome"] == second["outcome"] == "fits" and second["clean"] is True
    assert [type(o).__name__ for o in fake_bnb.built] == ["AdamW", "AdamW"]
    assert [o.steps for o in fake_bnb.built] == [2, 2]  # Workload.steps, through run_steps
    assert len(fake_bnb.overrides) == 6  # registered again with each optimizer, as the Trainer does


def test_a_worker_without_bitsandbytes_refuses_the_cell_before_taking_the_device(no_bnb):
    memory = CpuMemory()
    reply = Worker(memory).handle(init_request("adamw-8bit"))
    assert (reply["op"], reply["error_type"]) == ("failed", "BackendUnavailable")
    assert reply["error"].startswith("the 8-bit AdamW probe needs bitsandbytes, which is not installed")
    assert not memory.opened


# -- without bitsandbytes ---------------------------------------------------------------------------


def test_without_bitsandbytes_the_backend_and_the_builder_say_what_to_install(no_bnb):
    assert not bitsandbytes_available()
    with pytest.raises(BackendUnavailable) as raised:
        CudaBackend(LOCAL, bnb_optimizer="adamw-8bit")
    assert str(raised.value) == (
        "the 8-bit AdamW probe needs bitsandbytes, which is not installed: pip install bitsandbytes "
        "(it needs a CUDA GPU), or let explain emulate its state sizes"
    )
    with pytest.raises(BackendUnavailable, match=r"^the 8-bit AdamW probe needs bitsandbytes, which cannot "
                                                 r"be imported here \(.*\): pip install bitsandbytes"):
        make_bnb_optimizer(nn.Linear(2, 2), "adamw-8bit")


@pytest.mark.slow
def test_a_worker_process_without_bitsandbytes_is_backend_unavailable_in_the_parent(fake_bnb):
    # The parent has (a fake) bitsandbytes, the worker process none: its refusal crosses the protocol.
    script = (f"import sys; sys.path.insert(0, {str(TESTS)!r}); sys.modules['bitsandbytes'] = None; "
              "import cpumemory, autotune.backends.cuda.probe_worker as w; "
              "sys.exit(w.main(cpumemory.CpuMemory))")
    backend = CudaBackend(LOCAL, timeout_s=120, worker_command=[sys.executable, "-c", script],
                          bnb_optimizer="adamw-8bit")
    with pytest.raises(BackendUnavailable, match="needs bitsandbytes, which is not installed"):
        with backend.cell(tiny_bert(), FP32, 16, GIB):
            pass


def test_importing_autotune_does_not_import_bitsandbytes(tmp_path):
    # A bitsandbytes whose import fails loudly: finding it must not import it.
    (tmp_path / "bitsandbytes").mkdir()
    (tmp_path / "bitsandbytes" / "__init__.py").write_text("raise SystemExit('bitsandbytes was imported')\n")
    script = ("import sys, autotune.analysis.explain, autotune.analysis.levers, "
              "autotune.backends.cuda.backend, autotune.backends.cuda.probe_worker; "
              "import autotune.backends.cuda.bnb as bnb; "
              "assert bnb.bitsandbytes_available(); "
              "print('bitsandbytes' in sys.modules)")
    path = os.pathsep.join([str(TESTS.parent), str(tmp_path)])
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          cwd=TESTS.parent, env={**os.environ, "PYTHONPATH": path})
    assert (done.returncode, done.stdout.strip()) == (0, "False"), done.stderr


# -- measured or emulated -----------------------------------------------------------------------------


@pytest.mark.parametrize(("has_cuda", "has_bnb"),
                         [(False, False), (True, False), (False, True), (True, True)])
def test_the_8bit_levers_are_measured_only_with_both_cuda_and_bitsandbytes(monkeypatch, has_cuda, has_bnb):
    monkeypatch.setattr(device, "cuda_available", lambda: has_cuda)
    monkeypatch.setattr(bnb, "bitsandbytes_available", lambda: has_bnb)
    monkeypatch.setattr(device, "local_gpu", lambda: LOCAL)
    target = custom_gpu(16 * GIB)
    real = real_8bit(target)
    if not (has_cuda and has_bnb):
        assert real is None
        return
    assert real is not None and real.gpu == LOCAL
    backend = real.backend("adamw-8bit-trainer")  # no worker starts before a cell
    assert isinstance(backend, CudaBackend) and backend.workers_started == 0
    assert (backend.gpu, backend.bnb_optimizer) == (target, "adamw-8bit-trainer")


class FakeBackend:
    """The cuda backend with a bitsandbytes optimizer, as a memory curve: batches up to ``limit`` fit."""

    name = "cuda"

    def __init__(self, limit: int, error: str | None = None) -> None:
        self.limit, self.error = limit, error
        self.cells: list[tuple[Workload, str, int, int]] = []
        self.gpu = resolve_gpu("A100-80GB")  # the card its answers are for (Backend.gpu)

    @contextlib.contextmanager
    def cell(self, workload: Workload, mode: Any, seq_len: int, budget_bytes: int) -> Any:
        self.cells.append((workload, mode.name, seq_len, budget_bytes))

        def fits(batch: int) -> Probe:
            if self.error is not None:
                return Probe(batch, "error", error=self.error)
            return Probe(batch, "fits" if batch <= self.limit else "oom",
                         peak_bytes=int(budget_bytes * batch / (self.limit + 0.5)))

        yield ProbeOnlyCell(fits)


def lever(real: Real8bit | None, name: str = "adamw-8bit-trainer", budget: int = 900 * MIB,
          backend: Any = None) -> Any:
    variant = Variant(optimizer="adamw-8bit", fp32_state_for_embeddings=name == "adamw-8bit-trainer")
    return eight_bit_lever(name, "label", variant, backend=backend, workload=tiny_bert(), mode=FP32,
                           seq_len=32, budget=budget, max_batch=4096, real=real, note=TRAINER_NOTE)


def test_a_measured_lever_is_the_bnb_backends_max_batch_at_the_same_budget():
    made: dict[str, FakeBackend] = {}

    def make(name: str) -> FakeBackend:
        made[name] = FakeBackend(limit=37)
        return made[name]

    result = lever(Real8bit(make, LOCAL), "adamw-8bit", backend=object())  # the estimator is not used
    assert (result.max_batch_size, result.capped, result.error) == (37, False, None)
    assert result.estimated == "measured: bitsandbytes AdamW8bit on Fake H100"
    assert result.note == TRAINER_NOTE and (result.mode, result.seq_len) == ("fp32", 32)
    assert list(made) == ["adamw-8bit"]
    assert {cell[1:] for cell in made["adamw-8bit"].cells} == {("fp32", 32, 900 * MIB)}
    trainer = lever(Real8bit(lambda name: FakeBackend(limit=5), LOCAL), backend=object())
    assert trainer.estimated == "measured: bitsandbytes AdamW(optim_bits=8) on Fake H100"


@pytest.fixture(scope="module")
def emulated() -> tuple[EstimateBackend, Any]:
    backend = EstimateBackend(custom_gpu(GIB))
    return backend, lever(None, backend=backend)


def test_without_a_real_backend_the_lever_is_emulated_as_before(emulated):
    _, result = emulated
    assert result.estimated == EMULATED_8BIT and result.note == TRAINER_NOTE
    assert result.max_batch_size is not None and result.max_batch_size > 0


class Unavailable(FakeBackend):
    def cell(self, *args: Any) -> Any:
        raise BackendUnavailable("the budget of 900.0 MiB does not fit in the GPU's free memory")


@pytest.mark.parametrize(("real_backend", "why"), [
    (FakeBackend(limit=37, error="CUDA error: an illegal memory access was encountered"),
     r"the measurement failed: probe at batch size \d+ failed: CUDA error: an illegal memory access"),
    (Unavailable(limit=37),
     "the measurement failed: the budget of 900.0 MiB does not fit in the GPU's free memory"),
])
def test_a_failed_measurement_falls_back_to_the_emulation_and_says_why(emulated, real_backend, why):
    backend, reference = emulated
    result = lever(Real8bit(lambda name: real_backend, LOCAL), backend=backend)
    assert (result.max_batch_size, result.estimated) == (reference.max_batch_size, EMULATED_8BIT)
    assert result.note is not None
    assert result.note.startswith(f"{TRAINER_NOTE}; not measured (")
    assert result.note.endswith("): emulated instead")
    assert re.search(why, result.note), result.note


def test_a_budget_beyond_the_local_gpu_is_emulated_without_starting_a_worker(emulated):
    backend, reference = emulated

    def make(name: str) -> Any:
        raise AssertionError("no backend should be made for a budget the local GPU cannot hold")

    small = GpuSpec("Fake T4", 512 * MIB, 300 * MIB, (7, 5))
    result = lever(Real8bit(make, small), backend=backend)
    assert (result.max_batch_size, result.estimated) == (reference.max_batch_size, EMULATED_8BIT)
    assert result.note == (f"{TRAINER_NOTE}; not measured (the budget of 900 MiB exceeds the local "
                           "Fake T4's 512 MiB): emulated instead")


@pytest.mark.slow
def test_explain_measures_both_8bit_levers_where_cuda_and_bitsandbytes_exist(monkeypatch):
    made: list[tuple[GpuSpec, str, FakeBackend]] = []

    def fake_cuda_backend(gpu: GpuSpec, *, bnb_optimizer: str) -> FakeBackend:
        limit = {"adamw-8bit": 300, "adamw-8bit-trainer": 200}[bnb_optimizer]
        made.append((gpu, bnb_optimizer, FakeBackend(limit=limit)))
        return made[-1][2]

    monkeypatch.setattr(device, "cuda_available", lambda: True)
    monkeypatch.setattr(bnb, "bitsandbytes_available", lambda: True)
    monkeypatch.setattr(device, "local_gpu", lambda: LOCAL)
    monkeypatch.setattr(cuda_backend, "CudaBackend", fake_cuda_backend)
    # 640 MiB, a budget of 88 MiB past the context: the emulated levers' max batches near 150 to 300,
    # each search settled over a tenth of that (on 1 GiB ten times as many replays; issue 39).
    gpu = custom_gpu(640 * MIB)
    result = explain(tiny_bert(), EstimateBackend(gpu), gpu, seq_len=64, mode=FP32, margin=0.05)
    levers = {lever.name: lever for lever in result.levers}
    assert (levers["adamw-8bit"].max_batch_size, levers["adamw-8bit-trainer"].max_batch_size) == (300, 200)
    assert levers["adamw-8bit"].estimated == "measured: bitsandbytes AdamW8bit on Fake H100"
    assert levers["adamw-8bit-trainer"].note == TRAINER_NOTE
    assert [(g, name) for g, name, _ in made] == [(gpu, "adamw-8bit"), (gpu, "adamw-8bit-trainer")]
    for _, _, fake in made:
        assert {cell[1:] for cell in fake.cells} == {("fp32", 64, result.budget_bytes)}
    assert levers["frozen-embeddings"].estimated == "the table's step with the embeddings frozen"
    assert levers["sgd"].estimated == "as the table"


# -- on a real GPU with bitsandbytes --------------------------------------------------------------


@pytest.mark.cuda
@needs_cuda_and_bnb
@pytest.mark.parametrize("setup", list(BNB_OPTIMIZERS))
def test_bitsandbytes_optimizers_run_the_step_on_the_gpu(setup):
    backend = CudaBackend(local_gpu(), bnb_optimizer=setup)
    with backend.cell(tiny_bert(), FP32, 16, GIB) as cell:
        probes = [cell.fits(2), cell.fits(4)]
    assert [p.outcome for p in probes] == ["fits", "fits"], [p.error for p in probes]
    assert all(p.peak_bytes and "worker_replaced" not in p.details for p in probes)
    assert backend.workers_started == 1  # the optimizer's state went with it: every reset clean


@pytest.mark.cuda
@needs_cuda_and_bnb
@pytest.mark.parametrize("method", ["lora", "qlora", "lora_8bit"])
def test_lora_and_qlora_run_the_step_on_the_gpu(method):
    """PEFT over bitsandbytes' real Linear4bit (qlora) and Linear8bitLt (lora_8bit): two probes in
    one worker, and the estimate of the same cells beside them."""
    from autotune.backends.estimate.backend import EstimateBackend
    from autotune.workload.adapters import make_adapter

    workload = Workload(resolve_model("tiny-llama"), "causal-lm", None, adapter=make_adapter(method))
    mode = parse_mode("bf16+ckpt")
    backend = CudaBackend(local_gpu())
    with backend.cell(workload, mode, 64, GIB) as cell:
        probes = [cell.fits(2), cell.fits(4)]
    assert [p.outcome for p in probes] == ["fits", "fits"], [p.error for p in probes]
    estimate = EstimateBackend(local_gpu())
    with estimate.cell(workload, mode, 64, GIB) as cell:
        estimated = [cell.fits(2), cell.fits(4)]
    print(method, [(p.peak_bytes, e.peak_bytes) for p, e in zip(probes, estimated, strict=True)])
