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
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import platform
import queue
import secrets
import shutil
import subprocess
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from kevin.evaluation.builder import (BUILDER_VERSION, MAX_COMPILE_JOBS, REGISTRATION_MARKER, Toolchain, kernel_names,
                                      load_link_baseline, prepare_headers, prepare_link)
from kevin.evaluation.config import EvalConfig
from kevin.evaluation.report import PhaseProgress
from kevin.evaluation.inputs import DISTRIBUTIONS
from kevin.evaluation.isolation import protect_process
from kevin.evaluation.judge import JudgeClient, JudgeError
from kevin.records.evaluation import Candidate, EvalResult, Status, trim_error
from kevin.records.verdicts import parse_error_verdict
from kevin.evaluation.rules import cpp_rule_hits, load_rules, static_hits
from kevin.evaluation.runs import CompileFacts, RunDriver, RunPlan, drive_compile
from kevin.evaluation.sandbox import HarnessJob, child_env
from kevin.evaluation.symbols import library_hits
from kevin.evaluation.verdict import Failure, RunFacts, assemble, score
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


def compile_priority(rank: int, shared_jobs: int) -> tuple[int, int]:
    """(nice level, compiler processes) of the compile at ``rank`` in its batch's queue (0: first).

    The GPU waits for a batch's first compile (measured on the H200: 19 s of a 71 s batch), so the first runs at
    nice 10 with a lone compile's processes, and later ones at nice 11, 12, ... 19 with ``shared_jobs`` (the cores
    the queue leaves each): the first candidate is ready sooner and the cores stay as full as before.
    """
    return 10 + min(9, max(0, rank)), (MAX_COMPILE_JOBS if rank == 0 else shared_jobs)


def default_compile_workers(n_devices: int, cores: int = 0) -> int:
    """Cores minus two per run worker (its Python process and the candidate's host code), at least one.

    Measured on the 16-core H200 box: 16 compile workers starved the run phase (about 40 s per
    candidate instead of about 10 s), so run workers keep cores of their own.
    """
    return max(1, (cores or os.cpu_count() or 2) - 2 * max(1, n_devices))


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
    """PyTorch eager timings, measured once per task x size x hardware x torch version x protocol.

    The file is read once, when the cache is made; after that this process's own copy is what counts
    (a value read or measured is never read from the file again), so a file rewritten behind its back
    changes nothing it already knows. Only this process writes the file; candidates cannot (isolation.py).
    """

    def __init__(self, path: Path):
        self.path = path
        self._known: dict[str, float] = {k: float(v["ms"]) for k, v in self._load().items()
                                          if isinstance(v, dict) and isinstance(v.get("ms"), (int, float))}
        self._lock = threading.Lock()

    def _load(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text())
            return data if isinstance(data, dict) else {}
        except (OSError, ValueError):
            return {}

    def get(self, key: str) -> float | None:
        """This process's value, else one another evaluator process measured meanwhile (read from the file, and
        kept: a value once known is never replaced by what the file says later)."""
        with self._lock:
            if key not in self._known:
                for k, v in self._load().items():
                    if k not in self._known and isinstance(v, dict) and isinstance(v.get("ms"), (int, float)):
                        self._known[k] = float(v["ms"])
            return self._known.get(key)

    def put(self, key: str, ms: float, info: dict[str, Any]) -> None:
        with self._lock:
            self._known[key] = ms
        with _locked(self.path):
            data = self._load()
            data[key] = {"ms": ms, **info}
            tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
            os.replace(tmp, self.path)


# ----------------------------------------------------------------------------------- compiled


@dataclass
class Compiled:
    """A solution's compile outcome: its libraries' folder in the cache, or why there is none."""

    failure: Failure | None = None
    ext_dir: Path | None = None
    kernels: list[str] = field(default_factory=list)
    """``__global__`` names in the compiled CUDA sources (read here, from the staging folder)."""
    compile_s: float = 0.0
    compile_path: str = ""
    warnings: list[str] = field(default_factory=list)


_REGISTRATION = "\n" + REGISTRATION_MARKER


def _candidate_text(source_file: Path) -> str:
    """A compiled source as the candidate wrote it: our registration block (main.cpp) cut off."""
    text = source_file.read_text(errors="replace")
    cut = text.rfind(_REGISTRATION)
    return text[:cut] if cut >= 0 and source_file.name == "main.cpp" else text


# ----------------------------------------------------------------------------------- evaluator


class Evaluator:
    """Judges candidates for tasks under one EvalConfig. Thread-safe; ``close()`` ends its judges."""

    def __init__(self, config: EvalConfig | None = None):
        self.config = config or EvalConfig()
        self.rules = load_rules(self.config.rules)
        self.cache_dir = self.config.resolved_cache_dir
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        self.baselines = BaselineCache(self.cache_dir / "baselines.json")
        self._baseline_locks: dict[str, threading.Lock] = {}
        self._lock = threading.Lock()
        self._toolchain: Toolchain | None = None
        self._link_baseline = None  # builder.load_link_baseline: what every library of the toolchain holds
        self._judges: dict[str, JudgeClient] = {}
        self._judge_locks: dict[str, threading.Lock] = {}
        self._compile_locks: dict[str, threading.Lock] = {}
        self._compile_failures: dict[str, Compiled] = {}
        self._layouts: dict[tuple[str, str, str], dict[str, Any]] = {}
        self._protected = False
        if self.config.backend == "cuda":
            names, arch = gpu_info()
            if not names:
                raise RuntimeError("backend 'cuda' needs a visible NVIDIA GPU (nvidia-smi found none); use --backend cpu")
            self.gpu_names = names
            self.arch = os.environ.get("TORCH_CUDA_ARCH_LIST") or arch
            self.hardware = names[0]
        else:
            self.gpu_names, self.arch, self.hardware = [], "", cpu_name()
        cores = self.config.cpu_cores or os.cpu_count() or 2
        self._compile_workers = self.config.compile_workers or default_compile_workers(len(self.devices()), cores)
        # Shared by every batch in progress: two batches at once (waves of a rollout) compile in as many processes
        # as one batch would, not twice as many.
        self._compile_slots = threading.BoundedSemaphore(self._compile_workers)
        # On cpu a run process started ahead would take cores from the one being timed.
        self._prestart = self.config.prestart_runs if self.config.backend == "cuda" else 0
        self._cores = cores
        self._compile_demand = 0  # compiles queued or running in the batches in progress (_compile_jobs)

    # -- lifecycle ---------------------------------------------------------------------------------

    def close(self) -> None:
        """End the judge processes (a later call starts them again)."""
        with self._lock:
            judges, self._judges = list(self._judges.values()), {}
        for judge in judges:
            judge.close()

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
        if self.config.backend == "cpu":
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
            return judge

    def _new_judge(self, device: str) -> JudgeClient:
        s = self.config.sandbox
        sandbox = {"network": s.network != "off", "seccomp": s.seccomp != "off", "rlimits": {"RLIMIT_CORE": 0}}
        env = child_env(self._env(gpu_visible=self.config.backend == "cuda"))
        return JudgeClient({**self.config.to_dict(), "cache_dir": str(self.cache_dir)}, device, sandbox, env,
                           timeout_s=max(600.0, self.config.timeout_s))

    def _layers(self) -> list[str]:
        """The isolation layers asked for, in words (for messages about a process that died)."""
        s = self.config.sandbox
        layers = [name for name, value in (("network namespace", s.network != "off"), ("read-only mounts", s.mounts != "off"),
                                           ("capabilities dropped", s.drop_capabilities), ("cgroup", s.cgroup != "off"))
                  if value]
        if s.filesystem != "off":
            layers.append("Landlock")
        if s.seccomp != "off":
            layers.append("seccomp")
        return layers

    # -- keys --------------------------------------------------------------------------------------

    def solution_key(self, source: str) -> str:
        """The cache key of a solution's libraries: its source and everything that shapes the build."""
        t = self.toolchain()
        payload = json.dumps({"source": source, "toolchain": t.key, "builder": BUILDER_VERSION, "backend": self.config.backend,
                              "rules": self.rules}, sort_keys=True, default=str)
        return hashlib.sha256(payload.encode()).hexdigest()[:32]

    def baseline_key(self, task: Task) -> str:
        import importlib.metadata as md

        torch_version = md.version("torch")
        c = self.config
        return "|".join([task.task_id, task.digest, c.resolved_profile, c.backend, self.hardware, torch_version,
                         f"w{c.warmup_trials}t{c.timing_trials}r{c.baseline_rounds}f{int(c.flush_l2)}tf32{int(not c.disable_tf32)}"
                         f"t{c.cpu_threads}"])

    def _task_spec(self, task: Task) -> dict[str, str]:
        return {"task_id": task.task_id, "source": task.render(self.config.resolved_profile)}

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
                counted = [0]

                rounds = self.config.baseline_rounds

                def tick(message: dict[str, Any]) -> None:  # one message per task and round
                    counted[0] += 1
                    if progress and counted[0] % rounds == 0:
                        progress(counted[0] // rounds, len(tasks))

                answer = judge.request({"t": "baselines", "tasks": [self._task_spec(t) for t in tasks]}, "baselines",
                                       timeout=max(600.0, self.config.timeout_s * len(tasks) * rounds), on_progress=tick)
            finally:
                judge.close()
        times = {str(k): float(v) for k, v in answer.get("ms", {}).items()}
        missing = [t.task_id for t in tasks if t.task_id not in times]
        if not missing:
            return times, ""
        errors = answer.get("errors", {})
        detail = "; ".join(f"{k}: {errors.get(k) or 'no time'}" for k in missing[:3])
        return times, f"timing the reference of {', '.join(missing)} failed: {detail}"

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
            times, failure = self._time_references(list(todo.values()), device, progress)
            if failure:
                _log.warning("%s", failure)
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
            for key, task in todo.items():
                if task.task_id in times:
                    self.baselines.put(key, times[task.task_id], {"measured": stamp})
        finally:
            for lock in locks:
                lock.release()

    def baseline_ms(self, task: Task, device: str | None = None) -> float:
        """PyTorch eager time of the task (cached); raises RuntimeError when it cannot be timed."""
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
        hits = static_hits(candidate.source, self.config.backend, self.rules, task.render(self.config.resolved_profile))
        if hits:
            return self._finish(EvalResult(task_id=task.task_id, candidate_id=candidate.key, backend=self.config.backend,
                                           status=Status.RULE_VIOLATION, rule_id=hits[0].rule_id, error=hits[0].describe()), start)
        return None

    def _finish(self, result: EvalResult, start: float) -> EvalResult:
        result.times.static = time.perf_counter() - start
        result.times.total = result.times.total or result.times.static
        return score(result)

    def _failed(self, task: Task, candidate: Candidate, failure: Failure, warnings: list[str] | None = None,
                compiled: bool = False) -> EvalResult:
        result = EvalResult(task_id=task.task_id, candidate_id=candidate.key, status=failure.status, backend=self.config.backend,
                            rule_id=failure.rule_id, compiled=compiled, warnings=list(warnings or []))
        result.error = failure.message if not failure.error else (f"{failure.message}: {failure.error}" if failure.message else failure.error)
        if failure.status in (Status.COMPILE_ERROR,):
            result.error = failure.error or failure.message
        return score(result)

    # -- compile -----------------------------------------------------------------------------------

    def compile(self, candidate: Candidate, rank: int = 0) -> Compiled:
        """The solution's libraries in the cache (built now unless they are there), or why not. ``rank``: the
        candidate's place in its batch's compile queue (``compile_priority``)."""
        key = self.solution_key(candidate.source)
        with self._lock:
            lock = self._compile_locks.setdefault(key, threading.Lock())
        with lock:  # identical solutions in one batch are compiled once
            cached = self._cached_build(key)
            if cached is not None:
                return cached
            if key in self._compile_failures:
                return self._compile_failures[key]
            result = self._build(candidate.source, key, rank)
            if result.failure is not None and result.failure.status is not Status.TIMEOUT:
                self._compile_failures[key] = result
            return result

    def _compile_jobs(self) -> int:
        """Compiler processes for the build starting now: ``compile_jobs``, else the cores shared among the
        compiles waiting (all workers together never oversubscribe the cores), at most MAX_COMPILE_JOBS."""
        if self.config.compile_jobs:
            return self.config.compile_jobs
        with self._lock:
            waiting = max(1, self._compile_demand)
        return max(1, min(MAX_COMPILE_JOBS, self._cores // waiting))

    def _demand(self, change: int) -> None:
        with self._lock:
            self._compile_demand += change

    def _cached_build(self, key: str) -> Compiled | None:
        folder = self.cache_dir / "ext" / key
        try:
            meta = json.loads((folder / "meta.json").read_text())
        except (OSError, ValueError):
            return None
        return Compiled(ext_dir=folder, kernels=[str(k) for k in meta.get("kernels", [])], compile_s=0.0,
                        compile_path=str(meta.get("path", "")))

    def _build(self, source: str, key: str, rank: int) -> Compiled:
        self._protect()
        toolchain = self.toolchain()
        cfg = self.config
        nice, jobs = compile_priority(rank, self._compile_jobs())
        job = HarnessJob({"mode": "compile", "solution_source": source, "config": {**cfg.to_dict(), "cache_dir": str(self.cache_dir)},
                          "toolchain": toolchain.to_dict(), "max_jobs": cfg.compile_jobs or jobs, "device": "cpu"},
                         memory_limit_mb=cfg.memory_limit_mb, env_extra=self._env(gpu_visible=False), nice=nice, sandbox=cfg.sandbox,
                         backend=cfg.backend, read_only=[toolchain.pch_dir, *toolchain.include_dirs, *toolchain.lib_dirs],
                         cpu_seconds=int(3 * cfg.compile_timeout_s) + 60)
        try:
            facts = drive_compile(job, cfg.compile_timeout_s, self._layers())
            if facts.failure is not None:
                return Compiled(failure=facts.failure, compile_s=facts.compile_s, warnings=facts.warnings)
            return self._adopt(job.staging, key, facts)
        finally:
            job.close()

    def _adopt(self, staging: Path, key: str, facts: CompileFacts) -> Compiled:
        """Check what a compile job left in its staging folder and move it into the cache (trusted side)."""
        hits = library_hits(staging, self.rules["native_symbols"], self.config.allowed_runtime_ops,
                            self._link_baseline)
        sources = sorted(p for p in staging.rglob("*") if p.name in ("main.cpp", "cuda.cu") and p.is_file() and not p.is_symlink())
        texts = {p: _candidate_text(p) for p in sources}
        hits += cpp_rule_hits(list(texts.values()), self.rules)
        if not any(p.suffix == ".so" for p in staging.rglob("*.so")):
            return Compiled(failure=Failure(Status.RUNTIME_ERROR, "the compile job reported success but built no library"),
                            compile_s=facts.compile_s)
        if hits:
            return Compiled(failure=Failure(Status.RULE_VIOLATION, hits[0].message, rule_id=hits[0].rule_id), compile_s=facts.compile_s)
        kernels = kernel_names([t for p, t in texts.items() if p.name == "cuda.cu"])
        paths = sorted({b["path"] for b in facts.built})
        path = "lite" if paths == ["lite"] else ("full-fallback" if "full" in paths else "")
        folder = self.cache_dir / "ext" / key
        tmp = self.cache_dir / "ext" / f".{key}.{secrets.token_hex(4)}"
        tmp.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(staging), str(tmp))
        (tmp / "meta.json").write_text(json.dumps({"kernels": kernels, "path": path, "built": facts.built}))
        try:
            os.rename(tmp, folder)
        except OSError:  # the same solution was adopted meanwhile: keep that one
            shutil.rmtree(tmp, ignore_errors=True)
        return Compiled(ext_dir=folder, kernels=kernels, compile_s=facts.compile_s, compile_path=path, warnings=facts.warnings)

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

    def _start_run(self, task: Task, candidate: Candidate, compiled: Compiled, device: str, gated: bool) -> tuple[HarnessJob, RunPlan]:
        self._protect()
        plan, spec = self._plan(task, compiled, device)
        cfg = self.config
        job = HarnessJob({**spec, "solution_source": candidate.source, "gated": gated}, memory_limit_mb=cfg.memory_limit_mb,
                         env_extra=self._env(gpu_visible=cfg.backend == "cuda"), sandbox=cfg.sandbox, backend=cfg.backend,
                         read_only=[str(compiled.ext_dir)], cpu_seconds=int(3 * cfg.timeout_s) + 60)
        return job, plan

    def _run_phase(self, task: Task, candidate: Candidate, compiled: Compiled, device: str,
                   started: tuple[HarnessJob, RunPlan] | None = None) -> EvalResult:
        """The run job of one candidate (``started``: one started ahead of its turn) and its verdict."""
        try:
            baseline = self.baseline_ms(task, device)
        except RuntimeError as exc:  # the task's own reference cannot be timed: the task's failure, not the candidate's
            if started:
                started[0].cancel()
            return self._failed(task, candidate, Failure(Status.RUNTIME_ERROR, "the task's reference could not be timed",
                                                         f"task: {exc}"), compiled=True)
        if started is not None and started[0].died():
            # Ended before its turn (its set-up failed, or something killed it) before any code of its own
            # ran: not its doing, so it gets a fresh process, now.
            started[0].end()
            started[0].close()
            started = None
        job, plan = started or self._start_run(task, candidate, compiled, device, gated=False)
        facts = self._drive(job, plan, device, task)
        result = assemble(task.task_id, candidate.key, self.config.backend, facts, baseline, self.config.correctness_trials,
                          self.config.speedup_flag_threshold, compiled.compile_s, compiled.compile_path)
        result.warnings = compiled.warnings + result.warnings
        result.threads = self.config.cpu_threads if self.config.backend == "cpu" else 0
        if result.flagged_speedup:
            # Too good to trust on one measurement: judge it again in a fresh process.
            job, plan = self._start_run(task, candidate, compiled, device, gated=False)
            again = assemble(task.task_id, candidate.key, self.config.backend, self._drive(job, plan, device, task), baseline,
                             self.config.correctness_trials, self.config.speedup_flag_threshold, compiled.compile_s,
                             compiled.compile_path)
            again.flagged_speedup = True
            again.threads = result.threads
            again.warnings.append(f"speedup above {self.config.speedup_flag_threshold}x: re-verified in a fresh process "
                                  f"(first run {result.speedup:.2f}x)")
            result = again
        return score(result)

    def _drive(self, job: HarnessJob, plan: RunPlan, device: str, task: Task) -> RunFacts:
        with self._judge_lock(device):
            try:
                plan.layout = self.layout(task, device)
            except JudgeError as exc:  # the task's inputs or outputs cannot go through a channel: not the candidate's doing
                job.cancel()
                return RunFacts(failure=Failure(Status.RUNTIME_ERROR, "the task could not be evaluated", f"task: {exc}"))
            driver = RunDriver(job, self.judge(device), plan, self._layers())
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
        static_s = time.perf_counter() - start
        compiled = self.compile(candidate)
        if compiled.failure is not None:
            result = self._failed(task, candidate, compiled.failure, compiled.warnings)
            result.times.compile = compiled.compile_s
        else:
            result = self._run_phase(task, candidate, compiled, device or self.devices()[0])
        result.times.static = static_s
        result.times.total = time.perf_counter() - start
        return result

    # -- batches -----------------------------------------------------------------------------------

    @property
    def concurrent_batches(self) -> bool:
        """Whether several ``evaluate_many`` calls may run at once without changing their verdicts. On cuda they
        share the compile slots, and the device lock keeps every timed run alone on its GPU. On cpu one batch's
        compiles would share the cores with another's timed runs, so its callers take one batch at a time."""
        return self.config.backend == "cuda"

    def evaluate_many(self, items: Iterable[tuple[Task, Candidate]], progress: ProgressFn | None = None,
                      show_progress: bool = False) -> list[EvalResult]:
        """Evaluate many candidates: compile on a CPU pool, run on every device, results in input order."""
        return _Batch(self, list(items), progress, show_progress).run()


class _Batch:
    """One ``evaluate_many`` call: its own queues and results, so calls on one evaluator do not mix."""

    def __init__(self, ev: Evaluator, items: list[tuple[Task, Candidate]], progress: ProgressFn | None, show: bool):
        self.ev, self.items, self.progress = ev, items, progress
        self.results: list[EvalResult | None] = [None] * len(items)
        self.compiled: dict[int, Compiled] = {}
        self.run_q: queue.Queue[int | None] = queue.Queue()
        self.run_intervals: list[tuple[str, float, float]] = []
        self.compile_intervals: list[tuple[float, float]] = []
        self.bar = PhaseProgress() if show else None
        self._lock = threading.Lock()

    def done(self, i: int, result: EvalResult) -> None:
        with self._lock:
            self.results[i] = result
        if self.progress:
            self.progress(result)

    def _show(self, method: str, *args: Any) -> None:
        if self.bar:
            with self._lock:
                getattr(self.bar, method)(*args)

    def compile_one(self, i: int, rank: int) -> None:
        task, cand = self.items[i]
        started = time.perf_counter()
        try:
            with self.ev._compile_slots:
                began = time.monotonic()
                compiled = self.ev.compile(cand, rank)
                self.compile_intervals.append((began, time.monotonic()))
        finally:
            self.ev._demand(-1)
        self._show("advance", "compiling")
        if compiled.failure is not None:
            result = self.ev._failed(task, cand, compiled.failure, compiled.warnings)
            result.times.compile = compiled.compile_s
            result.times.total = time.perf_counter() - started
            self._show("add_total", "running", -1)
            self.done(i, result)
        else:
            self.compiled[i] = compiled
            self.run_q.put(i)

    def run_worker(self, device: str) -> None:
        ev = self.ev
        ahead = ev._prestart
        started: deque[tuple[int, tuple[HarnessJob, RunPlan]]] = deque()
        ended = False
        while True:
            while not ended and len(started) <= ahead:
                try:
                    i = self.run_q.get(block=not started)
                except queue.Empty:
                    break
                if i is None:
                    ended = True
                    break
                task, cand = self.items[i]
                started.append((i, ev._start_run(task, cand, self.compiled[i], device, gated=True)))
            if not started:
                return
            i, job = started.popleft()
            task, cand = self.items[i]
            began = time.monotonic()
            try:
                result = ev._run_phase(task, cand, self.compiled[i], device, job)
            except Exception as exc:  # a verdict, never a lost item
                job[0].cancel()
                result = score(EvalResult(task_id=task.task_id, candidate_id=cand.key, backend=ev.config.backend,
                                          status=Status.RUNTIME_ERROR, error=trim_error(f"evaluator: {exc}")))
            self.run_intervals.append((device, began, time.monotonic()))
            self._show("advance", "running")
            _log.debug("run phase of %s on %s: %.1f s wall, %s %s, phases %s%s", cand.key, device, time.monotonic() - began,
                       result.status.value, result.rule_id, {k: round(x, 2) for k, x in asdict(result.times).items() if x},
                       f", error: {result.error[:300]!r}" if result.error else "")
            self.done(i, result)

    def run(self) -> list[EvalResult]:
        ev = self.ev
        compile_q: list[int] = []
        for i, (task, cand) in enumerate(self.items):
            early = ev.static_check(task, cand)
            if early:
                self.done(i, early)
            else:
                compile_q.append(i)
        devices = ev.devices()
        baseline_tasks = list({self.items[i][0].task_id: self.items[i][0] for i in compile_q}.values())
        self._show("set_total", "baselines", len([t for t in baseline_tasks if ev.baselines.get(ev.baseline_key(t)) is None]))
        self._show("set_total", "compiling", len(compile_q))
        self._show("set_total", "running", len(compile_q))
        overlap = ev.config.backend == "cuda"  # on cpu, compiling beside timed runs would skew the timings
        runners = [threading.Thread(target=self.run_worker, args=(d,), daemon=True) for d in devices]
        # Baselines first, before any compile worker takes the cores: PyTorch eager's times are cached for every
        # later batch and must not carry this batch's load (cuDNN's host-side work slows down under it).
        ev.prefetch_baselines(baseline_tasks, devices[0], progress=lambda n, total: self._show("advance", "baselines"))
        if compile_q:
            ev.toolchain()  # headers prepared once, before the workers need them
        if overlap:
            for t in runners:
                t.start()
        ev._demand(len(compile_q))
        with ThreadPoolExecutor(max_workers=ev._compile_workers) as pool:
            list(pool.map(self.compile_one, compile_q, range(len(compile_q))))
        if not overlap:
            for t in runners:
                t.start()
        for _ in runners:
            self.run_q.put(None)
        for t in runners:
            t.join()
        # The last batch's timeline (monotonic clock), for benchmarks: when each run and each compile went on.
        ev.run_intervals, ev.compile_intervals = self.run_intervals, self.compile_intervals
        if self.bar:
            self.bar.close()
        return [r for r in self.results if r is not None]


def _defines_class(source: str, name: str) -> bool:
    import ast

    return any(isinstance(n, ast.ClassDef) and n.name == name for n in ast.walk(ast.parse(source)))


def solution_text_problem(source: str) -> str:
    """Why a solution is not a Python file defining ModelNew ('' when it is), as a parse-error phrase."""
    if not source.strip():
        return "the solution is empty"
    if "\x00" in source:
        return "the solution is binary data, not Python"
    try:
        compile(source, "<solution>", "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as exc:
        where = f" (line {exc.lineno})" if getattr(exc, "lineno", None) else ""
        return f"not valid Python: {getattr(exc, 'msg', exc)}{where}"
    if "ModelNew" not in source or not _defines_class(source, "ModelNew"):
        return "no class ModelNew is defined"
    return ""




__all__ = ["BaselineCache", "Compiled", "Evaluator", "cpu_name", "gpu_info"]
