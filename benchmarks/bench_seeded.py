"""GPU probes per cell of the measured (cuda) search, on a fake GPU whose memory differs from the
estimator's (autotune/testing.py): bisect, guided without the estimator, and estimator-seeded
(autotune/backends/seeded.py, the cuda backend's default).

    .venv/bin/python benchmarks/bench_seeded.py                       # BERT-base, 12 GiB, +-10 %
    .venv/bin/python benchmarks/bench_seeded.py --gpu T4 --scales 0.9,1.1 --seq-lens 128,512

Goal (issue 15): at most 2.5 GPU probes per cell, every search finding the same max batch (the
fake's curve is smooth: ``ScaledGpu(smooth=True)``, so every search of it agrees).
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from autotune.backends import Backend, make_backend  # noqa: E402
from autotune.backends.estimate.backend import EstimateBackend  # noqa: E402
from autotune.backends.seeded import EstimateSeeded  # noqa: E402
from autotune.defaults import DEFAULT_SEQ_LENS  # noqa: E402
from autotune.testing import ScaledGpu  # noqa: E402
from autotune.tuner import TableResult, tune_table  # noqa: E402
from autotune.workload import Workload  # noqa: E402
from autotune.workload.models import resolve_model  # noqa: E402
from autotune.workload.modes import parse_modes  # noqa: E402

HOWS = ("bisect", "guided", "seeded")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="bert-base-uncased")
    parser.add_argument("--gpu", default=None)
    parser.add_argument("--gpu-memory", default="12GiB")
    parser.add_argument("--seq-lens", default=",".join(map(str, DEFAULT_SEQ_LENS)))
    parser.add_argument("--modes", default="fp32,amp,ckpt,amp+ckpt")
    parser.add_argument("--scales", default="0.9,1.0,1.1",
                        help="the fake GPU's memory over the estimator's (default: %(default)s)")
    parser.add_argument("--stepwise", action="store_true",
                        help="the fake GPU is the estimator's own curve (its allocator steps) times the "
                        "scale, not the smooth line through it: --scales 1.0 is a GPU the estimator "
                        "gets exactly right (the searches may then differ where the curve is not monotone)")
    args = parser.parse_args()
    warnings.simplefilter("ignore", FutureWarning)
    _, target = make_backend("estimate", args.gpu, None if args.gpu else args.gpu_memory)
    workload = Workload(resolve_model(args.model), "sequence-classification", None)
    seq_lens = [int(s) for s in args.seq_lens.split(",")]
    modes = parse_modes(args.modes)
    curve, estimator = EstimateBackend(target), EstimateBackend(target)
    shape = "curve" if args.stepwise else "curve's line near the limit"
    print(f"{args.model} on {target.name}; fake GPU = the estimator's {shape} x scale")
    worst = 0.0
    for scale in (float(s) for s in args.scales.split(",")):
        tables: dict[str, TableResult] = {}
        counts: dict[str, int] = {}
        for how in HOWS:
            fake = ScaledGpu(curve, scale=scale, smooth=not args.stepwise)
            backend: Backend = EstimateSeeded(fake, estimator) if how == "seeded" else fake
            started = time.perf_counter()
            tables[how] = tune_table(workload, backend, target, seq_lens=seq_lens, modes=modes,
                                     method="bisect" if how == "bisect" else "guided")
            tables[how].elapsed_s = time.perf_counter() - started
            counts[how] = fake.probes
        cells = len(tables["bisect"].cells)
        answers = {how: [c.max_batch_size for c in t.cells] for how, t in tables.items()}
        agree = answers["bisect"] == answers["guided"] == answers["seeded"]
        figures = [f"{how} {counts[how] / cells:.2f} GPU probes/cell ({tables[how].elapsed_s:.0f} s)"
                   for how in HOWS]
        print(f"scale {scale}: {', '.join(figures)}; same answers: {agree}")
        for index, cell in enumerate(tables["bisect"].cells):
            found = {how: answers[how][index] for how in HOWS}
            if len(set(found.values())) > 1:
                print(f"   differ at {cell.mode} seq {cell.seq_len}: {found}")
        for cell in tables["seeded"].cells:
            if cell.probes > 2:
                print(f"   {cell.mode} seq {cell.seq_len}: estimate {cell.estimated_max_batch_size}, "
                      f"max {cell.max_batch_size}, probes {[p['batch_size'] for p in cell.probe_log]}")
        worst = max(worst, counts["seeded"] / cells)
    print(f"seeded, worst scale: {worst:.2f} GPU probes per cell (goal 2.5)")


if __name__ == "__main__":
    main()
