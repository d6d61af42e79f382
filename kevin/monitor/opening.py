"""Openings and the Not-Okay Ratio: what a response's reasoning starts with, and the share of a batch that no
longer starts with the base model's habitual opening ("Okay," for QwQ), the paper's leading collapse indicator.

Pure functions over plain strings (no tokenizer), so they work with any model and either generation backend.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from collections.abc import Sequence

# What may precede the reasoning: whitespace and one <think> tag (in the prompt for some chat templates, emitted by
# the model for others).
_THINK_PREFIX = re.compile(r"^\s*(?:<think>\s*)?", re.IGNORECASE)


def reasoning_text(text: str) -> str:
    """The response with what precedes the reasoning removed: NFKC-normalised, leading whitespace and one
    leading ``<think>`` tag stripped (some chat templates put the tag in the prompt, others let the model
    emit it), inner whitespace runs collapsed to one space. NFKC maps full-width punctuation ("Okay，")
    to ASCII, so a model that mixes scripts is not counted as "not okay" for it."""
    text = unicodedata.normalize("NFKC", text)
    text = _THINK_PREFIX.sub("", text, count=1)
    return " ".join(text.split())


def first_words(text: str, n_words: int = 1) -> str:
    """The first ``n_words`` whitespace-separated words of the reasoning, punctuation kept ("Okay,");
    "" when the reasoning has fewer words (an empty response has no opening)."""
    words = reasoning_text(text).split(" ", n_words)
    if len(words) < n_words or not words[0]:
        return ""
    return " ".join(words[:n_words])


def starts_with_opening(text: str, opening: str) -> bool:
    """Whether the reasoning starts with ``opening`` (compared after the same normalisation), on a word
    boundary: "Okay" matches "Okay, so" but "I" does not match "In". Case and punctuation count, because
    the habit being lost is the exact opening ("okay" or "Okay." is already a departure from "Okay,")."""
    opening = reasoning_text(opening)
    if not opening:
        raise ValueError("opening is empty; pass the text the reasoning starts with, e.g. 'Okay,'")
    body = reasoning_text(text)
    if not body.startswith(opening):
        return False
    rest = body[len(opening):]
    # A boundary: the text ends, or the opening ends in punctuation, or the next char is not a word char.
    return not rest or not opening[-1].isalnum() or not rest[0].isalnum()


def not_okay_ratio(texts: Sequence[str], opening: str) -> float:
    """Share of ``texts`` whose reasoning does not start with ``opening``; empty texts count as not okay.
    Raises ValueError on an empty batch (a ratio of nothing is undefined, not 0)."""
    if not texts:
        raise ValueError("not_okay_ratio needs at least one text")
    misses = sum(not starts_with_opening(t, opening) for t in texts)
    return misses / len(texts)


def opening_counts(texts: Sequence[str], n_words: int = 1) -> Counter[str]:
    """How many texts open with each first-``n_words`` group; texts without that many words are left out."""
    if n_words < 1:
        raise ValueError("n_words must be >= 1")
    return Counter(o for o in (first_words(t, n_words) for t in texts) if o)


def calibrate_opening(texts: Sequence[str], n_words: int = 1) -> str:
    """The most common opening (first ``n_words`` words of the normalised reasoning) in a batch of the base
    model's responses.

    Empty or whitespace-only texts (and texts shorter than ``n_words`` words) have no opening and get no
    vote. Ties go to the opening seen first in the batch (``Counter.most_common`` keeps insertion order),
    so the result is deterministic for a given batch order. Raises ValueError when no text has an opening.
    """
    counts = opening_counts(texts, n_words)
    if not counts:
        raise ValueError(
            f"cannot calibrate an opening from {len(texts)} empty responses; calibrate on a batch with text, "
            "or set MonitorConfig.expected_opening (e.g. 'Okay,' for QwQ)"
        )
    return counts.most_common(1)[0][0]
