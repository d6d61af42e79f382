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

import json
import math
import re
import sys
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

if TYPE_CHECKING:
    import pandas as pd

    from kevin.tasks.splits import Split, SplitEntry

MAX_ROWS_KEPT = 1000
"""Failing rows kept per expectation in a report (the count is always exact)."""
_ID = re.compile(r"^level(\d+)/")


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
        columns = tuple(kwargs.get("column_list") or [kwargs[k] for k in ("column", "column_A", "column_B") if k in kwargs])
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


# ------------------------------------------------------------------------------------------ splits


def split_checks(levels: Iterable[int], bundled: bool) -> list[Check]:
    """The expectations a split must meet (``levels``: the configured ones)."""
    levels = sorted(levels)
    checks = [
        Check("ExpectColumnDistinctValuesToEqualSet", {"column": "split", "value_set": ["train", "eval"]},
              "both train and eval have tasks"),
        Check("ExpectColumnValuesToNotBeNull", {"column": "task_id"}, "every entry has a task id"),
        Check("ExpectColumnValuesToMatchRegex", {"column": "task_id", "regex": r"^level\d+/[^/\s]+$"},
              "task ids read levelN/name"),
        Check("ExpectCompoundColumnsToBeUnique", {"column_list": ["split", "task_id"]},
              "no task id appears twice in one split"),
        Check("ExpectColumnValuesToBeInSet", {"column": "in_both", "value_set": [False]},
              "no task is in both train and eval"),
        Check("ExpectColumnValuesToBeInSet", {"column": "level", "value_set": levels},
              f"every task's level is a configured level {levels}"),
        Check("ExpectColumnDistinctValuesToContainSet", {"column": "level", "value_set": levels},
              "every configured level has tasks"),
        Check("ExpectColumnPairValuesToBeEqual",
              {"column_A": "level", "column_B": "id_level", "ignore_row_if": "either_value_is_missing"},
              "the level in a task's id is its level"),
        Check("ExpectColumnValuesToBeInSet", {"column": "loads", "value_set": [True]},
              "every task file loads as a KernelBench task", detail="load_error"),
        Check("ExpectColumnValuesToBeInSet", {"column": "renders", "value_set": [True]},
              "every size profile renders into a valid task", detail="render_error"),
        Check("ExpectColumnValuesToBeInSet", {"column": "digest_matches", "value_set": [True]},
              "every task file is the one the split recorded (same content digest)", detail="digest_note"),
        Check("ExpectColumnValuesToBeInSet", {"column": "profile_numeric", "value_set": [True]},
              "size-profile values are numbers", detail="profile_note"),
        Check("ExpectColumnValuesToBeBetween", {"column": "profile_min", "min_value": 1},
              "size-profile values are at least 1", detail="profile_note"),
        Check("ExpectColumnValuesToBeBetween", {"column": "profile_growth", "max_value": 1.0},
              "no size profile is larger than the task's own sizes", detail="profile_note"),
    ]
    if bundled:
        # The cpu backend evaluates bundled tasks at their cpu sizes: a task without them would run
        # at GPU sizes on a CPU (minutes per call).
        checks.append(Check("ExpectColumnValuesToBeInSet", {"column": "has_cpu_profile", "value_set": [True]},
                            "every bundled task has a cpu size profile"))
    return checks


SPLIT_ID_COLUMNS = ("split", "position", "task_id")


def split_frame(split: "Split", source: str | None = None) -> "pd.DataFrame":
    """One row per split entry, with the outcome of loading and rendering its task file.

    ``source`` overrides the split's own (e.g. the same KernelBench checkout at another path). Raises
    TaskError/FileNotFoundError when the source itself is missing.
    """
    import pandas as pd

    from kevin.tasks.loader import source_root

    root = source_root(source or split.config.source)
    train_ids = {e.task_id for e in split.train}
    eval_ids = {e.task_id for e in split.eval}
    records = []
    for name, entries in (("train", split.train), ("eval", split.eval)):
        for position, entry in enumerate(entries, 1):
            record = {"split": name, "position": position, "task_id": entry.task_id, "level": entry.level,
                      "digest": entry.digest, "path": entry.path,
                      "in_both": entry.task_id in train_ids and entry.task_id in eval_ids}
            match = _ID.match(entry.task_id) if isinstance(entry.task_id, str) else None
            record["id_level"] = int(match.group(1)) if match else None
            record.update(task_file_facts(entry, root))
            records.append(record)
    frame = pd.DataFrame.from_records(records, columns=_SPLIT_COLUMNS)
    frame.insert(0, "row", range(1, len(frame) + 1))
    return frame


_SPLIT_COLUMNS = ["split", "position", "task_id", "level", "digest", "path", "in_both", "id_level", "loads",
                  "load_error", "renders", "render_error", "digest_matches", "digest_note", "has_cpu_profile",
                  "profile_numeric", "profile_min", "profile_growth", "profile_note"]


def task_file_facts(entry: "SplitEntry", root: Path) -> dict[str, Any]:
    """Load and render one entry's task file; every outcome is a value (never an exception).

    Columns: loads/load_error, renders/render_error, digest_matches/digest_note, has_cpu_profile, and the
    size-profile figures (None when the task has no profiles): profile_numeric, profile_min (smallest
    value any profile sets), profile_growth (largest ratio of a profile value to the task's own value).
    """
    from kevin.tasks.loader import load_task_file
    from kevin.tasks.profiles import read_constants, read_profiles
    from kevin.tasks.task import validate_task_source

    facts: dict[str, Any] = {"loads": False, "load_error": "", "renders": None, "render_error": "",
                             "digest_matches": None, "digest_note": "", "has_cpu_profile": None,
                             "profile_numeric": None, "profile_min": None, "profile_growth": None, "profile_note": ""}
    task_id = entry.task_id if isinstance(entry.task_id, str) else str(entry.task_id)
    level = entry.level if isinstance(entry.level, int) and not isinstance(entry.level, bool) else 0
    path = root / entry.path if entry.path else root / f"level{level}" / f"{task_id.split('/')[-1]}.py"
    try:
        task = load_task_file(path, level=level, task_id=task_id)
    except (OSError, ValueError) as exc:  # TaskError and ProfileError are ValueErrors; a missing file an OSError
        facts["load_error"] = f"{type(exc).__name__}: {exc}"
        return facts
    facts["loads"] = True
    facts["digest_matches"] = task.digest == entry.digest
    if not facts["digest_matches"]:
        facts["digest_note"] = f"split recorded {entry.digest}, the file now hashes to {task.digest}"
    facts["has_cpu_profile"] = "cpu" in task.profiles

    facts["renders"] = True
    for profile in ("default", *task.profiles):
        try:
            rendered = task.render(profile)
            validate_task_source(rendered, f"{task_id} [{profile}]")
            if read_profiles(rendered):
                raise ValueError("the rendered source still declares KEVIN_PROFILES")
            constants = read_constants(rendered)
            wrong = {k: constants.get(k) for k, v in task.profiles.get(profile, {}).items() if constants.get(k) != v}
            if wrong:
                raise ValueError(f"rendered constants differ from the profile: {wrong}")
        except (ValueError, SyntaxError) as exc:
            facts["renders"] = False
            facts["render_error"] = f"profile {profile!r}: {type(exc).__name__}: {exc}"
            break

    values = {(p, k): v for p, sizes in task.profiles.items() for k, v in sizes.items()}
    if values:
        numeric = {key: v for key, v in values.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        facts["profile_numeric"] = len(numeric) == len(values)
        own = read_constants(task.source)
        ratios = {key: v / own[key[1]] for key, v in numeric.items()
                  if isinstance(own.get(key[1]), (int, float)) and not isinstance(own.get(key[1]), bool) and own[key[1]] > 0}
        if numeric:
            facts["profile_min"] = min(numeric.values())
        if ratios:
            facts["profile_growth"] = max(ratios.values())
        notes = [f"{p}.{k}={v!r}" for (p, k), v in values.items() if (p, k) not in numeric]
        notes += [f"{p}.{k}={v!r} (own {own[k]!r})" for (p, k), v in numeric.items() if v < 1 or ratios.get((p, k), 0) > 1]
        facts["profile_note"] = "; ".join(notes)
    return facts


def check_split(split: "Split", source: str | None = None) -> CheckReport:
    """Run the split suite over ``split`` (loading its tasks from ``source``, default the split's own)."""
    frame = split_frame(split, source)
    bundled = (source or split.config.source) == "bundled"
    return run_checks("splits", frame, split_checks(split.config.levels, bundled), SPLIT_ID_COLUMNS)


# ------------------------------------------------------------------------------------------ rollouts


def rollout_checks() -> list[Check]:
    """The expectations a batch of rollout turns must meet."""
    from kevin.records.evaluation import Status

    per_turn = [
        Check("ExpectColumnValuesToNotBeNull", {"column": "task_id"}, "every turn names its task"),
        Check("ExpectColumnValuesToNotBeNull", {"column": "trajectory"}, "every turn has a trajectory index"),
        Check("ExpectColumnValuesToBeBetween", {"column": "trajectory", "min_value": 0}, "trajectory indices are >= 0"),
        Check("ExpectColumnValuesToNotBeNull", {"column": "turn"}, "every turn has a turn index"),
        Check("ExpectColumnValuesToBeInSet", {"column": "missing_turns", "value_set": [""]},
              "turn indices run 0..n-1 without gaps in each (task, trajectory)", detail="missing_turns"),
        Check("ExpectCompoundColumnsToBeUnique", {"column_list": ["task_id", "trajectory", "turn"]},
              "exactly one response per (task, trajectory, turn)"),
        Check("ExpectColumnValuesToBeInSet", {"column": "has_response", "value_set": [True]},
              "every turn holds its response text"),
        Check("ExpectColumnValuesToNotBeNull", {"column": "status"}, "every turn has a verdict status"),
        Check("ExpectColumnValuesToBeInSet", {"column": "status", "value_set": [s.value for s in Status]},
              "statuses are evaluator statuses"),
        Check("ExpectColumnValuesToNotBeNull", {"column": "score"}, "every score is a number (not NaN)",
              detail="score_raw"),
        Check("ExpectColumnValuesToBeBetween", {"column": "score", "min_value": 0.0, "max_value": sys.float_info.max},
              "scores are finite and >= 0"),
        Check("ExpectColumnValuesToNotBeNull", {"column": "speedup"}, "every speedup is a number (not NaN)",
              detail="speedup_raw"),
        Check("ExpectColumnValuesToBeBetween", {"column": "speedup", "min_value": 0.0}, "speedups are >= 0"),
    ]
    return [
        Check("ExpectTableRowCountToBeBetween", {"min_value": 1}, "the batch has turns"),
        Check("ExpectColumnValuesToBeInSet", {"column": "parsed", "value_set": [True]},
              "every line is a JSON turn record", detail="parse_note"),
        # A line that is not a record is reported once, above, not again by every per-turn check.
        *(replace(check, only_if=("parsed", True)) for check in per_turn),
    ]


ROLLOUT_ID_COLUMNS = ("line", "task_id", "trajectory", "turn")
_ABSENT = object()


def read_rollout_lines(path: str | Path) -> list[tuple[int, Any]]:
    """``(line number, parsed JSON or the error text)`` per non-blank line; a bad line is data, not an exception."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no such rollout file: {path}")
    out: list[tuple[int, Any]] = []
    with path.open(encoding="utf-8", errors="replace") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                out.append((lineno, json.loads(line)))
            except json.JSONDecodeError as exc:
                out.append((lineno, _BadLine(f"not valid JSON ({exc.msg})")))
    return out


@dataclass(frozen=True)
class _BadLine:
    reason: str


def rollout_frame(lines: Iterable[tuple[int, Any]]) -> "pd.DataFrame":
    """One row per turn. Turn records are read as plain dicts (fields of ``Turn.to_dict()``); a
    Trajectory record (with a ``turns`` list) contributes each of its turns."""
    import pandas as pd

    records = []
    for lineno, data in lines:
        if isinstance(data, dict) and isinstance(data.get("turns"), list):
            records.extend(_turn_record(lineno, turn) for turn in data["turns"])
        else:
            records.append(_turn_record(lineno, data))
    frame = pd.DataFrame.from_records(records, columns=_ROLLOUT_COLUMNS)
    for column in ("trajectory", "turn", "score", "speedup"):
        frame[column] = pd.to_numeric(frame[column], errors="coerce")
    keyed = frame.dropna(subset=["task_id", "trajectory", "turn"])
    # The turns a trajectory lacks below its last one, named on each of its turns that comes after a gap (a lone
    # turn 1 says "turns missing: 0", rather than that 1 should have been 0).
    groups = keyed.groupby([keyed["task_id"].astype(str), "trajectory"])["turn"]
    missing = pd.Series([""] * len(keyed), index=keyed.index, dtype=object)
    for _, turns in groups:
        gaps = _missing_turns(turns)
        if gaps:
            note = "turns missing: " + ", ".join(map(str, gaps))
            missing[turns.index[turns > gaps[0]]] = note
    frame["missing_turns"] = missing.reindex(frame.index).fillna("")
    frame.insert(0, "row", range(1, len(frame) + 1))
    return frame


def _missing_turns(turns: "pd.Series") -> list[int]:
    """The indices in 0..max(turns) that ``turns`` lacks, in order."""
    present = {int(t) for t in turns if float(t).is_integer() and t >= 0}
    return sorted(set(range(max(present, default=-1) + 1)) - present)


_ROLLOUT_COLUMNS = ["line", "parsed", "parse_note", "task_id", "trajectory", "turn", "has_response", "status",
                    "score", "score_raw", "speedup", "speedup_raw"]


def _turn_record(lineno: int, data: Any) -> dict[str, Any]:
    if not isinstance(data, dict):
        note = data.reason if isinstance(data, _BadLine) else f"a JSON {type(data).__name__}, not an object"
        return {"line": lineno, "parsed": False, "parse_note": note}
    result = data.get("result") if isinstance(data.get("result"), dict) else {}
    score, speedup = result.get("score", _ABSENT), result.get("speedup", _ABSENT)
    task_id = data.get("task_id")
    return {
        "line": lineno, "parsed": True, "parse_note": "",
        "task_id": task_id if task_id is None or isinstance(task_id, str) else str(task_id),
        "trajectory": _number(data.get("trajectory")), "turn": _number(data.get("turn")),
        "has_response": isinstance(data.get("response"), str),
        "status": result.get("status"),
        "score": _number(score), "score_raw": _raw(score),
        "speedup": _number(speedup), "speedup_raw": _raw(speedup),
    }


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _raw(value: Any) -> str:
    return "no value in the record" if value is _ABSENT else f"recorded as {value!r}"


# The other JSONL records a run writes beside its turns, by the fields only they carry: a file of these given as
# rollouts would fail every row, so it is named instead.
_OTHER_RECORDS = (
    ({"advantage", "completion_token_ids"}, "training samples (a step's samples.jsonl)"),
    ({"candidate_id", "status"}, "verdicts (rollout/verdicts_T.jsonl)"),
    ({"kernel", "parse_error"}, "parsed responses (rollout/parsed_T.jsonl)"),
    ({"text", "token_ids"}, "generated responses (rollout/generated_T.jsonl)"),
)


def other_record_kind(lines: Sequence[tuple[int, Any]]) -> str | None:
    """What a JSONL file holds when no record of it is a turn (nor a trajectory of turns) and its records are all
    of another kind a run writes; None otherwise (turn files, and files of no known kind, go to the suite)."""
    records = [data for _, data in lines if isinstance(data, dict)]
    if not records or any("result" in r or isinstance(r.get("turns"), list) for r in records):
        return None
    for fields, kind in _OTHER_RECORDS:
        if all(fields <= r.keys() for r in records):
            return kind
    return None


def check_rollouts(rows: str | Path | Sequence[Mapping[str, Any]]) -> CheckReport:
    """Run the rollout suite over a JSONL file of Turn records (or over the records as dicts). A file of another
    record kind a run writes (samples, verdicts ...) is a ``ValueError`` that names the kind."""
    if isinstance(rows, (str, Path)):
        return replace(check_rollout_batch(str(rows), [Path(rows)]), suite="rollouts")
    return _check_lines("the records", list(enumerate(rows, 1)))


def _check_lines(name: str, lines: list[tuple[int, Any]]) -> CheckReport:
    kind = other_record_kind(lines)
    if kind is not None:
        raise ValueError(f"{name} holds {kind}, not rollout turns: give a turns file (a step's rollout/turn_T.jsonl, "
                         "or an evaluation's rollouts/<split>/turn_T.jsonl) or their folder")
    return run_checks("rollouts", rollout_frame(lines), rollout_checks(), ROLLOUT_ID_COLUMNS)


def rollout_batches(path: str | Path) -> list[tuple[str, list[Path]]]:
    """The batches of turns below ``path``: a turns file alone, or, for a folder, each folder holding
    ``turn_*.jsonl`` files (a step's ``rollout/``, an evaluation's ``rollouts/<split>/``) with all of them, since
    one batch's turns are spread over one file per turn."""
    path = Path(path)
    if path.is_file():
        return [(str(path), [path])]
    if not path.is_dir():
        raise FileNotFoundError(f"no such rollout file or folder: {path}")
    folders = sorted({p.parent for p in path.rglob("turn_*.jsonl")})
    if not folders:
        raise FileNotFoundError(f"{path} holds no rollout turns (turn_*.jsonl files)")
    return [(str(folder), sorted(folder.glob("turn_*.jsonl"))) for folder in folders]


def check_rollout_batch(name: str, files: Sequence[Path]) -> CheckReport:
    """``check_rollouts`` over the turns of several files as one batch, the report named ``rollouts <name>``."""
    report = _check_lines(name, [line for f in files for line in read_rollout_lines(f)])
    return replace(report, suite=f"rollouts {name}")


def render_reports(reports: Iterable[CheckReport], max_rows: int = 20) -> str:
    return "\n\n".join(r.render(max_rows) for r in reports)
