#!/usr/bin/env bash
# One device call (one H200, 10 min): generation and training-step speed (issue 15), tables to docs/.
#   bash scripts/gpu_speed.sh                 # results in docs/ of the copy and, when $OUT is set, in $OUT
#   SKIP_STEP=1 bash scripts/gpu_speed.sh     # only the generation benchmark
#   SKIP_GEN=1 STEP_ARGS=--compile T2=400 bash scripts/gpu_speed.sh   # only the step, decoding compiled (gpu profile)
#   GPU_TESTS=1 bash scripts/gpu_speed.sh     # first the gpu-marked generation/update tests
# 1. benchmarks/bench_generate.py, 0.5B preset on cuda: kevin's HFPolicy vs transformers' generate with a
#    static cache (and the old reference loop, and ours with torch.compile unless GEN_ARGS is set without
#    --compile), batches $BATCH -> docs/bench_generate_h200.md
# 2. benchmarks/bench_train_step.py, 0.5B preset, cuda backend: one whole step with generation, evaluation
#    and update times and peak GPU memory per phase -> docs/bench_train_step_h200.md
set -euo pipefail
export PYTHONUNBUFFERED=1
export KEVIN_CACHE_DIR=${KEVIN_CACHE_DIR:-$PWD/.cache/kevin-gpu}
DOCS=${DOCS:-docs}
OUT_DIR=${OUT:-$DOCS}
mkdir -p "$DOCS" "$OUT_DIR"
date -u
nvidia-smi -L
python3 -c 'import torch, transformers; print("torch", torch.__version__, torch.version.cuda, "transformers", transformers.__version__)'
status=0
if [ "${GPU_TESTS:-0}" = 1 ]; then
  timeout "${T0:-150}" python3 -m pytest -q -m gpu tests/policy/test_hf_gpu.py -p no:cacheprovider -rA 2>&1 \
    | tee "$OUT_DIR/gpu_speed_tests.log" | tail -25 || status=1
fi
if [ "${SKIP_GEN:-0}" != 1 ]; then
  timeout "${T1:-300}" python3 benchmarks/bench_generate.py --device cuda --preset 0.5b --batch "${BATCH:-4,32}" \
    ${GEN_ARGS---compile} --out "$DOCS/bench_generate_h200.md" || status=1
fi
if [ "${SKIP_STEP:-0}" != 1 ]; then
  timeout "${T2:-240}" python3 benchmarks/bench_train_step.py --device cuda --backend cuda --cache "$KEVIN_CACHE_DIR" \
    ${STEP_ARGS:-} --out "$DOCS/bench_train_step_h200.md" 2>&1 | tail -45 || status=1
fi
if [ "$OUT_DIR" != "$DOCS" ]; then
  cp "$DOCS"/bench_generate_h200.* "$DOCS"/bench_train_step_h200.* "$OUT_DIR"/ 2>/dev/null || true
fi
exit $status
