"""LLaMA-Factory's reward model (stage rm, issues 34/36): the causal LM with TRL 0.24's value head and
PairwiseTrainer's loss, traced on tiny models (workload/value_head.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/test_preference.py's helpers
from test_preference import SEQ, decoder_end_bytes, peak, tiny_llama  # noqa: E402

from autotune.backends.estimate.backend import EstimateBackend  # noqa: E402
from autotune.backends.estimate.traced_step import StepHooks  # noqa: E402
from autotune.cli import main  # noqa: E402
from autotune.gpus import custom_gpu  # noqa: E402
from autotune.units import GIB  # noqa: E402
from autotune.workload import Workload  # noqa: E402
from autotune.workload.adapters import make_adapter  # noqa: E402
from autotune.workload.models import ModelSpec, tiny_config  # noqa: E402
from autotune.workload.modes import parse_mode  # noqa: E402
from autotune.workload.trainers import Trainer, check_trainer  # noqa: E402
from autotune.workload.value_head import ValueHeadModel, pairwise_loss  # noqa: E402

VOCAB, HIDDEN = 4096, 64


def lf_reward() -> Trainer:
    trainer = check_trainer("reward", llamafactory=True)
    assert trainer is not None and trainer.value_head
    return trainer


def vocab_heavy(trainer: Trainer | None, *, lora: bool = True) -> Workload:
    """A tiny Llama whose logits dominate its activations, as a real vocabulary's do."""
    config = tiny_config("llama", vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=128,
                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2)
    adapter = make_adapter("lora", r=8, alpha=16, dropout=0.0, targets=None) if lora else None
    task = "sequence-classification" if trainer is not None and not trainer.value_head else "causal-lm"
    if task == "sequence-classification":
        config.num_labels = 1
    return Workload(ModelSpec("tiny-llama-vocab", "local", config, 128), task, None, trainer=trainer,
                    adapter=adapter)


class Allocations(StepHooks):
    """The bytes of every allocation of the traced steps. Watches only."""

    every_step = True

    def make_tracker(self, device: Any) -> Any:
        self.tracker = super().make_tracker(device)
        return self.tracker


def allocations(workload: Workload, batch: int, mode: str) -> list[int]:
    backend = EstimateBackend(custom_gpu(4 * GIB))
    hooks = Allocations()
    with backend.cell(workload, parse_mode(mode), SEQ, 4 * GIB):
        backend.trace_with(hooks, backend._model(workload), workload, parse_mode(mode), SEQ, batch)
    return [nbytes for _, nbytes in hooks.tracker.events if nbytes > 0]


def test_the_model_is_the_lm_with_a_float32_trained_value_head_and_its_dropout():
    # modeling_value_head.py: ValueHead(dropout 0.1, summary Linear(hidden, 1)) built in float32 after
    # the adapter, trainable; PairwiseTrainer (transformers' Trainer) disables no dropout
    backend = EstimateBackend(custom_gpu(4 * GIB))
    workload = vocab_heavy(lf_reward())
    model = backend._model(workload).model
    assert isinstance(model, ValueHeadModel)
    head = {name: (tuple(p.shape), p.dtype, p.requires_grad) for name, p in model.named_parameters()
            if name.startswith("v_head.")}
    assert head == {"v_head.summary.weight": ((1, HIDDEN), torch.float32, True),
                    "v_head.summary.bias": ((1,), torch.float32, True)}
    assert isinstance(model.v_head.dropout, torch.nn.Dropout) and model.v_head.dropout.p == 0.1
    counts = backend.parameter_counts(workload)
    lm = backend.parameter_counts(vocab_heavy(None))
    assert (counts.trainable, counts.total) == (lm.trainable + HIDDEN + 1, lm.total + HIDDEN + 1)


def test_the_step_computes_the_lm_logits_and_their_float32_copies_trl_s_reward_model_none():
    # bf16 autocast, 2 pairs = 4 rows: the LM head's bfloat16 logits, the LM loss's float32 upcast and
    # its log_softmax, and the wrapper's lm_logits.float(); RewardTrainer's classifier has no logits
    rows = 2 * 2
    logits16, logits32 = rows * SEQ * VOCAB * 2, rows * SEQ * VOCAB * 4
    step = allocations(vocab_heavy(lf_reward()), 2, "bf16")
    assert step.count(logits16) >= 1 and step.count(logits32) >= 3
    trl = allocations(vocab_heavy(Trainer("reward")), 2, "bf16")
    assert logits16 not in trl and logits32 not in trl
    # at once at the forward's end: the bfloat16 logits, the LM loss's log_softmax and a float32 copy
    lf, trl_peak = peak(vocab_heavy(lf_reward()), 2, "bf16"), peak(vocab_heavy(Trainer("reward")), 2, "bf16")
    assert lf > trl_peak + logits16 + 2 * logits32


def test_a_batch_of_pairs_runs_two_rows_each():
    # at the end of the decoder, 3 pairs hold what an SFT step's 6 rows hold (the same input_ids,
    # attention_mask and labels: PairwiseDataCollatorWithPadding) and the value head's float32 weights
    hidden = tiny_config("llama").hidden_size
    head = (hidden + 1) * 4
    reward = decoder_end_bytes(tiny_llama(lf_reward()), 3)
    assert reward[0] == decoder_end_bytes(tiny_llama(None), 6)[0] + head
    # under LoRA the frozen first norm saves no input, but output_hidden_states holds the embeddings'
    # output ([6, seq, hidden] float32) until the forward returns
    reward = decoder_end_bytes(tiny_llama(lf_reward(), lora=True), 3)
    sft = decoder_end_bytes(tiny_llama(None, lora=True), 6)
    assert reward[0] == sft[0] + head + 6 * SEQ * hidden * 4
    assert lf_reward().rows_per_sample == 2


def test_the_loss_is_pairwise_over_each_row_s_last_attended_token():
    # a real (not fake) run of PairwiseTrainer.compute_loss on a tiny model: chosen rows first
    config = tiny_config("llama")
    from transformers import AutoModelForCausalLM

    model = ValueHeadModel(AutoModelForCausalLM.from_config(config)).eval()
    ids = torch.randint(0, config.vocab_size, (4, 8))
    mask = torch.ones(4, 8, dtype=torch.long)
    mask[1, 5:] = 0
    loss = pairwise_loss(model, False, input_ids=ids, attention_mask=mask, labels=ids)
    values = model(input_ids=ids, attention_mask=mask)[2]
    last = values[torch.arange(4), mask.sum(-1) - 1]
    assert torch.allclose(loss, -torch.nn.functional.logsigmoid(last[:2] - last[2:]).mean())


def test_the_label_and_the_trainer_json_say_llamafactory_s_value_head():
    trainer = lf_reward()
    assert trainer.label(peft=True).startswith("reward (LLaMA-Factory's PairwiseTrainer, value head); "
                                               "batch = pairs")
    found = trainer.to_json(peft=True)
    assert (found["trl_class"], found["reference"], found["rows_per_sample"]) == (
        "AutoModelForCausalLMWithValueHead (TRL 0.24)", None, 2)
    assert Trainer(**{**trainer.__dict__}) == trainer  # the cuda worker's protocol rebuilds it
    assert not Trainer("reward").value_head


def test_check_answers_a_llamafactory_rm_config_with_the_value_head(tmp_path, capsys):
    data = {"model_name_or_path": "tiny-llama", "stage": "rm", "do_train": True, "finetuning_type": "lora",
            "lora_rank": 8, "lora_target": "all", "cutoff_len": 64, "per_device_train_batch_size": 1,
            "bf16": True}
    path = tmp_path / "qwen3_lora_reward.yaml"
    path.write_text(yaml.safe_dump(data))
    code = main(["check", "tiny-llama", "--from-config", str(path), "--gpu-memory", "4GiB", "--json",
                 "--no-cache"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0 and doc["fits"] is True
    trainer = doc["trainer"]
    assert (trainer["name"], trainer["recipe"], trainer["rows_per_sample"]) == ("reward", "llamafactory", 2)
    assert trainer["label"].startswith("reward (LLaMA-Factory's PairwiseTrainer, value head)")


@pytest.mark.parametrize("kwargs", [{"precompute_ref_log_probs": True}, {"chosen_nll": False}])
def test_llamafactory_s_reward_model_takes_no_trl_settings(kwargs):
    from autotune.errors import InvalidInput

    with pytest.raises(InvalidInput):
        check_trainer("reward", llamafactory=True, **kwargs)


def test_the_cuda_worker_builds_and_runs_the_value_head_model():
    # the cuda backend's worker (on the CPU here) wraps the LoRA model as the estimator does
    from cpumemory import CpuMemory

    from autotune.backends.cuda.probe_worker import Worker
    from autotune.backends.cuda.protocol import PROTOCOL, cell_spec

    worker = Worker(CpuMemory())
    spec = cell_spec(tiny_llama(lf_reward(), lora=True), parse_mode("fp32"), 16, GIB)
    ready = worker.handle({"op": "init", "protocol": PROTOCOL, "cell": spec.to_json()})
    assert ready["op"] == "ready", ready
    assert isinstance(worker.model, ValueHeadModel) and worker.reference is None
    assert worker.model.v_head.summary.weight.requires_grad and worker.model.v_head.dropout.p == 0.1
    reply = worker.handle({"op": "probe", "batch_size": 2})
    assert reply["outcome"] == "fits", reply
