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
"""

from __future__ import annotations

import logging
import math
import os
import re
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from kevin.evaluation.config import EvalConfig
from kevin.records.evaluation import Candidate, EvalResult, Status, trim_error
from kevin.settings import Settings
from kevin.tasks.task import Task

if TYPE_CHECKING:
    from kevin.evaluation.evaluator import Evaluator

_log = logging.getLogger(__name__)

ProgressFn = Callable[[EvalResult], None]
Item = tuple[Task, Candidate]

# How often the driver asks busy workers for the verdicts they finished, and how long it waits for those answers.
_POLL_S = 2.0
_POLL_WAIT_S = 5.0
_REPROBE_S = 1.0  # how often a restarting worker is asked whether it is back
_ADDRESS = re.compile(r"^(auto|ray://[^\s:/]+:\d+|[^\s:/]+:\d+)$")


# ----------------------------------------------------------------------------------------------- config


@dataclass
class ClusterConfig(Settings):
    """Where the evaluation workers run and what each of them reserves."""

    section = "cluster"

    enabled: bool = False
    """Evaluate batches on a Ray cluster (``ClusterEvaluator``) instead of this process's ``Evaluator``."""

    address: str = ""
    """The Ray cluster: "" starts a one-machine cluster inside this process (ended by ``close``); "auto" joins
    the cluster this machine belongs to (``ray start --head`` / ``ray start --address=HEAD:6379`` ran here);
    "HEAD:6379" joins that cluster's head directly; "ray://HEAD:10001" connects through Ray Client from a
    machine outside the cluster. A process already connected to Ray (a flow under prefect-ray's
    RayTaskRunner, a test) keeps its connection whatever this says."""

    workers_per_node: int = 0
    """Workers on each node; 0 fits them to the node: one per ``gpus_per_worker`` GPUs on cuda (nodes without
    GPUs get none), one per ``cpus_per_worker`` cores on cpu (one per node when that is 0 too, so runs timed on
    the cpu backend are not slowed by another worker's compiles). More than fit is capped to what fits."""

    cpus_per_worker: int = 0
    """CPU cores each worker reserves (its compile pool, its judge and the candidate's process); 0 shares the
    node's cores equally among its workers."""

    gpus_per_worker: int = 1
    """cuda: GPUs each worker reserves; its Evaluator runs one candidate at a time on each of them. Whole GPUs
    only: two workers timing on one GPU would skew each other's timings."""

    chunk_size: int = 0
    """Candidates handed to a worker at a time (candidates of one task kept together); 0 splits the batch
    evenly, one share per worker (the best overlap of compiles and runs inside a worker). Smaller chunks balance
    uneven work across workers."""

    max_attempts: int = 3
    """Times a candidate is handed to a worker before it comes back as a runtime_error verdict, when the
    workers it was handed to died (or their evaluator failed) before judging it."""

    max_restarts: int = 3
    """Times Ray restarts a worker whose process died (on its node, or elsewhere if the node is gone); -1
    restarts it whenever it dies. A worker past this is left out for the rest of the evaluator's life."""

    start_timeout_s: float = 300.0
    """How long a worker may take to start or restart (placing it, importing the evaluator) before it is
    given up."""

    local_cpus: int = 0
    """address "": CPU cores the in-process cluster offers; 0 offers every core of this machine (its GPUs are
    found by Ray)."""

    namespace: str = "kevin"
    """Ray namespace of the workers (the namespace the connection is made in)."""

    runtime_env: dict[str, Any] = field(default_factory=dict)
    """Ray runtime environment for the connection ({} none), e.g. {"env_vars": {"KEVIN_CACHE_DIR": "/scratch/kevin"}}.
    Every node needs kevin, torch and a compiler installed; ``{"py_modules": ["/path/to/kevin"]}`` ships this
    checkout's kevin package to the nodes."""

    def __post_init__(self) -> None:
        if self.address and not _ADDRESS.match(self.address):
            raise ValueError(f"cluster.address {self.address!r} is not a Ray address: use \"\" (a cluster in this process), "
                             "\"auto\", \"HEAD:6379\" or \"ray://HEAD:10001\"")
        if self.workers_per_node < 0 or self.cpus_per_worker < 0 or self.local_cpus < 0:
            raise ValueError("cluster.workers_per_node, cpus_per_worker and local_cpus must be >= 0 (0: fit to the node)")
        if isinstance(self.gpus_per_worker, float) and self.gpus_per_worker.is_integer():
            self.gpus_per_worker = int(self.gpus_per_worker)
        if not isinstance(self.gpus_per_worker, int) or self.gpus_per_worker < 1:
            raise ValueError(f"cluster.gpus_per_worker must be a whole number >= 1, got {self.gpus_per_worker!r} "
                             "(a GPU shared by two workers would skew both workers' timings)")
        if self.chunk_size < 0:
            raise ValueError("cluster.chunk_size must be >= 0 (0: the batch split evenly over the workers)")
        if self.max_attempts < 1:
            raise ValueError("cluster.max_attempts must be >= 1 (1: a candidate whose worker died is not retried)")
        if self.max_restarts < -1:
            raise ValueError("cluster.max_restarts must be >= 0, or -1 for no limit")
        if not (0 < self.start_timeout_s < math.inf):
            raise ValueError("cluster.start_timeout_s must be positive, finite seconds")
        if not self.namespace:
            raise ValueError("cluster.namespace must not be empty")
        if not isinstance(self.runtime_env, dict):
            raise ValueError("cluster.runtime_env must be a mapping (a Ray runtime environment), e.g. {}")


# ------------------------------------------------------------------------------------------ pure parts


@dataclass(frozen=True)
class NodeSlots:
    """What one alive node of the cluster offers (Ray's resource counts)."""

    node_id: str
    ip: str
    cpus: int
    gpus: int


@dataclass(frozen=True)
class WorkerSpec:
    """One worker to start: where, and what it reserves."""

    label: str
    """``<node ip>#<k>``: the worker's name in logs and in ``BatchReport.judged_by``."""
    node_id: str
    num_cpus: int
    num_gpus: int
    compile_workers: int
    """Its Evaluator's compile pool."""


def ray_init_kwargs(cfg: ClusterConfig) -> dict[str, Any]:
    """The arguments of ``ray.init`` for ``cfg``: a local cluster gets its cores and no dashboard; a cluster
    that already runs is only joined (Ray refuses resource arguments then)."""
    kwargs: dict[str, Any] = {"namespace": cfg.namespace}
    if cfg.runtime_env:
        kwargs["runtime_env"] = dict(cfg.runtime_env)
    if cfg.address:
        kwargs["address"] = cfg.address
    else:
        kwargs["include_dashboard"] = False
        if cfg.local_cpus:
            kwargs["num_cpus"] = cfg.local_cpus
    return kwargs


def worker_compile_pool(num_cpus: int, num_gpus: int, configured: int = 0) -> int:
    """A worker's compile processes: ``configured`` when set, else its cores minus two per device it runs
    candidates on (the run process and the candidate's host code; the cpu backend counts one device), at least
    one. The same rule as the Evaluator's own default, over the worker's cores instead of the machine's."""
    if configured:
        return configured
    return max(1, num_cpus - 2 * max(1, num_gpus))


def plan_workers(nodes: Iterable[NodeSlots], backend: str, cfg: ClusterConfig, compile_workers: int = 0) -> list[WorkerSpec]:
    """The workers to start on ``nodes``: per node, as many as ``cfg`` asks and the node's resources hold."""
    specs: list[WorkerSpec] = []
    for node in sorted(nodes, key=lambda n: (n.ip, n.node_id)):
        cuda = backend == "cuda"
        gpus = cfg.gpus_per_worker if cuda else 0
        fits = node.gpus // gpus if cuda else node.cpus
        if cfg.cpus_per_worker:
            fits = min(fits, node.cpus // cfg.cpus_per_worker)
        fits = min(fits, node.cpus)  # every worker reserves at least one core
        if cfg.workers_per_node:
            count = min(cfg.workers_per_node, fits)
        else:
            count = fits if cuda or cfg.cpus_per_worker else min(1, fits)
        if cfg.workers_per_node > fits:
            _log.warning("node %s holds %d evaluation workers, not the %d asked for", node.ip, fits, cfg.workers_per_node)
        if count <= 0:
            continue
        cpus = cfg.cpus_per_worker or max(1, node.cpus // count)
        for k in range(count):
            specs.append(WorkerSpec(label=f"{node.ip}#{k}", node_id=node.node_id, num_cpus=cpus, num_gpus=gpus,
                                    compile_workers=worker_compile_pool(cpus, gpus, compile_workers)))
    return specs


def plan_chunks(task_ids: list[str], workers: int, chunk_size: int = 0) -> list[list[int]]:
    """Positions of a batch cut into chunks: candidates of one task kept together (tasks in order of first
    appearance, candidates in input order within a task), ``chunk_size`` per chunk or, when 0, an even share per
    worker (sizes differing by at most one)."""
    if not task_ids:
        return []
    first: dict[str, list[int]] = {}
    for i, task_id in enumerate(task_ids):
        first.setdefault(task_id, []).append(i)
    order = [i for positions in first.values() for i in positions]
    if chunk_size:
        return [order[k:k + chunk_size] for k in range(0, len(order), chunk_size)]
    parts = max(1, min(workers, len(order)))
    base, extra = divmod(len(order), parts)
    chunks, start = [], 0
    for k in range(parts):
        size = base + (1 if k < extra else 0)
        chunks.append(order[start:start + size])
        start += size
    return chunks


def split_for_retry(positions: list[int]) -> list[list[int]]:
    """A chunk handed out again after its worker died: in two halves (one chunk when a single candidate), so a
    candidate that kills every worker it reaches takes fewer of the others with it each time."""
    if len(positions) <= 1:
        return [list(positions)]
    half = (len(positions) + 1) // 2
    return [positions[:half], positions[half:]]


def lost_verdict(task: Task, candidate: Candidate, backend: str, why: str) -> EvalResult:
    """The verdict of a candidate no worker could judge: a runtime_error that says why (score 0)."""
    from kevin.evaluation.verdict import score

    return score(EvalResult(task_id=task.task_id, candidate_id=candidate.key, backend=backend, status=Status.RUNTIME_ERROR,
                            error=trim_error(f"evaluator: {why}")))


# ----------------------------------------------------------------------------------------- records


@dataclass
class WorkerInfo:
    """A worker as it reports itself."""

    label: str
    hostname: str
    ip: str
    node_id: str
    pid: int
    devices: list[str]
    """The devices its Evaluator runs candidates on (``cuda:0`` is the GPU Ray gave it)."""
    gpu_ids: list[str]
    """The node's GPU indices Ray assigned to it (its CUDA_VISIBLE_DEVICES); [] on the cpu backend."""
    num_cpus: int
    compile_workers: int
    judged: int
    """Verdicts it returned since it (last) started."""
    busy: int
    """Candidates of its current chunk not yet judged."""


@dataclass
class BatchReport:
    """What happened to the last batch on the cluster."""

    judged_by: list[str] = field(default_factory=list)
    """Per input position: the label of the worker whose verdict was returned ("" for a lost_verdict)."""
    failures: list[str] = field(default_factory=list)
    """Each time a worker died or its evaluator failed with candidates in hand: who, and why."""
    replaced: list[str] = field(default_factory=list)
    """Workers Ray restarted after a failure (label: old pid -> new pid)."""
    given_up: list[str] = field(default_factory=list)
    """Workers left out for good (restarts spent, node gone, or not back within start_timeout_s)."""


class BatchEvaluator(Protocol):
    """What a training loop needs from an evaluator of batches (Evaluator and ClusterEvaluator both are one)."""

    def evaluate_many(self, items: Iterable[Item], progress: ProgressFn | None = None,
                      show_progress: bool = False) -> list[EvalResult]: ...

    def close(self) -> None: ...


# --------------------------------------------------------------------------------------- the worker


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


# --------------------------------------------------------------------------------------- the driver


@dataclass
class _Worker:
    spec: WorkerSpec
    handle: Any
    pid: int = 0
    alive: bool = True
    restarting_since: float | None = None
    """When its process was seen dead; None while it is known to be up."""


@dataclass
class _Chunk:
    positions: list[int]
    attempt: int = 1


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
        self._workers: list[_Worker] = []
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
            what = "GPUs" if self.config.backend == "cuda" else "CPU cores"
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
            self._workers.append(_Worker(spec, handle))
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

    def _seen(self, worker: _Worker, answer: Any, report: BatchReport | None = None) -> bool:
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
                why = f"not restarted ({type(answer).__name__}: {_first_line(answer)})"
            if worker.alive:
                self._drop(worker, why, report)
            return False

    def _drop(self, worker: _Worker, why: str, report: BatchReport | None) -> None:
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
        live = [w for w in self._workers if w.alive]
        answers = self._ask([w.handle.info.remote() for w in live], 30.0)
        return [a for w, a in zip(live, answers) if self._seen(w, a)]

    def worker_handles(self) -> dict[str, Any]:
        """The Ray actor handle of each worker in use, by label (to call or kill one directly)."""
        return {w.spec.label: w.handle for w in self._workers if w.alive}

    # -- batches ------------------------------------------------------------------------------------

    def evaluate_many(self, items: Iterable[Item], progress: ProgressFn | None = None,
                      show_progress: bool = False) -> list[EvalResult]:
        """Judge a batch on the cluster's workers; one verdict per item, in input order."""
        run = _ClusterBatch(self, list(items), progress, show_progress)
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


class _ClusterBatch:
    """One ``evaluate_many`` call on the cluster: hands chunks to idle workers, gathers verdicts as workers finish
    them, and hands out again what a dead worker left unjudged."""

    def __init__(self, ev: ClusterEvaluator, items: list[Item], progress: ProgressFn | None, show: bool):
        self.ev, self.items, self.progress = ev, items, progress
        self.backend = ev.config.backend
        self.results: list[EvalResult | None] = [None] * len(items)
        self.report = BatchReport(judged_by=[""] * len(items))
        self.final: set[int] = set()
        self.bar = _Bar(len(items)) if show and items else None
        self.pending: deque[_Chunk] = deque()
        self.idle: deque[_Worker] = deque()
        self.chunks: dict[Any, tuple[_Worker, _Chunk]] = {}   # evaluate calls in flight
        self.probes: dict[Any, _Worker] = {}                  # info calls to workers seen dead: back, or gone?
        self.polls: dict[Any, tuple[_Worker, float]] = {}     # finished calls to busy workers, and when they were sent
        self.later: dict[int, tuple[_Worker, float]] = {}     # workers still restarting, by id: when to ask again

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

    def failed(self, worker: _Worker, chunk: _Chunk, why: str) -> None:
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
        self.pending.extend(_Chunk(part, chunk.attempt + 1) for part in split_for_retry(left) if part)

    def probe(self, worker: _Worker) -> None:
        self.probes[worker.handle.info.remote()] = worker

    def run(self) -> list[EvalResult]:
        import ray

        ev = self.ev
        live = [w for w in ev._workers if w.alive]
        self.pending.extend(_Chunk(c) for c in plan_chunks([t.task_id for t, _ in self.items], len(live), ev.cluster.chunk_size))
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

    def _chunk_back(self, ref: Any, worker: _Worker, chunk: _Chunk) -> None:
        import ray

        try:
            answered = ray.get(ref)
        except ray.exceptions.RayActorError as exc:  # the worker's process died: Ray restarts it (max_restarts)
            worker.restarting_since = time.monotonic()
            self.failed(worker, chunk, f"its process died ({type(exc).__name__})")
            self.probe(worker)
            return
        except Exception as exc:  # the evaluator raised; the worker itself is fine
            self.failed(worker, chunk, f"its evaluator failed: {_first_line(exc)}")
            self.idle.append(worker)
            return
        for pos, result in answered:
            self.keep(pos, result, worker.spec.label)
        self.idle.append(worker)

    def _probe_back(self, ref: Any, worker: _Worker) -> None:
        try:
            answer: Any = _get(ref)
        except Exception as exc:
            answer = exc
        if self.ev._seen(worker, answer, self.report):
            self.idle.append(worker)
        elif worker.alive:  # still restarting: ask again in a moment
            self.later[id(worker)] = (worker, time.monotonic() + _REPROBE_S)

    def _poll_back(self, ref: Any, worker: _Worker) -> None:
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


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines()[-1] if text else type(exc).__name__)[:500]


def batch_evaluator(config: EvalConfig | None = None, cluster: ClusterConfig | None = None) -> BatchEvaluator:
    """The batch evaluator a run asks for: a ClusterEvaluator when ``cluster.enabled``, else an Evaluator on this
    machine. Both have ``evaluate_many`` and ``close`` and are context managers."""
    if cluster is not None and cluster.enabled:
        return ClusterEvaluator(config, cluster)
    from kevin.evaluation.evaluator import Evaluator

    return Evaluator(config)


__all__ = ["BatchEvaluator", "BatchReport", "ClusterConfig", "ClusterEvaluator", "EvalWorker", "NodeSlots", "WorkerInfo",
           "WorkerSpec", "batch_evaluator", "lost_verdict", "plan_chunks", "plan_workers", "ray_init_kwargs",
           "split_for_retry", "worker_compile_pool"]
