"""An estimator table's modes in worker processes (autotune/parallel.py): the cells of one process."""

from __future__ import annotations

import sys

import pytest

import autotune
from autotune import parallel
from autotune.errors import AutotuneError
from autotune.workload import Workload
from autotune.workload.models import resolve_model
from autotune.workload.modes import parse_modes

TABLE = {"seq_lens": [32, 64], "modes": "fp32,amp+ckpt", "gpu_memory": "1GiB"}


def cells(table):
    return [(c.mode, c.seq_len, c.max_batch_size, c.probes, c.peak_memory_bytes) for c in table.cells]


@pytest.mark.slow
def test_two_workers_make_the_table_of_one_process():
    progress = []
    one = autotune.table("tiny-bert", workers=1, **TABLE)
    two = autotune.table("tiny-bert", workers=2, **TABLE,
                         on_cell=lambda cell, done, total: progress.append((done, total)))
    assert cells(two) == cells(one)
    for field in ("modes", "warnings", "backend", "attn", "budget_bytes", "environment"):
        assert getattr(two, field) == getattr(one, field), field
    assert progress == [(1, 4), (2, 4), (3, 4), (4, 4)]


def test_a_worker_that_dies_fails_the_table_naming_its_mode(monkeypatch):
    monkeypatch.setattr(parallel, "WORKER_COMMAND", (sys.executable, "-c", "import sys; sys.exit(3)"))
    with pytest.raises(AutotuneError, match=r"the worker of mode (fp32|amp\+ckpt) exited with code 3"):
        autotune.table("tiny-bert", workers=2, **TABLE)


def test_small_models_run_in_one_process_and_workers_is_checked(monkeypatch):
    modes = parse_modes("fp32,amp,ckpt,amp+ckpt")
    monkeypatch.setattr(parallel, "usable_cores", lambda: 2)
    tiny = Workload(resolve_model("tiny-bert"), "sequence-classification", None)
    assert parallel.default_workers(tiny, modes) == 1
    base = Workload(resolve_model("bert-base-uncased"), "sequence-classification", None)
    assert parallel.approximate_parameters(base) > parallel.PARALLEL_FROM_PARAMETERS
    assert parallel.default_workers(base, modes) == 2
    with pytest.raises(AutotuneError, match="workers must be an integer >= 1"):
        autotune.table("tiny-bert", workers=0, **TABLE)


@pytest.mark.slow
def test_an_error_of_the_progress_callback_ends_the_table_and_its_workers():
    def fail(cell, done, total):
        raise RuntimeError("the terminal went away")

    with pytest.raises(RuntimeError, match="the terminal went away"):
        autotune.table("tiny-bert", workers=2, on_cell=fail, **TABLE)


@pytest.mark.slow
def test_the_callers_process_takes_modes_too(monkeypatch):
    started = []
    popen = parallel.subprocess.Popen

    def count(*args, **kwargs):
        started.append(args)
        return popen(*args, **kwargs)

    monkeypatch.setattr(parallel.subprocess, "Popen", count)
    one = autotune.table("tiny-bert", workers=1, **TABLE)
    two = autotune.table("tiny-bert", workers=2, **TABLE)
    assert len(started) == 1  # two processes: this one and one worker
    assert cells(two) == cells(one)
