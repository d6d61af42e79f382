"""Plots of run reports as PNG files: best@k against k, metrics against turn per budget split, and the
best speedup per task. Passing several reports overlays them (base model vs checkpoint).

Figures are built as ``matplotlib.figure.Figure`` objects, never through pyplot: no global figure
state, no display, no backend to select (saving to PNG renders with Agg). Each ``*_figure`` function
returns the figure so that tests and notebooks can inspect it; ``write_plots`` saves them all.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from matplotlib.figure import Figure

from kevin.analysis.estimators import Metrics
from kevin.analysis.metrics import RunReport
from kevin.analysis.outcomes import fast_name

__all__ = ["best_at_k_figure", "save_figure", "task_speedup_figure", "turn_curves_figure", "write_plots"]

LINESTYLES = ("-", "--", ":", "-.")


def _check(reports: Sequence[RunReport]) -> None:
    if not reports:
        raise ValueError("no runs to plot")


def _default_metrics(reports: Sequence[RunReport]) -> list[str]:
    return ["correct", "perf", *(fast_name(p) for p in reports[0].table_fast_ps)]


def _style_axes(ax, metric: str) -> None:
    """Shares on a fixed 0..1 scale so panels and runs read alike; speedups from 0."""
    if metric == "perf":
        ax.set_ylabel("speedup (x)")
        ax.set_ylim(bottom=0.0)
    else:
        ax.set_ylabel("share of tasks")
        ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)


def _legend(fig: Figure, ax, title: str | None = None) -> None:
    """One legend for the figure, outside the panels (the lines are the same in every panel)."""
    handles, labels = ax.get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside right upper", fontsize="small", title=title)


def _axes_row(count: int, height: float = 3.4, width: float = 4.0) -> tuple[Figure, list]:
    fig = Figure(figsize=(width * count, height), layout="constrained")
    axes = fig.subplots(1, count, squeeze=False)[0]
    return fig, list(axes)


def best_at_k_figure(reports: Sequence[RunReport], metrics: Sequence[str] | None = None) -> Figure:
    """One panel per metric, one line per run: best@k after the last turn for k = 1..m."""
    _check(reports)
    metrics = list(metrics or _default_metrics(reports))
    fig, axes = _axes_row(len(metrics))
    for ax, metric in zip(axes, metrics):
        for r in reports:
            ks = [m.k for m in r.by_k]
            ax.plot(ks, [m.best[metric] for m in r.by_k], marker="o" if len(ks) <= 32 else None, label=r.name)
        ax.set_title(f"{metric}: best@k")
        ax.set_xlabel("k (trajectories)")
        ax.xaxis.get_major_locator().set_params(integer=True)
        _style_axes(ax, metric)
    _legend(fig, axes[0], "run")
    return fig


def _curves(report: RunReport) -> dict[str, tuple[Metrics, ...]]:
    """The report's budget splits, plus its own m x n when that is not one of them."""
    own = f"{report.trajectories}x{report.turns}"
    return {**report.splits, **({} if own in report.splits else {own: report.by_turn})}


def turn_curves_figure(reports: Sequence[RunReport], metrics: Sequence[str] | None = None) -> Figure:
    """One panel per metric; per run and budget split a line of best@k (k = the split's trajectories)
    after turn t = 1..the split's turns. Colour = split, line style = run."""
    _check(reports)
    metrics = list(metrics or _default_metrics(reports))
    fig, axes = _axes_row(len(metrics))
    splits: list[str] = []
    for r in reports:
        splits += [s for s in _curves(r) if s not in splits]
    colours = {s: f"C{i % 10}" for i, s in enumerate(splits)}
    for ax, metric in zip(axes, metrics):
        for i, r in enumerate(reports):
            for split, curve in _curves(r).items():
                label = split if len(reports) == 1 else f"{r.name} {split}"
                ax.plot([m.turn for m in curve], [m.best[metric] for m in curve], marker="o",
                        color=colours[split], linestyle=LINESTYLES[i % len(LINESTYLES)], label=label)
        ax.set_title(f"{metric}: best@k after turn t")
        ax.set_xlabel("turn t")
        ax.xaxis.get_major_locator().set_params(integer=True)
        _style_axes(ax, metric)
    _legend(fig, axes[0], "k x turns")
    return fig


def task_speedup_figure(reports: Sequence[RunReport]) -> Figure:
    """A bar per task (and per run, grouped) of the best speedup over all trajectories and turns (0: no
    correct kernel; no bar: the run lacks the task), tasks sorted by the first run's value, largest first; a dashed line marks 1x."""
    _check(reports)
    tasks = sorted(reports[0].task_best_speedup, key=lambda t: (-reports[0].task_best_speedup[t], t))
    for r in reports[1:]:
        tasks += sorted(t for t in r.task_best_speedup if t not in tasks)
    width = 0.8 / len(reports)
    fig = Figure(figsize=(min(40.0, max(6.0, 0.3 * len(tasks) * len(reports) + 2)), 4.0), layout="constrained")
    ax = fig.subplots()
    for i, r in enumerate(reports):
        xs = [j + (i - (len(reports) - 1) / 2) * width for j in range(len(tasks))]
        # A task the run lacks gets an empty (NaN) bar, not a 0 that would read as "no correct kernel".
        ax.bar(xs, [r.task_best_speedup.get(t, math.nan) for t in tasks], width=width, label=r.name)
    ax.axhline(1.0, color="black", linestyle="--", linewidth=0.8)
    ax.set_xticks(range(len(tasks)), tasks, rotation=90, fontsize="small")
    ax.set_ylabel("best speedup (x)")
    ax.set_title("best correct kernel per task")
    ax.legend(fontsize="small")
    return fig


def save_figure(fig: Figure, path: str | Path) -> Path:
    """Write a figure as PNG (parents created)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", dpi=120)
    return path


def write_plots(reports: Sequence[RunReport], out_dir: str | Path) -> list[Path]:
    """All plots of these runs (overlaid when several) as PNG files in ``out_dir``; returns their paths."""
    out = Path(out_dir)
    return [
        save_figure(best_at_k_figure(reports), out / "best_at_k.png"),
        save_figure(turn_curves_figure(reports), out / "turn_curves.png"),
        save_figure(task_speedup_figure(reports), out / "task_speedups.png"),
    ]
