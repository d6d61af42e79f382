"""Where batches of candidates come from (a folder of solution files, a JSONL file, or our references), and whether a
candidate's text is a solution at all."""

from __future__ import annotations

import json
from pathlib import Path

from kevin.records.evaluation import Candidate
from kevin.tasks import Task, bundled_solutions_dir, find_task


def read_candidates(path: Path, tasks: list[Task]) -> list[tuple[Task, Candidate]]:
    """Pairs of (task, candidate).

    A folder: every ``*.py`` below it, matched to a task by ``levelN/NAME.py`` or by ``NAME.py``.
    A JSONL file: one object per line with ``task_id`` and ``source`` (optional ``trajectory``,
    ``turn``, ``candidate_id``).
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no such file or folder: {path}")
    items: list[tuple[Task, Candidate]] = []
    if path.is_dir():
        for file in sorted(path.rglob("*.py")):
            rel = file.relative_to(path)
            task_id = f"{rel.parent.name}/{file.stem}" if rel.parent.name.startswith("level") else file.stem
            task = find_task(tasks, task_id)
            source = file.read_bytes().decode("utf-8", errors="replace")
            items.append((task, Candidate(task_id=task.task_id, source=source, candidate_id=str(rel))))
        return items
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            task = find_task(tasks, row["task_id"])
        except (ValueError, KeyError) as exc:
            raise ValueError(f"{path}:{n}: expected {{task_id, source}} of a known task ({exc})") from exc
        items.append((task, Candidate(task_id=task.task_id, source=str(row.get("source", "")),
                                      trajectory=int(row.get("trajectory", 0)), turn=int(row.get("turn", 0)),
                                      candidate_id=str(row.get("candidate_id", "")))))
    return items


def reference_candidates(tasks: list[Task], backend: str) -> list[tuple[Task, Candidate]]:
    """Our reference solution of each bundled task for ``backend`` (tasks without one are skipped)."""
    root = bundled_solutions_dir(backend)
    items = []
    for task in tasks:
        file = root / f"level{task.level}" / f"{task.name}.py"
        if file.is_file():
            items.append((task, Candidate(task_id=task.task_id, source=file.read_text(), candidate_id=f"reference:{task.task_id}")))
    return items


def _defines_class(source: str, name: str) -> bool:
    import ast

    return any(isinstance(n, ast.ClassDef) and n.name == name for n in ast.walk(ast.parse(source)))


def solution_text_problem(source: str) -> str:
    """Why a solution is not a Python file defining ModelNew ('' when it is), as a parse-error phrase."""
    if not source.strip():
        return "the solution is empty"
    if "\x00" in source:
        return "the solution is binary data, not Python"
    try:
        compile(source, "<solution>", "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as exc:
        where = f" (line {exc.lineno})" if getattr(exc, "lineno", None) else ""
        return f"not valid Python: {getattr(exc, 'msg', exc)}{where}"
    if "ModelNew" not in source or not _defines_class(source, "ModelNew"):
        return "no class ModelNew is defined"
    return ""
