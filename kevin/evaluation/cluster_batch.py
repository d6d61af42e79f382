"""One batch on a Ray cluster, seen from the driver: hands chunks to idle workers, gathers verdicts as workers finish
them, and hands out again what a dead worker left unjudged.

It reaches its evaluator only through ``ClusterHost`` (``ClusterEvaluator`` is one). Ray is imported inside the
functions that use it.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Protocol

from kevin.evaluation.cluster_plan import (BatchReport, ClusterConfig, Item, WorkerSpec, lost_verdict,
                                           plan_chunks, split_for_retry)
from kevin.evaluation.config import EvalConfig
from kevin.records.evaluation import EvalResult, ProgressFn

_log = logging.getLogger(__name__)

# How often the driver asks busy workers for the verdicts they finished, and how long it waits for those answers.
_POLL_S = 2.0
_POLL_WAIT_S = 5.0
_REPROBE_S = 1.0  # how often a restarting worker is asked whether it is back


@dataclass
class Worker:
    """The driver's record of one worker: its actor, and whether it is up."""

    spec: WorkerSpec
    handle: Any
    pid: int = 0
    alive: bool = True
    restarting_since: float | None = None
    """When its process was seen dead; None while it is known to be up."""


@dataclass
class Chunk:
    """Positions of the batch handed to one worker at a time; ``attempt``: how many times they were handed out."""

    positions: list[int]
    attempt: int = 1


class ClusterHost(Protocol):
    """What a cluster batch needs from its evaluator."""

    config: EvalConfig
    cluster: ClusterConfig

    def live_workers(self) -> list[Worker]: ...

    def seen(self, worker: Worker, answer: Any, report: BatchReport | None = None) -> bool: ...


class ClusterBatch:
    """One ``evaluate_many`` call on the cluster: hands chunks to idle workers, gathers verdicts as workers finish
    them, and hands out again what a dead worker left unjudged."""

    def __init__(self, ev: ClusterHost, items: list[Item], progress: ProgressFn | None, show: bool):
        self.ev, self.items, self.progress = ev, items, progress
        self.backend = ev.config.backend
        self.results: list[EvalResult | None] = [None] * len(items)
        self.report = BatchReport(judged_by=[""] * len(items))
        self.final: set[int] = set()
        self.bar = _Bar(len(items)) if show and items else None
        self.pending: deque[Chunk] = deque()
        self.idle: deque[Worker] = deque()
        self.chunks: dict[Any, tuple[Worker, Chunk]] = {}   # evaluate calls in flight
        self.probes: dict[Any, Worker] = {}                  # info calls to workers seen dead: back, or gone?
        self.polls: dict[Any, tuple[Worker, float]] = {}     # finished calls to busy workers, and when they were sent
        self.later: dict[int, tuple[Worker, float]] = {}     # workers still restarting, by id: when to ask again

    def keep(self, pos: int, result: EvalResult, label: str, final: bool = True) -> None:
        """A verdict for ``pos``: streamed by a poll (``final`` False) or in a chunk's answer, which wins (a late poll
        answer never replaces it)."""
        if pos in self.final:
            return
        if self.results[pos] is None:  # progress counts the first verdict; the chunk's answer restates it
            if self.progress:
                self.progress(result)
            if self.bar:
                self.bar.advance()
        self.results[pos] = result
        self.report.judged_by[pos] = label
        if final:
            self.final.add(pos)

    def give_up(self, positions: list[int], why: str) -> None:
        for pos in positions:
            if self.results[pos] is None:
                task, cand = self.items[pos]
                self.keep(pos, lost_verdict(task, cand, self.backend, why), "")

    def failed(self, worker: Worker, chunk: Chunk, why: str) -> None:
        """A chunk came back without its verdicts: hand out again what is unjudged, or give it up."""
        left = [p for p in chunk.positions if self.results[p] is None]
        self.report.failures.append(f"{worker.spec.label}: {why} ({len(left)} of {len(chunk.positions)} candidates unjudged)")
        _log.warning("evaluation worker %s failed with %d candidates unjudged (attempt %d of %d): %s", worker.spec.label,
                     len(left), chunk.attempt, self.ev.cluster.max_attempts, why)
        if not left:
            return
        if chunk.attempt >= self.ev.cluster.max_attempts:
            self.give_up(left, f"no verdict after {chunk.attempt} attempt(s): the evaluation worker judging it failed "
                               f"({why})")
            return
        self.pending.extend(Chunk(part, chunk.attempt + 1) for part in split_for_retry(left) if part)

    def probe(self, worker: Worker) -> None:
        self.probes[worker.handle.info.remote()] = worker

    def run(self) -> list[EvalResult]:
        import ray

        ev = self.ev
        live = ev.live_workers()
        self.pending.extend(Chunk(c) for c in plan_chunks([t.task_id for t, _ in self.items], len(live), ev.cluster.chunk_size))
        for worker in live:
            if worker.restarting_since is None:
                self.idle.append(worker)
            else:  # seen dead in an earlier batch and not yet back
                self.probe(worker)
        last_poll = time.monotonic()
        try:
            while self.pending or self.chunks:
                while self.pending and self.idle:
                    worker, chunk = self.idle.popleft(), self.pending.popleft()
                    ref = worker.handle.evaluate.remote(chunk.positions, [self.items[p] for p in chunk.positions])
                    self.chunks[ref] = (worker, chunk)
                if not self.chunks and not self.probes and not self.later:
                    self.give_up([p for c in self.pending for p in c.positions], "no evaluation worker is left on the cluster")
                    self.pending.clear()
                    break
                waiting = list(self.chunks) + list(self.probes) + list(self.polls)
                if waiting:
                    ready, _ = ray.wait(waiting, num_returns=1, timeout=_REPROBE_S if self.later else _POLL_S)
                else:
                    ready = []
                    time.sleep(_REPROBE_S)
                for ref in ready:
                    if ref in self.chunks:
                        self._chunk_back(ref, *self.chunks.pop(ref))
                    elif ref in self.probes:
                        self._probe_back(ref, self.probes.pop(ref))
                    else:
                        self._poll_back(ref, self.polls.pop(ref)[0])
                now = time.monotonic()
                for key, (worker, at) in list(self.later.items()):
                    if at <= now:
                        del self.later[key]
                        self.probe(worker)
                for ref, (worker, sent) in list(self.polls.items()):
                    if now - sent > _POLL_WAIT_S:  # not answered: its worker is dying or restarting; its chunk will say
                        del self.polls[ref]
                if now - last_poll >= _POLL_S:
                    last_poll = now
                    asked = {id(w) for w, _ in self.polls.values()}
                    for worker, _ in self.chunks.values():
                        if id(worker) not in asked:
                            self.polls[worker.handle.finished.remote()] = (worker, now)
        finally:
            if self.bar:
                self.bar.close()
        # Workers still restarting stay marked (restarting_since): the next batch or ``workers()`` asks again.
        for pos, result in enumerate(self.results):  # every path above fills each position; this is the guard
            if result is None:
                task, cand = self.items[pos]
                self.results[pos] = lost_verdict(task, cand, self.backend, "the cluster batch ended without its verdict")
        return [r for r in self.results if r is not None]

    def _chunk_back(self, ref: Any, worker: Worker, chunk: Chunk) -> None:
        import ray

        try:
            answered = ray.get(ref)
        except ray.exceptions.RayActorError as exc:  # the worker's process died: Ray restarts it (max_restarts)
            worker.restarting_since = time.monotonic()
            self.failed(worker, chunk, f"its process died ({type(exc).__name__})")
            self.probe(worker)
            return
        except Exception as exc:  # the evaluator raised; the worker itself is fine
            self.failed(worker, chunk, f"its evaluator failed: {first_line(exc)}")
            self.idle.append(worker)
            return
        for pos, result in answered:
            self.keep(pos, result, worker.spec.label)
        self.idle.append(worker)

    def _probe_back(self, ref: Any, worker: Worker) -> None:
        try:
            answer: Any = _get(ref)
        except Exception as exc:
            answer = exc
        if self.ev.seen(worker, answer, self.report):
            self.idle.append(worker)
        elif worker.alive:  # still restarting: ask again in a moment
            self.later[id(worker)] = (worker, time.monotonic() + _REPROBE_S)

    def _poll_back(self, ref: Any, worker: Worker) -> None:
        try:
            done = _get(ref)
        except Exception:  # the worker died meanwhile: its chunk's answer says so
            return
        for pos, result in done:
            self.keep(pos, result, worker.spec.label, final=False)


def _get(ref: Any) -> Any:
    """``ray.get`` of one reference that is ready (its value, or the exception that stands in its way is raised)."""
    import ray

    return ray.get(ref)


class _Bar:
    """Candidates judged on the cluster, as a rich progress bar on stderr."""

    def __init__(self, total: int):
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

        self._progress = Progress(TextColumn("judged"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                  TextColumn("left"), TimeRemainingColumn(), console=Console(stderr=True))
        self._task = self._progress.add_task("judged", total=total)
        self._progress.start()

    def advance(self) -> None:
        self._progress.advance(self._task)

    def close(self) -> None:
        self._progress.stop()


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines()[-1] if text else type(exc).__name__)[:500]


__all__ = ["ClusterBatch", "ClusterHost", "Worker", "first_line"]
