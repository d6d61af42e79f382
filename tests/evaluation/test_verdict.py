"""The verdict's pure parts: timing corroboration against the evaluator's clock, kernel classification and
the assembly of an EvalResult (hand-computed values)."""

from __future__ import annotations

import pytest

from kevin.evaluation.verdict import (Failure, Overhead, RunFacts, TimingEvidence, assemble, call_extras_ms, classify_kernels,
                                      clock_ms, corroborate, corroborated_ms, kernel_time_problem, low, measure_overhead,
                                      window_excess_ms)
from kevin.records.evaluation import EvalResult, Status, TimingFigures

MS = 1_000_000  # ns


def evidence(reported: list[float], window: list[float], gap: float) -> TimingEvidence:
    """Calls whose marks are ``window[i]`` ms apart, each cycle ``gap`` ms longer than its window."""
    begin, end, t = [], [], 0
    for w in window:
        begin.append(t)
        end.append(t + int(w * MS))
        t += int((w + gap) * MS)
    return TimingEvidence(reported, begin, end)


def test_excesses_by_hand():
    ev = evidence([1.0, 2.0, 1.5], [1.25, 2.5, 1.75], gap=3.0)
    # windows - reported = 0.25, 0.5, 0.25; the low quantile of three is the smallest, the median the middle one
    assert window_excess_ms(ev) == pytest.approx([0.25, 0.5, 0.25])
    assert measure_overhead(ev) == Overhead(window_ms=pytest.approx(0.25), typical_ms=pytest.approx(0.25))
    ev = evidence([0.0] * 4, [0.1, 0.4, 0.3, 0.2], gap=1.0)
    assert measure_overhead(ev) == Overhead(window_ms=pytest.approx(0.1), typical_ms=pytest.approx(0.25))


def test_low_is_the_tenth_percentile_from_below():
    assert low([5.0]) == 5.0
    assert low(list(range(11))) == 1  # index int(0.1 * 10) = 1
    assert low([9, 1, 8, 2, 7, 3, 6, 4, 5, 0, 10]) == 1
    assert low(list(range(100))) == 9  # index int(0.1 * 99) = 9


def test_honest_times_agree():
    overhead = Overhead(window_ms=0.2, typical_ms=0.2)
    ev = evidence([1.0] * 20, [1.2] * 20, gap=2.0)  # window excess 0.2 = overhead, cycle excess 2.2 - 0.0 ... = 2.2
    assert corroborate(ev, overhead, slack_ms=0.1, tolerance=0.2) == ""


def test_times_reported_shorter_than_the_marks_are_flagged():
    overhead = Overhead(window_ms=0.2, typical_ms=0.2)
    # reported 0.5 ms, marks 1.2 ms apart: 0.7 excess - 0.2 overhead = 0.5 > 0.1 + 0.2 * 0.5 = 0.2
    ev = evidence([0.5] * 20, [1.2] * 20, gap=2.0)
    problem = corroborate(ev, overhead, slack_ms=0.1, tolerance=0.2)
    assert "0.5000 ms more" in problem and "allowed 0.2000 ms" in problem
    # the same 0.3 ms shortfall on a 10 ms call is within 0.1 + 0.2 * 10
    assert corroborate(evidence([10.0] * 20, [10.5] * 20, gap=2.0), overhead, slack_ms=0.1, tolerance=0.2) == ""


def test_a_reported_total_beyond_the_evaluators_clock_is_flagged():
    ev = evidence([2.0, 2.0, 2.0], [1.0, 1.0, 1.0], gap=1.0)  # 6 ms reported, 3 ms seen
    assert "more than the 3.000 ms the evaluator saw" in corroborate(ev, None, 0.1, 0.2)


@pytest.mark.parametrize("reported", [[-1.0, 1.0, 1.0], [float("nan"), 1.0, 1.0]])
def test_nonsense_times_are_flagged(reported):
    assert "negative or not a number" in corroborate(evidence(reported, [1.0] * 3, 1.0), None, 0.1, 0.2)


def test_missing_marks_are_flagged():
    ev = TimingEvidence([1.0, 1.0], [0], [MS])
    assert "evaluator saw 1" in corroborate(ev, None, 0.1, 0.2)


def test_a_few_delayed_stamps_do_not_flag_an_honest_kernel():
    # 20 calls of 1 ms; 15 of them stamped late by 2 ms (a busy machine): the low quantile ignores them
    window = [1.2] * 5 + [3.2] * 15
    ev = evidence([1.0] * 20, window, gap=2.0)
    assert corroborate(ev, Overhead(0.2, 0.2), 0.1, 0.2) == ""


def test_a_delayed_call_counts_at_what_its_window_vouches_for():
    # 4 calls reported at 1 ms; two stamped 2 ms late. Extras over the 0.2 ms overhead: 0, 0, 2, 2. A late call
    # counts at 1 + (2 - 0.1 slack - 0.2 x 1) = 2.7 ms; the others as reported.
    ev = evidence([1.0] * 4, [1.2, 1.2, 3.2, 3.2], gap=1.0)
    assert call_extras_ms(ev, Overhead(0.2, 0.2)) == pytest.approx([0.0, 0.0, 2.0, 2.0])
    assert corroborated_ms(ev, Overhead(0.2, 0.2), 0.1, 0.2) == pytest.approx([1.0, 1.0, 2.7, 2.7])
    assert corroborated_ms(ev, None, 0.1, 0.2) == [1.0] * 4  # no calibration: the reported times stand


def test_reporting_most_calls_short_does_not_lower_the_median_that_scores():
    # 15 of 20 calls ran 1 ms but report 0.5; 5 report their 1 ms. The best calls agree, so nothing is flagged,
    # but the short ones count at 0.5 + (0.5 - 0.1 - 0.2 x 0.5) = 0.8 ms: the median scores 0.8, not 0.5.
    ev = evidence([0.5] * 15 + [1.0] * 5, [1.2] * 20, gap=1.0)
    assert corroborate(ev, Overhead(0.2, 0.2), 0.1, 0.2) == ""
    vouched = corroborated_ms(ev, Overhead(0.2, 0.2), 0.1, 0.2)
    assert vouched == pytest.approx([0.8] * 15 + [1.0] * 5)
    assert sorted(vouched)[10] == pytest.approx(0.8)


def test_the_evaluators_own_figure_is_the_median_window_less_the_typical_cost_and_its_spread():
    # windows 1.2, 1.4, 3.0 ms; typical protocol cost 0.3 ms: 0.9, 1.1, 2.7 -> median 1.1 (reports play no part),
    # less the calibration's spread (typical 0.3 - low 0.2 = 0.1): 1.0
    ev = evidence([0.001] * 3, [1.2, 1.4, 3.0], gap=1.0)
    assert clock_ms(ev, Overhead(0.2, 0.3)) == pytest.approx(1.0)
    assert clock_ms(ev, Overhead(0.3, 0.3)) == pytest.approx(1.1)  # no spread, no allowance
    assert clock_ms(ev, None) == 0.0  # no calibration, no figure
    assert clock_ms(evidence([0.0] * 3, [0.1] * 3, gap=1.0), Overhead(0.2, 0.3)) == 0.0  # never below 0


def test_reports_short_within_the_allowances_pass_but_score_no_less_than_the_clock():
    # Every call ran 0.6 ms (window 0.8 = 0.6 + 0.2 overhead) and reports 0.001 ms: the extra 0.599 ms is within
    # the cpu's 1 ms slack, so nothing is flagged and each call is vouched at its report; the floor (0.8 - 0.2 =
    # 0.6 ms) is what scores.
    ev = evidence([0.001] * 20, [0.8] * 20, gap=1.0)
    overhead = Overhead(0.2, 0.2)
    assert corroborate(ev, overhead, slack_ms=1.0, tolerance=0.2) == ""
    assert corroborated_ms(ev, overhead, 1.0, 0.2) == pytest.approx([0.001] * 20)
    assert clock_ms(ev, overhead) == pytest.approx(0.6)
    # an honest call of the same kernel: reported 0.6, the same windows, scored as reported
    honest = evidence([0.6] * 20, [0.8] * 20, gap=1.0)
    assert corroborated_ms(honest, overhead, 1.0, 0.2) == pytest.approx([0.6] * 20)
    assert clock_ms(honest, overhead) == pytest.approx(0.6)


def test_profiled_kernels_longer_than_the_reported_call_are_flagged():
    assert kernel_time_problem(0.5, [0.4, 0.5, 0.6], tolerance=0.2, slack_ms=0.1) == ""  # 0.5 <= 0.5 * 1.4 + 0.1
    assert "ran 2.0000 ms" in kernel_time_problem(2.0, [0.4, 0.5, 0.6], tolerance=0.2, slack_ms=0.1)
    assert kernel_time_problem(None, [1.0], 0.2, 0.1) == ""


def test_kernels_are_classified_by_their_own_names():
    names = ["void relu_kernel<float>(float const*, float*, long)", "ampere_sgemm_128x64_nn", "vectorized_elementwise_kernel fill",
             "void at::native::copy_kernel"]
    own, foreign = classify_kernels(names, ["relu_kernel", "gemm"])
    assert own == ["void relu_kernel<float>(float const*, float*, long)"]
    assert foreign == ["ampere_sgemm_128x64_nn"]  # a kernel named 'gemm' does not claim cuBLAS's GEMM


def test_correct_needs_every_trial_and_the_timing():
    timing = TimingFigures(reported_ms=1.8, vouched_ms=1.9, clock_ms=2.0, mean_ms=1.95, std_ms=0.05, min_ms=1.85, loops=2)
    facts = RunFacts(trials_run=5, trials_passed=5, runtime_ms=2.0, timing=timing, timed=True)
    r = assemble("t", "c", "cpu", facts, baseline_ms=3.0, correctness_trials=5, flag_threshold=10.0)
    assert r.status is Status.CORRECT and r.correct and r.speedup == pytest.approx(1.5) and not r.flagged_speedup
    assert r.timing == timing and EvalResult.from_dict(r.to_dict()) == r  # the figures go with the verdict
    old = r.to_dict()
    del old["timing"]  # a verdict file written before the figures existed
    assert EvalResult.from_dict(old).timing == TimingFigures()
    partial = assemble("t", "c", "cpu", RunFacts(trials_run=3, trials_passed=3, runtime_ms=2.0, timed=True), 3.0, 5, 10.0)
    assert partial.status is Status.RUNTIME_ERROR and not partial.correct
    untimed = assemble("t", "c", "cpu", RunFacts(trials_run=5, trials_passed=5), 3.0, 5, 10.0)
    assert untimed.status is Status.RUNTIME_ERROR and "timed calls did not complete" in untimed.error
    fast = assemble("t", "c", "cpu", RunFacts(trials_run=5, trials_passed=5, runtime_ms=0.1, timed=True), 3.0, 5, 10.0)
    assert fast.speedup == pytest.approx(30.0) and fast.flagged_speedup


def test_a_failure_wins_over_anything_reported():
    facts = RunFacts(failure=Failure(Status.INCORRECT, "trial 2 (scaled inputs): output 0 ..."), trials_run=5, trials_passed=5,
                     runtime_ms=1.0, timed=True)
    r = assemble("t", "c", "cpu", facts, 3.0, 5, 10.0)
    assert r.status is Status.INCORRECT and not r.correct and r.error.startswith("trial 2")
