"""KTO (issue 36): TRL's KTOTrainer step traced on tiny models, its options and configs."""

from __future__ import annotations

import pytest
from test_preference import decoder_end_bytes, floor, peak, tiny_llama, weight_bytes

from autotune.configs import read_training_config
from autotune.errors import InvalidInput
from autotune.request import CheckRequest, Step, Target, resolve
from autotune.workload.trainers import Trainer, check_trainer

KTO = Trainer("kto")
APO = Trainer("kto", kto_loss_type="apo_zero_unpaired")  # calculate_KL off: no KL batch
PRECOMPUTED = Trainer("kto", precompute_ref_log_probs=True)
INT64 = 8


def kl_inputs(batch: int, seq: int = 64) -> int:
    """The KL rows' KL_input_ids, KL_attention_mask and KL_completion_mask (int64 [batch, seq])."""
    return 3 * batch * seq * INT64


# --- the step -------------------------------------------------------------------------------


def test_the_kl_rows_run_through_the_policy_and_the_reference_under_no_grad():
    # The policy's decoder, at the end of each forward of both traced steps. Under LoRA the reference
    # is the policy with its adapter disabled: the KL rows', the batch's, the reference's KL rows' and
    # the batch's again; two without the KL batch. A full fine-tune's reference is another model.
    assert len(decoder_end_bytes(tiny_llama(KTO, lora=True), 3)) == 2 * 4
    assert len(decoder_end_bytes(tiny_llama(APO, lora=True), 3)) == 2 * 2
    with_kl, without = decoder_end_bytes(tiny_llama(KTO), 3), decoder_end_bytes(tiny_llama(APO), 3)
    assert (len(with_kl), len(without)) == (2 * 2, 2 * 1)
    # the KL forward leaves its [batch] float32 log-probs behind and no saved activation: the
    # policy's forward then holds what the step without KL holds, plus the KL rows and those log-probs
    assert with_kl[1] == without[0] + kl_inputs(3) + 3 * 4
    activations = with_kl[1] - decoder_end_bytes(tiny_llama(KTO), 2)[1]
    assert 0 < with_kl[1] - with_kl[0] and with_kl[0] < with_kl[1] - activations


def test_a_kto_step_allocates_more_than_the_same_step_without_kl():
    # at the peak (the policy's backward) the KL rows are still held, with both [batch] KL log-probs
    # (the policy's and the reference's, one 512-byte block each)
    assert peak(tiny_llama(KTO), 4) - peak(tiny_llama(APO), 4) == kl_inputs(4) + 2 * 512
    assert peak(tiny_llama(KTO), 4, "amp+ckpt") > peak(tiny_llama(APO), 4, "amp+ckpt")


def test_the_reference_is_a_frozen_copy_the_adapter_disabled_or_none_when_precomputed():
    weights = weight_bytes(tiny_llama(None))
    assert floor(tiny_llama(KTO)) == floor(tiny_llama(None)) + weights
    assert floor(tiny_llama(PRECOMPUTED)) == floor(tiny_llama(None))
    assert floor(tiny_llama(KTO, lora=True)) == floor(tiny_llama(None, lora=True))
    assert len(decoder_end_bytes(tiny_llama(PRECOMPUTED, lora=True), 3)) == 2 * 2  # no reference forward
    assert (KTO.reference(peft=False), KTO.reference(peft=True), PRECOMPUTED.reference(peft=True)) == (
        "frozen copy", "adapter disabled", "precomputed")


# --- options and refusals --------------------------------------------------------------------


def check(batch_size: int = 2, **step: object) -> object:
    target = Target(gpu_memory="1GiB", backend="estimate")
    return resolve(CheckRequest(Step(model="tiny-llama", **step), target, seq_len=64, batch_size=batch_size))


def test_kto_options_make_the_trainer():
    assert check_trainer("kto", kto_loss_type="apo_zero_unpaired", precompute_ref_log_probs=True) == Trainer(
        "kto", precompute_ref_log_probs=True, kto_loss_type="apo_zero_unpaired")
    assert "KL batch" in KTO.label(peft=False) and "no KL batch" in APO.label(peft=False)
    assert KTO.to_json(peft=True)["kto"] == {"loss_type": "kto", "kl_batch": True, "min_batch": 2}


@pytest.mark.parametrize(("step", "field", "words"), [
    ({"trainer": "kto", "kto_loss_type": "sigmoid"}, "kto_loss_type", "allowed are kto, apo_zero_unpaired"),
    ({"trainer": "dpo", "kto_loss_type": "kto"}, "kto_loss_type", "is KTO's"),
    ({"trainer": "kto", "chosen_nll": False}, "chosen_nll", "is SimPO's"),
    ({"trainer": "kto", "gpus": 2}, "gpus", "more than one GPU is not modelled yet"),
])
def test_each_refusal_names_its_field(step, field, words):
    with pytest.raises(InvalidInput, match=words) as caught:
        check(**step)
    assert caught.value.field == field


def test_a_batch_of_one_is_refused_with_the_kl_term_as_ktotrainer_refuses_it():
    from autotune.analysis.check import check_step
    from autotune.backends.estimate.backend import EstimateBackend
    from autotune.gpus import custom_gpu
    from autotune.units import GIB
    from autotune.workload.modes import parse_mode

    gpu = custom_gpu(4 * GIB)
    with pytest.raises(InvalidInput, match="Actual \\(not effective\\) batch size must be > 1") as caught:
        check_step(tiny_llama(KTO), EstimateBackend(gpu), gpu, seq_len=64, batch_size=1,
                   mode=parse_mode("fp32"), margin=0.0)
    assert caught.value.field == "batch_size"


@pytest.mark.parametrize(("trainer", "fits", "answer"), [
    (KTO, 1, 0),  # batch 1 fits, but KTOTrainer refuses it with the KL term: nothing it runs fits
    (KTO, 3, 3),
    (Trainer("kto", kto_loss_type="apo_zero_unpaired"), 1, 1),  # no KL batch: a batch of one runs
])
def test_a_table_s_answer_is_a_batch_the_trainer_runs(trainer, fits, answer):
    from limitbackend import LimitBackend

    from autotune.tuner import tune_table
    from autotune.workload.modes import parse_mode

    backend = LimitBackend(lambda *_: fits)
    table = tune_table(tiny_llama(trainer), backend, backend.gpu, seq_lens=[64], modes=[parse_mode("fp32")])
    assert [cell.max_batch_size for cell in table.cells] == [answer]


# --- configs ---------------------------------------------------------------------------------


def test_trl_s_kto_config_is_read_as_kto(tmp_path):
    from configread import read

    found = read(tmp_path, {"model_name_or_path": "tiny-llama", "per_device_train_batch_size": 2,
                            "desirable_weight": 1.0, "undesirable_weight": 1.33,
                            "loss_type": "apo_zero_unpaired", "precompute_ref_log_probs": True},
                 "config.yaml")
    assert (found.format, found.trainer, found.kto_loss_type, found.precompute_ref_log_probs) == (
        "trl-kto", "kto", "apo_zero_unpaired", True)
    assert any("desirable_weight, undesirable_weight: the trainer's" in note for note in found.notes)


def test_a_precompute_only_config_is_kto_when_trainer_kto_is_asked(tmp_path):
    from configread import write

    path = write(tmp_path, {"model_name_or_path": "tiny-llama", "precompute_ref_log_probs": True}, "c.yaml")
    assert read_training_config(path).request.step.trainer == "dpo"
    assert read_training_config(path, trainer="kto").request.step.trainer == "kto"


@pytest.mark.parametrize(("keys", "key"), [
    ({"loss_type": "sigmoid"}, "loss_type"),
    ({"train_sampling_strategy": "random"}, "train_sampling_strategy"),
    ({"sync_ref_model": True}, "sync_ref_model"),
])
def test_kto_config_keys_that_trl_refuses_or_autotune_does_not_model_are_refused(tmp_path, keys, key):
    from configread import write

    with pytest.raises(InvalidInput, match=key):
        read_training_config(write(tmp_path, {"model_name_or_path": "tiny-llama", "desirable_weight": 1.0,
                                              **keys}, "config.yaml"))


def test_the_example_configs_are_read_as_kto():
    trl = read_training_config("examples/trl_kto_lora.yaml")
    assert (trl.format, trl.request.step.trainer, trl.request.batch_size, trl.request.seq_len) == (
        "trl-kto", "kto", 4, 1024)
    axolotl = read_training_config("examples/axolotl_kto_lora.yml")
    step = axolotl.request.step
    assert (step.trainer, step.adapter.method, axolotl.request.batch_size, axolotl.request.seq_len) == (
        "kto", "lora", 4, 2048)
    assert any("adapter disabled" in note and "KL batch" in note for note in axolotl.notes)


def test_axolotl_s_kto_ignores_precompute_ref_log_probs_as_axolotl_does(tmp_path):
    from configread import read

    found = read(tmp_path, {"base_model": "tiny-llama", "bf16": False, "rl": "kto", "micro_batch_size": 2,
                            "sequence_len": 64, "precompute_ref_log_probs": True}, "axolotl.yml")
    assert (found.trainer, found.precompute_ref_log_probs) == ("kto", None)
    assert any("Axolotl passes it to DPO alone" in note for note in found.notes)
    assert any("a frozen copy KTOTrainer loads itself" in note for note in found.notes)
