"""What judging identical candidates once (EvalConfig.reuse_verdicts) saves on a rollout's repeats, side by side.

    python benchmarks/bench_verdict_reuse.py --backend cpu --tasks 4 --rounds 2 --out docs/bench_verdict_reuse_cpu.md

A rollout of our concise level-1 answers (data/warmstart/<backend>/level1), shaped as the H200 learning runs'
rollouts are: per task four trajectories, of which two write the same answer and two answers of their own, and a
second turn that repeats the first (`python scripts/repeats_in_run.py outputs/<run>` counts them in a real run:
the fifth run's first steps built and ran 12 to 20 kernels a step, at most 3 to 11 of them distinct). Each turn is
one batch, as a training step's is. Every build is made once before the clock starts (a primed compile cache, as identical
sources share one build either way), so what the two columns differ in is the run phase alone: the serial part,
one candidate at a time on the device. Rounds alternate which mode goes first.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.common import print_and_save, scratch_dir  # noqa: E402
from kevin.evaluation import Candidate, EvalConfig, Evaluator  # noqa: E402
from kevin.tasks.loader import find_task, load_tasks  # noqa: E402

TRAJECTORIES = 4
TURNS = 2


def rollout(honest: list[tuple[object, str]]) -> list[list[tuple[object, Candidate]]]:
    """One batch per turn: trajectories 0 and 1 write the task's answer, 2 and 3 a variant each (the same kernel,
    its own text), and every second turn repeats its first."""
    turns = []
    for turn in range(TURNS):
        items = []
        for task, source in honest:
            answers = [source, source, source + "\n# written another way\n", source + "\n# and a third way\n"]
            for traj, answer in enumerate(answers):
                items.append((task, Candidate(task.task_id, answer, trajectory=traj, turn=turn,
                                              candidate_id=f"{task.task_id}#traj{traj}#turn{turn}")))
        turns.append(items)
    return turns


def judge(config: EvalConfig, turns: list[list[tuple[object, Candidate]]]) -> tuple[float, int, int, int]:
    """(wall seconds, run phases, reused verdicts, correct verdicts) of the rollout's turns, one batch each."""
    with Evaluator(config) as ev:
        ev.prefetch_baselines([t for t, _ in turns[0]])  # cached: not part of either column
        start, runs, reused, correct = time.perf_counter(), 0, 0, 0
        for items in turns:
            results = ev.evaluate_many(items)
            runs += len(ev.run_intervals)
            reused += sum(r.reused for r in results)
            correct += sum(r.correct for r in results)
        return time.perf_counter() - start, runs, reused, correct


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--tasks", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    tasks = load_tasks("bundled")
    folder = REPO / "data" / "warmstart" / args.backend / "level1"
    honest = [(find_task(tasks, f"level1/{p.stem}"), p.read_text()) for p in sorted(folder.glob("*.py"))][:args.tasks]
    turns = rollout(honest)
    base = EvalConfig(backend=args.backend, cache_dir=scratch_dir("kevin-reuse-"),
                      **({"timing_trials": 20, "warmup_trials": 2, "timeout_s": 30} if args.backend == "cpu" else {}))
    print_and_save(measure(args, honest, turns, base), args.out)


def measure(args: argparse.Namespace, honest: list, turns: list, base: EvalConfig) -> str:
    """The report: both modes, ``args.rounds`` times each, after priming the builds."""
    with Evaluator(base) as ev:  # every distinct build into the cache, before any clock
        primed = time.perf_counter()
        for task, cand in {c.source: (t, c) for t, c in turns[0]}.values():
            ev.compile(cand)
        primed = time.perf_counter() - primed
    figures: dict[str, list[tuple[float, int, int, int]]] = {"every candidate judged": [], "repeats reused": []}
    for r in range(args.rounds):
        modes = list(figures) if r % 2 == 0 else list(reversed(figures))
        for mode in modes:
            config = EvalConfig.from_dict({**base.to_dict(), "reuse_verdicts": mode == "repeats reused"})
            figures[mode].append(judge(config, turns))
    n = len(turns[0]) * TURNS
    lines = [f"# Judging a rollout's repeats once ({args.backend}, {len(honest)} tasks x {TRAJECTORIES} trajectories x "
             f"{TURNS} turns = {n} candidates, {len(honest) * 3} distinct; {args.rounds} rounds)", "",
             f"`python benchmarks/bench_verdict_reuse.py --backend {args.backend} --tasks {args.tasks} "
             f"--rounds {args.rounds}`; builds primed first ({primed:.1f} s, in neither column).", "",
             "| mode | wall s (median) | wall s (each round) | run phases | reused | correct |", "| --- | --- | --- | --- | --- | --- |"]
    for mode, rows in figures.items():
        walls = [w for w, *_ in rows]
        _, runs, reused, correct = rows[-1]
        lines.append(f"| {mode} | {statistics.median(walls):.1f} | {', '.join(f'{w:.1f}' for w in walls)} | {runs} | "
                     f"{reused} | {correct} of {n} |")
    off, on = (statistics.median(w for w, *_ in figures[m]) for m in figures)
    lines += ["", f"Wall time with repeats reused: {on / off:.2f}x of judging every candidate ({off / on:.2f}x faster)."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
