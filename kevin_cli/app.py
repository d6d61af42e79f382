"""The typer app: every command of `kevin ...`, in the order `kevin --help` lists them.

The commands live in their modules by what they work on (kernels, runs, data, reports); they are registered here
and nowhere else, so the help's order and the command names are read in one place.
"""

from __future__ import annotations

from typing import Any, Callable

import typer

from kevin_cli import data, kernels, reports, runs

COMMANDS: tuple[tuple[str, Callable[..., Any]], ...] = (
    ("eval", kernels.eval_cmd),
    ("eval-batch", kernels.eval_batch_cmd),
    ("train", runs.train_cmd),
    ("evaluate", runs.evaluate_cmd),
    ("suite", kernels.suite_cmd),
    ("baseline", kernels.baseline_cmd),
    ("sft", runs.sft_cmd),
    ("report", reports.report_cmd),
    ("learning", reports.learning_cmd),
    ("tasks", data.tasks_cmd),
    ("split", data.split_cmd),
    ("validate", data.validate_cmd),
)
"""(name, function) of every command; the help lists them in this order."""


def build_app() -> typer.Typer:
    """A typer app with every command of ``COMMANDS`` registered."""
    built = typer.Typer(add_completion=False, no_args_is_help=True,
                        help="Kevin: multi-turn RL for fast, correct GPU kernels.")
    for name, command in COMMANDS:
        built.command(name)(command)
    return built


app = build_app()


def main() -> None:
    """The console script `kevin` (pyproject.toml) and `python -m kevin_cli`."""
    app()
