"""Where a checkpoint's evaluation moved against the warm start's: the tasks its updates trained on, and the others.

    python scripts/eval_gain_by_update.py outputs/h200-learn-quarter \
        outputs/h200-sft-turns-both-eval-start-train-8x1 outputs/h200-learn-quarter-eval-last-train-8x1 \
        --also-before outputs/h200-sft-turns-both-eval-start-train-8x1-seed1 \
        --also-after outputs/h200-learn-quarter-eval-last-train-8x1-seed1

A task counts as trained when a step drew it and one of its groups (the task's kernels of one turn) held a correct
kernel beside a failing one: only such a group's advantages reward correctness, so only there did an update push the
policy toward the task's correct kernels (an all-failing group's advantages are zero, an all-correct group's differ
by timing alone). This is narrower than `policy_drift.correct_answers`' "updated" (any nonzero advantage, timing
included), because the question here is about correct kernels. For the trained tasks, the untrained ones and all of
them, it prints each task's share of correct tries in the first evaluation (`report.json`'s `task_correct_share`) and
in the second, the mean gain, and a 90% bootstrap interval over the tasks (`kevin.analysis.learning.paired_gain`, the
interval `kevin learning` uses), then the same for the share of tasks solved (some try correct); beside each, the
interval with each task's tries redrawn too (`kevin.analysis.moves.count_gain` on its pooled counts: the try-to-try
noise that a task-only redraw leaves out), then the tasks whose
count of correct tries changed beyond chance (`kevin.analysis.moves`). An evaluation repeated at another sampling
seed (`--also-before`, `--also-after`, once per repeat) pools its tries with the first: a task's share is the mean
over that side's evaluations (each holds the same tries a task), it is solved when any of them holds a correct try,
and its counts are summed, so the figures reflect every try made. A gain on the trained tasks with a loss on the
others is an update that learns its own tasks and spills onto the rest; no gain on either is an update too
small to last.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from pathlib import Path

from kevin.analysis.learning import mixed_groups_by_task, paired_gain
from kevin.analysis.metrics import RunReport
from kevin.analysis.moves import count_gain, task_moves
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


def _over_repeats(evaluations: Sequence[Path], combine: Callable[[list[float]], float]) -> dict[str, float]:
    """Each task's correct shares in ``evaluations`` (over the tasks all of them evaluated), combined into one."""
    shares = [correct_shares(evaluation) for evaluation in evaluations]
    tasks = set.intersection(*(set(s) for s in shares))
    return {task: combine([s[task] for s in shares]) for task in tasks}


def pooled_shares(evaluations: Sequence[Path]) -> dict[str, float]:
    """Each task's share of correct tries over ``evaluations`` (repeats of one model, the same tries a task each):
    the mean of their shares."""
    return _over_repeats(evaluations, lambda shares: sum(shares) / len(shares))


def solved_shares(evaluations: Sequence[Path]) -> dict[str, float]:
    """Each task's 1.0 when some try of ``evaluations`` was correct, else 0.0: their mean over tasks is best@k for
    the pooled tries."""
    return _over_repeats(evaluations, lambda shares: float(max(shares) > 0))


def pooled_counts(evaluations: Sequence[Path]) -> dict[str, tuple[int, int]]:
    """Each task's (correct tries, tries) summed over ``evaluations`` (over the tasks all of them evaluated)."""
    counts = []
    for evaluation in evaluations:
        correct_shares(evaluation)  # a missing or older report stops here, with its message
        report = RunReport.from_dict(json.loads((evaluation / "report.json").read_text()))
        counts.append(report.task_correct_counts())
    tasks = set.intersection(*(set(c) for c in counts))
    return {task: (sum(c[task][0] for c in counts), sum(c[task][1] for c in counts)) for task in tasks}


def gains(run: Path, before: Path | Sequence[Path], after: Path | Sequence[Path], *, figure: str = "tries",
          trained: dict[str, int] | None = None) -> list[dict[str, object]]:
    """One row each for the trained tasks, the untrained ones and all of them (those present in every evaluation).
    ``before`` and ``after`` are one evaluation's folder or several repeats of one; ``figure`` is "tries" (each
    task's share of correct tries) or "solved" (whether any try was correct). ``trained``: ``trained_tasks(run)``
    where the caller has it already (it reads every judged kernel of the run)."""
    per_task = {"tries": pooled_shares, "solved": solved_shares}.get(figure)
    if per_task is None:
        raise ValueError(f"figure must be 'tries' or 'solved', got {figure!r}")
    mixed = trained_tasks(run) if trained is None else trained
    sides = [[side] if isinstance(side, Path) else list(side) for side in (before, after)]
    first, last = (per_task(side) for side in sides)
    counts_first, counts_last = (pooled_counts(side) for side in sides)
    shared = sorted(set(first) & set(last))
    rows = []
    for name, tasks in (("trained", [t for t in shared if mixed.get(t, 0) > 0]),
                        ("not trained", [t for t in shared if mixed.get(t, 0) == 0]),
                        ("all", shared)):
        row: dict[str, object] = {"tasks": name, "n": len(tasks)}
        if tasks:
            mean_first, mean_last, low, high, _ = paired_gain({t: [first[t], last[t]] for t in tasks})
            row.update(first=mean_first, last=mean_last, gain=mean_last - mean_first, low=low, high=high)
            # The interval above redraws the tasks; this one their tries too (each task's pooled count).
            _, _, low, high = count_gain({t: counts_first[t] for t in tasks}, {t: counts_last[t] for t in tasks},
                                         "share" if figure == "tries" else "solved")
            row.update(redrawn_low=low, redrawn_high=high)
        rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run", type=Path, help="the training run's folder (outputs/<name>)")
    ap.add_argument("before", type=Path, help="the first evaluation's folder (e.g. the warm start's)")
    ap.add_argument("after", type=Path, help="the second evaluation's folder (e.g. the last checkpoint's)")
    ap.add_argument("--also-before", type=Path, action="append", default=[], metavar="DIR",
                    help="a repeat of the first evaluation at another sampling seed, pooled with it")
    ap.add_argument("--also-after", type=Path, action="append", default=[], metavar="DIR",
                    help="a repeat of the second evaluation at another sampling seed, pooled with it")
    args = ap.parse_args()
    before, after = [args.before, *args.also_before], [args.after, *args.also_after]
    mixed = trained_tasks(args.run)  # once: every judged kernel of the run
    for figure, title in (("tries", "tries correct"), ("solved", "tasks solved")):
        print(f"\n{title}:" if figure == "solved" else f"{title}:")
        print(f"| tasks | n | {' + '.join(p.name for p in before)} | {' + '.join(p.name for p in after)} | gain "
              "| 90% interval | 90% interval, tries redrawn |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for row in gains(args.run, before, after, figure=figure, trained=mixed):
            if "gain" not in row:
                print(f"| {row['tasks']} | 0 | | | | | |")
                continue
            print(f"| {row['tasks']} | {row['n']} | {row['first']:.3f} | {row['last']:.3f} | {row['gain']:+.3f} "
                  f"| [{row['low']:+.3f}, {row['high']:+.3f}] "
                  f"| [{row['redrawn_low']:+.3f}, {row['redrawn_high']:+.3f}] |")
    moves = task_moves(pooled_counts(before), pooled_counts(after))
    print(f"\ntasks whose correct tries moved beyond chance (Fisher's exact test, p < 0.05): {len(moves)}")
    if moves:
        print("| task | trained | before | after | p |")
        print("| --- | --- | --- | --- | --- |")
        for m in moves:
            print(f"| {m.task} | {'yes' if mixed.get(m.task, 0) else 'no'} | {m.before} of {m.before_tries} "
                  f"| {m.after} of {m.after_tries} | {m.p:.2g} |")


if __name__ == "__main__":
    main()
