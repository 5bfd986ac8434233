"""Sequences past max_position_embeddings: RoPE models run them (with a warning), tables refuse them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import transformers
from transformers import CONFIG_MAPPING

from autotune.cli import main
from autotune.errors import SequenceTooLong
from autotune.workload.models import check_seq_len, resolve_model, seq_len_warnings
from autotune.workload.positions import TABLE_AND_ROPE_MODEL_TYPES, runs_past_positions

# A learned table sized by the positions: nn.Embedding(config.max_position_embeddings, ...) and the like.
_TABLE = re.compile(r"nn\.Embedding\(\s*(?:self\.)?config\.(?:max_position_embeddings|n_positions)\b")


def _rope_model_types_with_a_table() -> set[str]:
    """The model types of transformers' RoPE configs whose modeling source builds a position table."""
    models = Path(transformers.__file__).parent / "models"
    found = set()
    for configuration in models.glob("*/configuration_*.py"):
        if "rope_parameters" not in configuration.read_text():
            continue
        modelings = configuration.parent.glob("modeling_*.py")
        if any(_TABLE.search(modeling.read_text()) for modeling in modelings):
            found.add(configuration.parent.name)
    return found


def test_the_rope_models_with_a_position_table_are_the_ones_transformers_builds():
    assert _rope_model_types_with_a_table() == TABLE_AND_ROPE_MODEL_TYPES
    assert TABLE_AND_ROPE_MODEL_TYPES <= set(CONFIG_MAPPING)  # directory names are the model types


@pytest.mark.parametrize(("model_type", "runs"), [
    ("bert", False), ("gpt2", False), ("opt", False), ("gptj", False), ("codegen", False),
    ("evolla", False), ("moonshine_streaming", False),
    ("llama", True), ("qwen2", True), ("mistral", True), ("gpt_neox", True), ("llava", True),
    ("modernbert", True),
])
def test_which_models_run_past_their_positions(model_type, runs):
    assert runs_past_positions(CONFIG_MAPPING[model_type]()) is runs


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2", "tiny-llava"])
def test_a_rope_model_takes_a_sequence_past_its_positions_with_a_warning(name):
    spec = resolve_model(name)
    check_seq_len(spec, 2 * spec.max_seq_len)
    assert seq_len_warnings(spec, spec.max_seq_len) == []
    longer = 2 * spec.max_seq_len
    assert seq_len_warnings(spec, longer) == [
        f"sequence length {longer} is past max_position_embeddings={spec.max_seq_len} of {name}, "
        "the length it was trained for: its rotary positions are computed for any position, so the step "
        "runs and its memory is as traced; the model's quality that far is untested"]


@pytest.mark.parametrize("name", ["tiny-bert", "tiny-gpt2", "tiny-roberta"])
def test_a_model_with_a_position_table_refuses_a_sequence_past_it(name):
    spec = resolve_model(name)
    with pytest.raises(SequenceTooLong, match=f"^sequence length {spec.max_seq_len + 1} exceeds "):
        check_seq_len(spec, spec.max_seq_len + 1)


def test_check_answers_past_the_positions_and_says_so(capsys):
    code = main(["check", "tiny-llama", "--seq-len", "256", "--batch-size", "2", "--gpu-memory", "1GiB",
                 "--backend", "estimate", "--workers", "1", "--no-cache"])
    out, _ = capsys.readouterr()
    assert code == 0
    lines = out.strip().splitlines()
    assert lines[0].startswith("fits: tiny-llama seq 256 fp32 ")
    assert lines[1] == ("warning: sequence length 256 is past max_position_embeddings=128 of tiny-llama, the "
                        "length it was trained for: its rotary positions are computed for any position, so "
                        "the step runs and its memory is as traced; the model's quality that far is untested")
