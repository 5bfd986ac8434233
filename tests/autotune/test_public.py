"""The Python API: what ``import autotune`` exports, and that each function answers as its command."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
from pathlib import Path

import pytest

import autotune
from autotune.analysis.check import CheckResult
from autotune.analysis.explain import Explanation
from autotune.tuner import TableResult

ROOT = Path(__file__).resolve().parents[2]
FUNCTIONS = ("table", "check", "explain", "max_batch_size")
# tiny-bert's max batches near 150 to 300 (a budget of 88 MiB past the context): a search settles
# over a tenth of its max, on 1 GiB (1,400 to 2,800) ten times as many replays (issue 39).
TINY = {"gpu_memory": "640MiB", "backend": "estimate"}


def test_exported_members():
    assert set(autotune.__all__) == {
        "AutotuneError", "BackendUnavailable", "InvalidInput", "ProbeError", "SequenceTooLong",
        "UnknownGpu", "UnknownModel", "__version__", "check", "explain", "max_batch_size", "table",
    }
    for name in autotune.__all__:
        assert getattr(autotune, name) is not None, name
    assert sorted(n for n in dir(autotune) if not n.startswith("_") and callable(getattr(autotune, n))
                  and not inspect.ismodule(getattr(autotune, n))) == sorted(
        n for n in autotune.__all__ if n != "__version__")


@pytest.mark.parametrize("name", FUNCTIONS)
def test_each_function_has_a_docstring_with_an_example(name):
    doc = inspect.getdoc(getattr(autotune, name))
    assert doc and f"autotune.{name}(" in doc and ">>>" in doc


@pytest.mark.parametrize("name", FUNCTIONS)
def test_functions_take_the_cli_names_as_keywords(name):
    from autotune.public import StepOptions

    parameters = inspect.signature(getattr(autotune, name)).parameters
    assert list(parameters)[0] == "model"
    *keywords, step = list(parameters.values())[1:]
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in keywords)
    assert step.kind is inspect.Parameter.VAR_KEYWORD  # **step: Unpack[StepOptions]
    assert {"gpu", "gpu_memory", "backend", "margin"} <= set(parameters)
    assert {"task", "attn", "optimizer", "peft", "lora_r"} <= set(StepOptions.__annotations__)


def test_import_autotune_imports_neither_torch_nor_transformers():
    code = "import sys, autotune; assert not {'torch', 'transformers', 'fastapi'} & set(sys.modules)"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


@pytest.fixture(scope="module")
def tiny_table() -> TableResult:
    return autotune.table("tiny-bert", seq_lens="32,64", modes=["fp32", "amp"], **TINY)


def test_table_is_the_cli_table(tiny_table):
    assert isinstance(tiny_table, TableResult)
    assert tiny_table.seq_lens == [32, 64] and tiny_table.modes == ["fp32", "amp"]
    assert all(cell.error is None and cell.max_batch_size for cell in tiny_table.cells)


def test_max_batch_size_is_the_tables_cell(tiny_table):
    for mode in ("fp32", "amp"):
        best = autotune.max_batch_size("tiny-bert", seq_len=64, mode=mode, **TINY)
        assert best == tiny_table.cell(mode, 64).max_batch_size


def test_check_answers_with_the_cells_max_batch(tiny_table):
    best = tiny_table.cell("fp32", 64).max_batch_size
    assert best is not None
    fits = autotune.check("tiny-bert", seq_len=64, batch_size=best, **TINY)
    assert isinstance(fits, CheckResult) and fits.fits and fits.max_batch_size == best
    over = autotune.check("tiny-bert", seq_len=64, batch_size=best + 1, accumulation_steps=2, **TINY)
    assert not over.fits and over.message.startswith("does not fit: tiny-bert seq 64 fp32")


def test_explain_gives_the_breakdown_at_the_max_batch(tiny_table):
    result = autotune.explain("tiny-bert", seq_len=64, levers=False, gpu_memory=TINY["gpu_memory"])
    assert isinstance(result, Explanation)
    assert result.max_batch_size == tiny_table.cell("fp32", 64).max_batch_size
    assert sum(result.breakdown.categories.values()) == result.breakdown.peak_allocated_bytes


def test_explain_takes_lengths_and_picks_the_sequence_length_from_them():
    result = autotune.explain("tiny-bert", lengths=[5, 9, 30], levers=False, gpu_memory="1GiB")
    assert result.seq_len == 32 and result.padding is not None and result.padding.stats.max == 30


@pytest.mark.parametrize(("call", "message"), [
    (lambda: autotune.table("tiny-bert", seq_lens="32,x", **TINY),
     "invalid sequence lengths '32,x': use comma-separated integers, e.g. 128,256,512"),
    (lambda: autotune.max_batch_size("tiny-bert", seq_len=64, mode="fp8", **TINY),
     "unknown mode 'fp8'"),
    (lambda: autotune.check("tiny-bert", seq_len=64, batch_size=0, **TINY),
     "batch_size must be an integer >= 1, got 0"),
    (lambda: autotune.max_batch_size("tiny-bert", seq_len=64, gpu="T4", gpu_memory="1GiB",
                                     multiprocessors=40),
     "give either gpu (T4 has its own multiprocessors) or multiprocessors, not both"),
    (lambda: autotune.max_batch_size("tiny-bert", seq_len=64, gpu="T4", gpu_memory="16GiB"),
     "GPU memory 16 GiB is more than the 14.56 GiB of T4"),
    (lambda: autotune.explain("tiny-bert", text_column="text", gpu_memory="1GiB"),
     "text_column and tokenizer go with texts"),
    (lambda: autotune.max_batch_size("tiny-bert", seq_len=4096, **TINY),
     "sequence length 4096 exceeds"),
])
def test_bad_input_raises_invalid_input_naming_the_field(call, message):
    with pytest.raises(autotune.InvalidInput) as info:
        call()
    assert str(info.value).startswith(message)
    assert isinstance(info.value, ValueError)


@pytest.mark.slow
def test_the_python_api_prints_none_of_the_libraries_notices_about_its_own_calls(tmp_path):
    # transformers 5's deprecated checkpointing names, its use_cache notice and PEFT's call of a
    # deprecated name are the tool's own doing: a script calling autotune sees none of them.
    script = (
        "import autotune\n"
        "autotune.table('tiny-llama', seq_lens=[64], modes='fp32,ckpt', gpu_memory='640MiB',"
        " backend='estimate', workers=1)\n"
        "autotune.check('tiny-llama', seq_len=64, batch_size=4, mode='ckpt', gpu_memory='640MiB',"
        " backend='estimate', peft='lora')\n"
    )
    done = subprocess.run([sys.executable, "-W", "default", "-c", script], capture_output=True, text=True,
                          timeout=300, cwd=Path(__file__).resolve().parents[2],
                          env={**os.environ, "AUTOTUNE_CACHE_DIR": str(tmp_path)})
    assert done.returncode == 0 and done.stderr == "", done.stderr
