"""The data commands: list a suite's tasks (`tasks`), split it into train and eval tasks (`split`) and run the data
checks over a split and rollout records (`validate`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from kevin_cli.common import die


def tasks_cmd(source: str = typer.Option("bundled", help="'bundled' or the path of a KernelBench checkout")) -> None:
    """List the tasks of the bundled suite or of a KernelBench checkout."""
    from kevin.tasks import TaskError, load_tasks

    try:
        found = load_tasks(source)
    except (TaskError, FileNotFoundError) as exc:
        die(str(exc))
    for task in found:
        profiles = ",".join(sorted(task.profiles)) or "-"
        typer.echo(f"{task.task_id}\tprofiles={profiles}")
    typer.echo(f"{len(found)} tasks", err=True)


def split_cmd(
    out: Path = typer.Option(..., help="where to write the split (JSON), e.g. data/splits/bundled.json"),
    source: str = typer.Option("", help="'bundled' or the path of a KernelBench checkout (default: params.yaml, "
                                        "else bundled)"),
    params: Optional[Path] = typer.Option(None, help="params.yaml to read the splits section from"),
) -> None:
    """Split a task suite into train and eval tasks (seeded, stratified by level, stable across re-runs)."""
    from kevin.config import read_params
    from kevin.tasks import SplitConfig, TaskError, make_split, write_split

    try:
        section = dict(read_params(params).get("splits", {}) or {})
        if source:
            section["source"] = source
        config = SplitConfig.from_dict(section)
        split = make_split(config)
    except (TaskError, FileNotFoundError, ValueError) as exc:
        die(str(exc))
    write_split(out, split)
    counts = split.counts()
    for name in ("train", "eval"):
        per_level = ", ".join(f"level {level}: {n}" for level, n in counts[name].items())
        typer.echo(f"{name}: {sum(counts[name].values())} tasks ({per_level})")
    typer.echo(f"split of {config.source!r} (seed {config.seed}) written to {out}")


def validate_cmd(
    splits: Optional[Path] = typer.Option(None, help="a split file written by `split`"),
    rollouts: Optional[list[Path]] = typer.Option(
        None, help="a JSONL file of rollout turns, or a folder: each folder below it holding turn_*.jsonl files (a "
                   "step's rollout/, an evaluation's rollouts/<split>/) is checked as one batch (repeatable)"),
    source: str = typer.Option("", help="load the split's tasks from here instead of the source it records"),
    report: Optional[Path] = typer.Option(None, help="also write the reports here as JSON"),
    max_rows: int = typer.Option(20, help="failing rows shown per expectation"),
) -> None:
    """Run the data checks; exit 1 with a report of every failed expectation and its rows."""
    from kevin.datachecks import check_rollout_batch, check_split, render_reports, rollout_batches
    from kevin.tasks import TaskError, read_split

    if splits is None and not rollouts:
        die("give --splits FILE and/or --rollouts FILE.jsonl|FOLDER")
    reports = []
    try:
        if splits is not None:
            reports.append(check_split(read_split(splits), source or None))
        for path in rollouts or []:
            reports += [check_rollout_batch(name, files) for name, files in rollout_batches(path)]
    except (TaskError, FileNotFoundError, ValueError) as exc:
        die(str(exc))
    if report is not None:
        report.parent.mkdir(parents=True, exist_ok=True)
        report.write_text(json.dumps([r.to_dict() for r in reports], indent=1) + "\n")
    failed = [r for r in reports if not r.success]
    if len(reports) > 3:  # many batches (a run's steps): the failures in full, the rest counted
        typer.echo(render_reports(failed, max_rows) if failed else "")
        typer.echo(f"{len(reports) - len(failed)} of {len(reports)} batches passed")
    else:
        typer.echo(render_reports(reports, max_rows))
    if failed:
        raise typer.Exit(1)
