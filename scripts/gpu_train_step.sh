#!/usr/bin/env bash
# One device call (one H200, 10 min): one step of the training flow on cuda with the 0.5B preset built in-process
# (scripts/gpu_train_step.py says how), once per entry of WAVES (experiment.rollout_waves), each with a cold compile
# and baseline cache of its own so that the runs compare. Results land in $OUT: step_w<N>.json (seconds per phase,
# the rollout's wall time, update tokens/s, verdicts, peak GPU memory), report_w<N>.md, and waves.md (side by side).
#   TASKS=4 TRAJ=4 TURNS=2 TOKENS=512 WAVES="1 2" bash scripts/gpu_train_step.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
date -u; nvidia-smi -L; nproc; python3 -c 'import torch, transformers; print("torch", torch.__version__, torch.version.cuda, "transformers", transformers.__version__)'
for W in ${WAVES:-1}; do
  KEVIN_CACHE_DIR="$PWD/.cache/kevin-gpu-w$W" timeout ${T:-270} python3 scripts/gpu_train_step.py --preset 0.5b \
    --backend cuda --out /tmp/gpu_train_step_w$W --tasks ${TASKS:-4} --trajectories ${TRAJ:-4} --turns ${TURNS:-2} \
    --max-response-tokens ${TOKENS:-512} --waves $W 2>&1 | grep -v '^evaluating' | tee "$OUT/gpu_train_step_w$W.log" | tail -60
  cp /tmp/gpu_train_step_w$W/step.json "$OUT/step_w$W.json" 2>/dev/null || true
  cp /tmp/gpu_train_step_w$W/report.md "$OUT/report_w$W.md" 2>/dev/null || true
done
python3 - "$OUT" <<'PY' | tee "$OUT/waves.md"
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
rows = [json.loads(p.read_text()) for p in sorted(out.glob("step_w*.json"))]
print("| waves | generate s | evaluate s | rollout wall s | step s | verdicts |")
print("| --- | --- | --- | --- | --- | --- |")
for r in rows:
    s = r["seconds"]
    print(f"| {r['waves']} | {s.get('generate', 0):.1f} | {s.get('evaluate', 0):.1f} | {s.get('rollout_wall', 0):.1f} "
          f"| {s['step']:.1f} | {r['verdicts']} |")
PY
