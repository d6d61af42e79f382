"""The monitor's history as a figure (one panel per metric, thresholds and alerts marked), and the rule for step
axes that every step plot of kevin shares (whole steps only).

matplotlib is imported inside the functions, not at module import: it is not a dependency of the library.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from kevin.monitor.names import CHECK_KEY, METRICS, base_metric

if TYPE_CHECKING:  # only for annotations
    from kevin.monitor.config import MonitorConfig
    from kevin.monitor.events import Alert


# Shown instead of the threshold line while the ratio is not checked; tracking's Not-Okay plot shows it too, so the
# monitor's figure and MLflow's say the same.
NOT_CHECKED_NOTE = "opening not calibrated: check off (no alert)"


def whole_step_axis(axis: Any) -> None:
    """Ticks at whole steps only on a matplotlib step ``axis``. Left alone, matplotlib ticks a run of a few steps at
    0.2, 0.4 ...; ``integer=True`` alone still does for a single step (it wants two integers in view), hence
    ``min_n_ticks=1``."""
    from matplotlib.ticker import MaxNLocator

    axis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))


def not_okay_checked(history: Sequence[Mapping[str, float]]) -> bool | None:
    """Whether the latest row that says so (``not_okay_check``) had the Not-Okay Ratio checked; None when no row
    says (a history from before the key existed)."""
    states = [row[CHECK_KEY] for row in history if CHECK_KEY in row]
    return bool(states[-1]) if states else None


def plot_history(
    history: Sequence[Mapping[str, float]],
    metrics: Sequence[str] | None = None,
    *,
    config: MonitorConfig | None = None,
    alerts: Sequence[Alert] = (),
    path: str | None = None,
):
    """One panel per metric over steps, with threshold lines (from ``config``) and alert steps marked. A Not-Okay
    panel gets no threshold line while the latest row says the ratio is not checked (``not_okay_check`` 0), but
    the note NOT_CHECKED_NOTE.

    ``metrics`` defaults to every monitor metric present in the history. matplotlib is imported here, not at
    module import (it is not a dependency of the library); the figure is built without pyplot, so no GUI
    backend or global figure state is involved. Returns the matplotlib Figure; saves it when ``path`` is set.
    """
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("plot_history needs matplotlib; pip install matplotlib") from exc

    present = {k for row in history for k in row}
    if metrics is None:
        metrics = [m for m in METRICS if m in present] + sorted(
            k for k in present if "/" in k and base_metric(k) is not None)
    if not metrics:
        raise ValueError("nothing to plot: the history has none of the requested metrics")
    checked = not_okay_checked(history)
    fig = Figure(figsize=(7, 2.0 * len(metrics)), layout="constrained")
    axes = fig.subplots(len(metrics), 1, sharex=True, squeeze=False)[:, 0]
    for ax, metric in zip(axes, metrics):
        _draw_panel(ax, history, metric, checked=checked, config=config, alerts=alerts)
    axes[-1].set_xlabel("step")
    whole_step_axis(axes[-1].xaxis)  # shared by every panel (sharex)
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig


def _draw_panel(ax: Any, history: Sequence[Mapping[str, float]], metric: str, *, checked: bool | None,
                config: MonitorConfig | None, alerts: Sequence[Alert]) -> None:
    """One metric's panel of ``plot_history``: its values over steps, its threshold lines, its alert steps."""
    points = [(row["step"], row[metric]) for row in history if metric in row]
    if points:
        xs, ys = zip(*points)
        ax.plot(xs, ys, marker=".", label=metric)
    if base_metric(metric) == "not_okay_ratio" and checked is False:
        # No line for a threshold the monitor does not apply: values far above it with no alert would read as
        # a broken monitor.
        ax.text(0.5, 0.5, NOT_CHECKED_NOTE, transform=ax.transAxes, ha="center", va="center", color="dimgray")
    elif config is not None:
        for table, style in ((config.max_thresholds, "--"), (config.min_thresholds, ":")):
            if metric in table:
                ax.axhline(table[metric], color="red", linestyle=style, linewidth=1)
    for alert in alerts:
        if alert.metric == metric:
            ax.axvline(alert.step, color="darkred" if alert.should_stop else "orange", alpha=0.4, linewidth=1)
    ax.set_ylabel(metric, fontsize=8)
