"""LoRA and QLoRA (workload/adapters.py, backends/estimate/nf4.py): what PEFT builds, the 4-bit
storage bitsandbytes would allocate, the options' checks, and the three steps' order."""

from __future__ import annotations

import json

import pytest
import torch
from peft import LoraConfig, get_peft_model

from autotune.backends.estimate.backend import EstimateBackend
from autotune.backends.estimate.nf4 import EmulatedLinear4bit, nf4_storage_bytes
from autotune.backends.estimate.parts import ESTIMATE_PARTS
from autotune.errors import InvalidInput
from autotune.gpus import custom_gpu
from autotune.request import PeftOptions
from autotune.tuner import budget_bytes, search_cell
from autotune.workload import Workload
from autotune.workload.adapters import (
    Adapter,
    adapter_from_peft_config,
    make_adapter,
    summarize,
)
from autotune.workload.models import _spec, resolve_model, tiny_config
from autotune.workload.modes import parse_mode
from autotune.workload.step import build_model


def _peft_counts(name: str, config: LoraConfig) -> tuple[int, int]:
    """PEFT's own get_nb_trainable_parameters on the model built from the same preset (meta
    device: shapes only, as PEFT counts them)."""
    spec = resolve_model(name)
    with torch.device("meta"):
        model, _ = build_model(spec, "causal-lm", "eager", "bfloat16")
        return get_peft_model(model, config).get_nb_trainable_parameters()


@pytest.mark.parametrize("name", ["tiny-llama", "meta-llama/Llama-3.2-1B"])
@pytest.mark.parametrize("targets", [None, "all-linear"])
def test_parameter_counts_are_peft_s(name: str, targets: str | None) -> None:
    adapter = make_adapter("lora", r=16, alpha=32, dropout=0.05, targets=targets)
    workload = Workload(resolve_model(name), "causal-lm", None, weights_dtype="bfloat16", adapter=adapter)
    summary = summarize(workload, ESTIMATE_PARTS)
    assert summary is not None
    config = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.05, target_modules=targets, task_type="CAUSAL_LM")
    trainable, total = _peft_counts(name, config)
    assert (summary.parameters.trainable, summary.parameters.total) == (trainable, total)
    # QLoRA trains the same adapters; PEFT counts a 4-bit weight as its unpacked elements.
    quantized = summarize(Workload(resolve_model(name), "causal-lm", None, weights_dtype="bfloat16",
                                   adapter=make_adapter("qlora", targets=targets)), ESTIMATE_PARTS)
    assert quantized is not None
    assert (quantized.parameters.trainable, quantized.parameters.total) == (trainable, total)


def test_llama_1b_default_targets_and_label() -> None:
    workload = Workload(resolve_model("meta-llama/Llama-3.2-1B"), "causal-lm", None,
                        weights_dtype="bfloat16", adapter=make_adapter("qlora"))
    summary = summarize(workload, ESTIMATE_PARTS)
    assert summary is not None
    assert summary.targets == ("q_proj", "v_proj")  # PEFT's default for llama
    # 16 layers x (q: 2048x16 + 16x2048, v: 2048x16 + 16x512)
    assert summary.parameters.trainable == 16 * (2048 * 16 + 16 * 2048 + 2048 * 16 + 16 * 512)
    assert summary.label().startswith("QLoRA (nf4, double quant, TRL's SFTTrainer recipe) r=16 alpha=32 "
                                      "dropout 0.05 on q_proj,v_proj: 1.70M of 1.24B parameters trainable")
    assert summary.to_json()["targets_default"] is True


def test_nf4_storage_is_bitsandbytes_bytes() -> None:
    # A 4096 x 4096 layer: 16,777,216 weights in 4 bits, 262,144 blocks of 64.
    assert nf4_storage_bytes(4096, 4096, double_quant=False) == {
        "weight": 8_388_608, "code": 64, "absmax": 262_144 * 4}
    assert nf4_storage_bytes(4096, 4096, double_quant=True) == {
        "weight": 8_388_608, "code": 64, "absmax": 262_144, "offset": 4,
        "state2_absmax": 1024 * 4, "state2_code": 256 * 4}
    # An odd count rounds the packed bytes and the blocks up: 3 x 5 = 15 weights -> 8 bytes, 1 block.
    assert nf4_storage_bytes(3, 5, double_quant=True)["weight"] == 8
    assert nf4_storage_bytes(3, 5, double_quant=True)["absmax"] == 1


@pytest.mark.parametrize("double_quant", [True, False])
def test_emulated_layer_holds_exactly_that_storage(double_quant: bool) -> None:
    with torch.device("meta"):
        layer = EmulatedLinear4bit(torch.nn.Linear(4096, 1024, bias=False, dtype=torch.bfloat16),
                                   quant_type="nf4", double_quant=double_quant, compute_dtype="bfloat16")
    held = sum(t.numel() * t.element_size() for t in (*layer.parameters(), *layer.buffers()))
    assert held == sum(nf4_storage_bytes(4096, 1024, double_quant=double_quant).values())
    assert layer.weight.dtype == torch.uint8 and not layer.weight.requires_grad
    assert (layer.in_features, layer.out_features) == (4096, 1024)


@pytest.mark.parametrize(("options", "message"), [
    (PeftOptions(load_in_4bit=True), "load_in_4bit trains adapters only"),
    (PeftOptions(lora_r=8), "lora_r needs peft lora or peft qlora"),
    (PeftOptions(peft="lora", bnb_4bit_quant_type="fp4"), "set a 4-bit base"),
    (PeftOptions(load_in_8bit=True), "load_in_8bit trains adapters only"),
    (PeftOptions(peft="qlora", load_in_8bit=True), "load_in_8bit and peft qlora ask for two bases"),
    (PeftOptions(peft="lora", load_in_8bit=True, bnb_4bit_quant_type="fp4"),
     "bnb_4bit_quant_type set a 4-bit base: add load_in_4bit or peft qlora (an 8-bit base has no such"),
    (PeftOptions(peft="dora"), "unknown peft 'dora': allowed are none, lora, qlora"),
    (PeftOptions(peft="lora", lora_r=0), "LoRA rank must be an integer from 1 to 4096"),
    (PeftOptions(peft="lora", lora_dropout=1.0), "LoRA dropout must be a number from 0"),
    (PeftOptions(peft="lora", lora_targets="all-linear,q_proj"), "all-linear stands alone"),
])
def test_bad_options_are_refused_naming_them(options: PeftOptions, message: str) -> None:
    with pytest.raises(InvalidInput, match=message.replace("(", r"\(").replace("+", r"\+")):
        options.adapter()


def test_options_resolve() -> None:
    assert PeftOptions().adapter() is None
    qlora = PeftOptions(peft="lora", load_in_4bit=True, lora_r=8, bnb_4bit_use_double_quant=False).adapter()
    assert qlora is not None and qlora.method == "qlora" and qlora.r == 8 and not qlora.double_quant
    assert PeftOptions(peft="qlora", lora_targets="q_proj, k_proj").adapter().targets == ("q_proj", "k_proj")


def test_peft_adapter_config(tmp_path) -> None:
    (tmp_path / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "r": 64, "lora_alpha": 16, "lora_dropout": 0.1,
        "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"], "bias": "none",
        "task_type": "CAUSAL_LM", "use_rslora": True}))
    adapter = adapter_from_peft_config(tmp_path)
    assert (adapter.method, adapter.r, adapter.alpha, adapter.dropout) == ("lora", 64, 16, 0.1)
    assert adapter.targets == ("q_proj", "k_proj", "v_proj", "o_proj")
    assert adapter_from_peft_config(tmp_path / "adapter_config.json", method="qlora").method == "qlora"
    (tmp_path / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "use_dora": True}))
    with pytest.raises(InvalidInput, match="use_dora=True .DoRA"):
        adapter_from_peft_config(tmp_path)
    with pytest.raises(InvalidInput, match="no PEFT config at"):
        adapter_from_peft_config(tmp_path / "missing")


def test_unknown_targets_are_refused() -> None:
    workload = Workload(resolve_model("tiny-llama"), "causal-lm", None,
                        adapter=make_adapter("lora", targets="query"))
    with pytest.raises(InvalidInput, match="LoRA targets: Target modules {'query'} not found"):
        summarize(workload, ESTIMATE_PARTS)


@pytest.mark.slow
def test_qlora_below_lora_below_full_fine_tune() -> None:
    """Where the weights weigh (4 wide layers, bf16 weights, checkpointing, a 768 MiB card): the peak
    of the same cell falls from a full fine-tune to LoRA to QLoRA, and the max batch rises."""
    config = tiny_config("llama", hidden_size=512, intermediate_size=2048, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=4, vocab_size=128,
                         max_position_embeddings=64, tie_word_embeddings=True)
    spec = _spec("tiny-llama-wide", "preset", config)
    gpu = custom_gpu(768 * 2**20)
    budget = budget_bytes(gpu, 0.05)
    mode = parse_mode("bf16+ckpt")
    peaks, maxima = [], []
    for adapter in (None, make_adapter("lora"), make_adapter("qlora")):
        workload = Workload(spec, "causal-lm", None, weights_dtype="bfloat16", adapter=adapter)
        backend = EstimateBackend(gpu)
        maxima.append(search_cell(backend, workload, mode, 32, budget).max_batch_size)
        with backend.cell(workload, mode, 32, budget) as cell:
            peaks.append(cell.fits(4).peak_bytes)
    assert peaks[0] > peaks[1] > peaks[2]
    assert 0 < maxima[0] < maxima[1] < maxima[2]


def test_lora_config_carries_every_setting() -> None:
    from autotune.workload.adapters import lora_config

    config = lora_config(make_adapter("lora", r=8, alpha=16, dropout=0.1, targets="q_proj"), "causal-lm")
    assert (config.r, config.lora_alpha, config.lora_dropout) == (8, 16, 0.1)
    assert set(config.target_modules) == {"q_proj"}


def _dtypes_by_part(model: torch.nn.Module) -> dict[str, set[tuple[str, bool]]]:
    """(dtype, trainable) of a wrapped llama's parameters, grouped: adapters, norms, embeddings,
    head, 4-bit weights."""
    parts: dict[str, set[tuple[str, bool]]] = {}
    for name, param in model.named_parameters():
        part = next((p for key, p in (("lora_", "lora"), ("norm", "norm"), ("embed_tokens", "embed"),
                                      ("lm_head", "head")) if key in name), "4-bit")
        parts.setdefault(part, set()).add((str(param.dtype).removeprefix("torch."), param.requires_grad))
    return parts


@pytest.mark.parametrize(("method", "stored"), [("qlora", "uint8"), ("lora_8bit", "int8")])
@pytest.mark.parametrize(("recipe", "norms", "adapters"), [
    # TRL's SFTTrainer: no prepare_model_for_kbit_training; what trains is cast to bfloat16.
    ("trl", "bfloat16", "bfloat16"),
    # Axolotl: prepare_model_for_kbit_training, then norms and embeddings back to the model's dtype;
    # PEFT's autocast_adapter_dtype keeps the adapters float32.
    ("axolotl", "bfloat16", "float32"),
    # prepare_model_for_kbit_training alone: every weight not quantized in float32.
    ("peft", "float32", "float32"),
])
def test_each_qlora_recipe_leaves_its_trainer_s_dtypes(method: str, stored: str, recipe: str, norms: str,
                                                       adapters: str) -> None:
    # An 8-bit base the same: TRL, Axolotl and PEFT read is_loaded_in_8bit as is_loaded_in_4bit.
    from autotune.backends.estimate.int8 import EmulatedLinear8bitLt, LoraLinear8bitLt
    from autotune.workload.adapters import prepare

    with torch.device("meta"):
        model, _ = build_model(resolve_model("tiny-llama"), "causal-lm", "eager", "bfloat16")
        wrapped = prepare(model, make_adapter(method, recipe=recipe), "causal-lm", ESTIMATE_PARTS)
    assert _dtypes_by_part(wrapped) == {
        "lora": {(adapters, True)}, "norm": {(norms, False)}, "embed": {(norms, False)},
        "head": {(norms, False)}, "4-bit": {(stored, False)}}
    if method == "lora_8bit":
        assert wrapped.get_base_model().is_loaded_in_8bit is True
        adapted = [m for m in wrapped.modules() if isinstance(m, LoraLinear8bitLt)]
        assert adapted and all(isinstance(m.base_layer, EmulatedLinear8bitLt) for m in adapted)


def test_an_8bit_base_weighs_between_a_16bit_and_a_4bit_one() -> None:
    """bf16 weights of wide layers: LoRA over int8 weights holds about half the 16-bit base, QLoRA's
    NF4 a quarter; the layer inputs an 8-bit base keeps for backward cost less than that here."""
    config = tiny_config("llama", hidden_size=512, intermediate_size=2048, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=4, vocab_size=128,
                         max_position_embeddings=64, tie_word_embeddings=True)
    spec = _spec("tiny-llama-wide", "preset", config)
    gpu = custom_gpu(768 * 2**20)
    budget = budget_bytes(gpu, 0.05)
    weights = {}
    for method in ("lora", "lora_8bit", "qlora"):
        workload = Workload(spec, "causal-lm", None, weights_dtype="bfloat16",
                            adapter=make_adapter(method, recipe="axolotl" if method != "lora" else None))
        backend = EstimateBackend(gpu)
        with backend.cell(workload, parse_mode("bf16+ckpt"), 32, budget) as cell:
            cell.fits(1)
        model = backend._model(workload).model
        weights[method] = sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))
    assert weights["lora"] > weights["lora_8bit"] > weights["qlora"]
    # 4 layers of 4 attention (512 x 512) and 3 MLP (512 x 2048) linears: int8 plus a float32 scale a row
    linears = 4 * (4 * 512 * 512 + 3 * 512 * 2048)
    scales = 4 * (4 * 512 + 2 * 2048 + 512) * 4
    assert weights["lora"] - weights["lora_8bit"] == linears * 2 - (linears + scales)


def test_the_recipe_changes_the_peak_as_its_dtypes_say() -> None:
    """bf16 weights, bf16+ckpt: TRL's bfloat16 adapters (and their AdamW states) weigh least, Axolotl's
    float32 adapters more, and prepare_model_for_kbit_training's float32 embeddings, norms and residual
    stream most."""
    config = tiny_config("llama", hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=4, vocab_size=4096,
                         max_position_embeddings=256, tie_word_embeddings=True)
    spec = _spec("tiny-llama-recipes", "preset", config)
    gpu = custom_gpu(2**30)
    budget = budget_bytes(gpu, 0.05)
    peaks = {}
    for recipe in ("trl", "axolotl", "peft"):
        workload = Workload(spec, "causal-lm", None, weights_dtype="bfloat16",
                            adapter=make_adapter("qlora", recipe=recipe, targets="all-linear"))
        with EstimateBackend(gpu).cell(workload, parse_mode("bf16+ckpt"), 256, budget) as cell:
            peaks[recipe] = cell.fits(8).details["peak_allocated_bytes"]
    assert peaks["trl"] < peaks["axolotl"] < peaks["peft"]


def test_the_recipe_is_for_a_4bit_base_and_one_of_three() -> None:
    assert PeftOptions(peft="qlora").adapter().recipe == "trl"
    assert PeftOptions(peft="lora").adapter().recipe is None
    assert PeftOptions(peft="lora", load_in_4bit=True, qlora_recipe="axolotl").adapter().recipe == "axolotl"
    with pytest.raises(InvalidInput, match="qlora_recipe prepares a 4- or 8-bit base: add load_in_4bit"):
        PeftOptions(peft="lora", qlora_recipe="peft").adapter()
    eight = PeftOptions(peft="lora", load_in_8bit=True, qlora_recipe="axolotl").adapter()
    assert (eight.method, eight.base_bits, eight.recipe) == ("lora_8bit", 8, "axolotl")
    assert PeftOptions(peft="lora", load_in_8bit=True).adapter().recipe == "trl"
    with pytest.raises(InvalidInput, match="unknown QLoRA recipe 'unsloth': allowed are trl, axolotl, peft"):
        PeftOptions(peft="qlora", qlora_recipe="unsloth").adapter()
    with pytest.raises(InvalidInput, match="LoRA over a 16/32-bit base has none"):
        make_adapter("lora", recipe="trl")
    # A QLoRA adapter stored before the recipe existed was computed with prepare_model_for_kbit_training.
    stored = make_adapter("qlora").to_json()
    del stored["recipe"]
    assert Adapter.from_json(stored).recipe == "peft"
    assert Adapter.from_json(make_adapter("qlora", recipe="axolotl").to_json()).recipe == "axolotl"


def test_a_trained_head_is_copied_without_a_fake_tensor_warning() -> None:
    """PEFT deep-copies a classification head it trains in full (modules_to_save); on the
    estimator's fake tensors torch warns of a data pointer there, which reached users' terminals."""
    import warnings

    workload = Workload(resolve_model("tiny-bert"), "sequence-classification", None,
                        adapter=make_adapter("lora"))
    backend = EstimateBackend(custom_gpu(1 << 30))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        counts = backend.parameter_counts(workload)
    assert 0 < counts.trainable < counts.total
    assert [str(w.message) for w in caught if "FakeTensor" in str(w.message)] == []


def test_a_target_pattern_is_what_peft_matches_and_keeps_old_keys():
    from autotune.workload.adapters import Adapter, lora_config, make_adapter

    adapter = make_adapter("lora", target_pattern=r".*\.(q|v)_proj")
    assert lora_config(adapter, "causal-lm").target_modules == r".*\.(q|v)_proj"
    assert Adapter.from_json(adapter.to_json()) == adapter
    assert "target_pattern" not in make_adapter("lora", targets="q_proj,v_proj").to_json()  # stored keys
    with pytest.raises(InvalidInput, match="not a regular expression"):
        make_adapter("lora", target_pattern="(q_proj")
    with pytest.raises(InvalidInput, match="names or a pattern, not both"):
        make_adapter("lora", targets="q_proj", target_pattern="q_proj")


def test_axolotl_builds_the_fused_experts_lora_without_dropout_as_peft_alone_refuses() -> None:
    # transformers 5's Mixtral keeps its experts as 3D parameters: all-linear LoRA wraps them in
    # PEFT's ParamWrapper, which refuses lora_dropout != 0. Axolotl's load_lora builds it with
    # dropout 0 (_patch_peft_param_wrapper_dropout), the attention's LoRA keeping its dropout.
    from peft.tuners.lora.layer import ParamWrapper

    from autotune.workload.adapters import prepare

    def build(adapter: Adapter) -> torch.nn.Module:
        with torch.device("meta"):
            model, _ = build_model(resolve_model("tiny-mixtral"), "causal-lm", "eager", "bfloat16")
            return prepare(model, adapter, "causal-lm", ESTIMATE_PARTS)

    peft_alone = make_adapter("lora", dropout=0.05, targets="all-linear")
    with pytest.raises(InvalidInput, match="ParamWrapper does not work with lora_dropout"):
        build(peft_alone)
    with pytest.warns(RuntimeWarning, match="did not match any targeted module"):
        wrapped = build(make_adapter("lora", dropout=0.05, targets="all-linear", experts_undropped=True))
    wrappers = [m for m in wrapped.modules() if isinstance(m, ParamWrapper)]
    assert wrappers and all(isinstance(m.lora_dropout["default"], torch.nn.Identity) for m in wrappers)
    others = [m for name, m in wrapped.named_modules()
              if name.endswith("q_proj") and hasattr(m, "lora_dropout")]
    assert others and all(isinstance(m.lora_dropout["default"], torch.nn.Dropout) for m in others)
    assert ParamWrapper.__init__.__qualname__ == "ParamWrapper.__init__"  # PEFT's own again
    assert Adapter.from_json(make_adapter("lora", dropout=0.05, experts_undropped=True).to_json()) \
        .experts_undropped


def test_an_axolotl_lora_with_dropout_is_built_as_axolotl_builds_fused_experts(tmp_path) -> None:
    import yaml

    from autotune.configs import read_training_config

    config = {"base_model": "tiny-mixtral", "sequence_len": 64, "micro_batch_size": 2, "bf16": True,
              "attn_implementation": "flash_attention_2", "datasets": [{"path": "x", "type": "alpaca"}],
              "adapter": "lora", "lora_r": 8, "lora_alpha": 16, "lora_target_linear": True,
              "lora_mlp_kernel": False, "lora_qkv_kernel": False, "lora_o_kernel": False}
    for dropout, undropped in ((0.05, True), (0.0, False)):
        path = tmp_path / f"{dropout}.yml"
        path.write_text(yaml.safe_dump({**config, "lora_dropout": dropout}))
        assert read_training_config(path).request.step.adapter.experts_undropped is undropped


def test_a_base_saved_quantized_is_stored_and_refused_where_it_cannot_be():
    from autotune.workload.prequantized import SavedQuant

    quant = SavedQuant("gptq", bits=4, group_size=128, desc_act=True)
    adapter = make_adapter("lora", r=8, targets="all-linear", saved_quant=quant)
    assert Adapter.from_json(adapter.to_json()) == adapter
    assert "saved_quant" not in make_adapter("lora").to_json()  # the stored keys of adapters before it
    with pytest.raises(InvalidInput, match="not quantized again with bitsandbytes"):
        make_adapter("qlora", saved_quant=quant)
    with pytest.raises(InvalidInput, match="GPTQ 3-bit is not modelled"):
        make_adapter("lora", saved_quant=SavedQuant("gptq", bits=3, group_size=128))
    with pytest.raises(InvalidInput, match="AWQ version 'gemv' is not modelled"):
        make_adapter("lora", saved_quant=SavedQuant("awq", bits=4, group_size=128, version="gemv"))
