"""Cluster evaluation without Ray: its config, where the workers go and what each reserves, how a batch is cut into
chunks and handed out again, and the records that workers and the driver exchange.

Pure planning and data: nothing here imports Ray, so a config is checked and a layout planned on any machine (and
tested without a cluster); cluster.py puts the plans to work.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from kevin.evaluation.hardware import default_compile_workers
from kevin.records.evaluation import Candidate, EvalResult, Fault, Status, trim_error
from kevin.records.target import KernelTarget
from kevin.settings import Settings
from kevin.tasks.task import Task

_log = logging.getLogger(__name__)

Item = tuple[Task, Candidate]

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
    # At least one core: 0 would make the rule count this machine's cores, not the worker's reservation.
    return default_compile_workers(num_gpus, max(1, num_cpus))


def plan_workers(nodes: Iterable[NodeSlots], backend: str, cfg: ClusterConfig, compile_workers: int = 0) -> list[WorkerSpec]:
    """The workers to start on ``nodes``: per node, as many as ``cfg`` asks and the node's resources hold."""
    specs: list[WorkerSpec] = []
    for node in sorted(nodes, key=lambda n: (n.ip, n.node_id)):
        cuda = KernelTarget.parse(backend).is_gpu
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
                            error=trim_error(f"evaluator: {why}"), fault=Fault.EVALUATOR))


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


__all__ = ["BatchReport", "ClusterConfig", "Item", "NodeSlots", "WorkerInfo", "WorkerSpec",
           "lost_verdict", "plan_chunks", "plan_workers", "ray_init_kwargs", "split_for_retry", "worker_compile_pool"]
