"""What the score's floor (verdict.clock_ms) costs honest kernels and what it takes from a forged clock, side by side.

    python benchmarks/bench_timing_floor.py --backend cpu --rounds 2 --out docs/bench_timing_floor_cpu.md

Each round judges our concise level-1 answers (data/warmstart/<backend>/level1) and one forgery, a relu whose clock
reports every call shorter than it ran by just under the slack (tests/evaluation/hostile.py), once with the floor
and once without it (the evaluator's own figure of a call ignored, as before 2026-12-05). For the honest kernels it
prints how much longer they were scored than they reported (the floor's cost); for the forgery its speedup against
the honest relu's in the same judging (what forging bought).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.common import print_and_save, raise_share, scratch_dir  # noqa: E402
from kevin.evaluation import Candidate, EvalConfig, Evaluator, runs  # noqa: E402
from kevin.tasks.loader import find_task, load_tasks  # noqa: E402
from tests.conftest import RELU_BODY, cpp_solution  # noqa: E402
from tests.evaluation.hostile import NO_INTEGRITY, SHORT_CPU_TIMER, native  # noqa: E402
from tests.evaluation.test_sandbox_cpu import RELAXED  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="cpu", choices=["cpu"])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    tasks = load_tasks("bundled")
    folder = REPO / "data" / "warmstart" / args.backend / "level1"
    honest = [(find_task(tasks, f"level1/{p.stem}"), p.read_text()) for p in sorted(folder.glob("*.py"))][:8]
    relu = find_task(tasks, "level1/01_relu")
    forged = cpp_solution(native(NO_INTEGRITY + SHORT_CPU_TIMER) + RELU_BODY, name="bench_forged")
    floor = runs.clock_ms
    shares: dict[str, list[float]] = {"floor": [], "no floor": []}
    forgery: dict[str, list[float]] = {"floor": [], "no floor": []}
    config = EvalConfig(backend=args.backend, timing_trials=20, warmup_trials=2, timeout_s=30, rules=RELAXED,
                        cache_dir=scratch_dir("kevin-floor-"))
    with Evaluator(config) as ev:
        for _ in range(args.rounds):
            for mode in ("floor", "no floor"):
                runs.clock_ms = floor if mode == "floor" else (lambda evidence, overhead: 0.0)
                items = [(t, Candidate(t.task_id, src, candidate_id=t.task_id)) for t, src in honest]
                items += [(relu, Candidate(relu.task_id, cpp_solution(RELU_BODY), candidate_id="honest relu")),
                          (relu, Candidate(relu.task_id, forged, candidate_id="forged relu"))]
                results = {r.candidate_id: r for r in ev.evaluate_many(items)}
                for t, _ in honest:
                    r = results[t.task_id]
                    if r.correct:
                        shares[mode].append(raise_share(r.warnings))
                good, bad = results["honest relu"], results["forged relu"]
                if good.correct:
                    forgery[mode].append(bad.speedup / good.speedup if bad.correct else 0.0)
                print(mode, {k: f"{r.status.value} {r.runtime_ms:.4f}" for k, r in results.items()}, flush=True)
    runs.clock_ms = floor
    lines = [f"# The score's floor on {args.backend}: {args.rounds} round(s), `python benchmarks/bench_timing_floor.py "
             f"--backend {args.backend} --rounds {args.rounds}`", "",
             "| | honest kernels judged | scored slower than reported (median / max) | forged relu's speedup / honest relu's |",
             "| --- | --- | --- | --- |"]
    for mode in ("floor", "no floor"):
        s, f = shares[mode] or [0.0], forgery[mode] or [0.0]
        lines.append(f"| {mode} | {len(shares[mode])} | {statistics.median(s):.1%} / {max(s):.1%} | "
                     f"{', '.join(f'{x:.2f}' for x in f)} |")
    lines += ["", "A forged speedup ratio of 0 means the forgery was not judged correct (flagged)."]
    print_and_save("\n".join(lines) + "\n", args.out)


if __name__ == "__main__":
    main()
