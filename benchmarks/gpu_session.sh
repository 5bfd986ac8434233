#!/usr/bin/env bash
# One lease of a GPU machine (issue "Measured truth on a real GPU"): the cuda tests, then a plan of
# benchmarks/gpu_measure.py, everything packed into $OUT/PLAN.tgz before the lease's limit.
#
#   benchmarks/gpu_session.sh PLAN SECONDS [--tests]
#
# Wheels for what the machine lacks (transformers and PEFT at this checkout's versions,
# pydantic-settings, bitsandbytes with its CUDA 13 libraries only) travel in .whl/ (not in git; add
# "/.whl/" to .git/info/exclude and carry ".whl"). Made on the developer machine with:
#   p="--no-deps --only-binary=:all: --python-version 3.12 --implementation cp --platform any
#      --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64
#      --platform manylinux2014_x86_64"
#   pip download $p -d .whl transformers==5.24.0 peft==0.21.2 tokenizers==0.23.3 regex==2026.11.19 \
#       pydantic==2.14.4 pydantic_core==2.50.5 pydantic-settings==2.16.3 typing-inspection==0.4.5 \
#       annotated-types==0.8.0 python-dotenv==1.2.4 fastapi==0.165.0 starlette==1.10.0 \
#       uvicorn==0.54.0 annotated-doc==0.0.7 typing_extensions==4.16.0
#   pip download $p -d /tmp/bnb bitsandbytes==0.50.2 && mkdir -p .whl/bnb_site && cd .whl/bnb_site \
#       && unzip -q /tmp/bnb/bitsandbytes-*.whl && rm bitsandbytes/libbitsandbytes_{cuda1[12]*,rocm*,xpu*}.so
# (the lent machine has torch 2.11+cu130, huggingface_hub, accelerate; its fastapi tests also need
# opentelemetry-api, not carried: only the cuda tests run there).
set -u
plan=$1 seconds=$2 tests=${3:-}
start=$(date +%s)
out=/tmp/gpu-$plan
mkdir -p "$out"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 AUTOTUNE_OFFLINE=1 TRANSFORMERS_VERBOSITY=error OMP_NUM_THREADS=4
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .whl/*.whl >"$out/pip.txt" 2>&1 || { cat "$out/pip.txt"; exit 1; }
    [ -d .whl/bnb_site ] && cp -r .whl/bnb_site/* /tmp/site/
    export PYTHONPATH=/tmp/site:$PWD
fi
{
    nvidia-smi
    nproc; free -g; uname -r
    python3 -c "import sys, torch, transformers, peft; print(sys.version); print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__, 'peft', peft.__version__)"
    python3 -c "import bitsandbytes; print('bitsandbytes', bitsandbytes.__version__)"
} >"$out/env.txt" 2>&1
head -30 "$out/env.txt"
if [ "$tests" = --tests ]; then  # every cuda-marked test (bitsandbytes, LoRA and QLoRA included),
    # beside the plan: a few GiB of the card, most of it at 1 GiB budgets
    timeout 200 python3 -m pytest -q -s -p no:cacheprovider -m cuda -rs --timeout 120 \
        tests/autotune/backends/cuda >"$out/pytest-cuda.txt" 2>&1 &
fi
python3 benchmarks/gpu_measure.py plan "$plan" --out "$out" --deadline $((start + seconds)) >"$out/plan.log" 2>&1
if [ "$tests" = --tests ]; then
    wait
    tail -15 "$out/pytest-cuda.txt"
fi
nvidia-smi --query-gpu=memory.used,memory.total --format=csv >>"$out/env.txt" 2>&1
tar czf "$OUT/$plan.tgz" -C /tmp "gpu-$plan"
grep -v "^\[transformers\]\|warn" "$out/plan.log" | tail -80
ls -la "$out"
