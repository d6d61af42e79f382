"""Task records and loaders (bundled suite, external KernelBench checkout)."""

from kevin.tasks.loader import (
    bundled_solutions_dir,
    bundled_tasks_dir,
    find_task,
    load_bundled_suite,
    load_kernelbench_dir,
    load_task_file,
    load_tasks,
    read_source,
)
from kevin.tasks.task import Task, TaskError, UnknownTaskError, make_task, validate_task_source

__all__ = [
    "Task",
    "TaskError",
    "UnknownTaskError",
    "bundled_solutions_dir",
    "bundled_tasks_dir",
    "find_task",
    "load_bundled_suite",
    "load_kernelbench_dir",
    "load_task_file",
    "load_tasks",
    "make_task",
    "read_source",
    "validate_task_source",
]
