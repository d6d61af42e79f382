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

Batches run at once (a rollout's waves): a key one batch is judging is in flight (``Pending``), and another batch's
identical candidate waits for that verdict instead of judging it a second time (the sixth H200 run judged a kernel
twice in 7 of its 11 groups of four identical correct copies, one judgement a wave, and their timing noise then
scored the copies apart).
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


class Pending:
    """A key one batch is judging now: the verdict it gives, once given (None if the batch gave none)."""

    def __init__(self) -> None:
        self._given = threading.Event()
        self._result: EvalResult | None = None

    def resolve(self, result: EvalResult | None) -> None:
        self._result = result
        self._given.set()

    def wait(self) -> EvalResult | None:
        """The verdict of the batch judging the key, when it has one. Never forever: the judging batch resolves
        every key it claimed before its call returns or raises (``VerdictMemo.release``)."""
        self._given.wait()
        return self._result


class VerdictMemo:
    """The reusable verdicts of one evaluator, by ``verdict_key``, and the keys being judged now; thread-safe, the
    newest ``capacity`` verdicts kept."""

    def __init__(self, capacity: int = 2048):
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity = capacity
        self.hits = 0
        """Verdicts handed to a repeat so far (benchmarks and logs read it)."""
        self._entries: OrderedDict[str, EvalResult] = OrderedDict()
        self._in_flight: dict[str, Pending] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def _hit(self, key: str) -> EvalResult | None:
        """The verdict kept for ``key``, counted as a hit and kept longest; None when there is none. Under the lock."""
        known = self._entries.get(key)
        if known is not None:
            self._entries.move_to_end(key)
            self.hits += 1
        return known

    def get(self, key: str, candidate: Candidate) -> EvalResult | None:
        """The verdict kept for ``key``, as ``candidate``'s; None when there is none."""
        with self._lock:
            known = self._hit(key)
        return None if known is None else reused(known, candidate)

    def claim(self, key: str, candidate: Candidate) -> EvalResult | Pending | None:
        """The verdict kept for ``key`` as ``candidate``'s; else the ``Pending`` of the batch judging ``key`` now
        (wait for it); else None, and ``key`` is in flight for the caller, who must ``put`` its verdict or
        ``release`` it."""
        with self._lock:
            known = self._hit(key)
            if known is None:
                if key not in self._in_flight:
                    self._in_flight[key] = Pending()
                    return None
                return self._in_flight[key]
        return reused(known, candidate)

    def put(self, key: str, result: EvalResult) -> None:
        """Keep ``result`` for ``key`` if it is reusable (the first verdict of a key stays), and hand it to the
        batches waiting for ``key`` (reusable or not: they judge their own candidates again if not)."""
        with self._lock:
            pending = self._in_flight.pop(key, None)
            if not result.reused and reusable(result) and key not in self._entries:
                self._entries[key] = dataclasses.replace(result, warnings=list(result.warnings))
                while len(self._entries) > self.capacity:
                    self._entries.popitem(last=False)
        if pending is not None:
            pending.resolve(result)

    def release(self, key: str) -> None:
        """``key`` will get no verdict from the batch that claimed it (it failed): its waiters judge their own."""
        with self._lock:
            pending = self._in_flight.pop(key, None)
        if pending is not None:
            pending.resolve(None)


__all__ = ["NOT_REUSED_RULES", "Pending", "VerdictMemo", "reusable", "reused", "verdict_key"]
