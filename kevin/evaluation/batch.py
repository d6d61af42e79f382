"""The batch scheduler of one machine: compiles on a pool of CPU workers, run jobs on every device, results in
input order.

A batch talks to its evaluator only through ``BatchHost`` (the evaluator's public interface): it decides when
and where each candidate's phases happen, never how a phase judges. Run jobs go one at a time per device, a fresh
process each, started ahead of their turn on cuda (``BatchHost.prestart``); the compile processes of every batch
in progress share the machine's cores (``CompileSlots``).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict
from typing import Any, Callable, Iterable, Iterator, Protocol

from kevin.evaluation.baselines import BaselineCache
from kevin.evaluation.builder import MAX_COMPILE_JOBS
from kevin.evaluation.compile_cache import Compiled
from kevin.evaluation.config import EvalConfig
from kevin.evaluation.report import PhaseProgress
from kevin.evaluation.runs import RunPlan
from kevin.evaluation.sandbox import HarnessJob
from kevin.evaluation.verdict import Failure, score
from kevin.evaluation.verdict_memo import Pending, VerdictMemo, reusable, reused
from kevin.records.evaluation import Candidate, EvalResult, Fault, ProgressFn, Status, trim_error
from kevin.tasks.task import Task

_log = logging.getLogger(__name__)

Started = tuple[HarnessJob, RunPlan]
"""A run job started ahead of its turn, and its plan."""


def compile_priority(rank: int, shared_jobs: int) -> tuple[int, int]:
    """(nice level, compiler processes) of the compile at ``rank`` in its batch's queue (0: first).

    The GPU waits for a batch's first compile (measured on the H200: 19 s of a 71 s batch), so the first runs at
    nice 10 with a lone compile's processes, and later ones at nice 11, 12, ... 19 with ``shared_jobs`` (the cores
    the queue leaves each): the first candidate is ready sooner and the cores stay as full as before.
    """
    return 10 + min(9, max(0, rank)), (MAX_COMPILE_JOBS if rank == 0 else shared_jobs)


class CompileSlots:
    """The compile workers of one evaluator, shared by every batch in progress: two batches at once (waves of a
    rollout) compile in as many processes as one batch would, not twice as many."""

    def __init__(self, workers: int, cores: int, fixed_jobs: int = 0):
        self.workers = workers
        self.cores = cores
        self.fixed_jobs = fixed_jobs
        self.demand = 0
        """Compiles queued or running in the batches in progress (``jobs`` shares the cores among them)."""
        self._slots = threading.BoundedSemaphore(workers)
        self._lock = threading.Lock()

    def add_demand(self, change: int) -> None:
        with self._lock:
            self.demand += change

    def jobs(self) -> int:
        """Compiler processes for the build starting now: ``fixed_jobs`` (config ``compile_jobs``), else the cores
        shared among the compiles waiting (all workers together never oversubscribe the cores), at most
        MAX_COMPILE_JOBS."""
        if self.fixed_jobs:
            return self.fixed_jobs
        with self._lock:
            waiting = max(1, self.demand)
        return max(1, min(MAX_COMPILE_JOBS, self.cores // waiting))

    @contextmanager
    def slot(self) -> Iterator[None]:
        """One compile worker's turn (waits while every worker is busy)."""
        with self._slots:
            yield


class BatchHost(Protocol):
    """What a batch needs from its evaluator (``Evaluator`` is one)."""

    config: EvalConfig
    baselines: BaselineCache
    compile_slots: CompileSlots
    verdicts: VerdictMemo
    """Verdicts of identical candidates, asked and filled under ``config.reuse_verdicts`` only."""
    prestart: int
    """Run jobs started ahead of their turn on each device (0 on cpu: they would take the timed run's cores)."""

    def devices(self) -> list[str]: ...

    def static_check(self, task: Task, candidate: Candidate) -> EvalResult | None: ...

    def verdict_key(self, task: Task, candidate: Candidate) -> str: ...

    def baseline_key(self, task: Task) -> str: ...

    def prefetch_baselines(self, tasks: Iterable[Task], device: str | None = None,
                           progress: Callable[[int, int], None] | None = None) -> None: ...

    def toolchain(self) -> Any: ...

    def compile(self, candidate: Candidate, rank: int = 0) -> Compiled: ...

    def failed(self, task: Task, candidate: Candidate, failure: Failure, warnings: list[str] | None = None,
               compiled: bool = False) -> EvalResult: ...

    def start_run(self, task: Task, candidate: Candidate, compiled: Compiled, device: str, gated: bool) -> Started: ...

    def run_phase(self, task: Task, candidate: Candidate, compiled: Compiled, device: str,
                  started: Started | None = None) -> EvalResult: ...


class Batch:
    """One ``evaluate_many`` call: its own queues and results, so calls on one evaluator do not mix.

    ``reuse``: False judges every item itself even under ``config.reuse_verdicts`` (the repeats of a verdict that
    was the moment's, a batch of their own); True reuses verdicts when the config says so.
    """

    def __init__(self, ev: BatchHost, items: list[tuple[Task, Candidate]], progress: ProgressFn | None, show: bool,
                 reuse: bool = True):
        self.ev, self.items, self.progress = ev, items, progress
        self.results: list[EvalResult | None] = [None] * len(items)
        self.compiled: dict[int, Compiled] = {}
        self.run_q: queue.Queue[int | None] = queue.Queue()
        # The batch's timeline (monotonic clock), for benchmarks: when each run and each compile went on.
        self.run_intervals: list[tuple[str, float, float]] = []
        self.compile_intervals: list[tuple[float, float]] = []
        self.bar = PhaseProgress() if show else None
        self._lock = threading.Lock()
        # Under reuse_verdicts: each judged item's key, the identical items waiting for its verdict, the items
        # waiting for another batch's judgement of their key, and those whose first's verdict could not stand for
        # them (judged after the batch's others, ``run``).
        self.reuse = reuse and ev.config.reuse_verdicts
        self.keys: dict[int, str] = {}
        self.first: dict[str, int] = {}
        self.followers: dict[int, list[int]] = {}
        self.elsewhere: list[tuple[int, Pending]] = []
        self.again: list[int] = []

    def done(self, i: int, result: EvalResult) -> None:
        with self._lock:
            self.results[i] = result
            waiting = self.followers.pop(i, [])
        if self.progress:
            self.progress(result)
        if i in self.keys:
            self.ev.verdicts.put(self.keys[i], result)
        if waiting and not reusable(result):
            with self._lock:
                self.again.extend(waiting)
            return
        for f in waiting:
            self.done(f, reused(result, self.items[f][1]))

    def _first_of_its_kind(self, i: int) -> bool:
        """Under reuse_verdicts: False when item ``i`` got a known verdict or waits for an identical item's, in this
        batch or in another one judging it now (then it is neither compiled nor run), True when it is to be judged
        (its key is then in flight for this batch)."""
        task, cand = self.items[i]
        key = self.ev.verdict_key(task, cand)
        if key in self.first:
            self.followers.setdefault(self.first[key], []).append(i)
            return False
        found = self.ev.verdicts.claim(key, cand)
        if isinstance(found, EvalResult):
            self.done(i, found)
            return False
        if isinstance(found, Pending):
            self.elsewhere.append((i, found))
            return False
        self.keys[i], self.first[key] = key, i
        return True

    def _show(self, method: str, *args: Any) -> None:
        if self.bar:
            with self._lock:
                getattr(self.bar, method)(*args)

    def compile_one(self, i: int, rank: int) -> None:
        task, cand = self.items[i]
        started = time.perf_counter()
        try:
            with self.ev.compile_slots.slot():
                began = time.monotonic()
                compiled = self.ev.compile(cand, rank)
                self.compile_intervals.append((began, time.monotonic()))
        finally:
            self.ev.compile_slots.add_demand(-1)
        self._show("advance", "compiling")
        if compiled.failure is not None:
            result = self.ev.failed(task, cand, compiled.failure, compiled.warnings)
            result.times.compile = compiled.compile_s
            result.times.total = time.perf_counter() - started
            self._show("add_total", "running", -1)
            self.done(i, result)
        else:
            self.compiled[i] = compiled
            self.run_q.put(i)

    def run_worker(self, device: str) -> None:
        ev = self.ev
        ahead = ev.prestart
        started: deque[tuple[int, Started]] = deque()
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
                started.append((i, ev.start_run(task, cand, self.compiled[i], device, gated=True)))
            if not started:
                return
            i, job = started.popleft()
            task, cand = self.items[i]
            began = time.monotonic()
            try:
                result = ev.run_phase(task, cand, self.compiled[i], device, job)
            except Exception as exc:  # a verdict, never a lost item
                job[0].cancel()
                result = score(EvalResult(task_id=task.task_id, candidate_id=cand.key, backend=ev.config.backend,
                                          status=Status.RUNTIME_ERROR, error=trim_error(f"evaluator: {exc}"),
                                          fault=Fault.EVALUATOR))
            self.run_intervals.append((device, began, time.monotonic()))
            self._show("advance", "running")
            _log.debug("run phase of %s on %s: %.1f s wall, %s %s, phases %s%s", cand.key, device,
                       time.monotonic() - began, result.status.value, result.rule_id,
                       {k: round(x, 2) for k, x in asdict(result.times).items() if x},
                       f", error: {result.error[:300]!r}" if result.error else "")
            self.done(i, result)

    def run(self) -> list[EvalResult]:
        try:
            self._judge()
        finally:
            for i, key in self.keys.items():  # keys it claimed and gave no verdict: their waiters judge their own
                if self.results[i] is None:
                    self.ev.verdicts.release(key)
        for i, pending in self.elsewhere:  # after its own keys are given, so two batches never wait on each other
            given = pending.wait()
            if given is not None and reusable(given):
                self.done(i, reused(given, self.items[i][1]))
            else:
                self.again.append(i)
        if self.again:
            # Repeats of a candidate whose verdict was the moment's (a timeout, a failure not the candidate's): each
            # judged on its own, not grouped again behind one of them.
            ev = self.ev
            rest = Batch(ev, [self.items[i] for i in self.again], None, False, reuse=False)
            for i, result in zip(self.again, rest.run()):
                self.done(i, result)
            self.run_intervals += rest.run_intervals
            self.compile_intervals += rest.compile_intervals
        return [r for r in self.results if r is not None]

    def _judge(self) -> None:
        """Judge the batch's own items: static rules, baselines, compiles, run phases."""
        ev = self.ev
        compile_q: list[int] = []
        for i, (task, cand) in enumerate(self.items):
            early = ev.static_check(task, cand)
            if early:
                self.done(i, early)
            elif not self.reuse or self._first_of_its_kind(i):
                compile_q.append(i)
        devices = ev.devices()
        baseline_tasks = list({self.items[i][0].task_id: self.items[i][0] for i in compile_q}.values())
        uncached = [t for t in baseline_tasks if ev.baselines.get(ev.baseline_key(t)) is None]
        self._show("set_total", "baselines", len(uncached))
        self._show("set_total", "compiling", len(compile_q))
        self._show("set_total", "running", len(compile_q))
        overlap = ev.config.target.overlaps_compiles
        runners = [threading.Thread(target=self.run_worker, args=(d,), daemon=True) for d in devices]
        # Baselines first, before any compile worker takes the cores: PyTorch eager's times are cached for every
        # later batch and must not carry this batch's load (cuDNN's host-side work slows down under it).
        ev.prefetch_baselines(baseline_tasks, devices[0], progress=lambda n, total: self._show("advance", "baselines"))
        if compile_q:
            ev.toolchain()  # headers prepared once, before the workers need them
        if overlap:
            for t in runners:
                t.start()
        ev.compile_slots.add_demand(len(compile_q))
        with ThreadPoolExecutor(max_workers=ev.compile_slots.workers) as pool:
            list(pool.map(self.compile_one, compile_q, range(len(compile_q))))
        if not overlap:
            for t in runners:
                t.start()
        for _ in runners:
            self.run_q.put(None)
        for t in runners:
            t.join()
        if self.bar:
            self.bar.close()


__all__ = ["Batch", "BatchHost", "CompileSlots", "Started", "compile_priority"]
