"""The estimators (best@k as the expected best of a random k-subset, avg@k, pass@k, geometric mean) and their
aggregate over tasks at one turn (``Metrics``), computed once per turn and shared by every k.

Apart from the run report (``kevin.analysis.metrics``), which composes them per turn and budget split; the
definitions are in that module's docstring.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from kevin.analysis.outcomes import (
    TaskOutcome,
    check_turn,
    metric_names,
    trajectory_correct,
    trajectory_fast,
    trajectory_metrics,
    trajectory_perf,
)

__all__ = [
    "Metrics",
    "avg_over",
    "best_at_k",
    "check_tasks",
    "curve_metrics",
    "expected_max_of_subset",
    "geometric_mean",
    "metrics_at",
    "metrics_from",
    "pass_at_k",
    "subset_max_weights",
    "trajectory_count",
    "turn_table",
]


# ----------------------------------------------------------------------------------------- estimators


def _check_k(k: int, n: int, what: str) -> None:
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= n:
        raise ValueError(f"k must be an integer in 1..{n} (the number of {what}), got {k!r}")


def expected_max_of_subset(values: Sequence[float], k: int) -> float:
    """E[max of a uniformly random k-subset of ``values``] = sum_i v_(i) C(i-1, k-1) / C(m, k), v ascending.

    v_(i) is the maximum of exactly C(i-1, k-1) of the C(m, k) subsets: those holding it and k-1 of the
    i-1 values below it. Ties do not matter (equal values are interchangeable). Exact integer binomials,
    one division each, so m in the hundreds is fine.
    """
    ordered = sorted(float(v) for v in values)
    m = len(ordered)
    _check_k(k, m, "values")
    total = math.comb(m, k)
    return math.fsum(v * (math.comb(i - 1, k - 1) / total) for i, v in enumerate(ordered, 1) if i >= k)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of Chen et al. 2021: 1 - C(n-c, k) / C(n, k), for c correct among n samples."""
    _check_k(k, n, "samples")
    if isinstance(c, bool) or not isinstance(c, int) or not 0 <= c <= n:
        raise ValueError(f"c (correct samples) must be an integer in 0..{n}, got {c!r}")
    # math.comb(n - c, k) is 0 when fewer than k samples are wrong: every k-subset then holds a correct one.
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def geometric_mean(values: Iterable[float]) -> float | None:
    """exp(mean(log v)); None for no values, 0.0 if any value is 0."""
    values = [float(v) for v in values]
    if not values:
        return None
    if any(v < 0 for v in values):
        raise ValueError(f"a geometric mean needs values >= 0, got {min(values)}")
    if any(v == 0 for v in values):
        return 0.0
    return math.exp(math.fsum(math.log(v) for v in values) / len(values))


def check_tasks(tasks: Sequence[TaskOutcome]) -> None:
    if not tasks:
        raise ValueError("no tasks to analyse: the rollouts are empty")


def _metric_values(task: TaskOutcome, metric: str, turn: int | None) -> list[float]:
    """One value per trajectory of ``metric`` (correct | perf | fast_<p>) after ``turn``."""
    if metric == "correct":
        return [float(trajectory_correct(tr, turn)) for tr in task.trajectories]
    if metric == "perf":
        return [trajectory_perf(tr, turn) for tr in task.trajectories]
    if metric.startswith("fast_"):
        try:
            p = float(metric[len("fast_"):])
        except ValueError:
            p = math.nan
        if 0 <= p < math.inf:
            return [float(trajectory_fast(tr, p, turn)) for tr in task.trajectories]
    raise ValueError(f"unknown metric {metric!r}; use correct, perf or fast_<p> (e.g. fast_1.5)")


def best_at_k(tasks: Sequence[TaskOutcome], metric: str, k: int, turn: int | None = None) -> float:
    """best@k of ``metric`` (correct | perf | fast_<p>) after ``turn`` (None: all turns), mean over tasks."""
    check_tasks(tasks)
    return math.fsum(expected_max_of_subset(_metric_values(t, metric, turn), k) for t in tasks) / len(tasks)


def avg_over(tasks: Sequence[TaskOutcome], metric: str, turn: int | None = None) -> float:
    """avg@k (any k) of ``metric`` after ``turn``: mean over a task's trajectories, then over tasks."""
    check_tasks(tasks)
    means = []
    for task in tasks:
        values = _metric_values(task, metric, turn)
        if not values:
            raise ValueError(f"task {task.task_id!r} has no trajectories")
        means.append(math.fsum(values) / len(values))
    return math.fsum(means) / len(tasks)


# ------------------------------------------------------------------------------------------ aggregates


@dataclass(frozen=True)
class Metrics:
    """Every metric of one run at one point: k trajectories per task, after turn ``turn``, mean over tasks."""

    k: int
    turn: int
    """1-based: only the kernels of turns 1..turn count."""
    best: dict[str, float]
    """best@k per metric name (correct, perf, fast_p ...)."""
    avg: dict[str, float]
    """avg@k per metric name (the same for every k)."""
    pass_kernels: dict[int, float] = field(default_factory=dict)
    """pass@k over kernels for each requested k that every task has enough kernels for."""
    geomean_speedup: float | None = None
    """Geometric mean of the speedups of all correct kernels; None when there is none."""
    kernels: int = 0
    """Kernels generated in turns 1..turn, all tasks."""
    correct_kernels: int = 0


@functools.lru_cache(maxsize=32)
def subset_max_weights(m: int) -> np.ndarray:
    """[m, m] read-only: row k-1, column i-1 is C(i-1, k-1) / C(m, k), the weight of the i-th smallest of
    m values in best@k (0 for i < k). Each row sums to 1. One matrix product then gives best@k for every k."""
    if isinstance(m, bool) or not isinstance(m, int) or m < 1:
        raise ValueError(f"m must be a positive integer, got {m!r}")
    weights = np.array([[math.comb(i - 1, k - 1) / math.comb(m, k) for i in range(1, m + 1)] for k in range(1, m + 1)])
    weights.flags.writeable = False
    return weights


@dataclass(frozen=True)
class _TurnTable:
    """Everything the aggregates need after one turn, computed once and shared by every k."""

    turn: int
    names: list[str]
    values: np.ndarray  # [tasks, metrics, m]: per-trajectory values, sorted ascending along the last axis
    kernel_counts: list[tuple[int, int]]  # (kernels, correct kernels) per task
    correct_speedups: list[float]  # every correct kernel's speedup, all tasks


def trajectory_count(tasks: Sequence[TaskOutcome]) -> int:
    """The number m of trajectories every task has (an error when tasks differ)."""
    counts = {len(t.trajectories) for t in tasks}
    if len(counts) != 1:
        by_count = {c: [t.task_id for t in tasks if len(t.trajectories) == c][:3] for c in sorted(counts)}
        raise ValueError(f"every task needs the same number of trajectories; got {by_count} (count: task ids); "
                         "re-run the missing trajectories or leave those tasks out")
    m = counts.pop()
    if m == 0:
        raise ValueError("tasks have no trajectories")
    return m


def turn_table(tasks: Sequence[TaskOutcome], turn: int, fast_ps: Sequence[float]) -> _TurnTable:
    check_tasks(tasks)
    check_turn(turn)
    trajectory_count(tasks)
    names = metric_names(fast_ps)
    rows, kernel_counts, correct_speedups = [], [], []
    for task in tasks:
        per_traj = [trajectory_metrics(tr, turn, fast_ps) for tr in task.trajectories]
        rows.append([[row[name] for row in per_traj] for name in names])
        kernels = [kern for tr in task.trajectories for kern in tr.upto(turn)]
        kernel_counts.append((len(kernels), sum(kern.correct for kern in kernels)))
        correct_speedups.extend(float(kern.speedup) for kern in kernels if kern.correct)
    values = np.sort(np.asarray(rows, dtype=np.float64), axis=-1)
    return _TurnTable(turn, names, values, kernel_counts, correct_speedups)


def metrics_from(table: _TurnTable, ks: Sequence[int], pass_ks: Sequence[int]) -> list[Metrics]:
    """Metrics for each k in ``ks`` from one turn's table."""
    tasks, n_metrics, m = table.values.shape
    for k in ks:
        _check_k(k, m, "trajectories per task")
    # [tasks * metrics, m] @ [m, m]^T -> best@k of every task and metric for every k, then mean over tasks
    best_all = (table.values.reshape(-1, m) @ subset_max_weights(m).T).reshape(tasks, n_metrics, m).mean(axis=0)
    avg = dict(zip(table.names, table.values.mean(axis=-1).mean(axis=0).tolist()))
    min_kernels = min(n for n, _ in table.kernel_counts)
    pass_kernels = {
        pk: math.fsum(pass_at_k(n, c, pk) for n, c in table.kernel_counts) / tasks
        for pk in pass_ks if pk <= min_kernels
    }
    geomean = geometric_mean(table.correct_speedups)
    kernels = sum(n for n, _ in table.kernel_counts)
    correct_kernels = sum(c for _, c in table.kernel_counts)
    return [
        Metrics(k=k, turn=table.turn, best=dict(zip(table.names, best_all[:, k - 1].tolist())), avg=dict(avg),
                pass_kernels=dict(pass_kernels), geomean_speedup=geomean, kernels=kernels,
                correct_kernels=correct_kernels)
        for k in ks
    ]


def metrics_at(tasks: Sequence[TaskOutcome], k: int, turn: int, fast_ps: Sequence[float],
               pass_ks: Sequence[int] = ()) -> Metrics:
    """All metrics after ``turn`` with best@k over k of each task's trajectories (every task must have the
    same number of trajectories, at least k)."""
    return metrics_from(turn_table(tasks, turn, fast_ps), [k], pass_ks)[0]


def curve_metrics(tasks: Sequence[TaskOutcome], turn: int, ks: Sequence[int], fast_ps: Sequence[float],
                  pass_ks: Sequence[int] = ()) -> list[Metrics]:
    """``metrics_at`` for each k in ``ks`` (one per k, in order), the per-turn work done once."""
    return metrics_from(turn_table(tasks, turn, fast_ps), list(ks), pass_ks)
