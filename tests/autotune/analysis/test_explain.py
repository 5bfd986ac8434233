"""autotune explain: the breakdown, the outliers of the user stories, the levers, dynamic padding.

The stories: a vocabulary that grew to 867,813 tokens so the embeddings held 722 M parameters
(here 868,000 x hidden 32), and a dense layer over a flattened 2 x 512 x 768 sequence (here
2 x 64 x 32). Tiny configs throughout; figures checked by hand are spelled out.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from autotune.analysis.explain import LOSS_LOGITS, breakdown_of, explain, weight_state
from autotune.analysis.levers import accumulation_plan
from autotune.analysis.padding import length_stats, percentile, read_lengths
from autotune.backends.estimate.backend import EstimateBackend, _FakeModel
from autotune.backends.estimate.instrument import AdamW8bitState, InstrumentedBackend, Variant
from autotune.backends.estimate.trace import Trace
from autotune.errors import InvalidInput
from autotune.gpus import custom_gpu
from autotune.tuner import search_cell, tune_table
from autotune.units import MIB, format_bytes
from autotune.workload import Workload
from autotune.workload.models import ModelSpec, resolve_model, tiny_config
from autotune.workload.modes import parse_mode

GIB = 1024**3
VOCAB, HIDDEN = 868_000, 32  # the TabBERT story, scaled to a tiny hidden size
FP32 = parse_mode("fp32")


def tiny_bert() -> Workload:
    return Workload(resolve_model("tiny-bert"), "sequence-classification", None)


def huge_vocab() -> Workload:
    spec = ModelSpec("tiny-bert-868k", "local", tiny_config("bert", vocab_size=VOCAB), 128)
    return Workload(spec, "sequence-classification", None)


@pytest.fixture(scope="module")
def one_gib():
    gpu = custom_gpu(GIB)
    return gpu, EstimateBackend(gpu)


# -- the instrumented step is the table's step ------------------------------------------------------


@pytest.mark.parametrize("mode", ["fp32", "amp+ckpt"])
def test_the_instrumented_step_allocates_what_the_table_step_does(one_gib, mode):
    gpu, backend = one_gib
    workload, mode = tiny_bert(), parse_mode(mode)
    with backend.cell(workload, mode, 64, GIB):  # the cell turns checkpointing on for its probes
        expected = backend.trace(backend._model(workload), workload, mode, 64, 8)
    instrumented = InstrumentedBackend(backend)
    with instrumented.cell(workload, mode, 64, GIB) as cell:
        cell.fits(8)
    assert Trace.from_events(8, instrumented.last.events, instrumented.last.workspaces) == expected


def test_the_breakdown_adds_up_to_the_peak_the_probe_reports(one_gib):
    gpu, backend = one_gib
    amp = parse_mode("amp")
    result = explain(tiny_bert(), backend, gpu, seq_len=64, mode=amp, margin=0.05, batch_size=64,
                     with_levers=False)
    breakdown = result.breakdown
    with backend.cell(tiny_bert(), amp, 64, result.budget_bytes) as cell:
        probe = cell.fits(64)
    assert sum(breakdown.categories.values()) == breakdown.peak_allocated_bytes
    assert breakdown.peak_allocated_bytes == probe.details["peak_allocated_bytes"]
    assert breakdown.demand_bytes == probe.details["demand_bytes"]
    assert breakdown.cached_bytes == breakdown.demand_bytes - breakdown.peak_allocated_bytes
    assert result.fits and breakdown.fits and result.batch_size == 64 <= result.max_batch_size
    # The custom card counts as Hopper-class: two cuBLAS workspaces of 32 + 1 MiB (gpus.py), each a
    # whole 34 MiB segment (2 MiB granularity; a 1 MiB rest is not split off a large block).
    assert breakdown.categories["workspaces"] == 2 * 34 * MIB
    # AMP keeps float16 copies of the weights; a batch of 64 x 64 tokens saves activations.
    assert breakdown.categories["autocast_copies"] > 0 and breakdown.categories["activations"] > 0
    assert breakdown.peak_phase in ("forward", "backward", "optimizer step")
    assert result.flags == []  # a per-token BERT: no outliers


# -- the huge vocabulary ---------------------------------------------------------------------------


def test_an_868k_vocabulary_is_counted_and_flagged():
    gpu = custom_gpu(4 * GIB)
    result = explain(huge_vocab(), EstimateBackend(gpu), gpu, seq_len=64, mode=FP32, margin=0.05,
                     with_levers=False)
    top = result.top_parameters[0]
    assert (top.name, top.description) == ("bert.embeddings.word_embeddings", "Embedding(868000, 32)")
    assert top.params == VOCAB * HIDDEN == 27_776_000 and top.param_bytes == 4 * 27_776_000
    assert top.share > 0.99
    assert [(f.kind, f.module) for f in result.flags] == [
        ("huge-vocabulary", "bert.embeddings.word_embeddings")]
    assert "a vocabulary of 868,000 tokens x 32" in result.flags[0].message
    assert result.max_batch_size > 0 and result.does_not_fit is None


def test_even_batch_1_names_the_embedding_that_alone_exceeds_the_budget():
    # 800 MiB card: budget (800 - 512 context) x 0.95 = 273.6 MiB. The embedding's weights,
    # gradients and AdamW's two moments are 4 x 868,000 x 32 x 4 B = 423.83 MiB on their own.
    gpu = custom_gpu(800 * MIB)
    result = explain(huge_vocab(), EstimateBackend(gpu), gpu, seq_len=64, mode=FP32, margin=0.05,
                     batch_size=8, with_levers=False)
    assert result.max_batch_size == 0 and result.batch_size == 1 and not result.fits
    assert result.does_not_fit == (
        "even batch 1 does not fit in the 273.6 MiB budget: the parameters, gradients and AdamW state "
        "of bert.embeddings.word_embeddings (Embedding(868000, 32), 27,776,000 parameters) alone "
        f"take {format_bytes(4 * 4 * VOCAB * HIDDEN)}"
    )
    # At batch 1 the Trainer's fused AdamW (the default) has no temporaries in its step: the peak
    # is the second backward, over the state. foreach AdamW's step adds a weights-sized temporary
    # and sets the peak.
    assert result.breakdown.peak_phase == "backward"
    foreach = explain(dataclasses.replace(huge_vocab(), optimizer="adamw_torch"), EstimateBackend(gpu),
                      gpu, seq_len=64, mode=FP32, margin=0.05, batch_size=8, with_levers=False)
    assert foreach.breakdown.peak_phase == "optimizer step"


def test_weights_alone_over_the_budget_are_still_explained_at_batch_1():
    # 600 MiB card: budget (600 - 512) x 0.95 = 83.6 MiB, under the 105.96 MiB of the embedding's
    # weights. The search takes that bound without a trace; explain traces batch 1 all the same
    # (it was an internal error: no recording).
    gpu = custom_gpu(600 * MIB)
    result = explain(huge_vocab(), EstimateBackend(gpu), gpu, seq_len=64, mode=FP32, margin=0.05,
                     with_levers=False)
    assert result.max_batch_size == 0 and result.batch_size == 1 and not result.fits
    assert result.breakdown.categories["parameters"] >= 4 * VOCAB * HIDDEN > result.budget_bytes
    assert result.does_not_fit is not None and "bert.embeddings.word_embeddings" in result.does_not_fit


def test_8bit_adamw_state_is_two_bytes_a_parameter_plus_block_scales():
    big, small = nn.Parameter(torch.zeros(10_000)), nn.Parameter(torch.zeros(100))
    optimizer = AdamW8bitState([big, small])
    big.grad, small.grad = torch.zeros(10_000), torch.zeros(100)
    optimizer.step()
    state = optimizer.state[big]
    assert (state["state1"].dtype, state["state1"].nbytes) == (torch.uint8, 10_000)
    assert (state["state2"].dtype, state["state2"].nbytes) == (torch.uint8, 10_000)
    assert state["absmax1"].shape == state["absmax2"].shape == (40,)  # ceil(10,000 / 256) float32 scales
    assert state["qmap1"].numel() == state["qmap2"].numel() == 256
    # Under min_8bit_size (4,096 elements) bitsandbytes keeps float32 moments.
    assert optimizer.state[small]["state1"].dtype == torch.float32


def test_the_8bit_state_of_the_embedding_in_the_trace(one_gib):
    gpu, backend = one_gib
    n = VOCAB * HIDDEN

    def embedding_state(variant):
        instrumented = InstrumentedBackend(backend, variant)
        with instrumented.cell(huge_vocab(), FP32, 16, GIB) as cell:
            cell.fits(1)
        return weight_state(instrumented.last)["bert.embeddings.word_embeddings.weight"]["optimizer_state"]

    # Two uint8 moments, two float32 scales per 256 elements, and the two shared 256-value maps
    # (counted with the first parameter that gets state, the embedding).
    assert embedding_state(Variant(optimizer="adamw-8bit")) == 2 * n + 2 * 4 * math.ceil(n / 256) + 2 * 1024
    # As transformers' Trainer sets it up: the embedding keeps two float32 moments.
    assert embedding_state(Variant(optimizer="adamw-8bit", fp32_state_for_embeddings=True)) == 2 * 4 * n


# -- the outsized linear head ------------------------------------------------------------------------

SEQ, ANSWERS = 64, 200  # the story's Dense(1604) over [2, 512, 768], scaled down


class FlattenedQA(nn.Module):
    """The SQuAD story: question and context encodings flattened, concatenated, one dense layer."""

    def __init__(self, config) -> None:
        super().__init__()
        from transformers import BertModel

        self.config = config
        self.bert = BertModel(config)
        self.answers = nn.Linear(2 * SEQ * config.hidden_size, ANSWERS)

    def forward(self, input_ids, attention_mask, start_positions, end_positions):
        hidden = self.bert(input_ids, attention_mask=attention_mask).last_hidden_state
        question, context = hidden.flatten(1), hidden.flatten(1)  # the story encodes both with BERT
        logits = self.answers(torch.cat([question, context], dim=1))
        return SimpleNamespace(loss=F.cross_entropy(logits, start_positions))


class FlattenedQABackend(EstimateBackend):
    """The estimate backend on a model no config describes."""

    def _model(self, workload, precision="fp32"):
        if workload not in self._models:
            fake_mode = FakeTensorMode()
            with fake_mode:
                model = FlattenedQA(workload.model.config).train()
            self._models[workload] = _FakeModel(model, fake_mode, "sdpa")
        return self._models[workload]


def test_a_dense_layer_over_the_flattened_sequence_is_flagged():
    gpu = custom_gpu(GIB)
    spec = ModelSpec("flattened-qa", "local", tiny_config("bert"), 128)
    workload = Workload(spec, "question-answering", None)
    result = explain(workload, FlattenedQABackend(gpu), gpu, seq_len=SEQ, mode=FP32, margin=0.05,
                     with_levers=False)
    top = result.top_parameters[0]
    # in_features 2 x 64 x 32 = 4,096; 4,096 x 200 weights + 200 biases.
    assert (top.name, top.description, top.params) == ("answers", "Linear(4096, 200)", 819_400)
    assert [(f.kind, f.module) for f in result.flags] == [("flattened-sequence", "answers")]
    assert "in_features 4,096 = 2 x seq_len 64 x hidden 32" in result.flags[0].message
    assert sum(result.breakdown.categories.values()) == result.breakdown.peak_allocated_bytes


# -- levers and dynamic padding agree with the table -------------------------------------------------


def table_cell(gpu, mode: str, seq_len: int, workload: Workload | None = None) -> int:
    """The max batch of a one-cell table (a table of several lengths hints each search with the
    shorter lengths' answers, and may stop at another boundary where the allocator is not monotone)."""
    table = tune_table(workload or tiny_bert(), EstimateBackend(gpu), gpu, seq_lens=[seq_len],
                       modes=[parse_mode(mode)])
    return table.cells[0].max_batch_size


@pytest.mark.slow
def test_levers_and_padding_agree_with_the_table():
    # 640 MiB, a budget of 88 MiB past the context: max batches near 150 to 300, each search settled
    # over a tenth of its max (estimate/backend.py _settle; on 1 GiB ten times as many replays).
    gpu = custom_gpu(640 * MIB)
    lengths = list(range(1, 101))  # p50 50, p90 90, p99 99, max 100 by hand
    result = explain(tiny_bert(), EstimateBackend(gpu), gpu, seq_len=64, mode=FP32, margin=0.05,
                     batch_size=5000, lengths=lengths)
    levers = {lever.name: lever for lever in result.levers}
    assert result.max_batch_size == table_cell(gpu, "fp32", 64)
    for name in ("amp", "bf16", "ckpt", "amp+ckpt"):
        assert levers[name].max_batch_size == table_cell(gpu, name, 64), name
        assert levers[name].estimated == "as the table"
    assert levers["seq-32"].max_batch_size == table_cell(gpu, "fp32", 32)
    sgd = Workload(tiny_bert().model, "sequence-classification", None, "sgd")
    assert levers["sgd"].max_batch_size == table_cell(gpu, "fp32", 64, sgd)
    micro, steps = accumulation_plan(5000, result.max_batch_size)
    assert levers["accumulation"].max_batch_size == micro
    assert f"x {steps} accumulation steps" in levers["accumulation"].note
    for name in ("adamw-8bit", "adamw-8bit-trainer", "frozen-embeddings"):
        assert levers[name].max_batch_size >= 1, name

    padding = result.padding
    assert (padding.stats.p50, padding.stats.p90, padding.stats.p99, padding.stats.max) == (50, 90, 99, 100)
    assert padding.stats.truncated == 36  # 65..100 are cut to 64
    # Buckets at p50 = 50 -> 56 (a multiple of 8) and at seq_len 64 (p90 and above are truncated).
    assert [(b.max_len, b.count) for b in padding.buckets] == [(56, 56), (64, 44)]
    assert padding.buckets[0].max_batch_size == table_cell(gpu, "fp32", 56)
    assert padding.buckets[1].max_batch_size == padding.fixed_max_batch == result.max_batch_size
    assert padding.fixed_padding == pytest.approx(1 - (sum(range(1, 65)) + 36 * 64) / (100 * 64))


def test_percentiles_are_nearest_rank():
    assert [percentile([1, 2, 3, 4], p) for p in (25, 50, 51, 100)] == [1, 2, 3, 4]
    stats = length_stats([5, 1, 9, 3], seq_len=4)
    assert (stats.p50, stats.max, stats.truncated, stats.mean) == (3, 9, 2, 4.5)


@pytest.mark.parametrize(("text", "message"), [
    ("12\n\n7\nabc\n", "line 4: 'abc' is not a positive integer"),
    ("12\n0\n", "line 2: '0' is not a positive integer"),
    ("\n\n", "holds no lengths"),
])
def test_a_bad_lengths_file_is_refused_with_the_line(tmp_path, text, message):
    path = tmp_path / "lengths.txt"
    path.write_text(text)
    with pytest.raises(InvalidInput, match=message):
        read_lengths(path)


# -- the command line ------------------------------------------------------------------------------


@pytest.fixture
def huge_vocab_dir(tmp_path):
    config = {"model_type": "bert", **tiny_config("bert").to_diff_dict(), "vocab_size": VOCAB}
    (tmp_path / "config.json").write_text(json.dumps(config))
    return str(tmp_path)


def test_the_report_says_batch_1_does_not_fit_and_flags_the_embedding(explain_cli_run, huge_vocab_dir):
    code, out, _ = explain_cli_run(huge_vocab_dir, "--seq-len", "64", "--gpu-memory", "1GiB", "--no-levers")
    assert code == 0
    assert "max batch 0 (estimated); explained at batch 1" in out
    assert "even batch 1 does not fit in the 486.4 MiB budget" in out
    assert "bert.embeddings.word_embeddings (Embedding(868000, 32), 27,776,000 parameters)" in out
    assert "! bert.embeddings.word_embeddings: a vocabulary of 868,000 tokens x 32" in out
    assert "= peak allocated" in out and "+ CUDA context" in out


def test_embedding_levers_rank_as_their_state_sizes(explain_cli_run, huge_vocab_dir):
    # 1 GiB card: budget 486.4 MiB, of which the workspaces take 68 MiB. With AdamW the embedding
    # holds 4 x 106 MiB (weights, gradients, two moments): batch 1 does not fit, nor with the
    # Trainer's 8-bit setup, which keeps the embedding's moments at 32 bits. Through forward and
    # backward, what stays of the embedding besides its weights: 8-bit AdamW's moments (2 bytes
    # a parameter, 53 MiB); SGD and a frozen embedding keep nothing (the embedding's gradient
    # is the last one backward makes, when the activations are gone), so they fit the most.
    code, out, _ = explain_cli_run(huge_vocab_dir, "--seq-len", "64", "--gpu-memory", "1GiB", "--json")
    assert code == 0
    doc = json.loads(out)
    batches = {lever["name"]: lever["max_batch_size"] for lever in doc["levers"]}
    assert doc["max_batch_size"] == 0 and batches["adamw-8bit-trainer"] == 0
    assert batches["frozen-embeddings"] >= batches["sgd"] > batches["adamw-8bit"] > 0
    assert doc["breakdown"]["peak_allocated_bytes"] == sum(doc["breakdown"]["categories"].values())


@pytest.mark.parametrize(("argv", "message"), [
    (["bert-huge"], "Error: unknown model 'bert-huge'"),
    (["tiny-bert", "--seq-len", "1024"], "Error: sequence length 1024 exceeds max_position_embeddings=128"),
    (["tiny-bert", "--mode", "fp8"], "Error: unknown mode 'fp8'"),
])
def test_bad_input_exits_2_with_the_reason(explain_cli_run, argv, message):
    code, out, err = explain_cli_run(*argv)
    assert code == 2 and out == ""
    assert err.startswith(message)


def test_a_missing_lengths_file_exits_2(explain_cli_run, tmp_path):
    code, _, err = explain_cli_run("tiny-bert", "--lengths", str(tmp_path / "none.txt"))
    assert code == 2 and err.startswith("Error: cannot read lengths file")


def test_breakdown_of_a_trace_by_hand():
    # Two 1 MiB blocks alive together, then one freed and a 3 MiB one: the peak is 4 MiB, at the
    # last allocation, made of the first block (a parameter) and the 3 MiB temporary.
    from autotune.backends.estimate.instrument import Allocation, Recording

    allocations = [Allocation(MIB, "setup", 0, None, (MIB,), "uint8", kind="parameters"),
                   Allocation(MIB, "forward", 1, "", (MIB,), "uint8", kind="activations"),
                   Allocation(3 * MIB, "backward", 1, None, (3 * MIB,), "uint8")]
    events = [(1, MIB), (2, MIB), (2, -1), (3, 3 * MIB)]
    recording = Recording(1, 8, events, allocations, steps=1)
    breakdown = breakdown_of(recording, custom_gpu(GIB), budget=100 * MIB, demand_bytes=6 * MIB, fits=True)
    assert breakdown.peak_allocated_bytes == 4 * MIB
    assert (breakdown.peak_phase, breakdown.peak_step) == ("backward", 1)
    assert {k: v for k, v in breakdown.categories.items() if v} == {"parameters": MIB, "temporaries": 3 * MIB}


def test_explain_needs_the_estimate_backend(one_gib):
    gpu, _ = one_gib

    class Measuring:
        name = "cuda"

    with pytest.raises(InvalidInput, match="explain needs the estimate backend"):
        explain(tiny_bert(), Measuring(), gpu, seq_len=64, mode=FP32, margin=0.05)


def test_max_batch_is_the_cells(one_gib):
    gpu, backend = one_gib
    result = explain(tiny_bert(), backend, gpu, seq_len=32, mode=FP32, margin=0.05, with_levers=False)
    assert result.max_batch_size == search_cell(backend, tiny_bert(), FP32, 32,
                                                result.budget_bytes).max_batch_size
    assert result.batch_size == result.max_batch_size and result.requested_batch_size is None


# -- the loss's logits -------------------------------------------------------------------------------

LM_VOCAB, LM_HIDDEN, LM_BATCH, LM_SEQ = 4096, 128, 4, 128  # as tests/autotune/workload/test_loss.py


def vocab_heavy_lm(task: str = "causal-lm") -> Workload:
    """A one-layer GPT-2 whose vocabulary is 32 x its width: the loss's logits dominate."""
    config = tiny_config("gpt2", vocab_size=LM_VOCAB, n_embd=LM_HIDDEN, n_layer=1, n_inner=2 * LM_HIDDEN,
                         bos_token_id=0, eos_token_id=0)
    return Workload(ModelSpec("tiny-gpt2-vocab", "local", config, 128), task, None)


def test_the_logits_of_the_loss_are_named_and_flagged_as_the_largest_activation(one_gib):
    gpu, backend = one_gib
    result = explain(vocab_heavy_lm(), backend, gpu, seq_len=LM_SEQ, mode=FP32, margin=0.05,
                     batch_size=LM_BATCH, with_levers=False)
    top = result.top_activations[0]
    # The log-softmax of the float32 logits, [4 x 128, 4096] x 4 B = 8 MiB, saved for backward.
    assert (top.name, top.type, top.output_shape) == ("", LOSS_LOGITS, (LM_BATCH, LM_SEQ, LM_VOCAB))
    assert top.activation_bytes == LM_BATCH * LM_SEQ * LM_VOCAB * 4 == 8 * MIB
    flags = [flag for flag in result.flags if flag.kind == "loss-logits"]
    assert len(flags) == 1
    assert flags[0].message.startswith(
        f"the logits of the loss (float32, [batch 4, seq 128, vocab 4,096]) are the largest activation: "
        f"{format_bytes(8 * MIB)}, {top.share:.0%} of those saved for backward")
    assert "loss 'chunked', as Liger Kernel's" in flags[0].message


def test_with_the_chunked_loss_there_are_no_logits_to_flag(one_gib):
    gpu, backend = one_gib
    workload = replace(vocab_heavy_lm(), loss="chunked")
    result = explain(workload, backend, gpu, seq_len=LM_SEQ, mode=FP32, margin=0.05, batch_size=LM_BATCH,
                     with_levers=False)
    assert LOSS_LOGITS not in [row.type for row in result.top_activations]
    assert "loss-logits" not in [flag.kind for flag in result.flags]
    # What the fused loss keeps instead: its gradients of the hidden states and of the head's weight.
    fused = next(row for row in result.top_activations if row.name == "")
    assert fused.type == "gradients of the fused loss (hidden states, head weight)"
    assert fused.activation_bytes >= (LM_BATCH * LM_SEQ + LM_VOCAB) * LM_HIDDEN * 4


def test_the_header_states_the_step_it_modelled(one_gib):
    from autotune.cli.explain import render

    gpu, backend = one_gib
    result = explain(vocab_heavy_lm(), backend, gpu, seq_len=LM_SEQ, mode=FP32, margin=0.05,
                     batch_size=LM_BATCH, with_levers=False)
    doc = result.to_dict()
    assert {key: doc[key] for key in ("task", "weights_dtype", "optimizer", "attn", "loss",
                                      "attention_kernel")} == {
        "task": "causal-lm", "weights_dtype": "float32", "optimizer": result.optimizer, "attn": "sdpa",
        "loss": "full", "attention_kernel": "memory-efficient"}  # SDPA's kernel for float32
    text = render(result)
    assert (f"step: task causal-lm, weights float32, optimizer {result.optimizer}, attention sdpa "
            "(memory-efficient), loss full\n") in text
    row = next(line for line in text.splitlines() if LOSS_LOGITS in line)
    assert row.split()[:7] == ["(model)", "logits", "of", "the", "loss", "(float32)", "->"]
    assert "-> 4 x 128 x 4096 " in row


def test_the_fused_cross_entropy_lever_is_the_chunked_step_searched_as_the_table(one_gib):
    # The lever as what_if plans and reports it (explained_levers, then report_lever: what its
    # default runner does for each lever), searched alone: what_if's other levers are the
    # modes', 8-bit AdamW's, SGD's and a shorter length's, tested in test_levers_and_padding_agree_...
    from autotune.analysis.levers import explained_levers, report_lever
    from autotune.defaults import DEFAULT_MAX_BATCH

    gpu, backend = one_gib
    workload, budget = vocab_heavy_lm(), 200 * MIB
    base = search_cell(backend, workload, FP32, LM_SEQ, budget).max_batch_size
    (planned,) = [lever for lever in explained_levers(workload, backend, seq_len=LM_SEQ, mode=FP32,
                                                      peft=False) if lever.name == "fused-cross-entropy"]
    lever = report_lever(planned, backend, budget=budget, max_batch=DEFAULT_MAX_BATCH)
    assert lever.label == "fused linear cross-entropy (chunked logits, as Liger Kernel)"
    chunked = search_cell(backend, replace(workload, loss="chunked"), FP32, LM_SEQ, budget).max_batch_size
    assert lever.max_batch_size == chunked > base > 0
    assert lever.estimated == "as the table" and lever.error is None


def test_the_fused_cross_entropy_lever_is_offered_only_for_a_causal_lm_with_its_own_loss(one_gib):
    # Which levers an explanation reports is explained_levers' plan (what_if searches each of them
    # and adds accumulation): no search needed to see one is not offered.
    from autotune.analysis.levers import explained_levers

    gpu, backend = one_gib
    workloads = {"lm": vocab_heavy_lm(), "chunked": replace(vocab_heavy_lm(), loss="chunked"),
                 "bert": tiny_bert()}
    offered = {name: [lever.name for lever in explained_levers(workload, backend, seq_len=32,
                                                               mode=parse_mode("amp+ckpt"), peft=False)]
               for name, workload in workloads.items()}
    assert "fused-cross-entropy" in offered["lm"]  # the plan offers it where it applies
    assert "fused-cross-entropy" not in offered["chunked"] and "fused-cross-entropy" not in offered["bert"]


def test_modules_of_equal_size_are_listed_in_the_model_s_order():
    from autotune.analysis.explain import module_order

    names = ["m.layer.10.out", "m.layer.2.out", "m.layer.1.out", "m.embeddings", ""]
    assert sorted(names, key=module_order) == ["", "m.embeddings", "m.layer.1.out", "m.layer.2.out",
                                               "m.layer.10.out"]


def test_a_lever_label_too_long_for_its_column_has_a_line_of_its_own():
    from autotune.analysis.levers import LeverReport
    from autotune.cli.explain import LEVER_LABEL_WIDTH, _lever_line

    label = "QLoRA r=16 on PEFT's default modules, 4-bit NF4 base, TRL's SFTTrainer recipe"
    assert len(label) > LEVER_LABEL_WIDTH
    broken = LeverReport("qlora", label, None, "bf16", 64, "adamw_torch", "as the table",
                         error="PEFT cannot build qlora for a sequence-classification model")
    first, second = _lever_line(broken, 100).split("\n")
    assert first == f"  {label}" and second.strip() == "n/a: PEFT cannot build qlora for a " \
        "sequence-classification model"
    fits = replace(broken, max_batch_size=150, error=None)
    assert _lever_line(fits, 100).split("\n")[1].split() == ["150", "+50%"]
    short = replace(fits, label="bf16 (autocast bfloat16)")
    assert "\n" not in _lever_line(short, 100) and _lever_line(short, 100).split()[-2:] == ["150", "+50%"]
