"""LLaMA-Factory's Muon and Adam-mini (workload/lf_optimizers.py): their state against each source's rule,
parameter by parameter, on a tiny Qwen2; their step on the estimator; the keys that choose them."""

from __future__ import annotations

import pytest
import torch

from autotune.backends.estimate.backend import EstimateBackend
from autotune.errors import UnmodelledSetting
from autotune.gpus import resolve_gpu
from autotune.request import CheckRequest, Step, Target, resolve
from autotune.workload import Workload
from autotune.workload.lf_optimizers import make_lf_optimizer
from autotune.workload.models import resolve_model
from autotune.workload.modes import parse_mode
from autotune.workload.optimizers import describe_optimizer, optimizer_label
from autotune.workload.step import build_model, make_batch


def _stepped(name: str, dtype: torch.dtype) -> tuple[torch.nn.Module, object]:
    torch.manual_seed(0)
    model, _ = build_model(resolve_model("tiny-qwen2"), "causal-lm", "eager")
    model.to(dtype)
    optimizer = make_lf_optimizer(model, name)
    batch = make_batch(model.config, "causal-lm", 2, 8)
    model(**batch).loss.backward()
    optimizer.step()
    return model, optimizer


def _state_bytes(optimizer: object, p: torch.Tensor) -> int:
    state = optimizer.state[p]  # type: ignore[attr-defined]
    return sum(t.numel() * t.element_size() for t in state.values() if torch.is_tensor(t))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_muon_keeps_one_buffer_for_2d_weights_and_adamws_two_for_the_rest(dtype):
    # muon.py Muon.step: momentum_buffer = zeros_like(g) for the Muon parameters; moment1, moment2 =
    # zeros_like(g) for AdamW's. _create_muon_optimizer: Muon takes the 2-D ones without "embed" or
    # "lm_head" in their name.
    model, optimizer = _stepped("llamafactory_muon", dtype)
    size = torch.tensor([], dtype=dtype).element_size()
    for name, p in model.named_parameters():
        muon = p.ndim == 2 and "embed" not in name and "lm_head" not in name
        assert _state_bytes(optimizer, p) == (1 if muon else 2) * p.numel() * size, name
    assert any(p.ndim == 2 and "proj" in n for n, p in model.named_parameters())  # some are Muon's


def test_adam_mini_keeps_one_second_moment_per_block():
    # adam_mini.py Adam_mini.step: m like the parameter everywhere; vmean per head (q_proj, k_proj:
    # head_numel = hidden**2 / heads elements a block), per output row (embed, lm_head, v, o, mlp), one
    # value (norms); biases Adam's v like themselves.
    model, optimizer = _stepped("adam_mini", torch.float32)
    config = model.config
    head_numel = config.hidden_size**2 // config.num_attention_heads
    for name, p in model.named_parameters():
        if "bias" in name:
            second = p.numel()
        elif "q_proj" in name or "k_proj" in name:
            second = p.numel() // head_numel
        elif any(n in name for n in ("embed", "lm_head", "v_proj", "o_proj", "mlp")):
            second = p.shape[0]
        else:
            second = 1
        assert _state_bytes(optimizer, p) == 4 * (p.numel() + second), name


@pytest.mark.parametrize("name", ["llamafactory_muon", "adam_mini"])
def test_the_lf_optimizers_run_in_the_estimators_probe_below_adamws_state(name):
    # tiny-qwen2's parameters are mostly 2-D weights: Muon keeps one buffer where AdamW keeps two,
    # Adam-mini one moment and per-block scalars. At batch 1 the step's peak is the optimizer's.
    backend = EstimateBackend(resolve_gpu("A100-80GB"))
    peaks = {}
    for optimizer in ("adamw_torch_fused", name):
        workload = Workload(resolve_model("tiny-qwen2"), "causal-lm", None, optimizer=optimizer)
        with backend.cell(workload, parse_mode("fp32"), 16, 10**12) as cell:
            probe = cell.fits(1)
        assert probe.outcome == "fits"
        peaks[optimizer] = probe.details["peak_allocated_bytes"]
    assert peaks[name] < peaks["adamw_torch_fused"]


def test_the_names_say_whose_they_are():
    assert optimizer_label("llamafactory_muon") == "Muon" and optimizer_label("adam_mini") == "Adam-mini"
    assert "use_muon" in describe_optimizer("llamafactory_muon")
    assert "use_adam_mini" in describe_optimizer("adam_mini")


def test_more_than_one_gpu_is_refused():
    request = CheckRequest(Step("tiny-qwen2", optimizer="adam_mini", gpus=2), Target(backend="estimate"),
                           seq_len=16, batch_size=1)
    with pytest.raises(UnmodelledSetting, match="adam_mini .* over more than one GPU is not modelled"):
        resolve(request)
