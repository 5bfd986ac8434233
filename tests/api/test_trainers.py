"""Preference and RL trainers in the service (issue 36): POST /v1/tables and GET /v1/check take the
trainer and its plain settings, the store keeps them in the run's spec and its key (an SFT run's key
as before trainers were stored), the run's JSON and page say the trainer, a stored table answers a
check only for the same trainer, and the run's worker tables the trainer's step.

Runs stay queued (the idle runner) or are written straight into the real SQLite store."""

from __future__ import annotations

import hashlib
import json
import re

import pytest
from storedruns import spec_of, store_done_run, text

from api.routes.check import _covers
from api.runs.spec import TableSpec
from autotune.workload.trainers import GRPO_FIELDS, TRAINERS, Trainer

LLAMA = {"model": "tiny-llama", "seq_lens": [32], "modes": ["fp32"], "gpu_memory": "1GiB",
         "backend": "estimate"}
KTO = {"trainer": "kto"}
GRPO = {"trainer": "grpo", "max_completion_length": 16, "num_generations": 4, "beta": 0.04}


@pytest.fixture
def client(idle_client):
    return idle_client


def test_a_trainer_s_table_is_its_own_run_and_identical_requests_share_one(client):
    sft = client.post("/v1/tables", json=LLAMA).json()
    kto = client.post("/v1/tables", json=LLAMA | KTO)
    assert kto.status_code == 202 and kto.json()["created"] and kto.json()["id"] != sft["id"]
    again = client.post("/v1/tables", json=LLAMA | KTO | {"kto_loss_type": "kto"})  # the default spelled out
    assert again.json()["id"] == kto.json()["id"] and again.json()["created"] is False
    others = [client.post("/v1/tables", json=LLAMA | body).json() for body in (
        {"trainer": "kto", "kto_loss_type": "apo_zero_unpaired"},
        {"trainer": "kto", "precompute_ref_log_probs": True}, {"trainer": "dpo"}, GRPO)]
    assert len({sft["id"], kto.json()["id"], *(o["id"] for o in others)}) == 6
    assert client.post("/v1/tables", json=LLAMA | {"trainer": "sft"}).json()["id"] == sft["id"]

    table = client.get(kto.json()["url"]).json()
    assert table["trainer"]["settings"] == {"name": "kto", "precompute_ref_log_probs": False,
                                            "kto_loss_type": "kto"}
    assert (table["trainer"]["trl_class"], table["trainer"]["reference"], table["trainer"]["kto"]) == (
        "KTOTrainer", "frozen copy", {"loss_type": "kto", "kl_batch": True, "min_batch": 2})
    assert client.get(sft["url"]).json()["trainer"] is None
    grpo = client.get(others[3]["url"]).json()["trainer"]
    assert grpo["settings"] == {"name": "grpo", "num_generations": 4, "max_completion_length": 16,
                                "beta": 0.04, "vllm_mode": None, "steps_per_generation": 1,
                                "vllm_gpu_memory_utilization": 0.3}
    # the real SQLite store keeps the trainer in the run's spec, and its worker tables that step
    run = client.app.state.queue.store.get_run(kto.json()["id"])
    assert run.spec["trainer"] == table["trainer"]["settings"]
    assert TableSpec.from_json(run.spec).workload().trainer == Trainer("kto")


def test_an_sft_run_keeps_the_key_of_the_runs_stored_before_trainers(client):
    spec = spec_of(client, LLAMA)
    old = {k: v for k, v in spec.to_json().items() if k != "trainer"}  # a run stored before trainers
    old_key = hashlib.sha256(json.dumps({k: v for k, v in old.items() if k not in (
        "adapter", "ckpt_reentrant", "liger", "alloc_conf", "parallel")}, sort_keys=True,
        separators=(",", ":")).encode()).hexdigest()
    assert spec.key() == old_key and spec.trainer is None
    store = client.app.state.queue.store
    run, _ = store.create_run(key=old_key, spec=old, model=spec.model, gpu=spec.gpu["name"],
                              backend=spec.backend, total=1)
    assert TableSpec.from_json(store.get_run(run.id).spec).workload().trainer is None
    assert client.get(f"/v1/tables/{run.id}").json()["trainer"] is None
    assert client.post("/v1/tables", json=LLAMA).json()["id"] == run.id  # still dedupes


def test_a_stored_table_answers_a_check_only_for_its_own_trainer(client):
    sft, dpo = spec_of(client, LLAMA), spec_of(client, LLAMA | {"trainer": "dpo"})
    assert _covers(sft.to_json(), sft, 32) and _covers(dpo.to_json(), dpo, 32)
    assert not _covers(sft.to_json(), dpo, 32) and not _covers(dpo.to_json(), sft, 32)
    run_id = store_done_run(client, dpo, {"attn": "sdpa"})
    cell = {"model": "tiny-llama", "seq_len": 32, "batch_size": 4, "gpu_memory": "1GiB", "mode": "fp32"}
    answer = client.get("/v1/check", params=cell | {"trainer": "dpo"}).json()
    assert answer["table_id"] == run_id and answer["trainer"]["name"] == "dpo"


def test_the_run_page_says_the_trainer(client):
    kto = client.post("/v1/tables", json=LLAMA | KTO | {"peft": "lora"}).json()
    sft = client.post("/v1/tables", json=LLAMA).json()
    page = text(client.get(f"/runs/{kto['id']}"))
    assert "Trainer kto (KTOTrainer); batch = examples" in page
    assert "reference: the same model with its adapter disabled" in page
    assert "Trainer sft (supervised fine-tuning)" in text(client.get(f"/runs/{sft['id']}"))


@pytest.mark.parametrize(("changes", "field", "words"), [
    ({"trainer": "dpo", "num_generations": 4}, "num_generations", "is GRPO's"),
    ({"trainer": "orpo", "precompute_ref_log_probs": True}, "precompute_ref_log_probs", "is DPO's and KTO's"),
    ({"trainer": "kto", "kto_loss_type": "sigmoid"}, "kto_loss_type", "apo_zero_unpaired"),
    ({**GRPO, "beta": -1}, "beta", "a finite number of 0 or more"),
    ({**GRPO, "num_generations": 5000}, "num_generations", "an integer from 2 to 1024"),
    ({"trainer": "grpo"}, "max_completion_length", "leaves no prompt"),  # 32 tokens, 512 of completion
    ({"trainer": "reward", "task": "causal-lm"}, "task", "trains a sequence-classification model"),
    ({"trainer": "ppo"}, "trainer", "unknown trainer 'ppo'"),
])
def test_each_refusal_names_its_field(client, changes, field, words):
    response = client.post("/v1/tables", json=LLAMA | changes)
    assert response.status_code == 422, response.text
    assert response.json()["field"] == field and words in response.json()["detail"]


def test_a_reward_model_s_run_stores_its_one_score_head(client):
    spec = spec_of(client, LLAMA | {"trainer": "reward"})
    assert (spec.task, spec.workload().model.config.num_labels, spec.trainer) == (
        "sequence-classification", 1, {"name": "reward"})


def _rounded_run(client, body, fitted, best):
    """A finished run of ``body`` whose one cell fitted batch ``fitted`` and answers ``best``, as the
    tuner stores a cell its trainer rounds down (tuner._tune_cell through Trainer.largest_batch)."""
    spec = spec_of(client, body)
    store = client.app.state.queue.store
    run, _ = store.create_run(key=spec.key(), spec=spec.to_json(), model=spec.model, gpu=spec.gpu["name"],
                              backend=spec.backend, total=spec.cells, reuse=())
    store.mark_running(run.id, lane="estimate:0", worker_pid=None)
    probes = [{"batch_size": b, "outcome": outcome, "peak_bytes": 1000 * b, "peak_allocated_bytes": 900 * b,
               "peak_reserved_bytes": 1000 * b} for b, outcome in ((fitted, "fits"), (fitted + 1, "oom"))]
    store.add_cell(run.id, 0, {
        "seq_len": 32, "mode": "fp32", "max_batch_size": best, "peak_memory_bytes": None,
        "peak_allocated_bytes": None, "probes": 2, "capped": False, "backend": spec.backend,
        "step_time_s": None, "error": None, "probe_log": probes})
    store.finish_run(run.id, "done")
    return text(client.get(f"/runs/{run.id}"))


def test_the_run_page_says_why_a_batch_that_fits_is_not_the_answer(client):
    # KTO with its KL term: batch 1 fits, KTOTrainer refuses it, the cell answers 0
    page = _rounded_run(client, LLAMA | KTO, fitted=1, best=0)
    assert "Batch 1 fits in 486.4 MiB, but the trainer runs no batch up to it: KTOTrainer refuses" in page
    assert "Batch 1 does not fit" not in page
    # GRPO's whole groups of 4 completions: 7 fit, the answer is 4, whose peak was never probed
    page = _rounded_run(client, LLAMA | GRPO, fitted=7, best=4)
    assert "Batch 4 was not probed itself: a larger batch fitted." in page
    assert ("Batch 7 fits too, but the trainer does not run it: GRPO runs whole groups of num_generations 4 "
            "completions: a batch that is a multiple of 4") in page
    # a supervised run's 0 is what it was
    assert "Batch 1 does not fit in 486.4 MiB." in _rounded_run(client, LLAMA, fitted=1, best=0)


def test_the_launch_form_asks_for_the_trainer_and_only_its_own_settings(client):
    page = client.get("/new").text
    form = re.search(r'<fieldset class="field target trainer" aria-describedby="trainer-help">\s*'
                     r'<legend>Trainer</legend>(.*?)</fieldset>', page, re.S)
    assert form, "no Trainer fieldset with its legend"
    form = form.group(1)
    assert re.search(r'<label for="trainer">TRL trainer</label>\s*'
                     r'<select id="trainer" name="trainer"[^>]*>\s*'
                     r'<option value="sft" selected>sft: supervised fine-tuning \(SFTTrainer\)</option>',
                     form)
    assert re.findall(r'<option value="(\w+)"', form.split('id="kto_loss_type"')[0]) == list(TRAINERS)
    assert re.search(r'<option value="simpo"\s*>simpo: pairs, no reference '
                     r'\(CPOTrainer \(loss_type simpo\)\)</option>', form)
    # each setting, a label, an error slot, and the trainers it is shown for (hidden while sft is chosen)
    shown_for = {"precompute_ref_log_probs": "dpo kto", "chosen_nll": "simpo", "kto_loss_type": "kto",
                 **{name: "grpo ebft" for name in GRPO_FIELDS if name != "use_vllm"}}
    for name, trainers in shown_for.items():
        field = re.search(rf'<div class="field[ \w]*" data-trainers="([\w ]+)"[^>]*hidden>\s*'
                          rf'<label(?: for="{name}">|><input type="checkbox" id="{name}")', form)
        assert field and field.group(1) == trainers, name
        assert f'<p class="error" id="{name}-error" hidden></p>' in form
    assert 'data-trainers="grpo ebft" data-vllm-mode="colocate" hidden>' in form  # the engine's share
    assert re.search(r'<option value="server"\s*>vLLM server on other GPUs</option>', form)
    assert 'placeholder="512"' in form and 'placeholder="0.3"' in form  # GRPOConfig's defaults
    help_text = re.sub(r"\s+", " ", re.search(r'<p class="help" id="trainer-help">(.*?)</p>', form).group(1))
    assert help_text.startswith("The step of the table, as TRL runs it. For the paired trainers (dpo, orpo, "
                                "simpo, reward) the batch is pairs")
    assert "a sequence length is both together" in form  # GRPO's rows: prompt + completion


@pytest.mark.parametrize("settings", [
    {"trainer": "dpo", "precompute_ref_log_probs": True}, {"trainer": "simpo", "chosen_nll": False},
    {"trainer": "kto", "kto_loss_type": "apo_zero_unpaired"},
    GRPO | {"steps_per_generation": 2, "use_vllm": True, "vllm_mode": "colocate",
            "vllm_gpu_memory_utilization": 0.25},
    GRPO | {"use_vllm": True, "vllm_mode": "server"},
])
def test_the_bodies_the_launch_form_sends_for_each_trainer_are_taken(client, settings):
    # as app.js's trainerBody builds them: the vLLM engine as use_vllm + vllm_mode
    response = client.post("/v1/tables", json=LLAMA | settings)
    assert response.status_code == 202, response.text
    stored = client.get(response.json()["url"]).json()["trainer"]["settings"]
    assert stored["name"] == settings["trainer"]
    assert all(stored[key] == value for key, value in settings.items() if key not in ("trainer", "use_vllm"))
