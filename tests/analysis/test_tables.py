"""Tables and the flat metrics dict: exact text for two small runs worked out by hand."""

from __future__ import annotations

import dataclasses

import pytest

from kevin.analysis.metrics import AnalysisConfig, analyze_run
from kevin.analysis.moves import count_gain
from kevin.analysis.outcomes import TaskOutcome, TrajectoryOutcome
from kevin.analysis.tables import (
    best_at_k_csv,
    comparison_csv,
    comparison_markdown,
    moved_markdown,
    paired_markdown,
    flat_metrics,
    table1_csv,
    table1_markdown,
    table2_csv,
    table2_markdown,
    turn_curves_csv,
)

T = TrajectoryOutcome.of
F0 = (False, 0.0)
CONFIG = AnalysisConfig(fast_ps=(1.0, 1.5), table_fast_ps=(1.0, 1.5), budget_splits=("1x2", "2x1", "4x1"), pass_ks=(1, 4))

# Two tasks x two trajectories x two turns.
# base, after turn 2:  X: x0 perf 2.0, x1 0      Y: y0 perf 0.6, y1 0
#   correct best (1 + 1)/2 = 100%, avg (0.5 + 0.5)/2 = 50%
#   perf best (2.0 + 0.6)/2 = 1.30x, avg (1.0 + 0.3)/2 = 0.65x
#   fast_1 X [1, 0], Y [0, 0]: best 50%, avg 25%; fast_1.5: the same
BASE = analyze_run("base", [
    TaskOutcome("X", (T((True, 1.0), (True, 2.0)), T(F0, F0))),
    TaskOutcome("Y", (T(F0, (True, 0.6)), T(F0, F0))),
], CONFIG)
# ckpt, after turn 2:  X: x0 perf 3.0 (turn 2's 1.0x is slower), x1 1.2    Y: y0 1.6, y1 0
#   correct best 100%, avg (1 + 0.5)/2 = 75%
#   perf best (3.0 + 1.6)/2 = 2.30x, avg (2.1 + 0.8)/2 = 1.45x
#   fast_1 X [1, 1], Y [1, 0]: best 100%, avg 75%; fast_1.5 X [1, 0], Y [1, 0]: best 100%, avg 50%
CKPT = analyze_run("ckpt", [
    TaskOutcome("X", (T((True, 3.0), (True, 1.0)), T((True, 1.2), F0))),
    TaskOutcome("Y", (T((True, 1.0), (True, 1.6)), T(F0, F0))),
], CONFIG)
# Splits (perf / correct, best@k after the split's last turn):
#   1x2 = best@1 (= avg) after turn 2: base 0.65x / 50%, ckpt 1.45x / 75%
#   2x1 = best@2 after turn 1: base X 1.0x, Y 0 -> 0.50x / 50%; ckpt X 3.0x, Y 1.0x -> 2.00x / 100%
#   4x1 needs 4 trajectories: n/a


def test_table1_markdown():
    assert table1_markdown([BASE, CKPT]) == (
        "| run  | k x turns | correct    | perf          | fast_1     | fast_1.5   |\n"
        "|------|-----------|------------|---------------|------------|------------|\n"
        "| base | 2x2       | 100% / 50% | 1.30x / 0.65x | 50% / 25%  | 50% / 25%  |\n"
        "| ckpt | 2x2       | 100% / 75% | 2.30x / 1.45x | 100% / 75% | 100% / 50% |\n"
        "\n"
        "Cells: best@k / avg@k over k = all trajectories of a task, after the last turn; mean over tasks.\n"
    )


def test_table1_csv():
    assert table1_csv([BASE, CKPT]) == (
        "run,trajectories,turns,tasks,correct_best,correct_avg,perf_best,perf_avg,"
        "fast_1_best,fast_1_avg,fast_1.5_best,fast_1.5_avg\n"
        "base,2,2,2,1.000000,0.500000,1.300000,0.650000,0.500000,0.250000,0.500000,0.250000\n"
        "ckpt,2,2,2,1.000000,0.750000,2.300000,1.450000,1.000000,0.750000,1.000000,0.500000\n"
    )


def test_table2_markdown_and_csv():
    assert table2_markdown([BASE, CKPT], ["1x2", "2x1", "4x1"]) == (
        "| run  | 1x2         | 2x1          | 4x1 |\n"
        "|------|-------------|--------------|-----|\n"
        "| base | 0.65x / 50% | 0.50x / 50%  | n/a |\n"
        "| ckpt | 1.45x / 75% | 2.00x / 100% | n/a |\n"
        "\n"
        "Cells: perf / correct as best@k with k = the split's trajectories, after its last turn; "
        "n/a: the rollouts hold fewer trajectories or turns.\n"
    )
    # default columns: the splits some run holds
    assert table2_markdown([BASE]).splitlines()[0] == "| run  | 1x2         | 2x1         |"
    assert table2_csv([BASE, CKPT], ["1x2", "2x1", "4x1"]) == (
        "run,split,trajectories,turns,perf,correct\n"
        "base,1x2,1,2,0.650000,0.500000\n"
        "base,2x1,2,1,0.500000,0.500000\n"
        "ckpt,1x2,1,2,1.450000,0.750000\n"
        "ckpt,2x1,2,1,2.000000,1.000000\n"
    )


def test_comparison():
    # geomean of correct kernels: base 1.0 * 2.0 * 0.6 = 1.2 -> 1.2^(1/3) = 1.063; ckpt 3.0 * 1.0 * 1.2 * 1.0 * 1.6
    #   = 5.76 -> 5.76^(1/5) = 1.419; difference 0.357
    # pass@1 kernels: base X 2/4, Y 1/4 -> 0.375 (37.5 rounds half to even: 38%); ckpt X 3/4, Y 2/4 -> 0.625 (62%)
    # pass@4 kernels (n = 4 per task): 1 if any kernel is correct -> 100% for both
    assert comparison_markdown([BASE, CKPT]) == (
        "| metric                            | base  | ckpt  | ckpt - base |\n"
        "|-----------------------------------|-------|-------|-------------|\n"
        "| correct best@k                    | 100%  | 100%  | +0 pts      |\n"
        "| correct avg@k                     | 50%   | 75%   | +25 pts     |\n"
        "| perf best@k                       | 1.30x | 2.30x | +1.00x      |\n"
        "| perf avg@k                        | 0.65x | 1.45x | +0.80x      |\n"
        "| fast_1 best@k                     | 50%   | 100%  | +50 pts     |\n"
        "| fast_1 avg@k                      | 25%   | 75%   | +50 pts     |\n"
        "| fast_1.5 best@k                   | 50%   | 100%  | +50 pts     |\n"
        "| fast_1.5 avg@k                    | 25%   | 50%   | +25 pts     |\n"
        "| geomean speedup (correct kernels) | 1.06x | 1.42x | +0.36x      |\n"
        "| pass@1 kernels                    | 38%   | 62%   | +25 pts     |\n"
        "| pass@4 kernels                    | 100%  | 100%  | +0 pts      |\n"
        "| 1x2 perf                          | 0.65x | 1.45x | +0.80x      |\n"
        "| 1x2 correct                       | 50%   | 75%   | +25 pts     |\n"
        "| 2x1 perf                          | 0.50x | 2.00x | +1.50x      |\n"
        "| 2x1 correct                       | 50%   | 100%  | +50 pts     |\n"
    )
    csv_text = comparison_csv([BASE, CKPT], baseline="ckpt")
    lines = csv_text.splitlines()
    assert lines[0] == "metric,base,ckpt,base - ckpt"
    assert lines[3] == "perf best@k,1.300000,2.300000,-1.000000"
    assert lines[9] == f"geomean speedup (correct kernels),{1.2 ** (1 / 3):.6f},{5.76 ** 0.2:.6f},{1.2 ** (1 / 3) - 5.76 ** 0.2:.6f}"
    assert len(lines) == 16
    with pytest.raises(ValueError, match="not among the runs"):
        comparison_markdown([BASE, CKPT], baseline="other")
    with pytest.raises(ValueError, match="names must differ"):
        comparison_markdown([BASE, BASE])


def test_curve_csvs():
    # turn curves: base's own 2x2 (k=2, turns 1-2) plus 1x2 (k=1, turns 1-2) and 2x1 (k=2, turn 1), 4 metrics each
    rows = turn_curves_csv([BASE]).splitlines()
    assert rows[0] == "run,split,k,turn,metric,best,avg"
    assert len(rows) == 1 + (2 + 2 + 1) * 4
    # after turn 1, k=2: perf X 1.0, Y 0 -> best 0.5, avg (0.5 + 0)/2 = 0.25
    assert "base,2x2,2,1,perf,0.500000,0.250000" in rows
    assert "base,1x2,1,2,correct,0.500000,0.500000" in rows
    rows = best_at_k_csv([BASE, CKPT]).splitlines()
    assert rows[0] == "run,k,metric,best" and len(rows) == 1 + 2 * 2 * 4
    assert "ckpt,1,perf,1.450000" in rows and "ckpt,2,perf,2.300000" in rows


def test_flat_metrics_names_and_values():
    flat = flat_metrics(BASE)
    assert flat["best_at_2/correct"] == 1.0
    assert flat["avg_at_2/perf"] == pytest.approx(0.65)
    assert flat["best_at_1/perf"] == pytest.approx(0.65)  # the best@k curve
    assert flat["pass_at_1/trajectories"] == pytest.approx(0.5)  # = best@1 of correct
    assert flat["pass_at_1/kernels"] == pytest.approx(0.375)
    assert flat["geomean_speedup"] == pytest.approx(1.2 ** (1 / 3))
    assert flat["turn_1/best_at_2/perf"] == pytest.approx(0.5)
    assert flat["turn_2/best_at_2/perf"] == flat["best_at_2/perf"]
    assert flat["split_2x1/best_at_2/correct"] == pytest.approx(0.5)
    # 1x2 after turn 1: best@1 = mean; X [1.0, 0] -> 0.5, Y [0, 0] -> 0; over tasks 0.25
    assert flat["split_1x2/turn_1/best_at_1/perf"] == pytest.approx(0.25)
    assert (flat["tasks"], flat["kernels"], flat["correct_kernels"]) == (2.0, 8.0, 3.0)
    assert not [name for name in flat if "@" in name]
    # no correct kernel: the geometric mean is undefined and left out
    none = analyze_run("none", [TaskOutcome("X", (T(F0), T(F0)))], CONFIG)
    assert "geomean_speedup" not in flat_metrics(none) and flat_metrics(none)["best_at_2/perf"] == 0.0


def test_flat_metric_names_are_accepted_by_mlflow(tmp_path):
    mlflow = pytest.importorskip("mlflow")
    flat = flat_metrics(CKPT)
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    try:
        with mlflow.start_run() as run:
            mlflow.log_metrics(flat)
        logged = mlflow.tracking.MlflowClient().get_run(run.info.run_id).data.metrics
    finally:
        mlflow.set_tracking_uri(None)
    assert logged == pytest.approx(flat)


def test_paired_pairs_each_task_with_itself():
    # Tasks' best perf: base A 0, B 1.2, C 0.5, D 0; run A 0.8, B 1.5, C 0.5, E 2.0. Only A, B and C are in both.
    # solved: base [0, 1, 1] = 67%, run [1, 1, 1] = 100%, differences [1, 0, 0]; a redraw of the 3 tasks has mean 0
    #   with probability (2/3)^3 = 0.30 (so the 5% end is 0) and mean 1 with 1/27 = 0.04 < 0.05 (so the 95% end is
    #   the next value down, 2/3): [+0, +67 pts], within the noise.
    # faster than eager (perf > 1): base [0, 1, 0], run [0, 1, 0]: +0 pts, [+0, +0].
    # best perf: base (0 + 1.2 + 0.5) / 3 = 0.57x, run (0.8 + 1.5 + 0.5) / 3 = 0.93x, gain 0.37x; differences
    #   [0.8, 0.3, 0]: mean 0 has probability 1/27 < 0.05, so the 5% end is the next value up, 0.3 / 3 = 0.10; mean
    #   0.8 has 1/27, so the 95% end is (0.8 + 0.8 + 0.3) / 3 = 0.63: a rise above the noise.
    # Tries correct (avg@k), from the tasks' shares: base A 0, B 0.5, C 0.25; run A 0.5, B 1.0, C 0.25: 25% ->
    #   58%, +33 pts; differences [0.5, 0.5, 0]: mean 0 has probability 1/27 < 0.05, so the 5% end is the next value
    #   up, 0.5 / 3 = +17 pts; mean 0.5 has 8/27 > 0.05, so the 95% end is +50 pts: a rise above the noise.
    # Four tries a task, so the shares are counts: base A 0, B 2, C 1 of 4; run A 2, B 4, C 1 of 4.
    base = dataclasses.replace(BASE, trajectories=4, task_best_speedup={"A": 0.0, "B": 1.2, "C": 0.5, "D": 0.0},
                               task_correct_share={"A": 0.0, "B": 0.5, "C": 0.25, "D": 0.0})
    run = dataclasses.replace(CKPT, trajectories=4, task_best_speedup={"A": 0.8, "B": 1.5, "C": 0.5, "E": 2.0},
                              task_correct_share={"A": 0.5, "B": 1.0, "C": 0.25, "E": 1.0})
    table = paired_markdown([base, run])
    cells = [[cell.strip() for cell in line.strip("|").split("|")] for line in table.splitlines()]
    assert cells[0] == ["figure", "run", "tasks", "base (baseline)", "run", "gain", "90% interval", "verdict"]
    assert cells[2:6] == [
        ["tasks solved", "ckpt", "3", "67%", "100%", "+33 pts", "[+0 pts, +67 pts]", "within the noise"],
        ["tasks faster than eager", "ckpt", "3", "33%", "33%", "+0 pts", "[+0 pts, +0 pts]", "within the noise"],
        ["best perf", "ckpt", "3", "0.57x", "0.93x", "+0.37x", "[+0.10x, +0.63x]", "a rise above the noise"],
        ["tries correct (avg@k)", "ckpt", "3", "25%", "58%", "+33 pts", "[+17 pts, +50 pts]", "a rise above the noise"],
    ]
    # Then the same two correctness figures with each task's 4 tries redrawn too (count_gain on the counts): the
    # means and gains are the rows' above, the intervals count_gain's.
    counts = ({"A": (0, 4), "B": (2, 4), "C": (1, 4)}, {"A": (2, 4), "B": (4, 4), "C": (1, 4)})
    assert (base.task_correct_counts(), run.task_correct_counts()) == ({**counts[0], "D": (0, 4)},
                                                                       {**counts[1], "E": (4, 4)})
    for row, label, figure, means in ((cells[6], "tasks solved, tries redrawn", "solved", ["67%", "100%"]),
                                      (cells[7], "tries correct, tries redrawn", "share", ["25%", "58%"])):
        _, _, low, high = count_gain(*counts, figure)
        assert row[:7] == [label, "ckpt", "3", *means, "+33 pts", f"[{100 * low:+.0f} pts, {100 * high:+.0f} pts]"]
    # Redrawn, A's 2 of 4 can come out 0 of 4, and B's 2 of 4 as 4 of 4: the tries-correct gain that redrawing the
    # tasks alone put above the noise ([+17, +50] pts) is within it once the 4 tries a task are redrawn.
    assert count_gain(*counts, "share")[2] < 1 / 6 and cells[7][7] == "within the noise"
    assert len(cells) == 8
    # Reports written before the shares were kept pair the best-perf figures only.
    assert "tries correct" not in paired_markdown([dataclasses.replace(base, task_correct_share={}), run])
    # The other way round: the same pairs, every gain and interval negated.
    lines = paired_markdown([base, run], baseline="ckpt").splitlines()
    assert "| best perf " in lines[4] and "-0.37x" in lines[4] and "[-0.63x, -0.10x]" in lines[4]
    assert "a fall beyond the noise" in lines[4]
    # Runs of other tasks (a train-split run beside an eval-split run) have nothing to pair.
    other = dataclasses.replace(CKPT, task_best_speedup={"E": 2.0})
    assert paired_markdown([base, other]) == "No run shares a task with base: there is nothing to pair.\n"


def test_moved_lists_the_tasks_whose_correct_tries_changed_beyond_chance():
    # Eight trajectories a task. A: 0 -> 8 of 8 and B: 8 -> 0 of 8, each p = 2 / C(16, 8) = 1.6e-4; C: 4 -> 5 of 8,
    # the likeliest split (p 1); D and E are in one run only, so 3 tasks are tested and 0.05 x 3 = 0.15 of them
    # would be listed by chance.
    base = dataclasses.replace(BASE, trajectories=8, task_correct_share={"A": 0.0, "B": 1.0, "C": 0.5, "D": 0.0})
    run = dataclasses.replace(CKPT, trajectories=8, task_correct_share={"A": 1.0, "B": 0.0, "C": 0.625, "E": 1.0})
    assert base.task_correct_counts() == {"A": (0, 8), "B": (8, 8), "C": (4, 8), "D": (0, 8)}
    assert moved_markdown([base, run]) == (
        "ckpt against base: 1 of 3 tasks rose and 1 fell beyond chance (Fisher's exact test, p < 0.05; chance "
        "alone lists at most about 0.15 of unchanged tasks).\n"
        "| task | base (baseline) | ckpt   | p       | change |\n"
        "|------|-----------------|--------|---------|--------|\n"
        "| A    | 0 of 8          | 8 of 8 | 0.00016 | rose   |\n"
        "| B    | 8 of 8          | 0 of 8 | 0.00016 | fell   |\n"
    )
    # The other way round, the same two tasks, directions swapped; at a stricter level neither is listed.
    assert "| A    | 8 of 8 " in moved_markdown([base, run], baseline="ckpt")
    assert moved_markdown([base, run], alpha=1e-4).startswith("ckpt against base: 0 of 3 tasks rose and 0 fell")
    # Reports written before the shares were kept, or of other tasks, have nothing to test.
    assert moved_markdown([dataclasses.replace(base, task_correct_share={}), run]) == (
        "No run shares a task's tries with base: there is nothing to test.\n")
