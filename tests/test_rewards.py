"""Turn returns and group advantages, against numbers worked out by hand in the comments."""

from __future__ import annotations

import math

import pytest
import torch

from kevin import rewards
from kevin.records import evaluation as records
from kevin.rewards import AGGREGATIONS, RewardConfig, group_advantages, register_aggregation, turn_returns

SCORES = [0.0, 1.3, 0.3]  # turn 0 failed; turn 1 correct at 1.0x (0.3 + 1.0); turn 2 correct but very slow (0.3 + ~0)


def close(actual, expected, tol=1e-9):
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        assert a == pytest.approx(e, abs=tol), (actual, expected)


# ---------------------------------------------------------------- kernel score


def test_kernel_score_is_the_evaluators_one():
    # Re-used, not duplicated: one definition of the reward in the code base.
    assert rewards.kernel_score is records.kernel_score
    assert rewards.kernel_score(True, 1.0) == pytest.approx(1.3)  # 0.3 for correct + 1.0x speedup
    assert rewards.kernel_score(False, 5.0) == 0.0  # incorrect: no credit for a "speedup"
    assert rewards.kernel_score(True, 5.0, rule_violation=True) == 0.0


# ---------------------------------------------------------------- turn returns


def test_sum_returns_by_hand():
    # gamma 0.4: R2 = 0.3; R1 = 1.3 + 0.4*0.3 = 1.42; R0 = 0 + 0.4*1.3 + 0.16*0.3 = 0.52 + 0.048 = 0.568
    close(turn_returns(SCORES, "sum", 0.4), [0.568, 1.42, 0.3])


def test_sum_returns_gamma_edges():
    # gamma 0: only the turn's own score (= greedy). gamma 1: plain suffix sums 1.6, 1.6, 0.3.
    close(turn_returns(SCORES, "sum", 0.0), [0.0, 1.3, 0.3])
    close(turn_returns(SCORES, "sum", 1.0), [1.6, 1.6, 0.3])


def test_max_returns_by_hand():
    # gamma 0.4: R2 = 0.3; R1 = max(1.3, 0.4*0.3=0.12) = 1.3; R0 = max(0, 0.4*1.3=0.52, 0.16*0.3=0.048) = 0.52
    close(turn_returns(SCORES, "max", 0.4), [0.52, 1.3, 0.3])
    # gamma 0.8, scores [0.3, 0, 2.0]: R2 = 2.0; R1 = max(0, 0.8*2) = 1.6; R0 = max(0.3, 0, 0.64*2 = 1.28) = 1.28
    # (a later, discounted score beats the turn's own one); the sum would give R0 = 0.3 + 0 + 1.28 = 1.58.
    close(turn_returns([0.3, 0.0, 2.0], "max", 0.8), [1.28, 1.6, 2.0])
    close(turn_returns([0.3, 0.0, 2.0], "sum", 0.8), [1.58, 1.6, 2.0])


def test_greedy_and_outcome_by_hand():
    close(turn_returns(SCORES, "greedy", 0.4), [0.0, 1.3, 0.3])  # R_t = S_t
    close(turn_returns(SCORES, "outcome", 0.4), [1.3, 1.3, 1.3])  # best of the trajectory, undiscounted
    # gamma is ignored by both
    assert turn_returns(SCORES, "greedy", 0.9) == turn_returns(SCORES, "greedy", 0.1)
    assert turn_returns(SCORES, "outcome", 0.9) == turn_returns(SCORES, "outcome", 0.1)


@pytest.mark.parametrize("name", ["sum", "max", "greedy", "outcome"])
def test_single_and_empty_trajectories(name):
    # One turn: every aggregation returns that turn's score; a trajectory with no turns returns nothing.
    assert turn_returns([2.5], name, 0.4) == [2.5]
    assert turn_returns([], name, 0.4) == []


def test_registry_lists_the_paper_aggregations():
    assert {"sum", "max", "greedy", "outcome"} <= set(AGGREGATIONS)


def test_register_a_new_aggregation(monkeypatch):
    monkeypatch.setattr(rewards, "AGGREGATIONS", dict(rewards.AGGREGATIONS))  # keep the real registry clean

    @register_aggregation("last")
    def last(scores, gamma):
        return [scores[-1]] * len(scores)

    assert turn_returns(SCORES, "last", 0.4) == [0.3, 0.3, 0.3]
    with pytest.raises(ValueError, match="gamma"):  # registered functions get the input checks too
        rewards.AGGREGATIONS["last"](SCORES, 2.0)
    with pytest.raises(ValueError, match="already registered"):
        register_aggregation("sum")(last)


def test_turn_return_errors():
    with pytest.raises(ValueError, match=r"unknown turn-return aggregation 'mean'.*greedy"):
        turn_returns(SCORES, "mean", 0.4)
    for gamma in (-0.1, 1.5, float("nan"), True):
        with pytest.raises(ValueError, match=r"gamma must be a number in \[0, 1\]"):
            turn_returns(SCORES, "sum", gamma)
    for bad in (float("nan"), float("inf")):
        with pytest.raises(ValueError, match="finite"):
            turn_returns([0.3, bad], "sum", 0.4)


# ---------------------------------------------------------------- advantages

# Three tasks in one batch, interleaved, with arbitrary ids:
#   task 7: returns 0.3, 1.3, 2.3 -> mean 1.3, deviations -1, 0, 1, sample var (1+0+1)/2 = 1, std 1
#   task 2: returns 5.0, 2.0, 8.0 -> mean 5, deviations 0, -3, 3, sample var (0+9+9)/2 = 9, std 3
#   task 4: one sample (7.0) -> advantage 0
RETURNS = torch.tensor([0.3, 5.0, 1.3, 2.0, 2.3, 8.0, 7.0])
GROUPS = torch.tensor([7, 2, 7, 2, 7, 2, 4])
EPS = 1e-4


def test_advantages_scaled_by_std():
    adv = group_advantages(RETURNS, GROUPS, eps=EPS)
    expected = [-1 / (1 + EPS), 0.0, 0.0, -3 / (3 + EPS), 1 / (1 + EPS), 3 / (3 + EPS), 0.0]
    close(adv.tolist(), expected, tol=1e-6)


def test_advantages_without_std_dr_grpo():
    # Only the group mean is subtracted: the deviations themselves.
    adv = group_advantages(RETURNS, GROUPS, scale_by_std=False)
    close(adv.tolist(), [-1.0, 0.0, 0.0, -3.0, 1.0, 3.0, 0.0], tol=1e-6)


def test_advantages_leave_one_out():
    # task 7: 0.3 - (1.3+2.3)/2 = -1.5; 1.3 - (0.3+2.3)/2 = 0; 2.3 - (0.3+1.3)/2 = 1.5
    # task 2: 5 - (2+8)/2 = 0; 2 - (5+8)/2 = -4.5; 8 - (5+2)/2 = 4.5   (= k/(k-1) = 1.5 x the deviations)
    loo = [-1.5, 0.0, 0.0, -4.5, 1.5, 4.5, 0.0]
    close(group_advantages(RETURNS, GROUPS, scale_by_std=False, leave_one_out=True).tolist(), loo, tol=1e-6)
    # with std scaling: divided by each task's std (1 and 3) plus eps
    scaled = [-1.5 / (1 + EPS), 0.0, 0.0, -4.5 / (3 + EPS), 1.5 / (1 + EPS), 4.5 / (3 + EPS), 0.0]
    close(group_advantages(RETURNS, GROUPS, leave_one_out=True, eps=EPS).tolist(), scaled, tol=1e-6)


def test_advantages_of_equal_returns_are_zero():
    # All kernels of a task failed: no signal, and float rounding must not be blown up by the std division.
    assert group_advantages(torch.zeros(8), torch.zeros(8, dtype=torch.long)).tolist() == [0.0] * 8
    # Equal non-zero returns: exactly 0 in every variant (their float mean is not exactly 0.1 or 0.7).
    for kwargs in ({}, {"scale_by_std": False}, {"leave_one_out": True}):
        same = group_advantages(torch.tensor([0.1] * 7 + [0.7] * 3), [0] * 7 + [1] * 3, **kwargs)
        assert same.tolist() == [0.0] * 10
    # A flat group beside one with spread keeps the other's advantages.
    mixed = group_advantages(torch.tensor([0.7, 0.7, 0.7, 0.0, 1.0], dtype=torch.float64), [3, 3, 3, 5, 5], eps=EPS)
    assert mixed[:3].tolist() == [0.0] * 3
    close(mixed[3:].tolist(), [-0.5 / (0.5 ** 0.5 + EPS), 0.5 / (0.5 ** 0.5 + EPS)], tol=1e-9)
    assert group_advantages(torch.tensor([4.0]), [0], leave_one_out=True).tolist() == [0.0]  # singleton


def test_a_std_floor_keeps_timing_jitter_from_becoming_advantages():
    # The eighth H200 run's cumsum group: correct kernels scored 0.716 and 0.717 (timing jitter), and a group with a
    # real difference (a failing kernel at 0, a correct one at 0.5).
    returns = torch.tensor([0.716, 0.717, 0.0, 0.5], dtype=torch.float64)
    groups = [0, 0, 1, 1]
    # group 0: deviations -/+0.0005, sample std 0.0005 * sqrt(2) = 0.000707; group 1: -/+0.25, std 0.25 * sqrt(2)
    jitter_std, real_std = 0.0005 * 2 ** 0.5, 0.25 * 2 ** 0.5
    plain = group_advantages(returns, groups, eps=EPS)
    close(plain.tolist(), [-0.0005 / (jitter_std + EPS), 0.0005 / (jitter_std + EPS),
                           -0.25 / (real_std + EPS), 0.25 / (real_std + EPS)], tol=1e-9)
    assert abs(plain[0]) > 0.6  # GRPO as published: jitter weighs as much as correctness
    floored = group_advantages(returns, groups, eps=EPS, std_floor=0.05)
    close(floored.tolist(), [-0.0005 / (0.05 + EPS), 0.0005 / (0.05 + EPS),  # -/+0.00998
                             -0.25 / (real_std + EPS), 0.25 / (real_std + EPS)], tol=1e-9)  # unchanged: std > floor
    config = RewardConfig(std_floor=0.05)
    assert config.advantages(returns, groups).tolist() == floored.tolist()
    assert RewardConfig.from_dict(config.to_dict()) == config
    # Dr-GRPO divides by nothing, so the floor has nothing to do.
    assert group_advantages(returns, groups, scale_by_std=False, std_floor=0.05).tolist() == \
        group_advantages(returns, groups, scale_by_std=False).tolist()
    with pytest.raises(ValueError, match="std_floor"):
        group_advantages(returns, groups, std_floor=-0.1)


def test_advantages_keep_shape_and_dtype():
    # [tasks=2, samples=3] in, same out; group ids may be a nested list; float32 stays float32.
    returns = torch.tensor([[0.3, 1.3, 2.3], [5.0, 2.0, 8.0]], dtype=torch.float32)
    adv = group_advantages(returns, [[0, 0, 0], [1, 1, 1]], scale_by_std=False)
    assert adv.shape == (2, 3) and adv.dtype == torch.float32
    close(adv.flatten().tolist(), [-1.0, 0.0, 1.0, 0.0, -3.0, 3.0], tol=1e-6)
    assert group_advantages(torch.zeros(0), torch.zeros(0, dtype=torch.long)).shape == (0,)


def test_advantage_errors():
    with pytest.raises(ValueError, match="shape"):
        group_advantages(RETURNS, GROUPS[:3])
    with pytest.raises(ValueError, match="eps"):
        group_advantages(RETURNS, GROUPS, eps=0.0)


def test_scores_to_advantages_end_to_end():
    # 2 tasks x 2 trajectories x 2 turns, sum returns with gamma 0.4, Dr-GRPO advantages.
    # task 0, traj a: scores [0, 1.3] -> returns [0.4*1.3, 1.3] = [0.52, 1.3]
    #         traj b: scores [0.3, 0] -> returns [0.3, 0]
    #   group mean (0.52 + 1.3 + 0.3 + 0) / 4 = 0.53 -> advantages [-0.01, 0.77, -0.23, -0.53]
    # task 1: every score 0 -> every advantage 0
    config = RewardConfig(scale_by_std=False)
    trajectories = {0: [[0.0, 1.3], [0.3, 0.0]], 1: [[0.0, 0.0], [0.0, 0.0]]}
    returns, groups = [], []
    for task, trajs in trajectories.items():
        for scores in trajs:
            turn_r = config.returns(scores)
            returns += turn_r
            groups += [task] * len(turn_r)
    adv = config.advantages(torch.tensor(returns, dtype=torch.float64), groups)
    close(adv.tolist(), [-0.01, 0.77, -0.23, -0.53, 0.0, 0.0, 0.0, 0.0], tol=1e-12)


# ---------------------------------------------------------------- config


def test_reward_config_defaults_and_round_trip():
    config = RewardConfig()
    assert (config.aggregation, config.gamma, config.scale_by_std, config.leave_one_out, config.eps, config.std_floor) \
        == ("sum", 0.4, True, False, 1e-4, 0.0)
    assert RewardConfig.from_dict(config.to_dict()) == config
    close(RewardConfig(aggregation="max", gamma=0.4).returns(SCORES), [0.52, 1.3, 0.3])


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"aggregation": "mean"}, r"rewards.aggregation must be one of \['greedy', 'max', 'outcome', 'sum'"),
        ({"gamma": 1.2}, r"gamma must be a number in \[0, 1\]"),
        ({"gamma": -0.5}, r"gamma must be a number in \[0, 1\]"),
        ({"scale_by_std": "yes"}, "rewards.scale_by_std must be true or false"),
        ({"leave_one_out": 1}, "rewards.leave_one_out must be true or false"),
        ({"eps": 0.0}, "rewards.eps must be a positive number"),
        ({"eps": math.nan}, "rewards.eps must be a positive number"),
        ({"std_floor": -0.05}, r"rewards.std_floor must be a number >= 0"),
        ({"std_floor": True}, r"rewards.std_floor must be a number >= 0"),
        ({"group": "trajectory"}, r"rewards.group must be one of \['task', 'turn'\]"),
    ],
)
def test_reward_config_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        RewardConfig(**kwargs)


def test_reward_config_unknown_key():
    with pytest.raises(ValueError, match=r"unknown rewards settings: \['discount'\]"):
        RewardConfig.from_dict({"discount": 0.4})
