"""What a training run shows as it goes: a line per step and per turn phase, and a bar while kernels are judged.

``Progress`` is the interface (it shows nothing), ``LogProgress`` writes the lines to a logger (a flow run on a
worker), ``RichProgress`` prints them to the terminal with rich (``kevin train``).
"""

from __future__ import annotations

import logging
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

    def evaluation_started(self, step: int, turn: int, total: int) -> None:
        self.line(f"  turn {turn + 1}: judging {total} kernels")

    def verdict(self, result: EvalResult) -> None:
        """One verdict of the evaluation in progress."""

    def evaluation_finished(self, step: int, turn: int) -> None:
        """The evaluation of the turn is over."""

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
    """Lines on the terminal, and a bar over the kernels of a turn while they are judged."""

    def __init__(self, console: Any = None):
        from rich.console import Console

        self.console = console or Console(highlight=False)
        self._bar: Any = None
        self._task: Any = None

    def line(self, text: str) -> None:
        self.console.print(text, markup=False)

    def step_started(self, step: int, steps: int, task_ids: Sequence[str]) -> None:
        self.console.rule(f"step {step + 1}/{steps}", style="dim")
        self.line(f"tasks: {', '.join(task_ids)}")

    def evaluation_started(self, step: int, turn: int, total: int) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
        from rich.progress import Progress as Bar

        self.evaluation_finished(step, turn)
        self._bar = Bar(TextColumn(f"  turn {turn + 1}: judging"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), TextColumn("{task.fields[last]}"), console=self.console, transient=True)
        self._task = self._bar.add_task("judging", total=total, last="")
        self._bar.start()

    def verdict(self, result: EvalResult) -> None:
        if self._bar is not None:
            self._bar.update(self._task, advance=1, last=result.status.value)

    def evaluation_finished(self, step: int, turn: int) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
