"""autotune check: every exit code, --from-config, the suggestion."""

from __future__ import annotations

import json
import socket

import limitbackend
import pytest

from autotune.analysis.levers import accumulation_plan
from autotune.cli import main
from autotune.configs import read_training_config
from autotune.errors import InvalidInput

# tiny-bert on a 1 GiB card: the max batch at seq 64 is in the hundreds (test_tuner figures).
SMALL = ["--gpu-memory", "1GiB", "--backend", "estimate"]

# What TrainingArguments(...).to_json_string() writes, trimmed; most keys are not ours.
TRAINING_ARGS = {
    "output_dir": "out", "overwrite_output_dir": False, "do_train": True, "eval_strategy": "no",
    "per_device_train_batch_size": 8, "per_device_eval_batch_size": 8,
    "gradient_accumulation_steps": 4, "learning_rate": 5e-05, "weight_decay": 0.0,
    "num_train_epochs": 3.0, "lr_scheduler_type": "linear", "warmup_ratio": 0.0, "seed": 42,
    "bf16": False, "fp16": True, "gradient_checkpointing": True, "optim": "adamw_torch",
    "report_to": [], "dataloader_num_workers": 0,
    "model_name_or_path": "tiny-bert", "max_seq_length": 64,
}


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_a_batch_that_fits_exits_0_with_one_line(capsys):
    code, out, err = run(capsys, "check", "tiny-bert", "--seq-len", "64", "--batch-size", "4", *SMALL)
    assert code == 0
    assert out.startswith("fits: tiny-bert seq 64 fp32 (sequence-classification, fp32 weights, "
                          "adamw_torch_fused, attention sdpa) on 1 GiB, batch 4: peak ")
    assert len(out.strip().splitlines()) == 1


def test_a_batch_that_does_not_fit_exits_1_with_a_suggestion(capsys):
    # 640 MiB: max batch 150, each lever's search settled over a tenth of its max (on 1 GiB, 1,406: ten
    # times as many replays; issue 39)
    code, out, _ = run(capsys, "check", "tiny-bert", "--seq-len", "64", "--batch-size", "100000",
                       "--gpu-memory", "640MiB", "--backend", "estimate", "--json")
    assert code == 1
    doc = json.loads(out)
    assert doc["fits"] is False and 0 < doc["max_batch_size"] < 100000
    assert doc["source"] == "estimated" and doc["backend"] == "estimate"
    for key in ("peak_memory_bytes", "budget_bytes", "suggestion"):
        assert key in doc
    assert "accumulation steps for an effective" in doc["suggestion"]
    assert "mode bf16+ckpt (max " in doc["suggestion"]  # a card given by size is taken as sm80+
    assert doc["message"].startswith("does not fit: tiny-bert seq 64 fp32 (sequence-classification, fp32 "
                                     "weights, adamw_torch_fused, attention sdpa) on 640 MiB: max batch ")
    assert (doc["task"], doc["weights_dtype"], doc["optimizer"], doc["attn"], doc["loss"]) == (
        "sequence-classification", "float32", "adamw_torch_fused", "sdpa", "full")
    assert doc["levers"] and all(lever["max_batch_size"] > doc["max_batch_size"] for lever in doc["levers"])
    maxima = [lever["max_batch_size"] for lever in doc["levers"]]
    assert maxima == sorted(maxima, reverse=True)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["check", "bert-huge", "--seq-len", "64", "--batch-size", "8"], "unknown model 'bert-huge'"),
        (["check", "bert-base-uncased", "--seq-len", "1024", "--batch-size", "8"],
         "sequence length 1024 exceeds max_position_embeddings=512 of bert-base-uncased"),
        (["check", "tiny-bert", "--batch-size", "8"], "missing seq_len: give --seq-len"),
        (["check", "tiny-bert", "--seq-len", "64", "--batch-size", "8", "--mode", "fp8"],
         "unknown mode 'fp8'"),
    ],
)
def test_bad_input_exits_2(capsys, argv, message):
    code, out, err = run(capsys, *argv)
    assert code == 2 and message in err


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_an_unreachable_server_exits_2(capsys):
    server = f"http://127.0.0.1:{_closed_port()}"
    code, _, err = run(capsys, "check", "tiny-bert", "--seq-len", "64", "--batch-size", "8",
                       "--server", server)
    assert code == 2 and f"server {server} is unreachable" in err


def test_from_config_reads_training_arguments(tmp_path, capsys):
    path = tmp_path / "training_args.json"
    path.write_text(json.dumps(TRAINING_ARGS))
    order = read_training_config(path).request
    assert (order.step.model, order.seq_len, order.batch_size, order.accumulation_steps, order.mode) == (
        "tiny-bert", 64, 8, 4, "amp+ckpt")
    code, out, _ = run(capsys, "check", "--from-config", str(path), *SMALL, "--json")
    doc = json.loads(out)
    assert code == 0 and doc["mode"] == "amp+ckpt" and doc["batch_size"] == 8


def test_from_config_yaml_flags_win_and_missing_keys_are_named(tmp_path, capsys):
    path = tmp_path / "plan.yaml"
    path.write_text("model: tiny-bert\nseq_len: 64\nmode: amp\n")
    code, _, err = run(capsys, "check", "--from-config", str(path), *SMALL)
    assert code == 2 and f"missing batch_size: give in '{path}' or --batch-size" in err
    code, out, _ = run(capsys, "check", "--from-config", str(path), "--batch-size", "2", *SMALL)
    assert code == 0 and " amp (sequence-classification, fp32 weights, adamw_torch_fused, attention sdpa) " \
        "on 1 GiB, batch 2" in out
    path.write_text("model: tiny-bert\nseq_len: 64\nmode: amp\nbatch_sise: 2\n")  # a typo: an error, exit 2
    code, _, err = run(capsys, "check", "--from-config", str(path), *SMALL)
    assert code == 2 and "unknown key batch_sise in" in err and "did you mean batch_size?" in err


def test_a_malformed_config_is_refused(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text("{not json")
    with pytest.raises(InvalidInput, match="is not valid JSON"):
        read_training_config(path)
    path.write_text(json.dumps({"per_device_train_batch_size": 0}))
    with pytest.raises(InvalidInput, match="batch size in .* must be a positive integer, got 0"):
        read_training_config(path)


@pytest.mark.parametrize(("effective", "max_batch", "plan"), [
    (64, 13, (8, 8)),  # the example
    (64, 29, (16, 4)),
    (61, 13, (13, 5)),  # a prime: micro-batches of the max, effective 65
    (8, 8, (8, 1)),
])
def test_accumulation_plan(effective, max_batch, plan):
    assert accumulation_plan(effective, max_batch) == plan


# -- the advice names only levers that raise the max batch ------------------------------------


class LimitBackend(limitbackend.LimitBackend):
    """Fits up to a limit per (optimizer, loss, mode, seq_len), else ``limits["base"]``: the
    advice's searches run against known answers."""

    def __init__(self, limits):
        self.limits = limits
        super().__init__(lambda workload, mode, seq_len: limits.get(
            (workload.optimizer, workload.loss, mode.name, seq_len), limits["base"]))


def _causal_workload():
    from autotune.workload import Workload
    from autotune.workload.models import resolve_model

    return Workload(resolve_model("tiny-gpt2"), "causal-lm", None)


def test_only_levers_that_raise_the_max_are_advised_best_first():
    from autotune.analysis.levers import helpful_levers, suggestion
    from autotune.workload.modes import parse_mode

    workload = _causal_workload()
    backend = LimitBackend({
        "base": 3,  # fp32 at seq 64, and everything not listed: no gain
        ("adamw_torch_fused", "full", "ckpt", 64): 5,  # checkpointing helps
        ("adamw_bnb_8bit", "full", "fp32", 64): 4,  # 8-bit AdamW helps less
    })
    levers = helpful_levers(backend, workload, parse_mode("fp32"), 64, 1 << 30, best=3)
    found = [(lever.name, lever.max_batch_size) for lever in levers]
    assert found == [("checkpointing", 5), ("optimizer", 4)]
    text = suggestion(3, 8, levers)
    assert text == ("use batch 2 x 4 accumulation steps for an effective 8, or mode ckpt (gradient "
                    "checkpointing) (max 5), or optimizer adamw_bnb_8bit (bitsandbytes 8-bit AdamW) (max 4)")
    assert "bf16" not in text and "chunked" not in text and "shorter" not in text


def test_nothing_fits_and_no_lever_helps_says_so_without_a_shorter_sequence():
    from autotune.analysis.levers import helpful_levers, suggestion
    from autotune.workload.modes import parse_mode

    backend = LimitBackend({"base": 0})
    levers = helpful_levers(backend, _causal_workload(), parse_mode("bf16+ckpt"), 64, 1 << 30, best=0)
    assert levers == []
    assert suggestion(0, 4, levers).startswith("even batch 1 does not fit with any lever autotune models")


def test_when_only_levers_together_fit_batch_1_the_advice_is_all_of_them():
    from autotune.analysis.levers import helpful_levers
    from autotune.workload.modes import parse_mode

    backend = LimitBackend({"base": 0, ("adamw_bnb_8bit", "chunked", "bf16+ckpt", 64): 2})
    levers = helpful_levers(backend, _causal_workload(), parse_mode("fp32"), 64, 1 << 30, best=0)
    assert [(lever.name, lever.max_batch_size) for lever in levers] == [("combined", 2)]
    assert levers[0].label.startswith("all of: mode bf16+ckpt; optimizer adamw_bnb_8bit")


def test_when_only_levers_together_over_a_4bit_base_fit_the_advice_is_all_of_them_with_qlora():
    # Llama-3.1-8B on 12 GiB: its bf16 weights alone exceed the budget whatever else changes; QLoRA
    # alone is too much at 2048 tokens without checkpointing; all of them over a 4-bit base fit.
    from autotune.analysis.levers import helpful_levers
    from autotune.workload.modes import parse_mode

    def limit(workload, mode, seq_len):
        quantized = workload.adapter is not None and workload.adapter.base_bits == 4
        return 2 if quantized and mode.name == "bf16+ckpt" and workload.loss == "chunked" else 0

    levers = helpful_levers(limitbackend.LimitBackend(limit), _causal_workload(), parse_mode("bf16"), 64,
                            1 << 30, best=0)
    assert [(lever.name, lever.max_batch_size) for lever in levers] == [("combined", 2)]
    assert levers[0].label.startswith("all of: mode bf16+ckpt; ")
    assert levers[0].label.endswith("; QLoRA r=16 on PEFT's default modules, 4-bit NF4 base, TRL's "
                                    "SFTTrainer recipe")


def test_a_shorter_sequence_is_advised_only_when_it_fits():
    from autotune.analysis.levers import helpful_levers
    from autotune.workload.modes import parse_mode

    backend = LimitBackend({"base": 0, ("adamw_torch_fused", "full", "bf16+ckpt", 32): 3})
    levers = helpful_levers(backend, _causal_workload(), parse_mode("bf16+ckpt"), 64, 1 << 30, best=0)
    assert [(lever.name, lever.label, lever.max_batch_size) for lever in levers] == [
        ("seq_len", "sequences of at most 32 tokens", 3)]


def test_a_lever_is_searched_up_to_the_cell_s_cap_not_the_default():
    # A plan above DEFAULT_MAX_BATCH (4096): the check's search is capped at the requested batch,
    # and so are the levers' (capped at 4096 they could never beat a max of 5000).
    from autotune.analysis.levers import helpful_levers
    from autotune.workload.modes import parse_mode

    backend = LimitBackend({"base": 5000, ("adamw_torch_fused", "full", "ckpt", 64): 8000})
    levers = helpful_levers(backend, _causal_workload(), parse_mode("fp32"), 64, 1 << 30, best=5000,
                            max_batch=10_000)
    assert [(lever.name, lever.max_batch_size) for lever in levers] == [("checkpointing", 8000)]


def test_from_config_qlora_recipe_alone_changes_only_how_the_base_is_prepared(tmp_path, capsys):
    path = tmp_path / "axolotl.yml"
    path.write_text("base_model: tiny-llama\nsequence_len: 32\nmicro_batch_size: 2\nadapter: qlora\n"
                    "load_in_4bit: true\nlora_r: 8\nlora_alpha: 16\nbf16: true\nlora_target_linear: true\n"
                    "lora_mlp_kernel: false\nlora_qkv_kernel: false\nlora_o_kernel: false\n")
    code, out, _ = run(capsys, "check", "--from-config", str(path), *SMALL, "--json")
    assert code == 0, out
    assert (json.loads(out)["adapter"]["recipe"], json.loads(out)["adapter"]["r"]) == ("axolotl", 8)
    code, out, _ = run(capsys, "check", "--from-config", str(path), *SMALL, "--qlora-recipe", "peft",
                       "--json")
    assert code == 0
    assert (json.loads(out)["adapter"]["recipe"], json.loads(out)["adapter"]["r"]) == ("peft", 8)


def test_a_batch_in_a_hole_below_the_max_does_not_fit_and_says_why():
    # 17 fits, 18 runs out, 19 and 20 fit, and the backend's max is 20 (the estimator's was, before
    # its max stayed below the first failure in its window; a failure further below still can be): a
    # plan of 18 still does not fit.
    from contextlib import nullcontext

    from autotune.analysis.check import check_step
    from autotune.search import Probe
    from autotune.workload.modes import parse_mode

    class Holed(limitbackend.LimitBackend):
        def cell(self, workload, mode, seq_len, budget_bytes):
            class Cell:
                def fits(self, batch):
                    ok = batch <= 20 and batch != 18
                    return Probe(batch, "fits" if ok else "oom", peak_bytes=batch)

                def predict(self, lo, hi):
                    return None

                def settle(self, boundary):
                    return 20 if boundary == 17 else None

                def above(self, boundary):
                    return None

            return nullcontext(Cell())

    backend = Holed(lambda workload, mode, seq_len: 0)
    workload = _causal_workload()
    for batch, fits in ((17, True), (18, False), (20, True)):
        result = check_step(workload, backend, backend.gpu, seq_len=64, batch_size=batch,
                            mode=parse_mode("fp32"), margin=0.05)
        assert (result.fits, result.max_batch_size) == (fits, 20), batch
    assert result.suggestion is None
    hole = check_step(workload, backend, backend.gpu, seq_len=64, batch_size=18, mode=parse_mode("fp32"),
                      margin=0.05)
    assert hole.levers == []
    assert hole.suggestion == ("batch 18 runs out of memory here though batch 20 fits: the caching "
                               "allocator fragments differently at the two sizes; use batch 20")
    assert hole.message.startswith("does not fit: ") and "use batch 20" in hole.message


def test_a_batch_that_fits_past_the_first_failure_is_a_note_beside_the_max():
    # 7 fits, 8 runs out, 9 fits (Llama-3.2-1B FSDP2 at 1024 on an H200 at 21.88 GiB): the max is 7,
    # as the H200 measured; 9 is said, in the message and the JSON, whatever batch was asked.
    from contextlib import nullcontext

    from autotune.analysis.check import check_step
    from autotune.search import Probe
    from autotune.workload.modes import parse_mode

    class Holed(limitbackend.LimitBackend):
        def cell(self, workload, mode, seq_len, budget_bytes):
            class Cell:
                def fits(self, batch):
                    ok = batch <= 9 and batch != 8
                    return Probe(batch, "fits" if ok else "oom", peak_bytes=batch)

                def predict(self, lo, hi):
                    return None

                def settle(self, boundary):
                    return 7 if boundary == 9 else None  # a search that stopped at 9 moves below 8

                def above(self, boundary):
                    return 9 if boundary == 7 else None

            return nullcontext(Cell())

    backend = Holed(lambda workload, mode, seq_len: 0)
    note = ("note: batch 9 also fits: batch 8 runs out of memory (the caching allocator fragments "
            "differently at the two sizes); the max is below the first batch that does")
    for batch, fits in ((7, True), (8, False), (9, False)):
        result = check_step(_causal_workload(), backend, backend.gpu, seq_len=64, batch_size=batch,
                            mode=parse_mode("fp32"), margin=0.05)
        assert (result.fits, result.max_batch_size, result.also_fits) == (fits, 7, 9), batch
        assert note in result.message.splitlines()
        assert result.to_dict()["also_fits"] == 9


def test_reentrant_checkpointing_is_traced_and_said(capsys):
    # use_reentrant=True recomputes each layer under an autograd.backward of its own, holding the
    # layer's whole recomputed graph: traced through torch.utils.checkpoint, a lower max here.
    step = ["check", "tiny-llama", "--seq-len", "128", "--batch-size", "4", "--mode", "bf16+ckpt",
            "--no-cache", "--json", *SMALL]
    _, plain, _ = run(capsys, *step)
    code, reentrant, _ = run(capsys, *step, "--ckpt-reentrant")
    plain_doc, reentrant_doc = json.loads(plain), json.loads(reentrant)
    assert code == 0 and (plain_doc["ckpt_reentrant"], reentrant_doc["ckpt_reentrant"]) == (False, True)
    assert reentrant_doc["max_batch_size"] < plain_doc["max_batch_size"]
    assert "reentrant checkpointing" in reentrant_doc["message"]
    assert "reentrant" not in plain_doc["message"]
