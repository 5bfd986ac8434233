"""Llama 4 (workload/llama4.py, presets/llama4.py): the presets' published totals, Axolotl's linearized
experts (the fused experts' computation in per-expert linear layers, 4-bit under QLoRA), and the
text-only step of the vision-language model."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from autotune.cli import main
from autotune.workload.adapters import make_adapter, prepare
from autotune.workload.models import resolve_model
from autotune.workload.step import build_model, make_batch
from autotune.workload.vision import IMAGE_TEXT_TO_TEXT, make_images

VLM = IMAGE_TEXT_TO_TEXT


def _total(name: str) -> int:
    from transformers import AutoModelForImageTextToText

    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(resolve_model(name).config)
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize(("name", "params"), [
    # the hub's count of Llama-4-Scout-17B-16E-Instruct (same shapes) as public inventories list it
    ("meta-llama/Llama-4-Scout-17B-16E", 108_641_793_536),
    # the parameter_count of Fireworks' billing export for Llama 4 Maverick
    ("meta-llama/Llama-4-Maverick-17B-128E", 401_583_781_376),
])
def test_llama4_presets_count_their_published_totals(name, params):
    assert _total(name) == params


def _linearized(name: str = "tiny-llama4"):
    return dataclasses.replace(resolve_model(name), linearized_experts=True)


def test_linearized_experts_compute_what_the_fused_experts_compute():
    # Axolotl's delinearize_llama4.py: gate_up_proj[e] = cat(gate_projs[e].weight.T, up_projs[e].weight.T),
    # down_proj[e] = down_projs[e].weight.T; the same weights give the same loss and logits.
    torch.manual_seed(0)
    fused, _ = build_model(resolve_model("tiny-llama4"), VLM, "eager")
    linear, _ = build_model(_linearized(), VLM, "eager")
    fused.eval(), linear.eval()
    state = linear.state_dict()
    for name, value in fused.state_dict().items():
        if name.endswith("experts.gate_up_proj"):
            prefix = name.removesuffix("gate_up_proj")
            inner = value.shape[-1] // 2
            for e in range(value.shape[0]):
                state[f"{prefix}gate_projs.{e}.weight"] = value[e, :, :inner].T
                state[f"{prefix}up_projs.{e}.weight"] = value[e, :, inner:].T
        elif name.endswith("experts.down_proj"):
            prefix = name.removesuffix("down_proj")
            for e in range(value.shape[0]):
                state[f"{prefix}down_projs.{e}.weight"] = value[e].T
        else:
            state[name] = value
    linear.load_state_dict(state)
    assert sum(p.numel() for p in linear.parameters()) == sum(p.numel() for p in fused.parameters())
    experts = linear.language_model.model.layers[0].feed_forward.experts
    assert [len(experts.gate_projs), len(experts.up_projs), len(experts.down_projs)] == [4, 4, 4]
    assert type(experts.gate_projs[0]) is torch.nn.Linear
    batch = make_batch(fused.config, VLM, 2, 16, images=make_images(0, None))  # no images
    batch["input_ids"] = torch.randint(3, 100, (2, 16))
    with torch.no_grad():
        expected, got = fused(**batch), linear(**batch)
    assert torch.allclose(got.logits, expected.logits, atol=1e-5)
    assert torch.allclose(got.loss, expected.loss, atol=1e-6)


def test_qlora_stores_every_linearized_expert_in_4_bits():
    from autotune.backends.estimate.parts import ESTIMATE_PARTS

    adapter = make_adapter("qlora", targets=("q_proj", "v_proj"))
    for spec, experts in ((_linearized(), 3 * 4 * 2), (resolve_model("tiny-llama4"), 0)):
        model, _ = build_model(spec, VLM, "eager", "bfloat16")
        model = prepare(model, adapter, VLM, ESTIMATE_PARTS)
        four_bit = [name for name, module in model.named_modules()
                    if ".experts." in name and type(module).__name__ == "EmulatedLinear4bit"]
        assert len(four_bit) == experts  # 3 projections x 4 experts x 2 layers; the fused stay 3-D


def test_a_text_only_step_of_llama4_is_estimated_with_linearized_experts(capsys):
    code = main(["check", "tiny-llama4", "--seq-len", "128", "--batch-size", "2", "--gpu", "H100-80GB",
                 "--images-per-sample", "0", "--peft", "qlora", "--lora-targets", "q_proj,v_proj",
                 "--llama4-linearized-experts", "--no-cache"])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert "no images: a text-only step of the vision-language model" in out.out


def test_linearized_experts_of_another_model_type_are_refused(capsys):
    code = main(["check", "tiny-mixtral", "--seq-len", "64", "--batch-size", "1", "--gpu", "H100-80GB",
                 "--llama4-linearized-experts", "--no-cache"])
    assert code == 2
    assert "Axolotl linearizes the experts of model type 'llama4' only" in capsys.readouterr().err


def test_a_cuda_cell_rebuilds_the_linearized_experts():
    import json

    from autotune.backends.cuda.protocol import CellSpec, cell_spec, rebuild_workload
    from autotune.workload import Workload
    from autotune.workload.modes import parse_mode

    workload = Workload(_linearized(), VLM, "sdpa", weights_dtype="bfloat16", images=make_images(0, None))
    spec = cell_spec(workload, parse_mode("bf16"), 128, 1 << 30)
    rebuilt, _ = rebuild_workload(CellSpec.from_json(json.loads(json.dumps(spec.to_json()))))
    assert rebuilt.model.linearized_experts and rebuilt.model == workload.model


@pytest.mark.parametrize("task", [VLM, "causal-lm"])
def test_the_chunked_loss_of_llama4_is_its_own_loss(task):
    # Neither Llama 4 class names its text model by base_model_prefix: the hidden states are its text model's.
    from autotune.workload.loss import chunked_lm_loss

    torch.manual_seed(0)
    model, _ = build_model(resolve_model("tiny-llama4"), task, "eager")
    model.eval()
    batch = make_batch(model.config, task, 2, 16, images=make_images(0, None) if task == VLM else None)
    batch["input_ids"] = torch.randint(3, 100, (2, 16))
    batch["labels"] = batch["input_ids"].clone()
    with torch.no_grad():
        assert torch.allclose(chunked_lm_loss(model, batch), model(**batch).loss, atol=1e-5)
