"""LLaMA-Factory's dpo and kto stages (issue 34/36): its CustomDPOTrainer and CustomKTOTrainer step
traced on tiny models (workload/llamafactory_preference.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/test_preference.py's helpers
from test_preference import decoder_end_bytes, floor, peak, tiny_llama  # noqa: E402

from autotune.workload import Workload  # noqa: E402
from autotune.workload.llamafactory_preference import get_batch_logps  # noqa: E402
from autotune.workload.models import ModelSpec, tiny_config  # noqa: E402
from autotune.workload.preference import selective_log_softmax  # noqa: E402
from autotune.workload.trainers import Trainer, check_trainer  # noqa: E402


def lf(name: str) -> Trainer:
    trainer = check_trainer(name, llamafactory=True)
    assert trainer is not None
    return trainer


def saved_shapes(fn, logits: torch.Tensor, labels: torch.Tensor) -> list[tuple[tuple[int, ...], torch.dtype]]:
    """The tensors of their own (not views of ``logits``) autograd saves for the backward of
    ``fn(logits, labels)``."""
    saved: list[tuple[tuple[int, ...], torch.dtype]] = []
    ptr = logits.untyped_storage().data_ptr()

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        if tensor.untyped_storage().data_ptr() != ptr:
            saved.append((tuple(tensor.shape), tensor.dtype))
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        fn(logits, labels)
    return saved


def test_llamafactory_s_log_probs_save_the_whole_float32_log_softmax_trl_s_do_not():
    rows, seq, vocab = 2, 8, 32
    logits = torch.randn(rows, seq, vocab, requires_grad=True)
    labels = torch.zeros(rows, seq, dtype=torch.long)
    whole = ((rows, seq - 1, vocab), torch.float32)
    assert whole in saved_shapes(lambda x, y: get_batch_logps(x, y)[0].sum(), logits, labels)
    # TRL's selective_log_softmax on float32 logits: a logsumexp per row, no [rows, seq, vocab] output
    trl = saved_shapes(lambda x, y: selective_log_softmax(x[:, :-1, :], y[:, 1:]).sum(), logits, labels)
    assert whole not in trl and trl


def test_the_dpo_stage_runs_the_reference_through_the_model_with_its_adapter_disabled():
    # two forwards of the policy's decoder per step (policy, then reference) under LoRA, over two
    # traced steps; orpo and simpo have no reference (use_ref_model false); a full fine-tune's
    # reference is another model
    assert len(decoder_end_bytes(tiny_llama(lf("dpo"), lora=True), 2)) == 2 * 2
    assert len(decoder_end_bytes(tiny_llama(lf("orpo"), lora=True), 2)) == 2 * 1
    assert len(decoder_end_bytes(tiny_llama(lf("simpo"), lora=True), 2)) == 2 * 1
    assert len(decoder_end_bytes(tiny_llama(lf("dpo")), 2)) == 2 * 1
    dpo, orpo = lf("dpo"), lf("orpo")
    assert (dpo.reference(peft=True), dpo.reference(peft=False), orpo.reference(peft=False)) == (
        "adapter disabled", "frozen copy", None)


def test_the_kto_stage_runs_its_kl_batch_and_the_reference_s_two_forwards():
    # the target and KL forwards of the policy, then the reference's (the adapter disabled)
    assert len(decoder_end_bytes(tiny_llama(lf("kto"), lora=True), 2)) == 2 * 4
    assert len(decoder_end_bytes(tiny_llama(lf("kto")), 2)) == 2 * 2
    # CustomKTOTrainer calls Trainer.__init__, not KTOTrainer's: a batch of 1 runs
    assert lf("kto").min_batch == 1 and Trainer("kto").min_batch == 2
    assert peak(tiny_llama(lf("kto"), lora=True), 1) > 0


def test_a_full_fine_tune_s_reference_is_loaded_in_the_checkpoint_s_dtype():
    # create_ref_model: load_model(is_trainable=False) loads torch_dtype "auto" and casts nothing to
    # float32: a bfloat16 checkpoint's reference holds half the float32 policy's weight bytes
    config = tiny_config("llama", dtype="bfloat16")
    spec = ModelSpec("tiny-llama-bf16", "local", config, 128)

    def workload(trainer: Trainer | None) -> Workload:
        return Workload(spec, "causal-lm", None, weights_dtype="float32", trainer=trainer)

    base = floor(workload(None))
    lf_reference = floor(workload(lf("dpo"))) - base
    trl_reference = floor(workload(Trainer("dpo"))) - base
    assert lf_reference > 0 and trl_reference == pytest.approx(2 * lf_reference, rel=0.01)
    assert floor(workload(lf("orpo"))) == base


def test_the_label_says_llamafactory_s_trainer():
    assert lf("dpo").label(peft=True).startswith("dpo (LLaMA-Factory's CustomDPOTrainer); batch = pairs")
    assert lf("kto").label(peft=False).startswith("kto (LLaMA-Factory's CustomKTOTrainer)")
    assert "no reference model" in lf("simpo").label(peft=True)
    assert lf("dpo").to_json(peft=True)["recipe"] == "llamafactory"
    assert Trainer(**{**lf("kto").__dict__}) == lf("kto")  # the cuda worker's protocol rebuilds it


def test_llamafactory_s_trainers_are_dpo_orpo_simpo_kto_and_reward():
    from autotune.errors import InvalidInput

    with pytest.raises(InvalidInput, match="LLaMA-Factory's trainers run dpo, orpo, simpo, kto, reward"):
        check_trainer("grpo", llamafactory=True)
