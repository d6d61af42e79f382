"""The learning figures of a training run: per-step rows from the steps' summaries, the first/last window gain with
its bootstrap interval (hand-computed), the plot, and `kevin learning` on a run folder."""

from __future__ import annotations

import json
import struct

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


def test_each_draw_against_the_first_over_the_tasks_drawn_that_often():
    from kevin.analysis.learning import draw_gains, task_gain

    # a: 1, 3, 3 of 4 correct; b: 2, 4 of 4; c: 0, 0, 1, 2 of 4; d drawn once.
    summaries = [_drawn(0, ("a", 4, 1), ("b", 4, 2)), _drawn(1, ("c", 4, 0), ("d", 4, 4)),
                 _drawn(2, ("a", 4, 3), ("c", 4, 0)), _drawn(3, ("b", 4, 4)), _drawn(4, ("a", 4, 3), ("c", 4, 1)),
                 _drawn(5, ("c", 4, 2))]
    second, third, fourth = draw_gains(summaries)
    # Second draw, a b c: first (0.25 + 0.5 + 0) / 3 = 0.25, second (0.75 + 1 + 0) / 3 = 0.5833.
    assert (second.draw, second.tasks, second.first) == (2, 3, pytest.approx(0.25))
    assert second.last == pytest.approx(1.75 / 3)
    # Third draw, a and c: first 0.125, third (0.75 + 0.25) / 2 = 0.5; gains 0.5 and 0.25, so every bootstrap mean
    # lies in [0.25, 0.5].
    assert (third.tasks, third.first, third.last) == (2, pytest.approx(0.125), pytest.approx(0.5))
    assert 0.25 - 1e-12 <= third.low <= third.high <= 0.5 + 1e-12 and third.learned
    # Fourth draw, c alone: 0 -> 0.5, the interval a point.
    assert (fourth.tasks, fourth.gain, fourth.low, fourth.high) == (1, 0.5, 0.5, 0.5)
    # task_gain pairs first with last, whatever the draw: a 0.25 -> 0.75, b 0.5 -> 1, c 0 -> 0.5.
    assert task_gain(summaries).last == pytest.approx(0.75)
    scores = draw_gains([_drawn(0, ("a", 4, 1, 0.2)), _drawn(1, ("a", 4, 2, 0.6))], "score_mean")
    assert [(g.draw, g.first, g.last) for g in scores] == [(2, 0.2, 0.6)]
    assert draw_gains([_drawn(0, ("a", 4, 1))]) == []
    assert draw_gains(summaries, "score_mean") == []  # no score per task in these rows: nothing to pair
    with pytest.raises(ValueError, match="metric must be"):
        draw_gains(summaries, "speed")


def _kernel(step, turn, task, status, score=0.0):
    return {"step": step, "turn": turn, "task_id": task, "status": status, "score": score}


def test_one_turn_of_each_task_against_itself():
    from kevin.analysis.learning import turn_task_gain, turn_task_visits

    # Task a: turn 1 correct 2 of 2 at step 0, 1 of 2 at step 3; turn 2 parse errors 2 of 2 -> 0 of 2.
    # Task b: turn 1 correct 1 of 2 -> 0 of 2 (step 1 -> step 2); turn 2 parse errors 1 of 2 -> 1 of 2.
    verdicts = [_kernel(3, 0, "a", "correct", 1.2), _kernel(3, 0, "a", "compile_error"),
                _kernel(0, 0, "a", "correct", 0.8), _kernel(0, 0, "a", "correct", 0.4),
                _kernel(0, 1, "a", "parse_error"), _kernel(0, 1, "a", "parse_error"),
                _kernel(3, 1, "a", "correct", 0.5), _kernel(3, 1, "a", "incorrect"),
                _kernel(1, 0, "b", "correct", 0.3), _kernel(1, 0, "b", "runtime_error"),
                _kernel(2, 0, "b", "incorrect"), _kernel(2, 0, "b", "parse_error"),
                _kernel(1, 1, "b", "parse_error"), _kernel(1, 1, "b", "correct", 0.6),
                _kernel(2, 1, "b", "parse_error"), _kernel(2, 1, "b", "correct", 0.9),
                _kernel(4, 0, "c", "correct", 1.0)]  # c drawn once: never paired
    assert turn_task_visits(verdicts, 1, "correct_share") == {"a": [1.0, 0.5], "b": [0.5, 0.0], "c": [1.0]}
    assert turn_task_visits(verdicts, 1, "score_mean") == {"a": [pytest.approx(0.6), pytest.approx(0.6)],
                                                           "b": [pytest.approx(0.15), 0.0], "c": [1.0]}
    first = turn_task_gain(verdicts, 1, "correct_share")
    # a: 1.0 -> 0.5, b: 0.5 -> 0.0: both fell by 0.5, so every bootstrap mean is -0.5.
    assert (first.turn, first.tasks, first.first, first.last) == (1, 2, 0.75, 0.25)
    assert (first.low, first.high) == (pytest.approx(-0.5), pytest.approx(-0.5))
    assert first.verdict == "a fall beyond the noise" and not first.learned
    parse = turn_task_gain(verdicts, 2, "parse_error_share")
    # a: 1.0 -> 0.0, b: 0.5 -> 0.5: mean 0.75 -> 0.25; the bootstrap means lie in [-1, 0].
    assert (parse.first, parse.last, parse.gain) == (0.75, 0.25, -0.5)
    assert -1.0 <= parse.low <= parse.high <= 0.0 and parse.verdict != "a rise above the noise"
    second = turn_task_gain(verdicts, 2, "score_mean")
    # a: 0.0 -> (0.5 + 0) / 2, b: (0 + 0.6) / 2 -> (0 + 0.9) / 2.
    assert (second.first, second.last) == (pytest.approx(0.15), pytest.approx(0.35))
    with pytest.raises(ValueError, match="metric must be one of"):
        turn_task_gain(verdicts, 1, "speedup")
    with pytest.raises(ValueError, match="no task was drawn twice yet"):
        turn_task_gain(verdicts[-1:], 1)


def test_each_task_of_the_run_against_the_model_it_started_from():
    from kevin.analysis.learning import start_gain

    # The start's evaluation (one step, no turn: as `kevin evaluate` writes them): a correct 2 of 4, b 0 of 4,
    # d (never drawn by the run) 4 of 4.
    start = [{"task_id": "a", "status": s, "score": 0.5 if s == "correct" else 0.0}
             for s in ("correct", "correct", "incorrect", "compile_error")]
    start += [{"task_id": "b", "status": "incorrect", "score": 0.0}] * 4
    start += [{"task_id": "d", "status": "correct", "score": 1.0}] * 4
    # The run: a at step 0 (2 of 2 correct, turn 2 ignored) and step 3 (0 of 2); b at step 1 (1 of 2); c unknown.
    run = [_kernel(0, 0, "a", "correct", 0.6), _kernel(0, 0, "a", "correct", 0.8), _kernel(0, 1, "a", "incorrect"),
           _kernel(3, 0, "a", "incorrect"), _kernel(3, 0, "a", "runtime_error"),
           _kernel(1, 0, "b", "correct", 0.4), _kernel(1, 0, "b", "parse_error"), _kernel(2, 0, "c", "correct", 1.0)]
    first = start_gain(start, run, "correct_share", "first")
    # a: 0.5 -> 1.0, b: 0.0 -> 0.5: both +0.5, so every bootstrap mean is +0.5.
    assert (first.tasks, first.first, first.last, first.at) == (2, 0.25, 0.75, "first")
    assert (first.low, first.high, first.verdict) == (0.5, 0.5, "a rise above the noise")
    last = start_gain(start, run, "correct_share", "last")
    # a: 0.5 -> 0.0 (its step-3 draw), b: 0.0 -> 0.5 (drawn once: its last draw is its first).
    assert (last.first, last.last, last.gain) == (0.25, 0.25, 0.0) and last.low == -0.5 and last.high == 0.5
    score = start_gain(start, run, "score_mean", "first")
    # a: (0.5 + 0.5) / 4 = 0.25 -> 0.7, b: 0 -> 0.2.
    assert (score.first, score.last) == (pytest.approx(0.125), pytest.approx(0.45))
    with pytest.raises(ValueError, match="none of the run's 1 tasks is among the evaluation's 3"):
        start_gain(start, run[-1:])
    with pytest.raises(ValueError, match="at must be first or last"):
        start_gain(start, run, at="middle")


def test_every_draw_against_the_start_by_windows_of_steps():
    from kevin.analysis.learning import start_windows

    # The start: a correct 2 of 4, b 0 of 4. The run's first turns: a 2 of 2 at step 0, b 1 of 2 at step 1, a 0 of 2
    # at step 2, c (not evaluated at the start) at step 3; second turns are not counted.
    start = [{"task_id": "a", "status": s, "score": 0.0} for s in ("correct", "correct", "incorrect", "incorrect")]
    start += [{"task_id": "b", "status": "incorrect", "score": 0.0}] * 4
    run = [_kernel(0, 0, "a", "correct"), _kernel(0, 0, "a", "correct"), _kernel(0, 1, "a", "incorrect"),
           _kernel(1, 0, "b", "correct"), _kernel(1, 0, "b", "incorrect"),
           _kernel(2, 0, "a", "incorrect"), _kernel(2, 0, "a", "incorrect"), _kernel(3, 0, "c", "correct")]
    first, second = start_windows(start, run, window=2)
    # Steps 1-2: a 0.5 -> 1.0 and b 0.0 -> 0.5, both +0.5, so every redraw's mean is +0.5.
    assert (first.first_step, first.last_step, first.pairs) == (1, 2, 2)
    assert (first.first, first.last, first.low, first.high) == (0.25, 0.75, 0.5, 0.5)
    assert first.verdict == "a rise above the noise" and first.metric == "correct_share"
    # Step 3: a 0.5 -> 0.0; step 4 drew only c, which the start never saw, so no window holds it.
    assert (second.first_step, second.last_step, second.pairs, second.gain) == (3, 3, 1, -0.5)
    # One window of every step: the three draws' means, 1/3 -> 1/2.
    (whole,) = start_windows(start, run, window=10)
    assert (whole.first, whole.last, whole.pairs) == (pytest.approx(1 / 3), pytest.approx(0.5), 3)
    # Two evaluations of the start pool their kernels: a 2 of 4 and 4 of 4 is 6 of 8.
    again = [{"task_id": "a", "status": "correct", "score": 0.0}] * 4
    assert start_windows(start + again, run, window=1)[0].first == 0.75
    assert start_windows(start, run, "score_mean", window=1)[0].last == 0.0
    with pytest.raises(ValueError, match="window must be at least 1 step"):
        start_windows(start, run, window=0)
    with pytest.raises(ValueError, match="no task the run drew is among the evaluation's 2"):
        start_windows(start, run[-1:])


def test_kevin_learning_compares_the_run_with_the_start_s_evaluation(tmp_path):
    from typer.testing import CliRunner

    from kevin_cli import app

    run = tmp_path / "run"
    for step, (task, status) in enumerate([("a", "correct"), ("b", "incorrect")]):
        folder = run / "steps" / f"step_{step:06d}"
        wave = folder / "rollout" / "wave_0"
        wave.mkdir(parents=True)
        (folder / "summary.json").write_text(json.dumps(_summary(step, [(1, int(status == "correct"), 0.5)])))
        verdict = {"task_id": task, "status": status, "score": 0.5 if status == "correct" else 0.0,
                   "runtime_ms": 0.5 if status == "correct" else 0.0, "timing": {"reported_ms": 0.4}}
        (wave / "verdicts_000.jsonl").write_text(json.dumps(verdict) + "\n")
    start = tmp_path / "start-eval"
    (start / "rollouts" / "4x1").mkdir(parents=True)
    (start / "rollouts" / "4x1" / "verdicts_000.jsonl").write_text("".join(
        json.dumps({"task_id": t, "status": s, "score": 0.0}) + "\n" for t, s in
        [("a", "incorrect"), ("a", "incorrect"), ("b", "correct"), ("b", "incorrect")]))
    result = CliRunner().invoke(app, ["learning", str(run), "--window", "1", "--start", str(start)])
    assert result.exit_code == 0, result.output
    # a: 0 -> 1, b: 0.5 -> 0; each task drawn once, so the last draw is not shown again.
    assert ("correct_share, first turn, the start (start-eval) -> the run at each task's first draw, 2 tasks: "
            "0.2500 -> 0.5000: gain +0.2500") in result.output
    assert "last draw" not in result.output
    assert "the score's floor: 1 of 1 correct kernels judged here were scored slower than they reported, median " \
        "25.0%, at most 25.0%" in result.output
    # Every draw against the start by windows of steps: one window of both steps, 0.25 -> 0.5.
    assert "every draw against the start on the same task, by 10 steps:\n  steps 1-2, 2 draws: 0.2500 -> 0.5000: " \
        "gain +0.2500" in result.output
    saved = json.loads((run / "plots" / "learning.json").read_text())["against_start"]
    assert sorted(saved) == ["correct_share_first", "correct_share_windows", "score_mean_first"]
    assert saved["correct_share_first"]["tasks"] == 2
    assert [(w["first_step"], w["last_step"], w["pairs"]) for w in saved["correct_share_windows"]] == [(1, 2, 2)]
    # A repeat of the start's evaluation pools with the first: b's 1 of 2 and 2 of 2 give 3 of 4 for b, so the start's
    # mean is (0 + 0.75) / 2; with windows of one step each draw is a window of its own; the plot gains a panel.
    repeat = tmp_path / "start-eval-seed1"
    (repeat / "rollouts" / "4x1").mkdir(parents=True)
    (repeat / "rollouts" / "4x1" / "verdicts_000.jsonl").write_text("".join(
        json.dumps({"task_id": t, "status": s, "score": 0.0}) + "\n" for t, s in [("b", "correct"), ("b", "correct")]))
    pooled = CliRunner().invoke(app, ["learning", str(run), "--window", "1", "--start", str(start), "--start",
                                      str(repeat), "--start-window", "1"])
    assert pooled.exit_code == 0, pooled.output
    assert "the start (start-eval + start-eval-seed1) -> the run at each task's first draw, 2 tasks: 0.3750 -> " \
        "0.5000" in pooled.output
    assert "  steps 1-1, 1 draws: 0.0000 -> 1.0000" in pooled.output and "  steps 2-2, 1 draws: 0.7500 -> 0.0000" \
        in pooled.output
    import struct

    # four panels of 550 pixels: score, correct share, the answers cut off or unparsed, and the windows against the start
    assert struct.unpack(">II", (run / "plots" / "learning.png").read_bytes()[16:24])[0] == 2200
    bad = CliRunner().invoke(app, ["learning", str(run), "--start", str(start), "--start-window", "0"])
    # refused before anything is read or printed
    assert bad.exit_code == 2 and "--start-window" in bad.output and "the start (" not in bad.output
    missing = CliRunner().invoke(app, ["learning", str(run), "--start", str(tmp_path / "nothing")])
    assert missing.exit_code != 0 and "holds no judged kernel of turn 1" in missing.output


def test_what_the_score_s_floor_cost_the_correct_kernels():
    from kevin.analysis.learning import floor_raises

    def judged(status, runtime, reported, reused=False):
        return {"status": status, "runtime_ms": runtime, "reused": reused, "timing": {"reported_ms": reported}}

    verdicts = [judged("correct", 1.1, 1.0), judged("correct", 2.0, 2.0), judged("correct", 0.5, 0.2, reused=True),
                judged("incorrect", 0.0, 0.0), {"status": "correct", "runtime_ms": 3.0}]  # the last: no figures
    # Counted: +10% and 0% (the reused repeat, the failing kernel and the old record are not).
    assert floor_raises(verdicts) == {"kernels": 2, "raised": 1, "median_raise": pytest.approx(0.05),
                                      "max_raise": pytest.approx(0.1)}
    assert floor_raises(verdicts[2:]) is None
    three = floor_raises([judged("correct", 1.5, 1.0), *verdicts[:2]])
    assert three["median_raise"] == pytest.approx(0.1) and three["raised"] == 2


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
    # and draw by draw: 1, 2 and 3 of 4 correct at the second, third and fourth draw.
    assert "correct_share, the 1 tasks drawn 3 times or more, first -> draw 3: 0.0000 -> 0.5000: gain +0.5000" \
        in result.output
    assert [(g["draw"], g["last"]) for g in saved["per_task_by_draw"]["correct_share"]] == [
        (2, 0.25), (3, 0.5), (4, 0.75)]
    assert (run / "plots" / "learning.png").stat().st_size > 10_000
    # Three panels of 5 inches at 110 dpi: score, correct share, and the by-draw gains (no rollouts: no answers panel).
    assert struct.unpack(">II", (run / "plots" / "learning.png").read_bytes()[16:24]) == (1650, 462)
    assert saved["per_task_turn"] == {}  # no rollouts in this run folder: nothing per turn
    lines = (run / "plots" / "learning.csv").read_text().splitlines()
    assert lines[0].startswith("step,kernels,correct,correct_share,score_mean,") and len(lines) == 5
    empty = CliRunner().invoke(app, ["learning", str(tmp_path / "none")])
    assert empty.exit_code != 0 and "holds no finished training step" in empty.output


def test_kevin_learning_reads_each_turn_from_the_rollouts_it_still_holds(tmp_path):
    from typer.testing import CliRunner

    from kevin_cli import app

    run = tmp_path / "run"
    for step, (t1, t2) in enumerate([("correct", "parse_error"), ("correct", "correct"), ("incorrect", "correct")]):
        folder = run / "steps" / f"step_{step:06d}"
        folder.mkdir(parents=True)
        (folder / "summary.json").write_text(json.dumps(_summary(step, [(1, int(t1 == "correct"), 0.5)])))
        if step == 1:
            continue  # this step's rollouts stayed on another machine
        wave = folder / "rollout" / "wave_0"
        wave.mkdir(parents=True)
        for turn, status in enumerate((t1, t2)):
            verdict = json.dumps({"task_id": "t", "status": status, "score": 1.0 if status == "correct" else 0.0})
            (wave / f"verdicts_{turn:03d}.jsonl").write_text(verdict + "\n" + ('{"task_id": "t", "sta' if turn else ""))
    result = CliRunner().invoke(app, ["learning", str(run), "--window", "1"])
    assert result.exit_code == 0, result.output
    assert "the judged kernels of 2 of 3 steps are here" in result.output
    assert "unfinished step" not in result.output
    # Steps 0 and 2 (the cut-off line skipped): turn 1 correct 1 -> 0, turn 2 correct 0 -> 1.
    assert "turn 1 correct_share, the same 1 tasks at their first and last draw: 1.0000 -> 0.0000" in result.output
    assert "turn 2 parse_error_share, the same 1 tasks at their first and last draw: 1.0000 -> 0.0000" in result.output
    saved = json.loads((run / "plots" / "learning.json").read_text())["per_task_turn"]
    assert saved["turn_2/correct_share"]["gain"] == 1.0 and saved["turn_1/correct_share"]["verdict"] == (
        "a fall beyond the noise")
    # One kernel a group: turn 1 correct at step 0, incorrect at step 2; turn 2 the other way round.
    assert "turn 1: 2 groups: 1 / 0 (0.00) / 1; at its tasks' correct rates, groups of 4 / 8 / 16 would be mixed in " \
        "0.88 / 0.99 / 1.00" in result.output  # one task, correct half the time: p 0.5 for both its groups
    groups = json.loads((run / "plots" / "learning.json").read_text())["groups"]
    assert groups["2"] == {"groups": 2, "none_correct": 1, "mixed": 0, "all_correct": 1,
                           "mixed_share_at": {"4": 0.875, "8": pytest.approx(1 - 2 * 0.5 ** 8),
                                              "16": pytest.approx(1 - 2 * 0.5 ** 16)}}
    # Step 4 was stopped after its first turn was judged: no summary, its verdicts alone; they count, and it is said.
    wave = run / "steps" / "step_000003" / "rollout" / "wave_0"
    wave.mkdir(parents=True)
    (wave / "verdicts_000.jsonl").write_text(json.dumps({"task_id": "t", "status": "correct", "score": 1.0}) + "\n")
    again = CliRunner().invoke(app, ["learning", str(run), "--window", "1"])
    assert "the judged kernels of 2 of 3 steps are here" in again.output
    assert "with the judged kernels of unfinished step 4 (a resume redoes it from them)" in again.output
    # turn 1 of task t: correct at step 1, incorrect at step 3, correct at the unfinished step 4 (its last draw)
    assert "turn 1 correct_share, the same 1 tasks at their first and last draw: 1.0000 -> 1.0000" in again.output


def test_each_turn_step_by_step_with_the_answers_cut_off():
    from kevin.analysis.learning import turn_step_rows, turn_task_gain, turn_task_visits

    def cut(step, turn, task, status, truncated, score=0.0):
        return {**_kernel(step, turn, task, status, score), "truncated": truncated}

    verdicts = [cut(0, 0, "a", "correct", False, 0.8), cut(0, 0, "a", "incorrect", True),
                cut(0, 1, "a", "parse_error", True), cut(0, 1, "a", "correct", True, 0.4),
                cut(2, 1, "a", "correct", False, 0.6), cut(2, 1, "a", "correct", True, 0.2),
                _kernel(2, 0, "a", "correct", 1.0)]  # a verdict whose turn record was never written
    rows = turn_step_rows(verdicts)
    assert [r["step"] for r in rows] == [1, 3]
    # step 0 turn 1: correct 1 of 2, cut off 1 of 2, score (0.8 + 0) / 2; turn 2: parse error 1 of 2, both cut off.
    assert rows[0] == {"step": 1, "kernels_turn_1": 2, "correct_share_turn_1": 0.5, "parse_error_share_turn_1": 0.0,
                       "truncated_share_turn_1": 0.5, "score_mean_turn_1": pytest.approx(0.4),
                       "kernels_turn_2": 2, "correct_share_turn_2": 0.5, "parse_error_share_turn_2": 0.5,
                       "truncated_share_turn_2": 1.0, "score_mean_turn_2": pytest.approx(0.2)}
    # step 2 turn 1: the one kernel without a record has no cut-off share; turn 2: 1 of 2 cut off.
    assert "truncated_share_turn_1" not in rows[1] and rows[1]["correct_share_turn_1"] == 1.0
    assert rows[1]["truncated_share_turn_2"] == 0.5
    assert turn_task_visits(verdicts, 2, "truncated_share") == {"a": [1.0, 0.5]}
    assert turn_task_visits(verdicts, 1, "truncated_share") == {"a": [0.5]}  # step 2's turn 1 is unknown
    gain = turn_task_gain(verdicts, 2, "truncated_share")
    assert (gain.first, gain.last, gain.low, gain.high) == (1.0, 0.5, -0.5, -0.5)


def test_the_windows_say_whether_they_drew_the_same_tasks():
    from kevin.analysis.learning import window_tasks

    steps = [_drawn(0, ("a", 1, 1), ("b", 1, 0)), _drawn(1, ("c", 1, 1)), _drawn(2, ("a", 1, 0)),
             _drawn(3, ("d", 1, 1), ("a", 1, 1))]
    assert window_tasks(steps, 2) == (3, 2, 1)  # first {a, b, c}, last {a, d}: a in both
    assert window_tasks(steps[:2], 1) == (2, 1, 0)


def test_kevin_learning_shows_each_turns_answers_cut_off(tmp_path):
    from typer.testing import CliRunner

    from kevin_cli import app

    run = tmp_path / "run"
    for step, (cut_1, cut_2) in enumerate([(False, True), (False, False)]):
        folder = run / "steps" / f"step_{step:06d}"
        summary = _summary(step, [(1, 1, 0.5), (1, 1, 0.5)])
        summary["tasks"] = [{"task": f"t{step}", "kernels": 2, "correct": 2, "score_mean": 0.5}]
        wave = folder / "rollout" / "wave_0"
        wave.mkdir(parents=True)
        (folder / "summary.json").write_text(json.dumps(summary))
        for turn, truncated in enumerate((cut_1, cut_2)):
            result = {"task_id": f"t{step}", "status": "correct", "score": 0.5}
            (wave / f"verdicts_{turn:03d}.jsonl").write_text(json.dumps(result) + "\n")
            record = {"task_id": f"t{step}", "trajectory": 0, "turn": turn, "truncated": truncated, "result": result}
            (wave / f"turn_{turn:03d}.jsonl").write_text(json.dumps(record) + "\n")
    result = CliRunner().invoke(app, ["learning", str(run), "--window", "1"])
    assert result.exit_code == 0, result.output
    assert "step   1  t1 0.00/0.00  t2 1.00/0.00" in result.output
    assert "step   2  t1 0.00/0.00  t2 0.00/0.00" in result.output
    assert "the windows drew different tasks (first 1, last 1, 0 in both)" in result.output
    lines = (run / "plots" / "learning.csv").read_text().splitlines()
    header = lines[0].split(",")
    assert lines[1].split(",")[header.index("truncated_share_turn_2")] == "1.0"


def test_a_step_whose_rollout_is_gone_is_read_from_its_kernels_file(tmp_path):
    from typer.testing import CliRunner

    from kevin.pipeline import KERNELS_FILE, kernel_rows, read_step_verdicts
    from kevin.records.evaluation import EvalResult, Status
    from kevin.records.rollout import Trajectory, Turn
    from kevin_cli import app

    def judged(turn: int, status: Status, truncated: bool) -> Turn:
        return Turn(task_id="t", trajectory=0, turn=turn, truncated=truncated,
                    result=EvalResult(task_id="t", candidate_id=f"c{turn}", status=status, score=0.5 * (turn == 0)))

    # Turn records out of order in the trajectory: the file holds them by turn.
    rows = kernel_rows([Trajectory("t", 0, [judged(1, Status.PARSE_ERROR, True), judged(0, Status.CORRECT, False)])])
    assert [(r["turn"], r["trajectory"], r["status"], r["truncated"], r["score"]) for r in rows] == [
        (0, 0, "correct", False, 0.5), (1, 0, "parse_error", True, 0.0)]
    run = tmp_path / "run"
    for step in (0, 1):
        folder = run / "steps" / f"step_{step:06d}"
        folder.mkdir(parents=True)
        summary = _summary(step, [(2, 1, 0.25)])
        summary["tasks"] = [{"task": "t", "kernels": 2, "correct": 1, "score_mean": 0.25}]
        (folder / "summary.json").write_text(json.dumps(summary))
        (folder / KERNELS_FILE).write_text("".join(json.dumps(r) + "\n" for r in rows))
    # Step 1 still holds its rollout, which is read in place of its kernels file (turn 2 not cut off there).
    wave = run / "steps" / "step_000001" / "rollout" / "wave_0"
    wave.mkdir(parents=True)
    for row in rows:
        result = {k: v for k, v in row.items() if k not in ("trajectory", "turn", "truncated")}
        (wave / f"verdicts_{row['turn']:03d}.jsonl").write_text(json.dumps(result) + "\n")
        record = {"task_id": "t", "trajectory": 0, "turn": row["turn"], "truncated": False, "result": result}
        (wave / f"turn_{row['turn']:03d}.jsonl").write_text(json.dumps(record) + "\n")
    verdicts = read_step_verdicts(run)
    assert [(v["step"], v["turn"], v["truncated"]) for v in verdicts] == [(0, 0, False), (0, 1, True), (1, 0, False),
                                                                          (1, 1, False)]
    assert [v["trajectory"] for v in verdicts] == [0, 0, 0, 0]  # from the kernels file and from the turn records
    result = CliRunner().invoke(app, ["learning", str(run), "--window", "1"])
    assert result.exit_code == 0, result.output
    # Both steps: a correct first turn, then a parse error (no kernel, so nothing repeated).
    assert ("turn 2 after a failing turn 1: 0 kernels, 0 (0.00) a kernel already judged, byte for byte; 0 (0.00) "
            "correct. After a correct turn 1: 2 kernels, 0 already judged, 2 failing") in result.output
    assert json.loads((run / "plots" / "learning.json").read_text())["followups"] == {"2": {
        "after_failure": 0, "repeated_after_failure": 0, "fixed": 0, "after_correct": 2, "repeated_after_correct": 0,
        "lost": 2}}
    assert "rests barren tasks" not in result.output  # no config.yaml: nothing said
    (run / "config.yaml").write_text("experiment:\n  name: r\n  rest_barren_epochs: 2\n")
    result = CliRunner().invoke(app, ["learning", str(run), "--window", "1"])
    assert "this run rests barren tasks (experiment.rest_barren_epochs=2)" in result.output
    assert "step   1  t1 0.00/0.00  t2 1.00/1.00" in result.output
    assert "step   2  t1 0.00/0.00  t2 0.00/1.00" in result.output
    assert "the judged kernels of" not in result.output  # every step's kernels are here


def test_groups_say_what_each_update_had_to_learn_from():
    """A group is one task's kernels at one turn of one step: only one that holds correct and failing kernels teaches
    correctness; steps and tasks are never pooled into one group."""
    from kevin.analysis.learning import turn_groups

    verdicts = [_kernel(0, 0, "a", "correct", 0.5), _kernel(0, 0, "a", "incorrect"),      # mixed
                _kernel(0, 0, "b", "compile_error"), _kernel(0, 0, "b", "parse_error"),   # none correct
                _kernel(1, 0, "a", "correct", 0.5), _kernel(1, 0, "a", "correct", 0.7),   # all correct (speeds differ)
                _kernel(1, 0, "b", "incorrect"),                                          # none: not pooled with step 0
                _kernel(0, 1, "a", "correct", 0.5), _kernel(0, 1, "a", "correct", 0.5)]   # turn 2: all correct
    assert turn_groups(verdicts) == {
        1: {"groups": 4, "none_correct": 2, "mixed": 1, "all_correct": 1},
        2: {"groups": 1, "none_correct": 0, "mixed": 0, "all_correct": 1}}
    assert turn_groups([]) == {}


def test_followups_say_whether_a_refinement_turn_tried_anything_new():
    """Each trajectory's turn against its own previous turn: a repeat is a kernel whose verdict was reused (judged
    before, byte for byte); trajectories, tasks and steps are never crossed, and kernels without a trajectory are
    left out."""
    from kevin.analysis.learning import turn_followups

    def k(step, turn, task, trajectory, status, reused=False):
        return {**_kernel(step, turn, task, status), "trajectory": trajectory, "reused": reused}

    verdicts = [k(0, 0, "a", 0, "compile_error"), k(0, 1, "a", 0, "compile_error", True),   # failed, repeated
                k(0, 0, "a", 1, "incorrect"), k(0, 1, "a", 1, "correct"),                   # failed, fixed
                k(0, 0, "a", 2, "correct"), k(0, 1, "a", 2, "correct", True),               # correct, repeated
                k(0, 0, "a", 3, "correct", True), k(0, 1, "a", 3, "runtime_error"),         # correct, lost
                k(0, 0, "b", 0, "parse_error"), k(0, 1, "b", 0, "parse_error"),             # failed, new (no kernel)
                k(0, 2, "b", 0, "correct", True),                                           # turn 3: fixed, a repeat
                k(1, 1, "a", 0, "correct"),                     # step 1 has no turn 1 of trajectory 0: not counted
                {**_kernel(0, 1, "c", "correct"), "reused": True}]  # no trajectory recorded: left out
    assert turn_followups(verdicts) == {
        2: {"after_failure": 3, "repeated_after_failure": 1, "fixed": 1,
            "after_correct": 2, "repeated_after_correct": 1, "lost": 1},
        3: {"after_failure": 1, "repeated_after_failure": 1, "fixed": 1,
            "after_correct": 0, "repeated_after_correct": 0, "lost": 0}}
    assert turn_followups([k(0, 0, "a", 0, "correct")]) == {}


def test_the_mixed_share_more_trajectories_would_give():
    """Task a is correct on 6 of its 8 first-turn kernels over the run (p 0.75), task b never (p 0). A group of n of a
    is mixed with chance 1 - 0.75^n - 0.25^n (n 2: 0.375; n 4: 0.6796875), one of b never; a was drawn twice, b
    once, so the share is two thirds of a's chance."""
    from kevin.analysis.learning import mixed_share_at

    verdicts = [_kernel(0, 0, "a", s) for s in ("correct", "incorrect", "correct", "compile_error")]
    verdicts += [_kernel(1, 0, "a", "correct") for _ in range(4)]
    verdicts += [_kernel(0, 0, "b", "incorrect") for _ in range(4)]
    verdicts += [_kernel(0, 1, "b", "correct")]  # turn 2: not counted for turn 1
    assert mixed_share_at(verdicts, 1, 2) == pytest.approx(0.375 * 2 / 3)
    assert mixed_share_at(verdicts, 1, 4) == pytest.approx(0.6796875 * 2 / 3)
    assert mixed_share_at(verdicts, 2, 4) == 0.0  # b's one turn-2 kernel: always correct
    with pytest.raises(ValueError, match="no kernel of turn 3"):
        mixed_share_at(verdicts, 3, 4)
