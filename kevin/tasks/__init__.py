"""Task records and loaders (bundled suite, external KernelBench checkout)."""

from kevin.tasks.loader import (
    bundled_solution_path,
    bundled_solutions_dir,
    bundled_tasks_dir,
    find_task,
    load_bundled_suite,
    load_kernelbench_dir,
    load_task_file,
    load_tasks,
    read_source,
    source_root,
)
from kevin.tasks.splits import Split, SplitConfig, SplitEntry, make_split, read_split, split_tasks, write_split
from kevin.tasks.task import Task, TaskError, UnknownTaskError, make_task, validate_task_source

__all__ = [
    "Task",
    "TaskError",
    "UnknownTaskError",
    "bundled_solution_path",
    "bundled_solutions_dir",
    "bundled_tasks_dir",
    "find_task",
    "load_bundled_suite",
    "load_kernelbench_dir",
    "load_task_file",
    "load_tasks",
    "make_task",
    "read_source",
    "source_root",
    "Split",
    "SplitConfig",
    "SplitEntry",
    "make_split",
    "read_split",
    "split_tasks",
    "write_split",
    "validate_task_source",
]
