"""Every metric on hand-made trajectories, against values worked out by hand in the comments."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import numpy as np
import pytest

from kevin.analysis import estimators as E
from kevin.analysis import outcomes as O
from kevin.analysis.estimators import avg_over, best_at_k, expected_max_of_subset, geometric_mean, metrics_at, pass_at_k
from kevin.analysis.metrics import AnalysisConfig, BudgetSplit, RunReport, analyze_run, report_from_states
from kevin.analysis.outcomes import KernelOutcome, TaskOutcome, TrajectoryOutcome, outcomes_from_turns
from kevin.records.evaluation import EvalResult, Status
from kevin.records.rollout import Turn, load_turns, save_turns

T = TrajectoryOutcome.of
F0 = (False, 0.0)

# Three tasks x four trajectories x three turns; (correct, speedup) per turn.
TASK_A = TaskOutcome("A", (
    T(F0, (True, 0.9), (True, 0.8)),    # a0: correct at turn 2 (0.9x); turn 3 correct but slower -> perf stays 0.9
    T((True, 0.5), F0, (True, 2.0)),    # a1: 0.5x at turn 1, 2.0x at turn 3
    T(F0, F0, F0),                      # a2: never correct
    T((True, 1.0), (True, 1.5), F0),    # a3: 1.0x, then 1.5x, then a failure (perf stays 1.5)
))
TASK_B = TaskOutcome("B", tuple(T((False, 3.0), F0, F0) for _ in range(4)))  # no correct kernel; an incorrect
# kernel's "speedup" of 3.0 must be ignored everywhere
TASK_C = TaskOutcome("C", (
    T((True, 1.5)),                     # c0: stopped after turn 1 with 1.5x (exactly fast_1.5)
    T(F0, F0, (True, 1.0)),             # c1: 1.0x at turn 3 (exactly fast_1)
    T(F0, F0, F0),
    T(F0, F0, F0),
))
TASKS = [TASK_A, TASK_B, TASK_C]

# Per-trajectory perf after turn t (t = 1, 2, 3):
#   A: a0 0, 0.9, 0.9 | a1 0.5, 0.5, 2.0 | a2 0, 0, 0 | a3 1.0, 1.5, 1.5
#   B: all 0
#   C: c0 1.5, 1.5, 1.5 | c1 0, 0, 1.0 | c2, c3 0


# ---------------------------------------------------------------------------------- per trajectory


def test_trajectory_metrics_after_each_turn():
    a0, a1, a2, a3 = TASK_A.trajectories
    assert [O.trajectory_correct(a0, t) for t in (1, 2, 3)] == [False, True, True]
    assert [O.trajectory_perf(a0, t) for t in (1, 2, 3)] == [0.0, 0.9, 0.9]  # fastest correct, not the latest
    assert [O.trajectory_perf(a1, t) for t in (1, 2, 3)] == [0.5, 0.5, 2.0]
    assert [O.trajectory_perf(a3, t) for t in (1, 2, 3)] == [1.0, 1.5, 1.5]
    assert O.trajectory_perf(a2) == 0.0 and not O.trajectory_correct(a2)
    assert O.trajectory_perf(TASK_B.trajectories[0]) == 0.0  # incorrect 3.0x does not count
    c0, c1 = TASK_C.trajectories[:2]
    assert [O.trajectory_perf(c0, t) for t in (1, 2, 3)] == [1.5, 1.5, 1.5]  # stopped early: keeps its state
    # fast_p is ">= p": exactly at the threshold counts
    assert O.trajectory_fast(c0, 1.5) and not O.trajectory_fast(c0, 1.5000001)
    assert O.trajectory_fast(c1, 1.0, 3) and not O.trajectory_fast(c1, 1.0, 2)
    assert not O.trajectory_fast(TASK_B.trajectories[0], 1.0)  # incorrect kernels are never fast
    # the bulk function agrees with the single ones
    for traj in (a0, a1, a2, a3, c0, c1):
        for t in (1, 2, 3):
            row = O.trajectory_metrics(traj, t, (0.0, 1.0, 1.5))
            assert row == {"correct": float(O.trajectory_correct(traj, t)), "perf": O.trajectory_perf(traj, t),
                           "fast_0": float(O.trajectory_fast(traj, 0.0, t)),
                           "fast_1": float(O.trajectory_fast(traj, 1.0, t)),
                           "fast_1.5": float(O.trajectory_fast(traj, 1.5, t))}
    with pytest.raises(ValueError, match="positive integer"):
        O.trajectory_perf(a0, 0)


# -------------------------------------------------------------------------------------- estimators


def test_expected_max_by_hand():
    # A's perf after turn 3: [0.9, 2.0, 0, 1.5] -> ascending 0, 0.9, 1.5, 2.0; C(4,k) = 4, 6, 4, 1
    v = [0.9, 2.0, 0.0, 1.5]
    assert expected_max_of_subset(v, 1) == pytest.approx(4.4 / 4)  # k=1: the mean, 1.1
    # k=2: weights C(i-1,1)/6 = 0, 1/6, 2/6, 3/6 -> (0.9*1 + 1.5*2 + 2.0*3)/6 = 9.9/6 = 1.65
    assert expected_max_of_subset(v, 2) == pytest.approx(1.65)
    # k=3: weights C(i-1,2)/4 = 0, 0, 1/4, 3/4 -> (1.5 + 6.0)/4 = 1.875
    assert expected_max_of_subset(v, 3) == pytest.approx(1.875)
    assert expected_max_of_subset(v, 4) == 2.0  # k=m: the plain maximum
    for bad in (0, 5, 1.0, True):
        with pytest.raises(ValueError, match="k must be"):
            expected_max_of_subset(v, bad)


def test_expected_max_equals_the_mean_over_all_subsets():
    values = [0.0, 0.0, 1.3, 0.7, 2.2, 0.7, 5.0]  # ties and zeros on purpose
    for k in range(1, len(values) + 1):
        subsets = list(itertools.combinations(values, k))
        brute = sum(max(s) for s in subsets) / len(subsets)
        assert expected_max_of_subset(values, k) == pytest.approx(brute, abs=1e-12)


def test_subset_weights_matrix():
    # m=4: row k-1 = C(i-1, k-1)/C(4, k) for i = 1..4
    w = E.subset_max_weights(4)
    assert w == pytest.approx(np.array([
        [1 / 4, 1 / 4, 1 / 4, 1 / 4],   # k=1: the mean
        [0, 1 / 6, 2 / 6, 3 / 6],       # k=2
        [0, 0, 1 / 4, 3 / 4],           # k=3
        [0, 0, 0, 1],                   # k=4: the maximum
    ]))
    assert not w.flags.writeable  # shared by every caller through the cache
    # at the paper's largest split (m = 128) the bulk path agrees with the one-k function
    values = sorted((i * 37 % 101) / 17 for i in range(128))
    bulk = E.subset_max_weights(128) @ values
    for k in (1, 2, 16, 64, 127, 128):
        assert bulk[k - 1] == pytest.approx(expected_max_of_subset(values, k), rel=1e-12)
    assert E.subset_max_weights(128).sum(axis=1) == pytest.approx([1.0] * 128, rel=1e-12)


def test_pass_at_k_by_hand_and_edges():
    # n=12, c=6, k=4: 1 - C(6,4)/C(12,4) = 1 - 15/495 = 32/33
    assert pass_at_k(12, 6, 4) == pytest.approx(32 / 33)
    # n=10, c=2, k=4: 1 - C(8,4)/C(10,4) = 1 - 70/210 = 2/3
    assert pass_at_k(10, 2, 4) == pytest.approx(2 / 3)
    assert pass_at_k(10, 2, 1) == pytest.approx(0.2)  # k=1: c/n
    assert pass_at_k(5, 0, 1) == 0.0 and pass_at_k(5, 0, 5) == 0.0  # c=0: never
    assert pass_at_k(5, 5, 1) == 1.0 and pass_at_k(5, 5, 3) == 1.0  # c=n: always
    assert pass_at_k(5, 3, 3) == 1.0  # n-c=2 < k=3: every 3-subset holds a correct one
    assert pass_at_k(4, 1, 4) == 1.0  # k=n: 1 if any is correct
    # exact against rational arithmetic at a size where naive floats would overflow binomials
    exact = 1 - Fraction(math.comb(1000 - 7, 64), math.comb(1000, 64))
    assert pass_at_k(1000, 7, 64) == pytest.approx(float(exact), rel=1e-12)
    with pytest.raises(ValueError, match="c \\(correct samples\\)"):
        pass_at_k(5, 6, 1)
    with pytest.raises(ValueError, match="k must be"):
        pass_at_k(5, 2, 6)


def test_best_at_k_of_a_0_1_metric_is_pass_at_k():
    for m, c in [(4, 0), (4, 1), (4, 3), (4, 4), (9, 5)]:
        values = [1.0] * c + [0.0] * (m - c)
        for k in range(1, m + 1):
            assert expected_max_of_subset(values, k) == pytest.approx(pass_at_k(m, c, k), abs=1e-12)


def test_geometric_mean():
    assert geometric_mean([2.0, 0.5]) == pytest.approx(1.0)  # sqrt(2 * 0.5)
    assert geometric_mean([1.0, 8.0, 1.0]) == pytest.approx(2.0)  # 8^(1/3)
    assert geometric_mean([]) is None
    assert geometric_mean([3.0, 0.0]) == 0.0
    with pytest.raises(ValueError, match=">= 0"):
        geometric_mean([-1.0])


# ------------------------------------------------------------------------------------ over tasks


def test_best_and_avg_at_k_over_tasks_after_the_last_turn():
    # perf best@k per task: A 1.1, 1.65, 1.875, 2.0 (above); B 0 (no correct kernel);
    # C [1.5, 1.0, 0, 0] ascending 0, 0, 1.0, 1.5: k=1 2.5/4 = 0.625; k=2 (1.0*2 + 1.5*3)/6 = 6.5/6;
    #   k=3 (1.0*1 + 1.5*3)/4 = 1.375; k=4 1.5
    assert best_at_k(TASKS, "perf", 1) == pytest.approx((1.1 + 0 + 0.625) / 3)  # 0.575
    assert best_at_k(TASKS, "perf", 2) == pytest.approx((1.65 + 0 + 6.5 / 6) / 3)  # 0.91111
    assert best_at_k(TASKS, "perf", 3) == pytest.approx((1.875 + 0 + 1.375) / 3)  # 1.08333
    assert best_at_k(TASKS, "perf", 4) == pytest.approx((2.0 + 0 + 1.5) / 3)  # 1.16667
    # avg@k = mean over trajectories: A 4.4/4 = 1.1, B 0, C 2.5/4 = 0.625 -> 0.575 (= best@1)
    assert avg_over(TASKS, "perf") == pytest.approx(0.575)
    # correct: A [1,1,0,1] c=3, B c=0, C [1,1,0,0] c=2
    #   k=1: (0.75 + 0 + 0.5)/3 = 0.41667; k=2: A 1 - C(1,2)/6 = 1, C 1 - C(2,2)/6 = 5/6 -> (1 + 5/6)/3 = 11/18
    #   k=4: (1 + 0 + 1)/3 = 2/3
    assert best_at_k(TASKS, "correct", 1) == pytest.approx(1.25 / 3)
    assert best_at_k(TASKS, "correct", 2) == pytest.approx(11 / 18)
    assert best_at_k(TASKS, "correct", 4) == pytest.approx(2 / 3)
    assert avg_over(TASKS, "correct") == pytest.approx(1.25 / 3)
    # fast_1: A [0 (0.9), 1, 0, 1] c=2; C [1, 1 (exactly 1.0), 0, 0] c=2
    #   k=2: A and C 1 - C(2,2)/6 = 5/6 -> (5/6 + 0 + 5/6)/3 = 5/9; k=4: 2/3; avg (0.5 + 0 + 0.5)/3 = 1/3
    assert best_at_k(TASKS, "fast_1", 2) == pytest.approx(5 / 9)
    assert best_at_k(TASKS, "fast_1", 4) == pytest.approx(2 / 3)
    assert avg_over(TASKS, "fast_1") == pytest.approx(1 / 3)
    # fast_1.5: A [0, 1, 0, 1 (exactly 1.5)] c=2; C [1 (exactly 1.5), 0, 0, 0] c=1
    #   k=1: (0.5 + 0 + 0.25)/3 = 0.25; k=2: A 5/6, C 1 - C(3,2)/6 = 1/2 -> (5/6 + 1/2)/3 = 4/9
    #   k=3: A 1, C 1 - C(3,3)/4 = 3/4 -> 1.75/3; k=4: 2/3
    assert best_at_k(TASKS, "fast_1.5", 1) == pytest.approx(0.25)
    assert best_at_k(TASKS, "fast_1.5", 2) == pytest.approx(4 / 9)
    assert best_at_k(TASKS, "fast_1.5", 3) == pytest.approx(1.75 / 3)
    assert best_at_k(TASKS, "fast_1.5", 4) == pytest.approx(2 / 3)
    # fast_2: only a1 (2.0x) -> A c=1: k=4 1, avg 1/4 -> best 1/3, avg 1/12
    assert best_at_k(TASKS, "fast_2", 4) == pytest.approx(1 / 3)
    assert avg_over(TASKS, "fast_2") == pytest.approx(1 / 12)
    # fast_0 is correctness (a correct kernel always has speedup >= 0)
    for k in (1, 2, 3, 4):
        assert best_at_k(TASKS, "fast_0", k) == best_at_k(TASKS, "correct", k)
    with pytest.raises(ValueError, match="unknown metric"):
        best_at_k(TASKS, "fast_x", 1)


def test_turn_curves():
    # after turn 1: perf A [0, 0.5, 0, 1.0], B 0, C [1.5, 0, 0, 0]; correct A c=2, C c=1
    m1 = metrics_at(TASKS, 4, 1, (1.0, 1.5), (1, 4))
    assert m1.best["perf"] == pytest.approx((1.0 + 0 + 1.5) / 3)  # 0.83333
    assert m1.avg["perf"] == pytest.approx((1.5 / 4 + 0 + 1.5 / 4) / 3)  # 0.25
    assert m1.best["correct"] == pytest.approx(2 / 3)
    assert m1.avg["correct"] == pytest.approx((0.5 + 0 + 0.25) / 3)  # 0.25
    assert m1.best["fast_1.5"] == pytest.approx(1 / 3)  # only C (1.5x at turn 1); A's 1.5x comes at turn 2
    # after turn 2: perf A [0.9, 0.5, 0, 1.5], C unchanged
    m2 = metrics_at(TASKS, 4, 2, (1.0, 1.5), (1, 4))
    assert m2.best["perf"] == pytest.approx((1.5 + 0 + 1.5) / 3)  # 1.0
    assert m2.avg["perf"] == pytest.approx((2.9 / 4 + 0 + 1.5 / 4) / 3)  # (0.725 + 0.375)/3 = 0.36667
    assert m2.avg["correct"] == pytest.approx((0.75 + 0 + 0.25) / 3)  # 1/3
    assert m2.best["fast_1.5"] == pytest.approx(2 / 3)
    # after turn 3 (= all turns)
    m3 = metrics_at(TASKS, 4, 3, (1.0, 1.5), (1, 4))
    assert m3.best["perf"] == pytest.approx(3.5 / 3) and m3.avg["perf"] == pytest.approx(0.575)
    assert (m1.turn, m1.k, m3.turn) == (1, 4, 3)


def test_pass_at_k_over_kernels_and_geomean_per_turn():
    m1 = metrics_at(TASKS, 4, 1, (), (1, 4, 12))
    # turn 1: 4 kernels per task. A correct a1 (0.5x), a3 (1.0x): c=2; B c=0; C c0 (1.5x): c=1
    assert (m1.kernels, m1.correct_kernels) == (12, 3)
    assert m1.pass_kernels[1] == pytest.approx((2 / 4 + 0 + 1 / 4) / 3)  # 0.25
    # pass@4 with n=4: 1 if any correct -> (1 + 0 + 1)/3
    assert m1.pass_kernels[4] == pytest.approx(2 / 3)
    assert 12 not in m1.pass_kernels  # k=12 > 4 kernels per task: undefined, left out
    assert m1.geomean_speedup == pytest.approx((0.5 * 1.0 * 1.5) ** (1 / 3))  # 0.75^(1/3)
    m3 = metrics_at(TASKS, 4, 3, (), (1, 4, 12))
    # turn 3: A 12 kernels, c = 2 (a0) + 2 (a1) + 0 + 2 (a3) = 6; B 12, c=0; C 1 + 3 + 3 + 3 = 10, c=2 -> 34, 8
    assert (m3.kernels, m3.correct_kernels) == (34, 8)
    assert m3.pass_kernels[1] == pytest.approx((6 / 12 + 0 + 2 / 10) / 3)  # 0.7/3
    assert m3.pass_kernels[4] == pytest.approx((32 / 33 + 0 + 2 / 3) / 3)  # = 6/11 (hand: 54/33/3)
    assert m3.pass_kernels[4] == pytest.approx(6 / 11)
    assert 12 not in m3.pass_kernels  # C has only 10 kernels
    # correct speedups: A 0.9, 0.8, 0.5, 2.0, 1.0, 1.5; C 1.5, 1.0 -> product 1.62 over 8 kernels
    assert m3.geomean_speedup == pytest.approx(1.62 ** (1 / 8))  # 1.0622
    none = metrics_at([TASK_B], 4, 3, (), (1,))
    assert none.geomean_speedup is None and none.pass_kernels == {1: 0.0}


def test_analyze_run_budget_splits_and_report():
    config = AnalysisConfig(fast_ps=(0, 1, 1.5, 2), budget_splits=("2x3", "4x1", "8x1", "4x4"), pass_ks=(1, 4))
    report = analyze_run("base", TASKS, config)
    assert (report.trajectories, report.turns, report.tasks) == (4, 3, 3)
    assert [m.k for m in report.by_k] == [1, 2, 3, 4] and all(m.turn == 3 for m in report.by_k)
    assert [m.turn for m in report.by_turn] == [1, 2, 3] and all(m.k == 4 for m in report.by_turn)
    assert report.by_k[1].best["perf"] == pytest.approx((1.65 + 6.5 / 6) / 3)
    assert report.final == report.by_turn[-1] == report.by_k[-1]
    # 8x1 needs 8 trajectories, 4x4 four turns: these rollouts cannot hold them
    assert list(report.splits) == ["2x3", "4x1"] and report.split("8x1") is None
    # 2x3 = best@2 after turn 3: perf 0.91111, correct 11/18 (above)
    assert report.split("2x3").best["perf"] == pytest.approx((1.65 + 6.5 / 6) / 3)
    assert report.split("2x3").best["correct"] == pytest.approx(11 / 18)
    assert [m.turn for m in report.splits["2x3"]] == [1, 2, 3]
    # 4x1 = best@4 after turn 1: perf 2.5/3, correct 2/3
    assert report.split("4x1").best["perf"] == pytest.approx(2.5 / 3)
    assert report.split(" 4 x 1 ").best["correct"] == pytest.approx(2 / 3)
    assert report.task_best_speedup == {"A": 2.0, "B": 0.0, "C": 1.5}
    # tries with a correct kernel: A a0, a1, a3 of 4; B none; C c0, c1 of 4. Their mean is avg@4 of correct.
    assert report.task_correct_share == {"A": 0.75, "B": 0.0, "C": 0.5}
    assert report.final.avg["correct"] == pytest.approx((0.75 + 0.0 + 0.5) / 3)
    assert RunReport.from_dict(report.to_dict()) == report
    # a report written before the shares were kept reads back without them
    old = {k: v for k, v in report.to_dict().items() if k != "task_correct_share"}
    assert RunReport.from_dict(old).task_correct_share == {}
    assert report.metric_names == ["correct", "perf", "fast_0", "fast_1", "fast_1.5", "fast_2"]


def test_report_from_states_keeps_the_headline_shares_of_correct_tries():
    # Independent trajectories: the same outcomes after every turn, so the report matches analyze_run's; a beam
    # that kept only a1 and a3 of task A (both correct) and C's c0, c1 after its last turn has shares 1.0 there.
    config = AnalysisConfig(budget_splits=("4x3",))
    same = report_from_states("s", {"4x3": [TASKS] * 3}, config)
    assert same.task_correct_share == {"A": 0.75, "B": 0.0, "C": 0.5}
    beam_last = [TaskOutcome("A", TASK_A.trajectories[1::2]), TaskOutcome("B", TASK_B.trajectories[:2]),
                 TaskOutcome("C", TASK_C.trajectories[:2])]
    beam = report_from_states("b", {"2x3": [TASKS, TASKS, beam_last]}, AnalysisConfig(budget_splits=("2x3",)))
    assert beam.task_correct_share == {"A": 1.0, "B": 0.0, "C": 1.0}


def test_analyze_run_refuses_bad_input():
    with pytest.raises(ValueError, match="no tasks"):
        analyze_run("x", [])
    uneven = [TASK_A, TaskOutcome("D", TASK_A.trajectories[:3])]
    with pytest.raises(ValueError, match="same number of trajectories"):
        analyze_run("x", uneven)
    with pytest.raises(ValueError, match="task ids repeat"):
        analyze_run("x", [TASK_A, TASK_A])
    with pytest.raises(ValueError, match="finite speedup"):
        KernelOutcome(True, math.inf)
    with pytest.raises(ValueError, match="finite speedup"):
        KernelOutcome(True, math.nan)
    KernelOutcome(False, math.nan)  # an incorrect kernel's speedup is never read


def test_config_validation():
    c = AnalysisConfig(fast_ps=[2, 1, 0.5, 1], table_fast_ps=[2], budget_splits=["16x8", " 32 x 4"], pass_ks=[1, 8])
    assert c.fast_ps == (0.5, 1.0, 2.0) and c.budget_splits == ("16x8", "32x4") and c.pass_ks == (1, 8)
    assert c.splits == [BudgetSplit(16, 8), BudgetSplit(32, 4)] and c.splits[0].generations == 128
    assert AnalysisConfig().fast_ps == (0.0, 0.5, 0.8, 1.0, 1.5, 2.0)
    with pytest.raises(ValueError, match="not in fast_ps"):
        AnalysisConfig(fast_ps=[1], table_fast_ps=[1, 1.5])
    with pytest.raises(ValueError, match="TRAJECTORIESxTURNS"):
        AnalysisConfig(budget_splits=["16-8"])
    with pytest.raises(ValueError, match="positive integer"):
        AnalysisConfig(budget_splits=["0x8"])
    with pytest.raises(ValueError, match="twice"):
        AnalysisConfig(budget_splits=["16x8", "16 x 8"])
    with pytest.raises(ValueError, match="finite speedups"):
        AnalysisConfig(fast_ps=[-1])
    with pytest.raises(ValueError, match="unknown analysis settings"):
        AnalysisConfig.from_dict({"fast_p": [1]})


# ------------------------------------------------------------------------------------------- adapter


def _turn(task, traj, turn, correct, speedup):
    status = "correct" if correct else "incorrect"
    return Turn(task_id=task, trajectory=traj, turn=turn,
                result={"status": status, "correct": correct, "speedup": speedup, "score": 0.0})


def test_outcomes_from_saved_turn_records(tmp_path):
    # The records a rollout writes: read back, their verdicts are EvalResults, not dicts.
    def verdict(status, speedup):
        return EvalResult(task_id="t", candidate_id="c", status=status, correct=status is Status.CORRECT,
                          speedup=speedup, score=0.0)

    path = tmp_path / "turn_000.jsonl"
    save_turns(path, [Turn(task_id="t", trajectory=0, turn=0, result=verdict(Status.CORRECT, 1.25)),
                      Turn(task_id="t", trajectory=1, turn=0, result=verdict(Status.COMPILE_ERROR, 0.0))])
    loaded = load_turns(path)
    assert isinstance(loaded[0].result, EvalResult)
    (task,) = outcomes_from_turns(loaded)
    assert task.trajectories == (T((True, 1.25)), T(F0))


def test_outcomes_from_rollout_turns():
    turns = [
        _turn("t2", 1, 1, True, 1.4), _turn("t2", 1, 0, False, 0.0),  # out of order on purpose
        _turn("t1", 0, 0, True, 0.7),
        _turn("t2", 0, 0, True, 2.5),
        Turn(task_id="t1", trajectory=1, turn=0, result={}),  # not evaluated: an incorrect kernel
    ]
    tasks = outcomes_from_turns(turns)
    assert [t.task_id for t in tasks] == ["t2", "t1"]  # order of first appearance
    t2, t1 = tasks
    assert t2.trajectories == (T((True, 2.5)), T(F0, (True, 1.4)))
    assert t1.trajectories == (T((True, 0.7)), T(F0))
    assert t2.turns == 2
    with pytest.raises(ValueError, match="without gaps"):
        outcomes_from_turns([_turn("t", 0, 0, True, 1.0), _turn("t", 0, 2, True, 1.0)])
    with pytest.raises(ValueError, match="appears twice"):
        outcomes_from_turns([_turn("t", 0, 0, True, 1.0), _turn("t", 0, 0, False, 0.0)])
