"""Prompt and turn-context building: example in turn 1 only, reasoning dropped, oldest attempts dropped first."""

from __future__ import annotations

import pytest

from kevin.evaluation.rules import load_rules, static_hits
from kevin.rollout.prompts import (
    EXAMPLE_REFERENCE,
    Attempt,
    PromptBuilder,
    approx_tokens,
    base_prompt,
    example_solution,
    render_messages,
)

EXAMPLE_MARK = "example_vector_add"


def attempt(turn: int, size: int = 0) -> Attempt:
    kernel = f"class ModelNew(nn.Module):  # kernel of turn {turn}\n" + "    x = 1\n" * size
    feedback = f"Your kernel is correct and runs at 1.{turn}0x the speed of the PyTorch eager baseline; it can be made faster."
    return Attempt(turn=turn, kernel=kernel, summary=f"summary of turn {turn}", feedback=feedback)


class FakeTokenizer:
    """Just enough of a HF tokenizer: a visible chat template and a whitespace token count."""

    def apply_chat_template(self, messages, add_generation_prompt=False, tokenize=True):
        assert add_generation_prompt is True and tokenize is False
        body = "".join(f"<|{m['role']}|>{m['content']}<|end|>" for m in messages)
        return body + "<|assistant|>"

    def encode(self, text, add_special_tokens=True):
        return text.split()


@pytest.mark.parametrize("backend", ["cuda", "cpu"])
def test_first_turn_has_example_rules_task_and_format(backend, relu_task):
    ctx = PromptBuilder(backend).build(relu_task)
    text = ctx.text
    assert EXAMPLE_MARK in text and "class ModelNew" in text
    assert relu_task.render("cpu" if backend == "cpu" else "default").strip() in text
    for rule_word in ("try/except", "`pass`", "subclasses", "load_inline", "threads", "timers"):
        assert rule_word in text, rule_word
    assert "summary" in text and "ONE ```python code block" in text
    assert ("__global__" in text) == (backend == "cuda")
    assert ctx.attempts_kept == ctx.attempts_dropped == 0 and not ctx.over_budget
    assert ctx.messages == [{"role": "user", "content": text}]


def test_profile_sizes_are_rendered(relu_task):
    assert "batch_size = 64" in PromptBuilder("cpu").build(relu_task).text  # the cpu profile
    assert "batch_size = 8192" in PromptBuilder("cuda").build(relu_task).text  # the task's own sizes


def test_later_turns_show_attempts_without_reasoning_or_example(relu_task):
    attempts = [attempt(0), attempt(1)]
    ctx = PromptBuilder("cpu").build(relu_task, attempts)
    text = ctx.text
    assert EXAMPLE_MARK not in text
    assert "## Your previous attempts" in text and "Start your reasoning again" in text
    for a in attempts:
        assert a.kernel.strip() in text and a.summary in text and a.feedback in text
    assert text.index("Attempt 1") < text.index("Attempt 2")
    assert ctx.attempts_kept == 2 and ctx.attempts_dropped == 0


def test_reasoning_never_reaches_the_context(relu_task):
    # Attempt has no reasoning field by construction; check the loop's conversion keeps it that way.
    from kevin.records.evaluation import EvalResult, Status
    from kevin.records.rollout import Trajectory, Turn
    from kevin.rollout.loop import past_attempts

    verdict = EvalResult("level1/01_relu", "c", Status.CORRECT, correct=True, feedback="fb")
    turn = Turn("level1/01_relu", 0, 0, verdict, reasoning="SECRET-THOUGHTS", kernel="class ModelNew: ...", summary="s")
    traj = Trajectory("level1/01_relu", 0, [turn])
    text = PromptBuilder("cpu").build(relu_task, past_attempts(traj)).text
    assert "SECRET-THOUGHTS" not in text and "fb" in text


def test_oldest_attempts_are_dropped_first_under_a_small_budget(relu_task):
    builder = PromptBuilder("cpu", max_prompt_tokens=10**6)
    attempts = [attempt(t, size=200) for t in range(4)]
    full = builder.build(relu_task, attempts).tokens
    # Room for the last two attempts plus the "left out" note, not for a third (~600 tokens each).
    budget = builder.build(relu_task, attempts[-2:]).tokens + 30
    ctx = PromptBuilder("cpu", max_prompt_tokens=budget).build(relu_task, attempts)
    assert ctx.tokens <= budget < full
    assert ctx.attempts_kept == 2 and ctx.attempts_dropped == 2
    assert "kernel of turn 0" not in ctx.text and "kernel of turn 1" not in ctx.text
    assert "kernel of turn 2" in ctx.text and "kernel of turn 3" in ctx.text
    assert "2 earlier attempts are left out" in ctx.text
    assert attempts[-1].feedback in ctx.text  # the newest feedback always survives the longest


def test_over_budget_when_the_task_alone_does_not_fit(relu_task):
    ctx = PromptBuilder("cpu", max_prompt_tokens=50).build(relu_task, [attempt(0)])
    assert ctx.over_budget and ctx.attempts_kept == 0 and ctx.attempts_dropped == 1
    assert EXAMPLE_MARK not in ctx.text  # still a later turn: no example


def test_chat_template_and_tokenizer_counting(relu_task):
    tok = FakeTokenizer()
    builder = PromptBuilder("cpu", tokenizer=tok, system_prompt="Be brief.")
    ctx = builder.build(relu_task, [attempt(0)])
    assert ctx.text.startswith("<|system|>Be brief.<|end|><|user|>") and ctx.text.endswith("<|assistant|>")
    assert ctx.tokens == len(ctx.text.split())
    assert [m["role"] for m in ctx.messages] == ["system", "user"]


def test_custom_token_counter_wins(relu_task):
    ctx = PromptBuilder("cpu", count_tokens=lambda s: 7).build(relu_task)
    assert ctx.tokens == 7


def test_plain_rendering_without_tokenizer():
    assert render_messages([{"role": "system", "content": "a"}, {"role": "user", "content": "b"}]) == "a\n\nb"
    assert approx_tokens("12345678") == 2


def test_bad_backend_is_a_clear_error():
    with pytest.raises(ValueError, match="backend must be one of"):
        base_prompt("x", "rocm", with_example=False)


@pytest.mark.parametrize("backend", ["cuda", "cpu"])
def test_the_one_shot_example_obeys_the_rules_it_teaches(backend):
    hits = static_hits(example_solution(backend), backend, load_rules(), EXAMPLE_REFERENCE)
    assert hits == [], [h.describe() for h in hits]
