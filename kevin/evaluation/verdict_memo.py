"""Verdicts of identical candidates, judged once per evaluator (``EvalConfig.reuse_verdicts``).

A rollout judges the same kernel many times: a task's trajectories often write the same answer, and a second turn
often repeats its first. The fifth H200 learning run's first four steps ran 12 to 20 candidates a step through the
run phase, of which at most 3 to 11 were distinct; each run phase holds the GPU alone for about 3 s, so the repeats
were most of a step's serial GPU time. A candidate's verdict depends on the task, its source and the evaluator's
settings, all fixed within one evaluator, and otherwise only on the judge's draws and the timing's noise; so the
first verdict stands for every identical candidate after it.

What the reuse does not change: every candidate still passes the static rules itself (cheap, and they decide
nothing a repeat could change); the expected reward of a repeated answer is what judging it again would give (the
judge's secret draws, e.g. which correctness trial is profiled, are made once for the repeats instead of once
each, so a forgery caught on some draws scores the same on average, never more). What is never reused: a verdict
that says more about the evaluator's moment than about the candidate (a timeout, an evaluator or task failure, a
timing flag the machine's load can raise); identical candidates in that case are judged again. Whose failure a
verdict is comes from ``EvalResult.fault``, set where the failure is made, never from its error text.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import threading
from collections import OrderedDict

from kevin.records.evaluation import Candidate, EvalResult, Fault, PhaseTimes, Status

NOT_REUSED_RULES = frozenset({"timing_mismatch"})
"""Rules the machine's load can trip for an honest kernel (docs/judge.md): a repeat gets a measurement of its own."""


def verdict_key(task_id: str, task_source: str, source: str) -> str:
    """What makes two candidates identical to one evaluator: the task (its id and rendered source) and the
    candidate's source, byte for byte."""
    return hashlib.sha256(json.dumps([task_id, task_source, source]).encode()).hexdigest()


def reusable(result: EvalResult) -> bool:
    """Whether ``result`` speaks for an identical candidate: the candidate's own outcome, not the moment's."""
    if result.status is Status.TIMEOUT or result.rule_id in NOT_REUSED_RULES:
        return False
    return result.fault is Fault.CANDIDATE  # not when the evaluator lost it or the task's own reference failed


def reused(result: EvalResult, candidate: Candidate) -> EvalResult:
    """``result`` as the verdict of the identical ``candidate``: its own id, no time spent, marked ``reused``."""
    return dataclasses.replace(result, candidate_id=candidate.key, warnings=list(result.warnings), times=PhaseTimes(),
                               reused=True)


class VerdictMemo:
    """The reusable verdicts of one evaluator, by ``verdict_key``; thread-safe, the newest ``capacity`` kept."""

    def __init__(self, capacity: int = 2048):
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity = capacity
        self.hits = 0
        """Verdicts handed to a repeat so far (benchmarks and logs read it)."""
        self._entries: OrderedDict[str, EvalResult] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def get(self, key: str, candidate: Candidate) -> EvalResult | None:
        """The verdict kept for ``key``, as ``candidate``'s; None when there is none."""
        with self._lock:
            known = self._entries.get(key)
            if known is None:
                return None
            self._entries.move_to_end(key)
            self.hits += 1
        return reused(known, candidate)

    def put(self, key: str, result: EvalResult) -> None:
        """Keep ``result`` for ``key`` if it is reusable (the first verdict of a key stays)."""
        if result.reused or not reusable(result):
            return
        with self._lock:
            if key in self._entries:
                return
            self._entries[key] = dataclasses.replace(result, warnings=list(result.warnings))
            while len(self._entries) > self.capacity:
                self._entries.popitem(last=False)


__all__ = ["NOT_REUSED_RULES", "VerdictMemo", "reusable", "reused", "verdict_key"]
