"""The GRPO loss against numbers worked out by hand in the comments.

Log-probs are built from the ratios we want: logp_old = 0, logp_new = log(ratio), so ratio = exp(new - old).
"""

from __future__ import annotations

import math

import pytest
import torch

from kevin.training.loss import (
    LOSS_AGGREGATIONS,
    LossConfig,
    aggregate_token_loss,
    clipped_token_loss,
    k3_kl,
    policy_loss,
)


def logps_for(ratios) -> tuple[torch.Tensor, torch.Tensor]:
    """(logp_new [B, T] requiring grad, logp_old [B, T]) with exp(new - old) = ratios."""
    ratios = torch.tensor(ratios, dtype=torch.float64)
    return ratios.log().requires_grad_(True), torch.zeros_like(ratios)


# Four single-token sequences covering the four clip cases (eps_low 0.2, eps_high 0.28):
#   ratio 1.5, A=+1: min(1.5*1, 1.28*1) = 1.28 -> loss -1.28, clipped high (no gradient)
#   ratio 1.5, A=-1: min(-1.5, -1.28) = -1.5  -> loss +1.5, unclipped: d loss / d logp = -A*ratio = +1.5
#   ratio 0.5, A=-1: min(-0.5, -0.8) = -0.8   -> loss +0.8, clipped low at 0.8 (no gradient)
#   ratio 0.5, A=+1: min(0.5, 0.8) = 0.5      -> loss -0.5, unclipped: d loss / d logp = -A*ratio = -0.5
CASE_RATIOS = [[1.5], [1.5], [0.5], [0.5]]
CASE_ADV = torch.tensor([1.0, -1.0, -1.0, 1.0], dtype=torch.float64)
CASE_MASK = torch.ones(4, 1)


def test_clip_higher_per_token_losses():
    new, old = logps_for(CASE_RATIOS)
    per_token, ratio = clipped_token_loss(new, old, CASE_ADV, CASE_MASK, eps_low=0.2, eps_high=0.28)
    assert per_token.squeeze(1).tolist() == pytest.approx([-1.28, 1.5, 0.8, -0.5])
    assert ratio.squeeze(1).tolist() == pytest.approx([1.5, 1.5, 0.5, 0.5])


def test_clip_higher_is_asymmetric():
    # Ratio 1.25 with A=+1 lies inside the upper bound 1.28 (loss -1.25, gradient -1.25) but is clipped by
    # the symmetric PPO bound 1.2 (loss -1.2, gradient 0). Ratio 0.75 with A=-1 is clipped low at 0.8 either way.
    adv = torch.tensor([1.0, -1.0], dtype=torch.float64)
    mask = torch.ones(2, 1)
    new, old = logps_for([[1.25], [0.75]])
    per_token, _ = clipped_token_loss(new, old, adv, mask, eps_low=0.2, eps_high=0.28)
    assert per_token.squeeze(1).tolist() == pytest.approx([-1.25, 0.8])
    per_token.sum().backward()
    assert new.grad.squeeze(1).tolist() == pytest.approx([-1.25, 0.0])

    new, old = logps_for([[1.25], [0.75]])
    per_token, _ = clipped_token_loss(new, old, adv, mask, eps_low=0.2, eps_high=0.2)
    assert per_token.squeeze(1).tolist() == pytest.approx([-1.2, 0.8])
    per_token.sum().backward()
    assert new.grad.squeeze(1).tolist() == pytest.approx([0.0, 0.0])


def test_gradient_flows_only_where_unclipped():
    # dr_grpo with B=4 sequences and constant 1: loss = (-1.28 + 1.5 + 0.8 - 0.5) / (4*1) = 0.52/4 = 0.13;
    # gradients = (0, +1.5, 0, -0.5) / 4 = (0, 0.375, 0, -0.125).
    new, old = logps_for(CASE_RATIOS)
    loss, metrics = policy_loss(new, old, CASE_ADV, CASE_MASK, LossConfig(max_completion_length=1))
    assert loss.item() == pytest.approx(0.13)
    loss.backward()
    assert new.grad.squeeze(1).tolist() == pytest.approx([0.0, 0.375, 0.0, -0.125])
    # clipped: 1 of 4 high (ratio 1.5, A>0), 1 of 4 low (ratio 0.5, A<0)
    assert metrics["clip_fraction"] == pytest.approx(0.5)
    assert metrics["clip_fraction_high"] == pytest.approx(0.25)
    assert metrics["clip_fraction_low"] == pytest.approx(0.25)
    assert metrics["ratio_mean"] == pytest.approx(1.0)  # (1.5 + 1.5 + 0.5 + 0.5) / 4


# Two sequences, T=3, the second one token long; on-policy (ratio 1) so each token's loss is -A:
#   row 0, A=+1: [-1, -1, -1]; row 1, A=-2: [+2, pad, pad]. Token sum = -3 + 2 = -1, 4 real tokens.
ROW_MASK = torch.tensor([[1, 1, 1], [1, 0, 0]])
ROW_ADV = torch.tensor([1.0, -2.0])


def on_policy(mask=ROW_MASK):
    new = torch.zeros(mask.shape, dtype=torch.float64, requires_grad=True)
    return new, new.detach().clone()


def test_dr_grpo_divides_by_the_constant_not_the_lengths():
    new, old = on_policy()
    loss, _ = policy_loss(new, old, ROW_ADV, ROW_MASK, LossConfig(max_completion_length=10))
    assert loss.item() == pytest.approx(-1 / (2 * 10))  # -0.05
    loss.backward()
    # every real token gets -A / (B * 10), whatever its sequence's length: -1/20 and +2/20
    assert new.grad.flatten().tolist() == pytest.approx([-0.05, -0.05, -0.05, 0.1, 0.0, 0.0])
    # Doubling the constant halves the loss; widening the padding changes nothing.
    new, old = on_policy()
    assert policy_loss(new, old, ROW_ADV, ROW_MASK, LossConfig(max_completion_length=20))[0].item() == pytest.approx(-0.025)
    wide = torch.cat([ROW_MASK, torch.zeros(2, 4, dtype=ROW_MASK.dtype)], dim=1)  # T = 7
    new, old = on_policy(wide)
    assert policy_loss(new, old, ROW_ADV, wide, LossConfig(max_completion_length=10))[0].item() == pytest.approx(-0.05)


def test_token_mean_and_sequence_mean():
    new, old = on_policy()
    # token_mean (DAPO): -1 / 4 real tokens = -0.25
    loss, _ = policy_loss(new, old, ROW_ADV, ROW_MASK, LossConfig(aggregation="token_mean"))
    assert loss.item() == pytest.approx(-0.25)
    # sequence_mean (GRPO): row means -1 and +2, mean of those = 0.5; the short row weighs as much as the long one
    loss, _ = policy_loss(new, old, ROW_ADV, ROW_MASK, LossConfig(aggregation="sequence_mean"))
    assert loss.item() == pytest.approx(0.5)
    loss.backward()
    assert new.grad.flatten().tolist() == pytest.approx([-1 / 6, -1 / 6, -1 / 6, 1.0, 0.0, 0.0])  # -A / (len * B)


@pytest.mark.parametrize("aggregation, full", [("dr_grpo", -0.05), ("token_mean", -0.25), ("sequence_mean", 0.5)])
def test_micro_batches_sum_to_the_full_batch(aggregation, full):
    # Split the two rows into micro-batches of one, passing the step's totals (2 sequences, 4 tokens):
    #   dr_grpo: -3/(2*10) + 2/(2*10) = -0.05; token_mean: -3/4 + 2/4 = -0.25; sequence_mean: -1/2 + 2/2 = 0.5
    config = LossConfig(aggregation=aggregation, max_completion_length=10)
    total = 0.0
    for row in range(2):
        new, old = on_policy(ROW_MASK[row:row + 1])
        loss, _ = policy_loss(new, old, ROW_ADV[row:row + 1], ROW_MASK[row:row + 1], config, num_sequences=2, num_tokens=4)
        total += loss.item()
    assert total == pytest.approx(full)


def test_masked_tokens_are_ignored_even_if_garbage():
    # Padding may hold -inf / NaN log-probs (e.g. from a masked softmax): neither the loss nor the gradient
    # may see them. Same numbers as the dr_grpo test above.
    new = torch.tensor([[0.0, 0.0, 0.0], [0.0, float("nan"), float("-inf")]], dtype=torch.float64, requires_grad=True)
    old = torch.tensor([[0.0, 0.0, 0.0], [0.0, float("-inf"), 3.0]], dtype=torch.float64)
    loss, metrics = policy_loss(new, old, ROW_ADV, ROW_MASK.bool(), LossConfig(max_completion_length=10))
    assert loss.item() == pytest.approx(-0.05)
    loss.backward()
    assert new.grad.flatten().tolist() == pytest.approx([-0.05, -0.05, -0.05, 0.1, 0.0, 0.0])
    assert all(math.isfinite(v) for v in metrics.values())
    assert metrics["ratio_mean"] == pytest.approx(1.0) and metrics["approx_kl"] == pytest.approx(0.0)


def test_on_policy_metrics_and_kl_free_path():
    # beta 0: no reference needed, no kl_ref metric, and the loss is the policy-gradient term alone.
    new, old = on_policy()
    loss, metrics = policy_loss(new, old, ROW_ADV, ROW_MASK, LossConfig(max_completion_length=10))
    assert metrics["pg_loss"] == pytest.approx(loss.item())
    assert "kl_ref" not in metrics
    assert metrics["clip_fraction"] == 0.0 and metrics["ratio_mean"] == pytest.approx(1.0)
    assert metrics["approx_kl"] == pytest.approx(0.0)
    assert not LossConfig().needs_reference


def test_approx_kl_metric_by_hand():
    # Ratios 2 and 1 on two real tokens (a third is padding): k3 of (old || new) = (r - 1) - ln r
    #   = (1 - ln 2) = 0.306853 and 0 -> mean 0.153426; ratio_mean = (2 + 1) / 2 = 1.5
    new, old = logps_for([[2.0, 1.0, 7.0]])
    mask = torch.tensor([[1, 1, 0]])
    _, metrics = policy_loss(new, old, torch.tensor([0.0]), mask, LossConfig(max_completion_length=3))
    assert metrics["approx_kl"] == pytest.approx((1 - math.log(2)) / 2)
    assert metrics["ratio_mean"] == pytest.approx(1.5)


def test_kl_penalty_by_hand():
    # One token, on-policy, A = 0 (no policy-gradient term); ref - new = ln 2:
    #   k3 = e^(ln 2) - ln 2 - 1 = 1 - ln 2 = 0.306853; loss = beta * k3 / (B*L = 1) = 0.0306853
    #   d k3 / d new = -e^(ref - new) + 1 = -1, so the gradient is beta * -1 = -0.1 (pulls new up towards ref)
    new = torch.zeros(1, 1, dtype=torch.float64, requires_grad=True)
    ref = torch.full((1, 1), math.log(2), dtype=torch.float64)
    mask = torch.ones(1, 1)
    assert k3_kl(new, ref, mask).item() == pytest.approx(1 - math.log(2))
    config = LossConfig(beta=0.1, max_completion_length=1)
    loss, metrics = policy_loss(new, new.detach(), torch.zeros(1), mask, config, logp_ref=ref)
    assert loss.item() == pytest.approx(0.1 * (1 - math.log(2)))
    assert metrics["kl_ref"] == pytest.approx(1 - math.log(2)) and metrics["pg_loss"] == pytest.approx(0.0)
    loss.backward()
    assert new.grad.item() == pytest.approx(-0.1)
    # A reference given with beta 0 is only reported, never added to the loss.
    loss0, metrics0 = policy_loss(new, new.detach(), torch.zeros(1), mask, LossConfig(max_completion_length=1), logp_ref=ref)
    assert loss0.item() == 0.0 and metrics0["kl_ref"] == pytest.approx(1 - math.log(2))


def test_kl_needs_a_reference():
    new, old = on_policy()
    with pytest.raises(ValueError, match="beta > 0 needs logp_ref"):
        policy_loss(new, old, ROW_ADV, ROW_MASK, LossConfig(beta=0.01, max_completion_length=10))


def test_low_precision_inputs_are_computed_in_float32():
    new = torch.zeros(2, 3, dtype=torch.bfloat16, requires_grad=True)
    loss, _ = policy_loss(new, new.detach(), ROW_ADV.bfloat16(), ROW_MASK, LossConfig(max_completion_length=10))
    assert loss.dtype == torch.float32 and loss.item() == pytest.approx(-0.05)


def test_shape_and_length_errors():
    new, old = on_policy()
    config = LossConfig(max_completion_length=10)
    with pytest.raises(ValueError, match=r"advantages must be \[B\]"):
        policy_loss(new, old, ROW_ADV.unsqueeze(1), ROW_MASK, config)
    with pytest.raises(ValueError, match="mask shape"):
        policy_loss(new, old, ROW_ADV, ROW_MASK[:, :2], config)
    with pytest.raises(ValueError, match="max new tokens"):
        policy_loss(new, old, ROW_ADV, ROW_MASK, LossConfig(max_completion_length=2))  # T = 3 > 2
    with pytest.raises(ValueError, match="unknown loss aggregation 'mean'"):
        aggregate_token_loss(torch.zeros(2, 3), ROW_MASK, "mean", max_len=10)


def test_loss_config_defaults_and_round_trip():
    config = LossConfig()
    assert (config.eps_low, config.eps_high, config.aggregation, config.beta) == (0.2, 0.28, "dr_grpo", 0.0)
    assert config.max_completion_length == 16384
    assert LossConfig.from_dict(config.to_dict()) == config
    assert {"dr_grpo", "token_mean", "sequence_mean"} <= set(LOSS_AGGREGATIONS)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"eps_low": -0.1}, r"loss.eps_low must be in \[0, 1\)"),
        ({"eps_low": 1.0}, r"loss.eps_low must be in \[0, 1\)"),
        ({"eps_high": -0.2}, "loss.eps_high must be >= 0"),
        ({"aggregation": "mean"}, r"loss.aggregation must be one of \['dr_grpo', 'sequence_mean', 'token_mean'\]"),
        ({"max_completion_length": 0}, "generation's max new tokens"),
        ({"max_completion_length": 1.5}, "positive integer"),
        ({"beta": -0.001}, "loss.beta must be >= 0"),
        ({"beta": math.nan}, "loss.beta must be >= 0"),
    ],
)
def test_loss_config_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        LossConfig(**kwargs)


def test_loss_config_unknown_key():
    with pytest.raises(ValueError, match=r"unknown loss settings: \['epsilon'\]"):
        LossConfig.from_dict({"epsilon": 0.2})
