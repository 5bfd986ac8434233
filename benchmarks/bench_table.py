"""Time the default BERT-base table on the estimator and count probes per cell.

    python benchmarks/bench_table.py                 # guided search (the default), the modes in
                                                     # parallel as `autotune table` runs them
    python benchmarks/bench_table.py --workers 1     # in one process
    python benchmarks/bench_table.py --compare       # guided and bisect side by side

Goal (issue 2): <= 60 s for the 24 cells on a 2-core machine, <= 3 probes per cell on average.
Both searches must find the same max batch in every cell; --compare checks it.
"""

from __future__ import annotations

import argparse
import time
import warnings

import autotune
from autotune.defaults import DEFAULT_MODE_NAMES, DEFAULT_SEQ_LENS
from autotune.tuner import TableResult


def run(model: str, gpu: str | None, gpu_memory: str | None, method: str, workers: int | None) -> TableResult:
    return autotune.table(model, seq_lens=DEFAULT_SEQ_LENS, modes=DEFAULT_MODE_NAMES,
                          task="sequence-classification", gpu=gpu, gpu_memory=gpu_memory, backend="estimate",
                          search=method, workers=workers)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="bert-base-uncased")
    parser.add_argument("--gpu", default=None)
    parser.add_argument("--gpu-memory", default=None)
    parser.add_argument("--compare", action="store_true", help="also run the bisect baseline")
    parser.add_argument("--workers", type=int, default=None,
                        help="processes for the modes (default: as autotune table)")
    args = parser.parse_args()
    warnings.simplefilter("ignore", FutureWarning)
    methods = ["guided", "bisect"] if args.compare else ["guided"]
    tables: dict[str, TableResult] = {}
    for method in methods:
        started = time.perf_counter()
        tables[method] = run(args.model, args.gpu, args.gpu_memory, method, args.workers)
        tables[method].elapsed_s = time.perf_counter() - started
    first = tables[methods[0]]
    print(f"{args.model} on {first.gpu_name}, budget {first.budget_bytes / 2**30:.2f} GiB")
    header = f"{'mode':>9} {'seq':>5}" + "".join(f" {m + ' max':>11} {'probes':>6}" for m in methods)
    print(header)
    agree = True
    for cell in first.cells:
        row = f"{cell.mode:>9} {cell.seq_len:>5}"
        for method in methods:
            other = tables[method].cell(cell.mode, cell.seq_len)
            assert other is not None
            row += f" {other.max_batch_size!s:>11} {other.probes:>6}"
            agree &= other.max_batch_size == cell.max_batch_size
        print(row)
    for method in methods:
        table = tables[method]
        print(f"{method}: {table.elapsed_s:.1f} s, {table.total_probes} probes, "
              f"{table.total_probes / len(table.cells):.2f} per cell")
    if args.compare:
        print("same max in every cell:", agree)


if __name__ == "__main__":
    main()
