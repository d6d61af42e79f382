"""The body of one evaluation worker of a Ray cluster: an ordinary Evaluator for the devices Ray gave its process.

It runs in the worker's process on its node (``ray.remote(EvalWorker)`` in cluster.py), so it must stay importable
by this path there. It judges the chunks the driver hands it and keeps each verdict for ``finished`` as soon as it is
known, so the driver holds it even if this process dies before the chunk ends.
"""

from __future__ import annotations

import os
import socket
import threading
from collections import deque
from typing import TYPE_CHECKING

from kevin.evaluation.cluster_plan import Item, WorkerInfo, WorkerSpec, lost_verdict
from kevin.evaluation.config import EvalConfig
from kevin.records.evaluation import EvalResult

if TYPE_CHECKING:
    from kevin.evaluation.evaluator import Evaluator


class EvalWorker:
    """The body of one Ray actor: an Evaluator for the devices Ray gave this process.

    A threaded actor (two calls at once), so ``finished`` and ``info`` answer while ``evaluate`` runs."""

    def __init__(self, config: EvalConfig, spec: WorkerSpec):
        from kevin.evaluation.evaluator import Evaluator

        self.spec = spec
        self.evaluator: Evaluator = Evaluator(config)
        self._lock = threading.Lock()
        self._done: list[tuple[int, EvalResult]] = []
        self._judged = 0
        self._busy = 0

    def info(self) -> WorkerInfo:
        import ray

        ctx = ray.get_runtime_context()
        with self._lock:
            judged, busy = self._judged, self._busy
        return WorkerInfo(label=self.spec.label, hostname=socket.gethostname(), ip=ray.util.get_node_ip_address(),
                          node_id=ctx.get_node_id(), pid=os.getpid(), devices=self.evaluator.devices(),
                          gpu_ids=[str(g) for g in ctx.get_accelerator_ids().get("GPU", [])], num_cpus=self.spec.num_cpus,
                          compile_workers=self.spec.compile_workers, judged=judged, busy=busy)

    def evaluate(self, positions: list[int], items: list[Item]) -> list[tuple[int, EvalResult]]:
        """Judge ``items`` (at ``positions`` of the driver's batch); each verdict is also kept for ``finished``
        as soon as it is known, so the driver holds it even if this process dies before the chunk ends."""
        pending: dict[tuple[str, str], deque[int]] = {}
        reported: dict[int, EvalResult] = {}
        for pos, (task, cand) in zip(positions, items):
            pending.setdefault((task.task_id, cand.key), deque()).append(pos)
        with self._lock:
            self._done.clear()
            self._busy = len(items)

        def one_done(result: EvalResult) -> None:
            # Verdicts of identical candidates (same task and key) are interchangeable: they go to positions in turn.
            with self._lock:
                slots = pending.get((result.task_id, result.candidate_id))
                if slots:
                    pos = slots.popleft()
                    reported[pos] = result
                    self._done.append((pos, result))
                    self._judged += 1
                    self._busy = max(0, self._busy - 1)

        try:
            results = self.evaluator.evaluate_many(items, progress=one_done)
        finally:
            with self._lock:
                self._busy = 0
        if len(results) == len(items):
            return list(zip(positions, results))
        # The evaluator returned fewer verdicts than candidates: keep those it reported one by one, the rest are lost.
        with self._lock:
            seen = dict(reported)
        backend = self.evaluator.config.backend
        return [(pos, seen.get(pos) or lost_verdict(task, cand, backend, f"worker {self.spec.label} returned no verdict"))
                for pos, (task, cand) in zip(positions, items)]

    def finished(self) -> list[tuple[int, EvalResult]]:
        """Verdicts of the current chunk known since the last call."""
        with self._lock:
            done, self._done = self._done, []
        return done

    def close(self) -> None:
        self.evaluator.close()


__all__ = ["EvalWorker"]
