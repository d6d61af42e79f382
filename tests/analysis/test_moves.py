"""Fisher's exact test of a task's correct tries before and after, with p-values worked out by hand; the bootstrap
that redraws the tries too."""

from __future__ import annotations

from math import comb

import pytest

from kevin.analysis.learning import paired_gain
from kevin.analysis.moves import TaskMove, count_gain, exact_p, task_moves


def test_exact_p_sums_the_splits_no_more_likely_than_the_one_seen():
    # 0 of 2 against 2 of 2: 2 correct in all; the first side holds 0, 1 or 2 of them with chances 1/6, 4/6, 1/6.
    # The splits no more likely than 0 (chance 1/6) are 0 and 2: p = 2/6.
    assert exact_p(0, 2, 2, 2) == pytest.approx(1 / 3, abs=1e-15)
    # 1 of 2 against 1 of 2 is the likeliest split: every split counts, p = 1.
    assert exact_p(1, 2, 1, 2) == 1.0
    # 0 of 8 against 8 of 8: only the two extreme splits of 8 in 16 are as unlikely, each 1/C(16, 8) = 1/12870.
    assert exact_p(0, 8, 8, 8) == pytest.approx(2 / 12870, rel=1e-12)
    # 0 of 16 against 10 of 16 (the eighth run's level2/01_linear_relu_add_bias): 2 C(16, 10) / C(32, 10).
    assert exact_p(0, 16, 10, 16) == pytest.approx(2 * comb(16, 10) / comb(32, 10), rel=1e-12)
    assert exact_p(0, 16, 10, 16) == pytest.approx(16016 / 64512240, rel=1e-12)
    # Unequal tries, 3 of 7 against 0 of 12: of 3 correct in 19 the first side holds x with chance
    # C(7, x) C(12, 3 - x) / C(19, 3) = 220, 462, 252, 35 (/ 969) for x = 0..3; only x = 3 is as unlikely.
    assert exact_p(3, 7, 0, 12) == pytest.approx(35 / 969, rel=1e-12)
    # The test is symmetric in its two sides, and a split as likely as the one seen counts in full.
    assert exact_p(8, 8, 0, 8) == exact_p(0, 8, 8, 8)
    # 2 of 8 against 5 of 8: not beyond chance (scipy.stats.fisher_exact gives 0.3147 too).
    assert exact_p(2, 8, 5, 8) == pytest.approx(0.31468531468531, rel=1e-12)


@pytest.mark.parametrize("counts", [(0, 0, 1, 2), (3, 2, 1, 2), (-1, 2, 1, 2), (1, 2, 3, 2)])
def test_exact_p_refuses_what_is_not_a_count_of_tries(counts):
    with pytest.raises(ValueError, match="is not a count of tries"):
        exact_p(*counts)


def test_task_moves_lists_the_tasks_beyond_chance_most_certain_first():
    before = {"a": (0, 8), "b": (8, 8), "c": (4, 8), "d": (0, 16), "gone": (0, 8)}
    after = {"a": (8, 8), "b": (1, 8), "c": (5, 8), "d": (10, 16), "new": (8, 8)}
    moves = task_moves(before, after)
    # a: 0 -> 8 of 8, p 2/12870 = 1.6e-4; d: 0 -> 10 of 16, 2.5e-4; b: 8 -> 1 of 8, where the splits of 9 correct
    # in 16 as unlikely as 8 | 1 are 8 | 1 and 1 | 8, each C(8, 8) C(8, 1) / C(16, 9) = 8/11440: p 16/11440 = 1.4e-3.
    assert [m.task for m in moves] == ["a", "d", "b"]
    assert moves[0] == TaskMove("a", 0, 8, 8, 8, pytest.approx(2 / 12870))
    assert moves[2].p == pytest.approx(16 / 11440) and not moves[2].rose
    assert moves[0].rose and moves[1].rose
    # c (4 -> 5 of 8) is the likeliest split of 9 in 16 (tied with 5 | 4): p 1, listed at no level; "gone" and
    # "new" are in one evaluation only.
    assert exact_p(4, 8, 5, 8) == 1.0
    assert {m.task for m in task_moves(before, after, alpha=0.999)} == {"a", "b", "d"}
    assert task_moves(before, after, alpha=1e-4) == []
    assert moves[1].to_dict() == {"task": "d", "before": 0, "before_tries": 16, "after": 10, "after_tries": 16,
                                  "p": moves[1].p, "rose": True}


def test_a_rise_is_read_from_shares_not_counts():
    # 4 of 8 (50%) against 6 of 16 (37.5%): more correct tries, a lower share.
    assert not TaskMove("t", 4, 8, 6, 16, 0.5).rose
    assert TaskMove("t", 4, 16, 3, 8, 0.5).rose


def test_task_moves_refuses_a_level_outside_zero_and_one():
    with pytest.raises(ValueError, match="alpha must be between 0 and 1"):
        task_moves({}, {}, alpha=1.0)


def test_count_gain_of_tasks_always_or_never_correct_is_the_task_only_interval():
    # A 8 of 8 -> 8 of 8, B 0 of 8 -> 8 of 8: every redraw of a task's tries keeps its count, so only the redraw of
    # the two tasks varies: both A (gain 0, chance 1/4), one of each (0.5, 1/2), both B (1, 1/4). The 5% and 95%
    # ends of 2000 such redraws are 0 and 1; the means 50% -> 100% (share) and 50% -> 100% (solved).
    before, after = {"A": (8, 8), "B": (0, 8)}, {"A": (8, 8), "B": (8, 8)}
    assert count_gain(before, after, "share") == (0.5, 1.0, 0.0, 1.0)
    assert count_gain(before, after, "solved") == (0.5, 1.0, 0.0, 1.0)
    # Tasks in only one evaluation are left out.
    assert count_gain({**before, "C": (0, 8)}, {**after, "D": (8, 8)}, "share") == (0.5, 1.0, 0.0, 1.0)


def test_count_gain_widens_the_interval_by_the_noise_of_the_tries():
    # 40 tasks, each 4 of 8 tries correct in both evaluations: nothing changed. Redrawing the tasks only (the
    # broken variant, paired_gain over the shares) sees 40 differences of exactly 0 and calls the interval [0, 0],
    # so a second evaluation at another seed would look like a rise or a fall beyond the noise.
    same = {f"task{i}": (4, 8) for i in range(40)}
    assert paired_gain({task: [0.5, 0.5] for task in same}) == (0.5, 0.5, 0.0, 0.0, 40)
    # Redrawing the tries too: a task's share difference has variance 2 x (1/2)(1/2) / 8 = 1/16 (sd 0.25), the mean
    # of 40 sd 0.25 / sqrt(40) = 0.0395, so the 90% interval is about +-1.645 x 0.0395 = +-0.065.
    first, last, low, high = count_gain(same, same, "share")
    assert (first, last) == (0.5, 0.5)
    assert low == pytest.approx(-0.065, abs=0.01) and high == pytest.approx(0.065, abs=0.01)
    # Seeded: the same call gives the same interval; another seed another one of the same width.
    assert count_gain(same, same, "share") == (first, last, low, high)
    other = count_gain(same, same, "share", seed=1)
    assert other[2] == pytest.approx(-0.065, abs=0.01) and other[3] == pytest.approx(0.065, abs=0.01)


@pytest.mark.parametrize("before, after, figure, message", [
    ({"A": (1, 8)}, {"B": (1, 8)}, "share", "share no task"),
    ({"A": (9, 8)}, {"A": (1, 8)}, "share", "9 correct of 8 tries"),
    ({"A": (0, 0)}, {"A": (0, 8)}, "share", "0 correct of 0 tries"),
    ({"A": (1, 8)}, {"A": (1, 8)}, "best", "figure must be one of"),
])
def test_count_gain_refuses_what_it_cannot_pair(before, after, figure, message):
    with pytest.raises(ValueError, match=message):
        count_gain(before, after, figure)
    with pytest.raises(ValueError, match="level must be between"):
        count_gain({"A": (1, 8)}, {"A": (1, 8)}, level=1.0)
