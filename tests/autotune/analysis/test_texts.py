"""Token lengths from a column of texts and a local tokenizer (levers.lengths_from_texts), and
``autotune explain --texts``.

The tokenizer is built here: a word-level vocabulary split on whitespace, which adds [CLS] A [SEP]
to one text and [CLS] A [SEP] B [SEP] to a pair, so a text of n words is n + 2 tokens and a pair of
n and m words is n + m + 3 (a word outside the vocabulary is one [UNK]).
"""

from __future__ import annotations

import json

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from autotune.analysis.padding import percentile
from autotune.analysis.texts import TOKENIZE_BATCH, lengths_from_texts
from autotune.errors import InvalidInput
from autotune.workload.models import tiny_config

VOCAB = {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "the": 4, "cat": 5, "sat": 6}


def save_tokenizer(directory, *, special_tokens: bool = True) -> str:
    tokenizer = Tokenizer(models.WordLevel(VOCAB, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    if special_tokens:
        tokenizer.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
            special_tokens=[("[CLS]", VOCAB["[CLS]"]), ("[SEP]", VOCAB["[SEP]"])])
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="[UNK]", pad_token="[PAD]",
                            cls_token="[CLS]", sep_token="[SEP]").save_pretrained(directory)
    return str(directory)


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return save_tokenizer(tmp_path_factory.mktemp("tokenizer"))


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


# -- reading each format ---------------------------------------------------------------------------


def test_csv_column_with_quoted_commas_and_newlines(tmp_path, tok):
    path = write(tmp_path, "data.csv", 'id,text,label\n1,the cat sat,0\n2,"the, cat\nsat on it",1\n3,,0\n')
    # "the , cat sat on it": the comma is a word of its own (Whitespace splits punctuation off)
    assert lengths_from_texts(path, "text", tok) == [3 + 2, 6 + 2, 0 + 2]


def test_tsv_column(tmp_path, tok):
    path = write(tmp_path, "data.tsv", "text\tlabel\nthe cat\t0\nsat\t1\n")
    assert lengths_from_texts(path, "text", tok) == [4, 3]


def test_jsonl_key_skipping_blank_lines(tmp_path, tok):
    rows = [{"text": "the cat sat", "n": 1}, {"text": "chat assis là", "n": 2}]
    path = write(tmp_path, "data.jsonl", "\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + "\n\n")
    assert lengths_from_texts(path, "text", tok) == [5, 5]


def test_jsonlines_extension_and_csv_byte_order_mark(tmp_path, tok):
    assert lengths_from_texts(write(tmp_path, "d.jsonlines", '{"t": "cat"}\n'), "t", tok) == [3]
    assert lengths_from_texts(write(tmp_path, "d.csv", "\ufefftext\nthe cat\n"), "text", tok) == [4]


def test_txt_one_text_a_line_without_blank_lines(tmp_path, tok):
    path = write(tmp_path, "data.txt", "the cat sat\n\nthe\r\n  \nsat sat sat sat\n")
    assert lengths_from_texts(path, None, tok) == [5, 3, 6]


@pytest.mark.parametrize(("name", "text"), [
    ("one.csv", "sentence\nthe cat\nsat\n"),
    ("one.jsonl", '{"sentence": "the cat"}\n{"sentence": "sat"}\n'),
])
def test_the_only_column_needs_no_name(tmp_path, tok, name, text):
    assert lengths_from_texts(write(tmp_path, name, text), None, tok) == [4, 3]


@pytest.mark.parametrize("column", ["question,context", " question , context "])
def test_a_pair_of_columns_is_tokenized_as_a_pair(tmp_path, tok, column):
    path = write(tmp_path, "squad.csv", "question,context\nwho sat,the cat sat\nthe,cat\n")
    assert lengths_from_texts(path, column, tok) == [2 + 3 + 3, 1 + 1 + 3]


def test_more_texts_than_a_batch_keep_their_order(tmp_path, tok):
    count = 2 * TOKENIZE_BATCH + 7
    path = write(tmp_path, "many.txt", "".join("cat " * (i % 9 + 1) + "\n" for i in range(count)))
    assert lengths_from_texts(path, None, tok) == [i % 9 + 1 + 2 for i in range(count)]


# -- what is refused, and the message that says so -----------------------------------------------


@pytest.mark.parametrize(("name", "text", "column", "message"), [
    ("data.parquet", "x", "text", "texts file '{path}': unknown extension '.parquet'; allowed: "
     ".csv, .tsv, .jsonl, .jsonlines, .txt"),
    ("data.csv", "id,text\n1,cat\n", "body", "column 'body' not found in texts file '{path}'; "
     "its columns: 'id', 'text'"),
    ("data.csv", "q,c\ncat,sat\n", "q,context", "column 'context' not found in texts file '{path}'; "
     "its columns: 'q', 'c'"),
    ("data.csv", "id,text\n1,cat\n", None, "texts file '{path}' has 2 columns ('id', 'text'): name the "
     "text column with --text-column NAME, or a pair with --text-column A,B"),
    ("data.jsonl", '{"text": "cat"}\n', "body", "column 'body' not found in texts file '{path}'; "
     "its columns: 'text'"),
    ("data.csv", "a,b,c\nx,y,z\n", "a,b,c", "text column 'a,b,c': give one column, or a pair of "
     "columns as A,B"),
    ("data.csv", "a,b\nx,y\n", "a,", "text column 'a,': give one column, or a pair of columns as A,B"),
    ("data.txt", "cat\n", "text", "texts file '{path}' holds one text a line and has no columns: drop the "
     "text column, or use .csv, .tsv or .jsonl"),
    ("data.csv", "", "text", "texts file '{path}' holds no texts"),
    ("data.csv", "id,text\n", "text", "texts file '{path}' holds no texts"),
    ("data.txt", "\n  \n", None, "texts file '{path}' holds no texts"),
    ("data.jsonl", "\n", "text", "texts file '{path}' holds no texts"),
    ("data.csv", "id,text\n1,cat\n2\n", "text", "texts file '{path}', row 2 (after the header) has no "
     "value in column 'text'"),
    ("data.jsonl", '{"text": "cat"}\n\n{"text": 3}\n', "text", "texts file '{path}', line 3: 'text' is 3, "
     "a number, not a string"),
    ("data.jsonl", '{"text": ["cat"]}\n', "text", "texts file '{path}', line 1: 'text' is [\"cat\"], an "
     "array, not a string"),
    ("data.jsonl", '{"text": null}\n', "text", "texts file '{path}', line 1: 'text' is null, "
     "not a string"),
    ("data.jsonl", '{"text": ["the cat sat on the mat", "and then it sat on the hat"]}\n', "text",
     "texts file '{path}', line 1: 'text' is an array, not a string"),
    ("data.jsonl", '{"text": "cat"}\n{"body": "sat"}\n', "text", "texts file '{path}', line 2 has no key "
     "'text'; its keys: body"),
    ("data.jsonl", '{"text": "cat"}\n["cat"]\n', "text", "texts file '{path}', line 2 is not a JSON "
     "object: one object a line, with the text under a key"),
    ("data.jsonl", '{"text": "cat"}\n{text: cat}\n', "text", "texts file '{path}', line 2 is not JSON: "
     "Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"),
])
def test_a_bad_texts_file_is_refused_with_what_is_allowed(tmp_path, tok, name, text, column, message):
    path = write(tmp_path, name, text)
    with pytest.raises(InvalidInput) as caught:
        lengths_from_texts(path, column, tok)
    assert str(caught.value) == message.format(path=path)


def test_a_missing_texts_file(tmp_path, tok):
    with pytest.raises(InvalidInput, match=r"^texts file '.*none\.csv' not found$"):
        lengths_from_texts(tmp_path / "none.csv", "text", tok)


def test_a_file_that_is_not_utf8(tmp_path, tok):
    path = tmp_path / "latin1.txt"
    path.write_bytes("café\n".encode("latin-1"))
    with pytest.raises(InvalidInput, match=r"^cannot read texts file '.*latin1\.txt': 'utf-8' codec"):
        lengths_from_texts(path, None, tok)


def test_a_text_without_tokens(tmp_path):
    bare = save_tokenizer(tmp_path / "bare", special_tokens=False)  # "" is 0 tokens without [CLS] [SEP]
    path = write(tmp_path, "data.jsonl", '{"text": "cat"}\n{"text": ""}\n')
    with pytest.raises(InvalidInput) as caught:
        lengths_from_texts(path, "text", bare)
    assert str(caught.value) == f"texts file '{path}', line 2: the text makes no tokens; drop empty texts"


def test_a_missing_tokenizer_directory(tmp_path):
    path = write(tmp_path, "data.txt", "cat\n")
    with pytest.raises(InvalidInput) as caught:
        lengths_from_texts(path, None, tmp_path / "nowhere")
    assert str(caught.value) == (f"tokenizer directory '{tmp_path / 'nowhere'}' not found: give a local "
                                 "directory with the tokenizer's files (as save_pretrained writes them)")


def test_a_directory_without_tokenizer_files(tmp_path):
    # config.json alone: AutoTokenizer would build a BERT tokenizer with no vocabulary
    path = write(tmp_path, "data.txt", "cat\n")
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text('{"model_type": "bert"}')
    with pytest.raises(InvalidInput) as caught:
        lengths_from_texts(path, None, tmp_path / "model")
    assert str(caught.value) == (f"tokenizer directory '{tmp_path / 'model'}' holds no tokenizer files: "
                                 "expected one of tokenizer.json, tokenizer_config.json, vocab.txt, "
                                 "vocab.json, tokenizer.model, spiece.model, sentencepiece.bpe.model")


def test_a_tokenizer_that_does_not_load(tmp_path):
    path = write(tmp_path, "data.txt", "cat\n")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "tokenizer.json").write_text("not json")
    with pytest.raises(InvalidInput, match=r"^cannot load the tokenizer in '.*broken': \w+Error: "):
        lengths_from_texts(path, None, tmp_path / "broken")


def test_a_tokenizer_without_its_vocabulary(tmp_path):
    path = write(tmp_path, "data.txt", "cat\n")
    (tmp_path / "bert").mkdir()
    (tmp_path / "bert" / "config.json").write_text('{"model_type": "bert"}')
    (tmp_path / "bert" / "tokenizer_config.json").write_text('{"tokenizer_class": "BertTokenizer"}')
    with pytest.raises(InvalidInput) as caught:
        lengths_from_texts(path, None, tmp_path / "bert")
    assert str(caught.value) == (f"the tokenizer in '{tmp_path / 'bert'}' has no vocabulary besides its "
                                 "special tokens: its vocabulary file is missing")


# -- the command line ------------------------------------------------------------------------------


def test_explain_reports_the_percentiles_of_the_texts(explain_cli_run, tmp_path, tok):
    # pairs of n = 1..20 and n % 4 words, n + n % 4 + 3 tokens each; sorted: 5 7 7 9 9 11 11 13 13
    # 15 | 15 17 17 19 19 21 21 23 | 23 | 25: nearest rank p50 the 10th, p90 the 18th, p99 the 20th
    words = [(n, n % 4) for n in range(1, 21)]
    rows = "".join(f"{n},{'cat ' * q},{'sat ' * c}\n" for n, (q, c) in enumerate(words))
    path = write(tmp_path, "pairs.csv", "id,question,context\n" + rows)
    lengths = sorted(q + c + 3 for q, c in words)
    code, out, _ = explain_cli_run("tiny-bert", "--texts", str(path), "--text-column", "question,context",
                       "--tokenizer", tok, "--seq-len", "32", "--gpu-memory", "1GiB", "--no-levers", "--json")
    assert code == 0
    stats = json.loads(out)["padding"]["stats"]
    assert (stats["p50"], stats["p90"], stats["p99"], stats["max"]) == (15, 23, 25, 25) == (
        percentile(lengths, 50), percentile(lengths, 90), percentile(lengths, 99), lengths[-1])
    assert stats["count"] == 20 and stats["mean"] == sum(lengths) / 20 and stats["truncated"] == 0


def test_the_model_directory_is_the_default_tokenizer(explain_cli_run, tmp_path):
    model = tmp_path / "model"
    save_tokenizer(model)
    config = {"model_type": "bert", **tiny_config("bert").to_diff_dict()}
    (model / "config.json").write_text(json.dumps(config))
    path = write(tmp_path, "data.txt", "cat\nthe cat sat\n")
    code, out, _ = explain_cli_run(str(model), "--texts", str(path), "--gpu-memory", "1GiB", "--no-levers",
                       "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["seq_len"] == 8  # the longest text, 5 tokens, padded to a multiple of 8
    assert doc["padding"]["stats"]["max"] == 5 and doc["padding"]["stats"]["count"] == 2


@pytest.mark.parametrize(("argv", "message"), [
    (["--texts", "data.txt"], "Error: --texts needs a tokenizer: give --tokenizer DIR, a local directory "
     "with the tokenizer's files ('tiny-bert' is not a local directory)"),
    (["--text-column", "text"], "Error: --text-column and --tokenizer go with --texts FILE"),
    (["--lengths", "lengths.txt", "--tokenizer", "tok"], "Error: --text-column and --tokenizer go with "
     "--texts FILE"),
])
def test_texts_options_out_of_place_exit_2(explain_cli_run, argv, message):
    code, out, err = explain_cli_run("tiny-bert", *argv)
    assert code == 2 and err == message + "\n"


def test_texts_and_lengths_are_exclusive(explain_cli_run, capsys):
    with pytest.raises(SystemExit) as caught:
        explain_cli_run("tiny-bert", "--texts", "data.txt", "--lengths", "lengths.txt")
    assert caught.value.code == 2
    assert "argument --lengths: not allowed with argument --texts" in capsys.readouterr().err
