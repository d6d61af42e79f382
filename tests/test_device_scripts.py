"""The device scripts' pure parts: what a run's pack keeps (scripts/run_pack_filter.sh) and how the carried files are
shared among device calls (scripts/device_carry.py)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO

RUN = "outputs/h200-learn-rest"


def pack(paths: list[str], newest: str) -> list[str]:
    out = subprocess.run(["bash", str(REPO / "scripts" / "run_pack_filter.sh"), RUN, newest], input="\n".join(paths),
                         capture_output=True, text=True, check=True)
    return out.stdout.splitlines()


def test_the_pack_keeps_the_newest_checkpoint_and_the_rollouts_after_it():
    paths = [
        f"{RUN}/checkpoints/step_000009/model/adapter.safetensors",
        f"{RUN}/checkpoints/step_000010/model/adapter.safetensors",
        f"{RUN}/steps/step_000000/kernels.jsonl",
        f"{RUN}/steps/step_000000/rollout/wave_0/turn_000.jsonl",
        f"{RUN}/steps/step_000010/rollout/wave_1/verdicts_001.jsonl",
        f"{RUN}/steps/step_000010/rollout/wave_1/policy_001.pt",
        f"{RUN}/steps/step_000011/rollout/wave_0/generated_000.jsonl",
        f"{RUN}/mlflow.db",
        "outputs/h200-sft/model/adapter_model.safetensors",
        f"{RUN}-eval-last-train/report.json",
    ]
    assert pack(paths, "10") == [paths[1], paths[2], paths[6], paths[7], paths[8], paths[9]]
    assert pack(paths, "") == paths  # no checkpoint yet: everything goes on


def test_eval_gain_by_update_pools_repeated_evaluations(tmp_path, monkeypatch, capsys):
    """Evaluations repeated at other sampling seeds pool their tries: each task's share is the mean over a side's
    repeats, it is solved when any try was, and its correct tries are summed for the exact test."""
    gains = _script("eval_gain_by_update")
    run = tmp_path / "run"
    (run / "steps" / "step_000000").mkdir(parents=True)
    # a: mixed at step 0, so trained; b and c drawn with one outcome each, so not.
    (run / "steps" / "step_000000" / "kernels.jsonl").write_text("".join(
        json.dumps({"task_id": t, "candidate_id": f"{t}#traj{i}#turn0", "correct": c,
                    "status": "correct" if c else "incorrect", "trajectory": i, "turn": 0}) + "\n"
        for t, i, c in [("a", 0, True), ("a", 1, False), ("b", 0, False), ("b", 1, False), ("c", 0, True),
                        ("c", 1, True)]))

    def write_eval(name: str, shares: dict[str, float]) -> Path:
        (tmp_path / name).mkdir()
        (tmp_path / name / "report.json").write_text(json.dumps({
            "name": name, "trajectories": 2, "turns": 1, "tasks": len(shares), "fast_ps": [], "table_fast_ps": [],
            "by_k": [], "by_turn": [], "splits": {}, "task_best_speedup": {}, "task_correct_share": shares}))
        return tmp_path / name

    before = [write_eval("start", {"a": 0.0, "b": 0.5, "c": 1.0}), write_eval("start1", {"a": 0.5, "b": 0.5, "c": 1.0})]
    after = [write_eval("last", {"a": 1.0, "b": 0.0, "c": 1.0}), write_eval("last1", {"a": 1.0, "b": 0.5, "c": 0.5})]
    # Pooled shares: before a 0.25, b 0.5, c 1.0; after a 1.0, b 0.25, c 0.75.
    assert gains.pooled_shares(before) == {"a": 0.25, "b": 0.5, "c": 1.0}
    rows = {row["tasks"]: row for row in gains.gains(run, before, after)}
    trained = rows["trained"]
    assert {k: v for k, v in trained.items() if not k.startswith("redrawn")} == {
        "tasks": "trained", "n": 1, "first": 0.25, "last": 1.0, "gain": 0.75, "low": 0.75, "high": 0.75}
    # With its tries redrawn, a's 1 of 4 before is a binomial draw of 4 at 1/4 (4 of 4 after stays 4 of 4): the gain
    # is 1 - X/4, 1.0 with chance (3/4)^4 = 0.32 (so the 95% end is 1.0) and 0.25 or less with chance 0.05 (so the
    # 5% end is 0.25 or the next value up, 0.5).
    assert trained["redrawn_high"] == 1.0 and trained["redrawn_low"] in (0.25, 0.5)
    assert (rows["not trained"]["first"], rows["not trained"]["last"]) == (0.75, 0.5)
    assert rows["not trained"]["low"] == rows["not trained"]["high"] == -0.25
    # Solved: every task has a correct try on both sides (a's first repeat had none, its second one of two).
    solved = {row["tasks"]: row for row in gains.gains(run, before, after, figure="solved")}
    assert (solved["all"]["first"], solved["all"]["last"], solved["all"]["gain"]) == (1.0, 1.0, 0.0)
    assert gains.solved_shares(before[:1]) == {"a": 0.0, "b": 1.0, "c": 1.0}
    # Summed counts: 2 tries a task in each of two repeats.
    assert gains.pooled_counts(before) == {"a": (1, 4), "b": (2, 4), "c": (4, 4)}
    assert gains.pooled_counts(after) == {"a": (4, 4), "b": (1, 4), "c": (3, 4)}
    with pytest.raises(ValueError, match="figure must be"):
        gains.gains(run, before, after, figure="best")
    # The command line: a 1 of 4 -> 4 of 4 is p 8/56 = 0.14 (of 5 correct in 8, the splits 1 | 4 and 4 | 1 have
    # chance 4/56 each), not beyond chance.
    monkeypatch.setattr("sys.argv", ["eval_gain_by_update.py", str(run), str(before[0]), str(after[0]),
                                     "--also-before", str(before[1]), "--also-after", str(after[1])])
    gains.main()
    out = capsys.readouterr().out
    assert "| start + start1 | last + last1 |" in out
    assert "| trained | 1 | 0.250 | 1.000 | +0.750 | [+0.750, +0.750] | [" in out
    assert "tasks solved:" in out and "| all | 3 | 1.000 | 1.000 | +0.000 |" in out
    assert "moved beyond chance (Fisher's exact test, p < 0.05): 0" in out


def test_files_are_shared_first_fit_largest_first():
    spec = importlib.util.spec_from_file_location("device_carry", REPO / "scripts" / "device_carry.py")
    carry = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(carry)
    # a (40) opens call 1, b (30) does not fit beside it and opens call 2, c (25) joins b, d (10) fits beside a.
    assert carry.plan({"a": 40, "b": 30, "c": 25, "d": 10}, 60) == [["a", "d"], ["b", "c"]]
    with pytest.raises(SystemExit, match="split it"):
        carry.plan({"big": 61}, 60)


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_answer_forks_counts_the_tokens_that_were_choices(tmp_path):
    """scripts/answer_forks.py: per answer, tokens, tokens sampled below p 0.9 and 0.5, and the answer's NLL."""
    import math

    forks = _script("answer_forks")
    answers = [[math.log(0.95), math.log(0.8), math.log(0.4)], [0.0]]
    figures = forks.fork_figures(answers)
    assert figures["tokens"] == 2.0
    assert figures["p<0.9"] == 1.0  # 0.8 and 0.4 in the first answer, none in the second: 2 over 2 answers
    assert figures["p<0.5"] == 0.5  # 0.4 only
    assert math.isclose(figures["nll"], -(math.log(0.95) + math.log(0.8) + math.log(0.4)) / 2)
    step = tmp_path / "steps" / "step_000003"
    step.mkdir(parents=True)
    (step / "samples.jsonl").write_text("".join(json.dumps({"old_logprobs": lp}) + "\n" for lp in answers))
    assert [s["old_logprobs"] for s in forks.read_samples(step)] == answers


def test_sample_spread_reads_each_tasks_newest_first_turn_prompt(tmp_path):
    spread = _script("sample_spread")
    for step, prompt in (("step_000000", [1, 2]), ("step_000004", [3, 4])):
        folder = tmp_path / "steps" / step
        folder.mkdir(parents=True)
        rows = [{"task_id": "level1/02_gelu", "turn": 0, "prompt_token_ids": prompt},
                {"task_id": "level1/02_gelu", "turn": 1, "prompt_token_ids": [9]}]
        (folder / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert spread.first_turn_prompts(tmp_path, ["level1/02_gelu"]) == {"level1/02_gelu": [3, 4]}
    with pytest.raises(SystemExit, match="level1/03_sigmoid"):
        spread.first_turn_prompts(tmp_path, ["level1/02_gelu", "level1/03_sigmoid"])
    assert spread.load_inline_arguments("raise RuntimeError('broken answer')") is None


def test_policy_drift_collects_each_distinct_correct_first_turn_answer(tmp_path, monkeypatch):
    """scripts/policy_drift.py: the probe set is every distinct first-turn answer judged correct, with the steps that
    drew each task and those whose update had it (a non-zero advantage)."""
    import math

    monkeypatch.syspath_prepend(str(REPO / "scripts"))  # it imports its sibling answer_forks
    drift = _script("policy_drift")

    def write_step(step: int, rows: list[tuple[str, int, int, list[int], bool, float]]) -> None:
        folder = tmp_path / "steps" / f"step_{step:06d}"
        folder.mkdir(parents=True)
        with open(folder / "samples.jsonl", "w") as f, open(folder / "kernels.jsonl", "w") as k:
            for task, traj, turn, answer, correct, advantage in rows:
                f.write(json.dumps({"task_id": task, "trajectory": traj, "turn": turn, "prompt_token_ids": [1, 2],
                                    "completion_token_ids": answer, "old_logprobs": [0.0] * len(answer),
                                    "advantage": advantage}) + "\n")
                k.write(json.dumps({"task_id": task, "trajectory": traj, "turn": turn, "correct": correct}) + "\n")

    write_step(0, [("a", 0, 0, [5, 6], True, 0.5), ("a", 0, 1, [5, 6], True, 0.5),   # a second turn: not probed
                   ("a", 1, 0, [5, 7], False, -0.5), ("a", 1, 1, [5, 6], True, 0.5),
                   ("b", 0, 0, [8], True, 0.0), ("b", 1, 0, [8], True, 0.0)])        # b: 2 of 2, no advantage
    write_step(2, [("a", 0, 0, [5, 6], True, 0.0), ("a", 1, 0, [9], True, 0.0)])    # a repeat, then a new answer
    answers, drawn, updated = drift.correct_answers(tmp_path)
    assert {t: [s["completion_token_ids"] for s in v] for t, v in answers.items()} == {"a": [[5, 6], [9]],
                                                                                      "b": [[8]]}
    assert [s["step"] for s in answers["a"]] == [0, 2]
    assert drawn == {"a": [0, 2], "b": [0]}
    assert updated == {"a": [0]}
    assert math.isclose(drift.log_sum_exp([math.log(0.25), math.log(0.5)]), math.log(0.75))
    # Scores come back as one list in flatten's order (a's two answers, then b's) and are regrouped per task:
    # P(a) = 0.1 * 0.5 + 0.2 = 0.25 (an answer's probability is the product over its tokens), P(b) = 0.5.
    assert [s["completion_token_ids"] for s in drift.flatten(answers)] == [[5, 6], [9], [8]]
    token_lps = [[math.log(0.1), math.log(0.5)], [math.log(0.2)], [math.log(0.5)]]
    grouped = drift.by_task(answers, token_lps)
    assert grouped == {"a": token_lps[:2], "b": token_lps[2:]}
    log_p = drift.probe_log_p(grouped)
    assert math.isclose(log_p["a"], math.log(0.25)) and math.isclose(log_p["b"], math.log(0.5))


def test_policy_drift_splits_a_change_by_the_steps_that_updated_each_task(monkeypatch):
    """The interference figure of policy_drift.py and replay_updates.py: tasks updated at a 0-based step in
    (after, upto] against the rest, as mean change (count)."""
    monkeypatch.syspath_prepend(str(REPO / "scripts"))
    drift = _script("policy_drift")
    changes = {"a": 0.5, "b": -1.0, "c": -2.0, "d": 0.25}
    updated = {"a": [0, 7], "b": [3], "c": [4]}  # d: never updated
    assert drift.split_by_update(changes, updated, -1, 3) == ([0.5, -1.0], [-2.0, 0.25])
    assert drift.split_by_update(changes, updated, 3, 7) == ([0.5, -2.0], [-1.0, 0.25])
    assert drift.mean_of([0.5, -2.0]) == "   -0.75 (2)" and drift.mean_of([]) == "       - (0)"


def test_replay_rescores_only_after_an_update_that_moved_the_weights(monkeypatch):
    """replay_updates.py skips its minutes-long rescoring after a step whose optimiser steps trained no sequence
    or were skipped for a non-finite gradient: the weights are those it scored last."""
    monkeypatch.syspath_prepend(str(REPO / "scripts"))
    replay = _script("replay_updates")
    assert not replay.trained_any([])
    assert not replay.trained_any([{"trained_sequences": 0.0, "skipped": 0.0}])
    assert not replay.trained_any([{"trained_sequences": 3.0, "skipped": 1.0}])
    assert replay.trained_any([{"trained_sequences": 0.0, "skipped": 0.0}, {"trained_sequences": 2.0, "skipped": 0.0}])


def test_eval_gain_by_update_splits_the_tasks_by_whether_a_group_was_mixed(tmp_path):
    """A task is trained when one of its groups (a step's kernels of one turn) held a correct kernel beside a failing
    one; the evaluations' per-task correct shares are paired within each part."""
    gains = _script("eval_gain_by_update")
    run = tmp_path / "run"

    def write_step(step: int, kernels: list[tuple[str, int, int, bool]]) -> None:
        folder = run / "steps" / f"step_{step:06d}"
        folder.mkdir(parents=True)
        (folder / "kernels.jsonl").write_text("".join(
            json.dumps({"task_id": t, "candidate_id": f"{t}#traj{i}#turn{j}", "correct": c,
                        "status": "correct" if c else "incorrect", "trajectory": i, "turn": j}) + "\n"
            for t, i, j, c in kernels))

    # a: turn 0 mixed at step 0. b: each turn one-sided (turn 0 all fail, turn 1 all correct), so never mixed,
    # although its step held both outcomes. c: all correct twice.
    write_step(0, [("a", 0, 0, True), ("a", 1, 0, False), ("b", 0, 0, False), ("b", 1, 0, False),
                   ("b", 0, 1, True), ("b", 1, 1, True)])
    write_step(1, [("c", 0, 0, True), ("c", 1, 0, True), ("a", 0, 0, False), ("a", 1, 0, False)])
    assert gains.trained_tasks(run) == {"a": 1, "b": 0, "c": 0}

    def write_eval(name: str, shares: dict[str, float]) -> Path:
        (tmp_path / name).mkdir()
        (tmp_path / name / "report.json").write_text(json.dumps({
            "name": name, "trajectories": 4, "turns": 1, "tasks": len(shares), "fast_ps": [], "table_fast_ps": [],
            "by_k": [], "by_turn": [], "splits": {}, "task_best_speedup": {}, "task_correct_share": shares}))
        return tmp_path / name

    before = write_eval("start", {"a": 0.25, "b": 0.5, "c": 1.0, "d": 0.0})  # d: not in the second evaluation
    after = write_eval("last", {"a": 0.75, "b": 0.25, "c": 0.75})
    rows = {row["tasks"]: row for row in gains.gains(run, before, after)}
    assert {k: v for k, v in rows["trained"].items() if not k.startswith("redrawn")} == {
        "tasks": "trained", "n": 1, "first": 0.25, "last": 0.75, "gain": 0.5, "low": 0.5, "high": 0.5}
    # not trained: b -0.25 and c -0.25, so every redraw's mean is -0.25
    assert rows["not trained"]["n"] == 2 and rows["not trained"]["first"] == 0.75
    assert rows["not trained"]["last"] == 0.5 and rows["not trained"]["low"] == rows["not trained"]["high"] == -0.25
    assert rows["all"]["n"] == 3 and abs(rows["all"]["gain"] - (0.5 - 0.25 - 0.25) / 3) < 1e-12
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "report.json").write_text(json.dumps({"tasks": 3}))
    with pytest.raises(SystemExit, match="no task_correct_share"):
        gains.gains(run, tmp_path / "old", after)
    with pytest.raises(SystemExit, match="no judged kernels"):
        gains.gains(tmp_path / "start", before, after)
