"""Evaluation records: one candidate in, one EvalResult out (the evaluator's input and verdict).

They live in the records layer, below the evaluator and every stage that reads verdicts, so the rollout,
rewards and training import them without importing the evaluator. Records hold plain data (strings,
numbers, enums) so they serialise to JSON and cross process boundaries; exceptions are turned into
trimmed error text at the point they are caught.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
from dataclasses import dataclass, field
from typing import Any, Callable


class Status(str, enum.Enum):
    """Outcome of evaluating one candidate, in the order the phases can fail."""

    PARSE_ERROR = "parse_error"
    RULE_VIOLATION = "rule_violation"
    COMPILE_ERROR = "compile_error"
    RUNTIME_ERROR = "runtime_error"
    INCORRECT = "incorrect"
    CORRECT = "correct"
    TIMEOUT = "timeout"


class Fault(str, enum.Enum):
    """Whose doing a verdict records: the candidate's, or a failure around it that says nothing about it."""

    CANDIDATE = "candidate"
    """The candidate's own outcome, whatever its status (every verdict but the two below)."""
    EVALUATOR = "evaluator"
    """The evaluator lost the candidate (a worker died, a phase raised): its error reads ``evaluator: ...``."""
    TASK = "task"
    """The task's own reference could not be loaded, timed or laid out: its error ends in ``task: ...``."""


@dataclass(frozen=True)
class Candidate:
    """One kernel to evaluate: a solution source for a task, with its place in a rollout."""

    task_id: str
    source: str
    trajectory: int = 0
    turn: int = 0
    candidate_id: str = ""

    @property
    def key(self) -> str:
        """Stable id: the explicit one, else a content hash of task and source."""
        if self.candidate_id:
            return self.candidate_id
        digest = hashlib.sha256(f"{self.task_id}\0{self.source}".encode()).hexdigest()[:16]
        return f"{self.task_id}:{digest}"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class PhaseTimes:
    """Wall seconds spent in each phase of one evaluation (0 when the phase did not run)."""

    static: float = 0.0
    setup: float = 0.0
    """In the run process: importing torch, creating the CUDA context, starting the profiler."""
    compile: float = 0.0
    load: float = 0.0
    correctness: float = 0.0
    profile: float = 0.0
    timing: float = 0.0
    total: float = 0.0


@dataclass
class TimingFigures:
    """How a correct candidate's time a call was established, in ms (all 0 when it was not timed). The score is
    built on ``EvalResult.runtime_ms``, the larger of ``vouched_ms`` and ``clock_ms`` (docs/judge.md): the figures
    say how far the candidate's own report was trusted, and how much the evaluator's clock added."""

    reported_ms: float = 0.0
    """Median of the timed calls as the candidate's process reported them (its CUDA events or its clock)."""
    vouched_ms: float = 0.0
    """Median of the same calls as far as the evaluator's stamps vouch for them (a report shorter than the stamps
    allow is raised)."""
    clock_ms: float = 0.0
    """The median call by the evaluator's clock alone, less the protocol's own cost: the least a call is scored at."""
    mean_ms: float = 0.0
    """Mean of the vouched calls."""
    std_ms: float = 0.0
    """Population standard deviation of the vouched calls: the timing noise the speedup carries."""
    min_ms: float = 0.0
    """Fastest vouched call."""
    loops: int = 0
    """Timed loops run: more than 1 when the evaluator's clock disagreed with a loop and it was timed again."""


@dataclass
class EvalResult:
    """The verdict on one candidate. ``score`` is the RL reward (docs/recipe.md §3)."""

    task_id: str
    candidate_id: str
    status: Status
    backend: str = "cpu"
    rule_id: str = ""
    compiled: bool = False
    correct: bool = False
    runtime_ms: float = 0.0
    baseline_ms: float = 0.0
    speedup: float = 0.0
    score: float = 0.0
    max_abs_error: float = 0.0
    max_rel_error: float = 0.0
    trials_passed: int = 0
    trials_run: int = 0
    flagged_speedup: bool = False
    threads: int = 0
    """cpu backend: the CPU threads both the candidate (OpenMP) and the PyTorch eager baseline ran with; 0 on cuda."""
    compile_path: str = ""
    """cuda: "lite" (narrow torch header) or "full-fallback" (the stock header decided); "" otherwise."""
    feedback: str = ""
    error: str = ""
    fault: Fault = Fault.CANDIDATE
    """Whose failure this verdict is: only the candidate's own verdict speaks for an identical candidate
    (``verdict_memo.reusable``); the error text says the same to a reader and is never parsed for it."""
    warnings: list[str] = field(default_factory=list)
    times: PhaseTimes = field(default_factory=PhaseTimes)
    timing: TimingFigures = field(default_factory=TimingFigures)
    """How ``runtime_ms`` was established (a correct candidate's; zeros otherwise)."""
    reused: bool = False
    """The verdict of an identical candidate (same task, same source) this evaluator judged before: no compile or
    run process was spent on this one (``EvalConfig.reuse_verdicts``)."""

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["status"] = self.status.value
        data["fault"] = self.fault.value
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "EvalResult":
        data = dict(data)
        data["status"] = Status(data["status"])
        # A record written before the field existed loads as the candidate's (the default): only verdicts judged in
        # this process are ever reused, so a record read back decides no reuse.
        data["fault"] = Fault(data.get("fault", Fault.CANDIDATE.value))
        data["times"] = PhaseTimes(**data.get("times", {}))
        data["timing"] = TimingFigures(**data.get("timing", {}))  # records written before it existed: zeros
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


ProgressFn = Callable[[EvalResult], None]
"""Called with each verdict as it comes (in completion order); the one-machine and the cluster evaluator take the
same callback, so it is typed here, below both."""


def kernel_score(correct: bool, speedup: float, rule_violation: bool = False) -> float:
    """Kevin's kernel score: 0.3 * 1{correct} + speedup * 1{correct}; 0 on any rule violation."""
    if rule_violation or not correct:
        return 0.0
    return 0.3 + speedup


ERROR_TEXT_LIMIT = 4000


def trim_error(text: str, limit: int = ERROR_TEXT_LIMIT) -> str:
    """Keep error text readable and bounded: the head (first errors) and the tail (the summary)."""
    text = text.strip()
    if len(text) <= limit:
        return text
    head = limit * 3 // 4
    tail = limit - head - 40
    return f"{text[:head]}\n... [{len(text) - head - tail} characters cut] ...\n{text[-tail:]}"
