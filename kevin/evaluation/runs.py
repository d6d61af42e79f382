"""The evaluator's side of a compile job and of a run job: message by message, in a strict order.

A job's process only reports (harness.py). Here every message is checked against what may come next,
raw observations are judged (profiler ops and kernels, the extension call count), each output goes to
the judge, the timing marks are stamped, and the facts are collected for ``verdict.assemble``. Any
message out of order, malformed or missing is the candidate's failure, never the evaluator's.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

from kevin.evaluation.judge import JudgeClient, JudgeError
from kevin.evaluation.protocol import Received
from kevin.records.evaluation import Fault, Status, TimingFigures, trim_error
from kevin.evaluation.sandbox import HarnessJob, ProcessEnd
from kevin.evaluation.verdict import (Failure, Overhead, RunFacts, TimingEvidence, classify_kernels, corroborate,
                                      forbidden_ops, kernel_time_problem, measure_overhead, corroborated_ms, clock_ms)
from kevin.records.target import KernelTarget

REPORTABLE = {"parse_error": Status.PARSE_ERROR, "rule_violation": Status.RULE_VIOLATION, "compile_error": Status.COMPILE_ERROR,
              "runtime_error": Status.RUNTIME_ERROR, "task_error": Status.RUNTIME_ERROR, "incorrect": Status.INCORRECT}
"""What a harness may report about itself: failures only (success is established here, never claimed)."""
_GRACE_S = 5.0


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError("not a finite number")
    return float(value)


def _float_map(value: Any) -> dict[str, float]:
    if not isinstance(value, dict):
        return {}
    out = {}
    for k, v in list(value.items())[:32]:
        try:
            out[str(k)[:40]] = _number(v)
        except ValueError:
            continue
    return out


def _strings(value: Any, limit: int = 50) -> list[str]:
    if not isinstance(value, list):
        return []
    return [str(v)[:500] for v in value[:limit] if isinstance(v, str)]


def reported_failure(message: dict[str, Any]) -> Failure:
    """A harness's own report of a failure (an unknown status counts as a runtime error)."""
    status = REPORTABLE.get(message.get("status"), Status.RUNTIME_ERROR)
    text, error = str(message.get("message", ""))[:2000], trim_error(str(message.get("error", "")))
    fault = Fault.CANDIDATE
    if message.get("status") == "task_error":
        text, fault = f"the task could not be evaluated ({text})", Fault.TASK
    rule = str(message.get("rule_id", ""))[:60] if status is Status.RULE_VIOLATION else ""
    return Failure(status, text, error, rule, fault)


def ended_without_verdict(what: str, end: ProcessEnd, layers: list[str]) -> Failure:
    """A process that stopped reporting: why it ended, the tail of its stderr, the isolation in force."""
    if end.timed_out:
        return Failure(Status.TIMEOUT, f"{what} did not finish within its time limit; the process was killed")
    if end.memory_exceeded:
        return Failure(Status.RUNTIME_ERROR, f"{what} exceeded its memory limit and was killed")
    if end.processes_exceeded:
        return Failure(Status.RUNTIME_ERROR, f"{what} started too many processes and was killed")
    detail = f"{what} ended without finishing ({end.describe()})"
    if layers:
        detail += f"; isolation in force: {', '.join(layers)}"
    return Failure(Status.RUNTIME_ERROR, detail, stderr_digest(end.stderr_tail))


def stderr_digest(text: str, limit: int = 1500) -> str:
    """The end of a process's stderr without the profiler's own chatter (torch's CPU profiler logs a line at
    every start and stop), which would crowd out the error a policy needs to read."""
    lines = [line for line in text.splitlines() if "USDT:" not in line and "ActivityProfilerHandler" not in line]
    return "\n".join(lines).strip()[-limit:]


# --------------------------------------------------------------------------------------------- compile


@dataclass
class CompileFacts:
    """What a compile job established."""

    failure: Failure | None = None
    built: list[dict[str, Any]] = field(default_factory=list)
    compile_s: float = 0.0
    warnings: list[str] = field(default_factory=list)
    end: ProcessEnd | None = None


def drive_compile(job: HarnessJob, timeout_s: float, layers: list[str]) -> CompileFacts:
    facts = CompileFacts()
    deadline = time.monotonic() + timeout_s
    done = timed_out = False
    while not done:
        item = job.next(deadline)
        if item is None:
            timed_out = not job.limit_hit
            break
        message = item.message
        if message is None:
            if item.error != "closed":
                facts.failure = facts.failure or Failure(Status.RUNTIME_ERROR, f"the compile process sent {item.error}")
            break
        kind = message["t"]
        if kind == "built" and isinstance(message.get("dir"), str):
            facts.built.append({"name": str(message.get("name", "")), "dir": message["dir"], "path": str(message.get("path", ""))})
        elif kind == "times":
            facts.compile_s = _float_map(message).get("compile", facts.compile_s)
        elif kind == "notes":
            facts.warnings.extend(_strings(message.get("warnings")))
        elif kind == "fail":
            facts.failure = facts.failure or reported_failure(message)
        elif kind == "done":
            done = True
    facts.end = job.end(timed_out=timed_out)
    if facts.end.timed_out:
        facts.failure = Failure(Status.TIMEOUT, f"compilation did not finish within {timeout_s:.0f} s; the process was killed")
    elif facts.failure is None and not done:
        facts.failure = ended_without_verdict("the compile process", facts.end, layers)
    return facts


# ------------------------------------------------------------------------------------------------- run


@dataclass
class RunPlan:
    """What the evaluator expects of one run job, decided before the candidate runs. Nothing here is sent to the
    candidate's process: its seeds and which timed calls are compared live in the judge alone."""

    task: dict[str, str]
    """``{"task_id", "source"}`` (the rendered source) for the judge."""
    trials: list[str]
    """The input distribution of each correctness trial."""
    timing_trials: int
    watched_trial: int
    """The correctness trial whose GPU kernels are profiled on cuda (told to the process at that trial's begin)."""
    own_kernels: list[str]
    allowed_ops: list[str]
    backend: str
    timeout_s: float
    layout: dict[str, Any] = field(default_factory=dict)
    """The channel's layout (channel.Layout), from the judge's own run of the task."""
    timed_checks: int = 4
    """Timed calls the judge compares, drawn by reservoir sampling in the judge."""
    calibration_calls: int = 30
    slack_ms: float = 0.1
    tolerance: float = 0.2
    timing_attempts: int = 3
    """Timed loops a candidate gets when its times disagree with the evaluator's clock: a burst of other
    work on the machine delays the evaluator's stamps in one loop, a forgery shows in every loop: a loop that agrees
    is enough."""


@dataclass(frozen=True)
class TimedLoop:
    """One timed loop that agreed with the evaluator's clock: what the run scores if it is the fastest."""

    scored_ms: float
    """The median call as scored: the larger of the corroborated median and ``clock_ms``."""
    vouched_ms: list[float]
    """Each call's time as far as the evaluator's clock vouches for it (verdict.corroborated_ms)."""
    reported_ms: list[float]
    """Each call's time as the candidate's process reported it."""
    clock_ms: float
    """The median call by the evaluator's clock alone (verdict.clock_ms)."""


class RunDriver:
    """Drives one run job to its end and collects its facts.

    Every call of the job, from the calibration to the last timed call, goes the same way: the process sends its
    begin mark; the judge writes the call's inputs into the channel (not in the calibration); the evaluator stamps
    the begin and answers; the process calls, puts the outputs into the channel and sends its end mark; the judge
    copies the outputs out, and the evaluator stamps the end when that copy is done. So the evaluator's window of a
    call holds everything the process did for it, and the outputs compared are those the channel held at its end.
    """

    def __init__(self, job: HarnessJob, judge: JudgeClient, plan: RunPlan, layers: list[str]):
        self.job, self.judge, self.plan, self.layers = job, judge, plan, layers
        self.facts = RunFacts()
        self.judge_failed = False
        self.overhead: Overhead | None = None
        self._kernel_ms: float | None = None
        self._begin: dict[int, int] = {}
        self._end: dict[int, int] = {}
        self._next_mark = ("b", 0)
        self._phase = "ready"
        self._attempts = 0
        self._attached = False
        self._best: TimedLoop | None = None  # the agreeing timed loop that scored fastest

    def fail(self, failure: Failure) -> None:
        if self.facts.failure is None:
            self.facts.failure = failure

    def violation(self, rule_id: str, message: str) -> None:
        self.fail(Failure(Status.RULE_VIOLATION, message, rule_id=rule_id))

    def run(self) -> RunFacts:
        plan, job = self.plan, self.job
        deadline = time.monotonic() + plan.timeout_s
        timed_out = finished = False
        try:
            while not finished:
                limit = deadline if self.facts.failure is None else min(deadline, time.monotonic() + _GRACE_S)
                item = job.next(limit)
                if item is None:
                    timed_out = self.facts.failure is None and not job.limit_hit
                    break
                if item.message is None:
                    if item.error != "closed":
                        self.fail(Failure(Status.RUNTIME_ERROR, f"the candidate's process sent {item.error}"))
                    break
                try:
                    finished = self.handle(item)
                except (ValueError, TypeError, KeyError) as exc:
                    self.fail(Failure(Status.RUNTIME_ERROR, f"the candidate's process broke the evaluation protocol: {exc}"))
                    job.send({"t": "stop"})
                except JudgeError as exc:
                    self.judge_failed = True
                    # The judge is the evaluator's: its failure says nothing of the candidate, and the verdict must
                    # not be remembered as the candidate's (verdict_memo reuses only Fault.CANDIDATE).
                    self.fail(Failure(Status.RUNTIME_ERROR, "evaluator: the judge failed while checking this candidate",
                                      trim_error(str(exc)), fault=Fault.EVALUATOR))
                    job.send({"t": "stop"})
        finally:
            self.detach()
        end = job.end(timed_out=timed_out)
        self.facts.wall_seconds = end.wall_seconds
        if end.timed_out:
            self.facts.failure = Failure(Status.TIMEOUT, f"no verdict within {plan.timeout_s:.0f} s; the process was killed")
        elif end.memory_exceeded or end.processes_exceeded:
            self.facts.failure = ended_without_verdict("the candidate's process", end, self.layers)
        elif self.facts.failure is None and self._phase != "done":
            self.facts.failure = ended_without_verdict("the candidate's process", end, self.layers)
        return self.facts

    def detach(self) -> None:
        if self._attached and not self.judge_failed:
            self._attached = False
            try:
                self.judge.request({"t": "detach"}, "detached")
            except JudgeError:
                self.judge_failed = True

    # -- messages ----------------------------------------------------------------------------------

    def handle(self, item: Received) -> bool:
        """React to one message; True when the job has nothing more to say."""
        message, kind, phase = item.message, item.message["t"], self._phase
        if kind == "ready" and phase == "ready":
            self.job.start({"layout": self.plan.layout})
            self._phase = "channel"
        elif kind == "fail":
            self.fail(reported_failure(message))
        elif kind == "report":
            self.facts.warnings.extend(_strings(message.get("warnings")))
            self.facts.times.update(_float_map(message.get("times")))
        elif kind == "done":
            if self.facts.failure is None and phase != "finished":
                raise ValueError("the process finished before its timed calls were checked")
            self._phase = "done"
            return True
        elif self.facts.failure is not None:
            return False  # after a failure only the report and the end matter
        elif kind == "channel" and phase == "channel":
            self.attach(message)
        elif kind == "calibrate" and phase == "calibration":
            if message.get("trials") != self.plan.calibration_calls:
                raise ValueError("calibration started out of turn")
            self._loop("calibrating")
        elif kind == "calibrated" and phase == "calibrating":
            self.calibrated(message)
        elif kind == "b" and phase in ("trials", "calibrating", "timing"):
            self.begin(message.get("i"))
        elif kind == "e" and phase in ("trials", "calibrating", "timing"):
            self.end(message)
        elif kind == "timing" and phase in ("trials", "again"):
            if self.facts.trials_run != len(self.plan.trials) or int(message.get("trials", -1)) != self.plan.timing_trials:
                raise ValueError("timing started out of turn")
            self._loop("timing")
        elif kind == "timed" and phase == "timing":
            self.timed(message)
        else:
            raise ValueError(f"unexpected message {kind!r} while {phase}")
        return False

    def _loop(self, phase: str) -> None:
        self._phase = phase
        self._begin, self._end, self._next_mark = {}, {}, ("b", 0)

    def attach(self, message: dict[str, Any]) -> None:
        """The judge maps the job's channel (its process has run no candidate code yet)."""
        describe = {k: v for k, v in message.items() if k != "t"}
        self.judge.request({"t": "attach", "task": self.plan.task, "layout": self.plan.layout, "channel": describe,
                            "folder": str(self.job.cwd), "checks": self.plan.timed_checks}, "attached")
        self._attached = True
        self.job.send({"t": "attached"})
        self._loop("calibration")

    def begin(self, index: Any) -> None:
        """A call may begin: its inputs go into the channel first (from the judge's secret seed), then its begin is
        stamped and answered."""
        phase = self._phase
        if phase == "trials":
            if not isinstance(index, int) or index != self.facts.trials_run or index >= len(self.plan.trials) \
                    or self._next_mark != ("b", index):
                raise ValueError(f"trial {index} began out of order")
            self.judge.call({"t": "prepare", "dist": self.plan.trials[index]}, "prepared")
            self._next_mark = ("e", index)
            self.job.send({"t": "ack", "k": "b", "i": index, "profile": index == self.plan.watched_trial})
            return
        self._mark("b", index)
        limit = self.plan.calibration_calls if phase == "calibrating" else self.plan.timing_trials
        if index >= limit:
            raise ValueError("more timed calls than asked for")
        # The calibration writes inputs and flushes the cache too: on cuda the judge's GPU work before a call (the
        # context switch, a cold cache for the hand-over copy) costs 0.05-0.1 ms that an honest call then shows in its
        # window (seen on an H200 when only the timed calls did it).
        self.judge.call({"t": "prepare", "dist": "base"}, "prepared")
        self._begin[index] = time.monotonic_ns()
        self.job.send({"t": "ack", "k": "b", "i": index})

    def end(self, message: dict[str, Any]) -> None:
        index, phase = message.get("i"), self._phase
        if phase == "trials":
            self.trial_end(message)
            return
        self._mark("e", index)
        at, _ = self.judge.call({"t": "capture", "mode": "sample" if phase == "timing" else "none"}, "captured")
        self._end[index] = at

    def _mark(self, kind: str, index: Any) -> None:
        if (kind, index) != self._next_mark or not isinstance(index, int):
            raise ValueError(f"timing mark {kind} {index} out of order")
        self._next_mark = ("e", index) if kind == "b" else ("b", index + 1)

    def calibrated(self, message: dict[str, Any]) -> None:
        evidence = self._evidence(message, self.plan.calibration_calls)
        self.overhead = measure_overhead(evidence)
        self._phase = "trials"
        self._next_mark = ("b", 0)
        self.job.send({"t": "continue"})

    def _evidence(self, message: dict[str, Any], n: int) -> TimingEvidence:
        samples = message.get("samples")
        if not isinstance(samples, list) or len(samples) != n or len(self._begin) != n or len(self._end) != n:
            raise ValueError("the timed calls were not all reported")
        return TimingEvidence([_number(x) for x in samples], [self._begin[i] for i in range(n)], [self._end[i] for i in range(n)])

    def trial_end(self, message: dict[str, Any]) -> None:
        plan, facts = self.plan, self.facts
        k = message.get("i")
        if self._next_mark != ("e", k):
            raise ValueError(f"trial {k} ended out of order")
        self._next_mark = ("b", k + 1)
        answer = self.judge.request({"t": "capture", "mode": "check", "constant_check": k == 0, "input_check": True}, "checked")
        self.observe(message, watched=k == plan.watched_trial)
        if self.facts.failure is not None:
            self.job.send({"t": "stop"})
            return
        dist = plan.trials[k]
        facts.trials_run += 1
        if answer.get("input_mutation"):
            self.violation("input_mutation", "the forward modified its inputs in place")
            self.job.send({"t": "stop"})
            return
        if answer.get("nearly_constant"):
            facts.warnings.append("reference output is nearly constant: this task cannot tell a constant answer from a kernel")
        if not answer.get("ref_finite", True):
            facts.warnings.append(f"trial {k}: reference output not finite under the {dist} distribution; trial skipped")
        elif answer.get("ok"):
            facts.trials_passed += 1
            facts.max_abs_error = max(facts.max_abs_error, _number(answer.get("max_abs", 0.0)))
            facts.max_rel_error = max(facts.max_rel_error, float(answer.get("max_rel", 0.0)))
        else:
            facts.max_abs_error = max(facts.max_abs_error, float(answer.get("max_abs", 0.0)))
            self.fail(Failure(Status.INCORRECT, f"trial {k + 1} ({dist} inputs): {answer.get('message', '')}"))
            self.job.send({"t": "stop"})
            return
        self.job.send({"t": "continue"})

    def observe(self, message: dict[str, Any], watched: bool) -> None:
        """Judge the raw observations a trial reports: PyTorch ops, GPU kernels, extension calls."""
        plan = self.plan
        if not isinstance(message.get("ext_calls"), int) or message["ext_calls"] < 1:
            self.violation("decoy_kernel", "the forward never called the compiled extension")
            return
        gpu = KernelTarget.parse(plan.backend).is_gpu
        profiled = not gpu or watched
        if profiled:
            # The hand-over (checking the outputs, putting them into the channel) runs in the candidate's process
            # too: compute moved there, after a forward that returned an uncomputed copy, is PyTorch's all the same.
            for key, unreported, where in (("ops", "the forward's PyTorch ops were not reported", "in the forward"),
                                           ("handover_ops", "the PyTorch ops of the outputs' hand-over were not reported",
                                            "while the forward's outputs were handed over")):
                if not isinstance(message.get(key), list):
                    self.violation("torch_compute_runtime", unreported)
                    return
                bad = forbidden_ops(_strings(message[key], 500), plan.allowed_ops)
                if bad:
                    self.violation("torch_compute_runtime", f"PyTorch compute ran {where}: {', '.join(bad[:5])}")
                    return
        if gpu and watched:
            kernels = _strings(message.get("kernels"), 200)
            own, foreign = classify_kernels(kernels, plan.own_kernels)
            _, late = classify_kernels(_strings(message.get("handover_kernels"), 200), [])
            if not own:
                self.violation("decoy_kernel", "none of the solution's own CUDA kernels ran in the forward (decoy kernel)")
            elif foreign:
                self.violation("foreign_kernel", f"kernels not from the solution ran in the forward: {foreign[0][:120]}")
            elif late:
                self.violation("foreign_kernel", f"kernels ran while the forward's outputs were handed over: {late[0][:120]}")
            else:
                self._kernel_ms = _number(message.get("kernel_ms", 0.0))

    def timed(self, message: dict[str, Any]) -> None:
        """All timed calls ended: the judge compares the calls it drew, then the times are corroborated."""
        plan, facts = self.plan, self.facts
        evidence = self._evidence(message, plan.timing_trials)
        samples = evidence.reported_ms
        answer = self.judge.request({"t": "verify"}, "checked")
        if not answer.get("ok"):
            call = answer.get("call")
            which = f"timed call {call + 1}" if isinstance(call, int) else "a timed call"
            self.fail(Failure(Status.INCORRECT, f"{which} returned a wrong result (work outside its timed window, a "
                                                f"stale or cached output?): {answer.get('message', '')}"))
            self.job.send({"t": "stop"})
            return
        problem = corroborate(evidence, self.overhead, plan.slack_ms, plan.tolerance)
        vouched = corroborated_ms(evidence, self.overhead, plan.slack_ms, plan.tolerance)
        # The evaluator's own figure is the floor: the allowances above cannot be spent on reporting calls short.
        clock = clock_ms(evidence, self.overhead)
        scored = max(statistics.median(vouched), clock)
        if not problem and (self._best is None or scored < self._best.scored_ms):
            self._best = TimedLoop(scored, vouched, samples, clock)
        slowed = statistics.median(vouched) - statistics.median(samples)
        if (problem or slowed > 0) and self._attempts < plan.timing_attempts - 1:
            # Not calibrated again here: the candidate's code is loaded by now, and a patch of the hand-over would
            # stretch the calibration's empty calls as much as its own (a changed load is met by a fresh process:
            # Evaluator.run_phase).
            self._attempts += 1
            why = problem or f"its stamps held the median call {slowed:.4f} ms longer than reported"
            self.facts.warnings.append(f"timed loop {self._attempts} disagreed with the evaluator's clock ({why}); "
                                       "timed again")
            self._phase = "again"
            self.job.send({"t": "again"})
            return
        if self._best is not None:  # a loop that agreed is scored (a later one timed again may have disagreed)
            problem = ""
            scored, vouched, samples, clock = (self._best.scored_ms, self._best.vouched_ms, self._best.reported_ms,
                                               self._best.clock_ms)
        if not problem and KernelTarget.parse(plan.backend).is_gpu:
            problem = kernel_time_problem(self._kernel_ms, samples, plan.tolerance, plan.slack_ms)
        if problem:
            self.violation("timing_mismatch", f"timing does not match the evaluator's clock: {problem}")
            self.job.send({"t": "stop"})
            return
        facts.runtime_ms = scored
        slowed = facts.runtime_ms - statistics.median(samples)
        if slowed > 0:
            facts.warnings.append(f"scored at {facts.runtime_ms:.4f} ms a call, {slowed:.4f} ms more than the reported "
                                  "median: the evaluator's clock did not vouch for the rest")
        facts.timing = TimingFigures(reported_ms=statistics.median(samples), vouched_ms=statistics.median(vouched),
                                     clock_ms=clock, mean_ms=statistics.fmean(vouched),
                                     std_ms=statistics.pstdev(vouched), min_ms=min(vouched), loops=self._attempts + 1)
        facts.timed = True
        self._phase = "finished"
        self.job.send({"t": "continue"})
