"""The multi-turn loop with a scripted generator and a scripted evaluator (a unit test of the loop only)."""

from __future__ import annotations

import json

import pytest

from kevin.records.evaluation import Candidate, EvalResult, Status
from kevin.rollout.config import RolloutConfig
from kevin.records.generation import GenerationOut
from kevin.rollout.loop import load_rollout, read_meta, run_rollouts, turn_path
from kevin.rollout.prompts import approx_tokens
from kevin.tasks import make_task
from tests.conftest import identity_task_source


@pytest.fixture
def tasks():
    return [make_task(f"toy/{n}", 1, n, identity_task_source(f"toy task {n}")) for n in ("a", "b")]


class ScriptedGenerator:
    """Deterministic responses: batch k, item i gets reasoning, a kernel and a summary tagged (k, i).

    ``junk`` lists (batch, item) pairs that get an unparseable response instead.
    """

    def __init__(self, junk=()):
        self.batches: list[list[str]] = []
        self.junk = set(junk)

    def __call__(self, prompts):
        k = len(self.batches)
        self.batches.append(list(prompts))
        outs = []
        for i, _ in enumerate(prompts):
            if (k, i) in self.junk:
                text = "Okay, I am not sure what to write"
            else:
                text = (f"<think>\nOkay, SECRET-REASONING-{k}-{i}\n</think>\n"
                        f"```python\nclass ModelNew(nn.Module):  # kernel-{k}-{i}\n    x = 1\n```\nsummary-{k}-{i}")
            outs.append(GenerationOut(text=text, token_ids=[k, i, 7], logprobs=[-0.1, -0.2, -0.3],
                                      prompt_token_ids=[1] * 5, truncated=False))
        return outs


class ScriptedEvaluator:
    """Verdicts by (task id, trajectory, turn): ``script`` maps them to (status, speedup); default incorrect."""

    def __init__(self, script=None, crash_on_call=None):
        self.calls: list[list[Candidate]] = []
        self.script = script or {}
        self.crash_on_call = crash_on_call

    def __call__(self, items):
        if self.crash_on_call is not None and len(self.calls) == self.crash_on_call:
            raise RuntimeError("evaluator died")
        self.calls.append([c for _, c in items])
        out = []
        for task, cand in items:
            assert cand.task_id == task.task_id and "class ModelNew" in cand.source
            status, speedup = self.script.get((task.task_id, cand.trajectory, cand.turn), (Status.INCORRECT, 0.0))
            correct = status is Status.CORRECT
            out.append(EvalResult(task_id=task.task_id, candidate_id=cand.key, status=status, correct=correct,
                                  compiled=True, speedup=speedup, score=(0.3 + speedup) if correct else 0.0,
                                  error="" if correct else "max abs error 3.0"))
        return out


def test_batches_one_generate_and_one_evaluate_call_per_turn(tasks, tmp_path):
    gen, ev = ScriptedGenerator(junk={(0, 1)}), ScriptedEvaluator()
    cfg = RolloutConfig(trajectories=3, turns=2)
    trajs = run_rollouts(tasks, gen, ev, cfg)
    assert [len(b) for b in gen.batches] == [6, 6]  # m x tasks prompts in ONE batch per turn
    assert [len(c) for c in ev.calls] == [5, 6]  # the parse error of turn 0 is judged without evaluate()
    assert [(t.task_id, t.index) for t in trajs] == [("toy/a", 0), ("toy/a", 1), ("toy/a", 2),
                                                      ("toy/b", 0), ("toy/b", 1), ("toy/b", 2)]
    assert all(len(t.turns) == 2 and not t.stopped for t in trajs)
    bad = trajs[1].turns[0]
    assert bad.parse_error and bad.status is Status.PARSE_ERROR and bad.score == 0.0
    assert bad.feedback.startswith("Your response could not be parsed: no ```python block")
    assert bad.reasoning == "Okay, I am not sure what to write"
    good = trajs[0].turns[0]
    assert good.reasoning == "Okay, SECRET-REASONING-0-0" and good.summary == "summary-0-0"
    assert good.response_token_ids == [0, 0, 7] and good.logprobs == [-0.1, -0.2, -0.3]
    assert good.prompt_tokens == 5 and good.response_tokens == 3
    assert good.feedback.startswith("Your kernel compiled and ran but its output is incorrect")  # filled by the loop
    assert good.result.candidate_id == "toy/a#traj0#turn0"


def test_second_turn_context_has_kernel_summary_feedback_but_no_reasoning(tasks):
    gen = ScriptedGenerator(junk={(0, 1)})
    trajs = run_rollouts(tasks, gen, ScriptedEvaluator(), RolloutConfig(trajectories=2, turns=3))
    for traj in trajs:
        first, second, third = traj.turns
        assert "example_vector_add" in first.prompt and "example_vector_add" not in second.prompt
        assert first.attempts_in_context == 0 and second.attempts_in_context == 1 and third.attempts_in_context == 2
        for earlier in (first, second):
            assert earlier.feedback in third.prompt and earlier.summary in third.prompt
            assert earlier.kernel.strip() in third.prompt
        assert "SECRET-REASONING" not in second.prompt and "SECRET-REASONING" not in third.prompt
        assert "Start your reasoning again" in second.prompt
    # The trajectory whose first answer was junk still shows that attempt and its parse-error feedback.
    assert "(no code could be extracted from this response)" in trajs[1].turns[1].prompt
    assert "could not be parsed" in trajs[1].turns[1].prompt
    # Each trajectory sees only its own history.
    assert "kernel-0-1" not in trajs[0].turns[1].prompt and "kernel-0-0" in trajs[0].turns[1].prompt


def test_oldest_attempts_dropped_under_a_tight_budget(tasks):
    trajs = run_rollouts(tasks[:1], ScriptedGenerator(), ScriptedEvaluator(),
                         RolloutConfig(trajectories=1, turns=4, max_prompt_tokens=10**6))
    # The loop counts rendered prompts with the default ~4 chars/token estimate (no tokenizer given).
    budget = approx_tokens(trajs[0].turns[2].prompt) + 20  # room for two attempts plus a note, not three
    trajs = run_rollouts(tasks[:1], ScriptedGenerator(), ScriptedEvaluator(),
                         RolloutConfig(trajectories=1, turns=4, max_prompt_tokens=budget))
    last = trajs[0].turns[3]
    assert last.attempts_in_context == 2 and last.attempts_dropped == 1
    assert "kernel-0-0" not in last.prompt and "kernel-1-0" in last.prompt and "kernel-2-0" in last.prompt


def test_early_stop_after_a_fast_correct_kernel(tasks):
    script = {("toy/a", 0, 0): (Status.CORRECT, 2.0),   # stops after turn 0
              ("toy/a", 1, 0): (Status.CORRECT, 0.5),   # correct but too slow: goes on
              ("toy/b", 1, 1): (Status.CORRECT, 1.0)}   # exactly the target: stops after turn 1
    gen, ev = ScriptedGenerator(), ScriptedEvaluator(script)
    trajs = run_rollouts(tasks, gen, ev, RolloutConfig(trajectories=2, turns=3, early_stop_speedup=1.0))
    assert [len(b) for b in gen.batches] == [4, 3, 2]
    assert [len(c) for c in ev.calls] == [4, 3, 2]
    lengths = {(t.task_id, t.index): len(t.turns) for t in trajs}
    assert lengths == {("toy/a", 0): 1, ("toy/a", 1): 3, ("toy/b", 0): 3, ("toy/b", 1): 2}
    assert trajs[0].stop_reason.startswith("turn 0: correct kernel at 2.00x")
    assert not trajs[1].stopped and not trajs[2].stopped


def test_no_early_stop_by_default(tasks):
    script = {("toy/a", 0, 0): (Status.CORRECT, 50.0)}
    gen = ScriptedGenerator()
    trajs = run_rollouts(tasks, gen, ScriptedEvaluator(script), RolloutConfig(trajectories=1, turns=2))
    assert [len(b) for b in gen.batches] == [2, 2] and all(len(t.turns) == 2 for t in trajs)


def test_all_stopped_ends_the_rollout(tasks):
    script = {(t.task_id, 0, 0): (Status.CORRECT, 1.0) for t in tasks}
    gen = ScriptedGenerator()
    run_rollouts(tasks, gen, ScriptedEvaluator(script), RolloutConfig(trajectories=1, turns=4, early_stop_speedup=0.0))
    assert len(gen.batches) == 1


def test_persist_and_reload_round_trip(tasks, tmp_path):
    out = tmp_path / "rollout"
    script = {("toy/a", 0, 0): (Status.CORRECT, 3.0)}
    cfg = RolloutConfig(trajectories=2, turns=2, early_stop_speedup=2.0)
    trajs = run_rollouts(tasks, ScriptedGenerator(junk={(1, 0)}), ScriptedEvaluator(script), cfg, out_dir=out)
    assert sorted(p.name for p in out.iterdir()) == ["rollout.json", "turn_000.jsonl", "turn_001.jsonl"]
    assert len(turn_path(out, 0).read_text().splitlines()) == 4 and len(turn_path(out, 1).read_text().splitlines()) == 3
    meta = read_meta(out)
    assert meta["complete"] and meta["turns_completed"] == 2 and meta["task_ids"] == ["toy/a", "toy/b"]
    assert meta["config"] == cfg.to_dict()
    reloaded = load_rollout(out)
    assert [t.to_dict() for t in reloaded] == [t.to_dict() for t in trajs]


def test_crash_mid_run_keeps_completed_turns_and_resume_finishes(tasks, tmp_path):
    out = tmp_path / "rollout"
    cfg = RolloutConfig(trajectories=2, turns=4)
    with pytest.raises(RuntimeError, match="evaluator died"):
        run_rollouts(tasks, ScriptedGenerator(), ScriptedEvaluator(crash_on_call=2), cfg, out_dir=out)
    assert turn_path(out, 0).exists() and turn_path(out, 1).exists() and not turn_path(out, 2).exists()
    assert not any(p.name.endswith(".tmp") for p in out.iterdir())
    meta = read_meta(out)
    assert meta["turns_completed"] == 2 and not meta["complete"]
    partial = load_rollout(out)
    assert len(partial) == 4 and all(len(t.turns) == 2 for t in partial)

    # Running again without resume refuses to overwrite; with resume it does only the missing turns.
    with pytest.raises(FileExistsError, match="resume=True"):
        run_rollouts(tasks, ScriptedGenerator(), ScriptedEvaluator(), cfg, out_dir=out)
    gen = ScriptedGenerator()
    trajs = run_rollouts(tasks, gen, ScriptedEvaluator(), cfg, out_dir=out, resume=True)
    assert len(gen.batches) == 2 and all(len(t.turns) == 4 for t in trajs)
    assert [t.turn for t in trajs[0].turns] == [0, 1, 2, 3]
    assert trajs[0].turns[1].kernel.strip() in trajs[0].turns[2].prompt  # the context continues the reloaded history
    assert read_meta(out)["complete"]
    assert [t.to_dict() for t in load_rollout(out)] == [t.to_dict() for t in trajs]


def test_resume_refuses_a_different_setup(tasks, tmp_path):
    out = tmp_path / "rollout"
    run_rollouts(tasks, ScriptedGenerator(), ScriptedEvaluator(), RolloutConfig(trajectories=2, turns=1), out_dir=out)
    with pytest.raises(ValueError, match="trajectories"):
        run_rollouts(tasks, ScriptedGenerator(), ScriptedEvaluator(), RolloutConfig(trajectories=3, turns=2),
                     out_dir=out, resume=True)
    with pytest.raises(ValueError, match="other tasks"):
        run_rollouts(tasks[:1], ScriptedGenerator(), ScriptedEvaluator(), RolloutConfig(trajectories=2, turns=2),
                     out_dir=out, resume=True)


@pytest.mark.parametrize("change", [dict(turns=3), dict(max_prompt_tokens=4096), dict(include_example=False),
                                    dict(early_stop_speedup=1.0), dict(system_prompt="Be brief."),
                                    dict(prompt_opens_reasoning=True)])
def test_resume_refuses_any_setting_that_changes_the_turns(tasks, tmp_path, change):
    out = tmp_path / "rollout"
    cfg = RolloutConfig(trajectories=1, turns=2)
    with pytest.raises(RuntimeError, match="evaluator died"):  # one turn on disk, the rollout unfinished
        run_rollouts(tasks, ScriptedGenerator(), ScriptedEvaluator(crash_on_call=1), cfg, out_dir=out)
    (name, value), = change.items()
    with pytest.raises(ValueError, match=rf"rollout\.{name} = .* and this run has {value!r}"):
        run_rollouts(tasks, ScriptedGenerator(), ScriptedEvaluator(),
                     RolloutConfig(**{"trajectories": 1, "turns": 2, **change}), out_dir=out, resume=True)
    # Presentation only: a progress bar may be switched on for the resumed part.
    trajs = run_rollouts(tasks, ScriptedGenerator(), ScriptedEvaluator(),
                         RolloutConfig(trajectories=1, turns=2, show_progress=True), out_dir=out, resume=True)
    assert all(len(t.turns) == 2 for t in trajs)


@pytest.mark.parametrize("template", ["QWQ", "R1_DISTILL"])
def test_reasoning_cut_off_under_a_template_that_opens_it(tasks, template):
    """The template writes <think> into the prompt; a response cut off mid-reasoning has neither tag. It must be
    a parse error that says so, and none of its reasoning may reach the next turn's context."""
    pytest.importorskip("transformers")
    from tests import chat_templates

    tok = chat_templates.chat_tokenizer(getattr(chat_templates, template))
    cut = ("Okay, a first draft:\n```python\nclass ModelNew(nn.Module):  # DRAFT-KERNEL\n    x = 1\n```\n"
           "Wait, SECRET-REASONING says the indexing is off, so")
    finished = ("Okay, SECRET-REASONING again.\n</think>\n\n```python\nclass ModelNew(nn.Module):  # FINAL\n"
                "    x = 2\n```\nOne loop over the elements.")
    responses = iter([cut, finished, finished])

    def gen(prompts):
        assert all(p.templated and p.text.endswith("<think>\n") for p in prompts)
        return [GenerationOut(text=next(responses), truncated=k == 0) for k, _ in enumerate(prompts)]

    ev = ScriptedEvaluator()
    (traj,) = run_rollouts(tasks[:1], gen, ev, RolloutConfig(trajectories=1, turns=3), tokenizer=tok)
    first, second, third = traj.turns
    assert first.reasoning_opened_by_prompt and first.truncated
    assert first.parse_error and first.kernel == "" and first.summary == ""
    assert first.feedback == ("Your response could not be parsed: the reasoning was never closed with </think>, so no "
                              "answer followed it (the response was cut off at the length limit).")
    assert [len(c) for c in ev.calls] == [1, 1]  # the draft was never evaluated
    assert not second.parse_error and "# FINAL" in second.kernel and second.summary == "One loop over the elements."
    for later in (second, third):
        assert "SECRET-REASONING" not in later.prompt and "DRAFT-KERNEL" not in later.prompt
    assert "the reasoning was never closed" in second.prompt


def test_wrong_batch_sizes_and_bad_tasks_are_clear_errors(tasks):
    with pytest.raises(RuntimeError, match="generate returned 1 outputs for 2 prompts"):
        run_rollouts(tasks, lambda prompts: [GenerationOut("x")], ScriptedEvaluator(), RolloutConfig(trajectories=1, turns=1))
    with pytest.raises(RuntimeError, match="evaluate returned 0 results for 2 candidates"):
        run_rollouts(tasks, ScriptedGenerator(), lambda items: [], RolloutConfig(trajectories=1, turns=1))
    with pytest.raises(ValueError, match="unique"):
        run_rollouts([tasks[0], tasks[0]], ScriptedGenerator(), ScriptedEvaluator(), RolloutConfig(trajectories=1, turns=1))
    with pytest.raises(ValueError, match="at least one task"):
        run_rollouts([], ScriptedGenerator(), ScriptedEvaluator())


def test_truncated_generation_is_recorded(tasks):
    def gen(prompts):
        return [GenerationOut(text="Okay, thinking about tiles and", truncated=True) for _ in prompts]

    trajs = run_rollouts(tasks[:1], gen, ScriptedEvaluator(), RolloutConfig(trajectories=1, turns=1))
    turn = trajs[0].turns[0]
    assert turn.truncated and turn.parse_error and "cut off at the length limit" in turn.feedback
    assert turn.response_tokens > 0 and turn.logprobs is None  # counted from text when the backend gives no ids


def test_progress_bar_option(tasks, capsys):
    run_rollouts(tasks, ScriptedGenerator(), ScriptedEvaluator(), RolloutConfig(trajectories=1, turns=2, show_progress=True))
    assert "rollout" in capsys.readouterr().err


@pytest.mark.parametrize("kwargs, match", [
    ({"trajectories": 0}, "trajectories must be a positive integer"),
    ({"turns": 1.5}, "turns must be a positive integer"),
    ({"backend": "rocm"}, "backend must be one of"),
    ({"max_prompt_tokens": 100}, "at least 256"),
    ({"early_stop_speedup": -1.0}, "early_stop_speedup must be >= 0"),
    ({"early_stop_speedup": float("nan")}, "early_stop_speedup must be >= 0"),
    ({"early_stop_speedup": "fast"}, "a number or None"),
    ({"prompt_opens_reasoning": "yes"}, "true, false or null"),
])
def test_config_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RolloutConfig(**kwargs)


def test_config_round_trip_and_unknown_keys():
    cfg = RolloutConfig(trajectories=4, turns=2, backend="cuda", early_stop_speedup=1.5)
    assert RolloutConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    assert cfg.samples_per_task == 8
    with pytest.raises(ValueError, match="unknown rollout settings: \\['m'\\]"):
        RolloutConfig.from_dict({"m": 4})
