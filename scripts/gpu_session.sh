#!/usr/bin/env bash
# Device-machine calls (one H200, 10 min per call). Each PART fits one call; results land in $OUT.
#   PART=tests       every gpu-marked test: the CUDA suite, reference-vs-reference, the published hacks,
#                    the hostile suite on cuda with Landlock on, the trainer on CUDA (DEBUG log per phase)
#   PART=bench       benchmarks/bench_eval.py: our batch evaluator on a mix of >= 32 candidates against
#                    stock load_inline compiled serially, then the 0.5B training step (bench_train_step.py)
#   PART=kernelbench KernelBench's own harness against ours on the same candidates. Before it, here:
#     mkdir -p external/KernelBench && git --git-dir=<fetched mirror> archive HEAD src | tar -x -C external/KernelBench
#     python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl pydantic pydantic-core annotated-types typing-inspection
#   and call run with carry [".whl", "external/KernelBench"].
set -uo pipefail
export PYTHONUNBUFFERED=1 KEVIN_CACHE_DIR="$PWD/.cache/kevin-gpu" KEVIN_COMPILE_WORKERS=${WORKERS:-0}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
date -u; nvidia-smi -L; nproc; python3 -c 'import torch; print("torch", torch.__version__, torch.version.cuda)'
case "${PART:-tests}" in
  tests)
    timeout ${T:-570} python3 -m pytest -q -m gpu tests/gpu tests/training -p no:cacheprovider -s -rA --durations=15 \
      -o log_cli=true --log-cli-level=DEBUG 2>&1 | grep -v '^evaluating' | tee "$OUT/gpu_tests.log" | grep -v ' phase of ' ;;
  bench)
    timeout ${T1:-360} python3 benchmarks/bench_eval.py --backend cuda --n ${N:-32} --stock ${STOCK:-2} \
      --cache "$KEVIN_CACHE_DIR" --out "$OUT/bench_eval_cuda.md" 2>&1 | grep -v '^evaluating' | tail -40
    timeout ${T2:-210} python3 benchmarks/bench_train_step.py --device cuda --backend cuda --cache "$KEVIN_CACHE_DIR" \
      --out "$OUT/train_step.md" 2>&1 | tail -60 ;;
  kernelbench)
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
    timeout ${T:-570} python3 benchmarks/bench_vs_kernelbench.py --kernelbench external/KernelBench --n ${N:-32} \
      --out "$OUT/bench_vs_kernelbench.md" 2>&1 | grep -v '^evaluating' | tail -60 ;;
  *) echo "unknown PART=${PART}" >&2; exit 2 ;;
esac
cp "$KEVIN_CACHE_DIR/baselines.json" "$OUT/" 2>/dev/null || true
