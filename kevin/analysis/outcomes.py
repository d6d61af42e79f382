"""The inputs of the metrics: one typed record per kernel, trajectory and task, what each trajectory scores after
turn t (correct, perf, fast_p), and the adapters that build the records from rollout records.

Apart from the estimators (``kevin.analysis.estimators``) and the run report (``kevin.analysis.metrics``) because
the records and their per-trajectory reading are what every other analysis module (beam selection, tables) needs;
the definitions are in ``kevin.analysis.metrics``'s docstring.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "KernelOutcome",
    "TaskOutcome",
    "TrajectoryOutcome",
    "check_turn",
    "fast_name",
    "metric_names",
    "outcomes_from_trajectories",
    "outcomes_from_turns",
    "trajectory_correct",
    "trajectory_fast",
    "trajectory_metrics",
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
        check_turn(turn)
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


# ------------------------------------------------------------------------------- per trajectory, turn t


def check_turn(turn: int) -> None:
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
    ``result``: the ``EvalResult`` of a loaded ``Turn``, or a dict holding the evaluator's ``correct`` and
    ``speedup``).

    Tasks keep the order in which they first appear, trajectories are sorted by index, turns by number;
    each trajectory's turn numbers must run 0, 1, 2 ... without gaps (turn i is the (i+1)-th kernel).
    A turn without a verdict (empty ``result``) counts as an incorrect kernel.
    """
    grouped: dict[str, dict[int, dict[int, KernelOutcome]]] = {}
    for record in turns:
        result = record.result
        if isinstance(result, Mapping) or result is None:  # a verdict's dict (or none)
            correct = bool((result or {}).get("correct", False))
            speedup = float((result or {}).get("speedup", 0.0) or 0.0)
        else:  # the EvalResult a loaded ``Turn`` holds
            correct, speedup = bool(result.correct), float(result.speedup or 0.0)
        kernels = grouped.setdefault(record.task_id, {}).setdefault(int(record.trajectory), {})
        if int(record.turn) in kernels:
            raise ValueError(f"task {record.task_id!r} trajectory {record.trajectory}: turn {record.turn} "
                             "appears twice")
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
