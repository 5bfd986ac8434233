"""Axolotl's unfrozen_parameters (workload/frozen.py freeze_except) and model_config overrides
(workload/overrides.py), on tiny models."""

from __future__ import annotations

import re

import pytest

import autotune
from autotune.errors import InvalidInput
from autotune.request import CheckRequest, Step, resolve
from autotune.workload.frozen import freeze_except, unfrozen_names, unmatched
from autotune.workload.models import resolve_model
from autotune.workload.step import build_model

# Mixtral's examples (bigstral-ds-zero3.yaml, mixtral_22.yml), the tiny model's layer numbers.
MIXTRAL_PATTERNS = ("^lm_head.weight$", "^model.embed_tokens.weight$", "model.layers.1.mlp.gate",
                    "model.layers.1.block_sparse_moe.experts")


def axolotl_match(pattern: str, name: str) -> bool:
    """utils/freeze.py LayerNamePattern.match, written out: range cut, periods literal, re.match."""
    ranged = re.match(r"^(.+)\[([0-9]*)(?::([0-9]*))?\]$", pattern)
    regex = re.sub(r"\.(?!\+)", "\\.", ranged.group(1) if ranged else pattern)
    return re.match(regex, name) is not None


def tiny(name: str = "tiny-mixtral"):
    return build_model(resolve_model(name), "causal-lm", "eager", "float32")[0]


def test_the_trained_parameters_are_those_a_pattern_matches_from_the_name_s_start():
    model = tiny()
    names = [name for name, _ in model.named_parameters()]
    assert freeze_except(model, MIXTRAL_PATTERNS) == 3
    trained = [name for name, param in model.named_parameters() if param.requires_grad]
    assert trained == [name for name in names if any(axolotl_match(p, name) for p in MIXTRAL_PATTERNS)]
    assert trained == ["model.embed_tokens.weight", "model.layers.1.mlp.gate.weight", "lm_head.weight"]
    # transformers 5 names Mixtral's experts mlp.experts: the block_sparse_moe pattern matches none
    assert unmatched(names, MIXTRAL_PATTERNS) == ["model.layers.1.block_sparse_moe.experts"]


@pytest.mark.parametrize(("pattern", "matches"), [
    ("embed_tokens", False),  # re.match: from the name's start, not re.search
    ("model.embed_tokens", True), ("model.embed_tokens.weight$", True),
    ("model.embed_tokens.weight$[:32]", True),  # an index range: the parameter trained whole
    ("model.*embed_tokens", True), ("model.*tokens", False),  # ".*" reads as "any number of periods"
    ("model.+embed_tokens", True),  # ".+" stays a wildcard
    ("modelXembed_tokens", False), ("model_embed", False),
])
def test_patterns_read_as_axolotl_reads_them(pattern, matches):
    name = "model.embed_tokens.weight"
    assert (unfrozen_names([name], (pattern,)) == [name]) is matches is axolotl_match(pattern, name)


def test_patterns_that_match_nothing_are_refused():
    with pytest.raises(InvalidInput, match="match no parameter of this model: Axolotl would freeze every"):
        freeze_except(tiny(), ("embed_tokens", "layers"))


def test_embedding_patterns_make_the_embeddings_output_require_grad():
    model = tiny()
    freeze_except(model, ("model.layers.1.mlp",))
    batch = model.get_input_embeddings()(__import__("torch").tensor([[1, 2]]))
    assert not batch.requires_grad
    freeze_except(model, ("model.layers.1.mlp", "lm_head"))  # train.py: enable_input_require_grads
    assert model.get_input_embeddings()(__import__("torch").tensor([[1, 2]])).requires_grad


def check(**step):
    return autotune.check("tiny-mixtral", seq_len=64, batch_size=512, mode="bf16", gpu_memory="1GiB",
                          dtype="bfloat16", workers=1, **step)


def test_fewer_trained_parameters_lower_the_peak():
    whole, part = check(), check(unfrozen_parameters=["model.layers.1.mlp.gate"])
    assert part.peak_memory_bytes < whole.peak_memory_bytes and part.max_batch_size > whole.max_batch_size
    # the regexes given on the command line as a JSON list read the same
    listed = check(unfrozen_parameters='["model.layers.1.mlp.gate"]')
    assert listed.peak_memory_bytes == part.peak_memory_bytes


def test_unfrozen_parameters_are_for_a_full_fine_tune():
    with pytest.raises(InvalidInput, match="unfrozen_parameters.* full fine-tune"):
        check(unfrozen_parameters=["lm_head"], peft="lora")


def test_output_router_logits_reaches_the_traced_model_and_adds_the_router_loss():
    request = CheckRequest(Step(model="tiny-mixtral", config_overrides='{"output_router_logits": true}'),
                           seq_len=64, batch_size=2)
    spec = resolve(request, make_target=False).workload.model
    assert spec.config.output_router_logits is True and spec.overrides == (("output_router_logits", "True"),)
    assert resolve_model("tiny-mixtral").config.output_router_logits is False  # the preset untouched
    import torch

    model = build_model(spec, "causal-lm", "eager", "float32")[0]
    ids = torch.randint(0, 100, (2, 8))
    out = model(input_ids=ids, labels=ids)
    assert out.aux_loss is not None and len(out.router_logits) == spec.config.num_hidden_layers
    plain = check()
    routed = check(config_overrides='{"output_router_logits": true}')
    # the router logits kept for the loss and load_balancing_loss_func's graph, traced: never more rows
    # (tiny-mixtral's are [tokens, 4 experts] a layer, under its peak: the same max, 1024, the cap)
    assert routed.max_batch_size <= plain.max_batch_size


@pytest.mark.parametrize(("overrides", "error"), [
    ('{"output_router_logit": true}', "MixtralConfig has no attribute output_router_logit"),
    ('{"torch_dtype": "float32"}', "torch_dtype='float32': not modelled: Axolotl's loader passes it"),
    ('{"attn_implementation": "eager"}', "attn_implementation='eager': not modelled"),
    ('{"quantization_config": {"quant_method": "fp8"}}', "not modelled: a quantized checkpoint"),
    ('{"output_router_logits": "yes"}', "MixtralConfig.output_router_logits is bool"),
    ('[1]', "must map attribute names"),
])
def test_overrides_not_traced_are_refused_by_name(overrides, error):
    with pytest.raises(InvalidInput, match=re.escape(error)):
        check(config_overrides=overrides)
