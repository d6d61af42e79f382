"""What a training run shows as it goes: a line per step and per turn phase, and a bar while kernels are judged.

An evaluation is named by a label ("turn 2/4", or "turn 2/4, wave 1/2" when waves overlap): with waves several
evaluations are in progress at once, each reporting its verdicts from its own thread.

``Progress`` is the interface (it shows nothing), ``LogProgress`` writes the lines to a logger (a flow run on a
worker), ``RichProgress`` prints them to the terminal with rich (``kevin train``).
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Sequence

from kevin.records.evaluation import EvalResult

__all__ = ["LogProgress", "Progress", "RichProgress"]


class Progress:
    """The events of a training run; each default turns the event into a line for ``line``, which shows nothing."""

    def line(self, text: str) -> None:
        """Show one line (the base shows nothing)."""

    def run_started(self, name: str, first_step: int, steps: int, out_dir: str, resumed: bool) -> None:
        how = f"resumed at step {first_step}" if resumed and first_step else "starting"
        self.line(f"[{name}] {how}: {steps} steps, outputs in {out_dir}")

    def step_started(self, step: int, steps: int, task_ids: Sequence[str]) -> None:
        self.line(f"step {step + 1}/{steps}: {', '.join(task_ids)}")

    def phase(self, step: int, text: str) -> None:
        self.line(f"  {text}")

    def evaluation_started(self, step: int, label: str, total: int) -> None:
        self.line(f"  {label}: judging {total} kernels")

    def verdict(self, result: EvalResult, label: str = "") -> None:
        """One verdict of the evaluation ``label``."""

    def evaluation_finished(self, step: int, label: str) -> None:
        """The evaluation ``label`` is over."""

    def step_finished(self, step: int, lines: Sequence[str]) -> None:
        for text in lines:
            self.line(f"  {text}")


class LogProgress(Progress):
    """Every line to ``logger`` at INFO."""

    def __init__(self, logger: logging.Logger | None = None):
        self.logger = logger or logging.getLogger("kevin.train")

    def line(self, text: str) -> None:
        self.logger.info("%s", text)


class RichProgress(Progress):
    """Lines on the terminal, and a bar per evaluation in progress over the kernels it judges."""

    def __init__(self, console: Any = None):
        from rich.console import Console

        self.console = console or Console(highlight=False)
        self._bar: Any = None
        self._tasks: dict[str, Any] = {}
        self._lock = threading.Lock()

    def line(self, text: str) -> None:
        self.console.print(text, markup=False)

    def step_started(self, step: int, steps: int, task_ids: Sequence[str]) -> None:
        self.console.rule(f"step {step + 1}/{steps}", style="dim")
        self.line(f"tasks: {', '.join(task_ids)}")

    def evaluation_started(self, step: int, label: str, total: int) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
        from rich.progress import Progress as Bar

        with self._lock:
            if self._bar is None:
                self._bar = Bar(TextColumn("  {task.description}: judging"), BarColumn(), MofNCompleteColumn(),
                                TimeElapsedColumn(), TextColumn("{task.fields[last]}"), console=self.console,
                                transient=True)
                self._bar.start()
            elif label in self._tasks:  # the same evaluation started again (a retried task): a fresh bar
                self._bar.remove_task(self._tasks.pop(label))
            self._tasks[label] = self._bar.add_task(label, total=total, last="")

    def verdict(self, result: EvalResult, label: str = "") -> None:
        with self._lock:
            if self._bar is not None and label in self._tasks:
                self._bar.update(self._tasks[label], advance=1, last=result.status.value)

    def evaluation_finished(self, step: int, label: str) -> None:
        with self._lock:
            if self._bar is None or label not in self._tasks:
                return
            self._bar.remove_task(self._tasks.pop(label))
            if not self._tasks:
                self._bar.stop()
                self._bar = None
