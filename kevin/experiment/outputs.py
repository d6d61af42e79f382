"""An evaluation run's outputs as files: its report read back, its tables, curves and plots, and several runs compared.

Split from ``evaluate.py`` (which runs the evaluation) because ``kevin compare`` needs only finished runs' files.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path

from kevin.analysis.metrics import RunReport
from kevin.analysis.tables import csv_text
from kevin.experiment.files import write_json
from kevin.records.jsonl import atomic_write_text

__all__ = ["REPORT_FILE", "compare_runs", "correct_shares_from_rollouts", "load_report", "wide_curves", "write_report_files"]

REPORT_FILE = "report.json"


def load_report(run_dir: str | Path) -> RunReport:
    """The report of a finished evaluation run folder (``report.json``)."""
    path = Path(run_dir) / REPORT_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: {run_dir} is not a finished evaluation run (finish it with "
                                "kevin evaluate --resume)")
    data = json.loads(path.read_text(encoding="utf-8"))
    report = RunReport.from_dict(data)
    if "task_correct_share" not in data:  # written before the field existed: read it from the turn records
        report = dataclasses.replace(report, task_correct_share=correct_shares_from_rollouts(Path(run_dir)))
    return report


def correct_shares_from_rollouts(run_dir: Path) -> dict[str, float]:
    """Each task's share of trajectories with a correct kernel, from an evaluation's turn records (``run.json``
    names its rollouts). Empty when the run has no single independent rollout to read it from (a beam's shares are
    those of its last state, which its turn files alone do not give) or its records are gone."""
    from kevin.analysis.metrics import task_correct_shares
    from kevin.analysis.outcomes import outcomes_from_turns
    from kevin.records.rollout import load_turns

    try:
        plans = json.loads((run_dir / "run.json").read_text(encoding="utf-8")).get("rollouts", [])
    except (OSError, ValueError):
        return {}
    if len(plans) != 1 or plans[0].get("select"):
        return {}
    files = sorted((run_dir / "rollouts" / str(plans[0]["name"])).glob("turn_*.jsonl"))
    turns = [t for f in files for t in load_turns(f)]
    return task_correct_shares(outcomes_from_turns(turns)) if turns else {}


def _num(value: float | None) -> str:
    return "" if value is None else f"{value:.6f}"


def wide_curves(report: RunReport) -> dict[str, str]:
    """The curves as DVC plots read them (one x column, one column per metric): ``best_at_k.csv`` (k, then best@k
    of each metric after the last turn) and ``turns/<split>.csv`` per budget split and the run's own size (turn,
    then best@k of each metric with k = the split's trajectories)."""
    names = report.metric_names
    out = {"best_at_k.csv": csv_text(["k", *names], [[m.k, *(_num(m.best[n]) for n in names)] for m in report.by_k])}
    curves = {f"{report.trajectories}x{report.turns}": report.by_turn, **report.splits}
    for split, curve in curves.items():
        out[f"turns/{split}.csv"] = csv_text(["turn", *names], [[m.turn, *(_num(m.best[n]) for n in names)]
                                                                 for m in curve])
    return out


def write_report_files(reports: Sequence[RunReport], out_dir: str | Path, baseline: str | None = None) -> dict[str, Path]:
    """Tables (markdown and CSV; the curves in long form too), plots (PNG) and, for one run, its curves as DVC plots
    read them (``wide_curves``); several runs are put side by side, with the comparison table. Returns name -> path."""
    from kevin.analysis.plots import write_plots
    from kevin.analysis.tables import (
        best_at_k_csv,
        comparison_csv,
        comparison_markdown,
        moved_markdown,
        paired_markdown,
        table1_csv,
        table1_markdown,
        table2_csv,
        table2_markdown,
        turn_curves_csv,
    )

    out = Path(out_dir)
    texts = {
        "tables/table1.md": table1_markdown(reports), "tables/table1.csv": table1_csv(reports),
        "tables/table2.md": table2_markdown(reports), "tables/table2.csv": table2_csv(reports),
        "tables/turn_curves.csv": turn_curves_csv(reports), "tables/best_at_k.csv": best_at_k_csv(reports),
    }
    if len(reports) > 1:
        texts["tables/comparison.md"] = comparison_markdown(reports, baseline)
        texts["tables/comparison.csv"] = comparison_csv(reports, baseline)
        texts["tables/paired.md"] = paired_markdown(reports, baseline)
        texts["tables/moved.md"] = moved_markdown(reports, baseline)
    else:
        texts.update({f"curves/{name}": text for name, text in wide_curves(reports[0]).items()})
    paths = {name: atomic_write_text(out / name, text) for name, text in texts.items()}
    for path in write_plots(reports, out / "plots"):
        paths[f"plots/{path.name}"] = path
    return paths


def compare_runs(run_dirs: Sequence[str | Path], out_dir: str | Path, baseline: str | None = None) -> dict[str, Path]:
    """Finished evaluation runs side by side (e.g. the base model and a checkpoint): their tables, the comparison
    (each run's difference from the baseline run: the first by default) and overlaid plots in ``out_dir``. Runs of
    the same name are told apart by their folder's name."""
    if len(run_dirs) < 2:
        raise ValueError(f"a comparison needs at least two evaluation runs, got {len(run_dirs)}")
    reports = [load_report(d) for d in run_dirs]
    names = [r.name for r in reports]
    if len(set(names)) != len(names):
        reports = [dataclasses.replace(r, name=f"{r.name} ({Path(d).resolve().name})") for r, d in zip(reports, run_dirs)]
    if baseline is not None and baseline not in [r.name for r in reports]:
        raise ValueError(f"baseline {baseline!r} is not one of the runs {[r.name for r in reports]}")
    paths = write_report_files(reports, out_dir, baseline)
    paths["runs"] = write_json(Path(out_dir) / "runs.json", [str(Path(d).resolve()) for d in run_dirs])
    return paths
