#!/usr/bin/env bash
# One device-machine call: the evaluation benchmark from a cold cache (results to $OUT and docs/).
set -uo pipefail
export PYTHONUNBUFFERED=1 KEVIN_CACHE_DIR="$PWD/.cache/kevin-gpu"
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi -L; python3 -c 'import torch; print("torch", torch.__version__, torch.version.cuda)'; nproc
timeout ${BENCH_TIMEOUT:-420} python3 benchmarks/bench_eval.py --backend cuda --n ${N:-32} --stock ${STOCK:-1} \
  --workers ${WORKERS:-0} --cache "$KEVIN_CACHE_DIR" --out "$OUT/bench_eval_cuda.md" 2>&1 | grep -v '^evaluating' | tee "$OUT/bench.log"
