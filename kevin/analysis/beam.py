"""Beam-style selection between turns: which trajectories survive and how they refill the m slots.

After turn t the evaluation flow scores each of the m trajectories, calls ``select`` and continues slot
j of turn t+1 from trajectory ``parents[j]`` (its context: that trajectory's attempts and feedback).
Several slots continuing one parent are branches: sampling at a temperature > 0 makes them diverge.

Strategies are registered by name, so a new one is a config value:
- ``independent``: no selection, every trajectory continues itself (the paper's plain m x n).
- ``top_k``: keep the ``keep`` best-scored trajectories (ties: lower index first) and give each an
  equal share of the m slots; when ``keep`` does not divide m the remainder goes one slot each to the
  best survivors. Slots are filled survivor by survivor, best first.
Scores come from ``trajectory_scores``: the kernel score (0.3 + speedup when correct, else 0) of the
trajectory's best kernel so far (``best``) or of its latest kernel (``last``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kevin.analysis.outcomes import TrajectoryOutcome
from kevin.records.evaluation import kernel_score
from kevin.settings import Settings

__all__ = ["BeamConfig", "BeamStep", "SELECTIONS", "register_selection", "select", "trajectory_scores"]


@dataclass(frozen=True)
class BeamStep:
    """The outcome of one selection over m trajectories."""

    survivors: tuple[int, ...]
    """Indices of the trajectories that continue, best first."""
    parents: tuple[int, ...]
    """Length m: slot j of the next turn continues trajectory ``parents[j]``."""


SCORE_BY = ("best", "last")

# (scores of the m trajectories, keep) -> BeamStep
SelectionFn = Callable[[list[float], int], BeamStep]

SELECTIONS: dict[str, SelectionFn] = {}
"""Selection strategies by name; add one with ``@register_selection("name")``."""


def register_selection(name: str) -> Callable[[SelectionFn], SelectionFn]:
    """Register ``fn(scores, keep) -> BeamStep`` under ``name``."""

    def decorator(fn: SelectionFn) -> SelectionFn:
        if name in SELECTIONS:
            raise ValueError(f"selection strategy {name!r} is already registered")
        SELECTIONS[name] = fn
        return fn

    return decorator


@register_selection("independent")
def _independent(scores: list[float], keep: int) -> BeamStep:
    everyone = tuple(range(len(scores)))
    return BeamStep(survivors=everyone, parents=everyone)


@register_selection("top_k")
def _top_k(scores: list[float], keep: int) -> BeamStep:
    m = len(scores)
    if keep > m:
        raise ValueError(f"top_k keeps {keep} trajectories but there are only {m}; lower beam.keep")
    ranked = sorted(range(m), key=lambda i: (-scores[i], i))  # best first; ties keep the lower index
    survivors = tuple(ranked[:keep])
    share, extra = divmod(m, keep)
    parents: list[int] = []
    for rank, index in enumerate(survivors):
        parents += [index] * (share + (1 if rank < extra else 0))
    return BeamStep(survivors=survivors, parents=tuple(parents))


def select(scores: Sequence[float], keep: int, strategy: str = "top_k") -> BeamStep:
    """Apply a registered strategy to the scores of the m trajectories after some turn."""
    try:
        fn = SELECTIONS[strategy]
    except KeyError:
        raise ValueError(f"unknown selection strategy {strategy!r}; choose one of {sorted(SELECTIONS)}") from None
    values = [float(s) for s in scores]
    if not values:
        raise ValueError("no trajectories to select from")
    if any(not math.isfinite(v) for v in values):
        raise ValueError(f"trajectory scores must be finite, got {values}")
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
        raise ValueError(f"keep must be a positive integer, got {keep!r}")
    step = fn(values, keep)
    if len(step.parents) != len(values) or any(not 0 <= p < len(values) for p in step.parents):
        raise ValueError(f"strategy {strategy!r} returned parents {step.parents} for {len(values)} trajectories")
    return step


def trajectory_scores(trajectories: Sequence[TrajectoryOutcome], by: str = "best") -> list[float]:
    """Each trajectory's kernel score so far: of its best kernel (``best``) or its latest one (``last``)."""
    if by not in SCORE_BY:
        raise ValueError(f"score by {by!r}: use one of {SCORE_BY}")
    scores = []
    for traj in trajectories:
        kernels = [kernel_score(k.correct, float(k.speedup)) for k in traj.kernels]
        scores.append(max(kernels, default=0.0) if by == "best" else (kernels[-1] if kernels else 0.0))
    return scores


@dataclass
class BeamConfig(Settings):
    """Beam-style selection between turns during evaluation (the ``beam`` section of params.yaml)."""

    section = "beam"

    strategy: str = "independent"
    """`independent` (no selection: m trajectories of n turns) or `top_k` (after each turn keep the best
    `keep` and branch them to refill m), or any strategy registered with ``register_selection``."""

    keep: int = 4
    """How many trajectories survive each selection with `top_k` (at most the number of trajectories);
    `independent` ignores it."""

    score: str = "best"
    """What ranks a trajectory: `best` (kernel score of its best kernel so far) or `last` (of its latest kernel)."""

    def __post_init__(self) -> None:
        if self.strategy not in SELECTIONS:
            raise ValueError(f"beam strategy {self.strategy!r} is unknown; choose one of {sorted(SELECTIONS)}")
        if isinstance(self.keep, bool) or not isinstance(self.keep, int) or self.keep < 1:
            raise ValueError(f"beam keep must be a positive integer, got {self.keep!r}")
        if self.score not in SCORE_BY:
            raise ValueError(f"beam score must be one of {SCORE_BY}, got {self.score!r}")

    def step(self, trajectories: Sequence[TrajectoryOutcome]) -> BeamStep:
        """Score the trajectories and select (with `top_k`, ``keep`` above their number is an error)."""
        return select(trajectory_scores(trajectories, self.score), self.keep, self.strategy)
