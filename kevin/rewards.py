"""Rewards: kernel scores -> per-turn returns -> per-task group advantages (docs/recipe.md §4).

The chain, each step a small pure function:

1. kernel score S of one turn's kernel: ``kernel_score`` (re-used from ``kevin.records.evaluation``;
   the evaluator already stores it in ``EvalResult.score``).
2. per-turn returns R_0..R_{n-1} of one trajectory from its scores S_0..S_{n-1}: an aggregation
   registered by name (``sum`` | ``max`` | ``greedy`` | ``outcome``), so an ablation is a config value.
3. advantages: returns of ALL m x n turn samples of one task are normalised together
   (``group_advantages``), each turn being its own training sample; or, with ``rewards.group: turn``, the m samples
   of one task and one turn (``RewardConfig.group_key``).

How this departs from single-turn GRPO (e.g. TRL's GRPOTrainer):
- a group is a task's m trajectories x n turns, not the G completions of one prompt: the samples of
  a group have different prompts (later turns see earlier attempts and their feedback);
- a sample's reward is its turn's return, which credits a turn for the later turns it enabled.
"""

from __future__ import annotations

import functools
import math
import numbers
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from kevin.records.evaluation import kernel_score
from kevin.settings import Settings

__all__ = [
    "ADVANTAGE_GROUPS",
    "AGGREGATIONS",
    "RewardConfig",
    "TRUNCATION_RULES",
    "group_advantages",
    "kernel_score",
    "register_aggregation",
    "turn_returns",
]

# (scores S_0..S_{n-1} of one trajectory, gamma) -> returns R_0..R_{n-1}
AggregationFn = Callable[[Sequence[float], float], list[float]]

AGGREGATIONS: dict[str, AggregationFn] = {}
"""Turn-return aggregations by name; add one with ``@register_aggregation("name")``."""


def _check_gamma(gamma: float) -> None:
    # gamma > 1 would weight the future above the present and make returns grow with the number of
    # turns; gamma < 0 would flip the sign of later turns' credit.
    if not isinstance(gamma, numbers.Real) or isinstance(gamma, bool) or not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be a number in [0, 1] (the paper uses 0.4 for `sum`), got {gamma!r}")


def _check_scores(scores: Sequence[float]) -> list[float]:
    values = [float(s) for s in scores]
    bad = [s for s in values if not math.isfinite(s)]
    if bad:
        # One NaN/inf return would turn every advantage of its task group into NaN.
        raise ValueError(f"turn scores must be finite numbers, got {bad}; check the evaluator's speedups")
    return values


def register_aggregation(name: str) -> Callable[[AggregationFn], AggregationFn]:
    """Register ``fn(scores, gamma) -> returns`` under ``name``; the registered version validates its inputs."""

    def decorator(fn: AggregationFn) -> AggregationFn:
        if name in AGGREGATIONS:
            raise ValueError(f"turn-return aggregation {name!r} is already registered")

        @functools.wraps(fn)
        def checked(scores: Sequence[float], gamma: float) -> list[float]:
            _check_gamma(gamma)
            return fn(_check_scores(scores), gamma)

        AGGREGATIONS[name] = checked
        return checked

    return decorator


@register_aggregation("sum")
def sum_returns(scores: Sequence[float], gamma: float) -> list[float]:
    """R_t = sum_{i>=t} gamma^(i-t) S_i (the paper's choice, gamma 0.4)."""
    returns, running = [], 0.0
    for score in reversed(scores):  # R_t = S_t + gamma * R_{t+1}
        running = score + gamma * running
        returns.append(running)
    return returns[::-1]


@register_aggregation("max")
def max_returns(scores: Sequence[float], gamma: float) -> list[float]:
    """R_t = max_{i>=t} gamma^(i-t) S_i (the paper found it better with gamma 0.8 and fewer turns)."""
    returns: list[float] = []
    for score in reversed(scores):  # R_t = max(S_t, gamma * R_{t+1}), valid because gamma >= 0
        returns.append(score if not returns else max(score, gamma * returns[-1]))
    return returns[::-1]


@register_aggregation("greedy")
def greedy_returns(scores: Sequence[float], gamma: float) -> list[float]:
    """R_t = S_t: each turn is credited only for its own kernel (gamma is ignored)."""
    return list(scores)


@register_aggregation("outcome")
def outcome_returns(scores: Sequence[float], gamma: float) -> list[float]:
    """R_t = max_i S_i for every turn: the trajectory's best score, undiscounted (gamma is ignored)."""
    best = max(scores, default=0.0)
    return [best] * len(scores)


def turn_returns(scores: Sequence[float], aggregation: str = "sum", gamma: float = 0.4) -> list[float]:
    """Per-turn returns of one trajectory: scores S_0..S_{n-1} -> returns R_0..R_{n-1} (same length).

    A trajectory that stopped early simply has fewer turns; an empty one gives an empty list.
    """
    try:
        fn = AGGREGATIONS[aggregation]
    except KeyError:
        raise ValueError(f"unknown turn-return aggregation {aggregation!r}; choose one of {sorted(AGGREGATIONS)}") from None
    return fn(scores, gamma)


def group_advantages(
    returns: torch.Tensor,
    group_ids: torch.Tensor | Sequence[int],
    *,
    scale_by_std: bool = True,
    leave_one_out: bool = False,
    eps: float = 1e-4,
    std_floor: float = 0.0,
) -> torch.Tensor:
    """Advantages normalised per group (a group = all m x n turn samples of one task).

    Shapes: ``returns`` [*] (any shape, usually [N] with N = total turn samples in the batch);
    ``group_ids`` the same shape, integer group (task) of each sample, any values, need not be
    contiguous or sorted. Output: [*], same shape and dtype as ``returns``.

    For sample j in group g with k samples:
      baseline_j = mean_g (default) or, with ``leave_one_out``, the mean of the OTHER k-1 samples
                   (= k/(k-1) * (R_j - mean_g) after subtraction: an unbiased RLOO baseline);
      A_j = (R_j - baseline_j) / (max(std_g, std_floor) + eps) if ``scale_by_std`` else R_j - baseline_j (Dr-GRPO).
    ``std_floor`` (default 0, plain GRPO) keeps a group whose returns differ by less than the reward's own noise (8
    correct kernels whose scores differ only by timing jitter, 0.716 against 0.717) from being scaled up to
    advantages as large as a correct kernel's against a failing one.
    std_g is the SAMPLE standard deviation (Bessel's correction, k-1 in the denominator), as
    ``torch.std`` and TRL's GRPOTrainer use, so our advantages equal TRL's on a single-turn group.
    eps defaults to TRL's 1e-4: when every return of a group is equal, float rounding can leave
    R - mean ~ 1e-8 and std ~ 1e-8, which a tiny eps would inflate to advantages of order 1.
    A group of one sample gets advantage 0 (no baseline, no spread: nothing to compare it with), and so does a
    group whose returns are all equal, exactly 0 rather than rounding's ~1e-12: it has nothing to teach, and the
    trainer and the task sampler tell such samples by their zero advantage.
    Computed in float64 internally (groups are small; the result is cast back).
    """
    if eps <= 0:
        raise ValueError(f"eps must be > 0 (it guards the division by a group's std), got {eps}")
    if std_floor < 0:
        raise ValueError(f"std_floor must be >= 0, got {std_floor}")
    ids = torch.as_tensor(group_ids, device=returns.device)
    if ids.shape != returns.shape:
        raise ValueError(f"group_ids shape {tuple(ids.shape)} must equal returns shape {tuple(returns.shape)}")
    if returns.numel() == 0:
        return returns.clone()
    r = returns.detach().reshape(-1).to(torch.float64)  # [N]
    _, inverse = torch.unique(ids.reshape(-1), return_inverse=True)  # inverse [N]: dense group index 0..G-1
    num_groups = int(inverse.max()) + 1

    def group_sum(x: torch.Tensor) -> torch.Tensor:  # [N] -> [G]
        return torch.zeros(num_groups, dtype=torch.float64, device=r.device).index_add_(0, inverse, x)

    count = group_sum(torch.ones_like(r))  # [G]
    total = group_sum(r)  # [G]
    mean = (total / count)[inverse]  # [N]
    k = count[inverse]  # [N]: size of each sample's group
    singleton = k < 2
    if leave_one_out:
        others = (k - 1).clamp(min=1)
        baseline = (total[inverse] - r) / others  # [N]: mean of the other samples of the group
    else:
        baseline = mean
    adv = r - baseline  # [N]
    if scale_by_std:
        var = group_sum((r - mean) ** 2) / (count - 1).clamp(min=1)  # [G], Bessel-corrected
        adv = adv / (var.sqrt().clamp(min=std_floor)[inverse] + eps)
    low = torch.full((num_groups,), float("inf"), dtype=torch.float64, device=r.device).scatter_reduce(
        0, inverse, r, "amin")
    high = torch.full((num_groups,), float("-inf"), dtype=torch.float64, device=r.device).scatter_reduce(
        0, inverse, r, "amax")
    flat = (low == high)[inverse] | singleton  # [N]: the sample's group has one value only
    adv = torch.where(flat, torch.zeros_like(adv), adv)
    return adv.to(returns.dtype).reshape(returns.shape)


ADVANTAGE_GROUPS = ("task", "turn")
"""Which samples share a baseline (``RewardConfig.group``)."""

TRUNCATION_RULES = ("keep", "zero")
"""What a response cut off at the length limit scores (``RewardConfig.truncation``)."""


@dataclass
class RewardConfig(Settings):
    """How kernel scores become returns and advantages (the ``rewards`` section of params.yaml)."""

    section = "rewards"

    aggregation: str = "sum"
    """Turn-return aggregation: `sum` (discounted sum, the paper's choice), `max` (discounted max),
    `greedy` (own score only) or `outcome` (trajectory's best score for every turn)."""

    gamma: float = 0.4
    """Discount in [0, 1] for `sum` and `max` (paper: 0.4 for sum; 0.8 suited max); ignored otherwise."""

    scale_by_std: bool = True
    """Divide advantages by the task group's std (GRPO); False only subtracts the baseline (Dr-GRPO)."""

    leave_one_out: bool = False
    """Baseline each sample by the mean of the other samples of its group instead of the group mean."""

    eps: float = 1e-4
    """Added to the group std before dividing (> 0); 1e-4 as in TRL, see ``group_advantages``."""

    std_floor: float = 0.0
    """With ``scale_by_std``, the smallest std a group is divided by (>= 0; 0: plain GRPO). Scores of correct kernels
    carry timing noise (~1% of a speedup), and GRPO scales a group of near-equal scores up to advantages of about 1
    whatever their spread: our eighth H200 run gave 8 correct cumsum kernels scored 0.716-0.717 advantages up to 1.38.
    A floor of ~0.05 (a tenth of the gap between a failing and a correct kernel) leaves such groups near 0 and groups
    with a real difference as they were."""

    group: str = "task"
    """Which samples are normalised together: `task` (the paper: all m x n turn samples of a task) or `turn` (the m
    samples of one task at one turn). Under `task` an earlier turn's return holds the later turns' scores too (R_0 =
    S_0 + gamma S_1), so when a second turn merely repeats a correct first one, turn 0 gets a positive and turn 1 a
    negative advantage of about 0.9 in every such group: the update is told, step after step, to write something
    else after a correct kernel. Our fourth H200 run broke every kernel that way by step 12 (docs/learning.md);
    `turn` compares each turn with the same turn of the other trajectories only."""

    truncation: str = "keep"
    """A response cut off at the length limit: `keep` scores its kernel as judged (the paper); `zero` scores it 0
    before the returns (the overlong penalty): a model that repeats its kernel until the limit, which the parser
    still reads, otherwise pays nothing for never ending its answer (docs/learning.md)."""

    def __post_init__(self) -> None:
        if self.aggregation not in AGGREGATIONS:
            raise ValueError(
                f"rewards.aggregation must be one of {sorted(AGGREGATIONS)}, got {self.aggregation!r}"
            )
        _check_gamma(self.gamma)
        for name in ("scale_by_std", "leave_one_out"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"rewards.{name} must be true or false, got {getattr(self, name)!r}")
        if not isinstance(self.eps, numbers.Real) or isinstance(self.eps, bool) or not self.eps > 0:
            raise ValueError(f"rewards.eps must be a positive number such as 1.0e-4, got {self.eps!r}")
        if not isinstance(self.std_floor, numbers.Real) or isinstance(self.std_floor, bool) or not self.std_floor >= 0:
            raise ValueError(f"rewards.std_floor must be a number >= 0 such as 0.05, got {self.std_floor!r}")
        if self.group not in ADVANTAGE_GROUPS:
            raise ValueError(f"rewards.group must be one of {list(ADVANTAGE_GROUPS)}, got {self.group!r}")
        if self.truncation not in TRUNCATION_RULES:
            raise ValueError(f"rewards.truncation must be one of {list(TRUNCATION_RULES)}, got {self.truncation!r}")

    def turn_score(self, score: float, truncated: bool) -> float:
        """The score a turn's return is built from: its kernel's score, or 0 for a cut-off answer under
        ``truncation: zero``."""
        return 0.0 if truncated and self.truncation == "zero" else float(score)

    def group_key(self, task_id: str, turn: int) -> tuple[str, int]:
        """The advantage group of a task's sample at ``turn`` (see ``group``): samples with equal keys share a baseline."""
        return (task_id, turn if self.group == "turn" else 0)

    def returns(self, scores: Sequence[float]) -> list[float]:
        """Per-turn returns of one trajectory under this config (see ``turn_returns``)."""
        return turn_returns(scores, self.aggregation, self.gamma)

    def advantages(self, returns: torch.Tensor, group_ids: torch.Tensor | Sequence[int]) -> torch.Tensor:
        """Group advantages under this config (see ``group_advantages``; shapes [*] -> [*])."""
        return group_advantages(
            returns, group_ids, scale_by_std=self.scale_by_std, leave_one_out=self.leave_one_out, eps=self.eps,
            std_floor=self.std_floor,
        )


