"""Plots: the figures hold the expected lines and bars with the report's values, and PNGs are written."""

from __future__ import annotations

import math

import pytest

from kevin.analysis import plots
from kevin.analysis.metrics import AnalysisConfig, analyze_run
from kevin.analysis.outcomes import TaskOutcome, TrajectoryOutcome

T = TrajectoryOutcome.of
F0 = (False, 0.0)
CONFIG = AnalysisConfig(fast_ps=(1.0, 1.5), budget_splits=("1x3", "2x2", "8x1"))

# 3 tasks x 2 trajectories x 3 turns; best speedups per task: P 2.5, Q 0 (none correct), R 1.2
BASE = analyze_run("base", [
    TaskOutcome("P", (T(F0, (True, 2.5), F0), T((True, 1.0), F0, F0))),
    TaskOutcome("Q", (T(F0, F0, F0), T(F0, F0, F0))),
    TaskOutcome("R", (T(F0, F0, (True, 1.2)), T(F0, F0, F0))),
], CONFIG)
# the checkpoint was run on P and S only (so the per-task chart has a task each run lacks)
CKPT = analyze_run("ckpt", [
    TaskOutcome("P", (T((True, 3.0), F0, F0), T(F0, F0, F0))),
    TaskOutcome("S", (T((True, 0.4), F0, F0), T(F0, F0, F0))),
], CONFIG)


def test_best_at_k_figure():
    fig = plots.best_at_k_figure([BASE, CKPT])
    axes = fig.get_axes()
    assert [ax.get_title() for ax in axes] == ["correct: best@k", "perf: best@k", "fast_1: best@k", "fast_1.5: best@k"]
    for ax, metric in zip(axes, ["correct", "perf", "fast_1", "fast_1.5"]):
        lines = ax.get_lines()
        assert len(lines) == 2  # one per run
        for line, report in zip(lines, [BASE, CKPT]):
            assert list(line.get_xdata()) == [1, 2]
            assert list(line.get_ydata()) == [m.best[metric] for m in report.by_k]
    # perf best@2: (2.5 + 0 + 1.2)/3 for base; best@1: P (2.5 + 1.0)/2, Q 0, R 1.2/2 -> (1.75 + 0.6)/3
    assert list(axes[1].get_lines()[0].get_ydata()) == pytest.approx([2.35 / 3, 3.7 / 3])
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["base", "ckpt"]


def test_turn_curves_figure():
    fig = plots.turn_curves_figure([BASE])
    # curves: 1x3 and 2x2 (8x1 does not fit), plus the run's own 2x3
    for ax in fig.get_axes():
        lines = ax.get_lines()
        assert [line.get_label() for line in lines] == ["1x3", "2x2", "2x3"]
        assert [list(line.get_xdata()) for line in lines] == [[1, 2, 3], [1, 2], [1, 2, 3]]
    perf = fig.get_axes()[1].get_lines()
    # 2x3 perf best@2 after turn t: t=1 P 1.0 -> 1/3; t=2 P 2.5 -> 2.5/3; t=3 + R 1.2 -> 3.7/3
    assert list(perf[2].get_ydata()) == pytest.approx([1 / 3, 2.5 / 3, 3.7 / 3])
    # overlay of two runs: the same splits per run, line style tells the runs apart
    fig = plots.turn_curves_figure([BASE, CKPT])
    lines = fig.get_axes()[0].get_lines()
    assert [line.get_label() for line in lines] == ["base 1x3", "base 2x2", "base 2x3", "ckpt 1x3", "ckpt 2x2", "ckpt 2x3"]
    assert {line.get_linestyle() for line in lines[:3]} == {"-"} and {line.get_linestyle() for line in lines[3:]} == {"--"}
    assert lines[0].get_color() == lines[3].get_color()  # same split, same colour


def test_task_speedup_figure():
    ax = plots.task_speedup_figure([BASE]).get_axes()[0]
    bars = ax.patches
    assert len(bars) == 3  # a bar per task
    assert [b.get_height() for b in bars] == [2.5, 1.2, 0.0]  # sorted, largest first
    assert [t.get_text() for t in ax.get_xticklabels()] == ["P", "R", "Q"]
    assert len(ax.get_lines()) == 1 and list(ax.get_lines()[0].get_ydata()) == [1.0, 1.0]  # the 1x line
    ax = plots.task_speedup_figure([BASE, CKPT]).get_axes()[0]
    assert len(ax.patches) == 4 * 2  # tasks P, R, Q, S x two runs
    assert [t.get_text() for t in ax.get_xticklabels()] == ["P", "R", "Q", "S"]
    base_bars, ckpt_bars = ax.patches[:4], ax.patches[4:]
    assert [b.get_height() for b in base_bars][:3] == [2.5, 1.2, 0.0] and math.isnan(base_bars[3].get_height())
    assert [b.get_height() for b in ckpt_bars][::3] == [3.0, 0.4]  # P and S
    assert all(math.isnan(b.get_height()) for b in ckpt_bars[1:3])  # R and Q: not run, no bar


def test_write_plots(tmp_path):
    paths = plots.write_plots([BASE, CKPT], tmp_path / "plots")
    assert [p.name for p in paths] == ["best_at_k.png", "turn_curves.png", "task_speedups.png"]
    for p in paths:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 10_000
    with pytest.raises(ValueError, match="no runs"):
        plots.write_plots([], tmp_path)
