"""Loaders: our bundled suite, an external KernelBench checkout, or a single task file."""

from __future__ import annotations

import re
from pathlib import Path

from kevin.tasks.task import Task, TaskError, UnknownTaskError, make_task

_LEVEL_DIR = re.compile(r"^level_?(\d+)$", re.IGNORECASE)


def repo_root() -> Path:
    """The checkout this package runs from (bundled data lives in its ``data/``)."""
    return Path(__file__).resolve().parents[2]


def bundled_tasks_dir() -> Path:
    return repo_root() / "data" / "tasks"


def bundled_solutions_dir(backend: str) -> Path:
    return repo_root() / "data" / "solutions" / backend


def bundled_solution_path(task: Task, backend: str) -> Path:
    """Where the bundled reference solution of a bundled ``task`` lives (it may not exist for other tasks)."""
    return bundled_solutions_dir(backend) / f"level{task.level}" / f"{task.name}.py"


def read_source(path: Path) -> str:
    """Read a source file with clear errors for missing, binary and non-UTF-8 files."""
    if not path.exists():
        raise FileNotFoundError(f"no such file: {path}")
    if not path.is_file():
        raise TaskError(f"not a file: {path}")
    data = path.read_bytes()
    if b"\x00" in data:
        raise TaskError(f"{path}: binary content, not a Python source file")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TaskError(f"{path}: not UTF-8 text ({exc.reason})") from exc


def load_task_file(path: str | Path, level: int = 0, task_id: str = "") -> Task:
    """Load one task file. Its id defaults to ``level<N>/<stem>`` or the bare stem."""
    path = Path(path)
    if not level:
        match = _LEVEL_DIR.match(path.parent.name)
        level = int(match.group(1)) if match else 0
    if not task_id:
        task_id = f"level{level}/{path.stem}" if level else path.stem
    return make_task(task_id, level, path.stem, read_source(path), str(path))


def _load_levels(root: Path, levels: tuple[int, ...] | None) -> list[Task]:
    if not root.is_dir():
        raise FileNotFoundError(f"no such task directory: {root}")
    tasks: list[Task] = []
    level_dirs = sorted(
        (int(m.group(1)), d) for d in root.iterdir() if d.is_dir() and (m := _LEVEL_DIR.match(d.name))
    )
    if not level_dirs:
        raise TaskError(f"{root}: no level1/ level2/ level3/ directories found")
    for level, directory in level_dirs:
        if levels and level not in levels:
            continue
        for path in sorted(directory.glob("*.py"), key=_natural_key):
            if path.name.startswith("_"):
                continue
            tasks.append(load_task_file(path, level=level, task_id=f"level{level}/{path.stem}"))
    return tasks


def _natural_key(path: Path) -> tuple:
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", path.stem))


def load_bundled_suite(levels: tuple[int, ...] | None = None) -> list[Task]:
    """Our own suite under data/tasks (written by us in the KernelBench format)."""
    return _load_levels(bundled_tasks_dir(), levels)


def kernelbench_root(path: str | Path) -> Path:
    """The folder holding the level folders of a KernelBench checkout (its KernelBench/ folder or ``path`` itself)."""
    root = Path(path)
    for candidate in (root / "KernelBench", root):
        if candidate.is_dir() and any(_LEVEL_DIR.match(d.name) for d in candidate.iterdir() if d.is_dir()):
            return candidate
    raise TaskError(f"{root}: not a KernelBench checkout (expected level1/ level2/ level3/ under it or its KernelBench/)")


def load_kernelbench_dir(path: str | Path, levels: tuple[int, ...] | None = (1, 2, 3)) -> list[Task]:
    """An external KernelBench checkout: the repo root, its KernelBench/ folder, or a level folder's parent."""
    return _load_levels(kernelbench_root(path), levels)


def source_root(source: str = "bundled") -> Path:
    """The folder the task files of ``source`` (``bundled`` or a KernelBench checkout) live under, by level."""
    return bundled_tasks_dir() if source == "bundled" else kernelbench_root(source)


def load_tasks(source: str = "bundled", levels: tuple[int, ...] | None = None) -> list[Task]:
    """``bundled`` for our suite, or a path to a KernelBench checkout."""
    if source == "bundled":
        return load_bundled_suite(levels)
    return load_kernelbench_dir(source, levels or (1, 2, 3))


def find_task(tasks: list[Task], task_id: str) -> Task:
    """The task whose id (``level1/01_relu``) or name (``01_relu``) is ``task_id``; UnknownTaskError if none."""
    for task in tasks:
        if task.task_id == task_id or task.name == task_id:
            return task
    raise UnknownTaskError(f"no task {task_id!r}")
