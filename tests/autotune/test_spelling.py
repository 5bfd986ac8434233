"""Did you mean: which names are suggested for a mistyped one, and how the suggestion reads."""

from __future__ import annotations

import pytest

from autotune.spelling import close_matches, did_you_mean, fold

FORMS = [("bert-base-uncased", "bert-base-uncased"), ("bert-base-cased", "bert-base-cased"),
         ("roberta-large", "roberta-large"), ("bert-large-uncased", "bert-large-uncased"),
         ("gpt2", "gpt2"), ("openai-community/gpt2", "gpt2")]


def test_fold_ignores_case_spaces_hyphens_and_underscores():
    assert fold(" T-4 ") == fold("t_4") == fold("T 4") == "t4"


@pytest.mark.parametrize(
    ("typed", "names"),
    [
        ("bert-base-uncase", ["bert-base-uncased"]),  # 0.97; bert-base-cased (0.90) is too far behind
        ("BERT_BASE_UNCASED", ["bert-base-uncased"]),
        ("bert-large", ["bert-large-uncased"]),  # begins it: above roberta-large's ratio 0.86
        ("bert", ["bert-base-uncased", "bert-base-cased", "bert-large-uncased"]),  # ties: forms' order
        ("bert-huge", []),
        ("", []),
    ],
)
def test_close_matches(typed, names):
    assert close_matches(typed, FORMS) == names


def test_a_name_is_suggested_once_whichever_spelling_matched():
    assert close_matches(["openai-community/gtp2", "gtp2"], FORMS) == ["gpt2"]


def test_at_most_limit_names():
    assert close_matches("bert", FORMS, limit=1) == ["bert-base-uncased"]


@pytest.mark.parametrize(
    ("names", "text"),
    [([], ""), (["T4"], "did you mean T4?"), (["A", "B"], "did you mean A or B?"),
     (["A", "B", "C"], "did you mean A, B or C?")],
)
def test_did_you_mean(names, text):
    assert did_you_mean(names) == text
