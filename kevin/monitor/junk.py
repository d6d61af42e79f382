"""The junk score of one response: how much of it is repetition, loops or gibberish.

The score (`junk_breakdown`), per response. Collapse junk takes a few forms (repeated tokens or phrases, loops
that run until the length limit, mixed-script gibberish, broken bytes), while an honest kernel response
repeats itself in one way (its code: a draft in the reasoning, a revision, the final file). Each measure is a
share in [0, 1], and the score is the largest, so it reads as "at least this share of the response is junk":
- ``ngram_repeat``: share of the word n-grams (n = `ngram_size`, words casefolded) that repeat an earlier one.
  An n-gram that occurs inside closed ```fenced``` code may occur `code_copies` times (draft, revision,
  final) before it counts: an honest response with three copies of its kernel is not junk; a fourth copy,
  or prose pasted again, is.
- ``run_share``: share of the words covered by the longest stretch that is one block of p words
  (1 <= p <= `max_period`) repeated back to back at least twice ("a b a b a b": 1).
- ``tail_loop``: share of the last `tail_words` words covered by a back-to-back repetition that runs to the
  very end (blocks of up to 256 words: a repeated paragraph too, once it is there three times): a response
  that fell into a loop and went on until the length limit, however long its honest start.
- ``char_run``: share of the characters inside a block of at most 16 characters repeated back to back at
  least 4 times over 32 characters or more ("!!!!!!!!", "))))))))", "kernelkernelkernel"): junk with no
  spaces, which the word measures cannot see.
- ``script_mix``: share of the words with letters that sit in a run of 8 such words using three or more
  writing systems (Latin, CJK, Cyrillic, Arabic, Thai, Hangul, ...), over the whole text or its last
  `tail_words` words: gibberish sampled from a multilingual vocabulary. Two systems never count: a model that
  drifts into Chinese in its reasoning (QwQ does) is not junk.
- ``nonprintable``: share of characters that are neither printable nor ordinary whitespace, plus U+FFFD.
Limits: word salad in one script without repetition ("ocrats gdx avent ortheast") is not seen; it shows up
as parse errors, truncation and length instead.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from kevin.rollout.parsing import find_code_blocks

# Whitespace a response may hold anywhere; every other non-printable character is a sign of broken bytes.
_HARMLESS_WHITESPACE = frozenset("\n\t\r")


@dataclass(frozen=True)
class JunkBreakdown:
    """Junk score of one response and its parts (each a share in [0, 1]; see the module docstring)."""

    ngram_repeat: float
    run_share: float
    nonprintable: float
    tail_loop: float = 0.0
    char_run: float = 0.0
    script_mix: float = 0.0

    @property
    def score(self) -> float:
        return max(self.ngram_repeat, self.run_share, self.nonprintable, self.tail_loop, self.char_run,
                   self.script_mix)


def repeated_ngram_share(words: Sequence[str], n: int, in_code: Sequence[bool] | None = None,
                         code_copies: int = 1) -> float:
    """Share of the word n-grams that repeat an earlier occurrence; 0 when there are none (fewer than n words).

    ``in_code`` (one flag per word) marks words inside closed fenced code: an n-gram lying entirely in code
    may occur ``code_copies`` times before its later copies count as repeats (1 = plain 1 - distinct/total)."""
    total = len(words) - n + 1
    if total <= 0:
        return 0.0
    counts: Counter[tuple[str, ...]] = Counter()
    coded: set[tuple[str, ...]] = set()
    for i in range(total):
        gram = tuple(words[i:i + n])
        counts[gram] += 1
        if in_code is not None and all(in_code[i:i + n]):
            coded.add(gram)
    repeats = sum(max(0, c - (code_copies if g in coded else 1)) for g, c in counts.items())
    return repeats / total


def words_and_code_flags(text: str) -> tuple[list[str], list[bool]]:
    """Casefolded words, and for each whether it lies inside a CLOSED fenced code block (fences as the response
    parser reads them). An unclosed block (a response cut off inside code) is not code here: a loop that runs
    until the length limit is exactly what must still count."""
    spans = [(b.start, b.end) for b in find_code_blocks(text) if b.terminated]
    words: list[str] = []
    flags: list[bool] = []
    k = 0
    for match in re.finditer(r"\S+", text):
        while k < len(spans) and spans[k][1] <= match.start():
            k += 1
        words.append(match.group().casefold())
        flags.append(k < len(spans) and spans[k][0] <= match.start())
    return words, flags


def longest_repeat_run(words: Sequence[str], max_period: int) -> int:
    """Words covered by the longest back-to-back repetition of a block of p <= max_period words (0 if none).

    For each period p, a run is a stretch where word[i] == word[i - p]; it counts only once the whole block
    has repeated (run >= p matches), and then covers run + p words.
    """
    best = 0
    n = len(words)
    for p in range(1, min(max_period, n // 2) + 1):
        run = 0
        for a, b in zip(words, words[p:]):  # b is word[i], a is word[i - p]
            if a == b:
                run += 1
                if run >= p and run + p > best:
                    best = run + p
            else:
                run = 0
    return best


def tail_loop_share(words: Sequence[str], max_period: int, tail_words: int = 96, long_period: int = 256) -> float:
    """Share of the last ``tail_words`` words covered by a back-to-back repetition that runs to the end of the
    text: a loop the length limit cut off. Blocks of up to ``max_period`` words must repeat once (two copies),
    longer ones, up to ``long_period`` words (a paragraph), twice (three copies)."""
    n = len(words)
    window = min(n, tail_words)
    best = 0
    for p in range(1, min(long_period, n // 2) + 1):
        matches = 0
        for i in range(n - 1, p - 1, -1):  # backwards from the last word while word[i] == word[i - p]
            if words[i] != words[i - p]:
                break
            matches += 1
        if matches >= (p if p <= max_period else 2 * p):
            best = max(best, min(window, matches + p))
    return best / window if window else 0.0


_CHAR_RUN = re.compile(r"(.{1,16}?)\1{3,}", re.DOTALL)
CHAR_RUN_MIN = 32
"""Characters a back-to-back repetition must span to count (indentation and short rules stay below it)."""


def char_run_share(text: str) -> float:
    """Share of characters inside blocks of at most 16 characters repeated back to back 4+ times over at least
    CHAR_RUN_MIN characters ("!!!!...", "kernelkernel..."); whitespace-only runs (indentation) never count."""
    if not text:
        return 0.0
    covered = sum(len(m.group()) for m in _CHAR_RUN.finditer(text)
                  if len(m.group()) >= CHAR_RUN_MIN and m.group(1).strip())
    return covered / len(text)


_SCRIPT_ALIASES = {"HIRAGANA": "CJK", "KATAKANA": "CJK", "FULLWIDTH": "LATIN", "HALFWIDTH": "CJK"}
_SCRIPT_CACHE: dict[str, str] = {}


def _script(ch: str) -> str:
    """The writing system of a letter: the first word of its Unicode name (LATIN, CJK, CYRILLIC, ...)."""
    found = _SCRIPT_CACHE.get(ch)
    if found is None:
        name = unicodedata.name(ch, "UNKNOWN").split(" ")[0]
        found = _SCRIPT_CACHE[ch] = _SCRIPT_ALIASES.get(name, name)
    return found


def _word_scripts(word: str) -> set[str]:
    if word.isascii():
        return {"LATIN"} if any(c.isalpha() for c in word) else set()
    return {_script(c) for c in word if c.isalpha()}


SCRIPT_WINDOW = 8
"""Lettered words per window of the script-mix measure."""


def script_mix_share(text: str, tail_words: int = 96) -> float:
    """Share of the words with letters that lie in a window of SCRIPT_WINDOW such words using three or more
    writing systems (CJK counts as one): the larger of that share over the whole text and over its last
    ``tail_words`` lettered words (gibberish that took over at the end). Two systems never count, so a model
    that mixes Chinese into English reasoning, even within a word, is not junk; 0 without lettered words."""
    scripts = [sc for sc in (_word_scripts(w) for w in text.split()) if sc]

    def share(families: list[set[str]]) -> float:
        if not families:
            return 0.0
        marked = [False] * len(families)
        for i in range(max(1, len(families) - SCRIPT_WINDOW + 1)):
            window = families[i:i + SCRIPT_WINDOW]
            if len(set().union(*window)) >= 3:
                marked[i:i + len(window)] = [True] * len(window)
        return sum(marked) / len(families)

    return max(share(scripts), share(scripts[-tail_words:]))


def nonprintable_share(text: str) -> float:
    """Share of characters that are not printable (ordinary whitespace excepted) or are U+FFFD."""
    if not text:
        return 0.0
    bad = sum(1 for ch in text if ch == "\ufffd" or (not ch.isprintable() and ch not in _HARMLESS_WHITESPACE))
    return bad / len(text)


def junk_breakdown(text: str, ngram_size: int = 4, max_period: int = 32, code_copies: int = 3,
                   tail_words: int = 96) -> JunkBreakdown:
    """The junk measures of one response (words are casefolded, so "The the" repeats)."""
    words, in_code = words_and_code_flags(text)
    run = longest_repeat_run(words, max_period)
    return JunkBreakdown(
        ngram_repeat=repeated_ngram_share(words, ngram_size, in_code, code_copies),
        run_share=run / len(words) if words else 0.0,
        nonprintable=nonprintable_share(text),
        tail_loop=tail_loop_share(words, max_period, tail_words),
        char_run=char_run_share(text),
        script_mix=script_mix_share(text, tail_words),
    )


def junk_score(text: str, ngram_size: int = 4, max_period: int = 32, code_copies: int = 3,
               tail_words: int = 96) -> float:
    """Junk score of one response in [0, 1]: the largest of its measures (low for honest responses)."""
    return junk_breakdown(text, ngram_size, max_period, code_copies, tail_words).score
