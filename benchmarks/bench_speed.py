"""Every figure of the speed goals (issue 15) in one run, on this machine.

    .venv/bin/python benchmarks/bench_speed.py               # everything (about 10 minutes on 2 cores)
    .venv/bin/python benchmarks/bench_speed.py --quick       # the default table only

Each figure is given in CPU seconds beside wall: this process's and its reaped children's user and
system time (``resource.getrusage``), the fair figure on a shared machine, where wall grows with the
load; the 1-minute load average is printed at the start and at the end (issue 39: goals on an idle
2-core machine, the default table <= 20 CPU s).

1. The default BERT-base table on the estimator: ``autotune table bert-base-uncased`` in a fresh
   process, wall and CPU (start-up, imports and exit included: what its user waits), then the
   table's own work (``autotune.table``, its modes in worker processes as the CLI runs them) at
   three budgets: a T4 (the default), ``--gpu-memory 12GiB`` and an A100-80GB: time, probes per
   cell, traced runs of the model. Goal: at most 2.5 probes per cell at each budget.
   ``--compare`` also runs the bisect baseline in one process and checks the same answer in every cell.
2. Checks (bench_check.py): ``GET /v1/check`` with and without a stored table, and ``autotune check``
   in a fresh process, cold and again. Goals: 2 s for the CLI check, 0.3 s for a repeated request
   without a stored table.
3. The measured path on a fake GPU off the estimator by +-10 % (bench_seeded.py): GPU probes per
   cell of bisect, guided without the estimator, and estimator-seeded. Goal: at most 2.5.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import autotune  # noqa: E402
from autotune.defaults import DEFAULT_MODE_NAMES, DEFAULT_SEQ_LENS  # noqa: E402
from autotune.tuner import TableResult  # noqa: E402

TARGETS = (("T4 (default)", {}), ("12 GiB", {"gpu_memory": "12GiB"}), ("A100-80GB", {"gpu": "A100-80GB"}))


def cpu_seconds() -> float:
    """User and system CPU seconds of this process and of its children that were waited for (the
    estimator's workers and the fresh processes are, before their call returns)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def load() -> str:
    """The 1-, 5- and 15-minute load averages: how busy the machine was while a figure was taken."""
    return ", ".join(f"{value:.1f}" for value in os.getloadavg())


class Clock:
    """Wall and CPU seconds (``cpu_seconds``) since it was made."""

    def __init__(self) -> None:
        self.wall_started, self.cpu_started = time.perf_counter(), cpu_seconds()

    def wall(self) -> float:
        return time.perf_counter() - self.wall_started

    def cpu(self) -> float:
        return cpu_seconds() - self.cpu_started


def table(target: dict[str, str], **options: object) -> tuple[TableResult, Clock]:
    """The default table's work at ``target``, and its clock (read it at once)."""
    clock = Clock()
    result = autotune.table("bert-base-uncased", seq_lens=DEFAULT_SEQ_LENS, modes=DEFAULT_MODE_NAMES,
                            backend="estimate", **target, **options)  # type: ignore[arg-type]
    return result, clock


def traced_runs(result: TableResult) -> int:
    return sum(1 for cell in result.cells for probe in cell.probe_log if probe.get("estimate") == "traced")


def command_wall(runs: int = 2) -> None:
    """``autotune table bert-base-uncased`` in a fresh process, wall and CPU (its own and its
    workers'), each of ``runs``."""
    walls, cpus = [], []
    for _ in range(runs):
        clock = Clock()
        subprocess.run([sys.executable, "-m", "autotune", "table", "bert-base-uncased"], check=True,
                       capture_output=True, cwd=ROOT)
        walls.append(clock.wall())
        cpus.append(clock.cpu())
    print(f"   $ autotune table bert-base-uncased (fresh process): {min(cpus):.1f} CPU s, "
          f"{min(walls):.1f} s wall (best of {runs}; CPU {', '.join(f'{c:.1f}' for c in cpus)}; "
          f"wall {', '.join(f'{w:.1f}' for w in walls)})", flush=True)


def tables(compare: bool) -> None:
    print("1. default table, bert-base-uncased, 24 cells, estimator")
    command_wall()
    print(f"   {'target':<14} {'CPU s':>7} {'wall s':>7} {'probes':>7} {'per cell':>9} {'traced':>7}" +
          (f" {'bisect probes':>14} {'same answers':>13}" if compare else ""))
    for name, target in TARGETS:
        result, clock = table(target)
        cpu, wall = clock.cpu(), clock.wall()
        cells = len(result.cells)
        line = (f"   {name:<14} {cpu:>7.1f} {wall:>7.1f} {result.total_probes:>7} "
                f"{result.total_probes / cells:>9.2f} {traced_runs(result):>7}")
        if compare:
            baseline, _ = table(target, search="bisect", workers=1)
            same = all(cell.max_batch_size == baseline.cell(cell.mode, cell.seq_len).max_batch_size  # type: ignore[union-attr]
                       for cell in result.cells)
            line += f" {baseline.total_probes:>14} {same!s:>13}"
        print(line, flush=True)


def script(name: str, *args: str) -> None:
    print(f"\n$ python benchmarks/{name} {' '.join(args)}".rstrip(), flush=True)
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / name), *args], check=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="the default table at a T4 only")
    parser.add_argument("--compare", action="store_true", help="also the bisect baseline's answers")
    args = parser.parse_args()
    warnings.simplefilter("ignore", FutureWarning)
    print(f"load average at start: {load()} ({os.cpu_count()} CPUs)", flush=True)
    if args.quick:
        command_wall()
        result, clock = table({})
        cpu, wall = clock.cpu(), clock.wall()
        print(f"default table: {cpu:.1f} CPU s, {wall:.1f} s wall, {result.total_probes} probes "
              f"({result.total_probes / len(result.cells):.2f} per cell), {traced_runs(result)} traced runs")
    else:
        tables(args.compare)
        print("\n2. checks")
        script("bench_check.py", "--requests", "50", "--cli-runs", "3")
        print("\n3. the measured path on a fake GPU")
        script("bench_seeded.py")
    print(f"load average at end: {load()}", flush=True)


if __name__ == "__main__":
    main()
