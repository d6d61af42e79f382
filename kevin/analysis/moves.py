"""Which tasks moved between two evaluations by more than chance: each task's correct tries before and after, and
Fisher's exact test of the two counts.

A mean over tasks can stay put while single tasks move a long way: a policy update that teaches a task it never
solved can forget another, and their sum is a tie (the eighth learning run, docs/learning.md). The bootstrap of
``kevin.analysis.learning.paired_gain`` asks whether the mean moved; this asks, task by task, whether its count of
correct tries did. With a few tries a task only large moves pass (0 of 8 against 8 of 8 does, 2 of 8 against 5 of 8
does not), and with many tasks about ``alpha`` of the unchanged ones pass by chance, which the table says.

``count_gain`` asks the bootstrap's question again with the tries' own noise in it. Redrawing the tasks alone treats
each task's share of correct tries as known, yet 8 tries a task are a sample too: the eighth run's warm start,
evaluated twice at two sampling seeds, solved 60% and 52.5% of the same 40 tasks, and the task-only interval called
a checkpoint's 7.5-point lead over the second "above the noise". Here every redraw picks the tasks again and then,
within each task, its tries again from its observed rate, so the interval is as wide as a repeat of both
evaluations would be.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import comb, fsum
from typing import Mapping

__all__ = ["COUNT_FIGURES", "TaskMove", "count_gain", "exact_p", "task_moves"]

# Two tables' hypergeometric probabilities that are equal in exact arithmetic can differ in the last bits of a
# float; this slack counts them as equal, as the usual implementations of the test do.
_TIES = 1 + 1e-7


def _check_count(name: str, hits: int, tries: int) -> None:
    """ValueError unless ``hits`` correct of ``tries`` can be a count of tries."""
    if tries < 1 or not 0 <= hits <= tries:
        raise ValueError(f"{name}: {hits} correct of {tries} tries is not a count of tries")


def exact_p(before: int, before_tries: int, after: int, after_tries: int) -> float:
    """Two-sided p-value of Fisher's exact test that ``before`` correct of ``before_tries`` and ``after`` of
    ``after_tries`` come from one success rate: given the total correct, the probability of every split of it
    between the two that is no more likely than the one observed."""
    _check_count("before", before, before_tries)
    _check_count("after", after, after_tries)
    total = before + after
    every = comb(before_tries + after_tries, total)

    def chance(x: int) -> float:
        return comb(before_tries, x) * comb(after_tries, total - x) / every

    observed = chance(before)
    splits = range(max(0, total - after_tries), min(total, before_tries) + 1)
    return min(1.0, fsum(p for p in map(chance, splits) if p <= observed * _TIES))


@dataclass(frozen=True)
class TaskMove:
    """One task's correct tries in two evaluations and the exact test of the change."""

    task: str
    before: int
    """Correct tries in the first evaluation (the baseline)."""
    before_tries: int
    after: int
    """Correct tries in the second."""
    after_tries: int
    p: float
    """``exact_p`` of the two counts."""

    @property
    def rose(self) -> bool:
        """Whether the share of correct tries went up (compared as shares: the tries may differ)."""
        return self.after * self.before_tries > self.before * self.after_tries

    def to_dict(self) -> dict[str, object]:
        return {"task": self.task, "before": self.before, "before_tries": self.before_tries, "after": self.after,
                "after_tries": self.after_tries, "p": self.p, "rose": self.rose}


def task_moves(before: Mapping[str, tuple[int, int]], after: Mapping[str, tuple[int, int]],
               alpha: float = 0.05) -> list[TaskMove]:
    """The tasks of both evaluations (each task's ``(correct, tries)``) whose change has ``exact_p`` below
    ``alpha``, most certain first (then by task)."""
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be between 0 and 1, got {alpha}")
    moves = [TaskMove(task, *before[task], *after[task], exact_p(*before[task], *after[task]))
             for task in sorted(set(before) & set(after))]
    return sorted((m for m in moves if m.p < alpha), key=lambda m: (m.p, m.task))


COUNT_FIGURES = ("share", "solved")
"""What ``count_gain`` compares per task: ``share``, the share of its tries that were correct (avg@k); ``solved``,
whether any try was (best@k of correctness)."""


def _figure(correct, tries, figure: str):
    return correct / tries if figure == "share" else (correct > 0) * 1.0


def count_gain(before: Mapping[str, tuple[int, int]], after: Mapping[str, tuple[int, int]], figure: str = "share", *,
               level: float = 0.9, draws: int = 2000, seed: int = 0) -> tuple[float, float, float, float]:
    """Two evaluations' mean ``figure`` (``COUNT_FIGURES``) over the tasks both hold (each task's ``(correct,
    tries)``), before and after, and a ``level`` percentile interval of the gain from ``draws`` seeded two-level
    redraws: the tasks with replacement, then each drawn task's tries on both sides, as many as it had, each correct
    at the rate it showed (a binomial draw). A task that was always or never correct keeps its count in every redraw,
    so evaluations of such tasks only get the task-only interval; the more a task's tries split, the wider it gets.
    A redraw can lose a task solved by one try in k but never finds one solved by none, so ``solved`` is redrawn a
    little below its observed rate on both sides and its interval can sit slightly off the gain.
    ValueError on no shared task, a bad count, figure or level."""
    import numpy as np  # only here: the rest of the module is plain Python

    from kevin.analysis.learning import _interval  # the percentile interval every bootstrap here reads

    if figure not in COUNT_FIGURES:
        raise ValueError(f"figure must be one of {COUNT_FIGURES}, got {figure!r}")
    if not 0 < level < 1:
        raise ValueError(f"level must be between 0 and 1, got {level}")
    tasks = sorted(set(before) & set(after))
    if not tasks:
        raise ValueError("the two evaluations share no task: there is nothing to pair")
    for task in tasks:
        _check_count(task, *before[task])
        _check_count(task, *after[task])

    def counts(side: Mapping[str, tuple[int, int]]) -> tuple[np.ndarray, np.ndarray]:  # (correct, tries) a task
        return np.array([side[t][0] for t in tasks]), np.array([side[t][1] for t in tasks])

    (hits_b, tries_b), (hits_a, tries_a) = counts(before), counts(after)
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(tasks), size=(draws, len(tasks)))
    redrawn_b = rng.binomial(tries_b[picks], hits_b[picks] / tries_b[picks])
    redrawn_a = rng.binomial(tries_a[picks], hits_a[picks] / tries_a[picks])
    gains = (_figure(redrawn_a, tries_a[picks], figure) - _figure(redrawn_b, tries_b[picks], figure)).mean(axis=1)
    low, high = _interval([float(g) for g in gains], level)
    first = float(np.mean(_figure(hits_b, tries_b, figure)))
    last = float(np.mean(_figure(hits_a, tries_a, figure)))
    return first, last, low, high
