"""Test-time-scaling metrics: best@k, avg@k, fast_p, pass@k and geometric-mean speedup, after every turn.

Definitions (docs/analysis.md has them with worked examples):

- A trajectory's kernels are its turns' kernels, in order. "After turn t" (t = 1..n, 1-based) means only
  the kernels of its first t turns count. A trajectory that stopped early keeps its last state.
- A trajectory is *correct* after turn t if any of those kernels is correct; its *performance* (perf) is
  the speedup of the fastest correct one, 0 if none; it is *fast_p* if a correct one has speedup >= p
  (so fast_p = correct and perf >= p).
- Per task and metric, the m trajectories give m values v_1..v_m. best@k is the expected maximum over a
  uniformly random subset of k of them (an unbiased estimator of "the best of k fresh trajectories"):
  with the values sorted ascending, best@k = sum_i v_(i) * C(i-1, k-1) / C(m, k). For 0/1 metrics
  (correct, fast_p) with c ones this is 1 - C(m-c, k) / C(m, k), the pass@k estimator. best@m = max.
- avg@k is the mean over the m trajectories: the mean of a random subset of k has that same expectation
  whatever k is, so avg@k does not depend on k.
- Both are averaged over tasks with equal weight per task.
- pass@k (Chen et al. 2021), unbiased: 1 - C(n-c, k) / C(n, k) per task, mean over tasks; "over
  trajectories" n = m and c = correct trajectories (equal to best@k of correct), "over kernels" n = all
  kernels of the task after turn t and c = the correct ones.
- Geometric-mean speedup: exp(mean(log speedup)) over every correct kernel of every task after turn t.

Inputs are plain typed records (``KernelOutcome`` / ``TrajectoryOutcome`` / ``TaskOutcome``);
``outcomes_from_turns`` builds them from rollout ``Turn`` records by reading only their attribute names.
"""

from __future__ import annotations

import functools
import math
import numbers
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kevin.settings import Settings

__all__ = [
    "AnalysisConfig",
    "BudgetSplit",
    "KernelOutcome",
    "Metrics",
    "RunReport",
    "TaskOutcome",
    "TrajectoryOutcome",
    "analyze_run",
    "avg_over",
    "best_at_k",
    "curve_metrics",
    "expected_max_of_subset",
    "fast_name",
    "geometric_mean",
    "metric_names",
    "metrics_at",
    "outcomes_from_trajectories",
    "outcomes_from_turns",
    "pass_at_k",
    "report_from_states",
    "subset_max_weights",
    "trajectory_correct",
    "trajectory_fast",
    "trajectory_perf",
]


# ---------------------------------------------------------------------------------------------- records


@dataclass(frozen=True)
class KernelOutcome:
    """The verdict on one turn's kernel, as far as the metrics need it."""

    correct: bool
    speedup: float = 0.0
    """PyTorch eager time / kernel time; only read when the kernel is correct."""

    def __post_init__(self) -> None:
        if not isinstance(self.correct, bool):
            raise ValueError(f"correct must be a bool, got {self.correct!r}")
        if self.correct:
            speedup = self.speedup
            if isinstance(speedup, bool) or not isinstance(speedup, numbers.Real) or not 0 <= speedup < math.inf:
                # A NaN or infinite speedup would poison every mean and max it enters.
                raise ValueError(f"a correct kernel needs a finite speedup >= 0, got {speedup!r}; "
                                 "check the evaluator's timing of this kernel")


@dataclass(frozen=True)
class TrajectoryOutcome:
    """One trajectory's kernels: ``kernels[i]`` is turn i's (0-based). Fewer than n when it stopped early."""

    kernels: tuple[KernelOutcome, ...] = ()

    @classmethod
    def of(cls, *pairs: tuple[bool, float]) -> "TrajectoryOutcome":
        """Shorthand: ``TrajectoryOutcome.of((False, 0.0), (True, 1.2))``."""
        return cls(tuple(KernelOutcome(bool(c), float(s)) for c, s in pairs))

    def upto(self, turn: int | None) -> tuple[KernelOutcome, ...]:
        """The kernels of the first ``turn`` turns (all of them when ``turn`` is None)."""
        if turn is None:
            return self.kernels
        _check_turn(turn)
        return self.kernels[:turn]


@dataclass(frozen=True)
class TaskOutcome:
    """All trajectories of one task."""

    task_id: str
    trajectories: tuple[TrajectoryOutcome, ...]

    @property
    def turns(self) -> int:
        """The longest trajectory's number of turns."""
        return max((len(tr.kernels) for tr in self.trajectories), default=0)


@dataclass(frozen=True)
class BudgetSplit:
    """A budget of trajectories x turns generations per task, written ``"16x8"``."""

    trajectories: int
    turns: int

    def __post_init__(self) -> None:
        for name in ("trajectories", "turns"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"budget split {name} must be a positive integer, got {value!r}")

    @property
    def name(self) -> str:
        return f"{self.trajectories}x{self.turns}"

    @property
    def generations(self) -> int:
        return self.trajectories * self.turns

    @classmethod
    def parse(cls, text: str) -> "BudgetSplit":
        match = re.fullmatch(r"\s*(\d+)\s*x\s*(\d+)\s*", str(text))
        if not match:
            raise ValueError(f"budget split {text!r} must read TRAJECTORIESxTURNS, e.g. '16x8'")
        return cls(int(match.group(1)), int(match.group(2)))

    def fits(self, trajectories: int, turns: int) -> bool:
        """Whether rollouts of ``trajectories`` x ``turns`` hold this split."""
        return self.trajectories <= trajectories and self.turns <= turns


# ------------------------------------------------------------------------------- per trajectory, turn t


def _check_turn(turn: int) -> None:
    if isinstance(turn, bool) or not isinstance(turn, int) or turn < 1:
        raise ValueError(f"turn must be a positive integer (1 = after the first turn), got {turn!r}")


def trajectory_correct(traj: TrajectoryOutcome, turn: int | None = None) -> bool:
    """Any kernel of the first ``turn`` turns is correct."""
    return any(k.correct for k in traj.upto(turn))


def trajectory_perf(traj: TrajectoryOutcome, turn: int | None = None) -> float:
    """Speedup of the fastest correct kernel of the first ``turn`` turns; 0 if none is correct."""
    return max((float(k.speedup) for k in traj.upto(turn) if k.correct), default=0.0)


def trajectory_fast(traj: TrajectoryOutcome, p: float, turn: int | None = None) -> bool:
    """A correct kernel of the first ``turn`` turns has speedup >= p."""
    return any(k.correct and k.speedup >= p for k in traj.upto(turn))


def fast_name(p: float) -> str:
    """Metric name of fast_p: ``fast_0``, ``fast_0.5``, ``fast_1``, ``fast_1.5`` ..."""
    return f"fast_{float(p):g}"


def metric_names(fast_ps: Sequence[float]) -> list[str]:
    """The per-trajectory metrics in report order: correct, perf, then fast_p for each p."""
    return ["correct", "perf", *(fast_name(p) for p in fast_ps)]


def trajectory_metrics(traj: TrajectoryOutcome, turn: int | None, fast_ps: Sequence[float]) -> dict[str, float]:
    """Every per-trajectory metric after ``turn`` as a number (booleans as 0/1)."""
    perf = trajectory_perf(traj, turn)
    correct = trajectory_correct(traj, turn)
    values = {"correct": float(correct), "perf": perf}
    for p in fast_ps:
        values[fast_name(p)] = float(correct and perf >= p)  # the fastest correct kernel decides
    return values


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


def _check_tasks(tasks: Sequence[TaskOutcome]) -> None:
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
    _check_tasks(tasks)
    return math.fsum(expected_max_of_subset(_metric_values(t, metric, turn), k) for t in tasks) / len(tasks)


def avg_over(tasks: Sequence[TaskOutcome], metric: str, turn: int | None = None) -> float:
    """avg@k (any k) of ``metric`` after ``turn``: mean over a task's trajectories, then over tasks."""
    _check_tasks(tasks)
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


def _trajectory_count(tasks: Sequence[TaskOutcome]) -> int:
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


def _turn_table(tasks: Sequence[TaskOutcome], turn: int, fast_ps: Sequence[float]) -> _TurnTable:
    _check_tasks(tasks)
    _check_turn(turn)
    _trajectory_count(tasks)
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


def _metrics_from(table: _TurnTable, ks: Sequence[int], pass_ks: Sequence[int]) -> list[Metrics]:
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
                pass_kernels=dict(pass_kernels), geomean_speedup=geomean, kernels=kernels, correct_kernels=correct_kernels)
        for k in ks
    ]


def metrics_at(tasks: Sequence[TaskOutcome], k: int, turn: int, fast_ps: Sequence[float],
               pass_ks: Sequence[int] = ()) -> Metrics:
    """All metrics after ``turn`` with best@k over k of each task's trajectories (every task must have the
    same number of trajectories, at least k)."""
    return _metrics_from(_turn_table(tasks, turn, fast_ps), [k], pass_ks)[0]


def curve_metrics(tasks: Sequence[TaskOutcome], turn: int, ks: Sequence[int], fast_ps: Sequence[float],
                  pass_ks: Sequence[int] = ()) -> list[Metrics]:
    """``metrics_at`` for each k in ``ks`` (one per k, in order), the per-turn work done once."""
    return _metrics_from(_turn_table(tasks, turn, fast_ps), list(ks), pass_ks)


# -------------------------------------------------------------------------------------------- a run


def _number_tuple(name: str, values: Any, kind: type) -> tuple:
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise ValueError(f"{name} must be a list, got {values!r}")
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, numbers.Real) or (kind is int and not isinstance(v, int)):
            raise ValueError(f"{name} must hold {'integers' if kind is int else 'numbers'}, got {v!r}")
        out.append(kind(v))
    return tuple(out)


@dataclass
class AnalysisConfig(Settings):
    """Which metrics and budget splits to report (the ``analysis`` section of params.yaml)."""

    section = "analysis"

    fast_ps: tuple[float, ...] = (0.0, 0.5, 0.8, 1.0, 1.5, 2.0)
    """Speedup thresholds p of the fast_p metrics (share with a correct kernel at least p times faster)."""

    table_fast_ps: tuple[float, ...] = (1.0, 1.5)
    """The fast_p columns of the Table-1-style table (each must be in fast_ps); the paper shows 1 and 1.5."""

    budget_splits: tuple[str, ...] = ("16x8", "32x4", "128x1")
    """Budget splits TRAJECTORIESxTURNS to report (Table 2 and the turn curves); those the rollouts cannot
    hold (more trajectories or turns than were generated) are left out of the report."""

    pass_ks: tuple[int, ...] = (1, 4, 16)
    """k values of pass@k over kernels (a k larger than some task's number of kernels is left out)."""

    def __post_init__(self) -> None:
        self.fast_ps = tuple(sorted(set(_number_tuple("fast_ps", self.fast_ps, float))))
        bad = [p for p in self.fast_ps if not 0 <= p < math.inf]
        if bad:
            raise ValueError(f"fast_ps must be finite speedups >= 0 (e.g. [0, 1, 1.5]), got {bad}")
        self.table_fast_ps = _number_tuple("table_fast_ps", self.table_fast_ps, float)
        missing = [p for p in self.table_fast_ps if p not in self.fast_ps]
        if missing:
            raise ValueError(f"table_fast_ps {missing} are not in fast_ps {list(self.fast_ps)}; add them to fast_ps")
        if isinstance(self.budget_splits, str):
            raise ValueError(f"budget_splits must be a list such as ['16x8', '32x4'], got {self.budget_splits!r}")
        self.budget_splits = tuple(BudgetSplit.parse(s).name for s in self.budget_splits)
        if len(set(self.budget_splits)) != len(self.budget_splits):
            raise ValueError(f"budget_splits lists a split twice: {list(self.budget_splits)}")
        self.pass_ks = _number_tuple("pass_ks", self.pass_ks, int)
        if any(k < 1 for k in self.pass_ks):
            raise ValueError(f"pass_ks must be positive integers, got {list(self.pass_ks)}")

    @property
    def splits(self) -> list[BudgetSplit]:
        return [BudgetSplit.parse(s) for s in self.budget_splits]

    def to_dict(self) -> dict[str, Any]:
        # Lists, as params.yaml writes them (YAML and JSON have no tuples).
        return {k: list(v) if isinstance(v, tuple) else v for k, v in super().to_dict().items()}


@dataclass(frozen=True)
class RunReport:
    """Everything the tables and plots show about one run (one model on one set of rollouts)."""

    name: str
    trajectories: int
    """m: trajectories per task."""
    turns: int
    """n: turns of the longest trajectory."""
    tasks: int
    fast_ps: tuple[float, ...]
    table_fast_ps: tuple[float, ...]
    by_k: tuple[Metrics, ...]
    """After the last turn, k = 1..m (the best@k curve)."""
    by_turn: tuple[Metrics, ...]
    """k = m, after turn t = 1..n (the turn curves)."""
    splits: dict[str, tuple[Metrics, ...]]
    """Budget split name -> its turn curve: k = the split's trajectories, after turn t = 1..its turns."""
    task_best_speedup: dict[str, float]
    """Per task, its best trajectory's perf after the last turn (0 when no kernel was correct)."""

    @property
    def final(self) -> Metrics:
        """k = m after the last turn: what Table 1 shows."""
        return self.by_turn[-1]

    def split(self, name: str) -> Metrics | None:
        """A budget split's metrics after its last turn; None when these rollouts cannot hold it."""
        curve = self.splits.get(BudgetSplit.parse(name).name)
        return curve[-1] if curve else None

    @property
    def metric_names(self) -> list[str]:
        return metric_names(self.fast_ps)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready data (``from_dict`` reads it back): a finished evaluation keeps its report on disk, so
        runs can be compared later without their rollouts."""

        def metrics(m: Metrics) -> dict[str, Any]:
            return {"k": m.k, "turn": m.turn, "best": dict(m.best), "avg": dict(m.avg),
                    "pass_kernels": {str(k): v for k, v in m.pass_kernels.items()},
                    "geomean_speedup": m.geomean_speedup, "kernels": m.kernels, "correct_kernels": m.correct_kernels}

        return {"name": self.name, "trajectories": self.trajectories, "turns": self.turns, "tasks": self.tasks,
                "fast_ps": list(self.fast_ps), "table_fast_ps": list(self.table_fast_ps),
                "by_k": [metrics(m) for m in self.by_k], "by_turn": [metrics(m) for m in self.by_turn],
                "splits": {s: [metrics(m) for m in curve] for s, curve in self.splits.items()},
                "task_best_speedup": dict(self.task_best_speedup)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "RunReport":
        def metrics(d: Mapping[str, Any]) -> Metrics:
            # JSON object keys are text: pass@k's k comes back as an int.
            return Metrics(k=int(d["k"]), turn=int(d["turn"]), best=dict(d["best"]), avg=dict(d["avg"]),
                           pass_kernels={int(k): v for k, v in d.get("pass_kernels", {}).items()},
                           geomean_speedup=d.get("geomean_speedup"), kernels=int(d.get("kernels", 0)),
                           correct_kernels=int(d.get("correct_kernels", 0)))

        return cls(name=data["name"], trajectories=int(data["trajectories"]), turns=int(data["turns"]),
                   tasks=int(data["tasks"]), fast_ps=tuple(float(p) for p in data["fast_ps"]),
                   table_fast_ps=tuple(float(p) for p in data["table_fast_ps"]),
                   by_k=tuple(metrics(m) for m in data["by_k"]), by_turn=tuple(metrics(m) for m in data["by_turn"]),
                   splits={s: tuple(metrics(m) for m in curve) for s, curve in data["splits"].items()},
                   task_best_speedup={t: float(v) for t, v in data["task_best_speedup"].items()})


def analyze_run(name: str, tasks: Sequence[TaskOutcome], config: AnalysisConfig | None = None) -> RunReport:
    """Compute a run's report from its task outcomes (every task must have the same number m of trajectories).

    A budget split m' x n' with m' <= m and n' <= n is read from the same rollouts: best@m' over the m
    trajectories (the expected best of a random m'-subset, no random draw) after turn n'.
    """
    config = config or AnalysisConfig()
    _check_tasks(tasks)
    m = _trajectory_count(tasks)
    n = max(t.turns for t in tasks)
    if n == 0:
        raise ValueError("no trajectory has a kernel: nothing to analyse")
    ids = [t.task_id for t in tasks]
    if len(set(ids)) != len(ids):
        raise ValueError(f"task ids repeat: {sorted({i for i in ids if ids.count(i) > 1})}")

    tables = [_turn_table(tasks, t, config.fast_ps) for t in range(1, n + 1)]  # one per turn, shared by every k
    by_turn = tuple(_metrics_from(table, [m], config.pass_ks)[0] for table in tables)
    by_k = tuple(_metrics_from(tables[-1], list(range(1, m + 1)), config.pass_ks))
    splits = {
        s.name: tuple(_metrics_from(tables[t - 1], [s.trajectories], config.pass_ks)[0] for t in range(1, s.turns + 1))
        for s in config.splits if s.fits(m, n)
    }
    return RunReport(
        name=name,
        trajectories=m,
        turns=n,
        tasks=len(tasks),
        fast_ps=config.fast_ps,
        table_fast_ps=config.table_fast_ps,
        by_k=by_k,
        by_turn=by_turn,
        splits=splits,
        task_best_speedup={t.task_id: max(trajectory_perf(tr) for tr in t.trajectories) for t in tasks},
    )


def report_from_states(name: str, states: Mapping[str, Sequence[Sequence[TaskOutcome]]],
                       config: AnalysisConfig | None = None, headline: str | None = None) -> RunReport:
    """A run's report from the rollouts each budget split is read from, turn by turn.

    ``states[split][t]`` are the task outcomes the split is read from as they were after turn t+1: the same
    outcomes at every t for independent trajectories (only the kernels of turns 1..t+1 count), the beam's
    trajectories after turn t+1 for a beam-style rollout (selection replaces trajectories between turns). A
    split ``MxN`` gets best@M after each turn 1..N over however many trajectories its outcomes hold (the subset
    estimator; a rollout that ended before turn N keeps its last state). The ``headline`` split (default: the
    first) is the run's Table-1 view: ``trajectories`` x ``turns`` = its M x N, ``by_turn`` its curve, and
    ``by_k`` best@k after its last turn for every k up to the trajectories its outcomes hold.
    ``task_best_speedup`` is each task's fastest correct kernel of any state.
    """
    config = config or AnalysisConfig()
    if not states:
        raise ValueError("no budget split to report")
    names = {BudgetSplit.parse(s).name: s for s in states}
    headline = BudgetSplit.parse(headline).name if headline is not None else next(iter(names))
    if headline not in names:
        raise ValueError(f"the headline split {headline!r} is not among the splits {list(names)}")

    def at(split: str, turn: int) -> Sequence[TaskOutcome]:
        found = states[names[split]]
        if not found:
            raise ValueError(f"split {split}: its rollout has no finished turn")
        return found[min(turn, len(found)) - 1]

    ids = [t.task_id for t in at(headline, 1)]
    splits: dict[str, tuple[Metrics, ...]] = {}
    for split_name in names:
        split = BudgetSplit.parse(split_name)
        for turn in range(1, split.turns + 1):
            if [t.task_id for t in at(split_name, turn)] != ids:
                raise ValueError(f"split {split_name} after turn {turn} holds other tasks than split {headline}")
        splits[split_name] = tuple(curve_metrics(at(split_name, t), t, [split.trajectories], config.fast_ps,
                                                 config.pass_ks)[0] for t in range(1, split.turns + 1))
    top = BudgetSplit.parse(headline)
    last = at(headline, top.turns)
    by_k = curve_metrics(last, top.turns, range(1, _trajectory_count(last) + 1), config.fast_ps, config.pass_ks)
    best: dict[str, float] = {i: 0.0 for i in ids}
    for found in states.values():
        for tasks in found:
            for task in tasks:
                best[task.task_id] = max([best[task.task_id], *(trajectory_perf(tr) for tr in task.trajectories)])
    return RunReport(name=name, trajectories=top.trajectories, turns=top.turns, tasks=len(ids),
                     fast_ps=config.fast_ps, table_fast_ps=config.table_fast_ps, by_k=tuple(by_k),
                     by_turn=splits[headline], splits=splits, task_best_speedup=best)


# ------------------------------------------------------------------------------------------- adapter


def outcomes_from_trajectories(trajectories: Iterable[Any]) -> list[TaskOutcome]:
    """Task outcomes from trajectory records (anything with ``task_id`` and ``turns``, each turn with a ``result``
    dict or an object with ``correct`` and ``speedup``), each trajectory's kernels in the order of its turns.

    Unlike ``outcomes_from_turns`` it does not group turns by their trajectory index: a trajectory that continues
    another (beam-style selection) holds its parent's turns, whatever slot they were generated in. Tasks keep
    the order in which they first appear, trajectories theirs.
    """
    grouped: dict[str, list[TrajectoryOutcome]] = {}
    for traj in trajectories:
        kernels = []
        for turn in traj.turns:
            result = turn.result
            if isinstance(result, Mapping):
                correct, speedup = result.get("correct", False), result.get("speedup", 0.0)
            else:
                correct, speedup = getattr(result, "correct", False), getattr(result, "speedup", 0.0)
            kernels.append(KernelOutcome(bool(correct), float(speedup or 0.0)))
        grouped.setdefault(traj.task_id, []).append(TrajectoryOutcome(tuple(kernels)))
    return [TaskOutcome(task_id, tuple(outs)) for task_id, outs in grouped.items()]


def outcomes_from_turns(turns: Iterable[Any]) -> list[TaskOutcome]:
    """Task outcomes from rollout turn records (anything with ``task_id``, ``trajectory``, ``turn`` and a
    ``result`` dict holding the evaluator's ``correct`` and ``speedup``).

    Tasks keep the order in which they first appear, trajectories are sorted by index, turns by number;
    each trajectory's turn numbers must run 0, 1, 2 ... without gaps (turn i is the (i+1)-th kernel).
    A turn without a verdict (empty ``result``) counts as an incorrect kernel.
    """
    grouped: dict[str, dict[int, dict[int, KernelOutcome]]] = {}
    for record in turns:
        result: Mapping[str, Any] = record.result or {}
        correct = bool(result.get("correct", False))
        speedup = float(result.get("speedup", 0.0) or 0.0)
        kernels = grouped.setdefault(record.task_id, {}).setdefault(int(record.trajectory), {})
        if int(record.turn) in kernels:
            raise ValueError(f"task {record.task_id!r} trajectory {record.trajectory}: turn {record.turn} appears twice")
        kernels[int(record.turn)] = KernelOutcome(correct, speedup)
    tasks = []
    for task_id, trajectories in grouped.items():
        outs = []
        for index in sorted(trajectories):
            kernels = trajectories[index]
            if sorted(kernels) != list(range(len(kernels))):
                raise ValueError(f"task {task_id!r} trajectory {index}: turn numbers {sorted(kernels)} must be "
                                 f"0..{len(kernels) - 1} without gaps")
            outs.append(TrajectoryOutcome(tuple(kernels[i] for i in range(len(kernels)))))
        tasks.append(TaskOutcome(task_id, tuple(outs)))
    return tasks
