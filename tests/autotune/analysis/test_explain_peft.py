"""autotune explain with LoRA and QLoRA: the breakdown's frozen base, 4-bit base and adapter
weights, the 4-bit matmul's temporaries, the adapter in the result and the report, and the PEFT
levers (LoRA / QLoRA for a full fine-tune, QLoRA and a lower rank for LoRA).

tiny-llama throughout (hidden 32, two layers, float32 weights): PEFT's default targets are q_proj
and v_proj; QLoRA quantizes every linear layer but the output head.
"""

from __future__ import annotations

import json
from dataclasses import replace

import limitbackend
import pytest

from autotune.analysis.explain import (
    ADAPTER_WEIGHTS,
    BASE_4BIT,
    BASE_8BIT,
    CATEGORY_LABELS,
    DEQUANTIZATION,
    FROZEN_BASE,
    INT8_MATMUL,
    AdapterSplit,
    breakdown_of,
    category_keys,
    category_labels,
    dequantization,
    explain,
    parameter_table,
)
from autotune.analysis.levers import adapter_levers, helpful_levers, suggestion
from autotune.backends.estimate.backend import EstimateBackend
from autotune.backends.estimate.instrument import CATEGORIES, Allocation, InstrumentedBackend, Recording
from autotune.backends.estimate.nf4 import EmulatedLinear4bit, nf4_storage_bytes
from autotune.gpus import custom_gpu
from autotune.tuner import search_cell
from autotune.units import MIB
from autotune.workload import Workload
from autotune.workload.adapters import make_adapter
from autotune.workload.models import resolve_model
from autotune.workload.modes import parse_mode

GIB = 1024**3
SEQ = 64
BF16 = parse_mode("bf16")

TRL = "TRL's SFTTrainer recipe"  # how QLoRA levers name the default recipe


def llama(adapter: str | None = None, **settings) -> Workload:
    workload = Workload(resolve_model("tiny-llama"), "causal-lm", None)
    return workload if adapter is None else replace(workload, adapter=make_adapter(adapter, **settings))


@pytest.fixture(scope="module")
def one_gib():
    gpu = custom_gpu(GIB)
    return gpu, EstimateBackend(gpu)


def explained(one_gib, workload):
    gpu, backend = one_gib
    return explain(workload, backend, gpu, seq_len=SEQ, mode=BF16, margin=0.05, batch_size=4,
                   with_levers=False)


@pytest.fixture(scope="module")
def qlora_result(one_gib):
    return explained(one_gib, llama("qlora"))


@pytest.fixture(scope="module")
def lora_result(one_gib):
    return explained(one_gib, llama("lora"))


# -- the breakdown ------------------------------------------------------------------------------------


def test_an_8bit_base_has_its_storage_and_its_matmul_temporaries(one_gib):
    from autotune.backends.estimate.int8 import EmulatedLinear8bitLt, int8_storage_bytes

    gpu, backend = one_gib
    result = explained(one_gib, llama("lora_8bit"))
    categories = result.breakdown.categories
    assert tuple(categories) == category_keys(True, bits=8) == (
        FROZEN_BASE, BASE_8BIT, ADAPTER_WEIGHTS, "gradients", "optimizer_state", "autocast_copies",
        "activations", INT8_MATMUL, "temporaries", "inputs", "workspaces")
    assert sum(categories.values()) == result.breakdown.peak_allocated_bytes
    model = backend._model(llama("lora_8bit")).model
    layers = [m for m in model.modules() if isinstance(m, EmulatedLinear8bitLt)]
    assert len(layers) == 14  # 7 linear layers x 2 decoder layers; lm_head stays
    storage = sum(sum(int8_storage_bytes(m.in_features, m.out_features).values()) for m in layers)
    assert result.weight_bytes[BASE_8BIT] == storage
    labels = category_labels(result.adapter)
    assert labels[BASE_8BIT] == "8-bit base (int8 weights + row scales)"
    assert labels[INT8_MATMUL] == "8-bit matmul temporaries"


def test_qlora_splits_the_parameters_into_frozen_base_4bit_base_and_adapter_weights(one_gib, qlora_result):
    gpu, backend = one_gib
    result = qlora_result
    categories = result.breakdown.categories
    assert tuple(categories) == category_keys(True, bits=4) == (
        FROZEN_BASE, BASE_4BIT, ADAPTER_WEIGHTS, "gradients", "optimizer_state", "autocast_copies",
        "activations", DEQUANTIZATION, "temporaries", "inputs", "workspaces")
    assert sum(categories.values()) == result.breakdown.peak_allocated_bytes
    assert categories[FROZEN_BASE] > 0 and categories[BASE_4BIT] > 0 and categories[ADAPTER_WEIGHTS] > 0
    assert categories["optimizer_state"] > 0  # AdamW over the adapters; the peak is after step 1

    # The tensors: the 4-bit base is bitsandbytes' storage of every quantized layer, packed
    # weights and quantization state (nf4.nf4_storage_bytes), less than the same layers in bf16.
    layers = [m for m in backend._model(llama("qlora")).model.modules()
              if isinstance(m, EmulatedLinear4bit)]
    assert len(layers) == 14  # 7 linear layers x 2 decoder layers; lm_head stays
    storage = sum(sum(nf4_storage_bytes(m.in_features, m.out_features, double_quant=True).values())
                  for m in layers)
    bf16 = sum(2 * m.in_features * m.out_features for m in layers)
    assert result.weight_bytes[BASE_4BIT] == storage < bf16
    # TRL's recipe (the default) trains the adapters in bfloat16: 2 bytes a parameter.
    trainable = result.adapter["parameters"]["trainable"]
    assert result.adapter["recipe"] == "trl"
    assert result.weight_bytes[ADAPTER_WEIGHTS] == 2 * trainable > 0
    assert result.weight_bytes[FROZEN_BASE] > 0


def test_lora_has_no_4bit_lines_and_its_frozen_base_is_the_whole_model(one_gib, lora_result):
    gpu, backend = one_gib
    lora = lora_result
    categories = lora.breakdown.categories
    assert tuple(categories) == category_keys(True)
    assert BASE_4BIT not in categories and DEQUANTIZATION not in categories
    assert "parameters" not in categories
    assert sum(categories.values()) == lora.breakdown.peak_allocated_bytes
    full = backend._model(llama()).model
    params = sum(p.numel() * p.element_size() for p in full.parameters())
    buffers = sum(b.numel() * b.element_size() for b in full.buffers())
    assert lora.weight_bytes == {FROZEN_BASE: params + buffers, BASE_4BIT: 0,
                                 ADAPTER_WEIGHTS: 4 * lora.adapter["parameters"]["trainable"]}


def test_a_full_fine_tune_keeps_its_categories_and_has_no_adapter(one_gib):
    result = explained(one_gib, llama())
    assert tuple(result.breakdown.categories) == CATEGORIES
    assert result.adapter is None and result.weight_bytes is None
    assert category_labels(None) == CATEGORY_LABELS


def test_the_4bit_matmul_temporaries_are_recorded_in_forward_and_backward(one_gib):
    gpu, backend = one_gib
    workload = llama("qlora")
    instrumented = InstrumentedBackend(backend)
    with instrumented.cell(workload, BF16, SEQ, GIB) as cell:
        cell.fits(2)
    recording = instrumented.last
    made = [recording.allocations[i] for i in sorted(dequantization(recording))]
    assert {a.phase for a in made} == {"forward", "backward"}
    assert all(a.kind == "temporaries" for a in made)  # none outlives the matmul
    # Every quantized layer's weight dequantized to [out, in], in forward and backward.
    shapes = {(m.out_features, m.in_features) for m in backend._model(workload).model.modules()
              if isinstance(m, EmulatedLinear4bit)}
    for phase in ("forward", "backward"):
        assert shapes <= {a.shape for a in made if a.phase == phase}, phase
    # A full fine-tune has no 4-bit matmul.
    with instrumented.cell(llama(), BF16, SEQ, GIB) as cell:
        cell.fits(2)
    assert instrumented.last is not recording and dequantization(instrumented.last) == frozenset()


def test_where_the_weights_dominate_the_peak_holds_a_dequantized_weight(one_gib):
    # A wide two-layer Llama (hidden 1024, MLP 4096, vocabulary 128) at batch 1 x 16 tokens: the
    # step's largest tensors are the 4-bit layers' weights dequantized for the matmul.
    from autotune.workload.models import ModelSpec, tiny_config

    gpu, backend = one_gib
    config = tiny_config("llama", hidden_size=1024, intermediate_size=4096, vocab_size=128)
    workload = replace(Workload(ModelSpec("wide-llama", "local", config, 128), "causal-lm", None),
                       adapter=make_adapter("qlora"))
    result = explain(workload, backend, gpu, seq_len=16, mode=BF16, margin=0.05, batch_size=1,
                     with_levers=False)
    categories = result.breakdown.categories
    assert categories[DEQUANTIZATION] >= 2 * 1024 * 4096  # at least one MLP weight in 16 bits
    assert categories[DEQUANTIZATION] > categories["activations"] + categories["temporaries"]
    assert sum(categories.values()) == result.breakdown.peak_allocated_bytes


def test_the_breakdown_puts_each_allocation_in_its_adapter_category():
    # By hand: a frozen weight, a 4-bit weight, a LoRA matrix, and at the peak a dequantized
    # weight (a temporary made in the 4-bit matmul) and another temporary.
    allocations = [
        Allocation(MIB, "setup", 0, None, (MIB,), "float32", kind="parameters", param="embed.weight"),
        Allocation(MIB, "setup", 0, None, (MIB,), "uint8", kind="parameters", param="q.base_layer.weight"),
        Allocation(MIB, "setup", 0, None, (MIB,), "float32", kind="parameters", param="q.lora_A.weight"),
        Allocation(2 * MIB, "backward", 1, None, (2 * MIB,), "bfloat16"),
        Allocation(3 * MIB, "backward", 1, None, (3 * MIB,), "bfloat16"),
    ]
    events = [(1, MIB), (2, MIB), (3, MIB), (4, 2 * MIB), (5, 3 * MIB)]
    recording = Recording(1, 8, events, allocations, steps=1)
    split = AdapterSplit(4, {"q.base_layer.weight": BASE_4BIT, "q.lora_A.weight": ADAPTER_WEIGHTS},
                         frozenset({3}))
    breakdown = breakdown_of(recording, custom_gpu(GIB), budget=100 * MIB, demand_bytes=8 * MIB,
                             fits=True, split=split)
    assert {k: v for k, v in breakdown.categories.items() if v} == {
        FROZEN_BASE: MIB, BASE_4BIT: MIB, ADAPTER_WEIGHTS: MIB, DEQUANTIZATION: 2 * MIB,
        "temporaries": 3 * MIB}


# -- the result and the report --------------------------------------------------------------------------


def test_the_report_states_the_adapter_and_names_the_split(one_gib, qlora_result):
    from autotune.cli.explain import render

    result = qlora_result
    adapter = result.adapter
    assert adapter["method"] == "qlora" and adapter["targets"] == ["q_proj", "v_proj"]
    assert adapter["label"].startswith("QLoRA (nf4, double quant, TRL's SFTTrainer recipe) r=16 alpha=32 "
                                       "dropout 0.05 on "
                                       "q_proj,v_proj: ")
    doc = json.loads(json.dumps(result.to_dict()))
    assert doc["adapter"]["parameters"] == adapter["parameters"]
    assert set(doc["weight_bytes"]) == {FROZEN_BASE, BASE_4BIT, ADAPTER_WEIGHTS}
    text = render(result)
    assert f"\nadapter: {adapter['label']}\n" in text
    for label in ("frozen base (weights and buffers)", "4-bit base (NF4 weights + quantization state)",
                  "adapter weights (trainable)", "adapter gradients",
                  "optimizer state (adapter weights only)", "4-bit dequantization temporaries"):
        assert f"\n  {label} " in text, label
    assert "parameters and buffers" not in text
    # The 4-bit layers by the weights they hold (as PEFT counts them), their bytes packed.
    table, total = parameter_table(one_gib[1]._model(llama("qlora")).model)
    assert total == adapter["parameters"]["total"]
    row = next(r for r in table if r.name.endswith("layers.0.mlp.up_proj"))
    assert (row.description, row.params) == ("Linear4bit(32, 64, nf4)", 32 * 64)
    assert row.param_bytes == sum(nf4_storage_bytes(32, 64, double_quant=True).values())


def test_the_loss_logits_of_a_peft_model_are_named(lora_result):
    from autotune.analysis.explain import LOSS_LOGITS

    # transformers' loss runs in the forward of PEFT's base model (base_model.model), not the
    # wrapper's: its float32 logits are still named as the loss's.
    top = {row.type: row for row in lora_result.top_activations}
    assert top[LOSS_LOGITS].output_shape == (4, SEQ, 128)  # tiny-llama's vocabulary


# -- the levers ------------------------------------------------------------------------------------------


def test_the_peft_levers_of_each_setup():
    def names(workload):
        return [(name, label) for name, label, _ in adapter_levers(workload)]

    assert names(llama()) == [("lora", "LoRA r=16 on PEFT's default modules"),
                              ("qlora", f"QLoRA r=16 on PEFT's default modules, 4-bit NF4 base, {TRL}")]
    assert names(llama("lora", r=32, targets="all-linear")) == [
        ("qlora", f"QLoRA r=32: this LoRA over a 4-bit NF4 base, {TRL}"),
        ("lora-r16", "LoRA r=16, half the rank")]
    assert names(llama("qlora", r=8)) == [("qlora-r4", "QLoRA r=4, half the rank")]
    assert names(llama("qlora", r=1)) == []
    # The QLoRA lever of a LoRA setup keeps its rank and targets.
    (_, _, changed), _ = adapter_levers(llama("lora", r=32, targets="all-linear"))
    assert changed.adapter == make_adapter("qlora", r=32, targets="all-linear")


BUDGET = 100 * MIB  # 68 MiB of it the custom card's two cuBLAS workspaces: max batches in the tens


def searched(backend, workload, mode=BF16):
    return search_cell(backend, workload, mode, SEQ, BUDGET).max_batch_size


@pytest.mark.slow
def test_a_full_fine_tune_gets_lora_and_qlora_levers_searched_as_the_table(one_gib):
    from autotune.analysis.levers import what_if

    # SGD and bf16+ckpt: few other levers to search (amp+ckpt, frozen embeddings, the fused loss).
    gpu, backend = one_gib
    workload, mode = replace(llama(), optimizer="sgd"), parse_mode("bf16+ckpt")
    levers = {lever.name: lever for lever in what_if(
        workload, backend, seq_len=SEQ, mode=mode, budget=BUDGET, base_max=1, shorter_seq_lens=[SEQ])}
    for name, label in (("lora", "LoRA r=16"), ("qlora", "QLoRA r=16")):
        lever = levers[name]
        assert lever.label.startswith(label) and lever.error is None, name
        assert isinstance(lever.max_batch_size, int) and lever.max_batch_size >= 1
        assert (lever.mode, lever.seq_len, lever.optimizer) == ("bf16+ckpt", SEQ, "sgd")
        assert lever.adapter is not None and lever.adapter["method"] == name
        assert lever.note == lever.adapter["label"]
    qlora = replace(workload, adapter=make_adapter("qlora"))
    assert levers["qlora"].max_batch_size == searched(backend, qlora, mode)
    names = list(levers)
    assert names.index("fused-cross-entropy") < names.index("lora") < names.index("qlora")


@pytest.mark.slow
def test_a_lora_setup_gets_qlora_and_a_lower_rank_and_no_embedding_levers(one_gib):
    from autotune.analysis.levers import what_if

    gpu, backend = one_gib
    workload, mode = replace(llama("lora"), optimizer="sgd"), parse_mode("bf16+ckpt")
    levers = {lever.name: lever for lever in what_if(
        workload, backend, seq_len=SEQ, mode=mode, budget=BUDGET, base_max=1, shorter_seq_lens=[SEQ])}
    assert levers["qlora"].label == f"QLoRA r=16: this LoRA over a 4-bit NF4 base, {TRL}"
    assert levers["qlora"].adapter["method"] == "qlora"
    assert levers["qlora"].adapter["targets"] == ["q_proj", "v_proj"]
    assert levers["lora-r8"].label == "LoRA r=8, half the rank"
    assert levers["lora-r8"].max_batch_size == searched(
        backend, replace(workload, adapter=replace(workload.adapter, r=8)), mode)
    assert isinstance(levers["qlora"].max_batch_size, int) and levers["qlora"].max_batch_size >= 1
    assert "lora" not in levers and "frozen-embeddings" not in levers  # PEFT froze the embeddings
    # The chunked loss runs on the LM under PEFT's wrapper.
    assert levers["fused-cross-entropy"].error is None and levers["fused-cross-entropy"].max_batch_size >= 1


def test_a_qlora_lever_peft_cannot_build_is_an_error_not_a_crash(one_gib):
    from autotune.analysis.levers import search_lever

    # BERT sequence classification: transformers keeps the classifier's bias, not the module, out
    # of 4-bit; PEFT's modules_to_save then cannot train its packed weight.
    gpu, backend = one_gib
    bert = Workload(resolve_model("tiny-bert"), "sequence-classification", None)
    (_, _, lora), (name, label, qlora) = adapter_levers(bert)
    lever = search_lever(name, label, backend, qlora, BF16, SEQ, budget=BUDGET, max_batch=64)
    assert lever.max_batch_size is None and "PEFT cannot build qlora for a sequence-classification model: " \
        "transformers quantizes its head to 4 bits" in lever.error
    assert search_cell(backend, lora, BF16, SEQ, BUDGET).max_batch_size >= 1


# -- check's advice ------------------------------------------------------------------------------------


class AdapterLimitBackend(limitbackend.LimitBackend):
    """Fits up to a limit per PEFT method and rank (None: a full fine-tune), else 0."""

    def __init__(self, limits):
        self.limits = limits
        super().__init__(lambda workload, mode, seq_len: self.limits.get(
            None if workload.adapter is None else (workload.adapter.method, workload.adapter.r), 0))


def test_check_advises_qlora_and_lora_for_a_full_fine_tune_that_does_not_fit():
    backend = AdapterLimitBackend({None: 3, ("lora", 16): 6, ("qlora", 16): 9})
    levers = helpful_levers(backend, llama(), BF16, SEQ, 1 << 30, best=3)
    assert [(lever.name, lever.max_batch_size) for lever in levers] == [("adapter", 9), ("adapter", 6)]
    assert suggestion(3, 8, levers) == (
        "use batch 2 x 4 accumulation steps for an effective 8, or QLoRA r=16 on PEFT's default "
        f"modules, 4-bit NF4 base, {TRL} (max 9), or LoRA r=16 on PEFT's default modules (max 6)")


def test_check_advises_qlora_and_a_lower_rank_for_lora():
    backend = AdapterLimitBackend({("lora", 16): 2, ("qlora", 16): 5, ("lora", 8): 3})
    levers = helpful_levers(backend, llama("lora"), BF16, SEQ, 1 << 30, best=2)
    assert [(lever.label, lever.max_batch_size) for lever in levers] == [
        (f"QLoRA r=16: this LoRA over a 4-bit NF4 base, {TRL}", 5), ("LoRA r=8, half the rank", 3)]


def test_when_only_peft_fits_batch_1_the_step_s_own_levers_together_are_still_advised():
    # Batch 1 fits with QLoRA, or with the full fine-tune's levers all together (bf16+ckpt, 8-bit
    # AdamW, the chunked loss): the advice names both, as a full fine-tune may not want QLoRA.
    class Together(AdapterLimitBackend):
        def cell(self, workload, mode, seq_len, budget_bytes):
            if workload.adapter is None and workload.loss == "chunked" and mode.checkpointing:
                self.limits[None] = 2
            try:
                return super().cell(workload, mode, seq_len, budget_bytes)
            finally:
                self.limits[None] = 0

    levers = helpful_levers(Together({None: 0, ("qlora", 16): 4}), llama(), BF16, SEQ, 1 << 30, best=0)
    assert [(lever.name, lever.max_batch_size) for lever in levers] == [("adapter", 4), ("combined", 2)]
