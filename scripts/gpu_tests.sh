#!/usr/bin/env bash
# One device-machine call: the GPU tests (reusing the warm cache of gpu_bench.sh when the machine is warm).
set -uo pipefail
export PYTHONUNBUFFERED=1 KEVIN_CACHE_DIR="$PWD/.cache/kevin-gpu" KEVIN_COMPILE_WORKERS=${WORKERS:-0}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
date -u; nvidia-smi -L
timeout ${TEST_TIMEOUT:-560} python3 -m pytest -q -m gpu tests/gpu -p no:cacheprovider -s ${PYTEST_ARGS:-} 2>&1 | grep -v '^evaluating' | tee "$OUT/gpu_tests.log"
