#!/usr/bin/env bash
# One device call: the training step with one process per GPU over N GPUs and the same step on 1 GPU, for the
# 0.5B and 1.5B presets (scripts/gpu_train_multi.py says what each run does). Results land in $OUT:
# gpu_train_multi.jsonl (every run's figures, per process), gpu_train_multi.md (the table and the 1 -> N speed-ups)
# and gpu_train_multi.log.
#   bash scripts/gpu_train_multi.sh 2                                   # nvidia-h200-x2
#   TASKS=8 TRAJ=16 TURNS=4 TOKENS=1024 bash scripts/gpu_train_multi.sh 8   # the paper's batch shape, nvidia-h200-x8
#   PRESETS=0.5b ZERO="0 3" COUNTS="1 2" bash scripts/gpu_train_multi.sh 2   # replicated and ZeRO-3, chosen counts
# DeepSpeed is not on the device image: carry the wheels built here (`.whl`, see docs/multigpu.md); they are
# installed into /tmp/site when `import deepspeed` fails.
set -uo pipefail
N=${1:-2}
# NVLink multicast stays off (the device notes: it can take the host's shared GPUs out of service).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 KEVIN_CACHE_DIR="$PWD/.cache/kevin-gpu" TOKENIZERS_PARALLELISM=false
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
LOG="$OUT/gpu_train_multi.log"; RESULTS="$OUT/gpu_train_multi.jsonl"; : > "$RESULTS"
if ! python3 -c 'import deepspeed' 2>/dev/null; then
  ls .whl/*.whl >/dev/null 2>&1 || { echo "deepspeed is missing and no .whl/ was carried" | tee -a "$LOG"; exit 2; }
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 2
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
{ date -u; nvidia-smi -L; nproc
  python3 -c 'import torch, transformers, deepspeed; print("torch", torch.__version__, torch.version.cuda, "gpus", torch.cuda.device_count(), "transformers", transformers.__version__, "deepspeed", deepspeed.__version__)'
} 2>&1 | tee -a "$LOG"
for preset in ${PRESETS:-0.5b 1.5b}; do
  for zero in ${ZERO:-3}; do
    for n in ${COUNTS:-1 $N}; do
      echo "== preset $preset ZeRO $zero on $n GPU(s) $(date -u +%T)" | tee -a "$LOG"
      timeout ${T:-600} python3 -m torch.distributed.run --standalone --nproc_per_node "$n" scripts/gpu_train_multi.py \
        --preset "$preset" --zero "$zero" --backend cuda --tasks ${TASKS:-2} --trajectories ${TRAJ:-8} \
        --turns ${TURNS:-2} --max-response-tokens ${TOKENS:-256} --work /tmp/gpu_train_multi --results "$RESULTS" 2>&1 \
        | grep -v -e '^evaluating' -e 'Loading weights' | tail -n 60 | tee -a "$LOG"
      rm -rf /tmp/gpu_train_multi/ckpt_*  # a 1.5B checkpoint is ~6 GB x 3 files: keep the disk for the next run
    done
  done
done
python3 scripts/gpu_train_multi.py --report "$RESULTS" "$OUT/gpu_train_multi.md" 2>&1 | tee -a "$LOG"
