"""The checks as data and their running: a ``Check`` becomes a great-expectations expectation only when a suite
runs over a pandas frame, and GX's result comes back as our plain ``CheckReport``, rendered as text.

Apart from the suites (``kevin.datachecks.splits``, ``kevin.datachecks.rollouts``) because both run through it and
neither needs the other. great_expectations is imported only when a suite runs: the import alone takes seconds.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["MAX_ROWS_KEPT", "Check", "CheckReport", "FailedRow", "Failure", "render_reports", "report_from_result",
           "run_checks"]

MAX_ROWS_KEPT = 1000
"""Failing rows kept per expectation in a report (the count is always exact)."""


# ------------------------------------------------------------------------------------------ records


@dataclass(frozen=True)
class Check:
    """One expectation of a suite, as data; it becomes a GX expectation only when the suite runs."""

    expectation: str
    """Class name under ``great_expectations.expectations``, e.g. ``ExpectColumnValuesToBeUnique``."""
    kwargs: dict[str, Any]
    """Its arguments (column names, value sets, bounds)."""
    description: str
    """What the expectation means here, in our words; the report leads with it."""
    detail: str = ""
    """A column whose text explains a failing row (e.g. the error a task file raised on loading)."""
    only_if: tuple[str, Any] | None = None
    """``(column, value)``: judge only the rows where that column holds that value (e.g. parsed lines),
    so one broken row is reported once, not by every check."""


@dataclass(frozen=True)
class FailedRow:
    """One row an expectation rejected."""

    row: int
    """1-based row of the checked frame."""
    where: dict[str, Any]
    """The row's identifying columns (split and task id; or line, task, trajectory and turn)."""
    value: dict[str, Any]
    """The checked column(s) and their offending value(s)."""
    detail: str = ""


@dataclass(frozen=True)
class Failure:
    """One failed expectation and the rows it rejected."""

    expectation: str
    """GX's name for it, e.g. ``expect_column_values_to_be_unique``."""
    description: str
    columns: tuple[str, ...]
    unexpected_count: int
    """How many rows failed (``rows`` keeps at most MAX_ROWS_KEPT of them)."""
    rows: tuple[FailedRow, ...] = ()
    observed: Any = None
    """For whole-column expectations: the value GX observed, when it gives one."""
    missing: tuple[Any, ...] = ()
    """For set expectations: the values the column should hold but lacks (e.g. a level without tasks)."""
    error: str = ""
    """The exception text when the expectation could not be evaluated at all."""


@dataclass(frozen=True)
class CheckReport:
    """The outcome of one suite over one data set."""

    suite: str
    success: bool
    rows: int
    """Rows checked."""
    evaluated: int
    """Expectations evaluated."""
    failures: tuple[Failure, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def render(self, max_rows: int = 20) -> str:
        """A readable report: a verdict line, then each failed expectation with up to ``max_rows`` rows."""
        verdict = "passed" if self.success else f"FAILED {len(self.failures)} of {self.evaluated} expectations"
        lines = [f"{self.suite}: {verdict} ({self.rows} rows checked)"]
        for failure in self.failures:
            columns = ", ".join(failure.columns) or "table"
            count = f"{failure.unexpected_count} row{'s' if failure.unexpected_count != 1 else ''}"
            if failure.error:
                outcome = f"could not run: {failure.error}"
            elif failure.missing:
                outcome = f"missing {list(failure.missing)!r}"
            elif failure.rows or failure.unexpected_count:
                outcome = count
            else:
                outcome = f"observed {failure.observed!r}"
            lines.append(f"  x {failure.description}  [{failure.expectation} on {columns}]: {outcome}")
            for bad in failure.rows[:max_rows]:
                where = " ".join(f"{k}={'missing' if v is None else v}" for k, v in bad.where.items())
                value = ", ".join(f"{k}={_show(v)}" for k, v in bad.value.items())
                lines.append(f"      row {bad.row} [{where}]" + (f": {value}" if value else "")
                             + (f"  -- {bad.detail}" if bad.detail else ""))
            if failure.unexpected_count > min(len(failure.rows), max_rows):
                lines.append(f"      ... and {failure.unexpected_count - min(len(failure.rows), max_rows)} more")
        return "\n".join(lines)


def _show(value: Any) -> str:
    if value is None:
        return "missing"
    return repr(int(value)) if isinstance(value, float) and value.is_integer() else repr(value)


# ------------------------------------------------------------------------------------------ running a suite


def run_checks(suite: str, frame: "pd.DataFrame", checks: Sequence[Check], id_columns: Sequence[str]) -> CheckReport:
    """Run ``checks`` as one GX suite over ``frame`` (which has a 1-based ``row`` column) and report.

    ``id_columns`` name each failing row in the report (with ``row``).
    """
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False)  # pipeline logs, not a terminal
    batch = (context.data_sources.add_pandas(f"{suite}-source").add_dataframe_asset(f"{suite}-rows")
             .add_batch_definition_whole_dataframe("all").get_batch(batch_parameters={"dataframe": frame}))
    if len({c.description for c in checks}) != len(checks):
        raise ValueError("check descriptions must be unique: the report finds each check's detail column by it")
    gx_suite = gx.ExpectationSuite(name=suite)
    for check in checks:
        kwargs = dict(check.kwargs)
        if check.only_if is not None:
            from great_expectations.expectations.row_conditions import Column

            kwargs["row_condition"] = Column(check.only_if[0]) == check.only_if[1]
        expectation = getattr(gx.expectations, check.expectation)(**kwargs, description=check.description)
        gx_suite.add_expectation(expectation)
    result = batch.validate(gx_suite, result_format={
        "result_format": "COMPLETE", "unexpected_index_column_names": ["row", *id_columns]})
    return report_from_result(result.to_json_dict(), frame, checks, id_columns)


def report_from_result(result: Mapping[str, Any], frame: "pd.DataFrame", checks: Sequence[Check],
                       id_columns: Sequence[str]) -> CheckReport:
    """Our report from GX's ``to_json_dict()`` of a suite run (``frame`` supplies each row's detail text)."""
    details = {c.description: c.detail for c in checks}
    by_row = frame.set_index("row")
    failures = []
    for item in result["results"]:
        if item["success"]:
            continue
        config = item["expectation_config"]
        kwargs = config["kwargs"]
        columns = tuple(kwargs.get("column_list")
                        or [kwargs[k] for k in ("column", "column_A", "column_B") if k in kwargs])
        outcome = item.get("result") or {}
        detail_column = details.get(config.get("description", ""), "")
        rows = []
        for index in (outcome.get("unexpected_index_list") or [])[:MAX_ROWS_KEPT]:
            row = int(index["row"])
            detail = _plain(by_row.at[row, detail_column]) if detail_column else None
            rows.append(FailedRow(
                row=row,
                where={k: _whole(_plain(index.get(k))) for k in id_columns},
                value={c: _plain(by_row.at[row, c]) for c in columns if c not in id_columns},
                detail="" if detail is None else str(detail),
            ))
        exception = item.get("exception_info") or {}
        failures.append(Failure(
            expectation=config["type"],
            description=config.get("description", ""),
            columns=columns,
            unexpected_count=int(outcome.get("unexpected_count") or len(rows)),
            rows=tuple(rows),
            observed=_plain(outcome.get("observed_value")),
            missing=tuple(_plain(outcome.get("partial_missing_list") or [])),
            error=str(exception.get("exception_message") or "") if exception.get("raised_exception") else "",
        ))
    order = {c.description: i for i, c in enumerate(checks)}  # the suite's own order, not GX's
    failures.sort(key=lambda f: order.get(f.description, len(order)))
    return CheckReport(suite=result.get("suite_name", ""), success=bool(result["success"]), rows=len(frame),
                       evaluated=len(result["results"]), failures=tuple(failures))


def _whole(value: Any) -> Any:
    """Indices read back as floats (pandas stores a column with missing values so) print as integers."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _plain(value: Any) -> Any:
    """JSON-ready plain data: NaN and pandas' missing markers become None, numpy scalars Python numbers."""
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def render_reports(reports: Iterable[CheckReport], max_rows: int = 20) -> str:
    """The reports rendered one after another, a blank line between them."""
    return "\n\n".join(r.render(max_rows) for r in reports)
