"""The compact prompt (``rollout.prompt_style: compact``): short, no example, the same answer format the parser
reads, the same attempts and feedback in later turns."""

from __future__ import annotations

import pytest

from kevin.rollout.config import RolloutConfig
from kevin.rollout.parsing import parse_response
from kevin.rollout.prompts import EXAMPLE_REFERENCE, PROMPT_STYLES, Attempt, PromptBuilder, approx_tokens
from kevin.rollout.replay import replay_response

SOLUTION = "import torch\nimport torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n    def forward(self, x):\n        return x\n"


@pytest.mark.parametrize("backend", ["cpu", "cuda"])
def test_compact_first_turn_is_short_shows_the_task_and_no_example(backend, relu_task):
    full = PromptBuilder(backend, max_prompt_tokens=100_000).build(relu_task)
    compact = PromptBuilder(backend, max_prompt_tokens=100_000, style="compact").build(relu_task)
    source = relu_task.render("cpu" if backend == "cpu" else "default")
    assert source.strip() in compact.text and "load_inline" in compact.text and "ModelNew" in compact.text
    assert "example_vector_add" not in compact.text and EXAMPLE_REFERENCE.strip() not in compact.text
    assert "ONE ```python" in compact.text
    # About 4 characters a token: the task plus at most ~180 tokens of instructions (the full prompt: ~1,000 more).
    overhead = compact.tokens - approx_tokens(source)
    assert overhead <= 180, overhead
    assert full.tokens - compact.tokens >= 700, (full.tokens, compact.tokens)


def test_an_answer_in_the_compact_format_parses_back_to_its_parts(relu_task):
    answer = "I loop over the elements in C++.\n\n" + replay_response(SOLUTION, "One loop computes the output.")
    parsed = parse_response(answer)
    assert not parsed.parse_error
    assert parsed.kernel.strip() == SOLUTION.strip()
    assert parsed.reasoning.strip() == "I loop over the elements in C++."
    assert parsed.summary.strip() == "One loop computes the output."


def test_later_turns_keep_the_attempts_and_feedback_of_the_full_style(relu_task):
    tries = [Attempt(turn=0, kernel=SOLUTION, summary="first try", feedback="Your kernel failed to compile: boom.")]
    full = PromptBuilder("cpu", max_prompt_tokens=100_000).build(relu_task, tries).text
    compact = PromptBuilder("cpu", max_prompt_tokens=100_000, style="compact").build(relu_task, tries).text
    tail = full[full.index("## Your previous attempts"):full.index("Reply in this order")]
    assert tail in compact  # the attempts section and the restart instruction, word for word
    assert compact.count("```python\n") == 2  # the task and the attempt's kernel; no example


def test_the_style_is_a_validated_rollout_setting(relu_task):
    assert PROMPT_STYLES == ("full", "compact") and RolloutConfig().prompt_style == "full"
    assert RolloutConfig(prompt_style="compact").prompt_style == "compact"
    with pytest.raises(ValueError, match=r"rollout.prompt_style must be one of \['full', 'compact'\]"):
        RolloutConfig(prompt_style="short")
    with pytest.raises(ValueError, match="prompt style must be one of"):
        PromptBuilder("cpu", style="tiny")
