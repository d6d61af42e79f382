"""The evaluation run's pure parts: which rollouts a plan generates, the report's JSON round trip, the DVC curves,
the checkpoint a setting names, and the comparison of two reports on disk."""

from __future__ import annotations

import csv
import dataclasses
import json

import pytest

from kevin.analysis import AnalysisConfig, BeamConfig, TaskOutcome, TrajectoryOutcome, analyze_run
from kevin.experiment.evaluate import RolloutPlan, resolve_checkpoint, rollout_plan
from kevin.experiment.outputs import compare_runs, load_report, wide_curves


def test_one_rollout_of_the_largest_split_without_selection_and_one_per_split_with_it():
    config = AnalysisConfig(budget_splits=("16x8", "32x4", "128x1"))
    assert rollout_plan(config, BeamConfig()) == [RolloutPlan("128x8", 128, 8, False)]
    assert rollout_plan(config, BeamConfig(strategy="top_k", keep=4)) == [
        RolloutPlan("16x8", 16, 8, True), RolloutPlan("32x4", 32, 4, True), RolloutPlan("128x1", 128, 1, False)]
    with pytest.raises(ValueError, match="lower beam.keep"):
        rollout_plan(AnalysisConfig(budget_splits=("2x2",)), BeamConfig(strategy="top_k", keep=4))


def report(name: str = "run"):
    # Task a: trajectories perf [2.0, 0] (the first correct at turn 2); task b: [0.5, 1.5] in turn 1.
    tasks = [TaskOutcome("a", (TrajectoryOutcome.of((False, 0.0), (True, 2.0)), TrajectoryOutcome.of((False, 0.0), (False, 0.0)))),
             TaskOutcome("b", (TrajectoryOutcome.of((True, 0.5), (False, 0.0)), TrajectoryOutcome.of((True, 1.5), (False, 0.0))))]
    return analyze_run(name, tasks, AnalysisConfig(budget_splits=("1x2", "2x1"), fast_ps=(0.0, 1.0),
                                                   table_fast_ps=(1.0,), pass_ks=(1,)))


def test_a_report_round_trips_through_json(tmp_path):
    r = report()
    (tmp_path / "report.json").write_text(json.dumps(r.to_dict()))
    assert load_report(tmp_path) == r
    with pytest.raises(FileNotFoundError, match="--resume"):
        load_report(tmp_path / "nothing")


def test_an_older_report_gets_its_per_task_correct_shares_from_the_turn_records(tmp_path):
    from kevin.records.evaluation import EvalResult, Status
    from kevin.records.rollout import Turn, save_turns

    def turn(task, traj, number, ok):
        status = Status.CORRECT if ok else Status.INCORRECT
        return Turn(task_id=task, trajectory=traj, turn=number,
                    result=EvalResult(task_id=task, candidate_id="c", status=status, correct=ok, speedup=1.0, score=0.0))

    older = report().to_dict()
    del older["task_correct_share"]  # a report written before the field existed
    (tmp_path / "report.json").write_text(json.dumps(older))
    (tmp_path / "run.json").write_text(json.dumps({"rollouts": [{"name": "2x2", "trajectories": 2, "turns": 2,
                                                                  "select": False}]}))
    rollout = tmp_path / "rollouts" / "2x2"
    rollout.mkdir(parents=True)
    # Task a: trajectory 0 correct at turn 2, trajectory 1 never: 1/2. Task b: both correct in turn 1: 2/2.
    save_turns(rollout / "turn_000.jsonl", [turn("a", 0, 0, False), turn("a", 1, 0, False),
                                             turn("b", 0, 0, True), turn("b", 1, 0, True)])
    save_turns(rollout / "turn_001.jsonl", [turn("a", 0, 1, True), turn("a", 1, 1, False),
                                             turn("b", 0, 1, False), turn("b", 1, 1, False)])
    read = load_report(tmp_path)
    assert read.task_correct_share == {"a": 0.5, "b": 1.0}
    assert dataclasses.replace(read, task_correct_share={}) == dataclasses.replace(report(), task_correct_share={})
    # A beam's rollouts do not give its last state's shares: left empty rather than guessed.
    (tmp_path / "run.json").write_text(json.dumps({"rollouts": [{"name": "2x2", "select": True}]}))
    assert load_report(tmp_path).task_correct_share == {}
    # A report that has the field is read as written, whatever the records say.
    (tmp_path / "report.json").write_text(json.dumps({**older, "task_correct_share": {"a": 0.25}}))
    assert load_report(tmp_path).task_correct_share == {"a": 0.25}


def test_the_dvc_curves_have_one_x_column_and_a_column_per_metric():
    curves = wide_curves(report())
    assert sorted(curves) == ["best_at_k.csv", "turns/1x2.csv", "turns/2x1.csv", "turns/2x2.csv"]
    rows = list(csv.DictReader(curves["best_at_k.csv"].splitlines()))
    # best@1 perf = mean over tasks of the mean perf: (1.0 + 1.0) / 2; best@2 = (2.0 + 1.5) / 2.
    assert [(r["k"], float(r["perf"])) for r in rows] == [("1", 1.0), ("2", 1.75)]
    turns = list(csv.DictReader(curves["turns/2x2.csv"].splitlines()))
    # After turn 1 task a has no correct kernel: correct best@2 = (0 + 1) / 2, then 1.
    assert [(r["turn"], float(r["correct"]), float(r["fast_1"])) for r in turns] == [("1", 0.5, 0.5), ("2", 1.0, 1.0)]


def test_a_checkpoint_setting_names_a_step_folder_the_newest_one_or_none(tmp_path):
    for step in (1, 3):
        folder = tmp_path / "checkpoints" / f"step_{step:06d}"
        folder.mkdir(parents=True)
        (folder / "trainer_state.json").write_text(json.dumps({"step": step}))
    assert resolve_checkpoint("checkpoints", tmp_path) == tmp_path / "checkpoints" / "step_000003"
    assert resolve_checkpoint(str(tmp_path / "checkpoints" / "step_000001"), "/") == tmp_path / "checkpoints" / "step_000001"
    assert resolve_checkpoint("none", tmp_path) is None and resolve_checkpoint("", tmp_path) is None
    assert resolve_checkpoint("no-such-folder", tmp_path) is None


def test_runs_of_one_name_are_told_apart_by_their_folder(tmp_path):
    for folder in ("base", "step-40"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "report.json").write_text(json.dumps(report("evaluate").to_dict()))
    paths = compare_runs([tmp_path / "base", tmp_path / "step-40"], tmp_path / "cmp")
    header = paths["tables/comparison.md"].read_text().splitlines()[0]
    assert "evaluate (base)" in header and "evaluate (step-40) - evaluate (base)" in header
    assert json.loads(paths["runs"].read_text()) == [str(tmp_path / "base"), str(tmp_path / "step-40")]
    with pytest.raises(ValueError, match="at least two"):
        compare_runs([tmp_path / "base"], tmp_path / "cmp")
