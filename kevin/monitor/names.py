"""The monitor's vocabulary: which metrics exist, which are shares, which are also kept per turn, and a line on what
each one means.

Kept apart from the code that computes them so the config (which validates threshold keys), the monitor (which
words its alerts) and the plots (which pick panels) all read one list.
"""

from __future__ import annotations

import re

# Metrics computed from the responses of one step (absent from a history row when they cannot be computed).
TEXT_METRICS = (
    "not_okay_ratio",   # share of responses whose reasoning does not start with the expected opening
    "junk_mean",        # mean junk score over responses
    "junk_max",         # worst response's junk score
    "junk_share",       # share of responses with junk score >= MonitorConfig.junk_response_threshold
    "mean_chars",       # mean response length in characters
    "mean_tokens",      # mean response length in tokens (only when token counts are passed)
    "truncated_share",  # share of responses cut off at the length limit (only when flags are passed)
)
# Metrics of the step's judged kernels, measured against each task's previous draw (the monitor keeps those).
KERNEL_METRICS = (
    "forgotten_share",  # of the step's tasks solved at their previous draw, the share with no correct kernel now
)
# Metrics of the update, passed in by the trainer as numbers.
TRAIN_METRICS = ("entropy", "grad_norm", "clip_fraction", "approx_kl")
# Calibration quality: the share of the base batch that starts with the calibrated opening.
CALIBRATION_METRICS = ("opening_share",)
# In every row: 1 when the Not-Okay Ratio is checked against its thresholds, 0 while it is not (no opening yet, or
# one too rare in the base batch to trust), so a plot of the ratio can tell a quiet check from a skipped one.
CHECK_KEY = "not_okay_check"
METRICS = TEXT_METRICS + KERNEL_METRICS + TRAIN_METRICS
# Metrics that are shares, so their thresholds must lie in [0, 1].
RATIO_METRICS = frozenset({"not_okay_ratio", "junk_mean", "junk_max", "junk_share", "truncated_share", "clip_fraction",
                           "forgotten_share"})
# Metrics also computed per turn (``junk_share/turn3``, ``junk_share/last_turn``): junk shows first in the last turn.
PER_TURN_METRICS = ("not_okay_ratio", "junk_share")
_PER_TURN_KEY = re.compile(r"^(?P<metric>[a-z_]+)/(?:turn(?P<turn>\d+)|last_turn)$")


def base_metric(key: str) -> str | None:
    """The metric a history key measures (``junk_share/turn3`` -> ``junk_share``), or None for an unknown key.
    Per-turn keys exist for PER_TURN_METRICS: ``<metric>/turn<t>`` (0-based turn t) and ``<metric>/last_turn``
    (the highest turn of the step's batch)."""
    if key in METRICS:
        return key
    match = _PER_TURN_KEY.match(key)
    if match and match.group("metric") in PER_TURN_METRICS:
        return match.group("metric")
    return None


# One line per metric, appended to alert messages so a notification says what the number means.
HINTS = {
    "not_okay_ratio": "reasoning no longer starts with the base model's usual opening (the paper's leading "
                      "indicator: junk followed about 15 steps later)",
    "junk_mean": "responses are getting repetitive or garbled",
    "junk_max": "at least one response is repetitive or garbled",
    "junk_share": "many responses are repetitive junk (collapse; it shows first in the last turn)",
    "mean_chars": "response length moved out of range (a length collapse or runaway generation)",
    "mean_tokens": "response length moved out of range (a length collapse or runaway generation)",
    "truncated_share": "many responses hit the length limit (runaway or looping generation)",
    "forgotten_share": "tasks the policy used to solve get no correct kernel any more (collapse into broken code, "
                       "which the text indicators do not see)",
    "entropy": "policy entropy moved out of range (entropy collapse, or sampling noise taking over)",
    "grad_norm": "gradient norm moved out of range (unstable update)",
    "clip_fraction": "many tokens hit the clip range (the update moves the policy too far per step)",
    "approx_kl": "the policy moved far from the sampling policy in one step",
    "opening_share": "the base model has no habitual opening, so the Not-Okay Ratio raises no alerts",
}
