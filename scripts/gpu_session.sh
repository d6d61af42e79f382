#!/usr/bin/env bash
# Device-machine calls (10 min per call). Each PART fits one call; results land in $OUT.
#   PART=judge   (WARMSTART=SECONDS: first the CUDA warm-start answers; TESTS: test files in order)
#                what the machine allows a candidate (isolation probe: Landlock, read-only mounts, seccomp,
#                capabilities, CUDA IPC), then every gpu-marked evaluation test with the sandbox layers on: the
#                60 CUDA references, reference vs reference, the published hacks, the hostile suite by class; with
#                Landlock on when the probe shows CUDA starts under the harness's allow-list (else off)
#   PART=bench   benchmarks/bench_eval.py: throughput of our batch evaluator beside the evaluator of an older
#                checkout (BASELINE, default .baseline/d0218c5, carried as an ignored folder: made here with
#                `mkdir -p .baseline/d0218c5 && git archive d0218c5 | tar -x -C .baseline/d0218c5`), our compile
#                against stock load_inline (both serial), GPU busy share
#   PART=evalspeed  benchmarks/bench_eval.py (compile against stock load_inline, both serial; busy share and where
#                the GPU waited), then GPU tests with every build running nvcc's host and device passes side by
#                side (KEVIN_COMPILE_JOBS=3), in a cache of their own that shares the prepared headers:
#                SPLIT=suite (default) the 60 CUDA references, SPLIT=hostile the hostile suite by class
#   PART=kernelbench  benchmarks/bench_vs_kernelbench.py: KernelBench's own harness against ours on the same
#                candidates, end to end. Needs, carried: a KernelBench checkout (the search tool's fetch of
#                ScalingIntelligence/KernelBench, checked out into the git-ignored external/KernelBench) and the
#                pydantic wheels in .whl (see the device README: pydantic, pydantic-core, annotated-types,
#                typing-inspection, for Python 3.12); carry=["external/KernelBench", ".whl"]
#   PART=speed   generation and update speed (scripts/gpu_speed.sh)
#   PART=tests   every gpu-marked test (evaluation, policy, training)
#   Every PART installs the wheels carried in .whl first (capstone for the evaluator's disassembly of candidate
#   builds, which the device image lacks: `python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12
#   --platform manylinux2014_x86_64 -d .whl capstone==5.0.9`; carry=[".whl"]).
set -uo pipefail
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONUNBUFFERED=1 KEVIN_CACHE_DIR="$PWD/.cache/kevin-gpu" KEVIN_COMPILE_WORKERS=${WORKERS:-0}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
date -u; nvidia-smi -L; nproc; uname -r; python3 -c 'import torch; print("torch", torch.__version__, torch.version.cuda)'
case "${PART:-judge}" in
  judge)
    timeout 120 python3 scripts/gpu_isolation_probe.py --variants ${VARIANTS:-spec} 2>&1 | tee "$OUT/isolation_probe.txt"
    # The GPU tests run with Landlock on (the default) when the harness's own allow-list lets CUDA start;
    # otherwise without it, so one call still judges the suite (and the log says Landlock is what broke).
    if [ -z "${KEVIN_TEST_FILESYSTEM:-}" ]; then
      if grep -q '"variant": "spec".*"cuda": true' "$OUT/isolation_probe.txt"; then export KEVIN_TEST_FILESYSTEM=on
      else export KEVIN_TEST_FILESYSTEM=off; echo "Landlock stops CUDA here: the tests run without it"; fi
    fi
    echo "KEVIN_TEST_FILESYSTEM=$KEVIN_TEST_FILESYSTEM"
    if [ -n "${WARMSTART:-}" ]; then  # the concise CUDA warm-start answers (data/warmstart/cuda) through the evaluator
      timeout ${WARMSTART} python3 -m kevin_cli eval-batch data/warmstart/cuda --backend cuda --timing-trials 10 \
        --out "$OUT/warmstart_cuda.jsonl" 2>&1 | grep -v '━' | tail -45
    fi
    # TESTS: the files to run, in order (default: every GPU test of the judge, tests/gpu).
    timeout ${T:-450} python3 -m pytest -q -m gpu ${TESTS:-tests/gpu} -p no:cacheprovider -s -rA --durations=15 \
      -o log_cli=true --log-cli-level=WARNING 2>&1 | tee "$OUT/gpu_tests.log" | grep -v ' phase of ' | tail -150 ;;
  bench)
    timeout ${T1:-540} python3 benchmarks/bench_eval.py --backend cuda --n ${N:-24} --stock ${STOCK:-2} \
      --compare-dir "${BASELINE:-.baseline/d0218c5}" --out "$OUT/bench_eval_cuda.md" 2>&1 | grep -v '^evaluating' | tail -40 ;;
  evalspeed)
    # Caches of this call alone: builds left by an earlier call would skip the compiles being measured.
    bench="$KEVIN_CACHE_DIR-bench-$$" suite="$KEVIN_CACHE_DIR-split-$$"
    timeout ${T1:-330} python3 benchmarks/bench_eval.py --backend cuda --n ${N:-16} --stock ${STOCK:-2} \
      --cache "$bench" --out "$OUT/bench_eval_cuda.md" 2>&1 | grep -v '^evaluating' | grep -v '━' | tail -30
    mkdir -p "$suite"; ln -sfn "$bench/headers" "$suite/headers"
    case "${SPLIT:-suite}" in
      suite) tests=(tests/gpu/test_cuda_evaluation.py -k "every_cuda_reference or cuda_ipc") ;;
      hostile) tests=(tests/gpu/test_cuda_sandbox.py) ;;
      *) echo "unknown SPLIT=${SPLIT}" >&2; exit 2 ;;
    esac
    KEVIN_CACHE_DIR="$suite" KEVIN_COMPILE_JOBS=3 KEVIN_COMPILE_WORKERS=${SPLIT_WORKERS:-5} timeout ${T2:-230} \
      python3 -m pytest -q -m gpu "${tests[@]}" -p no:cacheprovider -rA --durations=5 2>&1 \
      | tee "$OUT/gpu_tests.log" | grep -v ' phase of ' | tail -40 ;;
  kernelbench)
    timeout ${T:-540} python3 benchmarks/bench_vs_kernelbench.py --kernelbench external/KernelBench --n ${N:-16} \
      --out "$OUT/bench_vs_kernelbench.md" 2>&1 | grep -v '━' | tail -40 ;;
  speed)
    bash scripts/gpu_speed.sh ;;
  tests)
    timeout ${T:-570} python3 -m pytest -q -m gpu tests -p no:cacheprovider -s -rA --durations=15 2>&1 \
      | tee "$OUT/gpu_tests.log" | tail -150 ;;
  *) echo "unknown PART=${PART}" >&2; exit 2 ;;
esac
cp "$KEVIN_CACHE_DIR/baselines.json" "$OUT/" 2>/dev/null || true
