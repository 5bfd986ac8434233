"""Activation offloading: TRL's OffloadActivations as ported (workload/offload.py), the estimator's step
under it, and the configs that turn it on (TRL's activation_offloading, Axolotl's).

TRL is not installed here: the port is checked against the rules of trl/models/activation_offloading.py
on real CPU tensors (what it offloads, keeps and stashes; the gradients it gives back are the step's
own), and the estimator's trace under it against the sizes those rules give.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from configread import view, write
from torch import nn

from autotune.backends.estimate.backend import EstimateBackend
from autotune.configs import read_training_config
from autotune.errors import InvalidInput
from autotune.gpus import custom_gpu
from autotune.tuner import search_cell
from autotune.units import GIB
from autotune.workload import Workload
from autotune.workload.models import resolve_model
from autotune.workload.modes import parse_mode
from autotune.workload.offload import MAX_FWD_STASH, MIN_OFFLOAD_BYTES, Offloader


def host_copy(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().to("cpu", copy=True)


class Head(nn.Module):
    """Eight square layers, then the output head the offloader keeps on the GPU."""

    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(8))
        self.lm_head = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.tanh(layer(x))  # tanh saves its output: one offloaded tensor per layer
        return self.lm_head(x)


def test_the_gradients_under_the_offloader_are_the_step_s_own():
    torch.manual_seed(0)
    model, x = Head(), torch.randn(16, 32)
    model(x).square().sum().backward()
    expected = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    offloader = Offloader(model, host_copy)
    with offloader:
        model(x).square().sum().backward()
    offloader.close()
    assert all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), expected, strict=True))
    assert offloader.tracker == {} and offloader.fwd_stash == {} and offloader.bwd_stash == {}


def test_what_is_offloaded_kept_and_stashed():
    model, x = Head(), torch.randn(16, 32)  # 16 x 32 float32: 2 KiB, above the 1 KiB minimum
    offloader = Offloader(model, host_copy)
    with offloader:
        out = model(x)
        offloaded = [i for i, (_, layout) in offloader.tracker.items() if layout is not None]
        kept = [t for t, layout in offloader.tracker.values() if layout is None]
        # the head's saved input stays on the GPU (NoOpManager); parameters are never offloaded
        assert not any(isinstance(t, nn.Parameter) for t, layout in offloader.tracker.values() if layout)
        assert all(isinstance(t, nn.Parameter) or t.numel() * t.element_size() >= MIN_OFFLOAD_BYTES
                   for t in kept)
        # x, the first layer's input, and each tanh's output, which the next layer saves again (the
        # same storage: offloaded once, the second save kept as it is): 9 offloaded, the newest
        # MAX_FWD_STASH on the GPU still; the head's input, the last tanh's, saved under its NoOp
        # kept: the weights the 7 later layers save (x needs no gradient: the first saves none) and
        # the 7 repeated saves
        assert len(offloaded) == 9 and len(kept) == 7 + 7
        assert list(offloader.fwd_stash) == [i for i in offloaded if i > offloaded[-1] - MAX_FWD_STASH]
        assert len(offloader.fwd_stash) == 2
        assert offloader.host_peak_bytes == 9 * 16 * 32 * 4
        out.sum().backward()
    offloader.close()


def test_without_streams_nothing_is_stashed_and_a_storage_saved_twice_is_copied_twice():
    # Axolotl's activation_offloading: legacy (use_streams=False): pack keeps no GPU tensor and tracks
    # no storage ("single-stream has no release point"): the 7 repeated saves of a tanh's output go
    # over again; the gradients are still the step's own
    torch.manual_seed(0)
    model, x = Head(), torch.randn(16, 32)
    model(x).square().sum().backward()
    expected = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    offloader = Offloader(model, host_copy, streams=False)
    with offloader:
        out = model(x)
        offloaded = [i for i, (_, layout) in offloader.tracker.items() if layout is not None]
        assert len(offloaded) == 9 + 7 and offloader.fwd_stash == {}
        assert offloader.host_peak_bytes == 16 * 16 * 32 * 4
        out.square().sum().backward()
    offloader.close()
    assert all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), expected, strict=True))
    assert offloader.tracker == {} and offloader.bwd_stash == {} and offloader.host_bytes == 0


def test_a_tensor_under_a_kibibyte_stays_where_it_is():
    model, x = Head(width=8), torch.randn(4, 8)  # 128 bytes an activation
    offloader = Offloader(model, host_copy)
    with offloader:
        model(x).sum().backward()
    offloader.close()
    assert offloader.host_peak_bytes == 0


def tiny() -> Workload:
    return Workload(resolve_model("tiny-llama"), "causal-lm", None)


def test_offloading_lowers_the_traced_step_and_is_said(capsys):
    from autotune.cli import main

    gpu = custom_gpu(2 * GIB)
    budget = int(1.4 * GIB)
    mode = parse_mode("bf16")
    plain = search_cell(EstimateBackend(gpu), tiny(), mode, 128, budget).max_batch_size
    offloaded_workload = Workload(resolve_model("tiny-llama"), "causal-lm", None, offload_activations=True)
    offloaded = search_cell(EstimateBackend(gpu), offloaded_workload, mode, 128, budget).max_batch_size
    assert offloaded > 1.5 * plain  # every saved activation but the newest five and the head's goes
    main(["explain", "tiny-llama", "--seq-len", "128", "--mode", "bf16", "--offload-activations",
          "--gpu-memory", "2GiB", "--no-levers", "--batch-size", "64"])
    text = capsys.readouterr().out
    assert "TRL's OffloadActivations (emulated: streams, 5 activations stashed, none under 1 KiB): saved " \
           "activations in pinned host memory, at most" in text


def test_legacy_offloading_is_traced_on_one_stream_and_said(capsys):
    from autotune.cli import main

    args = ["explain", "tiny-llama", "--seq-len", "128", "--mode", "bf16", "--offload-activations",
            "--gpu-memory", "2GiB", "--no-levers", "--batch-size", "64"]
    main([*args, "--no-offload-streams"])
    text = capsys.readouterr().out
    assert "TRL's OffloadActivations without streams (emulated: nothing stashed, none under 1 KiB): saved " \
           "activations in pinned host memory, at most" in text
    with pytest.raises(Exception, match="without streams .* estimate backend only"):
        from autotune.backends.cuda.backend import CudaBackend
        from autotune.gpus import resolve_gpu

        workload = Workload(resolve_model("tiny-llama"), "causal-lm", None, offload_activations=True,
                            offload_streams=False)
        with CudaBackend(resolve_gpu("H100-80GB")).cell(workload, parse_mode("bf16"), 64, GIB):
            pass


# -- configs ----------------------------------------------------------------------------------------

AXOLOTL = {"base_model": "meta-llama/Llama-3.2-1B", "sequence_len": 2048, "micro_batch_size": 1,
           "bf16": True, "attn_implementation": "flash_attention_2", "gradient_checkpointing": True,
           "optimizer": "adamw_torch", "learning_rate": 2e-5, "activation_offloading": True,
           "datasets": [{"path": "tatsu-lab/alpaca", "type": "alpaca"}]}
LORA = {"adapter": "lora", "lora_r": 8, "lora_alpha": 16, "lora_target_linear": True,
        "lora_mlp_kernel": False, "lora_qkv_kernel": False, "lora_o_kernel": False}


def read(tmp_path: Path, data: dict, name: str = "axolotl.yml"):
    return view(read_training_config(write(tmp_path, data, name)))


def test_axolotl_s_offloading_checkpoints_a_full_fine_tune_through_torch_s_wrapper(tmp_path):
    found = read(tmp_path, AXOLOTL)
    assert found.offload_activations is True and found.mode.checkpointing
    assert found.ckpt_reentrant is None  # checkpoint_wrapper: non-reentrant
    assert any("ac_wrap_hf_model" in note for note in found.notes)


def test_axolotl_s_offloading_with_lora_checkpoints_through_its_loader_reentrant(tmp_path):
    found = read(tmp_path, AXOLOTL | LORA)
    assert found.offload_activations is True and found.mode.checkpointing
    assert found.ckpt_reentrant is True  # normalize_config's {use_reentrant: True}


def test_axolotl_s_gradient_checkpointing_offload_is_activation_offloading(tmp_path):
    found = read(tmp_path, {**AXOLOTL, "activation_offloading": None, "gradient_checkpointing": "offload"})
    assert found.offload_activations is True
    assert any("check_gradient_checkpointing_w_offload" in note for note in found.notes)


def test_axolotl_s_legacy_offloading_of_a_full_fine_tune_runs_without_streams(tmp_path):
    # ActivationOffloadingMixin: use_streams = activation_offloading != "legacy"; the layers are
    # checkpointed by ac_wrap_hf_model as with true
    found = read(tmp_path, {**AXOLOTL, "activation_offloading": "legacy"})
    assert (found.offload_activations, found.offload_streams) == (True, False)
    assert any("activation_offloading: legacy: TRL's OffloadActivations without streams" in note
               for note in found.notes)
    assert read(tmp_path, AXOLOTL).offload_streams is None  # true: TRL's default streams


@pytest.mark.parametrize(("changes", "text"), [
    ({**LORA, "activation_offloading": "legacy"}, "'legacy' in .* not modelled: with an adapter, each"),
    ({"activation_offloading": "disk"}, "'disk' in .* not modelled: activations written"),
    ({"gradient_checkpointing": "offload_disk"}, "gradient_checkpointing: 'offload_disk' in .* not modelled"),
    ({"gradient_checkpointing": False}, "activation_offloading requires gradient_checkpointing"),
])
def test_axolotl_s_other_offloadings_are_refused_by_name(tmp_path, changes, text):
    with pytest.raises(InvalidInput, match=text):
        read(tmp_path, AXOLOTL | changes)


def test_trl_s_activation_offloading_is_read(tmp_path):
    sft = {"model_name_or_path": "Qwen/Qwen2.5-0.5B", "max_length": 1024, "per_device_train_batch_size": 2,
           "dataset_text_field": "text", "activation_offloading": True}
    found = read(tmp_path, sft, "sft_config.json")
    assert found.format == "trl-sft" and found.offload_activations is True


def test_the_host_memory_is_one_step_s_however_many_steps_run():
    model, x = Head(), torch.randn(16, 32)
    offloader = Offloader(model, host_copy)
    peaks = []
    for _ in range(3):
        with offloader:
            model(x).sum().backward()
        peaks.append(offloader.host_peak_bytes)
        assert offloader.host_bytes == 0  # every host copy was brought back or dropped
    offloader.close()
    assert peaks == [9 * 16 * 32 * 4] * 3
