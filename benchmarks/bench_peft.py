"""LoRA and QLoRA on the estimator (issue "LoRA and QLoRA"): time, peak RSS and answers, each run
in a fresh process.

- Llama-3.1-8B QLoRA r=16, bf16+ckpt, seq 2048 on a 24 GB card (RTX-4090): the table;
- Llama-3.2-1B and Llama-3.1-8B at seq 2048, bf16+ckpt, on a 24 GB card: full fine-tune, LoRA
  r=16 and QLoRA r=16 (PEFT's default targets), side by side.

Fake tensors hold no memory, so an 8B model fits this 2-core, 24 GiB machine; the peak RSS says
how much the process really used.

    .venv/bin/python benchmarks/bench_peft.py
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

AUTOTUNE = str(Path(sys.executable).with_name("autotune"))
CELL = ["--seq-lens", "2048", "--modes", "bf16+ckpt", "--gpu", "RTX-4090"]
RUNS = {
    "Llama-3.1-8B QLoRA r=16 table (bf16+ckpt, seq 2048, RTX-4090 24 GB)": [
        "table", "meta-llama/Llama-3.1-8B", "--peft", "qlora", *CELL],
    "Llama-3.1-8B LoRA r=16 (bf16+ckpt, seq 2048, RTX-4090)": [
        "table", "meta-llama/Llama-3.1-8B", "--peft", "lora", *CELL],
    "Llama-3.1-8B full fine-tune (bf16+ckpt, seq 2048, RTX-4090)": [
        "table", "meta-llama/Llama-3.1-8B", *CELL],
    "Llama-3.2-1B QLoRA r=16 (bf16+ckpt, seq 2048, RTX-4090)": [
        "table", "meta-llama/Llama-3.2-1B", "--peft", "qlora", *CELL],
    "Llama-3.2-1B LoRA r=16 (bf16+ckpt, seq 2048, RTX-4090)": [
        "table", "meta-llama/Llama-3.2-1B", "--peft", "lora", *CELL],
    "Llama-3.2-1B full fine-tune (bf16+ckpt, seq 2048, RTX-4090)": [
        "table", "meta-llama/Llama-3.2-1B", *CELL],
}


def measure(argv: list[str]) -> tuple[float, int, str]:
    """(wall seconds, peak RSS bytes, stdout and stderr's last lines) of one command."""
    started = time.perf_counter()
    done = subprocess.run(["/usr/bin/time", "-v", AUTOTUNE, *argv], capture_output=True, text=True)
    wall = time.perf_counter() - started
    rss_kib = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", done.stderr).group(1))
    errors = [line for line in done.stderr.splitlines() if line.startswith("Error")]
    return wall, rss_kib * 1024, done.stdout + "\n".join(errors)


def main() -> None:
    only = sys.argv[1:]
    for label, argv in RUNS.items():
        if only and not any(word in label for word in only):
            continue
        wall, rss, out = measure(argv)
        print(f"{label}: {wall:.1f} s wall, peak RSS {rss / 2**20:.0f} MiB", flush=True)
        print("  " + "\n  ".join(out.rstrip().splitlines()), flush=True)


if __name__ == "__main__":
    main()
