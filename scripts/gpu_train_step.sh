#!/usr/bin/env bash
# One device call (one H200, 10 min): one step of the training flow on cuda with the 0.5B preset built in-process
# (scripts/gpu_train_step.py says how), printing the seconds of each phase. Results land in $OUT:
# step.json (seconds per phase, update tokens/s, verdicts, peak GPU memory) and report.md (the step's report).
#   TASKS=4 TRAJ=4 TURNS=2 TOKENS=512 bash scripts/gpu_train_step.sh
set -uo pipefail
export PYTHONUNBUFFERED=1 KEVIN_CACHE_DIR="$PWD/.cache/kevin-gpu"
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
date -u; nvidia-smi -L; nproc; python3 -c 'import torch, transformers; print("torch", torch.__version__, torch.version.cuda, "transformers", transformers.__version__)'
timeout ${T:-570} python3 scripts/gpu_train_step.py --preset 0.5b --backend cuda --out /tmp/gpu_train_step \
  --tasks ${TASKS:-4} --trajectories ${TRAJ:-4} --turns ${TURNS:-2} --max-response-tokens ${TOKENS:-512} 2>&1 \
  | grep -v '^evaluating' | tee "$OUT/gpu_train_step.log"
cp /tmp/gpu_train_step/step.json /tmp/gpu_train_step/report.md "$OUT/" 2>/dev/null || true
