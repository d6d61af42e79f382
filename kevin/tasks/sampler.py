"""Batches of training tasks: balanced across levels, seeded, no task twice in an epoch, resumable.

An epoch is one pass over every training task. Its order (``epoch_order``) is a pure function of the task ids,
the seed and the epoch number: each level's tasks are shuffled with a generator seeded by (seed, epoch, level),
then the levels are interleaved in proportion to their sizes, so any run of consecutive tasks holds the levels
in their shares (with 20 + 20 tasks: L1, L2, L1, L2, ...; a batch of 8 takes 4 of each). Batches are
consecutive slices of that order. The last batch of an epoch takes what is left and tops up from the start of
the next epoch's order, skipping tasks it already holds, so a batch never repeats a task and every task is
drawn exactly once per epoch (an epoch's first batch may be shared with the end of the one before).

Barren tasks rest (``rest_epochs`` > 0; off by default). A task whose last draw gave every sample the same
return (so every advantage was 0: the update learned nothing from it) sits out the next ``rest_epochs`` epochs
and then comes back, since a policy that has learned elsewhere may now solve it part of the time. Its place in a
batch goes to a task that still teaches something: with a weak policy, a quarter to a half of a batch can be
tasks it never solves. An epoch's order is fixed when it begins, so a task that starts resting changes only later
epochs; an epoch with fewer eligible tasks than a batch draws from every task. It changes the
task mix, so a run that rests tasks cannot compare its mean score step by step: compare tasks with themselves
(``kevin learning``'s paired table) or evaluate checkpoints on fixed tasks.

The sampler's state is the epoch number, the tasks already drawn in it and the resting tasks: a checkpoint
stores ``state_dict()`` and a resumed run draws the same batches an uninterrupted one would.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

__all__ = ["TaskSampler", "epoch_order", "interleave_levels"]


def interleave_levels(by_level: Mapping[int, Sequence[str]]) -> list[str]:
    """The levels' lists merged so each level is spread evenly: a task at index i of a level of n tasks sits at
    fraction (i + 0.5) / n of the merged list (ties go to the lower level). Equal sizes alternate exactly."""
    keyed = [((i + 0.5) / len(ids), level, task_id)
             for level, ids in by_level.items() for i, task_id in enumerate(ids)]
    return [task_id for _, _, task_id in sorted(keyed)]


def epoch_order(by_level: Mapping[int, Sequence[str]], seed: int, epoch: int) -> list[str]:
    """Every task once, in the order of ``epoch``: each level shuffled (seeded by seed, epoch and level; the ids
    are sorted first, so the order given does not matter), then the levels interleaved by size."""
    shuffled: dict[int, list[str]] = {}
    for level in sorted(by_level):
        ids = sorted(by_level[level])
        # A string seed is hashed with SHA-512 by random.Random: stable across processes and Python versions.
        random.Random(f"kevin-sampler:{seed}:{epoch}:{level}").shuffle(ids)
        shuffled[level] = ids
    return interleave_levels(shuffled)


@dataclass
class TaskSampler:
    """Draws ``batch_size`` task ids per training step from ``by_level`` ({level: task ids})."""

    by_level: dict[int, list[str]]
    batch_size: int
    seed: int = 0
    epoch: int = 0
    """The epoch the next batch starts in."""
    drawn: list[str] = field(default_factory=list)
    """Tasks of the current epoch already drawn, in draw order."""
    rest_epochs: int = 0
    """Epochs a task sits out after a draw that taught nothing (every advantage 0); 0: every task every epoch."""
    resting: dict[str, int] = field(default_factory=dict)
    """Resting task -> the first epoch it may be drawn in again."""
    order: list[str] = field(default_factory=list)
    """The current epoch's order, fixed when it begins ([]: not begun yet), so a task that starts resting mid-epoch
    changes only later epochs."""

    def __post_init__(self) -> None:
        self.by_level = {int(level): list(ids) for level, ids in self.by_level.items() if ids}
        ids = [t for group in self.by_level.values() for t in group]
        if not ids:
            raise ValueError("the task sampler needs at least one training task; check the split's train tasks")
        repeated = sorted({t for t in ids if ids.count(t) > 1})
        if repeated:
            raise ValueError(f"task ids must be unique across levels; repeated: {repeated}")
        if isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise ValueError(f"tasks per batch must be a positive integer, got {self.batch_size!r}")
        if isinstance(self.rest_epochs, bool) or not isinstance(self.rest_epochs, int) or self.rest_epochs < 0:
            raise ValueError(f"epochs a barren task rests must be an integer >= 0, got {self.rest_epochs!r}")
        if self.batch_size > len(ids):
            raise ValueError(f"{self.batch_size} tasks per batch but the split has only {len(ids)} training tasks; "
                             "lower experiment.tasks_per_batch or train on more tasks")

    @property
    def task_ids(self) -> list[str]:
        return sorted(t for group in self.by_level.values() for t in group)

    def _order(self, epoch: int) -> list[str]:
        """The epoch's order without its resting tasks (every task, if fewer than a batch are left). The order of
        every task is drawn first and then filtered, so resting one task does not reshuffle the others."""
        order = epoch_order(self.by_level, self.seed, epoch)
        eligible = [t for t in order if self.resting.get(t, 0) <= epoch]
        return eligible if len(eligible) >= self.batch_size else order

    def next_batch(self) -> list[str]:
        """The next batch (draw order); advances the state."""
        if not self.order:
            self.order = self._order(self.epoch)
        used = set(self.drawn)
        left = [t for t in self.order if t not in used]
        batch = left[:self.batch_size]
        self.drawn += batch
        if len(left) <= self.batch_size:
            # The epoch is used up: the rest of the batch opens the next epoch (without the tasks it holds).
            self.epoch += 1
            self.order = self._order(self.epoch)
            self.drawn = []
            taken = set(batch)
            top_up = [t for t in self.order if t not in taken][:self.batch_size - len(batch)]
            self.drawn = top_up
            batch += top_up
        return batch

    def record(self, task_id: str, taught: bool) -> None:
        """What the task's last draw gave the update: ``taught`` is False when every advantage was 0. A barren
        task rests for the ``rest_epochs`` epochs after the current one; one that taught is eligible always."""
        if task_id not in self.task_ids:
            raise ValueError(f"{task_id!r} is not one of the sampler's tasks")
        if taught or not self.rest_epochs:
            self.resting.pop(task_id, None)
        else:
            self.resting[task_id] = self.epoch + 1 + self.rest_epochs

    def state_dict(self) -> dict[str, Any]:
        """Plain data for a checkpoint (the task ids too, so a resume can tell the split changed)."""
        return {"seed": self.seed, "batch_size": self.batch_size, "epoch": self.epoch, "drawn": list(self.drawn),
                "task_ids": self.task_ids, "rest_epochs": self.rest_epochs, "resting": dict(self.resting),
                "order": list(self.order)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state_dict()``; refuses a state drawn from other tasks, seed, batch size or rest. A state
        saved before tasks could rest is one with ``rest_epochs`` 0 and none resting."""
        state = {"rest_epochs": 0, "resting": {}, "order": [], **state}
        for key, mine in (("task_ids", self.task_ids), ("seed", self.seed), ("batch_size", self.batch_size),
                          ("rest_epochs", self.rest_epochs)):
            if state.get(key) != mine:
                raise ValueError(f"the checkpoint's task sampler was drawing with another {key} ({state.get(key)!r}, "
                                 f"this run has {mine!r}); resume with the split and experiment settings it started "
                                 "with, or start a new run")
        self.epoch = int(state["epoch"])
        self.drawn = list(state["drawn"])
        self.resting = {str(t): int(e) for t, e in state["resting"].items()}
        self.order = list(state["order"])
