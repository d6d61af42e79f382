"""The multi-process step's rollout in one process, with the scripted generator and evaluator: it drives the turn
stages, so it rolls out what ``run_rollouts`` rolls out; a process that owns no trajectory still generates once
per turn (tests/training/test_multiprocess_step_cpu.py runs it over two real processes)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from kevin.records.evaluation import Status
from kevin.rewards import RewardConfig
from kevin.rollout.config import RolloutConfig
from kevin.rollout.loop import run_rollouts
from kevin.tasks import make_task
from kevin.training import dp_step
from kevin.training.dp_step import DistributedStep
from tests.conftest import identity_task_source
from tests.rollout.test_loop import ScriptedEvaluator, ScriptedGenerator

SCRIPT = {("toy/a", 0, 0): (Status.CORRECT, 2.0),   # stops after turn 0
          ("toy/b", 1, 1): (Status.CORRECT, 1.0)}   # stops after turn 1


@pytest.fixture
def tasks():
    return [make_task(f"toy/{n}", 1, n, identity_task_source(f"toy task {n}")) for n in ("a", "b")]


def _step(gen, ev, config: RolloutConfig) -> DistributedStep:
    trainer = SimpleNamespace(config=SimpleNamespace(temperature=None))  # all the policy check reads of it
    return DistributedStep(trainer, gen, ev, config, RewardConfig(), sync_cuda=False)


def test_one_process_rolls_out_what_run_rollouts_rolls_out(tasks):
    config = RolloutConfig(trajectories=2, turns=3, early_stop_speedup=1.0)
    looped = run_rollouts(tasks, ScriptedGenerator(junk={(0, 1)}), ScriptedEvaluator(SCRIPT), config)
    gen, ev = ScriptedGenerator(junk={(0, 1)}), ScriptedEvaluator(SCRIPT)
    seconds: dict[str, float] = {}
    local = {"prompts": 0.0, "generated_tokens": 0.0, "judged": 0.0}
    got = _step(gen, ev, config).rollout_all(tasks, seconds, local)
    assert [t.to_dict() for t in got] == [t.to_dict() for t in looped]
    assert [len(b) for b in gen.batches] == [4, 3, 2]  # the early stops, as in the loop
    assert local == {"prompts": 9.0, "generated_tokens": 27.0, "judged": 8.0}  # one parse error, 3 tokens each
    assert set(seconds) == {f"{phase}/{turn}" for phase in ("generate", "evaluate", "gather") for turn in range(3)}


def test_a_process_without_trajectories_still_generates_every_turn(tasks, monkeypatch):
    # Process 2 of 3 with 2 trajectories per task owns none; another process is live for every turn.
    monkeypatch.setattr(dp_step, "max_over_processes", lambda mine: 1)
    monkeypatch.setattr(dp_step, "all_gather_objects", lambda records: [records])
    gen, ev = ScriptedGenerator(), ScriptedEvaluator()
    step = _step(gen, ev, RolloutConfig(trajectories=2, turns=2))
    step.rank, step.size = 2, 3
    seconds: dict[str, float] = {}
    local = {"prompts": 0.0, "generated_tokens": 0.0, "judged": 0.0}
    got = step.rollout_all(tasks, seconds, local)
    assert gen.batches == [[], []] and ev.calls == []
    assert [(t.task_id, t.index, t.turns) for t in got] == [(k.task_id, j, []) for k in tasks for j in range(2)]
    assert local == {"prompts": 0.0, "generated_tokens": 0.0, "judged": 0.0}
    assert {"generate/0", "evaluate/0", "gather/0", "generate/1", "evaluate/1", "gather/1"} == set(seconds)
