"""Collapse monitors: cheap indicators that a run is degenerating, and typed alerts when one crosses a limit.

Why these indicators (docs/recipe.md §6): Kevin's training eventually collapses into repetitive junk.
The leading indicator was the "Not Okay Ratio", the share of responses whose reasoning no longer starts
with the base model's habitual opening ("Okay," for QwQ); it rose about 15 steps before junk appeared,
and junk showed first in the last turn. We track that ratio, a per-response junk score, response length,
truncation, and the update's own health numbers (entropy, grad norm, clip fraction, approx KL).

What this module does and does not do:
- Pure metric functions over plain strings (no tensors, no tokenizer): the monitor must be cheap and
  work with any model and either generation backend.
- `CollapseMonitor.observe` turns one step's batch into one history row and a list of `Alert` events.
  The monitor never steers training; the trainer reads `should_stop`, saves a checkpoint and stops.
- No side effects at import and no logging setup; alerts are logged through `logging` at most, and are
  plain frozen dataclasses so flows (Prefect notifications) and tracking (MLflow) can consume them.

Junk score (`junk_breakdown`), per response. Collapse junk takes a few forms (repeated tokens or phrases, loops
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

import dataclasses
import enum
import logging
import math
import re
import unicodedata
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kevin.rollout.parsing import find_code_blocks
from kevin.settings import Settings

logger = logging.getLogger(__name__)

# Metrics computed from the responses of one step (absent from a history row when they cannot be computed).
TEXT_METRICS = (
    "not_okay_ratio",   # share of responses whose reasoning does not start with the expected opening
    "junk_mean",        # mean junk score over responses
    "junk_max",         # worst response's junk score
    "junk_share",       # share of responses with junk score >= MonitorConfig.junk_response_threshold
    "mean_chars",       # mean response length in characters
    "mean_tokens",      # mean response length in tokens (only when token counts are passed)
    "truncated_share",  # share of responses cut off at the length limit (only when flags are passed)
)
# Metrics of the update, passed in by the trainer as numbers.
TRAIN_METRICS = ("entropy", "grad_norm", "clip_fraction", "approx_kl")
# Calibration quality: the share of the base batch that starts with the calibrated opening.
CALIBRATION_METRICS = ("opening_share",)
# In every row: 1 when the Not-Okay Ratio is checked against its thresholds, 0 while it is not (no opening yet, or
# one too rare in the base batch to trust), so a plot of the ratio can tell a quiet check from a skipped one.
CHECK_KEY = "not_okay_check"
METRICS = TEXT_METRICS + TRAIN_METRICS
# Metrics that are shares, so their thresholds must lie in [0, 1].
RATIO_METRICS = frozenset({"not_okay_ratio", "junk_mean", "junk_max", "junk_share", "truncated_share", "clip_fraction"})
# Metrics also computed per turn (``junk_share/turn3``, ``junk_share/last_turn``): junk shows first in the last turn.
PER_TURN_METRICS = ("not_okay_ratio", "junk_share")
_PER_TURN_KEY = re.compile(r"^(?P<metric>[a-z_]+)/(?:turn(?P<turn>\d+)|last_turn)$")


def base_metric(key: str) -> str | None:
    """The metric a history key measures (``junk_share/turn3`` -> ``junk_share``), or None for an unknown key.
    Per-turn keys exist for PER_TURN_METRICS: ``<metric>/turn<t>`` (0-based turn t) and ``<metric>/last_turn``
    (the highest turn of the step's batch)."""
    if key in METRICS:
        return key
    match = _PER_TURN_KEY.match(key)
    if match and match.group("metric") in PER_TURN_METRICS:
        return match.group("metric")
    return None

# One line per metric, appended to alert messages so a notification says what the number means.
HINTS = {
    "not_okay_ratio": "reasoning no longer starts with the base model's usual opening (the paper's leading "
                      "indicator: junk followed about 15 steps later)",
    "junk_mean": "responses are getting repetitive or garbled",
    "junk_max": "at least one response is repetitive or garbled",
    "junk_share": "many responses are repetitive junk (collapse; it shows first in the last turn)",
    "mean_chars": "response length moved out of range (a length collapse or runaway generation)",
    "mean_tokens": "response length moved out of range (a length collapse or runaway generation)",
    "truncated_share": "many responses hit the length limit (runaway or looping generation)",
    "entropy": "policy entropy moved out of range (entropy collapse, or sampling noise taking over)",
    "grad_norm": "gradient norm moved out of range (unstable update)",
    "clip_fraction": "many tokens hit the clip range (the update moves the policy too far per step)",
    "approx_kl": "the policy moved far from the sampling policy in one step",
    "opening_share": "the base model has no habitual opening, so the Not-Okay Ratio raises no alerts",
}

_THINK_PREFIX = re.compile(r"^\s*(?:<think>\s*)?", re.IGNORECASE)
_HARMLESS_WHITESPACE = frozenset("\n\t\r")


# ----------------------------------------------------------------------------------------------------
# Openings and the Not-Okay Ratio


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


# ----------------------------------------------------------------------------------------------------
# Junk score


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


# ----------------------------------------------------------------------------------------------------
# Batch metrics


def text_metrics(
    responses: Sequence[str],
    *,
    opening: str | None,
    truncated_flags: Sequence[bool] | None = None,
    token_counts: Sequence[int] | None = None,
    turns: Sequence[int] | None = None,
    ngram_size: int = 4,
    max_period: int = 32,
    junk_response_threshold: float = 0.6,
    code_copies: int = 3,
    tail_words: int = 96,
) -> dict[str, float]:
    """One step's response metrics (names in TEXT_METRICS). A metric that cannot be computed (no responses,
    no opening yet, no flags, no token counts) is left out rather than set to None, so the row can go
    straight to a plot or to MLflow's log_metrics.

    With ``turns`` (each response's turn index) the row also gets ``not_okay_ratio/turn{t}`` and
    ``junk_share/turn{t}`` for every turn, and the same for the highest turn as ``.../last_turn``, because
    collapse shows first in the last turn.
    """
    n = len(responses)
    for name, seq in (("truncated_flags", truncated_flags), ("token_counts", token_counts), ("turns", turns)):
        if seq is not None and len(seq) != n:
            raise ValueError(f"{name} has {len(seq)} entries for {n} responses; pass one per response")
    if n == 0:
        return {}
    # Per-response values, computed once and shared by the batch and the per-turn summaries.
    scores = [junk_score(r, ngram_size, max_period, code_copies, tail_words) for r in responses]
    is_junk = [s >= junk_response_threshold for s in scores]
    not_okay = [not starts_with_opening(r, opening) for r in responses] if opening is not None else None

    out: dict[str, float] = {}
    if not_okay is not None:
        out["not_okay_ratio"] = sum(not_okay) / n
    out["junk_mean"] = sum(scores) / n
    out["junk_max"] = max(scores)
    out["junk_share"] = sum(is_junk) / n
    out["mean_chars"] = sum(len(r) for r in responses) / n
    if token_counts is not None:
        out["mean_tokens"] = sum(token_counts) / n
    if truncated_flags is not None:
        out["truncated_share"] = sum(bool(f) for f in truncated_flags) / n
    if turns is not None:
        last = max(turns)
        for turn in sorted(set(turns)):
            idx = [i for i, t in enumerate(turns) if t == turn]
            names = [f"turn{turn}"] + (["last_turn"] if turn == last else [])
            for name in names:
                if not_okay is not None:
                    out[f"not_okay_ratio/{name}"] = sum(not_okay[i] for i in idx) / len(idx)
                out[f"junk_share/{name}"] = sum(is_junk[i] for i in idx) / len(idx)
    return out


# ----------------------------------------------------------------------------------------------------
# Config


def _default_max_thresholds() -> dict[str, float]:
    # Starting points, not tuned constants: QwQ opens with "Okay," almost always, so 20% is far off its
    # habit; a tenth of the batch being junk is already visible collapse; junk shows first in the last turn,
    # where a fifth of the responses being junk is an early warning (it stops nothing by default); the KL /
    # clip limits are loose warnings for the paper's 2 gradient steps per batch with clip range 0.2 / 0.28.
    return {"not_okay_ratio": 0.2, "junk_share": 0.1, "junk_share/last_turn": 0.2, "truncated_share": 0.5,
            "clip_fraction": 0.3, "approx_kl": 0.1}


@dataclass
class MonitorConfig(Settings):
    """Which collapse indicators alert, when, and which of them stop training."""

    section = "monitor"

    expected_opening: str | None = None
    """The text the model's reasoning starts with ("Okay," for QwQ-32B); None calibrates it from the first
    observed batch (the base model's), so any model works."""

    opening_words: int = 1
    """How many words make up the calibrated opening (1 gives "Okay,"; ignored when expected_opening is set)."""

    min_opening_share: float = 0.5
    """If fewer than this share of the calibration batch starts with the calibrated opening, the model has no
    habit to lose: the Not-Okay Ratio is still recorded but raises no alert (an info alert says so)."""

    ngram_size: int = 4
    """Word n-gram size of the junk score's repeated-n-gram share."""

    max_period: int = 32
    """Longest block (in words) the junk score's repeated-run measure looks for; cost grows linearly with it."""

    junk_response_threshold: float = 0.6
    """A response whose junk score is >= this counts as junk in `junk_share`. Honest responses score far below
    it (repeated code within `code_copies` is allowed); repeated tokens, loops and gibberish score near 1."""

    code_copies: int = 3
    """How often an n-gram of closed fenced code may occur before its copies count as junk: a draft in the
    reasoning, a revision and the final file are honest, a fourth copy is not."""

    tail_words: int = 96
    """Words at the end of a response that the tail measures read (a loop or gibberish that ran until the
    length limit is junk however long the honest start before it)."""

    max_thresholds: dict[str, float] = field(default_factory=_default_max_thresholds)
    """Alert when a metric is ABOVE its value (strictly); keys from METRICS, or per turn for PER_TURN_METRICS:
    ``junk_share/turn3`` (0-based turn 3), ``junk_share/last_turn`` (each step's highest turn)."""

    min_thresholds: dict[str, float] = field(default_factory=dict)
    """Alert when a metric is BELOW its value (strictly), e.g. {"entropy": 0.05} for entropy collapse or
    {"mean_tokens": 200} for a length collapse; keys as in max_thresholds."""

    stop_on: list[str] = field(default_factory=lambda: ["junk_share"])
    """Metrics whose alerts stop training (after `patience` steps in a row); each needs a threshold. Not-Okay
    is only a warning by default: it leads junk by ~15 steps, so it warns early and junk stops."""

    patience: int = 1
    """Consecutive alerting steps of a stop_on metric before the alert says stop (1 = stop at the first)."""

    min_steps: int = 1
    """Observed steps before any alert (the first batch is the base model's, so it is recorded, and used to
    calibrate, but not judged). Steps before this count neither as alerts nor toward patience."""

    def __post_init__(self) -> None:
        if self.expected_opening is not None and not reasoning_text(self.expected_opening):
            raise ValueError(
                "expected_opening is blank; set it to the text the reasoning starts with (e.g. 'Okay,' for QwQ) "
                "or to None to calibrate it from the first batch"
            )
        for name in ("opening_words", "ngram_size", "max_period", "patience", "code_copies", "tail_words"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {getattr(self, name)!r}")
        if not isinstance(self.min_steps, int) or self.min_steps < 0:
            raise ValueError(f"min_steps must be an integer >= 0, got {self.min_steps!r}")
        if not 0.0 <= self.min_opening_share <= 1.0:
            raise ValueError(
                f"min_opening_share must be in [0, 1] (0 always trusts the calibration), got {self.min_opening_share}"
            )
        if not 0.0 < self.junk_response_threshold <= 1.0:
            raise ValueError(f"junk_response_threshold must be in (0, 1], got {self.junk_response_threshold}")
        for table_name in ("max_thresholds", "min_thresholds"):
            table = getattr(self, table_name)
            for metric, value in table.items():
                if base_metric(metric) is None:
                    raise ValueError(f"unknown metric {metric!r} in {table_name}; use one of {list(METRICS)}, or "
                                     f"one of {list(PER_TURN_METRICS)} per turn, e.g. 'junk_share/turn3' or "
                                     "'junk_share/last_turn'")
                if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                    raise ValueError(f"{table_name}[{metric!r}] must be a finite number, got {value!r}")
                if base_metric(metric) in RATIO_METRICS and not 0.0 <= value <= 1.0:
                    raise ValueError(f"{table_name}[{metric!r}] is a share; give a value in [0, 1], got {value}")
        for metric in set(self.max_thresholds) & set(self.min_thresholds):
            if self.min_thresholds[metric] >= self.max_thresholds[metric]:
                raise ValueError(
                    f"{metric}: min threshold {self.min_thresholds[metric]} must be below max threshold "
                    f"{self.max_thresholds[metric]}, else every value alerts"
                )
        if isinstance(self.stop_on, str):
            raise ValueError(f"stop_on must be a list of metric names, e.g. [{self.stop_on!r}]")
        for metric in self.stop_on:
            if base_metric(metric) is None:
                raise ValueError(f"unknown metric {metric!r} in stop_on; use one of {list(METRICS)} or a per-turn "
                                 "key such as 'junk_share/last_turn'")
            if metric not in self.max_thresholds and metric not in self.min_thresholds:
                raise ValueError(
                    f"stop_on names {metric!r} but it has no threshold; add it to max_thresholds or "
                    "min_thresholds, or remove it from stop_on"
                )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# ----------------------------------------------------------------------------------------------------
# Alerts


class Severity(str, enum.Enum):
    """How much an alert matters: info (a fact about the setup), warning (look at it), critical (stop)."""

    INFO = "info"
    WARNING = "warning"
    CRITICAL = "critical"


@dataclass(frozen=True)
class Alert:
    """One threshold crossing at one step: a plain event for notifications (Prefect) and tracking (MLflow)."""

    metric: str
    value: float
    threshold: float
    step: int
    severity: Severity
    should_stop: bool
    message: str
    bound: str = "max"
    """"max": the value went above the threshold; "min": it went below."""
    consecutive: int = 1
    """Steps in a row (since min_steps) this metric has crossed this bound, this one included; notifiers can
    send only consecutive == 1 to avoid one message per step."""

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["severity"] = self.severity.value
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Alert":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown alert fields: {unknown}; known: {sorted(known)}")
        data = dict(data)
        data["severity"] = Severity(data["severity"])
        return cls(**data)


def _crosses(value: float, threshold: float, bound: str) -> bool:
    # A NaN / inf grad norm or KL is a failure in itself, so non-finite values always cross.
    if not math.isfinite(value):
        return True
    return value > threshold if bound == "max" else value < threshold


def _ordinal(k: int) -> str:
    suffix = "th" if 10 <= k % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(k % 10, "th")
    return f"{k}{suffix}"


# ----------------------------------------------------------------------------------------------------
# The monitor


class CollapseMonitor:
    """Turns each step's responses and update metrics into a history row and alerts.

    Usage in a training loop::

        monitor = CollapseMonitor(MonitorConfig(expected_opening="Okay,"))
        for step in ...:
            alerts = monitor.observe(step, responses, truncated, {"entropy": h, "grad_norm": g, ...})
            ...  # hand alerts to tracking / notifications
            if monitor.should_stop:
                save_checkpoint(); break

    State (opening, history, alerts, streaks) goes into checkpoints through `state_dict` so a resumed run
    neither recalibrates on a drifted policy nor forgets how long a metric has been over its limit.
    """

    def __init__(self, config: MonitorConfig | None = None) -> None:
        self.config = config or MonitorConfig()
        self.opening: str | None = self.config.expected_opening
        self.opening_share: float | None = None  # set by calibration; None with a configured opening
        self.history: list[dict[str, float]] = []
        self.alerts: list[Alert] = []
        self._streaks: dict[str, int] = {}  # "metric:bound" -> consecutive crossing steps
        self._last_step: int | None = None

    # -- calibration --

    @property
    def opening_trusted(self) -> bool:
        """Whether Not-Okay alerts are meaningful: a configured opening, or a calibrated one the base model
        used in at least min_opening_share of its first batch."""
        return self._trusts(self.opening, self.opening_share)

    def _trusts(self, opening: str | None, opening_share: float | None) -> bool:
        if opening is None:
            return False
        return opening_share is None or opening_share >= self.config.min_opening_share

    def calibrate(self, texts: Sequence[str], step: int = 0) -> list[Alert]:
        """Set the opening from a batch of the base model's responses (observe does this on its first batch
        when no opening is configured). Returns an info alert when the opening is too rare to be trusted."""
        self.opening, self.opening_share, alerts = self._calibration(texts, step)
        return alerts

    def _calibration(self, texts: Sequence[str], step: int) -> tuple[str, float, list[Alert]]:
        # Pure: observe commits the result only once the whole step has been validated.
        opening = calibrate_opening(texts, self.config.opening_words)
        share = 1.0 - not_okay_ratio(texts, opening)
        logger.info("calibrated opening %r (share %.3f of %d responses)", opening, share, len(texts))
        if share >= self.config.min_opening_share:
            return opening, share, []
        alert = Alert(
            metric="opening_share", value=share, threshold=self.config.min_opening_share,
            step=step, severity=Severity.INFO, should_stop=False, bound="min",
            message=(
                f"step {step}: calibrated opening {opening!r} starts only {share:.0%} of the "
                f"base batch (< {self.config.min_opening_share:.0%}); {HINTS['opening_share']}. Set "
                "MonitorConfig.expected_opening or raise opening_words if the model has a longer habit."
            ),
        )
        return opening, share, [alert]

    # -- observation --

    def observe(
        self,
        step: int,
        responses: Sequence[str],
        truncated_flags: Sequence[bool] | None = None,
        train_metrics: Mapping[str, Any] | None = None,
        *,
        token_counts: Sequence[int] | None = None,
        turns: Sequence[int] | None = None,
    ) -> list[Alert]:
        """Record one step and return its alerts (at most one per metric and bound).

        ``responses`` are the step's response texts (the whole response or just its reasoning: the opening
        is at the start either way). ``truncated_flags`` and ``token_counts`` give one entry per response.
        ``train_metrics`` holds the update's numbers (TRAIN_METRICS; floats or 0-dim tensors); other keys,
        e.g. loss or lr, are recorded in the history too but cannot have thresholds. ``turns`` (the turn index
        of each response) adds per-turn Not-Okay and junk shares to the row, because collapse shows first in
        the last turn. Steps must increase.
        """
        if self._last_step is not None and step <= self._last_step:
            raise ValueError(
                f"step {step} observed after step {self._last_step}; observe steps in increasing order (after a "
                "resume, restore the monitor with load_state_dict from the same checkpoint)"
            )
        cfg = self.config
        alerts: list[Alert] = []
        opening, opening_share = self.opening, self.opening_share
        # Calibrate on the first batch that has openings; an all-empty batch defers it to the next step.
        if opening is None and opening_counts(responses, cfg.opening_words):
            opening, opening_share, alerts = self._calibration(responses, step)

        row: dict[str, float] = {"step": step, "n_responses": len(responses)}
        row.update(text_metrics(
            responses, opening=opening, truncated_flags=truncated_flags, token_counts=token_counts,
            turns=turns, ngram_size=cfg.ngram_size, max_period=cfg.max_period,
            junk_response_threshold=cfg.junk_response_threshold, code_copies=cfg.code_copies,
            tail_words=cfg.tail_words,
        ))
        row[CHECK_KEY] = float(self._trusts(opening, opening_share))
        for key, value in (train_metrics or {}).items():
            if key in row:
                raise ValueError(f"train metric {key!r} clashes with a monitor metric; rename it")
            try:
                row[key] = float(value)
            except (TypeError, ValueError) as exc:
                raise TypeError(f"train metric {key!r} must be a number (or 0-dim tensor), got {value!r}") from exc

        # Everything validated: commit, so a rejected call leaves the monitor as it was.
        self.opening, self.opening_share = opening, opening_share
        self.history.append(row)
        self._last_step = step
        if len(self.history) > cfg.min_steps:
            alerts += self._check(step, row)
        for alert in alerts:
            logger.log(logging.WARNING if alert.severity != Severity.INFO else logging.INFO, alert.message)
        self.alerts += alerts
        return alerts

    def _check(self, step: int, row: Mapping[str, float]) -> list[Alert]:
        cfg = self.config
        alerts = []
        for bound, table in (("max", cfg.max_thresholds), ("min", cfg.min_thresholds)):
            for metric, threshold in table.items():
                key = f"{metric}:{bound}"
                value = row.get(metric)
                # An untrusted calibrated opening has no habit to lose: record the ratio, do not alert on it.
                skip = value is None or (base_metric(metric) == "not_okay_ratio" and not self.opening_trusted)
                if skip or not _crosses(value, threshold, bound):
                    self._streaks[key] = 0
                    continue
                streak = self._streaks.get(key, 0) + 1
                self._streaks[key] = streak
                stop = metric in cfg.stop_on and streak >= cfg.patience
                alerts.append(Alert(
                    metric=metric, value=value, threshold=threshold, step=step,
                    severity=Severity.CRITICAL if stop else Severity.WARNING, should_stop=stop,
                    message=self._message(metric, value, threshold, step, bound, streak, stop),
                    bound=bound, consecutive=streak,
                ))
        return alerts

    def _message(self, metric: str, value: float, threshold: float, step: int, bound: str, streak: int, stop: bool) -> str:
        sign = ">" if bound == "max" else "<"
        text = f"step {step}: {metric} {value:.4g} {sign} {threshold:.4g}"
        if streak > 1:
            text += f" ({_ordinal(streak)} step in a row)"
        base = base_metric(metric) or metric
        hint = HINTS.get(base, "")
        if base != metric:
            hint = f"{hint} ({metric.split('/', 1)[1].replace('_', ' ')})"
        if base == "not_okay_ratio" and self.opening:
            hint = f"{hint}; expected opening {self.opening!r}"
        text += f": {hint}"
        return text + (". Stopping training." if stop else ".")

    # -- results --

    @property
    def should_stop(self) -> bool:
        """True once any alert asked to stop (stays True: a collapsed run does not recover by itself)."""
        return any(a.should_stop for a in self.alerts)

    @property
    def stop_alert(self) -> Alert | None:
        """The first alert that asked to stop, for the run's final status message."""
        return next((a for a in self.alerts if a.should_stop), None)

    def state_dict(self) -> dict[str, Any]:
        """Plain data for a checkpoint (JSON-serialisable)."""
        return {
            "opening": self.opening,
            "opening_share": self.opening_share,
            "history": [dict(r) for r in self.history],
            "alerts": [a.to_dict() for a in self.alerts],
            "streaks": dict(self._streaks),
            "last_step": self._last_step,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.opening = state["opening"]
        self.opening_share = state["opening_share"]
        self.history = [dict(r) for r in state["history"]]
        self.alerts = [Alert.from_dict(a) for a in state["alerts"]]
        self._streaks = dict(state["streaks"])
        self._last_step = state["last_step"]


# ----------------------------------------------------------------------------------------------------
# Plot

NOT_CHECKED_NOTE = "opening not calibrated: check off (no alert)"


def whole_step_axis(axis: Any) -> None:
    """Ticks at whole steps only on a matplotlib step ``axis``. Left alone, matplotlib ticks a run of a few steps at
    0.2, 0.4 ...; ``integer=True`` alone still does for a single step (it wants two integers in view), hence
    ``min_n_ticks=1``."""
    from matplotlib.ticker import MaxNLocator

    axis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))


def not_okay_checked(history: Sequence[Mapping[str, float]]) -> bool | None:
    """Whether the latest row that says so (``not_okay_check``) had the Not-Okay Ratio checked; None when no row
    says (a history from before the key existed)."""
    states = [row[CHECK_KEY] for row in history if CHECK_KEY in row]
    return bool(states[-1]) if states else None


def plot_history(
    history: Sequence[Mapping[str, float]],
    metrics: Sequence[str] | None = None,
    *,
    config: MonitorConfig | None = None,
    alerts: Sequence[Alert] = (),
    path: str | None = None,
):
    """One panel per metric over steps, with threshold lines (from ``config``) and alert steps marked. A Not-Okay
    panel gets no threshold line while the latest row says the ratio is not checked (``not_okay_check`` 0), but
    the note NOT_CHECKED_NOTE.

    ``metrics`` defaults to every monitor metric present in the history. matplotlib is imported here, not at
    module import (it is not a dependency of the library); the figure is built without pyplot, so no GUI
    backend or global figure state is involved. Returns the matplotlib Figure; saves it when ``path`` is set.
    """
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("plot_history needs matplotlib; pip install matplotlib") from exc

    present = {k for row in history for k in row}
    if metrics is None:
        metrics = [m for m in METRICS if m in present] + sorted(
            k for k in present if "/" in k and base_metric(k) is not None)
    if not metrics:
        raise ValueError("nothing to plot: the history has none of the requested metrics")
    checked = not_okay_checked(history)
    fig = Figure(figsize=(7, 2.0 * len(metrics)), layout="constrained")
    axes = fig.subplots(len(metrics), 1, sharex=True, squeeze=False)[:, 0]
    for ax, metric in zip(axes, metrics):
        points = [(row["step"], row[metric]) for row in history if metric in row]
        if points:
            xs, ys = zip(*points)
            ax.plot(xs, ys, marker=".", label=metric)
        if base_metric(metric) == "not_okay_ratio" and checked is False:
            # No line for a threshold the monitor does not apply: values far above it with no alert would read as
            # a broken monitor.
            ax.text(0.5, 0.5, NOT_CHECKED_NOTE, transform=ax.transAxes, ha="center", va="center", color="dimgray")
        elif config is not None:
            for table, style in ((config.max_thresholds, "--"), (config.min_thresholds, ":")):
                if metric in table:
                    ax.axhline(table[metric], color="red", linestyle=style, linewidth=1)
        for alert in alerts:
            if alert.metric == metric:
                ax.axvline(alert.step, color="darkred" if alert.should_stop else "orange", alpha=0.4, linewidth=1)
        ax.set_ylabel(metric, fontsize=8)
    axes[-1].set_xlabel("step")
    whole_step_axis(axes[-1].xaxis)  # shared by every panel (sharex)
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig
