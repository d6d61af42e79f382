"""The run's plots, drawn from its MLflow history: reward per turn and the Not-Okay Ratio over steps.

matplotlib Figures built without pyplot (no GUI backend, no global figure state); matplotlib is imported inside the
functions, so ``import kevin.tracking`` does not load it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any


def _series_plot(series: Mapping[str, Mapping[int, float]], title: str, ylabel: str,
                 thresholds: Mapping[str, float] | None = None, note: str = ""):
    from matplotlib.figure import Figure

    from kevin.monitor.plots import whole_step_axis

    fig = Figure(figsize=(7, 3.5), layout="constrained")
    ax = fig.subplots()
    for label in series:
        points = sorted(series[label].items())
        if points:
            xs, ys = zip(*points)
            ax.plot(xs, ys, marker=".", label=label)
    for label, value in (thresholds or {}).items():
        ax.axhline(value, color="red", linestyle="--", linewidth=1, label=label)
    if note:
        ax.text(0.5, 0.5, note, transform=ax.transAxes, ha="center", va="center", color="dimgray",
                bbox={"facecolor": "white", "edgecolor": "lightgray"})
    ax.set_title(title)
    ax.set_xlabel("step")
    whole_step_axis(ax.xaxis)
    ax.set_ylabel(ylabel)
    if series:
        ax.legend(fontsize=7)
    return fig


_REWARD_TURN = re.compile(r"reward/turn_(\d+)")
_NOT_OKAY_TURN = re.compile(r"monitor/not_okay_ratio/turn_(\d+)")
NOT_OKAY_CHECK = "monitor/not_okay_check"


def _turn_number(key: str) -> int:
    return int(re.search(r"turn_(\d+)$", key).group(1))


def _turn_keys(history: Mapping[str, Any], pattern: re.Pattern) -> list[str]:
    return sorted((k for k in history if pattern.fullmatch(k)), key=_turn_number)


def reward_turn_keys(history: Mapping[str, Any]) -> list[str]:
    """The ``reward/turn_<n>`` keys of ``history``, by turn (what the reward-per-turn plot draws)."""
    return _turn_keys(history, _REWARD_TURN)


def plot_reward_per_turn(history: Mapping[str, Mapping[int, float]]):
    """Mean kernel score of each turn over steps, one line per ``reward/turn_<n>`` in ``history``."""
    keys = reward_turn_keys(history)
    if not keys:
        raise ValueError("no reward/turn_<n> metrics to plot; log steps with StepSummary.reward['turn_<n>'] first")
    series = {f"turn {_turn_number(k)}": history[k] for k in keys}
    return _series_plot(series, "Mean kernel score per turn", "score")


def not_okay_check(history: Mapping[str, Mapping[int, float]]) -> bool | None:
    """Whether the monitor checks the Not-Okay Ratio at the run's latest step (``monitor/not_okay_check``: it does
    not until the base model's opening is calibrated and trusted); None when the history does not say."""
    states = history.get(NOT_OKAY_CHECK)
    if not states:
        return None
    return bool(states[max(states)])


def plot_not_okay_ratio(history: Mapping[str, Mapping[int, float]], threshold: float | None = None):
    """The Not-Okay Ratio over steps (``monitor/not_okay_ratio`` and its per-turn series). The alert threshold is a
    dashed line only while the monitor checks the ratio (``not_okay_check``); while it does not (no calibrated
    opening, so no alert can fire) a note says so instead, and no line suggests a limit that is not applied."""
    keys = ["monitor/not_okay_ratio"] if history.get("monitor/not_okay_ratio") else []
    keys += _turn_keys(history, _NOT_OKAY_TURN)
    if not keys:
        raise ValueError("no monitor/not_okay_ratio metrics to plot; pass the monitor row in StepSummary.monitor")
    series = {("all turns" if k == "monitor/not_okay_ratio" else f"turn {_turn_number(k)}"): history[k] for k in keys}
    if not_okay_check(history) is False:
        from kevin.monitor.plots import NOT_CHECKED_NOTE

        return _series_plot(series, "Not-Okay Ratio", "share of responses", note=NOT_CHECKED_NOTE)
    thresholds = {f"alert threshold {threshold:g}": threshold} if threshold is not None else None
    return _series_plot(series, "Not-Okay Ratio", "share of responses", thresholds)
