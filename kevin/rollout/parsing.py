"""Split a policy response into reasoning, kernel source and summary.

The expected shape is: reasoning (inside ``<think>...</think>``, or plain text before the code), then
one fenced ```python block with the whole solution file, then a short summary of the changes.
Real responses are messier (several drafts, no closing fence, truncated reasoning, junk), so:

- the kernel is the LAST fenced python (or untagged) block that defines ``class ModelNew``: models
  often show a draft first and the final version last;
- with a closed ``</think>`` only text after it is searched for code: drafts inside the reasoning are
  not the answer. An unclosed ``<think>`` means the model never left its reasoning (usually it hit the
  length limit), which is a parse error rather than a guess at a draft;
- many reasoning models' chat templates (QwQ, the DeepSeek-R1 distills, Qwen's thinking releases) OPEN
  the ``<think>`` block in the prompt, so the response starts inside its reasoning and carries only the
  closing tag. The parser must be told (``reasoning_open``; ``opens_reasoning`` reads it off the rendered
  prompt): a response cut off mid-reasoning then has NEITHER tag, and without that knowledge it would
  read like a plain answer whose last draft is the kernel and whose later reasoning is the summary;
- the summary never carries reasoning into a later turn: any ``<think>`` block left in it is removed;
- an unterminated fence runs to the end of the text: the model may simply have forgotten the closing
  fence; if the code was cut off, the evaluator reports the syntax error, which is better feedback;
- nothing raises: a missing kernel gives ``parse_error=True`` and an ``error`` phrase for the feedback.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from kevin.records.verdicts import parse_error_verdict

_THINK_OPEN = re.compile(r"<think>", re.IGNORECASE)
_THINK_CLOSE = re.compile(r"</think>", re.IGNORECASE)
_THINK_BLOCK = re.compile(r"<think>.*?</think>", re.IGNORECASE | re.DOTALL)
# An opening fence: up to 3 spaces, 3+ backticks or tildes, then an optional info string (language).
_FENCE_OPEN = re.compile(r"^[ \t]{0,3}(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^\n`]*)$")
_MODELNEW = re.compile(r"^[ \t]*class[ \t]+ModelNew\b", re.MULTILINE)
PYTHON_TAGS = frozenset({"", "python", "py", "python3"})


@dataclass
class CodeBlock:
    """One fenced block: its language tag, code, and character span in the text it came from."""

    lang: str
    code: str
    start: int
    """Offset of the opening fence line."""
    end: int
    """Offset just past the closing fence line (the text's end for an unterminated block)."""
    terminated: bool


@dataclass
class ParsedResponse:
    """The parts of one response. ``error`` says why ``kernel`` is missing (phrased for feedback)."""

    reasoning: str = ""
    kernel: str = ""
    summary: str = ""
    parse_error: bool = False
    error: str = ""
    warnings: list[str] = field(default_factory=list)

    @property
    def feedback(self) -> str:
        """The feedback line a parse error earns (the same wording the evaluator's verdicts use)."""
        if not self.parse_error:
            return ""
        return parse_error_verdict("", "", self.error).feedback


def _tail_after(prompt_text: str, last_content: str) -> str:
    """What the template wrote after the last message's content (the generation prompt), or the whole text."""
    at = prompt_text.rfind(last_content) if last_content else -1
    return prompt_text[at + len(last_content):] if at >= 0 else prompt_text


def opens_reasoning(prompt_text: str, last_content: str = "") -> bool:
    """Whether a rendered prompt ends inside an open ``<think>`` block, i.e. the chat template opened the
    reasoning for the model (QwQ: ``<|im_start|>assistant\n<think>\n``).

    Only the part after ``last_content`` (the last message's text, when given) is read, so a ``<think>`` quoted
    inside the task or an earlier attempt cannot count. An empty block the template closes again (Qwen3 with
    thinking turned off writes ``<think>\n\n</think>``) does not open anything."""
    tail = _tail_after(prompt_text, last_content)
    opening = list(_THINK_OPEN.finditer(tail))
    return bool(opening) and _THINK_CLOSE.search(tail, opening[-1].end()) is None


def template_opens_reasoning(tokenizer: Any) -> bool:
    """Whether ``tokenizer``'s chat template opens the reasoning in the generation prompt (a probe render)."""
    probe = "kevin-probe-message"
    text = tokenizer.apply_chat_template([{"role": "user", "content": probe}], add_generation_prompt=True,
                                         tokenize=False)
    return opens_reasoning(text, probe)


def find_code_blocks(text: str) -> list[CodeBlock]:
    """Every fenced block in ``text``, in order. A fence closes on a bare fence line of the same kind."""
    blocks: list[CodeBlock] = []
    lines = text.splitlines(keepends=True)
    offset = 0
    open_fence: tuple[str, str, int, int] | None = None  # (fence, lang, block start, code start)
    for line in lines:
        bare = line.rstrip("\r\n")
        if open_fence is None:
            m = _FENCE_OPEN.match(bare)
            if m:
                lang = m.group("info").strip().split(" ")[0].lower() if m.group("info").strip() else ""
                open_fence = (m.group("fence"), lang, offset, offset + len(line))
        else:
            fence, lang, start, code_start = open_fence
            stripped = bare.strip()
            if stripped and set(stripped) == {fence[0]} and len(stripped) >= len(fence) and len(bare) - len(bare.lstrip()) <= 3:
                blocks.append(CodeBlock(lang, text[code_start:offset], start, offset + len(line), True))
                open_fence = None
        offset += len(line)
    if open_fence is not None:
        _, lang, start, code_start = open_fence
        blocks.append(CodeBlock(lang, text[code_start:], start, len(text), False))
    return blocks


def split_reasoning(text: str) -> tuple[str | None, str, str]:
    """Return (reasoning inside think tags or None, the text after them, think state).

    State is ``closed`` (a ``</think>`` was found; an opening tag is optional because chat templates
    such as QwQ's put ``<think>`` in the prompt), ``unterminated`` (``<think>`` without a close) or
    ``none`` (no tags: reasoning is whatever precedes the code).
    """
    close = _THINK_CLOSE.search(text)
    opening = _THINK_OPEN.search(text)
    if close:
        start = opening.end() if opening and opening.start() < close.start() else 0
        return text[start:close.start()].strip(), text[close.end():], "closed"
    if opening:
        return text[opening.end():].strip(), "", "unterminated"
    return None, text, "none"


def _cut_off(truncated: bool) -> str:
    return " (the response was cut off at the length limit)" if truncated else ""


def continue_reasoning(text: str) -> tuple[str | None, str, str]:
    """``split_reasoning`` for a response that STARTS inside its reasoning (the prompt opened ``<think>``):
    everything up to the first ``</think>`` is reasoning; without one the reasoning never ended."""
    close = _THINK_CLOSE.search(text)
    if close is None:
        return text.strip(), "", "unterminated"
    # A model that also writes the opening tag itself (the template already did) leaves a stray one in front.
    return _THINK_OPEN.sub("", text[:close.start()], count=1).strip(), text[close.end():], "closed"


def clean_summary(text: str) -> str:
    """The summary without any reasoning: ``<think>...</think>`` blocks, an unclosed ``<think>`` and what
    follows it, and stray closing tags are removed (the summary goes into every later turn's context)."""
    text = _THINK_BLOCK.sub("", text)
    opening = _THINK_OPEN.search(text)
    if opening is not None:
        text = text[:opening.start()]
    return _THINK_CLOSE.sub("", text).strip()


def parse_response(text: str | None, truncated: bool = False, reasoning_open: bool = False) -> ParsedResponse:
    """Parse one response. ``reasoning_open``: the prompt ended inside an open ``<think>`` block, so the
    response starts in its reasoning (see ``opens_reasoning``). ``truncated`` (it hit the token limit) only
    sharpens the error wording."""
    text = text or ""
    if not text.strip():
        return ParsedResponse(parse_error=True, error="the response is empty" + _cut_off(truncated))
    reasoning, rest, think = continue_reasoning(text) if reasoning_open else split_reasoning(text)
    warnings = []
    if think == "unterminated":
        error = ("the reasoning was never closed with </think>, so no answer followed it" if reasoning_open else
                 "the response never closed its <think> block, so no code followed the reasoning")
        return ParsedResponse(reasoning=reasoning or "", parse_error=True, error=error + _cut_off(truncated))

    blocks = [b for b in find_code_blocks(rest) if b.lang in PYTHON_TAGS]
    chosen = next((b for b in reversed(blocks) if _MODELNEW.search(b.code)), None)
    if chosen is None:
        if blocks:
            error = f"none of the {len(blocks)} ```python blocks defines class ModelNew"
        else:
            error = "no ```python block defining ModelNew was found"
        return ParsedResponse(reasoning=reasoning if reasoning is not None else text.strip(),
                              parse_error=True, error=error + _cut_off(truncated))

    if reasoning is None:
        reasoning = rest[:chosen.start].strip()
    if not chosen.terminated:
        warnings.append("the code block was not closed with ```")
    summary = clean_summary(rest[chosen.end:])
    if not summary:
        warnings.append("no summary followed the code")
    return ParsedResponse(reasoning=reasoning, kernel=chosen.code.strip("\n") + "\n", summary=summary, warnings=warnings)
