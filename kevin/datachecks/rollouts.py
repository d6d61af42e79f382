"""The rollout suite: what a batch of turn records must meet (one record per task, trajectory and turn, turn numbers
without gaps, evaluator statuses, finite scores and speedups), over one row per turn; and finding the batches
below a run's folders.

A line that is not a record is a row that says so, never an exception, so one bad line is reported with the rest.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

from kevin.datachecks.suite import Check, CheckReport, run_checks

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["ROLLOUT_ID_COLUMNS", "check_rollout_batch", "check_rollouts", "other_record_kind", "read_rollout_lines",
           "rollout_batches", "rollout_checks", "rollout_frame"]


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
