"""Seeded train/eval splits of a task suite, stratified by level and stable across re-runs.

The rule (docs/data.md): within each level, tasks are ranked by ``sha256(f"{seed}:{task_id}")`` and
the first ``q`` of that ranking are held out for evaluation, the rest are trained on. ``q`` per level
comes from the eval size (or fraction) shared among levels in proportion to their size.

Why a hash of the id rather than a shuffle: a task's rank depends on its own id and the seed only,
so the split does not depend on the order the tasks were listed in, a content edit does not move a
task, and a task added to the suite moves at most one other task (the one at the eval boundary,
when the newcomer ranks into the eval set or the level's quota grows). Exact per-level counts and
"nothing else ever moves" cannot both hold: a fixed count with one more candidate must drop one.

A split is written as JSON: the config, then per split a list of entries (task id, level, content
digest, path under the source's task folder), so a later stage can tell a task edited since the split.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from kevin.settings import Settings
from kevin.tasks.task import Task

SPLIT_FORMAT = 1
BUNDLED_EVAL_FRACTION = 1 / 3
"""Default held-out share of the bundled suite: 10 + 10 of its 30 + 30 tasks."""
KERNELBENCH_EVAL_FRACTION = 0.1
"""Default held-out share of a KernelBench checkout: the paper trains on 90 + 90 of levels 1 and 2."""


@dataclass
class SplitConfig(Settings):
    """Which tasks a split draws from and how many it holds out (the ``splits`` section of params.yaml)."""

    section = "splits"

    source: str = "bundled"
    """``bundled`` (this repository's suite under data/tasks) or the path of a KernelBench checkout
    (its root or its KernelBench/ folder)."""

    levels: tuple[int, ...] = (1, 2)
    """Task levels in the split; tasks of other levels are left out (the paper uses levels 1 and 2)."""

    seed: int = 0
    """Seed of the hash that ranks the tasks; another seed holds out another set."""

    eval_size: int | None = None
    """Held-out tasks in all, shared among levels in proportion to their size. Give this or
    ``eval_fraction``, not both; with neither, the source's default fraction applies (1/3 for the
    bundled suite, 0.1 for a KernelBench checkout)."""

    eval_fraction: float | None = None
    """Held-out share of the tasks, in (0, 1): rounded to a whole number of tasks, then shared among
    levels like ``eval_size``."""

    stratify: bool = True
    """Hold out tasks level by level so each level keeps its share; False ranks all levels together
    (each level's share then varies with the seed)."""

    def to_dict(self) -> dict[str, Any]:
        """As params.yaml writes it (levels as a list)."""
        return {**super().to_dict(), "levels": list(self.levels)}

    def __post_init__(self) -> None:
        if not isinstance(self.source, str) or not self.source.strip():
            raise ValueError(f"source must be 'bundled' or the path of a KernelBench checkout, got {self.source!r}")
        levels = self.levels if isinstance(self.levels, (list, tuple)) else [self.levels]
        if not levels or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in levels):
            raise ValueError(f"levels must be a non-empty list of positive integers (e.g. [1, 2]), got {self.levels!r}")
        self.levels = tuple(sorted(set(levels)))
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"seed must be an integer, got {self.seed!r}")
        if self.eval_size is not None and self.eval_fraction is not None:
            raise ValueError("give splits.eval_size or splits.eval_fraction, not both (set the other to null)")
        if self.eval_size is not None and (
            isinstance(self.eval_size, bool) or not isinstance(self.eval_size, int) or self.eval_size < 1
        ):
            raise ValueError(f"eval_size must be a positive integer (or null to use eval_fraction), got {self.eval_size!r}")
        if self.eval_fraction is not None and (
            isinstance(self.eval_fraction, bool) or not isinstance(self.eval_fraction, (int, float))
            or not 0 < self.eval_fraction < 1
        ):
            raise ValueError(f"eval_fraction must be a number strictly between 0 and 1 (e.g. 0.1), got {self.eval_fraction!r}")
        if not isinstance(self.stratify, bool):
            raise ValueError(f"stratify must be true or false, got {self.stratify!r}")

    def eval_count(self, n_tasks: int) -> int:
        """How many of ``n_tasks`` tasks are held out (fractions round half up)."""
        if self.eval_size is not None:
            return self.eval_size
        fraction = self.eval_fraction
        if fraction is None:
            fraction = BUNDLED_EVAL_FRACTION if self.source == "bundled" else KERNELBENCH_EVAL_FRACTION
        # The epsilon keeps 0.1 * 200 = 20.000000000000004 and 1/3 * 60 = 19.999... on 20.
        return math.floor(fraction * n_tasks + 0.5 + 1e-9)


@dataclass(frozen=True)
class SplitEntry:
    """One task of a split, with what a later stage needs to find it and see whether it changed."""

    task_id: str
    level: int
    digest: str
    """``Task.digest`` (content hash of the task file) when the split was made."""
    path: str = ""
    """The task file relative to its source's task folder (e.g. ``level1/01_relu.py``); empty if unknown."""

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str) -> "SplitEntry":
        if not isinstance(data, Mapping):
            raise ValueError(f"{where}: expected an object with task_id, level, digest, got {data!r}")
        missing = [k for k in ("task_id", "level", "digest") if k not in data]
        if missing:
            raise ValueError(f"{where}: missing {missing}")
        return cls(task_id=data["task_id"], level=data["level"], digest=data["digest"], path=data.get("path", ""))


@dataclass(frozen=True)
class Split:
    """A train/eval split of one source's tasks, and the config that drew it."""

    config: SplitConfig
    train: tuple[SplitEntry, ...] = field(default_factory=tuple)
    eval: tuple[SplitEntry, ...] = field(default_factory=tuple)

    @property
    def train_ids(self) -> list[str]:
        return [e.task_id for e in self.train]

    @property
    def eval_ids(self) -> list[str]:
        return [e.task_id for e in self.eval]

    def counts(self) -> dict[str, dict[int, int]]:
        """Tasks per level in each split: ``{"train": {1: 90, 2: 90}, "eval": {...}}``."""
        out: dict[str, dict[int, int]] = {}
        for name, entries in (("train", self.train), ("eval", self.eval)):
            per_level: dict[int, int] = {}
            for e in entries:
                per_level[e.level] = per_level.get(e.level, 0) + 1
            out[name] = dict(sorted(per_level.items()))
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": SPLIT_FORMAT,
            "config": self.config.to_dict(),
            "train": [vars(e).copy() for e in self.train],
            "eval": [vars(e).copy() for e in self.eval],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "split") -> "Split":
        """Read a split as written, without judging it: duplicates or leaks are for the data checks to report."""
        if not isinstance(data, Mapping) or data.get("format") != SPLIT_FORMAT:
            raise ValueError(f"{where}: not a split file of format {SPLIT_FORMAT} (make one with `python -m kevin_cli split`)")
        for key in ("config", "train", "eval"):
            if key not in data:
                raise ValueError(f"{where}: missing {key!r}")
            if key != "config" and not isinstance(data[key], list):
                raise ValueError(f"{where}: {key!r} must be a list of task entries")
        config = SplitConfig.from_dict(data["config"])
        return cls(
            config=config,
            train=tuple(SplitEntry.from_dict(e, f"{where}: train[{i}]") for i, e in enumerate(data["train"])),
            eval=tuple(SplitEntry.from_dict(e, f"{where}: eval[{i}]") for i, e in enumerate(data["eval"])),
        )


# ------------------------------------------------------------------------------------------ the rule


def rank_key(task_id: str, seed: int) -> str:
    """A task's place in the seeded ranking: depends on its id and the seed only."""
    return hashlib.sha256(f"{seed}:{task_id}".encode()).hexdigest()


def allocate(total: int, sizes: Mapping[int, int]) -> dict[int, int]:
    """Share ``total`` among groups in proportion to ``sizes`` (largest remainder; ties go to the lower key).

    ``allocate(3, {1: 5, 2: 3}) == {1: 2, 2: 1}``: exact shares 1.875 and 1.125, floors 1 + 1, and the
    one left over goes to the larger remainder.
    """
    n = sum(sizes.values())
    if not 0 <= total <= n:
        raise ValueError(f"cannot share {total} among groups of {n} in all")
    # Integer arithmetic: total * size // n and its remainder, so no float rounding decides a tie.
    quota = {key: total * size // n for key, size in sizes.items()}
    left = total - sum(quota.values())
    order = sorted(sizes, key=lambda key: (-(total * sizes[key] % n), key))
    for key in order[:left]:
        quota[key] += 1
    return quota


def _natural(task_id: str) -> tuple:
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"(\d+)", task_id))


def _entry(task: Task, root: Path | None) -> SplitEntry:
    path = ""
    if task.path:
        path = Path(task.path).as_posix()
        if root is not None:
            try:
                path = Path(task.path).resolve().relative_to(root.resolve()).as_posix()
            except ValueError:
                pass
    return SplitEntry(task_id=task.task_id, level=task.level, digest=task.digest, path=path)


def split_tasks(tasks: Sequence[Task], config: SplitConfig, root: str | Path | None = None) -> Split:
    """Split ``tasks`` by ``config``'s rule; tasks outside ``config.levels`` are left out.

    ``root``: the source's task folder, so entries record paths relative to it (portable split files).
    Raises ValueError for duplicate ids, a configured level without tasks, or an eval size that
    leaves nothing to train on.
    """
    chosen = [t for t in tasks if t.level in config.levels]
    counts = Counter(t.task_id for t in chosen)
    duplicates = sorted(task_id for task_id, count in counts.items() if count > 1)
    if duplicates:
        raise ValueError(f"task ids must be unique to split a suite; repeated: {duplicates}")
    by_level: dict[int, list[Task]] = {level: [] for level in config.levels}
    for task in chosen:
        by_level[task.level].append(task)
    empty = [level for level, group in by_level.items() if not group]
    if empty:
        raise ValueError(f"no tasks of level(s) {empty} in source {config.source!r}; "
                         f"set splits.levels to levels the source has")
    n = len(chosen)
    total = config.eval_count(n)
    if not 1 <= total < n:
        raise ValueError(f"an eval set of {total} of {n} tasks leaves no train or no eval tasks; "
                         f"choose splits.eval_size between 1 and {n - 1}")

    def ranked(group: list[Task]) -> list[Task]:
        return sorted(group, key=lambda t: (rank_key(t.task_id, config.seed), t.task_id))

    if config.stratify:
        quota = allocate(total, {level: len(group) for level, group in by_level.items()})
        held = {t.task_id for level, group in by_level.items() for t in ranked(group)[:quota[level]]}
    else:
        held = {t.task_id for t in ranked(chosen)[:total]}

    root_path = Path(root) if root is not None else None
    order = sorted(chosen, key=lambda t: (t.level, _natural(t.task_id)))
    return Split(
        config=config,
        train=tuple(_entry(t, root_path) for t in order if t.task_id not in held),
        eval=tuple(_entry(t, root_path) for t in order if t.task_id in held),
    )


def make_split(config: SplitConfig) -> Split:
    """Load ``config.source`` and split it (raises TaskError/FileNotFoundError for a bad source)."""
    from kevin.tasks.loader import load_tasks, source_root

    tasks = load_tasks(config.source, config.levels)
    return split_tasks(tasks, config, root=source_root(config.source))


# ------------------------------------------------------------------------------------------ files


def write_split(path: str | Path, split: Split) -> Path:
    """Write the split as JSON, atomically (a temp sibling renamed into place)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = _split_json(split.to_dict())
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _split_json(data: dict[str, Any]) -> str:
    """JSON with one task entry per line, so a task changing sides is a one-line diff."""
    def entries(rows: list[dict[str, Any]]) -> str:
        return "[" + ",".join(f"\n  {json.dumps(row)}" for row in rows) + ("\n ]" if rows else "]")

    return (f'{{\n "format": {json.dumps(data["format"])},\n "config": {json.dumps(data["config"])},\n'
            f' "train": {entries(data["train"])},\n "eval": {entries(data["eval"])}\n}}\n')


def read_split(path: str | Path) -> Split:
    """Read a split file; raises FileNotFoundError or ValueError (naming the file) when it is not one."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no such split file: {path}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: not a JSON split file ({exc})") from exc
    return Split.from_dict(data, where=str(path))
