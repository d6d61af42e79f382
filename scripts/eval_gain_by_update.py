"""Where a checkpoint's evaluation moved against the warm start's: the tasks its updates trained on, and the others.

    python scripts/eval_gain_by_update.py outputs/h200-learn-quarter \
        outputs/h200-sft-turns-both-eval-start-train-8x1 outputs/h200-learn-quarter-eval-last-train-8x1

A task counts as trained when a step drew it and one of its groups (the task's kernels of one turn) held a correct
kernel beside a failing one: only such a group's advantages reward correctness, so only there did an update push the
policy toward the task's correct kernels (an all-failing group's advantages are zero, an all-correct group's differ
by timing alone). This is narrower than `policy_drift.correct_answers`' "updated" (any nonzero advantage, timing
included), because the question here is about correct kernels. For the trained tasks, the untrained ones and all of
them, it prints each task's share of correct tries in the first evaluation (`report.json`'s `task_correct_share`) and
in the second, the mean gain, and a 90% bootstrap interval over the tasks (`kevin.analysis.learning.paired_gain`, the
interval `kevin learning` uses). A gain on the trained tasks with a loss
on the others is an update that learns its own tasks and spills onto the rest; no gain on either is an update too
small to last.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from kevin.analysis.learning import mixed_groups_by_task, paired_gain
from kevin.pipeline import read_step_verdicts


def trained_tasks(run: Path) -> dict[str, int]:
    """Each task a step of ``run`` drew, with the number of its groups (per step and turn) that held a correct kernel
    beside a failing one (``kevin.analysis.learning.mixed_groups_by_task`` over the run's judged kernels)."""
    mixed = mixed_groups_by_task(read_step_verdicts(run))
    if not mixed:
        raise SystemExit(f"{run} holds no judged kernels (steps/step_*/): is it a training run's folder?")
    return mixed


def correct_shares(evaluation: Path) -> dict[str, float]:
    """Each task's share of correct tries in an evaluation's report."""
    report = evaluation / "report.json"
    if not report.is_file():
        raise SystemExit(f"{evaluation} has no report.json: is the evaluation finished (kevin evaluate --resume)?")
    shares = json.loads(report.read_text()).get("task_correct_share")
    if shares is None:  # reports written before RunReport kept it
        raise SystemExit(f"{report} has no task_correct_share: re-read it from its rollouts (kevin evaluate --resume)")
    return {task: float(share) for task, share in shares.items()}


def gains(run: Path, before: Path, after: Path) -> list[dict[str, object]]:
    """One row each for the trained tasks, the untrained ones and all of them (those present in both evaluations)."""
    mixed = trained_tasks(run)
    first, last = correct_shares(before), correct_shares(after)
    shared = sorted(set(first) & set(last))
    rows = []
    for name, tasks in (("trained", [t for t in shared if mixed.get(t, 0) > 0]),
                        ("not trained", [t for t in shared if mixed.get(t, 0) == 0]),
                        ("all", shared)):
        row: dict[str, object] = {"tasks": name, "n": len(tasks)}
        if tasks:
            mean_first, mean_last, low, high, _ = paired_gain({t: [first[t], last[t]] for t in tasks})
            row.update(first=mean_first, last=mean_last, gain=mean_last - mean_first, low=low, high=high)
        rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run", type=Path, help="the training run's folder (outputs/<name>)")
    ap.add_argument("before", type=Path, help="the first evaluation's folder (e.g. the warm start's)")
    ap.add_argument("after", type=Path, help="the second evaluation's folder (e.g. the last checkpoint's)")
    args = ap.parse_args()
    print(f"| tasks | n | {args.before.name} | {args.after.name} | gain | 90% interval |")
    print("| --- | --- | --- | --- | --- | --- |")
    for row in gains(args.run, args.before, args.after):
        if "gain" not in row:
            print(f"| {row['tasks']} | 0 | | | | |")
            continue
        print(f"| {row['tasks']} | {row['n']} | {row['first']:.3f} | {row['last']:.3f} | {row['gain']:+.3f} "
              f"| [{row['low']:+.3f}, {row['high']:+.3f}] |")


if __name__ == "__main__":
    main()
