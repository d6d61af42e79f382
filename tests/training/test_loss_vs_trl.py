"""Our Dr-GRPO loss against TRL's ``loss_type="dr_grpo"`` on the same tensors (written against trl 1.16.0).

How the comparison is made: TRL's loss lives inside ``GRPOTrainer._compute_loss(self, model, inputs)``
(trl/trainer/grpo_trainer.py, 1.16.0: lines 3020-3290). We call that very function with a stub ``self``
that holds only the attributes it reads and whose ``_get_per_token_logps_and_entropies`` returns our
log-probs, so TRL's own code computes the ratio, clipping, KL, Dr-GRPO normalisation and clip metrics.
A second test re-types TRL's formula lines (cited there), so the comparison survives if the stub goes
stale after an upgrade; and TRL's advantage lines are compared with ``group_advantages``.

Where the definitions coincide (what is asserted here): one micro-batch, no gradient accumulation,
token-level importance sampling; symmetric clip (TRL ``epsilon_high=None``) AND clip-higher (TRL
``epsilon_high=0.28``: TRL 1.16 has it too, so clip-higher is not a difference in the formula); beta = 0
and beta > 0 with the same k3 estimator; TRL's ``scale_rewards="group"``/``"none"`` vs our
``scale_by_std`` True/False (both: sample std, eps 1e-4).

Where they differ (not a bug in either):
- What a sample is. TRL: one completion of one prompt; a group is the G completions of that prompt;
  A comes from that completion's reward. Ours: one TURN of a multi-turn trajectory (prompt = that turn's
  context); a group is all m x n turn samples of a task, whose prompts differ; A comes from the turn's
  discounted return (kevin.rewards). The loss formula does not see this, the rows and A do.
- The constant. Both divide by rows x max_completion_length, but TRL takes the rows of the current
  micro-batch and then divides by gradient_accumulation_steps (exact only when micro-batches have equal
  rows); we take ``num_sequences`` (the step's total) explicitly, exact for uneven micro-batches.
  We also refuse completions wider than the constant (TRL does not check).
- Defaults: TRL epsilon 0.2 / epsilon_high None (symmetric), loss_type "dapo"; ours 0.2 / 0.28, dr_grpo.
- Padding: we zero padded positions with ``where`` before ``exp`` (NaN/-inf in padding stay harmless);
  TRL multiplies by the mask (NaN * 0 = NaN). Equal on finite inputs, which is what is compared.
- Precision: we compute the ratio in float32 at least; TRL in the input dtype (bf16 stays bf16).
- No leave-one-out baseline in TRL; TRL logs no approx_kl to the old policy (our ``approx_kl``).
"""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

from kevin.rewards import group_advantages
from kevin.training.loss import LossConfig, policy_loss

trl = pytest.importorskip("trl")
grpo_trainer = pytest.importorskip("trl.trainer.grpo_trainer")
trl_utils = pytest.importorskip("trl.trainer.utils")

B, T, MAX_LEN = 6, 9, 16


def make_batch(seed: int = 0):
    """Random [B, T] log-probs with ratios spread well past both clip bounds, right-padded masks, A [B]."""
    g = torch.Generator().manual_seed(seed)
    logp_old = -3.0 * torch.rand(B, T, generator=g, dtype=torch.float64)
    logp_new = logp_old + 0.4 * torch.randn(B, T, generator=g, dtype=torch.float64)
    logp_ref = logp_old + 0.2 * torch.randn(B, T, generator=g, dtype=torch.float64)
    signs = torch.tensor([1.0, -1.0, 1.0, -1.0, 1.0, -1.0], dtype=torch.float64)  # both clip sides get used
    advantages = signs * (0.1 + torch.rand(B, generator=g, dtype=torch.float64))
    lengths = torch.tensor([9, 1, 5, 7, 3, 9])
    mask = (torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)).long()  # [B, T], TRL's completion_mask dtype
    return logp_new, logp_old, logp_ref, advantages, mask


class _SingleProcessAccelerator:
    """What _compute_loss asks of accelerate, on one process: reductions are the identity."""

    num_processes = 1
    sync_gradients = True

    def reduce(self, tensor, reduction="sum"):
        return tensor

    def gather(self, tensor):
        return tensor

    def gather_for_metrics(self, tensor):
        return tensor


def trl_dr_grpo(logp_new, logp_old, advantages, mask, *, eps_low, eps_high, max_len, beta=0.0, logp_ref=None):
    """TRL's GRPOTrainer._compute_loss (loss_type="dr_grpo") on our tensors; returns (loss, metrics)."""
    rows, width = logp_new.shape
    stub = SimpleNamespace(
        # the model forward, replaced by our log-probs (entropies only feed a metric)
        _get_per_token_logps_and_entropies=lambda *args, **kwargs: (logp_new, torch.zeros_like(logp_new), None),
        top_entropy_quantile=1.0,
        off_policy_mask_threshold=None,
        importance_sampling_level="token",
        beta=beta,
        loss_type="dr_grpo",
        epsilon_low=eps_low,
        epsilon_high=eps_high,
        args=SimpleNamespace(delta=None, use_bias_correction_kl=False),
        use_vllm=False,
        model=SimpleNamespace(training=True),
        current_gradient_accumulation_steps=1,
        max_completion_length=max_len,
        _entropy_bonus_enabled=False,
        aux_loss_enabled=False,
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
        accelerator=_SingleProcessAccelerator(),
    )
    inputs = {
        "prompt_ids": torch.zeros(rows, 1, dtype=torch.long),
        "prompt_mask": torch.ones(rows, 1, dtype=torch.long),
        "completion_ids": torch.zeros(rows, width, dtype=torch.long),
        "completion_mask": mask,
        "advantages": advantages,
        "old_per_token_logps": logp_old,
    }
    if beta:
        inputs["ref_per_token_logps"] = logp_ref
    loss = grpo_trainer.GRPOTrainer._compute_loss(stub, None, inputs)
    return loss, {key: values[-1] for key, values in stub._metrics["train"].items()}


def ours(logp_new, logp_old, advantages, mask, *, eps_low, eps_high, max_len, beta=0.0, logp_ref=None):
    config = LossConfig(eps_low=eps_low, eps_high=eps_high, aggregation="dr_grpo", max_completion_length=max_len, beta=beta)
    return policy_loss(logp_new, logp_old, advantages, mask, config, logp_ref=logp_ref if beta else None)


@pytest.mark.parametrize("eps_high", [0.2, 0.28], ids=["symmetric", "clip_higher"])
@pytest.mark.parametrize("beta", [0.0, 0.04], ids=["no_kl", "kl"])
@pytest.mark.parametrize("seed", [0, 1])
def test_dr_grpo_loss_and_gradient_equal_trls(eps_high, beta, seed):
    if not trl.__version__.startswith("1.16."):
        # The stub mirrors what 1.16's _compute_loss reads; the formula test below still runs.
        pytest.skip(f"stub written for trl 1.16, found {trl.__version__}: re-check GRPOTrainer._compute_loss")
    logp_new, logp_old, logp_ref, advantages, mask = make_batch(seed)
    kwargs = dict(eps_low=0.2, eps_high=eps_high, max_len=MAX_LEN, beta=beta, logp_ref=logp_ref)

    theirs_new = logp_new.clone().requires_grad_(True)
    trl_loss, trl_metrics = trl_dr_grpo(theirs_new, logp_old, advantages, mask, **kwargs)
    trl_loss.backward()

    ours_new = logp_new.clone().requires_grad_(True)
    our_loss, our_metrics = ours(ours_new, logp_old, advantages, mask, **kwargs)
    our_loss.backward()

    # the batch really exercises both clip sides, else the comparison would prove little
    assert our_metrics["clip_fraction_high"] > 0 and our_metrics["clip_fraction_low"] > 0
    torch.testing.assert_close(our_loss, trl_loss, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ours_new.grad, theirs_new.grad, rtol=1e-12, atol=1e-12)
    assert our_metrics["clip_fraction"] == pytest.approx(trl_metrics["clip_ratio/region_mean"])
    assert our_metrics["clip_fraction_high"] == pytest.approx(trl_metrics["clip_ratio/high_mean"])
    assert our_metrics["clip_fraction_low"] == pytest.approx(trl_metrics["clip_ratio/low_mean"])
    if beta:
        assert our_metrics["kl_ref"] == pytest.approx(trl_metrics["kl"])


@pytest.mark.parametrize("eps_high", [0.2, 0.28], ids=["symmetric", "clip_higher"])
def test_dr_grpo_loss_equals_trls_formula_lines(eps_high):
    """TRL 1.16.0 grpo_trainer.py, re-typed: lines 3083, 3095 (ratio), 3100-3102 (k3), 3113 and 3118-3120
    (clipped surrogate), 3150 (KL added per token), 3164 (Dr-GRPO: sum / (B * max_completion_length))."""
    logp_new, logp_old, logp_ref, advantages, mask = make_batch(seed=3)
    beta, eps_low = 0.04, 0.2
    adv = advantages.unsqueeze(1)
    coef_1 = torch.exp(logp_new - logp_old)
    per_token_kl = torch.exp(logp_ref - logp_new) - (logp_ref - logp_new) - 1
    coef_2 = torch.clamp(coef_1, 1 - eps_low, 1 + eps_high)
    per_token_loss = -torch.min(coef_1 * adv, coef_2 * adv) + beta * per_token_kl
    trl_loss = (per_token_loss * mask).sum() / (per_token_loss.size(0) * MAX_LEN)

    our_loss, _ = ours(logp_new, logp_old, advantages, mask, eps_low=eps_low, eps_high=eps_high, max_len=MAX_LEN,
                       beta=beta, logp_ref=logp_ref)
    torch.testing.assert_close(our_loss, trl_loss, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("scale_by_std", [True, False], ids=["scale_rewards_group", "scale_rewards_none"])
def test_group_advantages_equal_trls(scale_by_std):
    """TRL 1.16.0 grpo_trainer.py lines 2765-2787 (sum_then_normalize), re-typed with TRL's own ``nanstd``:
    A = (r - group mean) / (group sample std + 1e-4), or without the division for scale_rewards="none".
    TRL's groups are consecutive blocks of num_generations; ours are ids, here laid out the same way."""
    g = torch.Generator().manual_seed(5)
    num_generations, groups = 8, 3
    rewards = torch.rand(groups * num_generations, generator=g, dtype=torch.float64) * 3
    rewards[:num_generations] = 0.3  # a group with no spread
    mean = torch.nanmean(rewards.view(-1, num_generations), dim=1).repeat_interleave(num_generations, dim=0)
    std = trl_utils.nanstd(rewards.view(-1, num_generations), dim=1).repeat_interleave(num_generations, dim=0)
    expected = rewards - mean
    if scale_by_std:
        expected = expected / (std + 1e-4)

    ids = torch.arange(groups).repeat_interleave(num_generations)
    actual = group_advantages(rewards, ids, scale_by_std=scale_by_std)
    # rtol 1e-6, not 1e-12: TRL's nanstd computes Bessel's factor count / (count - 1) from integer tensors,
    # which yields a float32 factor (relative error ~2e-8) even for float64 rewards.
    torch.testing.assert_close(actual, expected, rtol=1e-6, atol=1e-9)
