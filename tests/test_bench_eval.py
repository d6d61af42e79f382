"""The evaluation benchmark's timeline figures (benchmarks/bench_eval.py), by hand."""

from __future__ import annotations

import pytest

from benchmarks.bench_eval import busy_share, idle_breakdown


def test_busy_share_is_the_union_of_runs_per_device_over_wall():
    runs = [("cuda:0", 2.0, 5.0), ("cuda:0", 4.0, 6.0), ("cuda:0", 8.0, 9.0), ("cuda:1", 0.0, 10.0)]
    # cuda:0 busy 2-6 and 8-9 = 5 s of 10; cuda:1 10 of 10: mean 0.75.
    assert busy_share(runs, 10.0) == pytest.approx(0.75)


def test_idle_time_is_split_at_the_first_run_and_the_last_compile():
    compiles = [(0.0, 3.0), (0.0, 7.0), (3.0, 12.0)]  # the last compile ends at 12
    runs = [("cuda:0", 3.5, 5.0), ("cuda:0", 7.5, 9.0), ("cuda:0", 13.0, 14.0), ("cuda:0", 14.0, 15.0)]
    idle = idle_breakdown(runs, compiles, start=0.0, end=16.0)
    # Before the first run: 0-3.5. Gaps 5-7.5 and 9-13: 2.5 + 3 before 12, 1 after; the tail 15-16 after.
    assert idle == pytest.approx({"before the first run": 3.5, "while compiles went on": 5.5, "after the last compile": 2.0})


def test_with_no_run_the_whole_batch_waited():
    assert idle_breakdown([], [(0.0, 4.0)], 0.0, 4.0)["before the first run"] == 4.0
