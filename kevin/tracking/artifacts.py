"""A step's readable artifacts: a sample of kernels with their verdicts, a table per task, and the run's main
metrics per step, as markdown (what a person opens in the MLflow UI instead of a JSONL file).

Pure text builders; the tracker stores what they return.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from kevin.tracking.metrics import STATUSES, turn_status

if TYPE_CHECKING:  # only for annotations: these records are read by duck typing
    from kevin.records.rollout import Trajectory, Turn


def kernel_sample(trajectories: Sequence[Trajectory], k: int, seed: int = 0) -> list[Turn]:
    """Up to ``k`` turns that show the step's range of verdicts: round-robin over the statuses (in STATUSES
    order), the correct kernels fastest first, the others in a seeded random order (seed the step, so a
    re-logged step shows the same kernels)."""
    groups: dict[str, list[Turn]] = {}
    for traj in trajectories:
        for turn in traj.turns:
            groups.setdefault(turn_status(turn), []).append(turn)
    rng = random.Random(seed)
    order = [s for s in STATUSES if s in groups] + sorted(s for s in groups if s not in STATUSES)
    for status in order:
        if status == "correct":
            groups[status].sort(key=lambda t: -t.speedup)
        else:
            rng.shuffle(groups[status])
    picked: list[Turn] = []
    depth = 0
    while len(picked) < k and any(depth < len(groups[s]) for s in order):
        picked += [groups[s][depth] for s in order if depth < len(groups[s])][: k - len(picked)]
        depth += 1
    return picked


def _fence(code: str) -> str:
    # A fence longer than any backtick run inside the code, so a kernel holding ``` cannot end it early.
    longest = max((len(m) for m in re.findall(r"`+", code)), default=0)
    return "`" * max(3, longest + 1)


def kernels_markdown(turns: Sequence[Turn], step: int) -> str:
    """The sampled kernels as markdown: task, trajectory, turn, verdict, speedup, score, feedback, code."""
    lines = [f"# Step {step}: sample of {len(turns)} kernels", ""]
    for t in turns:
        lines += [f"## {t.task_id} / trajectory {t.trajectory} / turn {t.turn}: {turn_status(t)}", "",
                  f"score {t.score:.4g}, speedup {t.speedup:.4g}" + (", truncated" if t.truncated else ""), ""]
        if t.feedback:
            lines += [f"> {line}" for line in t.feedback.splitlines()] + [""]
        if t.kernel:
            fence = _fence(t.kernel)
            lines += [fence + "python", t.kernel.rstrip("\n"), fence, ""]
        else:
            lines += ["(no kernel: the response could not be parsed)", ""]
    return "\n".join(lines)


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A markdown table; floats to 4 significant digits, ``|`` in a cell escaped."""
    def cell(value: Any) -> str:
        text = f"{value:.4g}" if isinstance(value, float) else str(value)
        return text.replace("|", "\\|")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def tasks_table_markdown(trajectories: Sequence[Trajectory], step: int) -> str:
    """One row per task of the step: kernels, correct kernels, best correct speedup, mean score, verdicts."""
    tasks: dict[str, list[Turn]] = {}
    for traj in trajectories:
        tasks.setdefault(traj.task_id, []).extend(traj.turns)
    rows = []
    for task_id in sorted(tasks):
        turns = tasks[task_id]
        counts = Counter(turn_status(t) for t in turns)
        verdicts = ", ".join(f"{s} {counts[s]}" for s in STATUSES if counts[s])
        best = max((t.speedup for t in turns if t.correct), default=0.0)
        mean = sum(t.score for t in turns) / len(turns) if turns else 0.0
        rows.append((task_id, len(turns), sum(t.correct for t in turns), best, mean, verdicts))
    header = ("task", "kernels", "correct", "best speedup", "mean score", "verdicts")
    return f"# Step {step}: tasks\n\n" + markdown_table(header, rows)


STEP_TABLE_COLUMNS = ("reward/score_mean", "eval/status/correct", "eval/best_speedup_mean", "monitor/not_okay_ratio",
                      "monitor/junk_share", "loss/loss", "perf/step_s")


def steps_table_markdown(history: Mapping[str, Mapping[int, float]], columns: Sequence[str] = STEP_TABLE_COLUMNS) -> str:
    """The run's main metrics, one row per step; ``history`` maps a metric key to {step: value}. A column no
    step has is left out; a step without a value shows "-"."""
    present = [c for c in columns if history.get(c)]
    steps = sorted({s for c in present for s in history[c]})
    rows = [(s, *(history[c].get(s, "-") for c in present)) for s in steps]
    return "# Steps\n\n" + markdown_table(("step", *present), rows)
