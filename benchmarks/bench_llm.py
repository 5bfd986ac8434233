"""Time, probes and peak memory of the estimator on today's LLMs (issue #12), each in a fresh process:

- a Llama-3.2-1B table, bf16 and bf16+ckpt, seq 512..8192 (the default rows), on an H100-80GB;
- a 7B check (Mistral-7B-v0.3, seq 4096, bf16+ckpt, batch 4) with its bf16 weights, and with
  float32 weights (which does not fit: the advice's lever searches run too).

Fake tensors hold no memory, so a 7B model fits this 2-core, 24 GiB machine; the peak RSS says how
much the process really used.

    python benchmarks/bench_llm.py
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

AUTOTUNE = str(Path(sys.executable).with_name("autotune"))
RUNS = {
    "Llama-3.2-1B table (bf16, bf16+ckpt; seq 512-8192; H100-80GB)": [
        "table", "meta-llama/Llama-3.2-1B", "--modes", "bf16,bf16+ckpt", "--gpu", "H100-80GB"],
    "Mistral-7B-v0.3 check (seq 4096, bf16+ckpt, batch 4, bf16 weights)": [
        "check", "mistralai/Mistral-7B-v0.3", "--seq-len", "4096", "--batch-size", "4",
        "--mode", "bf16+ckpt", "--gpu", "H100-80GB"],
    "Mistral-7B-v0.3 check (seq 4096, bf16+ckpt, batch 4, float32 weights, with advice)": [
        "check", "mistralai/Mistral-7B-v0.3", "--seq-len", "4096", "--batch-size", "4",
        "--mode", "bf16+ckpt", "--gpu", "H100-80GB", "--dtype", "float32"],
}


def measure(argv: list[str]) -> tuple[float, int, str]:
    """(wall seconds, peak RSS bytes, stdout) of one autotune command in a fresh process."""
    started = time.perf_counter()
    done = subprocess.run(["/usr/bin/time", "-v", AUTOTUNE, *argv], capture_output=True, text=True)
    wall = time.perf_counter() - started
    rss_kib = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", done.stderr).group(1))
    return wall, rss_kib * 1024, done.stdout


def main() -> None:
    for label, argv in RUNS.items():
        wall, rss, out = measure(argv)
        print(f"{label}: {wall:.1f} s wall, peak RSS {rss / 2**20:.0f} MiB")
        print("  " + "\n  ".join(out.rstrip().splitlines()))


if __name__ == "__main__":
    main()
