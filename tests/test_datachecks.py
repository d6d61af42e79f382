"""Data checks (real great-expectations suites): they pass on good data and name the expectation and the
rows on broken splits and rollout batches; `kevin split` / `kevin validate` on the command line."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
import math

import pytest
from typer.testing import CliRunner

from kevin_cli import app
from kevin.datachecks import check_rollouts, check_split
from kevin.records.evaluation import EvalResult, Status
from kevin.records.rollout import TrainingSample, Turn, group_trajectories, save_records, save_turns
from kevin.tasks import SplitConfig, make_split, write_split
from tests.conftest import kernelbench_task_source, write_kernelbench_dir

runner = CliRunner()
SPLIT_CHECKS = 14  # expectations of the split suite for a KernelBench source (the bundled suite adds one)


def failed(report) -> dict[str, list[dict]]:
    """{description: [where of each failing row]} of a report."""
    return {f.description: [r.where for r in f.rows] for f in report.failures}


@pytest.fixture()
def kb(tmp_path):
    """A KernelBench-layout folder of our own tasks (8 + 8 + 1) and its split (eval 2 + 2)."""
    root = write_kernelbench_dir(tmp_path / "kb", {1: 8, 2: 8, 3: 1})
    return root, make_split(SplitConfig(source=str(root), eval_size=4))


def test_the_bundled_split_passes():
    report = check_split(make_split(SplitConfig()))
    assert report.success and report.failures == ()
    assert (report.suite, report.rows, report.evaluated) == ("splits", 60, SPLIT_CHECKS + 1)
    assert report.render() == "splits: passed (60 rows checked)"


def test_a_duplicated_id_fails_uniqueness_on_both_rows(kb):
    _, split = kb
    broken = dataclasses.replace(split, train=split.train + (split.train[2],))
    report = check_split(broken)
    assert not report.success
    dup = split.train[2].task_id
    assert failed(report) == {"no task id appears twice in one split": [
        {"split": "train", "position": 3, "task_id": dup}, {"split": "train", "position": 13, "task_id": dup}]}
    assert report.failures[0].expectation == "expect_compound_columns_to_be_unique"


def test_leakage_fails_on_the_task_in_both_splits(kb):
    _, split = kb
    leak = split.eval[1]
    broken = dataclasses.replace(split, train=(leak,) + split.train)
    report = check_split(broken)
    assert failed(report) == {"no task is in both train and eval": [
        {"split": "train", "position": 1, "task_id": leak.task_id},
        {"split": "eval", "position": 2, "task_id": leak.task_id}]}
    text = report.render()
    assert "x no task is in both train and eval  [expect_column_values_to_be_in_set on in_both]: 2 rows" in text
    assert f"row 1 [split=train position=1 task_id={leak.task_id}]: in_both=True" in text


def test_a_task_that_does_not_load_or_vanished(kb):
    root, split = kb
    junk, gone = split.train[0], split.eval[0]
    (root / "KernelBench" / junk.path).write_text("def get_inputs():\n    return []\n")
    (root / "KernelBench" / gone.path).unlink()
    report = check_split(split)
    assert failed(report) == {"every task file loads as a KernelBench task": [
        {"split": "train", "position": 1, "task_id": junk.task_id},
        {"split": "eval", "position": 1, "task_id": gone.task_id}]}
    rows = report.failures[0].rows
    assert "TaskError" in rows[0].detail and "missing Model, get_init_inputs" in rows[0].detail
    assert rows[1].detail.startswith("FileNotFoundError: no such file")


def test_edited_unrenderable_and_out_of_range_size_profiles(tmp_path):
    root = write_kernelbench_dir(tmp_path / "kb", {1: 6, 2: 6})
    level1 = root / "KernelBench" / "level1"
    (level1 / "2_Scale2.py").write_text(kernelbench_task_source(2) + '\nKEVIN_PROFILES = {"cpu": {"nope": 3}}\n')
    (level1 / "3_Scale3.py").write_text(kernelbench_task_source(3) + '\nKEVIN_PROFILES = {"cpu": {"dim": 4096}}\n')
    (level1 / "4_Scale4.py").write_text(kernelbench_task_source(4) + '\nKEVIN_PROFILES = {"cpu": {"dim": 0}}\n')
    (level1 / "5_Scale5.py").write_text(kernelbench_task_source(5) + '\nKEVIN_PROFILES = {"cpu": {"dim": "big"}}\n')
    split = make_split(SplitConfig(source=str(root), eval_size=2))
    (level1 / "6_Scale6.py").write_text(kernelbench_task_source(6, size=512))  # edited after the split
    report = check_split(split)
    ids = {d: [w["task_id"] for w in rows] for d, rows in failed(report).items()}
    assert ids == {
        "every size profile renders into a valid task": ["level1/2_Scale2"],
        "no size profile is larger than the task's own sizes": ["level1/3_Scale3"],
        "size-profile values are at least 1": ["level1/4_Scale4"],
        "size-profile values are numbers": ["level1/5_Scale5"],
        "every task file is the one the split recorded (same content digest)": ["level1/6_Scale6"],
    }
    details = {f.description: f.rows[0].detail for f in report.failures}
    assert "sets constants the task does not define: ['nope']" in details["every size profile renders into a valid task"]
    assert details["no size profile is larger than the task's own sizes"] == "cpu.dim=4096 (own 256)"
    assert details["size-profile values are numbers"] == "cpu.dim='big'"
    assert details["every task file is the one the split recorded (same content digest)"].startswith("split recorded ")
    growth = next(f for f in report.failures if f.description.startswith("no size profile"))
    assert growth.rows[0].value == {"profile_growth": 16.0}


def test_levels_outside_the_configuration(kb):
    _, split = kb
    moved = dataclasses.replace(split.train[0], level=3)
    report = check_split(dataclasses.replace(split, train=(moved,) + split.train[1:]))
    where = {"split": "train", "position": 1, "task_id": moved.task_id}
    assert failed(report) == {"every task's level is a configured level [1, 2]": [where],
                              "the level in a task's id is its level": [where]}
    only_train = check_split(dataclasses.replace(split, eval=()))
    assert set(failed(only_train)) == {"both train and eval have tasks"}
    assert only_train.failures[0].missing == ("eval",)
    assert "x both train and eval have tasks  [expect_column_distinct_values_to_equal_set on split]: missing ['eval']" \
        in only_train.render()
    no_level2 = dataclasses.replace(split, train=tuple(e for e in split.train if e.level == 1),
                                    eval=tuple(e for e in split.eval if e.level == 1))
    report = check_split(no_level2)
    assert set(failed(report)) == {"every configured level has tasks"} and report.failures[0].missing == (2,)


# ------------------------------------------------------------------------------------------ rollouts


def turn(task: str, traj: int, index: int, status: Status = Status.CORRECT, speedup: float = 1.25) -> Turn:
    correct = status is Status.CORRECT
    result = EvalResult(task_id=task, candidate_id=f"{task}:{traj}:{index}", status=status, correct=correct,
                        speedup=speedup if correct else 0.0, score=0.3 + speedup if correct else 0.0,
                        max_abs_error=math.inf if status is Status.INCORRECT else 0.0)
    return Turn(task_id=task, trajectory=traj, turn=index, prompt="p", response=f"r{index}", kernel="k", result=result)


def batch() -> list[Turn]:
    """2 tasks x 2 trajectories x 3 turns, every status kind of turn the loop writes."""
    statuses = [Status.COMPILE_ERROR, Status.INCORRECT, Status.CORRECT]
    return [turn(task, traj, i, statuses[i]) for task in ("level1/a", "level2/b") for traj in (0, 1) for i in range(3)]


def rows_of(turns: list[Turn]) -> list[dict]:
    return [json.loads(json.dumps(t.to_dict())) for t in turns]


def test_a_good_batch_passes_from_a_file_of_turns_or_of_trajectories(tmp_path):
    report = check_rollouts(save_turns(tmp_path / "turns.jsonl", batch()))
    assert report.success and (report.suite, report.rows, report.evaluated) == ("rollouts", 12, 15)
    trajectories = save_records(tmp_path / "traj.jsonl", group_trajectories(batch()))
    assert len(trajectories.read_text().splitlines()) == 4  # one Trajectory record per line, 3 turns each
    report = check_rollouts(trajectories)
    assert report.success and report.rows == 12


def test_bad_status_negative_and_nan_scores_negative_speedup():
    rows = rows_of(batch())
    rows[1]["result"]["status"] = "exploded"
    rows[2]["result"]["score"] = -0.5
    rows[5]["result"]["score"] = float("nan")
    rows[8]["result"]["score"] = float("inf")
    rows[11]["result"]["speedup"] = -2.0
    report = check_rollouts(rows)

    def where(i: int) -> dict:
        return {"line": i + 1, "task_id": rows[i]["task_id"], "trajectory": rows[i]["trajectory"], "turn": rows[i]["turn"]}

    assert failed(report) == {
        "statuses are evaluator statuses": [where(1)],
        "scores are finite and >= 0": [where(2), where(8)],
        "every score is a number (not NaN)": [where(5)],
        "speedups are >= 0": [where(11)],
    }
    by = {f.description: f for f in report.failures}
    assert by["statuses are evaluator statuses"].rows[0].value == {"status": "exploded"}
    assert [r.value["score"] for r in by["scores are finite and >= 0"].rows] == [-0.5, math.inf]
    assert by["every score is a number (not NaN)"].rows[0].detail == "recorded as nan"


def test_a_gap_in_turn_indices_and_a_duplicated_turn():
    turns = batch()
    gap = [t for t in turns if not (t.task_id == "level2/b" and t.trajectory == 1 and t.turn == 1)]
    report = check_rollouts(rows_of(gap))
    assert failed(report) == {"turn indices run 0..n-1 without gaps in each (task, trajectory)": [
        {"line": 11, "task_id": "level2/b", "trajectory": 1, "turn": 2}]}
    assert report.failures[0].rows[0].detail == "turns missing: 1"

    # A trajectory without its turn 0 (e.g. one turn file checked alone): every turn of it says so.
    alone = [t for t in turns if not (t.task_id == "level2/b" and t.trajectory == 1 and t.turn == 0)]
    report = check_rollouts(rows_of(alone))
    (failure,) = report.failures
    assert [(r.where["turn"], r.detail) for r in failure.rows] == [(1, "turns missing: 0"), (2, "turns missing: 0")]

    dup = turns + [turn("level1/a", 1, 2)]
    report = check_rollouts(rows_of(dup))
    assert failed(report) == {"exactly one response per (task, trajectory, turn)": [
        {"line": 6, "task_id": "level1/a", "trajectory": 1, "turn": 2},
        {"line": 13, "task_id": "level1/a", "trajectory": 1, "turn": 2}]}


def test_broken_lines_and_missing_fields_are_reported_once(tmp_path):
    rows = rows_of(batch())
    del rows[3]["response"]
    del rows[4]["result"]
    path = tmp_path / "b.jsonl"
    lines = [json.dumps(r) for r in rows]
    lines.insert(6, "{truncated")
    path.write_text("\n".join(lines) + "\n")
    report = check_rollouts(path)
    got = failed(report)
    assert got.pop("every line is a JSON turn record") == [{"line": 7, "task_id": None, "trajectory": None, "turn": None}]
    w3 = {"line": 4, "task_id": "level1/a", "trajectory": 1, "turn": 0}
    w4 = {"line": 5, "task_id": "level1/a", "trajectory": 1, "turn": 1}
    assert got == {"every turn holds its response text": [w3], "every turn has a verdict status": [w4],
                   "every score is a number (not NaN)": [w4], "every speedup is a number (not NaN)": [w4]}
    bad_line = next(f for f in report.failures if f.description == "every line is a JSON turn record")
    assert bad_line.rows[0].detail.startswith("not valid JSON (")
    assert not check_rollouts([]).success  # an empty batch is not a batch


def test_a_file_of_another_record_kind_is_named_not_failed_row_by_row(tmp_path):
    samples = [TrainingSample([1, 2], [3], None, 0.5, 0.25, "level1/a", 0, t).to_dict() for t in range(2)]
    path = tmp_path / "samples.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in samples))
    with pytest.raises(ValueError, match=r"samples.jsonl holds training samples .*not rollout turns: give a turns file"):
        check_rollouts(path)
    verdicts = [t.result.to_dict() for t in batch()]
    with pytest.raises(ValueError, match="holds verdicts"):
        check_rollouts(verdicts)
    r = runner.invoke(app, ["validate", "--rollouts", str(path)])
    assert r.exit_code != 0 and "holds training samples" in r.output, r.output
    # A turns file with one record of another kind in it is still a turns file: that row fails, named.
    mixed = rows_of(batch())[:3] + samples[:1]
    assert set(failed(check_rollouts(mixed))) == {
        "every turn holds its response text", "every turn has a verdict status", "every score is a number (not NaN)",
        "every speedup is a number (not NaN)", "exactly one response per (task, trajectory, turn)"}


# ------------------------------------------------------------------------------------------ command line


def test_split_then_validate_on_the_command_line(tmp_path):
    out = tmp_path / "splits" / "bundled.json"
    r = runner.invoke(app, ["split", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert "train: 40 tasks (level 1: 20, level 2: 20)" in r.output and "eval: 20 tasks (level 1: 10, level 2: 10)" in r.output
    report = tmp_path / "report.json"
    ok = runner.invoke(app, ["validate", "--splits", str(out), "--report", str(report)])
    assert ok.exit_code == 0, ok.output
    assert json.loads(report.read_text())[0]["success"] is True

    params = tmp_path / "params.yaml"
    params.write_text("evaluation:\n  backend: cpu\nsplits:\n  seed: 4\n  eval_size: 4\n  levels: [1, 2]\n")
    root = write_kernelbench_dir(tmp_path / "kb", {1: 5, 2: 5})
    kb_out = tmp_path / "kb.json"
    r = runner.invoke(app, ["split", "--source", str(root), "--params", str(params), "--out", str(kb_out)])
    assert r.exit_code == 0, r.output
    data = json.loads(kb_out.read_text())
    assert data["config"]["source"] == str(root) and data["config"]["seed"] == 4 and len(data["eval"]) == 4


def test_a_broken_split_fails_the_validate_stage_with_its_report(tmp_path):
    split = make_split(SplitConfig())
    leak = split.eval[0]
    path = write_split(tmp_path / "broken.json", dataclasses.replace(split, train=split.train + (leak,)))
    turns = save_turns(tmp_path / "t.jsonl", batch())
    r = runner.invoke(app, ["validate", "--splits", str(path), "--rollouts", str(turns)])
    assert r.exit_code == 1
    assert "splits: FAILED 1 of 15 expectations (61 rows checked)" in r.output
    assert f"row 41 [split=train position=41 task_id={leak.task_id}]: in_both=True" in r.output
    assert f"row 42 [split=eval position=1 task_id={leak.task_id}]: in_both=True" in r.output
    assert f"rollouts {turns}: passed (12 rows checked)" in r.output


def test_a_run_folder_is_checked_batch_by_batch_each_from_its_turn_files(tmp_path):
    turns = batch()
    for step in (0, 1):  # a step's turns, one file per turn index, as a run writes them
        folder = tmp_path / "steps" / f"step_{step:06d}" / "rollout"
        for index in sorted({t.turn for t in turns}):
            if step == 1 and index == 0:
                continue  # step 1 lost its first turn's file
            save_turns(folder / f"turn_{index:03d}.jsonl", [t for t in turns if t.turn == index])
    r = runner.invoke(app, ["validate", "--rollouts", str(tmp_path / "steps"), "--report", str(tmp_path / "r.json")])
    assert r.exit_code == 1, r.output
    reports = json.loads((tmp_path / "r.json").read_text())
    assert [(Path(x["suite"].split(" ", 1)[1]).parent.name, x["success"]) for x in reports] == [
        ("step_000000", True), ("step_000001", False)]
    assert "step_000001/rollout: FAILED 1 of" in r.output and "turns missing: 0" in r.output
    r = runner.invoke(app, ["validate", "--rollouts", str(tmp_path)])  # nothing but the same two batches below
    assert r.exit_code == 1
    empty = tmp_path / "empty"
    empty.mkdir()
    r = runner.invoke(app, ["validate", "--rollouts", str(empty)])
    assert r.exit_code == 2 and "holds no rollout turns" in r.output


def test_bad_arguments_exit_2(tmp_path):
    r = runner.invoke(app, ["validate"])
    assert r.exit_code == 2 and "give --splits FILE and/or --rollouts FILE.jsonl" in r.output
    r = runner.invoke(app, ["validate", "--splits", str(tmp_path / "none.json")])
    assert r.exit_code == 2 and "no such split file" in r.output
    params = tmp_path / "params.yaml"
    params.write_text("splits:\n  eval_sise: 3\n")
    r = runner.invoke(app, ["split", "--params", str(params), "--out", str(tmp_path / "s.json")])
    assert r.exit_code == 2 and "unknown splits settings: ['eval_sise']" in r.output
    r = runner.invoke(app, ["split", "--source", str(tmp_path), "--out", str(tmp_path / "s.json")])
    assert r.exit_code == 2 and "not a KernelBench checkout" in r.output
