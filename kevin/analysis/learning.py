"""Did the policy learn? A training run's per-step figures, the gain of its last steps over its first with a
bootstrap interval, and the plot (``kevin learning RUN_DIR``).

Each finished step's ``summary.json`` holds, per turn, how many kernels were judged, how many were correct and
their mean score. Per step we take the mean over all its kernels (the steps' sizes are equal in a run, so a mean of
step means weighs every kernel alike), the correct share, and both per turn. "It learns" is the last ``window``
steps' mean score above the first ``window`` steps' by more than the noise: the interval is a percentile bootstrap
of that difference, each window's steps drawn again with replacement, which asks how much the gain depends on
which few steps happened to be in the windows.

The steps draw different tasks, and tasks differ far more than one update moves a score, so the window means carry
the task mix as noise. ``task_gain`` pairs instead: the task sampler draws every train task once an epoch, so a task
drawn again was drawn later in training; each such task's figure at its last draw minus its first, averaged over
those tasks, with a bootstrap over the tasks; ``draw_gains`` does it at each draw (the second, the third, ...), a
curve by epoch that says whether the gain grew with each epoch or was made once. ``turn_task_gain`` does what
``task_gain`` does for one turn's kernels, read from the judged kernels of the steps' rollouts: the first turn is
what the warm start taught, the refinement turn is not, and an update can move one while the other stays put or
falls. ``start_gain`` pairs each task's draw in the run with an evaluation of the model the run started from:
within the first epoch, the only pairing there is; ``start_windows`` does it for every draw, in windows of steps: a
learning curve the task mix does not move.

Whether a run could learn at all is read from its groups (``turn_groups``: one task's kernels at one turn of a
step): GRPO learns correctness only from a group that holds a correct kernel beside a failing one, and
``mixed_share_at`` forecasts how often larger groups would, at the run's own correct rates. Whether the refinement
turns refine is read from each trajectory's turns in order (``turn_followups``): after a failing kernel, a new one,
a fixed one, or the same kernel again.

matplotlib is imported by ``plot_learning`` only.
"""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from kevin.pipeline import step_totals

__all__ = ["FOLLOWUP_KINDS", "GROUP_KINDS", "LEARNING_FIELDS", "TURN_METRICS", "UPDATE_FIELDS", "DrawGain", "Gain",
           "StartGain", "StartWindow", "TaskGain", "TurnTaskGain", "WindowGain", "draw_gains", "floor_raises",
           "group_kind", "learning_rows", "mixed_groups_by_task", "mixed_share_at", "paired_gain", "plot_learning",
           "start_gain", "start_windows", "task_gain", "task_visits", "turn_followups", "turn_groups", "turn_step_rows",
           "turn_task_gain", "turn_task_visits", "window_gain", "window_tasks"]

LEARNING_FIELDS = ("step", "kernels", "correct", "correct_share", "score_mean")
"""Columns of every row of ``learning_rows``; per turn N (1-based) also ``score_mean_turn_N`` and
``correct_share_turn_N``; for a step with an update, ``UPDATE_FIELDS``."""

UPDATE_FIELDS = ("lr", "policy_kl", "entropy", "skipped_steps")
"""How far the update moved the policy, so a flat curve can be told apart from too small a step: the lr, the
largest approximate KL divergence a later optimiser step of the step measured from the policy that sampled it
(the first step is on-policy: 0), the policy's mean token entropy, and the optimiser steps skipped for a
non-finite gradient."""


def learning_rows(summaries: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per finished step (its 1-based number as ``step``): kernels, correct kernels, correct share and mean
    kernel score over the step, and the score and correct share of each turn."""
    rows = []
    for summary in summaries:
        turns = summary["turns"]
        row: dict[str, Any] = {"step": int(summary["step"]) + 1, **step_totals(turns)}
        for t in turns:
            n = int(t["turn"]) + 1
            row[f"score_mean_turn_{n}"] = float(t["score_mean"])
            row[f"correct_share_turn_{n}"] = int(t["correct"]) / int(t["kernels"]) if int(t["kernels"]) else 0.0
        updates = summary.get("update") or []
        if updates:
            row.update(lr=float(updates[-1].get("lr", 0.0)),
                       policy_kl=max(float(u.get("approx_kl", 0.0)) for u in updates),
                       entropy=sum(float(u.get("entropy", 0.0)) for u in updates) / len(updates),
                       skipped_steps=sum(int(u.get("skipped", 0)) for u in updates))
        rows.append(row)
    return rows


@dataclass(frozen=True)
class Gain:
    """A figure late in training against the same figure early, with a bootstrap interval of the difference."""

    first: float
    """The early mean."""
    last: float
    """The late mean."""
    low: float
    """Lower end of the bootstrap interval of ``last - first``."""
    high: float
    """Upper end of the bootstrap interval."""

    @property
    def gain(self) -> float:
        return self.last - self.first

    @property
    def learned(self) -> bool:
        """The whole interval above zero: the gain is more than the noise the bootstrap sees."""
        return self.low > 0.0

    @property
    def verdict(self) -> str:
        """In words: a rise or a fall beyond the noise (the whole interval on one side of zero), or neither."""
        if self.low > 0.0:
            return "a rise above the noise"
        return "a fall beyond the noise" if self.high < 0.0 else "within the noise"

    def to_dict(self) -> dict[str, Any]:
        return {**{f.name: getattr(self, f.name) for f in fields(self)}, "gain": self.gain, "learned": self.learned,
                "verdict": self.verdict}


@dataclass(frozen=True)
class WindowGain(Gain):
    """The last ``window`` steps' mean against the first ``window`` steps' (``window_gain``); the interval redraws
    the steps of both windows."""

    window: int = 5


@dataclass(frozen=True)
class TaskGain(Gain):
    """Each task's figure at its last draw against its first, over the tasks drawn at least twice (``task_gain``);
    the interval redraws the tasks."""

    metric: str = "correct_share"
    """``correct_share`` or ``score_mean`` (of the task's kernels in the step that drew it)."""
    tasks: int = 0
    """Tasks drawn at least twice."""


def _interval(diffs: list[float], level: float) -> tuple[float, float]:
    """The ``level`` percentile interval of bootstrap draws ``diffs``."""
    diffs = sorted(diffs)
    tail = (1 - level) / 2
    return diffs[int(tail * (len(diffs) - 1))], diffs[int(round((1 - tail) * (len(diffs) - 1)))]


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def window_gain(values: Sequence[float], window: int = 5, *, level: float = 0.9, draws: int = 2000,
                seed: int = 0) -> WindowGain:
    """The mean of the last ``window`` values minus the mean of the first ``window`` (per-step figures in step
    order), with a ``level`` percentile-bootstrap interval from ``draws`` seeded redraws of both windows. The windows
    may not overlap: ValueError when there are fewer than ``2 * window`` values."""
    if window < 1:
        raise ValueError(f"window must be at least 1 step, got {window}")
    if len(values) < 2 * window:
        raise ValueError(f"{len(values)} steps are too few to compare the first {window} with the last {window}")
    if not 0 < level < 1:
        raise ValueError(f"level must be between 0 and 1, got {level}")
    first, last = [float(v) for v in values[:window]], [float(v) for v in values[-window:]]
    rng = random.Random(seed)
    low, high = _interval([_mean(rng.choices(last, k=window)) - _mean(rng.choices(first, k=window))
                           for _ in range(draws)], level)
    return WindowGain(first=_mean(first), last=_mean(last), low=low, high=high, window=window)


def window_tasks(summaries: Sequence[Mapping[str, Any]], window: int = 5) -> tuple[int, int, int]:
    """How many distinct tasks the first ``window`` steps drew, how many the last ``window`` drew, and how many
    both did (``summaries`` in step order). The window means of ``window_gain`` compare like with like only when
    the windows drew the same tasks; within one epoch of the task sampler they share none."""
    def drawn(part: Sequence[Mapping[str, Any]]) -> set[str]:
        return {str(row["task"]) for summary in part for row in summary.get("tasks", [])}

    first, last = drawn(summaries[:window]), drawn(summaries[-window:])
    return len(first), len(last), len(first & last)


def _task_figure(row: Mapping[str, Any], metric: str) -> float | None:
    kernels = int(row.get("kernels", 0))
    if metric == "correct_share":
        return int(row["correct"]) / kernels if kernels else None
    return float(row[metric]) if metric in row else None  # steps tracked before per-task scores have none


def paired_gain(visits: Mapping[str, Sequence[float]], *, level: float = 0.9, draws: int = 2000,
                seed: int = 0) -> tuple[float, float, float, float, int]:
    """Each key's last value minus its first (``visits`` in draw order), over the keys seen at least twice: the
    first mean, the last mean, a ``level`` percentile-bootstrap interval of the mean difference from ``draws``
    seeded redraws of the keys, and how many keys were paired. ValueError when none was seen twice."""
    if not 0 < level < 1:
        raise ValueError(f"level must be between 0 and 1, got {level}")
    pairs = [(v[0], v[-1]) for v in visits.values() if len(v) >= 2]
    if not pairs:
        raise ValueError(f"no task was drawn twice yet ({len(visits)} tasks drawn once): the sampler draws each "
                         "train task once an epoch, so this needs more than one epoch of steps")
    rng = random.Random(seed)
    low, high = _interval([_mean([b - a for a, b in rng.choices(pairs, k=len(pairs))]) for _ in range(draws)], level)
    return _mean([a for a, _ in pairs]), _mean([b for _, b in pairs]), low, high, len(pairs)


def task_gain(summaries: Sequence[Mapping[str, Any]], metric: str = "correct_share", *, level: float = 0.9,
              draws: int = 2000, seed: int = 0) -> TaskGain:
    """Pair each task with itself: its ``metric`` in the last step that drew it minus the first (``summaries`` in
    step order, each with its ``tasks`` rows), the mean over the tasks drawn at least twice, and a ``level``
    percentile-bootstrap interval from ``draws`` seeded redraws of those tasks. ValueError when no task was drawn
    twice with the figure known."""
    first, last, low, high, tasks = paired_gain(task_visits(summaries, metric), level=level, draws=draws, seed=seed)
    return TaskGain(first=first, last=last, low=low, high=high, metric=metric, tasks=tasks)


def task_visits(summaries: Sequence[Mapping[str, Any]], metric: str = "correct_share") -> dict[str, list[float]]:
    """Each task's ``metric`` at every step that drew it, in step order (``summaries`` in any order), the draws
    whose figure is unknown left out. ValueError for a metric the summaries do not hold per task."""
    if metric not in ("correct_share", "score_mean"):
        raise ValueError(f"metric must be correct_share or score_mean, got {metric!r}")
    visits: dict[str, list[float]] = {}
    for summary in sorted(summaries, key=lambda s: int(s["step"])):
        for row in summary.get("tasks", []):
            value = _task_figure(row, metric)
            if value is not None:
                visits.setdefault(str(row["task"]), []).append(value)
    return visits


@dataclass(frozen=True)
class DrawGain(TaskGain):
    """``TaskGain`` at one draw: each task's figure at its ``draw``-th draw against its first, over the tasks drawn
    at least ``draw`` times (``draw_gains``)."""

    draw: int = 2
    """Which draw of each task is compared with its first (2: the second)."""


def draw_gains(summaries: Sequence[Mapping[str, Any]], metric: str = "correct_share", *, level: float = 0.9,
               draws: int = 2000, seed: int = 0) -> list[DrawGain]:
    """A learning curve by epoch that compares like with like: for every k from 2 to the most draws any task had,
    each task's ``metric`` at its k-th draw minus its first, over the tasks drawn at least k times, with a
    ``level`` percentile-bootstrap interval over those tasks. ``task_gain`` pairs the first draw with the last,
    which for a run whose tasks were drawn a different number of times mixes draws; this says whether the gain grew
    with each epoch or was made once and held. Empty when no task was drawn twice."""
    visits = task_visits(summaries, metric)
    most = max((len(v) for v in visits.values()), default=0)
    found = []
    for k in range(2, most + 1):
        pairs = {task: [v[0], v[k - 1]] for task, v in visits.items() if len(v) >= k}
        first, last, low, high, tasks = paired_gain(pairs, level=level, draws=draws, seed=seed)
        found.append(DrawGain(first=first, last=last, low=low, high=high, metric=metric, tasks=tasks, draw=k))
    return found


TURN_METRICS = ("correct_share", "parse_error_share", "truncated_share", "score_mean")
"""What ``turn_task_gain`` compares of one turn's kernels of a task in one step: the share judged correct, the share
that did not parse (the answer format lost), the share of answers cut off at the length limit (known for the turns
whose records the rollout wrote; kernels without it are left out of this figure), and the mean kernel score."""


def _turn_figure(group: Sequence[Mapping[str, Any]], metric: str) -> float | None:
    """``metric`` (one of ``TURN_METRICS``) over one turn's judged kernels of a task in a step; None when unknown."""
    if metric == "score_mean":
        return _mean([float(v["score"]) for v in group])
    if metric == "truncated_share":
        known = [bool(v["truncated"]) for v in group if "truncated" in v]
        return sum(known) / len(known) if known else None
    status = "correct" if metric == "correct_share" else "parse_error"
    return sum(v["status"] == status for v in group) / len(group)


def turn_step_rows(verdicts: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per step (1-based ``step``) that has judged kernels, every turn's ``TURN_METRICS`` as ``<metric>_turn_N``
    (1-based N) beside ``kernels_turn_N``: what each turn's answers did at each step, across all the step's tasks
    (``truncated_share_turn_N`` only where the turns' records say it)."""
    groups: dict[int, dict[int, list[Mapping[str, Any]]]] = {}
    for v in verdicts:
        groups.setdefault(int(v["step"]), {}).setdefault(int(v["turn"]), []).append(v)
    rows = []
    for step, turns in sorted(groups.items()):
        row: dict[str, Any] = {"step": step + 1}
        for turn, group in sorted(turns.items()):
            row[f"kernels_turn_{turn + 1}"] = len(group)
            for metric in TURN_METRICS:
                value = _turn_figure(group, metric)
                if value is not None:
                    row[f"{metric}_turn_{turn + 1}"] = value
        rows.append(row)
    return rows


@dataclass(frozen=True)
class TurnTaskGain(TaskGain):
    """``TaskGain`` of one turn's kernels only (``turn_task_gain``): a turn the warm start never taught (the
    refinement turn) can move while the first turn does not, or the other way round."""

    turn: int = 1
    """1-based turn."""


def _turn_kernels(verdicts: Iterable[Mapping[str, Any]], turn: int) -> dict[tuple[int, str], list[Mapping[str, Any]]]:
    """The judged kernels of 1-based ``turn``, by (0-based step, task): one group of trajectories each."""
    kernels: dict[tuple[int, str], list[Mapping[str, Any]]] = {}
    for v in verdicts:
        if int(v["turn"]) == turn - 1:
            kernels.setdefault((int(v["step"]), str(v["task_id"])), []).append(v)
    return kernels


def turn_task_visits(verdicts: Iterable[Mapping[str, Any]], turn: int, metric: str) -> dict[str, list[float]]:
    """Per task, ``metric`` of its kernels at 1-based ``turn`` in each step that drew it, in step order.
    ``verdicts``: one mapping per judged kernel with ``step``, ``turn`` (0-based, as the rollout files number
    them), ``task_id``, ``status`` and ``score``."""
    if metric not in TURN_METRICS:
        raise ValueError(f"metric must be one of {', '.join(TURN_METRICS)}, got {metric!r}")
    visits: dict[str, list[float]] = {}
    for (_, task), group in sorted(_turn_kernels(verdicts, turn).items()):
        value = _turn_figure(group, metric)
        if value is not None:
            visits.setdefault(task, []).append(value)
    return visits


def turn_task_gain(verdicts: Iterable[Mapping[str, Any]], turn: int, metric: str = "correct_share", *,
                   level: float = 0.9, draws: int = 2000, seed: int = 0) -> TurnTaskGain:
    """``task_gain`` for the kernels of one turn, from the judged kernels themselves (``turn_task_visits``)."""
    visits = turn_task_visits(verdicts, turn, metric)
    first, last, low, high, tasks = paired_gain(visits, level=level, draws=draws, seed=seed)
    return TurnTaskGain(first=first, last=last, low=low, high=high, metric=metric, tasks=tasks, turn=turn)


@dataclass(frozen=True)
class StartGain(TaskGain):
    """The run's first-turn kernels of each task at one of its draws against the model the run started from
    (``start_gain``): ``first`` is the start's mean over the paired tasks, ``last`` the run's."""

    at: str = "first"
    """Which draw of each task: ``first`` (how much the steps before it kept of what the start knew) or ``last``."""


def start_gain(start_verdicts: Iterable[Mapping[str, Any]], verdicts: Iterable[Mapping[str, Any]],
               metric: str = "correct_share", at: str = "first", *, level: float = 0.9, draws: int = 2000,
               seed: int = 0) -> StartGain:
    """Pair each task the run drew with an evaluation of the model the run started from (``start_verdicts``: its
    first-turn kernels, e.g. ``kevin evaluate`` of the warm start on the train split, at the run's sampling): the
    run's ``metric`` of the task at its ``at`` draw (its first-turn kernels in that step) minus the start's, averaged
    over the tasks in both, with a ``level`` percentile-bootstrap interval over the tasks.
    Before a task's second draw this is the only pairing there is: the task-by-task gain within the run needs a
    second epoch. ValueError when no task is in both."""
    if at not in ("first", "last"):
        raise ValueError(f"at must be first or last, got {at!r}")
    start = turn_task_visits([{**v, "step": 0, "turn": 0} for v in start_verdicts], 1, metric)
    run = turn_task_visits(verdicts, 1, metric)
    visits = {task: [start[task][0], values[0 if at == "first" else -1]] for task, values in run.items()
              if task in start}
    if not visits:
        raise ValueError(f"none of the run's {len(run)} tasks is among the evaluation's {len(start)}: "
                         "was it evaluated on the run's split?")
    first, last, low, high, tasks = paired_gain(visits, level=level, draws=draws, seed=seed)
    return StartGain(first=first, last=last, low=low, high=high, metric=metric, tasks=tasks, at=at)


@dataclass(frozen=True)
class StartWindow(Gain):
    """The run's first-turn kernels in steps ``first_step``..``last_step`` (1-based) against the model the run
    started from on the same tasks (``start_windows``): ``first`` is the start's mean over the window's draws (one
    task in one step each), ``last`` the run's; the interval redraws the draws."""

    metric: str = "correct_share"
    first_step: int = 0
    last_step: int = 0
    pairs: int = 0
    """Draws in the window of a task the start was evaluated on."""


def start_windows(start_verdicts: Iterable[Mapping[str, Any]], verdicts: Iterable[Mapping[str, Any]],
                  metric: str = "correct_share", window: int = 10, *, level: float = 0.9, draws: int = 2000,
                  seed: int = 0) -> list[StartWindow]:
    """A learning curve that the task mix does not move: for each run of ``window`` consecutive steps with judged
    first-turn kernels, each draw's ``metric`` (a task's first-turn kernels in one step) paired with the start's on
    that task (``start_verdicts``, as in ``start_gain``; several evaluations of the start pool their kernels), the
    mean of both, and a ``level`` percentile-bootstrap interval of the mean difference over the window's draws.

    A step's raw mean rises and falls with which tasks it drew, far more than an update moves it; against the start's
    own figure for the same tasks, a window above zero is a policy that writes more correct kernels than it started
    with, whatever it drew. ValueError when no draw is of a task the start was evaluated on."""
    if window < 1:
        raise ValueError(f"window must be at least 1 step, got {window}")
    start = turn_task_visits([{**v, "step": 0, "turn": 0} for v in start_verdicts], 1, metric)
    by_step: dict[int, dict[str, float]] = {}
    for (step, task), group in sorted(_turn_kernels(verdicts, 1).items()):
        value = _turn_figure(group, metric)
        if value is not None and task in start:
            by_step.setdefault(step, {})[task] = value
    if not by_step:
        raise ValueError(f"no task the run drew is among the evaluation's {len(start)}: was it evaluated on the "
                         "run's split?")
    steps = sorted(by_step)
    found = []
    for i in range(0, len(steps), window):
        part = steps[i:i + window]
        visits = {f"{task}@{step}": [start[task][0], value] for step in part for task, value in by_step[step].items()}
        first, last, low, high, pairs = paired_gain(visits, level=level, draws=draws, seed=seed)
        found.append(StartWindow(first=first, last=last, low=low, high=high, metric=metric, first_step=part[0] + 1,
                                 last_step=part[-1] + 1, pairs=pairs))
    return found


GROUP_KINDS = ("none_correct", "mixed", "all_correct")
"""How one task's kernels at one turn of one step (its trajectories' answers) came out: none correct (an update can
only push them down together, and not at all where they scored alike); correct beside failing ones (the groups an
update learns correctness from); all correct (only their speed to learn from: copies of one kernel differ by
timing noise alone, and their advantages cancel on their identical tokens)."""


def turn_groups(verdicts: Iterable[Mapping[str, Any]]) -> dict[int, dict[str, int]]:
    """Per 1-based turn, how many of its groups (one task's kernels at that turn of one step) fell in each of
    ``GROUP_KINDS``, beside ``groups``. A learning run whose groups are mostly none or all correct gives its updates
    little to go on, whatever its settings."""
    verdicts = list(verdicts)
    out: dict[int, dict[str, int]] = {}
    for turn in sorted({int(v["turn"]) + 1 for v in verdicts}):
        counts = out[turn] = {"groups": 0, **dict.fromkeys(GROUP_KINDS, 0)}
        for group in _turn_kernels(verdicts, turn).values():
            counts["groups"] += 1
            counts[group_kind(group)] += 1
    return out


def group_kind(group: Sequence[Mapping[str, Any]]) -> str:
    """Which of ``GROUP_KINDS`` one group's judged kernels fall in."""
    correct = [v["status"] == "correct" for v in group]
    return "all_correct" if all(correct) else "mixed" if any(correct) else "none_correct"


def mixed_groups_by_task(verdicts: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """Each task the run drew, with how many of its groups (its kernels at one turn of one step) were ``mixed``:
    the groups whose advantages reward correctness."""
    verdicts = list(verdicts)
    mixed: dict[str, int] = {}
    for turn in sorted({int(v["turn"]) + 1 for v in verdicts}):
        for (_, task), group in _turn_kernels(verdicts, turn).items():
            mixed[task] = mixed.get(task, 0) + (group_kind(group) == "mixed")
    return mixed


def mixed_share_at(verdicts: Iterable[Mapping[str, Any]], turn: int, trajectories: int) -> float:
    """The share of ``turn``'s groups (1-based) that would hold a correct kernel beside a failing one had each group
    had ``trajectories`` kernels: per task, its kernels' correct share over the run at that turn as the chance of
    each kernel being correct, independent within a group; a group of n is mixed unless all or none are correct,
    1 - p^n - (1 - p)^n, averaged over the groups the run drew. What more trajectories a task would buy a run
    whose tasks are mostly solved always or never (a forecast from the run's own rates, which drift as it trains)."""
    groups = _turn_kernels(verdicts, turn)
    if not groups:
        raise ValueError(f"no kernel of turn {turn}")
    hits: dict[str, list[int]] = {}
    for (_, task), group in groups.items():
        seen = hits.setdefault(task, [0, 0])
        seen[0] += sum(v["status"] == "correct" for v in group)
        seen[1] += len(group)
    rate = {task: c / n for task, (c, n) in hits.items()}
    return _mean([1 - rate[task] ** trajectories - (1 - rate[task]) ** trajectories for _, task in groups])


def plot_learning(rows: Sequence[Mapping[str, Any]], path: str | Path, *, title: str = "",
                  gain: WindowGain | None = None, by_draw: Sequence[DrawGain] = (),
                  against_start: Sequence[StartWindow] = ()) -> Path:
    """Panels over the steps: mean kernel score (the step's, and each turn's) and correct share; with ``gain``, the
    first and last windows' means drawn over their steps; where the rows carry them (``turn_step_rows`` merged in),
    a panel of each turn's share of answers cut off at the length limit and of parse errors; with ``against_start``
    (``start_windows``), a panel of each window's gain over the start on the same tasks with its interval; with
    ``by_draw`` (``draw_gains``), a last panel of each draw's gain over the first with its interval, by draw. Saved
    as PNG."""
    from matplotlib.figure import Figure

    from kevin.monitor import whole_step_axis

    steps = [int(r["step"]) for r in rows]
    turns = sorted({int(k.rsplit("_", 1)[1]) for r in rows for k in r if k.startswith("score_mean_turn_")})
    answers = any(k.startswith(("truncated_share_turn_", "parse_error_share_turn_")) for r in rows for k in r)
    panels = 2 + answers + bool(against_start) + bool(by_draw)
    fig = Figure(figsize=(5 * panels, 4.2), layout="constrained")
    axes = list(fig.subplots(1, panels))
    if by_draw:
        _plot_draws(axes.pop(), by_draw)
    if against_start:
        _plot_start_windows(axes.pop(), against_start)
    for ax, key, label in zip(axes, ("score_mean", "correct_share"), ("mean kernel score", "correct share")):
        ax.plot(steps, [r[key] for r in rows], "o-", color="black", label="all turns")
        for n in turns:
            ax.plot(steps, [r.get(f"{key}_turn_{n}", float("nan")) for r in rows], ".--", alpha=0.7, label=f"turn {n}")
        if gain is not None and key == "score_mean":
            w = gain.window
            ax.hlines([gain.first, gain.last], [steps[0] - 0.3, steps[-w] - 0.3], [steps[w - 1] + 0.3, steps[-1] + 0.3],
                      colors="tab:red", linewidth=3, alpha=0.6,
                      label=f"first/last {w}: {gain.first:.3f} -> {gain.last:.3f} "
                            f"(gain {gain.gain:+.3f}, 90% [{gain.low:+.3f}, {gain.high:+.3f}])")
        ax.set_ylabel(label)
    if answers:
        ax = axes[2]
        for n, color in zip(turns, ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple")):
            for key, style, what in (("truncated_share", "o-", "cut off"), ("parse_error_share", "x:", "parse error")):
                ax.plot(steps, [r.get(f"{key}_turn_{n}", float("nan")) for r in rows], style, color=color,
                        alpha=0.8, label=f"turn {n} {what}")
        ax.set_ylabel("share of the turn's answers")
        ax.set_ylim(-0.03, 1.03)
    for ax in axes:
        ax.set_xlabel("training step")
        whole_step_axis(ax.xaxis)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    if title:
        fig.suptitle(title)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path


def _plot_start_windows(ax: Any, windows: Sequence[StartWindow]) -> None:
    """Each window's gain over the start on the same tasks at the middle of its steps, its bootstrap interval as an
    error bar and its steps as the horizontal extent: the learning curve the task mix does not move."""
    from kevin.monitor import whole_step_axis

    middles = [(w.first_step + w.last_step) / 2 for w in windows]
    ax.errorbar(middles, [w.gain for w in windows],
                xerr=[[m - w.first_step for m, w in zip(middles, windows)],
                      [w.last_step - m for m, w in zip(middles, windows)]],
                yerr=[[w.gain - w.low for w in windows], [w.high - w.gain for w in windows]], fmt="o-",
                color="tab:purple", capsize=4, label="first-turn correct share minus the start's, 90% interval")
    ax.axhline(0.0, color="grey", linewidth=1)
    ax.set_xlabel("training step")
    whole_step_axis(ax.xaxis)
    ax.set_ylabel("gain over the start, same tasks")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


def _plot_draws(ax: Any, by_draw: Sequence[DrawGain]) -> None:
    """Each draw's mean gain over the first draw with its bootstrap interval as an error bar, the tasks it pairs
    written beside it: the curve by epoch, on the axis of draws rather than steps."""
    draws = [g.draw for g in by_draw]
    gains = [g.gain for g in by_draw]
    ax.errorbar(draws, gains, yerr=[[g.gain - g.low for g in by_draw], [g.high - g.gain for g in by_draw]], fmt="o-",
                color="tab:green", capsize=4, label=f"{by_draw[0].metric.replace('_', ' ')}, 90% interval")
    for g in by_draw:
        ax.annotate(f"{g.tasks} tasks", (g.draw, g.high), textcoords="offset points", xytext=(0, 4), ha="center",
                    fontsize=7)
    ax.axhline(0.0, color="grey", linewidth=1)
    ax.set_xticks(draws)
    ax.set_xlabel("draw of the task (its first is 1)")
    ax.set_ylabel("gain over the task's first draw")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


FOLLOWUP_KINDS = ("after_failure", "repeated_after_failure", "fixed", "after_correct", "repeated_after_correct", "lost")
"""What ``turn_followups`` counts for a turn after the first, over the trajectories whose previous turn was judged:
those whose previous kernel failed, how many of them wrote a kernel the run had judged before byte for byte (its
verdict reused: nothing new was tried), how many were correct (a repair); those whose previous kernel was correct,
how many wrote a judged kernel again, how many failed (a correct kernel lost)."""


def turn_followups(verdicts: Iterable[Mapping[str, Any]]) -> dict[int, dict[str, int]]:
    """Per 1-based turn after the first, ``FOLLOWUP_KINDS`` over the trajectories that reached it: what each
    answer did after its own previous turn's verdict. A refinement turn that mostly repeats a failing kernel gives
    the feedback nothing to act on, and its samples only repeat the previous turn's signal. ``verdicts``: one mapping
    per judged kernel with ``step``, ``turn`` (0-based), ``task_id``, ``trajectory``, ``status`` and ``reused``
    (kernels without a trajectory, from files that did not record it, are left out)."""
    by_turn = {(int(v["step"]), str(v["task_id"]), int(v["trajectory"]), int(v["turn"])): v
               for v in verdicts if v.get("trajectory") is not None}
    out: dict[int, dict[str, int]] = {}
    for (step, task, trajectory, turn), v in sorted(by_turn.items()):
        before = by_turn.get((step, task, trajectory, turn - 1))
        if before is None:
            continue
        counts = out.setdefault(turn + 1, dict.fromkeys(FOLLOWUP_KINDS, 0))
        correct, repeated = v["status"] == "correct", bool(v.get("reused"))
        if before["status"] == "correct":
            counts["after_correct"] += 1
            counts["repeated_after_correct"] += repeated
            counts["lost"] += not correct
        else:
            counts["after_failure"] += 1
            counts["repeated_after_failure"] += repeated
            counts["fixed"] += correct
    return out


def floor_raises(verdicts: Iterable[Mapping[str, Any]]) -> dict[str, float] | None:
    """What the score's floor cost the run's correct kernels: over those judged in the run (not reused) whose verdict
    carries its timing figures (``EvalResult.timing``), how many were scored slower than they reported
    (``runtime_ms`` above ``timing.reported_ms``) and by how much, as a share of the reported time (median and
    largest). None when no verdict carries the figures (runs judged before they existed)."""
    raises = []
    for v in verdicts:
        reported = float((v.get("timing") or {}).get("reported_ms", 0.0))
        if v.get("status") == "correct" and not v.get("reused") and reported > 0:
            raises.append(max(float(v["runtime_ms"]) / reported - 1.0, 0.0))
    if not raises:
        return None
    return {"kernels": len(raises), "raised": sum(r > 0 for r in raises), "median_raise": statistics.median(raises),
            "max_raise": max(raises)}
