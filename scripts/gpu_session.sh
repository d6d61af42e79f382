#!/usr/bin/env bash
# Device-machine calls for the evaluation issues. PART=1: hacks + the whole suite (cold cache);
# PART=2: reference-vs-reference timing (warm cache) + stock load_inline compile sample;
# PART=3: KernelBench's harness against ours. Before PART=3, here (not on the device):
#   mkdir -p external/KernelBench && git --git-dir=<fetched mirror> archive HEAD src | tar -x -C external/KernelBench
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl pydantic pydantic-core annotated-types typing-inspection
# and call run with carry [".whl", "external/KernelBench"].
set -uo pipefail
export PYTHONUNBUFFERED=1 KEVIN_CACHE_DIR="$PWD/.cache/kevin-gpu" KEVIN_COMPILE_WORKERS=${WORKERS:-0}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
date -u; nvidia-smi -L; nproc; python3 -c 'import torch; print("torch", torch.__version__, torch.version.cuda)'
if [ "${PART:-1}" = 1 ]; then
  timeout ${T1:-540} python3 -m pytest -q -m gpu tests/gpu -p no:cacheprovider -s -k "not reference_against" 2>&1 \
    | grep -v '^evaluating' | tee "$OUT/gpu_tests_part1.log"
elif [ "${PART}" = 3 ]; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
  timeout ${T3:-580} python3 benchmarks/bench_vs_kernelbench.py --kernelbench external/KernelBench --n ${N:-32} \
    --out "$OUT/bench_vs_kernelbench.md" 2>&1 | grep -v '^evaluating' | tail -60
else
  timeout ${T2:-360} python3 -m pytest -q -m gpu tests/gpu -p no:cacheprovider -s -k "reference_against" 2>&1 \
    | grep -v '^evaluating' | tee "$OUT/gpu_tests_part2.log"
  timeout 200 python3 benchmarks/bench_eval.py --backend cuda --n 2 --stock 1 --stock-only 2>&1 | tail -3 | tee "$OUT/stock.log"
fi
cp -r "$KEVIN_CACHE_DIR/baselines.json" "$OUT/" 2>/dev/null || true
