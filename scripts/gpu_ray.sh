#!/usr/bin/env bash
# The Ray cluster evaluator on a machine with two GPUs (or more), one GPU per Ray worker: one device call.
#
# Ray is not on the device image, and its wheel (79 MB) is larger than the 64 MiB one call may carry, so it
# travels as an archive of its installed files without the parts evaluation never loads (Java jars, RLlib, Data,
# Serve, LLM; about 30 MB with xz), beside wheels of the packages Ray needs that the image lacks (jsonschema and
# its three dependencies). Both are made here, once, on a machine with pip and the package index:
#
#   bash scripts/gpu_ray.sh prepare            # writes .raycarry/ (ignored by git; about 2 minutes of xz on 2 cores)
#
# then one device call with .raycarry carried:
#
#   PART=run bash scripts/gpu_ray.sh           # run(command="bash scripts/gpu_ray.sh", carry=[".raycarry"],
#                                              #     kind="nvidia-h200-x2")
#
# The run unpacks Ray under /tmp/site, starts a local Ray cluster over the machine's GPUs and runs
# tests/gpu/test_cluster_gpu.py (every worker on its own GPU, a batch judged in order on all of them, a worker
# killed mid-batch restarted on its GPU). Log and $OUT/gpu_ray.json (layout, batch seconds, restarts) come back.
set -uo pipefail
PY_VERSION=${PY_VERSION:-3.12}          # the device image's python3
PYTHON=${PYTHON:-python3}               # prepare: any python with pip (it downloads for PY_VERSION)
CARRY=${CARRY:-.raycarry}
RAY_VERSION=2.60.0

prepare() {
  set -e
  local tmp
  tmp=$(mktemp -d)
  rm -rf "$CARRY" && mkdir -p "$CARRY"
  local platforms=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
  "$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version "$PY_VERSION" --implementation cp \
    "${platforms[@]}" -d "$tmp" "ray==$RAY_VERSION"
  "$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version "$PY_VERSION" --implementation cp \
    "${platforms[@]}" -d "$CARRY" jsonschema jsonschema-specifications referencing rpds-py
  unzip -q "$tmp"/ray-"$RAY_VERSION"-*.whl -d "$tmp/files"   # unzip keeps the executable bits of raylet and gcs_server
  tar -C "$tmp/files" -c --exclude=ray/jars --exclude=ray/rllib --exclude=ray/data --exclude=ray/serve --exclude=ray/llm . \
    | xz -T0 -6 > "$CARRY/ray.tar.xz"
  rm -rf "$tmp"
  du -sh "$CARRY"; ls -la "$CARRY"
}

run() {
  export PYTHONUNBUFFERED=1 KEVIN_CACHE_DIR="$PWD/.cache/kevin-gpu" RAY_USAGE_STATS_ENABLED=0
  OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
  date -u; nvidia-smi -L; nproc; python3 -c 'import torch; print("torch", torch.__version__, torch.cuda.device_count(), "GPUs")'
  mkdir -p /tmp/site
  tar -C /tmp/site -xJf "$CARRY/ray.tar.xz" || exit 3
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site "$CARRY"/*.whl || exit 3
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}   # Ray's workers inherit it from the driver
  python3 -c 'import ray; print("ray", ray.__version__)' || exit 3
  timeout "${T:-540}" python3 -m pytest -q -m gpu tests/gpu/test_cluster_gpu.py -p no:cacheprovider -s -rA --durations=10 \
    -o log_cli=true --log-cli-level=WARNING 2>&1 | tee "$OUT/gpu_ray.log" | tail -120
  cp "$KEVIN_CACHE_DIR/baselines.json" "$OUT/" 2>/dev/null || true
}

case "${1:-${PART:-run}}" in
  prepare) prepare ;;
  run) run ;;
  *) echo "usage: bash scripts/gpu_ray.sh [prepare|run]" >&2; exit 2 ;;
esac
