"""Which tasks moved between two evaluations by more than chance: each task's correct tries before and after, and
Fisher's exact test of the two counts.

A mean over tasks can stay put while single tasks move a long way: a policy update that teaches a task it never
solved can forget another, and their sum is a tie (the eighth learning run, docs/learning.md). The bootstrap of
``kevin.analysis.learning.paired_gain`` asks whether the mean moved; this asks, task by task, whether its count of
correct tries did. With a few tries a task only large moves pass (0 of 8 against 8 of 8 does, 2 of 8 against 5 of 8
does not), and with many tasks about ``alpha`` of the unchanged ones pass by chance, which the table says.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import comb, fsum
from typing import Mapping

__all__ = ["TaskMove", "exact_p", "task_moves"]

# Two tables' hypergeometric probabilities that are equal in exact arithmetic can differ in the last bits of a
# float; this slack counts them as equal, as the usual implementations of the test do.
_TIES = 1 + 1e-7


def exact_p(before: int, before_tries: int, after: int, after_tries: int) -> float:
    """Two-sided p-value of Fisher's exact test that ``before`` correct of ``before_tries`` and ``after`` of
    ``after_tries`` come from one success rate: given the total correct, the probability of every split of it
    between the two that is no more likely than the one observed."""
    for name, hits, tries in (("before", before, before_tries), ("after", after, after_tries)):
        if tries < 1 or not 0 <= hits <= tries:
            raise ValueError(f"{name}: {hits} correct of {tries} tries is not a count of tries")
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
