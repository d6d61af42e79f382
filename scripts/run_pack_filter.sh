#!/usr/bin/env bash
# Filters a run's file list (one path a line, on stdin) down to what the next machine needs:
#   bash scripts/run_pack_filter.sh RUN NEWEST
# RUN: the run's folder (outputs/<name>); NEWEST: the newest checkpoint's step ("" when there is none: keep all).
# Drops the checkpoints older than NEWEST and the rollouts of the steps up to NEWEST (a resume redoes only the steps
# after it; each step's kernels.jsonl keeps its verdicts for `kevin learning`).
set -euo pipefail
awk -v run="${1:?RUN}" -v newest="${2:-}" '
  function step(path, word,    n) { n = path; sub(".*/" word "/step_0*", "", n); sub("/.*", "", n); return n + 0 }
  index($0, run "/checkpoints/step_") == 1 && newest != "" && step($0, "checkpoints") != newest + 0 { next }
  index($0, run "/steps/step_") == 1 && $0 ~ /\/rollout\// && newest != "" && step($0, "steps") <= newest + 0 { next }
  { print }'
