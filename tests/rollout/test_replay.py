"""The replay policy (known responses for the first trajectories of each task) and the tokenizer corpus."""

from __future__ import annotations

import pytest

from kevin.records.generation import GenerationOut, Prompt
from kevin.rollout.replay import (
    REPLAY_SUMMARY,
    ReplayPolicy,
    longest_response_tokens,
    reference_responses,
    replay_response,
    tokenizer_corpus,
)
from kevin.tasks import find_task, load_bundled_suite


class Policy:
    """A stand-in sampler: echoes each prompt, two token ids per response."""

    config = None
    max_response_tokens = 5

    class tokenizer:  # noqa: N801  (a tokenizer stand-in: one token per character, and an EOS)
        eos_token_id = 0

        @staticmethod
        def encode(text, add_special_tokens=False):
            return list(range(len(text)))

    def __call__(self, prompts):
        return [GenerationOut(text=f"sampled {p.text}", token_ids=[1, 2]) for p in prompts]


@pytest.fixture(scope="module")
def tasks():
    suite = load_bundled_suite()
    return [find_task(suite, "01_relu"), find_task(suite, "02_gelu")]


def test_replays_by_prompt_position_and_checks_the_order(tasks):
    sources = {t.task_id: f"SOURCE-{t.name}" for t in tasks}
    gen = ReplayPolicy(Policy(), tasks, 3, 1, {t.task_id: f"ORACLE-{t.name}" for t in tasks}, sources)
    prompts = [Prompt([], f"p{i} {sources[tasks[i // 3].task_id]}") for i in range(6)]
    outs = gen(prompts)
    assert [o.text for o in outs] == ["ORACLE-01_relu", f"sampled {prompts[1].text}", f"sampled {prompts[2].text}",
                                      "ORACLE-02_gelu", f"sampled {prompts[4].text}", f"sampled {prompts[5].text}"]
    assert outs[0].token_ids == [] and gen.calls == [{"prompts": 6.0, "sampled": 4.0, "tokens": 8.0}]
    with pytest.raises(RuntimeError, match="order"):
        gen(prompts[3:] + prompts[:3])
    with pytest.raises(RuntimeError, match="no early stopping"):
        gen(prompts[:5])
    # The longest response it gives: a replayed one ("ORACLE-01_relu": 14 characters + EOS) beats the limit of 5.
    assert longest_response_tokens(Policy.tokenizer, gen.responses) == 15 and gen.max_response_tokens == 15
    with pytest.raises(ValueError, match="replayed must be in"):
        ReplayPolicy(Policy(), tasks, 3, 4, gen.responses, sources)


def test_reference_responses_are_the_bundled_solutions(tasks):
    responses = reference_responses(tasks, "cpu")
    relu = responses["level1/01_relu"]
    assert relu.startswith("```python\n") and relu.endswith(f"```\n\n{REPLAY_SUMMARY}") and "class ModelNew" in relu
    assert replay_response("x = 1\n", "Done.") == "```python\nx = 1\n```\n\nDone."


def test_tokenizer_corpus_holds_the_bundled_files_and_both_prompt_shapes(tasks):
    texts = tokenizer_corpus(tasks[:1], "cpu")
    assert any("class ModelNew" in t for t in texts) and any("def get_inputs" in t for t in texts)
    prompts = texts[-2:]
    assert "## Your previous attempts" not in prompts[0] and "## Your previous attempts" in prompts[1]


class StatefulPolicy(Policy):
    """The stand-in sampler with a sampler state, as HFPolicy has one."""

    def __init__(self):
        self.state = {"generator": 7}

    def state_dict(self):
        return dict(self.state)

    def load_state_dict(self, state):
        self.state = dict(state)


def test_reference_replay_finds_each_prompts_task_by_its_source(tasks):
    from kevin.rollout.prompts import PromptBuilder
    from kevin.rollout.replay import ReferenceReplay, replay_references

    builder = PromptBuilder(backend="cpu")
    relu, gelu = (builder.build(t).prompt for t in tasks)
    policy = StatefulPolicy()
    gen = ReferenceReplay(policy, tasks, trajectories=2, replayed=1, backend="cpu")
    # The batch of a step: each task's trajectories in a row, tasks in any order the sampler drew.
    outs = gen([gelu, gelu, relu, relu])
    references = reference_responses(tasks, "cpu")
    assert [o.text for o in outs] == [references["level1/02_gelu"], f"sampled {gelu.text}",
                                      references["level1/01_relu"], f"sampled {relu.text}"]
    assert gen.calls == [{"prompts": 4.0, "sampled": 2.0}]
    assert gen.max_response_tokens == max(len(r) + 1 for r in references.values())  # one token a character + EOS
    gen.load_state_dict({"generator": 9})
    assert gen.state_dict() == {"generator": 9} == policy.state
    with pytest.raises(RuntimeError, match="groups of one task's trajectories"):
        gen([gelu, relu, relu, gelu])
    with pytest.raises(RuntimeError, match="not a multiple of 2 trajectories"):
        gen([gelu, gelu, relu])
    with pytest.raises(RuntimeError, match="no known task source"):
        gen([Prompt([], "x"), Prompt([], "y")])

    class Run:  # the parts of a RunConfig the wrap reads
        class rollout:  # noqa: N801
            trajectories, backend, profile = 3, "cpu", ""

    wrapped = replay_references(policy, Run, tasks)
    assert (wrapped.trajectories, wrapped.replayed) == (3, 2)  # half of 3, rounded up


def test_reference_replay_reads_the_trajectory_the_rollout_names(tasks):
    """A wave or a process's share holds some of a task's trajectories: the named index decides, not the position,
    and the wrapped policy is called even with nothing to sample (a sharded policy's passes need every process)."""
    from kevin.rollout.prompts import PromptBuilder
    from kevin.rollout.replay import ReferenceReplay

    builder = PromptBuilder(backend="cpu")
    relu, gelu = (builder.build(t) for t in tasks)
    calls = []

    class Counting(Policy):
        def __call__(self, prompts):
            calls.append(len(prompts))
            return super().__call__(prompts)

    gen = ReferenceReplay(Counting(), tasks, trajectories=4, replayed=2, backend="cpu")
    references = reference_responses(tasks, "cpu")
    # Trajectories 1 and 3 of each task (a wave): 1 replays, 3 samples; no grouping or multiple of 4 needed.
    wave = [relu.prompt_for("level1/01_relu", 1), relu.prompt_for("level1/01_relu", 3), gelu.prompt_for("level1/02_gelu", 3)]
    outs = gen(wave)
    assert [o.text for o in outs] == [references["level1/01_relu"], f"sampled {relu.text}", f"sampled {gelu.text}"]
    assert gen.slots(wave) == [("level1/01_relu", 1), ("level1/01_relu", 3), ("level1/02_gelu", 3)]
    assert [o.text for o in gen([gelu.prompt_for("level1/02_gelu", 0)])] == [references["level1/02_gelu"]]
    assert calls == [2, 0]
    with pytest.raises(RuntimeError, match="not the ones they show"):
        gen([relu.prompt_for("level1/02_gelu", 0)])
