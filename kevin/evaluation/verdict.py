"""From what the evaluator saw to an EvalResult: small pure functions, no processes.

Correctness comes only from the judge's comparisons (judge.py); a candidate's process can report a
failure of its own (a crash, a rule broken at run time) but never a success. Timing is the candidate's
own measurement, accepted only when the evaluator's clock agrees with it:

- every call's inputs are written into the channel by the judge just before the evaluator stamps and
  answers its begin mark, and its outputs are copied out by the judge when its end mark arrives; the end
  stamp is taken when that copy is done (channel.py, runs.py). Whatever the process does for a call, the
  call's own work included, lies between the two stamps: before them the inputs did not exist, after
  them the outputs were taken;
- the reported time of a call cannot be longer than the time between its stamps, so the reported total
  cannot exceed what the evaluator saw pass;
- the window between the stamps holds the call and a fixed cost (the answer to the begin mark, putting
  the outputs into the channel, the end mark, the judge's copy). The same process measures that cost
  before any candidate code is loaded, with timed calls of an empty forward (``Overhead``). A process that
  reports a call as shorter than it was leaves the difference in the window. Its time is flagged when even the
  best of its calls (a low quantile) exceeds the allowed slack, and each call counts for the score at no less than
  its window allows (``corroborated_ms``): a process that reports only some of its calls as short gains nothing,
  and a busy machine costs an honest kernel speed, not its verdict;
- the allowances still let a process report every call shorter than it ran by up to the slack (0.1 ms on cuda,
  1 ms on cpu: more than many whole kernels take). So the score never uses less than the evaluator's own figure
  of a call (``clock_ms``): the median window less the protocol's typical cost and its spread in the calibration.
  A process cannot shorten its windows (its inputs exist only from the begin stamp, its outputs are taken before
  the end stamp), so work moved out of the reported time, or done after the end mark and before the judge's
  copy, is still counted but for the spread; what an honest kernel can lose to it is the difference between the
  protocol's typical cost while timed and while calibrated, beyond that spread;
- on cuda, the kernel durations the profiler recorded in one correctness call must fit in the reported
  call time.
What remains trusted: the profiler's own records, which the candidate's process produces, and the part of the
protocol's cost that runs in the candidate's process (a process that did its own hand-over faster than the
harness's Python does would gain that difference, some tens of microseconds a call).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from kevin.records.evaluation import EvalResult, Fault, PhaseTimes, Status, TimingFigures, kernel_score


@dataclass
class TimingEvidence:
    """The candidate's timed calls as it reported them and as the evaluator's clock saw them."""

    reported_ms: list[float]
    begin_ns: list[int]
    """Evaluator's stamp of each call's begin (when its begin mark was answered, the inputs in place)."""
    end_ns: list[int]
    """Evaluator's stamp of each call's end (when the judge had copied its outputs out of the channel)."""


@dataclass(frozen=True)
class Overhead:
    """The timing protocol's own cost per call, by the evaluator's clock, with an empty call (ms)."""

    window_ms: float
    """Low quantile (``low``) of (end stamp - begin stamp) - reported time."""
    typical_ms: float
    """Median of the same: what the protocol typically adds to a call's window (``clock_ms``)."""


def window_excess_ms(evidence: TimingEvidence) -> list[float]:
    """For each call: (its end stamp - its begin stamp) - its reported time."""
    return [(e - b) / 1e6 - r for b, e, r in zip(evidence.begin_ns, evidence.end_ns, evidence.reported_ms)]


def low(values: list[float]) -> float:
    """The 10th percentile (nearest rank below): what a cost is when nothing else gets in the way.

    Other work on the machine only ever adds time to a sample, and in bursts; a process that reports its
    calls as shorter than they were adds the difference to every sample. A low quantile keeps the second
    and ignores most of the first, where a median would flag honest kernels on a busy machine."""
    ordered = sorted(values)
    return ordered[int(0.1 * (len(ordered) - 1))] if ordered else 0.0


def measure_overhead(evidence: TimingEvidence) -> Overhead:
    """The ``Overhead`` of a run of the protocol around an empty call."""
    excess = window_excess_ms(evidence)
    return Overhead(low(excess), statistics.median(excess) if excess else 0.0)


def call_extras_ms(evidence: TimingEvidence, overhead: Overhead) -> list[float]:
    """For each call: how much longer it took between its stamps than it reported, less the protocol's cost."""
    return [x - overhead.window_ms for x in window_excess_ms(evidence)]


def corroborated_ms(evidence: TimingEvidence, overhead: Overhead | None, slack_ms: float, tolerance: float) -> list[float]:
    """Each call's time as far as the evaluator's clock vouches for it: the reported time, raised by whatever the
    window held beyond the protocol's cost and the allowance (``slack_ms`` + ``tolerance`` x the call).

    A call reported shorter than it ran counts at (nearly) its real length, so reporting some calls short cannot
    lower the median that scores the kernel; an honest call counts as reported unless the machine delayed its
    stamps beyond the allowance. Without a calibration (``overhead`` None) the reported times stand."""
    if overhead is None:
        return list(evidence.reported_ms)
    return [r + max(0.0, x - slack_ms - tolerance * r) for r, x in zip(evidence.reported_ms, call_extras_ms(evidence, overhead))]


def clock_ms(evidence: TimingEvidence, overhead: Overhead | None) -> float:
    """The median call by the evaluator's clock alone: each call's window less the protocol's typical cost, less the
    protocol's own spread in the calibration (its typical cost less its low quantile); 0 without a calibration.

    No report of the candidate's process enters it, so it is the least a call can be scored at. The spread is the
    allowance that the fixed slack was, measured instead of assumed: on a 2-core cpu machine the protocol's cost
    varied by ~0.1 ms a call (median 0.35 ms), and without this allowance every honest level-1 kernel judged there
    was scored 0.05-0.14 ms slower than it reported (``benchmarks/bench_timing_floor.py``). What a forgery can still
    gain is that spread, measured before its code was loaded."""
    if overhead is None or not evidence.begin_ns:
        return 0.0
    spread = max(0.0, overhead.typical_ms - overhead.window_ms)
    windows = [(e - b) / 1e6 - overhead.typical_ms for b, e in zip(evidence.begin_ns, evidence.end_ns)]
    return max(0.0, statistics.median(windows) - spread)


def corroborate(evidence: TimingEvidence, overhead: Overhead | None, slack_ms: float, tolerance: float) -> str:
    """'' when the reported times agree with the evaluator's clock, else what disagrees.

    ``overhead``: the calibration of the same process (None: only the hard bound is checked).
    """
    n = len(evidence.reported_ms)
    if n == 0:
        return "no timed calls were reported"
    if len(evidence.begin_ns) != n or len(evidence.end_ns) != n:
        return f"{n} timed calls were reported but the evaluator saw {min(len(evidence.begin_ns), len(evidence.end_ns))}"
    if any(not (x >= 0.0) for x in evidence.reported_ms):  # negative or NaN
        return "a reported call time is negative or not a number"
    seen_ms = sum(e - b for b, e in zip(evidence.begin_ns, evidence.end_ns)) / 1e6
    reported = sum(evidence.reported_ms)
    if reported > seen_ms + 0.01 * n:
        return f"the timed calls report {reported:.3f} ms in all, more than the {seen_ms:.3f} ms the evaluator saw pass"
    if overhead is None or n < 3:
        return ""
    median_call = statistics.median(evidence.reported_ms)
    allowance = slack_ms + tolerance * median_call
    extra = low(call_extras_ms(evidence, overhead))
    if extra > allowance:
        return (f"the timed calls report {median_call:.4f} ms each, but each took {extra:.4f} ms more than that between "
                f"its marks by the evaluator's clock (allowed {allowance:.4f} ms)")
    return ""


def kernel_time_problem(kernel_ms: float | None, reported_ms: list[float], tolerance: float, slack_ms: float) -> str:
    """'' unless the profiled kernels of one call took longer than the reported time of a call."""
    if kernel_ms is None or not reported_ms:
        return ""
    median_call = statistics.median(reported_ms)
    if kernel_ms > median_call * (1.0 + 2 * tolerance) + slack_ms:
        return (f"the profiled kernels of one call ran {kernel_ms:.4f} ms, longer than the {median_call:.4f} ms "
                "reported per timed call")
    return ""


def forbidden_ops(ops: list[str], allowed: list[str]) -> list[str]:
    allowed_set = set(allowed)
    return sorted(op for op in ops if op not in allowed_set)


_HARMLESS_KERNEL_WORDS = ("fill", "copy", "memset", "memcpy", "zero")


def classify_kernels(kernel_events: list[str], own_kernels: list[str]) -> tuple[list[str], list[str]]:
    """Split GPU kernel names seen during a forward into (own, foreign) lists.

    Own: the name contains one of the candidate's ``__global__`` names as a function name. Foreign:
    anything else but fills and copies (``torch.zeros``, ``.contiguous()``), e.g. cuBLAS GEMMs or
    PyTorch's elementwise kernels, which mean the compute was not the candidate's.
    """
    import re

    patterns = [re.compile(rf"(?:^|[\s:*&]){re.escape(k)}\s*[<(]") for k in own_kernels if k]
    own, foreign = [], []
    for name in kernel_events:
        if any(p.search(name) for p in patterns):
            own.append(name)
        elif not any(word in name.lower() for word in _HARMLESS_KERNEL_WORDS):
            foreign.append(name)
    return own, foreign


@dataclass
class Failure:
    """The first thing that went wrong, as a status and its texts."""

    status: Status
    message: str = ""
    error: str = ""
    rule_id: str = ""
    fault: Fault = Fault.CANDIDATE
    """Whose failure it is (``EvalResult.fault``): the task's when its reference could not be loaded, timed or laid out."""


@dataclass
class RunFacts:
    """What the evaluator established about one run job (filled by runs.py, read by ``assemble``)."""

    failure: Failure | None = None
    trials_run: int = 0
    trials_passed: int = 0
    max_abs_error: float = 0.0
    max_rel_error: float = 0.0
    runtime_ms: float = 0.0
    timing: TimingFigures = field(default_factory=TimingFigures)
    """How ``runtime_ms`` was established (``EvalResult.timing``)."""
    timed: bool = False
    """All timed calls were reported, corroborated, and their spot-checked outputs were correct."""
    warnings: list[str] = field(default_factory=list)
    times: dict[str, float] = field(default_factory=dict)
    wall_seconds: float = 0.0


def assemble(task_id: str, candidate_id: str, backend: str, facts: RunFacts, baseline_ms: float | None,
             correctness_trials: int, flag_threshold: float, compile_s: float = 0.0, compile_path: str = "") -> EvalResult:
    """The EvalResult of a candidate that compiled: correct only with every trial and the timing established."""
    t = facts.times
    r = EvalResult(task_id=task_id, candidate_id=candidate_id, status=Status.RUNTIME_ERROR, backend=backend, compiled=True,
                   compile_path=compile_path, warnings=list(facts.warnings), trials_run=facts.trials_run,
                   trials_passed=facts.trials_passed, max_abs_error=facts.max_abs_error, max_rel_error=facts.max_rel_error,
                   times=PhaseTimes(setup=t.get("setup", 0.0), compile=compile_s, load=t.get("load", 0.0),
                                    correctness=t.get("correctness", 0.0), profile=t.get("profile", 0.0),
                                    timing=t.get("timing", 0.0), total=facts.wall_seconds))
    if facts.failure is not None:
        r.status, r.rule_id, r.fault = facts.failure.status, facts.failure.rule_id, facts.failure.fault
        r.error = facts.failure.message
        if facts.failure.error and facts.failure.status not in (Status.INCORRECT, Status.RULE_VIOLATION):
            r.error = f"{facts.failure.message}: {facts.failure.error}" if facts.failure.message else facts.failure.error
        return r
    if facts.trials_passed == 0 or facts.trials_run < correctness_trials:
        r.error = "the correctness trials did not complete" if facts.trials_run < correctness_trials else \
            "no trial had a finite reference output"
        return r
    if not facts.timed or facts.runtime_ms <= 0:
        r.error = "the timed calls did not complete"
        return r
    r.status, r.correct = Status.CORRECT, True
    r.runtime_ms, r.timing = facts.runtime_ms, facts.timing
    if baseline_ms:
        against_baseline(r, baseline_ms, flag_threshold)
    return r


def against_baseline(result: EvalResult, baseline_ms: float, flag_threshold: float) -> EvalResult:
    """A correct ``result``'s speedup over ``baseline_ms``, flagged above ``flag_threshold`` (unscored: ``score``)."""
    result.baseline_ms = baseline_ms
    result.speedup = baseline_ms / result.runtime_ms
    result.flagged_speedup = result.speedup > flag_threshold
    return result


def score(result: EvalResult) -> EvalResult:
    """Fill the reward and the feedback line from the status and speedup."""
    from kevin.records.verdicts import feedback_line

    result.score = kernel_score(result.correct, result.speedup, result.status is Status.RULE_VIOLATION)
    result.feedback = feedback_line(result)
    return result
