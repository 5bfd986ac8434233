"""An estimator table's modes and a check's lever searches in worker processes (autotune/parallel.py):
the answers of one process."""

from __future__ import annotations

import sys

import pytest

import autotune
from autotune import parallel, processes, public
from autotune.errors import AutotuneError
from autotune.workload import Workload
from autotune.workload.models import resolve_model
from autotune.workload.modes import parse_modes

# Max batches 150 to 640 on 640 MiB (a budget of 88 MiB past the context); on 1 GiB (1,406 to the
# cap) each search settled over ten times as many replays (estimate/backend.py _settle; issue 39).
TABLE = {"seq_lens": [32, 64], "modes": "fp32,amp+ckpt", "gpu_memory": "640MiB"}


def cells(table):
    return [(c.mode, c.seq_len, c.max_batch_size, c.probes, c.peak_memory_bytes) for c in table.cells]


@pytest.fixture(scope="module")
def one():
    """TABLE in this process alone (workers=1 starts no process): what each table of two workers must
    equal. Traced once for the module, the tests that compare with it trace only their own table."""
    return autotune.table("tiny-bert", workers=1, **TABLE)


@pytest.mark.slow
def test_two_workers_make_the_table_of_one_process(one, started, monkeypatch):
    """... and the caller's process is one of the two, taking the costliest mode first (one table of
    two workers for the three: each starts a process that imports torch)."""
    progress, ran_here = [], []
    tune_mode = parallel._tune_mode

    def record(**arguments):  # the modes this process tunes, in order
        ran_here.append(arguments["mode_name"])
        return tune_mode(**arguments)

    monkeypatch.setattr(parallel, "_tune_mode", record)
    two = autotune.table("tiny-bert", workers=2, **TABLE,
                         on_cell=lambda cell, done, total: progress.append((done, total)))
    assert len(started) == 1  # this process and one worker
    assert ran_here[0] == "amp+ckpt"  # checkpointing and autocast: the costliest of the two
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


@pytest.fixture
def started(monkeypatch):
    """The worker processes started from here on (each Popen's arguments)."""
    calls = []
    popen = processes.subprocess.Popen  # every child starts there (processes.Child)

    def count(*args, **kwargs):
        calls.append(args)
        return popen(*args, **kwargs)

    monkeypatch.setattr(processes.subprocess, "Popen", count)
    return calls


@pytest.mark.slow
def test_a_table_takes_the_workers_started_before_it(started, one):
    parallel.prestart(1)
    early = list(parallel._prestarted)
    two = autotune.table("tiny-bert", workers=2, **TABLE)
    assert len(started) == 1 and parallel._prestarted == []  # the table took the early worker
    assert early[0].wait(timeout_s=30) == 0  # and ended it, its modes done
    assert cells(two) == cells(one)


def test_workers_no_table_took_are_stopped():
    parallel.prestart(2)
    early = list(parallel._prestarted)
    parallel.stop_prestarted()
    assert parallel._prestarted == [] and all(process.poll() is not None for process in early)


@pytest.mark.parametrize(("argv", "expected"), [
    (["table", "bert-base-uncased"], 1),  # 4 modes, 2 cores: this process and one worker
    (["table", "bert-base-uncased", "--workers", "3"], 2),
    (["table", "bert-base-uncased", "--modes", "amp"], 0),  # one mode: one process
    (["table", "bert-base-uncased", "--workers", "1"], 0),
    (["table", "bert-base-uncased", "--backend", "cuda"], 0),  # measured: no estimator table
    (["table", "tiny-bert"], 0),  # a small model runs in one process (default_workers)
    (["table", "./not-a-preset"], 0),  # a config: its size is known once transformers reads it
    (["table", "bert-base-uncased", "--modes", "fp33"], 0),  # the table says what is wrong
])
def test_the_cli_starts_the_workers_its_table_will_take(monkeypatch, argv, expected):
    from autotune.cli import build_parser
    from autotune.cli.table import prestart_workers

    asked = []
    monkeypatch.setattr("autotune.cli.answers.GPU_DEVICE_NODES", ())  # this machine has no GPU
    monkeypatch.setattr(parallel, "usable_cores", lambda: 2)
    monkeypatch.setattr(parallel, "prestart", asked.append)
    args = build_parser().parse_args(argv)
    assert prestart_workers(args) == expected
    assert sum(asked) == expected


def test_auto_on_a_machine_with_an_nvidia_device_starts_no_estimator_workers(monkeypatch, tmp_path):
    from autotune.cli import build_parser
    from autotune.cli.table import prestart_workers

    node = tmp_path / "nvidiactl"
    node.touch()
    monkeypatch.setattr("autotune.cli.answers.GPU_DEVICE_NODES", (str(node),))
    monkeypatch.setattr(parallel, "usable_cores", lambda: 2)
    monkeypatch.setattr(parallel, "prestart", lambda count: pytest.fail("started workers"))
    assert prestart_workers(build_parser().parse_args(["table", "bert-base-uncased"])) == 0


def test_the_preset_rule_is_default_workers_rule(monkeypatch):
    from autotune.workload.presets import PRESETS

    monkeypatch.setattr(parallel, "usable_cores", lambda: 4)
    modes = parse_modes("fp32,amp,ckpt,amp+ckpt")
    for name in PRESETS:
        workload = Workload(resolve_model(name), "sequence-classification", None)
        assert parallel.preset_workers(PRESETS[name], len(modes), None) == parallel.default_workers(
            workload, modes), name


# -- a check's lever searches ----------------------------------------------------------------

# tiny-bert at seq 64 on 640 MiB (as TABLE): batch 100000 does not fit, so every lever is searched,
# their max batches apart.
NOT_FITTING = {"seq_len": 64, "batch_size": 100_000, "gpu_memory": "640MiB", "backend": "estimate"}


@pytest.mark.slow
def test_a_check_s_levers_in_two_processes_are_those_of_one(started):
    one = autotune.check("tiny-bert", workers=1, **NOT_FITTING)
    assert started == []  # workers=1: this process alone
    two = autotune.check("tiny-bert", workers=2, **NOT_FITTING)
    assert len(started) == 1  # this process and one worker
    assert not one.fits and len(one.levers) >= 3
    assert len({lever["max_batch_size"] for lever in one.levers}) >= 3  # a lever mixed up with another shows
    assert two.to_dict() == one.to_dict()


def test_a_worker_that_dies_fails_the_check_naming_its_lever(monkeypatch):
    monkeypatch.setattr(parallel, "WORKER_COMMAND", (sys.executable, "-c", "import sys; sys.exit(3)"))
    with pytest.raises(AutotuneError, match=r"the worker of lever search .+ exited with code 3"):
        autotune.check("tiny-bert", workers=2, **NOT_FITTING)


def test_a_step_that_fits_starts_no_worker_and_workers_is_checked(started):
    fits = autotune.check("tiny-bert", seq_len=64, batch_size=4, gpu_memory="1GiB", workers=4)
    assert fits.fits and started == []
    with pytest.raises(AutotuneError, match="workers must be an integer >= 1"):
        autotune.check("tiny-bert", seq_len=64, batch_size=4, workers=0)


def test_the_check_command_starts_no_worker_for_a_step_that_fits(started, monkeypatch):
    # A preset the size of BERT-base would have its levers searched in workers: none is started
    # before the search says the step does not fit (issue 39: it cost a fitting check 35-40 % of its CPU).
    from autotune.cli import main

    monkeypatch.setattr("autotune.cli.answers.GPU_DEVICE_NODES", ())
    monkeypatch.setattr(parallel, "usable_cores", lambda: 2)
    code = main(["check", "distilbert-base-uncased", "--seq-len", "32", "--batch-size", "2",
                 "--gpu-memory", "12GiB", "--no-cache"])
    assert code == 0 and started == [] and parallel._prestarted == []


@pytest.mark.parametrize(("cores", "load", "expected"), [
    (2, 0.1, 2), (2, 1.0, 1), (2, 1.6, 1), (2, 7.0, 1), (16, 3.2, 13), (1, 0.0, 1),
])
def test_the_usable_cores_are_those_the_load_leaves(monkeypatch, cores, load, expected):
    monkeypatch.setattr(parallel.os, "sched_getaffinity", lambda pid: set(range(cores)))
    monkeypatch.setattr(parallel, "busy_cores", lambda: load)
    assert parallel.usable_cores() == expected


def test_lever_processes_follow_the_table_s_rule(monkeypatch):
    monkeypatch.setattr(parallel, "usable_cores", lambda: 4)
    tiny = Workload(resolve_model("tiny-bert"), "sequence-classification", None)
    base = Workload(resolve_model("bert-base-uncased"), "sequence-classification", None)
    assert parallel.lever_processes(tiny, 6, None) == 1  # a small model: one process
    assert parallel.lever_processes(base, 6, None) == 4  # up to the cores
    assert parallel.lever_processes(base, 3, None) == 3  # one per search
    assert parallel.lever_processes(base, 6, 2) == 2 and parallel.lever_processes(base, 1, 8) == 1
    assert parallel.lever_processes(base, 0, None) == 1


# -- an explanation's lever searches -----------------------------------------------------------

EXPLAIN = {"seq_len": 64, "batch_size": 8, "gpu_memory": "640MiB"}  # as NOT_FITTING's


@pytest.mark.slow
def test_an_explanation_s_levers_in_two_processes_are_those_of_one(started):
    one = autotune.explain("tiny-bert", workers=1, **EXPLAIN)
    assert started == []
    two = autotune.explain("tiny-bert", workers=2, **EXPLAIN)
    assert len(started) == 1
    assert {lever.name for lever in one.levers} >= {"amp", "ckpt", "adamw-8bit", "frozen-embeddings", "lora"}
    assert len({lever.max_batch_size for lever in one.levers}) >= 5  # a lever mixed up with another shows
    assert two.to_dict() == one.to_dict()


def test_a_worker_that_dies_fails_the_explanation_naming_its_lever(monkeypatch):
    monkeypatch.setattr(parallel, "WORKER_COMMAND", (sys.executable, "-c", "import sys; sys.exit(3)"))
    with pytest.raises(AutotuneError, match=r"the worker of lever .+ exited with code 3"):
        autotune.explain("tiny-bert", workers=2, **EXPLAIN)


@pytest.mark.parametrize(("argv", "expected"), [
    (["explain", "bert-base-uncased", "--seq-len", "128"], 1),  # 2 cores: this process and one worker
    (["explain", "bert-base-uncased", "--seq-len", "128", "--no-levers"], 0),
    (["explain", "bert-base-uncased", "--seq-len", "128", "--workers", "1"], 0),
    (["explain", "tiny-bert", "--seq-len", "64"], 0),  # a small model
])
def test_the_cli_explain_starts_workers_for_its_levers(monkeypatch, argv, expected):
    from autotune.cli import main

    asked = []
    monkeypatch.setattr("autotune.cli.answers.GPU_DEVICE_NODES", ())
    monkeypatch.setattr(parallel, "usable_cores", lambda: 2)
    monkeypatch.setattr(parallel, "prestart", asked.append)

    def explain(*args, **kwargs):
        raise AutotuneError("stop here")  # what matters is what was started before

    monkeypatch.setattr(public, "run_explain", explain)
    assert main(argv) == 2
    assert sum(asked) == expected
