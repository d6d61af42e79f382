"""The evaluator: static rules in this process, compile and run in sandboxed harness processes.

``Evaluator.evaluate`` judges one candidate; ``Evaluator.evaluate_many`` judges a batch with
compilation on a CPU pool overlapped with run phases on every GPU (one run at a time per GPU, a
fresh process per candidate, so a crashed CUDA context never reaches the next candidate).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import platform
import queue
import subprocess
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from kevin.evaluation.config import EvalConfig
from kevin.records.verdicts import feedback_line
from kevin.evaluation.harness import SETUP_FAILED_EXIT
from kevin.records.evaluation import Candidate, EvalResult, PhaseTimes, Status, kernel_score, trim_error
from kevin.evaluation.rules import load_rules, static_hits
from kevin.evaluation.sandbox import HarnessJob, JobOutcome
from kevin.tasks.task import Task

_log = logging.getLogger(__name__)

ProgressFn = Callable[[EvalResult], None]


# ------------------------------------------------------------------------------------ hardware


def gpu_info() -> tuple[list[str], str]:
    """(names of visible GPUs, compute capability like '9.0') without touching CUDA in this process."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,compute_cap", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30, check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return [], ""
    rows = [[c.strip() for c in line.split(",")] for line in out.strip().splitlines() if line.strip()]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        ids = [int(x) for x in visible.split(",") if x.strip().isdigit()]
        rows = [rows[i] for i in ids if i < len(rows)]
    return [r[0] for r in rows], (rows[0][1] if rows and len(rows[0]) > 1 else "")


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def default_compile_workers(n_devices: int) -> int:
    """Cores minus two per run worker (its Python process and the candidate's host code), at least one.

    Measured on the 16-core H200 box: 16 compile workers starved the run phase (about 40 s per
    candidate instead of about 10 s), so run workers keep cores of their own.
    """
    return max(1, (os.cpu_count() or 2) - 2 * max(1, n_devices))


# ----------------------------------------------------------------------------------- baselines


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{path}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


class BaselineCache:
    """PyTorch eager timings, measured once per task x size x hardware x torch version x protocol."""

    def __init__(self, path: Path):
        self.path = path

    def _load(self) -> dict[str, Any]:
        try:
            return json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}

    def get(self, key: str) -> float | None:
        entry = self._load().get(key)
        return float(entry["ms"]) if entry else None

    def put(self, key: str, ms: float, info: dict[str, Any]) -> None:
        with _locked(self.path):
            data = self._load()
            data[key] = {"ms": ms, **info}
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
            os.replace(tmp, self.path)


# ----------------------------------------------------------------------------------- evaluator


class Evaluator:
    """Judges candidates for tasks under one EvalConfig."""

    def __init__(self, config: EvalConfig | None = None):
        self.config = config or EvalConfig()
        self.rules = load_rules(self.config.rules)
        self.cache_dir = self.config.resolved_cache_dir
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        self.baselines = BaselineCache(self.cache_dir / "baselines.json")
        self._baseline_locks: dict[str, threading.Lock] = {}
        self._pch_ready, self._pch_note = False, ""
        self._lock = threading.Lock()
        if self.config.backend == "cuda":
            names, arch = gpu_info()
            if not names:
                raise RuntimeError("backend 'cuda' needs a visible NVIDIA GPU (nvidia-smi found none); use --backend cpu")
            self.gpu_names = names
            self.arch = os.environ.get("TORCH_CUDA_ARCH_LIST") or arch
            self.hardware = names[0]
        else:
            self.gpu_names, self.arch, self.hardware = [], "", cpu_name()
        self._compile_workers = self.config.compile_workers or default_compile_workers(len(self._devices()))
        # On cpu a run process started ahead would take cores from the one being timed.
        self._prestart = self.config.prestart_runs if self.config.backend == "cuda" else 0
        # Compiler jobs per compile worker, so that all workers together never oversubscribe the cores.
        self._max_jobs = max(1, (os.cpu_count() or 2) // self._compile_workers)

    # -- jobs --------------------------------------------------------------------------------

    def _devices(self) -> list[str]:
        if self.config.backend == "cpu":
            return ["cpu"]
        ids = self.config.gpus or list(range(len(self.gpu_names)))
        return [f"cuda:{i}" for i in ids]

    def _env(self, gpu_visible: bool) -> dict[str, str]:
        env = {"KEVIN_CACHE_DIR": str(self.cache_dir)}
        if self.arch:
            env["TORCH_CUDA_ARCH_LIST"] = self.arch  # compile workers see no GPU: name the target
        if not gpu_visible:
            env["CUDA_VISIBLE_DEVICES"] = ""
        elif os.environ.get("CUDA_VISIBLE_DEVICES"):
            env["CUDA_VISIBLE_DEVICES"] = os.environ["CUDA_VISIBLE_DEVICES"]
        return env

    def _job(self, mode: str, task: Task, source: str, device: str) -> dict[str, Any]:
        return {
            "mode": mode,
            "task_id": task.task_id,
            "task_source": task.render(self.config.resolved_profile),
            "solution_source": source,
            "config": {**self.config.to_dict(), "cache_dir": str(self.cache_dir)},
            "device": device,
            "max_jobs": self._max_jobs,
        }

    def _start(self, mode: str, task: Task, source: str, device: str, extra: dict[str, Any] | None = None,
               timeout_s: float = 0.0, gated: bool = False) -> HarnessJob:
        cuda = self.config.backend == "cuda"
        if mode == "compile":
            timeout, compile_timeout = self.config.compile_timeout_s, 0.0
        elif mode == "references":
            timeout, compile_timeout = timeout_s or self.config.timeout_s, 0.0
        else:
            # The run clock starts once the solution is imported: a cache hit after a compile phase,
            # or a real compile in single evaluations, which gets its own budget first.
            timeout, compile_timeout = self.config.timeout_s, self.config.compile_timeout_s
        job_device = "cpu" if mode == "compile" else device
        if mode in ("compile", "run"):  # timing references builds nothing: it need not wait for the header
            self._prepare_pch()
        return HarnessJob(
            {**self._job(mode, task, source, job_device), **(extra or {})}, timeout_s=timeout,
            memory_limit_mb=self.config.memory_limit_mb, env_extra=self._env(cuda and mode != "compile"),
            compile_timeout_s=compile_timeout,
            # Compiles yield the CPU to run phases: a GPU waiting on a starved run process is wasted.
            nice=10 if mode == "compile" else 0,
            sandbox=self.config.sandbox, backend=self.config.backend, cache_dir=str(self.cache_dir), gated=gated,
        )

    def _run(self, mode: str, task: Task, source: str, device: str, extra: dict[str, Any] | None = None,
             timeout_s: float = 0.0) -> JobOutcome:
        return self._start(mode, task, source, device, extra, timeout_s).finish()

    def _prepare_pch(self) -> None:
        """Build torch's precompiled header here, once: candidates may not write to the torch tree."""
        with self._lock:
            if self._pch_ready or not self.config.use_pch:
                return
            from kevin.evaluation.compiler import prepare_torch_pch

            self._pch_note = prepare_torch_pch(self.cache_dir)
            if self._pch_note:
                _log.warning("%s (C++ compiles will be slower)", self._pch_note)
            self._pch_ready = True

    # -- baseline ----------------------------------------------------------------------------

    def baseline_key(self, task: Task) -> str:
        import importlib.metadata as md

        torch_version = md.version("torch")
        c = self.config
        return "|".join([task.task_id, task.digest, c.resolved_profile, c.backend, self.hardware, torch_version,
                         f"w{c.warmup_trials}t{c.timing_trials}f{int(c.flush_l2)}tf32{int(not c.disable_tf32)}"])

    def _time_references(self, tasks: list[Task], device: str | None) -> tuple[dict[str, float], str]:
        """Reference times of ``tasks`` from one fresh process, and a description of any that failed."""
        if not tasks:
            return {}, ""
        device = device or self._devices()[0]
        entries = [{"task_id": t.task_id, "task_source": t.render(self.config.resolved_profile)} for t in tasks]
        # Each reference gets the per-candidate budget; the process start is paid once.
        outcome = self._run("references", tasks[0], "", device, extra={"reference_tasks": entries},
                            timeout_s=self.config.timeout_s * len(tasks))
        verdict = outcome.verdict or {}
        times = {k: float(v) for k, v in verdict.get("references_ms", {}).items()}
        missing = [t.task_id for t in tasks if t.task_id not in times]
        if not missing:
            return times, ""
        errors = verdict.get("reference_errors", {})
        detail = "; ".join(f"{k}: {errors.get(k) or 'no verdict'}" for k in missing[:3])
        if not verdict:
            detail += "\n" + (outcome.stderr_tail[-2000:] or f"exit code {outcome.exit_code}, timed out: {outcome.timed_out}")
        return times, f"timing the reference of {', '.join(missing)} failed: {detail}"

    def measure_references_ms(self, tasks: list[Task], device: str | None = None) -> dict[str, float]:
        """Time the PyTorch references of ``tasks`` now, all in one fresh process (no cache).

        Raises RuntimeError naming the tasks whose reference could not be timed.
        """
        times, failure = self._time_references(tasks, device)
        if failure:
            raise RuntimeError(failure)
        return times

    def measure_reference_ms(self, task: Task, device: str | None = None) -> float:
        """Time one task's PyTorch reference now, in a fresh process (no cache): reproducibility checks."""
        return self.measure_references_ms([task], device)[task.task_id]

    def prefetch_baselines(self, tasks: Iterable[Task], device: str | None = None) -> None:
        """Measure every uncached baseline among ``tasks`` in one process, before candidates need them.

        A failure here is not fatal: the tasks concerned are measured (and their error reported) one
        by one when a candidate of theirs runs.
        """
        missing = {self.baseline_key(t): t for t in tasks}
        missing = {k: t for k, t in missing.items() if self.baselines.get(k) is None}
        if not missing:
            return
        with self._lock:
            locks = [self._baseline_locks.setdefault(k, threading.Lock()) for k in sorted(missing)]
        for lock in locks:  # sorted order, and other threads hold one at a time: no deadlock
            lock.acquire()
        try:
            todo = {k: t for k, t in missing.items() if self.baselines.get(k) is None}
            times, failure = self._time_references(list(todo.values()), device)
            if failure:  # those tasks are tried again, one by one, when a candidate of theirs runs
                _log.warning("%s", failure)
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
            for key, task in todo.items():
                if task.task_id in times:
                    self.baselines.put(key, times[task.task_id], {"measured": stamp})
        finally:
            for lock in locks:
                lock.release()

    def baseline_ms(self, task: Task, device: str | None = None) -> float:
        """PyTorch eager time of the task (cached); measured in its own harness process."""
        key = self.baseline_key(task)
        with self._lock:
            lock = self._baseline_locks.setdefault(key, threading.Lock())
        with lock:
            cached = self.baselines.get(key)
            if cached is not None:
                return cached
            ms = self.measure_reference_ms(task, device)
            self.baselines.put(key, ms, {"measured": time.strftime("%Y-%m-%dT%H:%M:%S")})
            return ms

    # -- verdicts ----------------------------------------------------------------------------

    def static_check(self, task: Task, candidate: Candidate) -> EvalResult | None:
        """A verdict without running anything (parse errors, rule violations), or None to go on."""
        start = time.perf_counter()
        base = dict(task_id=task.task_id, candidate_id=candidate.key, backend=self.config.backend)
        source = candidate.source
        if not source.strip():
            return self._finish(EvalResult(status=Status.PARSE_ERROR, error="the solution is empty", **base), start)
        if "\x00" in source:
            return self._finish(EvalResult(status=Status.PARSE_ERROR, error="the solution is binary data, not Python", **base), start)
        try:
            compile(source, "<solution>", "exec", dont_inherit=True)
        except (SyntaxError, ValueError) as exc:
            where = f" (line {exc.lineno})" if getattr(exc, "lineno", None) else ""
            return self._finish(EvalResult(status=Status.PARSE_ERROR, error=f"not valid Python: {getattr(exc, 'msg', exc)}{where}", **base), start)
        if "ModelNew" not in source or not _defines_class(source, "ModelNew"):
            return self._finish(EvalResult(status=Status.PARSE_ERROR, error="no class ModelNew is defined", **base), start)
        hits = static_hits(source, self.config.backend, self.rules, task.render(self.config.resolved_profile))
        if hits:
            return self._finish(EvalResult(status=Status.RULE_VIOLATION, rule_id=hits[0].rule_id, error=hits[0].describe(), **base), start)
        return None

    def _finish(self, result: EvalResult, start: float) -> EvalResult:
        result.times.static = time.perf_counter() - start
        result.times.total = result.times.total or result.times.static
        return self._score(result)

    def from_outcome(self, task: Task, candidate: Candidate, outcome: JobOutcome, baseline: float | None) -> EvalResult:
        r = EvalResult(task_id=task.task_id, candidate_id=candidate.key, status=Status.RUNTIME_ERROR, backend=self.config.backend)
        v = outcome.verdict
        if outcome.timed_out:
            r.status, r.error = Status.TIMEOUT, f"no verdict within {self.config.timeout_s:.0f} s; the process was killed"
        elif outcome.memory_exceeded:
            r.error = f"the process exceeded the {self.config.memory_limit_mb} MiB memory limit and was killed"
        elif outcome.processes_exceeded:
            r.error = f"the candidate started more than {self.config.sandbox.max_processes} processes and was killed"
        elif v is None:
            why = f"exit code {outcome.exit_code}" + (" (killed by a signal)" if outcome.exit_code < 0 else "")
            r.error = trim_error(f"the process ended without a valid verdict ({why})\n{outcome.stderr_tail[-1500:]}")
        else:
            r.status = Status(v["status"])
            r.rule_id, r.compiled, r.correct = v["rule_id"], v["compiled"], v["correct"]
            r.max_abs_error, r.max_rel_error = v["max_abs_error"], v["max_rel_error"]
            r.trials_passed, r.trials_run, r.warnings = v["trials_passed"], v["trials_run"], v["warnings"]
            r.compile_path = v.get("compile_path", "")
            r.error = trim_error(v["error"] or v["message"]) if r.status is not Status.CORRECT else ""
            if r.status is Status.INCORRECT or r.status is Status.RULE_VIOLATION:
                r.error = v["message"]
            if r.status is Status.RUNTIME_ERROR and v["message"] and v["error"]:
                r.error = trim_error(f"{v['message']}: {v['error']}")
            t = v.get("times", {})
            r.times = PhaseTimes(setup=t.get("setup", 0.0), compile=t.get("compile", 0.0), load=t.get("load", 0.0), correctness=t.get("correctness", 0.0),
                                 profile=t.get("profile", 0.0), timing=t.get("timing", 0.0))
            if r.correct and baseline:
                r.runtime_ms, r.baseline_ms = v["runtime_ms"], baseline
                r.speedup = baseline / v["runtime_ms"] if v["runtime_ms"] > 0 else 0.0
                r.flagged_speedup = r.speedup > self.config.speedup_flag_threshold
        r.times.total = outcome.wall_seconds
        return r

    def evaluate(self, task: Task, candidate: Candidate | str, device: str | None = None) -> EvalResult:
        """Full evaluation of one candidate (compiles inside its run process)."""
        if isinstance(candidate, str):
            candidate = Candidate(task_id=task.task_id, source=candidate)
        start = time.perf_counter()
        early = self.static_check(task, candidate)
        if early:
            return early
        static_s = time.perf_counter() - start
        device = device or self._devices()[0]
        result = self._run_phase(task, candidate, device)
        result.times.static = static_s
        return result

    def _run_phase(self, task: Task, candidate: Candidate, device: str, job: HarnessJob | None = None) -> EvalResult:
        """The run process of one candidate (``job``: one started ahead, gated) and its verdict."""
        baseline = self.baseline_ms(task, device)
        outcome = (job or self._start("run", task, candidate.source, device)).finish()
        if job is not None and outcome.verdict is None and (job.died_before_go or outcome.exit_code == SETUP_FAILED_EXIT):
            # Its set-up failed (or it was killed) while another candidate had the GPU, before any code
            # of its own ran: not its doing, so it gets a fresh process, now.
            outcome = self._start("run", task, candidate.source, device).finish()
        result = self.from_outcome(task, candidate, outcome, baseline)
        if result.flagged_speedup:
            # Too good to trust on one measurement: judge it again in a fresh process.
            again = self.from_outcome(task, candidate, self._run("run", task, candidate.source, device), baseline)
            again.flagged_speedup = True
            again.warnings.append(f"speedup above {self.config.speedup_flag_threshold}x: re-verified in a fresh process "
                                  f"(first run {result.speedup:.2f}x)")
            result = again
        return self._score(result)

    def _score(self, result: EvalResult) -> EvalResult:
        result.score = kernel_score(result.correct, result.speedup, result.status is Status.RULE_VIOLATION)
        result.feedback = feedback_line(result)
        return result

    # -- batches -----------------------------------------------------------------------------

    def evaluate_many(
        self, items: Iterable[tuple[Task, Candidate]], progress: ProgressFn | None = None, show_progress: bool = False
    ) -> list[EvalResult]:
        """Evaluate many candidates: compile on a CPU pool, run on every device, results in input order."""
        items = list(items)
        results: list[EvalResult | None] = [None] * len(items)
        bar = _progress_bar(len(items)) if show_progress else None

        def done(i: int, result: EvalResult) -> None:
            results[i] = result
            if progress:
                progress(result)
            if bar:
                bar.update(1)

        compile_q: list[int] = []
        for i, (task, cand) in enumerate(items):
            early = self.static_check(task, cand)
            if early:
                done(i, early)
            else:
                compile_q.append(i)
        devices = self._devices()
        # Baselines: all uncached ones in one process by the first run worker before its first
        # candidate (on cuda that overlaps the first compiles); any left are measured lazily.
        baseline_tasks = list({items[i][0].task_id: items[i][0] for i in compile_q}.values())
        run_q: queue.Queue[int | None] = queue.Queue()
        workers = self._compile_workers
        overlap = self.config.backend == "cuda"  # on cpu, compiling beside timed runs would skew the timings

        def compile_one(i: int) -> None:
            task, cand = items[i]
            outcome = self._run("compile", task, cand.source, "cpu")
            v = outcome.verdict
            _log.debug("compile phase of %s: %.1f s wall, %s, compiler %.1f s, path %s", cand.key, outcome.wall_seconds,
                       (v or {}).get("status", "no verdict"), (v or {}).get("times", {}).get("compile", 0.0),
                       (v or {}).get("compile_path", ""))
            if v and v["status"] == "correct":
                self._compile_times[i] = v.get("times", {}).get("compile", 0.0)
                self._compile_paths[i] = v.get("compile_path", "")
                run_q.put(i)
            else:
                done(i, self._score(self.from_outcome(task, cand, outcome, None)))

        ahead = self._prestart

        def run_worker(device: str) -> None:
            if device == devices[0]:
                self.prefetch_baselines(baseline_tasks, device)
            # Up to ``ahead`` run processes are started early, gated: they set up (torch, CUDA context,
            # profiler) while the device runs the current candidate, which alone holds it.
            started: deque[tuple[int, HarnessJob]] = deque()
            ended = False
            while True:
                while not ended and len(started) <= ahead:
                    try:
                        i = run_q.get(block=not started)
                    except queue.Empty:
                        break
                    if i is None:
                        ended = True
                        break
                    task, cand = items[i]
                    started.append((i, self._start("run", task, cand.source, device, gated=True)))
                if not started:
                    return
                i, job = started.popleft()
                task, cand = items[i]
                began = time.monotonic()
                try:
                    result = self._run_phase(task, cand, device, job)
                except Exception as exc:  # e.g. the task's own reference cannot be timed: a verdict, not a lost item
                    job.cancel()
                    result = self._score(EvalResult(task_id=task.task_id, candidate_id=cand.key, backend=self.config.backend,
                                                    status=Status.RUNTIME_ERROR, error=trim_error(f"evaluator: {exc}")))
                self.run_intervals.append((device, began, time.monotonic()))
                _log.debug("run phase of %s on %s: %.1f s wall, %s %s, phases %s%s", cand.key, device, time.monotonic() - began,
                           result.status.value, result.rule_id, {k: round(x, 2) for k, x in asdict(result.times).items() if x},
                           f", error: {result.error[:300]!r}" if result.error else "")
                result.times.compile = max(result.times.compile, self._compile_times.get(i, 0.0))
                result.compile_path = result.compile_path or self._compile_paths.get(i, "")
                done(i, result)

        self._compile_times: dict[int, float] = {}
        self._compile_paths: dict[int, str] = {}
        self.run_intervals: list[tuple[str, float, float]] = []  # (device, start, end) of run phases, for busy-share figures
        runners = [threading.Thread(target=run_worker, args=(d,), daemon=True) for d in devices]
        if overlap:
            for t in runners:
                t.start()
        with ThreadPoolExecutor(max_workers=workers) as pool:
            list(pool.map(compile_one, compile_q))
        if not overlap:
            for t in runners:
                t.start()
        for _ in runners:
            run_q.put(None)
        for t in runners:
            t.join()
        if bar:
            bar.close()
        return [r for r in results if r is not None]


def _defines_class(source: str, name: str) -> bool:
    import ast

    return any(isinstance(n, ast.ClassDef) and n.name == name for n in ast.walk(ast.parse(source)))


def _progress_bar(total: int):
    from tqdm import tqdm

    return tqdm(total=total, desc="evaluating", unit="kernel", dynamic_ncols=True)
