"""The loop end to end with the real cpu evaluator (compiles C++): the reference solution is judged correct, and a
second turn that repeats it gets the first turn's verdict (a run's evaluator judges identical candidates once)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kevin.config import RunConfig
from kevin.evaluation import Evaluator, Status
from kevin.rollout import GenerationOut, RolloutConfig, load_rollout, run_rollouts
from kevin.rollout.loop import candidate_id
from kevin.tasks import bundled_solutions_dir


@pytest.mark.slow
def test_reference_solution_in_a_response_is_correct(relu_task, tmp_path, cache_dir):
    solution = (bundled_solutions_dir("cpu") / "level1" / "01_relu.py").read_text()
    response = (f"<think>\nOkay, a single pass over the data is enough.\n</think>\n"
                f"```python\n{solution}```\nOne C++ loop applies max(x, 0) elementwise.")
    # The evaluator a run builds from its settings (params.yaml's defaults), shortened.
    evaluator = Evaluator(replace(RunConfig(backend="cpu").evaluation, timing_trials=5, cache_dir=str(cache_dir)))
    prompts_seen: list[list[str]] = []

    def generate(prompts):
        prompts_seen.append(prompts)
        return [GenerationOut(text=response) for _ in prompts]

    cfg = RolloutConfig(trajectories=1, turns=2, backend="cpu")  # 2 evaluations keep it short
    trajs = run_rollouts([relu_task], generate, evaluator.evaluate_many, cfg, out_dir=tmp_path / "rollout")
    assert [len(p) for p in prompts_seen] == [1, 1]
    for traj in trajs:
        for turn in traj.turns:
            result = turn.result
            assert result.status is Status.CORRECT, result.error
            assert result.speedup > 0 and turn.score == pytest.approx(0.3 + result.speedup)
        assert "is correct and runs at" in traj.turns[1].prompt  # turn 0's verdict reached turn 1's context
        first, again = (turn.result for turn in traj.turns)
        assert not first.reused and again.reused and again.times.total == 0.0  # the repeat ran no process
        assert (again.runtime_ms, again.speedup) == (first.runtime_ms, first.speedup)
        assert (first.candidate_id, again.candidate_id) == (candidate_id(relu_task.task_id, 0, 0),
                                                            candidate_id(relu_task.task_id, 0, 1))
    assert [t.to_dict() for t in load_rollout(tmp_path / "rollout")] == [t.to_dict() for t in trajs]
