"""One step's response metrics: the Not-Okay Ratio, the junk shares, length and truncation over a batch, and per
turn, because collapse shows first in the last turn.

Kept apart from ``CollapseMonitor`` so the row a step adds to the history can be computed (and tested) without a
monitor's state.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from kevin.monitor.junk import junk_score
from kevin.monitor.opening import starts_with_opening


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
        out.update(per_turn_shares(turns, not_okay, is_junk))
    return out


def per_turn_shares(turns: Sequence[int], not_okay: Sequence[bool] | None, is_junk: Sequence[bool]) -> dict[str, float]:
    """``not_okay_ratio/turn{t}`` (when ``not_okay`` is known) and ``junk_share/turn{t}`` over the responses of each
    turn t, and the highest turn's again as ``.../last_turn``: a run's turn count can change, and thresholds on the
    last turn must follow it."""
    out: dict[str, float] = {}
    last = max(turns)
    for turn in sorted(set(turns)):
        idx = [i for i, t in enumerate(turns) if t == turn]
        names = [f"turn{turn}"] + (["last_turn"] if turn == last else [])
        for name in names:
            if not_okay is not None:
                out[f"not_okay_ratio/{name}"] = sum(not_okay[i] for i in idx) / len(idx)
            out[f"junk_share/{name}"] = sum(is_junk[i] for i in idx) / len(idx)
    return out


def solved_tasks(kernels: Iterable[tuple[str, bool]]) -> dict[str, bool]:
    """Each task of a step -> whether any of its kernels is correct, from (task id, correct) pairs."""
    solved: dict[str, bool] = {}
    for task_id, correct in kernels:
        solved[task_id] = solved.get(task_id, False) or bool(correct)
    return solved


def forgotten_share(solved_before: Mapping[str, bool], solved_now: Mapping[str, bool]) -> float | None:
    """Of this step's tasks that had a correct kernel at their previous draw, the share that has none now; None when
    no task of the step was solved at its previous draw (nothing to forget).

    ``solved_now``: each task of the step -> whether any of its kernels is correct; ``solved_before``: the same at
    each task's previous draw. A policy that stops writing kernels it used to write has collapsed even while its text
    stays fluent (the Not-Okay Ratio and the junk shares saw nothing when our fourth H200 run's kernels stopped
    compiling)."""
    known = [task for task in solved_now if solved_before.get(task, False)]
    if not known:
        return None
    return sum(not solved_now[task] for task in known) / len(known)
