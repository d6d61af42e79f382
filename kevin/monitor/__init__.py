"""Collapse monitors: cheap indicators that a run is degenerating, and typed alerts when one crosses a limit.

Why these indicators (docs/recipe.md §6): Kevin's training eventually collapses into repetitive junk.
The leading indicator was the "Not Okay Ratio", the share of responses whose reasoning no longer starts
with the base model's habitual opening ("Okay," for QwQ); it rose about 15 steps before junk appeared,
and junk showed first in the last turn. We track that ratio, a per-response junk score, response length,
truncation, and the update's own health numbers (entropy, grad norm, clip fraction, approx KL).

What this package does and does not do:
- Pure metric functions over plain strings (no tensors, no tokenizer): the monitor must be cheap and
  work with any model and either generation backend.
- `CollapseMonitor.observe` turns one step's batch into one history row and a list of `Alert` events.
  The monitor never steers training; the trainer reads `should_stop`, saves a checkpoint and stops.
- No side effects at import and no logging setup; alerts are logged through `logging` at most, and are
  plain frozen dataclasses so flows (Prefect notifications) and tracking (MLflow) can consume them.

The modules, one responsibility each (every name below is importable from ``kevin.monitor`` itself):
- ``names``: the metric names, which are shares, the per-turn keys, a hint per metric;
- ``opening``: the reasoning's opening, its calibration and the Not-Okay Ratio;
- ``junk``: the junk score of one response and its measures (its docstring describes each);
- ``batch``: one step's response metrics (``text_metrics``);
- ``config``: ``MonitorConfig``, the thresholds and what stops training;
- ``events``: ``Alert`` and ``Severity``;
- ``collapse``: ``CollapseMonitor``, the history, the streaks and the stop flag;
- ``plots``: the history as a figure, and the whole-step axis every step plot shares (matplotlib imported there,
  on demand).
"""

from __future__ import annotations

from kevin.monitor.batch import forgotten_share, solved_tasks, text_metrics
from kevin.monitor.collapse import CollapseMonitor
from kevin.monitor.config import MonitorConfig
from kevin.monitor.events import Alert, Severity
from kevin.monitor.junk import (
    CHAR_RUN_MIN,
    SCRIPT_WINDOW,
    JunkBreakdown,
    char_run_share,
    junk_breakdown,
    junk_score,
    longest_repeat_run,
    nonprintable_share,
    repeated_ngram_share,
    script_mix_share,
    tail_loop_share,
    words_and_code_flags,
)
from kevin.monitor.names import (
    CALIBRATION_METRICS,
    CHECK_KEY,
    HINTS,
    KERNEL_METRICS,
    METRICS,
    PER_TURN_METRICS,
    RATIO_METRICS,
    TEXT_METRICS,
    TRAIN_METRICS,
    base_metric,
)
from kevin.monitor.opening import (
    calibrate_opening,
    first_words,
    not_okay_ratio,
    opening_counts,
    reasoning_text,
    starts_with_opening,
)
from kevin.monitor.plots import NOT_CHECKED_NOTE, not_okay_checked, plot_history, whole_step_axis

__all__ = [
    "CALIBRATION_METRICS",
    "CHAR_RUN_MIN",
    "CHECK_KEY",
    "HINTS",
    "KERNEL_METRICS",
    "METRICS",
    "NOT_CHECKED_NOTE",
    "PER_TURN_METRICS",
    "RATIO_METRICS",
    "SCRIPT_WINDOW",
    "TEXT_METRICS",
    "TRAIN_METRICS",
    "Alert",
    "CollapseMonitor",
    "JunkBreakdown",
    "MonitorConfig",
    "Severity",
    "base_metric",
    "calibrate_opening",
    "char_run_share",
    "first_words",
    "forgotten_share",
    "junk_breakdown",
    "junk_score",
    "longest_repeat_run",
    "nonprintable_share",
    "not_okay_checked",
    "not_okay_ratio",
    "opening_counts",
    "plot_history",
    "reasoning_text",
    "repeated_ngram_share",
    "script_mix_share",
    "solved_tasks",
    "starts_with_opening",
    "tail_loop_share",
    "text_metrics",
    "whole_step_axis",
    "words_and_code_flags",
]
