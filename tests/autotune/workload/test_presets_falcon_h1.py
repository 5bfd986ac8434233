"""The Falcon-H1 presets: their parameter counts against the published sizes, the keys that shape
a Mamba-2 mixer's memory, and the tiny config's build."""

from __future__ import annotations

from typing import Any

import pytest

from autotune.workload.models import infer_task, preset_name, resolve_model
from tests.autotune.workload.test_presets_llm import fake_causal_lm, parameter_count, published


@pytest.mark.parametrize(
    ("name", "params", "figure"),
    [
        # The checkpoints' names (tiiuae's collection: "0.5B", "1.5B", "3B", "7B", "34B"; the technical
        # report, arXiv 2507.22448, sizes them so too): the counts at the names' precision.
        ("tiiuae/Falcon-H1-0.5B-Base", 521_411_104, "0.5B"),
        ("tiiuae/Falcon-H1-34B-Base", 33_642_516_224, "34B"),
        ("tiiuae/Falcon-H1-1.5B-Base", 1_554_863_488, "1.5B"),
        ("tiiuae/Falcon-H1-7B-Base", 7_585_648_736, "7B"),
        ("tiiuae/Falcon-H1-3B-Base", 3_149_387_264, "3B"),
        # A model list's ModelSpec("tiiuae/Falcon-H1-3B-Instruct", 3_149_400_000) (find_string id
        # 71494238893): the checkpoint's count to five figures.
        ("tiiuae/Falcon-H1-3B-Base", 3_149_387_264, "3.1494B"),
    ],
)
def test_falcon_h1_counts_are_the_published_sizes(name: str, params: int, figure: str) -> None:
    model = fake_causal_lm(name)
    assert parameter_count(model) == params
    assert published(params, figure)


@pytest.mark.parametrize(
    ("name", "fields"),
    [
        # Mamba-2: in_proj's width is gate + conv (x, B, C) + dt heads (modeling_falcon_h1.py FalconH1Mixer).
        ("tiiuae/Falcon-H1-0.5B-Base", {"mamba_d_ssm": 1536, "mamba_n_heads": 24, "mamba_d_state": 128,
                                        "mamba_n_groups": 1, "mamba_rms_norm": False, "vocab_size": 32784}),
        ("tiiuae/Falcon-H1-34B-Base", {"mamba_d_ssm": 4096, "mamba_n_heads": 32, "mamba_d_state": 256,
                                       "mamba_n_groups": 2, "mamba_rms_norm": True, "vocab_size": 261120}),
        ("tiiuae/Falcon-H1-1.5B-Base", {"mamba_d_ssm": 3072, "mamba_n_heads": 48, "mamba_d_state": 256,
                                        "mamba_n_groups": 1, "mamba_rms_norm": True, "vocab_size": 65537}),
        ("tiiuae/Falcon-H1-3B-Base", {"mamba_d_ssm": 4096, "mamba_n_heads": 32, "mamba_d_state": 256,
                                      "mamba_n_groups": 1, "mamba_rms_norm": True, "vocab_size": 65536}),
        ("tiiuae/Falcon-H1-7B-Base", {"mamba_d_ssm": 3072, "mamba_n_heads": 24, "mamba_d_state": 256,
                                      "mamba_n_groups": 1, "mamba_rms_norm": True, "vocab_size": 130048}),
    ],
)
def test_falcon_h1_presets_keep_the_mixer_s_shape(name: str, fields: dict[str, Any]) -> None:
    config = resolve_model(name).config
    assert {key: getattr(config, key) for key in fields} == fields
    mixer = fake_causal_lm(name).model.layers[0].mamba
    conv = fields["mamba_d_ssm"] + 2 * fields["mamba_n_groups"] * fields["mamba_d_state"]
    assert mixer.in_proj.out_features == fields["mamba_d_ssm"] + conv + fields["mamba_n_heads"]


def test_falcon_h1_resolves_by_its_instruct_s_name_only_as_its_base() -> None:
    assert preset_name("Falcon-H1-34B-Base") == "tiiuae/Falcon-H1-34B-Base"
    assert preset_name("tiiuae/Falcon-H1-34B-Instruct") is None  # the corpus maps it (bench_configs.py)


def test_tiny_falcon_h1_is_a_small_float32_causal_lm() -> None:
    config = resolve_model("tiny-falcon_h1").config
    assert config.dtype is None and infer_task(config)[0] == "causal-lm"
    assert config.mamba_chunk_size == 16  # 8 chunks in the 128 positions: the chunked scan's path
    assert parameter_count(fake_causal_lm("tiny-falcon_h1")) < 100_000


@pytest.mark.parametrize(("recipe", "out_proj", "lm_head"), [
    # Axolotl's llm_int8_skip_modules ["out_proj"] for falcon_h1 replaces transformers' default
    # skips: the mixers' out_proj stay 16-bit, lm_head is quantized (adapters.AXOLOTL_SKIPPED).
    ("axolotl", False, True),
    # transformers' defaults (get_keys_to_not_convert): every linear but the output embeddings.
    ("peft", True, False),
])
def test_axolotl_keeps_falcon_h1_s_mixer_out_proj_unquantized(recipe: str, out_proj: bool,
                                                               lm_head: bool) -> None:
    import torch

    from autotune.backends.estimate.nf4 import EmulatedLinear4bit
    from autotune.backends.estimate.parts import ESTIMATE_PARTS
    from autotune.workload.adapters import make_adapter, prepare
    from autotune.workload.step import build_model

    with torch.device("meta"):
        model, _ = build_model(resolve_model("tiny-falcon_h1"), "causal-lm", "eager", "bfloat16")
        wrapped = prepare(model, make_adapter("qlora", recipe=recipe, targets="q_proj"), "causal-lm",
                          ESTIMATE_PARTS)
    base = wrapped.get_base_model()
    assert isinstance(base.model.layers[0].mamba.out_proj, EmulatedLinear4bit) is out_proj
    assert isinstance(base.lm_head, EmulatedLinear4bit) is lm_head
    assert isinstance(base.model.layers[0].mamba.in_proj, EmulatedLinear4bit)
