"""The turn stages (generate, parse, evaluate as files): the records run_rollouts writes, and a stage that was done
is never done again, down to a single verdict."""

from __future__ import annotations

import json

import pytest

from kevin.records.evaluation import Status
from kevin.records.rollout import load_turns
from kevin.rollout.config import RolloutConfig
from kevin.rollout.loop import run_rollouts, turn_path
from kevin.rollout.stages import TurnStages, generated_path, parsed_path, read_verdicts, verdicts_path
from kevin.tasks import make_task
from tests.conftest import identity_task_source
from tests.rollout.test_loop import ScriptedEvaluator, ScriptedGenerator


@pytest.fixture
def tasks():
    return [make_task(f"toy/{n}", 1, n, identity_task_source(f"toy task {n}")) for n in ("a", "b")]


class ReportingEvaluator(ScriptedEvaluator):
    """The scripted evaluator with the batch evaluator's signature: each verdict is reported as it is given;
    ``die_after`` verdicts into a call it raises (a kill in the middle of a batch)."""

    def __init__(self, script=None, die_after=None):
        super().__init__(script)
        self.die_after = die_after
        self.judged: list[str] = []

    def __call__(self, items, progress=None):
        results = super().__call__(items)
        for n, result in enumerate(results):
            if self.die_after is not None and n == self.die_after:
                raise KeyboardInterrupt("killed in the middle of the batch")
            self.judged.append(result.candidate_id)
            if progress is not None:
                progress(result)
        return results


SCRIPT = {("toy/a", 0, 0): (Status.CORRECT, 1.5), ("toy/b", 1, 1): (Status.CORRECT, 2.0)}


def run_stages(stages: TurnStages, gen, ev, turns: int) -> None:
    for turn in range(turns):
        assert stages.generate(turn, gen) is not None
        stages.parse(turn)
        stages.evaluate(turn, ev)


def test_the_stages_write_what_run_rollouts_writes(tasks, tmp_path):
    cfg = RolloutConfig(trajectories=2, turns=2)
    looped = run_rollouts(tasks, ScriptedGenerator(junk={(0, 1)}), ScriptedEvaluator(SCRIPT), cfg,
                          out_dir=tmp_path / "loop")
    stages = TurnStages(tmp_path / "stages", tasks, cfg)
    gen, ev = ScriptedGenerator(junk={(0, 1)}), ReportingEvaluator(SCRIPT)
    run_stages(stages, gen, ev, 2)
    assert [t.to_dict() for t in stages.trajectories()] == [t.to_dict() for t in looped]
    for turn in range(2):
        assert load_turns(turn_path(tmp_path / "stages", turn)) == load_turns(turn_path(tmp_path / "loop", turn))
    # The parse error of turn 0 (trajectory 1 of toy/a) was judged without the evaluator, and is in the verdict file.
    assert len(ev.calls[0]) == 3 and len(read_verdicts(verdicts_path(tmp_path / "stages", 0))) == 4
    assert json.loads((tmp_path / "stages" / "rollout.json").read_text())["complete"] is True


def test_nothing_done_is_done_again(tasks, tmp_path):
    cfg = RolloutConfig(trajectories=2, turns=2)
    gen, ev = ScriptedGenerator(), ReportingEvaluator(SCRIPT, die_after=2)
    stages = TurnStages(tmp_path, tasks, cfg)
    stages.generate(0, gen)
    stages.parse(0)
    with pytest.raises(KeyboardInterrupt):
        stages.evaluate(0, ev)
    kept = verdicts_path(tmp_path, 0).read_text()
    assert len(kept.splitlines()) == 2 and not turn_path(tmp_path, 0).exists()
    with verdicts_path(tmp_path, 0).open("a") as fh:
        fh.write('{"task_id": "toy/b", "candidate_id": "toy/b#tr')  # the line a kill cut off

    # A new process: the generated turn is reused (no generate call) and only the two unjudged kernels go out.
    gen2, ev2 = ScriptedGenerator(), ReportingEvaluator(SCRIPT)
    again = TurnStages(tmp_path, tasks, cfg)
    assert again.turns_done == 0
    seen = []
    assert again.generate(0, gen2) == generated_path(tmp_path, 0) and gen2.batches == []
    assert again.parse(0) == parsed_path(tmp_path, 0)
    again.evaluate(0, ev2, on_verdict=lambda r: seen.append(r.candidate_id))
    assert ev2.judged == ["toy/b#traj0#turn0", "toy/b#traj1#turn0"]
    assert sorted(seen) == sorted(ev.judged + ev2.judged)  # every verdict reported, kept ones too
    assert verdicts_path(tmp_path, 0).read_text().startswith(kept)  # the kept verdicts are untouched
    records = load_turns(turn_path(tmp_path, 0))
    assert [r.status for r in records] == [Status.CORRECT, Status.INCORRECT, Status.INCORRECT, Status.INCORRECT]
    # A finished turn is not evaluated again, and the next turn goes on from it.
    assert again.evaluate(0, ev2) == turn_path(tmp_path, 0) and len(ev2.calls) == 1
    again.generate(1, gen2)
    assert len(gen2.batches) == 1 and "Attempt 1" in gen2.batches[0][0].text
    assert again.generate(1, gen2) == generated_path(tmp_path, 1) and len(gen2.batches) == 1
    with pytest.raises(ValueError, match="outside the rollout's 2 turns"):
        again.generate(2, gen2)
    with pytest.raises(ValueError, match="cannot start before turn 0 is finished"):
        TurnStages(tmp_path / "fresh", tasks, cfg).generate(1, gen2)


def test_no_live_trajectory_means_no_generation(tasks, tmp_path):
    cfg = RolloutConfig(trajectories=1, turns=3, early_stop_speedup=1.0)
    script = {("toy/a", 0, 0): (Status.CORRECT, 1.5), ("toy/b", 0, 0): (Status.CORRECT, 3.0)}
    stages = TurnStages(tmp_path, tasks, cfg)
    gen = ScriptedGenerator()
    run_stages(stages, gen, ReportingEvaluator(script), 1)
    assert stages.live() == [] and stages.generate(1, gen) is None and len(gen.batches) == 1
    assert json.loads((tmp_path / "rollout.json").read_text())["complete"] is True


def test_a_directory_rolled_out_with_other_settings_is_refused(tasks, tmp_path):
    TurnStages(tmp_path, tasks, RolloutConfig(trajectories=2, turns=2)).generate(0, ScriptedGenerator())
    TurnStages(tmp_path, tasks, RolloutConfig(trajectories=2, turns=2)).evaluate(0, ReportingEvaluator())
    with pytest.raises(ValueError, match="rollout.trajectories = 2"):
        TurnStages(tmp_path, tasks, RolloutConfig(trajectories=3, turns=2))


def test_a_branch_gives_each_slot_its_parents_history_and_survives_a_reopen(tasks, tmp_path):
    from kevin.rollout.stages import parents_path

    cfg = RolloutConfig(trajectories=2, turns=2)
    gen, ev = ScriptedGenerator(), ReportingEvaluator(SCRIPT)
    stages = TurnStages(tmp_path, tasks, cfg)
    run_stages(stages, gen, ev, 1)
    # toy/a: trajectory 0 was correct in turn 0, so both slots continue it; toy/b keeps its own two.
    parents = {"toy/a": [0, 0], "toy/b": [0, 1]}
    with pytest.raises(ValueError, match="2 trajectory indices"):
        stages.branch(0, {"toy/a": [0], "toy/b": [0, 1]})
    stages.branch(0, parents)
    assert json.loads(parents_path(tmp_path, 0).read_text()) == parents
    lineage = [[(t.trajectory, t.turn) for t in traj.turns] for traj in stages.trajectories()]
    assert lineage == [[(0, 0)], [(0, 0)], [(0, 0)], [(1, 0)]]  # slot (toy/a, 1) now holds trajectory 0's turn
    # What the rollout held right after turn 0, before the branch.
    assert [[t.trajectory for t in traj.turns] for traj in stages.trajectories_after(0)] == [[0], [1], [0], [1]]

    stages.generate(1, gen)
    # Slot 1 of toy/a is prompted with trajectory 0's attempt: its correct kernel's feedback.
    prompts = [p.text for p in gen.batches[-1]]
    assert prompts[0] == prompts[1]
    stages.parse(1)
    stages.evaluate(1, ev)

    again = TurnStages(tmp_path, tasks, cfg)  # a new process reads the same lineages back
    assert [t.to_dict() for t in again.trajectories()] == [t.to_dict() for t in stages.trajectories()]
    assert [[(t.trajectory, t.turn) for t in traj.turns] for traj in again.trajectories()][1] == [(0, 0), (1, 1)]
    with pytest.raises(ValueError, match="newest finished turn"):
        again.branch(0, {"toy/a": [1, 1], "toy/b": [0, 1]})


def test_a_wave_holds_some_trajectories_of_every_task(tasks, tmp_path):
    """Two waves (trajectories 0, 2 and 1, 3) hold, together, the records the whole rollout holds: the same
    candidates, verdicts and histories, each wave in its own folder; a branch is refused (it chooses among all
    of a task's trajectories) and a folder is not resumed as another wave."""
    cfg = RolloutConfig(trajectories=4, turns=2)
    script = {("toy/a", 2, 0): (Status.CORRECT, 1.5), ("toy/b", 1, 1): (Status.CORRECT, 2.0)}
    whole = TurnStages(tmp_path / "whole", tasks, cfg)
    run_stages(whole, ScriptedGenerator(), ReportingEvaluator(script), 2)
    waves = [TurnStages(tmp_path / f"wave_{k}", tasks, cfg, trajectory_indices=[k, k + 2]) for k in (0, 1)]
    gens = [ScriptedGenerator(), ScriptedGenerator()]
    for turn in range(2):
        for stages, gen in zip(waves, gens):
            stages.generate(turn, gen)
            stages.parse(turn)
            stages.evaluate(turn, ReportingEvaluator(script))
    # Each wave's prompts name their task and trajectory; a wave asks for its own trajectories only.
    named = [(p.task_id, p.trajectory) for p in gens[1].batches[0]]
    assert named == [("toy/a", 1), ("toy/a", 3), ("toy/b", 1), ("toy/b", 3)]

    def key(traj):
        return traj.task_id, traj.index

    together = sorted((t for stages in waves for t in stages.trajectories()), key=key)
    assert [key(t) for t in together] == [key(t) for t in whole.trajectories()]
    for mine, theirs in zip(together, whole.trajectories()):
        assert [(r.turn, r.status, r.speedup) for r in mine.turns] == [(r.turn, r.status, r.speedup) for r in theirs.turns]
    meta = json.loads((tmp_path / "wave_1" / "rollout.json").read_text())
    assert meta["trajectory_indices"] == [1, 3] and meta["complete"] is True
    with pytest.raises(ValueError, match="all of a task's trajectories"):
        waves[0].branch(1, {"toy/a": [0, 0, 0, 0], "toy/b": [0, 0, 0, 0]})
    with pytest.raises(ValueError, match=r"holds trajectories \[1, 3\]"):
        TurnStages(tmp_path / "wave_1", tasks, cfg, trajectory_indices=[0, 2])
    with pytest.raises(ValueError, match="some of 0..3"):
        TurnStages(tmp_path / "bad", tasks, cfg, trajectory_indices=[4])
