#!/usr/bin/env bash
# One device call (one H200, 10 min) for the training step at GPU speed (issue 15): the two figures of the
# evaluator and the overlap of a step's evaluation with its generation. Results land in $OUT.
# 1. benchmarks/bench_eval.py, cuda: our compile against stock load_inline on the same sources (both serial),
#    candidates per minute and the GPU busy share -> $OUT/bench_eval_cuda.md
# 2. scripts/gpu_train_step.sh with WAVES="1 2": one step of the training flow (0.5B preset) without and with
#    waves, each with a cold cache of its own -> $OUT/waves.md, step_w1.json, step_w2.json
#   bash scripts/gpu_step_speed.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
date -u; nvidia-smi -L; nproc
# Timed in the seventh session: the benchmark about 240 s with one stock compile (300 s with two), each step run
# about 145 s; the defaults keep the call inside its 10 minutes.
KEVIN_CACHE_DIR="$PWD/.cache/kevin-bench" timeout ${T1:-280} python3 benchmarks/bench_eval.py --backend cuda \
  --n ${N:-16} --stock ${STOCK:-1} --out "$OUT/bench_eval_cuda.md" 2>&1 | grep -v '^evaluating' | tail -30
WAVES=${WAVES:-"1 2"} T=${T2:-165} bash scripts/gpu_train_step.sh
