"""The learning figures of a training run: per-step rows from the steps' summaries, the first/last window gain with
its bootstrap interval (hand-computed), the plot, and `kevin learning` on a run folder."""

from __future__ import annotations

import json

import pytest


def _summary(step, turns):
    return {"step": step, "turns": [{"turn": i, "kernels": k, "correct": c, "score_mean": s, "return_mean": 0.0}
                                    for i, (k, c, s) in enumerate(turns)]}


def test_rows_weigh_every_kernel_and_keep_each_turn():
    from kevin.analysis.learning import learning_rows

    (row,) = learning_rows([_summary(0, [(4, 1, 0.5), (2, 2, 2.0)])])
    # 6 kernels: (4 * 0.5 + 2 * 2.0) / 6 = 1.0; 3 of 6 correct.
    assert row == {"step": 1, "kernels": 6, "correct": 3, "correct_share": 0.5, "score_mean": 1.0,
                   "score_mean_turn_1": 0.5, "correct_share_turn_1": 0.25,
                   "score_mean_turn_2": 2.0, "correct_share_turn_2": 1.0}


def test_rows_say_how_far_the_update_moved_the_policy():
    from kevin.analysis.learning import learning_rows

    summary = _summary(0, [(2, 1, 0.5)])
    summary["update"] = [{"lr": 1e-4, "approx_kl": 0.0, "entropy": 0.02, "skipped": 0.0},
                         {"lr": 1e-4, "approx_kl": 3e-4, "entropy": 0.04, "skipped": 1.0}]
    (row,) = learning_rows([summary])
    assert row["lr"] == 1e-4 and row["policy_kl"] == 3e-4 and row["skipped_steps"] == 1
    assert row["entropy"] == pytest.approx(0.03)
    (bare,) = learning_rows([_summary(0, [(2, 1, 0.5)])])  # a step without an update: no such columns
    assert "policy_kl" not in bare


def test_the_gain_of_the_last_window_over_the_first_with_its_interval():
    from kevin.analysis.learning import window_gain

    values = [0.0, 0.2, 0.1, 0.5, 0.3, 0.4]
    gain = window_gain(values, 2)
    assert gain.first == pytest.approx(0.1) and gain.last == pytest.approx(0.35)
    assert gain.gain == pytest.approx(0.25)
    # Every redraw of the windows: last in {0.3, 0.35, 0.4}, first in {0.0, 0.1, 0.2}; the difference lies in
    # [0.1, 0.4], and a 90% interval of 2000 draws reaches neither extreme's far side.
    assert 0.1 - 1e-12 <= gain.low <= gain.gain <= gain.high <= 0.4 + 1e-12
    assert gain.learned
    assert window_gain(values, 2) == gain  # seeded

    flat = window_gain([0.3, 0.1, 0.2, 0.1, 0.3, 0.2], 3)
    assert flat.gain == pytest.approx(0.0) and flat.low < 0 < flat.high and not flat.learned
    constant = window_gain([0.5] * 4, 2)
    assert (constant.low, constant.high) == (0.0, 0.0) and not constant.learned
    with pytest.raises(ValueError, match="3 steps are too few to compare the first 2 with the last 2"):
        window_gain([0.1, 0.2, 0.3], 2)


def _drawn(step, *tasks):
    """A step's summary with its tasks' rows: (task, kernels, correct[, score_mean])."""
    rows = [dict(zip(("task", "kernels", "correct", "score_mean"), t)) for t in tasks]
    return {"step": step, "turns": [], "tasks": rows}


def test_each_task_against_itself_at_its_first_and_last_draw():
    from kevin.analysis.learning import task_gain

    # Epoch 1 draws a, b, c; epoch 2 draws b, a (c not yet). Step order, not list order, decides first and last.
    summaries = [_drawn(2, ("b", 4, 4, 1.0), ("a", 4, 2, 0.6)), _drawn(0, ("a", 4, 1, 0.3), ("b", 4, 2, 0.5)),
                 _drawn(1, ("c", 4, 0))]
    share = task_gain(summaries, "correct_share")
    # a: 0.25 -> 0.5, b: 0.5 -> 1.0; c drawn once: left out.
    assert (share.tasks, share.first, share.last) == (2, pytest.approx(0.375), pytest.approx(0.75))
    assert share.gain == pytest.approx(0.375)
    # Every bootstrap mean is a mean of two of the pairs' gains {0.25, 0.5}: inside [0.25, 0.5], so above 0.
    assert 0.25 - 1e-12 <= share.low <= share.high <= 0.5 + 1e-12 and share.learned
    assert task_gain(summaries, "correct_share") == share  # seeded
    score = task_gain(summaries, "score_mean")  # c has no score: it could not count anyway
    assert (score.tasks, score.first, score.last) == (2, pytest.approx(0.4), pytest.approx(0.8))

    mixed = [_drawn(0, ("a", 2, 2), ("b", 2, 0)), _drawn(1, ("a", 2, 0), ("b", 2, 2))]
    flat = task_gain(mixed)  # one task up by 1, the other down by 1
    assert flat.gain == pytest.approx(0.0) and flat.low < 0 < flat.high and not flat.learned
    with pytest.raises(ValueError, match="no task was drawn twice yet"):
        task_gain([_drawn(0, ("a", 2, 1)), _drawn(1, ("b", 2, 1))])
    with pytest.raises(ValueError, match="metric must be"):
        task_gain(summaries, "speed")


def test_kevin_learning_writes_the_table_the_plot_and_the_gain(tmp_path):
    from typer.testing import CliRunner

    from kevin_cli import app

    run = tmp_path / "run"
    for step in range(4):
        folder = run / "steps" / f"step_{step:06d}"
        folder.mkdir(parents=True)
        score = 0.1 * step
        summary = _summary(step, [(2, step % 2, score), (2, 1, score + 0.2)])
        summary["tasks"] = [{"task": "t", "kernels": 4, "correct": step, "score_mean": score}]
        (folder / "summary.json").write_text(json.dumps(summary))
    result = CliRunner().invoke(app, ["learning", str(run), "--window", "2"])
    assert result.exit_code == 0, result.output
    # step means 0.1, 0.2, 0.3, 0.4: first 2 -> 0.15, last 2 -> 0.35
    assert "first 2 steps 0.1500 -> last 2 0.3500: gain +0.2000" in result.output
    saved = json.loads((run / "plots" / "learning.json").read_text())
    assert saved["steps"] == 4 and saved["gain"]["gain"] == pytest.approx(0.2)
    # task t drawn 4 times: correct 0 of 4 -> 3 of 4; score 0.0 -> 0.3.
    assert "correct_share, the same 1 tasks at their first and last draw: 0.0000 -> 0.7500: gain +0.7500" in result.output
    assert saved["per_task"]["score_mean"]["gain"] == pytest.approx(0.3)
    assert (run / "plots" / "learning.png").stat().st_size > 10_000
    lines = (run / "plots" / "learning.csv").read_text().splitlines()
    assert lines[0].startswith("step,kernels,correct,correct_share,score_mean,") and len(lines) == 5
    empty = CliRunner().invoke(app, ["learning", str(tmp_path / "none")])
    assert empty.exit_code != 0 and "holds no finished training step" in empty.output
