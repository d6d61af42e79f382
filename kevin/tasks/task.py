"""The Task record and the static validation of a KernelBench-format task file."""

from __future__ import annotations

import ast
import hashlib
from dataclasses import dataclass, field

from kevin.tasks.profiles import DEFAULT_PROFILE, read_profiles, render_profile

REQUIRED_NAMES = ("Model", "get_inputs", "get_init_inputs")


class TaskError(ValueError):
    """A task file is not a valid KernelBench-format task."""


class UnknownTaskError(TaskError, KeyError):
    """No task has the id asked for.

    Also a KeyError (a failed lookup) for callers that catch one, but printed as its message alone: a plain
    KeyError's str() wraps the message in a second pair of quotes (``"no task 'x'"``)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


@dataclass(frozen=True)
class Task:
    """One KernelBench-format task: a reference ``Model`` plus input factories.

    ``source`` is the file as written (with its size profiles); ``render(profile)`` gives the plain
    KernelBench source for one problem size. Tasks are never executed when loaded.
    """

    task_id: str
    level: int
    name: str
    source: str
    path: str = ""
    profiles: dict[str, dict[str, object]] = field(default_factory=dict)

    def render(self, profile: str = DEFAULT_PROFILE) -> str:
        """The task source with the sizes of ``profile`` (its own sizes if it has no such profile)."""
        return render_profile(self.source, profile)

    @property
    def digest(self) -> str:
        """Content hash of the task source, used in cache keys (e.g. cached baselines)."""
        return hashlib.sha256(self.source.encode()).hexdigest()[:16]


def validate_task_source(source: str, origin: str = "<task>") -> None:
    """Raise TaskError unless ``source`` parses and defines Model, get_inputs and get_init_inputs."""
    if "\x00" in source:
        raise TaskError(f"{origin}: binary content, not a Python task file")
    if not source.strip():
        raise TaskError(f"{origin}: empty task file")
    try:
        tree = ast.parse(source, filename=origin)
    except SyntaxError as exc:
        raise TaskError(f"{origin}: not valid Python ({exc.msg}, line {exc.lineno})") from exc
    defined = set()
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            defined.add(node.name)
        elif isinstance(node, ast.Assign):
            defined.update(t.id for t in node.targets if isinstance(t, ast.Name))
    missing = [name for name in REQUIRED_NAMES if name not in defined]
    if missing:
        raise TaskError(f"{origin}: a task must define {', '.join(REQUIRED_NAMES)}; missing {', '.join(missing)}")
    read_profiles(source)  # malformed profiles fail here, at load time


def make_task(task_id: str, level: int, name: str, source: str, path: str = "") -> Task:
    """Validate and build a Task record."""
    validate_task_source(source, path or task_id)
    return Task(task_id=task_id, level=level, name=name, source=source, path=path, profiles=read_profiles(source))
