"""The tasks of a run: a side (train or eval) of a split file or of the split the ``splits`` section draws.

Used by the training run (its train side) and the evaluation run (either side).
"""

from __future__ import annotations

import logging

from kevin.config import RunConfig
from kevin.tasks.task import Task

log = logging.getLogger(__name__)

__all__ = ["split_side", "train_tasks"]


def train_tasks(config: RunConfig) -> list[Task]:
    """The tasks the run trains on: the train side of ``experiment.split`` (a split file), else of the split the
    ``splits`` section draws; only those of ``experiment.tasks`` when it names some."""
    tasks = split_side(config, config.experiment.split, "train")
    chosen = set(config.experiment.tasks)
    if not chosen:
        return tasks
    unknown = sorted(chosen - {t.task_id for t in tasks})
    if unknown:
        raise ValueError(f"experiment.tasks names {unknown}, which are not train tasks of the split (held-out tasks "
                         "never train)")
    return [t for t in tasks if t.task_id in chosen]


def split_side(config: RunConfig, split_file: str, side: str) -> list[Task]:
    """The ``train`` or ``eval`` tasks of ``split_file`` (a ``kevin split`` file), else of the split the ``splits``
    section draws (``split_file`` ""), in the split's order."""
    from kevin.tasks import load_tasks, read_split, source_root, split_tasks

    if side not in ("train", "eval"):
        raise ValueError(f"a split has a train and an eval side, not {side!r}")
    if split_file:
        split = read_split(split_file)
        tasks = {t.task_id: t for t in load_tasks(split.config.source, split.config.levels)}
        entries = split.train if side == "train" else split.eval
        missing = [e.task_id for e in entries if e.task_id not in tasks]
        if missing:
            raise ValueError(f"{split_file}: its {side} tasks {missing} are not in {split.config.source!r}")
        changed = [e.task_id for e in entries if tasks[e.task_id].digest != e.digest]
        if changed:
            log.warning("%s: tasks edited since the split was made: %s", split_file, changed)
        return [tasks[e.task_id] for e in entries]
    tasks = load_tasks(config.splits.source, config.splits.levels)
    split = split_tasks(tasks, config.splits, root=source_root(config.splits.source))
    by_id = {t.task_id: t for t in tasks}
    return [by_id[i] for i in (split.train_ids if side == "train" else split.eval_ids)]
