"""``MonitorConfig``: which collapse indicators alert, at which thresholds, and which of them stop training.

Validated when built, so a typo in a threshold key or a share outside [0, 1] fails at the start of a run, not as an
alert that never fires.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from kevin.monitor.names import METRICS, PER_TURN_METRICS, RATIO_METRICS, base_metric
from kevin.monitor.opening import reasoning_text
from kevin.settings import Settings


def _default_max_thresholds() -> dict[str, float]:
    # Starting points, not tuned constants: QwQ opens with "Okay," almost always, so 20% is far off its
    # habit; a tenth of the batch being junk is already visible collapse; junk shows first in the last turn,
    # where a fifth of the responses being junk is an early warning (it stops nothing by default); the KL /
    # clip limits are loose warnings for the paper's 2 gradient steps per batch with clip range 0.2 / 0.28.
    # Losing half the tasks it had solved is a collapse into broken code (our fourth H200 run lost all of them a step
    # after the first; a run that learns nothing loses some to sampling noise, hence a warning that stops nothing).
    return {"not_okay_ratio": 0.2, "junk_share": 0.1, "junk_share/last_turn": 0.2, "truncated_share": 0.5,
            "clip_fraction": 0.3, "approx_kl": 0.1, "forgotten_share": 0.5}


@dataclass
class MonitorConfig(Settings):
    """Which collapse indicators alert, when, and which of them stop training."""

    section = "monitor"

    expected_opening: str | None = None
    """The text the model's reasoning starts with ("Okay," for QwQ-32B); None calibrates it from the first
    observed batch (the base model's), so any model works."""

    opening_words: int = 1
    """How many words make up the calibrated opening (1 gives "Okay,"; ignored when expected_opening is set)."""

    min_opening_share: float = 0.5
    """If fewer than this share of the calibration batch starts with the calibrated opening, the model has no
    habit to lose: the Not-Okay Ratio is still recorded but raises no alert (an info alert says so)."""

    ngram_size: int = 4
    """Word n-gram size of the junk score's repeated-n-gram share."""

    max_period: int = 32
    """Longest block (in words) the junk score's repeated-run measure looks for; cost grows linearly with it."""

    junk_response_threshold: float = 0.6
    """A response whose junk score is >= this counts as junk in `junk_share`. Honest responses score far below
    it (repeated code within `code_copies` is allowed); repeated tokens, loops and gibberish score near 1."""

    code_copies: int = 3
    """How often an n-gram of closed fenced code may occur before its copies count as junk: a draft in the
    reasoning, a revision and the final file are honest, a fourth copy is not."""

    tail_words: int = 96
    """Words at the end of a response that the tail measures read (a loop or gibberish that ran until the
    length limit is junk however long the honest start before it)."""

    max_thresholds: dict[str, float] = field(default_factory=_default_max_thresholds)
    """Alert when a metric is ABOVE its value (strictly); keys from METRICS, or per turn for PER_TURN_METRICS:
    ``junk_share/turn3`` (0-based turn 3), ``junk_share/last_turn`` (each step's highest turn)."""

    min_thresholds: dict[str, float] = field(default_factory=dict)
    """Alert when a metric is BELOW its value (strictly), e.g. {"entropy": 0.05} for entropy collapse or
    {"mean_tokens": 200} for a length collapse; keys as in max_thresholds."""

    stop_on: list[str] = field(default_factory=lambda: ["junk_share"])
    """Metrics whose alerts stop training (after `patience` steps in a row); each needs a threshold. Not-Okay
    is only a warning by default: it leads junk by ~15 steps, so it warns early and junk stops."""

    patience: int = 1
    """Consecutive alerting steps of a stop_on metric before the alert says stop (1 = stop at the first)."""

    min_steps: int = 1
    """Observed steps before any alert (the first batch is the base model's, so it is recorded, and used to
    calibrate, but not judged). Steps before this count neither as alerts nor toward patience."""

    def __post_init__(self) -> None:
        if self.expected_opening is not None and not reasoning_text(self.expected_opening):
            raise ValueError(
                "expected_opening is blank; set it to the text the reasoning starts with (e.g. 'Okay,' for QwQ) "
                "or to None to calibrate it from the first batch"
            )
        for name in ("opening_words", "ngram_size", "max_period", "patience", "code_copies", "tail_words"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {getattr(self, name)!r}")
        if not isinstance(self.min_steps, int) or self.min_steps < 0:
            raise ValueError(f"min_steps must be an integer >= 0, got {self.min_steps!r}")
        if not 0.0 <= self.min_opening_share <= 1.0:
            raise ValueError(
                f"min_opening_share must be in [0, 1] (0 always trusts the calibration), got {self.min_opening_share}"
            )
        if not 0.0 < self.junk_response_threshold <= 1.0:
            raise ValueError(f"junk_response_threshold must be in (0, 1], got {self.junk_response_threshold}")
        for table_name in ("max_thresholds", "min_thresholds"):
            table = getattr(self, table_name)
            for metric, value in table.items():
                if base_metric(metric) is None:
                    raise ValueError(f"unknown metric {metric!r} in {table_name}; use one of {list(METRICS)}, or "
                                     f"one of {list(PER_TURN_METRICS)} per turn, e.g. 'junk_share/turn3' or "
                                     "'junk_share/last_turn'")
                if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                    raise ValueError(f"{table_name}[{metric!r}] must be a finite number, got {value!r}")
                if base_metric(metric) in RATIO_METRICS and not 0.0 <= value <= 1.0:
                    raise ValueError(f"{table_name}[{metric!r}] is a share; give a value in [0, 1], got {value}")
        for metric in set(self.max_thresholds) & set(self.min_thresholds):
            if self.min_thresholds[metric] >= self.max_thresholds[metric]:
                raise ValueError(
                    f"{metric}: min threshold {self.min_thresholds[metric]} must be below max threshold "
                    f"{self.max_thresholds[metric]}, else every value alerts"
                )
        if isinstance(self.stop_on, str):
            raise ValueError(f"stop_on must be a list of metric names, e.g. [{self.stop_on!r}]")
        for metric in self.stop_on:
            if base_metric(metric) is None:
                raise ValueError(f"unknown metric {metric!r} in stop_on; use one of {list(METRICS)} or a per-turn "
                                 "key such as 'junk_share/last_turn'")
            if metric not in self.max_thresholds and metric not in self.min_thresholds:
                raise ValueError(
                    f"stop_on names {metric!r} but it has no threshold; add it to max_thresholds or "
                    "min_thresholds, or remove it from stop_on"
                )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
