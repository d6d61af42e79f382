"""The numbers of a training step as tables (pure functions over the step's records).

``step_report_markdown`` is the Prefect artifact of a step (and ``report.md`` in its folder): verdict counts,
rewards per turn, best speedup per task, seconds per phase. ``step_lines`` says the same in a few lines for
the terminal, and ``run_summary`` gathers what ``kevin train`` prints at the end.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Mapping, Sequence

from kevin.records.rollout import TrainingSample, Trajectory
from kevin.tracking import STATUSES, markdown_table

__all__ = ["PHASES", "ROLLOUT_PHASES", "phase_seconds", "rollout_wall", "print_results", "run_summary", "step_lines", "step_report_markdown", "task_rows", "turn_rows",
           "verdict_counts"]

PHASES = ("sample", "baselines", "generate", "parse", "evaluate", "aggregate", "update", "monitor", "checkpoint", "sync")
"""The phases of a step, in order; ``timings.json`` keys are ``<phase>``, ``<phase>/<turn>`` or ``<phase>/<turn>/<wave>``."""


def verdict_counts(trajectories: Sequence[Trajectory]) -> dict[str, int]:
    """Kernels per verdict, in STATUSES order (verdicts that did not occur left out)."""
    counts = Counter(t.status.value for traj in trajectories for t in traj.turns)
    return {s: counts[s] for s in STATUSES if counts[s]}


def turn_rows(trajectories: Sequence[Trajectory], samples: Sequence[TrainingSample] = ()) -> list[dict[str, float]]:
    """Per turn: kernels, correct kernels, mean kernel score and mean turn return (the discounted sum the
    advantages are taken from; 0 without samples)."""
    rows = []
    turns = sorted({t.turn for traj in trajectories for t in traj.turns})
    for index in turns:
        mine = [t for traj in trajectories for t in traj.turns if t.turn == index]
        returns = [s.reward for s in samples if s.turn == index]
        rows.append({"turn": index, "kernels": len(mine), "correct": sum(t.correct for t in mine),
                     "score_mean": sum(t.score for t in mine) / len(mine),
                     "return_mean": sum(returns) / len(returns) if returns else 0.0})
    return rows


def task_rows(trajectories: Sequence[Trajectory]) -> list[dict[str, Any]]:
    """Per task (in batch order): kernels, correct kernels, their mean score, speedup of the fastest correct one (0 if
    none)."""
    rows: dict[str, dict[str, Any]] = {}
    for traj in trajectories:
        row = rows.setdefault(traj.task_id, {"task": traj.task_id, "kernels": 0, "correct": 0, "score_mean": 0.0,
                                             "best_speedup": 0.0})
        row["kernels"] += len(traj.turns)
        row["correct"] += sum(t.correct for t in traj.turns)
        row["score_mean"] += sum(t.score for t in traj.turns)  # a sum until every trajectory is in
        row["best_speedup"] = max(row["best_speedup"], traj.best_speedup)
    for row in rows.values():
        row["score_mean"] = row["score_mean"] / row["kernels"] if row["kernels"] else 0.0
    return list(rows.values())


ROLLOUT_PHASES = ("generate", "parse", "evaluate")
"""The phases of a step's turns; with waves they overlap one another."""


def rollout_wall(spans: Mapping[str, Sequence[float]]) -> float | None:
    """Seconds from the start of the step's first turn phase to the end of its last (None when ``spans``, the
    ``spans.json`` of a step, has none): the rollout's wall time, less than its phases' sum when waves overlap."""
    rows = [v for k, v in spans.items() if k.split("/", 1)[0] in ROLLOUT_PHASES]
    if not rows:
        return None
    return max(float(end) for _, end in rows) - min(float(begin) for begin, _ in rows)


def phase_seconds(timings: Mapping[str, float], spans: Mapping[str, Sequence[float]] | None = None) -> dict[str, float]:
    """Seconds per phase (a phase's turns and waves added up, in PHASES order) and the step's total. With ``spans``
    (start and end of each timed block) also ``rollout_wall``, the rollout's wall time, and the total counts the
    rollout by its wall time instead of the sum of its overlapping phases."""
    out: dict[str, float] = {}
    for key, seconds in timings.items():
        phase = key.split("/", 1)[0]
        out[phase] = out.get(phase, 0.0) + float(seconds)
    ordered = {p: out[p] for p in PHASES if p in out}
    ordered.update({p: v for p, v in out.items() if p not in ordered})
    total = sum(ordered.values())
    wall = rollout_wall(spans or {})
    if wall is not None:
        ordered["rollout_wall"] = round(wall, 4)
        total += wall - sum(ordered.get(p, 0.0) for p in ROLLOUT_PHASES)
    ordered["step"] = total
    return ordered


def step_report_markdown(name: str, step: int, steps: int, trajectories: Sequence[Trajectory],
                         samples: Sequence[TrainingSample], seconds: Mapping[str, float],
                         update: Sequence[Mapping[str, float]] = (), monitor: Mapping[str, float] | None = None,
                         alerts: Sequence[str] = ()) -> str:
    """The step as markdown: verdict counts, rewards per turn, best speedup per task, seconds per phase, and the
    update's and the monitor's main numbers."""
    counts = verdict_counts(trajectories)
    lines = [f"# {name}: step {step + 1} of {steps}", ""]
    lines += ["## Verdicts", "", markdown_table(("verdict", "kernels"), [*counts.items(), ("all", sum(counts.values()))])]
    lines += ["## Rewards per turn", "", markdown_table(
        ("turn", "kernels", "correct", "mean score", "mean return"),
        [(r["turn"], r["kernels"], r["correct"], r["score_mean"], r["return_mean"]) for r in turn_rows(trajectories, samples)])]
    lines += ["## Best speedup per task", "", markdown_table(
        ("task", "kernels", "correct", "best speedup"),
        [(r["task"], r["kernels"], r["correct"], r["best_speedup"]) for r in task_rows(trajectories)])]
    lines += ["## Seconds per phase", "", markdown_table(("phase", "seconds"), list(seconds.items()))]
    if update:
        keys = [k for k in ("loss", "grad_norm", "clip_fraction", "approx_kl", "entropy", "trained_sequences")
                if k in update[0]]
        lines += ["## Update", "", markdown_table(("optimiser step", *keys),
                                                  [(i, *(float(m.get(k, 0.0)) for k in keys)) for i, m in enumerate(update)])]
    if monitor:
        shown = [(k, float(monitor[k])) for k in ("not_okay_ratio", "junk_share", "truncated_share", "mean_tokens")
                 if k in monitor]
        lines += ["## Collapse monitor", "", markdown_table(("indicator", "value"), shown)]
    if alerts:
        lines += ["## Alerts", ""] + [f"- {a}" for a in alerts] + [""]
    return "\n".join(lines)


def step_lines(trajectories: Sequence[Trajectory], samples: Sequence[TrainingSample], seconds: Mapping[str, float],
               update: Sequence[Mapping[str, float]] = (), monitor: Mapping[str, float] | None = None) -> list[str]:
    """The step in a few short lines for the terminal."""
    counts = verdict_counts(trajectories)
    rewards = ", ".join(f"turn {r['turn'] + 1} {r['score_mean']:.3f}" for r in turn_rows(trajectories, samples))
    out = ["verdicts: " + (", ".join(f"{k} {v}" for k, v in counts.items()) or "none"),
           f"mean score per turn: {rewards or '-'}"]
    if update:
        trained = int(max(m.get("trained_sequences", 0.0) for m in update))
        out.append(f"update: {len(update)} optimiser steps, loss {update[-1].get('loss', 0.0):.4g}, "
                   f"grad norm {update[-1].get('grad_norm', 0.0):.3g}, {trained} samples with non-zero advantage")
    if monitor:
        out.append(f"monitor: not-okay ratio {monitor.get('not_okay_ratio', float('nan')):.2f}, "
                   f"junk share {monitor.get('junk_share', float('nan')):.2f}")
    out.append("seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in seconds.items()))
    return out


def run_summary(steps: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """What the whole run produced, from each finished step's ``summary.json``: mean score per turn per step,
    verdict counts over every step, and the best speedup per task."""
    per_turn: dict[int, dict[int, float]] = {}
    verdicts: Counter[str] = Counter()
    best: dict[str, float] = {}
    for summary in steps:
        step = int(summary["step"])
        per_turn[step] = {int(r["turn"]): float(r["score_mean"]) for r in summary["turns"]}
        verdicts.update(summary["verdicts"])
        for row in summary["tasks"]:
            best[row["task"]] = max(best.get(row["task"], 0.0), float(row["best_speedup"]))
    return {"score_per_turn": per_turn, "verdicts": {s: verdicts[s] for s in STATUSES if verdicts[s]},
            "best_speedup": best}


def print_results(result: Mapping[str, Any], console: Any, *, stopped: bool = False) -> None:
    """What ``kevin train`` prints at the end: the mean score per turn of every step, the verdict counts, and where
    the results are (outputs, checkpoint, MLflow run and how to open it)."""
    from rich.table import Table

    per_turn = result.get("score_per_turn", {})
    turns = sorted({int(t) for row in per_turn.values() for t in row})
    table = Table(title="mean kernel score per turn", title_justify="left")
    table.add_column("step", justify="right")
    for t in turns:
        table.add_column(f"turn {t + 1}", justify="right")
    for step in sorted(per_turn, key=int):
        row = {int(k): v for k, v in per_turn[step].items()}
        table.add_row(str(int(step) + 1), *(f"{row[t]:.3f}" if t in row else "-" for t in turns))
    console.print(table)
    verdicts = result.get("verdicts", {})
    console.print("verdicts: " + (", ".join(f"{k} {v}" for k, v in verdicts.items()) or "none"), markup=False)
    best = {k: v for k, v in result.get("best_speedup", {}).items() if v > 0}
    if best:
        console.print("best speedups: " + ", ".join(f"{k} {v:.2f}x" for k, v in best.items()), markup=False)
    done = f"{result['steps_done']} of {result['steps']} steps"
    if stopped:
        console.print(f"STOPPED after {done}: {result.get('stop_reason', '')}", markup=False)
    elif result.get("paused"):
        console.print(f"PAUSED after {done}: {result['paused']}", markup=False)
    else:
        console.print(f"finished {done}", markup=False)
    console.print(f"outputs: {result['out_dir']}", markup=False)
    if result.get("checkpoint"):
        console.print(f"checkpoint: {result['checkpoint']}", markup=False)
    mlflow = result.get("mlflow") or {}
    if mlflow:
        console.print(f"MLflow run {mlflow['run_id']} (experiment {mlflow['experiment']!r}); open it with: "
                      f"{mlflow['ui']}", markup=False)
