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

Inputs are plain typed records (``KernelOutcome`` / ``TrajectoryOutcome`` / ``TaskOutcome``, in
``kevin.analysis.outcomes``); ``outcomes_from_turns`` builds them from rollout ``Turn`` records by reading only
their attribute names.
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kevin.analysis.estimators import Metrics, check_tasks, curve_metrics, metrics_from, trajectory_count, turn_table
from kevin.analysis.outcomes import TaskOutcome, metric_names, trajectory_correct, trajectory_perf
from kevin.settings import Settings

__all__ = ["AnalysisConfig", "BudgetSplit", "RunReport", "analyze_run", "report_from_states"]


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
    task_correct_share: dict[str, float] = field(default_factory=dict)
    """Per task, the share of its trajectories with a correct kernel after the headline's last turn (their mean
    over tasks is avg@k of ``correct``); empty in reports written before it was kept."""

    def task_correct_counts(self) -> dict[str, tuple[int, int]]:
        """Per task, (correct trajectories, trajectories) after the headline's last turn: the counts behind
        ``task_correct_share``, for the exact test of a task's change (``kevin.analysis.moves``)."""
        return {task: (round(share * self.trajectories), self.trajectories)
                for task, share in self.task_correct_share.items()}

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
                "task_best_speedup": dict(self.task_best_speedup),
                "task_correct_share": dict(self.task_correct_share)}

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
                   task_best_speedup={t: float(v) for t, v in data["task_best_speedup"].items()},
                   task_correct_share={t: float(v) for t, v in data.get("task_correct_share", {}).items()})


def task_correct_shares(tasks: Sequence[TaskOutcome]) -> dict[str, float]:
    """Per task, the share of its trajectories with a correct kernel (in any of their turns)."""
    return {t.task_id: (sum(map(trajectory_correct, t.trajectories)) / len(t.trajectories) if t.trajectories else 0.0)
            for t in tasks}


def analyze_run(name: str, tasks: Sequence[TaskOutcome], config: AnalysisConfig | None = None) -> RunReport:
    """Compute a run's report from its task outcomes (every task must have the same number m of trajectories).

    A budget split m' x n' with m' <= m and n' <= n is read from the same rollouts: best@m' over the m
    trajectories (the expected best of a random m'-subset, no random draw) after turn n'.
    """
    config = config or AnalysisConfig()
    check_tasks(tasks)
    m = trajectory_count(tasks)
    n = max(t.turns for t in tasks)
    if n == 0:
        raise ValueError("no trajectory has a kernel: nothing to analyse")
    ids = [t.task_id for t in tasks]
    if len(set(ids)) != len(ids):
        raise ValueError(f"task ids repeat: {sorted({i for i in ids if ids.count(i) > 1})}")

    tables = [turn_table(tasks, t, config.fast_ps) for t in range(1, n + 1)]  # one per turn, shared by every k
    by_turn = tuple(metrics_from(table, [m], config.pass_ks)[0] for table in tables)
    by_k = tuple(metrics_from(tables[-1], list(range(1, m + 1)), config.pass_ks))
    splits = {
        s.name: tuple(metrics_from(tables[t - 1], [s.trajectories], config.pass_ks)[0] for t in range(1, s.turns + 1))
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
        task_correct_share=task_correct_shares(tasks),
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
    by_k = curve_metrics(last, top.turns, range(1, trajectory_count(last) + 1), config.fast_ps, config.pass_ks)
    best: dict[str, float] = {i: 0.0 for i in ids}
    for found in states.values():
        for tasks in found:
            for task in tasks:
                best[task.task_id] = max([best[task.task_id], *(trajectory_perf(tr) for tr in task.trajectories)])
    return RunReport(name=name, trajectories=top.trajectories, turns=top.turns, tasks=len(ids),
                     fast_ps=config.fast_ps, table_fast_ps=config.table_fast_ps, by_k=tuple(by_k),
                     by_turn=splits[headline], splits=splits, task_best_speedup=best,
                     task_correct_share=task_correct_shares(last))
