"""Test-time-scaling analysis: metrics (best@k, avg@k, fast_p, pass@k, geometric-mean speedup, after
every turn and per budget split), Table-1/Table-2-style tables, comparison, and beam-style selection.

Plots live in ``kevin.analysis.plots`` (imported on demand: it loads matplotlib).
"""

from kevin.analysis.beam import BeamConfig, BeamStep, register_selection, select, trajectory_scores
from kevin.analysis.estimators import (
    Metrics,
    avg_over,
    best_at_k,
    curve_metrics,
    expected_max_of_subset,
    geometric_mean,
    metrics_at,
    pass_at_k,
)
from kevin.analysis.metrics import AnalysisConfig, BudgetSplit, RunReport, analyze_run, report_from_states
from kevin.analysis.outcomes import (
    KernelOutcome,
    TaskOutcome,
    TrajectoryOutcome,
    fast_name,
    outcomes_from_trajectories,
    outcomes_from_turns,
)
from kevin.analysis.tables import (
    comparison_csv,
    comparison_markdown,
    flat_metrics,
    paired_markdown,
    table1_csv,
    table1_markdown,
    table2_csv,
    table2_markdown,
)

__all__ = [
    "AnalysisConfig",
    "BeamConfig",
    "BeamStep",
    "BudgetSplit",
    "KernelOutcome",
    "Metrics",
    "RunReport",
    "TaskOutcome",
    "TrajectoryOutcome",
    "analyze_run",
    "avg_over",
    "best_at_k",
    "comparison_csv",
    "curve_metrics",
    "comparison_markdown",
    "expected_max_of_subset",
    "fast_name",
    "flat_metrics",
    "geometric_mean",
    "metrics_at",
    "outcomes_from_trajectories",
    "outcomes_from_turns",
    "paired_markdown",
    "pass_at_k",
    "register_selection",
    "report_from_states",
    "select",
    "table1_csv",
    "table1_markdown",
    "table2_csv",
    "table2_markdown",
    "trajectory_scores",
]
