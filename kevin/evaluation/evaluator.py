"""The evaluator: static rules here, compile and run in sandboxed processes, the verdict in the judge.

For one candidate:
1. static rules on its text (this process);
2. a compile job builds its extensions into the job's own staging folder (no candidate library is
   loaded there); this process then reads the libraries' symbol tables and the exact sources that were
   compiled (symbols.py, rules.py) and moves the folder into the cache under a hash it computed from the
   solution's source. Candidates only ever read the cache;
3. a run job imports the solution (its libraries from the cache), runs it on each trial's inputs and on
   the timed calls, and hands its raw outputs to the judge of its device (judge.py), which compares them
   with the reference; the timing is checked against this process's clock (verdict.py);
4. the verdict is assembled here from what the judge established.

``evaluate`` judges one candidate; ``evaluate_many`` judges a batch: compiles on a pool of CPU workers,
run jobs on every device (one at a time per device, a fresh process each, started ahead of their turn
on cuda), results in input order.

The evaluator holds the phases and the judges; the parts it leans on live beside it: the machine it runs on
(hardware.py), the baseline cache (baselines.py), the compile cache and what may enter it (compile_cache.py),
and the batch scheduler (batch.py, which reaches the evaluator only through ``batch.BatchHost``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import secrets
import sys
import threading
import time
from typing import Any, Callable, Iterable

from kevin.evaluation.baselines import BaselineCache, baseline_key as task_baseline_key, reference_times
from kevin.evaluation.batch import Batch, CompileSlots, Started, compile_priority
from kevin.evaluation.builder import load_link_baseline, prepare_headers, prepare_link
from kevin.evaluation.candidates import solution_text_problem
from kevin.evaluation.compile_cache import CompileCache, Compiled
from kevin.evaluation.config import EvalConfig
from kevin.evaluation.hardware import default_compile_workers, machine
from kevin.evaluation.inputs import DISTRIBUTIONS
from kevin.evaluation.isolation import protect_process
from kevin.evaluation.judge import JudgeClient, JudgeError
from kevin.evaluation.rules import load_rules, static_hits
from kevin.evaluation.runs import RunDriver, RunPlan, drive_compile
from kevin.evaluation.sandbox import HarnessJob, child_env
from kevin.evaluation.toolchain import BUILDER_VERSION, Toolchain
from kevin.evaluation.verdict import Failure, RunFacts, against_baseline, assemble, score
from kevin.evaluation.verdict_memo import VerdictMemo, verdict_key
from kevin.records.evaluation import Candidate, EvalResult, Fault, ProgressFn, Status
from kevin.records.verdicts import parse_error_verdict, rule_violation_verdict
from kevin.tasks.task import Task

_log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------------- evaluator


class Evaluator:
    """Judges candidates for tasks under one EvalConfig. Thread-safe; ``close()`` ends its judges."""

    def __init__(self, config: EvalConfig | None = None):
        self.config = config or EvalConfig()
        self.rules = load_rules(self.config.rules)
        self.cache_dir = self.config.resolved_cache_dir
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        self.baselines = BaselineCache(self.cache_dir / "baselines.json")
        self.compile_cache = CompileCache(self.cache_dir / "ext")
        self.verdicts = VerdictMemo()  # consulted only under config.reuse_verdicts
        self._lock = threading.Lock()
        self._toolchain: Toolchain | None = None
        self._link_baseline = None  # builder.load_link_baseline: what every library of the toolchain holds
        self._judges: dict[str, JudgeClient] = {}
        self._judge_locks: dict[str, threading.Lock] = {}
        self._layouts: dict[tuple[str, str, str], dict[str, Any]] = {}
        self._rendered_tasks: dict[tuple[str, str], str] = {}  # _rendered: (task source, profile) -> rendered source
        self._protected = False
        self._switch_interval: float | None = None  # Python's own, while ours is in force (config.switch_interval_s)
        self.gpu_names, self.arch, self.hardware = machine(self.config.backend)
        cores = self.config.cpu_cores or os.cpu_count() or 2
        workers = self.config.compile_workers or default_compile_workers(len(self.devices()), cores)
        self.compile_slots = CompileSlots(workers, cores, self.config.compile_jobs)
        # On cpu a run process started ahead would take cores from the one being timed.
        self.prestart = self.config.prestart_runs if self.config.target.prestarts_runs else 0
        # The last batch's timeline (monotonic clock), for benchmarks: when each run and each compile went on.
        self.run_intervals: list[tuple[str, float, float]] = []
        self.compile_intervals: list[tuple[float, float]] = []

    # -- lifecycle ---------------------------------------------------------------------------------

    def close(self) -> None:
        """End the judge processes (a later call starts them again)."""
        with self._lock:
            judges, self._judges = list(self._judges.values()), {}
            previous, self._switch_interval = self._switch_interval, None
        for judge in judges:
            judge.close()
        if previous is not None and abs(sys.getswitchinterval() - self.config.switch_interval_s) < 1e-6:
            sys.setswitchinterval(previous)  # unless someone set another since (Python keeps whole microseconds)

    def __enter__(self) -> "Evaluator":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown
            pass

    def _protect(self) -> None:
        """Before the first candidate process: this process is made non-dumpable (isolation.protect_process)."""
        if not self._protected:
            self._protected = True
            if self.config.sandbox.drop_capabilities:
                note = protect_process()
                if note:
                    _log.warning("%s", note)

    # -- machine and toolchain ---------------------------------------------------------------------

    def devices(self) -> list[str]:
        if not self.config.target.is_gpu:
            return ["cpu"]
        ids = self.config.gpus or list(range(len(self.gpu_names)))
        return [f"cuda:{i}" for i in ids]

    def toolchain(self) -> Toolchain:
        """Compilers and flags, detected once; the headers are written and precompiled on first use."""
        with self._lock:
            if self._toolchain is None:
                if self.arch:
                    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", self.arch)
                probe = Toolchain.detect(self.config.backend, "")
                pch_dir = self.cache_dir / "headers" / probe.key
                toolchain = Toolchain.detect(self.config.backend, str(pch_dir))
                note = prepare_headers(toolchain) if self.config.use_pch else ""
                if not self.config.use_pch:
                    prepare_link(toolchain)  # writes the headers too (ensure_glue)
                if note:
                    _log.warning("%s (compiles will be slower)", note)
                self._link_baseline = load_link_baseline(toolchain)
                self._toolchain = toolchain
            return self._toolchain

    def _env(self, gpu_visible: bool) -> dict[str, str]:
        # OpenMP in a candidate gets the threads PyTorch eager gets in the baseline (cpu_threads), and its idle
        # team sleeps rather than spins, so it neither steals cores from the timed call nor looks busy.
        threads = str(max(1, self.config.cpu_threads))
        env: dict[str, str] = {"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads, "OMP_WAIT_POLICY": "passive"}
        if self.arch:
            env["TORCH_CUDA_ARCH_LIST"] = self.arch
        if not gpu_visible:
            env["CUDA_VISIBLE_DEVICES"] = ""
        elif os.environ.get("CUDA_VISIBLE_DEVICES"):
            env["CUDA_VISIBLE_DEVICES"] = os.environ["CUDA_VISIBLE_DEVICES"]
        return env

    def judge(self, device: str) -> JudgeClient:
        """The judge process of ``device`` (started on first use, again if it died)."""
        with self._lock:
            judge = self._judges.get(device)
            if judge is None or not judge.alive():
                if judge is not None:
                    judge.close()
                judge = self._judges[device] = self._new_judge(device)
            wanted = self.config.switch_interval_s
            if wanted and self._switch_interval is None and sys.getswitchinterval() > wanted:
                # The timing marks wait for the interpreter lock in this process (EvalConfig.switch_interval_s).
                self._switch_interval = sys.getswitchinterval()
                sys.setswitchinterval(wanted)
            return judge

    def _new_judge(self, device: str) -> JudgeClient:
        s = self.config.sandbox
        sandbox = {"network": s.network != "off", "seccomp": s.seccomp != "off", "rlimits": {"RLIMIT_CORE": 0}}
        env = child_env(self._env(gpu_visible=self.config.target.is_gpu))
        return JudgeClient({**self.config.to_dict(), "cache_dir": str(self.cache_dir)}, device, sandbox, env,
                           timeout_s=max(600.0, self.config.timeout_s))

    # -- keys --------------------------------------------------------------------------------------

    def solution_key(self, source: str) -> str:
        """The cache key of a solution's libraries: its source and everything that shapes the build."""
        t = self.toolchain()
        payload = json.dumps({"source": source, "toolchain": t.key, "builder": BUILDER_VERSION, "backend": self.config.backend,
                              "rules": self.rules}, sort_keys=True, default=str)
        return hashlib.sha256(payload.encode()).hexdigest()[:32]

    def verdict_key(self, task: Task, candidate: Candidate) -> str:
        """Identical candidates share this key (``reuse_verdicts``): the same task, the same source."""
        return verdict_key(task.task_id, self._rendered(task), candidate.source)

    def baseline_key(self, task: Task) -> str:
        return task_baseline_key(task, self.config, self.hardware)

    def _task_spec(self, task: Task) -> dict[str, str]:
        return {"task_id": task.task_id, "source": self._rendered(task)}

    def _rendered(self, task: Task) -> str:
        """The task's source at this evaluator's sizes, rendered once per task: each candidate's verdict key, static
        rules and run plan need it, and a render parses the task's source twice."""
        profile = self.config.resolved_profile
        # Keyed by what the render reads, not the task id, which an edited task keeps. Two threads may both render
        # a task the first time: the same text, the later one kept.
        key = (task.source, profile)
        rendered = self._rendered_tasks.get(key)
        if rendered is None:
            rendered = self._rendered_tasks[key] = task.render(profile)
        return rendered

    # -- baselines ---------------------------------------------------------------------------------

    def _time_references(self, tasks: list[Task], device: str | None,
                         progress: Callable[[int, int], None] | None = None) -> tuple[dict[str, float], str]:
        """Reference times of ``tasks`` measured now in one fresh judge process, and a description of any that
        failed (``progress(done, total)`` after each task)."""
        if not tasks:
            return {}, ""
        device = device or self.devices()[0]
        with self._judge_lock(device):  # no candidate runs on the device meanwhile
            # A fresh judge process each time: a long-lived one has mapped and freed many candidates' buffers,
            # and PyTorch eager's timings should not depend on that history.
            judge = self._new_judge(device)
            try:
                return self._reference_times(judge, tasks, progress)
            finally:
                judge.close()

    def _reference_times(self, judge: JudgeClient, tasks: list[Task],
                         progress: Callable[[int, int], None] | None = None) -> tuple[dict[str, float], str]:
        """The reference times of ``tasks`` from ``judge`` (its device held by the caller), and a description of any
        that failed (``progress(done, total)`` after each task)."""
        rounds = self.config.baseline_rounds
        return reference_times(judge, [self._task_spec(t) for t in tasks], rounds,
                               max(600.0, self.config.timeout_s * len(tasks) * rounds), progress)

    def measure_references_ms(self, tasks: list[Task], device: str | None = None) -> dict[str, float]:
        """Time the PyTorch references of ``tasks`` now (no cache). Raises RuntimeError naming the tasks whose
        reference could not be timed."""
        times, failure = self._time_references(tasks, device)
        if failure:
            raise RuntimeError(failure)
        return times

    def measure_reference_ms(self, task: Task, device: str | None = None) -> float:
        """Time one task's PyTorch reference now (no cache): reproducibility checks."""
        return self.measure_references_ms([task], device)[task.task_id]

    def prefetch_baselines(self, tasks: Iterable[Task], device: str | None = None,
                           progress: Callable[[int, int], None] | None = None) -> None:
        """Measure every uncached baseline among ``tasks`` before candidates need them (one judge request per
        task; ``progress(done, total)`` after each). A task that fails here is tried again, and its error
        reported, when a candidate of it runs."""
        self.baselines.prefetch({self.baseline_key(t): t for t in tasks},
                                lambda todo: self._time_references(todo, device, progress))

    def baseline_ms(self, task: Task, device: str | None = None) -> float:
        """PyTorch eager time of the task (cached); raises RuntimeError when it cannot be timed."""
        return self.baselines.get_or_measure(self.baseline_key(task), lambda: self.measure_reference_ms(task, device))

    def hold_device(self, device: str) -> threading.Lock:
        """The device, held (as a context manager) for work that must not overlap a timing, such as the policy
        generating on it: while held no candidate run and no baseline timing starts there, and taking it waits for
        the one in progress (kevin/experiment/device_share.py)."""
        return self._judge_lock(device)

    def _judge_lock(self, device: str) -> threading.Lock:
        with self._lock:
            return self._judge_locks.setdefault(device, threading.Lock())

    def layout(self, task: Task, device: str) -> dict[str, Any]:
        """The channel layout of ``task`` (its inputs' and outputs' shapes), from the judge once per evaluator."""
        key = (task.task_id, task.digest, device)
        if key not in self._layouts:
            self._layouts[key] = self.judge(device).request({"t": "layout", "task": self._task_spec(task)}, "layout")["layout"]
        return self._layouts[key]

    def static_check(self, task: Task, candidate: Candidate) -> EvalResult | None:
        """A verdict without running anything (parse errors, rule violations), or None to go on."""
        start = time.perf_counter()
        problem = solution_text_problem(candidate.source)
        if problem:
            result = parse_error_verdict(task.task_id, candidate.key, problem, self.config.backend)
            return self._finish(result, start)
        hits = static_hits(candidate.source, self.config.backend, self.rules, self._rendered(task))
        if hits:
            return self._finish(rule_violation_verdict(task.task_id, candidate.key, hits[0].rule_id, hits[0].describe(),
                                                      self.config.backend), start)
        return None

    def _finish(self, result: EvalResult, start: float) -> EvalResult:
        result.times.static = time.perf_counter() - start
        result.times.total = result.times.total or result.times.static
        return score(result)

    def failed(self, task: Task, candidate: Candidate, failure: Failure, warnings: list[str] | None = None,
               compiled: bool = False) -> EvalResult:
        """The verdict of a candidate stopped by ``failure`` before its run (or, ``compiled``, by its task's)."""
        result = EvalResult(task_id=task.task_id, candidate_id=candidate.key, status=failure.status, backend=self.config.backend,
                            rule_id=failure.rule_id, compiled=compiled, warnings=list(warnings or []), fault=failure.fault)
        result.error = failure.message if not failure.error else (f"{failure.message}: {failure.error}" if failure.message else failure.error)
        if failure.status in (Status.COMPILE_ERROR,):
            result.error = failure.error or failure.message
        return score(result)

    # -- compile -----------------------------------------------------------------------------------

    def compile(self, candidate: Candidate, rank: int = 0) -> Compiled:
        """The solution's libraries in the cache (built now unless they are there), or why not. ``rank``: the
        candidate's place in its batch's compile queue (``compile_priority``)."""
        key = self.solution_key(candidate.source)
        return self.compile_cache.get_or_build(key, lambda: self._build(candidate.source, key, rank))

    def _build(self, source: str, key: str, rank: int) -> Compiled:
        self._protect()
        toolchain = self.toolchain()
        cfg = self.config
        nice, jobs = compile_priority(rank, self.compile_slots.jobs())
        job = HarnessJob({"mode": "compile", "solution_source": source, "config": {**cfg.to_dict(), "cache_dir": str(self.cache_dir)},
                          "toolchain": toolchain.to_dict(), "max_jobs": cfg.compile_jobs or jobs, "device": "cpu"},
                         memory_limit_mb=cfg.memory_limit_mb, env_extra=self._env(gpu_visible=False), nice=nice, sandbox=cfg.sandbox,
                         backend=cfg.backend, read_only=[toolchain.pch_dir, *toolchain.include_dirs, *toolchain.lib_dirs],
                         cpu_seconds=int(3 * cfg.compile_timeout_s) + 60)
        try:
            facts = drive_compile(job, cfg.compile_timeout_s, self.config.sandbox.layers())
            if facts.failure is not None:
                return Compiled(failure=facts.failure, compile_s=facts.compile_s, warnings=facts.warnings)
            return self.compile_cache.adopt(job.staging, key, facts, self.rules, cfg.allowed_runtime_ops,
                                            self._link_baseline)
        finally:
            job.close()

    # -- run ---------------------------------------------------------------------------------------

    def _plan(self, task: Task, compiled: Compiled, device: str) -> tuple[RunPlan, dict[str, Any]]:
        """The run's plan (kept here) and its job file (read by the candidate's process: it holds nothing secret, no
        seed and nothing about which calls are checked; those exist only in the judge)."""
        cfg = self.config
        plan = RunPlan(task=self._task_spec(task), trials=[DISTRIBUTIONS[k % len(DISTRIBUTIONS)] for k in range(cfg.correctness_trials)],
                       timing_trials=cfg.timing_trials, watched_trial=secrets.randbelow(cfg.correctness_trials),
                       own_kernels=compiled.kernels, allowed_ops=list(cfg.allowed_runtime_ops), backend=cfg.backend,
                       timeout_s=cfg.timeout_s, timed_checks=min(cfg.timed_checks, cfg.timing_trials), calibration_calls=cfg.calibration_calls,
                       slack_ms=cfg.resolved_clock_slack_ms, tolerance=cfg.clock_tolerance)
        job = {"mode": "run", "task_id": task.task_id, "task_source": plan.task["source"], "config": cfg.to_dict(),
               "device": device, "toolchain": self.toolchain().to_dict(), "ext_dir": str(compiled.ext_dir),
               "transport": cfg.transport, "calibration_calls": cfg.calibration_calls}
        return plan, job

    def start_run(self, task: Task, candidate: Candidate, compiled: Compiled, device: str, gated: bool) -> Started:
        self._protect()
        plan, spec = self._plan(task, compiled, device)
        cfg = self.config
        job = HarnessJob({**spec, "solution_source": candidate.source, "gated": gated}, memory_limit_mb=cfg.memory_limit_mb,
                         env_extra=self._env(gpu_visible=cfg.target.is_gpu), sandbox=cfg.sandbox, backend=cfg.backend,
                         read_only=[str(compiled.ext_dir)], cpu_seconds=int(3 * cfg.timeout_s) + 60)
        return job, plan

    def run_phase(self, task: Task, candidate: Candidate, compiled: Compiled, device: str,
                   started: Started | None = None) -> EvalResult:
        """The run job of one candidate (``started``: one started ahead of its turn) and its verdict."""
        try:
            baseline = self.baseline_ms(task, device)
        except RuntimeError as exc:  # the task's own reference cannot be timed: the task's failure, not the candidate's
            if started:
                started[0].cancel()
            return self.failed(task, candidate, Failure(Status.RUNTIME_ERROR, "the task's reference could not be timed",
                                                         f"task: {exc}", fault=Fault.TASK), compiled=True)
        if started is not None and started[0].died():
            # Ended before its turn (its set-up failed, or something killed it) before any code of its own
            # ran: not its doing, so it gets a fresh process, now.
            started[0].end()
            started[0].close()
            started = None
        result = self._judged(task, candidate, compiled, device, baseline, started)
        result.warnings = compiled.warnings + result.warnings
        if result.status is Status.RULE_VIOLATION and result.rule_id == "timing_mismatch":
            # The calibration that the timed loops are held to ran when the job started, before any candidate code
            # existed; the machine's load may have changed since (a neighbour's compile began on a 2-core CI machine
            # and two honest kernels were flagged). A fresh process calibrates under the load of now, again before
            # the candidate's code is loaded, so a forgery cannot stretch it; one that reports its calls short is
            # flagged there too.
            first = result
            result = self._judged(task, candidate, compiled, device, baseline)
            result.warnings = compiled.warnings + result.warnings + [
                f"judged again in a fresh process, calibrated under the load of now: the first flagged its timing "
                f"({first.error})"]
        if result.correct and self.config.confirm_baselines:
            baseline = self._confirmed_baseline(task, device, baseline, result)
        if result.flagged_speedup:
            # Too good to trust on one measurement: judge it again in a fresh process.
            again = self._judged(task, candidate, compiled, device, baseline)
            again.flagged_speedup = True
            again.warnings = compiled.warnings + again.warnings + [
                f"speedup above {self.config.speedup_flag_threshold}x: re-verified in a fresh process "
                f"(first run {result.speedup:.2f}x)"]
            result = again
        return score(result)

    def _confirmed_baseline(self, task: Task, device: str, baseline: float, result: EvalResult) -> float:
        """The task's baseline once timed a second time (``BaselineCache.confirm``; EvalConfig.confirm_baselines says
        why); a faster second timing rescores ``result`` against it, with a warning that says so."""
        confirmed = self.baselines.confirm(self.baseline_key(task), lambda: self._time_again(task, device))
        if confirmed < baseline and result.runtime_ms > 0:
            result.warnings.append(f"the task's baseline came out {baseline:.4f} ms the first time it was timed and "
                                   f"{confirmed:.4f} ms the second: scored against the faster")
            against_baseline(result, confirmed, self.config.speedup_flag_threshold)
        return confirmed

    def _time_again(self, task: Task, device: str) -> float:
        """The task's reference timed again, in the device's long-lived judge: no process to start for a check that
        runs once per task and cache, and what that judge's history could do is slow a timing, which the
        confirmation ignores (the first timing's fresh judge stays the one that sets a baseline). Raises
        RuntimeError (JudgeError) when it cannot be timed."""
        with self._judge_lock(device):
            times, failure = self._reference_times(self.judge(device), [task])
        if failure:
            raise RuntimeError(failure)
        return times[task.task_id]

    def _judged(self, task: Task, candidate: Candidate, compiled: Compiled, device: str, baseline: float,
                started: Started | None = None) -> EvalResult:
        """One run job of the candidate (``started``, or a fresh process) and its unscored result."""
        job, plan = started or self.start_run(task, candidate, compiled, device, gated=False)
        result = assemble(task.task_id, candidate.key, self.config.backend, self._drive(job, plan, device, task), baseline,
                          self.config.correctness_trials, self.config.speedup_flag_threshold, compiled.compile_s,
                          compiled.compile_path)
        result.threads = 0 if self.config.target.is_gpu else self.config.cpu_threads
        return result

    def _drive(self, job: HarnessJob, plan: RunPlan, device: str, task: Task) -> RunFacts:
        with self._judge_lock(device):
            try:
                plan.layout = self.layout(task, device)
            except JudgeError as exc:  # the task's inputs or outputs cannot go through a channel: not the candidate's doing
                job.cancel()
                return RunFacts(failure=Failure(Status.RUNTIME_ERROR, "the task could not be evaluated", f"task: {exc}",
                                                fault=Fault.TASK))
            driver = RunDriver(job, self.judge(device), plan, self.config.sandbox.layers())
            try:
                return driver.run()
            finally:
                job.close()
                if driver.judge_failed:
                    with self._lock:
                        judge = self._judges.pop(device, None)
                    if judge:
                        judge.close()

    def evaluate(self, task: Task, candidate: Candidate | str, device: str | None = None) -> EvalResult:
        """Full evaluation of one candidate."""
        if isinstance(candidate, str):
            candidate = Candidate(task_id=task.task_id, source=candidate)
        start = time.perf_counter()
        early = self.static_check(task, candidate)
        if early:
            return early
        reuse = self.config.reuse_verdicts
        key = self.verdict_key(task, candidate) if reuse else ""
        known = self.verdicts.get(key, candidate) if reuse else None
        if known is not None:
            return known
        static_s = time.perf_counter() - start
        compiled = self.compile(candidate)
        if compiled.failure is not None:
            result = self.failed(task, candidate, compiled.failure, compiled.warnings)
            result.times.compile = compiled.compile_s
        else:
            result = self.run_phase(task, candidate, compiled, device or self.devices()[0])
        result.times.static = static_s
        result.times.total = time.perf_counter() - start
        if reuse:
            self.verdicts.put(key, result)
        return result

    # -- batches -----------------------------------------------------------------------------------

    @property
    def concurrent_batches(self) -> bool:
        """Whether several ``evaluate_many`` calls may run at once without changing their verdicts. On cuda they
        share the compile slots, and the device lock keeps every timed run alone on its GPU. On cpu one batch's
        compiles would share the cores with another's timed runs, so its callers take one batch at a time."""
        return self.config.target.overlaps_compiles

    def evaluate_many(self, items: Iterable[tuple[Task, Candidate]], progress: ProgressFn | None = None,
                      show_progress: bool = False) -> list[EvalResult]:
        """Evaluate many candidates: compile on a CPU pool, run on every device, results in input order."""
        batch = Batch(self, list(items), progress, show_progress)
        results = batch.run()
        self.run_intervals, self.compile_intervals = batch.run_intervals, batch.compile_intervals
        return results


__all__ = ["Evaluator"]
