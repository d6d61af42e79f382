"""The split suite: what a train/eval split must meet (both halves filled, no task in both, every configured level
present, every task file loading, rendering and still matching its recorded digest), over one row per entry.

Loading and rendering happen here in Python, their outcome a column the suite checks, so a failure still names
its expectation and its rows.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

from kevin.datachecks.suite import Check, CheckReport, run_checks

if TYPE_CHECKING:
    import pandas as pd

    from kevin.tasks.splits import Split, SplitEntry

__all__ = ["SPLIT_ID_COLUMNS", "check_split", "split_checks", "split_frame", "task_file_facts"]

_ID = re.compile(r"^level(\d+)/")


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

    facts.update(_profile_facts(task))
    return facts


def _profile_facts(task: Any) -> dict[str, Any]:
    """The size-profile columns of ``task_file_facts`` (none when the task declares no profile)."""
    from kevin.tasks.profiles import read_constants

    values = {(p, k): v for p, sizes in task.profiles.items() for k, v in sizes.items()}
    if not values:
        return {}
    facts: dict[str, Any] = {}
    numeric = {key: v for key, v in values.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    facts["profile_numeric"] = len(numeric) == len(values)
    own = read_constants(task.source)
    ratios = {key: v / own[key[1]] for key, v in numeric.items()
              if isinstance(own.get(key[1]), (int, float)) and not isinstance(own.get(key[1]), bool)
              and own[key[1]] > 0}
    if numeric:
        facts["profile_min"] = min(numeric.values())
    if ratios:
        facts["profile_growth"] = max(ratios.values())
    notes = [f"{p}.{k}={v!r}" for (p, k), v in values.items() if (p, k) not in numeric]
    notes += [f"{p}.{k}={v!r} (own {own[k]!r})" for (p, k), v in numeric.items()
              if v < 1 or ratios.get((p, k), 0) > 1]
    facts["profile_note"] = "; ".join(notes)
    return facts


def check_split(split: "Split", source: str | None = None) -> CheckReport:
    """Run the split suite over ``split`` (loading its tasks from ``source``, default the split's own)."""
    frame = split_frame(split, source)
    bundled = (source or split.config.source) == "bundled"
    return run_checks("splits", frame, split_checks(split.config.levels, bundled), SPLIT_ID_COLUMNS)
