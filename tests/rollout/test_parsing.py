"""Response parsing: every odd shape gives a result, never an exception."""

from __future__ import annotations

import pytest

from kevin.rollout.parsing import find_code_blocks, parse_response

KERNEL = "import torch\nimport torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n    def forward(self, x):\n        return x\n"
DRAFT = "class ModelNew(nn.Module):\n    # draft\n    def forward(self, x):\n        return x\n"


def fenced(code: str, lang: str = "python") -> str:
    return f"```{lang}\n{code}```\n"


def test_think_tags_code_and_summary():
    r = parse_response(f"<think>\nOkay, let me fuse this.\n</think>\nHere it is:\n{fenced(KERNEL)}\nI fused the loops.")
    assert not r.parse_error and r.error == ""
    assert r.reasoning == "Okay, let me fuse this."
    assert r.kernel == KERNEL
    assert r.summary == "I fused the loops."
    assert r.warnings == [] and r.feedback == ""


def test_close_tag_without_open_tag_as_qwq_templates_produce():
    # QwQ's chat template puts "<think>" in the prompt, so the response only closes it.
    r = parse_response(f"Okay, so the task...\n</think>\n{fenced(KERNEL)}Done: one loop.")
    assert r.reasoning == "Okay, so the task..." and r.kernel == KERNEL and r.summary == "Done: one loop."


def test_no_think_tags_reasoning_is_text_before_the_code():
    r = parse_response(f"Okay, I will write a loop.\n\n{fenced(KERNEL)}\nSummary: a loop.")
    assert not r.parse_error
    assert r.reasoning == "Okay, I will write a loop."
    assert r.summary == "Summary: a loop."


def test_last_modelnew_block_wins_over_drafts_and_other_languages():
    cpp, trailing = fenced("int main() {}\n", "cpp"), fenced("print(1)\n")
    text = (f"First a draft:\n{fenced(DRAFT)}\nand the C++ part:\n{cpp}"
            f"Final:\n{fenced(KERNEL, 'py')}\nSummary here.\n{trailing}")
    r = parse_response(text)
    assert r.kernel == KERNEL
    assert "draft" in r.reasoning  # without think tags, everything before the chosen block is reasoning
    assert r.summary.startswith("Summary here.")


def test_code_inside_closed_think_is_not_the_answer():
    r = parse_response(f"<think>maybe:\n{fenced(DRAFT)}</think>\nI give up.")
    assert r.parse_error and "no ```python block defining ModelNew" in r.error
    assert "could not be parsed" in r.feedback


def test_blocks_without_modelnew():
    one, two = fenced("class Model:\n    x = 1\n"), fenced("y = 2\n")
    r = parse_response(f"Here:\n{one}{two}")
    assert r.parse_error
    assert r.error == "none of the 2 ```python blocks defines class ModelNew"
    assert r.kernel == "" and r.reasoning.startswith("Here:")


def test_no_code_at_all():
    r = parse_response("Okay, I think we should use shared memory.")
    assert r.parse_error and r.error == "no ```python block defining ModelNew was found"
    assert r.reasoning == "Okay, I think we should use shared memory."  # monitors read the opening
    assert r.feedback == "Your response could not be parsed: no ```python block defining ModelNew was found."


@pytest.mark.parametrize("text", ["", "   \n\t", None])
def test_empty_response(text):
    r = parse_response(text)
    assert r.parse_error and r.error == "the response is empty"


def test_unterminated_think_is_a_parse_error_mentioning_truncation():
    r = parse_response(f"<think>Okay, long thoughts {fenced(KERNEL)} and more", truncated=True)
    assert r.parse_error and "<think>" in r.error and "cut off at the length limit" in r.error
    assert r.reasoning.startswith("Okay, long thoughts")


def test_unterminated_fence_runs_to_the_end():
    r = parse_response(f"Okay.\n```python\n{KERNEL}")
    assert not r.parse_error and r.kernel == KERNEL and r.summary == ""
    assert "the code block was not closed with ```" in r.warnings
    assert "no summary followed the code" in r.warnings


def test_truncated_without_code_says_so():
    r = parse_response("Okay, let me think about tiling", truncated=True)
    assert r.parse_error and r.error.endswith("(the response was cut off at the length limit)")


@pytest.mark.parametrize("junk", [
    "```", "``````", "</think>", "<think>", "</think></think>```python\n```", "\x00\x01\ufffd" * 50,
    "```python\nclass ModelNew", "~~~python\nclass ModelNew(nn.Module): ...\n~~~", "````\n```\n````",
])
def test_junk_never_raises(junk):
    r = parse_response(junk)
    assert isinstance(r.parse_error, bool)
    assert r.parse_error == (r.kernel == "")
    if r.parse_error:
        assert r.error


def test_tilde_fence_and_longer_backtick_fence():
    assert parse_response(f"~~~python\n{KERNEL}~~~\nok").kernel == KERNEL
    inner = KERNEL + 'doc = """\n```\n"""\n'  # a shorter fence inside a longer one does not close it
    assert parse_response(f"````python\n{inner}````\nok").kernel == inner


def test_find_code_blocks_spans():
    text = "a\n```python\nx = 1\n```\nb\n```cpp\nint y;\n"
    blocks = find_code_blocks(text)
    assert [(b.lang, b.code, b.terminated) for b in blocks] == [("python", "x = 1\n", True), ("cpp", "int y;\n", False)]
    assert text[blocks[0].end:] == "b\n```cpp\nint y;\n"


# --------------------------------------------------------------------- the prompt opened the reasoning

def test_cut_off_mid_reasoning_is_a_parse_error_when_the_prompt_opened_it():
    # QwQ-style: the template wrote "<think>\n", the response never closes it and contains a draft.
    text = f"Okay, a first draft:\n{fenced(DRAFT)}Hmm, the draft is wrong because"
    r = parse_response(text, truncated=True, reasoning_open=True)
    assert r.parse_error and r.kernel == "" and r.summary == ""
    assert r.error == ("the reasoning was never closed with </think>, so no answer followed it "
                       "(the response was cut off at the length limit)")
    assert r.feedback.startswith("Your response could not be parsed: the reasoning was never closed")
    assert r.reasoning == text.strip()  # kept for the monitors, never for the context
    # The same text without that knowledge reads as a plain answer: the draft becomes the kernel.
    assert parse_response(text, truncated=True).kernel == DRAFT


def test_closed_reasoning_after_an_opened_prompt():
    text = f"Okay, a draft:\n{fenced(DRAFT)}That works.\n</think>\n\n{fenced(KERNEL)}\nOne fused loop."
    r = parse_response(text, reasoning_open=True)
    assert not r.parse_error and r.kernel == KERNEL and r.summary == "One fused loop."
    assert r.reasoning.startswith("Okay, a draft:") and r.reasoning.endswith("That works.")
    # A model that writes the opening tag again anyway: the stray tag is not part of the reasoning.
    again = parse_response(f"<think>\nOkay.\n</think>\n{fenced(KERNEL)}Done.", reasoning_open=True)
    assert again.reasoning == "Okay." and again.kernel == KERNEL


def test_summary_never_carries_reasoning():
    text = (f"<think>\nOkay.\n</think>\n{fenced(KERNEL)}A fused loop. <think>secret thoughts</think> Then more. "
            "<think>unclosed secret")
    r = parse_response(text)
    assert r.summary == "A fused loop.  Then more." and "secret" not in r.summary


@pytest.mark.parametrize("name, expected", [("QWQ", True), ("R1_DISTILL", True), ("QWEN3_HYBRID", False),
                                            ("PLAIN", False)])
def test_which_chat_templates_open_the_reasoning(name, expected):
    pytest.importorskip("transformers")
    from kevin.rollout.parsing import opens_reasoning, template_opens_reasoning
    from tests import chat_templates

    tok = chat_templates.chat_tokenizer(getattr(chat_templates, name))
    assert template_opens_reasoning(tok) is expected
    messages = [{"role": "user", "content": "the task; an attempt quoting <think> in its summary"}]
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert opens_reasoning(text, messages[0]["content"]) is expected  # the quoted tag is not the template's
    if name == "QWEN3_HYBRID":  # thinking switched off: an empty block, opened and closed again
        off = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, enable_thinking=False)
        assert off.endswith("<think>\n\n</think>\n\n") and not opens_reasoning(off, messages[0]["content"])
