"""Batch evaluation spread over the machines of a Ray cluster: one Ray actor per GPU, each with its own Evaluator.

``ClusterEvaluator`` has the interface of ``Evaluator`` for batches (``evaluate_many``, ``close``, a context
manager), so a training loop switches between one machine and a cluster with one config value
(``ClusterConfig.enabled``, see ``batch_evaluator``).

What runs where:
- this process (the driver) only splits the batch and gathers verdicts; it needs no GPU and no compiler;
- every worker is a Ray actor that reserves one GPU (``num_gpus``; Ray sets its ``CUDA_VISIBLE_DEVICES``) and
  a share of its node's CPU cores (``num_cpus``) for its compile pool, its judge and the candidate's run
  process. It holds an ordinary ``Evaluator`` for its device, so static checks, compiles, the trusted checks,
  the run and the judge all happen on that node: the built libraries never cross machines, and the node's
  own cache (``KEVIN_CACHE_DIR`` there) keeps them and the node's baseline times;
- on the cpu backend a worker reserves CPU cores only.

A worker that dies (its process killed, its node lost) is restarted by Ray in place; the candidates it had not
yet returned are handed out again (split in two each time, so one candidate that keeps killing its worker
cannot take the others with it), and after ``max_attempts`` they come back as ``runtime_error`` verdicts that
say so. No candidate is ever dropped: ``evaluate_many`` returns one verdict per item, in input order.

Ray is imported inside the functions that use it: ``kevin`` imports without it (``pip install 'kevin[cluster]'``).

The parts live beside this module: the config and the pure planning (cluster_plan.py, no Ray), the body of a
worker's actor (cluster_worker.py) and the driver's loop over one batch (cluster_batch.py).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from typing import Any, Protocol

from kevin.evaluation.cluster_batch import ClusterBatch, Worker, first_line
from kevin.evaluation.cluster_plan import (BatchReport, ClusterConfig, Item, NodeSlots, WorkerInfo,
                                           plan_workers, ray_init_kwargs)
from kevin.evaluation.cluster_worker import EvalWorker
from kevin.evaluation.config import EvalConfig
from kevin.records.evaluation import EvalResult, ProgressFn

_log = logging.getLogger(__name__)


class BatchEvaluator(Protocol):
    """What a training loop needs from an evaluator of batches (Evaluator and ClusterEvaluator both are one)."""

    def evaluate_many(self, items: Iterable[Item], progress: ProgressFn | None = None,
                      show_progress: bool = False) -> list[EvalResult]: ...

    def close(self) -> None: ...


# --------------------------------------------------------------------------------------- the driver


class ClusterEvaluator:
    """Judges batches on the workers of a Ray cluster; the interface of ``Evaluator`` for batches."""

    def __init__(self, config: EvalConfig | None = None, cluster: ClusterConfig | None = None):
        self.config = config or EvalConfig()
        self.cluster = cluster or ClusterConfig(enabled=True)
        if self.config.gpus:
            raise ValueError("evaluation.gpus picks GPUs of one machine; on a Ray cluster every worker runs on the GPU Ray "
                             "gives it: leave evaluation.gpus empty (cluster.gpus_per_worker sets how many per worker)")
        import ray

        self._owns_ray = False
        if not ray.is_initialized():
            ray.init(**ray_init_kwargs(self.cluster))
            self._owns_ray = True
        self.last_report = BatchReport()
        self.replacements: list[str] = []
        """Every worker restart seen since the start (label: old pid -> new pid)."""
        self._workers: list[Worker] = []
        self._lock = threading.Lock()
        try:
            self._start_workers()
        except BaseException:
            self.close()
            raise

    # -- workers ------------------------------------------------------------------------------------

    def _nodes(self) -> list[NodeSlots]:
        import ray

        return [NodeSlots(node_id=n["NodeID"], ip=n.get("NodeManagerAddress", ""), cpus=int(n["Resources"].get("CPU", 0)),
                          gpus=int(n["Resources"].get("GPU", 0)))
                for n in ray.nodes() if n.get("Alive")]

    def _start_workers(self) -> None:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        nodes = self._nodes()
        specs = plan_workers(nodes, self.config.backend, self.cluster, self.config.compile_workers)
        if not specs:
            what = "GPUs" if self.config.target.is_gpu else "CPU cores"
            raise RuntimeError(f"the Ray cluster offers no {what} for an evaluation worker (nodes: "
                               f"{[(n.ip, n.cpus, n.gpus) for n in nodes]} as (ip, CPUs, GPUs)); start its nodes with "
                               "`ray start ... --num-gpus N`, or use backend cpu")
        actor = ray.remote(EvalWorker)
        for spec in specs:
            cfg = EvalConfig.from_dict({**self.config.to_dict(), "compile_workers": spec.compile_workers,
                                        "cpu_cores": spec.num_cpus})
            # soft affinity: the worker starts on its node, and a restart may go elsewhere if that node is gone.
            handle = actor.options(
                num_cpus=spec.num_cpus, num_gpus=spec.num_gpus, max_restarts=self.cluster.max_restarts, max_task_retries=0,
                max_concurrency=2, scheduling_strategy=NodeAffinitySchedulingStrategy(spec.node_id, soft=True),
            ).remote(cfg, spec)
            self._workers.append(Worker(spec, handle))
        infos = self._ask([w.handle.info.remote() for w in self._workers], self.cluster.start_timeout_s)
        missing = [w.spec.label for w, info in zip(self._workers, infos) if not isinstance(info, WorkerInfo)]
        if missing:
            raise RuntimeError(f"evaluation workers {missing} did not start within {self.cluster.start_timeout_s:.0f} s: "
                               f"{[str(i)[:300] for i in infos if not isinstance(i, WorkerInfo)][:2]}")
        for w, info in zip(self._workers, infos):
            w.pid = info.pid
            _log.info("evaluation worker %s on %s (pid %d): devices %s, GPUs %s, %d cores, %d compile workers", info.label,
                      info.hostname, info.pid, info.devices, info.gpu_ids or "-", info.num_cpus, info.compile_workers)

    @staticmethod
    def _ask(refs: list[Any], timeout: float) -> list[Any]:
        """Answers to ``refs`` in order: a value, or the exception (or TimeoutError) that stood in its way."""
        import ray

        if not refs:
            return []
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout)
        done = set(ready)
        out: list[Any] = []
        for ref in refs:
            if ref not in done:
                out.append(TimeoutError(f"no answer within {timeout:.0f} s"))
                continue
            try:
                out.append(ray.get(ref))
            except Exception as exc:  # a dead worker answers with its death
                out.append(exc)
        return out

    def seen(self, worker: Worker, answer: Any, report: BatchReport | None = None) -> bool:
        """Take in a worker's answer to ``info`` (or what stood in its way); True when the worker is up. A new pid
        is a restart (recorded); a worker Ray will not bring back is left out for good."""
        import ray

        with self._lock:
            if isinstance(answer, WorkerInfo):
                if answer.pid != worker.pid:
                    note = f"{worker.spec.label}: pid {worker.pid} -> {answer.pid}"
                    self.replacements.append(note)
                    if report is not None:
                        report.replaced.append(note)
                    _log.warning("evaluation worker %s restarted (pid %d -> %d)", worker.spec.label, worker.pid, answer.pid)
                    worker.pid = answer.pid
                worker.restarting_since = None
                return True
            if isinstance(answer, (ray.exceptions.ActorUnavailableError, TimeoutError)):
                if worker.restarting_since is None:
                    worker.restarting_since = time.monotonic()
                if time.monotonic() - worker.restarting_since <= self.cluster.start_timeout_s:
                    return False  # restarting (or busy past the wait): asked again later
                why = f"not back within {self.cluster.start_timeout_s:.0f} s"
            else:  # ActorDiedError: its restarts are spent, or it cannot be placed anywhere
                why = f"not restarted ({type(answer).__name__}: {first_line(answer)})"
            if worker.alive:
                self._drop(worker, why, report)
            return False

    def _drop(self, worker: Worker, why: str, report: BatchReport | None) -> None:
        import ray

        worker.alive = False
        if report is not None:
            report.given_up.append(f"{worker.spec.label}: {why}")
        _log.warning("evaluation worker %s left out: %s", worker.spec.label, why)
        try:
            ray.kill(worker.handle)
        except Exception:  # already gone
            pass

    def workers(self) -> list[WorkerInfo]:
        """The workers up now, as they report themselves; a worker restarting (or not answering within 30 s) is left
        out of the list, and a restart it went through is added to ``replacements``."""
        live = self.live_workers()
        answers = self._ask([w.handle.info.remote() for w in live], 30.0)
        return [a for w, a in zip(live, answers) if self.seen(w, a)]

    def live_workers(self) -> list[Worker]:
        """The workers not left out for good (some may be restarting)."""
        return [w for w in self._workers if w.alive]

    def worker_handles(self) -> dict[str, Any]:
        """The Ray actor handle of each worker in use, by label (to call or kill one directly)."""
        return {w.spec.label: w.handle for w in self._workers if w.alive}

    # -- batches ------------------------------------------------------------------------------------

    def evaluate_many(self, items: Iterable[Item], progress: ProgressFn | None = None,
                      show_progress: bool = False) -> list[EvalResult]:
        """Judge a batch on the cluster's workers; one verdict per item, in input order."""
        run = ClusterBatch(self, list(items), progress, show_progress)
        try:
            return run.run()
        finally:
            self.last_report = run.report

    # -- lifecycle ----------------------------------------------------------------------------------

    def close(self) -> None:
        """End the workers (their judges first) and, when this evaluator started it, the local Ray cluster."""
        import ray

        workers, self._workers = self._workers, []
        if ray.is_initialized():
            self._ask([w.handle.close.remote() for w in workers if w.alive and w.restarting_since is None], 60.0)
            for w in workers:
                try:
                    ray.kill(w.handle)
                except Exception:  # already gone
                    pass
            if self._owns_ray:
                ray.shutdown()
        self._owns_ray = False

    def __enter__(self) -> ClusterEvaluator:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def batch_evaluator(config: EvalConfig | None = None, cluster: ClusterConfig | None = None) -> BatchEvaluator:
    """The batch evaluator a run asks for: a ClusterEvaluator when ``cluster.enabled``, else an Evaluator on this
    machine. Both have ``evaluate_many`` and ``close`` and are context managers."""
    if cluster is not None and cluster.enabled:
        return ClusterEvaluator(config, cluster)
    from kevin.evaluation.evaluator import Evaluator

    return Evaluator(config)


# ClusterConfig and BatchReport stay importable from here: the documented way in (docs/cluster.md).
__all__ = ["BatchEvaluator", "BatchReport", "ClusterConfig", "ClusterEvaluator", "batch_evaluator"]

