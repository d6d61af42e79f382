"""Data checks: great-expectations suites over task splits and rollout records (docs/data.md).

Each check is data (a ``Check``: GX expectation name, its arguments, what it means in our words) run
against a pandas frame with one row per split entry or per rollout turn. What GX cannot see by itself
(does a task file load, render, still match its recorded digest; is a task in both splits; where a
trajectory's turn numbering has a gap) is computed here in Python and put in a column the suite
checks, so every failure still names its expectation and its rows.

Results come back as plain records (``CheckReport``) built from GX's ``to_json_dict()``, never GX
objects, and render as text a person can act on: which expectation failed, on which rows, with what
value. great_expectations (and pandas) are imported only when a suite runs: the import alone takes
seconds.
"""

from __future__ import annotations

# The package splits the checks by what they check; every name stays importable from kevin.datachecks.
from kevin.datachecks.rollouts import (
    ROLLOUT_ID_COLUMNS,
    check_rollout_batch,
    check_rollouts,
    other_record_kind,
    read_rollout_lines,
    rollout_batches,
    rollout_checks,
    rollout_frame,
)
from kevin.datachecks.splits import SPLIT_ID_COLUMNS, check_split, split_checks, split_frame, task_file_facts
from kevin.datachecks.suite import (
    MAX_ROWS_KEPT,
    Check,
    CheckReport,
    FailedRow,
    Failure,
    render_reports,
    report_from_result,
    run_checks,
)

__all__ = [
    "MAX_ROWS_KEPT",
    "ROLLOUT_ID_COLUMNS",
    "SPLIT_ID_COLUMNS",
    "Check",
    "CheckReport",
    "FailedRow",
    "Failure",
    "check_rollout_batch",
    "check_rollouts",
    "check_split",
    "other_record_kind",
    "read_rollout_lines",
    "render_reports",
    "report_from_result",
    "rollout_batches",
    "rollout_checks",
    "rollout_frame",
    "run_checks",
    "split_checks",
    "split_frame",
    "task_file_facts",
]
