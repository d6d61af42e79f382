"""Beam-style selection: survivors and branching by hand, strategies by name, config validation."""

from __future__ import annotations

import math

import pytest

from kevin.analysis import beam
from kevin.analysis.beam import BeamConfig, BeamStep, select, trajectory_scores
from kevin.analysis.outcomes import TrajectoryOutcome

T = TrajectoryOutcome.of


def test_top_k_keeps_the_best_and_refills_m():
    # m=4, keep 2: scores 2.0 (index 1) and 2.0 (index 3) tie, lower index first; each gets 4/2 = 2 slots
    step = select([0.1, 2.0, 0.5, 2.0], keep=2, strategy="top_k")
    assert step == BeamStep(survivors=(1, 3), parents=(1, 1, 3, 3))
    # m=5, keep 2: 5 = 2*2 + 1, the extra slot goes to the best survivor (index 0)
    assert select([3.0, 1.0, 2.0, 0.0, 0.0], keep=2).parents == (0, 0, 0, 2, 2)
    # keep 1: everything continues the single best
    assert select([0.3, 1.3, 0.0], keep=1) == BeamStep(survivors=(1,), parents=(1, 1, 1))
    # keep m: everyone survives once, best first
    assert select([0.3, 1.3, 0.0], keep=3) == BeamStep(survivors=(1, 0, 2), parents=(1, 0, 2))
    # m=8, keep 3: 8 = 3*2 + 2 -> ranks 0 and 1 get 3 slots, rank 2 gets 2
    assert select([0, 5, 0, 4, 0, 0, 3, 0], keep=3).parents == (1, 1, 1, 3, 3, 3, 6, 6)


def test_independent_keeps_every_trajectory():
    assert select([0.0, 9.0, 1.0], keep=1, strategy="independent") == BeamStep((0, 1, 2), (0, 1, 2))


def test_select_refuses_bad_input():
    with pytest.raises(ValueError, match="only 2"):
        select([1.0, 2.0], keep=3)
    with pytest.raises(ValueError, match="positive integer"):
        select([1.0, 2.0], keep=0)
    with pytest.raises(ValueError, match="finite"):
        select([1.0, math.nan], keep=1)
    with pytest.raises(ValueError, match="unknown selection strategy"):
        select([1.0], keep=1, strategy="beam")
    with pytest.raises(ValueError, match="no trajectories"):
        select([], keep=1)


def test_register_a_strategy():
    @beam.register_selection("test_worst_first")
    def worst(scores, keep):
        order = sorted(range(len(scores)), key=lambda i: scores[i])[:keep]
        return BeamStep(tuple(order), tuple(order[j % keep] for j in range(len(scores))))

    try:
        assert select([1.0, 0.0, 2.0], keep=2, strategy="test_worst_first").parents == (1, 0, 1)
        with pytest.raises(ValueError, match="already registered"):
            beam.register_selection("test_worst_first")(worst)

        @beam.register_selection("test_broken")
        def broken(scores, keep):
            return BeamStep((0,), (0,))

        with pytest.raises(ValueError, match="returned parents"):
            select([1.0, 2.0], keep=1, strategy="test_broken")
    finally:
        beam.SELECTIONS.pop("test_worst_first", None)
        beam.SELECTIONS.pop("test_broken", None)


def test_trajectory_scores():
    trajs = [
        T((True, 1.2), (True, 0.8)),  # best kernel 0.3 + 1.2 = 1.5; last 0.3 + 0.8 = 1.1
        T((True, 0.5), (False, 9.0)),  # best 0.8; last incorrect: 0
        T((False, 0.0),),  # 0 either way
        TrajectoryOutcome(()),  # no kernel yet: 0
    ]
    assert trajectory_scores(trajs, "best") == pytest.approx([1.5, 0.8, 0.0, 0.0])
    assert trajectory_scores(trajs, "last") == pytest.approx([1.1, 0.0, 0.0, 0.0])
    with pytest.raises(ValueError, match="score by"):
        trajectory_scores(trajs, "mean")


def test_beam_config():
    trajs = [T((True, 0.2)), T((True, 1.2), (False, 0.0)), T((False, 0.0)), T((True, 1.0))]
    # by best: 0.5, 1.5, 0, 1.3 -> keep 2: indices 1 and 3, two slots each
    assert BeamConfig(strategy="top_k", keep=2).step(trajs) == BeamStep((1, 3), (1, 1, 3, 3))
    # by last: 0.5, 0, 0, 1.3 -> indices 3 and 0
    assert BeamConfig(strategy="top_k", keep=2, score="last").step(trajs).parents == (3, 3, 0, 0)
    assert BeamConfig(keep=8).step(trajs).parents == (0, 1, 2, 3)  # independent ignores keep
    with pytest.raises(ValueError, match="unknown"):
        BeamConfig(strategy="greedy")
    with pytest.raises(ValueError, match="positive integer"):
        BeamConfig(keep=0)
    with pytest.raises(ValueError, match="score must be"):
        BeamConfig(score="mean")
    with pytest.raises(ValueError, match="unknown beam settings"):
        BeamConfig.from_dict({"k": 2})
