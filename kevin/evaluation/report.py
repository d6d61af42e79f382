"""Showing verdicts: one result, a summary table, JSONL and summary files."""

from __future__ import annotations

import json
import statistics
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from kevin.records.evaluation import EvalResult, Status

if TYPE_CHECKING:
    from rich.console import Console


def write_jsonl(path: Path, results: list[EvalResult]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        for r in results:
            handle.write(json.dumps(r.to_dict()) + "\n")


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile (0-100) of ``values``, interpolating linearly between the two nearest ranks
    (numpy's default; the median for q = 50); 0.0 for no values."""
    if not values:
        return 0.0
    import numpy as np

    return float(np.percentile(np.asarray(values, dtype=float), q))


def summarise(results: list[EvalResult]) -> dict:
    """Counts per status, correctness share, speedups of correct kernels, compile-time percentiles (of the
    candidates that were built: a reused verdict spent no compile), and how many verdicts were reused."""
    counts = Counter(r.status.value for r in results)
    speedups = [r.speedup for r in results if r.correct]
    compile_s = [r.times.compile for r in results if r.compiled and r.times.compile > 0]
    return {
        "candidates": len(results),
        "status_counts": dict(sorted(counts.items())),
        "correct_share": (counts.get("correct", 0) / len(results)) if results else 0.0,
        "speedup_geomean": statistics.geometric_mean(speedups) if speedups and min(speedups) > 0 else 0.0,
        "speedup_median": statistics.median(speedups) if speedups else 0.0,
        "mean_score": statistics.fmean(r.score for r in results) if results else 0.0,
        "compile_s_median": percentile(compile_s, 50),
        "compile_s_p90": percentile(compile_s, 90),
        "reused": sum(r.reused for r in results),
    }


def write_summary(folder: Path, results: list[EvalResult]) -> dict:
    folder = Path(folder)
    write_jsonl(folder / "results.jsonl", results)
    summary = summarise(results)
    (folder / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


# ------------------------------------------------------------------------------ terminal output (rich)

COLUMN_GAP = 2
"""Characters between two table columns (one of padding, one of the borderless separator)."""

NOTE_MIN_WIDTH = 24
"""The note (rule id or first error line) gets a column of its own only when at least this many characters
are left for it; otherwise it is printed under the task id, in the task column."""


def choose_columns(width: int, task_width: int, status_width: int, optional: list[tuple[str, int]]) -> tuple[list[str], bool]:
    """The optional columns that fit in ``width`` characters next to whole task ids and statuses, and whether
    the note gets a column of its own.

    ``optional``: (name, width) from the most to the least useful, ``note`` among them (its width is ignored:
    it wraps, so it needs only ``NOTE_MIN_WIDTH``). Task ids and statuses are never cut: they are what a
    reader looks for; a column that does not fit is left out instead, and a note without a column goes under
    its task id."""
    used = task_width + COLUMN_GAP + status_width
    chosen: list[str] = []
    note_column = False
    for name, column_width in optional:
        need = NOTE_MIN_WIDTH if name == "note" else column_width
        if used + COLUMN_GAP + need > width:
            continue
        used += COLUMN_GAP + need
        if name == "note":
            note_column = True
        else:
            chosen.append(name)
    return chosen, note_column


def _note(r: EvalResult) -> str:
    return r.rule_id or (r.error.splitlines()[0][:100] if r.error.strip() else "")


def _status_text(status: Status) -> Any:
    from rich.text import Text

    return Text(status.value, style="green" if status is Status.CORRECT else "red")


# name -> (header, justify, cell); the optional columns of the results table, most useful first.
_OPTIONAL_COLUMNS: dict[str, tuple[str, str, Callable[[EvalResult], str]]] = {
    "speedup": ("speedup", "right", lambda r: f"{r.speedup:.2f}x" if r.correct else "-"),
    "compile": ("compile", "right", lambda r: f"{r.times.compile:.1f}s" if r.times.compile > 0 else "-"),
    "note": ("note", "left", _note),
    "runtime": ("runtime ms", "right", lambda r: f"{r.runtime_ms:.3f}" if r.correct else "-"),
    "baseline": ("baseline ms", "right", lambda r: f"{r.baseline_ms:.3f}" if r.baseline_ms else "-"),
}


def results_table(results: list[EvalResult], width: int) -> Any:
    """A rich Table of one row per result, laid out for a terminal ``width`` characters wide."""
    from rich import box
    from rich.console import Group
    from rich.padding import Padding
    from rich.table import Table
    from rich.text import Text

    cells = {name: [cell(r) for r in results] for name, (_, _, cell) in _OPTIONAL_COLUMNS.items()}
    if not any(cells["note"]):
        del cells["note"]
    widths = [(name, max([len(_OPTIONAL_COLUMNS[name][0])] + [len(c) for c in column])) for name, column in cells.items()]
    task_width = max([len("task")] + [len(r.task_id) for r in results])
    status_width = max([len("status")] + [len(r.status.value) for r in results])
    chosen, note_column = choose_columns(width, task_width, status_width, widths)

    # No outer border, one space of padding shared between neighbours: columns COLUMN_GAP apart.
    title = f"{len(results)} candidate{'' if len(results) == 1 else 's'}"
    table = Table(title=title, box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1),
                  collapse_padding=True)
    # A separate note column is the other column that wraps: the task column's width is then fixed, so that
    # rich shrinks the note, not the ids. Otherwise the task column is the only one that wraps (its notes) and
    # gets all the room the planned columns leave, at least task_width. fold: an id wider than a whole
    # terminal breaks onto the next line instead of ending in an ellipsis.
    table.add_column("task", overflow="fold", width=task_width if note_column else None)
    table.add_column("status", no_wrap=True)
    for name in chosen:
        header, justify, _ = _OPTIONAL_COLUMNS[name]
        table.add_column(header, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    if note_column:
        table.add_column("note", overflow="fold")
    for i, r in enumerate(results):
        task: Any = Text(r.task_id)
        if "note" in cells and not note_column and cells["note"][i]:
            # Indented under its id, so that a note never reads as the next task (also without colours).
            task = Group(task, Padding(Text(cells["note"][i], style="dim"), (0, 0, 0, 2)))
        row = [task, _status_text(r.status)] + [cells[name][i] for name in chosen]
        if note_column:
            row.append(Text(cells["note"][i]))  # Text: error text is never read as rich markup
        table.add_row(*row)
    return table


def summary_table(summary: dict) -> Any:
    """The figures of ``summarise`` as a two-column grid of short lines."""
    from rich.table import Table

    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column()
    n = summary["candidates"]
    counts = summary["status_counts"]
    grid.add_row("candidates", str(n))
    grid.add_row("correct", f"{counts.get('correct', 0)} of {n} ({summary['correct_share']:.0%})")
    # One status per line: a line such as "3 rule_violation" is never split by wrapping.
    by_count = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    grid.add_row("verdicts", "\n".join(f"{count} {status}" for status, count in by_count) or "-")
    if counts.get("correct", 0):
        grid.add_row("speedup", f"geomean {summary['speedup_geomean']:.3f}x, median {summary['speedup_median']:.3f}x")
    grid.add_row("mean score", f"{summary['mean_score']:.3f}")
    grid.add_row("compile", f"median {summary['compile_s_median']:.1f} s, p90 {summary['compile_s_p90']:.1f} s")
    return grid


def print_summary(results: list[EvalResult], console: Any = None) -> None:
    """The results table and the summary figures, fitted to the terminal's width."""
    from rich.console import Console

    console = console or Console()
    console.print(results_table(results, console.width))
    console.print()
    console.print(summary_table(summarise(results)))


def print_result(r: EvalResult, console: Any = None) -> None:
    """One verdict: the task and status, then one short line per figure."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = console or Console()
    title = Text(r.task_id, style="bold") + Text("  ") + _status_text(r.status)
    if r.rule_id:
        title.append(f"  rule {r.rule_id}")
    console.print(title)
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column(overflow="fold")
    if r.correct:
        grid.add_row("runtime", f"{r.runtime_ms:.4f} ms")
        grid.add_row("baseline", f"{r.baseline_ms:.4f} ms")
        grid.add_row("speedup", f"{r.speedup:.3f}x" + ("  (flagged: re-verified)" if r.flagged_speedup else ""))
        if r.threads:
            grid.add_row("threads", f"{r.threads} (the candidate's OpenMP and the PyTorch eager baseline alike)")
    grid.add_row("score", f"{r.score:.3f}")
    if r.trials_run:
        grid.add_row("trials", f"{r.trials_passed}/{r.trials_run} passed, max abs error {r.max_abs_error:.3g}")
    grid.add_row("time", f"compile {r.times.compile:.1f} s, total {r.times.total:.1f} s")
    for w in r.warnings:
        grid.add_row(Text("warning", style="yellow"), Text(w))
    grid.add_row("feedback", Text(r.feedback))  # Text: the feedback quotes candidate output, never markup
    first_error = _note(r) if not r.rule_id else ""
    if first_error and first_error not in r.feedback:  # e.g. a timeout's feedback does not say which limit
        grid.add_row("error", Text(first_error))
    console.print(grid)


class PhaseProgress:
    """Progress of a batch by phase (baselines, compiling N of M, running N of M), each with its own count and
    time left, so a long compile phase never shows as a bar stuck at zero. Writes to stderr."""

    PHASES = ("baselines", "compiling", "running")

    def __init__(self, console: "Console | None" = None):
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

        self._progress = Progress(TextColumn("{task.description:<10}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                  TextColumn("left"), TimeRemainingColumn(), console=console or Console(stderr=True),
                                  transient=False)
        self._tasks = {name: self._progress.add_task(name, total=0, start=False) for name in self.PHASES}
        self._progress.start()

    def set_total(self, phase: str, total: int) -> None:
        task = self._tasks[phase]
        self._progress.update(task, total=total)
        if total:
            self._progress.start_task(task)

    def add_total(self, phase: str, delta: int) -> None:
        task = self._tasks[phase]
        self._progress.update(task, total=max(0, (self._progress.tasks[task].total or 0) + delta))

    def advance(self, phase: str) -> None:
        task = self._tasks[phase]
        self._progress.start_task(task)
        self._progress.advance(task)

    def close(self) -> None:
        self._progress.stop()
