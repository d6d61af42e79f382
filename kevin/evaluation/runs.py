"""The evaluator's side of a compile job and of a run job: message by message, in a strict order.

A job's process only reports (harness.py). Here every message is checked against what may come next,
raw observations are judged (profiler ops and kernels, the extension call count), each output goes to
the judge, the timing marks are stamped, and the facts are collected for ``verdict.assemble``. Any
message out of order, malformed or missing is the candidate's failure, never the evaluator's.
"""

from __future__ import annotations

import math
import random
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from kevin.evaluation.judge import JudgeClient, JudgeError
from kevin.evaluation.protocol import Received
from kevin.records.evaluation import Status, trim_error
from kevin.evaluation.sandbox import HarnessJob, ProcessEnd
from kevin.evaluation.verdict import (Failure, Overhead, RunFacts, TimingEvidence, classify_kernels, corroborate,
                                      forbidden_ops, kernel_time_problem)

REPORTABLE = {"parse_error": Status.PARSE_ERROR, "rule_violation": Status.RULE_VIOLATION, "compile_error": Status.COMPILE_ERROR,
              "runtime_error": Status.RUNTIME_ERROR, "task_error": Status.RUNTIME_ERROR}
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


def draw_spot_trials(n: int, sources: int, rng: random.Random) -> list[int]:
    """Which of ``n`` timed calls have their outputs checked: one drawn at random among the calls of each timing
    input (call i runs on input ``i % sources``). Drawing two calls from all of them would, one time in
    ``sources``, pick calls of the same input, and an output cached on the first call (the inputs are refreshed
    in place, so their pointers never change) would then pass both checks."""
    return sorted(rng.choice(range(k, n, sources)) for k in range(min(sources, n)))


def reported_failure(message: dict[str, Any]) -> Failure:
    """A harness's own report of a failure (an unknown status counts as a runtime error)."""
    status = REPORTABLE.get(message.get("status"), Status.RUNTIME_ERROR)
    text, error = str(message.get("message", ""))[:2000], trim_error(str(message.get("error", "")))
    if message.get("status") == "task_error":
        text = f"the task could not be evaluated ({text})"
    rule = str(message.get("rule_id", ""))[:60] if status is Status.RULE_VIOLATION else ""
    return Failure(status, text, error, rule)


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
    """What the evaluator expects of one run job, decided before the candidate runs."""

    task: dict[str, str]
    """``{"task_id", "source"}`` (the rendered source) for the judge."""
    trials: list[tuple[int, str]]
    """(seed, input distribution) of each correctness trial."""
    timing_trials: int
    spot_trials: list[int]
    spot_seeds: list[int]
    """Seeds of the timing inputs; timed call i uses ``spot_seeds[i % len(spot_seeds)]``."""
    watched_trial: int
    own_kernels: list[str]
    allowed_ops: list[str]
    backend: str
    timeout_s: float
    overhead: Overhead | None = None
    slack_ms: float = 0.1
    tolerance: float = 0.2
    remeasure: Callable[[], Overhead] | None = None
    """Measures the overhead again, now: a disagreement is only reported if it holds against a fresh
    measurement (the machine's load may have changed since the first one)."""
    timing_attempts: int = 3
    """Timed loops a candidate gets when its times disagree with the evaluator's clock: a burst of other
    work on the machine delays the evaluator's stamps in one loop, a forgery shows in every loop."""


class RunDriver:
    """Drives one run job to its end and collects its facts."""

    def __init__(self, job: HarnessJob, judge: JudgeClient, plan: RunPlan, layers: list[str]):
        self.job, self.judge, self.plan, self.layers = job, judge, plan, layers
        self.facts = RunFacts()
        self.judge_failed = False
        self._kernel_ms: float | None = None
        self._begin: dict[int, int] = {}
        self._end: dict[int, int] = {}
        self._next_mark = ("b", 0)
        self._phase = "ready"
        self._attempts = 0

    def fail(self, failure: Failure) -> None:
        if self.facts.failure is None:
            self.facts.failure = failure

    def violation(self, rule_id: str, message: str) -> None:
        self.fail(Failure(Status.RULE_VIOLATION, message, rule_id=rule_id))

    def run(self, started: bool = False) -> RunFacts:
        """``started``: the job was handed its turn already (its ``ready`` read by the caller)."""
        plan, job = self.plan, self.job
        deadline = time.monotonic() + plan.timeout_s
        if started:
            self._phase = "trials"
        timed_out = finished = False
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
                self.fail(Failure(Status.RUNTIME_ERROR, "the judge failed while checking this candidate", str(exc)))
                job.send({"t": "stop"})
        end = job.end(timed_out=timed_out)
        self.facts.wall_seconds = end.wall_seconds
        if end.timed_out:
            self.facts.failure = Failure(Status.TIMEOUT, f"no verdict within {plan.timeout_s:.0f} s; the process was killed")
        elif end.memory_exceeded or end.processes_exceeded:
            self.facts.failure = ended_without_verdict("the candidate's process", end, self.layers)
        elif self.facts.failure is None and self._phase != "done":
            self.facts.failure = ended_without_verdict("the candidate's process", end, self.layers)
        return self.facts

    # -- messages ----------------------------------------------------------------------------------

    def handle(self, item: Received) -> bool:
        """React to one message; True when the job has nothing more to say."""
        message, kind = item.message, item.message["t"]
        if kind == "ready" and self._phase == "ready":
            self.job.start()
            self._phase = "trials"
        elif kind == "fail":
            self.fail(reported_failure(message))
        elif kind == "report":
            self.facts.warnings.extend(_strings(message.get("warnings")))
            self.facts.times.update(_float_map(message.get("times")))
        elif kind == "done":
            if self.facts.failure is None and self._phase != "finished":
                raise ValueError("the process finished before its timed calls were checked")
            self._phase = "done"
            return True
        elif self.facts.failure is not None:
            return False  # after a failure only the report and the end matter
        elif kind == "trial" and self._phase == "trials":
            self.trial(message)
        elif kind == "timing" and self._phase in ("trials", "again"):
            if self.facts.trials_run != len(self.plan.trials) or int(message.get("trials", -1)) != self.plan.timing_trials:
                raise ValueError("timing started out of turn")
            self._phase = "timing"
            self._begin, self._end, self._next_mark = {}, {}, ("b", 0)
        elif kind in ("b", "e") and self._phase == "timing":
            self.mark(kind, message.get("i"), item.at_ns)
        elif kind == "timed" and self._phase == "timing":
            self.timed(message)
        else:
            raise ValueError(f"unexpected message {kind!r} while {self._phase}")
        return False

    def trial(self, message: dict[str, Any]) -> None:
        plan, facts = self.plan, self.facts
        k = message.get("k")
        if k != facts.trials_run:
            raise ValueError(f"trial {k} reported out of order")
        self.observe(message, watched=k == plan.watched_trial)
        if self.facts.failure is not None:
            self.job.send({"t": "stop"})
            return
        seed, dist = plan.trials[k]
        answer = self.judge.request({"t": "check", "task": plan.task, "seed": seed, "dist": dist, "refs": message.get("refs"),
                                     "folder": str(self.job.cwd), "constant_check": k == 0}, "checked")
        facts.trials_run += 1
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
        profiled = plan.backend == "cpu" or watched
        if profiled:
            if not isinstance(message.get("ops"), list):
                self.violation("torch_compute_runtime", "the forward's PyTorch ops were not reported")
                return
            bad = forbidden_ops(_strings(message["ops"], 500), plan.allowed_ops)
            if bad:
                self.violation("torch_compute_runtime", f"PyTorch compute ran in the forward: {', '.join(bad[:5])}")
                return
        if plan.backend == "cuda" and watched:
            kernels = _strings(message.get("kernels"), 200)
            own, foreign = classify_kernels(kernels, plan.own_kernels)
            if not own:
                self.violation("decoy_kernel", "none of the solution's own CUDA kernels ran in the forward (decoy kernel)")
            elif foreign:
                self.violation("foreign_kernel", f"kernels not from the solution ran in the forward: {foreign[0][:120]}")
            else:
                self._kernel_ms = _number(message.get("kernel_ms", 0.0))

    def mark(self, kind: str, index: Any, at_ns: int) -> None:
        if (kind, index) != self._next_mark:
            raise ValueError(f"timing mark {kind} {index} out of order")
        (self._begin if kind == "b" else self._end)[index] = at_ns
        self._next_mark = ("e", index) if kind == "b" else ("b", index + 1)

    def timed(self, message: dict[str, Any]) -> None:
        plan, facts = self.plan, self.facts
        samples = message.get("samples")
        if not isinstance(samples, list) or len(samples) != plan.timing_trials:
            raise ValueError("the timed calls were not all reported")
        samples = [_number(x) for x in samples]
        spots = message.get("spots")
        if not isinstance(spots, dict) or sorted(spots) != sorted(str(i) for i in plan.spot_trials):
            raise ValueError("the spot-checked outputs were not reported")
        evidence = TimingEvidence(samples, [self._begin.get(i, 0) for i in range(len(samples))],
                                  [self._end.get(i, 0) for i in range(len(samples))])
        if len(self._begin) != len(samples) or len(self._end) != len(samples):
            evidence = TimingEvidence(samples, list(self._begin.values()), list(self._end.values()))
        cycles = plan.backend == "cuda"
        problem = corroborate(evidence, plan.overhead, plan.slack_ms, plan.tolerance, cycles)
        if problem and plan.remeasure is not None and plan.overhead is not None:
            plan.overhead = plan.remeasure()
            problem = corroborate(evidence, plan.overhead, plan.slack_ms, plan.tolerance, cycles)
        if problem and self._attempts < plan.timing_attempts - 1:
            self._attempts += 1
            self.facts.warnings.append(f"timed loop {self._attempts} disagreed with the evaluator's clock ({problem}); "
                                       "timed again")
            self._phase = "again"
            self.job.send({"t": "again"})
            return
        if not problem and plan.backend == "cuda":
            problem = kernel_time_problem(self._kernel_ms, samples, plan.tolerance, plan.slack_ms)
        if problem:
            self.violation("timing_mismatch", f"timing does not match the evaluator's clock: {problem}")
            self.job.send({"t": "stop"})
            return
        for i in plan.spot_trials:
            seed = plan.spot_seeds[i % len(plan.spot_seeds)]
            answer = self.judge.request({"t": "check", "task": plan.task, "seed": seed, "dist": "base", "refs": spots[str(i)],
                                         "folder": str(self.job.cwd), "constant_check": False}, "checked")
            if not answer.get("ok"):
                self.fail(Failure(Status.INCORRECT, f"timed call {i + 1} returned a wrong result (stale or cached output?): "
                                                    f"{answer.get('message', '')}"))
                self.job.send({"t": "stop"})
                return
        facts.runtime_ms = statistics.median(samples)
        facts.runtime_stats = {"median_ms": facts.runtime_ms, "mean_ms": statistics.fmean(samples),
                               "std_ms": statistics.pstdev(samples), "min_ms": min(samples)}
        facts.timed = True
        self._phase = "finished"
        self.job.send({"t": "continue"})
