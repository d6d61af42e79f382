"""Rollout records: JSON round trips (the verdict typed in memory, a dict only in the file), atomic JSONL
files, grouping."""

from __future__ import annotations

import json
import math
import pickle

import pytest

from kevin.records.evaluation import EvalResult, Fault, Status
from kevin.records.jsonl import atomic_write_text
from kevin.records.rollout import (
    TrainingSample,
    Trajectory,
    Turn,
    group_trajectories,
    load_records,
    load_turns,
    save_records,
    save_turns,
)


def make_turn(task="t/a", traj=0, turn=0, status=Status.CORRECT, speedup=1.5) -> Turn:
    result = EvalResult(task_id=task, candidate_id="c", status=status, correct=status is Status.CORRECT,
                        speedup=speedup, score=0.3 + speedup, max_abs_error=math.inf, feedback="fb")
    return Turn(task_id=task, trajectory=traj, turn=turn, prompt="p", prompt_messages=[{"role": "user", "content": "p"}],
                response="r", reasoning="Okay", kernel="class ModelNew: ...", summary="s", result=result,
                prompt_tokens=3, response_tokens=2, prompt_token_ids=[1, 2, 3], response_token_ids=[4, 5],
                logprobs=[-0.5, -1.25])


def test_turn_round_trip_and_accessors(tmp_path):
    turn = make_turn()
    again = Turn.from_dict(json.loads(json.dumps(turn.to_dict())))
    assert again == turn
    assert again.status is Status.CORRECT and again.correct and again.speedup == 1.5 and again.score == 1.8
    assert again.feedback == "fb" and again.result == turn.result and isinstance(again.result, EvalResult)
    path = save_turns(tmp_path / "b.jsonl", [turn, make_turn(traj=1)])
    assert load_turns(path) == [turn, make_turn(traj=1)]
    assert math.isinf(load_turns(path)[0].result.max_abs_error)  # inf survives the file


def test_trajectory_and_sample_round_trip(tmp_path):
    traj = Trajectory("t/a", 2, [make_turn(traj=2), make_turn(traj=2, turn=1, status=Status.INCORRECT, speedup=0.0)],
                      stop_reason="why")
    assert Trajectory.from_dict(json.loads(json.dumps(traj.to_dict()))) == traj
    assert traj.correct and traj.best_speedup == 1.5 and traj.stopped
    sample = traj.turns[0].training_sample(reward=1.2, advantage=-0.3)
    assert sample == TrainingSample([1, 2, 3], [4, 5], [-0.5, -1.25], 1.2, -0.3, "t/a", 2, 0)
    save_records(tmp_path / "s.jsonl", [sample])
    assert load_records(tmp_path / "s.jsonl", TrainingSample) == [sample]
    no_lp = TrainingSample([1], [2], None, 0.0, 0.0, "t", 0, 0)
    assert TrainingSample.from_dict(no_lp.to_dict()) == no_lp


def test_whose_failure_a_verdict_is_survives_every_crossing(tmp_path):
    turns = [make_turn(traj=k, status=Status.RUNTIME_ERROR, speedup=0.0) for k in range(len(Fault))]
    for turn, fault in zip(turns, Fault):
        turn.result.fault = fault
    for turn in turns:
        data = json.loads(json.dumps(turn.result.to_dict()))
        assert data["fault"] == turn.result.fault.value  # the value in the file, as for the status
        assert EvalResult.from_dict(data) == turn.result
        assert pickle.loads(pickle.dumps(turn.result)) == turn.result  # to and from a Ray worker
    assert load_turns(save_turns(tmp_path / "f.jsonl", turns)) == turns
    written_before = {k: v for k, v in make_turn().result.to_dict().items() if k != "fault"}
    assert EvalResult.from_dict(written_before).fault is Fault.CANDIDATE
    with pytest.raises(ValueError):
        EvalResult.from_dict(make_turn().result.to_dict() | {"fault": "nobody"})


def test_unknown_keys_are_ignored_and_missing_keys_are_named():
    data = make_turn().to_dict() | {"added_by_a_newer_version": 1}
    assert Turn.from_dict(data) == make_turn()
    with pytest.raises(ValueError, match=r"missing fields \['task_id', 'result'\]"):
        Turn.from_dict({"trajectory": 0, "turn": 0})
    with pytest.raises(ValueError):
        Turn.from_dict(make_turn().to_dict() | {"result": {"status": "nonsense"}})


def test_bad_line_names_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(make_turn().to_dict()) + "\n{not json\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:2"):
        load_turns(path)
    with pytest.raises(FileNotFoundError):
        load_turns(tmp_path / "missing.jsonl")


def test_atomic_write_leaves_old_file_on_failure(tmp_path, monkeypatch):
    path = tmp_path / "x.jsonl"
    atomic_write_text(path, "old\n")

    def crash(src, dst):
        raise OSError("disk went away during the rename")

    monkeypatch.setattr("kevin.records.jsonl.os.replace", crash)
    with pytest.raises(OSError):
        save_turns(path, [make_turn()])
    assert path.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.jsonl"]  # no temp file left behind


def test_group_trajectories_orders_by_task_then_index():
    turns = [make_turn("t/b", 1, 0), make_turn("t/a", 0, 1), make_turn("t/b", 0, 0), make_turn("t/a", 0, 0)]
    groups = group_trajectories(turns)
    assert [(g.task_id, g.index, [t.turn for t in g.turns]) for g in groups] == [
        ("t/b", 0, [0]), ("t/b", 1, [0]), ("t/a", 0, [0, 1])]
