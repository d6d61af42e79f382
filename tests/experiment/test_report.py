"""The step report and the run summary (pure): hand-built steps, exact tables."""

from __future__ import annotations

import pytest

from kevin.experiment.report import phase_seconds, rollout_wall, run_summary, step_lines, step_report_markdown, task_rows, turn_rows
from kevin.records.evaluation import EvalResult, Status
from kevin.records.rollout import TrainingSample, Trajectory, Turn


def turn(task: str, traj: int, index: int, status: Status, speedup: float = 0.0) -> Turn:
    correct = status is Status.CORRECT
    result = EvalResult(task_id=task, candidate_id=f"{task}#{traj}#{index}", status=status, correct=correct,
                        speedup=speedup if correct else 0.0, score=0.3 + speedup if correct else 0.0)
    return Turn(task_id=task, trajectory=traj, turn=index, result=result)


STEP = [
    Trajectory("l1/relu", 0, [turn("l1/relu", 0, 0, Status.CORRECT, 1.2), turn("l1/relu", 0, 1, Status.CORRECT, 2.0)]),
    Trajectory("l1/relu", 1, [turn("l1/relu", 1, 0, Status.PARSE_ERROR), turn("l1/relu", 1, 1, Status.COMPILE_ERROR)]),
    Trajectory("l2/gemm", 0, [turn("l2/gemm", 0, 0, Status.RULE_VIOLATION), turn("l2/gemm", 0, 1, Status.CORRECT, 0.5)]),
]
# Returns with gamma 0.4: relu/0: 1.5 + 0.4 * 2.3 = 2.42, 2.3; relu/1: 0, 0; gemm/0: 0.4 * 0.8 = 0.32, 0.8.
SAMPLES = [TrainingSample([1], [2], None, reward=r, advantage=0.0, task_id=t, trajectory=j, turn=k)
           for (t, j, k, r) in [("l1/relu", 0, 0, 2.42), ("l1/relu", 0, 1, 2.3), ("l1/relu", 1, 0, 0.0),
                                ("l1/relu", 1, 1, 0.0), ("l2/gemm", 0, 0, 0.32), ("l2/gemm", 0, 1, 0.8)]]


def test_rows_per_turn_and_per_task():
    assert turn_rows(STEP, SAMPLES) == [
        {"turn": 0, "kernels": 3, "correct": 1, "score_mean": 1.5 / 3, "return_mean": pytest.approx(2.74 / 3)},
        {"turn": 1, "kernels": 3, "correct": 2, "score_mean": pytest.approx(3.1 / 3), "return_mean": pytest.approx(3.1 / 3)},
    ]
    # relu: scores 1.5, 2.3, 0, 0 -> 3.8 / 4; gemm: 0, 0.8 -> 0.8 / 2.
    assert task_rows(STEP) == [
        {"task": "l1/relu", "kernels": 4, "correct": 2, "score_mean": pytest.approx(0.95), "best_speedup": 2.0},
        {"task": "l2/gemm", "kernels": 2, "correct": 1, "score_mean": pytest.approx(0.4), "best_speedup": 0.5}]


def test_phase_seconds_add_up_turns_in_phase_order():
    timings = {"generate/0": 10.0, "sample": 0.5, "evaluate/0": 3.0, "generate/1": 12.0, "update": 4.0, "evaluate/1": 2.0}
    assert phase_seconds(timings) == {"sample": 0.5, "generate": 22.0, "evaluate": 5.0, "update": 4.0, "step": 31.5}


def test_overlapping_waves_count_the_rollout_by_its_wall_time():
    """Two waves of one turn: wave 0 generates 0-10 s and is judged 10-30 s, wave 1 generates 10-18 s (beside wave 0's
    evaluation) and is judged 30-40 s (after it). Phases add up to 48 s of work, the rollout took 40 s."""
    timings = {"sample": 1.0, "generate/0/0": 10.0, "generate/0/1": 8.0, "evaluate/0/0": 20.0, "evaluate/0/1": 10.0,
               "update": 5.0}
    spans = {"sample": [99.0, 100.0], "generate/0/0": [100.0, 110.0], "generate/0/1": [110.0, 118.0],
             "evaluate/0/0": [110.0, 130.0], "evaluate/0/1": [130.0, 140.0], "update": [140.0, 145.0]}
    assert phase_seconds(timings, spans) == {"sample": 1.0, "generate": 18.0, "evaluate": 30.0, "update": 5.0,
                                             "rollout_wall": 40.0, "step": 46.0}
    assert rollout_wall({"update": [1.0, 2.0]}) is None


def test_the_step_report():
    seconds = {"generate": 22.0, "step": 31.5}
    update = [{"loss": 0.5, "grad_norm": 1.0, "trained_sequences": 4.0}, {"loss": 0.25, "grad_norm": 2.0, "trained_sequences": 4.0}]
    report = step_report_markdown("demo", 1, 3, STEP, SAMPLES, seconds, update, {"not_okay_ratio": 0.5, "junk_share": 0.0},
                                  ["step 1: not_okay_ratio 0.5 > 0.2"])
    assert report == """# demo: step 2 of 3

## Verdicts

| verdict | kernels |
|---|---|
| correct | 3 |
| compile_error | 1 |
| rule_violation | 1 |
| parse_error | 1 |
| all | 6 |

## Rewards per turn

| turn | kernels | correct | mean score | mean return |
|---|---|---|---|---|
| 0 | 3 | 1 | 0.5 | 0.9133 |
| 1 | 3 | 2 | 1.033 | 1.033 |

## Best speedup per task

| task | kernels | correct | best speedup |
|---|---|---|---|
| l1/relu | 4 | 2 | 2 |
| l2/gemm | 2 | 1 | 0.5 |

## Seconds per phase

| phase | seconds |
|---|---|
| generate | 22 |
| step | 31.5 |

## Update

| optimiser step | loss | grad_norm | trained_sequences |
|---|---|---|---|
| 0 | 0.5 | 1 | 4 |
| 1 | 0.25 | 2 | 4 |

## Collapse monitor

| indicator | value |
|---|---|
| not_okay_ratio | 0.5 |
| junk_share | 0 |

## Alerts

- step 1: not_okay_ratio 0.5 > 0.2
"""
    lines = step_lines(STEP, SAMPLES, seconds, update, {"not_okay_ratio": 0.5, "junk_share": 0.0})
    assert lines[:2] == ["verdicts: correct 3, compile_error 1, rule_violation 1, parse_error 1",
                         "mean score per turn: turn 1 0.500, turn 2 1.033"]
    assert lines[2] == "update: 2 optimiser steps, loss 0.25, grad norm 2, 4 samples with non-zero advantage"


def test_the_run_summary_gathers_the_steps():
    steps = [{"step": 0, "turns": [{"turn": 0, "score_mean": 0.1}, {"turn": 1, "score_mean": 0.2}],
              "verdicts": {"correct": 1, "parse_error": 3}, "tasks": [{"task": "a", "best_speedup": 1.5}]},
             {"step": 1, "turns": [{"turn": 0, "score_mean": 0.3}], "verdicts": {"parse_error": 2, "timeout": 1},
              "tasks": [{"task": "a", "best_speedup": 0.5}, {"task": "b", "best_speedup": 0.0}]}]
    assert run_summary(steps) == {"score_per_turn": {0: {0: 0.1, 1: 0.2}, 1: {0: 0.3}},
                                  "verdicts": {"correct": 1, "timeout": 1, "parse_error": 5},
                                  "best_speedup": {"a": 1.5, "b": 0.0}}
