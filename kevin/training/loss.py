"""The GRPO policy loss as pure tensor functions (no model, no optimiser, no trainer state).

Shapes: B = sequences (turn samples) in the micro-batch, T = padded completion length.
  logp_new  [B, T]  log-prob of each sampled completion token under the policy being trained
  logp_old  [B, T]  the same under the policy that generated it (stored at rollout time, or the
                    detached logp_new on the first, on-policy gradient step)
  logp_ref  [B, T]  the same under the reference model (only when beta > 0)
  advantages [B]    one advantage per sequence (``kevin.rewards.group_advantages``)
  mask      [B, T]  1/True for completion tokens that count, 0/False for padding

Objective, per token (PPO-style clipping with "clip-higher", DAPO):
  ratio = exp(logp_new - logp_old)
  loss  = -min(ratio * A, clip(ratio, 1 - eps_low, 1 + eps_high) * A)   [+ beta * k3 KL to ref]
then aggregated over tokens by a registered rule: ``dr_grpo`` (divide the token sum by
B * a FIXED length constant, Dr-GRPO; the paper's choice), ``token_mean`` (DAPO), ``sequence_mean``
(original GRPO). The wider upper clip lets low-probability tokens with positive advantage grow
further before clipping, which keeps exploration (entropy) from collapsing.

Gradient accumulation: pass ``num_sequences`` / ``num_tokens`` = totals over ALL micro-batches of one
optimiser step; then the micro-batch losses SUM to the full-batch loss (call backward on each,
divide by nothing). Without them, each call normalises by its own micro-batch. Under data parallelism
(gradients averaged across processes) pass each process's own totals.

Where this matches TRL's GRPOTrainer and where not: see tests/training/test_loss_vs_trl.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from kevin.settings import Settings

__all__ = [
    "LOSS_AGGREGATIONS",
    "LossConfig",
    "aggregate_token_loss",
    "clipped_token_loss",
    "k3_kl",
    "policy_loss",
    "register_loss_aggregation",
]

# (per_token_loss [B, T] zero at masked tokens, mask [B, T] float, *, max_len, num_sequences, num_tokens) -> []
LossAggregationFn = Callable[..., torch.Tensor]

LOSS_AGGREGATIONS: dict[str, LossAggregationFn] = {}
"""Token-loss aggregations by name; add one with ``@register_loss_aggregation("name")``."""


def register_loss_aggregation(name: str) -> Callable[[LossAggregationFn], LossAggregationFn]:
    def decorator(fn: LossAggregationFn) -> LossAggregationFn:
        if name in LOSS_AGGREGATIONS:
            raise ValueError(f"loss aggregation {name!r} is already registered")
        LOSS_AGGREGATIONS[name] = fn
        return fn

    return decorator


@register_loss_aggregation("dr_grpo")
def dr_grpo_aggregation(per_token_loss: torch.Tensor, mask: torch.Tensor, *, max_len: int, num_sequences: float,
                        num_tokens: float) -> torch.Tensor:
    """sum of all token losses / (num_sequences * max_len): a constant per token, so long and short
    responses weigh each token alike (dividing by each sample's own length favours long wrong answers)."""
    return per_token_loss.sum() / (num_sequences * max_len)


@register_loss_aggregation("token_mean")
def token_mean_aggregation(per_token_loss: torch.Tensor, mask: torch.Tensor, *, max_len: int, num_sequences: float,
                           num_tokens: float) -> torch.Tensor:
    """sum of all token losses / number of unmasked tokens (DAPO's token-level mean)."""
    return per_token_loss.sum() / max(num_tokens, 1.0)


@register_loss_aggregation("sequence_mean")
def sequence_mean_aggregation(per_token_loss: torch.Tensor, mask: torch.Tensor, *, max_len: int, num_sequences: float,
                              num_tokens: float) -> torch.Tensor:
    """mean over each sequence's own tokens, then sum / num_sequences (the original GRPO)."""
    lengths = mask.sum(dim=1).clamp(min=1.0)  # [B]; an all-padding row contributes 0, not NaN
    return (per_token_loss.sum(dim=1) / lengths).sum() / num_sequences


def clipped_token_loss(logp_new: torch.Tensor, logp_old: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                       eps_low: float = 0.2, eps_high: float = 0.28) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token clipped surrogate loss [B, T] (0 at masked tokens) and the ratio [B, T] (1 at masked tokens).

    Computed in float32 (or the inputs' wider dtype): bf16 log-probs would round the ratio to ~1%.
    """
    keep = mask.bool()  # [B, T]
    dtype = torch.promote_types(logp_new.dtype, torch.float32)
    # Zero the log-ratio of padding BEFORE exp: padding may hold -inf/NaN log-probs, and exp's backward
    # would turn them into NaN gradients even though the loss masks them afterwards.
    log_ratio = torch.where(keep, logp_new.to(dtype) - logp_old.to(dtype), torch.zeros((), dtype=dtype,
                                                                                     device=logp_new.device))
    ratio = torch.exp(log_ratio)  # [B, T]
    adv = advantages.to(dtype).unsqueeze(1)  # [B, 1], broadcast over tokens
    unclipped = ratio * adv  # [B, T]
    clipped = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high) * adv  # [B, T]
    # min() picks the pessimistic term: the gradient vanishes once the ratio has moved past the clip
    # bound in the direction the advantage pushes it, and never beyond in the other direction.
    per_token = -torch.minimum(unclipped, clipped)  # [B, T]
    return torch.where(keep, per_token, torch.zeros_like(per_token)), ratio


def k3_kl(logp_new: torch.Tensor, logp_ref: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(pi_new || pi_ref) [B, T], 0 at masked tokens.

    k3 = exp(ref - new) - (ref - new) - 1 >= 0, unbiased for tokens sampled from pi_new (Schulman's
    "Approximating KL divergence"; the estimator of DeepSeekMath's GRPO and TRL).
    """
    keep = mask.bool()
    dtype = torch.promote_types(logp_new.dtype, torch.float32)
    diff = torch.where(keep, logp_ref.to(dtype) - logp_new.to(dtype), torch.zeros((), dtype=dtype, device=logp_new.device))
    return torch.exp(diff) - diff - 1.0  # 0 where diff == 0, so masked tokens contribute 0


def aggregate_token_loss(per_token_loss: torch.Tensor, mask: torch.Tensor, aggregation: str, *, max_len: int,
                         num_sequences: float | None = None, num_tokens: float | None = None) -> torch.Tensor:
    """Scalar loss from per-token losses [B, T] by the named aggregation (see ``LOSS_AGGREGATIONS``)."""
    try:
        fn = LOSS_AGGREGATIONS[aggregation]
    except KeyError:
        raise ValueError(f"unknown loss aggregation {aggregation!r}; choose one of {sorted(LOSS_AGGREGATIONS)}") from None
    maskf = mask.to(per_token_loss.dtype)
    return fn(
        per_token_loss,
        maskf,
        max_len=max_len,
        num_sequences=float(per_token_loss.shape[0] if num_sequences is None else num_sequences),
        num_tokens=float(maskf.sum().item() if num_tokens is None else num_tokens),
    )


@dataclass
class LossConfig(Settings):
    """The GRPO objective (the ``loss`` section of params.yaml)."""

    section = "loss"

    eps_low: float = 0.2
    """Lower clip: the ratio may fall to 1 - eps_low on tokens with negative advantage before clipping."""

    eps_high: float = 0.28
    """Upper clip (clip-higher, DAPO): the ratio may rise to 1 + eps_high on tokens with positive advantage.
    Set it equal to eps_low for the symmetric PPO clip."""

    aggregation: str = "dr_grpo"
    """How token losses become one number: `dr_grpo` (sum / (B * max_completion_length), the paper's
    choice), `token_mean` (DAPO) or `sequence_mean` (original GRPO)."""

    max_completion_length: int = 16384
    """The Dr-GRPO constant: the generation's max new tokens (the paper: 16384). Under a length schedule that
    raises the limit (the paper: 22528 from step 30) it keeps the FIRST limit, so a token's weight in the loss
    does not change at the switch (docs/rl_core.md, "Response length"); the root config sets it. Completions
    wider than this are refused by ``policy_loss`` unless its caller allows more (``max_width``). Unused by
    the other aggregations."""

    beta: float = 0.0
    """KL-to-reference coefficient (k3 estimator). 0 (the paper's choice) loads no reference model."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.eps_low < 1.0:
            raise ValueError(f"loss.eps_low must be in [0, 1) (paper: 0.2), got {self.eps_low}")
        if not self.eps_high >= 0.0:
            raise ValueError(f"loss.eps_high must be >= 0 (paper: 0.28), got {self.eps_high}")
        if self.aggregation not in LOSS_AGGREGATIONS:
            raise ValueError(f"loss.aggregation must be one of {sorted(LOSS_AGGREGATIONS)}, got {self.aggregation!r}")
        if isinstance(self.max_completion_length, bool) or not isinstance(self.max_completion_length, int) \
                or self.max_completion_length < 1:
            raise ValueError(
                "loss.max_completion_length must be a positive integer: the generation's max new tokens "
                f"(the Dr-GRPO constant), got {self.max_completion_length!r}"
            )
        if not self.beta >= 0.0:
            raise ValueError(f"loss.beta must be >= 0 (0 disables the KL penalty), got {self.beta}")

    @property
    def needs_reference(self) -> bool:
        """Whether a reference model's log-probs are needed (only when the KL penalty is on)."""
        return self.beta > 0.0


def _check_shapes(logp_new: torch.Tensor, logp_old: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                  logp_ref: torch.Tensor | None) -> None:
    if logp_new.dim() != 2:
        raise ValueError(f"logp_new must be [B, T], got shape {tuple(logp_new.shape)}")
    for name, t in (("logp_old", logp_old), ("mask", mask), ("logp_ref", logp_ref)):
        if t is not None and t.shape != logp_new.shape:
            raise ValueError(f"{name} shape {tuple(t.shape)} must equal logp_new shape {tuple(logp_new.shape)} [B, T]")
    if advantages.shape != logp_new.shape[:1]:
        raise ValueError(f"advantages must be [B] = [{logp_new.shape[0]}], got shape {tuple(advantages.shape)}")


def policy_loss(
    logp_new: torch.Tensor,
    logp_old: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    config: LossConfig,
    *,
    logp_ref: torch.Tensor | None = None,
    num_sequences: float | None = None,
    num_tokens: float | None = None,
    max_width: int | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GRPO loss (scalar, differentiable w.r.t. logp_new) and metrics for one (micro-)batch.

    Shapes as in the module docstring. ``num_sequences`` / ``num_tokens``: totals over the whole
    optimiser step when accumulating gradients over micro-batches (default: this call's B and token count).

    Metrics (python floats, means over unmasked tokens of this call):
      pg_loss              the clipped policy-gradient term alone (same aggregation, no KL);
      clip_fraction        share of tokens whose gradient the clip removed (high or low side);
      clip_fraction_high   ratio > 1 + eps_high with A > 0;  clip_fraction_low: ratio < 1 - eps_low with A < 0;
      ratio_mean           mean of pi_new / pi_old (1 on the on-policy step);
      approx_kl            mean of (ratio - 1) - log(ratio): the k3 estimate of KL(pi_old || pi_new) from
                           tokens sampled by pi_old, >= 0 per token (CleanRL's approx_kl);
      kl_ref               mean k3 KL(pi_new || pi_ref), only when logp_ref is given.
    """
    _check_shapes(logp_new, logp_old, advantages, mask, logp_ref)
    width = config.max_completion_length if max_width is None else max_width
    if logp_new.shape[1] > width and config.aggregation == "dr_grpo":
        raise ValueError(
            f"completions are {logp_new.shape[1]} tokens wide but the longest allowed is {width} "
            f"(loss.max_completion_length {config.max_completion_length}); set max_response_tokens, which sets it "
            "to the generation's max new tokens"
        )
    if config.needs_reference and logp_ref is None:
        raise ValueError("loss.beta > 0 needs logp_ref (the reference model's log-probs); pass it or set beta to 0")

    per_token, ratio = clipped_token_loss(logp_new, logp_old, advantages, mask, config.eps_low, config.eps_high)
    kl = k3_kl(logp_new, logp_ref, mask) if logp_ref is not None else None  # [B, T]
    total = per_token + config.beta * kl if config.needs_reference else per_token  # [B, T]

    def aggregate(x: torch.Tensor) -> torch.Tensor:
        return aggregate_token_loss(x, mask, config.aggregation, max_len=config.max_completion_length,
                                    num_sequences=num_sequences, num_tokens=num_tokens)

    loss = aggregate(total)
    with torch.no_grad():
        metrics = _metrics(per_token, ratio, advantages, mask, config, kl)
        metrics["pg_loss"] = aggregate(per_token.detach()).item()
    return loss, metrics


def _metrics(per_token: torch.Tensor, ratio: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
             config: LossConfig, kl: torch.Tensor | None) -> dict[str, float]:
    keep = mask.bool()  # [B, T]
    n = keep.sum().clamp(min=1)

    def masked_mean(x: torch.Tensor) -> float:
        return (torch.where(keep, x.float(), torch.zeros((), device=x.device)).sum() / n).item()

    ratio = ratio.detach()
    adv = advantages.detach().unsqueeze(1)  # [B, 1]
    high = (ratio > 1.0 + config.eps_high) & (adv > 0)  # [B, T]
    low = (ratio < 1.0 - config.eps_low) & (adv < 0)  # [B, T]
    out = {
        "clip_fraction": masked_mean(high | low),
        "clip_fraction_high": masked_mean(high),
        "clip_fraction_low": masked_mean(low),
        "ratio_mean": masked_mean(ratio),
        "approx_kl": masked_mean((ratio - 1.0) - torch.log(ratio)),
    }
    if kl is not None:
        out["kl_ref"] = masked_mean(kl.detach())
    return out
